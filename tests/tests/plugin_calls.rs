//! Tier 4: plugin calls on a real control plane with the real wasmtime runtime. A
//! plugin that spends its whole deadline on every call delays neither the executor
//! (timers, the lease renewal) nor another engine's Databases, and a call stopped at
//! its deadline is tried again with no change to the Database; a plugin that changes
//! passes over its own engine's Databases only.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams};
use plugdb::crd::Database;
use plugdb::health::Health;
use plugdb::metrics::Metrics;
use plugdb::operator::{self, Options};
use plugdb::plugin::Limits;
use plugdb::reconcile::Settings;
use plugdb_tests::ControlPlane;
use plugdb_tests::operator::{
    InProcess, OPERATOR_NAMESPACE, counting_client, metric_sum, plugin_config_map, prepare, test_settings, wait_for,
};
use serde_json::json;

/// Long enough that `orders` (applied just after the hostile Databases) is reconciled
/// well within it on a cold, busy machine; a call that blocked the executor or a
/// reconcile that queued behind the hostile engine would take at least this long.
const DEADLINE: Duration = Duration::from_millis(4000);
const HOSTILE: usize = 8;
/// Reconcile slots: fewer than the hostile Databases, and as many as its engine's
/// calls may queue (running or waiting): reconciles that waited for those calls while
/// holding their slots would leave none to `orders`.
const SLOTS: u16 = 4;

fn timeouts(metrics: &Metrics) -> u64 {
    metric_sum(&metrics.encode(), "plugdb_plugin_calls_total", |l| l.contains("engine=\"hostile\"") && l.contains("outcome=\"timeout\""))
        as u64
}

/// One executor thread for everything, as a plugin call on the executor would block
/// it: timers stay on time, the lease is never lost, and a postgres Database is
/// reconciled before any of the hostile engine's calls has run out its deadline, though
/// the hostile Databases outnumber the reconcile slots and its calls may queue as deep
/// as there are slots (its calls go on without their reconciles, which let go of their
/// slots and come back for the answers).
#[tokio::test(flavor = "current_thread")]
async fn a_plugin_that_uses_its_whole_deadline_delays_only_its_own_engine() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("postgres", "postgres"), ("hostile", "hostile")]).await.expect("CRD and plugins");
    let (client, _) = counting_client(&cp.kubeconfig).await.expect("client");
    let metrics = Arc::new(Metrics::default());
    let lease = Duration::from_secs(3);
    let health = Health::elected(lease);
    let options = Options {
        identity: Some("only-replica".into()),
        lease_duration: lease,
        // Both of the hostile engine's threads spin throughout (its CPU share is not
        // what this test is about): every hostile Database reports within the wait.
        settings: Settings { concurrency: SLOTS, plugin_cpu_per_engine: 2.0, ..test_settings() },
        limits: Limits { call_timeout: DEADLINE, ..Limits::default() },
        ..Default::default()
    };
    let operator = tokio::spawn(operator::run(client, metrics.clone(), options, health.clone(), std::future::pending()));
    wait_for("the operator leads with its plugins loaded", Duration::from_secs(60), async || health.readiness().is_ok()).await;
    // Plugins serve their quick build at once and are recompiled in the background (at
    // normal priority, about a second each in a debug build): let that finish, so that
    // what is timed below is the call threads' own scheduling, not the compiler's.
    wait_for("both plugins serve their optimised build", Duration::from_secs(60), async || {
        metric_sum(&metrics.encode(), "plugdb_plugins_optimized", |_| true) == 2.0
    })
    .await;

    // How late a 50 ms timer fires on this executor, and whether leadership ever lapsed.
    let (latest, lapsed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
    let watcher = {
        let (latest, lapsed, health) = (latest.clone(), lapsed.clone(), health.clone());
        tokio::spawn(async move {
            loop {
                let asked = Instant::now();
                tokio::time::sleep(Duration::from_millis(50)).await;
                let late = asked.elapsed().saturating_sub(Duration::from_millis(50));
                latest.fetch_max(late.as_millis() as u64, Ordering::Relaxed);
                if !health.leading() {
                    lapsed.store(true, Ordering::Relaxed);
                }
            }
        })
    };

    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    let apply = |name: String, spec: serde_json::Value| {
        let dbs = dbs.clone();
        let db = json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": name}, "spec": spec});
        async move { dbs.patch(&name, &PatchParams::apply("test"), &Patch::Apply(&db)).await }
    };
    for i in 0..HOSTILE {
        apply(format!("hostile-{i}"), json!({"engine": "hostile", "storage": "1Gi", "parameters": {"attack": "loop"}}))
            .await
            .expect("hostile");
    }
    apply("orders".into(), json!({"engine": "postgres", "storage": "1Gi"})).await.expect("postgres");
    wait_for("orders is reconciled", Duration::from_secs(60), async || {
        dbs.get_opt("orders").await.ok().flatten().is_some_and(|d| d.status.is_some_and(|s| s.observed_generation.is_some()))
    })
    .await;
    let stopped_when_orders_ran = timeouts(&metrics);
    assert_eq!(
        stopped_when_orders_ran, 0,
        "orders waited for the hostile engine: {stopped_when_orders_ran} of its calls had already run out"
    );

    // Each hostile Database says why, and is tried again though nothing changed.
    // Bounds on progress, far above what it takes (16 s of deadlines on two threads), for
    // a machine shared with the other scenarios.
    wait_for("every hostile Database reports its timeout", Duration::from_secs(300), async || {
        let list = dbs.list(&Default::default()).await.map(|l| l.items).unwrap_or_default();
        let reported = list.iter().filter(|d| {
            d.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| c.type_ == "PluginReady" && c.status == "False" && c.message.contains("deadline"))
            })
        });
        reported.count() == HOSTILE
    })
    .await;
    wait_for("a timed-out call is retried", Duration::from_secs(300), async || timeouts(&metrics) > HOSTILE as u64).await;

    watcher.abort();
    let late = Duration::from_millis(latest.load(Ordering::Relaxed));
    // A call on the executor would hold the timer for about the whole deadline.
    assert!(late < DEADLINE / 2, "a timer fired {late:?} late: a plugin call ran on the executor");
    assert!(!lapsed.load(Ordering::Relaxed), "leadership lapsed while the hostile plugin ran");
    assert!(!operator.is_finished());
    operator.abort();
}

