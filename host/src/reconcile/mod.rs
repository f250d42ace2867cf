//! The reconciler: one pass from the Database's state to its children, members,
//! backups and status. Runs the same way whatever triggered it; a second pass over an
//! unchanged cluster writes nothing.

mod apply;
pub mod backups;
pub mod cache;
pub mod members;
pub mod restore;
pub mod status;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Predicate, WatchStreamExt, predicates, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::build::{self, MANAGER, Names, ROLE_LABEL};
use crate::crd::{Database, DatabaseStatus, DeletionPolicy, Phase, UpgradeStatus};
use crate::jobs::{self, Purpose};
use crate::metrics::{Metrics, ReconcileLabels};
use crate::plugin::{CallError, CallPool, EngineSpec, FailoverDecision, Plugin, Registry, UpgradeStep};
use backups::JobState;
use cache::{Caches, Triggers};
use status::{Growth, kind};

/// Finalizer that holds deletion until the final backup is taken.
pub const FINALIZER: &str = "plugdb.io/final-backup";

/// Timing of the reconciler.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// How long the primary may stay not ready before a failover.
    pub failover_after: Duration,
    /// Requeue while something is in progress.
    pub progress_requeue: Duration,
    /// Requeue when all is steady.
    pub idle_requeue: Duration,
    /// Databases reconciled at once (0: no limit).
    pub concurrency: u16,
    /// Plugin calls running at once, each on a thread of its own.
    pub plugin_calls: usize,
    /// Plugin calls of one engine running at once.
    pub plugin_calls_per_engine: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            failover_after: Duration::from_secs(30),
            progress_requeue: Duration::from_secs(5),
            idle_requeue: Duration::from_secs(300),
            concurrency: 16,
            plugin_calls: 8,
            plugin_calls_per_engine: 2,
        }
    }
}

/// Everything a reconcile needs.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Loaded engine plugins.
    pub registry: Registry,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Event recorder.
    pub recorder: crate::events::Recorder,
    /// Timing.
    pub settings: Settings,
    /// What the managed objects look like now.
    pub caches: Caches,
    calls: CallPool,
    namespace: Option<String>,
    triggers: Mutex<Option<Triggers>>,
    failures: Mutex<HashMap<ObjectRef<Database>, u32>>,
    written: Mutex<HashMap<ObjectRef<Database>, Written>>,
}

/// This operator's latest write to a Database, until the watch catches up with it.
struct Written {
    /// Versions the write superseded: a cache still holding one of these is behind.
    superseded: Vec<String>,
    latest: Database,
}

impl Context {
    /// A context for Databases in `namespace` (all when `None`); starts the caches.
    pub fn new(client: Client, registry: Registry, metrics: Arc<Metrics>, settings: Settings, namespace: Option<String>) -> Self {
        let recorder = crate::events::Recorder::new(client.clone(), MANAGER, "Reconcile");
        let (caches, triggers) = Caches::start(&client, namespace.as_deref());
        Self {
            client,
            registry,
            metrics,
            recorder,
            settings,
            caches,
            calls: CallPool::new(settings.plugin_calls, settings.plugin_calls_per_engine),
            namespace,
            triggers: Mutex::new(Some(triggers)),
            failures: Mutex::default(),
            written: Mutex::default(),
        }
    }

    /// `function` of `plugin` for `input`: answered from the plugin's memo when it can
    /// be (no thread), else run by `call` in the plugin call pool, never on the async
    /// executor. `input` is what the plugin method keys its memo by.
    pub async fn call<I, T>(
        &self,
        plugin: &Plugin,
        function: &'static str,
        input: I,
        call: fn(&Plugin, &I) -> Result<T, CallError>,
    ) -> Result<T, CallError>
    where
        I: serde::Serialize + Send + 'static,
        T: Clone + Send + 'static,
    {
        if let Some(answer) = plugin.remembered(function, &input) {
            return answer;
        }
        self.calls.run(plugin, move |p| call(p, &input)).await
    }

    /// `db`, or this operator's own later write to it when the cache has not seen that
    /// write yet: a pass never acts on state it has already replaced.
    fn freshest(&self, db: Arc<Database>) -> Arc<Database> {
        let key = ObjectRef::from_obj(db.as_ref());
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        match written.get(&key) {
            Some(w) if db.metadata.resource_version.as_ref().is_some_and(|rv| w.superseded.contains(rv)) => Arc::new(w.latest.clone()),
            Some(_) => {
                written.remove(&key);
                drop(written);
                self.count_state();
                db
            }
            None => db,
        }
    }

