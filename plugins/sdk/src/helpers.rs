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

/// Where the host mounts the Database's credentials Secret in every member and Job:
/// one file per key, readable by the workload's group only (`cluster-context`'s
/// `credentials-secret` in the contract).
pub const CREDENTIALS_DIR: &str = "/etc/plugdb-credentials";

/// `PLUGDB_CREDENTIALS`, naming [`CREDENTIALS_DIR`] for the workload's scripts: they read
/// each password from its file (`$PLUGDB_CREDENTIALS/<key>`) when they need it, so that
/// none sits in the environment every process of the container inherits.
pub fn env_credentials() -> EnvVar {
    env_value("PLUGDB_CREDENTIALS", CREDENTIALS_DIR)
}

/// The line of shell that sets the (unexported) variable `variable` to the password
/// under `key` of the mounted credentials (see [`env_credentials`]), forking nothing.
pub fn read_password(variable: &str, key: &str) -> String {
    format!("IFS= read -r {variable} < \"$PLUGDB_CREDENTIALS/{key}\" || [ -n \"${variable}\" ]")
}

/// An environment variable read from `key` of the Database's credentials Secret `secret`.
/// Prefer the mounted file ([`env_credentials`]): an engine should need this only where it
/// can read a password nowhere else.
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

/// `argv` run again 5 s after each time it ends, under the image's `/bin/sh`, so that its
/// container never ends: a container that ended makes its pod not ready, and a helper
/// such as an exporter must never take its member out of its Services (or fail its
/// primary over). SIGTERM or SIGINT ends both at once.
pub fn kept_running(argv: &[String]) -> Vec<String> {
    const SCRIPT: &str = r#"trap 'kill $child $pause 2>/dev/null; exit 0' TERM INT
while :; do
  "$@" &
  child=$!
  wait $child
  echo "$1 ended ($?): started again in 5 s" >&2
  sleep 5 &
  pause=$!
  wait $pause
done"#;
    ["/bin/sh", "-c", SCRIPT, "kept-running"].into_iter().map(String::from).chain(argv.iter().cloned()).collect()
}

/// A violation when the member memory the user set (limit, else request) is below
/// `minimum` bytes; `engine` names the engine in the message.
pub fn check_memory(spec: &crate::DatabaseSpec, minimum: u64, engine: &str) -> Option<Violation> {
    let memory = spec.limits.memory_bytes.or(spec.requests.memory_bytes)?;
    (memory < minimum).then(|| violation("spec.resources", format!("{engine} needs at least {}Mi of memory", minimum >> 20)))
}

/// Why a failover must wait for the ready replicas among `members` whose agents gave
/// no position `known` reads (`None`: it need not). Under synchronous replication,
/// where every commit was confirmed by `synchronous` replicas, as many silent replicas
/// as that could be every one that confirmed the last commits: promoting another could
/// lose them; fewer cannot, since one that answered confirmed each commit too, and the
/// furthest of those has it. Under asynchronous replication (`synchronous` 0) a commit
/// may be on the primary alone however far the replicas got, and a silent replica
/// never holds the failover back: the furthest of those that answered is promoted (as
/// peers do: a replica that does not answer is no candidate).
pub fn silent_replicas_wait(members: &[crate::Member], synchronous: u32, known: impl Fn(&str) -> bool) -> Option<String> {
    let silent: Vec<&str> =
        members.iter().filter(|m| m.ready && !m.primary && !m.position.as_deref().is_some_and(&known)).map(|m| m.pod.as_str()).collect();
    (synchronous > 0 && silent.len() >= synchronous as usize).then(|| {
        format!(
            "{} {} ready but {} position is unknown (its agent gave no answer), and each commit waited for {synchronous} replica{}: \
             promoting another could lose what only {} confirmed",
            silent.join(", "),
            if silent.len() == 1 { "is" } else { "are" },
            if silent.len() == 1 { "its" } else { "their" },
            if synchronous == 1 { "" } else { "s" },
            if silent.len() == 1 { "it" } else { "they" },
        )
    })
}
