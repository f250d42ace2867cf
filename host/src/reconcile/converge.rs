//! One pass over a Database that is not being deleted: a short driver over named
//! stages. Each stage observes (the watch caches, as values), asks the plugin the
//! question the decide stage names, and lets [`decide`] choose (pure, table-tested).
//! What they decide to apply, make, label, restart, move, remove and say goes into one
//! [`Plan`], carried out in one place in a fixed order when the pass ends (however it
//! ends), and so does what they decide the status says (its conditions and fields,
//! [`status::Told`]): the stages read the status as the pass found it and never write
//! it. The one status write is a pure function of the old status, what was told, what
//! the members show and what carrying out found ([`status::after`], then
//! [`status::conclude`]).
//!
//! ```text
//!            observe          ask the plugin      decide (pure)         the plan (or the handover)
//! engine     spec             validate            (host checks)         -
//! observe    member pods,     -                   members::observe      -
//!            down ones' nodes, the agents and the bucket when due, certificates the cache
//!            will not do, a restore's bucket, an elected leader's members
//! upgrade    running version  plan-upgrade        decide::upgrade       pre-upgrade backup Job, Event
//! failover   members          choose-primary      decide::failover      the handover: fence, Service, promote, labels; Event
//!  switchover (observed)       -                   decide::switchover    the fence, then the handover; the request removed
//! scale      StatefulSet      plan-scale          decide::scale         scale Job, Event
//! render     (observed)       render              certificates due      credentials, TLS and agent Secrets
//! elected    (observed)       choose-primary      decide::elected       Event
//! restore    restore Jobs     restore             restore::progress     claims, restore Jobs, Event
//!            (observed)
//! hear       (observed)       -                   second_primaries      a second primary fenced
//! apply      claims           -                   build::children       the children, claims grown
//! members    StatefulSet      -                   decide::roll          role labels, one restart, Event
//! replication members         -                   decide::replication   the agents asked for the synchronous setting, Event
//! move       lost nodes       -                   moveFromLostNodeAfter a replica's claim and pod, Event
//! steps      Jobs             -                   decide::steps         upgrade Jobs, Event
//! backups    (observed)       backup              decide::backups       backup Jobs, removals, the bucket pruned, Event
//! conclude   what was carried -                   status::conclude      the plan carried out, then the status written
//! ```
//!
//! The observe stage alone reads over the network, and no stage writes (both checked by
//! [`super::graph`]). The finalizer is the plan's first write; a change of who leads is a step ([`super::handover::Lead`]) that
//! ends the pass, carried out first by its end ([`Pass::lead`]), which looks again at
//! once. A growth the API server refuses, a bucket retention cannot prune, or a
//! synchronous setting the primary's agent does not take is found when the plan is
//! carried out, and the status says it. A members' template the plan writes
//! is one the StatefulSet's controller has not seen yet: no member is rolled onto it in
//! the same pass.
//!
//! A stage that finds a permanent problem ends the pass with a condition
//! ([`super::stopped`]): the plan so far is carried out, and nothing after it runs until
//! the spec or the plugin changes.
//!
//! The stages are methods of one `Pass`, in the order the table gives, so that a pass
//! reads top to bottom here; those that decide who leads are in [`leads`], those whose
//! work runs as Jobs in [`work`], and the end of a pass (the plan carried out, the status
//! written once, the next look) in [`end`].

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::backups;
use super::cache::SetFacts;
use super::decide::BackupReport;
use super::decide::{self, FailoverQuestion, JobState, Note, Primary, Scale, ScaleQuestion, Upgrade};
use super::members::{self, Observed};
use super::plan::{Plan, member_ref};
use super::status::{self, ConditionType, Growth, Reason};
use super::{Context, Error, after_stop, apply, join, nodes, plugin_uid, replication, restore, secrets, serving, stopped, write_status};
use crate::build;
use crate::crd::{Database, DatabaseStatus, DeletionPolicy, Phase};
use crate::jobs::{self, Purpose};
use crate::names::Names;
use crate::plugin::calls::{ChoosePrimary, PlanScale, PlanUpgrade, Render, Validate};
use crate::plugin::{CallError, Capability, EngineSpec, Plugin, Workload};