    /// Forgets everything kept about `db`, which is gone.
    fn forget(&self, db: &Database) {
        let key = ObjectRef::from_obj(db);
        self.written.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        self.failures.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        self.count_state();
    }

    /// Forgets everything kept about Databases that `exists` does not know.
    fn forget_all_but(&self, exists: impl Fn(&ObjectRef<Database>) -> bool) {
        self.written.lock().unwrap_or_else(|e| e.into_inner()).retain(|key, _| exists(key));
        self.failures.lock().unwrap_or_else(|e| e.into_inner()).retain(|key, _| exists(key));
        self.count_state();
    }

    /// Publishes how much per-Database state is kept.
    fn count_state(&self) {
        let written = self.written.lock().unwrap_or_else(|e| e.into_inner()).len();
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner()).len();
        self.metrics.reconcile_state_entries.set((written + failures) as i64);
    }

    /// Records that `before` was replaced by `after`, which this operator wrote.
    fn wrote(&self, before: &Database, after: Database) {
        let key = ObjectRef::from_obj(before);
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        // What this write replaced, and whatever the previous one had replaced or written.
        let mut superseded: Vec<String> =
            written.remove(&key).map(|w| w.superseded.into_iter().chain(w.latest.metadata.resource_version).collect()).unwrap_or_default();
        superseded.extend(before.metadata.resource_version.clone());
        superseded.retain(|rv| Some(rv) != after.metadata.resource_version.as_ref());
        superseded.sort();
        superseded.dedup();
        written.insert(key, Written { superseded, latest: after });
        drop(written);
        self.count_state();
    }
}

type Ctx = Context;

/// Transient failures: retried with per-object backoff. Permanent problems (bad spec,
/// plugin refusal, unknown engine) are conditions, not errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// An object could not be (de)serialised.
    #[error("serialisation: {0}")]
    Json(#[from] serde_json::Error),
    /// The CSPRNG failed.
    #[error("random source: {0}")]
    Random(String),
}

impl Error {
    /// What the API server said when it refused a write for a reason a user can act on
    /// (an invalid object, a quota, a policy): retrying alone will not fix it. Conflicts,
    /// throttling, missing objects and server errors are passing and are only retried.
    pub fn refusal(&self) -> Option<String> {
        match self {
            Error::Kube(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 413 | 422) => {
                let said = crate::events::truncate(&e.message, crate::events::MAX_NOTE / 2);
                Some(format!("the API server refused a write ({} {}): {said}", e.code, e.reason))
            }
            _ => None,
        }
    }
}

/// Runs the controller until `shutdown` completes; in-flight reconciles finish first.
/// Reconciles start once every cache has listed and the plugins present at start are loaded.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static) {
    let Some(triggers) = ctx.triggers.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        tracing::error!("this context's controller already ran");
        return;
    };
    let dbs: Api<Database> = cache::api(&ctx.client, ctx.namespace.as_deref());
    // Nothing is judged before the caches and the plugins are loaded: a restarted
    // operator must not report engines missing that are merely still loading.
    ctx.caches.ready().await;
    ctx.registry.synced().await;
    // A Database's own status and finalizer writes do not start another pass: only its
    // spec (generation, which deletion also bumps) and annotations (backup-now) do.
    let (reader, writer) = reflector::store();
    // What is kept about a Database goes with it: when its deletion is seen, and for
    // any a relist no longer finds (deleted while the watch was down).
    let (keeper, known) = (ctx.clone(), reader.clone());
    let databases = watcher(dbs, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect(writer)
        .inspect(move |event| match event {
            Ok(watcher::Event::Delete(db)) => keeper.forget(db),
            Ok(watcher::Event::InitDone) => keeper.forget_all_but(|key| known.get(key).is_some()),
            _ => {}
        })
        .applied_objects()
        .predicate_filter(predicates::generation.combine(predicates::annotations), Default::default());
    let plugin_changes = engine_changes(ctx.registry.subscribe(), reader.clone());
    let config = kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency);
    Controller::for_stream(databases, reader)
        .with_config(config)
        .owns_stream(triggers.stateful_sets.map(Ok))
        .owns_stream(triggers.jobs.map(Ok))
        .reconcile_on(plugin_changes)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile loop");
            }
        })
        .await;
}

