//! Tier 4: what the reconciler keeps per Database goes with the Database. 100
//! Databases are created, reconciled and deleted on a real control plane; afterwards
//! the reconciler holds no state about any of them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use plugdb::crd::{Database, DeletionPolicy};
use plugdb::health::Health;
use plugdb::metrics::Metrics;
use plugdb::operator::{self, Options};
use plugdb::reconcile::FINALIZER;
use plugdb_tests::ControlPlane;
use plugdb_tests::operator::{counting_client, metric_sum, prepare, test_settings};

const COUNT: usize = 100;

async fn wait_for(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn deleting_100_databases_leaves_no_state_behind_in_the_reconciler() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("minimal", "minimal")]).await.expect("CRD and plugins");
    let (client, _) = counting_client(&cp.kubeconfig).await.expect("client");
    let metrics = Arc::new(Metrics::default());
    let options = Options { settings: test_settings(), ..Default::default() };
    let operator = tokio::spawn(operator::run(client, metrics.clone(), options, Health::default(), std::future::pending()));
    let entries = || metric_sum(&metrics.encode(), "plugdb_reconcile_state_entries", |_| true) as usize;

    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    for i in 0..COUNT {
        let db: Database = serde_json::from_value(serde_json::json!({
            "apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": format!("db-{i}")},
            // Half go at once, half through the operator's finalizer.
            "spec": {"engine": "minimal", "storage": "1Gi", "deletionPolicy": if i % 2 == 0 { "Retain" } else { "Snapshot" }},
        }))
        .expect("a Database");
        dbs.create(&PostParams::default(), &db).await.expect("create");
    }
    let mut most = 0;
    wait_for("every Database is reconciled", Duration::from_secs(180), async || {
        most = most.max(entries());
        let list = dbs.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        let reconciled = list.iter().filter(|d| d.status.as_ref().is_some_and(|s| s.observed_generation.is_some()));
        reconciled.filter(|d| d.finalizers().iter().any(|f| f == FINALIZER) == (d.spec.deletion_policy == DeletionPolicy::Snapshot)).count()
            == COUNT
    })
    .await;
    assert!(most > 0, "the reconciler keeps state while the Databases live");

    dbs.delete_collection(&DeleteParams::default(), &ListParams::default()).await.expect("delete all");
    wait_for("every Database is gone", Duration::from_secs(180), async || {
        most = most.max(entries());
        dbs.list(&ListParams::default()).await.is_ok_and(|l| l.items.is_empty())
    })
    .await;
    wait_for("no state is kept about them", Duration::from_secs(30), async || entries() == 0).await;
    operator.abort();
}
