//! Data on the real node: backups, restores and the final snapshot.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use plugdb::crd::Database;
use plugdb::object_storage;
use plugdb_tests::minio::{ACCESS_KEY, Minio, SECRET_KEY};
use plugdb_tests::operator::{Backing, Cluster};
use serde_json::json;

use plugdb_tests::scenario::{Client, Engine, WAIT, database, is_running, pod_ip, signal_engine, volume_path};

use crate::{plugdb, plugdb_with_input};

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

    // `kubectl plugdb backup`: a backup on demand, waited for.
    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), &ns);
    let said = plugdb(&cluster, &["backup", "orders", "-n", &ns]).await;
    let source = dbs.get("orders").await.expect("orders");
    let backup = source.status.and_then(|s| s.last_backup).expect("last backup").name;
    assert!(said.starts_with(&format!("backup {backup} of Database {ns}/orders completed at ")), "{said}");
    assert!(backup.starts_with("orders-manual-"), "{backup}");
    // Written after the backup: must not be in the copy.
    client.insert(&primary, 1001..1002).await;

    // `kubectl plugdb restore`: a new Database with the source's spec, from that backup, followed until it runs.
    let said = plugdb(&cluster, &["restore", "orders", "--as", "copy", "--backup", &backup, "-n", &ns]).await;
    assert!(said.starts_with(&format!("Database {ns}/copy restored from Database {ns}/orders and Running")), "{said}");
    let copied = dbs.get("copy").await.expect("copy");
    assert_eq!(copied.spec.restore_from.as_ref().and_then(|r| r.backup.as_deref()), Some(backup.as_str()));
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
    // The administrator logs in from its own member alone: MariaDB's root logged in over
    // the network while the restore Job loaded the dump, and no longer once the members
    // rolled after it.
    let refused = match engine {
        Engine::Postgres => "pg_hba.conf rejects connection",
        Engine::Mysql => "Access denied for user 'root'",
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let said = copy.administrator_over_the_network(&copy_host).await;
        if said.as_ref().is_err_and(|e| e.contains(refused)) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the administrator over the network: {said:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    // `kubectl plugdb logs`: the primary's engine log; `kubectl plugdb plugins`: the
    // engine's ConfigMap, what its plugin says, its pinned digest, and that it serves.
    let log = plugdb(&cluster, &["logs", "copy", "-n", &ns]).await;
    let ready = match engine {
        Engine::Postgres => "database system is ready to accept connections",
        Engine::Mysql => "ready for connections",
    };
    assert!(log.contains(ready), "the engine's log: {log}");
    if engine == Engine::Postgres {
        // One JSON object a line, through the container's log, once the engine runs.
        let said = log.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).any(|r| {
            r["error_severity"] == "LOG" && r["backend_type"] == "postmaster" && r["message"].as_str().is_some_and(|m| m.contains(ready))
        });
        assert!(said, "the engine's log as JSON lines: {log}");
    }
    let agent = plugdb(&cluster, &["logs", "copy", "--member", "0", "--container", "agent", "--tail", "5", "-n", &ns]).await;
    assert!(agent.lines().count() <= 5 && !agent.contains(ready), "the agent's log, its last lines: {agent}");
    // Every member's engine log of the last hour, merged in time order, each line named.
    let all = plugdb(&cluster, &["logs", "orders", "--all", "--since", "1h", "-n", &ns]).await;
    let lines: Vec<(&str, &str)> = all.lines().filter_map(|l| l.split_once(' ')).collect();
    assert!(lines.windows(2).all(|w| w[0].0 <= w[1].0), "in time order: {all}");
    assert!(lines.iter().all(|(_, rest)| rest.starts_with("orders-")), "each line names its member: {all}");
    assert!(all.contains(ready), "{all}");
    let graver = plugdb(&cluster, &["logs", "orders", "--all", "--level", "warning", "-n", &ns]).await;
    assert!(
        graver.lines().all(|l| plugdb::cli::logs::level_of(l).is_some()) && !graver.contains(ready),
        "warnings and errors only: {graver}"
    );
    // `kubectl plugdb connect`: the engine's client in the primary, logged in, no password typed.
    let (query, says) = match engine {
        // The scenario's tables are in the application's database, `app`.
        Engine::Postgres => ("\\c app\nSELECT count(*) || ' rows' FROM orders;\n", "1000 rows"),
        Engine::Mysql => ("SELECT CONCAT(COUNT(*), ' rows') FROM app.orders;\n", "1000 rows"),
    };
    let answer = plugdb_with_input(&cluster, &["connect", "copy", "-n", &ns], Some(query)).await;
    assert!(answer.contains(says), "the client's answer: {answer}");
    let plugins = plugdb(&cluster, &["plugins"]).await;
    let name = format!("engine-{}", engine.name());
    let block: String =
        plugins.split(&format!("{name} (ConfigMap plugdb-system/{name})")).nth(1).expect(&plugins).lines().take(11).collect();
    let digest = format!("sha256:            {}", plugdb::plugin::hex_digest(&plugdb_tests::component(engine.name())));
    // The harness's ConfigMaps pin no digest (`plugdb plugin pack` does).
    for says in [&format!("engine:            {}", engine.name()), "backup, restore, failover", &digest, "no digest pinned", "serving ("] {
        assert!(block.contains(says), "{says}: {plugins}");
    }

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
/// data on disk, the credentials and the application's login, and takes no final
/// backup; `Delete` removes them. A Database made again with the kept one's name takes
/// what was kept (plugdb's stamp holds on its credentials) and serves the kept rows; one
/// whose credentials someone else made with plugdb's labels takes nothing and says so.
pub async fn deletion_policies(cluster: Arc<Cluster>) {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
    let ns = "postgres-deletion";
    for (name, policy) in [("keep", "Retain"), ("drop", "Delete")] {
        cluster.apply_database(ns, database(name, Engine::Postgres, "15", 1, json!({"deletionPolicy": policy}))).await.expect("apply");
    }
    for name in ["keep", "drop"] {
        cluster.wait_database(ns, name, "Running", WAIT, |d| is_running(d, 1)).await.expect("running");
        let client = Client::new(&cluster, Engine::Postgres, ns, name).await;
        let service = client.service_ip(name).await;
        client.create_table(&service).await;
        client.query(&service, "INSERT INTO orders VALUES (7, 'kept')").await.expect("a row");
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
            && secrets.get_opt("drop-credentials").await.expect("get").is_none()
            && secrets.get_opt("drop-app").await.expect("get").is_none();
        if gone && dropped {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "deleted: {gone}; Delete removed the volume and credentials: {dropped}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(claims.get_opt("data-keep-0").await.expect("get").is_some(), "Retain keeps the claim");
    assert!(secrets.get_opt("keep-credentials").await.expect("get").is_some(), "and the credentials that open it");
    assert!(secrets.get_opt("keep-app").await.expect("get").is_some(), "and the application's login");
    assert!(kept_volume.join("pgdata/PG_VERSION").is_file(), "the data is still on disk at {}", kept_volume.display());
    assert!(
        Api::<Job>::namespaced(cluster.client.clone(), ns).get_opt("keep-final").await.expect("get").is_none(),
        "no final backup under Retain"
    );

    // Someone with the right to make Secrets here makes `forged`'s credentials, with
    // plugdb's labels, before the Database.
    let labels = json!({"app.kubernetes.io/managed-by": "plugdb", "app.kubernetes.io/instance": "forged"});
    let forged: Secret =
        serde_json::from_value(json!({"metadata": {"name": "forged-credentials", "labels": labels}, "data": {"password": "Y2hvc2Vu"}}))
            .expect("a Secret");
    secrets.create(&Default::default(), &forged).await.expect("a forged Secret");
    for name in ["keep", "forged"] {
        cluster.apply_database(ns, database(name, Engine::Postgres, "15", 1, json!({"deletionPolicy": "Delete"}))).await.expect("apply");
    }
    cluster.wait_database(ns, "keep", "Running on what was kept", WAIT, |d| is_running(d, 1)).await.expect("made again");
    let client = Client::new(&cluster, Engine::Postgres, ns, "keep").await;
    // The Service is new: its address may route nowhere for a moment yet.
    let service = client.service_ip("keep").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let read = loop {
        match client.ids(&service).await {
            Err(e) if e.contains("Connection refused") && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_secs(1)).await
            }
            read => break read,
        }
    };
    assert_eq!(read, Ok(vec![7]), "the kept rows, opened with the kept credentials");
    let refused = |d: &Database| {
        d.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| c.type_ == "Ready" && c.reason == "NameTaken" && c.message.contains("not plugdb's stamp"))
        })
    };
    cluster.wait_database(ns, "forged", "refusing the forged credentials", WAIT, refused).await.expect("refused");
    let members: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(cluster.client.clone(), ns);
    assert!(members.get_opt("forged").await.expect("get").is_none(), "no member starts with the forged credentials");
}