/// The Databases to pass over when a plugin changes: those of the engine it serves. A
/// receiver that lagged behind has lost which engines changed, so it names them all.
fn engine_changes(
    changes: tokio::sync::broadcast::Receiver<String>,
    databases: reflector::Store<Database>,
) -> impl futures::Stream<Item = ObjectRef<Database>> + Send + 'static {
    use tokio::sync::broadcast::error::RecvError;
    futures::stream::unfold(changes, |mut rx| async move {
        match rx.recv().await {
            Ok(engine) => Some((Some(engine), rx)),
            Err(RecvError::Lagged(_)) => Some((None, rx)),
            Err(RecvError::Closed) => None,
        }
    })
    .flat_map(move |engine| {
        let of_engine = |db: &Database| engine.as_ref().is_none_or(|e| db.spec.engine == *e);
        futures::stream::iter(
            databases.state().iter().filter(|db| of_engine(db)).map(|db| ObjectRef::from_obj(db.as_ref())).collect::<Vec<_>>(),
        )
    })
}

/// The per-object backoff for transient errors: 1 s doubling to 5 min.
pub fn error_policy(db: Arc<Database>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = ObjectRef::from_obj(db.as_ref());
    let mut failures = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
    let n = failures.entry(key).or_insert(0);
    *n = (*n + 1).min(9);
    let delay = Duration::from_secs((1u64 << *n).min(300));
    drop(failures);
    ctx.count_state();
    tracing::warn!(database = %db.name_any(), namespace = db.namespace().unwrap_or_default(), error = %error, retry_in = ?delay, "reconcile failed");
    ctx.metrics.reconcile_errors.get_or_create(&ReconcileLabels { engine: db.spec.engine.clone() }).inc();
    Action::requeue(delay)
}

/// Reconciles one Database.
#[tracing::instrument(skip_all, fields(database = %db.name_any(), namespace = db.namespace().unwrap_or_default(), engine = %db.spec.engine))]
pub async fn reconcile(db: Arc<Database>, ctx: Arc<Context>) -> Result<Action, Error> {
    let db = ctx.freshest(db);
    let started = std::time::Instant::now();
    let labels = ReconcileLabels { engine: db.spec.engine.clone() };
    ctx.metrics.reconciles.get_or_create(&labels).inc();
    let result = if db.metadata.deletion_timestamp.is_some() { delete(&db, &ctx).await } else { converge(&db, &ctx).await };
    ctx.metrics.reconcile_seconds.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
    if let Some(message) = result.as_ref().err().and_then(Error::refusal) {
        refused(&ctx, &db, message).await;
    }
    if result.is_ok() && ctx.failures.lock().unwrap_or_else(|e| e.into_inner()).remove(&ObjectRef::from_obj(db.as_ref())).is_some() {
        ctx.count_state();
    }
    result
}

/// A write the API server refused for a reason the user can act on: a Warning Event and
/// `Progressing=False` say it once, not once per retry (the retries keep their backoff).
/// The next pass that succeeds sets `Progressing` anew.
async fn refused(ctx: &Ctx, db: &Database, message: String) {
    let mut status = db.status.clone().unwrap_or_default();
    if status.conditions.iter().any(|c| c.type_ == kind::PROGRESSING && c.reason == REFUSED && c.message == message) {
        return;
    }
    event(ctx, db, true, REFUSED, message.clone()).await;
    status::set(&mut status.conditions, kind::PROGRESSING, false, REFUSED, message, db.metadata.generation);
    if let Err(e) = write_status(ctx, db, status).await {
        tracing::warn!(error = %e, "could not record the refusal in the status");
    }
}

/// The reason of a write the API server refused.
const REFUSED: &str = "WriteRefused";

async fn event(ctx: &Ctx, db: &Database, warning: bool, reason: &str, note: String) {
    event_about(ctx, db, None, warning, reason, note).await;
}

/// An Event on the Database, optionally about a related object (a member pod).
async fn event_about(
    ctx: &Ctx,
    db: &Database,
    related: Option<k8s_openapi::api::core::v1::ObjectReference>,
    warning: bool,
    reason: &str,
    note: String,
) {
    if let Err(e) = ctx.recorder.publish(&db.object_ref(&()), related.as_ref(), warning, reason, &note).await {
        tracing::warn!(error = %e, reason, "could not record event");
    }
}

async fn write_status(ctx: &Ctx, db: &Database, status: DatabaseStatus) -> Result<(), Error> {
    if db.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let api: Api<Database> = Api::namespaced(ctx.client.clone(), &db.namespace().unwrap_or_default());
    // The status is the operator's alone and always written whole: one JSON Patch
    // replaces it (cheaper for the API server than an apply, and fields now unset go).
    let patch: json_patch::Patch = serde_json::from_value(json!([{"op": "add", "path": "/status", "value": status}]))?;
    let params = PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() };
    let after = api.patch_status(&db.name_any(), &params, &Patch::<()>::Json(patch)).await?;
    ctx.wrote(db, after);
    Ok(())
}

