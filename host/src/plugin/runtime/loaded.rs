//! A loaded plugin and its calls: each in a fresh instance, under the deadline, the
//! memory cap and the output bounds; a call thread drops its last instance after answering.

use super::*;
use crate::plugin::calls::{Backup, ChoosePrimary, Function, PlanScale, PlanUpgrade, Render, Restore, Validate};

/// What the sandbox logs under, plugins' lines included: the runtime's, as before this
/// module was split out of it (a filter on it keeps working).
const TARGET: &str = "plugdb::plugin::runtime";

/// A loaded plugin: compiled, linked and self-tested. Cheap to clone; each call runs in
/// a fresh instance, so nothing leaks from one call into the next.
#[derive(Clone)]
pub struct Plugin {
    pub(super) info: Arc<PluginInfo>,
    pub(super) digest: String,
    pub(super) bytes: Arc<[u8]>,
    pub(super) pre: wasmtime::component::InstancePre<CallState>,
    pub(super) exports: Exports,
    pub(super) runtime: Runtime,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("engine", &self.info.engine)
            .field("version", &self.info.plugin_version)
            .field("digest", &self.digest)
            .finish()
    }
}

thread_local! {
    /// Whether this thread's calls leave their instance to [`reset_spent`].
    static DEFER_RESETS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The store of this thread's last call (which holds its instance), while its reset
    /// is deferred.
    static HELD: std::cell::RefCell<Option<Store<CallState>>> = const { std::cell::RefCell::new(None) };
    /// Whether this thread's slow calls lower its priority.
    pub(super) static LOWER_WHEN_SLOW: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Whether a slow call has lowered this thread's priority.
    pub(super) static LOWERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes a call on this thread that is still running after [`SLOW_CALL`] lower the
/// thread's priority to nice [`SLOW_CALL_NICENESS`]: where CPU is short, a plugin that
/// spins until its deadline then gets only what everything else leaves, while quick
/// calls keep the thread's priority. An unprivileged thread cannot raise its priority
/// again: a thread once lowered ([`priority_lowered`]) should leave its work to a new one.
pub(crate) fn lower_priority_when_slow(on: bool) {
    LOWER_WHEN_SLOW.set(on);
}

/// Whether a slow call lowered this thread's priority (see [`lower_priority_when_slow`]).
pub(crate) fn priority_lowered() -> bool {
    LOWERED.get()
}

/// Lowers this thread's priority (Linux keeps a nice value per thread).
pub(crate) fn lower_priority() {
    match rustix::process::setpriority_process(None, SLOW_CALL_NICENESS) {
        Ok(()) => LOWERED.set(true),
        Err(e) => tracing::warn!(target: TARGET, error = %e, "a slow plugin call keeps its thread's priority"),
    }
}

/// Makes this thread's plugin calls answer before their instance is reset (`true`),
/// or reset it before they return (`false`, the default). The reset is the instance's
/// drop: its pool slot is given back, the memory's initial image copied over the pages
/// kept resident. A thread that hands each answer on before it calls [`reset_spent`]
/// lets its caller go on meanwhile; its next call drops a pending instance first, so a
/// thread never holds more than one.
pub fn defer_resets(on: bool) {
    DEFER_RESETS.set(on);
}

/// Whether this thread's calls defer their instance's reset (see [`defer_resets`]).
pub(crate) fn resets_deferred() -> bool {
    DEFER_RESETS.get()
}

/// Resets the instance of this thread's last call, if a deferred reset is pending (see
/// [`defer_resets`]).
pub fn reset_spent() {
    // Taken out before it is dropped: the borrow ends before the store's drop runs.
    drop(HELD.with_borrow_mut(Option::take));
}

/// What one call may allocate, checked before each allocation: linear memory over
/// all its memories together, table elements over all its tables, and a few
/// instances, memories and tables.
pub(super) struct CallLimiter {
    memory_cap: usize,
    memory_left: usize,
    table_elements_left: usize,
}

impl CallLimiter {
    /// A call's allowance: `memory_bytes` of memory, [`MAX_TABLE_ELEMENTS`] table elements.
    pub(super) fn new(memory_bytes: usize) -> Self {
        Self { memory_cap: memory_bytes, memory_left: memory_bytes, table_elements_left: MAX_TABLE_ELEMENTS }
    }
}

impl ResourceLimiter for CallLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let more = desired.saturating_sub(current);
        if more > self.memory_left {
            return Err(wasmtime::Error::msg(format!(
                "memory limit of {} bytes (all memories together) reached: {desired} bytes asked for one memory",
                self.memory_cap
            )));
        }
        self.memory_left -= more;
        Ok(true)
    }

    fn table_growing(&mut self, current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        let more = desired.saturating_sub(current);
        if more > self.table_elements_left {
            return Err(wasmtime::Error::msg(format!(
                "table limit of {MAX_TABLE_ELEMENTS} elements (all tables together) reached: {desired} asked for one table"
            )));
        }
        self.table_elements_left -= more;
        Ok(true)
    }

    fn instances(&self) -> usize {
        LIMITED_INSTANCES
    }

    fn tables(&self) -> usize {
        LIMITED_TABLES
    }

    fn memories(&self) -> usize {
        LIMITED_MEMORIES
    }
}

