//! Data on the real node: backups, restores and the final snapshot.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use plugdb::crd::Database;
use plugdb_tests::operator::Cluster;
use serde_json::json;

use plugdb_tests::scenario::{Client, Engine, WAIT, database, is_running, volume_path};

/// A backup on demand, then `restoreFrom` into a new Database: identical rows. Then the
/// source is deleted under `Snapshot`: its final backup ran and the artefact exists.
pub async fn backup_and_restore(cluster: Arc<Cluster>, engine: Engine, version: &str) {
    let ns = format!("{}-backups", engine.name());
    cluster.apply_database(&ns, database("orders", engine, version, 1, json!({}))).await.expect("apply");
    cluster.wait_database(&ns, "orders", "Running", WAIT, |d| is_running(d, 1)).await.expect("running");
    let client = Client::new(&cluster, engine, &ns, "orders").await;
    let primary = client.service_ip("orders").await;
    client.create_table(&primary).await;
    client.insert(&primary, 1..1001).await;
    let expected = client.checksum(&primary).await;
    assert!(expected.starts_with("1000 "), "{expected}");

    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), &ns);
    let token = json!({"metadata": {"annotations": {"plugdb.io/backup-now": "before-copy"}}});
    dbs.patch("orders", &PatchParams::default(), &Patch::Merge(token)).await.expect("annotate");
    let source = cluster
        .wait_database(&ns, "orders", "a backup", WAIT, |d| d.status.as_ref().and_then(|s| s.last_backup.as_ref()).is_some())
        .await
        .expect("backup");
    let backup = source.status.and_then(|s| s.last_backup).expect("last backup").name;
    // Written after the backup: must not be in the copy.
    client.insert(&primary, 1001..1002).await;

    let restore = json!({"restoreFrom": {"database": "orders", "backup": backup}});
    cluster.apply_database(&ns, database("copy", engine, version, 1, restore)).await.expect("apply copy");
    let copied = cluster.wait_database(&ns, "copy", "Running after the restore", WAIT, |d| is_running(d, 1)).await.expect("restored");
    assert!(copied.status.is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Restored" && c.status == "True")));
    if engine == Engine::Postgres {
        // A physical restore writes member 0's volume: the members start only after it.
        // (MariaDB's restore loads a dump into the running primary.)
        let restore_job = Api::<Job>::namespaced(cluster.client.clone(), &ns).get("copy-restore").await.expect("the restore Job");
        let sts = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(cluster.client.clone(), &ns).get("copy").await.expect("sts");
        assert!(
            sts.metadata.creation_timestamp >= restore_job.status.and_then(|s| s.completion_time),
            "members start only after the restore completed"
        );
    }
    let copy = Client::new(&cluster, engine, &ns, "copy").await;
    let copy_host = copy.service_ip("copy").await;
    copy.reachable(&copy_host).await;
    assert_eq!(copy.checksum(&copy_host).await, expected, "the copy holds exactly the rows backed up");
    let wrong = copy.query_as(&copy_host, "not-the-password", "SELECT 1").await;
    assert!(wrong.is_err(), "the copy takes its own credentials: {wrong:?}");

    // Deletion under Snapshot: the final backup runs and its artefact is on the backups volume.
    dbs.delete("orders", &DeleteParams::default()).await.expect("delete");
    let deadline = tokio::time::Instant::now() + WAIT;
    while dbs.get_opt("orders").await.expect("get").is_some() {
        assert!(tokio::time::Instant::now() < deadline, "orders was not deleted");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let final_job = Api::<Job>::namespaced(cluster.client.clone(), &ns).get("orders-final").await.expect("the final backup Job");
    assert_eq!(final_job.status.and_then(|s| s.succeeded), Some(1));
    let artefact = volume_path(&cluster, &ns, "orders-backups").await.join("orders-final");
    let files: Vec<_> = std::fs::read_dir(&artefact).map(|d| d.flatten().collect()).unwrap_or_default();
    let size: u64 = files.iter().filter_map(|f| f.metadata().ok()).map(|m| m.len()).sum();
    assert!(size > 1000, "the final backup's artefact {} holds data ({size} bytes)", artefact.display());
}

/// Deletion follows the policy on real volumes: `Retain` keeps the member's claim, its
/// data on disk and the credentials, and takes no final backup; `Delete` removes them.
pub async fn deletion_policies(cluster: Arc<Cluster>) {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
    let ns = "postgres-deletion";
    for (name, policy) in [("keep", "Retain"), ("drop", "Delete")] {
        cluster.apply_database(ns, database(name, Engine::Postgres, "15", 1, json!({"deletionPolicy": policy}))).await.expect("apply");
    }
    for name in ["keep", "drop"] {
        cluster.wait_database(ns, name, "Running", WAIT, |d| is_running(d, 1)).await.expect("running");
        let client = Client::new(&cluster, Engine::Postgres, ns, name).await;
        client.create_table(&client.service_ip(name).await).await;
    }
    let kept_volume = volume_path(&cluster, ns, "data-keep-0").await;
    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), ns);
    for name in ["keep", "drop"] {
        dbs.delete(name, &DeleteParams::default()).await.expect("delete");
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let gone = dbs.get_opt("keep").await.expect("get").is_none() && dbs.get_opt("drop").await.expect("get").is_none();
        let dropped = claims.get_opt("data-drop-0").await.expect("get").is_none()
            && secrets.get_opt("drop-credentials").await.expect("get").is_none();
        if gone && dropped {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "deleted: {gone}; Delete removed the volume and credentials: {dropped}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(claims.get_opt("data-keep-0").await.expect("get").is_some(), "Retain keeps the claim");
    assert!(secrets.get_opt("keep-credentials").await.expect("get").is_some(), "and the credentials that open it");
    assert!(kept_volume.join("pgdata/PG_VERSION").is_file(), "the data is still on disk at {}", kept_volume.display());
    assert!(
        Api::<Job>::namespaced(cluster.client.clone(), ns).get_opt("keep-final").await.expect("get").is_none(),
        "no final backup under Retain"
    );
}
