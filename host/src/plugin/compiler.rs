//! `plugdb compile`: the child that compiles a plugin for the operator (which starts
//! it, bounds it and reads its answer: `runtime/compile.rs`). It limits its own data
//! size, reads a component on stdin and writes the compiled artefact on stdout.

use std::io::{Read, Write};

use super::runtime::{Limits, Tier};

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
