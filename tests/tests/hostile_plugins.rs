//! Tier 2: hostile plugins in the real wasmtime runtime. Every attack ends as an
//! error value for that call, within its deadline; the process stays healthy and a
//! good plugin loaded beside it keeps answering.

use std::time::{Duration, Instant};

use plugdb::metrics::Metrics;
use plugdb::plugin::{
    CallError, CallPool, EngineSpec, Limits, LoadError, ParameterValue, Plugin, ResourceAmounts, Runtime, SLOW_CALL_NICENESS, Shape,
    ShapeLimits, Tier,
};

const DEADLINE: Duration = Duration::from_millis(200);

/// Counts what each thread allocates on the host heap, to see what a call copies
/// out of the guest (guest memory itself is mapped by wasmtime, not allocated here).
struct PerThread;

thread_local! {
    static NET: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
    static PEAK: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
}

fn track(delta: isize) {
    let _ = NET.try_with(|net| {
        net.set(net.get() + delta);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(net.get())));
    });
}

// SAFETY: every request is passed to the system allocator unchanged.
#[allow(unsafe_code)] // a global allocator is unsafe by definition
unsafe impl std::alloc::GlobalAlloc for PerThread {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        track(layout.size() as isize);
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        track(-(layout.size() as isize));
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        track(new_size as isize - layout.size() as isize);
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: PerThread = PerThread;

/// The most this thread had allocated at once while `f` ran, above what it held before.
fn peak_heap<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = NET.with(|n| n.get());
    PEAK.with(|p| p.set(base));
    let value = f();
    (value, (PEAK.with(|p| p.get()) - base).max(0) as usize)
}

fn runtime() -> Runtime {
    Runtime::new(Limits {
        call_timeout: DEADLINE,
        memory_bytes: 32 << 20,
        stack_bytes: 256 << 10,
        output_bytes: 256 << 10,
        ..Limits::default()
    })
    .expect("runtime")
}

fn spec(attack: &str) -> EngineSpec {
    EngineSpec {
        name: "victim".into(),
        namespace: "default".into(),
        version: "1".into(),
        replicas: 1,
        storage_bytes: 1 << 30,
        requests: ResourceAmounts::default(),
        limits: ResourceAmounts::default(),
        parameters: vec![("attack".into(), ParameterValue::Text(attack.into()))],
        tls: None,
        synchronous_replicas: 0,
    }
}

/// Runs one attack and checks the good plugin beside it still answers.
fn attack(runtime: &Runtime, hostile: &Plugin, good: &Plugin, name: &str) -> CallError {
    let started = Instant::now();
    let err = hostile.render(&spec(name), &plugdb_tests::cluster("victim", "default")).expect_err("the attack fails");
    // Far above the deadline to stay robust on a loaded machine, far below "stuck".
    assert!(started.elapsed() < DEADLINE * 25, "{name}: took {:?}", started.elapsed());
    let mut good_spec = spec("");
    good_spec.parameters.clear();
    good.render(&good_spec, &plugdb_tests::cluster("victim", "default")).expect("the good plugin keeps answering");
    // The hostile plugin itself recovers too: the next call gets a fresh instance.
    hostile.render(&spec("none"), &plugdb_tests::cluster("victim", "default")).expect("a fresh instance after the attack");
    let _ = runtime;
    err
}

fn plugins() -> (Runtime, Plugin, Plugin) {
    let rt = runtime();
    let hostile = rt.load(&plugdb_tests::component("hostile")).expect("hostile loads: it is well-formed");
    let good = rt.load(&plugdb_tests::component("minimal")).expect("minimal loads");
    (rt, hostile, good)
}

/// Instances come from a pool and memory images are reused copy-on-write: nothing a
/// call writes may be seen by a later one (the plugin counts its calls in a static),
/// over more calls than the pool has slots.
#[test]
fn no_state_outlives_a_call_in_the_instance_pool() {
    let (_rt, hostile, _) = plugins();
    for _ in 0..3 * Limits::default().instance_slots {
        let w = hostile.render(&spec("count"), &plugdb_tests::cluster("victim", "default")).expect("render");
        let calls = w.config_files.iter().find(|f| f.name == "calls.conf").map(|f| f.content.clone());
        assert_eq!(calls.as_deref(), Some("calls = 1\n"), "a call saw an earlier call's state");
    }
}

