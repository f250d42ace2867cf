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
const MAX_INIT_CONTAINERS: usize = 4;
const MAX_QUERY_BODY: usize = 4 << 10;
/// Downward API fields a plugin may read.
const ALLOWED_FIELDS: &[&str] = &["metadata.name", "metadata.namespace", "status.podIP", "spec.nodeName", "spec.serviceAccountName"];
/// Paths a data volume must never shadow (nor any parent of them).
const RESERVED_PATHS: &[&str] = &["/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/lib", "/usr", "/var/run/secrets", "/run/secrets"];
/// The largest uid the API server accepts.
const MAX_UID: u32 = i32::MAX as u32;
/// Violations reported one by one; the rest are counted.
pub const MAX_VIOLATIONS: usize = 20;
/// How much of a plugin-chosen string a message quotes.
const QUOTED: usize = 64;

/// A plugin-chosen string as a message shows it: quoted, and cut when long.
pub fn quoted(text: &str) -> String {
    if text.len() <= QUOTED {
        return format!("{text:?}");
    }
    let mut end = QUOTED;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &text[..end], text.len())
}

/// Violations, at most [`MAX_VIOLATIONS`] of them listed and the rest counted.
pub fn capped(mut violations: Vec<Violation>) -> Vec<Violation> {
    if violations.len() > MAX_VIOLATIONS {
        let more = violations.len() - MAX_VIOLATIONS;
        violations.truncate(MAX_VIOLATIONS);
        violations.push(Violation { field: "…".into(), message: format!("and {more} more") });
    }
    violations
}

struct Report(Vec<Violation>);

/// Records a violation unless `ok`; the field and message are only built for a
/// violation, so a passing check costs no allocation.
macro_rules! check {
    ($report:expr, $ok:expr, $field:expr, $message:expr $(,)?) => {
        if !$ok {
            $report.fail($field, $message);
        }
    };
}

impl Report {
    fn fail(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(Violation { field: field.into(), message: message.into() });
    }

    /// Every violation found: the caller caps the list once, with whatever it adds.
    fn done(self) -> Vec<Violation> {
        self.0
    }
}

/// A key of a ConfigMap or Secret, as the API server accepts it.
fn is_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && !key.starts_with("..")
        && key != "."
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// An absolute path in normal form: no empty, `.` or `..` segments, no trailing slash.
fn is_normal_path(path: &str) -> bool {
    path.len() > 1
        && path.len() <= 1024
        && path.starts_with('/')
        && path[1..].split('/').all(|s| !s.is_empty() && s != "." && s != "..")
        && !path.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 128
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
    check!(r, !image.is_empty() && image.len() <= MAX_IMAGE, field, format!("must be 1-{MAX_IMAGE} bytes, not {}", image.len()));
    check!(r, !image.chars().any(|c| c.is_whitespace() || c.is_control()), field, "must not contain whitespace");
}

fn check_argv(r: &mut Report, field: &str, argv: &[String]) {
    check!(r, argv.len() <= MAX_ARGV, field, format!("at most {MAX_ARGV} items"));
    check!(r, argv.iter().all(|a| a.len() <= MAX_ARG), field, format!("each item at most {MAX_ARG} bytes"));
}

fn check_env(r: &mut Report, env: &[EnvVar], credentials_secret: &str) {
    check!(r, env.len() <= MAX_ENV, "env", format!("at most {MAX_ENV} variables"));
    for (i, var) in env.iter().enumerate() {
        let field = || format!("env[{i}]");
        check!(r, is_env_name(&var.name), field(), format!("{} is not a valid variable name", quoted(&var.name)));
        match &var.source {
            EnvSource::Value(v) => check!(r, v.len() <= MAX_ARG, field(), format!("value at most {MAX_ARG} bytes")),
            EnvSource::Secret(s) => check!(
                r,
                s.name == credentials_secret,
                field(),
                format!("may only read the Database's own Secret {credentials_secret:?}, not {}", quoted(&s.name)),
            ),
            EnvSource::Field(path) => {
                check!(
                    r,
                    ALLOWED_FIELDS.contains(&path.as_str()),
                    field(),
                    format!("field {} is not one of {ALLOWED_FIELDS:?}", quoted(path))
                )
            }
        }
    }
}

