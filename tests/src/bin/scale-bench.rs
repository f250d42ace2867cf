//! The scale benchmark: the operator's cost curve on a real API server, at 100, 1,000
//! and 10,000 Databases (10, 10 and 100 namespaces), each size on a fresh control plane.
//!
//! `scripts/bench.sh [SIZES]`, or after `cargo build --release -p plugdb -p plugdb-tests`:
//! `target/release/scale-bench [SIZES] [OUT_FILE] [plugdb run flags...]`, SIZES a
//! comma-separated list (default `100,1000,10000`).
//!
//! Measures, at each size: the time `plugdb run` (the release binary, its own process)
//! takes to apply every Database's children and write its status, against a minimal
//! client creating the same objects directly (the API server's own bound), with the CPU
//! seconds kube-apiserver and etcd spent on each (up to 1,000 Databases in three paired
//! rounds, each on a fresh control plane: the times are medians, the ratio the median
//! of the rounds'; the other figures are the first round's); the operator's API
//! requests per Database, counted by its own metrics; its peak RSS and CPU seconds per
//! reconcile; and what a restarted operator costs to resync everything (requests,
//! writes, plugin calls, RSS), then what a scrape of its metrics holds per Database and
//! takes. Then the 1,000 (or a smaller size) again beside a noisy neighbour: an engine
//! whose plugin runs out its deadline on every call, in as many rounds as alone
//! (`10000` alone skips it). No kube-controller-manager runs: this measures the
//! operator, not StatefulSet pods.
//! Prints a table and writes it to OUT_FILE.

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
use plugdb_tests::operator::{OPERATOR_NAMESPACE, install_finalizer_policy, metric_sum, prepare};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const IN_FLIGHT: usize = 16;

/// Namespaces the Databases of one size are spread over: 10, or one per 100 Databases.
fn namespaces_for(count: usize) -> usize {
    (count / 100).max(10)
}

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

/// Where the chart's operator reaches the agents from: its own pods.
const AGENT_FROM: &str = "plugdb-system/app.kubernetes.io/name=plugdb,app.kubernetes.io/instance=plugdb";

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
            // As the chart runs it: members with agents, reached from the operator's pods.
            .args(["--image", "localhost/plugdb/operator:bench", "--agent-from", AGENT_FROM])
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
        let (_, body) = self.scrape().await?;
        Ok(metric_sum(&body, name, keep))
    }

    /// One scrape of its metrics: how long it took, and the body.
    async fn scrape(&self) -> Result<(Duration, String)> {
        let started = Instant::now();
        let mut stream = tokio::net::TcpStream::connect(&self.metrics).await?;
        stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").await?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await?;
        Ok((started.elapsed(), body))
    }

    /// What a Prometheus scraping it gets, in five scrapes: the median time of one, and
    /// the series that carry a `database` label (the last scrape's).
    async fn scraped(&self) -> Result<(Duration, usize)> {
        let mut times = Vec::new();
        let mut body = String::new();
        for _ in 0..5 {
            let (took, text) = self.scrape().await?;
            times.push(took.as_secs_f64());
            body = text;
        }
        let of_databases = body.lines().filter(|l| !l.starts_with('#') && l.contains("database=\"")).count();
        Ok((Duration::from_secs_f64(median(times)), of_databases))
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
        cpu_seconds(self.pid())
    }

    async fn stop(mut self) -> Result<()> {
        let _ = std::process::Command::new("kill").args(["-TERM", &self.pid().to_string()]).status();
        tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await??;
        Ok(())
    }
}