/// On the operator's call threads a call answers before its instance is reset: the
/// slot stays taken until the reset runs (or the thread's next call runs it first),
/// and what the call wrote is still gone before the slot serves again.
#[test]
fn a_deferred_reset_holds_the_slot_until_it_runs_and_no_state_outlives_it() {
    let rt = Runtime::new(Limits { instance_slots: 1, ..Limits::default() }).expect("runtime");
    let hostile = rt.load(&plugdb_tests::component("hostile")).expect("hostile loads");
    let calls = || {
        let w = hostile.render(&spec("count"), &plugdb_tests::cluster("victim", "default"))?;
        Ok::<_, CallError>(w.config_files.iter().find(|f| f.name == "calls.conf").map(|f| f.content.clone()))
    };
    let elsewhere = || std::thread::scope(|s| s.spawn(calls).join().expect("no panic"));
    plugdb::plugin::defer_resets(true);
    for _ in 0..3 {
        assert_eq!(calls().expect("this thread's next call resets its last instance first").as_deref(), Some("calls = 1\n"));
        let err = elsewhere().expect_err("the one slot is held until its reset");
        assert!(err.to_string().contains("concurrent"), "{err}");
    }
    plugdb::plugin::defer_resets(false);
    plugdb::plugin::reset_spent();
    assert_eq!(elsewhere().expect("the slot is back once reset").as_deref(), Some("calls = 1\n"));
    assert_eq!(calls().expect("answers").as_deref(), Some("calls = 1\n"));
    assert_eq!(elsewhere().expect("without deferral the slot is back at once").as_deref(), Some("calls = 1\n"));
}

#[test]
fn endless_loop_is_stopped_at_the_deadline() {
    let (rt, hostile, good) = plugins();
    let err = attack(&rt, &hostile, &good, "loop");
    assert!(matches!(err, CallError::Timeout { function: "render", .. }), "{err}");
    assert!(err.to_string().contains("deadline"), "{err}");
}

/// On the operator's call threads a quick call runs at the operator's priority; a
/// plugin that spins drops to the lowest priority once its call is slow, is still
/// stopped at the deadline, and the next call runs at the operator's priority again
/// (on a new thread: the lowered one cannot rise again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spinning_call_drops_to_the_lowest_priority_and_the_next_call_does_not() {
    let (_rt, hostile, good) = plugins();
    let pool = CallPool::new(1, 1);
    let caller = nice();
    assert!(caller < SLOW_CALL_NICENESS, "the test runs above the lowest priority");
    let answer = |p: &Plugin, attack: &str| {
        let mut database = spec(attack);
        database.parameters.retain(|_| !attack.is_empty());
        p.render(&database, &plugdb_tests::cluster("victim", "default")).map(drop)
    };
    // A loaded machine can make even a quick call slow (and so lowered, its thread
    // replaced): one of twenty at the operator's priority suffices. Were a lowered
    // thread never replaced, every call after the spinning one would run at 19.
    let quick = async |what: &str| {
        let mut said = Vec::new();
        for _ in 0..20 {
            said.push(pool.run(&good, move |p| (answer(p, "").is_ok(), nice())).await.expect("a slot"));
            if said.last() == Some(&(true, caller)) {
                return;
            }
        }
        panic!("{what}: {said:?}");
    };
    quick("a quick call runs at the operator's priority").await;
    let (spun, at) = pool.run(&hostile, move |p| (answer(p, "loop"), nice())).await.expect("a slot");
    assert!(matches!(spun, Err(CallError::Timeout { .. })), "{spun:?}");
    assert_eq!(at, SLOW_CALL_NICENESS, "the spinning call ran on at the lowest priority");
    quick("the next call runs at the operator's priority again").await;
}