/// Per-call state: the resource limiter and log accounting.
pub(crate) struct CallState {
    pub(super) limits: CallLimiter,
    /// Whose call it is (its engine name tags the log lines).
    pub(super) info: Arc<PluginInfo>,
    pub(super) log_lines: u32,
    /// Its engine's allowance of log bytes over time, and where what is dropped is counted.
    pub(super) logs: Arc<LogRate>,
    pub(super) metrics: Option<Arc<Metrics>>,
    /// Epoch ticks the call may run on once it is found slow, until then.
    pub(super) slow_after: Option<u64>,
}

impl convert::Logs for CallState {
    /// A line the plugin logs: counted, cut, escaped to one line and tagged with its
    /// engine; dropped (and counted) when the engine is past its allowance over time.
    fn log_line(&mut self, level: tracing::Level, message: String) {
        self.log_lines += 1;
        let engine = self.info.engine.as_str();
        let dropped = || {
            if let Some(m) = &self.metrics {
                m.plugin_log_lines_dropped.get_or_create(&crate::metrics::ReconcileLabels { engine: engine.to_string() }).inc();
            }
        };
        if self.log_lines > MAX_LOG_LINES {
            return dropped();
        }
        let message = crate::said::bounded(crate::said::cut(&message, MAX_LOG_BYTES), MAX_LOG_BYTES);
        match self.logs.admit(engine, message.len(), std::time::Instant::now()) {
            Admitted::No => return dropped(),
            Admitted::Yes { after_dropping: 0 } => {}
            Admitted::Yes { after_dropping } => {
                tracing::warn!(target: TARGET, engine, dropped = after_dropping, "the plugin logged past its allowance; lines were dropped");
            }
        }
        match level {
            tracing::Level::ERROR => tracing::error!(target: TARGET, engine, "{message}"),
            tracing::Level::WARN => tracing::warn!(target: TARGET, engine, "{message}"),
            tracing::Level::INFO => tracing::info!(target: TARGET, engine, "{message}"),
            tracing::Level::DEBUG => tracing::debug!(target: TARGET, engine, "{message}"),
            _ => tracing::trace!(target: TARGET, engine, "{message}"),
        }
    }
}

/// A contract function as the sandbox asks it: the call, and the host policy its
/// answer passes.
pub trait Sandboxed: Function {
    /// Asks `plugin` for `input` in a fresh instance, and checks the answer.
    fn call(plugin: &Plugin, input: &Self::Input) -> Result<Self::Output, CallError>;
}

macro_rules! sandboxed {
    ($($function:ident => $method:ident),* $(,)?) => {
        $(
            impl Sandboxed for $function {
                fn call(plugin: &Plugin, input: &Self::Input) -> Result<Self::Output, CallError> {
                    plugin.$method(input)
                }
            }
        )*
    };
}

