//! plugdb: a Kubernetes operator that runs databases of many engines through one
//! `Database` resource. Engine-specific decisions come from sandboxed WebAssembly
//! plugins loaded at run time; this crate is the host that owns everything else.

// No unsafe code, with one exception in `plugin/runtime.rs`: loading the code a child
// `plugdb compile` compiled (wasmtime marks any precompiled code unsafe to load).
#![deny(unsafe_code)]

pub mod agent;
pub mod build;
pub mod cli;
pub mod crd;
pub mod egress;
pub mod events;
pub mod health;
pub mod images;
pub mod jobs;
pub mod leader;
pub mod logging;
pub mod metrics;
pub mod names;
pub mod object_storage;
pub mod operator;
pub mod plugin;
pub mod quantity;
pub mod reconcile;
pub mod said;
pub mod schedule;
pub mod serve;
pub mod stamp;
pub mod tls;
