//! The sandbox: compile once per digest, a fresh instance per call from an
//! `InstancePre` (or, on the call threads, the thread's last instance of the same plugin,
//! reset to its initial state: `reuse`), a wall-clock deadline by epoch interruption, a
//! memory cap, a bounded wasm stack and a bounded output. Failures are values, never panics.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, ComponentExportIndex, Instance, Linker};
use wasmtime::{Config, Engine, ResourceLimiter, Store, Trap};

use super::convert::{self, Contract, Exports};
use super::logs::{Admitted, LogRate};
use super::memo::Memo;
use super::reuse;
use super::shape::{Shape, ShapeLimits};
use super::types::*;
use crate::metrics::{CallLabels, InstanceLabels, MemoLabels, Metrics};

/// The contract version this host implements (`wit/engine.wit`); it also serves 0.1 plugins.
pub const CONTRACT_VERSION: &str = "0.2.0";
const CONTRACT_EXPORT: &str = "plugdb:engine/plugin@";
const EPOCH_TICK: Duration = Duration::from_millis(5);
/// How long a call on one of the operator's plugin call threads runs at the thread's
/// priority: a call still running past it (plus up to one epoch tick) lowers its thread
/// to nice [`SLOW_CALL_NICENESS`] for the rest of the call.
pub const SLOW_CALL: Duration = Duration::from_millis(10);
/// The nice value a slow call's thread is lowered to (19, the lowest priority).
pub const SLOW_CALL_NICENESS: i32 = 19;
/// [`SLOW_CALL`] in epoch ticks.
const SLOW_TICKS: u64 = SLOW_CALL.as_millis().div_ceil(EPOCH_TICK.as_millis()) as u64;
const MAX_LOG_LINES: u32 = 64;
const MAX_LOG_BYTES: usize = 2048;
/// Table elements one call may have, over all its tables (function tables of real
/// plugins hold a few hundred).
const MAX_TABLE_ELEMENTS: usize = 100_000;
/// Memory each pool slot keeps mapped between calls, and resets by copying after every
/// call: the resident cost of the pool is at most `instance_slots` × this (per compile
/// tier), and each call's reset copies this much. It is the memory a call of a plugin
/// built by `xtask` touches; pages a call touches beyond it are unmapped after the call.
const KEEP_RESIDENT: usize = xtask::GUEST_RESIDENT;
/// Address space each memory reserves: all a 32-bit address can reach.
const MEMORY_RESERVATION: u64 = 1 << 32;
/// Unmapped address space after each memory's reservation (for an offset added to an address).
const MEMORY_GUARD: u64 = 32 << 20;
/// How wasmtime says a copy out of the guest went past the store's hostcall fuel.
const HOSTCALL_FUEL_EXHAUSTED: &str = "fuel allocated for hostcalls has been exhausted";
/// Core instances, memories and tables one call may create.
const LIMITED_INSTANCES: usize = 4;
const LIMITED_MEMORIES: usize = 2;
const LIMITED_TABLES: usize = 8;

/// Bounds applied to every plugin call.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Wall-clock deadline of one call, including instantiation.
    pub call_timeout: Duration,
    /// Linear memory a plugin instance may grow to.
    pub memory_bytes: usize,
    /// Wasm stack a call may use.
    pub stack_bytes: usize,
    /// Size of a call's result, counted while it is copied out of the guest (strings
    /// and list elements at their size in host memory, an aliased string each time it
    /// is referred to); also bounds one log line's copy.
    pub output_bytes: usize,
    /// Instances kept ready in a pool (the pooling allocator: no mapping per call,
    /// memory images copied on write), each reserving 4 GiB + 32 MiB of address space
    /// per memory (of which at most `memory_bytes` is ever made accessible); 0
    /// allocates every instance on demand. Calls beyond it fail. Half of them at most
    /// are kept between calls by the call threads, for their next call (see
    /// [`defer_resets`]).
    pub instance_slots: u32,
    /// Bounds on a component's code, checked before it is compiled.
    pub shape: ShapeLimits,
    /// Wall-clock time one compile may take (when compiling in a process of its own):
    /// 10 s (60 s in a debug build of plugdb).
    pub compile_timeout: Duration,
    /// Data (heap and private mappings) one compile may use (when compiling in a
    /// process of its own): 80 MiB.
    pub compile_memory: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_millis(500),
            memory_bytes: 16 << 20,
            stack_bytes: 512 << 10,
            output_bytes: 512 << 10,
            instance_slots: 12,
            shape: ShapeLimits::default(),
            // An unoptimised build of plugdb compiles about 10 times slower.
            compile_timeout: Duration::from_secs(if cfg!(debug_assertions) { 60 } else { 10 }),
            compile_memory: 80 << 20,
        }
    }
}

/// Why a plugin could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The bytes are not a WebAssembly component.
    #[error("not a WebAssembly component: {0}")]
    NotAComponent(String),
    /// The component's code is bigger than the host compiles.
    #[error("too big to compile: {0}")]
    TooBig(String),
    /// The compiler could not be run.
    #[error("compiling failed: {0}")]
    Compile(String),
    /// The component targets a contract this host does not speak.
    #[error("incompatible contract: {0}")]
    Contract(String),
    /// The component needs imports the host does not provide (no WASI).
    #[error("unsatisfiable imports: {0}")]
    Imports(String),
    /// `info()` failed or returned something unusable.
    #[error("self-test failed: {0}")]
    SelfTest(String),
}

