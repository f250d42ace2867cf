//! Tier 4 scenarios: the operator against a real control plane, driven the way a
//! user drives it, asserting on real objects and status.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use plugdb::crd::Database;
use plugdb_tests::operator::{Cluster, OPERATOR_NAMESPACE, plugin_config_map};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

fn condition<'a>(db: &'a Database, type_: &str) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    db.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

fn is_running(db: &Database, replicas: i32) -> bool {
    let s = db.status.clone().unwrap_or_default();
    s.phase.as_deref() == Some("Running") && s.ready_replicas == Some(replicas) && s.observed_generation == db.metadata.generation
}

fn orders(replicas: i32, version: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": "orders"},
        "spec": {"engine": "postgres", "version": version, "replicas": replicas, "storage": {"size": "1Gi"},
                 "resources": {"limits": {"memory": "1Gi"}}, "parameters": {"max_connections": 150}},
    })
}

async fn image_of(cluster: &Cluster, ns: &str) -> String {
    let sts: Api<StatefulSet> = Api::namespaced(cluster.client.clone(), ns);
    let s = sts.get("orders").await.expect("statefulset");
    s.spec.expect("spec").template.spec.expect("pod").containers[0].image.clone().unwrap_or_default()
}

#[tokio::test]
async fn a_database_becomes_ready_with_all_its_children_and_then_writes_nothing() {
    let mut cluster = Cluster::start(&[("postgres", "postgres")]).await.expect("cluster");
    cluster.apply_database("shop", orders(3, "15")).await.expect("apply");
    let db = cluster.wait_database("shop", "orders", "Running with 3 ready", WAIT, |d| is_running(d, 3)).await.expect("ready");
    let status = db.status.clone().expect("status");
    assert_eq!(status.primary.as_deref(), Some("orders-0"));
    assert_eq!(status.current_version.as_deref(), Some("15"));
    assert!(status.plugin.as_deref().is_some_and(|p| p.starts_with("postgres@")));
    for t in ["Ready", "PluginReady", "BackupHealthy"] {
        assert_eq!(condition(&db, t).map(|c| c.status.as_str()), Some("True"), "{t}");
    }

    let c = cluster.client.clone();
    let secret = Api::<Secret>::namespaced(c.clone(), "shop").get("orders-credentials").await.expect("credentials");
    let data = secret.data.clone().expect("data");
    assert_eq!(data["superuser-password"].0.len(), 32);
    assert!(secret.owner_references().is_empty(), "credentials outlive the Database under Snapshot");
    let config = Api::<ConfigMap>::namespaced(c.clone(), "shop").get("orders-config").await.expect("config");
    assert!(config.data.expect("data")["postgresql.conf"].contains("max_connections = 150"));
    let services = Api::<Service>::namespaced(c.clone(), "shop");
    for name in ["orders", "orders-replicas", "orders-headless"] {
        let svc = services.get(name).await.expect(name);
        assert_eq!(svc.owner_references()[0].name, "orders");
    }
    Api::<PodDisruptionBudget>::namespaced(c.clone(), "shop").get("orders").await.expect("pdb");
    let pods = Api::<Pod>::namespaced(c.clone(), "shop").list(&ListParams::default().labels("plugdb.io/role=replica")).await.expect("pods");
    assert_eq!(pods.items.len(), 2, "two members labelled replica for the read-only Service");
    assert_eq!(image_of(&cluster, "shop").await, "docker.io/library/postgres:15");

    // The credentials are never overwritten, even when a reconcile is forced.
    let before = data["superuser-password"].clone();
    let dbs: Api<Database> = Api::namespaced(c.clone(), "shop");
    dbs.patch("orders", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"poke": "1"}}}))).await.expect("poke");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = Api::<Secret>::namespaced(c.clone(), "shop").get("orders-credentials").await.expect("credentials").data.expect("data");
    assert_eq!(after["superuser-password"], before);

    // Steady state: a resync is served from the caches and writes nothing: no requests at all.
    let all = cluster.requests.all();
    let reconciles = cluster.reconciles("postgres");
    dbs.patch("orders", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"poke": "2"}}}))).await.expect("poke");
    cluster.wait_until("the poke is reconciled", WAIT, || cluster.reconciles("postgres") > reconciles).await.expect("reconcile");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cluster.requests.all(), all, "no requests in steady state");

    // A restarted operator resyncs from its caches once its plugins are loaded: it never
    // reports the engine missing in between, and writes nothing.
    let writes = cluster.requests.writes();
    cluster.restart_operator().expect("restart");
    cluster.wait_until("the restarted operator reconciles", WAIT, || cluster.reconciles("postgres") > 0).await.expect("resync");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cluster.requests.writes(), writes, "no writes after a restart");
}