/// A stage's outcome: go on with its value, or end the pass with this action.
type Flow<T> = Result<ControlFlow<Action, T>, Error>;

/// The value of a stage that went on; a stage that ended the pass returns its action.
macro_rules! proceed {
    ($stage:expr) => {
        match $stage? {
            ControlFlow::Continue(value) => value,
            ControlFlow::Break(action) => return Ok(action),
        }
    };
}

mod end;
mod leads;
mod work;

/// Converges `db` towards its spec. A pass that fails part way still says what it did
/// (see [`Plan`]).
pub(super) async fn converge(db: &Database, ctx: &Context) -> Result<Action, Error> {
    let mut pass = Pass::new(ctx, db);
    pass.plan.finalizer(db.spec.deletion_policy == DeletionPolicy::Snapshot);
    let result = stages(&mut pass).await;
    if result.is_err() {
        std::mem::take(&mut pass.plan).after_failure(ctx, db).await;
    }
    result
}

/// The stages of a pass, in order, then its end.
async fn stages(pass: &mut Pass<'_>) -> Result<Action, Error> {
    let (ctx, db) = (pass.ctx, pass.db);
    let engine = proceed!(pass.engine().await);
    let Observation { mut members, backups: seen, secrets: held, restore: restore_from, answered } = pass.observe(&engine).await?;
    let upgrade = proceed!(pass.upgrade(&engine, seen.answered()).await);
    let spec = EngineSpec { version: upgrade.version.clone(), ..engine.spec.clone() };
    let primary = proceed!(pass.failover(&engine.plugin, &spec, &mut members).await);
    let archiver = super::archiver(ctx, db, &engine.plugin);
    let scale = pass.scale(&engine.plugin, &spec, &members).await?;
    // The plugin renders the members there are in this step of a scale plan.
    let members_now = EngineSpec { replicas: scale.granted, ..spec.clone() };
    let rendering = proceed!(pass.render(&engine.plugin, &members_now, (&primary.name, &held), archiver.is_some()).await);
    let workload = &rendering.workload;
    let primary = pass.elected(&engine.plugin, &spec, (&members, answered), primary).await?;
    pass.scale_job(&scale, workload);
    let restoring = proceed!(pass.restore(&engine.plugin, &spec, workload, restore_from).await);
    let sidecars = build::Sidecars { archiver, agent: super::agent_sidecar(ctx, &engine.plugin, workload), pull: &ctx.settings.pull };
    let elects = engine.plugin.info().capabilities.elects_leader;
    pass.agents(super::wants_agent(&engine.plugin, workload), sidecars.agent.is_some());
    let incident = pass.hear(&members, &primary.name, elects);
    let leadership = build::Leadership::of(&engine.plugin);
    // The agents can name the replicas that confirm commits.
    let named = sidecars.agent.is_some() && !workload.synchronous_command.is_empty();
    let applied = pass.apply(&rendering, &members.heard, &primary.name, sidecars, (scale.granted, leadership)).await?;
    let rolled = pass.members(&members, &primary, &applied, scale.granted);
    let replication_due = pass.replication(&members, &primary, (elects, named));
    let moving_due = pass.move_replicas(&members, &primary, elects);
    let upgrading = pass.steps(&upgrade, workload, rolled.done);
    let report = pass.backups(&engine.plugin, &spec, workload, seen).await?;
    pass.end(end::Found {
        members: &members,
        primary: &primary,
        scale: &scale,
        rolled: &rolled,
        applied: &applied,
        restoring,
        report: &report,
        plan_refused: upgrade.refused || scale.refused,
        upgrading,
        incident,
        elects,
        due: [moving_due, replication_due, rolled.look_again],
        polled: (workload.member_query.is_some(), sidecars.agent.is_some()),
    })
    .await
}