/// This thread's nice value, as Linux reports it (`/proc/thread-self/stat`, field 19).
fn nice() -> i32 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("/proc/thread-self/stat");
    let fields: Vec<&str> = stat.rsplit_once(") ").expect("a stat line").1.split_whitespace().collect();
    fields[16].parse().expect("a nice value")
}

#[test]
fn memory_bomb_hits_the_memory_cap() {
    let (rt, hostile, good) = plugins();
    let err = attack(&rt, &hostile, &good, "memory");
    assert!(matches!(err, CallError::Trap { .. }), "{err}");
    assert!(err.to_string().contains("memory limit"), "{err}");
}

#[test]
fn unbounded_recursion_overflows_the_bounded_stack() {
    let (rt, hostile, good) = plugins();
    let err = attack(&rt, &hostile, &good, "recursion");
    assert!(err.to_string().contains("stack overflow"), "{err}");
}

#[test]
fn a_plugin_stack_run_below_its_memory_is_named_a_stack_overflow() {
    let (rt, hostile, good) = plugins();
    let err = attack(&rt, &hostile, &good, "stack");
    assert!(matches!(err, CallError::Trap { .. }), "{err}");
    assert!(err.to_string().contains("its own stack there overflowed"), "{err}");
}

#[test]
fn panic_becomes_a_trap_error() {
    let (rt, hostile, good) = plugins();
    let err = attack(&rt, &hostile, &good, "panic");
    assert!(matches!(err, CallError::Trap { .. }), "{err}");
    assert!(err.to_string().contains("panicked"), "{err}");
}

/// The optional `agent` export is asked in the same call as `render`, under the same
/// deadline and policy: a spinning status or fence command is stopped, an argv beyond
/// the bounds (status, fence, client or promote command) is refused by name.
#[test]
fn the_agent_commands_are_bounded_like_render() {
    let (rt, hostile, good) = plugins();
    let err = attack(&rt, &hostile, &good, "agent-spin");
    assert!(matches!(err, CallError::Timeout { function: "render", .. }), "{err}");
    let err = attack(&rt, &hostile, &good, "agent-argv");
    let CallError::Policy { violations, .. } = &err else { panic!("expected a policy error, got {err}") };
    assert!(violations.iter().any(|v| v.field == "statusCommand"), "{err}");
    let err = attack(&rt, &hostile, &good, "fence-spin");
    assert!(matches!(err, CallError::Timeout { function: "render", .. }), "{err}");
    let err = attack(&rt, &hostile, &good, "fence-argv");
    let CallError::Policy { violations, .. } = &err else { panic!("expected a policy error, got {err}") };
    assert!(violations.iter().any(|v| v.field == "fenceCommand"), "{err}");
    let err = attack(&rt, &hostile, &good, "client-argv");
    let CallError::Policy { violations, .. } = &err else { panic!("expected a policy error, got {err}") };
    assert!(violations.iter().any(|v| v.field == "clientCommand"), "{err}");
    let err = attack(&rt, &hostile, &good, "promote-argv");
    let CallError::Policy { violations, .. } = &err else { panic!("expected a policy error, got {err}") };
    assert!(violations.iter().any(|v| v.field == "promoteCommand"), "{err}");
    let err = attack(&rt, &hostile, &good, "synchronous-argv");
    let CallError::Policy { violations, .. } = &err else { panic!("expected a policy error, got {err}") };
    assert!(violations.iter().any(|v| v.field == "synchronousCommand"), "{err}");
    let err = attack(&rt, &hostile, &good, "application");
    let CallError::Policy { violations, .. } = &err else { panic!("expected a policy error, got {err}") };
    for field in ["application.user", "application.database", "application.passwordKey", "application.scheme"] {
        assert!(violations.iter().any(|v| v.field == field), "{field}: {err}");
    }
}

/// The optional `metrics` export is asked with `render` and checked like it: an
/// exporter on the agent's port, without an image, with an argv beyond the bounds,
/// reading a Secret not the Database's, at a path that is not one, is refused on each count.
#[test]
fn the_metrics_endpoint_is_checked_like_render() {
    let (rt, hostile, good) = plugins();
    let err = attack(&rt, &hostile, &good, "metrics");
    let CallError::Policy { violations, .. } = &err else { panic!("expected a policy error, got {err}") };
    for field in ["metrics.port", "metrics.path", "metrics.exporter.image", "metrics.exporter.command", "metrics.exporter.env[0]"] {
        assert!(violations.iter().any(|v| v.field == field), "{field}: {err}");
    }
}