/// Plugins are pure, so their answers are remembered: once a Database has been
/// rendered, passes over the same spec make no plugin call at all, and the metric
/// says how many were answered from memory. A changed spec is a new input: called.
#[tokio::test]
async fn a_resync_of_an_unchanged_database_makes_no_plugin_call() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("postgres", "postgres")]).await.expect("CRD and plugins");
    let operator = InProcess::start(&cp.kubeconfig, test_settings()).await.expect("operator");
    let calls = || operator.metric("plugdb_plugin_calls_total", |l| l.contains("engine=\"postgres\"")) as u64;
    let hits = || operator.metric("plugdb_plugin_memo_total", |l| l.contains("outcome=\"hit\"")) as u64;
    let reconciles = || operator.metric("plugdb_reconciles_total", |l| l.contains("engine=\"postgres\"")) as u64;

    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    let db = |replicas: i32| {
        json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": "orders"},
               "spec": {"engine": "postgres", "replicas": replicas, "storage": "1Gi"}})
    };
    dbs.patch("orders", &PatchParams::apply("test"), &Patch::Apply(&db(1))).await.expect("database");
    wait_for("orders is reconciled", Duration::from_secs(60), async || {
        dbs.get_opt("orders").await.ok().flatten().is_some_and(|d| d.status.is_some_and(|s| s.observed_generation.is_some()))
    })
    .await;
    // No Pod ever runs on this tier: the Database stays in progress and is passed over
    // again every requeue, with the same spec each time.
    let (calls_then, hits_then, passes_then) = (calls(), hits(), reconciles());
    assert!(calls_then > 0, "the first pass called the plugin");
    wait_for("five more passes", Duration::from_secs(60), async || reconciles() >= passes_then + 5).await;
    assert_eq!(calls(), calls_then, "passes over an unchanged spec called the plugin");
    assert!(hits() > hits_then, "they were answered from memory");

    dbs.patch("orders", &PatchParams::apply("test"), &Patch::Apply(&db(2))).await.expect("scale");
    wait_for("the new spec is rendered", Duration::from_secs(60), async || calls() > calls_then).await;
}

/// With no requeue due, only a change wakes a Database: a new build of one engine's
/// plugin passes over that engine's Databases, and leaves the other engine's alone.
#[tokio::test]
async fn a_plugin_change_passes_over_only_its_own_engines_databases() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("minimal", "minimal"), ("postgres", "postgres")]).await.expect("CRD and plugins");
    let hour = Duration::from_secs(3600);
    let settings = Settings { progress_requeue: hour, idle_requeue: hour, ..test_settings() };
    let operator = InProcess::start(&cp.kubeconfig, settings).await.expect("operator");
    let reconciles = |engine: &str| {
        let label = format!("engine=\"{engine}\"");
        operator.metric("plugdb_reconciles_total", |l| l.contains(&label)) as u64
    };

    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    for (name, engine) in [("cache", "minimal"), ("orders", "postgres")] {
        let db = json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": name},
                        "spec": {"engine": engine, "storage": "1Gi"}});
        dbs.patch(name, &PatchParams::apply("test"), &Patch::Apply(&db)).await.expect("database");
    }
    wait_for("both are reconciled", Duration::from_secs(60), async || {
        let reconciled = |d: Option<Database>| d.and_then(|d| d.status).is_some_and(|s| s.observed_generation.is_some());
        reconciled(dbs.get_opt("cache").await.ok().flatten()) && reconciled(dbs.get_opt("orders").await.ok().flatten())
    })
    .await;
    // Quiet: the children's first status changes have been passed over.
    let mut last = (0, 0, Instant::now());
    wait_for("no pass for 3 s", Duration::from_secs(60), async || {
        let now = (reconciles("minimal"), reconciles("postgres"));
        if now != (last.0, last.1) {
            last = (now.0, now.1, Instant::now());
        }
        last.2.elapsed() > Duration::from_secs(3)
    })
    .await;
    let (minimal, postgres) = (reconciles("minimal"), reconciles("postgres"));

    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(cp.client.clone(), OPERATOR_NAMESPACE);
    let v2 = plugin_config_map("minimal", "minimal-v2");
    cms.patch("engine-minimal", &PatchParams::apply("test").force(), &Patch::Apply(&v2)).await.expect("new build");
    wait_for("the minimal Database is passed over", Duration::from_secs(60), async || reconciles("minimal") > minimal).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(reconciles("postgres"), postgres, "another engine's plugin change passed over a postgres Database");
}