/// Why a plugin call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The plugin answered with an error of its own (a refusal with a reason).
    #[error("{engine} plugin refused: {reason}")]
    Refused {
        /// Engine name.
        engine: String,
        /// The plugin's reason.
        reason: String,
    },
    /// The call ran past its deadline and was interrupted.
    #[error("{engine} plugin: {function} ran past its {timeout:?} deadline and was stopped")]
    Timeout {
        /// Engine name.
        engine: String,
        /// Exported function.
        function: &'static str,
        /// The deadline.
        timeout: Duration,
    },
    /// The call trapped (panic, out of memory, stack overflow, ...).
    #[error("{engine} plugin: {function} trapped: {message}")]
    Trap {
        /// Engine name.
        engine: String,
        /// Exported function.
        function: &'static str,
        /// What happened.
        message: String,
    },
    /// A log line was larger than the host copies out of the plugin in a call.
    #[error("{engine} plugin: {function} sent a log line of more than the {limit}-byte limit (copying it out was stopped there)")]
    LogTooLarge {
        /// Engine name.
        engine: String,
        /// Exported function.
        function: &'static str,
        /// The limit.
        limit: usize,
    },
    /// The result was larger than the host accepts.
    #[error("{engine} plugin: {function} returned more than the {limit}-byte limit (copying it out was stopped there)")]
    OutputTooLarge {
        /// Engine name.
        engine: String,
        /// Exported function.
        function: &'static str,
        /// The limit.
        limit: usize,
    },
    /// The result breaks host policy.
    #[error("{engine} plugin: {function} output breaks host policy: {}", join(.violations))]
    Policy {
        /// Engine name.
        engine: String,
        /// Exported function.
        function: &'static str,
        /// What is wrong.
        violations: Vec<Violation>,
    },
}

fn join(violations: &[Violation]) -> String {
    violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// The shared wasmtime engine, linker and epoch ticker. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    engine: Engine,
    linker: Arc<Linker<CallState>>,
    limits: Limits,
    tier: Tier,
    metrics: Option<Arc<Metrics>>,
    memo: Option<Arc<Memo>>,
    /// The `plugdb` binary that compiles in a process of its own; in this process when `None`.
    compiler: Option<Arc<std::path::Path>>,
    /// Instances kept between calls now, over all threads (see [`Warm`]).
    warm: Arc<AtomicUsize>,
    /// Each engine's allowance of log bytes over time.
    logs: Arc<LogRate>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("limits", &self.limits).finish_non_exhaustive()
    }
}

/// How much work the compiler puts into a plugin's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Compiles fast (single-pass register allocation, no optimisation): a plugin
    /// serves sooner, its calls run a little slower.
    Quick,
    /// Compiles the best code: what serves once it is ready.
    Optimized,
}

impl Runtime {
    /// A runtime whose calls obey `limits`, compiling optimised code. Starts a ticker
    /// thread that lives as long as the runtime does.
    pub fn new(limits: Limits) -> anyhow::Result<Self> {
        Self::with_tier(limits, Tier::Optimized)
    }

