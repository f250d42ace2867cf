//! The `postgres` engine plugin: PostgreSQL 15 and 17 with streaming replication
//! (the majors Debian ships, so the ones proven on a real node; 16 is not offered).
//!
//! - Members run the official `postgres` image with a bootstrap script (a config file)
//!   that initialises the primary or clones a replica from the primary Service.
//! - Configuration: memory-derived settings, user parameters checked by name and
//!   type, pg_hba allowing only password (SCRAM) logins and replication.
//! - Backups are physical (`pg_basebackup`, compressed tar); restore unpacks one into
//!   an empty data volume.
//! - Point-in-time recovery: with an archive directory, the primary archives each
//!   finished WAL segment into it (`archive_command`, at least every `archive_timeout`,
//!   60 s unless set); a restore to a point in time unpacks the base backup, places the
//!   archived WAL beside it, and the first start replays it to that moment and ends
//!   recovery on a new timeline.
//! - Synchronous replication is quorum commit: `synchronous_standby_names = 'ANY n (*)'`,
//!   any `n` replicas as a primary starts; the agent names the replicas that confirm
//!   (the ready ones) and lowers it as the server runs (`ALTER SYSTEM`, reloaded,
//!   removed at the next start) when the host asks.
//! - Failover promotes the ready replica that has the most WAL on disk (it replays all
//!   of it before it leads).
//! - Minor upgrades roll members, replicas first; majors and downgrades are refused.

mod parameters;

use plugdb_sdk::*;

const VERSIONS: &[&str] = &["15", "17"];
const DEFAULT_VERSION: &str = "17";
const PORT: u16 = 5432;
const UID: u32 = 999;
/// WAL senders: the most members a Database may have (9) plus base backups in flight.
const WAL_SENDERS: u32 = 16;
const SUPERUSER_KEY: &str = "superuser-password";
const REPLICATION_KEY: &str = "replication-password";
/// The application's password: its user and database are both [`APPLICATION`].
const APPLICATION_KEY: &str = "app-password";
const APPLICATION: &str = "app";
/// The exporter's password: its user, [`MONITOR`], is a member of `pg_monitor` and
/// nothing else, and logs in over loopback alone.
const MONITOR_KEY: &str = "monitor-password";
const MONITOR: &str = "plugdb_monitor";
/// The community's exporter (prometheus-community/postgres_exporter), as it publishes it.
const EXPORTER_IMAGE: &str = "quay.io/prometheuscommunity/postgres-exporter:v0.17.1";
const EXPORTER_PORT: u16 = 9187;
const BOOTSTRAP: &str = include_str!("bootstrap.sh");

/// The engine; public so benchmarks can call its render natively.
pub struct Postgres;

fn image(version: &str) -> String {
    format!("docker.io/library/postgres:{version}")
}

fn pgdata(data_mount: &str) -> String {
    format!("{data_mount}/pgdata")
}

const DATA_MOUNT: &str = "/var/lib/postgresql/data";

