//! Compiling a plugin in a process of its own. A compile cannot be interrupted and
//! its memory grows with the code it is given, so the operator hands the component to
//! a child `plugdb compile` (`crate::plugin::compiler`) with a data-size limit
//! (`RLIMIT_DATA`) and a deadline, and takes back the compiled artefact. A compile that
//! runs out of either is stopped (by the child's PID) and the plugin refused; the
//! operator never spends more.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Limits, LoadError, Tier};

/// The most a compiled artefact may be (it holds the machine code of at most
/// `ShapeLimits::code_bytes` of wasm, a few times over).
const MAX_ARTIFACT_BYTES: u64 = 256 << 20;
/// What the child may say on stderr before it is cut.
const MAX_STDERR_BYTES: u64 = 4096;

/// The arguments of `plugdb compile` that reproduce `limits` and `tier` in the child:
/// the compiled code depends on them, and the artefact is only accepted by an engine
/// configured the same (wasmtime checks).
fn child_args(limits: &Limits, tier: Tier) -> Vec<String> {
    [
        ("--tier", tier.name().to_string()),
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
