//! MariaDB parameters users may set, and those the plugin keeps.

use plugdb_sdk::parameters::{Catalog, Kind};

const SIZE: Kind = Kind::WithUnit(&["K", "M", "G"], "256M");
const SWITCH: Kind = Kind::Enum(&["ON", "OFF", "0", "1"]);

/// What users may set; networking, identity, binary logging and replication are the plugin's.
pub const CATALOG: Catalog = Catalog {
    settable: &[
        // The plugin's own: how often the primary closes its binary log for the archive.
        ("archive_timeout", Kind::WithUnit(&["s", "min", "h"], "60s")),
        ("binlog_expire_logs_seconds", Kind::Int(0, 8_553_600)),
        ("character_set_server", Kind::Enum(&["utf8mb4", "utf8mb3", "latin1", "ascii", "binary"])),
        ("collation_server", Kind::Text(64)),
        ("innodb_buffer_pool_size", SIZE),
        ("innodb_flush_log_at_trx_commit", Kind::Enum(&["0", "1", "2"])),
        ("innodb_log_file_size", SIZE),
        ("interactive_timeout", Kind::Int(1, 31_536_000)),
        ("long_query_time", Kind::Real(0.0, 31_536_000.0)),
        ("max_allowed_packet", SIZE),
        ("max_connections", Kind::Int(10, 100_000)),
        ("max_heap_table_size", SIZE),
        ("slow_query_log", SWITCH),
        ("sql_mode", Kind::Text(512)),
        ("sync_binlog", Kind::Int(0, 4_294_967_295)),
        ("table_open_cache", Kind::Int(1, 1_048_576)),
        ("thread_cache_size", Kind::Int(0, 16_384)),
        ("tmp_table_size", SIZE),
        ("wait_timeout", Kind::Int(1, 31_536_000)),
    ],
    reserved: &[
        "port",
        "bind-address",
        "bind_address",
        "datadir",
        "socket",
        "server-id",
        "server_id",
        "log-bin",
        "log_bin",
        "binlog_format",
        "gtid_strict_mode",
        "log_slave_updates",
        "read_only",
        "skip-networking",
        "skip_networking",
        "init_file",
    ],
};