#[tokio::test]
async fn an_unknown_engine_gets_a_condition_and_no_children_until_its_plugin_arrives() {
    let cluster = Cluster::start(&[("postgres", "postgres")]).await.expect("cluster");
    cluster
        .apply_database(
            "apps",
            json!({"metadata": {"name": "cache"}, "spec": {"engine": "minimal", "version": "1", "storage": {"size": "1Gi"}}}),
        )
        .await
        .expect("apply");
    let db = cluster
        .wait_database("apps", "cache", "PluginReady=False", WAIT, |d| condition(d, "PluginReady").is_some_and(|c| c.status == "False"))
        .await
        .expect("condition");
    let c = condition(&db, "PluginReady").expect("condition");
    assert_eq!(c.reason, "EngineNotFound");
    assert!(c.message.contains("\"minimal\"") && c.message.contains("loaded: postgres"), "{}", c.message);
    assert!(Api::<StatefulSet>::namespaced(cluster.client.clone(), "apps").get_opt("cache").await.expect("get").is_none(), "no children");

    // Dropping in the plugin's ConfigMap brings the Database up; no restart.
    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), OPERATOR_NAMESPACE);
    cms.create(&PostParams::default(), &plugin_config_map("minimal", "minimal")).await.expect("plugin");
    let db = cluster.wait_database("apps", "cache", "Running", WAIT, |d| is_running(d, 1)).await.expect("running");
    assert_eq!(db.status.and_then(|s| s.plugin).as_deref(), Some("minimal@1.0.0"));

    // Hot swap: version 2 of the plugin re-renders the running Database.
    let mut v2 = plugin_config_map("minimal", "minimal-v2");
    v2.metadata.resource_version = cms.get("engine-minimal").await.expect("cm").metadata.resource_version;
    cms.replace("engine-minimal", &PostParams::default(), &v2).await.expect("swap");
    cluster
        .wait_database("apps", "cache", "re-rendered by minimal@2.0.0", WAIT, |d| {
            d.status.as_ref().and_then(|s| s.plugin.as_deref()) == Some("minimal@2.0.0")
        })
        .await
        .expect("hot swap");

    // A broken version 3 is refused: version 2 keeps serving and the Database says so.
    let mut broken = plugin_config_map("minimal", "minimal");
    broken.binary_data =
        Some(std::collections::BTreeMap::from([("plugin.wasm".to_string(), k8s_openapi::ByteString(b"not wasm".to_vec()))]));
    broken.metadata.resource_version = cms.get("engine-minimal").await.expect("cm").metadata.resource_version;
    cms.replace("engine-minimal", &PostParams::default(), &broken).await.expect("break");
    let db = cluster
        .wait_database("apps", "cache", "the rejection is reported", WAIT, |d| {
            condition(d, "PluginReady").is_some_and(|c| c.reason == "NewerVersionRejected")
        })
        .await
        .expect("reported");
    assert_eq!(db.status.as_ref().and_then(|s| s.plugin.as_deref()), Some("minimal@2.0.0"));
    assert!(condition(&db, "PluginReady").expect("c").message.contains("not a WebAssembly component"));
    assert!(is_running(&db, 1), "the running version keeps serving");
}

#[tokio::test]
async fn a_spec_the_plugin_rejects_becomes_a_readable_condition() {
    let cluster = Cluster::start(&[("postgres", "postgres")]).await.expect("cluster");
    let mut bad = orders(1, "13");
    bad["spec"]["parameters"] = json!({"max_connections": "lots", "fsync_everything": "yes"});
    cluster.apply_database("shop", bad).await.expect("apply");
    let db = cluster
        .wait_database("shop", "orders", "InvalidSpec", WAIT, |d| condition(d, "PluginReady").is_some_and(|c| c.reason == "InvalidSpec"))
        .await
        .expect("condition");
    let message = &condition(&db, "PluginReady").expect("condition").message;
    for part in ["spec.version", "spec.parameters.max_connections", "spec.parameters.fsync_everything"] {
        assert!(message.contains(part), "{message}");
    }
    assert_eq!(db.status.and_then(|s| s.phase).as_deref(), Some("Failed"));
    assert!(Api::<StatefulSet>::namespaced(cluster.client.clone(), "shop").get_opt("orders").await.expect("get").is_none());
}

#[tokio::test]
async fn scaling_up_and_down_keeps_the_volumes_of_removed_members() {
    let cluster = Cluster::start(&[("postgres", "postgres")]).await.expect("cluster");
    cluster.apply_database("shop", orders(1, "15")).await.expect("apply");
    cluster.wait_database("shop", "orders", "1 ready", WAIT, |d| is_running(d, 1)).await.expect("1");
    cluster.apply_database("shop", orders(3, "15")).await.expect("scale up");
    cluster.wait_database("shop", "orders", "3 ready", WAIT, |d| is_running(d, 3)).await.expect("3");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), "shop");
    for i in 0..3 {
        claims.get(&format!("data-orders-{i}")).await.expect("a claim per member");
    }
    cluster.apply_database("shop", orders(1, "15")).await.expect("scale down");
    cluster.wait_database("shop", "orders", "back to 1", WAIT, |d| is_running(d, 1)).await.expect("1 again");
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "shop");
    for _ in 0..100 {
        if pods.get_opt("orders-2").await.expect("get").is_none() && pods.get_opt("orders-1").await.expect("get").is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(pods.get_opt("orders-2").await.expect("get").is_none());
    for i in 0..3 {
        claims.get(&format!("data-orders-{i}")).await.expect("volumes of removed members are kept");
    }
}