async fn create_namespaces(client: &Client, prefix: &str, count: usize) -> Result<Vec<String>> {
    let api: Api<Namespace> = Api::all(client.clone());
    let mut names = Vec::new();
    for i in 0..count {
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
    let namespaces = create_namespaces(client, "direct", namespaces_for(count)).await?;
    let runtime = Runtime::new(Limits::default())?;
    let plugin = runtime.load(&plugdb_tests::component("postgres"))?;
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let (client, plugin, ns) = (client.clone(), plugin.clone(), namespaces[i % namespaces.len()].clone());
            async move {
                let db = database(&format!("db-{i}"), &ns);
                let dbs: Api<Database> = Api::namespaced(client.clone(), &ns);
                let created = dbs.create(&PostParams::default(), &db).await?;
                let spec = build::engine_spec(&created, "17").map_err(|v| anyhow::anyhow!("{v:?}"))?;
                let workload = plugin.render(&spec, &build::cluster_context(&created, &format!("db-{i}-0"), false))?;
                let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("db-{i}-credentials"), "namespace": ns}, "stringData": {"superuser-password": "x", "replication-password": "y"}});
                let secrets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&()));
                secrets.create(&PostParams::default(), &serde_json::from_value(secret)?).await?;
                let primary = format!("db-{i}-0");
                let rendered = build::Rendered {
                    workload: &workload,
                    engine: "postgres",
                    sidecars: build::Sidecars::default(),
                    primary: &primary,
                    rendered_for: &primary,
                    replicas: created.spec.replicas.max(1) as u32,
                    leadership: build::Leadership::HostChosen,
                    tls: None,
                };
                for child in build::children(&created, &rendered) {
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
    Ok(started.elapsed())
}

/// Deletes what `baseline` made, so that the operator serves the benchmark's
/// Databases only.
async fn clear_baseline(client: &Client, count: usize) -> Result<()> {
    for i in 0..namespaces_for(count) {
        let ns = format!("direct-{i}");
        let resources = [
            ApiResource::erase::<Database>(&()),
            ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&()),
            ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
            ApiResource::erase::<k8s_openapi::api::core::v1::Service>(&()),
            ApiResource::erase::<k8s_openapi::api::apps::v1::StatefulSet>(&()),
            ApiResource::erase::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(&()),
        ];
        for resource in &resources {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, resource);
            api.delete_collection(&DeleteParams::default(), &ListParams::default()).await?;
        }
    }
    Ok(())
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