    /// A runtime whose calls obey `limits`, compiling at `tier`.
    pub fn with_tier(limits: Limits, tier: Tier) -> anyhow::Result<Self> {
        let mut config = Config::new();
        config.wasm_component_model(true).epoch_interruption(true).max_wasm_stack(limits.stack_bytes).generate_address_map(false);
        // Each memory reserves the 4 GiB a 32-bit address reaches, plus a guard, so the
        // compiled code checks no bounds: an access outside the memory faults, and the
        // fault becomes a trap. Only what the memory cap allows is ever made accessible.
        config
            .memory_reservation(MEMORY_RESERVATION)
            .memory_guard_size(MEMORY_GUARD)
            .memory_reservation_for_growth(0)
            .signals_based_traps(true);
        if limits.instance_slots > 0 {
            let slots = limits.instance_slots;
            let mut pool = wasmtime::PoolingAllocationConfig::new();
            pool.total_component_instances(slots)
                .total_core_instances(slots * LIMITED_INSTANCES as u32)
                .total_memories(slots * LIMITED_MEMORIES as u32)
                .total_tables(slots * LIMITED_TABLES as u32)
                .max_core_instances_per_component(LIMITED_INSTANCES as u32)
                .max_memories_per_component(LIMITED_MEMORIES as u32)
                .max_tables_per_component(LIMITED_TABLES as u32)
                .max_memories_per_module(LIMITED_MEMORIES as u32)
                .max_tables_per_module(LIMITED_TABLES as u32)
                .max_memory_size(limits.memory_bytes)
                .table_elements(MAX_TABLE_ELEMENTS)
                .max_unused_warm_slots(slots)
                // The pages a call touches (stack, statics, the heap) stay mapped between
                // calls and are reset by copying the memory's initial image over them,
                // instead of being unmapped and faulted in again by every call. Asking
                // the kernel which pages are dirty (PAGEMAP_SCAN) costs more than
                // copying 64 KiB.
                .linear_memory_keep_resident(KEEP_RESIDENT)
                .table_keep_resident(KEEP_RESIDENT)
                .pagemap_scan(wasmtime::Enabled::No);
            config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
        }
        if tier == Tier::Quick {
            config.cranelift_opt_level(wasmtime::OptLevel::None).cranelift_regalloc_algorithm(wasmtime::RegallocAlgorithm::SinglePass);
        }
        let engine = Engine::new(&config).map_err(|e| anyhow::anyhow!("creating the wasm engine: {e:#}"))?;
        let mut linker = Linker::new(&engine);
        convert::add_to_linker(&mut linker).map_err(|e| anyhow::anyhow!("linking host imports: {e:#}"))?;
        let weak = engine.weak();
        std::thread::Builder::new().name("plugdb-epoch".into()).spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })?;
        Ok(Self {
            engine,
            linker: Arc::new(linker),
            limits,
            tier,
            metrics: None,
            memo: None,
            compiler: None,
            warm: Arc::new(AtomicUsize::new(0)),
            logs: Arc::default(),
        })
    }

    /// The same runtime, compiling each plugin in a child `plugdb compile` run from
    /// `exe` (the operator's own binary), bounded by `compile_timeout` and `compile_memory`.
    pub fn with_compiler(mut self, exe: &std::path::Path) -> Self {
        self.compiler = Some(exe.into());
        self
    }

    /// Compiles `bytes` in this process and serialises the result (what `plugdb compile` does).
    pub(crate) fn compile_here(&self, bytes: &[u8]) -> Result<Vec<u8>, LoadError> {
        let component = Component::from_binary(&self.engine, bytes).map_err(|e| LoadError::NotAComponent(format!("{e:#}")))?;
        component.serialize().map_err(|e| LoadError::Compile(format!("serialising the compiled code: {e:#}")))
    }

    /// Compiles `bytes`: in a child process when a compiler is set, else here.
    fn compile(&self, bytes: &[u8]) -> Result<Component, LoadError> {
        let Some(exe) = &self.compiler else {
            return Component::from_binary(&self.engine, bytes).map_err(|e| LoadError::NotAComponent(format!("{e:#}")));
        };
        let artifact = super::compiler::compile_apart(exe, &self.limits, self.tier, bytes)?;
        // SAFETY: the artefact was just produced by `Component::serialize` in a child
        // running this same binary with an engine configured from the same limits and
        // tier, handed over on a pipe only the two processes hold; wasmtime checks its
        // version and configuration before using it.
        #[allow(unsafe_code)]
        let component = unsafe { Component::deserialize(&self.engine, &artifact) };
        component.map_err(|e| LoadError::Compile(format!("loading the compiled code: {e:#}")))
    }

    /// The same runtime, counting every plugin call in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The same runtime, answering calls already answered from `memo` (plugins are pure).
    pub fn with_memo(mut self, memo: Arc<Memo>) -> Self {
        self.memo = Some(memo);
        self
    }

    /// The limits every call obeys.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A fresh store for one call of the plugin `info` describes: its allocations limited, its
    /// deadline set.
    fn store(&self, info: Arc<PluginInfo>) -> Store<CallState> {
        let state = CallState {
            limits: CallLimiter {
                memory_cap: self.limits.memory_bytes,
                memory_left: self.limits.memory_bytes,
                table_elements_left: MAX_TABLE_ELEMENTS,
            },
            info,
            log_lines: 0,
            logs: self.logs.clone(),
            metrics: self.metrics.clone(),
            slow_after: None,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        // Bounds what the host copies out of the guest in one go (a result, a log
        // line) while it copies, aliased strings counted each time they are referred to.
        self.start_call(&mut store);
        store.epoch_deadline_callback(|mut store| {
            Ok(match store.data_mut().slow_after.take() {
                Some(rest) => {
                    lower_priority();
                    wasmtime::UpdateDeadline::Continue(rest)
                }
                None => wasmtime::UpdateDeadline::Interrupt,
            })
        });
        store
    }

    /// Sets a call's bounds on `store`: its deadline, and what it may copy out. On a
    /// thread that lowers its priority for slow calls, the epoch first stops the call
    /// at [`SLOW_CALL`] to lower it, then lets it run on to the deadline.
    fn start_call(&self, store: &mut Store<CallState>) {
        store.set_hostcall_fuel(self.limits.output_bytes);
        let deadline = self.deadline_ticks();
        let lower = LOWER_WHEN_SLOW.get() && !LOWERED.get() && SLOW_TICKS < deadline;
        store.data_mut().slow_after = lower.then(|| deadline - SLOW_TICKS);
        store.set_epoch_deadline(if lower { SLOW_TICKS } else { deadline });
    }

    /// A call's deadline in epoch ticks: the ticks that cover it, and one more.
    fn deadline_ticks(&self) -> u64 {
        self.limits.call_timeout.as_millis().div_ceil(EPOCH_TICK.as_millis()).max(1) as u64 + 1
    }

    /// Compiles `bytes`, checks the contract, links it and runs `info()` as a self-test.
    /// CPU-heavy: call it off the async executor.
    pub fn load(&self, bytes: &[u8]) -> Result<Plugin, LoadError> {
        if bytes.len() >= 8 && bytes[..4] == *b"\0asm" && bytes[4..8] == [1, 0, 0, 0] {
            return Err(LoadError::NotAComponent(
                "this is a core wasm module; wrap it into a component (`wasm-tools component new`)".into(),
            ));
        }
        let shape = Shape::of(bytes).map_err(LoadError::NotAComponent)?;
        let excess = shape.excess(&self.limits.shape);
        if !excess.is_empty() {
            return Err(LoadError::TooBig(excess.join("; ")));
        }
        // Where the host can prove what state an instance keeps, it adds a reset to
        // the component, so that call threads reuse instances (`reuse`).
        let (component, reusable) = match reuse::with_reset(bytes) {
            Ok(with_reset) => (self.compile(&with_reset)?, true),
            Err(why) => {
                tracing::debug!(%why, "each call of this plugin gets a fresh instance");
                (self.compile(bytes)?, false)
            }
        };
        let (interface, contract) = check_contract(&self.engine, &component)?;
        let pre = self.linker.instantiate_pre(&component).map_err(|e| LoadError::Imports(format!("{e:#}")))?;
        // Type-checks every export of the contract, once.
        let exports = Exports::find(&component, &interface, contract, &pre).map_err(LoadError::Contract)?;
        let reset = if reusable { component.get_export(None, reuse::RESET_EXPORT).map(|(_, index)| index) } else { None };
        let mut plugin = Plugin {
            info: Arc::new(placeholder_info()),
            digest: hex_digest(bytes),
            bytes: bytes.into(),
            pre,
            exports,
            reset: None,
            identity: Arc::new(()),
            runtime: self.clone(),
        };
        let info: PluginInfo =
            plugin.call("info", |store, i| plugin.exports.info(store, i)).map_err(|e| LoadError::SelfTest(e.to_string()))?;
        check_info(&info, plugin.exports.contract())?;
        plugin.info = Arc::new(info);
        if let Some(reset) = reset {
            match plugin.reset_answers_alike(reset) {
                Ok(()) => plugin.reset = Some(reset),
                Err(why) => tracing::warn!(engine = %plugin.info.engine, %why, "each call of this plugin gets a fresh instance"),
            }
        }
        Ok(plugin)
    }
}