async fn set_finalizer(ctx: &Ctx, db: &Database, present: bool) -> Result<(), Error> {
    let has = db.finalizers().iter().any(|f| f == FINALIZER);
    if has == present {
        return Ok(());
    }
    let mut finalizers: Vec<String> = db.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
    if present {
        finalizers.push(FINALIZER.into());
    }
    // The last finalizer of a deleted Database: it goes, and so does what is kept about it.
    let gone = finalizers.is_empty() && db.metadata.deletion_timestamp.is_some();
    let api: Api<Database> = Api::namespaced(ctx.client.clone(), &db.namespace().unwrap_or_default());
    let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": db.resource_version()}});
    let after = api.patch(&db.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
    if gone {
        ctx.forget(db)
    } else {
        ctx.wrote(db, after)
    }
    Ok(())
}

/// A permanent problem: recorded as conditions and an Event; nothing else changes
/// until the spec or the plugin does.
async fn stop_with(
    ctx: &Ctx,
    db: &Database,
    mut status: DatabaseStatus,
    condition: &str,
    reason: &str,
    message: String,
) -> Result<Action, Error> {
    let generation = db.metadata.generation;
    status::set(&mut status.conditions, condition, false, reason, message.clone(), generation);
    if condition != kind::READY {
        status::set(&mut status.conditions, kind::READY, false, reason, message.clone(), generation);
    }
    // A Database that never ran and waits for its engine's plugin is Pending, not Failed:
    // the plugin may be on its way.
    status.phase = Some(match (status.current_version.is_some(), reason) {
        (true, _) => Phase::Degraded,
        (false, "EngineNotFound") => Phase::Pending,
        (false, _) => Phase::Failed,
    });
    status.observed_generation = generation;
    let changed =
        db.status.as_ref().map(|s| s.conditions.iter().find(|c| c.type_ == condition).map(|c| &c.message)) != Some(Some(&message));
    if changed {
        event(ctx, db, true, reason, message).await;
    }
    write_status(ctx, db, status).await?;
    Ok(Action::await_change())
}

/// A plugin call failed: the condition says why. A call stopped at its deadline may
/// succeed on a less busy machine, so it is tried again after a pause; a refusal, a
/// trap or a policy breach waits for a change (of the spec or the plugin).
async fn plugin_failed(ctx: &Ctx, db: &Database, status: DatabaseStatus, reason: &str, e: &CallError) -> Result<Action, Error> {
    let action = stop_with(ctx, db, status, kind::PLUGIN_READY, reason, e.to_string()).await?;
    Ok(match e {
        CallError::Timeout { .. } => Action::requeue(ctx.settings.progress_requeue * 10),
        _ => action,
    })
}

async fn converge(db: &Database, ctx: &Ctx) -> Result<Action, Error> {
    let mut status = db.status.clone().unwrap_or_default();
    let generation = db.metadata.generation;
    let name = db.name_any();
    let ns = db.namespace().unwrap_or_default();
    let names = Names(&name);
    set_finalizer(ctx, db, db.spec.deletion_policy == DeletionPolicy::Snapshot).await?;

    // 1. Dereference the plugin.
    let Some(plugin) = ctx.registry.get(&db.spec.engine) else {
        let mut message = format!("no plugin serves engine {:?}; loaded: {}", db.spec.engine, loaded(ctx));
        if let Some(p) = ctx.registry.problem(&db.spec.engine) {
            message.push_str(&format!("; ConfigMap {} was rejected: {}", p.config_map, p.reason));
        }
        return stop_with(ctx, db, status, kind::PLUGIN_READY, "EngineNotFound", message).await;
    };
    status.plugin = Some(plugin.id());
    let info = plugin.info().clone();
    let desired_version = if db.spec.version.is_empty() { info.default_version.clone() } else { db.spec.version.clone() };

    // 2. Validate: host rules, then the plugin's.
    let spec = match build::engine_spec(db, &desired_version) {
        Ok(spec) => spec,
        Err(v) => return stop_with(ctx, db, status, kind::PLUGIN_READY, "InvalidSpec", join(&v)).await,
    };
    match ctx.call(&plugin, "validate", spec.clone(), |p, spec| p.validate(spec)).await {
        Ok(v) if v.is_empty() => {}
        Ok(v) => {
            return stop_with(
                ctx,
                db,
                status,
                kind::PLUGIN_READY,
                "InvalidSpec",
                format!("{} rejects the spec: {}", plugin.id(), join(&v)),
            )
            .await;
        }
        Err(e) => return plugin_failed(ctx, db, status, "PluginFailed", &e).await,
    }

    // 3. Upgrades: which version to render.
    let running = status.current_version.clone();
    let mut plan = None;
    let mut version = desired_version.clone();
    // Refused in this pass: the refusal stays the Progressing condition. A refusal of an
    // earlier spec is not state: once the spec is fixed the condition follows the members.
    let mut upgrade_refused = false;
    if let Some(current) = running.as_ref().filter(|c| **c != desired_version) {
        match ctx.call(&plugin, "plan-upgrade", (spec.clone(), current.clone()), |p, (spec, from)| p.plan_upgrade(spec, from)).await {
            Ok(p) => {
                if status.upgrade.as_ref().is_none_or(|u| u.to != desired_version) {
                    event(
                        ctx,
                        db,
                        false,
                        "UpgradeStarted",
                        format!("upgrading from {current} to {desired_version}: {} step(s)", p.steps.len()),
                    )
                    .await;
                    status.upgrade = Some(UpgradeStatus { from: current.clone(), to: desired_version.clone(), step: 0 });
                }
                // A pre-upgrade backup first, when the plugin asks and backups are configured.
                if p.backup_first && db.spec.backup.as_ref().is_some_and(|b| b.enabled) {
                    let backup = format!("{name}-pre-{}", &crate::plugin::hex_digest(desired_version.as_bytes())[..10]);
                    let current_spec = EngineSpec { version: current.clone(), ..spec.clone() };
                    let uid = plugin_uid(ctx, &plugin, &current_spec, db).await;
                    match backups::ensure_backup(ctx, db, &plugin, &current_spec, &backup, uid).await? {
                        Ok(JobState::Succeeded) => {}
                        Ok(_) => version = current.clone(),
                        Err(reason) => return stop_with(ctx, db, status, kind::PROGRESSING, "PreUpgradeBackupImpossible", reason).await,
                    }
                }
                plan = Some(p);
            }
            Err(e) => {
                let message = format!("upgrade from {current} to {desired_version} refused: {e}");
                if !db.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.reason == "UpgradeRefused" && c.message == message)) {
                    event(ctx, db, true, "UpgradeRefused", message.clone()).await;
                }
                status::set(&mut status.conditions, kind::PROGRESSING, false, "UpgradeRefused", message, generation);
                upgrade_refused = true;
                status.upgrade = None;
                version = current.clone();
            }
        }
    } else {
        status.upgrade = None;
    }
    let spec = EngineSpec { version: version.clone(), ..spec };

    // 4. Members as they are; a lost primary is replaced before anything is rendered, so
    // the Services and members follow the new one in this same pass.
    let pod_list = ctx.caches.pods(&ns, &build::selector(db));
    let observed = members::observe(&names.primary(), &pod_list, k8s_openapi::jiff::Timestamp::now());
    let mut primary = status.primary.clone().unwrap_or_else(|| names.pod(0));
    let mut failed_over = false;
    if members::primary_lost(&observed, &primary, ctx.settings.failover_after.as_secs() as i64) {
        let members = members::for_plugin(&observed, &primary);
        match ctx.call(&plugin, "choose-primary", (spec.clone(), members), |p, (spec, members)| p.choose_primary(spec, members)).await {
            Ok(FailoverDecision::Promote { pod, command }) => {
                let note = format!(
                    "primary {primary} not ready for {:?}; promoting {pod} (promotion: {})",
                    ctx.settings.failover_after,
                    command.join(" ")
                );
                event(ctx, db, true, "FailoverPromoted", note).await;
                primary = pod;
                failed_over = true;
            }
            Ok(FailoverDecision::NoSafeMember(reason)) => {
                let message = format!("primary {primary} is not ready and no member is safe to promote: {reason}");
                if !db.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.reason == "NoSafeFailover")) {
                    event(ctx, db, true, "NoSafeFailover", message.clone()).await;
                }
                status::set(&mut status.conditions, kind::DEGRADED, true, "NoSafeFailover", message, generation);
            }
            Err(e) => status::set(&mut status.conditions, kind::DEGRADED, true, "FailoverFailed", e.to_string(), generation),
        }
    }

    // 5. Render and apply.
    let cluster = build::cluster_context(db, &primary);
    let workload = match ctx.call(&plugin, "render", (spec.clone(), cluster.clone()), |p, (spec, cluster)| p.render(spec, cluster)).await {
        Ok(w) => w,
        Err(e) => return plugin_failed(ctx, db, status, "RenderFailed", &e).await,
    };
    match ctx.registry.problem(&db.spec.engine) {
        // A bad new version never replaces the running one, but users of the engine should know.
        Some(p) => status::set(
            &mut status.conditions,
            kind::PLUGIN_READY,
            true,
            "NewerVersionRejected",
            format!("rendered by {}; ConfigMap {} is not serving: {}", serving(&plugin), p.config_map, p.reason),
            generation,
        ),
        None => status::set(
            &mut status.conditions,
            kind::PLUGIN_READY,
            true,
            "Rendered",
            format!("rendered by {}", serving(&plugin)),
            generation,
        ),
    }
    apply::ensure_credentials(ctx, db, &workload.credentials).await?;
    let was_ready = status::is_true(&status.conditions, kind::READY);
    // Restored once, never again: the condition remembers it.
    let restoring = if db.spec.restore_from.is_some() && !status::is_true(&status.conditions, kind::RESTORED) {
        let r = restore::reconcile(ctx, db, &plugin, &spec, &workload, was_ready).await?;
        if r == restore::Restore::Done {
            let source = db.spec.restore_from.as_ref().map(|s| format!("{}/{}", s.database, s.backup)).unwrap_or_default();
            event(ctx, db, false, "Restored", format!("restored from backup {source}")).await;
            status::set(&mut status.conditions, kind::RESTORED, true, "Restored", format!("restored from backup {source}"), generation);
        }
        r
    } else {
        restore::Restore::Done
    };
    match &restoring {
        restore::Restore::Failed(reason) => return stop_with(ctx, db, status, kind::PROGRESSING, "RestoreFailed", reason.clone()).await,
        restore::Restore::HoldMembers => {
            status.phase = Some(Phase::Restoring);
            status::set(
                &mut status.conditions,
                kind::PROGRESSING,
                true,
                "Restoring",
                format!("restoring into the data volume ({})", restore::job_name(db)),
                generation,
            );
            status.observed_generation = generation;
            write_status(ctx, db, status).await?;
            return Ok(Action::requeue(ctx.settings.progress_requeue));
        }
        restore::Restore::Done | restore::Restore::Running => {}
    }
    let mut sts: Option<Arc<StatefulSet>> = ctx.caches.stateful_set(&ns, &names.primary());
    for child in build::children(db, &workload, &db.spec.engine, &primary) {
        let applied = apply::apply(ctx, &ns, &child).await?;
        if let Some(applied) = applied.filter(|_| child.kind == build::Kind::StatefulSet) {
            sts = Some(Arc::new(serde_json::from_value(serde_json::to_value(applied)?)?));
        }
    }
    // Every pass, not only one that rewrote the StatefulSet: a refused grow is retried.
    let growth = grow_volumes(ctx, db, &ns).await?;
    status.primary = Some(primary.clone());
    if status.current_version.is_none() {
        status.current_version = Some(version.clone());
    }

    // 6. Members: roles and rolling restarts.
    // Revisions are only meaningful once the StatefulSet controller has seen the latest spec.
    let sts_current = sts.as_ref().is_some_and(|s| s.status.as_ref().and_then(|st| st.observed_generation) == s.metadata.generation);
    let sts_status = sts.as_ref().and_then(|s| s.status.as_ref());
    let desired = db.spec.replicas.max(1) as usize;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    for m in &observed {
        let role = if m.name == primary { "primary" } else { "replica" };
        if m.role.as_deref() != Some(role) && !m.terminating {
            pods.patch(&m.name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {ROLE_LABEL: role}}}))).await?;
        }
    }
    let update_revision = sts_status.and_then(|s| s.update_revision.clone()).unwrap_or_default();
    let mut progressing = failed_over;
    if let Some(next) = members::next_to_roll(&observed, &update_revision, &primary, desired).filter(|_| sts_current) {
        pods.delete(&next.name, &DeleteParams::default()).await?;
        let pod = pod_list.iter().find(|p| p.name_any() == next.name).map(|p| p.object_ref(&()));
        event_about(ctx, db, pod, false, "MemberRestarted", format!("restarted {} onto the current revision", next.name)).await;
        progressing = true;
    }
    let rolled = sts_current && members::rolled(&observed, &update_revision, desired);

    // 7. Upgrade steps, once the new version is rendered (until then, a pre-upgrade
    // backup is running).
    progressing |= status.upgrade.is_some();
    if let (Some(upgrade), Some(plan)) = (status.upgrade.clone().filter(|u| u.to == version), plan) {
        progressing = true;
        let mut step = upgrade.step as usize;
        while let Some(s) = plan.steps.get(step) {
            let done = match s {
                UpgradeStep::RollingRestart => rolled,
                UpgradeStep::Job(job) => {
                    let job_name = format!("{name}-upgrade-{}-{step}", &crate::plugin::hex_digest(upgrade.to.as_bytes())[..8]);
                    let child = jobs::job(db, &job_name, Purpose::Upgrade, job, &name, None, workload.run_as_user);
                    apply::create_once(ctx, &ns, &child).await?;
                    backups::state(ctx.caches.job(&ns, &job_name).as_deref()) == JobState::Succeeded
                }
            };
            if !done {
                break;
            }
            step += 1;
        }
        if step >= plan.steps.len() && rolled {
            event(ctx, db, false, "UpgradeCompleted", format!("upgraded from {} to {}", upgrade.from, upgrade.to)).await;
            status.current_version = Some(upgrade.to.clone());
            status.upgrade = None;
        } else {
            status.upgrade = Some(UpgradeStatus { step: step as i32, ..upgrade });
        }
    }

    // 8. Backups.
    let report = backups::reconcile(ctx, db, &plugin, &spec, workload.run_as_user).await?;
    status.last_backup = report.last.clone();
    status.next_backup = report.next.map(|t| t.to_rfc3339());
    status.backup_request = report.request.clone();
    status.last_scheduled_backup = report.scheduled.clone();
    match &report.problem {
        Some(p) => status::set(&mut status.conditions, kind::BACKUP_HEALTHY, false, "BackupProblem", p.clone(), generation),
        None => status::set(&mut status.conditions, kind::BACKUP_HEALTHY, true, "BackupsHealthy", backup_message(&report), generation),
    }

    // 9. Status.
    if let Growth::Failed(message) = &growth
        && !db.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.reason == "VolumeGrowFailed" && c.message == *message))
    {
        event(ctx, db, true, "VolumeGrowFailed", message.clone()).await;
    }
    let pass = status::Pass {
        generation,
        desired,
        members: &observed,
        rolled,
        moving: progressing,
        growth: &growth,
        upgrade_refused,
        restoring: restoring == restore::Restore::Running,
    };
    let progressing = status::conclude(&mut status, &pass);
    write_status(ctx, db, status).await?;
    let requeue = if progressing || report.running {
        ctx.settings.progress_requeue
    } else if matches!(growth, Growth::Failed(_)) {
        ctx.settings.progress_requeue * 6
    } else {
        until_next_backup(&report).min(ctx.settings.idle_requeue)
    };
    Ok(Action::requeue(requeue))
}