impl Pass<'_> {
    /// The replication stage: which replicas confirm commits, the primary's agent told
    /// at the end of the pass; when to look again, if commits wait for too few replicas.
    fn replication(&mut self, members: &Members, primary: &Primary, (elects, named): (bool, bool)) -> Option<Duration> {
        let heard: Vec<&str> = members.heard.iter().map(|(pod, _)| pod.as_str()).collect();
        let observed = (members.observed.as_slice(), primary.name.as_str(), heard.as_slice());
        let decided = replication::decide(self.db, (&self.old, &mut self.plan.told), observed, (elects, named));
        self.say(&decided.notes);
        if let Some(step) = decided.step {
            self.plan.synchronous(step);
        }
        decided.due
    }

    /// The move stage: a replica on a node lost past `spec.spread.moveFromLostNodeAfter`
    /// is made again elsewhere (never a member of an engine that elects its leader: it is
    /// part of the engine's membership); when to look again, if one waits.
    fn move_replicas(&mut self, members: &Members, primary: &Primary, elects: bool) -> Option<Duration> {
        let after = self.db.spec.spread.as_ref().and_then(|s| s.move_after()).filter(|_| !elects)?;
        let pods = (members.observed.as_slice(), members.pods.as_slice());
        nodes::move_replicas(self.ctx, self.db, after, pods, &members.lost, &primary.name, &mut self.plan)
    }
}

/// What the stages share: the Database, its status as the pass found it, and the plan.
struct Pass<'a> {
    ctx: &'a Context,
    db: &'a Database,
    name: String,
    ns: String,
    generation: Option<i64>,
    /// The status as the pass found it: what the stages decided it says goes in the plan.
    old: DatabaseStatus,
    /// What the stages decided to write, and what the status says, carried out and
    /// written when the pass ends.
    plan: Plan,
}

/// The engine's plugin and the spec it accepted (at the desired version).
struct Engine {
    plugin: Plugin,
    spec: EngineSpec,
}

/// What the render stage made sure of: the plugin's workload, the version and the primary
/// it was rendered for (member 0 for an engine that elects its leader), and the stamp of
/// the TLS certificate the members mount.
struct Rendering {
    workload: Workload,
    /// The engine version it was rendered at.
    version: String,
    rendered_for: String,
    tls: Option<String>,
}

/// What the observe stage read.
struct Observation {
    members: Members,
    backups: backups::Seen,
    secrets: secrets::Held,
    /// The bucket a restore starts from, when it is to start ([`restore::observe`]).
    restore: Option<Result<super::bucket::Opened, String>>,
    /// What an elected leader's members answered, in the order of the members
    /// ([`Pass::read_leader`]).
    answered: Option<Vec<Option<String>>>,
}

/// The members' pods and what they say.
struct Members {
    pods: Vec<Arc<Pod>>,
    observed: Vec<Observed>,
    lost: nodes::LostNodes,
    /// What their agents said in this pass, in the order of `observed`, when they were
    /// asked.
    said: Option<Vec<Option<crate::agent::Status>>>,
    /// The same, by pod, for those that said something.
    heard: Vec<(String, crate::agent::Status)>,
    /// Who leads as the pass found it, for the failover stage (which takes it).
    leads: Option<Leads>,
}

/// Who leads as the pass found it: the primary, how long it may be lost before it is
/// replaced, and whether the plugin is asked to replace it.
struct Leads {
    primary: String,
    after: Duration,
    question: FailoverQuestion,
}

/// What the apply stage decided.
struct Applied {
    /// The StatefulSet as the cache has it, unless this pass writes a new members'
    /// template: its controller has not seen it yet, and no member is rolled onto it.
    stateful_set: Option<SetFacts>,
    /// The members' template's hash without the primary's name ([`crate::names::ROLE_FREE_HASH`]).
    role_free: String,
    growth: Growth,
}

/// What the members stage found and did.
struct Rolled {
    /// Every member ready on the StatefulSet's current revision.
    done: bool,
    /// A member was restarted in this pass.
    restarted: bool,
    /// When to look again for a replica that may follow a new primary on its own.
    look_again: Option<Duration>,
}

impl<'a> Pass<'a> {
    fn new(ctx: &'a Context, db: &'a Database) -> Self {
        Self {
            ctx,
            db,
            name: db.name_any(),
            ns: db.namespace().unwrap_or_default(),
            generation: db.metadata.generation,
            old: db.status.clone().unwrap_or_default(),
            plan: Plan::default(),
        }
    }