/// Whether `version` names a supported major, alone (`17`) or with a minor (`17.2`).
fn supported(version: &str) -> bool {
    let mut parts = version.split('.');
    let major_ok = parts.next().is_some_and(|m| VERSIONS.contains(&m));
    let rest: Vec<&str> = parts.collect();
    major_ok && rest.len() <= 1 && rest.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

fn max_connections(spec: &DatabaseSpec) -> i64 {
    spec.parameters.iter().find(|p| p.name == "max_connections").and_then(parameter_integer).unwrap_or(100)
}

/// Where the archived WAL waits until the host ships it: written under a dot name, then
/// renamed, as the contract asks.
fn archive_command(dir: &str) -> String {
    format!("archive_command = 'cp %p {dir}/.%f && mv {dir}/.%f {dir}/%f'")
}

/// With TLS, libpq verifies the server's certificate and name on every connection a
/// member or Job makes (clones, replication, rewinds, base backups).
fn tls_env(spec: &DatabaseSpec) -> Vec<EnvVar> {
    match &spec.tls {
        Some(tls) => vec![env_value("PGSSLMODE", "verify-full"), env_value("PGSSLROOTCERT", tls.ca.clone())],
        None => vec![],
    }
}

fn postgresql_conf(spec: &DatabaseSpec, archive: Option<&str>) -> String {
    let memory = spec.limits.memory_bytes.or(spec.requests.memory_bytes);
    let mut lines = vec![
        "# Rendered by the plugdb postgres plugin; edit spec.parameters instead.".to_string(),
        "listen_addresses = '*'".into(),
        format!("port = {PORT}"),
        "password_encryption = 'scram-sha-256'".into(),
        "wal_level = replica".into(),
        "wal_log_hints = on".into(),
        "hot_standby = on".into(),
        // Fixed, not derived from the replica count: a scale must not change the
        // configuration (which would restart every member). Enough for the most members
        // a Database may have, plus base backups.
        format!("max_wal_senders = {WAL_SENDERS}"),
        format!("max_replication_slots = {WAL_SENDERS}"),
        "wal_keep_size = '512MB'".into(),
        // A replica whose stream a fence cut reconnects (to whichever member the read-write
        // Service selects) within a second.
        "wal_retrieve_retry_interval = '1s'".into(),
        // A replica whose primary's node was lost gives up on it within 20 s (not 60 s),
        // to follow the member promoted meanwhile: in synchronous mode the new primary's
        // commits wait for it.
        "wal_receiver_timeout = '20s'".into(),
        format!("max_connections = {}", max_connections(spec)),
        // The engine's log as one JSON object a line, for people and log collectors alike:
        // the collector writes its files through the links the bootstrap makes to its own
        // standard error, the container's log (never a file that fills the volume).
        "logging_collector = on".into(),
        "log_destination = 'jsonlog'".into(),
        // Beside the data directory, on the volume (relative to the data directory).
        "log_directory = '../log'".into(),
        "log_filename = 'postgres.log'".into(),
        "log_rotation_age = 0".into(),
        "log_rotation_size = 0".into(),
    ];
    if spec.synchronous_replicas > 0 {
        // Any n replicas: the primary changes with failovers, and members come and go.
        lines.push(format!("synchronous_standby_names = 'ANY {} (*)'", spec.synchronous_replicas));
    }
    if let Some(tls) = &spec.tls {
        lines.push("ssl = on".into());
        lines.push(format!("ssl_cert_file = '{}'", tls.certificate));
        lines.push(format!("ssl_key_file = '{}'", tls.key));
        lines.push(format!("ssl_ca_file = '{}'", tls.ca));
        lines.push("ssl_min_protocol_version = 'TLSv1.2'".into());
    }
    let user: Vec<&str> = spec.parameters.iter().map(|p| p.name.as_str()).collect();
    if let Some(dir) = archive {
        lines.push("archive_mode = on".into());
        lines.push(archive_command(dir));
        if !user.contains(&"archive_timeout") {
            lines.push("archive_timeout = '60s'".into());
        }
    }
    for (name, setting) in parameters::derived(memory, max_connections(spec)) {
        if !user.contains(&name) {
            lines.push(format!("{name} = '{setting}'"));
        }
    }
    for p in spec.parameters.iter().filter(|p| p.name != "max_connections") {
        lines.push(format!("{} = {}", p.name, parameters::conf_value(p)));
    }
    lines.join("\n") + "\n"
}

/// Password (SCRAM) logins and replication only; with TLS, network connections must use
/// it. The superuser logs in on the socket or from the member itself (its agent, over
/// loopback) and from nowhere else: the password a tenant may read from the credentials
/// Secret is no login over the network. The exporter's user logs in to database
/// `postgres` from the member itself alone.
fn pg_hba(spec: &DatabaseSpec) -> String {
    let host = if spec.tls.is_some() { "hostssl" } else { "host   " };
    format!(
        "# Rendered by the plugdb postgres plugin: password (SCRAM) logins and replication only{}.\n\
         # The superuser only on the socket and over loopback (the member's agent).\n\
         # TYPE  DATABASE     USER        ADDRESS       METHOD\n\
         local   all          all                       scram-sha-256\n\
         host    all          postgres    127.0.0.0/8   scram-sha-256\n\
         host    all          postgres    ::1/128       scram-sha-256\n\
         host    all          postgres    0.0.0.0/0     reject\n\
         host    all          postgres    ::/0          reject\n\
         host    postgres     {MONITOR} 127.0.0.0/8 scram-sha-256\n\
         host    all          {MONITOR} 0.0.0.0/0   reject\n\
         host    all          {MONITOR} ::/0        reject\n\
         {host} replication  replicator  0.0.0.0/0     scram-sha-256\n\
         {host} replication  replicator  ::/0          scram-sha-256\n\
         {host} all          all         0.0.0.0/0     scram-sha-256\n\
         {host} all          all         ::/0          scram-sha-256\n",
        if spec.tls.is_some() { ", over TLS" } else { "" }
    )
}

/// What the replication role may do beyond replicating: what `pg_rewind` reads from the
/// primary (the files of its data directory) and the checkpoint it asks for first, so
/// that a former primary rewinds without the superuser logging in over the network.
/// Granted on the primary as it starts and as it is promoted in place (`replicator.sql`).
const REPLICATOR_GRANTS: &str = "GRANT EXECUTE ON FUNCTION pg_catalog.pg_ls_dir(text, boolean, boolean) TO replicator;
GRANT EXECUTE ON FUNCTION pg_catalog.pg_stat_file(text, boolean) TO replicator;
GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text) TO replicator;
GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text, bigint, bigint, boolean) TO replicator;
GRANT pg_checkpoint TO replicator;
";

