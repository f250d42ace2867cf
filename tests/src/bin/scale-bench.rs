//! The scale benchmark: 1,000 Databases across 10 namespaces on a real API server.
//!
//! `scripts/bench.sh [COUNT]`, or after `cargo build --release -p plugdb -p plugdb-tests`:
//! `target/release/scale-bench [COUNT] [OUT_FILE] [plugdb run flags...]`
//!
//! Measures, in one run: the time `plugdb run` (the release binary, its own process)
//! takes to apply every Database's children and write its status, against a minimal
//! client creating the same objects directly (the API server's own bound); the
//! operator's API requests per Database, counted by its own metrics; writes when a
//! restarted operator resyncs everything; its peak RSS and CPU seconds per reconcile;
//! and plugin call times. No kube-controller-manager runs: this measures the operator,
//! not StatefulSet pods. Prints a table and writes it to OUT_FILE.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use plugdb::build;
use plugdb::crd::Database;
use plugdb::plugin::{Limits, Runtime};
use plugdb_tests::control_plane::{ControlPlane, Options};
use plugdb_tests::operator::{OPERATOR_NAMESPACE, metric_sum, prepare};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NAMESPACES: usize = 10;
const IN_FLIGHT: usize = 16;

fn database(name: &str, namespace: &str) -> Database {
    let mut db: Database = serde_json::from_value(json!({
        "apiVersion": "plugdb.io/v1alpha1", "kind": "Database",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"engine": "postgres", "version": "17", "replicas": 3, "storage": "10Gi",
                 "resources": {"limits": {"memory": "2Gi"}}, "parameters": {"max_connections": 200}},
    }))
    .expect("a Database");
    db.metadata.namespace = Some(namespace.into());
    db
}

/// `plugdb run` in a process of its own, serving its metrics on a loopback port.
struct Operator {
    child: tokio::process::Child,
    metrics: String,
}

impl Operator {
    async fn start(binary: &Path, kubeconfig: &Path, extra: &[String]) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let listen = format!("127.0.0.1:{port}");
        let child = tokio::process::Command::new(binary)
            .args(["run", "--namespace", OPERATOR_NAMESPACE, "--listen", &listen, "--no-leader-election"])
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let operator = Self { child, metrics: listen };
        let deadline = Instant::now() + Duration::from_secs(60);
        while operator.metric("plugdb_plugins_loaded").await.unwrap_or(0.0) < 1.0 {
            if Instant::now() > deadline {
                bail!("plugdb run did not load the postgres plugin within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(operator)
    }

    fn pid(&self) -> u32 {
        self.child.id().unwrap_or_default()
    }

    /// The sum of every sample of metric `name` (all label sets) that `keep` accepts.
    async fn metric_where(&self, name: &str, keep: impl Fn(&str) -> bool) -> Result<f64> {
        let mut stream = tokio::net::TcpStream::connect(&self.metrics).await?;
        stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").await?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await?;
        Ok(metric_sum(&body, name, keep))
    }

    /// Requests by verb, watches excluded, as `verb n, verb n`.
    async fn requests_by_verb(&self) -> Result<String> {
        let mut out = Vec::new();
        for verb in ["get", "post", "patch", "put", "delete"] {
            let n = self.metric_where("plugdb_api_requests_total", |l| l.contains(&format!("verb=\"{verb}\""))).await?;
            if n > 0.0 {
                out.push(format!("{verb} {n}"));
            }
        }
        Ok(out.join(", "))
    }

    async fn metric(&self, name: &str) -> Result<f64> {
        self.metric_where(name, |_| true).await
    }

    /// Requests other than watches.
    async fn requests(&self) -> Result<f64> {
        self.metric_where("plugdb_api_requests_total", |l| !l.contains("verb=\"watch\"")).await
    }

    /// Requests that may change state, and how many of them were Events.
    async fn writes(&self) -> Result<(f64, f64)> {
        let write = |l: &str| !l.contains("verb=\"watch\"") && !l.contains("verb=\"get\"");
        let all = self.metric_where("plugdb_api_requests_total", write).await?;
        let events = self.metric_where("plugdb_api_requests_total", |l| write(l) && l.contains("resource=\"events\"")).await?;
        Ok((all, events))
    }

    fn rss_peak_mib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:").and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok()))
            .unwrap_or(0)
            / 1024
    }

    fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
        let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        (ticks(11) + ticks(12)) / 100.0
    }