/// Host policy over the Jobs of a plan for `spec`.
fn check_jobs<'a>(jobs: impl Iterator<Item = &'a JobPlan>, spec: &EngineSpec) -> Vec<Violation> {
    jobs.flat_map(|job| super::policy::check_job(job, &spec.credentials_secret())).collect()
}

fn placeholder_info() -> PluginInfo {
    PluginInfo {
        engine: "(loading)".into(),
        plugin_version: String::new(),
        contract_version: String::new(),
        supported_versions: Vec::new(),
        default_version: String::new(),
        default_port: 0,
        capabilities: Capabilities::default(),
    }
}

/// Hex SHA-256 of `bytes`, the identity of a plugin build.
pub fn hex_digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The name of the contract interface `component` exports and its contract, if this
/// host speaks its version.
fn check_contract(engine: &Engine, component: &Component) -> Result<(String, Contract), LoadError> {
    let ty = component.component_type();
    let exports: Vec<String> = ty.exports(engine).map(|(name, _)| name.to_string()).collect();
    let Some(export) = exports.iter().find(|n| n.starts_with(CONTRACT_EXPORT)) else {
        return Err(LoadError::Contract(format!(
            "the component exports no `{CONTRACT_EXPORT}{CONTRACT_VERSION}` interface (it exports: {})",
            if exports.is_empty() { "nothing".to_string() } else { exports.join(", ") }
        )));
    };
    let version = &export[CONTRACT_EXPORT.len()..];
    let Some(contract) = Contract::of(version) else {
        return Err(LoadError::Contract(format!(
            "the plugin implements plugdb:engine@{version}; this host speaks plugdb:engine@{CONTRACT_VERSION} and 0.1: \
             rebuild the plugin against the plugdb-sdk of this release"
        )));
    };
    Ok((export.clone(), contract))
}

fn check_info(info: &PluginInfo, contract: Contract) -> Result<(), LoadError> {
    let name_ok = !info.engine.is_empty()
        && info.engine.len() <= 40
        && info.engine.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !info.engine.starts_with('-')
        && !info.engine.ends_with('-');
    if !name_ok {
        return Err(LoadError::SelfTest(format!("engine name {:?} must be 1-40 characters of [a-z0-9-]", info.engine)));
    }
    if Contract::of(&info.contract_version) != Some(contract) {
        return Err(LoadError::Contract(format!(
            "info() reports contract {}, but the component implements plugdb:engine@{}",
            info.contract_version,
            contract.version()
        )));
    }
    if info.supported_versions.is_empty() || !info.supported_versions.contains(&info.default_version) {
        return Err(LoadError::SelfTest(format!(
            "default version {:?} is not among the supported versions {:?}",
            info.default_version, info.supported_versions
        )));
    }
    let version_ok = !info.plugin_version.is_empty()
        && info.plugin_version.len() <= 64
        && info.plugin_version.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+'));
    if !version_ok {
        return Err(LoadError::SelfTest(format!(
            "plugin version {} must be 1-64 characters of [A-Za-z0-9.+-]",
            super::policy::quoted(&info.plugin_version)
        )));
    }
    let versions_ok = info.supported_versions.len() <= 64
        && info.supported_versions.iter().all(|v| !v.is_empty() && v.len() <= 32 && v.bytes().all(|b| b.is_ascii_graphic()));
    if !versions_ok {
        return Err(LoadError::SelfTest("supported versions must be at most 64, each 1-32 printable characters".into()));
    }
    if info.default_port == 0 {
        return Err(LoadError::SelfTest("default port is 0".into()));
    }
    Ok(())
}

