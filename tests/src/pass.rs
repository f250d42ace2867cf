//! Whole passes at unit speed, for the test files that run them: the reconciler runs one
//! pass over hand-built caches ([`Caches::holding`]) with the bundled plugins, against a
//! mocked API client that records every request in order ([`MockApi`]).

use std::sync::Arc;

use kube::runtime::controller::Action;
use plugdb::crd::Database;
use plugdb::metrics::Metrics;
use plugdb::plugin::{Limits, Registry, Runtime};
use plugdb::reconcile::cache::Caches;
use plugdb::reconcile::{self, Context};
use serde_json::{Value, json};

use crate::component;
use crate::mock_api::{Call, MockApi};
use crate::operator::test_settings;

/// A registry serving the bundled postgres plugin (compiled once per test).
pub async fn registry() -> Registry {
    registry_of(&["postgres"]).await
}

/// A registry serving the bundled plugins of `engines` (compiled once per test).
pub async fn registry_of(engines: &[&str]) -> Registry {
    let metrics = Arc::new(Metrics::default());
    let registry = Registry::new(Runtime::new(Limits::default()).expect("runtime"), metrics);
    for engine in engines {
        let outcome = registry.load_bytes(&format!("bundled/{engine}.wasm"), component(engine)).await;
        assert!(matches!(outcome, plugdb::plugin::Outcome::Loaded { .. }), "{engine}: {outcome:?}");
    }
    registry
}

/// A Database `orders` in `shop` as the API server serves it: `spec` over a minimal one.
pub fn database(spec: Value) -> Database {
    let mut whole = json!({"engine": "postgres", "storage": "1Gi"});
    json_patch::merge(&mut whole, &spec);
    serde_json::from_value(json!({
        "apiVersion": "plugdb.io/v1alpha1", "kind": "Database",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "db-uid", "generation": 1, "resourceVersion": "10"},
        "spec": whole,
    }))
    .expect("a Database")
}

/// One pass over `db` with the caches holding `objects`; the requests it made. A pass
/// whose plugin call runs slow on a busy machine ends `Busy` and goes on without it: as
/// the controller does, the pass is run again over the same state once the answer is
/// expected (the plugin's memo has it then), and only that run's requests count.
pub async fn pass(registry: &Registry, db: &Database, objects: &[Value]) -> (Vec<Call>, MockApi) {
    let (result, calls, api) = pass_over(registry, db, objects, &Server::default()).await;
    if let Err(e) = result {
        panic!("the pass: {e}");
    }
    (calls, api)
}

/// The API server beyond the Database, and how the operator runs.
#[derive(Default, Clone)]
pub struct Server {
    /// (path, object): what a read of the path finds.
    pub served: Vec<(String, Value)>,
    /// (path, status code): a write of the path is refused so.
    pub refused: Vec<(String, u16)>,
    /// The operator's own image: members get an agent beside them.
    pub image: Option<&'static str>,
    /// The members' agents are asked where they are on every pass (not every half minute).
    pub poll: bool,
    /// Where the operator may send a request a tenant named (a bucket's endpoint); none
    /// given: the default policy.
    pub egress: Option<plugdb::egress::Policy>,
}

/// The API server holding `served` (path, object) for reads.
pub fn serving(served: &[(String, Value)]) -> Server {
    Server { served: served.to_vec(), ..Server::default() }
}

/// [`pass`], with the API server as `server` says, whatever the pass ends with. A pass
/// the plugins' pool was too busy for is run again by a new operator (nothing of the
/// first kept).
pub async fn pass_over(
    registry: &Registry,
    db: &Database,
    objects: &[Value],
    server: &Server,
) -> (Result<Action, reconcile::Error>, Vec<Call>, MockApi) {
    let mut earlier = Vec::new();
    loop {
        let api = MockApi::new(db).serving(&server.served).refusing(&server.refused);
        let ctx = operator(registry, &api, objects, server);
        match reconcile::reconcile(Arc::new(db.clone()), ctx.clone()).await {
            Err(reconcile::Error::Busy(busy)) => tokio::time::sleep(busy.retry_in()).await,
            ended => return (ended, api.take(), api),
        }
        // The call goes on in this context's pool: it is kept until the pass is done.
        earlier.push(ctx);
    }
}

/// `n` passes of one operator (what it keeps between passes, kept), each over the
/// Database as the one before left it, with the API server as `server` says: what each
/// ended with and the requests it made (a pass the plugins' pool was too busy for, and
/// its run again, are one).
pub async fn passes_over(
    registry: &Registry,
    db: &Database,
    objects: &[Value],
    server: &Server,
    n: usize,
) -> (Vec<(Result<Action, reconcile::Error>, Vec<Call>)>, MockApi) {
    let api = MockApi::new(db).serving(&server.served).refusing(&server.refused);
    let ctx = operator(registry, &api, objects, server);
    let mut passes = Vec::new();
    let mut calls = Vec::new();
    while passes.len() < n {
        let ended = reconcile::reconcile(Arc::new(api.database()), ctx.clone()).await;
        calls.extend(api.take());
        match ended {
            Err(reconcile::Error::Busy(busy)) => tokio::time::sleep(busy.retry_in()).await,
            ended => passes.push((ended, std::mem::take(&mut calls))),
        }
    }
    (passes, api)
}

