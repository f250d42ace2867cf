//! The scale benchmark: 1,000 Databases across 10 namespaces on a real API server.
//!
//! `cargo run --release -p plugdb-tests --bin scale-bench -- [COUNT] [OUT_FILE]`
//!
//! Measures, in one run: the operator's time to apply every Database's children and
//! write its status, against a minimal client creating the same objects directly
//! (the API server's own bound); requests per Database on the first reconcile;
//! writes on a steady-state resync; the process's peak RSS and CPU seconds per
//! reconcile; and plugin call times. No kube-controller-manager runs: this measures
//! the operator, not StatefulSet pods. Prints a table and writes it to OUT_FILE.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use plugdb::build;
use plugdb::crd::Database;
use plugdb::metrics::Metrics;
use plugdb::plugin::{Limits, Registry, Runtime};
use plugdb::reconcile::{self, Settings};
use plugdb_tests::control_plane::{ControlPlane, Options};
use plugdb_tests::operator::{OPERATOR_NAMESPACE, counting_client, prepare};
use serde_json::json;

const NAMESPACES: usize = 10;
const IN_FLIGHT: usize = 16;

fn database(name: &str, namespace: &str) -> Database {
    let mut db: Database = serde_json::from_value(json!({
        "apiVersion": "plugdb.io/v1alpha1", "kind": "Database",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"engine": "postgres", "version": "17", "replicas": 3, "storage": {"size": "10Gi"},
                 "resources": {"limits": {"memory": "2Gi"}}, "parameters": {"max_connections": 200}},
    }))
    .expect("a Database");
    db.metadata.namespace = Some(namespace.into());
    db
}

fn rss_peak_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:").and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok()))
        .unwrap_or(0)
}

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
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
                let secrets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::Secret>(&()));
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
    Ok(started.elapsed())
}

async fn all_reconciled(client: &Client, namespaces: &[String], count: usize) -> Result<usize> {
    let mut done = 0;
    for ns in namespaces {
        let dbs: Api<Database> = Api::namespaced(client.clone(), ns);
        done +=
            dbs.list(&ListParams::default()).await?.items.iter().filter(|d| d.status.as_ref().is_some_and(|s| s.plugin.is_some())).count();
    }
    Ok(done.min(count))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let count: usize = args.first().map(|c| c.parse()).transpose().context("COUNT must be a number")?.unwrap_or(1000);
    let out_file = args.get(1).cloned().unwrap_or_else(|| "target/scale-bench.md".into());
    let cp = ControlPlane::start_with(Options { controller_manager: false, kubelet: false }).await?;
    prepare(&cp.client, &[("postgres", "postgres")]).await?;

    eprintln!("baseline: a plain client creates {count} Databases with their children and status…");
    let direct = baseline(&cp.client, count).await?;

    eprintln!("operator: {count} Databases across {NAMESPACES} namespaces…");
    let namespaces = create_namespaces(&cp.client, "bench").await?;
    let (operator_client, requests) = counting_client(&cp).await?;
    let metrics = Arc::new(Metrics::default());
    let registry = Registry::new(Runtime::new(Limits::default())?.with_metrics(metrics.clone()), metrics.clone());
    tokio::spawn(registry.clone().watch(operator_client.clone(), OPERATOR_NAMESPACE.into()));
    while registry.get("postgres").is_none() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // One pass per Database: no requeue inside the measurement.
    let settings = Settings { progress_requeue: Duration::from_secs(3600), idle_requeue: Duration::from_secs(3600), ..Settings::default() };
    let ctx = Arc::new(reconcile::Context::new(operator_client.clone(), registry.clone(), metrics.clone(), settings));
    let controller = tokio::spawn(reconcile::run(ctx, None, std::future::pending()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (requests_before, cpu_before) = (requests.all.load(Ordering::Relaxed), cpu_seconds());

    let started = Instant::now();
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
    while all_reconciled(&cp.client, &namespaces, count).await? < count {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let operator_time = started.elapsed();
    let first_requests = requests.all.load(Ordering::Relaxed) - requests_before;
    let reconciles: f64 = metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with("plugdb_reconciles_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let cpu_per_reconcile = (cpu_seconds() - cpu_before) / reconciles.max(1.0);

    // Steady state: a fresh controller reconciles everything once; nothing should be written.
    controller.abort();
    let writes_before = requests.writes.load(Ordering::Relaxed);
    let ctx = Arc::new(reconcile::Context::new(operator_client, registry.clone(), metrics.clone(), settings));
    let resync = tokio::spawn(reconcile::run(ctx, None, std::future::pending()));
    let reconciles_before = reconciles;
    let resync_deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let now: f64 = metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with("plugdb_reconciles_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if now - reconciles_before >= count as f64 || Instant::now() > resync_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let steady_writes = requests.writes.load(Ordering::Relaxed) - writes_before;
    resync.abort();

    // Plugin calls.
    let plugin = registry.get("postgres").context("postgres loaded")?;
    let db = Api::<Database>::namespaced(cp.client.clone(), &namespaces[0]).list(&ListParams::default()).await?.items.remove(0);
    let spec = build::engine_spec(&db, "17").map_err(|v| anyhow::anyhow!("{v:?}"))?;
    let cluster = build::cluster_context(&db, &format!("{}-0", db.name_any()));
    let mut calls: Vec<Duration> = (0..2000)
        .map(|_| {
            let t = Instant::now();
            let _ = plugin.render(&spec, &cluster);
            t.elapsed()
        })
        .collect();
    calls.sort();
    let compile = {
        let bytes = plugdb_tests::component("postgres");
        let runtime = Runtime::new(Limits::default())?;
        let t = Instant::now();
        runtime.load(&bytes)?;
        t.elapsed()
    };

    let children = 7; // credentials, config, 3 Services, StatefulSet, PodDisruptionBudget
    let table = format!(
        "| measure ({count} Databases, {NAMESPACES} namespaces) | value | target |\n| --- | --- | --- |\n\
         | operator: all children applied and status written | {:.1} s | |\n\
         | plain client creating the same objects | {:.1} s | |\n\
         | ratio operator / plain client | {:.2} | ≤ 1.5 |\n\
         | requests per Database until reconciled (every pass) | {:.1} | ≤ {} on the first pass |\n\
         | writes on a steady-state resync of all | {steady_writes} | 0 |\n\
         | peak RSS of the operator process (with the harness) | {} MiB | ≤ 150 MiB |\n\
         | CPU seconds per reconcile | {:.4} | |\n\
         | plugin render, median / p99 | {:.1} µs / {:.1} µs | median ≤ 50 µs |\n\
         | cold compile + self-test, postgres | {:.1} ms | |\n",
        operator_time.as_secs_f64(),
        direct.as_secs_f64(),
        operator_time.as_secs_f64() / direct.as_secs_f64(),
        first_requests as f64 / count as f64,
        children + 2,
        rss_peak_kib() / 1024,
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
