//! The host's policy on plugin output. A plugin decides what the engine needs; this
//! decides whether the host will turn it into objects. The contract cannot express
//! privileged containers, host paths, host networking or capabilities at all; what
//! it can express is bounded and checked here.

use super::types::*;

const MAX_IMAGE: usize = 256;
const MAX_ARGV: usize = 64;
const MAX_ARG: usize = 32 << 10;
const MAX_ENV: usize = 64;
const MAX_PORTS: usize = 8;
const MAX_CONFIG_BYTES: usize = 512 << 10;
const MAX_CREDENTIALS: usize = 16;
/// Downward API fields a plugin may read.
const ALLOWED_FIELDS: &[&str] = &["metadata.name", "metadata.namespace", "status.podIP", "spec.nodeName", "spec.serviceAccountName"];
/// Paths a data volume must never shadow.
const RESERVED_PATHS: &[&str] = &["/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/lib", "/usr", "/var/run/secrets"];

struct Report(Vec<Violation>);

impl Report {
    fn check(&mut self, ok: bool, field: impl Into<String>, message: impl Into<String>) {
        if !ok {
            self.0.push(Violation { field: field.into(), message: message.into() });
        }
    }
}

fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 128
}

fn is_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn is_port_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().any(|b| b.is_ascii_lowercase())
}

fn under(path: &str, root: &str) -> bool {
    path == root || path.strip_prefix(root).is_some_and(|rest| rest.starts_with('/'))
}

fn check_image(r: &mut Report, field: &str, image: &str) {
    r.check(!image.is_empty() && image.len() <= MAX_IMAGE, field, format!("must be 1-{MAX_IMAGE} bytes"));
    r.check(!image.chars().any(|c| c.is_whitespace() || c.is_control()), field, "must not contain whitespace");
}

fn check_argv(r: &mut Report, field: &str, argv: &[String]) {
    r.check(argv.len() <= MAX_ARGV, field, format!("at most {MAX_ARGV} items"));
    r.check(argv.iter().all(|a| a.len() <= MAX_ARG), field, format!("each item at most {MAX_ARG} bytes"));
}

fn check_env(r: &mut Report, env: &[EnvVar], credentials_secret: &str) {
    r.check(env.len() <= MAX_ENV, "env", format!("at most {MAX_ENV} variables"));
    for (i, var) in env.iter().enumerate() {
        let field = format!("env[{i}]");
        r.check(is_env_name(&var.name), &field, format!("{:?} is not a valid variable name", var.name));
        match &var.source {
            EnvSource::Value(v) => r.check(v.len() <= MAX_ARG, &field, format!("value at most {MAX_ARG} bytes")),
            EnvSource::Secret(s) => r.check(
                s.name == credentials_secret,
                &field,
                format!("may only read the Database's own Secret {credentials_secret:?}, not {:?}", s.name),
            ),
            EnvSource::Field(path) => {
                r.check(ALLOWED_FIELDS.contains(&path.as_str()), &field, format!("field {path:?} is not one of {ALLOWED_FIELDS:?}"))
            }
        }
    }
}

fn check_probe(r: &mut Report, field: &str, probe: &Option<Probe>) {
    let Some(p) = probe else { return };
    match &p.action {
        ProbeAction::Exec(cmd) => {
            r.check(!cmd.is_empty(), field, "exec probe needs a command");
            check_argv(r, field, cmd);
        }
        ProbeAction::TcpSocket(port) => r.check(*port != 0, field, "tcp probe port must not be 0"),
    }
    r.check((1..=3600).contains(&p.period_seconds), field, "periodSeconds must be 1-3600");
    r.check((1..=600).contains(&p.timeout_seconds), field, "timeoutSeconds must be 1-600");
    r.check((1..=100).contains(&p.failure_threshold), field, "failureThreshold must be 1-100");
    r.check(p.initial_delay_seconds <= 3600, field, "initialDelaySeconds must be at most 3600");
}

/// Violations of host policy in a rendered workload; empty when it may be applied.
pub fn check_workload(w: &Workload, cluster: &ClusterContext) -> Vec<Violation> {
    let mut r = Report(Vec::new());
    check_image(&mut r, "image", &w.image);
    check_argv(&mut r, "command", &w.command);
    check_argv(&mut r, "args", &w.args);
    check_env(&mut r, &w.env, &cluster.credentials_secret);
    r.check(!w.ports.is_empty() && w.ports.len() <= MAX_PORTS, "ports", format!("1-{MAX_PORTS} ports"));
    for (i, p) in w.ports.iter().enumerate() {
        r.check(is_port_name(&p.name), format!("ports[{i}].name"), format!("{:?} must be 1-15 characters of [a-z0-9-]", p.name));
        r.check(p.port != 0, format!("ports[{i}].port"), "must not be 0");
    }
    check_probe(&mut r, "readiness", &w.readiness);
    check_probe(&mut r, "liveness", &w.liveness);
    let total: usize = w.config_files.iter().map(|f| f.name.len() + f.content.len()).sum();
    r.check(total <= MAX_CONFIG_BYTES, "configFiles", format!("{total} bytes in all, over {MAX_CONFIG_BYTES}"));
    for (i, f) in w.config_files.iter().enumerate() {
        r.check(
            is_file_name(&f.name),
            format!("configFiles[{i}].name"),
            format!("{:?} must be a plain file name of [A-Za-z0-9._-]", f.name),
        );
        r.check(
            !w.config_files[..i].iter().any(|g| g.name == f.name),
            format!("configFiles[{i}].name"),
            format!("{:?} appears twice", f.name),
        );
    }
    let data = w.data_mount_path.as_str();
    let path_ok = data.starts_with('/') && data.len() > 1 && !data.split('/').any(|s| s == ".." || s == ".");
    r.check(path_ok, "dataMountPath", format!("{data:?} must be an absolute path below /"));
    r.check(!RESERVED_PATHS.iter().any(|p| under(data, p)), "dataMountPath", format!("{data:?} would shadow a system directory"));
    r.check(
        !under(data, &cluster.config_mount_path) && !under(&cluster.config_mount_path, data),
        "dataMountPath",
        "must not overlap the config mount",
    );
    r.check(w.credentials.len() <= MAX_CREDENTIALS, "credentials", format!("at most {MAX_CREDENTIALS} keys"));
    for (i, c) in w.credentials.iter().enumerate() {
        r.check(is_file_name(&c.key), format!("credentials[{i}].key"), format!("{:?} must be of [A-Za-z0-9._-]", c.key));
        r.check((16..=128).contains(&c.length), format!("credentials[{i}].length"), "must be 16-128");
    }
    r.check(w.run_as_user != 0, "runAsUser", "containers never run as root (uid 0)");
    r.0
}

/// Violations of host policy in a Job plan.
pub fn check_job(job: &JobPlan, credentials_secret: &str) -> Vec<Violation> {
    let mut r = Report(Vec::new());
    check_image(&mut r, "image", &job.image);
    r.check(!job.command.is_empty(), "command", "a Job needs a command");
    check_argv(&mut r, "command", &job.command);
    check_env(&mut r, &job.env, credentials_secret);
    r.0
}