/// A loaded plugin: compiled, linked and self-tested. Cheap to clone; each call runs in
/// a fresh instance, or in one reset to its initial state, so nothing leaks from one
/// call into the next.
#[derive(Clone)]
pub struct Plugin {
    info: Arc<PluginInfo>,
    digest: String,
    bytes: Arc<[u8]>,
    pre: wasmtime::component::InstancePre<CallState>,
    exports: Exports,
    /// The reset the host added (`reuse`), once the self-test showed it works.
    reset: Option<ComponentExportIndex>,
    /// This load, which the instances a thread keeps belong to.
    identity: Arc<()>,
    runtime: Runtime,
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
    /// The instance of this thread's last call, while its reset is deferred or kept for
    /// the thread's next call.
    static HELD: std::cell::RefCell<Option<Held>> = const { std::cell::RefCell::new(None) };
    /// Whether this thread's slow calls lower its priority.
    static LOWER_WHEN_SLOW: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Whether a slow call has lowered this thread's priority.
    static LOWERED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
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
        Err(e) => tracing::warn!(error = %e, "a slow plugin call keeps its thread's priority"),
    }
}

/// Makes this thread's plugin calls answer before their instance is reset (`true`),
/// or reset it before they return (`false`, the default). A thread that hands each
/// answer on before it calls [`reset_spent`] lets its caller go on meanwhile.
///
/// Such a thread also keeps its last instance, reset, for its next call of the same
/// plugin, where the plugin allows it (`reuse`) and fewer than half of the pool's
/// slots are kept so; otherwise the reset drops the instance, which gives its pool
/// slot back (copying the memory's initial image over the pages kept resident). A
/// call of another plugin drops the kept instance first, so a thread never holds
/// more than one. Turning deferral off drops it at the next [`reset_spent`].
pub fn defer_resets(on: bool) {
    DEFER_RESETS.set(on);
}

/// Whether this thread's calls defer their instance's reset (see [`defer_resets`]).
pub(crate) fn resets_deferred() -> bool {
    DEFER_RESETS.get()
}

/// Resets the instance of this thread's last call, if a deferred reset is pending, and
/// keeps it for the thread's next call or gives its slot back to the pool (see
/// [`defer_resets`]).
pub fn reset_spent() {
    if let Some(held) = settle() {
        HELD.set(Some(held));
    }
}

/// Drops the instance this thread keeps, if any, which gives its pool slot back (a
/// call thread that has been idle a while: see `pool::IDLE_RELEASE`).
pub(crate) fn release_held() {
    // Taken out before it is dropped: the borrow ends before the store's drop runs.
    drop(HELD.with_borrow_mut(Option::take));
}

/// This thread's held instance, reset if a call ran in it since; `None` when there is
/// none or it is not kept (it is dropped then, which gives its slot back).
fn settle() -> Option<Held> {
    // Taken out before anything is dropped: the borrow ends before a store's drop runs.
    let mut held = HELD.with_borrow_mut(Option::take)?;
    if !resets_deferred() {
        return None;
    }
    if held.dirty {
        let (reset, _) = held.reset.as_ref()?;
        let func = held.instance.get_func(&mut held.store, reset)?;
        // SAFETY: `Plugin::reset_answers_alike` called this export as `() -> ()` at load.
        #[allow(unsafe_code)]
        let typed = unsafe { wasmtime::component::TypedFunc::<(), ()>::new_unchecked(func) };
        held.store.data_mut().slow_after = None;
        held.store.set_epoch_deadline(held.reset_ticks);
        typed.call(&mut held.store, ()).ok()?;
        held.dirty = false;
    }
    Some(held)
}

/// An instance a thread holds between calls (see [`defer_resets`]).
struct Held {
    /// The plugin load it belongs to (`Plugin::identity`).
    owner: Arc<()>,
    store: Store<CallState>,
    instance: Instance,
    /// The reset export, when this instance is reset and kept rather than dropped,
    /// with the place it takes among the kept ones.
    reset: Option<(ComponentExportIndex, Warm)>,
    /// Whether a call ran in it since it was instantiated or reset.
    dirty: bool,
    /// What the call limiter allowed right after instantiation, given back at each reuse.
    fresh: (usize, usize),
    /// The reset's own deadline, in epoch ticks.
    reset_ticks: u64,
}

/// A place among the instances call threads keep between calls: at most half of the
/// pool's slots, so that the rest serve everything else (loads, other threads).
struct Warm(Arc<AtomicUsize>);

impl Warm {
    fn take(kept: &Arc<AtomicUsize>, slots: u32) -> Option<Self> {
        let most = slots as usize / 2;
        kept.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < most).then_some(n + 1)).ok()?;
        Some(Self(kept.clone()))
    }
}

