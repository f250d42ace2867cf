//! Compiling a plugin in a process of its own. A compile cannot be interrupted and
//! its memory grows with the code it is given, so the operator hands the component to
//! a child `plugdb compile` with a data-size limit (`RLIMIT_DATA`) and a deadline,
//! and takes back the compiled artefact. A compile that runs out of either is stopped
//! (by the child's PID) and the plugin refused; the operator never spends more.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::runtime::{Limits, LoadError, Tier};

/// The most a compiled artefact may be (it holds the machine code of at most
/// `ShapeLimits::code_bytes` of wasm, a few times over).
const MAX_ARTIFACT_BYTES: u64 = 256 << 20;
/// What the child may say on stderr before it is cut.
const MAX_STDERR_BYTES: u64 = 4096;

fn tier_name(tier: Tier) -> &'static str {
    match tier {
        Tier::Quick => "quick",
        Tier::Optimized => "optimized",
    }
}

/// The arguments of `plugdb compile` that reproduce `limits` and `tier` in the child:
/// the compiled code depends on them, and the artefact is only accepted by an engine
/// configured the same (wasmtime checks).
fn child_args(limits: &Limits, tier: Tier) -> Vec<String> {
    [
        ("--tier", tier_name(tier).to_string()),
        ("--memory-bytes", limits.memory_bytes.to_string()),
        ("--stack-bytes", limits.stack_bytes.to_string()),
        ("--data-bytes", limits.compile_memory.to_string()),
    ]
    .into_iter()
    .flat_map(|(flag, value)| [flag.to_string(), value])
    .collect()
}

/// Compiles `bytes` with the `plugdb` binary at `exe` under `limits`; returns the artefact.
pub(crate) fn compile_apart(exe: &Path, limits: &Limits, tier: Tier, bytes: &[u8]) -> Result<Vec<u8>, LoadError> {
    let failed = |what: &str, e: std::io::Error| LoadError::Compile(format!("{what} the compiler {}: {e}", exe.display()));
    let mut child = Command::new(exe)
        .arg("compile")
        .args(child_args(limits, tier))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed("starting", e))?;
    let (Some(mut stdin), Some(stdout), Some(stderr)) = (child.stdin.take(), child.stdout.take(), child.stderr.take()) else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(LoadError::Compile("the compiler's pipes were not set up".into()));
    };
    let input = bytes.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let reader = std::thread::spawn(move || {
        let mut artifact = Vec::new();
        stdout.take(MAX_ARTIFACT_BYTES + 1).read_to_end(&mut artifact).map(|_| artifact)
    });
    let complaints = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.take(MAX_STDERR_BYTES).read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + limits.compile_timeout;
    let status = loop {
        match child.try_wait().map_err(|e| failed("waiting for", e))? {
            Some(status) => break Some(status),
            None if Instant::now() >= deadline => {
                // Stopped by the PID we started, and reaped.
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    let _ = writer.join();
    let artifact = reader.join().unwrap_or_else(|_| Ok(Vec::new()));
    let complaint = complaints.join().unwrap_or_default();
    let complaint = complaint.trim();
    let Some(status) = status else {
        return Err(LoadError::TooBig(format!("compiling took longer than {:?}; the compiler was stopped", limits.compile_timeout)));
    };
    if complaint.contains("memory allocation of") || complaint.contains("out of memory") {
        return Err(LoadError::TooBig(format!(
            "compiling needed more than {} MiB of memory; the compiler was stopped",
            limits.compile_memory >> 20
        )));
    }
    if !status.success() {
        let said = if complaint.is_empty() { format!("the compiler exited with {status}") } else { complaint.to_string() };
        return Err(LoadError::NotAComponent(said));
    }
    let artifact = artifact.map_err(|e| failed("reading from", e))?;
    if artifact.len() as u64 > MAX_ARTIFACT_BYTES {
        return Err(LoadError::TooBig(format!("the compiled code is over {} MiB", MAX_ARTIFACT_BYTES >> 20)));
    }
    Ok(artifact)
}

/// What a `plugdb compile` child is asked to do: the settings that shape the compiled
/// code (see `child_args`) and the child's own data-size limit.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// The compile tier.
    pub tier: Tier,
    /// The memory cap the code is compiled for.
    pub memory_bytes: usize,
    /// The stack the code is compiled for.
    pub stack_bytes: usize,
    /// The child's data-size limit (`RLIMIT_DATA`).
    pub data_bytes: u64,
}

/// The tier named `name` (`quick` or `optimized`), as `child_args` writes it.
pub fn tier_named(name: &str) -> Option<Tier> {
    [Tier::Quick, Tier::Optimized].into_iter().find(|t| tier_name(*t) == name)
}

/// `plugdb compile`: limits its own data size, reads a component on stdin, writes the
/// compiled artefact on stdout. Errors go to stderr with a failing exit.
pub fn serve(request: Request) -> anyhow::Result<()> {
    // A panic must not allocate to report itself (the default hook takes a lock that an
    // allocation failing inside it would wait on forever): say it and stop.
    std::panic::set_hook(Box::new(|info| {
        let _ = writeln!(std::io::stderr(), "plugdb compile: {info}");
        std::process::abort();
    }));
    // Dies with the operator rather than compile for nobody.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .map_err(|e| anyhow::anyhow!("compile: asking to stop with the operator: {e}"))?;
    let data = request.data_bytes;
    rustix::process::setrlimit(rustix::process::Resource::Data, rustix::process::Rlimit { current: Some(data), maximum: Some(data) })
        .map_err(|e| anyhow::anyhow!("compile: limiting the data size to {data} bytes: {e}"))?;
    let limits = Limits {
        memory_bytes: request.memory_bytes,
        stack_bytes: request.stack_bytes,
        // Compiling instantiates nothing: no pool (the compiled code is the same).
        instance_slots: 0,
        ..Limits::default()
    };
    let mut bytes = Vec::new();
    std::io::stdin().take(super::registry::MAX_COMPONENT_BYTES + 1).read_to_end(&mut bytes)?;
    let runtime = super::Runtime::with_tier(limits, request.tier)?;
    let artifact = runtime.compile_here(&bytes).map_err(|e| anyhow::anyhow!("{e}"))?;
    std::io::stdout().lock().write_all(&artifact)?;
    Ok(())
}
