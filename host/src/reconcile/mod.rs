//! The reconciler: one pass from the Database's state to its children, members,
//! backups and status. Runs the same way whatever triggered it; a second pass over an
//! unchanged cluster writes nothing.
//!
//! This module holds what every pass shares: the [`Context`] (client, plugin registry
//! and call pool, watch caches, metrics, Events), the controller loop and its
//! triggers, error handling, and the status and finalizer writes. A pass is
//! `converge` (its stages are listed there) or, for a Database being deleted,
//! `delete`. Reading is [`cache`]; what a pass writes is gathered in its `plan` and
//! carried out there (children through `apply`, the Secrets `secrets` decides); the pure parts are
//! [`members`] (observing pods, rolls, failover questions) and [`status`] (conditions
//! and the end of a pass); backups and restores have their own modules.

mod agent;
mod apply;
pub mod ask;
pub mod backups;
mod bucket;
pub mod cache;
mod controller;
mod converge;
pub mod decide;
mod delete;
mod handover;
pub mod members;
mod nodes;
pub mod owner;
mod plan;
mod replication;
pub mod restore;
mod secrets;
pub mod status;

#[cfg(test)]
mod graph;

pub use controller::run;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::build;
use crate::crd::{Database, DatabaseStatus, Phase};
use crate::metrics::{Metrics, ReconcileLabels};
use crate::names::{MANAGER, Names};
use crate::plugin::calls::Render;
use crate::plugin::{CallError, CallPool, EngineSpec, Plugin, Registry, Workload};
use cache::Caches;
use status::{ConditionType, Reason};

/// Finalizer that holds deletion until the final backup is taken.
pub const FINALIZER: &str = "plugdb.io/final-backup";

/// Timing of the reconciler, and where members pull their images.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long the primary may stay not ready before a failover (the engines' readiness
    /// probes say not ready 5-8 s into a hang: a hung primary's replacement takes writes
    /// some 15-18 s in, while a restart in place, ready within the delay, fails nothing
    /// over, nor does a pause of 5 s).
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
    /// Call-thread seconds a second one engine's plugin calls may take on average.
    pub plugin_cpu_per_engine: f64,
    /// How often the members of an engine that elects its leader are asked who leads.
    pub leader_poll: Duration,
    /// How often the member agents are asked for their position and lag (the status and
    /// the lag metric follow).
    pub member_poll: Duration,
    /// How often a Database's bucket confirms what a restore can reach.
    pub bucket_recheck: Duration,
    /// The registry every rendered image is pulled from, and the pull Secrets.
    pub pull: crate::images::Pull,
    /// How the member agents log: as the operator does, so that a log collector reads
    /// one shape from both.
    pub agent_logs: crate::logging::LogFormat,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            failover_after: Duration::from_secs(6),
            progress_requeue: Duration::from_secs(5),
            idle_requeue: Duration::from_secs(300),
            concurrency: 16,
            plugin_calls: 8,
            plugin_calls_per_engine: 2,
            plugin_cpu_per_engine: crate::plugin::DEFAULT_CPU_PER_ENGINE,
            leader_poll: Duration::from_secs(10),
            member_poll: Duration::from_secs(30),
            bucket_recheck: Duration::from_secs(3600),
            pull: crate::images::Pull::default(),
            agent_logs: crate::logging::LogFormat::Text,
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
    calls: Arc<CallPool>,
    failures: Mutex<HashMap<ObjectRef<Database>, u32>>,
    written: Mutex<HashMap<ObjectRef<Database>, Written>>,
    /// The operator's own image: backup and restore Jobs run `plugdb transfer` from it.
    operator_image: Option<String>,
    /// Asks the members of engines that elect their leader (see [`ask`]).
    members_client: reqwest::Client,
    /// What the operator keeps to ask the member agents.
    agents: agent::Agents,
    /// Where the operator may send a request a tenant named (a bucket's endpoint).
    egress: crate::egress::Policy,
    /// Where the operator reaches the member agents from: the peers the members'
    /// NetworkPolicy lets reach their agent port (none known: anyone).
    agents_reached_from: Vec<NetworkPolicyPeer>,
}

