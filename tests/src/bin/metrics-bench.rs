//! What measuring a member costs, on the real nodes, per engine: a one-member Database
//! with its engine's exporter (the default), loaded in rounds for SECONDS each with the
//! engine's own load tool through the read-write Service as the application's login
//! (postgres: `pgbench`, TPC-B-like, 4 clients; mysql: `mariadb-slap`, 4 clients
//! inserting a row and reading the newest back, in runs of 40,000 statements), once
//! while a real Prometheus scrapes the member (its agent and its exporter, as the chart's
//! PodMonitor does) every 15 s and once while nothing does (which goes first
//! alternates): the throughput of each, on the same member, and what its exporter and
//! agent containers used while scraped (CPU, from their cgroups, and the most memory
//! each held). Beside it, the same Database with `monitoring.engineMetrics: false` has
//! no exporter container at all (checked). Medians of ROUNDS (default 3). Needs root
//! (the nodes). The table goes to stdout and to OUT (default `target/metrics-bench.md`).
//!
//! `cargo run -p plugdb-tests --bin metrics-bench -- [ROUNDS] [SECONDS] [OUT] [ENGINES]`
//! (ENGINES: `postgres,mysql` by default).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, ListParams};
use plugdb_tests::node::Nodes;
use plugdb_tests::operator::{Backing, Cluster};
use plugdb_tests::prometheus::Prometheus;
use plugdb_tests::scenario::{Engine, WAIT, container_usage, database, is_running};
use serde_json::json;

/// How often Prometheus scrapes (the chart's PodMonitor's default is 30 s; 15 s is what
/// most scrape configurations use).
const SCRAPE: Duration = Duration::from_secs(15);

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or_default()
}

/// The bench, until it ends or is interrupted: either way the nodes are torn down.
#[tokio::main]
async fn main() -> Result<()> {
    let out = std::env::args().nth(3).unwrap_or_else(|| "target/metrics-bench.md".into());
    plugdb_tests::node::bench_until_interrupted(&format!("{out}.log"), bench(out)).await
}

async fn bench(out: String) -> Result<()> {
    let rounds: usize = std::env::args().nth(1).map(|r| r.parse()).transpose().context("ROUNDS")?.unwrap_or(3);
    let seconds: u64 = std::env::args().nth(2).map(|r| r.parse()).transpose().context("SECONDS")?.unwrap_or(60);
    let engines = std::env::args().nth(4).unwrap_or_else(|| "postgres,mysql".into());
    let node = Nodes::start().await?;
    let plugins = [("postgres", "postgres"), ("mysql", "mysql")];
    let cluster = Cluster::with_settings(Backing::Node(Box::new(node)), &plugins, plugdb::reconcile::Settings::default()).await?;
    let mut rows = Vec::new();
    let benched =
        [(Engine::Postgres, "17"), (Engine::Mysql, "11.8")].into_iter().filter(|(e, _)| engines.split(',').any(|n| n == e.name()));
    for (engine, version) in benched {
        rows.extend(measure(&cluster, engine, version, rounds, Duration::from_secs(seconds)).await?);
    }
    let commit = std::process::Command::new("git").args(["rev-parse", "--short", "HEAD"]).output().ok();
    let commit = commit.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
    let table = format!(
        "metrics-bench at {commit}: medians of {rounds} rounds of {seconds} s, a scrape every {} s\n\n| measure | value |\n| --- | --- |\n{}\n",
        SCRAPE.as_secs(),
        rows.join("\n")
    );
    print!("{table}");
    std::fs::write(&out, table).with_context(|| format!("writing {out}"))?;
    Ok(())
}