sandboxed! {
    Validate => validate_now,
    Render => render_now,
    PlanUpgrade => plan_upgrade_now,
    PlanScale => plan_scale_now,
    ChoosePrimary => choose_primary_now,
    Backup => backup_now,
    Restore => restore_now,
}

impl Plugin {
    /// What the plugin said about itself at load.
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// The contract the plugin was built against.
    pub fn contract(&self) -> Contract {
        self.exports.contract()
    }

    /// Why the plugin cannot be asked for `capability`: it does not declare it.
    pub fn lacks(&self, capability: Capability) -> Option<String> {
        let info = &self.info;
        (!info.capabilities.has(capability)).then(|| {
            format!(
                "the {} plugin ({}@{}) does not declare the {} capability",
                info.engine,
                info.engine,
                info.plugin_version,
                capability.name()
            )
        })
    }

    /// Hex SHA-256 of the component bytes.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Size of the component in bytes.
    pub fn size(&self) -> usize {
        self.bytes.len()
    }

    /// The component's bytes (to recompile it at another tier).
    pub fn bytes(&self) -> Arc<[u8]> {
        self.bytes.clone()
    }

    /// Whether this build was compiled at the optimised tier.
    pub fn optimized(&self) -> bool {
        self.runtime.tier == Tier::Optimized
    }

    /// `name@version`, as shown in status and logs.
    pub fn id(&self) -> String {
        format!("{}@{}", self.info.engine, self.info.plugin_version)
    }

    /// Engine-specific checks of `spec` ([`Validate`]).
    pub fn validate(&self, spec: &EngineSpec) -> Result<Vec<Violation>, CallError> {
        self.ask::<Validate>(spec)
    }

    /// The workload for `spec`, checked against host policy ([`Render`]).
    pub fn render(&self, spec: &EngineSpec, cluster: &ClusterContext) -> Result<Workload, CallError> {
        self.ask::<Render>(&(spec.clone(), cluster.clone()))
    }

    /// How to move from `from` to `spec.version` ([`PlanUpgrade`]).
    pub fn plan_upgrade(&self, spec: &EngineSpec, from: &str) -> Result<UpgradePlan, CallError> {
        self.ask::<PlanUpgrade>(&(spec.clone(), from.to_string()))
    }

    /// How to go from `from` members to `spec.replicas` ([`PlanScale`]).
    pub fn plan_scale(&self, spec: &EngineSpec, from: u32, members: &[Member]) -> Result<Vec<ScaleStep>, CallError> {
        self.ask::<PlanScale>(&(spec.clone(), from, members.to_vec()))
    }

    /// Which member to promote, or which member the engine elected ([`ChoosePrimary`]).
    pub fn choose_primary(&self, spec: &EngineSpec, members: &[Member]) -> Result<FailoverDecision, CallError> {
        self.ask::<ChoosePrimary>(&(spec.clone(), members.to_vec()))
    }

    /// A Job that backs the Database up to `location` ([`Backup`]).
    pub fn backup(&self, spec: &EngineSpec, location: &BackupLocation) -> Result<JobPlan, CallError> {
        self.ask::<Backup>(&(spec.clone(), location.clone()))
    }

    /// A Job that restores the backup at `location` into member `member`, or `None`
    /// when that member joins the restored ones instead ([`Restore`]).
    pub fn restore(&self, spec: &EngineSpec, location: &BackupLocation, member: u32) -> Result<Option<JobPlan>, CallError> {
        self.ask::<Restore>(&(spec.clone(), location.clone(), member))
    }

    /// [`Validate`] in the sandboxed plugin: its violations, bounded in number and length.
    fn validate_now(&self, spec: &EngineSpec) -> Result<Vec<Violation>, CallError> {
        let found: Vec<Violation> = self.call(Validate::NAME, |s, i| self.exports.validate(s, i, spec))?;
        // The plugin's words end up in a status: bounded in number and length.
        let cut = |text: &str, max: usize| crate::said::cut(text, max).to_string();
        Ok(crate::plugin::policy::capped(
            found.iter().map(|v| Violation { field: cut(&v.field, 128), message: cut(&v.message, 512) }).collect(),
        ))
    }

