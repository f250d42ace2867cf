//! Figures of Databases on the real nodes, per engine, medians of RUNS (default 3):
//! the time from `kubectl apply` of a three-member Database to `Running` with every
//! member Ready by its real probes; the time from a failure struck at the primary (its
//! pod deleted; its engine killed with SIGKILL; its engine hung, every process of it
//! stopped with SIGSTOP until then) to the first write the primary Service
//! accepts again; a planned switchover under a writer to a member that does not lead:
//! the longest time without an accepted write, and the acknowledged writes lost (none
//! may be); then the new primary's node lost without warning under a writer (its link
//! cut, as the real-node scenario does), nothing set by the bench: the time to the
//! first write the primary Service accepts, and the acknowledged writes the promoted
//! member lacks once the node is back (asynchronous replication, the default; then the
//! same on a new Database with synchronous replication). Before
//! the hang, the primary's engine is paused for 5 s (SIGSTOP, then SIGCONT): whether
//! that failed it over (it must not). The operator runs with its defaults (failover
//! delay 6 s; a lost node's primary is replaced whatever the delay), as a user runs it.
//! First, the machine's CPU while twelve members sit idle (what their probes, agents and
//! runtimes cost). Needs root (the nodes). The table goes to stdout and to OUT (default
//! `target/node-bench.md`).
//!
//! `cargo run -p plugdb-tests --bin node-bench -- [RUNS] [OUT] [ENGINES]` (ENGINES:
//! `postgres,mysql` by default). The in-process operator logs to OUT with `.log` added.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use plugdb::crd::Database;
use plugdb::names::SWITCHOVER;
use plugdb_tests::node::Nodes;
use plugdb_tests::operator::{Backing, Cluster};
use plugdb_tests::scenario::{Client, Engine, Failure, WAIT, database, is_running, resume_all, signal_all};
use serde_json::json;

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// The bench, until it ends or is interrupted: either way the nodes are torn down.
#[tokio::main]
async fn main() -> Result<()> {
    let out = std::env::args().nth(2).unwrap_or_else(|| "target/node-bench.md".into());
    plugdb_tests::node::bench_until_interrupted(&format!("{out}.log"), bench(out)).await
}