/// Backups in a real S3 server (MinIO in the node's network namespace), for `engine`:
/// backups on demand land in the bucket (the Database's own namespace holds no backup
/// volume), retention leaves exactly the newest 2 and says so in an Event, and a new
/// Database in another namespace restores the newest one with identical rows. A wrong
/// key and a missing bucket are conditions that name them, and the Database runs on.
pub async fn backups_in_object_storage(cluster: Arc<Cluster>, engine: Engine, version: &str) {
    let Backing::Node(node) = &cluster.backing else { panic!("needs the real node") };
    let bucket_name = format!("{}-backups", engine.name());
    let port = match engine {
        Engine::Postgres => 9000,
        Engine::Mysql => 9010,
    };
    let minio = Minio::on_node(node, port, &[&bucket_name]).await.expect("minio on the node");
    let ns = format!("{}-s3", engine.name());
    let copy_ns = format!("{}-s3-copy", engine.name());
    let target = |secret: &str, bucket: &str| json!({"endpoint": minio.endpoint, "bucket": bucket, "prefix": "plugdb-tests", "credentials": {"secretName": secret}});
    // Both archive their log (WAL, binary logs) for point-in-time recovery: often, for the test.
    let parameters = json!({"archive_timeout": "5s"});
    let yearly = |s3: serde_json::Value| json!({"backup": {"schedule": "0 0 1 1 *", "retention": 2, "s3": s3}, "deletionPolicy": "Delete", "parameters": parameters});
    cluster.apply_database(&ns, database("orders", engine, version, 1, yearly(target("s3", &bucket_name)))).await.expect("apply");
    for namespace in [&ns, &copy_ns] {
        s3_secret(&cluster, namespace, "s3", SECRET_KEY).await;
    }
    cluster.wait_database(&ns, "orders", "Running", WAIT, |d| is_running(d, 1)).await.expect("running");
    let client = Client::new(&cluster, engine, &ns, "orders").await;
    let primary = client.service_ip("orders").await;
    client.create_table(&primary).await;

    // Three backups on demand, rows added between them: retention keeps the newest 2.
    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), &ns);
    let mut expected = String::new();
    for (round, token) in ["first", "second", "third"].into_iter().enumerate() {
        let from = round as i64 * 100 + 1;
        client.insert(&primary, from..from + 100).await;
        expected = client.checksum(&primary).await;
        let annotate = json!({"metadata": {"annotations": {"plugdb.io/backup-now": token}}});
        dbs.patch("orders", &PatchParams::default(), &Patch::Merge(annotate)).await.expect("annotate");
        cluster
            .wait_database(&ns, "orders", &format!("the {token} backup"), WAIT, |d| {
                d.status.as_ref().is_some_and(|s| {
                    s.backup_request.as_deref() == Some(token)
                        && s.last_backup.as_ref().is_some_and(|b| b.name == format!("orders-manual-{}", &hex(token)[..10]))
                })
            })
            .await
            .expect("backup");
    }
    let store = minio.bucket(ACCESS_KEY, SECRET_KEY, &bucket_name).store().expect("store");
    let database_key = object_storage::database_key("plugdb-tests", &ns, "orders");
    let deadline = tokio::time::Instant::now() + WAIT;
    let kept = loop {
        let listed = object_storage::list(store.as_ref(), &database_key).await.expect("list the bucket");
        if listed.len() == 2 {
            break listed;
        }
        assert!(tokio::time::Instant::now() < deadline, "retention leaves 2 backups in the bucket: {listed:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let third = format!("orders-manual-{}", &hex("third")[..10]);
    assert!(kept.iter().all(|b| b.completed.is_some()), "{kept:?}");
    assert_eq!(object_storage::newest(&kept).map(|b| b.name.clone()), Some(third.clone()));
    // Status says what a restore reaches: from the oldest kept backup up to where the
    // archived log ends.
    let newest = object_storage::newest(&kept).and_then(|b| b.completed).expect("a newest backup");
    let db = cluster
        .wait_database(&ns, "orders", "the recoverable window", WAIT, |d| {
            d.status.as_ref().and_then(|s| s.recoverable.as_ref()).is_some_and(|r| {
                let last = r.last.as_deref().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
                r.backups == 2 && r.point_in_time && last.is_some_and(|l| l >= newest)
            })
        })
        .await
        .expect("recoverable");
    let window = db.status.and_then(|s| s.recoverable).expect("recoverable");
    assert!(window.first < window.last, "{window:?}");
    // The member's agent measures what waits to be shipped: nothing for long.
    let member = client.members().await.into_iter().next().expect("the member");
    let series = plugdb_tests::scenario::agent_series(&member).await;
    let value = |name: &str| series.lines().find_map(|l| l.strip_prefix(&format!("{name}{{"))?.rsplit(' ').next()?.parse::<f64>().ok());
    assert!(value("plugdb_member_archive_pending_segments").is_some(), "{series}");
    let waited = value("plugdb_member_archive_oldest_pending_seconds");
    assert!(waited.is_some_and(|w| w < 300.0), "the archiver keeps up: {waited:?}");
    let events = Api::<Event>::namespaced(cluster.client.clone(), &ns).list(&Default::default()).await.expect("events").items;
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("BackupsPruned") && e.note.as_deref().is_some_and(|n| n.contains(&bucket_name))),
        "an Event says what retention removed"
    );
    assert!(
        Api::<PersistentVolumeClaim>::namespaced(cluster.client.clone(), &ns).get_opt("orders-backups").await.expect("get").is_none(),
        "no backup volume: the backups are in the bucket"
    );

    // Restore into another namespace, from the bucket alone: the newest backup.
    let restore =
        json!({"restoreFrom": {"database": "orders", "namespace": ns, "s3": target("s3", &bucket_name)}, "deletionPolicy": "Delete"});
    cluster.apply_database(&copy_ns, database("copy", engine, version, 1, restore)).await.expect("apply copy");
    let copied = cluster.wait_database(&copy_ns, "copy", "Running after the restore", WAIT, |d| is_running(d, 1)).await.expect("restored");
    let restored = copied.status.expect("status").conditions.into_iter().find(|c| c.type_ == "Restored").expect("Restored");
    assert!(restored.message.contains(&third), "{}", restored.message);
    let copy = Client::new(&cluster, engine, &copy_ns, "copy").await;
    let copy_host = copy.service_ip("copy").await;
    copy.reachable(&copy_host).await;
    assert_eq!(copy.checksum(&copy_host).await, expected, "the copy holds exactly the rows of the newest backup");

    point_in_time_recovery(&cluster, engine, &client, &primary, &ns).await;
    if engine == Engine::Postgres {
        interrupted_upload(&cluster, &minio, &client, &primary, &ns, &bucket_name).await;
    }

    // A wrong key, then a missing bucket: a condition names each; the Database runs on
    // (with an archiver, its members restart once to take the new target).
    s3_secret(&cluster, &ns, "s3-wrong", "not-the-secret-key").await;
    let refusals: [(&str, &str, &[&str]); 2] = [
        ("s3-wrong", &bucket_name, &["SignatureDoesNotMatch", "Access Denied"]),
        ("s3", "no-such-bucket", &["NoSuchBucket", "does not exist"]),
    ];
    for (secret, bucket, expect) in refusals {
        cluster.apply_database(&ns, database("orders", engine, version, 1, yearly(target(secret, bucket)))).await.expect("apply");
        let annotate = json!({"metadata": {"annotations": {"plugdb.io/backup-now": format!("with-{secret}-{bucket}")}}});
        dbs.patch("orders", &PatchParams::default(), &Patch::Merge(annotate)).await.expect("annotate");
        let db = cluster
            .wait_database(&ns, "orders", "a backup condition naming the problem, running", WAIT, |d| {
                is_running(d, 1)
                    && d.status.as_ref().is_some_and(|s| {
                        s.conditions.iter().any(|c| {
                            c.type_ == "BackupHealthy"
                                && c.status == "False"
                                && c.message.contains(bucket)
                                && expect.iter().any(|e| c.message.contains(e))
                        })
                    })
            })
            .await
            .expect("condition");
        let message = db.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "BackupHealthy")).map(|c| c.message.clone());
        assert!(message.as_deref().is_some_and(|m| m.contains("spec.backup.s3")), "{message:?}");
    }
    // The node's CPU is shared with the other scenarios: their members go, with their pods.
    for (namespace, name) in [(ns.as_str(), "orders"), (copy_ns.as_str(), "copy")] {
        Api::<Database>::namespaced(cluster.client.clone(), namespace).delete(name, &DeleteParams::default()).await.expect("delete");
    }
    for namespace in [&ns, &copy_ns] {
        let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
        let deadline = tokio::time::Instant::now() + WAIT;
        while !pods
            .list(&Default::default())
            .await
            .expect("pods")
            .items
            .iter()
            .all(|p| p.metadata.labels.as_ref().is_some_and(|l| l.contains_key("job-name")))
        {
            assert!(tokio::time::Instant::now() < deadline, "the members in {namespace} did not go");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    drop(minio);
}

/// Rows written before and after a moment; the archived log replayed into a new
/// Database of two members up to that moment (`kubectl plugdb restore orders --as moment
/// --to MOMENT --replicas 2`) holds the first and not the second, on both members: the
/// second joins once the restore is done, and copies it.
async fn point_in_time_recovery(cluster: &Arc<Cluster>, engine: Engine, client: &Client, primary: &str, ns: &str) {
    let archive = Api::<Pod>::namespaced(cluster.client.clone(), ns).get("orders-0").await.expect("member 0");
    let names: Vec<String> = archive.spec.iter().flat_map(|s| &s.containers).map(|c| c.name.clone()).collect();
    assert_eq!(names[..2], [engine.name(), "archive"], "the archiver runs beside the engine");
    client.insert(primary, 1000..1010).await;
    let before = client.checksum(primary).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let moment = chrono::Utc::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    client.insert(primary, 2000..2010).await;
    let after_second = chrono::Utc::now();
    assert_ne!(client.checksum(primary).await, before);
    // The window grows with the archive, past the second write, between backups. A log
    // is archived once it is closed, and MariaDB closes one only while writes arrive:
    // the source keeps taking a row every 5 s, as a live database does.
    let past_second = |d: &Database| {
        d.status
            .as_ref()
            .and_then(|s| s.recoverable.as_ref())
            .and_then(|r| r.last.as_deref())
            .is_some_and(|t| chrono::DateTime::parse_from_rfc3339(t).is_ok_and(|t| t > after_second))
    };
    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), ns);
    let deadline = tokio::time::Instant::now() + WAIT;
    for id in 3000.. {
        let db = dbs.get("orders").await.expect("get");
        if past_second(&db) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the archive does not reach past the second write: {:?}", db.status);
        client.insert(primary, id..id + 1).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    }

    let at = moment.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let said = plugdb(cluster, &["restore", "orders", "--as", "moment", "--to", &at, "--replicas", "2", "-n", ns]).await;
    assert!(said.starts_with(&format!("Database {ns}/moment restored from Database {ns}/orders and Running")), "{said}");
    let recovered = dbs.get("moment").await.expect("moment");
    let from = recovered.spec.restore_from.as_ref().expect("restoreFrom");
    assert_eq!((from.point_in_time.as_deref(), from.namespace.as_deref()), (Some(at.as_str()), Some(ns)), "{from:?}");
    cluster.wait_database(ns, "moment", "Running at the moment", WAIT, |d| is_running(d, 2)).await.expect("recovered");
    let copy = Client::new(cluster, engine, ns, "moment").await;
    let host = copy.service_ip("moment").await;
    copy.reachable(&host).await;
    assert_eq!(copy.checksum(&host).await, before, "the rows written before the moment, and not those after");
    let restored = Api::<Job>::namespaced(cluster.client.clone(), ns).get("moment-restore").await.expect("the restore Job");
    let done = restored.status.and_then(|s| s.completion_time).expect("the restore completed");
    let members = copy.members().await;
    assert_eq!(members.len(), 2);
    assert!(members[1].metadata.creation_timestamp.as_ref().is_some_and(|t| t.0 >= done.0), "member 1 joins after the restore");
    copy.eventually(&pod_ip(&members[1]), "SELECT COUNT(*) FROM orders", WAIT, |rows| !rows.is_empty()).await;
    assert_eq!(copy.checksum(&pod_ip(&members[1])).await, before, "member 1 holds the restored rows");
    dbs.delete("moment", &DeleteParams::default()).await.expect("delete");
}