fn backup_message(report: &backups::BackupReport) -> String {
    match (&report.last, &report.next) {
        (Some(last), _) => format!("last backup {}", last.name),
        (None, Some(_)) => "no backup yet".into(),
        (None, None) => "no backups scheduled".into(),
    }
}

fn until_next_backup(report: &backups::BackupReport) -> Duration {
    report.next.map(|t| (t - chrono::Utc::now()).to_std().unwrap_or_default() + Duration::from_secs(1)).unwrap_or(Duration::from_secs(3600))
}

/// The serving plugin and its build: `postgres@0.1.0 (sha256 0123456789ab)`.
fn serving(plugin: &Plugin) -> String {
    format!("{} (sha256 {})", plugin.id(), &plugin.digest()[..12.min(plugin.digest().len())])
}

fn loaded(ctx: &Ctx) -> String {
    let engines: Vec<String> = ctx.registry.engines().into_iter().map(|(e, _)| e).collect();
    if engines.is_empty() { "none".into() } else { engines.join(", ") }
}

fn join(v: &[crate::plugin::Violation]) -> String {
    v.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// Grows member claims to `spec.storage` (claims grow, never shrink). A StatefulSet's
/// claim templates cannot change, so the claims themselves are patched.
async fn grow_volumes(ctx: &Ctx, db: &Database, ns: &str) -> Result<Growth, Error> {
    let Some(want) = crate::quantity::bytes(&db.spec.storage.0) else { return Ok(Growth::Done) };
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let name = db.name_any();
    let mut growth = Growth::Done;
    for ordinal in 0..db.spec.replicas.max(1) as u32 {
        let claim = Names(&name).data_claim(ordinal);
        // An unbound claim cannot change; it is grown once it is bound.
        let Some(pvc) = ctx.caches.claim(ns, &claim).filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")) else {
            continue;
        };
        let storage = |map: Option<&std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            map.and_then(|m| m.get("storage")).and_then(|q| crate::quantity::bytes(&q.0))
        };
        let requested = storage(pvc.spec.as_ref().and_then(|s| s.resources.as_ref()).and_then(|r| r.requests.as_ref()));
        if requested.is_some_and(|r| r < want) {
            let patch = Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": db.spec.storage.0}}}}));
            match api.patch(&claim, &PatchParams::default(), &patch).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if (400..500).contains(&e.code) => {
                    return Ok(Growth::Failed(format!("claim {claim} cannot grow to {}: {}", db.spec.storage.0, e.message)));
                }
                Err(e) => return Err(e.into()),
            }
        }
        let capacity = storage(pvc.status.as_ref().and_then(|s| s.capacity.as_ref()));
        if growth == Growth::Done && capacity.is_some_and(|c| c < want) {
            growth = Growth::Waiting(format!("claim {claim} asks for {}; the storage provider is growing it", db.spec.storage.0));
        }
    }
    Ok(growth)
}

