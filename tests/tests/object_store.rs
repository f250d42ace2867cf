//! Backups in object storage against a real S3 server (MinIO on loopback): what the
//! transfer containers of backup and restore Jobs do (the `plugdb` binary itself where
//! a process is killed), and what the operator's retention does to a bucket.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use plugdb::object_storage;
use plugdb_tests::minio::{ACCESS_KEY, Minio, SECRET_KEY};

const BUCKET: &str = "backups";

/// A file of `len` bytes whose content depends on `seed`.
fn write(path: &Path, len: usize, seed: u8) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    let bytes: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    std::fs::write(path, bytes).expect("write");
}

/// Every file under `dir` with its bytes, sorted.
fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let rel = path.strip_prefix(dir).expect("inside").to_string_lossy().into_owned();
                out.push((rel, std::fs::read(&path).expect("read")));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn a_backup_goes_up_file_by_file_and_comes_back_byte_for_byte() {
    let minio = Minio::on_loopback(&[BUCKET]).await.expect("minio");
    let store = minio.bucket(ACCESS_KEY, SECRET_KEY, BUCKET).store().expect("store");
    let work = tempfile::tempdir().expect("tempdir");

    // A directory artefact (as pg_basebackup -Ft writes), one file bigger than a part.
    let artefact = work.path().join("orders-1");
    write(&artefact.join("base.tar.gz"), 20 << 20, 1);
    write(&artefact.join("pg_wal/000000010000000000000001"), 70_000, 2);
    write(&artefact.join("backup_manifest"), 1_000, 3);
    let key = object_storage::backup_key("team/pg", "shop", "orders", "orders-1");
    let manifest = object_storage::upload(store.as_ref(), &key, &artefact).await.expect("upload");
    assert_eq!(manifest.files.len(), 3);
    assert_eq!(manifest.bytes(), (20 << 20) + 70_000 + 1_000);

    let restored = work.path().join("restored/orders-1");
    object_storage::download(store.as_ref(), &key, &restored).await.expect("download");
    assert_eq!(tree(&restored), tree(&artefact), "every file, byte for byte");

    // A single-file artefact (as a dump) comes back as a file of the same name.
    let dump = work.path().join("orders-2");
    write(&dump, 3_000, 4);
    let key2 = object_storage::backup_key("team/pg", "shop", "orders", "orders-2");
    object_storage::upload(store.as_ref(), &key2, &dump).await.expect("upload dump");
    let back = work.path().join("restored/orders-2");
    object_storage::download(store.as_ref(), &key2, &back).await.expect("download dump");
    assert_eq!(std::fs::read(&back).expect("read"), std::fs::read(&dump).expect("read"));

    // Listed under the Database's key, newest complete first; a file changed in the
    // bucket is caught on the way back.
    let listed = object_storage::list(store.as_ref(), &object_storage::database_key("team/pg", "shop", "orders")).await.expect("list");
    let names: Vec<&str> = listed.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["orders-2", "orders-1"]);
    assert!(listed.iter().all(|b| b.completed.is_some()));
    let tampered = minio.data.join(BUCKET).join("team/pg/shop/orders/orders-1/files/backup_manifest");
    assert!(tampered.exists(), "MinIO keeps objects as paths under its data directory");
    use object_store::ObjectStoreExt;
    let file_key = key.clone().join("files").join("backup_manifest");
    store.put(&file_key, vec![0u8; 1_000].into()).await.expect("overwrite");
    let err = object_storage::download(store.as_ref(), &key, &work.path().join("again")).await.expect_err("a changed file is refused");
    assert!(err.to_string().contains("SHA-256"), "{err}");
}