/// An operator over the caches holding `objects`, with `api` as its API server, running
/// as `server` says.
fn operator(registry: &Registry, api: &MockApi, objects: &[Value], server: &Server) -> Arc<Context> {
    let caches = Caches::holding(objects, reconcile::fresh_stamper()).expect("caches");
    let mut settings = test_settings();
    if server.poll {
        settings.member_poll = std::time::Duration::ZERO;
    }
    let ctx = Context::new(api.client(), registry.clone(), Arc::new(Metrics::default()), settings, caches);
    let mut ctx = ctx.with_operator_image(server.image.map(str::to_string));
    if let Some(policy) = &server.egress {
        ctx = ctx.with_egress(policy.clone());
    }
    Arc::new(ctx)
}

/// Each request, as one line (`METHOD path`).
pub fn lines(calls: &[Call]) -> Vec<String> {
    calls.iter().map(Call::line).collect()
}

/// The objects `calls` created or applied, as the API server would serve them back.
pub fn written(calls: &[Call]) -> Vec<Value> {
    calls.iter().filter(|c| c.method == "POST" || c.is_apply()).filter(|c| c.body["kind"] != "Event").map(|c| c.body.clone()).collect()
}

/// What the Database's status says now.
pub fn status(api: &MockApi) -> plugdb::crd::DatabaseStatus {
    api.database().status.expect("a status")
}

/// A Database that had its first pass: the Database as that pass left it, and what it
/// made.
pub async fn made(registry: &Registry, spec: Value) -> (Database, Vec<Value>) {
    let (calls, api) = pass(registry, &database(spec), &[]).await;
    (api.database(), written(&calls))
}

/// `made`, its StatefulSet's controller caught up at revision `revision`, and its
/// members as the StatefulSet's template makes them: one pod per `(ready, revision)`,
/// started an hour ago, member 0 labelled primary.
pub fn running(made: &[Value], revision: &str, members: &[(bool, &str)]) -> Vec<Value> {
    let an_hour_ago = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut objects: Vec<Value> = made.to_vec();
    let set = objects.iter_mut().find(|o| o["kind"] == "StatefulSet").expect("a StatefulSet");
    set["metadata"]["generation"] = json!(1);
    set["status"] = json!({"observedGeneration": 1, "updateRevision": revision, "currentRevision": revision, "replicas": members.len()});
    let template = set["spec"]["template"]["metadata"].clone();
    let containers = set["spec"]["template"]["spec"]["containers"].clone();
    for (ordinal, (ready, revision)) in members.iter().enumerate() {
        let mut labels = template["labels"].clone();
        labels["controller-revision-hash"] = json!(revision);
        labels["plugdb.io/role"] = json!(if ordinal == 0 { "primary" } else { "replica" });
        let owner = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "orders", "uid": "set-uid", "controller": true});
        objects.push(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": format!("orders-{ordinal}"), "namespace": "shop", "uid": format!("pod-{ordinal}"),
                "creationTimestamp": an_hour_ago, "labels": labels, "annotations": template["annotations"], "ownerReferences": [owner],
            },
            "spec": {"nodeName": format!("node-{ordinal}"), "containers": containers},
            "status": {
                "phase": "Running", "podIP": format!("10.0.0.{}", 10 + ordinal),
                "conditions": [{"type": "Ready", "status": if *ready { "True" } else { "False" }, "lastTransitionTime": an_hour_ago}],
            },
        }));
    }
    objects
}

/// A backup Job of `orders` named `name`, completed at `completed` (running when `None`).
pub fn backup_job(name: &str, completed: Option<&str>) -> Value {
    let conditions = match completed {
        Some(_) => json!([{"type": "Complete", "status": "True"}]),
        None => json!([]),
    };
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": name, "namespace": "shop", "uid": format!("job-{name}"), "creationTimestamp": completed.unwrap_or("2026-11-28T00:00:00Z"),
            "labels": {"plugdb.io/backup-of": "orders", "app.kubernetes.io/instance": "orders", "app.kubernetes.io/managed-by": "plugdb"},
            "ownerReferences": [{"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "name": "orders", "uid": "db-uid", "controller": true}],
        },
        "spec": {"template": {"spec": {"containers": []}}},
        "status": {"completionTime": completed, "conditions": conditions},
    })
}