    /// [`Render`] in the sandboxed plugin, checked against host policy.
    fn render_now(&self, (spec, cluster): &(EngineSpec, ClusterContext)) -> Result<Workload, CallError> {
        let workload = self.call(Render::NAME, |s, i| self.exports.render(s, i, spec, cluster))?.map_err(|r| self.refused(r))?;
        let mut violations = crate::plugin::policy::check_workload(&workload, cluster);
        match (self.info.capabilities.elects_leader, workload.member_query.is_some()) {
            (true, false) => violations.push(Violation {
                field: "memberQuery".into(),
                message: "the plugin declares elects-leader: the workload must say how members are asked who leads".into(),
            }),
            (false, true) => violations.push(Violation {
                field: "memberQuery".into(),
                message: "only a plugin that declares elects-leader asks its members who leads".into(),
            }),
            _ => {}
        }
        if workload.member_query.as_ref().is_some_and(|q| q.https) && spec.tls.is_none() {
            violations.push(Violation {
                field: "memberQuery.https".into(),
                message: "members are asked over HTTPS only when the Database has TLS (spec.tls)".into(),
            });
        }
        self.checked(Render::NAME, violations, workload)
    }

    /// [`PlanUpgrade`] in the sandboxed plugin, its Jobs checked as any Job.
    fn plan_upgrade_now(&self, (spec, from): &(EngineSpec, String)) -> Result<UpgradePlan, CallError> {
        let plan = self.call(PlanUpgrade::NAME, |s, i| self.exports.plan_upgrade(s, i, spec, from))?.map_err(|r| self.refused(r))?;
        let jobs = plan.steps.iter().filter_map(|step| match step {
            UpgradeStep::Job(job) => Some(job),
            UpgradeStep::RollingRestart => None,
        });
        let violations = check_jobs(jobs, spec);
        self.checked(PlanUpgrade::NAME, violations, plan)
    }

    /// [`PlanScale`] in the sandboxed plugin, checked: Jobs as any Job, and member counts
    /// from 1 to 9 ending at `spec.replicas`.
    fn plan_scale_now(&self, (spec, from, members): &(EngineSpec, u32, Vec<Member>)) -> Result<Vec<ScaleStep>, CallError> {
        let steps = self.call(PlanScale::NAME, |s, i| self.exports.plan_scale(s, i, spec, *from, members))?.map_err(|r| self.refused(r))?;
        let jobs = steps.iter().filter_map(|step| match step {
            ScaleStep::Job(job) => Some(job),
            ScaleStep::Members(_) => None,
        });
        let mut violations = check_jobs(jobs, spec);
        let counts: Vec<u32> = steps.iter().filter_map(|s| if let ScaleStep::Members(n) = s { Some(*n) } else { None }).collect();
        if counts.iter().any(|n| !(1..=9).contains(n)) {
            violations.push(Violation { field: "plan-scale".into(), message: format!("member counts {counts:?} must be 1-9") });
        }
        if counts.last() != Some(&spec.replicas) {
            violations.push(Violation {
                field: "plan-scale".into(),
                message: format!("the plan must end with members({}); it ends at {:?}", spec.replicas, counts.last()),
            });
        }
        self.checked(PlanScale::NAME, violations, steps)
    }

