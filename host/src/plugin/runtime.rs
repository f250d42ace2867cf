//! The sandbox: compile once per digest, a fresh instance per call from an
//! `InstancePre` (out of a pool of slots: no mapping per call, memory images copied on
//! write), a wall-clock deadline by epoch interruption, a memory cap, a bounded wasm
//! stack and a bounded output. Failures are values, never panics.

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Instance, Linker};
use wasmtime::{Config, Engine, ResourceLimiter, Store, Trap};

use super::calls::CallError;
use super::convert::{self, Contract, Exports};
use super::logs::{Admitted, LogRate};
use super::memo::Memo;
use super::shape::{Shape, ShapeLimits};
use super::types::*;
use crate::metrics::{CallLabels, MemoLabels, Metrics};

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
/// tier), and each call's reset copies (or clears) what the call made accessible, up to
/// this. It is the memory a call of a plugin built by `xtask` touches; pages a call
/// touches beyond it are unmapped after the call.
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
    /// allocates every instance on demand. Calls beyond it fail; a call thread that
    /// defers its resets holds its last call's slot until then (see [`defer_resets`]).
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

impl Tier {
    /// `quick` or `optimized`, as `plugdb compile --tier` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Quick => "quick",
            Tier::Optimized => "optimized",
        }
    }

    /// The tier [`Tier::name`] gives `name`.
    pub fn named(name: &str) -> Option<Tier> {
        [Tier::Quick, Tier::Optimized].into_iter().find(|t| t.name() == name)
    }
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
        Ok(Self { engine, linker: Arc::new(linker), limits, tier, metrics: None, memo: None, compiler: None, logs: Arc::default() })
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
        let artifact = compile::compile_apart(exe, &self.limits, self.tier, bytes)?;
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
            limits: CallLimiter::new(self.limits.memory_bytes),
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
        let component = self.compile(bytes)?;
        let (interface, contract) = check_contract(&self.engine, &component)?;
        let pre = self.linker.instantiate_pre(&component).map_err(|e| LoadError::Imports(format!("{e:#}")))?;
        // Type-checks every export of the contract, once.
        let exports = Exports::find(&component, &interface, contract, &pre).map_err(LoadError::Contract)?;
        let mut plugin = Plugin {
            info: Arc::new(placeholder_info()),
            digest: hex_digest(bytes),
            bytes: bytes.into(),
            pre,
            exports,
            runtime: self.clone(),
        };
        // Run once more if it ran past its deadline: a busy machine can starve the first
        // call of a fresh component past it (a plugin that spins does so twice).
        let info = |plugin: &Plugin| plugin.call("info", |store, i| plugin.exports.info(store, i));
        let info: PluginInfo = match info(&plugin) {
            Err(CallError::Timeout { .. }) => info(&plugin),
            said => said,
        }
        .map_err(|e| LoadError::SelfTest(e.to_string()))?;
        check_info(&info, plugin.exports.contract())?;
        plugin.info = Arc::new(info);
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

mod compile;
mod loaded;
pub use loaded::*;

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
