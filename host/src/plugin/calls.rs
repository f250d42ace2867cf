//! The contract's functions, each one value: its name, what it is asked with, what it
//! answers. Everything else follows from that one definition: the memo key
//! ([`Function::key`]), where the memo and the call pool keep an answer ([`Answer`]),
//! the metrics' label, and a pass asking by type (`ctx.ask::<Render>(plugin, input)`);
//! the sandbox says how each is asked (`runtime`'s `Sandboxed`). And how a call fails.

use std::time::Duration;

use sha2::{Digest, Sha256};

use super::types::{
    BackupLocation, ClusterContext, EngineSpec, FailoverDecision, JobPlan, Member, ScaleStep, UpgradePlan, Violation, Workload,
};

/// What an answer is remembered under: the plugin build, the function and the input.
pub type Key = [u8; 32];

/// One function of the plugin contract.
pub trait Function: Send + Sync + 'static {
    /// Its name in the contract (metrics, errors, the memo key).
    const NAME: &'static str;
    /// What it is asked with; its answers are remembered by it.
    type Input: serde::Serialize + Send + Sync + 'static;
    /// What it answers.
    type Output: Clone + serde::Serialize + Send + Sync + 'static;

    /// `answer` as the answers of every function are kept.
    fn keep(answer: Result<Self::Output, CallError>) -> Answer;

    /// This function's answer in `kept`; `None` when it is another function's.
    fn take(kept: Answer) -> Option<Result<Self::Output, CallError>>;

    /// What an answer of plugin build `digest` for `input` is remembered under (`None`
    /// when the input cannot be serialised).
    fn key(digest: &str, input: &Self::Input) -> Option<Key> {
        let mut hasher = Sha256::new();
        hasher.update(digest.as_bytes());
        hasher.update([0]);
        hasher.update(Self::NAME.as_bytes());
        hasher.update([0]);
        serde_json::to_writer(HashWriter(&mut hasher), input).ok()?;
        Some(hasher.finalize().into())
    }
}

/// Feeds serialised input straight into the hash.
struct HashWriter<'a>(&'a mut Sha256);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Defines each function and the [`Answer`] that holds any of their answers.
macro_rules! functions {
    ($($(#[$doc:meta])* $function:ident $name:literal ($input:ty) -> $output:ty;)*) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Clone, Copy)]
            pub struct $function;

            impl Function for $function {
                const NAME: &'static str = $name;
                type Input = $input;
                type Output = $output;

                fn keep(answer: Result<$output, CallError>) -> Answer {
                    Answer::$function(Box::new(answer))
                }

                fn take(kept: Answer) -> Option<Result<$output, CallError>> {
                    match kept {
                        Answer::$function(answer) => Some(*answer),
                        #[allow(unreachable_patterns)]
                        _ => None,
                    }
                }
            }
        )*

        /// An answer of any contract function, as the memo and the call pool keep it.
        #[derive(Debug, Clone)]
        pub enum Answer {
            $(
                #[doc = concat!("An answer of `", $name, "`.")]
                $function(Box<Result<$output, CallError>>),
            )*
        }
    };
}

functions! {
    /// `validate`: the engine's own checks of a spec.
    Validate "validate" (EngineSpec) -> Vec<Violation>;
    /// `render`: the workload for a spec and the cluster's facts.
    Render "render" ((EngineSpec, ClusterContext)) -> Workload;
    /// `plan-upgrade`: how to move from a running version to the spec's.
    PlanUpgrade "plan-upgrade" ((EngineSpec, String)) -> UpgradePlan;
    /// `plan-scale`: how to go from a number of members to the spec's.
    PlanScale "plan-scale" ((EngineSpec, u32, Vec<Member>)) -> Vec<ScaleStep>;
    /// `choose-primary`: which member to promote, or which one the engine elected.
    ChoosePrimary "choose-primary" ((EngineSpec, Vec<Member>)) -> FailoverDecision;
    /// `backup`: a Job that backs the Database up to a location.
    Backup "backup" ((EngineSpec, BackupLocation)) -> JobPlan;
    /// `restore`: a Job that restores a backup into one member, or none (it joins the others).
    Restore "restore" ((EngineSpec, BackupLocation, u32)) -> Option<JobPlan>;
}

/// Why a plugin call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The plugin answered with an error of its own (a refusal with a reason).
    #[error("{engine} plugin refused: {reason}")]
    Refused {
        /// Engine name.
        engine: String,
        /// The plugin's reason.
        reason: String,
    },
    /// The call ran past its deadline and was interrupted.
    #[error("{engine} plugin: {function} ran past its {timeout:?} deadline and was stopped")]
    Timeout {
        /// Engine name.
        engine: String,
        /// Exported function.
        function: &'static str,
        /// The deadline.
        timeout: Duration,
    },
    /// The call trapped (panic, out of memory, stack overflow, ...).
    #[error("{engine} plugin: {function} trapped: {message}")]
    Trap {
        /// Engine name.
        engine: String,
        /// Exported function.
        function: &'static str,
        /// What happened.
        message: String,
    },
    /// A log line was larger than the host copies out of the plugin in a call.
    #[error("{engine} plugin: {function} sent a log line of more than the {limit}-byte limit (copying it out was stopped there)")]
    LogTooLarge {
        /// Engine name.
        engine: String,
        /// Exported function.
        function: &'static str,
        /// The limit.
        limit: usize,
    },
    /// The result was larger than the host accepts.
    #[error("{engine} plugin: {function} returned more than the {limit}-byte limit (copying it out was stopped there)")]
    OutputTooLarge {
        /// Engine name.
        engine: String,
        /// Exported function.
        function: &'static str,
        /// The limit.
        limit: usize,
    },
    /// The result breaks host policy.
    #[error("{engine} plugin: {function} output breaks host policy: {}", join(.violations))]
    Policy {
        /// Engine name.
        engine: String,
        /// Exported function.
        function: &'static str,
        /// What is wrong.
        violations: Vec<Violation>,
    },
}

fn join(violations: &[Violation]) -> String {
    violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}