/// An HTTP path a member is asked at: `/` first, at most 256 printable characters.
pub(crate) fn http_path_ok(path: &str) -> bool {
    path.starts_with('/') && path.len() <= 256 && path.bytes().all(|b| b.is_ascii_graphic())
}

fn check_probe(r: &mut Report, field: &str, probe: &Option<Probe>) {
    let Some(p) = probe else { return };
    match &p.action {
        ProbeAction::Exec(cmd) => {
            check!(r, !cmd.is_empty(), field, "exec probe needs a command");
            check_argv(r, field, cmd);
        }
        ProbeAction::TcpSocket(port) | ProbeAction::Grpc(port) => check!(r, *port != 0, field, "probe port must not be 0"),
        ProbeAction::HttpGet { path, port, .. } => {
            check!(r, *port != 0, field, "probe port must not be 0");
            check!(
                r,
                http_path_ok(path),
                field,
                format!("http probe path {} must start with / and be at most 256 printable characters", quoted(path))
            );
        }
    }
    check!(r, (1..=3600).contains(&p.period_seconds), field, "periodSeconds must be 1-3600");
    check!(r, (1..=600).contains(&p.timeout_seconds), field, "timeoutSeconds must be 1-600");
    check!(r, (1..=100).contains(&p.failure_threshold), field, "failureThreshold must be 1-100");
    check!(r, p.initial_delay_seconds <= 3600, field, "initialDelaySeconds must be at most 3600");
}

