//! Engine plugins: the contract's host-side types, the sandboxed runtime that runs
//! plugin components, the policy every plugin output passes, and the registry that
//! loads plugins from ConfigMaps.

pub mod calls;
pub mod compiler;
mod convert;
pub mod logs;
mod memo;
pub mod policy;
mod pool;
pub mod registry;
mod runtime;
mod shape;
pub mod types;

pub use calls::{Answer, CallError, Function};
pub use convert::Contract;
pub use memo::Memo;
pub use pool::{Busy, CallPool, DEFAULT_CPU_PER_ENGINE, Unanswered};
pub use registry::{Outcome, Registry};
pub use runtime::{
    CONTRACT_VERSION, Limits, LoadError, Plugin, Runtime, SLOW_CALL, SLOW_CALL_NICENESS, Sandboxed, Tier, defer_resets, hex_digest,
    reset_spent,
};
pub use shape::{Shape, ShapeLimits};
pub use types::*;