    /// [`ChoosePrimary`] in the sandboxed plugin: each answer only where the plugin
    /// declared that model (host-chosen leadership, or `elects-leader`).
    fn choose_primary_now(&self, (spec, members): &(EngineSpec, Vec<Member>)) -> Result<FailoverDecision, CallError> {
        let decision = self.call(ChoosePrimary::NAME, |s, i| self.exports.choose_primary(s, i, spec, members))?;
        let elects = self.info.capabilities.elects_leader;
        let violation = |field: &str, message: String| vec![Violation { field: field.into(), message }];
        let violations = match &decision {
            FailoverDecision::Promote { .. } if elects => {
                violation("promote", "the plugin declares elects-leader: the host never promotes; answer elected(pod)".into())
            }
            FailoverDecision::Promote { pod, .. } if !members.iter().any(|m| &m.pod == pod && !m.primary) => {
                violation("promote.pod", format!("{pod:?} is not a replica of this Database"))
            }
            FailoverDecision::Elected(_) if !elects => {
                violation("elected", "the plugin does not declare elects-leader: the host chooses the primary".into())
            }
            FailoverDecision::Elected(pod) if !members.iter().any(|m| &m.pod == pod) => {
                violation("elected", format!("{pod:?} is not a member of this Database"))
            }
            _ => Vec::new(),
        };
        self.checked(ChoosePrimary::NAME, violations, decision)
    }

    /// [`Backup`] in the sandboxed plugin, its Job checked.
    fn backup_now(&self, (spec, location): &(EngineSpec, BackupLocation)) -> Result<JobPlan, CallError> {
        let job = self.call(Backup::NAME, |s, i| self.exports.backup(s, i, spec, location))?.map_err(|r| self.refused(r))?;
        self.checked(Backup::NAME, crate::plugin::policy::check_job(&job, &location.credentials_secret), job)
    }

    /// [`Restore`] in the sandboxed plugin, its Job checked (`restore::restored_members`
    /// checks the answers for all members together).
    fn restore_now(&self, (spec, location, member): &(EngineSpec, BackupLocation, u32)) -> Result<Option<JobPlan>, CallError> {
        let plan = self.call(Restore::NAME, |s, i| self.exports.restore(s, i, spec, location, *member))?.map_err(|r| self.refused(r))?;
        let violations = plan.as_ref().map(|job| crate::plugin::policy::check_job(job, &location.credentials_secret)).unwrap_or_default();
        self.checked(Restore::NAME, violations, plan)
    }

    fn refused(&self, reason: String) -> CallError {
        CallError::Refused { engine: self.info.engine.clone(), reason }
    }

    /// `value` when host policy found no violation, else the violations, capped once.
    fn checked<T>(&self, function: &'static str, violations: Vec<Violation>, value: T) -> Result<T, CallError> {
        if violations.is_empty() {
            return Ok(value);
        }
        Err(CallError::Policy { engine: self.info.engine.clone(), function, violations: crate::plugin::policy::capped(violations) })
    }

    /// Asks `F` of this plugin for `input`: the remembered answer when there is one;
    /// otherwise the sandboxed call ([`Sandboxed::call`]), its outcome counted in the
    /// metrics (what the sandbox saw, the plugin's own refusal, or the host policy's)
    /// and remembered unless it was the machine's doing (a deadline, a trap).
    pub fn ask<F: Sandboxed>(&self, input: &F::Input) -> Result<F::Output, CallError> {
        if let Some(answer) = self.remembered::<F>(input) {
            return answer;
        }
        let key = self.runtime.memo.as_ref().and_then(|_| F::key(&self.digest, input));
        if key.is_some() {
            self.count_memo("miss");
        }
        let result = F::call(self, input);
        if let Some(metrics) = &self.runtime.metrics {
            let outcome = match &result {
                Ok(_) => "ok",
                Err(CallError::Refused { .. }) => "refused",
                Err(CallError::Timeout { .. }) => "timeout",
                Err(CallError::Trap { .. }) => "trap",
                Err(CallError::OutputTooLarge { .. } | CallError::LogTooLarge { .. }) => "too-large",
                Err(CallError::Policy { .. }) => "policy",
            };
            let labels = CallLabels { engine: self.info.engine.clone(), function: F::NAME.into(), outcome: outcome.into() };
            metrics.plugin_calls.get_or_create(&labels).inc();
        }
        let pure = !matches!(result, Err(CallError::Timeout { .. } | CallError::Trap { .. }));
        if let (Some(memo), Some(key), true) = (&self.runtime.memo, key, pure) {
            let bytes = match &result {
                Ok(value) => serde_json::to_vec(value).map(|v| v.len()).unwrap_or(usize::MAX),
                Err(e) => e.to_string().len(),
            };
            memo.put(key, &self.digest, F::keep(result.clone()), bytes);
        }
        result
    }