/// A log line past the copy bound fails the call, and the error says it was a log line,
/// not the result.
#[test]
fn a_log_line_past_the_copy_bound_is_named_as_such() {
    let (rt, hostile, good) = plugins();
    let err = attack(&rt, &hostile, &good, "log-huge");
    eprintln!("{err:?}");
    assert!(matches!(err, CallError::LogTooLarge { .. }), "{err}");
    assert!(err.to_string().contains("a log line"), "{err}");
}

#[test]
fn oversized_output_is_refused() {
    let (rt, hostile, good) = plugins();
    let err = attack(&rt, &hostile, &good, "huge");
    assert!(matches!(err, CallError::OutputTooLarge { limit, .. } if limit == 256 << 10), "{err}");
}

/// A result is bounded while it is copied out of the guest: strings aliased 512
/// times cost the host no more than the copy bound, not 512 copies.
#[test]
fn aliased_strings_are_refused_while_they_are_copied() {
    let (rt, hostile, good) = plugins();
    let (err, peak) = peak_heap(|| attack(&rt, &hostile, &good, "alias"));
    assert!(matches!(err, CallError::OutputTooLarge { limit, .. } if limit == 256 << 10), "{err}");
    let bound = rt.limits().output_bytes;
    assert!(peak < 4 * bound, "the host heap grew by {peak} bytes during the call (copy bound {bound})");
}

#[test]
fn output_that_breaks_host_policy_is_refused_with_every_reason() {
    let (rt, hostile, good) = plugins();
    let err = attack(&rt, &hostile, &good, "policy");
    let CallError::Policy { violations, .. } = &err else { panic!("expected a policy error, got {err}") };
    let fields: Vec<&str> = violations.iter().map(|v| v.field.as_str()).collect();
    assert!(fields.contains(&"runAsUser"), "{err}");
    assert!(fields.contains(&"dataMountPath"), "{err}");
    assert!(fields.contains(&"env[0]"), "{err}");
    assert!(err.to_string().contains("cluster-admin-token"), "{err}");
}

#[test]
fn every_call_outcome_is_counted_in_the_metrics() {
    let metrics = std::sync::Arc::new(plugdb::metrics::Metrics::default());
    let rt = runtime().with_metrics(metrics.clone());
    let hostile = rt.load(&plugdb_tests::component("hostile")).expect("hostile loads");
    for attack in ["none", "loop", "panic", "huge", "policy"] {
        let _ = hostile.render(&spec(attack), &plugdb_tests::cluster("victim", "default"));
    }
    let _ = hostile.backup(
        &spec("none"),
        &plugdb::plugin::BackupLocation {
            directory: "/backups".into(),
            artifact: "a".into(),
            host: "h".into(),
            credentials_secret: "victim-credentials".into(),
            cluster: plugdb_tests::cluster("victim", "default"),
            archive_directory: None,
            point_in_time: None,
        },
    );
    let text = metrics.encode();
    for (function, outcome) in
        [("render", "ok"), ("render", "timeout"), ("render", "trap"), ("render", "too-large"), ("render", "policy"), ("backup", "refused")]
    {
        let line = format!("plugdb_plugin_calls_total{{engine=\"hostile\",function=\"{function}\",outcome=\"{outcome}\"}} 1");
        assert!(text.contains(&line), "{line} missing from:\n{text}");
    }
}

#[test]
fn log_flood_is_bounded_and_the_call_succeeds() {
    let (rt, hostile, good) = plugins();
    let started = Instant::now();
    let result = hostile.render(&spec("log-flood"), &plugdb_tests::cluster("victim", "default"));
    // Either it finished (lines past the cap are dropped) or it ran out of time; never stuck.
    assert!(result.is_ok() || matches!(result, Err(CallError::Timeout { .. })), "{result:?}");
    assert!(started.elapsed() < DEADLINE * 25);
    good.render(&EngineSpec { parameters: vec![], ..spec("") }, &plugdb_tests::cluster("victim", "default"))
        .expect("the good plugin keeps answering");
    let _ = rt;
}