/// The operator identity of the contexts not given one ([`Context::with_agent_identity`]):
/// made once in this process, so that contexts made again (a pass test's, a restarted
/// operator's in a test) ask as the same operator. The operator's own is read from its
/// namespace. Making a key fails only without the system's random source, without which
/// no Secret could be generated either.
fn fresh_identity() -> crate::tls::OperatorIdentity {
    static MADE: std::sync::OnceLock<crate::tls::OperatorIdentity> = std::sync::OnceLock::new();
    MADE.get_or_init(|| crate::tls::OperatorIdentity::new(chrono::Utc::now()).expect("the system's random source makes keys")).clone()
}

/// What stamps Secrets for the operator identity of the contexts not given one
/// ([`fresh_identity`]): for caches started beside such a context.
pub fn fresh_stamper() -> crate::stamp::Stamper {
    crate::stamp::Stamper::new(&fresh_identity().authority.key)
}

/// This operator's latest write to a Database, until the watch catches up with it.
struct Written {
    /// Versions the write superseded: a cache still holding one of these is behind.
    superseded: Vec<String>,
    latest: Database,
}

impl Context {
    /// A context that reads the managed objects from `caches`: started by
    /// [`Caches::start`] (whose namespace is that of the Databases reconciled), or
    /// holding hand-built objects ([`Caches::holding`]) for a pass run in a test.
    pub fn new(client: Client, registry: Registry, metrics: Arc<Metrics>, settings: Settings, caches: Caches) -> Self {
        let recorder = crate::events::Recorder::new(client.clone(), MANAGER, "Reconcile");
        let calls =
            CallPool::new(settings.plugin_calls, settings.plugin_calls_per_engine).with_cpu_per_engine(settings.plugin_cpu_per_engine);
        Self {
            client,
            registry,
            metrics,
            recorder,
            settings,
            caches,
            calls: Arc::new(calls),
            failures: Mutex::default(),
            written: Mutex::default(),
            operator_image: None,
            members_client: ask::client(),
            agents: agent::Agents::new(fresh_identity()),
            egress: crate::egress::Policy::default(),
            agents_reached_from: Vec::new(),
        }
    }

    /// The same context, telling the members' NetworkPolicies that the agents are asked
    /// from `peers` alone (`plugdb run --agent-from`).
    pub fn with_agents_reached_from(mut self, peers: Vec<NetworkPolicyPeer>) -> Self {
        self.agents_reached_from = peers;
        self
    }

    /// The same context, reaching the endpoints a tenant names as `policy` allows.
    pub fn with_egress(mut self, policy: crate::egress::Policy) -> Self {
        self.egress = policy;
        self
    }

    /// The same context, asking member agents as `identity` (the operator's, kept in its
    /// namespace) rather than as one made for this context alone.
    pub fn with_agent_identity(mut self, identity: crate::tls::OperatorIdentity) -> Self {
        self.agents = agent::Agents::new(identity);
        self
    }

    /// Waits until every cache has listed and the plugins present at start are loaded:
    /// before that, nothing is judged.
    pub async fn loaded(&self) {
        self.caches.ready().await;
        self.registry.synced().await;
    }

    /// The same context, whose backup and restore Jobs move artefacts to and from object
    /// storage with the `plugdb` binary of `image` (the operator's own image).
    pub fn with_operator_image(mut self, image: Option<String>) -> Self {
        self.operator_image = image;
        self
    }

