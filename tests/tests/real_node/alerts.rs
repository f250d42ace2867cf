//! The chart's alert rules in a real Prometheus, scraping what the chart's PodMonitor
//! selects, against a primary and a replica on the nodes: the alerts a replica in
//! trouble raises fire, and resolve once it is well.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use plugdb_tests::operator::Cluster;
use plugdb_tests::prometheus::{Prometheus, held_at_most};
use plugdb_tests::scenario::{Client, Engine, WAIT, database, is_running, pod_ip};
use serde_json::json;

/// The longest a rule here holds before it fires: the rules' own hold times (minutes),
/// which their `promtool test rules` tests check, are capped at it.
const HELD: Duration = Duration::from_secs(15);

/// A primary and a replica under a writer. The replica's replay paused: its lag grows
/// past 30 s, and `PlugdbReplicationLag` (lag over 30 s and not falling) fires for it;
/// replaying again, it resolves. The replica's engine stopped (SIGSTOP: it answers no
/// one): `PlugdbMemberDown` fires for it; running again, it resolves. The primary raises
/// neither.
pub async fn a_replica_in_trouble_fires_alerts_that_resolve(cluster: Arc<Cluster>) {
    let ns = "postgres-alerts";
    let dir = tempfile::tempdir().expect("a directory");
    let chart = plugdb_tests::workspace_root().join("deploy/chart/plugdb/alerts/plugdb-rules.yaml");
    let rules = held_at_most(&chart, HELD, dir.path()).expect("the rules");
    cluster.apply_database(ns, database("orders", Engine::Postgres, "17", 2, json!({}))).await.expect("apply");
    cluster.wait_database(ns, "orders", "2 members Ready", WAIT, |d| is_running(d, 2)).await.expect("running");
    let prometheus = Prometheus::start(crate::nodes::nodes(&cluster), ns, "127.0.0.1:1", &rules).await.expect("Prometheus");
    let client = Arc::new(Client::new(&cluster, Engine::Postgres, ns, "orders").await);
    let primary = client.service_ip("orders").await;
    client.create_table(&primary).await;
    let members = client.members().await;
    let replica = members.iter().find(|p| p.name_any() == "orders-1").expect("orders-1").clone();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = client.writer(1, stop.clone());
    // A transaction replayed first: a replica that has replayed none knows no lag.
    let replayed = |rows: &str| rows.parse::<u64>().is_ok_and(|n| n > 0);
    client.eventually(&pod_ip(&replica), "SELECT count(*) FROM orders", WAIT, replayed).await;

    // Replay paused: what it receives waits, and its lag is the age of what it replayed last.
    client.administer(&replica, "SELECT pg_wal_replay_pause()").await.expect("replay paused");
    let paused = Instant::now();
    prometheus.until_firing("PlugdbReplicationLag", "orders-1", WAIT).await;
    eprintln!("{ns}: PlugdbReplicationLag firing for orders-1 {:.0} s after its replay paused", paused.elapsed().as_secs_f64());
    client.administer(&replica, "SELECT pg_wal_replay_resume()").await.expect("replay resumed");
    prometheus.until_resolved("PlugdbReplicationLag", "orders-1", WAIT).await;
    stop.store(true, Ordering::SeqCst);
    let (written, _) = writer.await.expect("the writer");
    assert!(!written.is_empty(), "the writer wrote throughout");

    // The engine stopped: its agent's status command gets no answer.
    let container = replica.spec.as_ref().map(|s| s.containers[0].name.clone()).expect("the engine's container");
    plugdb_tests::scenario::signal_all(&replica, &container, "STOP");
    let stopped = Instant::now();
    prometheus.until_firing("PlugdbMemberDown", "orders-1", WAIT).await;
    eprintln!("{ns}: PlugdbMemberDown firing for orders-1 {:.0} s after its engine stopped", stopped.elapsed().as_secs_f64());
    plugdb_tests::scenario::resume_all(&replica, &container);
    prometheus.until_resolved("PlugdbMemberDown", "orders-1", WAIT).await;
    let alerts = prometheus.alerts().await.expect("alerts");
    assert!(alerts.iter().all(|(labels, _)| labels["member"] != "orders-0"), "the primary raised none: {alerts:?}");
}