async fn bench(out: String) -> Result<()> {
    let runs: usize = std::env::args().nth(1).map(|r| r.parse()).transpose().context("RUNS")?.unwrap_or(3);
    let engines = std::env::args().nth(3).unwrap_or_else(|| "postgres,mysql".into());
    let started = Instant::now();
    let node = Nodes::start().await?;
    let node_ready = started.elapsed();
    let plugins = [("postgres", "postgres"), ("mysql", "mysql")];
    let settings = plugdb::reconcile::Settings::default();
    let delay = settings.failover_after;
    let cluster = Cluster::with_settings(Backing::Node(Box::new(node)), &plugins, settings).await?;

    let mut rows = vec![format!("| node Ready (control plane, kubelet, add-ons; images cached) | {:.1} s |", node_ready.as_secs_f64())];
    let (members, busy) = idle(&cluster).await?;
    rows.push(format!(
        "| the machine's CPU busy while {members} members sit idle (two postgres and two mysql Databases; median of {IDLE_LOOKS} looks of {}s) | {:.0} % of 2 cores |",
        IDLE_LOOK.as_secs(),
        busy * 100.0
    ));
    let benched =
        [(Engine::Postgres, "17"), (Engine::Mysql, "11.8")].into_iter().filter(|(e, _)| engines.split(',').any(|n| n == e.name()));
    for (engine, version) in benched {
        let (mut ready, mut deleted, mut killed, mut switched, mut lost) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), 0);
        let (mut node_lost, mut lost_with_node, mut hung, mut paused) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut node_lost_sync, mut lost_with_node_sync) = (Vec::new(), Vec::new());
        for run in 0..runs {
            let ns = format!("bench-{}-{run}", engine.name());
            let applied = Instant::now();
            cluster.apply_database(&ns, database("orders", engine, version, 3, json!({}))).await?;
            cluster.wait_database(&ns, "orders", "Running", WAIT, |d| is_running(d, 3)).await?;
            ready.push(applied.elapsed());
            let client = Client::new(&cluster, engine, &ns, "orders").await;
            client.create_table(&client.service_ip("orders").await).await;
            for (failure, into) in [(Failure::PodDeleted, &mut deleted), (Failure::EngineKilled, &mut killed)] {
                into.push(client.strike(failure).await);
                cluster.wait_database(&ns, "orders", "Running again", WAIT, |d| is_running(d, 3)).await?;
            }
            let client = Arc::new(client);
            let primary = past_its_first_minute(&cluster, &ns).await?;
            paused.push(if pause_the_primary(&cluster, &ns, &primary).await? { "failed over" } else { "kept" });
            hung.push(hang_the_primary(&cluster, &ns, engine, client.clone()).await?);
            let (gap, missing) = switchover(&cluster, &ns, client.clone()).await?;
            switched.push(gap);
            lost += missing;
            let (first, missing_after_loss) = lose_the_primarys_node(&cluster, &ns, client).await?;
            node_lost.push(first);
            lost_with_node.push(missing_after_loss);
            plugdb_tests::release::release(&cluster, &ns, WAIT).await?;
            let (first_sync, missing_sync) = lose_a_synchronous_primarys_node(&cluster, engine, version, run).await?;
            node_lost_sync.push(first_sync);
            lost_with_node_sync.push(missing_sync);
            eprintln!(
                "{ns}: Ready {:.1} s; writes again after pod deletion {:.1} s, after kill -9 {:.1} s, after a hang {:.1} s; switchover: no write for {:.1} s, {missing} lost; node lost: writes again after {:.1} s, {missing_after_loss} lost; synchronous: after {:.1} s, {missing_sync} lost",
                ready[run].as_secs_f64(),
                deleted[run].as_secs_f64(),
                killed[run].as_secs_f64(),
                hung[run].as_secs_f64(),
                gap.as_secs_f64(),
                first.as_secs_f64(),
                first_sync.as_secs_f64()
            );
        }
        let name = format!("{} {version}", engine.name());
        rows.push(format!("| {name}: `kubectl apply` → 3 members Ready (median of {runs}) | {:.1} s |", median(ready).as_secs_f64()));
        rows.push(format!("| {name}: primary's pod deleted → first accepted write (median) | {:.1} s |", median(deleted).as_secs_f64()));
        rows.push(format!(
            "| {name}: kill -9 of the primary's engine → first accepted write (median) | {:.1} s |",
            median(killed).as_secs_f64()
        ));
        rows.push(format!(
            "| {name}: the primary paused 5 s (SIGSTOP, then SIGCONT; its pod past its first minute): the primary after it (each run) | {} |",
            paused.join(", ")
        ));
        rows.push(format!(
            "| {name}: the primary's engine hung (SIGSTOP) → first accepted write on another member (median; failover delay {delay:?}) | {:.1} s |",
            median(hung).as_secs_f64()
        ));
        rows.push(format!(
            "| {name}: planned switchover under a writer → longest time without an accepted write (median) | {:.1} s |",
            median(switched).as_secs_f64()
        ));
        rows.push(format!("| {name}: acknowledged writes lost at the switchovers (all {runs} runs) | {lost} |"));
        rows.push(format!(
            "| {name}: the primary's node lost → first accepted write (median) | {:.1} s |",
            median(node_lost).as_secs_f64()
        ));
        let lost_with_node: Vec<String> = lost_with_node.iter().map(usize::to_string).collect();
        rows.push(format!("| {name}: acknowledged writes lost with the node (asynchronous; each run) | {} |", lost_with_node.join(", ")));
        rows.push(format!(
            "| {name}, synchronous replication: the primary's node lost → first accepted write (median) | {:.1} s |",
            median(node_lost_sync).as_secs_f64()
        ));
        let lost_with_node_sync: Vec<String> = lost_with_node_sync.iter().map(usize::to_string).collect();
        rows.push(format!(
            "| {name}, synchronous replication: acknowledged writes lost with the node (each run) | {} |",
            lost_with_node_sync.join(", ")
        ));
    }
    let table = format!("| measure (real node, 2 cores) | value |\n| --- | --- |\n{}\n", rows.join("\n"));
    print!("{table}");
    std::fs::write(&out, &table).with_context(|| format!("writing {out}"))?;
    drop(cluster);
    Ok(())
}

