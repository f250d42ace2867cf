//! The member agent's guard, as the engine's container runs it: `plugdb agent guard`
//! with a real engine-like child. It passes on the container's signals and its engine's
//! exit, and kills a stopped (hung) engine when the agent writes the stop file, but not
//! for a stop file an earlier guard carried out.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// `plugdb agent guard --stop <dir>/stop -- sh -c <script>`; the script writes its
/// shell's pid to `<dir>/pid` first.
fn guard(dir: &Path, script: &str) -> Child {
    let script = format!("echo $$ > {}/pid; {script}", dir.display());
    Command::new(plugdb_tests::plugdb_binary())
        .args(["agent", "guard", "--stop"])
        .arg(dir.join("stop"))
        .args(["--", "sh", "-c", &script])
        .spawn()
        .expect("the guard")
}

/// The engine's pid, once it wrote it.
fn engine(dir: &Path) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = std::fs::read_to_string(dir.join("pid")).ok().and_then(|p| p.trim().parse().ok()) {
            return pid;
        }
        assert!(Instant::now() < deadline, "the engine never started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(pid: i32, signal: &str) {
    let status = Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status().expect("kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// How `child` exited, within `within`.
fn exited(child: &mut Child, within: Duration) -> Option<i32> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().expect("wait") {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    None
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
}

#[test]
fn the_guard_passes_on_signals_and_the_engines_exit() {
    let dir = tempfile::tempdir().expect("dir");
    let mut exits = guard(dir.path(), "exit 3");
    assert_eq!(exited(&mut exits, Duration::from_secs(10)), Some(3), "the engine's exit code is the guard's");

    let dir = tempfile::tempdir().expect("dir");
    let mut trapped = guard(dir.path(), "trap 'exit 7' TERM; while :; do sleep 0.05; done");
    engine(dir.path());
    std::thread::sleep(Duration::from_millis(200));
    signal(trapped.id() as i32, "TERM");
    assert_eq!(exited(&mut trapped, Duration::from_secs(10)), Some(7), "SIGTERM reaches the engine, which exits as it chooses");
}

#[test]
fn a_stop_order_kills_a_stopped_engine_and_an_old_one_is_not_an_order() {
    let dir = tempfile::tempdir().expect("dir");
    // An order carried out before this guard started.
    std::fs::write(dir.path().join("stop"), "an earlier order\n").expect("write");
    let mut guarded = guard(dir.path(), "exec sleep 1000");
    let pid = engine(dir.path());
    std::thread::sleep(Duration::from_millis(800));
    assert!(guarded.try_wait().expect("wait").is_none() && alive(pid), "an old stop file is not an order");
    signal(pid, "KILL");
    assert_eq!(exited(&mut guarded, Duration::from_secs(5)), Some(137), "an engine ended by a signal: 128 + its number");

    std::fs::remove_file(dir.path().join("pid")).expect("remove");
    let mut guarded = guard(dir.path(), "exec sleep 1000");
    let pid = engine(dir.path());
    signal(pid, "STOP");
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(dir.path().join("stop"), "its fence was not confirmed\n").expect("the order");
    assert_eq!(exited(&mut guarded, Duration::from_secs(5)), Some(137), "the guard ends once the engine is killed");
    assert!(!alive(pid), "the stopped engine was killed");
}

/// The agent logs as the operator that rendered its member does: one JSON object a line
/// when the member's environment says `PLUGDB_LOG_FORMAT=json`, text otherwise.
#[test]
fn the_agent_logs_in_the_operators_shape() {
    use std::io::BufRead;
    let first_line = |format: Option<&str>| {
        let mut agent = Command::new(plugdb_tests::plugdb_binary());
        agent.args(["agent", "serve", "--port", "0", "--certs", "/nonexistent", "--clients", &"0a".repeat(32), "--", "true"]);
        agent.env_remove(plugdb::logging::FORMAT_ENV).stderr(std::process::Stdio::piped());
        if let Some(format) = format {
            agent.env(plugdb::logging::FORMAT_ENV, format);
        }
        let mut agent = agent.spawn().expect("the agent");
        let mut line = String::new();
        std::io::BufReader::new(agent.stderr.take().expect("stderr")).read_line(&mut line).expect("a line");
        let _ = agent.kill();
        let _ = agent.wait();
        line
    };
    let json: serde_json::Value = serde_json::from_str(&first_line(Some("json"))).expect("a JSON line");
    assert_eq!((json["level"].as_str(), json["fields"]["message"].as_str()), (Some("INFO"), Some("the member agent serves")), "{json}");
    let text = first_line(None);
    assert!(text.contains(" INFO ") && text.contains("the member agent serves") && !text.starts_with('{'), "{text}");
}