/// A transfer killed mid-upload (as when a backup Job's pod is deleted) leaves no
/// manifest: the backup is listed as incomplete, a restore never picks it, and
/// retention removes it once no Job is writing it.
#[tokio::test]
async fn an_upload_killed_midway_leaves_no_backup_a_restore_would_pick() {
    let minio = Minio::on_loopback(&[BUCKET]).await.expect("minio");
    let bucket = minio.bucket(ACCESS_KEY, SECRET_KEY, BUCKET);
    let store = bucket.store().expect("store");
    let work = tempfile::tempdir().expect("tempdir");
    let database = object_storage::database_key("", "shop", "orders");

    let small = work.path().join("small");
    write(&small.join("dump.sql"), 10_000, 5);
    object_storage::upload(store.as_ref(), &database.clone().join("orders-complete"), &small).await.expect("a complete backup first");

    let big = work.path().join("big");
    write(&big.join("a-small"), 1_000, 6);
    write(&big.join("base.tar"), 400 << 20, 7);
    let key = database.clone().join("orders-killed");
    let mut transfer = Command::new(plugdb_tests::plugdb_binary())
        .args(["transfer", "upload", "--artefact"])
        .arg(&big)
        .args(["--key", key.as_ref()])
        .env(object_storage::ENV_ENDPOINT, &bucket.endpoint)
        .env(object_storage::ENV_BUCKET, BUCKET)
        .env(object_storage::ENV_ACCESS_KEY_ID, ACCESS_KEY)
        .env(object_storage::ENV_SECRET_ACCESS_KEY, SECRET_KEY)
        .stdin(Stdio::null())
        .spawn()
        .expect("plugdb transfer upload");
    // Killed once the first file is stored and MinIO holds a part of the second: the
    // upload is under way, far from done.
    let first = minio.data.join(BUCKET).join("shop/orders/orders-killed/files/a-small");
    let multipart = minio.data.join(".minio.sys/multipart");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(first.exists() && std::fs::read_dir(&multipart).is_ok_and(|mut d| d.next().is_some())) {
        assert!(transfer.try_wait().expect("wait").is_none(), "the transfer ended before a part was stored");
        assert!(Instant::now() < deadline, "no part stored within 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    transfer.kill().expect("kill");
    transfer.wait().expect("reap");

    let listed = object_storage::list(store.as_ref(), &database).await.expect("list");
    let killed = listed.iter().find(|b| b.name == "orders-killed").expect("the killed upload's first file is in the bucket");
    assert_eq!(killed.completed, None, "listed as incomplete");
    assert_eq!(object_storage::newest(&listed).map(|b| b.name.as_str()), Some("orders-complete"), "{listed:?}");
    assert!(object_storage::manifest(store.as_ref(), &key).await.expect("read").is_none(), "no manifest for the killed upload");
    let err = object_storage::download(store.as_ref(), &key, &work.path().join("restored")).await.expect_err("not restorable");
    assert!(err.to_string().contains("not a complete backup"), "{err}");

    // Retention: while a Job writes it, it stays; after, it goes. The complete one stays.
    assert_eq!(object_storage::to_prune(&listed, 1, &["orders-killed".to_string()]), Vec::<String>::new());
    assert_eq!(object_storage::to_prune(&listed, 1, &[]), ["orders-killed"]);
    object_storage::remove(store.as_ref(), &key).await.expect("remove");
    let after = object_storage::list(store.as_ref(), &database).await.expect("list");
    assert_eq!(after.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), ["orders-complete"]);
}

#[tokio::test]
async fn retention_leaves_exactly_the_newest_n_in_the_bucket() {
    let minio = Minio::on_loopback(&[BUCKET]).await.expect("minio");
    let store = minio.bucket(ACCESS_KEY, SECRET_KEY, BUCKET).store().expect("store");
    let work = tempfile::tempdir().expect("tempdir");
    let database = object_storage::database_key("p", "shop", "orders");
    for i in 1..=4 {
        let artefact = work.path().join(format!("b{i}"));
        write(&artefact.join("data"), 1_000 * i, i as u8);
        object_storage::upload(store.as_ref(), &database.clone().join(format!("orders-{i}").as_str()), &artefact).await.expect("upload");
        // Manifests a second apart at least, so that "newest" is unambiguous.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    let listed = object_storage::list(store.as_ref(), &database).await.expect("list");
    let prune = object_storage::to_prune(&listed, 2, &[]);
    assert_eq!(prune, ["orders-2", "orders-1"]);
    for name in &prune {
        object_storage::remove(store.as_ref(), &database.clone().join(name.as_str())).await.expect("remove");
    }
    let left = object_storage::list(store.as_ref(), &database).await.expect("list");
    assert_eq!(left.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), ["orders-4", "orders-3"]);
    // Nothing of the removed ones is left behind in the bucket.
    assert!(!minio.data.join(BUCKET).join("p/shop/orders/orders-1").exists());
}

#[tokio::test]
async fn a_wrong_key_or_a_missing_bucket_is_said_plainly() {
    let minio = Minio::on_loopback(&[BUCKET]).await.expect("minio");
    let database = object_storage::database_key("", "shop", "orders");

    let wrong = minio.bucket(ACCESS_KEY, "not-the-secret", BUCKET).store().expect("store");
    let err = object_storage::list(wrong.as_ref(), &database).await.expect_err("a wrong key is refused");
    assert!(err.to_string().contains("SignatureDoesNotMatch") || err.to_string().contains("Access Denied"), "{err}");

    let missing = minio.bucket(ACCESS_KEY, SECRET_KEY, "no-such-bucket").store().expect("store");
    let err = object_storage::list(missing.as_ref(), &database).await.expect_err("a missing bucket");
    assert!(err.to_string().contains("NoSuchBucket") || err.to_string().contains("does not exist"), "{err}");
}

/// An endpoint with a private CA: reached with the CA given (`spec.backup.s3.ca`),
/// refused without it, as any client would refuse an unknown certificate.
#[tokio::test]
async fn an_endpoint_signed_by_a_private_ca_is_reached_with_that_ca_only() {
    let minio = Minio::on_loopback_tls(&[BUCKET]).await.expect("minio over https");
    assert!(minio.endpoint.starts_with("https://"), "{}", minio.endpoint);
    let database = object_storage::database_key("", "shop", "orders");
    let trusted = minio.bucket(ACCESS_KEY, SECRET_KEY, BUCKET).store().expect("store");
    let work = tempfile::tempdir().expect("tempdir");
    write(&work.path().join("dump.sql"), 2_000, 8);
    object_storage::upload(trusted.as_ref(), &database.clone().join("orders-tls"), &work.path().join("dump.sql"))
        .await
        .expect("upload over https");
    let listed = object_storage::list(trusted.as_ref(), &database).await.expect("list over https");
    assert_eq!(object_storage::newest(&listed).map(|b| b.name.as_str()), Some("orders-tls"));

    let mut unknown = minio.bucket(ACCESS_KEY, SECRET_KEY, BUCKET);
    unknown.ca_pem = None;
    let err = object_storage::list(unknown.store().expect("store").as_ref(), &database).await.expect_err("an unknown CA is refused");
    assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");
}

#[tokio::test]
async fn the_archive_ships_finished_segments_only_and_a_restore_takes_what_its_backup_replays() {
    let minio = Minio::on_loopback(&[BUCKET]).await.expect("minio");
    let store = minio.bucket(ACCESS_KEY, SECRET_KEY, BUCKET).store().expect("store");
    let work = tempfile::tempdir().expect("tempdir");
    let database = object_storage::database_key("pg", "shop", "orders");
    let archive = database.clone().join(object_storage::ARCHIVE);

    // The engine's directory: two finished segments, one still being written (a dot name).
    let spool = work.path().join("spool");
    write(&spool.join("000000010000000000000001"), 70_000, 1);
    write(&spool.join("000000010000000000000002"), 70_000, 2);
    write(&spool.join(".000000010000000000000003"), 10, 3);
    assert_eq!(object_storage::ship(store.as_ref(), &spool, &archive).await.expect("ship"), 2);
    let left: Vec<String> = std::fs::read_dir(&spool).expect("spool").flatten().map(|e| e.file_name().to_string_lossy().into()).collect();
    assert_eq!(left, [".000000010000000000000003"], "shipped segments are removed; one being written is left alone");
    let segments = object_storage::archived(store.as_ref(), &database).await.expect("archived");
    let names: Vec<&str> = segments.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["000000010000000000000001", "000000010000000000000002"]);

    // The archive is never mistaken for a backup (retention would remove it).
    let artefact = work.path().join("orders-1");
    write(&artefact.join("base.tar.gz"), 1_000, 4);
    let backup = database.clone().join("orders-1");
    let manifest = object_storage::upload(store.as_ref(), &backup, &artefact).await.expect("upload");
    let listed = object_storage::list(store.as_ref(), &database).await.expect("list");
    assert_eq!(listed.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), ["orders-1"]);
    assert!(manifest.started <= manifest.completed);

    // A restore from the backup downloads the segments stored since it started.
    let replay = work.path().join("replay");
    let count = object_storage::download_archive(store.as_ref(), &database, manifest.started, &replay).await.expect("download");
    assert_eq!(count, 2);
    assert_eq!(tree(&replay).len(), 2);
    let expected: Vec<u8> = (0..70_000usize).map(|i| (i as u8).wrapping_mul(31).wrapping_add(2)).collect();
    assert_eq!(std::fs::read(replay.join("000000010000000000000002")).expect("segment"), expected, "byte for byte");
    // A backup that started long after them needs none, and retention removes them.
    let later = manifest.started + Duration::from_secs(3600);
    assert_eq!(object_storage::download_archive(store.as_ref(), &database, later, &work.path().join("none")).await.expect("download"), 0);
    assert!(object_storage::not_replayed(&segments, manifest.started).is_empty(), "the backup replays them");
    let old = object_storage::not_replayed(&segments, later);
    assert_eq!(old.len(), 2);
    assert_eq!(object_storage::remove_segments(store.as_ref(), &database, &old).await.expect("remove"), 2);
    assert!(object_storage::archived(store.as_ref(), &database).await.expect("archived").is_empty());
}

