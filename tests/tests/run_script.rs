//! `scripts/run.sh` interrupted (Ctrl-C) after its operator died: its cleanup runs to
//! the end whatever is already gone, so the control plane, the nodes, their containers,
//! namespaces, veths and routes all go, and the machine's own network namespace and
//! kernel settings are as they were before it started.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use plugdb_tests::node::{machine_state, state_difference};

/// The PIDs of the processes running `binary` (by the file they execute) with `arg`
/// among their arguments, when given.
fn processes(binary: &std::path::Path, arg: Option<&str>) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else { continue };
        if exe != binary {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let mut args = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned());
        if arg.is_none_or(|arg| args.any(|a| a == arg)) {
            found.push(pid);
        }
    }
    found
}

/// Sends `signal` to every process of group `group`, as a terminal does.
fn signal_group(signal: &str, group: i32) -> bool {
    Command::new("kill").args(["-s", signal, "--", &format!("-{group}")]).status().is_ok_and(|s| s.success())
}

#[test]
fn ctrl_c_after_the_operator_died_tears_everything_down() {
    let root = plugdb_tests::workspace_root();
    // A crashed run's leftovers go before the machine is described.
    plugdb_tests::node::teardown(&plugdb_tests::node::run_dir());
    let before = machine_state();
    let mut run = Command::new("bash")
        .arg(root.join("scripts/run.sh"))
        .current_dir(&root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        // A process group of its own, as a terminal's foreground job: Ctrl-C reaches every process in it.
        .process_group(0)
        .spawn()
        .expect("bash scripts/run.sh");
    let group = run.id() as i32;
    let stdout = run.stdout.take().expect("stdout");
    let (lines, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("run.sh: {line}");
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    // Until the operator has started (the sample Database is applied next).
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match seen.recv_timeout(left) {
            Ok(line) if line.starts_with("== applying") => break,
            Ok(_) => {}
            Err(e) => {
                signal_group("INT", group);
                let _ = run.wait();
                panic!("run.sh did not start its operator: {e}");
            }
        }
    }
    let plugdb = plugdb_tests::plugdb_binary().canonicalize().expect("the plugdb binary");
    // run.sh prints its next step right after it forks the operator, which may not have
    // exec'd the binary yet.
    let deadline = Instant::now() + Duration::from_secs(10);
    let operators = loop {
        let found = processes(&plugdb, Some("run"));
        if !found.is_empty() || Instant::now() >= deadline {
            break found;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // A child the operator is starting (a plugin's compiler) is a copy of it until it
    // execs: the operator is the one whose parent is none of them.
    let parent = |pid: &u32| -> Option<u32> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status.lines().find_map(|l| l.strip_prefix("PPid:")?.trim().parse().ok())
    };
    let operators: Vec<u32> = operators.iter().copied().filter(|pid| parent(pid).is_none_or(|p| !operators.contains(&p))).collect();
    assert_eq!(operators.len(), 1, "one operator runs: {operators:?}");
    let status = Command::new("kill").args(["-KILL", &operators[0].to_string()]).status().expect("kill");
    assert!(status.success(), "the operator killed");
    std::thread::sleep(Duration::from_secs(1));

    assert!(signal_group("INT", group), "Ctrl-C sent");
    let deadline = Instant::now() + Duration::from_secs(120);
    let code = loop {
        if let Some(code) = run.try_wait().expect("wait") {
            break code;
        }
        assert!(Instant::now() < deadline, "run.sh did not end within 120 s of Ctrl-C");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(!code.success(), "an interrupted run.sh says so: {code}");
    let left = state_difference(&before, &machine_state());
    assert!(left.is_empty(), "run.sh left the machine changed:\n{}", left.join("\n"));
    let namespaces = std::fs::read_dir("/run/netns").into_iter().flatten().flatten();
    let ours: Vec<String> =
        namespaces.map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with(plugdb_tests::node::NETNS)).collect();
    assert!(ours.is_empty(), "network namespaces left: {ours:?}");
    let node = plugdb.with_file_name("node").canonicalize().expect("the node binary");
    assert!(processes(&node, None).is_empty() && processes(&plugdb, Some("run")).is_empty(), "nothing of it still runs");
}
