//! Tier 4: two operators against one control plane. Only the lease holder reconciles;
//! when it dies without letting go, the other takes over once the lease runs out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use plugdb::crd::Database;
use plugdb::metrics::Metrics;
use plugdb::operator::{self, Options, Stopped};
use plugdb_tests::ControlPlane;
use plugdb_tests::operator::{OPERATOR_NAMESPACE, counting_client, prepare, test_settings};
use serde_json::json;

const LEASE: Duration = Duration::from_secs(3);

async fn holder(client: &Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    leases.get_opt("plugdb-leader").await.ok().flatten()?.spec?.holder_identity
}

async fn wait_for(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn options(identity: &str) -> Options {
    Options { identity: Some(identity.into()), lease_duration: LEASE, settings: test_settings(), ..Default::default() }
}

/// Whether a leader reconciled the current spec: status written for its generation
/// and the StatefulSet sized for `replicas` (no node runs the Pods on this tier).
async fn reconciled(dbs: &Api<Database>, replicas: i32) -> bool {
    let Some(db) = dbs.get_opt("orders").await.ok().flatten() else { return false };
    let current = db.status.as_ref().is_some_and(|s| s.observed_generation == db.metadata.generation && s.primary.is_some());
    let sts: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(dbs.clone().into_client(), "default");
    let sized = sts.get_opt("orders").await.ok().flatten().and_then(|s| s.spec).and_then(|s| s.replicas) == Some(replicas);
    current && sized
}

#[tokio::test]
async fn only_the_leader_writes_and_a_follower_takes_over_when_it_dies() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("postgres", "postgres")]).await.expect("CRD and plugins");
    let (client_a, writes_a) = counting_client(&cp.kubeconfig).await.expect("client a");
    let (client_b, writes_b) = counting_client(&cp.kubeconfig).await.expect("client b");

    let a = tokio::spawn(operator::run(client_a, Arc::new(Metrics::default()), options("replica-a"), || {}, std::future::pending()));
    wait_for("replica-a leads", Duration::from_secs(30), async || holder(&cp.client).await.as_deref() == Some("replica-a")).await;
    let (stop_b, stopped_b) = tokio::sync::oneshot::channel::<()>();
    let b = tokio::spawn(operator::run(client_b, Arc::new(Metrics::default()), options("replica-b"), || {}, async move {
        let _ = stopped_b.await;
    }));

    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    let db = |replicas: i32| {
        json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": "orders"},
                                   "spec": {"engine": "postgres", "replicas": replicas, "storage": "1Gi"}})
    };
    dbs.patch("orders", &kube::api::PatchParams::apply("test"), &kube::api::Patch::Apply(&db(1))).await.expect("database");
    wait_for("reconciled under replica-a", Duration::from_secs(60), async || reconciled(&dbs, 1).await).await;
    assert_eq!(writes_b.writes(), 0, "the follower wrote nothing");
    assert!(writes_a.writes() > 0, "the leader did the work");

    // replica-a dies without releasing the lease.
    a.abort();
    let _ = a.await;
    let a_writes = writes_a.writes();
    let died = Instant::now();
    wait_for("replica-b takes the lease", LEASE * 4, async || holder(&cp.client).await.as_deref() == Some("replica-b")).await;
    let took_over = died.elapsed();
    assert!(took_over <= LEASE * 2, "took over after {took_over:?}, lease is {LEASE:?}");

    dbs.patch("orders", &kube::api::PatchParams::apply("test"), &kube::api::Patch::Apply(&db(2))).await.expect("scale");
    wait_for("2 members under replica-b", Duration::from_secs(60), async || reconciled(&dbs, 2).await).await;
    assert!(writes_b.writes() > 0, "the new leader reconciles");
    assert_eq!(writes_a.writes(), a_writes, "the dead leader writes nothing more");

    // A graceful stop releases the lease at once.
    let _ = stop_b.send(());
    assert_eq!(b.await.expect("join").expect("run"), Stopped::Shutdown);
    assert_eq!(holder(&cp.client).await, None);
}