/// A whole pass over a Database whose backups are in the bucket: the pass reads the
/// bucket with the key from the Secret the spec names, removes the complete backups past
/// retention and an incomplete one no Job writes, says so in an Event, and the status
/// says what a restore reaches, confirmed now.
#[tokio::test]
async fn a_pass_prunes_the_bucket_past_retention_and_says_what_a_restore_reaches() {
    use plugdb_tests::pass::{Server, made, pass_over, registry, running, status};
    let minio = Minio::on_loopback(&[BUCKET]).await.expect("minio");
    let store = minio.bucket(ACCESS_KEY, SECRET_KEY, BUCKET).store().expect("store");
    let work = tempfile::tempdir().expect("tempdir");
    let database = object_storage::database_key("", "shop", "orders");
    for (i, name) in ["orders-2611260200", "orders-2611270200", "orders-gone", "orders-2611280200"].into_iter().enumerate() {
        let artefact = work.path().join(name);
        write(&artefact.join("data"), 1_000, i as u8);
        object_storage::upload(store.as_ref(), &database.clone().join(name), &artefact).await.expect("upload");
        // Manifests a second apart at least, so that "newest" is unambiguous.
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    // A backup whose upload never finished: its manifest is missing.
    object_store::ObjectStoreExt::delete(store.as_ref(), &database.clone().join("orders-gone").join(object_storage::MANIFEST))
        .await
        .expect("delete the manifest");

    let registry = registry().await;
    let s3 = serde_json::json!({"endpoint": minio.endpoint, "bucket": BUCKET, "credentials": {"secretName": "s3"}});
    let (db, made) =
        made(&registry, serde_json::json!({"replicas": 3, "backup": {"schedule": "0 2 * * *", "retention": 2, "s3": s3}})).await;
    let b64 = |s: &str| serde_json::to_value(k8s_openapi::ByteString(s.as_bytes().to_vec())).expect("base64");
    let secret = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3", "namespace": "shop"},
        "data": {"accessKeyId": b64(ACCESS_KEY), "secretAccessKey": b64(SECRET_KEY)},
    });
    let loopback = plugdb::egress::Policy::new(vec![], vec!["127.0.0.1/32".parse().expect("a network")], vec![]);
    let server =
        Server { served: vec![("/api/v1/namespaces/shop/secrets/s3".into(), secret)], egress: Some(loopback), ..Server::default() };
    let cluster = running(&made, "r1", &[(true, "r1"), (true, "r1"), (true, "r1")]);
    let (result, calls, api) = pass_over(&registry, &db, &cluster, &server).await;
    assert!(result.is_ok(), "{result:?}");

    let left = object_storage::list(store.as_ref(), &database).await.expect("list");
    assert_eq!(left.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), ["orders-2611280200", "orders-2611270200"]);
    let event = calls.iter().find(|c| c.body["reason"] == "BackupsPruned").expect("an Event of the pruning");
    let note = event.body["note"].as_str().or(event.body["message"].as_str()).unwrap_or_default();
    assert!(note.contains("1 backup(s) beyond the newest 2 (orders-2611260200)") && note.contains("(orders-gone)"), "{note}");
    let status = status(&api);
    let reach = status.recoverable.expect("what a restore reaches");
    assert_eq!(reach.backups, 2, "{reach:?}");
    assert!(reach.confirmed.is_some() && reach.unreachable_since.is_none(), "{reach:?}");
    let healthy = status.conditions.iter().find(|c| c.type_ == "BackupHealthy").expect("BackupHealthy");
    assert_eq!(healthy.status, "True", "{healthy:?}");
}