#[test]
fn a_plugin_for_another_contract_version_is_refused_at_load() {
    let err = runtime().load(&plugdb_tests::component("future-contract")).expect_err("refused");
    assert!(matches!(err, LoadError::Contract(_)), "{err}");
    let text = err.to_string();
    assert!(text.contains("plugdb:engine@1.0.0") && text.contains("plugdb:engine@0.2.0") && text.contains("rebuild"), "{text}");
}

#[test]
fn bytes_that_are_not_a_component_are_refused_at_load() {
    let rt = runtime();
    let err = rt.load(b"definitely not wasm").expect_err("garbage refused");
    assert!(matches!(err, LoadError::NotAComponent(_)), "{err}");
    let core_module = b"\0asm\x01\0\0\0";
    let err = rt.load(core_module).expect_err("core module refused");
    assert!(err.to_string().contains("core wasm module"), "{err}");
    let mut truncated = plugdb_tests::component("minimal");
    truncated.truncate(truncated.len() / 2);
    assert!(matches!(rt.load(&truncated), Err(LoadError::NotAComponent(_))));
    // The runtime still loads good plugins afterwards.
    rt.load(&plugdb_tests::component("minimal")).expect("minimal still loads");
}

/// Code bigger than the shape limits is refused before the compiler sees it, with
/// every excess named.
#[test]
fn code_past_the_shape_limits_is_refused_before_compiling() {
    let limits = Limits::default();
    let twice = ShapeLimits { function_bytes: 2 * limits.shape.function_bytes + (16 << 10), ..limits.shape };
    let bytes = plugdb_tests::bomb::component("loops", &twice);
    let err = Runtime::with_tier(limits, Tier::Quick).expect("runtime").load(&bytes).expect_err("too big");
    assert!(matches!(err, LoadError::TooBig(_)), "{err}");
    let expected = format!("the limit is {} bytes", limits.shape.function_bytes);
    assert!(err.to_string().starts_with("too big to compile: code in one function: ") && err.to_string().contains(&expected), "{err}");
}

/// The operator compiles in a child `plugdb compile` process: real plugins load and
/// answer through it.
#[test]
fn plugins_compiled_in_a_child_process_load_and_answer() {
    for tier in [Tier::Quick, Tier::Optimized] {
        let rt = Runtime::with_tier(Limits::default(), tier).expect("runtime").with_compiler(&plugdb_tests::plugdb_binary());
        let postgres = rt.load(&plugdb_tests::component("postgres")).expect("postgres compiles apart and loads");
        let mut spec = spec("");
        spec.parameters.clear();
        spec.version = postgres.info().default_version.clone();
        let workload = postgres.render(&spec, &plugdb_tests::cluster("victim", "default")).expect("postgres renders");
        assert!(!workload.image.is_empty());
        let err = rt.load(b"\0asm\x0d\0\x01\0garbage").expect_err("garbage");
        assert!(matches!(err, LoadError::NotAComponent(_)), "the child's complaint comes back: {err}");
    }
}

/// Code within the shape limits can still be costly to compile (deep blocks left by
/// wide branch tables: about 20 s and 950 MiB in one optimised compile here). The
/// child compiler runs out of its time or memory and is stopped; the operator spends
/// neither, and loads the next plugin (within the same bound: 15 s, which a small
/// plugin's compile stays well within even on a machine busy with the other tiers).
#[test]
fn a_compile_bomb_within_the_shape_limits_is_stopped_by_the_compilers_bounds() {
    let limits = Limits { compile_timeout: Duration::from_secs(15), ..Limits::default() };
    let bomb = plugdb_tests::bomb::component("branches", &limits.shape);
    assert_eq!(Shape::of(&bomb).expect("shape").excess(&limits.shape), Vec::<String>::new(), "the bomb passes the shape limits");
    let rt = Runtime::with_tier(limits, Tier::Optimized).expect("runtime").with_compiler(&plugdb_tests::plugdb_binary());
    let err = rt.load(&bomb).expect_err("the bomb is stopped");
    assert!(matches!(err, LoadError::TooBig(_)), "{err}");
    let said = err.to_string();
    let memory = format!("more than {} MiB", limits.compile_memory >> 20);
    assert!(said.contains("longer than 15s") || said.contains(&memory), "{said}");
    rt.load(&plugdb_tests::component("minimal")).expect("the next plugin loads");
}

