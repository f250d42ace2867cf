//! Volumes that grow before they fill, on storage that really grows: csi-loop's volumes
//! are each an XFS of their own on a loop device, grown online when their claim asks.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use plugdb_tests::node::GROWING_STORAGE_CLASS;
use plugdb_tests::operator::Cluster;
use plugdb_tests::scenario::{Client, Engine, WAIT, database, df_in, is_running};
use serde_json::json;

/// The default threshold of `storageGrowth`, in percent.
const THRESHOLD: u64 = 80;
const MI: u64 = 1 << 20;

/// A postgres and a mysql Database, one member each on 600Mi volumes that grow by half
/// at the default threshold, are written to until the member's volume passes it: the
/// volume grows under the running engine (the same pod, no container restarted, `df`
/// inside it shows the larger size), no write is refused, and the member then holds more
/// than the volume's first size.
pub async fn volumes_grow_before_they_fill(cluster: Arc<Cluster>) {
    futures::join!(fill_until_grown(&cluster, Engine::Postgres, "17"), fill_until_grown(&cluster, Engine::Mysql, "11.8"));
}

fn restarts(pod: &Pod) -> i32 {
    pod.status.iter().flat_map(|s| s.container_statuses.iter().flatten()).map(|c| c.restart_count).sum()
}

async fn fill_until_grown(cluster: &Cluster, engine: Engine, version: &str) {
    let ns = format!("{}-growth", engine.name());
    let name = "filling";
    let spec = json!({"storage": "600Mi", "storageClassName": GROWING_STORAGE_CLASS,
                      "storageGrowth": {"step": "50%", "limit": "2Gi"}});
    cluster.apply_database(&ns, database(name, engine, version, 1, spec)).await.expect("apply");
    cluster.wait_database(&ns, name, "1 member Ready", WAIT, |d| is_running(d, 1)).await.expect("running");
    let client = Client::new(cluster, engine, &ns, name).await;
    let primary = client.service_ip(name).await;
    client.reachable(&primary).await;
    let member = client.members().await.remove(0);
    let (first, used) = df_in(&member);
    assert!(first <= 600 * MI && first > 500 * MI, "{ns}: the member's volume is a filesystem of its own, 600Mi: {first} bytes");
    assert!(used * 100 < first * THRESHOLD, "{ns}: below the threshold before any write: {used} of {first}");

    let (create, batch) = match engine {
        Engine::Postgres => {
            ("CREATE TABLE fill (b text)", "INSERT INTO fill SELECT repeat(md5(g::text), 32) FROM generate_series(1, 10000) g")
        }
        Engine::Mysql => {
            ("CREATE TABLE fill (b LONGTEXT) ENGINE=InnoDB", "INSERT INTO fill SELECT REPEAT(MD5(seq), 32) FROM seq_1_to_10000")
        }
    };
    client.query(&primary, create).await.unwrap_or_else(|e| panic!("{ns}: {create}: {e}"));
    let mut batches = 0;
    let write = async |batches: &mut u32| {
        client.query(&primary, batch).await.unwrap_or_else(|e| panic!("{ns}: write {batches} was refused: {e}"));
        *batches += 1;
    };

    // Written until the volume passes the threshold, then no more until it has grown.
    while df_in(&member).1 * 100 < first * THRESHOLD {
        write(&mut batches).await;
        assert!(batches < 200, "{ns}: 2 GB written and the volume not past {THRESHOLD} %: {:?}", df_in(&member));
    }
    let passed = tokio::time::Instant::now();
    let deadline = passed + WAIT;
    let grown = loop {
        let (size, used) = df_in(&member);
        if size > first {
            break (size, used);
        }
        assert!(tokio::time::Instant::now() < deadline, "{ns}: the volume did not grow past {first} bytes ({used} used)");
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    eprintln!(
        "{ns}: {} batches took the volume past {THRESHOLD} %; {:.0} s later df in the pod says {} MiB",
        batches,
        passed.elapsed().as_secs_f64(),
        grown.0 / MI
    );
    // By half (XFS keeps a share of any size for itself).
    assert!(grown.0 * 10 >= first * 14 && grown.0 * 10 <= first * 16, "{ns}: grown by half from {first} bytes: {} bytes", grown.0);

    // The grown space holds what would not have fitted before, the engine never stopping.
    while df_in(&member).1 <= first {
        write(&mut batches).await;
        assert!(batches < 400, "{ns}: 4 GB written and the volume holds less than its first size: {:?}", df_in(&member));
    }
    let now = client.members().await.remove(0);
    assert_eq!(now.uid(), member.uid(), "{ns}: the same pod");
    assert_eq!(restarts(&now), 0, "{ns}: no container restarted");
    let rows = client.query(&primary, "SELECT count(*) FROM fill").await.expect("count");
    assert_eq!(rows, (u64::from(batches) * 10_000).to_string(), "{ns}: every batch written is there");

    let db = cluster
        .wait_database(&ns, name, "the growth in status", WAIT, |d| d.status.as_ref().and_then(|s| s.storage_growth.as_ref()).is_some())
        .await
        .expect("status");
    let growth = db.status.and_then(|s| s.storage_growth).expect("status.storageGrowth");
    assert_eq!((growth.size.as_str(), growth.count), ("900Mi", 1), "{ns}");
}
