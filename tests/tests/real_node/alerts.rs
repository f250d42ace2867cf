//! The chart's alert rules in a real Prometheus, scraping what the chart's PodMonitor
//! selects, against a primary and a replica on the nodes: the alerts a replica in
//! trouble raises fire, and resolve once it is well. The members' volumes are
//! filesystems of their own (the nodes' small class), so one can really fill.

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
/// neither. The replica's volume filled past 80 %: `PlugdbVolumeFilling` fires for it
/// (the warning: it is not past 90 %); emptied, it resolves.
pub async fn a_replica_in_trouble_fires_alerts_that_resolve(cluster: Arc<Cluster>) {
    let ns = "postgres-alerts";
    let dir = tempfile::tempdir().expect("a directory");
    let chart = plugdb_tests::workspace_root().join("deploy/chart/plugdb/alerts/plugdb-rules.yaml");
    let rules = held_at_most(&chart, HELD, dir.path()).expect("the rules");
    let small = json!({"storageClassName": plugdb_tests::node::SMALL_STORAGE_CLASS});
    cluster.apply_database(ns, database("orders", Engine::Postgres, "17", 2, small)).await.expect("apply");
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

    // A file beside the engine's data, written on the node, takes the volume to 85 %:
    // what the agent reads of it is the filesystem's own statfs.
    let volume = plugdb_tests::scenario::volume_path(&cluster, ns, "data-orders-1").await;
    let filler = volume.join("filler");
    let (size, used) = usage(&volume);
    let small = plugdb_tests::node::SMALL_BYTES;
    assert!(size <= small && size > small / 2, "the volume is a filesystem of its own: {size} bytes");
    let fill = (size * 85 / 100).saturating_sub(used);
    let out = std::process::Command::new("fallocate").args(["-l", &fill.to_string()]).arg(&filler).output().expect("fallocate");
    assert!(out.status.success(), "fallocate: {}", String::from_utf8_lossy(&out.stderr));
    let filled = Instant::now();
    prometheus.until_firing("PlugdbVolumeFilling", "orders-1", WAIT).await;
    eprintln!("{ns}: PlugdbVolumeFilling firing for orders-1 {:.0} s after its volume passed 80 %", filled.elapsed().as_secs_f64());
    std::fs::remove_file(&filler).expect("the filler removed");
    prometheus.until_resolved("PlugdbVolumeFilling", "orders-1", WAIT).await;

    let alerts = prometheus.alerts().await.expect("alerts");
    assert!(alerts.iter().all(|(labels, _)| labels["member"] != "orders-0"), "the primary raised none: {alerts:?}");
}

/// The size and the bytes in use of the filesystem holding `path`, as `df` reads them.
fn usage(path: &std::path::Path) -> (u64, u64) {
    let out = std::process::Command::new("df").args(["-B1", "--output=size,used"]).arg(path).output().expect("df");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let numbers: Vec<u64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    match numbers[..] {
        [size, used] => (size, used),
        _ => panic!("df {}: {text}", path.display()),
    }
}