/// Creates `count` Databases over `namespaces`, 16 at a time, and waits until the
/// operator has written every one's status.
async fn create_all(client: &Client, namespaces: &[String], count: usize) -> Result<()> {
    let watch = tokio::spawn(all_reconciled(client.clone(), count));
    futures::stream::iter(0..count)
        .map(|i| {
            let (client, ns) = (client.clone(), namespaces[i % namespaces.len()].clone());
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
    watch.await?
}

/// Databases of a noisy neighbour: an engine whose plugin spends its whole deadline
/// on every call (it never answers, so nothing of it is remembered and every pass
/// calls again), enough of them to keep its calls queued throughout.
const NOISY: usize = 100;

/// The time `count` postgres Databases take to reconcile while the noisy engine's
/// Databases keep its calls busy (on a control plane of its own), and how many of
/// the noisy engine's calls ran out their deadline meanwhile.
async fn beside_noisy_neighbour(binary: &Path, count: usize, extra: &[String]) -> Result<(Duration, f64)> {
    let cp = ControlPlane::start_with(Options { controller_manager: false, ..Default::default() }).await?;
    prepare(&cp.client, &[("postgres", "postgres"), ("hostile", "hostile")]).await?;
    install_finalizer_policy(&cp.client).await?;
    let noisy = create_namespaces(&cp.client, "noisy", 1).await?.remove(0);
    let hostile: Api<Database> = Api::namespaced(cp.client.clone(), &noisy);
    for i in 0..NOISY {
        let db: Database = serde_json::from_value(json!({
            "apiVersion": "plugdb.io/v1alpha1", "kind": "Database",
            "metadata": {"name": format!("noisy-{i}"), "namespace": noisy},
            "spec": {"engine": "hostile", "storage": "1Gi", "parameters": {"attack": "loop"}},
        }))?;
        hostile.create(&PostParams::default(), &db).await?;
    }
    let namespaces = create_namespaces(&cp.client, "bench", namespaces_for(count)).await?;
    eprintln!("[{count}] beside a noisy neighbour: {NOISY} Databases whose plugin runs out its deadline on every call…");
    let operator = Operator::start(binary, &cp.kubeconfig, extra).await?;
    let timeouts = async || {
        operator.metric_where("plugdb_plugin_calls_total", |l| l.contains("engine=\"hostile\"") && l.contains("outcome=\"timeout\"")).await
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while timeouts().await? < 2.0 {
        if Instant::now() > deadline {
            bail!("the noisy engine's calls did not run out their deadline within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while operator.metric("plugdb_plugins_loaded").await? < 2.0 {
        if Instant::now() > deadline {
            bail!("the postgres plugin did not load beside the noisy one within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = timeouts().await?;
    let started = Instant::now();
    create_all(&cp.client, &namespaces, count).await?;
    let elapsed = started.elapsed();
    let during = timeouts().await? - before;
    operator.stop().await?;
    Ok((elapsed, during))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// CPU seconds (user + system) process `pid` has spent.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU seconds kube-apiserver and etcd spent while `work` ran, beside its result.
async fn with_server_cpu<T>(cp: &ControlPlane, work: impl std::future::Future<Output = Result<T>>) -> Result<(T, f64, f64)> {
    let (apiserver, etcd) = (cp.pid_of("kube-apiserver").context("kube-apiserver runs")?, cp.pid_of("etcd").context("etcd runs")?);
    let before = (cpu_seconds(apiserver), cpu_seconds(etcd));
    let value = work.await?;
    Ok((value, cpu_seconds(apiserver) - before.0, cpu_seconds(etcd) - before.1))
}

/// What one size costs. Times are medians over its rounds; the rest is its first round's.
struct Run {
    count: usize,
    namespaces: usize,
    /// Seconds.
    operator: f64,
    direct: f64,
    /// Operator ÷ plain client, one per round.
    ratios: Vec<f64>,
    /// kube-apiserver / etcd CPU seconds under the plain client and under the operator.
    server_cpu_direct: (f64, f64),
    server_cpu_operator: (f64, f64),
    requests: f64,
    reconciles: f64,
    /// Of the reconciles, those that ended early as their engine's calls were queued full
    /// or a slow call went on without them.
    busy: f64,
    cpu_per_reconcile: f64,
    operator_cpu: f64,
    peak_rss: u64,
    resync_requests: f64,
    resync_writes: f64,
    resync_events: f64,
    resync_calls: f64,
    resync_rss: u64,
    /// Once all are reconciled: the median time of a scrape of the operator's metrics,
    /// and the series per Database in it.
    scrape: Duration,
    series_per_database: f64,
}

/// Paired rounds (plain client, then operator) per size up to 1,000, each on a fresh
/// control plane: on a shared machine one round's ratio varies by a third from run to
/// run, so the table reports the median. Larger sizes take tens of minutes: one round.
fn rounds_for(count: usize) -> usize {
    if count <= 1000 { 3 } else { 1 }
}

/// One round: the plain client's baseline on a fresh control plane, then a fresh
/// operator reconciling as many new Databases, left running for what follows.
struct Round {
    cp: ControlPlane,
    operator: Operator,
    namespaces: usize,
    direct: Duration,
    server_cpu_direct: (f64, f64),
    operator_time: Duration,
    server_cpu_operator: (f64, f64),
    requests: f64,
    reconciles: f64,
    busy: f64,
    operator_cpu: f64,
}

async fn round(binary: &Path, count: usize, extra: &[String]) -> Result<Round> {
    let cp = ControlPlane::start_with(Options { controller_manager: false, ..Default::default() }).await?;
    prepare(&cp.client, &[("postgres", "postgres")]).await?;

    eprintln!("[{count}] baseline: a plain client creates {count} Databases with their children and status…");
    let (direct, api_direct, etcd_direct) = with_server_cpu(&cp, baseline(&cp.client, count)).await?;
    clear_baseline(&cp.client, count).await?;
    // As the chart installs it: the API server puts the finalizer on each Database as
    // it is created, so the operator does not write it (installed after the baseline,
    // whose Databases no operator would release).
    install_finalizer_policy(&cp.client).await?;

    let namespaces = create_namespaces(&cp.client, "bench", namespaces_for(count)).await?;
    eprintln!("[{count}] operator: {count} Databases across {} namespaces…", namespaces.len());
    let operator = Operator::start(binary, &cp.kubeconfig, extra).await?;
    let (requests_before, reconciles_before, busy_before, cpu_before) = (
        operator.requests().await?,
        operator.metric("plugdb_reconciles_total").await?,
        operator.metric("plugdb_reconciles_busy_total").await?,
        operator.cpu_seconds(),
    );
    let started = Instant::now();
    let ((), api_operator, etcd_operator) = with_server_cpu(&cp, create_all(&cp.client, &namespaces, count)).await?;
    let operator_time = started.elapsed();
    eprintln!("[{count}] {:.1} s against the plain client's {:.1} s", operator_time.as_secs_f64(), direct.as_secs_f64());
    Ok(Round {
        requests: operator.requests().await? - requests_before,
        reconciles: operator.metric("plugdb_reconciles_total").await? - reconciles_before,
        busy: operator.metric("plugdb_reconciles_busy_total").await? - busy_before,
        operator_cpu: operator.cpu_seconds() - cpu_before,
        cp,
        operator,
        namespaces: namespaces.len(),
        direct,
        server_cpu_direct: (api_direct, etcd_direct),
        operator_time,
        server_cpu_operator: (api_operator, etcd_operator),
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn measure(binary: &Path, count: usize, extra: &[String]) -> Result<Run> {
    let Round {
        cp,
        operator,
        namespaces,
        direct,
        server_cpu_direct,
        operator_time,
        server_cpu_operator,
        requests,
        reconciles,
        busy,
        operator_cpu,
    } = round(binary, count, extra).await?;
    let peak_rss = operator.rss_peak_mib();
    eprintln!("[{count}] requests by verb: {}", operator.requests_by_verb().await?);
    operator.stop().await?;

    // Steady state: a restarted operator reconciles everything once; nothing should be
    // written, and no plugin called (the answers are remembered across passes, not
    // across restarts: the first pass of each Database after a restart calls again).
    eprintln!("[{count}] resync: a restarted operator reconciles all {count}…");
    let operator = Operator::start(binary, &cp.kubeconfig, extra).await?;
    let deadline = Instant::now() + Duration::from_secs(1200);
    // Passes that ended at once because their engine was busy do not count.
    while operator.metric("plugdb_reconciles_total").await? - operator.metric("plugdb_reconciles_busy_total").await? < count as f64 {
        if Instant::now() > deadline {
            bail!("the restarted operator did not reconcile {count} Databases within 20 minutes");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (resync_requests, (resync_writes, resync_events)) = (operator.requests().await?, operator.writes().await?);
    let resync_calls = operator.metric("plugdb_plugin_calls_total").await?;
    let resync_rss = operator.rss_peak_mib();
    let (scrape, of_databases) = operator.scraped().await?;
    eprintln!("[{count}] resync requests by verb: {}", operator.requests_by_verb().await?);
    operator.stop().await?;
    drop(cp);

    let mut times = vec![(direct, operator_time)];
    for _ in 1..rounds_for(count) {
        let again = round(binary, count, extra).await?;
        again.operator.stop().await?;
        times.push((again.direct, again.operator_time));
    }
    Ok(Run {
        count,
        namespaces,
        operator: median(times.iter().map(|(_, o)| o.as_secs_f64()).collect()),
        direct: median(times.iter().map(|(d, _)| d.as_secs_f64()).collect()),
        ratios: times.iter().map(|(d, o)| o.as_secs_f64() / d.as_secs_f64()).collect(),
        server_cpu_direct,
        server_cpu_operator,
        requests,
        reconciles,
        busy,
        cpu_per_reconcile: operator_cpu / reconciles.max(1.0),
        operator_cpu,
        peak_rss,
        resync_requests,
        resync_writes,
        resync_events,
        resync_calls,
        resync_rss,
        scrape,
        series_per_database: of_databases as f64 / count as f64,
    })
}

/// One row of the cost-curve table: a measure, a cell per size, and the goal.
fn row(measure: &str, runs: &[Run], cell: impl Fn(usize, &Run) -> String, goal: &str) -> String {
    let cells: Vec<String> = runs.iter().enumerate().map(|(i, r)| cell(i, r)).collect();
    format!("| {measure} | {} | {goal} |\n", cells.join(" | "))
}

fn table(runs: &[Run]) -> String {
    // The credentials, the application's login, the agents' certificates, config, 3
    // Services, StatefulSet, PodDisruptionBudget, NetworkPolicy.
    let children = 10;
    let header: Vec<String> = runs.iter().map(|r| format!("{} Databases / {} namespaces", r.count, r.namespaces)).collect();
    let mut out = format!("| measure | {} | goal |\n|{}", header.join(" | "), " --- |".repeat(runs.len() + 2));
    out.push('\n');
    out += &row("paired rounds, each on a fresh control plane", runs, |_, r| r.ratios.len().to_string(), "");
    out +=
        &row("operator (`plugdb run`): all children applied and status written (median)", runs, |_, r| format!("{:.1} s", r.operator), "");
    out += &row("plain client creating the same objects (median)", runs, |_, r| format!("{:.1} s", r.direct), "");
    out += &row(
        "ratio operator ÷ plain client: median (each round)",
        runs,
        |_, r| {
            let each: Vec<String> = r.ratios.iter().map(|x| format!("{x:.2}")).collect();
            format!("{:.2} ({})", median(r.ratios.clone()), each.join(", "))
        },
        "≤ 1.2",
    );
    out += &row(
        "kube-apiserver / etcd CPU s: under the plain client",
        runs,
        |_, r| format!("{:.1} / {:.1}", r.server_cpu_direct.0, r.server_cpu_direct.1),
        "",
    );
    out += &row(
        "kube-apiserver / etcd CPU s: under the operator (operator's own)",
        runs,
        |_, r| format!("{:.1} / {:.1} ({:.1})", r.server_cpu_operator.0, r.server_cpu_operator.1, r.operator_cpu),
        "",
    );
    out += &row(
        "operator requests per Database until reconciled (watches excluded)",
        runs,
        |_, r| format!("{:.2}", r.requests / r.count as f64),
        // The status; the finalizer is the admission policy's (`install_finalizer_policy`).
        &format!("≤ {} on the first pass", children + 1),
    );
    out += &row(
        "reconciles per Database until reconciled (of which ended early: engine busy)",
        runs,
        |_, r| format!("{:.2} ({:.2})", r.reconciles / r.count as f64, r.busy / r.count as f64),
        "",
    );
    out += &row("operator CPU seconds per reconcile", runs, |_, r| format!("{:.5}", r.cpu_per_reconcile), "");
    out += &row("operator peak RSS", runs, |_, r| format!("{} MiB", r.peak_rss), "≤ 64 MiB at 1,000");
    out += &row(
        "RSS growth per Database from the previous size",
        runs,
        |i, r| match i.checked_sub(1).map(|p| &runs[p]) {
            Some(p) => format!("{:.1} KiB", (r.peak_rss as f64 - p.peak_rss as f64) * 1024.0 / (r.count - p.count) as f64),
            None => "–".into(),
        },
        "≤ 16 KiB beyond 1,000",
    );
    out += &row(
        "restarted operator resyncing all: requests / writes (of which Events) / plugin calls",
        runs,
        |_, r| format!("{} / {} ({}) / {}", r.resync_requests, r.resync_writes, r.resync_events, r.resync_calls),
        "writes 0",
    );
    out +=
        &row("series per Database in the operator's metrics, all reconciled", runs, |_, r| format!("{:.2}", r.series_per_database), "flat");
    out +=
        &row("one scrape of the operator's metrics (median of 5)", runs, |_, r| format!("{:.0} ms", r.scrape.as_secs_f64() * 1000.0), "");
    out += &row(
        "restarted operator peak RSS (÷ first run)",
        runs,
        |_, r| format!("{} MiB ({:.2})", r.resync_rss, r.resync_rss as f64 / r.peak_rss.max(1) as f64),
        "≤ 1.2",
    );
    out
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sizes: Vec<usize> = args
        .first()
        .map(String::as_str)
        .unwrap_or("100,1000,10000")
        .split(',')
        .map(|c| c.trim().parse().with_context(|| format!("SIZES must be numbers separated by commas, not {c:?}")))
        .collect::<Result<_>>()?;
    let out_file = args.get(1).cloned().unwrap_or_else(|| "target/scale-bench.md".into());
    // Any further arguments go to `plugdb run` (e.g. --concurrency 32).
    let extra: Vec<String> = args.iter().skip(2).cloned().collect();
    let binary: PathBuf = std::env::current_exe()?.with_file_name("plugdb");
    if !binary.exists() {
        bail!("{} is missing: build it first with `cargo build --release -p plugdb`", binary.display());
    }
    let mut runs = Vec::new();
    for &count in &sizes {
        runs.push(measure(&binary, count, &extra).await?);
        // Each size's table as soon as it is measured: a long run leaves what it found.
        std::fs::write(&out_file, table(&runs)).with_context(|| format!("writing {out_file}"))?;
    }
    // Fairness: the 1,000 (or the largest smaller size's) Databases again, beside a
    // noisy engine. Larger sizes alone skip it: at 10,000 it would add another hour.
    let alone = runs.iter().filter(|r| r.count <= 1000).max_by_key(|r| r.count);
    let fairness = match alone {
        Some(alone) => {
            // As many rounds as alone, each on a fresh control plane: the median.
            let mut rounds = Vec::new();
            for _ in 0..rounds_for(alone.count) {
                let (beside, timeouts) = beside_noisy_neighbour(&binary, alone.count, &extra).await?;
                rounds.push((beside.as_secs_f64(), timeouts));
            }
            let beside = median(rounds.iter().map(|(t, _)| *t).collect());
            let each = rounds.iter().map(|(t, _)| format!("{:.2}", t / alone.operator)).collect::<Vec<_>>().join(", ");
            let timeouts = rounds.iter().map(|(_, n)| n.to_string()).collect::<Vec<_>>().join(", ");
            format!(
                "\n| {} postgres Databases | time to reconcile all | ÷ alone |\n| --- | --- | --- |\n\
                 | alone (the median above) | {:.1} s | 1.00 |\n\
                 | beside {NOISY} Databases of an engine whose plugin runs out its {} ms deadline on every call (median of {} rounds, each on a fresh control plane: ÷ alone {each}; calls stopped meanwhile {timeouts}) | {:.1} s | {:.2} |\n",
                alone.count,
                alone.operator,
                Limits::default().call_timeout.as_millis(),
                rounds.len(),
                beside,
                beside / alone.operator,
            )
        }
        None => "\nBeside a noisy neighbour: not measured (it runs at 1,000 Databases, or a smaller size asked for).\n".to_string(),
    };

    // Plugin calls, in this process.
    let runtime = Runtime::new(Limits::default())?;
    let compile = {
        let bytes = plugdb_tests::component("postgres");
        let t = Instant::now();
        runtime.load(&bytes)?;
        t.elapsed()
    };
    let plugin = runtime.load(&plugdb_tests::component("postgres"))?;
    let db = database("db-0", "bench-0");
    let spec = build::engine_spec(&db, "17").map_err(|v| anyhow::anyhow!("{v:?}"))?;
    let cluster = build::cluster_context(&db, "db-0-0", false);
    let mut calls: Vec<Duration> = (0..2000)
        .map(|_| {
            let t = Instant::now();
            let _ = plugin.render(&spec, &cluster);
            t.elapsed()
        })
        .collect();
    calls.sort();
    let table = format!(
        "{}{fairness}\nPlugin `render` in this process (2,000 calls): median {:.1} µs, p99 {:.1} µs; cold compile + self-test of postgres {:.1} ms.\n",
        table(&runs),
        percentile(&calls, 0.5).as_secs_f64() * 1e6,
        percentile(&calls, 0.99).as_secs_f64() * 1e6,
        compile.as_secs_f64() * 1e3,
    );
    println!("{table}");
    std::fs::write(&out_file, &table).with_context(|| format!("writing {out_file}"))?;
    eprintln!("written to {out_file}");
    Ok(())
}
