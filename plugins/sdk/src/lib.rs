//! Guest-side SDK for plugdb engine plugins.
//!
//! An engine plugin implements [`Engine`], [`Agent`] and [`Metrics`] and exports them
//! with [`export_engine!`]:
//!
//! ```text
//! struct Redis;
//! impl plugdb_sdk::Engine for Redis { /* info, validate, render, ... */ }
//! impl plugdb_sdk::Agent for Redis {} // no member agent: every agent function's default
//! impl plugdb_sdk::Metrics for Redis {} // measured by the agent alone
//! plugdb_sdk::export_engine!(Redis);
//! ```
//!
//! Everything a plugin exchanges with the host is a typed record from the
//! `plugdb:engine` WIT package (re-exported here), plus a few helpers for the
//! chores every engine repeats (parameters, sizes, versions).

#![allow(missing_docs)] // the generated bindings carry the WIT documentation

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "engine",
        path: "wit",
        pub_export_macro: true,
        export_macro_name: "export_engine",
        default_bindings_module: "plugdb_sdk::bindings",
        additional_derives: [PartialEq],
    });
}

/// The contract version these bindings implement (`wit/engine.wit`): what
/// `PluginInfo::contract_version` must say.
pub const CONTRACT_VERSION: &str = "0.2.0";

pub use bindings::exports::plugdb::engine::agent::ApplicationLogin;
pub use bindings::exports::plugdb::engine::metrics::{Exporter, MetricsEndpoint};
pub use bindings::exports::plugdb::engine::plugin::Guest as Engine;
pub use bindings::plugdb::engine::host::log as host_log;
pub use bindings::plugdb::engine::types::*;

/// Exports a type that implements [`Engine`] as the plugin of this component.
pub use bindings::export_engine;

/// What the member agent beside each engine runs, each function of the contract's `agent`
/// interface with its default: not offered (no command, no login). A plugin implements
/// what its engine does; a function the contract gains later needs nothing of a plugin
/// that does not use it. With no status command, members run no agent at all.
pub trait Agent {
    /// Prints the member's role and position (see `wit/engine.wit`).
    fn status_command(_spec: DatabaseSpec) -> Vec<String> {
        Vec::new()
    }

    /// Makes the engine take no more writes.
    fn fence_command(_spec: DatabaseSpec) -> Vec<String> {
        Vec::new()
    }

    /// What `kubectl plugdb connect` runs in a member's engine container.
    fn client_command(_spec: DatabaseSpec) -> Vec<String> {
        Vec::new()
    }

    /// Promotes a replica in place.
    fn promote_command(_spec: DatabaseSpec) -> Vec<String> {
        Vec::new()
    }

    /// Sets how many replicas confirm each commit.
    fn synchronous_command(_spec: DatabaseSpec) -> Vec<String> {
        Vec::new()
    }

    /// Has a replica follow a new primary.
    fn follow_command(_spec: DatabaseSpec) -> Vec<String> {
        Vec::new()
    }

    /// The application's own login.
    fn application(_spec: DatabaseSpec) -> Option<ApplicationLogin> {
        None
    }
}

impl<T: Agent> bindings::exports::plugdb::engine::agent::Guest for T {
    fn status_command(spec: DatabaseSpec) -> Vec<String> {
        <T as Agent>::status_command(spec)
    }

    fn fence_command(spec: DatabaseSpec) -> Vec<String> {
        <T as Agent>::fence_command(spec)
    }

    fn client_command(spec: DatabaseSpec) -> Vec<String> {
        <T as Agent>::client_command(spec)
    }

    fn promote_command(spec: DatabaseSpec) -> Vec<String> {
        <T as Agent>::promote_command(spec)
    }

    fn synchronous_command(spec: DatabaseSpec) -> Vec<String> {
        <T as Agent>::synchronous_command(spec)
    }

    fn follow_command(spec: DatabaseSpec) -> Vec<String> {
        <T as Agent>::follow_command(spec)
    }

    fn application(spec: DatabaseSpec) -> Option<ApplicationLogin> {
        <T as Agent>::application(spec)
    }
}

/// How Prometheus measures the members' engine (the contract's `metrics` interface),
/// with its default: not at all beyond the agent's series.
pub trait Metrics {
    /// Where the engine's series are scraped, and the exporter that serves them.
    fn endpoint(_spec: DatabaseSpec, _cluster: ClusterContext) -> Option<MetricsEndpoint> {
        None
    }
}

impl<T: Metrics> bindings::exports::plugdb::engine::metrics::Guest for T {
    fn endpoint(spec: DatabaseSpec, cluster: ClusterContext) -> Option<MetricsEndpoint> {
        <T as Metrics>::endpoint(spec, cluster)
    }
}

mod allocator;
mod helpers;
pub mod parameters;
pub use helpers::*;

#[cfg(test)]
mod tests {
    #[test]
    fn the_contract_version_is_the_wit_package_version() {
        let wit = include_str!("../wit/engine.wit");
        assert!(
            wit.contains(&format!("\npackage plugdb:engine@{};\n", super::CONTRACT_VERSION)),
            "wit/engine.wit declares another version"
        );
    }

    /// The helper kept running starts again after it ends, and its container's stop
    /// (SIGTERM to the shell) ends both at once.
    #[test]
    fn a_command_kept_running_starts_again_and_stops_with_its_container() {
        let dir = std::env::temp_dir().join(format!("plugdb-kept-running-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let runs = dir.join("runs");
        let helper = ["sh".to_string(), "-c".into(), format!("echo run >> {}; exit 3", runs.display())];
        let argv = super::kept_running(&helper);
        let mut shell = std::process::Command::new(&argv[0]).args(&argv[1..]).stderr(std::process::Stdio::piped()).spawn().expect("sh");
        let started = std::time::Instant::now();
        let count = || std::fs::read_to_string(&runs).unwrap_or_default().lines().count();
        while count() < 2 {
            assert!(started.elapsed() < std::time::Duration::from_secs(20), "never started again");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(started.elapsed() >= std::time::Duration::from_secs(4), "started again only after a pause");
        let stopping = std::time::Instant::now();
        std::process::Command::new("kill").args(["-TERM", &shell.id().to_string()]).status().expect("kill");
        let ended = shell.wait().expect("wait");
        assert!(ended.success() && stopping.elapsed() < std::time::Duration::from_secs(3), "{ended:?}");
        let mut said = String::new();
        std::io::Read::read_to_string(shell.stderr.as_mut().expect("stderr"), &mut said).expect("read");
        assert!(said.contains("sh ended (3): started again in 5 s"), "{said}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
