//! Trouble named before it is an outage: a transaction left open, and connections near
//! the most the engine lets in, each said by the member's agent and named by the operator
//! in the `Anomaly` condition and a Warning Event; gone again, the condition says so.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use plugdb_tests::operator::Cluster;
use plugdb_tests::scenario::{Client, Engine, WAIT, database, is_running};
use serde_json::json;

/// How long each held session lasts: past the one-minute rule, with the agent asked
/// every half minute, and then it ends on its own.
const HELD: Duration = Duration::from_secs(120);
/// The sessions held beside the open transaction: with the engine's own few, past half
/// of the 20 connections it lets in.
const SESSIONS: usize = 10;

/// A postgres and a mysql Database of one member each, told to name a transaction open a
/// minute and connections at half the most the engine lets in (20). A transaction left
/// open and ten sessions held beside it: `Anomaly` is True naming both for the member,
/// with a Warning Event of its reason; once they end, `Anomaly` is False.
pub async fn named_before_an_outage(cluster: Arc<Cluster>) {
    futures::join!(held_open(&cluster, Engine::Postgres, "17"), held_open(&cluster, Engine::Mysql, "11.8"));
}

async fn held_open(cluster: &Cluster, engine: Engine, version: &str) {
    let ns = format!("{}-anomalies", engine.name());
    let name = "held";
    let spec = json!({"parameters": {"max_connections": 20},
                      "anomalies": {"transactionMinutes": 1, "connectionsPercent": 50}});
    cluster.apply_database(&ns, database(name, engine, version, 1, spec)).await.expect("apply");
    cluster.wait_database(&ns, name, "1 member Ready", WAIT, |d| is_running(d, 1)).await.expect("running");
    let client = Arc::new(Client::new(cluster, engine, &ns, name).await);
    let primary = client.service_ip(name).await;
    client.reachable(&primary).await;
    let member = client.members().await.remove(0).name_any();
    let quiet = cluster
        .wait_database(&ns, name, "no anomaly", WAIT, |d| {
            anomaly(d).is_some_and(|(status, reason, _)| status == "False" && reason == "NoAnomaly")
        })
        .await
        .expect("Anomaly False while nothing is held");
    eprintln!("{ns}: {}", anomaly(&quiet).map(|(.., m)| m).unwrap_or_default());

    let seconds = HELD.as_secs();
    let (create, open, sleep) = match engine {
        Engine::Postgres => (
            "CREATE TABLE held (id int)",
            format!("BEGIN; INSERT INTO held VALUES (1); SELECT pg_sleep({seconds}); COMMIT"),
            format!("SELECT pg_sleep({seconds})"),
        ),
        Engine::Mysql => (
            "CREATE TABLE held (id int) ENGINE=InnoDB",
            format!("START TRANSACTION; INSERT INTO held VALUES (1); SELECT SLEEP({seconds}); COMMIT"),
            format!("SELECT SLEEP({seconds})"),
        ),
    };
    client.query(&primary, create).await.unwrap_or_else(|e| panic!("{ns}: {create}: {e}"));
    let mut held = vec![open];
    held.extend(std::iter::repeat_n(sleep, SESSIONS));
    let sessions: Vec<_> = held
        .into_iter()
        .map(|sql| {
            let (client, primary) = (client.clone(), primary.clone());
            tokio::spawn(async move { client.query(&primary, &sql).await })
        })
        .collect();
    let started = tokio::time::Instant::now();
    let open = format!("{member}: a transaction has been open");
    let named = cluster
        .wait_database(&ns, name, "Anomaly names the open transaction and the connections", WAIT, |d| {
            anomaly(d).is_some_and(|(status, _, message)| {
                status == "True" && message.contains(&open) && message.contains("of the 20 connections it lets in")
            })
        })
        .await
        .expect("the anomalies named");
    let (_, reason, message) = anomaly(&named).expect("Anomaly");
    eprintln!("{ns}: named {:.0} s after the sessions began: {reason}: {message}", started.elapsed().as_secs_f64());
    // The worst first: connections near the limit stop new clients before an open
    // transaction does harm.
    assert_eq!(reason, "ConnectionsNearLimit", "{ns}: {message}");
    let events = Api::<Event>::namespaced(cluster.client.clone(), &ns).list(&ListParams::default()).await.expect("events").items;
    let warned = events.iter().any(|e| {
        e.type_.as_deref() == Some("Warning")
            && matches!(e.reason.as_deref(), Some("ConnectionsNearLimit" | "LongTransaction"))
            && e.note.as_deref().is_some_and(|n| n.contains(&member))
    });
    assert!(warned, "{ns}: a Warning Event names the anomaly: {:?}", events.iter().map(|e| (&e.reason, &e.note)).collect::<Vec<_>>());

    for session in sessions {
        session.await.expect("a session").unwrap_or_else(|e| panic!("{ns}: a held session failed: {e}"));
    }
    cluster
        .wait_database(&ns, name, "no anomaly once the sessions ended", WAIT, |d| {
            anomaly(d).is_some_and(|(status, reason, _)| status == "False" && reason == "NoAnomaly")
        })
        .await
        .expect("Anomaly False again");
}

/// The `Anomaly` condition's status, reason and message.
fn anomaly(db: &plugdb::crd::Database) -> Option<(String, String, String)> {
    let c = db.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Anomaly")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}