    /// `F` of `plugin` for `input`: answered from the plugin's memo when it can be (no
    /// thread), else asked in the plugin call pool, never on the async executor. A call
    /// that failed is [`Error::Plugin`]; an engine that is busy, or a call that goes on
    /// without this pass, is [`Error::Busy`]: the pass ends, to be tried again when the
    /// answer is expected.
    pub async fn ask<F: crate::plugin::Sandboxed>(&self, plugin: &Plugin, input: F::Input) -> Result<F::Output, Error> {
        let answer = match plugin.remembered::<F>(&input) {
            Some(answer) => answer.map_err(Error::Plugin)?,
            None => self.calls.run_keyed::<F>(plugin, input).await?,
        };
        Ok(answer)
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
        let (ns, name) = (db.namespace().unwrap_or_default(), db.name_any());
        self.agents.forget(db);
        for m in db.status.iter().flat_map(|s| &s.members) {
            self.metrics.member_said(&ns, &name, &m.pod, None);
        }
        self.metrics.database(db, None);
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
    fn wrote(&self, before: &Database, mut after: Database) {
        cache::database_essentials(&mut after);
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
    /// A TLS certificate could not be issued.
    #[error("TLS: {0}")]
    Tls(String),
    /// The engine's plugin calls are queued as deep as they may be, or a slow call goes
    /// on without the pass: the pass ends and is tried again when the answer is
    /// expected, without holding a reconcile slot meanwhile.
    #[error(transparent)]
    Busy(#[from] crate::plugin::Busy),
    /// A plugin call failed: the plugin refused, broke host policy, or the sandbox
    /// stopped it. Each stage that asks says what that means for the Database.
    #[error(transparent)]
    Plugin(#[from] CallError),
    /// An object with the name of one of the Database's children is not the Database's:
    /// nothing of it is touched, and the pass stops until it goes.
    #[error(transparent)]
    Taken(#[from] owner::Taken),
}

impl From<crate::plugin::Unanswered> for Error {
    fn from(unanswered: crate::plugin::Unanswered) -> Self {
        match unanswered {
            crate::plugin::Unanswered::Busy(busy) => Error::Busy(busy),
            crate::plugin::Unanswered::Failed(failed) => Error::Plugin(failed),
        }
    }
}

impl Error {
    /// Why a pass could not go on, for a reason a user can act on, when retrying alone
    /// will not fix it: the API server refused a write (an invalid object, a quota, a
    /// policy), or a child's name is taken. Conflicts, throttling, missing objects and
    /// server errors are passing and are only retried.
    pub fn refusal(&self) -> Option<(Reason, String)> {
        match self {
            Error::Kube(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 413 | 422) => {
                let said = crate::said::cut(&e.message, crate::events::MAX_NOTE / 2);
                Some((Reason::WriteRefused, format!("the API server refused a write ({} {}): {said}", e.code, e.reason)))
            }
            Error::Taken(taken) => Some((Reason::NameTaken, taken.to_string())),
            _ => None,
        }
    }
}

/// The per-object backoff for transient errors: 1 s doubling to 5 min.
pub fn error_policy(db: Arc<Database>, error: &Error, ctx: Arc<Context>) -> Action {
    if let Error::Busy(busy) = error {
        // Not a failure of this Database: no backoff, no warning.
        tracing::debug!(database = %db.name_any(), %busy, "engine busy");
        ctx.metrics.reconciles_busy.get_or_create(&ReconcileLabels { engine: db.spec.engine.clone() }).inc();
        return Action::requeue(busy.retry_in());
    }
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
    let result =
        if db.metadata.deletion_timestamp.is_some() { delete::delete(&db, &ctx).await } else { converge::converge(&db, &ctx).await };
    ctx.metrics.reconcile_seconds.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
    if let Some((reason, message)) = result.as_ref().err().and_then(Error::refusal) {
        // Over what the failed pass still wrote (a new primary), not the status it found.
        refused(&ctx, &ctx.freshest(db.clone()), reason, message).await;
    }
    if result.is_ok() && ctx.failures.lock().unwrap_or_else(|e| e.into_inner()).remove(&ObjectRef::from_obj(db.as_ref())).is_some() {
        ctx.count_state();
    }
    result
}

/// A pass stopped for a reason the user can act on ([`Error::refusal`]): a Warning Event
/// and `Progressing=False` say it once, not once per retry (the retries keep their
/// backoff); a taken name also makes the Database not `Ready`. The next pass that
/// succeeds sets the conditions anew.
async fn refused(ctx: &Context, db: &Database, reason: Reason, message: String) {
    if status::says(db.status.as_ref(), Some(ConditionType::Progressing), Some(reason), Some(&message)) {
        return;
    }
    let mut status = db.status.clone().unwrap_or_default();
    event(ctx, db, true, reason, message.clone()).await;
    if reason == Reason::NameTaken {
        status::set(&mut status.conditions, ConditionType::Ready, false, reason, message.clone(), db.metadata.generation);
    }
    status::set(&mut status.conditions, ConditionType::Progressing, false, reason, message, db.metadata.generation);
    if let Err(e) = write_status(ctx, db, status).await {
        tracing::warn!(error = %e, "could not record the refusal in the status");
    }
}

async fn event(ctx: &Context, db: &Database, warning: bool, reason: Reason, note: String) {
    event_about(ctx, db, None, warning, reason, note).await;
}

/// An Event on the Database, optionally about a related object (a member pod).
async fn event_about(
    ctx: &Context,
    db: &Database,
    related: Option<k8s_openapi::api::core::v1::ObjectReference>,
    warning: bool,
    reason: Reason,
    note: String,
) {
    // Every decision that changed a Database is an Event; the operator's log says it too,
    // both as one bounded line whatever a plugin, a member or a bucket put in it.
    let note = crate::said::bounded(&note, crate::events::MAX_NOTE);
    let (database, namespace) = (db.name_any(), db.namespace().unwrap_or_default());
    let member = related.as_ref().and_then(|r| r.name.as_deref()).unwrap_or_default();
    if warning {
        tracing::warn!(%database, %namespace, reason = reason.as_str(), member, "{note}");
    } else {
        tracing::info!(%database, %namespace, reason = reason.as_str(), member, "{note}");
    }
    if let Err(e) = ctx.recorder.publish(&db.object_ref(&()), related.as_ref(), warning, reason.as_str(), &note).await {
        tracing::warn!(error = %e, reason = reason.as_str(), "could not record event");
    }
}

async fn write_status(ctx: &Context, db: &Database, status: DatabaseStatus) -> Result<(), Error> {
    ctx.metrics.database(db, Some(&status));
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

async fn set_finalizer(ctx: &Context, db: &Database, present: bool) -> Result<(), Error> {
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

/// A permanent problem, as the status says it: `condition` (and `Ready`) false for
/// `reason`, and the phase. Nothing else changes until the spec or the plugin does.
/// Returns the status and whether the problem is news (an Event says it once).
fn stopped(db: &Database, mut status: DatabaseStatus, condition: ConditionType, reason: Reason, message: &str) -> (DatabaseStatus, bool) {
    let generation = db.metadata.generation;
    status::set(&mut status.conditions, condition, false, reason, message.to_string(), generation);
    if condition != ConditionType::Ready {
        status::set(&mut status.conditions, ConditionType::Ready, false, reason, message.to_string(), generation);
    }
    // A Database that never ran and waits for its engine's plugin is Pending, not Failed:
    // the plugin may be on its way.
    status.phase = Some(match (status.current_version.is_some(), reason) {
        (true, _) => Phase::Degraded,
        (false, Reason::EngineNotFound) => Phase::Pending,
        (false, _) => Phase::Failed,
    });
    status.observed_generation = generation;
    let news = !status::says(db.status.as_ref(), Some(condition), None, Some(message));
    (status, news)
}

/// A pass that stopped on a permanent problem waits for a change; one stopped by a
/// plugin call that ran out of time (which may succeed on a less busy machine) is tried
/// again after a pause.
fn after_stop(ctx: &Context, e: Option<&CallError>) -> Action {
    match e {
        Some(CallError::Timeout { .. }) => Action::requeue(ctx.settings.progress_requeue * 10),
        _ => Action::await_change(),
    }
}

fn backup_message(report: &decide::BackupReport) -> String {
    match (&report.last, &report.next) {
        (Some(last), _) => format!("last backup {}", last.name),
        (None, Some(_)) => "no backup yet".into(),
        (None, None) => "no backups scheduled".into(),
    }
}

fn until_next_backup(report: &decide::BackupReport) -> Duration {
    report.next.map(|t| (t - chrono::Utc::now()).to_std().unwrap_or_default() + Duration::from_secs(1)).unwrap_or(Duration::from_secs(3600))
}

/// The serving plugin and its build: `postgres@0.1.0 (sha256 0123456789ab)`.
fn serving(plugin: &Plugin) -> String {
    format!("{} (sha256 {})", plugin.id(), &plugin.digest()[..12.min(plugin.digest().len())])
}

fn loaded(ctx: &Context) -> String {
    let engines: Vec<String> = ctx.registry.engines().into_iter().map(|(e, _)| e).collect();
    if engines.is_empty() { "none".into() } else { engines.join(", ") }
}

/// The archiver beside `db`'s members when they archive their log for point-in-time
/// recovery: backups go to a bucket, the plugin declares `point-in-time`, and the
/// operator knows its own image (which ships the segments).
pub fn archiver<'a>(ctx: &'a Context, db: &'a Database, plugin: &Plugin) -> Option<build::Archiver<'a>> {
    let target = db.spec.backup.as_ref()?.s3.as_ref()?;
    plugin.lacks(crate::plugin::Capability::PointInTime).is_none().then_some(())?;
    Some(build::Archiver { target, image: ctx.operator_image.as_deref()? })
}

/// What `plugin` is told of the cluster around `db`'s members with `primary` leading: the
/// names it is reached by, and whether its members archive their log.
fn cluster(ctx: &Context, db: &Database, plugin: &Plugin, primary: &str) -> crate::plugin::ClusterContext {
    build::cluster_context(db, primary, archiver(ctx, db, plugin).is_some())
}

/// The member agent beside `db`'s members (from the operator's image, trusting its
/// authority): when the plugin says how a member tells its role and position and the
/// host chooses the primary.
pub fn agent_sidecar<'a>(ctx: &'a Context, plugin: &Plugin, workload: &Workload) -> Option<build::AgentSidecar<'a>> {
    wants_agent(plugin, workload).then_some(())?;
    let image = ctx.operator_image.as_deref()?;
    Some(build::AgentSidecar { image, clients: ctx.agents.pin(), operator: &ctx.agents_reached_from, logs: ctx.settings.agent_logs })
}

/// Whether the members of `workload` should run their agent: the host fails them over
/// and the plugin says how a member tells its position.
pub fn wants_agent(plugin: &Plugin, workload: &Workload) -> bool {
    host_chooses(plugin) && !workload.status_command.is_empty()
}

/// Whether the host chooses the primary of `plugin`'s members (it fails them over, and
/// does not leave it to an election).
fn host_chooses(plugin: &Plugin) -> bool {
    plugin.lacks(crate::plugin::Capability::Failover).is_none() && !plugin.info().capabilities.elects_leader
}

fn join(v: &[crate::plugin::Violation]) -> String {
    v.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// The user the plugin runs the engine as (its Jobs run as the same user): what it
/// renders for `spec` with member 0 as primary. The memo answers it when a pass already
/// rendered the same.
async fn plugin_uid(ctx: &Context, plugin: &Plugin, spec: &EngineSpec, db: &Database) -> Result<u32, Error> {
    let cluster = cluster(ctx, db, plugin, &Names(&db.name_any()).pod(0));
    Ok(ctx.ask::<Render>(plugin, (spec.clone(), cluster)).await?.run_as_user)
}