    /// Ends the pass with a permanent problem (see [`stopped`]): nothing after it runs
    /// until the spec or the plugin changes.
    async fn stop<T>(&mut self, condition: ConditionType, reason: Reason, message: String) -> Flow<T> {
        self.stop_after(condition, reason, message, None).await
    }

    /// Ends the pass on a failed plugin call: `PluginReady` says why (see [`after_stop`]).
    async fn plugin_failed<T>(&mut self, reason: Reason, e: &CallError) -> Flow<T> {
        self.stop_after(ConditionType::PluginReady, reason, e.to_string(), Some(e)).await
    }

    async fn stop_after<T>(&mut self, condition: ConditionType, reason: Reason, message: String, call: Option<&CallError>) -> Flow<T> {
        let (status, news) = stopped(self.db, self.told(), condition, reason, &message);
        if news {
            self.plan.tell(None, true, reason, message);
        }
        self.finish(status).await?;
        Ok(ControlFlow::Break(after_stop(self.ctx, call)))
    }

    /// The old status with what the stages told so far ([`status::after`]).
    fn told(&mut self) -> DatabaseStatus {
        status::after(&self.old, std::mem::take(&mut self.plan.told), self.generation)
    }

    /// The plugin serving the engine, and the spec it and the host accept.
    async fn engine(&mut self) -> Flow<Engine> {
        let (ctx, db) = (self.ctx, self.db);
        let Some(plugin) = ctx.registry.get(&db.spec.engine) else {
            let mut message = format!("no plugin serves engine {:?}; loaded: {}", db.spec.engine, super::loaded(ctx));
            if let Some(p) = ctx.registry.problem(&db.spec.engine) {
                message.push_str(&format!("; ConfigMap {} was rejected: {}", p.config_map, p.reason));
            }
            return self.stop(ConditionType::PluginReady, Reason::EngineNotFound, message).await;
        };
        self.plan.told.plugin = Some(plugin.id());
        if db.spec.tls_enabled()
            && let Some(why) = plugin.lacks(Capability::Tls)
        {
            let message = format!("spec.tls: TLS cannot be configured: {why}");
            return self.stop(ConditionType::PluginReady, Reason::CapabilityMissing, message).await;
        }
        let version = if db.spec.version.is_empty() { plugin.info().default_version.clone() } else { db.spec.version.clone() };
        let spec = match build::engine_spec(db, &version) {
            Ok(spec) => spec,
            Err(v) => return self.stop(ConditionType::PluginReady, Reason::InvalidSpec, join(&v)).await,
        };
        match ctx.ask::<Validate>(&plugin, spec.clone()).await {
            Ok(v) if v.is_empty() => Ok(ControlFlow::Continue(Engine { plugin, spec })),
            Ok(v) => {
                let message = format!("{} rejects the spec: {}", plugin.id(), join(&v));
                self.stop(ConditionType::PluginReady, Reason::InvalidSpec, message).await
            }
            Err(Error::Plugin(e)) => self.plugin_failed(Reason::PluginFailed, &e).await,
            Err(e) => Err(e),
        }
    }

