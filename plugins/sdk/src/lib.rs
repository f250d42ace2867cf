//! Guest-side SDK for plugdb engine plugins.
//!
//! An engine plugin implements [`Engine`] and [`Agent`] and exports them with
//! [`export_engine!`]:
//!
//! ```text
//! struct Redis;
//! impl plugdb_sdk::Engine for Redis { /* info, validate, render, ... */ }
//! impl plugdb_sdk::Agent for Redis { /* status_command: empty for no member agent */ }
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

pub use bindings::exports::plugdb::engine::agent::{ApplicationLogin, Guest as Agent};
pub use bindings::exports::plugdb::engine::plugin::Guest as Engine;
pub use bindings::plugdb::engine::host::log as host_log;
pub use bindings::plugdb::engine::types::*;

/// Exports a type that implements [`Engine`] as the plugin of this component.
pub use bindings::export_engine;

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
}