    async fn stop(mut self) -> Result<()> {
        let _ = std::process::Command::new("kill").args(["-TERM", &self.pid().to_string()]).status();
        tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await??;
        Ok(())
    }
}

async fn create_namespaces(client: &Client, prefix: &str) -> Result<Vec<String>> {
    let api: Api<Namespace> = Api::all(client.clone());
    let mut names = Vec::new();
    for i in 0..NAMESPACES {
        let name = format!("{prefix}-{i}");
        api.create(
            &PostParams::default(),
            &Namespace { metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() }, ..Default::default() },
        )
        .await?;
        names.push(name);
    }
    Ok(names)
}

/// The API server's own bound: a plain client creates each Database, its children
/// (as the operator would render them) and its status, 16 requests in flight.
async fn baseline(client: &Client, count: usize) -> Result<Duration> {
    let namespaces = create_namespaces(client, "direct").await?;
    let runtime = Runtime::new(Limits::default())?;
    let plugin = runtime.load(&plugdb_tests::component("postgres"))?;
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let (client, plugin, ns) = (client.clone(), plugin.clone(), namespaces[i % NAMESPACES].clone());
            async move {
                let db = database(&format!("db-{i}"), &ns);
                let dbs: Api<Database> = Api::namespaced(client.clone(), &ns);
                let created = dbs.create(&PostParams::default(), &db).await?;
                let spec = build::engine_spec(&created, "17").map_err(|v| anyhow::anyhow!("{v:?}"))?;
                let workload = plugin.render(&spec, &build::cluster_context(&created, &format!("db-{i}-0")))?;
                let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("db-{i}-credentials"), "namespace": ns}, "stringData": {"superuser-password": "x", "replication-password": "y"}});
                let secrets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&()));
                secrets.create(&PostParams::default(), &serde_json::from_value(secret)?).await?;
                for child in build::children(&created, &workload, "postgres", &format!("db-{i}-0")) {
                    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &child.resource);
                    api.create(&PostParams::default(), &serde_json::from_value(child.object)?).await?;
                }
                let status = json!({"status": {"phase": "Creating", "readyReplicas": 0}});
                dbs.patch_status(&format!("db-{i}"), &PatchParams::default(), &Patch::Merge(status)).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<Vec<_>>()
        .await?;
    let elapsed = started.elapsed();
    // Gone before the operator starts, so that it serves the benchmark's Databases only.
    for ns in &namespaces {
        let resources = [
            ApiResource::erase::<Database>(&()),
            ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&()),
            ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
            ApiResource::erase::<k8s_openapi::api::apps::v1::StatefulSet>(&()),
            ApiResource::erase::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(&()),
        ];
        for resource in &resources {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, resource);
            api.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
        }
    }
    Ok(elapsed)
}