impl Drop for Warm {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What one call may allocate, checked before each allocation: linear memory over
/// all its memories together, table elements over all its tables, and a few
/// instances, memories and tables.
struct CallLimiter {
    memory_cap: usize,
    memory_left: usize,
    table_elements_left: usize,
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
    limits: CallLimiter,
    /// Whose call it is (its engine name tags the log lines).
    info: Arc<PluginInfo>,
    log_lines: u32,
    /// Its engine's allowance of log bytes over time, and where what is dropped is counted.
    logs: Arc<LogRate>,
    metrics: Option<Arc<Metrics>>,
    /// Epoch ticks the call may run on once it is found slow, until then.
    slow_after: Option<u64>,
}

impl CallState {
    /// A line the plugin logs: counted, cut, escaped to one line and tagged with its
    /// engine; dropped (and counted) when the engine is past its allowance over time.
    pub(crate) fn log_line(&mut self, level: tracing::Level, message: String) {
        self.log_lines += 1;
        if self.log_lines > MAX_LOG_LINES {
            return;
        }
        let mut message = message;
        if message.len() > MAX_LOG_BYTES {
            let mut cut = MAX_LOG_BYTES;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        let message = super::logs::escaped(&message);
        let engine = self.info.engine.as_str();
        match self.logs.admit(engine, message.len(), std::time::Instant::now()) {
            Admitted::No => {
                if let Some(m) = &self.metrics {
                    m.plugin_log_lines_dropped.get_or_create(&crate::metrics::ReconcileLabels { engine: engine.to_string() }).inc();
                }
                return;
            }
            Admitted::Yes { after_dropping: 0 } => {}
            Admitted::Yes { after_dropping } => {
                tracing::warn!(engine, dropped = after_dropping, "the plugin logged past its allowance; lines were dropped");
            }
        }
        match level {
            tracing::Level::ERROR => tracing::error!(engine, "{message}"),
            tracing::Level::WARN => tracing::warn!(engine, "{message}"),
            tracing::Level::INFO => tracing::info!(engine, "{message}"),
            tracing::Level::DEBUG => tracing::debug!(engine, "{message}"),
            _ => tracing::trace!(engine, "{message}"),
        }
    }
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

    /// Engine-specific checks of `spec`.
    pub fn validate(&self, spec: &EngineSpec) -> Result<Vec<Violation>, CallError> {
        self.counted("validate", spec, || {
            let found: Vec<Violation> = self.call("validate", |s, i| self.exports.validate(s, i, spec))?;
            // The plugin's words end up in a status: bounded in number and length.
            let cut = |text: &str, max: usize| crate::events::truncate(text, max).to_string();
            Ok(super::policy::capped(
                found.iter().map(|v| Violation { field: cut(&v.field, 128), message: cut(&v.message, 512) }).collect(),
            ))
        })
    }

    /// The workload for `spec`, checked against host policy.
    pub fn render(&self, spec: &EngineSpec, cluster: &ClusterContext) -> Result<Workload, CallError> {
        self.counted("render", &(spec, cluster), || {
            let workload = self.call("render", |s, i| self.exports.render(s, i, spec, cluster))?.map_err(|r| self.refused(r))?;
            let mut violations = super::policy::check_workload(&workload, cluster);
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
            self.checked("render", violations, workload)
        })
    }

    /// How to move from `from` to `spec.version`.
    pub fn plan_upgrade(&self, spec: &EngineSpec, from: &str) -> Result<UpgradePlan, CallError> {
        self.counted("plan-upgrade", &(spec, from), || {
            let plan = self.call("plan-upgrade", |s, i| self.exports.plan_upgrade(s, i, spec, from))?.map_err(|r| self.refused(r))?;
            let jobs = plan.steps.iter().filter_map(|step| match step {
                UpgradeStep::Job(job) => Some(job),
                UpgradeStep::RollingRestart => None,
            });
            let violations = check_jobs(jobs, spec);
            self.checked("plan-upgrade", violations, plan)
        })
    }

    /// How to go from `from` members to `spec.replicas`, checked: Jobs as any Job, and
    /// member counts from 1 to 9 ending at `spec.replicas`.
    pub fn plan_scale(&self, spec: &EngineSpec, from: u32, members: &[Member]) -> Result<Vec<ScaleStep>, CallError> {
        self.counted("plan-scale", &(spec, from, members), || {
            let steps = self.call("plan-scale", |s, i| self.exports.plan_scale(s, i, spec, from, members))?.map_err(|r| self.refused(r))?;
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
            self.checked("plan-scale", violations, steps)
        })
    }

    /// Which member to promote (host-chosen leadership), or which member the engine
    /// elected (`elects-leader`): each answer only where the plugin declared that model.
    pub fn choose_primary(&self, spec: &EngineSpec, members: &[Member]) -> Result<FailoverDecision, CallError> {
        self.counted("choose-primary", &(spec, members), || {
            let decision = self.call("choose-primary", |s, i| self.exports.choose_primary(s, i, spec, members))?;
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
            self.checked("choose-primary", violations, decision)
        })
    }

    /// A Job that backs the Database up to `location`.
    pub fn backup(&self, spec: &EngineSpec, location: &BackupLocation) -> Result<JobPlan, CallError> {
        self.counted("backup", &(spec, location), || {
            let job = self.call("backup", |s, i| self.exports.backup(s, i, spec, location))?.map_err(|r| self.refused(r))?;
            self.checked("backup", super::policy::check_job(&job, &location.credentials_secret), job)
        })
    }

    /// A Job that restores the backup at `location` into member `member`, or `None`
    /// when that member joins the restored ones instead (`restore::restored_members`
    /// checks the answers together).
    pub fn restore(&self, spec: &EngineSpec, location: &BackupLocation, member: u32) -> Result<Option<JobPlan>, CallError> {
        self.counted("restore", &(spec, location, member), || {
            let plan = self.call("restore", |s, i| self.exports.restore(s, i, spec, location, member))?.map_err(|r| self.refused(r))?;
            let violations = plan.as_ref().map(|job| super::policy::check_job(job, &location.credentials_secret)).unwrap_or_default();
            self.checked("restore", violations, plan)
        })
    }

    fn refused(&self, reason: String) -> CallError {
        CallError::Refused { engine: self.info.engine.clone(), reason }
    }

    /// `value` when host policy found no violation, else the violations, capped once.
    fn checked<T>(&self, function: &'static str, violations: Vec<Violation>, value: T) -> Result<T, CallError> {
        if violations.is_empty() {
            return Ok(value);
        }
        Err(CallError::Policy { engine: self.info.engine.clone(), function, violations: super::policy::capped(violations) })
    }

    /// Answers `function` of `input` from the memo when it was answered before;
    /// otherwise runs `call`, counts its outcome in the metrics (what the sandbox saw,
    /// the plugin's own refusal, or the host policy's) and remembers the answer unless
    /// it was the machine's doing (a deadline, a trap).
    fn counted<T: Clone + Send + Sync + serde::Serialize + 'static>(
        &self,
        function: &'static str,
        input: &impl serde::Serialize,
        call: impl FnOnce() -> Result<T, CallError>,
    ) -> Result<T, CallError> {
        if let Some(answer) = self.remembered(function, input) {
            return answer;
        }
        let key = self.runtime.memo.as_ref().and_then(|_| Memo::key(&self.digest, function, input));
        if key.is_some() {
            self.count_memo("miss");
        }
        let result = call();
        if let Some(metrics) = &self.runtime.metrics {
            let outcome = match &result {
                Ok(_) => "ok",
                Err(CallError::Refused { .. }) => "refused",
                Err(CallError::Timeout { .. }) => "timeout",
                Err(CallError::Trap { .. }) => "trap",
                Err(CallError::OutputTooLarge { .. } | CallError::LogTooLarge { .. }) => "too-large",
                Err(CallError::Policy { .. }) => "policy",
            };
            let labels = CallLabels { engine: self.info.engine.clone(), function: function.into(), outcome: outcome.into() };
            metrics.plugin_calls.get_or_create(&labels).inc();
        }
        let pure = !matches!(result, Err(CallError::Timeout { .. } | CallError::Trap { .. }));
        if let (Some(memo), Some(key), true) = (&self.runtime.memo, key, pure) {
            let bytes = match &result {
                Ok(value) => serde_json::to_vec(value).map(|v| v.len()).unwrap_or(usize::MAX),
                Err(e) => e.to_string().len(),
            };
            memo.put(key, &self.digest, result.clone(), bytes);
        }
        result
    }