/// A backup Job's uploader killed mid-upload (its first file stored, the manifest not yet):
/// the bucket holds no complete backup under that name, a restore would take the
/// previous one, and the Job's next pod takes the backup again, whole.
async fn interrupted_upload(cluster: &Cluster, minio: &Minio, client: &Client, primary: &str, ns: &str, bucket: &str) {
    // Incompressible rows, so that uploading the base backup takes seconds.
    let bulk = "CREATE TABLE bulk AS SELECT decode(md5(random()::text) || md5(random()::text) || md5(random()::text) \
                || md5(random()::text), 'hex') AS b FROM generate_series(1, 1500000)";
    client.query(primary, bulk).await.expect("bulk rows");
    let store = minio.bucket(ACCESS_KEY, SECRET_KEY, bucket).store().expect("store");
    let database_key = object_storage::database_key("plugdb-tests", ns, "orders");
    let complete = |listed: &[object_storage::Listed]| object_storage::newest(listed).map(|b| b.name.clone());
    let before = complete(&object_storage::list(store.as_ref(), &database_key).await.expect("list")).expect("a complete backup");

    let token = "interrupted";
    let name = format!("orders-manual-{}", &hex(token)[..10]);
    let annotate = json!({"metadata": {"annotations": {"plugdb.io/backup-now": token}}});
    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), ns);
    dbs.patch("orders", &PatchParams::default(), &Patch::Merge(annotate)).await.expect("annotate");
    let stored = minio.data.join(bucket).join("plugdb-tests").join(ns).join("orders").join(&name);
    let deadline = tokio::time::Instant::now() + WAIT;
    while !std::fs::read_dir(stored.join("files")).is_ok_and(|mut d| d.next().is_some()) {
        assert!(tokio::time::Instant::now() < deadline, "no file of {name} reached the bucket");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // SIGKILL from the node, as a crash of the node or the pod would: no chance to finish.
    // Its file is in the bucket before the kubelet may have said the container runs (a
    // busy node reports late): the pod as soon as it says so.
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let selector = kube::api::ListParams::default().labels(&format!("job-name={name}"));
    let running = |p: &Pod| {
        let statuses = p.status.as_ref().and_then(|s| s.container_statuses.as_ref());
        statuses.is_some_and(|c| c.iter().any(|c| c.container_id.is_some() && c.state.as_ref().is_some_and(|s| s.running.is_some())))
    };
    let uploading = loop {
        let listed = pods.list(&selector).await.expect("pods").items;
        assert_eq!(listed.len(), 1, "one pod uploads");
        if running(&listed[0]) {
            break listed;
        }
        assert!(tokio::time::Instant::now() < deadline, "the uploading pod never said its container runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    signal_engine(&uploading[0], "plugdb", "KILL");
    assert!(!stored.join(object_storage::MANIFEST).exists(), "the upload finished before it could be interrupted");

    let key = database_key.clone().join(name.as_str());
    let listed = object_storage::list(store.as_ref(), &database_key).await.expect("list");
    let killed = listed.iter().find(|b| b.name == name).expect("the killed upload's first file is in the bucket");
    assert_eq!(killed.completed, None, "listed as incomplete");
    assert_eq!(complete(&listed), Some(before.clone()), "a restore takes the previous backup: {listed:?}");
    assert!(object_storage::manifest(store.as_ref(), &key).await.expect("read").is_none(), "no manifest for the killed upload");
    let db = dbs.get("orders").await.expect("get");
    assert_eq!(db.status.and_then(|s| s.last_backup).map(|b| b.name), Some(before), "status still names the last complete backup");

    // The Job's next pod runs the backup again and completes it.
    cluster
        .wait_database(ns, "orders", "the interrupted backup taken again", WAIT, |d| {
            d.status.as_ref().and_then(|s| s.last_backup.as_ref()).is_some_and(|b| b.name == name)
        })
        .await
        .expect("the retried backup");
    let manifest = object_storage::manifest(store.as_ref(), &key).await.expect("read").expect("complete now");
    let size: u64 = manifest.files.iter().map(|f| f.bytes).sum();
    assert!(size > 64 << 20, "the whole base backup: {size} bytes");
}

fn hex(token: &str) -> String {
    plugdb::plugin::hex_digest(token.as_bytes())
}

/// A Secret `name` in `namespace` (made if need be) with the test server's access key and `secret_key`.
async fn s3_secret(cluster: &Cluster, namespace: &str, name: &str, secret_key: &str) {
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    let object = Namespace { metadata: kube::api::ObjectMeta { name: Some(namespace.into()), ..Default::default() }, ..Default::default() };
    namespaces.patch(namespace, &PatchParams::apply("test"), &Patch::Apply(&object)).await.expect("the namespace");
    let secret = Secret {
        metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
        string_data: Some(
            [("accessKeyId".to_string(), ACCESS_KEY.to_string()), ("secretAccessKey".to_string(), secret_key.to_string())].into(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(cluster.client.clone(), namespace)
        .patch(name, &PatchParams::apply("test").force(), &Patch::Apply(&secret))
        .await
        .expect("the S3 Secret");
}