/// Deletion: under Snapshot, a final backup must succeed before the finalizer goes.
async fn delete(db: &Database, ctx: &Ctx) -> Result<Action, Error> {
    if !db.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    if db.spec.deletion_policy != DeletionPolicy::Snapshot {
        set_finalizer(ctx, db, false).await?;
        return Ok(Action::await_change());
    }
    let name = db.name_any();
    // A Database that never ran (an unknown engine, a spec refused from the start) has
    // no members and no data: there is nothing to back up.
    let ns = db.namespace().unwrap_or_default();
    if db.status.as_ref().is_none_or(|s| s.current_version.is_none()) && ctx.caches.stateful_set(&ns, &Names(&name).primary()).is_none() {
        event(ctx, db, false, "DeletedWithoutBackup", "the Database never ran, so it holds no data: no final backup taken".into()).await;
        set_finalizer(ctx, db, false).await?;
        return Ok(Action::await_change());
    }
    let mut status = db.status.clone().unwrap_or_default();
    status.phase = Some(Phase::Deleting);
    let final_name = format!("{name}-final");
    let outcome = match ctx.registry.get(&db.spec.engine) {
        None => Err(format!(
            "no plugin serves engine {:?}, so no final backup can be taken; set deletionPolicy: Retain to delete without one",
            db.spec.engine
        )),
        Some(plugin) => {
            let version =
                db.status.as_ref().and_then(|s| s.current_version.clone()).unwrap_or_else(|| plugin.info().default_version.clone());
            match build::engine_spec(db, &version) {
                Err(v) => Err(join(&v)),
                Ok(spec) => {
                    let uid = plugin_uid(ctx, &plugin, &spec, db).await;
                    match backups::ensure_backup(ctx, db, &plugin, &spec, &final_name, uid).await? {
                        Ok(state) => Ok(state),
                        Err(reason) => Err(format!(
                            "the plugin cannot take a final backup: {reason}; set deletionPolicy: Retain to delete without one"
                        )),
                    }
                }
            }
        }
    };
    match outcome {
        Ok(JobState::Succeeded) => {
            event(ctx, db, false, "FinalBackupTaken", format!("final backup {final_name} succeeded; deleting")).await;
            set_finalizer(ctx, db, false).await?;
            Ok(Action::await_change())
        }
        Ok(JobState::Failed) => {
            let message =
                format!("final backup {final_name} failed; the Database is kept. Delete the Job to retry, or set deletionPolicy: Retain");
            stop_with(ctx, db, status, kind::BACKUP_HEALTHY, "FinalBackupFailed", message).await
        }
        Ok(_) => {
            status::set(
                &mut status.conditions,
                kind::BACKUP_HEALTHY,
                true,
                "FinalBackupRunning",
                format!("waiting for final backup {final_name}"),
                db.metadata.generation,
            );
            write_status(ctx, db, status).await?;
            Ok(Action::requeue(ctx.settings.progress_requeue))
        }
        Err(message) => stop_with(ctx, db, status, kind::BACKUP_HEALTHY, "FinalBackupImpossible", message).await,
    }
}

async fn plugin_uid(ctx: &Ctx, plugin: &Plugin, spec: &EngineSpec, db: &Database) -> u32 {
    let cluster = build::cluster_context(db, &Names(&db.name_any()).pod(0));
    ctx.call(plugin, "render", (spec.clone(), cluster), |p, (spec, cluster)| p.render(spec, cluster))
        .await
        .map(|w| w.run_as_user)
        .unwrap_or(1000)
}