    /// Which version to render: a version change is planned by the plugin; a refused plan
    /// keeps the running version and says why in `Progressing` (a refusal of an earlier
    /// spec is not state: once the spec is fixed the condition follows the members).
    /// The upgrade stage; `answered`: whether the backups' bucket answered when the pass
    /// observed it (a backup before the upgrade must have it).
    async fn upgrade(&mut self, engine: &Engine, answered: Option<Result<(), String>>) -> Flow<Upgrade> {
        let (ctx, db) = (self.ctx, self.db);
        let desired = engine.spec.version.clone();
        let Some(running) = decide::upgrade_from(self.old.current_version.as_deref(), &desired).map(str::to_string) else {
            self.plan.told.upgrade = Some(None);
            return Ok(ControlFlow::Continue(Upgrade::none(&desired)));
        };
        let input = (engine.spec.clone(), running.clone());
        let answer = match ctx.ask::<PlanUpgrade>(&engine.plugin, input).await {
            Err(Error::Plugin(e)) => Err(e.to_string()),
            asked => Ok(asked?),
        };
        let backup = decide::pre_upgrade_backup(&self.name, &desired);
        let backup_state = self.job_state(&backup);
        let facts = decide::UpgradeFacts {
            name: &self.name,
            running: &running,
            desired: &desired,
            progress: self.old.upgrade.as_ref(),
            backups: db.spec.backup.as_ref().is_some_and(|b| b.enabled),
            backup: backup_state,
        };
        let upgrade = decide::upgrade(facts, answer);
        self.say(&upgrade.notes);
        self.plan.told.upgrade = Some(upgrade.progress.clone());
        if let Some(backup) = upgrade.backup_first.as_deref().filter(|_| backup_state == JobState::Missing) {
            // Taken at the running version, before anything is rendered at the new one.
            let current_spec = EngineSpec { version: running.clone(), ..engine.spec.clone() };
            let uid = match plugin_uid(ctx, &engine.plugin, &current_spec, db).await {
                Ok(uid) => uid,
                Err(Error::Plugin(e)) => return self.plugin_failed(Reason::RenderFailed, &e).await,
                Err(e) => return Err(e),
            };
            if let Err(reason) = backups::backup(ctx, db, (&engine.plugin, &current_spec), (backup, uid), answered, &mut self.plan).await? {
                return self.stop(ConditionType::Progressing, Reason::PreUpgradeBackupImpossible, reason).await;
            }
        }
        Ok(ControlFlow::Continue(upgrade))
    }

    /// The observe stage: the members as the pod cache has them (those on a node cut off
    /// from the control plane taken as down, and, unless the engine elects its leader,
    /// replicas that do not replicate), the nodes of those that are down, whether the
    /// failover stage is to ask the plugin, and, when due, what every member's agent says
    /// ([`Pass::agents_due`]); what the backups need read ([`backups::observe`]), and the
    /// certificates ([`secrets::observe`]).
    async fn observe(&self, engine: &Engine) -> Result<Observation, Error> {
        let (ctx, db, plugin) = (self.ctx, self.db, &engine.plugin);
        let elects = plugin.info().capabilities.elects_leader;
        let pods = ctx.caches.pods(db, &crate::names::selector(db));
        let at = k8s_openapi::jiff::Timestamp::now();
        let mut observed = members::observe(&Names(&self.name).primary(), &pods, at);
        let now = std::time::Instant::now();
        members::cut_off(&mut observed, |node| ctx.caches.silent_for(node, now));
        let lost = nodes::read(ctx, &mut observed).await;
        // After the nodes are read: such a replica's pod, and so its node, is ready.
        if let Some(primary) = self.old.primary.as_deref().filter(|_| !elects) {
            members::not_replicating(&mut observed, primary, &self.old.members, at, 2 * ctx.settings.member_poll);
        }
        let primary = self.old.primary.clone().unwrap_or_else(|| Names(&self.name).pod(0));
        // A switchover under way: asked for, or for a drain of the primary's node.
        let draining = observed.iter().any(|m| m.name == primary && m.node.as_deref().is_some_and(|n| ctx.caches.cordoned(n)));
        let switching = draining || db.annotations().contains_key(crate::names::SWITCHOVER);
        let after = decide::failover_delay(&observed, &primary, switching, ctx.settings.failover_after);
        let question = decide::failover_question(&observed, &primary, after, elects, plugin.lacks(Capability::Failover));
        let said = match self.agents_due(&observed, &primary, &question, elects) {
            true => Some(super::agent::statuses(ctx, db, &observed).await?),
            false => None,
        };
        let heard = said.as_deref().map(|said| super::agent::by_pod(&observed, said)).unwrap_or_default();
        let members = Members { pods, observed, lost, said, heard, leads: Some(Leads { primary, after, question }) };
        // A backup before an upgrade may start (the upgrade stage decides).
        let desired = &engine.spec.version;
        let upgrading = decide::upgrade_from(self.old.current_version.as_deref(), desired).is_some();
        let before_upgrade = upgrading && self.job_state(&decide::pre_upgrade_backup(&self.name, desired)) == JobState::Missing;
        let backups = backups::observe(ctx, db, plugin, before_upgrade).await?;
        let agents = ctx.operator_image.is_some() && super::host_chooses(plugin);
        let secrets = secrets::observe(ctx, db, agents, elects).await?;
        let restore = restore::observe(ctx, db, engine.spec.replicas, self.restore_unfinished()).await?;
        let answered = match elects {
            true => self.read_leader(engine, &members.observed, &secrets).await?,
            false => None,
        };
        Ok(Observation { members, backups, secrets, restore, answered })
    }

