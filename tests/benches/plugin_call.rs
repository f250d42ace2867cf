//! Plugin call cost: `render` of a typical spec per iteration in a fresh instance (from
//! the instance pool, and allocated on demand for comparison), whole or, as on the
//! operator's call threads, answered before the instance's slot is reset; the same
//! work natively for the ratio (`render` and the `agent` functions the host's render asks
//! in the same instance), and a cold compile of each bundled plugin. Then each call
//! timed on its own, for the median, the p99 and the ratio to native of one run,
//! written beside `$CRITERION_HOME` as `plugin-call.md`.
//!
//! `cargo bench -p plugdb-tests --bench plugin_call`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use plugdb::plugin::{EngineSpec, Limits, ParameterValue, ResourceAmounts, Runtime, Tier};
use plugdb_sdk::Engine;

fn spec() -> EngineSpec {
    EngineSpec {
        name: "orders".into(),
        namespace: "shop".into(),
        version: "17".into(),
        replicas: 3,
        storage_bytes: 10 << 30,
        requests: ResourceAmounts { cpu_millis: Some(500), memory_bytes: Some(1 << 30) },
        limits: ResourceAmounts { cpu_millis: Some(2000), memory_bytes: Some(4 << 30) },
        parameters: vec![
            ("max_connections".into(), ParameterValue::Integer(200)),
            ("work_mem".into(), ParameterValue::Text("8MB".into())),
            ("statement_timeout".into(), ParameterValue::Text("30s".into())),
        ],
        tls: None,
        synchronous_replicas: 0,
    }
}

/// The same inputs in the guest SDK's types, for the native call.
fn native_inputs() -> (plugdb_sdk::DatabaseSpec, plugdb_sdk::ClusterContext) {
    let s = spec();
    let c = plugdb_tests::cluster("orders", "shop");
    let amounts = |a: ResourceAmounts| plugdb_sdk::ResourceAmounts { cpu_millis: a.cpu_millis, memory_bytes: a.memory_bytes };
    (
        plugdb_sdk::DatabaseSpec {
            name: s.name,
            namespace: s.namespace,
            version: s.version,
            replicas: s.replicas,
            storage_bytes: s.storage_bytes,
            requests: amounts(s.requests),
            limits: amounts(s.limits),
            parameters: s
                .parameters
                .into_iter()
                .map(|(name, v)| plugdb_sdk::Parameter {
                    name,
                    value: match v {
                        ParameterValue::Integer(n) => plugdb_sdk::ParameterValue::Integer(n),
                        ParameterValue::Text(t) => plugdb_sdk::ParameterValue::Text(t),
                    },
                })
                .collect(),
            tls: None,
            synchronous_replicas: 0,
        },
        plugdb_sdk::ClusterContext {
            primary_host: c.primary_host,
            headless_host: c.headless_host,
            primary_pod: c.primary_pod,
            credentials_secret: c.credentials_secret,
            config_mount_path: c.config_mount_path,
            archive_directory: c.archive_directory,
            restoring: c.restoring,
        },
    )
}

/// The postgres render natively, as the host asks for it: `render`, then each function of
/// the `agent` interface (the member agent's commands and the application's login), which
/// the host's render asks in the same instance.
fn native_render(spec: &plugdb_sdk::DatabaseSpec, cluster: &plugdb_sdk::ClusterContext) {
    use plugdb_plugin_postgres::Postgres;
    use plugdb_sdk::Agent;
    black_box(Postgres::render(spec.clone(), cluster.clone()).expect("render"));
    black_box(Postgres::status_command(spec.clone()));
    black_box(Postgres::fence_command(spec.clone()));
    black_box(Postgres::client_command(spec.clone()));
    black_box(Postgres::promote_command(spec.clone()));
    black_box(Postgres::synchronous_command(spec.clone()));
    black_box(Postgres::follow_command(spec.clone()));
    black_box(Postgres::application(spec.clone()));
}

fn render(c: &mut Criterion) {
    let runtime = Runtime::new(Limits::default()).expect("runtime");
    let postgres = runtime.load(&plugdb_tests::component("postgres")).expect("postgres loads");
    let mysql = runtime.load(&plugdb_tests::component("mysql")).expect("mysql loads");
    let (s, cl) = (spec(), plugdb_tests::cluster("orders", "shop"));
    let mut mysql_spec = spec();
    mysql_spec.version = "11.8".into();
    mysql_spec.parameters = vec![("max_connections".into(), ParameterValue::Integer(200))];
    let mut group = c.benchmark_group("render");
    group.bench_function("postgres plugin (fresh instance + render + policy, then reset)", |b| {
        b.iter(|| postgres.render(black_box(&s), black_box(&cl)).expect("render"))
    });
    // As the operator's call threads run it: the answer is handed on before the
    // instance's slot is reset, so the reset (run after each call, untimed) is not waited for.
    group.bench_function("postgres plugin on a call thread, answer only (fresh instance, its reset after the answer)", |b| {
        plugdb::plugin::defer_resets(true);
        b.iter_custom(|calls| {
            let mut answering = Duration::ZERO;
            for _ in 0..calls {
                let started = Instant::now();
                black_box(postgres.render(black_box(&s), black_box(&cl)).expect("render"));
                answering += started.elapsed();
                plugdb::plugin::reset_spent();
            }
            answering
        });
        plugdb::plugin::defer_resets(false);
        plugdb::plugin::reset_spent();
    });
    group.bench_function("postgres plugin on a call thread, whole call (fresh instance + render + policy, then its reset)", |b| {
        plugdb::plugin::defer_resets(true);
        b.iter(|| {
            black_box(postgres.render(black_box(&s), black_box(&cl)).expect("render"));
            plugdb::plugin::reset_spent();
        });
        plugdb::plugin::defer_resets(false);
        plugdb::plugin::reset_spent();
    });
    group.bench_function("mysql plugin (fresh instance + render + policy, then reset)", |b| {
        b.iter(|| mysql.render(black_box(&mysql_spec), black_box(&cl)).expect("render"))
    });
    let on_demand = Runtime::new(Limits { instance_slots: 0, ..Limits::default() }).expect("runtime");
    let postgres_on_demand = on_demand.load(&plugdb_tests::component("postgres")).expect("postgres loads");
    group.bench_function("postgres plugin, instances allocated on demand (no pool)", |b| {
        b.iter(|| postgres_on_demand.render(black_box(&s), black_box(&cl)).expect("render"))
    });
    let (ns, nc) = native_inputs();
    group.bench_function("postgres native (same render and agent functions, no sandbox)", |b| {
        b.iter(|| native_render(black_box(&ns), black_box(&nc)))
    });
    group.finish();
}