/// Violations of host policy in a rendered workload; empty when it may be applied.
pub fn check_workload(w: &Workload, cluster: &ClusterContext) -> Vec<Violation> {
    let mut r = Report(Vec::new());
    check_image(&mut r, "image", &w.image);
    check_argv(&mut r, "command", &w.command);
    check_argv(&mut r, "args", &w.args);
    check_argv(&mut r, "statusCommand", &w.status_command);
    check_argv(&mut r, "fenceCommand", &w.fence_command);
    check_argv(&mut r, "clientCommand", &w.client_command);
    check_argv(&mut r, "promoteCommand", &w.promote_command);
    check_argv(&mut r, "synchronousCommand", &w.synchronous_command);
    check_argv(&mut r, "followCommand", &w.follow_command);
    check!(r, w.ports.iter().all(|p| p.port != crate::agent::PORT), "ports", format!("port {} is the member agent's", crate::agent::PORT));
    check_env(&mut r, &w.env, &cluster.credentials_secret);
    check!(r, !w.ports.is_empty() && w.ports.len() <= MAX_PORTS, "ports", format!("1-{MAX_PORTS} ports"));
    for (i, p) in w.ports.iter().enumerate() {
        check!(r, is_port_name(&p.name), format!("ports[{i}].name"), format!("{} must be 1-15 characters of [a-z0-9-]", quoted(&p.name)));
        check!(r, p.port != 0, format!("ports[{i}].port"), "must not be 0");
    }
    check_probe(&mut r, "readiness", &w.readiness);
    check_probe(&mut r, "liveness", &w.liveness);
    if let Some(q) = &w.member_query {
        check!(r, q.port != 0, "memberQuery.port", "must not be 0");
        check!(
            r,
            http_path_ok(&q.path),
            "memberQuery.path",
            format!("{} must start with / and be at most 256 printable characters", quoted(&q.path))
        );
        let body = q.body.as_deref().unwrap_or_default();
        check!(r, body.len() <= MAX_QUERY_BODY, "memberQuery.body", format!("at most {MAX_QUERY_BODY} bytes, not {}", body.len()));
    }
    check!(r, w.init_containers.len() <= MAX_INIT_CONTAINERS, "initContainers", format!("at most {MAX_INIT_CONTAINERS}"));
    for (i, c) in w.init_containers.iter().enumerate() {
        let field = |f: &str| format!("initContainers[{i}].{f}");
        let name_ok = (1..=40).contains(&c.name.len())
            && c.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !c.name.starts_with('-')
            && !c.name.ends_with('-');
        check!(r, name_ok, field("name"), format!("{} must be 1-40 characters of [a-z0-9-]", quoted(&c.name)));
        check!(r, !w.init_containers[..i].iter().any(|d| d.name == c.name), field("name"), format!("{} appears twice", quoted(&c.name)));
        check_image(&mut r, &field("image"), &c.image);
        check!(r, !c.command.is_empty(), field("command"), "an init container needs a command");
        check_argv(&mut r, &field("command"), &c.command);
        let mut env = Report(Vec::new());
        check_env(&mut env, &c.env, &cluster.credentials_secret);
        r.0.extend(env.0.into_iter().map(|v| Violation { field: field(&v.field), ..v }));
    }
    let total: usize = w.config_files.iter().map(|f| f.name.len() + f.content.len()).sum();
    check!(r, total <= MAX_CONFIG_BYTES, "configFiles", format!("{total} bytes in all, over {MAX_CONFIG_BYTES}"));
    for (i, f) in w.config_files.iter().enumerate() {
        check!(
            r,
            is_key(&f.name),
            format!("configFiles[{i}].name"),
            format!("{} must be 1-253 characters of [A-Za-z0-9._-], not starting with \"..\"", quoted(&f.name)),
        );
        check!(
            r,
            !w.config_files[..i].iter().any(|g| g.name == f.name),
            format!("configFiles[{i}].name"),
            format!("{} appears twice", quoted(&f.name)),
        );
    }
    let data = w.data_mount_path.as_str();
    check!(
        r,
        is_normal_path(data),
        "dataMountPath",
        format!("{} must be a normalised absolute path below / (no //, . or ..)", quoted(data))
    );
    if let Some(reserved) = RESERVED_PATHS.iter().find(|p| under(data, p) || under(p, data)) {
        r.fail("dataMountPath", format!("{} would shadow {reserved}", quoted(data)));
    }
    check!(
        r,
        !under(data, &cluster.config_mount_path) && !under(&cluster.config_mount_path, data),
        "dataMountPath",
        "must not overlap the config mount",
    );
    if let Some(archive) = &cluster.archive_directory {
        check!(
            r,
            !under(data, archive) && !under(archive, data),
            "dataMountPath",
            format!("must not overlap the archive directory {archive}")
        );
    }
    check!(r, w.credentials.len() <= MAX_CREDENTIALS, "credentials", format!("at most {MAX_CREDENTIALS} keys"));
    for (i, c) in w.credentials.iter().enumerate() {
        check!(
            r,
            is_key(&c.key),
            format!("credentials[{i}].key"),
            format!("{} must be 1-253 characters of [A-Za-z0-9._-], not starting with \"..\"", quoted(&c.key)),
        );
        check!(r, (16..=128).contains(&c.length), format!("credentials[{i}].length"), "must be 16-128");
    }
    if let Some(login) = &w.application {
        check_application(&mut r, login, &w.credentials);
    }
    if let Some(metrics) = &w.metrics {
        check_metrics(&mut r, metrics, w, cluster);
    }
    check!(r, w.run_as_user != 0, "runAsUser", "containers never run as root (uid 0)");
    check!(r, w.run_as_user <= MAX_UID, "runAsUser", format!("{} is above the largest uid, {MAX_UID}", w.run_as_user));
    r.done()
}