    /// The remembered answer of `F` for `input`, if there is one: no instance, no
    /// thread. Counted as a hit.
    pub fn remembered<F: Function>(&self, input: &F::Input) -> Option<Result<F::Output, CallError>> {
        let memo = self.runtime.memo.as_ref()?;
        let answer = memo.get::<F>(&F::key(&self.digest, input)?)?;
        self.count_memo("hit");
        Some(answer)
    }

    fn count_memo(&self, outcome: &str) {
        if let Some(metrics) = &self.runtime.metrics {
            metrics.plugin_memo.get_or_create(&MemoLabels { engine: self.info.engine.clone(), outcome: outcome.into() }).inc();
        }
    }

    /// Runs `f` against a fresh instance under the call limits (its result bounded
    /// while it is copied out: the store's hostcall fuel).
    pub(super) fn call<R>(
        &self,
        function: &'static str,
        f: impl FnOnce(&mut Store<CallState>, &Instance) -> wasmtime::Result<R>,
    ) -> Result<R, CallError> {
        // A thread holds one instance at most: the last call's goes first.
        reset_spent();
        let mut store = self.runtime.store(self.info.clone());
        let instance = self.pre.instantiate(&mut store).map_err(|e| self.classify(function, e))?;
        let result = f(&mut store, &instance);
        if resets_deferred() {
            HELD.set(Some(store));
        }
        result.map_err(|e| self.classify(function, e))
    }

    fn classify(&self, function: &'static str, error: wasmtime::Error) -> CallError {
        let engine = self.info.engine.clone();
        let trap = error.downcast_ref::<Trap>().or_else(|| error.chain().find_map(|e| e.downcast_ref::<Trap>()));
        let message = format!("{error:#}");
        match trap {
            Some(Trap::Interrupt) => CallError::Timeout { engine, function, timeout: self.runtime.limits.call_timeout },
            Some(Trap::StackOverflow) => CallError::Trap { engine, function, message: "wasm stack overflow (unbounded recursion?)".into() },
            Some(Trap::UnreachableCodeReached) => {
                CallError::Trap { engine, function, message: "the plugin panicked or aborted (unreachable executed)".into() }
            }
            // Safe Rust reaches outside its memory only when the stack it keeps there
            // (below its statics, as `xtask` links plugins) runs past the start.
            Some(Trap::MemoryOutOfBounds) => CallError::Trap {
                engine,
                function,
                message: format!(
                    "an access outside the plugin's linear memory: its own stack there overflowed (`plugdb plugin build` \
                     links a {} KiB stack), or unsafe code went astray: {message}",
                    xtask::GUEST_STACK >> 10
                ),
            },
            // Copied while the plugin's code is on the stack: the argument of a host call
            // (its one import, `log`); after it returned: the result.
            _ if message.contains(HOSTCALL_FUEL_EXHAUSTED)
                && error.downcast_ref::<wasmtime::WasmBacktrace>().is_some_and(|b| !b.frames().is_empty()) =>
            {
                CallError::LogTooLarge { engine, function, limit: self.runtime.limits.output_bytes }
            }
            _ if message.contains(HOSTCALL_FUEL_EXHAUSTED) => {
                CallError::OutputTooLarge { engine, function, limit: self.runtime.limits.output_bytes }
            }
            _ => {
                let message = if message.contains("growing memory") || message.contains("memory") && message.contains("limit") {
                    format!("memory limit of {} bytes reached: {message}", self.runtime.limits.memory_bytes)
                } else {
                    message
                };
                CallError::Trap { engine, function, message }
            }
        }
    }
}