    /// Whether the members' agents are asked where their members are in this pass: the
    /// failover stage is to ask the plugin (which weighs their positions); the primary a
    /// switchover fenced has answered (the member leads once it has all it wrote); or
    /// their poll is due (every `member_poll`; in every pass whose roll would restart a
    /// replica to follow while a member is away: not one that streams), for the status,
    /// unless the engine elects its leader (its members say who leads).
    fn agents_due(&self, observed: &[Observed], primary: &str, question: &FailoverQuestion, elects: bool) -> bool {
        let (ctx, db) = (self.ctx, self.db);
        let follow = members::to_follow_while_away(observed, primary);
        let poll = if follow { Duration::ZERO } else { ctx.settings.member_poll };
        let polled = !elects && observed.iter().any(|m| m.agent) && ctx.agents.due(db, poll);
        let fenced = ctx.agents.fence_said(db, primary) == Some(decide::Fenced::Confirmed);
        matches!(question, FailoverQuestion::Ask(_)) || fenced || polled
    }

    /// Whether the Database's status already says `reason` (with `message`, when given).
    fn said(&self, reason: Reason, message: Option<&str>) -> bool {
        status::says(self.db.status.as_ref(), None, Some(reason), message)
    }

    /// The state of the Database's Job `name`, as the cache has it.
    fn job_state(&self, name: &str) -> JobState {
        backups::state(self.ctx.caches.job(self.db, name).as_deref())
    }

    /// Tells the user what a decision noted: conditions set, Events planned.
    fn say(&mut self, notes: &[Note]) {
        for note in notes {
            if let Some(warning) = note.sent(self.db.status.as_ref()) {
                self.plan.tell(None, warning, note.reason, note.message.clone());
            }
            if let Some((condition, status)) = note.condition {
                self.plan.told.set(condition, status, note.reason, note.message.clone());
            }
        }
    }

    /// The plugin's workload for this version and primary; the credentials it asks for.
    /// An engine that elects its leader is always told member 0, so that a new leader
    /// re-renders nothing.
    async fn render(
        &mut self,
        plugin: &Plugin,
        spec: &EngineSpec,
        (primary, held): (&str, &secrets::Held),
        archive: bool,
    ) -> Flow<Rendering> {
        let (ctx, db) = (self.ctx, self.db);
        let bootstrap = Names(&self.name).pod(0);
        let primary = if plugin.info().capabilities.elects_leader { bootstrap.as_str() } else { primary };
        let mut cluster = build::cluster_context(db, primary, archive);
        cluster.restoring = self.restore_unfinished();
        let workload = match ctx.ask::<Render>(plugin, (spec.clone(), cluster)).await {
            Ok(w) => w,
            Err(Error::Plugin(e)) => return self.plugin_failed(Reason::RenderFailed, &e).await,
            Err(e) => return Err(e),
        };
        // A bad new version never replaces the running one, but users of the engine should know.
        let (reason, message) = match ctx.registry.problem(&db.spec.engine) {
            Some(p) => (
                Reason::NewerVersionRejected,
                format!("rendered by {}; ConfigMap {} is not serving: {}", serving(plugin), p.config_map, p.reason),
            ),
            None => (Reason::Rendered, format!("rendered by {}", serving(plugin))),
        };
        self.plan.told.set(ConditionType::PluginReady, true, reason, message);
        secrets::ensure_credentials(ctx, db, &workload, &mut self.plan)?;
        let tls = match secrets::ensure_tls(ctx, db, held, &mut self.plan)? {
            secrets::Certified::Off => None,
            secrets::Certified::Issued(stamp) => Some(stamp),
            secrets::Certified::Waiting(reason, message) => {
                let phase = self.old.current_version.is_none().then_some(Phase::Pending);
                return self.wait(reason, message, phase).await;
            }
        };
        if super::agent_sidecar(ctx, plugin, &workload).is_some() {
            secrets::ensure_agents(ctx, db, held, &mut self.plan)?;
        }
        Ok(ControlFlow::Continue(Rendering { workload, version: spec.version.clone(), rendered_for: primary.to_string(), tls }))
    }