/// Waits until `count` Databases carry a status written by the operator.
async fn all_reconciled(client: Client, count: usize) -> Result<()> {
    let mut done = HashSet::new();
    let stream = watcher(Api::<Database>::all(client), watcher::Config::default()).applied_objects();
    let mut stream = std::pin::pin!(stream);
    while done.len() < count {
        let db = stream.try_next().await?.context("the Database watch ended")?;
        if db.status.as_ref().is_some_and(|s| s.plugin.is_some()) && db.namespace().is_some_and(|ns| ns.starts_with("bench-")) {
            done.insert((db.namespace(), db.name_any()));
        }
    }
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let count: usize = args.first().map(|c| c.parse()).transpose().context("COUNT must be a number")?.unwrap_or(1000);
    let out_file = args.get(1).cloned().unwrap_or_else(|| "target/scale-bench.md".into());
    // Any further arguments go to `plugdb run` (e.g. --concurrency 32).
    let extra: Vec<String> = args.iter().skip(2).cloned().collect();
    let binary: PathBuf = std::env::current_exe()?.with_file_name("plugdb");
    if !binary.exists() {
        bail!("{} is missing: build it first with `cargo build --release -p plugdb`", binary.display());
    }
    let cp = ControlPlane::start_with(Options { controller_manager: false, ..Default::default() }).await?;
    prepare(&cp.client, &[("postgres", "postgres")]).await?;

    eprintln!("baseline: a plain client creates {count} Databases with their children and status…");
    let direct = baseline(&cp.client, count).await?;

    eprintln!("operator: {count} Databases across {NAMESPACES} namespaces…");
    let namespaces = create_namespaces(&cp.client, "bench").await?;
    let operator = Operator::start(&binary, &cp.kubeconfig, &extra).await?;
    let (requests_before, reconciles_before, cpu_before) =
        (operator.requests().await?, operator.metric("plugdb_reconciles_total").await?, operator.cpu_seconds());

    let started = Instant::now();
    let watch = tokio::spawn(all_reconciled(cp.client.clone(), count));
    let client = cp.client.clone();
    futures::stream::iter(0..count)
        .map(|i| {
            let (client, ns) = (client.clone(), namespaces[i % NAMESPACES].clone());
            async move {
                Api::<Database>::namespaced(client, &ns)
                    .create(&PostParams::default(), &database(&format!("db-{i}"), &ns))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<Vec<_>>()
        .await?;
    watch.await??;
    let operator_time = started.elapsed();
    let requests = operator.requests().await? - requests_before;
    let reconciles = operator.metric("plugdb_reconciles_total").await? - reconciles_before;
    let cpu_per_reconcile = (operator.cpu_seconds() - cpu_before) / reconciles.max(1.0);
    let peak_rss = operator.rss_peak_mib();
    eprintln!("requests by verb: {}", operator.requests_by_verb().await?);
    operator.stop().await?;

    // Steady state: a restarted operator reconciles everything once; nothing should be written.
    eprintln!("resync: a restarted operator reconciles all {count}…");
    let operator = Operator::start(&binary, &cp.kubeconfig, &extra).await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while operator.metric("plugdb_reconciles_total").await? < count as f64 {
        if Instant::now() > deadline {
            bail!("the restarted operator did not reconcile {count} Databases within 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (resync_requests, (resync_writes, resync_events)) = (operator.requests().await?, operator.writes().await?);
    let resync_rss = operator.rss_peak_mib();
    eprintln!("resync requests by verb: {}", operator.requests_by_verb().await?);
    operator.stop().await?;

    // Plugin calls, in this process.
    let runtime = Runtime::new(Limits::default())?;
    let compile = {
        let bytes = plugdb_tests::component("postgres");
        let t = Instant::now();
        runtime.load(&bytes)?;
        t.elapsed()
    };
    let plugin = runtime.load(&plugdb_tests::component("postgres"))?;
    let db = database("db-0", &namespaces[0]);
    let spec = build::engine_spec(&db, "17").map_err(|v| anyhow::anyhow!("{v:?}"))?;
    let cluster = build::cluster_context(&db, "db-0-0");
    let mut calls: Vec<Duration> = (0..2000)
        .map(|_| {
            let t = Instant::now();
            let _ = plugin.render(&spec, &cluster);
            t.elapsed()
        })
        .collect();
    calls.sort();

    let children = 7; // credentials, config, 3 Services, StatefulSet, PodDisruptionBudget
    let table = format!(
        "| measure ({count} Databases, {NAMESPACES} namespaces) | value | target |\n| --- | --- | --- |\n\
         | operator (`plugdb run`): all children applied and status written | {:.1} s | |\n\
         | plain client creating the same objects | {:.1} s | |\n\
         | ratio operator / plain client | {:.2} | ≤ 1.5 |\n\
         | operator requests per Database until reconciled (every pass, watches excluded) | {:.2} | ≤ {} on the first pass |\n\
         | reconciles per Database until reconciled | {:.2} | |\n\
         | restarted operator resyncing all: requests / writes (of which Events) | {resync_requests} / {resync_writes} ({resync_events}) | writes 0 |\n\
         | operator peak RSS | {peak_rss} MiB | ≤ 150 MiB |\n\
         | restarted operator peak RSS | {resync_rss} MiB | |\n\
         | operator CPU seconds per reconcile | {:.5} | |\n\
         | plugin render, median / p99 | {:.1} µs / {:.1} µs | median ≤ 50 µs |\n\
         | cold compile + self-test, postgres | {:.1} ms | |\n",
        operator_time.as_secs_f64(),
        direct.as_secs_f64(),
        operator_time.as_secs_f64() / direct.as_secs_f64(),
        requests / count as f64,
        children + 2,
        reconciles / count as f64,
        cpu_per_reconcile,
        percentile(&calls, 0.5).as_secs_f64() * 1e6,
        percentile(&calls, 0.99).as_secs_f64() * 1e6,
        compile.as_secs_f64() * 1e3,
    );
    println!("{table}");
    std::fs::write(&out_file, &table).with_context(|| format!("writing {out_file}"))?;
    eprintln!("written to {out_file}");
    Ok(())
}