    /// The remembered answer of `function` (`"render"`, `"validate"`, ...) for
    /// `input`, if there is one: no instance, no thread. Counted as a hit.
    pub fn remembered<T: Clone + 'static>(&self, function: &'static str, input: &impl serde::Serialize) -> Option<Result<T, CallError>> {
        let memo = self.runtime.memo.as_ref()?;
        let answer = memo.get::<Result<T, CallError>>(&Memo::key(&self.digest, function, input)?)?;
        self.count_memo("hit");
        Some(answer)
    }

    fn count_memo(&self, outcome: &str) {
        if let Some(metrics) = &self.runtime.metrics {
            metrics.plugin_memo.get_or_create(&MemoLabels { engine: self.info.engine.clone(), outcome: outcome.into() }).inc();
        }
    }

    /// Runs `f` against a fresh instance, or this thread's kept instance of this plugin
    /// once reset, under the call limits (its result bounded while it is copied out:
    /// the store's hostcall fuel).
    fn call<R>(
        &self,
        function: &'static str,
        f: impl FnOnce(&mut Store<CallState>, &Instance) -> wasmtime::Result<R>,
    ) -> Result<R, CallError> {
        // A thread holds one instance at most: the last call's is reset, and dropped
        // unless it is this plugin's to reuse.
        let mut held = match settle() {
            Some(mut held) if Arc::ptr_eq(&held.owner, &self.identity) => {
                let state = held.store.data_mut();
                (state.limits.memory_left, state.limits.table_elements_left) = held.fresh;
                state.log_lines = 0;
                state.info = self.info.clone();
                self.runtime.start_call(&mut held.store);
                self.count_instance("reused");
                held
            }
            other => {
                drop(other);
                let held = self.instantiate().map_err(|e| self.classify(function, e))?;
                self.count_instance("new");
                held
            }
        };
        let result = f(&mut held.store, &held.instance);
        held.dirty = true;
        if result.is_err() {
            // Whatever failed (a trap, the deadline, a result too large) may have left
            // the instance anywhere: it is dropped, never reused.
            held.reset = None;
        }
        if resets_deferred() {
            HELD.set(Some(held));
        }
        result.map_err(|e| self.classify(function, e))
    }

    /// A fresh instance of this plugin, kept between calls where this thread defers
    /// resets, the plugin has a reset and a place among the kept instances is free.
    fn instantiate(&self) -> wasmtime::Result<Held> {
        let mut store = self.runtime.store(self.info.clone());
        let instance = self.pre.instantiate(&mut store)?;
        let limits = &store.data().limits;
        let fresh = (limits.memory_left, limits.table_elements_left);
        let reset = match self.reset {
            Some(reset) if resets_deferred() => Warm::take(&self.runtime.warm, self.runtime.limits.instance_slots).map(|w| (reset, w)),
            _ => None,
        };
        Ok(Held { owner: self.identity.clone(), store, instance, reset, dirty: false, fresh, reset_ticks: self.runtime.deadline_ticks() })
    }

