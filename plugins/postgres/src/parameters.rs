//! PostgreSQL parameters: which ones users may set, their types, and the settings
//! derived from the Database's resources.

use plugdb_sdk::{Parameter, ParameterValue, Violation, parameter_field, violation};

/// The type of a user-settable parameter, as PostgreSQL checks it.
#[derive(Clone, Copy)]
enum Kind {
    /// Integer in an inclusive range.
    Int(i64, i64),
    /// Memory size: a number with kB, MB, GB or TB, or a plain integer (server's unit).
    Size,
    /// Duration: a number with ms, s, min, h or d, or a plain integer.
    Duration,
    /// Floating point in an inclusive range.
    Real(f64, f64),
    /// on/off.
    Bool,
    /// One of these words.
    Enum(&'static [&'static str]),
}

const PARAMETERS: &[(&str, Kind)] = &[
    ("checkpoint_completion_target", Kind::Real(0.0, 1.0)),
    ("checkpoint_timeout", Kind::Duration),
    ("default_statistics_target", Kind::Int(1, 10_000)),
    ("effective_cache_size", Kind::Size),
    ("effective_io_concurrency", Kind::Int(0, 1000)),
    ("huge_pages", Kind::Enum(&["on", "off", "try"])),
    ("idle_in_transaction_session_timeout", Kind::Duration),
    ("jit", Kind::Bool),
    ("log_min_duration_statement", Kind::Duration),
    ("log_statement", Kind::Enum(&["none", "ddl", "mod", "all"])),
    ("maintenance_work_mem", Kind::Size),
    ("max_connections", Kind::Int(1, 10_000)),
    ("max_parallel_workers", Kind::Int(0, 1024)),
    ("max_wal_size", Kind::Size),
    ("max_worker_processes", Kind::Int(0, 262_143)),
    ("min_wal_size", Kind::Size),
    ("random_page_cost", Kind::Real(0.0, 1_000_000.0)),
    ("shared_buffers", Kind::Size),
    ("statement_timeout", Kind::Duration),
    ("synchronous_commit", Kind::Enum(&["on", "off", "local", "remote_write", "remote_apply"])),
    ("track_io_timing", Kind::Bool),
    ("wal_buffers", Kind::Size),
    ("work_mem", Kind::Size),
];

/// Parameters the plugin owns because replication, networking or paths depend on them.
const RESERVED: &[&str] = &[
    "listen_addresses",
    "port",
    "hba_file",
    "ident_file",
    "data_directory",
    "config_file",
    "wal_level",
    "hot_standby",
    "max_wal_senders",
    "max_replication_slots",
    "primary_conninfo",
    "password_encryption",
    "unix_socket_directories",
];

fn valid(kind: Kind, text: &str, integer: Option<i64>) -> Result<(), String> {
    let with_unit = |units: &[&str]| {
        let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let unit = &text[digits.len()..];
        let number_ok = digits.trim().parse::<i64>().is_ok_and(|n| n >= -1);
        number_ok && (unit.is_empty() || units.contains(&unit))
    };
    match kind {
        Kind::Int(lo, hi) => match integer {
            Some(n) if (lo..=hi).contains(&n) => Ok(()),
            _ => Err(format!("must be an integer between {lo} and {hi}")),
        },
        Kind::Size if with_unit(&["kB", "MB", "GB", "TB"]) => Ok(()),
        Kind::Size => Err("must be a size such as 64MB, 1GB or 8192kB".into()),
        Kind::Duration if with_unit(&["us", "ms", "s", "min", "h", "d"]) => Ok(()),
        Kind::Duration => Err("must be a duration such as 500ms, 30s or 5min".into()),
        Kind::Real(lo, hi) => match text.parse::<f64>() {
            Ok(x) if (lo..=hi).contains(&x) => Ok(()),
            _ => Err(format!("must be a number between {lo} and {hi}")),
        },
        Kind::Bool if ["on", "off", "true", "false"].contains(&text) => Ok(()),
        Kind::Bool => Err("must be on or off".into()),
        Kind::Enum(words) if words.contains(&text) => Ok(()),
        Kind::Enum(words) => Err(format!("must be one of {}", words.join(", "))),
    }
}