    /// Ends the pass until something outside plugdb is done (a certificate being issued,
    /// a backup to restore appearing): `Progressing=False` says what, a Warning Event says
    /// it once, `phase` (when given) is the phase, and the pass is tried again shortly.
    /// Members that run go on running.
    async fn wait<T>(&mut self, reason: Reason, message: String, phase: Option<Phase>) -> Flow<T> {
        if !self.said(reason, Some(&message)) {
            self.plan.tell(None, true, reason, message.clone());
        }
        self.plan.told.set(ConditionType::Progressing, false, reason, message);
        self.plan.told.phase = phase;
        let status = self.told();
        self.finish(status).await?;
        Ok(ControlFlow::Break(Action::requeue(self.ctx.settings.progress_requeue)))
    }

    /// The children, planned to be applied where they differ; member volumes grown to
    /// the spec.
    async fn apply(
        &mut self,
        rendering: &Rendering,
        heard: &[(String, crate::agent::Status)],
        primary: &str,
        sidecars: build::Sidecars<'_>,
        (replicas, leadership): (u32, build::Leadership),
    ) -> Result<Applied, Error> {
        let (ctx, db) = (self.ctx, self.db);
        let mut stateful_set = ctx.caches.stateful_set(db);
        let rendered = build::Rendered {
            workload: &rendering.workload,
            engine: &db.spec.engine,
            sidecars,
            primary,
            rendered_for: &rendering.rendered_for,
            replicas,
            leadership,
            tls: rendering.tls.as_deref(),
        };
        let children = build::children(db, &rendered);
        let role_free = children.members.role_free.clone();
        for child in children {
            // A new members' template is one its controller has not seen: what the members
            // run is not known until it has. Another change (the count, how claims are
            // kept) leaves it known.
            if child.kind == build::Kind::StatefulSet
                && !apply::unchanged(ctx, db, &child)
                && !stateful_set.as_ref().is_some_and(|s| s.same_template(&role_free, &rendering.rendered_for))
            {
                stateful_set = None;
            }
            self.plan.apply(child);
        }
        // Every pass, not only one that rewrote the StatefulSet: a refused grow is retried.
        let mut size = self.volume_size();
        let (mut grown, mut growth) = apply::grow_volumes(ctx, db, &size);
        // The volumes grow on their own only once every claim has what it asked for.
        if growth == Growth::Done
            && let Some(to) = self.autogrow(&size, sidecars.agent.is_some(), heard)
        {
            size = to;
            (grown, growth) = apply::grow_volumes(ctx, db, &size);
        }
        for claim in grown {
            self.plan.grow(claim, size.clone());
        }
        self.plan.told.primary = Some(primary.to_string());
        if self.old.current_version.is_none() {
            self.plan.told.current_version = Some(rendering.version.clone());
        }
        Ok(Applied { stateful_set, role_free, growth })
    }

    /// The size the members' volumes should have: `spec.storage`, or what they grew to on
    /// their own when that is more.
    fn volume_size(&self) -> String {
        let spec = &self.db.spec.storage.0;
        let grown = self
            .old
            .storage_growth
            .as_ref()
            .map(|g| g.size.as_str())
            .filter(|g| crate::quantity::bytes(g).zip(crate::quantity::bytes(spec)).is_some_and(|(grown, spec)| grown > spec));
        grown.unwrap_or(spec).to_string()
    }

