//! The guard: `plugdb agent guard`, the first process of the engine's container in a
//! member whose plugin declares a fence command. It runs the engine's command as its
//! child and stays its parent: it passes on the signals a container is stopped (or
//! told to reload) by, reaps what is left to it, and exits as the engine does.
//!
//! Its one decision is not its own: when the agent orders it (the file [`STOP_FILE`],
//! written or rewritten after the guard started), it kills every process of the engine
//! with SIGKILL, which a hung or stopped process cannot refuse, and exits; the container
//! starts again, and the engine's start waits while the member is fenced. The agent
//! orders it for a fence the engine did not confirm (it does not answer): a hung primary
//! that ran again could otherwise commit what it had in flight after another member was
//! promoted.

use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use rustix::process::{Pid, Signal, WaitOptions};
use tokio::signal::unix::{SignalKind, signal};

/// The file in the agent's state whose writing orders the guard to stop the engine.
pub const STOP_FILE: &str = "stop";
/// How often the guard looks at [`STOP_FILE`] (and reaps, should a SIGCHLD be missed).
pub const LOOK_EVERY: Duration = Duration::from_millis(100);
/// The signals passed on to the engine: those a container is stopped by (the runtime's
/// SIGTERM, a user's SIGINT or SIGQUIT) or an engine reloads on.
const PASSED_ON: [Signal; 6] = [Signal::TERM, Signal::INT, Signal::QUIT, Signal::HUP, Signal::USR1, Signal::USR2];

/// When `stop` was last written, if it exists.
fn written(stop: &Path) -> Option<SystemTime> {
    std::fs::metadata(stop).and_then(|m| m.modified()).ok()
}

/// Runs `argv` (the engine) and guards it: the exit code to leave with, the engine's
/// (128 + the signal that ended it), or 137 once the agent ordered it stopped.
pub fn guard(stop: &Path, argv: &[String]) -> anyhow::Result<i32> {
    let (program, args) = argv.split_first().context("no command to guard")?;
    // An order written before this start was carried out by an earlier guard.
    let carried_out = written(stop);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    runtime.block_on(async {
        // Handlers first: a signal the engine should get is not lost in between.
        let mut passed_on = Vec::new();
        for sig in PASSED_ON {
            passed_on.push((sig, signal(SignalKind::from_raw(sig.as_raw())).context("a signal handler")?));
        }
        let mut children = signal(SignalKind::child()).context("a SIGCHLD handler")?;
        // In a process group of its own: what it starts is killed with it, should the
        // guard not be the container's first process.
        let child = std::os::unix::process::CommandExt::process_group(&mut std::process::Command::new(program), 0)
            .args(args)
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        let engine = Pid::from_raw(child.id() as i32).context("the engine's process id")?;
        let mut look = tokio::time::interval(LOOK_EVERY);
        loop {
            let received =
                futures::future::select_all(passed_on.iter_mut().map(|(sig, s)| Box::pin(async move { s.recv().await.map(|()| *sig) })));
            tokio::select! {
                (Some(sig), _, _) = received => {
                    let _ = rustix::process::kill_process(engine, sig);
                }
                _ = children.recv() => {}
                _ = look.tick() => {
                    if written(stop).is_some_and(|at| Some(at) != carried_out) {
                        let why = std::fs::read_to_string(stop).unwrap_or_default();
                        eprintln!("plugdb guard: the member agent ordered the engine stopped ({}): killing it", why.trim());
                        kill_all(engine);
                        while reap(engine).is_none() {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        return Ok(137);
                    }
                }
            }
            if let Some(code) = reap(engine) {
                return Ok(code);
            }
        }
    })
}

/// Reaps every child that has ended; the exit code of `engine` once it has.
fn reap(engine: Pid) -> Option<i32> {
    let mut ended = None;
    while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
        if pid == engine {
            ended = status.exit_status().or(status.terminating_signal().map(|s| 128 + s));
        }
    }
    ended
}

/// SIGKILL to the engine's process group and, when the guard is its container's first
/// process (its processes are all the engine's), to every other process it sees.
fn kill_all(engine: Pid) {
    let _ = rustix::process::kill_process_group(engine, Signal::KILL);
    if rustix::process::getpid().as_raw_nonzero().get() != 1 {
        return;
    }
    let processes = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    for pid in processes.filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()).filter(|&p| p != 1) {
        if let Some(pid) = Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
    }
}
