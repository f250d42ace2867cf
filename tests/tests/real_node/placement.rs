//! Where members run and how their volumes grow, on the real scheduler and provisioner.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use plugdb::crd::Database;
use plugdb_tests::operator::Cluster;
use plugdb_tests::scenario::{Engine, WAIT, database, is_running};
use serde_json::json;

const CLASS: &str = plugdb_tests::node::GROWABLE_STORAGE_CLASS;

fn condition(db: &Database, type_: &str) -> Option<(String, String, String)> {
    let c = db.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn requested(claims: &Api<PersistentVolumeClaim>, name: &str) -> String {
    let claim = claims.get(name).await.expect("claim");
    claim.spec.and_then(|s| s.resources).and_then(|r| r.requests).and_then(|r| r.get("storage").cloned()).map(|q| q.0).unwrap_or_default()
}

/// Members of `name` required on different nodes and zones land one per node, in zones
/// a, b and c; a fourth has no node left and waits unscheduled, and the Database says why.
async fn spread_over_zones(cluster: &Cluster, ns: &str, name: &str, engine: Engine, version: &str) {
    let spec = |replicas: i32| {
        database(name, engine, version, replicas, json!({"storageClassName": CLASS, "spread": {"nodes": "Required", "zones": "Required"}}))
    };
    cluster.apply_database(ns, spec(3)).await.expect("apply");
    cluster.wait_database(ns, name, "3 members Ready", WAIT, |d| is_running(d, 3)).await.expect("running");
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let mut zones = Vec::new();
    for ordinal in 0..3 {
        let pod = pods.get(&format!("{name}-{ordinal}")).await.expect("member");
        let node = nodes.get(&crate::nodes::node_of(&pod)).await.expect("its node");
        zones.push(node.labels().get("topology.kubernetes.io/zone").cloned().unwrap_or_default());
    }
    zones.sort();
    assert_eq!(zones, ["a", "b", "c"], "{name}: one member in each zone");

    cluster.apply_database(ns, spec(4)).await.expect("a fourth member");
    let fourth = format!("{name}-3");
    let db = cluster
        .wait_database(ns, name, "member 3 reported unschedulable", WAIT, |d| {
            d.status.as_ref().and_then(|s| s.ready_replicas) == Some(3)
                && condition(d, "Ready").is_some_and(|(_, _, m)| m.contains(&format!("{fourth} cannot be scheduled")))
        })
        .await
        .expect("three members run, the fourth waits");
    let (_, reason, message) = condition(&db, "Ready").expect("Ready");
    assert_eq!(reason, "MembersNotReady");
    assert!(message.contains("0/3 nodes are available") && message.contains("anti-affinity"), "the scheduler's reason: {message}");
    let waiting = pods.get(&fourth).await.expect("member 3");
    assert!(waiting.spec.and_then(|s| s.node_name).is_none(), "{name}: member 3 is on no node");
}

/// Members required on different nodes and zones, for postgres and mysql, land one per
/// node, in zones a, b and c; a fourth has no node left and waits unscheduled, and the
/// Database says why. A volume grow the storage class refuses is a condition and an
/// Event, retried until the class allows it, then every bound claim asks for the new size.
pub async fn spread_and_volume_growth(cluster: Arc<Cluster>) {
    let ns = "postgres-placement";
    let classes: Api<StorageClass> = Api::all(cluster.client.clone());
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": CLASS},
        "provisioner": "rancher.io/local-path",
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
        "allowVolumeExpansion": false,
    }))
    .expect("a StorageClass");
    classes.create(&PostParams::default(), &class).await.expect("storage class");

    let spec = |replicas: i32, extra: serde_json::Value| {
        let mut fields = json!({"storageClassName": CLASS, "spread": {"nodes": "Required", "zones": "Required"}});
        fields.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
        database("spread", Engine::Postgres, "15", replicas, fields)
    };
    futures::join!(
        spread_over_zones(&cluster, ns, "spread", Engine::Postgres, "15"),
        spread_over_zones(&cluster, ns, "spread-my", Engine::Mysql, "10.11")
    );

    cluster.apply_database(ns, spec(4, json!({"storage": "2Gi"}))).await.expect("grow");
    let db = cluster
        .wait_database(ns, "spread", "VolumeGrowFailed", WAIT, |d| {
            condition(d, "Progressing").is_some_and(|(status, reason, _)| status == "False" && reason == "VolumeGrowFailed")
        })
        .await
        .expect("the refused grow is reported");
    let (_, _, message) = condition(&db, "Progressing").expect("Progressing");
    assert!(message.contains("claim data-spread-") && message.contains("2Gi"), "{message}");
    assert!(message.contains("resize"), "the API server's reason: {message}");
    let events = Api::<Event>::namespaced(cluster.client.clone(), ns).list(&ListParams::default()).await.expect("events").items;
    assert!(events.iter().any(|e| e.reason.as_deref() == Some("VolumeGrowFailed")), "an Event says so");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), ns);
    assert_eq!(requested(&claims, "data-spread-0").await, "1Gi");

    // Allowing expansion later is enough: the operator keeps trying, with no spec change.
    classes.patch(CLASS, &PatchParams::default(), &Patch::Merge(json!({"allowVolumeExpansion": true}))).await.expect("allow expansion");
    let deadline = tokio::time::Instant::now() + WAIT;
    for claim in ["data-spread-0", "data-spread-1", "data-spread-2"] {
        while requested(&claims, claim).await != "2Gi" {
            assert!(tokio::time::Instant::now() < deadline, "{claim} was not grown once the class allowed it");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    // local-path-provisioner has no resizer: the claims ask for 2Gi and keep 1Gi, and
    // the Database says it is waiting for that rather than claiming to be done.
    let db = cluster
        .wait_database(ns, "spread", "waiting for the provider", WAIT, |d| {
            condition(d, "Progressing").is_some_and(|(status, _, m)| status == "True" && m.contains("storage provider is growing it"))
        })
        .await
        .expect("growth reported");
    assert_eq!(db.status.and_then(|s| s.ready_replicas), Some(3));

    // Volumes that grow on their own, from what each member's agent measures of its data
    // volume: local-path's volumes are directories on the nodes' filesystem, well past
    // 1 % used, so a look at the members grows every bound claim by the step, once (the
    // claims then wait for a resizer local-path does not have).
    let grows = json!({"storageClassName": CLASS, "spread": {"nodes": "Required", "zones": "Required"},
                       "storageGrowth": {"thresholdPercent": 1, "step": "1Gi", "limit": "4Gi"}});
    cluster.apply_database(ns, database("spread-my", Engine::Mysql, "10.11", 4, grows)).await.expect("storageGrowth");
    let db = cluster
        .wait_database(ns, "spread-my", "its volumes grown on their own", WAIT, |d| {
            d.status.as_ref().is_some_and(|s| s.storage_growth.is_some())
        })
        .await
        .expect("grown");
    let grown = db.status.as_ref().and_then(|s| s.storage_growth.clone()).expect("status.storageGrowth");
    assert_eq!((grown.size.as_str(), grown.count), ("2Gi", 1));
    let (status, reason, message) = condition(&db, "StorageGrowth").expect("StorageGrowth");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "VolumesGrown"));
    assert!(message.contains("% full: every member's volume grows from 1Gi to 2Gi"), "{message}");
    let deadline = tokio::time::Instant::now() + WAIT;
    for claim in ["data-spread-my-0", "data-spread-my-1", "data-spread-my-2"] {
        while requested(&claims, claim).await != "2Gi" {
            assert!(tokio::time::Instant::now() < deadline, "{claim} was not grown");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let events = Api::<Event>::namespaced(cluster.client.clone(), ns).list(&ListParams::default()).await.expect("events").items;
    let grew: Vec<&Event> = events.iter().filter(|e| e.reason.as_deref() == Some("VolumesGrown")).collect();
    assert_eq!(grew.len(), 1, "one growth, said once");
    assert_eq!(grew[0].type_.as_deref(), Some("Normal"));
}