/// A shared buffer the operator's log subscriber writes into.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What `f` logs through the operator's own subscriber in `format`.
fn operator_log(format: plugdb::logging::LogFormat, f: impl FnOnce()) -> String {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = plugdb::logging::subscriber(format, plugdb::logging::filter("info"), move || writer.clone(), false);
    tracing::subscriber::with_default(subscriber, f);
    String::from_utf8(captured.0.lock().expect("buffer").clone()).expect("UTF-8")
}

/// A plugin's log line is one record of the operator's log, in text and in JSON: its
/// newlines, carriage returns, NULs, escape sequences and line separators are escaped,
/// and it is tagged with its engine.
#[test]
fn a_plugin_cannot_forge_a_line_of_the_operators_log() {
    let (_rt, hostile, _good) = plugins();
    let forge = || {
        hostile.render(&spec("log-forge"), &plugdb_tests::cluster("victim", "default")).expect("renders");
    };
    let text = operator_log(plugdb::logging::LogFormat::Text, forge);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "two plugin lines, two records:\n{text}");
    for line in &lines {
        assert!(line.contains("engine=\"hostile\"") || line.contains("engine=hostile"), "untagged: {line}");
        assert!(!line.chars().any(|c| c.is_control() || c == '\u{2028}'), "a control character passed: {line:?}");
        assert!(line.contains("FORGED"), "{line}");
    }
    assert!(lines[0].contains("ok\\n2026-11-27T08:00:00.000000Z  INFO plugdb::reconcile: FORGED"), "{}", lines[0]);

    let json = operator_log(plugdb::logging::LogFormat::Json, forge);
    let records: Vec<serde_json::Value> =
        json.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not one JSON record: {l}: {e}"))).collect();
    assert_eq!(records.len(), 2, "{json}");
    for record in &records {
        assert_eq!(record["fields"]["engine"], "hostile", "{record}");
        assert_eq!(record["target"], "plugdb::plugin::runtime", "{record}");
    }
}

/// An engine that logs without pause is held to its allowance of bytes over time; what
/// it loses is counted per engine.
#[test]
fn a_chatty_plugin_is_bounded_over_time_and_the_lines_dropped_are_counted() {
    let metrics = std::sync::Arc::new(Metrics::default());
    let rt = runtime().with_metrics(metrics.clone());
    let hostile = rt.load(&plugdb_tests::component("hostile")).expect("hostile loads");
    let started = Instant::now();
    let log = operator_log(plugdb::logging::LogFormat::Text, || {
        for _ in 0..5 {
            let _ = hostile.render(&spec("log-flood"), &plugdb_tests::cluster("victim", "default"));
        }
    });
    let allowed = plugdb::plugin::logs::BURST_BYTES + plugdb::plugin::logs::BYTES_PER_SECOND * started.elapsed().as_secs_f64();
    let flood: usize = log.lines().filter(|l| l.contains("flood line")).map(str::len).sum();
    assert!(flood > 0, "some lines get through");
    // Each line as printed carries a timestamp, level, target and tag beside the message.
    assert!((flood as f64) < allowed * 1.2, "{flood} bytes of flood logged, allowance {allowed}");
    let dropped = plugdb_tests::operator::metric_sum(&metrics.encode(), "plugdb_plugin_log_lines_dropped_total", |l| {
        l.contains("engine=\"hostile\"")
    });
    // Five calls of 64 lines each (the per-call cap), about 2 KiB a line after the cut.
    assert!(dropped >= 5.0 * 64.0 - allowed / 2048.0 - 1.0, "dropped {dropped}");
}