/// How many looks at the machine's idle CPU, and how long each lasts.
const IDLE_LOOKS: usize = 5;
const IDLE_LOOK: Duration = Duration::from_secs(20);

/// The machine's CPU while members sit idle: two three-member Databases of each engine
/// made and Ready, a minute to settle, then the median share of both cores busy over
/// [`IDLE_LOOKS`] looks (`/proc/stat`: every process of the machine, the nodes'
/// kubelets, runtimes and probes, the control plane and the operator included). Then the
/// Databases go, with their namespace.
async fn idle(cluster: &Cluster) -> Result<(usize, f64)> {
    let ns = "bench-idle";
    let made =
        [("pa", Engine::Postgres, "17"), ("pb", Engine::Postgres, "17"), ("ma", Engine::Mysql, "11.8"), ("mb", Engine::Mysql, "11.8")];
    for (name, engine, version) in made {
        cluster.apply_database(ns, database(name, engine, version, 3, json!({"deletionPolicy": "Delete"}))).await?;
    }
    for (name, ..) in made {
        cluster.wait_database(ns, name, "Running", WAIT, |d| is_running(d, 3)).await?;
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    let mut looks = Vec::new();
    for _ in 0..IDLE_LOOKS {
        let before = cpu()?;
        tokio::time::sleep(IDLE_LOOK).await;
        let after = cpu()?;
        looks.push((after.0 - before.0) as f64 / (after.1 - before.1).max(1) as f64);
    }
    looks.sort_by(f64::total_cmp);
    plugdb_tests::release::release(cluster, ns, WAIT).await?;
    Ok((3 * made.len(), looks[looks.len() / 2]))
}

/// The machine's busy and total CPU time so far, in ticks (`/proc/stat`'s first line:
/// busy is all but idle and iowait).
fn cpu() -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let ticks: Vec<u64> =
        stat.lines().next().unwrap_or_default().split_whitespace().skip(1).take(8).filter_map(|t| t.parse().ok()).collect();
    anyhow::ensure!(ticks.len() == 8, "/proc/stat's cpu line: {ticks:?}");
    let total: u64 = ticks.iter().sum();
    Ok((total - ticks[3] - ticks[4], total))
}