fn compile(c: &mut Criterion) {
    // Quick: the compile a plugin serves from (time to serve); optimised: the build
    // that replaces it in the background and serves the calls measured above.
    for tier in [Tier::Quick, Tier::Optimized] {
        let runtime = Runtime::with_tier(Limits::default(), tier).expect("runtime");
        let mut group = c.benchmark_group(format!("cold compile + self-test, {tier:?}"));
        group.sample_size(10).measurement_time(Duration::from_secs(10));
        for name in ["postgres", "mysql", "minimal", "bulky"] {
            let bytes = plugdb_tests::component(name);
            group.bench_function(format!("{name} ({} KiB)", bytes.len() / 1024), |b| {
                b.iter(|| runtime.load(black_box(&bytes)).expect("loads"))
            });
        }
        group.finish();
    }
}

/// Times each of `calls` one call at a time, `n` times each after a warm-up, taking
/// turns in blocks of 100 calls so that the machine's noise falls on all alike while
/// each runs with its own code and data in the caches: their sorted durations. A call
/// that left its instance's reset pending (see `plugdb::plugin::defer_resets`) has it
/// done after its time is taken.
fn timed(n: usize, calls: &mut [&mut dyn FnMut()]) -> Vec<Vec<Duration>> {
    const BLOCK: usize = 100;
    fn block(call: &mut dyn FnMut(), into: &mut Vec<Duration>) {
        for _ in 0..BLOCK {
            let started = Instant::now();
            call();
            into.push(started.elapsed());
            plugdb::plugin::reset_spent();
        }
    }
    let mut times: Vec<Vec<Duration>> = calls.iter().map(|_| Vec::with_capacity(n)).collect();
    for call in calls.iter_mut() {
        block(*call, &mut Vec::new());
    }
    while times[0].len() < n {
        for (call, into) in calls.iter_mut().zip(&mut times) {
            block(*call, into);
        }
    }
    times.iter_mut().for_each(|t| t.sort());
    times
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Median and p99 of single calls, the sandboxed ones against native, in one run.
fn latency() {
    const CALLS: usize = 20_000;
    let runtime = Runtime::new(Limits::default()).expect("runtime");
    let postgres = runtime.load(&plugdb_tests::component("postgres")).expect("postgres loads");
    let (s, cl) = (spec(), plugdb_tests::cluster("orders", "shop"));
    let (ns, nc) = native_inputs();
    let render = || {
        black_box(postgres.render(&s, &cl).expect("render"));
    };
    // As on the operator's call threads: the instance's slot is reset after the answer
    // (untimed in the answer, timed in the whole call).
    let call_thread = |whole: bool| {
        plugdb::plugin::defer_resets(true);
        render();
        if whole {
            plugdb::plugin::reset_spent();
        }
    };
    let times = timed(
        CALLS,
        &mut [
            &mut || call_thread(false),
            &mut || call_thread(true),
            &mut || {
                // Elsewhere: the slot is reset before the call returns.
                plugdb::plugin::defer_resets(false);
                render();
            },
            &mut || native_render(&ns, &nc),
        ],
    );
    let [answer, whole, fresh, native] = &times[..] else { unreachable!("four series") };
    let micros = |d: Duration| d.as_secs_f64() * 1e6;
    let row = |what: &str, t: &[Duration]| {
        format!(
            "| {what} | {:.2} µs | {:.2} µs | {:.1}× |\n",
            micros(percentile(t, 0.5)),
            micros(percentile(t, 0.99)),
            percentile(t, 0.5).as_secs_f64() / percentile(native, 0.5).as_secs_f64()
        )
    };
    let table = format!(
        "| postgres `render`, {CALLS} calls timed one by one | median | p99 | median ÷ native median |\n| --- | --- | --- | --- |\n{}{}{}{}",
        row("sandboxed on a call thread, answer: instance from the pool + call + host policy (the slot reset after)", answer),
        row("sandboxed on a call thread, whole call: the same, then the slot's reset", whole),
        row("sandboxed elsewhere: instance from the pool + call + host policy, the slot's reset before it returns", fresh),
        row("native: the same render and agent functions, no sandbox", native),
    );
    println!("\n{table}");
    // Beside criterion's own results (scripts/bench.sh: target/plugin-call.md).
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        let out = std::path::Path::new(&home).with_file_name("plugin-call.md");
        if let Err(e) = std::fs::write(&out, &table) {
            eprintln!("writing {}: {e}", out.display());
        }
    }
}

criterion_group!(benches, render, compile);

fn main() {
    benches();
    latency();
    Criterion::default().configure_from_args().final_summary();
}