/// The rows of one engine.
async fn measure(cluster: &Cluster, engine: Engine, version: &str, rounds: usize, load: Duration) -> Result<Vec<String>> {
    let name = engine.name();
    let (on, off) = (format!("{name}-measured"), format!("{name}-unmeasured"));
    cluster.apply_database(&on, database("bench", engine, version, 1, json!({}))).await?;
    cluster.apply_database(&off, database("bench", engine, version, 1, json!({"monitoring": {"engineMetrics": false}}))).await?;
    for ns in [&on, &off] {
        cluster.wait_database(ns, "bench", "1 member Running", WAIT, |d| is_running(d, 1)).await?;
    }
    let containers = |pod: &Pod| -> Vec<String> { pod.spec.iter().flat_map(|s| &s.containers).map(|c| c.name.clone()).collect() };
    let unmeasured = Api::<Pod>::namespaced(cluster.client.clone(), &off).get("bench-0").await?;
    if containers(&unmeasured).iter().any(|c| c == "exporter") {
        bail!("{name}: a Database with engineMetrics off runs an exporter");
    }
    let Backing::Node(nodes) = &cluster.backing else { bail!("needs the real nodes") };
    let rules = plugdb_tests::workspace_root().join("deploy/chart/plugdb/alerts/plugdb-rules.yaml");
    let target = Target::new(cluster, engine, &on).await?;
    target.prepare().await?;
    let member = Api::<Pod>::namespaced(cluster.client.clone(), &on).get("bench-0").await?;
    let up = match engine {
        Engine::Postgres => "pg_up",
        Engine::Mysql => "mysql_up",
    };
    let (mut scraped, mut quiet, mut exporter_cpu, mut agent_cpu) = (vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        // Which goes first alternates: a run warms what the next one finds.
        if round % 2 == 1 {
            quiet.push(target.load(load).await?);
        }
        // No operator's /metrics here: its target is down, which costs the member nothing.
        let prometheus = Prometheus::start_every(nodes, &on, "127.0.0.1:1", &rules, SCRAPE).await?;
        let usage = || (container_usage(&member, "exporter"), container_usage(&member, "agent"));
        let (before, started) = (usage(), Instant::now());
        scraped.push(target.load(load).await?);
        let (after, elapsed) = (usage(), started.elapsed().as_secs_f64());
        let ((Some(e0), Some(a0)), (Some(e1), Some(a1))) = (before, after) else { bail!("{name}: no cgroup of the exporter or agent") };
        exporter_cpu.push((e1.0 - e0.0) / elapsed);
        agent_cpu.push((a1.0 - a0.0) / elapsed);
        if prometheus.query(&format!(r#"{up}{{namespace="{on}"}} == 1"#)).await?.is_empty() {
            bail!("{name}: Prometheus never scraped the member's exporter");
        }
        drop(prometheus);
        if round % 2 == 0 {
            quiet.push(target.load(load).await?);
        }
        eprintln!("{name} round {}: {:.0} scraped, {:.0} not", round + 1, scraped[round], quiet[round]);
    }
    let peak = |container: &str| container_usage(&member, container).map(|u| u.1 as f64 / f64::from(1 << 20)).unwrap_or_default();
    let unit = match engine {
        Engine::Postgres => "pgbench transactions a second",
        Engine::Mysql => "mariadb-slap statements a second",
    };
    let (scraped, quiet) = (median(scraped), median(quiet));
    Ok(vec![
        format!("| {name}: {unit}, its agent and exporter scraped every 15 s | {scraped:.0} |"),
        format!("| {name}: {unit}, not scraped | {quiet:.0} |"),
        format!("| {name}: scraped ÷ not | {:.3} |", scraped / quiet),
        format!("| {name}: exporter CPU while scraped, under that load | {:.1} millicores |", median(exporter_cpu) * 1000.0),
        format!("| {name}: exporter memory, the most it held | {:.1} MiB |", peak("exporter")),
        format!("| {name}: agent CPU while scraped, under that load | {:.1} millicores |", median(agent_cpu) * 1000.0),
        format!("| {name}: agent memory, the most it held | {:.1} MiB |", peak("agent")),
    ])
}

/// A Database's read-write Service, as its application's login reaches it.
struct Target {
    engine: Engine,
    host: String,
    user: String,
    password: String,
    database: String,
}

impl Target {
    async fn new(cluster: &Cluster, engine: Engine, ns: &str) -> Result<Self> {
        let secret = Api::<Secret>::namespaced(cluster.client.clone(), ns).get("bench-app").await?;
        let data = secret.data.context("the application's Secret has no data")?;
        let field = |key: &str| data.get(key).map(|v| String::from_utf8_lossy(&v.0).to_string()).with_context(|| format!("no {key}"));
        let services = Api::<Service>::namespaced(cluster.client.clone(), ns).list(&ListParams::default()).await?;
        let service = services.items.iter().find(|s| s.metadata.name.as_deref() == Some("bench")).context("the read-write Service")?;
        let host = service.spec.as_ref().and_then(|s| s.cluster_ip.clone()).context("its address")?;
        Ok(Self { engine, host, user: field("username")?, password: field("password")?, database: field("dbname")? })
    }

    fn command(&self, program: &str) -> std::process::Command {
        let mut c = Nodes::command(program);
        c.env("PGPASSWORD", &self.password).env("MYSQL_PWD", &self.password).stdin(std::process::Stdio::null());
        c
    }

    /// Makes what the load needs (pgbench's tables, scale 10; a table of rows), again for
    /// a minute while it fails: a Service just made may not be reached at once.
    async fn prepare(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match run(self.preparation()).await {
                Err(e) if Instant::now() < deadline => {
                    eprintln!("preparing again: {e}");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                done => return done.map(drop),
            }
        }
    }

    fn preparation(&self) -> std::process::Command {
        match self.engine {
            Engine::Postgres => {
                let mut c = self.command("pgbench");
                c.args(["-i", "-q", "-s", "10", "-h", &self.host, "-U", &self.user, &self.database]);
                c
            }
            Engine::Mysql => {
                let mut c = self.command("mariadb");
                let table = "CREATE TABLE IF NOT EXISTS slap (id BIGINT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(64))";
                c.args(["-h", &self.host, &format!("-u{}", self.user), &self.database, "-e", table]);
                c
            }
        }
    }

    /// The throughput of a load of `load`, 4 clients.
    async fn load(&self, load: Duration) -> Result<f64> {
        match self.engine {
            Engine::Postgres => {
                let mut c = self.command("pgbench");
                c.args(["-c", "4", "-j", "2", "-T", &load.as_secs().to_string(), "-h", &self.host, "-U", &self.user, &self.database]);
                let said = run(c).await?;
                said.lines()
                    .find_map(|l| l.strip_prefix("tps = ")?.split_whitespace().next()?.parse().ok())
                    .with_context(|| format!("no tps in {said}"))
            }
            Engine::Mysql => {
                // Runs of a fixed number of queries, one after another for `load`: the
                // answer is the queries a second over them all, as the tool timed them.
                const QUERIES: u64 = 40_000;
                let (started, mut queries, mut seconds) = (Instant::now(), 0u64, 0.0f64);
                while started.elapsed() < load {
                    let mut c = self.command("mariadb-slap");
                    c.args([
                        "-h",
                        &self.host,
                        &format!("-u{}", self.user),
                        // Named, not made: with a query of its own it makes no schema.
                        &format!("--create-schema={}", self.database),
                        "--concurrency=4",
                        "--iterations=1",
                        &format!("--number-of-queries={QUERIES}"),
                        "--delimiter=;",
                        "--query=INSERT INTO slap (v) VALUES (REPEAT('x', 32));SELECT v FROM slap ORDER BY id DESC LIMIT 1",
                    ]);
                    let said = run(c).await?;
                    let took: f64 = said
                        .lines()
                        .find_map(|l| {
                            let rest = l.trim().strip_prefix("Average number of seconds to run all queries:")?;
                            rest.split_whitespace().next()?.parse().ok()
                        })
                        .with_context(|| format!("no time in {said}"))?;
                    (queries, seconds) = (queries + QUERIES, seconds + took);
                }
                Ok(queries as f64 / seconds.max(0.001))
            }
        }
    }
}

async fn run(c: std::process::Command) -> Result<String> {
    let program = format!("{:?}", c.get_args().nth(1).unwrap_or_default());
    let out = tokio::process::Command::from(c).kill_on_drop(true).output().await.with_context(|| format!("running {program}"))?;
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        bail!("{program} failed: {said}");
    }
    Ok(said)
}
