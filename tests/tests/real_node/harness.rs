//! A test harness for scenarios that share three real nodes: it starts the nodes, the
//! control plane and the operator once, runs the scenarios (a few at a time, each in
//! a namespace of its own), and tears the nodes down afterwards — also when a scenario
//! fails, and when the run is interrupted (SIGINT, SIGTERM). Output follows libtest's
//! shape, so `cargo test` reads its closing line.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt;
use plugdb::logging::LogFormat;
use plugdb_tests::node::{Nodes, machine_state, run_dir, state_difference, teardown};
use plugdb_tests::operator::{Backing, Cluster};
use plugdb_tests::release;
use tokio::signal::unix::{SignalKind, signal};

/// A scenario: an async function of the shared cluster.
pub type Scenario = fn(Arc<Cluster>) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// Engine plugins loaded into the shared cluster (engine, component).
const PLUGINS: &[(&str, &str)] = &[("postgres", "postgres"), ("mysql", "mysql"), ("etcd", "etcd")];

/// Runs the scenarios selected by the command line (substring filters; `--list`
/// lists them) on the real nodes: those in `alone` first, one at a time with nothing
/// else running (they restart the operator, count its requests, or take a node away
/// from every member on it), then the `shared` ones a few at a time.
pub fn run(alone: &[(&'static str, Scenario)], shared: &[(&'static str, Scenario)]) -> ExitCode {
    let scenarios: Vec<(&'static str, Scenario, bool)> =
        alone.iter().map(|&(n, s)| (n, s, true)).chain(shared.iter().map(|&(n, s)| (n, s, false))).collect();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    if args.iter().any(|a| a == "--list") {
        for (name, _, _) in &scenarios {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let selected: Vec<(&'static str, Scenario, bool)> =
        scenarios.iter().filter(|(name, _, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))).copied().collect();
    let filtered_out = scenarios.len() - selected.len();
    println!("\nrunning {} tests", selected.len());
    if selected.is_empty() {
        println!("\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; {filtered_out} filtered out; finished in 0.00s\n");
        return ExitCode::SUCCESS;
    }
    // The operator's log, for the failures: what it did in a failed scenario's namespaces.
    if let Ok(file) = std::fs::File::create(operator_log()) {
        let log =
            plugdb::logging::subscriber(LogFormat::Text, plugdb::logging::filter("info,kube=warn"), std::sync::Mutex::new(file), false);
        let _ = tracing::subscriber::set_global_default(log);
    }
    // A failed scenario says where and why, without a backtrace (the test command runs with
    // RUST_BACKTRACE set): what it left and the operator's records follow, and are what tell.
    std::panic::set_hook(Box::new(|info| eprintln!("{info}")));
    let parallel = std::env::var("PLUGDB_SCENARIO_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(3usize).max(1);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    let outcome = runtime.block_on(async move {
        let mut interrupt = signal(SignalKind::interrupt()).ok();
        let mut terminate = signal(SignalKind::terminate()).ok();
        let interrupted = async move {
            match (interrupt.as_mut(), terminate.as_mut()) {
                (Some(i), Some(t)) => tokio::select! { _ = i.recv() => {}, _ = t.recv() => {} },
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            outcome = run_all(selected, parallel) => outcome,
            () = interrupted => {
                teardown(&run_dir());
                Err("interrupted; the node was torn down".to_string())
            }
        }
    });
    // A scenario stopped at its limit may leave a blocking call behind: not waited for.
    runtime.shutdown_timeout(std::time::Duration::from_secs(10));
    let secs = started.elapsed().as_secs_f64();
    match outcome {
        Ok(failed) => {
            let passed_count = failed.iter().filter(|(_, ok)| *ok).count();
            let failures: Vec<&str> = failed.iter().filter(|(_, ok)| !ok).map(|(n, _)| *n).collect();
            if !failures.is_empty() {
                println!("\nfailures:");
                for name in &failures {
                    println!("    {name}");
                }
            }
            let verdict = if failures.is_empty() { "ok" } else { "FAILED" };
            println!(
                "\ntest result: {verdict}. {passed_count} passed; {} failed; 0 ignored; 0 measured; {filtered_out} filtered out; finished in {secs:.2}s\n",
                failures.len()
            );
            if failures.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(e) => {
            eprintln!("real-node scenarios: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one scenario, reports it the way libtest does, and says whether it passed.
/// Afterwards its namespaces are released (described first when it failed): what it
/// ran must not starve the scenarios after it of the node's CPU.
async fn run_one(name: &str, scenario: Scenario, cluster: Arc<Cluster>) -> bool {
    let started = Instant::now();
    let bounded = tokio::time::timeout(SCENARIO_LIMIT, scenario(cluster.clone()));
    let (outcome, namespaces) = release::noting_namespaces(AssertUnwindSafe(bounded).catch_unwind()).await;
    let ok = matches!(outcome, Ok(Ok(())));
    if let Ok(Err(_)) = outcome {
        eprintln!("{name} was still running after {SCENARIO_LIMIT:?}: stopped");
    }
    if let plugdb_tests::operator::Backing::Node(nodes) = &cluster.backing {
        for node in nodes.restore_all() {
            eprintln!("{name} left {node} lost: brought back");
        }
    }
    if !ok {
        for ns in &namespaces {
            eprintln!("{name} failed; what it left:\n{}", release::describe(&cluster, ns).await);
            eprintln!("{name}: the operator's last records of {ns}:\n{}", operator_records(ns, 80));
        }
    }
    for ns in &namespaces {
        if let Err(e) = release::release(&cluster, ns, RELEASE_WAIT).await {
            eprintln!("{name}: releasing namespace {ns}: {e:#}");
        }
    }
    println!("test {name} ... {} ({:.1} s)", if ok { "ok" } else { "FAILED" }, started.elapsed().as_secs_f64());
    ok
}

/// Where the operator's log of this run is written.
fn operator_log() -> std::path::PathBuf {
    std::env::temp_dir().join("plugdb-real-node-operator.log")
}

/// The operator's last `count` records that name namespace `ns`.
fn operator_records(ns: &str, count: usize) -> String {
    let log = std::fs::read_to_string(operator_log()).unwrap_or_default();
    let named = format!(".{ns}");
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(&named) || l.contains(&format!("namespace={ns}"))).collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

/// The longest a scenario may run: one still running then has hung (every wait of its
/// own is shorter), and is stopped and failed with what it left described.
const SCENARIO_LIMIT: std::time::Duration = std::time::Duration::from_secs(25 * 60);

/// How long a scenario's namespace may take to go once it is deleted.
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(180);

/// The machine's state before the node started, for the containment checks.
pub static MACHINE_BEFORE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

async fn run_all(selected: Vec<(&'static str, Scenario, bool)>, parallel: usize) -> Result<Vec<(&'static str, bool)>, String> {
    // A crashed run's leftovers go before the machine is described.
    let leftovers = teardown(&run_dir());
    if !leftovers.is_empty() {
        eprintln!("cleaned up after an earlier run: {}", leftovers.join("; "));
    }
    let before = MACHINE_BEFORE.get_or_init(machine_state).clone();
    let node = Nodes::start().await.map_err(|e| format!("the real nodes did not start: {e:#}"))?;
    let cluster =
        Arc::new(Cluster::on(Backing::Node(Box::new(node)), PLUGINS).await.map_err(|e| format!("the operator did not start: {e:#}"))?);
    let mut results = Vec::new();
    let (alone, shared): (Vec<_>, Vec<_>) = selected.into_iter().partition(|(_, _, alone)| *alone);
    for (name, scenario, _) in alone {
        results.push((name, run_one(name, scenario, cluster.clone()).await));
    }
    let permits = Arc::new(tokio::sync::Semaphore::new(parallel));
    let mut handles = Vec::new();
    for (name, scenario, _) in shared {
        let (cluster, permits) = (cluster.clone(), permits.clone());
        handles.push(tokio::spawn(async move {
            let _permit = permits.acquire_owned().await;
            (name, run_one(name, scenario, cluster).await)
        }));
    }
    for handle in handles {
        results.push(handle.await.map_err(|e| format!("a scenario task failed: {e}"))?);
    }
    // The scenarios' clones are gone: dropping the last one tears the node down. A clone
    // kept by something still running must not keep the node up: tear down regardless.
    if let Err(still_shared) = Arc::try_unwrap(cluster).map(drop) {
        drop(still_shared);
        teardown(&run_dir());
    }
    let left = state_difference(&before, &machine_state());
    if !left.is_empty() {
        return Err(format!("the node's teardown left the machine changed:\n{}", left.join("\n")));
    }
    Ok(results)
}
