//! PostgreSQL parameters: which ones users may set, their types, and the settings
//! derived from the Database's resources.

use plugdb_sdk::parameters::{Catalog, Kind};
use plugdb_sdk::{Parameter, ParameterValue};

const SIZE: Kind = Kind::WithUnit(&["kB", "MB", "GB", "TB"], "64MB");
const DURATION: Kind = Kind::WithUnit(&["us", "ms", "s", "min", "h", "d"], "30s");
const BOOL: Kind = Kind::Enum(&["on", "off", "true", "false"]);

/// What users may set, and what the plugin keeps because replication, networking or
/// paths depend on it.
pub const CATALOG: Catalog = Catalog {
    settable: &[
        ("archive_timeout", DURATION),
        ("checkpoint_completion_target", Kind::Real(0.0, 1.0)),
        ("checkpoint_timeout", DURATION),
        ("default_statistics_target", Kind::Int(1, 10_000)),
        ("effective_cache_size", SIZE),
        ("effective_io_concurrency", Kind::Int(0, 1000)),
        ("huge_pages", Kind::Enum(&["on", "off", "try"])),
        ("idle_in_transaction_session_timeout", DURATION),
        ("jit", BOOL),
        ("log_min_duration_statement", DURATION),
        ("log_statement", Kind::Enum(&["none", "ddl", "mod", "all"])),
        ("maintenance_work_mem", SIZE),
        ("max_connections", Kind::Int(1, 10_000)),
        ("max_parallel_workers", Kind::Int(0, 1024)),
        ("max_wal_size", SIZE),
        ("max_worker_processes", Kind::Int(0, 262_143)),
        ("min_wal_size", SIZE),
        ("random_page_cost", Kind::Real(0.0, 1_000_000.0)),
        ("shared_buffers", SIZE),
        ("statement_timeout", DURATION),
        ("synchronous_commit", Kind::Enum(&["on", "off", "local", "remote_write", "remote_apply"])),
        ("timezone", Kind::Text(64)),
        ("track_io_timing", BOOL),
        ("wal_buffers", SIZE),
        ("work_mem", SIZE),
    ],
    reserved: &[
        "listen_addresses",
        "port",
        "hba_file",
        "ident_file",
        "data_directory",
        "config_file",
        "wal_level",
        "wal_log_hints",
        "hot_standby",
        "max_wal_senders",
        "max_replication_slots",
        "primary_conninfo",
        "password_encryption",
        "unix_socket_directories",
    ],
};

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
        assert_eq!(CATALOG.check(&ok), vec![]);
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
        let fields: Vec<String> = CATALOG.check(&bad).into_iter().map(|v| v.field).collect();
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