/// A PostgreSQL LSN (`16/B374D848`) as a number, for comparing replay positions.
fn parse_lsn(lsn: &str) -> Option<u64> {
    let (hi, lo) = lsn.trim().split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

/// The host's RFC 3339 UTC moment as `recovery_target_time` takes it at server start,
/// when zone abbreviations such as `Z` are not loaded yet: `2026-11-23 10:15:30.5+00`.
fn recovery_target_time(rfc3339: &str) -> String {
    let utc = rfc3339.strip_suffix('Z').map(|t| format!("{t}+00")).unwrap_or_else(|| rfc3339.to_string());
    utc.replacen('T', " ", 1)
}

/// `script`, run by `sh -c`, with the password under `key` of the mounted credentials
/// read first into shell variable `variable` (exported only where a script says so).
fn with_password(variable: &str, key: &str, script: &str) -> Vec<String> {
    shell(&format!("{}\n{script}", read_password(variable, key)))
}

fn job_env(spec: &DatabaseSpec, location: &BackupLocation) -> Vec<EnvVar> {
    let mut env = vec![
        env_value("BACKUP_DIR", location.directory.clone()),
        env_value("BACKUP_NAME", location.artifact.clone()),
        env_value("PGHOST", location.host.clone()),
        env_value("PGPORT", PORT.to_string()),
        env_value("PGDATA", pgdata(DATA_MOUNT)),
        env_credentials(),
        env_value("PLUGDB_DATABASE", format!("{}/{}", spec.namespace, spec.name)),
    ];
    env.extend(tls_env(spec));
    if let (Some(at), Some(dir)) = (&location.point_in_time, &location.archive_directory) {
        env.push(env_value("POINT_IN_TIME", recovery_target_time(at)));
        env.push(env_value("ARCHIVE_DIR", dir.clone()));
    }
    env
}

impl Engine for Postgres {
    fn info() -> PluginInfo {
        PluginInfo {
            engine: "postgres".into(),
            plugin_version: env!("CARGO_PKG_VERSION").into(),
            contract_version: CONTRACT_VERSION.into(),
            supported_versions: VERSIONS.iter().map(|v| v.to_string()).collect(),
            default_version: DEFAULT_VERSION.into(),
            default_port: PORT,
            capabilities: Capabilities::BACKUP
                | Capabilities::RESTORE
                | Capabilities::FAILOVER
                | Capabilities::ONLINE_UPGRADE
                | Capabilities::POINT_IN_TIME
                | Capabilities::TLS,
        }
    }

    fn validate(spec: DatabaseSpec) -> Vec<Violation> {
        let mut out = Vec::new();
        if !supported(&spec.version) {
            out.push(violation(
                "spec.version",
                format!(
                    "PostgreSQL {:?} is not supported; use one of {} (optionally with a minor, e.g. 17.2)",
                    spec.version,
                    VERSIONS.join(", ")
                ),
            ));
        }
        out.extend(check_memory(&spec, 256 << 20, "PostgreSQL"));
        out.extend(parameters::CATALOG.check(&spec.parameters));
        let durable = ["on", "remote_write", "remote_apply"];
        if let Some(p) = spec.parameters.iter().find(|p| p.name == "synchronous_commit")
            && spec.synchronous_replicas > 0
            && !durable.contains(&parameter_text(p).as_str())
        {
            out.push(violation(
                "spec.parameters.synchronous_commit",
                format!(
                    "{:?} acknowledges commits no replica has, which spec.replication.mode Synchronous forbids; use one of {}",
                    parameter_text(p),
                    durable.join(", ")
                ),
            ));
        }
        out
    }

    fn render(spec: DatabaseSpec, cluster: ClusterContext) -> Result<Workload, String> {
        let violations = Self::validate(spec.clone());
        if let Some(v) = violations.first() {
            return Err(format!("{}: {}", v.field, v.message));
        }
        let mut env = vec![
            env_value("PGDATA", pgdata(DATA_MOUNT)),
            env_value("PLUGDB_CONFIG_DIR", cluster.config_mount_path.clone()),
            env_field("POD_NAME", "metadata.name"),
            env_value("PRIMARY_POD", cluster.primary_pod.clone()),
            env_value("PRIMARY_HOST", cluster.primary_host.clone()),
            env_value("PRIMARY_PORT", PORT.to_string()),
            env_credentials(),
        ];
        env.extend(tls_env(&spec));
        Ok(Workload {
            image: image(&spec.version),
            command: vec!["sh".into(), format!("{}/bootstrap.sh", cluster.config_mount_path)],
            args: vec![],
            env,
            ports: vec![Port { name: "postgres".into(), port: PORT }],
            // Not ready 5-8 s into a hang (two looks 3 s apart that get no answer within
            // 2 s), which the failover delay then counts; a pause of 5 s is never two
            // such looks. Ready again 2-5 s after a restart in place. Over TCP: the agent
            // runs it, beside the engine.
            readiness: Some(Probe {
                action: ProbeAction::Exec(
                    ["pg_isready", "-q", "-h", "localhost", "-p", "5432", "-U", "postgres"].map(String::from).to_vec(),
                ),
                initial_delay_seconds: 2,
                period_seconds: 3,
                timeout_seconds: 2,
                failure_threshold: 2,
            }),
            // Alive while the server listens (refusing connections as it starts or
            // recovers counts), or while the bootstrap prepares the data directory: a
            // rewind or a clone cut short by a restart only begins again.
            liveness: Some(Probe {
                action: ProbeAction::Exec(shell(&format!(
                    "pg_isready -q -h 127.0.0.1 -p {PORT} -t 4; [ $? -le 1 ] || [ -n \"$(find {DATA_MOUNT}/preparing -mmin -1 2>/dev/null)\" ]"
                ))),
                initial_delay_seconds: 30,
                period_seconds: 10,
                timeout_seconds: 5,
                failure_threshold: 6,
            }),
            config_files: vec![
                ConfigFile { name: "postgresql.conf".into(), content: postgresql_conf(&spec, cluster.archive_directory.as_deref()) },
                ConfigFile { name: "pg_hba.conf".into(), content: pg_hba(&spec) },
                ConfigFile { name: "bootstrap.sh".into(), content: BOOTSTRAP.into() },
                ConfigFile { name: "replicator.sql".into(), content: REPLICATOR_GRANTS.into() },
            ],
            data_mount_path: DATA_MOUNT.into(),
            credentials: [SUPERUSER_KEY, REPLICATION_KEY, APPLICATION_KEY, MONITOR_KEY]
                .map(|key| Credential { key: key.into(), length: 32 })
                .to_vec(),
            recommended: ResourceAmounts { cpu_millis: Some(500), memory_bytes: Some(1 << 30) },
            run_as_user: UID,
            init_containers: vec![],
            member_query: None,
        })
    }

    fn plan_upgrade(spec: DatabaseSpec, from: String) -> Result<UpgradePlan, String> {
        if !supported(&spec.version) {
            return Err(format!("PostgreSQL {} is not supported by this plugin", spec.version));
        }
        let (Some(old), Some(new)) = (version_parts(&from), version_parts(&spec.version)) else {
            return Err(format!("cannot compare versions {from:?} and {:?}", spec.version));
        };
        if old == new {
            return Ok(UpgradePlan { steps: vec![], backup_first: false });
        }
        if new < old {
            return Err(format!(
                "downgrading PostgreSQL from {from} to {} is not possible: data files are not backward compatible",
                spec.version
            ));
        }
        if new[0] != old[0] {
            return Err(format!(
                "a major upgrade from PostgreSQL {} to {} needs pg_upgrade with both versions' binaries, which the official images do not ship; \
                 create a new Database with version {} and restoreFrom a backup of this one, or keep {}",
                old[0], new[0], new[0], from
            ));
        }
        Ok(UpgradePlan { steps: vec![UpgradeStep::RollingRestart], backup_first: true })
    }

    fn plan_scale(spec: DatabaseSpec, _from: u32, _members: Vec<Member>) -> Result<Vec<ScaleStep>, String> {
        // Members join and leave through replication alone: one step.
        Ok(vec![ScaleStep::Members(spec.replicas)])
    }

    fn choose_primary(spec: DatabaseSpec, members: Vec<Member>) -> FailoverDecision {
        if let Some(primary) = members.iter().find(|m| m.primary && m.ready) {
            return FailoverDecision::NoSafeMember(format!("{} is primary and ready; nothing to fail over", primary.pod));
        }
        // A ready replica that did not say how far it got may hold commits only it confirmed.
        if let Some(why) = silent_replicas_wait(&members, spec.synchronous_replicas, |p| parse_lsn(p).is_some()) {
            return FailoverDecision::NoSafeMember(why);
        }
        let best = members
            .iter()
            .filter(|m| m.ready && !m.primary)
            .filter_map(|m| Some((parse_lsn(m.position.as_deref()?)?, m)))
            .max_by(|(a, ma), (b, mb)| a.cmp(b).then(mb.ordinal.cmp(&ma.ordinal)));
        match best {
            Some((_, m)) => FailoverDecision::Promote(Promotion { pod: m.pod.clone(), command: shell("pg_ctl promote -w -D \"$PGDATA\"") }),
            None => FailoverDecision::NoSafeMember("no ready replica reports a replay position; promoting one could lose data".into()),
        }
    }

    fn backup(spec: DatabaseSpec, location: BackupLocation) -> Result<JobPlan, String> {
        Ok(JobPlan {
            image: image(&spec.version),
            command: with_password(
                "PGPASSWORD",
                REPLICATION_KEY,
                "set -eu; export PGPASSWORD; out=\"$BACKUP_DIR/$BACKUP_NAME\"; rm -rf \"$out.partial\"; \
                 pg_basebackup -U replicator -D \"$out.partial\" -Ft -z -X fetch --checkpoint=fast; mv \"$out.partial\" \"$out\"",
            ),
            env: job_env(&spec, &location),
            mounts_data: false,
        })
    }

    /// Member 0 only: the replicas clone the restored primary as they do any primary.
    fn restore(spec: DatabaseSpec, location: BackupLocation, member: u32) -> Result<Option<JobPlan>, String> {
        if member > 0 {
            return Ok(None);
        }
        Ok(Some(JobPlan {
            image: image(&spec.version),
            command: shell(
                "set -eu; src=\"$BACKUP_DIR/$BACKUP_NAME/base.tar.gz\"; \
                 test -f \"$src\" || { echo \"backup $src not found\" >&2; exit 1; }; \
                 if [ -s \"$PGDATA/PG_VERSION\" ]; then echo \"refusing to restore over the existing data directory $PGDATA\" >&2; exit 1; fi; \
                 mkdir -p \"$PGDATA\"; chmod 700 \"$PGDATA\"; tar -xzf \"$src\" -C \"$PGDATA\"; \
                 rm -f \"$PGDATA/standby.signal\" \"$PGDATA/postmaster.pid\"; touch \"$PGDATA/plugdb-restored\"; \
                 if [ -n \"${POINT_IN_TIME:-}\" ]; then \
                   pitr=\"$(dirname \"$PGDATA\")/plugdb-pitr\"; rm -rf \"$pitr\"; mkdir -p \"$pitr/wal\"; \
                   find \"$ARCHIVE_DIR\" -maxdepth 1 -type f -exec cp {} \"$pitr/wal/\" \\; ; \
                   printf '%s\\n' \"$POINT_IN_TIME\" > \"$pitr/target\"; touch \"$PGDATA/recovery.signal\"; \
                   echo \"restored $BACKUP_NAME with $(ls \"$pitr/wal\" | wc -l) archived WAL files to replay to $POINT_IN_TIME\"; \
                 fi",
            ),
            env: job_env(&spec, &location),
            mounts_data: true,
        }))
    }
}

/// What the member agent runs: the member's role and the WAL it has on disk (replica:
/// received and flushed, or replayed, whichever is further; it replays all of it before
/// it leads) or has written (primary), over TCP to the local server (what pg_hba
/// allows), in a second at most. Synchronous replication counts a commit once replicas
/// have flushed it: a failover must compare that, not what they have replayed yet.
/// A replica that has replayed nothing yet prints nothing: its position stays unknown.
/// A streaming replica adds its lag: 0 once it has replayed all it received, else how
/// old the last transaction it replayed is; one that does not stream knows no lag.
/// The agent's status, promote and synchronous commands run with `search_path` set to
/// `pg_catalog` as the session starts (a startup option wins over the role's settings):
/// functions a database user defines elsewhere (a `pg_is_in_recovery` of their own) never
/// answer for the server's. A second line says the engine's health (the host names an
/// anomaly from it): client connections of `max_connections`, how long the oldest open
/// transaction has run (the status's own aside), the oldest database's transaction-ID
/// age, and the WAL a replication slot keeps (0 with none).
const STATUS: &str = "PGPASSWORD=\"$POSTGRES_PASSWORD\" PGCONNECT_TIMEOUT=1 PGOPTIONS='-c search_path=pg_catalog' exec psql -h localhost -p 5432 -U postgres -d postgres -XAtq \
    -v ON_ERROR_STOP=1 -c \"SELECT CASE WHEN pg_is_in_recovery() THEN 'replica ' || greatest(pg_last_wal_replay_lsn(), pg_last_wal_receive_lsn()) || COALESCE(' ' || \
    CASE WHEN NOT EXISTS (SELECT FROM pg_stat_wal_receiver WHERE status = 'streaming') THEN NULL \
    WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN '0' \
    ELSE round(greatest(extract(epoch FROM now() - pg_last_xact_replay_timestamp()), 0)::numeric, 3)::text END, '') \
    ELSE 'primary ' || pg_current_wal_lsn() END\" \
    -c \"SELECT 'signals connections=' || (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend') || '/' || \
    current_setting('max_connections') || ' transaction=' || COALESCE((SELECT floor(extract(epoch FROM max(now() - xact_start)))::bigint \
    FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()), 0) || ' xid-age=' || \
    (SELECT max(age(datfrozenxid)) FROM pg_database) || ' held=' || COALESCE((SELECT max(pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() \
    THEN pg_last_wal_receive_lsn() ELSE pg_current_wal_lsn() END, restart_lsn))::bigint FROM pg_replication_slots), 0)\"";

/// The rules a fenced primary lets in: the superuser from the member's own addresses
/// (the agent, beside the engine in its pod) and replication (a switchover's member
/// catches up from it). Every other login is refused, whatever it would do once in.
fn fenced_hba(spec: &DatabaseSpec) -> [String; 3] {
    let host = if spec.tls.is_some() { "hostssl" } else { "host" };
    [
        "local all postgres scram-sha-256".into(),
        "host all postgres samehost scram-sha-256".into(),
        format!("{host} replication replicator all scram-sha-256"),
    ]
}

/// What the member agent runs to fence a primary, in one session (the agent gives it
/// 1.5 s). The server's pg_hba (a copy the start makes of the rendered one, so the fence
/// ends with the pod) is rewritten to [`fenced_hba`], new sessions start read-only
/// (`ALTER SYSTEM`, which the start also removes), and the server reloads both, in one
/// step that ends before it lets in another session; this session sees the reload once
/// that step has told every session. Then every other client session ends (an open
/// transaction with it), and once more a moment later (one let in before the reload may
/// have been logging in): none is left to turn the default off, and no new one gets in.
/// Every replica's stream ends too: a replica reconnects through the read-write Service,
/// to the member it selects, so that once another member is promoted none follows this
/// one any more (its shutdown, as it restarts, would write past the new primary's start).
/// A server that refuses connections takes no writes either.
fn fence(spec: &DatabaseSpec) -> String {
    let rules: Vec<String> = fenced_hba(spec).iter().map(|r| format!("(''{r}'')")).collect();
    let others = "FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND backend_type";
    format!(
        "export PGPASSWORD=\"$POSTGRES_PASSWORD\" PGCONNECT_TIMEOUT=1 PGOPTIONS='-c search_path=pg_catalog'
fence() {{
  psql -h localhost -p 5432 -U postgres -d postgres -XAtq -v ON_ERROR_STOP=1 2>&1 <<'SQL'
DO $fence$ BEGIN EXECUTE format('COPY (VALUES {rules}) TO %L', current_setting('hba_file')); END $fence$;
ALTER SYSTEM SET default_transaction_read_only = on;
SELECT pg_reload_conf() \\g /dev/null
SELECT pg_sleep(0.05) \\g /dev/null
DO $fence$ BEGIN IF current_setting('default_transaction_read_only') <> 'on' THEN RAISE EXCEPTION 'not reloaded yet'; END IF; END $fence$;
SELECT count(pg_terminate_backend(pid)) {others} IN ('client backend', 'walsender') \\g /dev/null
SELECT pg_sleep(0.1) \\g /dev/null
SELECT count(pg_terminate_backend(pid)) {others} = 'client backend' \\g /dev/null
SQL
}}
until said=$( fence ); do
  case \"$said\" in
    *'Connection refused'*) exit 0 ;;
    *'not reloaded yet'*) sleep 0.05 ;;
    *) echo \"$said\" >&2; exit 1 ;;
  esac
