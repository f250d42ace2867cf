//! Helpers for the chores every engine repeats.

use crate::{EnvSource, EnvVar, LogLevel, Parameter, ParameterValue, SecretRef, Violation};

/// Logs a line through the host at `level`.
pub fn log(level: LogLevel, message: &str) {
    crate::host_log(level, message);
}

/// A violation of `field` with `message`.
pub fn violation(field: impl Into<String>, message: impl Into<String>) -> Violation {
    Violation { field: field.into(), message: message.into() }
}

/// The field path of a parameter, as users see it.
pub fn parameter_field(name: &str) -> String {
    format!("spec.parameters.{name}")
}

/// The parameter's value as text, whichever way the user wrote it.
pub fn parameter_text(parameter: &Parameter) -> String {
    match &parameter.value {
        ParameterValue::Text(text) => text.clone(),
        ParameterValue::Integer(n) => n.to_string(),
    }
}

/// The parameter's value as an integer, if it is one (or a string of digits).
pub fn parameter_integer(parameter: &Parameter) -> Option<i64> {
    match &parameter.value {
        ParameterValue::Integer(n) => Some(*n),
        ParameterValue::Text(text) => text.trim().parse().ok(),
    }
}

/// The leading major component of a version: `"16.4"` → `16`, `"10.11"` → `10`.
pub fn major_version(version: &str) -> Option<u32> {
    version.split('.').next()?.parse().ok()
}

/// A version as numeric components for ordering: `"10.11.9"` → `[10, 11, 9]`.
/// `None` when any component is not a number.
pub fn version_parts(version: &str) -> Option<Vec<u32>> {
    version.split('.').map(|p| p.parse().ok()).collect()
}

/// An environment variable with a literal value (never a password).
pub fn env_value(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar { name: name.into(), source: EnvSource::Value(value.into()) }
}

/// An environment variable read from `key` of the Database's credentials Secret `secret`.
pub fn env_secret(name: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar { name: name.into(), source: EnvSource::Secret(SecretRef { name: secret.into(), key: key.into() }) }
}

/// An environment variable from a Downward API field of the pod (`metadata.name`, ...).
pub fn env_field(name: &str, path: &str) -> EnvVar {
    EnvVar { name: name.into(), source: EnvSource::Field(path.into()) }
}

/// The argv that runs `script` with `sh -c`.
pub fn shell(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

/// A violation when the member memory the user set (limit, else request) is below
/// `minimum` bytes; `engine` names the engine in the message.
pub fn check_memory(spec: &crate::DatabaseSpec, minimum: u64, engine: &str) -> Option<Violation> {
    let memory = spec.limits.memory_bytes.or(spec.requests.memory_bytes)?;
    (memory < minimum).then(|| violation("spec.resources", format!("{engine} needs at least {}Mi of memory", minimum >> 20)))
}