    /// Whether the volumes, `size` now, grow on their own in this pass (`spec.storageGrowth`,
    /// from what the agents said of their volumes; `measured`: the members run one), and
    /// to what; said in the status.
    fn autogrow(&mut self, size: &str, measured: bool, heard: &[(String, crate::agent::Status)]) -> Option<String> {
        let Some(rule) = self.db.spec.storage_growth.as_ref() else {
            self.plan.told.remove(ConditionType::StorageGrowth);
            return None;
        };
        if !measured {
            self.say(&[decide::not_measured(&self.db.spec.engine)]);
            return None;
        }
        let now = k8s_openapi::jiff::Timestamp::now();
        let grown = self.old.storage_growth.clone();
        let last = grown.as_ref().and_then(|g| g.last.parse().ok());
        let bytes = crate::quantity::bytes(size)?;
        match decide::autogrowth(rule, bytes, heard, last, now) {
            decide::Autogrowth::Wait => {
                // A pass that heard no volume (the agents are asked every half minute)
                // keeps what the last one that did said.
                let measured = heard.iter().any(|(_, said)| said.volume.is_some());
                let said = self.old.conditions.iter().find(|c| c.type_ == ConditionType::StorageGrowth.as_str());
                if said.is_none_or(|c| measured && c.status != "True") {
                    self.say(&[decide::growth_rule(rule)]);
                }
                None
            }
            decide::Autogrowth::AtLimit(note) => {
                self.say(&[note]);
                None
            }
            decide::Autogrowth::Grow { to, note } => {
                tracing::info!(database = %self.name, namespace = %self.ns, "{}", note.message);
                self.say(&[note]);
                let to = decide::quantity(to);
                let count = grown.map_or(0, |g| g.count) + 1;
                let last = format!("{now:.0}");
                self.plan.told.storage_growth = Some(crate::crd::StorageGrowthStatus { size: to.clone(), count, last });
                Some(to)
            }
        }
    }

    /// The `Anomaly` condition, from what the agents said in this pass (`spec.anomalies`;
    /// a pass that heard none keeps what the last one that did said).
    fn anomalies(&mut self, heard: &[(String, crate::agent::Status)]) {
        let rule = self.db.spec.anomalies.clone().unwrap_or_default();
        if !rule.enabled {
            self.plan.told.remove(ConditionType::Anomaly);
        } else if let Some(note) = decide::anomalies(&rule, heard) {
            self.say(&[note]);
        }
    }

    /// Role labels on the members, and the next member restart of a roll (one at a time,
    /// replicas first, primary last) among the `granted` members of this pass.
    fn members(&mut self, members: &Members, primary: &Primary, applied: &Applied, granted: u32) -> Rolled {
        // A member that began to crash loop since the last status: a Warning with its last
        // words, once (the status keeps saying it).
        for m in members.observed.iter().filter(|m| m.crash_loop && !m.terminating) {
            let said_before =
                self.old.members.iter().any(|b| b.pod == m.name && b.down.as_deref().is_some_and(|d| d.contains("crash looping")));
            if let (false, Some(why)) = (said_before, m.down.as_deref()) {
                self.plan.tell(member_ref(&members.pods, &m.name), true, Reason::CrashLoop, format!("{}: {why}", m.name));
            }
        }
        self.anomalies(&members.heard);
        let set = applied.stateful_set.as_ref();
        // Which replicas said in this pass whether they stream.
        let streams =
            |m: &Observed| members.heard.iter().find(|(pod, _)| *pod == m.name).map(|(_, said)| !said.primary && said.lag.is_some());
        let observed: Vec<Observed> = members.observed.iter().map(|m| Observed { streaming: streams(m), ..m.clone() }).collect();
        let roll = decide::roll(&observed, &primary.name, set, &applied.role_free, (granted, primary.failed_over));
        for (name, role) in roll.labels {
            self.plan.label(name, role);
        }
        if let Some(next) = &roll.restart {
            let member = members.observed.iter().find(|m| m.name == *next);
            self.plan.restart(next.clone(), member.filter(|m| m.fenced).cloned());
            let (warning, note) = match member.filter(|m| m.remake).and_then(|m| m.down.as_deref()) {
                Some(why) => (true, format!("restarted {next} to make it again: {why}")),
                None => (false, format!("restarted {next} onto the current revision")),
            };
            self.plan.tell(member_ref(&members.pods, next), warning, Reason::MemberRestarted, note);
        }
        Rolled { done: roll.done, restarted: roll.restart.is_some(), look_again: roll.look_again }
    }
}
