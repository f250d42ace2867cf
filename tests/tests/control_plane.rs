//! Tier 4 smoke tests: the real control plane the other scenarios stand on.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::{Client, CustomResourceExt, ResourceExt};
use plugdb::crd::Database;
use plugdb_tests::ControlPlane;
use serde_json::json;

async fn install_crd(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Database::crd()).await.expect("CRD created");
    let established = kube::runtime::wait::conditions::is_crd_established();
    tokio::time::timeout(Duration::from_secs(30), kube::runtime::wait::await_condition(crds, "databases.plugdb.io", established))
        .await
        .expect("CRD established in time")
        .expect("CRD watch");
}

fn database(name: &str, spec: serde_json::Value) -> Database {
    serde_json::from_value(json!({
        "apiVersion": "plugdb.io/v1alpha1",
        "kind": "Database",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("a Database")
}

#[tokio::test]
async fn api_server_serves_the_database_crd_and_enforces_its_schema() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    install_crd(&cp.client).await;
    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");

    let created = dbs
        .create(
            &PostParams::default(),
            &database("orders", json!({"engine": "postgres", "version": "17", "replicas": 3, "storage": "10Gi"})),
        )
        .await
        .expect("valid Database accepted");
    let read = dbs.get("orders").await.expect("read back");
    assert_eq!(read.uid(), created.uid());
    assert_eq!(read.spec.engine, "postgres");
    assert_eq!(read.spec.replicas, 3);

    // The API server's own validation refuses what the schema forbids.
    let too_many = database("too-many", json!({"engine": "postgres", "replicas": 50, "storage": "1Gi"}));
    let err = dbs.create(&PostParams::default(), &too_many).await.expect_err("replicas over the maximum refused");
    assert!(err.to_string().contains("spec.replicas"), "{err}");

    let bad_engine = database("bad-engine", json!({"engine": "Post Gres!", "storage": "1Gi"}));
    let err = dbs.create(&PostParams::default(), &bad_engine).await.expect_err("bad engine name refused");
    assert!(err.to_string().contains("spec.engine"), "{err}");

    // CEL rules: engine is immutable, storage never shrinks.
    let mut changed = read.clone();
    changed.spec.engine = "mysql".into();
    let err = dbs.replace("orders", &PostParams::default(), &changed).await.expect_err("engine change refused");
    assert!(err.to_string().contains("engine cannot be changed"), "{err}");
    let mut shrunk = dbs.get("orders").await.expect("read");
    shrunk.spec.storage = k8s_openapi::apimachinery::pkg::api::resource::Quantity("5Gi".into());
    let err = dbs.replace("orders", &PostParams::default(), &shrunk).await.expect_err("shrink refused");
    assert!(err.to_string().contains("never shrink"), "{err}");

    // The Operator-pattern documentation's shape applies unchanged; storage's errors name it.
    let documented: Database = yaml_serde::from_str(
        "apiVersion: plugdb.io/v1alpha1\nkind: Database\nmetadata: {name: documented}\nspec:\n  engine: postgres\n  storage: 50Gi\n  backup: {enabled: true, schedule: \"0 */6 * * *\"}\n",
    )
    .expect("the documented shape parses");
    dbs.create(&PostParams::default(), &documented).await.expect("the documented shape is accepted");
    // Parameters hold 64-bit integers (and text) through the API server and back.
    let big = database("big", json!({"engine": "postgres", "storage": "1Gi", "parameters": {"quota": 4_294_967_296_i64, "mem": "8MB"}}));
    dbs.create(&PostParams::default(), &big).await.expect("a 64-bit parameter is accepted");
    let read = dbs.get("big").await.expect("read");
    assert_eq!(read.spec.parameters.get("quota"), Some(&plugdb::crd::Parameter::Integer(4_294_967_296)));
    assert_eq!(read.spec.parameters.get("mem"), Some(&plugdb::crd::Parameter::Text("8MB".into())));
    for schedule in ["daily", "0 2 * *", "1 2 3 4 5 6 7 8"] {
        let unscheduled = database("unscheduled", json!({"engine": "postgres", "storage": "1Gi", "backup": {"schedule": schedule}}));
        let err = dbs.create(&PostParams::default(), &unscheduled).await.expect_err(schedule);
        assert!(err.to_string().contains("spec.backup.schedule") && err.to_string().contains("five cron fields"), "{schedule}: {err}");
    }
    for after in ["10", "5s", "1d", "soon"] {
        let hasty = database("hasty", json!({"engine": "postgres", "storage": "1Gi", "spread": {"moveFromLostNodeAfter": after}}));
        let err = dbs.create(&PostParams::default(), &hasty).await.expect_err(after);
        assert!(
            err.to_string().contains("spec.spread.moveFromLostNodeAfter") && err.to_string().contains("at least 30s"),
            "{after}: {err}"
        );
    }
    let patient = database("patient", json!({"engine": "postgres", "storage": "1Gi", "spread": {"moveFromLostNodeAfter": "1h30m"}}));
    let created = dbs.create(&PostParams::default(), &patient).await.expect("a well-formed duration is accepted");
    let after = created.spec.spread.and_then(|s| s.move_after());
    assert_eq!(after, Some(std::time::Duration::from_secs(5400)), "read as the API server checked it");
    let nothing = database("nothing", json!({"engine": "postgres", "storage": "0"}));
    let err = dbs.create(&PostParams::default(), &nothing).await.expect_err("an empty volume is refused");
    assert!(err.to_string().contains("spec.storage") && err.to_string().contains("positive quantity"), "{err}");
    let mut reclassed = dbs.get("documented").await.expect("read");
    reclassed.spec.storage_class_name = Some("fast".into());
    let err = dbs.replace("documented", &PostParams::default(), &reclassed).await.expect_err("class change refused");
    assert!(err.to_string().contains("storageClassName cannot be changed"), "{err}");
}

#[tokio::test]
async fn the_controller_manager_makes_a_statefulsets_pods() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    let sts: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "podManagementPolicy": "Parallel",
            "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "registry.example/web:1"}]}
            }
        }
    }))
    .expect("a StatefulSet");
    let api: Api<StatefulSet> = Api::namespaced(cp.client.clone(), "default");
    api.create(&PostParams::default(), &sts).await.expect("StatefulSet created");
    // No node runs them here (the real node does that): the Pods exist, unscheduled.
    let pods: Api<Pod> = Api::namespaced(cp.client.clone(), "default");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let names: Vec<String> = pods.list(&Default::default()).await.expect("pods").items.iter().map(|p| p.name_any()).collect();
        if names == ["web-0", "web-1"] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pods {names:?}; controller-manager log:\n{}",
            cp.log_tail("kube-controller-manager")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn dropping_the_control_plane_stops_its_processes_and_removes_its_directory() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    let (dir, pids) = (cp.dir().to_path_buf(), cp.pids());
    assert_eq!(pids.len(), 3, "etcd, kube-apiserver, kube-controller-manager");
    drop(cp);
    assert!(!dir.exists(), "{} removed", dir.display());
    for pid in pids {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(stat.is_empty(), "process {pid} still exists: {stat}");
    }
}