/// A planned switchover under a writer to the first member that does not lead, waited
/// for until every member is ready again: the longest time without an acknowledged
/// write, and how many acknowledged writes the new primary lacks.
async fn switchover(cluster: &Cluster, ns: &str, client: Arc<Client>) -> Result<(Duration, usize)> {
    let stop = Arc::new(AtomicBool::new(false));
    let writer = client.writer(1_000, stop.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let api: Api<Database> = Api::namespaced(cluster.client.clone(), ns);
    let primary = leader(cluster, ns).await?;
    let target = ["orders-0", "orders-1"].into_iter().find(|m| *m != primary).unwrap_or("orders-1");
    let request = json!({"metadata": {"annotations": {SWITCHOVER: target}}});
    api.patch("orders", &PatchParams::default(), &Patch::Merge(&request)).await?;
    let led = |d: &Database| d.status.as_ref().and_then(|s| s.primary.as_deref()) == Some(target);
    cluster.wait_database(ns, "orders", "the member leads", WAIT, |d| led(d) && !d.annotations().contains_key(SWITCHOVER)).await?;
    settled(cluster, ns, &client, &stop, writer).await
}

/// The primary's node lost without warning under a writer, nothing set by the bench: the
/// time from the loss to the first write the primary Service accepts (a probe on a new
/// connection every 250 ms, each given 5 s to connect), and, once the node is back and
/// every member Ready, how many acknowledged writes the promoted member lacks.
async fn lose_the_primarys_node(cluster: &Cluster, ns: &str, client: Arc<Client>) -> Result<(Duration, usize)> {
    let Backing::Node(nodes) = &cluster.backing else { anyhow::bail!("needs the real nodes") };
    let primary = leader(cluster, ns).await?;
    let pod = Api::<Pod>::namespaced(cluster.client.clone(), ns).get(&primary).await?;
    let node = pod.spec.and_then(|s| s.node_name).context("the primary's node")?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = client.writer(1_000_000, stop.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let lost = Instant::now();
    nodes.cut(&node)?;
    let first = first_write(&client, lost, 1_500_000_000).await;
    nodes.restore(&node)?;
    let first = first?;
    another_leads(cluster, ns, &primary).await?;
    let (_, missing) = settled(cluster, ns, &client, &stop, writer).await?;
    Ok((first, missing))
}

/// A new three-member Database with synchronous replication (`bench-ENGINE-sync-RUN`),
/// its primary's node lost as in [`lose_the_primarys_node`]; then it goes.
async fn lose_a_synchronous_primarys_node(cluster: &Cluster, engine: Engine, version: &str, run: usize) -> Result<(Duration, usize)> {
    let ns = format!("bench-{}-sync-{run}", engine.name());
    let synchronous = json!({"replication": {"mode": "Synchronous"}});
    cluster.apply_database(&ns, database("orders", engine, version, 3, synchronous)).await?;
    cluster.wait_database(&ns, "orders", "Running", WAIT, |d| is_running(d, 3)).await?;
    let client = Client::new(cluster, engine, &ns, "orders").await;
    client.create_table(&client.service_ip("orders").await).await;
    let lost = lose_the_primarys_node(cluster, &ns, Arc::new(client)).await?;
    plugdb_tests::release::release(cluster, &ns, WAIT).await?;
    Ok(lost)
}

/// The time from `since` to the first write the primary Service accepts: a probe on a new
/// connection every 250 ms (ids from `first_id`), each given the client's 5 s to connect;
/// those sent in the first 2 s could reach the old primary before the failure lands.
async fn first_write(client: &Arc<Client>, since: Instant, first_id: i64) -> Result<Duration> {
    let service = client.service_ip("orders").await;
    let (sender, mut received) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (mut probes, mut id) = (tokio::task::JoinSet::new(), first_id);
    loop {
        if since.elapsed() > Duration::from_secs(2) {
            let (client, service, sender) = (client.clone(), service.clone(), sender.clone());
            id += 1;
            probes.spawn(async move {
                if client.query(&service, &format!("INSERT INTO orders VALUES ({id}, 'probe')")).await.is_ok() {
                    let _ = sender.send(());
                }
            });
        }
        tokio::select! {
            _ = received.recv() => return Ok(since.elapsed()),
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
        anyhow::ensure!(since.elapsed() < WAIT, "no write accepted within {WAIT:?}");
    }
}

/// The primary, once its pod is past its first minute: the pod-deletion step made this
/// one anew moments ago, and the figures stay comparable with runs from before a pod
/// that was ready lost its start-up grace (docs/operations.md, Failover).
async fn past_its_first_minute(cluster: &Cluster, ns: &str) -> Result<Pod> {
    let primary = leader(cluster, ns).await?;
    let pod = Api::<Pod>::namespaced(cluster.client.clone(), ns).get(&primary).await?;
    let created = pod.metadata.creation_timestamp.as_ref().context("the primary's creation time")?.0;
    let age = Duration::try_from(k8s_openapi::jiff::Timestamp::now().duration_since(created)).unwrap_or_default();
    let past_grace = Duration::from_secs(plugdb::reconcile::members::STARTUP_GRACE_SECONDS as u64 + 1);
    if let Some(wait) = past_grace.checked_sub(age) {
        tokio::time::sleep(wait).await;
    }
    Ok(pod)
}

/// The engine's container of member `pod`.
fn engine_container(pod: &Pod) -> Result<String> {
    pod.spec.as_ref().and_then(|s| s.containers.first()).map(|c| c.name.clone()).context("an engine container")
}

/// The primary `pod`'s engine paused for 5 s (every process of it stopped, then let run
/// on): whether another member leads 20 s later.
async fn pause_the_primary(cluster: &Cluster, ns: &str, pod: &Pod) -> Result<bool> {
    let container = engine_container(pod)?;
    signal_all(pod, &container, "STOP");
    tokio::time::sleep(Duration::from_secs(5)).await;
    resume_all(pod, &container);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let failed_over = leader(cluster, ns).await? != pod.name_any();
    if failed_over {
        another_leads(cluster, ns, &pod.name_any()).await?;
        cluster.wait_database(ns, "orders", "Running again", WAIT, |d| is_running(d, 3)).await?;
    }
    Ok(failed_over)
}

/// The primary's engine hung (every process of it stopped), nothing set by the bench:
/// the time to the first write another member accepts through the primary Service.
/// Then what is left of the engine would run again: nothing is (its guard killed it
/// before the promotion), and it rejoins as a replica.
async fn hang_the_primary(cluster: &Cluster, ns: &str, engine: Engine, client: Arc<Client>) -> Result<Duration> {
    let pod = past_its_first_minute(cluster, ns).await?;
    let primary = pod.name_any();
    let container = engine_container(&pod)?;
    let hung = Instant::now();
    signal_all(&pod, &container, "STOP");
    let first = first_write(&client, hung, 1_600_000_000).await;
    // Its guard killed it before another member was promoted: nothing is left to run.
    let left = resume_all(&pod, &container);
    anyhow::ensure!(left == 0, "{ns}: {left} processes of the hung engine were left to run again");
    let first = first.with_context(|| format!("{ns}: {} hung", engine.name()))?;
    another_leads(cluster, ns, &primary).await?;
    cluster.wait_database(ns, "orders", "Running again", WAIT, |d| is_running(d, 3)).await?;
    Ok(first)
}

/// The member that leads `orders` in `ns`, as its status says.
async fn leader(cluster: &Cluster, ns: &str) -> Result<String> {
    let api: Api<Database> = Api::namespaced(cluster.client.clone(), ns);
    api.get("orders").await?.status.and_then(|s| s.primary).context("a primary")
}

/// Waits until a member other than `primary` leads `orders`.
async fn another_leads(cluster: &Cluster, ns: &str, primary: &str) -> Result<()> {
    let led = |d: &Database| d.status.as_ref().and_then(|s| s.primary.as_deref()).is_some_and(|p| p != primary);
    cluster.wait_database(ns, "orders", "another member leads", WAIT, led).await?;
    Ok(())
}

/// Once every member is Ready again, stops `writer` and returns the longest time it went
/// without an acknowledged write and how many acknowledged writes the primary lacks.
async fn settled(
    cluster: &Cluster,
    ns: &str,
    client: &Client,
    stop: &AtomicBool,
    writer: tokio::task::JoinHandle<(Vec<i64>, Duration)>,
) -> Result<(Duration, usize)> {
    cluster.wait_database(ns, "orders", "Running again", WAIT, |d| is_running(d, 3)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let (acknowledged, longest) = writer.await?;
    // A node just back may not route to the Service for a moment yet.
    let service = client.service_ip("orders").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let present = loop {
        match client.ids(&service).await {
            Ok(ids) => break ids,
            Err(e) if Instant::now() > deadline => anyhow::bail!("{ns}: the ids through the read-write Service: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    };
    Ok((longest, acknowledged.iter().filter(|id| !present.contains(id)).count()))
}