    /// Checks at load that `reset` gives an instance back its initial state as far as
    /// `info` can tell: called before and after a reset, on one instance, it answers alike.
    fn reset_answers_alike(&self, reset: ComponentExportIndex) -> Result<(), String> {
        let mut store = self.runtime.store(self.info.clone());
        let instance = self.pre.instantiate(&mut store).map_err(|e| format!("{e:#}"))?;
        let first = self.exports.info(&mut store, &instance).map_err(|e| format!("{e:#}"))?;
        let func = instance.get_func(&mut store, reset).ok_or("the reset is not a function")?;
        let typed = func.typed::<(), ()>(&store).map_err(|e| format!("{e:#}"))?;
        typed.call(&mut store, ()).map_err(|e| format!("the reset failed: {e:#}"))?;
        self.runtime.start_call(&mut store);
        let again = self.exports.info(&mut store, &instance).map_err(|e| format!("{e:#}"))?;
        if first == again { Ok(()) } else { Err("info() answers differently after a reset".into()) }
    }

    fn count_instance(&self, how: &str) {
        if let Some(metrics) = &self.runtime.metrics {
            metrics.plugin_instances.get_or_create(&InstanceLabels { engine: self.info.engine.clone(), how: how.into() }).inc();
        }
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

impl EngineSpec {
    /// Name of the credentials Secret of this Database.
    pub fn credentials_secret(&self) -> String {
        format!("{}-credentials", self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_encoder::{
        CodeSection, ConstExpr, Function, FunctionSection, Instruction, MemorySection, MemoryType, Module, RefType, StartSection,
        TableSection, TableType, TypeSection,
    };

    /// A core module whose start function grows a table by `grow`, with memories of
    /// `pages` 64 KiB pages each.
    fn module(grow: i32, memories: &[u64]) -> Vec<u8> {
        let mut module = Module::new();
        let mut types = TypeSection::new();
        types.ty().function([], []);
        module.section(&types);
        let mut functions = FunctionSection::new();
        functions.function(0);
        module.section(&functions);
        let mut tables = TableSection::new();
        tables.table_with_init(
            TableType { element_type: RefType::FUNCREF, table64: false, minimum: 1, maximum: None, shared: false },
            &ConstExpr::ref_null(wasm_encoder::HeapType::FUNC),
        );
        module.section(&tables);
        let mut memory = MemorySection::new();
        for &pages in memories {
            memory.memory(MemoryType { minimum: pages, maximum: None, memory64: false, shared: false, page_size_log2: None });
        }
        module.section(&memory);
        module.section(&StartSection { function_index: 0 });
        let mut code = CodeSection::new();
        let mut start = Function::new([]);
        start
            .instruction(&Instruction::RefNull(wasm_encoder::HeapType::FUNC))
            .instruction(&Instruction::I32Const(grow))
            .instruction(&Instruction::TableGrow(0))
            .instruction(&Instruction::Drop)
            .instruction(&Instruction::End);
        code.function(&start);
        module.section(&code);
        module.finish()
    }

    fn instantiate(runtime: &Runtime, bytes: &[u8]) -> Result<(), String> {
        let module = wasmtime::Module::new(&runtime.engine, bytes).map_err(|e| format!("{e:#}"))?;
        let mut store = runtime.store(Arc::new(placeholder_info()));
        wasmtime::Instance::new(&mut store, &module, &[]).map(|_| ()).map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn table_growth_is_refused_before_it_is_allocated() {
        let runtime = Runtime::with_tier(Limits::default(), Tier::Quick).expect("runtime");
        assert_eq!(instantiate(&runtime, &module(1000, &[1])), Ok(()));
        let started = std::time::Instant::now();
        let err = instantiate(&runtime, &module(1 << 28, &[1])).expect_err("2^28 elements");
        assert!(err.contains("table limit of 100000 elements"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(1), "refused before allocating: {:?}", started.elapsed());
    }

    #[test]
    fn the_memory_cap_counts_all_memories_together() {
        let runtime = Runtime::with_tier(Limits { memory_bytes: 64 << 20, ..Limits::default() }, Tier::Quick).expect("runtime");
        // 40 MiB each: one fits the 64 MiB cap, two do not.
        assert_eq!(instantiate(&runtime, &module(0, &[640])), Ok(()));
        let err = instantiate(&runtime, &module(0, &[640, 640])).expect_err("80 MiB in two memories");
        assert!(err.contains("all memories together"), "{err}");
    }

    #[test]
    fn what_a_plugin_says_about_itself_is_bounded() {
        let good = PluginInfo {
            engine: "redis".into(),
            plugin_version: "1.2.3+build.4".into(),
            contract_version: CONTRACT_VERSION.into(),
            supported_versions: vec!["7.2".into()],
            default_version: "7.2".into(),
            default_port: 6379,
            capabilities: Capabilities::default(),
        };
        assert!(check_info(&good, Contract::CURRENT).is_ok());
        let refused = |info: PluginInfo| check_info(&info, Contract::CURRENT).expect_err("refused").to_string();
        let said = refused(PluginInfo { plugin_version: "9".repeat(400 << 10), ..good.clone() });
        assert!(said.contains("plugin version") && said.contains("1-64 characters") && said.len() < 600, "{}", &said[..200]);
        assert!(refused(PluginInfo { engine: "Redis".into(), ..good.clone() }).contains("engine name"));
        assert!(refused(PluginInfo { supported_versions: vec!["7.2".into(); 65], ..good.clone() }).contains("at most 64"));
        assert!(refused(PluginInfo { default_port: 0, ..good.clone() }).contains("default port"));
    }
}