/// Violations of the user's parameters: unknown names, reserved names, wrong types.
pub fn check(parameters: &[Parameter]) -> Vec<Violation> {
    let mut out = Vec::new();
    for p in parameters {
        let field = parameter_field(&p.name);
        if RESERVED.contains(&p.name.as_str()) {
            out.push(violation(field, "is managed by plugdb and cannot be set"));
            continue;
        }
        let Some((_, kind)) = PARAMETERS.iter().find(|(name, _)| *name == p.name) else {
            let known: Vec<&str> = PARAMETERS.iter().map(|(n, _)| *n).collect();
            out.push(violation(field, format!("unknown parameter; settable: {}", known.join(", "))));
            continue;
        };
        let (text, integer) = match &p.value {
            ParameterValue::Text(t) => (t.trim().to_string(), t.trim().parse().ok()),
            ParameterValue::Integer(n) => (n.to_string(), Some(*n)),
        };
        if let Err(message) = valid(*kind, &text, integer) {
            out.push(violation(field, format!("{text:?} {message}")));
        }
    }
    out
}

/// Settings derived from the memory available to a member, in MB, following the
/// usual guidance: shared_buffers a quarter, effective_cache_size three quarters,
/// maintenance_work_mem a sixteenth (at most 2 GB), work_mem a quarter split by connections.
pub fn derived(memory_bytes: Option<u64>, max_connections: i64) -> Vec<(&'static str, String)> {
    let mb = memory_bytes.map(|b| b / (1 << 20)).unwrap_or(512).max(128);
    let connections = max_connections.max(1) as u64;
    vec![
        ("shared_buffers", format!("{}MB", (mb / 4).max(16))),
        ("effective_cache_size", format!("{}MB", (mb * 3 / 4).max(32))),
        ("maintenance_work_mem", format!("{}MB", (mb / 16).clamp(16, 2048))),
        ("work_mem", format!("{}kB", (mb * 1024 / 4 / connections).clamp(64, 1 << 20))),
    ]
}

/// The value to write into postgresql.conf for a user parameter.
pub fn conf_value(p: &Parameter) -> String {
    match &p.value {
        ParameterValue::Integer(n) => n.to_string(),
        ParameterValue::Text(t) => format!("'{}'", t.trim().replace('\'', "''")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(name: &str, value: ParameterValue) -> Parameter {
        Parameter { name: name.into(), value }
    }

    #[test]
    fn accepts_known_parameters_of_the_right_type() {
        let ok = [
            param("max_connections", ParameterValue::Integer(200)),
            param("shared_buffers", ParameterValue::Text("1GB".into())),
            param("statement_timeout", ParameterValue::Text("30s".into())),
            param("jit", ParameterValue::Text("off".into())),
            param("random_page_cost", ParameterValue::Text("1.1".into())),
            param("log_statement", ParameterValue::Text("ddl".into())),
        ];
        assert_eq!(check(&ok), vec![]);
    }

    #[test]
    fn reports_each_bad_parameter_by_field() {
        let bad = [
            param("max_connections", ParameterValue::Text("lots".into())),
            param("shared_buffers", ParameterValue::Text("1 gigabyte".into())),
            param("port", ParameterValue::Integer(5433)),
            param("no_such_thing", ParameterValue::Integer(1)),
            param("log_statement", ParameterValue::Text("everything".into())),
        ];
        let fields: Vec<String> = check(&bad).into_iter().map(|v| v.field).collect();
        assert_eq!(
            fields,
            [
                "spec.parameters.max_connections",
                "spec.parameters.shared_buffers",
                "spec.parameters.port",
                "spec.parameters.no_such_thing",
                "spec.parameters.log_statement"
            ]
        );
    }

    #[test]
    fn memory_settings_follow_the_memory_limit() {
        let four_gib = derived(Some(4 << 30), 100);
        assert_eq!(four_gib[0], ("shared_buffers", "1024MB".to_string()));
        assert_eq!(four_gib[1], ("effective_cache_size", "3072MB".to_string()));
        assert_eq!(four_gib[2], ("maintenance_work_mem", "256MB".to_string()));
        assert_eq!(four_gib[3], ("work_mem", "10485kB".to_string()));
    }
}