done",
        rules = rules.join(", ")
    )
}

/// What the member agent runs to promote a replica in place: recovery ends on a new
/// timeline (which the old primary rewinds onto when it restarts to follow) and the
/// server takes writes as it runs, with no restart. Done within three seconds, or the
/// member is promoted by its restart instead; one out of recovery already (an earlier ask
/// promoted it, and its answer was lost) leads as it is. Then the replication role is
/// given what a rewind reads (`replicator.sql`; a data directory made before it was may
/// not have it), committed here alone: no replica follows yet to confirm it.
const PROMOTE: &str = "export PGPASSWORD=\"$POSTGRES_PASSWORD\" PGCONNECT_TIMEOUT=1 PGOPTIONS='-c search_path=pg_catalog'
sql() { psql -h localhost -p 5432 -U postgres -d postgres -XAtq -v ON_ERROR_STOP=1 \"$@\"; }
[ \"$(sql -c 'SELECT CASE WHEN pg_is_in_recovery() THEN pg_promote(true, 3) ELSE true END')\" = t ] || exit 1
PGOPTIONS=\"$PGOPTIONS -c synchronous_commit=local\" sql -1 -f \"$PLUGDB_CONFIG_DIR/replicator.sql\" >/dev/null || true";

/// What the member agent runs to change how many replicas confirm each commit, and which
/// (their pods' names are their `application_name`s): as the server runs (`ALTER SYSTEM`,
/// reloaded; the start removes it, so the rendered setting returns with the next start).
/// An empty setting releases the commits waiting now. A standby, told too, has nothing to
/// do: the primary names those that confirm.
const SYNCHRONOUS: &str = "export PGPASSWORD=\"$POSTGRES_PASSWORD\" PGCONNECT_TIMEOUT=1 PGOPTIONS='-c search_path=pg_catalog'
n=\"$PLUGDB_SYNCHRONOUS_REPLICAS\" members=\"${PLUGDB_SYNCHRONOUS_MEMBERS:-}\"
case \"$members\" in *[!a-z0-9,-]*) echo \"not a list of members: $members\" >&2; exit 2 ;; '') of='*' ;; *) of=\"\\\"$(echo \"$members\" | sed 's/,/\", \"/g')\\\"\" ;; esac
case \"$n\" in 0) names='' ;; [1-9]) names=\"ANY $n ($of)\" ;; *) echo \"not a number of replicas: $n\" >&2; exit 2 ;; esac
sql() { psql -h localhost -p 5432 -U postgres -d postgres -XAtq -v ON_ERROR_STOP=1 \"$@\"; }
standby=$(sql -c 'SELECT pg_is_in_recovery()') || exit 1
[ \"$standby\" = f ] || exit 0
sql -c \"ALTER SYSTEM SET synchronous_standby_names = '$names'\" -c 'SELECT pg_reload_conf()' >/dev/null
until [ \"$(sql -c 'SHOW synchronous_standby_names')\" = \"$names\" ]; do sleep 0.05; done";

/// What the member agent runs to have a replica follow a newly promoted member: its
/// replication connection names that member (`ALTER SYSTEM`, which the start removes:
/// a restarted replica follows the read-write Service again), and the reload restarts
/// the WAL receiver at once, from where it was: a replica that was streaming from a
/// primary whose node was lost would hold on to it until `wal_receiver_timeout`. It
/// succeeds once the replica streams from that member (within 3 s, in the same session): one that cannot (it
/// holds what the member never had, past where its timeline forked) is restarted by the
/// host, and rewound. The address is checked to be a name (it is written into the
/// setting). A primary refuses.
const FOLLOW: &str = "export PGPASSWORD=\"$POSTGRES_PASSWORD\" PGCONNECT_TIMEOUT=1 PGOPTIONS='-c search_path=pg_catalog'
host=\"$PLUGDB_PRIMARY_HOST\"
case \"$host\" in ''|*[!a-z0-9.-]*) echo \"not a member's address: $host\" >&2; exit 2 ;; esac
passfile=\"$(dirname \"$PGDATA\")/replication.pgpass\"
conninfo=\"host=$host port=5432 user=replicator passfile=$passfile application_name=$POD_NAME connect_timeout=5\"
exec psql -h localhost -p 5432 -U postgres -d postgres -XAtq -v ON_ERROR_STOP=1 \\
  -c \"DO \\$follow\\$ BEGIN IF NOT pg_is_in_recovery() THEN RAISE EXCEPTION 'not a replica'; END IF; END \\$follow\\$\" \\
  -c \"ALTER SYSTEM SET primary_conninfo = '$conninfo'\" -c 'SELECT pg_reload_conf()' \\
  -c \"DO \\$follow\\$ BEGIN FOR i IN 1..30 LOOP \\
        IF EXISTS (SELECT FROM pg_stat_wal_receiver WHERE status = 'streaming' AND sender_host = '$host') THEN RETURN; END IF; \\
        PERFORM pg_sleep(0.1); END LOOP; \\
      RAISE EXCEPTION 'not streaming from $host'; END \\$follow\\$\" >/dev/null";

impl Agent for Postgres {
    fn status_command(_spec: DatabaseSpec) -> Vec<String> {
        with_password("POSTGRES_PASSWORD", SUPERUSER_KEY, STATUS)
    }

    fn fence_command(spec: DatabaseSpec) -> Vec<String> {
        with_password("POSTGRES_PASSWORD", SUPERUSER_KEY, &fence(&spec))
    }

    /// psql as the superuser, over TCP to the local server (what pg_hba allows).
    fn client_command(_spec: DatabaseSpec) -> Vec<String> {
        with_password(
            "POSTGRES_PASSWORD",
            SUPERUSER_KEY,
            "PGPASSWORD=\"$POSTGRES_PASSWORD\" exec psql -h localhost -p 5432 -U postgres -d postgres",
        )
    }

    fn promote_command(_spec: DatabaseSpec) -> Vec<String> {
        with_password("POSTGRES_PASSWORD", SUPERUSER_KEY, PROMOTE)
    }

    fn synchronous_command(spec: DatabaseSpec) -> Vec<String> {
        if spec.synchronous_replicas == 0 { Vec::new() } else { with_password("POSTGRES_PASSWORD", SUPERUSER_KEY, SYNCHRONOUS) }
    }

    fn follow_command(_spec: DatabaseSpec) -> Vec<String> {
        with_password("POSTGRES_PASSWORD", SUPERUSER_KEY, FOLLOW)
    }

    /// User `app`, owner of database `app`; the start makes both on the primary (see
    /// `bootstrap.sh`).
    fn application(_spec: DatabaseSpec) -> Option<ApplicationLogin> {
        Some(ApplicationLogin {
            user: APPLICATION.into(),
            database: APPLICATION.into(),
            password_key: APPLICATION_KEY.into(),
            scheme: "postgresql".into(),
        })
    }
}

/// postgres_exporter beside each member, as user [`MONITOR`] over loopback (what
/// pg_hba lets it do, and nothing more), under its own metric names (`pg_up`,
/// `pg_stat_database_*`, `pg_replication_*`), which the community's dashboards and rules use.
impl Metrics for Postgres {
    fn endpoint(_spec: DatabaseSpec, cluster: ClusterContext) -> Option<MetricsEndpoint> {
        Some(MetricsEndpoint {
            port: EXPORTER_PORT,
            path: "/metrics".into(),
            exporter: Some(Exporter {
                image: EXPORTER_IMAGE.into(),
                // With each database's transaction-ID age, which wraparound is measured by;
                // started again should it end (its container never ends: see kept_running).
                command: kept_running(&[
                    "/bin/postgres_exporter".into(),
                    format!("--web.listen-address=:{EXPORTER_PORT}"),
                    "--collector.database_wraparound".into(),
                ]),
                env: vec![
                    env_value("DATA_SOURCE_URI", format!("127.0.0.1:{PORT}/postgres?sslmode=disable")),
                    env_value("DATA_SOURCE_USER", MONITOR),
                    env_secret("DATA_SOURCE_PASS", &cluster.credentials_secret, MONITOR_KEY),
                ],
            }),
        })
    }
}

export_engine!(Postgres);

#[cfg(test)]
mod tests;