/// The engine's metrics: a port of their own on the pod, an HTTP path, and an exporter
/// held to what an init container is (an image, a bounded argv, the Database's own
/// Secret alone).
fn check_metrics(r: &mut Report, m: &MetricsEndpoint, w: &Workload, cluster: &ClusterContext) {
    let agent = [crate::agent::PORT, crate::agent::metrics::PORT];
    let taken = m.port == 0 || agent.contains(&m.port) || w.ports.iter().any(|p| p.port == m.port);
    check!(r, !taken, "metrics.port", format!("port {} is 0, one of the member agent's {agent:?} or one of the engine's", m.port));
    check!(
        r,
        http_path_ok(&m.path),
        "metrics.path",
        format!("{} must start with / and be at most 256 printable characters", quoted(&m.path))
    );
    let Some(x) = &m.exporter else { return };
    check_image(r, "metrics.exporter.image", &x.image);
    check_argv(r, "metrics.exporter.command", &x.command);
    let mut env = Report(Vec::new());
    check_env(&mut env, &x.env, &cluster.credentials_secret);
    r.0.extend(env.0.into_iter().map(|v| Violation { field: format!("metrics.exporter.{}", v.field), ..v }));
}

/// The application's login goes into a Secret and a URI: names clients can type, and a
/// password the host generated.
fn check_application(r: &mut Report, login: &ApplicationLogin, credentials: &[Credential]) {
    let identifier = |s: &str| {
        (1..=32).contains(&s.len())
            && s.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    for (field, value) in [("application.user", &login.user), ("application.database", &login.database)] {
        check!(r, identifier(value), field, format!("{} must be 1-32 characters of [a-z0-9_], not starting with a digit", quoted(value)));
    }
    check!(
        r,
        credentials.iter().any(|c| c.key == login.password_key),
        "application.passwordKey",
        format!("{} is not one of the credentials", quoted(&login.password_key))
    );
    let scheme = login.scheme.as_bytes();
    let scheme_ok = (1..=32).contains(&scheme.len())
        && scheme[0].is_ascii_lowercase()
        && scheme.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+.-".contains(b));
    check!(
        r,
        scheme_ok,
        "application.scheme",
        format!("{} must be 1-32 characters of [a-z0-9+.-], starting with a letter", quoted(&login.scheme))
    );
}

/// Violations of host policy in a Job plan.
pub fn check_job(job: &JobPlan, credentials_secret: &str) -> Vec<Violation> {
    let mut r = Report(Vec::new());
    check_image(&mut r, "image", &job.image);
    check!(r, !job.command.is_empty(), "command", "a Job needs a command");
    check_argv(&mut r, "command", &job.command);
    check_env(&mut r, &job.env, credentials_secret);
    r.done()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn workload() -> Workload {
        Workload {
            image: "docker.io/library/postgres:17".into(),
            command: vec![],
            args: vec![],
            env: vec![],
            ports: vec![Port { name: "postgres".into(), port: 5432 }],
            readiness: None,
            liveness: None,
            config_files: vec![ConfigFile { name: "postgresql.conf".into(), content: String::new() }],
            data_mount_path: "/var/lib/postgresql/data".into(),
            credentials: vec![],
            recommended: ResourceAmounts::default(),
            run_as_user: 999,
            init_containers: vec![],
            member_query: None,
            status_command: vec![],
            fence_command: vec![],
            client_command: vec![],
            promote_command: vec![],
            synchronous_command: vec![],
            follow_command: vec![],
            application: None,
            metrics: None,
        }
    }

    fn cluster() -> ClusterContext {
        ClusterContext {
            primary_host: "orders.default.svc".into(),
            headless_host: "orders-headless.default.svc".into(),
            primary_pod: "orders-0".into(),
            credentials_secret: "orders-credentials".into(),
            config_mount_path: "/etc/plugdb".into(),
            archive_directory: None,
            restoring: false,
        }
    }

    fn fields(w: &Workload) -> Vec<String> {
        check_workload(w, &cluster()).into_iter().map(|v| format!("{}: {}", v.field, v.message)).collect()
    }

    #[test]
    fn a_good_workload_passes() {
        assert!(fields(&workload()).is_empty(), "{:?}", fields(&workload()));
    }

    #[test]
    fn mount_paths_are_compared_as_paths_and_parents_of_reserved_paths_refused() {
        for path in ["//etc", "//proc", "//var/run/secrets", "/run/secrets", "/var/lib//data", "/data/", "/data/./x", "/", "/var", "/run"] {
            let problems = fields(&Workload { data_mount_path: path.into(), ..workload() });
            assert!(problems.iter().any(|p| p.starts_with("dataMountPath")), "{path:?} passed");
        }
        let problems = fields(&Workload { data_mount_path: "/var".into(), ..workload() });
        assert!(problems.iter().any(|p| p.contains("would shadow /var/run/secrets")), "{problems:?}");
    }

    #[test]
    fn init_containers_are_held_to_the_engines_rules_and_named_in_each_violation() {
        let init = |name: &str, image: &str, secret: &str| InitContainer {
            name: name.into(),
            image: image.into(),
            command: vec!["prepare".into()],
            env: vec![EnvVar { name: "P".into(), source: EnvSource::Secret(SecretRef { name: secret.into(), key: "k".into() }) }],
        };
        let good = Workload { init_containers: vec![init("prepare", "busybox:1", "orders-credentials")], ..workload() };
        assert!(fields(&good).is_empty(), "{:?}", fields(&good));
        let bad = Workload {
            init_containers: vec![init("Prepare", "busy box", "someone-elses"), init("ok", "busybox:1", "orders-credentials")],
            ..workload()
        };
        let problems = fields(&bad);
        for field in ["initContainers[0].name", "initContainers[0].image", "initContainers[0].env[0]"] {
            assert!(problems.iter().any(|p| p.starts_with(field)), "{field}: {problems:?}");
        }
        assert!(!problems.iter().any(|p| p.starts_with("initContainers[1]")), "{problems:?}");
        let many = Workload {
            init_containers: (0..5).map(|i| init(&format!("step-{i}"), "busybox:1", "orders-credentials")).collect(),
            ..workload()
        };
        assert!(fields(&many).iter().any(|p| p.starts_with("initContainers: at most 4")), "{:?}", fields(&many));
    }

    #[test]
    fn the_data_volume_may_not_cover_the_archive() {
        let archived = ClusterContext { archive_directory: Some("/plugdb/archive".into()), ..cluster() };
        for path in ["/plugdb", "/plugdb/archive/data"] {
            let problems: Vec<String> = check_workload(&Workload { data_mount_path: path.into(), ..workload() }, &archived)
                .into_iter()
                .map(|v| format!("{}: {}", v.field, v.message))
                .collect();
            assert!(problems.iter().any(|p| p.contains("archive directory")), "{path}: {problems:?}");
        }
    }

    #[test]
    fn keys_and_ids_are_held_to_the_api_servers_rules() {
        let w = Workload { config_files: vec![ConfigFile { name: "..data".into(), content: String::new() }], ..workload() };
        assert!(fields(&w).iter().any(|p| p.starts_with("configFiles[0].name")), "{:?}", fields(&w));
        let w = Workload { run_as_user: u32::MAX, ..workload() };
        assert!(fields(&w).iter().any(|p| p.contains("above the largest uid")), "{:?}", fields(&w));
    }

    #[test]
    fn violation_lists_and_quoted_strings_are_capped() {
        let ports = (0..20_000).map(|i| Port { name: format!("BAD_{i}"), port: 1 }).collect();
        let mut problems = check_workload(&Workload { ports, ..workload() }, &cluster());
        problems.push(Violation { field: "memberQuery".into(), message: "one found after the workload's".into() });
        let problems = capped(problems);
        assert_eq!(problems.len(), MAX_VIOLATIONS + 1);
        assert_eq!(problems.last().map(|v| v.message.as_str()), Some("and 19982 more"), "every violation past the cap is counted");
        let long = "x".repeat(100_000);
        let problems = fields(&Workload { env: vec![EnvVar { name: long, source: EnvSource::Value(String::new()) }], ..workload() });
        assert!(problems.iter().all(|p| p.len() < 200), "{problems:?}");
    }
}
