//! The `mysql` engine plugin: MariaDB 10.11 and 11.8 with GTID replication (the LTS
//! series Debian ships, so the ones proven on a real node).
//! (MySQL Community images are not supported by this plugin: their GTID and
//! replication syntax differ.)
//!
//! - Members run the official `mariadb` image with a bootstrap script (a config file)
//!   that initialises the data directory, keeps accounts in step with the credentials
//!   Secret, and clones a fresh replica from the primary Service before starting
//!   GTID replication (`MASTER_USE_GTID=slave_pos`).
//! - Backups are logical (`mariadb-dump --all-databases`, gzip, with the GTID position
//!   they reach); a restore loads one into the new primary and re-applies the new
//!   Database's passwords.
//! - Point-in-time recovery: with an archive directory, the primary hands each closed
//!   binary log to the archiver, and closes the current one at least every
//!   `archive_timeout` (60 s unless set) while transactions arrive. A restore to a point
//!   in time loads the dump, then replays the archived logs from the dump's GTID
//!   position up to that moment; transactions that several members' logs repeat (after
//!   a failover) apply once. Binary-log times have one-second resolution: what was
//!   logged in the second of the moment is not replayed.
//! - Synchronous replication is semi-synchronous, waiting after sync: the primary
//!   acknowledges a commit once a replica has it in its relay log (MariaDB waits for one
//!   replica, never more); the agent turns it off and on as the server runs. A replica
//!   applies all it received before it is promoted, or before it stops.
//! - Failover promotes the ready replica whose received GTID position covers all others,
//!   in place: its agent opens it to writes once it applied all it received, without a
//!   restart, and the other replicas' agents have them follow it.
//! - Minor upgrades roll members; so does a major upgrade to the next LTS, each member's
//!   start bringing its system tables up to date (`mariadb-upgrade`, over the socket);
//!   skipping an LTS and downgrades are refused.
//! - Root logs in on the socket and over loopback alone (the member's agent), and over
//!   the network only while a backup is restored into the Database; replicas clone and
//!   backups dump as the replication role.

mod parameters;

use std::collections::BTreeMap;

use plugdb_sdk::*;

const VERSIONS: &[&str] = &["10.11", "11.8"];
const DEFAULT_VERSION: &str = "11.8";
const PORT: u16 = 3306;
const UID: u32 = 999;
const ROOT_KEY: &str = "root-password";
const REPLICATION_KEY: &str = "replication-password";
/// The application's password: its user and database are both [`APPLICATION`].
const APPLICATION_KEY: &str = "app-password";
const APPLICATION: &str = "app";
/// The exporter's password: its user is `plugdb_monitor`, from the member itself alone
/// (see `accounts.sh`).
const MONITOR_KEY: &str = "monitor-password";
/// The community's exporter (prometheus/mysqld_exporter), as it publishes it.
const EXPORTER_IMAGE: &str = "quay.io/prometheus/mysqld-exporter:v0.17.2";
const EXPORTER_PORT: u16 = 9104;
const DATA_MOUNT: &str = "/var/lib/mysql";
const BOOTSTRAP: &str = include_str!("bootstrap.sh");
/// The members' accounts (`accounts_sql`), which the bootstrap and the restore keep.
const ACCOUNTS: &str = include_str!("accounts.sh");
const RESTORE: &str = include_str!("restore.sh");
/// A plugin setting, not a server variable: how often the primary closes its binary log
/// for the archive while transactions arrive.
const ARCHIVE_TIMEOUT: &str = "archive_timeout";

struct Mysql;

fn image(version: &str) -> String {
    format!("docker.io/library/mariadb:{version}")
}

/// The LTS series of `version` (`10.11.9` → `10.11`), when supported.
fn series(version: &str) -> Option<&'static str> {
    let parts = version_parts(version)?;
    let series = VERSIONS.iter().find(|s| version_parts(s).is_some_and(|p| parts.len() >= 2 && parts[..2] == p[..]))?;
    (parts.len() <= 3).then_some(*series)
}

fn my_cnf(spec: &DatabaseSpec) -> String {
    let memory = spec.limits.memory_bytes.or(spec.requests.memory_bytes).unwrap_or(1 << 30);
    let mut settings: BTreeMap<String, String> = BTreeMap::new();
    settings.insert("innodb_buffer_pool_size".into(), format!("{}M", (memory / (1 << 20) / 2).max(64)));
    settings.insert("max_connections".into(), "151".into());
    for p in spec.parameters.iter().filter(|p| p.name != ARCHIVE_TIMEOUT) {
        settings.insert(p.name.clone(), parameter_text(p));
    }
    let mut lines = vec![
        "# Rendered by the plugdb mysql plugin; edit spec.parameters instead.".to_string(),
        "[mysqld]".into(),
        format!("port = {PORT}"),
        "bind-address = 0.0.0.0".into(),
        "skip-name-resolve".into(),
        "log-bin = mysql-bin".into(),
        "binlog_format = ROW".into(),
        "log_slave_updates = ON".into(),
        "gtid_strict_mode = ON".into(),
        "character_set_server = utf8mb4".into(),
        // A replica whose primary's node was lost gives up on it within 6 s (not 60 s),
        // and on a connection to it that does not complete as soon, and reconnects every
        // 2 s to whichever member the read-write Service selects by then: one its agent
        // did not have follow a promoted member (`follow_command`) finds it so. The
        // primary's heartbeat (every 3 s, half of this) keeps an idle stream up.
        "slave_net_timeout = 6".into(),
    ];
    if let Some(tls) = &spec.tls {
        lines.push(format!("ssl_cert = {}", tls.certificate));
        lines.push(format!("ssl_key = {}", tls.key));
        lines.push(format!("ssl_ca = {}", tls.ca));
        // Connections over the socket count as secure; every network one needs TLS.
        lines.push("require_secure_transport = ON".into());
    }
    if spec.synchronous_replicas > 0 {
        // Every member: any of them may lead next. Commits wait for a replica however long
        // (the host turns it off when the user allows it, see SYNCHRONOUS). Waiting is
        // turned on by the primary's start alone (`SEMI_SYNC`): a replica applying what it
        // receives logs it too, and would wait for replicas of its own, which it has none of.
        lines.push("rpl_semi_sync_slave_enabled = ON".into());
        lines.push("rpl_semi_sync_master_wait_point = AFTER_SYNC".into());
        lines.push("rpl_semi_sync_master_wait_no_slave = ON".into());
        lines.push(format!("rpl_semi_sync_master_timeout = {}", u32::MAX));
        // A replica's stream ends (a follow, a promotion) once it has asked its primary to
        // end it there, for a second at most: a lost primary never answers (5 s unless set).
        lines.push("rpl_semi_sync_slave_kill_conn_timeout = 1".into());
    }
    lines.extend(settings.iter().map(|(k, v)| format!("{k} = {v}")));
    lines.join("\n") + "\n"
}

/// With TLS: `CLIENT_TLS`, the options every network client of a member or Job adds
/// (verify the server against the Database's authority, and its name), and
/// `REPLICATION_TLS`, the same for a replica's connection to the primary.
fn tls_env(spec: &DatabaseSpec) -> Vec<EnvVar> {
    let Some(tls) = &spec.tls else { return vec![] };
    vec![
        env_value("CLIENT_TLS", format!("--ssl-ca={} --ssl-verify-server-cert", tls.ca)),
        env_value("REPLICATION_TLS", format!("MASTER_SSL=1, MASTER_SSL_CA='{}', MASTER_SSL_VERIFY_SERVER_CERT=1", tls.ca)),
    ]
}

/// A GTID position (`0-1-42,1-2-7`) as sequence numbers by replication domain.
fn parse_gtid(position: &str) -> Option<BTreeMap<u32, u64>> {
    let mut out = BTreeMap::new();
    for gtid in position.split(',').map(str::trim).filter(|g| !g.is_empty()) {
        let mut parts = gtid.split('-');
        let (domain, _server, seq) = (parts.next()?.parse().ok()?, parts.next()?.parse::<u32>().ok()?, parts.next()?.parse().ok()?);
        if parts.next().is_some() {
            return None;
        }
        out.insert(domain, seq);
    }
    Some(out)
}

/// Whether position `a` has applied everything `b` has, in every domain.
fn covers(a: &BTreeMap<u32, u64>, b: &BTreeMap<u32, u64>) -> bool {
    b.iter().all(|(domain, seq)| a.get(domain).is_some_and(|s| s >= seq))
}

/// `archive_timeout` in seconds (`90`, `90s`, `2min`, `1h`; the catalogue checked the
/// form), at least 1; 60 unless set.
fn archive_timeout(spec: &DatabaseSpec) -> u64 {
    let Some(p) = spec.parameters.iter().find(|p| p.name == ARCHIVE_TIMEOUT) else { return 60 };
    let text = parameter_text(p);
    let digits = text.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = match &text[digits.len()..] {
        "min" => 60,
        "h" => 3600,
        _ => 1,
    };
    (digits.parse::<u64>().unwrap_or(60) * unit).max(1)
}

/// The host's RFC 3339 UTC moment as `mariadb-binlog --stop-datetime` takes it (in UTC):
/// `2026-11-23T10:15:30.5Z` → `2026-11-23 10:15:30`. Binary-log times are whole seconds.
fn stop_datetime(rfc3339: &str) -> String {
    let utc = rfc3339.trim_end_matches('Z');
    let whole = utc.split_once('.').map_or(utc, |(seconds, _)| seconds);
    whole.replacen('T', " ", 1)
}

/// `script`, run by `sh -c`, with each password (shell variable, key of the mounted
/// credentials) read first.
fn with_passwords(passwords: &[(&str, &str)], script: &str) -> Vec<String> {
    let read: Vec<String> = passwords.iter().map(|(variable, key)| read_password(variable, key)).collect();
    shell(&format!("{}\n{script}", read.join("\n")))
}

/// `script` run by the member agent: root's password read, then [`CLIENT`].
fn as_root(script: &str) -> Vec<String> {
    with_passwords(&[("MARIADB_ROOT_PASSWORD", ROOT_KEY)], &[CLIENT, script].concat())
}

fn job_env(spec: &DatabaseSpec, location: &BackupLocation) -> Vec<EnvVar> {
    let mut env = vec![
        env_value("BACKUP_DIR", location.directory.clone()),
        env_value("BACKUP_NAME", location.artifact.clone()),
        env_value("DB_HOST", location.host.clone()),
        env_value("DB_PORT", PORT.to_string()),
        env_credentials(),
    ];
    env.extend(tls_env(spec));
    if let (Some(at), Some(dir)) = (&location.point_in_time, &location.archive_directory) {
        env.push(env_value("POINT_IN_TIME", stop_datetime(at)));
        env.push(env_value("ARCHIVE_DIR", dir.clone()));
    }
    env
}

impl Engine for Mysql {
    fn info() -> PluginInfo {
        PluginInfo {
            engine: "mysql".into(),
            plugin_version: env!("CARGO_PKG_VERSION").into(),
            contract_version: CONTRACT_VERSION.into(),
            supported_versions: VERSIONS.iter().map(|v| v.to_string()).collect(),
            default_version: DEFAULT_VERSION.into(),
            default_port: PORT,
            capabilities: Capabilities::BACKUP
                | Capabilities::RESTORE
                | Capabilities::FAILOVER
                | Capabilities::ONLINE_UPGRADE
                | Capabilities::MAJOR_UPGRADE
                | Capabilities::POINT_IN_TIME
                | Capabilities::TLS,
        }
    }

    fn validate(spec: DatabaseSpec) -> Vec<Violation> {
        let mut out = Vec::new();
        if series(&spec.version).is_none() {
            out.push(violation(
                "spec.version",
                format!(
                    "MariaDB {:?} is not supported; use one of {} (optionally with a patch, e.g. 11.8.6)",
                    spec.version,
                    VERSIONS.join(", ")
                ),
            ));
        }
        out.extend(check_memory(&spec, 256 << 20, "MariaDB"));
        if spec.synchronous_replicas > 1 {
            out.push(violation(
                "spec.replication.synchronousReplicas",
                format!("MariaDB's semi-synchronous replication waits for one replica, not {}; use 1", spec.synchronous_replicas),
            ));
        }
        out.extend(parameters::CATALOG.check(&spec.parameters));
        out
    }

    fn render(spec: DatabaseSpec, cluster: ClusterContext) -> Result<Workload, String> {
        if let Some(v) = Self::validate(spec.clone()).first() {
            return Err(format!("{}: {}", v.field, v.message));
        }
        let mut env = vec![
            env_value("DATADIR", format!("{DATA_MOUNT}/data")),
            env_value("PLUGDB_CONFIG_DIR", cluster.config_mount_path.clone()),
            env_value("MARIADB_SOCKET", "/run/mysqld/mysqld.sock"),
            env_field("POD_NAME", "metadata.name"),
            env_value("PRIMARY_POD", cluster.primary_pod.clone()),
            env_value("PRIMARY_HOST", cluster.primary_host.clone()),
            env_value("PRIMARY_PORT", PORT.to_string()),
            env_credentials(),
        ];
        env.extend(tls_env(&spec));
        if spec.synchronous_replicas > 0 {
            // The primary's start turns on waiting for a replica (see my_cnf).
            env.push(env_value("SEMI_SYNC", "ON"));
        }
        if let Some(dir) = &cluster.archive_directory {
            env.push(env_value("ARCHIVE_DIR", dir.clone()));
            env.push(env_value("ARCHIVE_TIMEOUT", archive_timeout(&spec).to_string()));
        }
        if cluster.restoring {
            // Root logs in over the network while the restore Job loads the backup (see
            // `bootstrap.sh`); the members roll once it has finished, and it no longer does.
            env.push(env_value("PLUGDB_RESTORING", "1"));
        }
        Ok(Workload {
            image: image(&spec.version),
            command: vec!["sh".into(), format!("{}/bootstrap.sh", cluster.config_mount_path)],
            args: vec![],
            env,
            ports: vec![Port { name: "mysql".into(), port: PORT }],
            // Bounded in itself: a hung server accepts the connection and never answers,
            // and an exec probe that does not end keeps the member ready. Not ready 5-8 s
            // into a hang (two looks 3 s apart that get no answer within 2 s), which the
            // failover delay then counts; a pause of 5 s is never two such looks. Over
            // TCP: the agent runs it, beside the engine.
            readiness: Some(Probe {
                action: ProbeAction::Exec(with_passwords(
                    &[("MARIADB_ROOT_PASSWORD", ROOT_KEY)],
                    "test -f \"$(dirname \"$DATADIR\")/plugdb-ready\" && timeout 2 mariadb --protocol=TCP -h localhost -P 3306 ${CLIENT_TLS:-} --connect-timeout=2 -uroot -p\"$MARIADB_ROOT_PASSWORD\" -e 'SELECT 1' >/dev/null",
                )),
                initial_delay_seconds: 2,
                period_seconds: 3,
                timeout_seconds: 3,
                failure_threshold: 2,
            }),
            liveness: Some(Probe {
                action: ProbeAction::TcpSocket(PORT),
                initial_delay_seconds: 60,
                period_seconds: 10,
                timeout_seconds: 5,
                failure_threshold: 6,
            }),
            config_files: vec![
                ConfigFile { name: "my.cnf".into(), content: my_cnf(&spec) },
                ConfigFile { name: "bootstrap.sh".into(), content: BOOTSTRAP.into() },
                ConfigFile { name: "accounts.sh".into(), content: ACCOUNTS.into() },
            ],
            data_mount_path: DATA_MOUNT.into(),
            credentials: [ROOT_KEY, REPLICATION_KEY, APPLICATION_KEY, MONITOR_KEY]
                .map(|key| Credential { key: key.into(), length: 32 })
                .to_vec(),
            recommended: ResourceAmounts { cpu_millis: Some(500), memory_bytes: Some(1 << 30) },
            run_as_user: UID,
            init_containers: vec![],
            member_query: None,
        })
    }

    fn plan_upgrade(spec: DatabaseSpec, from: String) -> Result<UpgradePlan, String> {
        let (Some(old_series), Some(new_series)) = (series(&from), series(&spec.version)) else {
            return Err(format!(
                "cannot plan an upgrade from {from:?} to {:?}: supported series are {}",
                spec.version,
                VERSIONS.join(", ")
            ));
        };
        let (old, new) = (version_parts(&from).unwrap_or_default(), version_parts(&spec.version).unwrap_or_default());
        if old == new {
            return Ok(UpgradePlan { steps: vec![], backup_first: false });
        }
        if new < old {
            return Err(format!(
                "downgrading MariaDB from {from} to {} is not supported: system tables are not backward compatible",
                spec.version
            ));
        }
        if old_series == new_series {
            return Ok(UpgradePlan { steps: vec![UpgradeStep::RollingRestart], backup_first: true });
        }
        let (i, j) = (VERSIONS.iter().position(|v| *v == old_series), VERSIONS.iter().position(|v| *v == new_series));
        if let (Some(i), Some(j)) = (i, j)
            && j != i + 1
        {
            return Err(format!("MariaDB upgrades go one LTS series at a time: {old_series} → {} first", VERSIONS[i + 1]));
        }
        // Each member's start on the new series brings its own system tables up to date
        // (`mariadb-upgrade` over the socket, in `bootstrap.sh`): root needs no login from
        // a Job over the network.
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
        if let Some(why) = silent_replicas_wait(&members, spec.synchronous_replicas, |p| parse_gtid(p).is_some()) {
            return FailoverDecision::NoSafeMember(why);
        }
        let candidates: Vec<(&Member, BTreeMap<u32, u64>)> =
            members.iter().filter(|m| m.ready && !m.primary).filter_map(|m| Some((m, parse_gtid(m.position.as_deref()?)?))).collect();
        let best =
            candidates.iter().filter(|(_, pos)| candidates.iter().all(|(_, other)| covers(pos, other))).min_by_key(|(m, _)| m.ordinal);
        match best {
            Some((m, _)) => FailoverDecision::Promote(Promotion {
                pod: m.pod.clone(),
                command: with_passwords(
                    &[("MARIADB_ROOT_PASSWORD", ROOT_KEY)],
                    "mariadb --socket=\"$MARIADB_SOCKET\" -uroot -p\"$MARIADB_ROOT_PASSWORD\" -e 'STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = OFF;'",
                ),
            }),
            None if candidates.is_empty() => {
                FailoverDecision::NoSafeMember("no ready replica reports a GTID position; promoting one could lose data".into())
            }
            None => {
                FailoverDecision::NoSafeMember("no ready replica has applied every transaction the others have; replicas diverged".into())
            }
        }
    }

    fn backup(spec: DatabaseSpec, location: BackupLocation) -> Result<JobPlan, String> {
        Ok(JobPlan {
            image: image(&spec.version),
            command: with_passwords(
                &[("REPLICATION_PASSWORD", REPLICATION_KEY)],
                "set -eu; out=\"$BACKUP_DIR/$BACKUP_NAME\"; rm -rf \"$out.partial\"; mkdir -p \"$out.partial\"; \
                 mariadb-dump -h \"$DB_HOST\" -P \"$DB_PORT\" ${CLIENT_TLS:-} -ureplicator -p\"$REPLICATION_PASSWORD\" --all-databases --single-transaction \
                 --gtid --master-data=2 --routines --events --triggers --no-tablespaces | gzip > \"$out.partial/dump.sql.gz\"; mv \"$out.partial\" \"$out\"",
            ),
            env: job_env(&spec, &location),
            mounts_data: false,
        })
    }

    /// A load into the running primary (member 0); the replicas clone it afterwards.
    fn restore(spec: DatabaseSpec, location: BackupLocation, member: u32) -> Result<Option<JobPlan>, String> {
        if member > 0 {
            return Ok(None);
        }
        let passwords = [("MARIADB_ROOT_PASSWORD", ROOT_KEY), ("REPLICATION_PASSWORD", REPLICATION_KEY), ("APP_PASSWORD", APPLICATION_KEY)];
        let command = with_passwords(&passwords, &[ACCOUNTS, RESTORE].concat());
        Ok(Some(JobPlan { image: image(&spec.version), command, env: job_env(&spec, &location), mounts_data: false }))
    }
}

/// How the member agent reaches the local server: over TCP, in a second at most. `later`
/// runs statements `$1` in a session of their own that outlives the command (which the
/// agent ends, whole, when it is done): stopping a replica's stream may wait on a lost
/// primary longer than the agent gives a command, and one cut short would leave the
/// replica stopped.
const CLIENT: &str = "m() { $RUN mariadb --protocol=TCP -h localhost -P 3306 ${CLIENT_TLS:-} -uroot -p\"$MARIADB_ROOT_PASSWORD\" --connect-timeout=1 \"$@\"; }
RUN=
later() { RUN='setsid -f'; m -e \"$1\" </dev/null >/dev/null 2>&1; RUN=; }
";

/// What the member agent runs: the member's role (a replica is read-only) and the GTID
/// position it has: a primary's (`@@gtid_current_pos`), a replica's received one
/// (`Gtid_IO_Pos`, which it applies before it stops; what it has applied until it has
/// received anything): a commit semi-synchronous replication confirmed may be in a
/// replica's relay log only. A replica adds its lag (`Seconds_Behind_Master`, not known
/// while it does not replicate). A primary fenced by shutting its server down says the
/// last position it wrote, which the fence kept beside the fence's mark. One client and
/// one connection, read by the shell alone: the agent's share of a busy node's CPU is
/// small, and its answer decides a failover. A second line says the engine's health (the
/// host names an anomaly from it): clients connected of `max_connections`, how long the
/// oldest open InnoDB transaction has run, and the bytes of binary log on the volume.
const STATUS: &str = r#"if ! out=$(m -e "SELECT CONCAT(IF(@@read_only, 'replica ', 'primary '), IF(@@gtid_current_pos = '', '0-0-0', @@gtid_current_pos)) AS said; SHOW SLAVE STATUS\G
SELECT CONCAT('signals connections=', (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'THREADS_CONNECTED'), '/', @@max_connections,
  ' transaction=', COALESCE((SELECT MAX(TIMESTAMPDIFF(SECOND, trx_started, NOW())) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id <> CONNECTION_ID()), 0)) AS signals" 2>&1); then
  last="${PLUGDB_FENCED:-}.position"
  case "$out" in *"Can't connect to server"*) [ -n "${PLUGDB_FENCED:-}" ] && [ -s "$last" ] && exec echo "primary $(cat "$last")" ;; esac
  echo "$out" >&2; exit 1
fi
said= lag= received= signals=
while IFS= read -r line; do
  case "$line" in
    'replica '*|'primary '*) [ -n "$said" ] || said=$line ;;
    'signals connections='*) signals=$line ;;
    *' Seconds_Behind_Master: '*) lag=${line#*Seconds_Behind_Master: } ;;
    *' Gtid_IO_Pos: '*) received=${line#*Gtid_IO_Pos: } ;;
  esac
done <<EOF
$out
EOF
[ -n "$said" ] || { echo "no role in what the server said" >&2; exit 1; }
case "$lag" in ''|*[!0-9]*) lag= ;; esac
case "$received" in ''|*[!0-9,-]*|[!0-9]*|*[!0-9]) received= ;; esac
case "$said" in
  replica*) [ -z "$received" ] || said="replica $received" ;;
  *) lag= ;;
esac
echo "$said${lag:+ $lag}"
held=$(find "$DATADIR" -maxdepth 1 -name 'mysql-bin.[0-9]*' -printf '%s\n' 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
case "$signals" in *[!a-z0-9=/\ -]*) ;; ?*) echo "$signals held=$held" ;; esac"#;

/// What the member agent runs to fence a primary: the server shuts down (`read_only`
/// would not stop accounts with every privilege), and the start waits while the member
/// is fenced. First every commit stops (`FLUSH TABLES WITH READ LOCK`, a second at most)
/// and the server says its position then: the last the member wrote, which a planned
/// switchover waits for its new primary to reach. It then sends every replica connected
/// all it wrote before it ends (`WAIT FOR ALL SLAVES`; a plain shutdown ends their
/// streams where they are, and a replica a moment behind would never reach that
/// position). That client runs in a session of its own, writing beside the fence's mark
/// as it goes (`later`, unbuffered): the agent ends this command, whole, when its time
/// is up, and on a loaded node that may come after the shutdown was sent and before
/// anything here kept the position. Once the server refuses connections, in this run or
/// the next, its last position is kept: the one its binary log's state file says (a
/// server writes it as it shuts down cleanly, and removes it as it starts), else the one
/// it said under the lock. The lock ends with the client's session, which may come
/// before the server ends its clients: a commit waiting on it then lands after the
/// position said. While it answers, nothing kept before is. Without the lock in time (a
/// long transaction) the server shuts down all the same. A server that refuses
/// connections takes no writes either; one that does not answer (hung) is tried again.
const FENCE: &str = r#"gtids='^[0-9]+-[0-9]+-[0-9]+(,[0-9]+-[0-9]+-[0-9]+)*$'
state="${PLUGDB_FENCED:-}" said=/dev/null
[ -z "$state" ] || said="$state.said"
down() { case "$(m -e 'SELECT 1' 2>&1)" in *"Can't connect to server"*) return 0 ;; esac; return 1; }
kept() {
  last=$(awk -F- '/^[0-9]+-[0-9]+-[0-9]+$/ { at[$1] = $0 } END { for (d in at) print at[d] }' "$DATADIR/mysql-bin.state" 2>/dev/null |
    sort -t- -k1,1n | paste -sd, -)
  [ -n "$last" ] || last=$(grep -E "$gtids" "$said" 2>/dev/null | tail -n 1)
  [ -z "$last" ] || [ -z "$state" ] || printf '%s\n' "$last" > "$state.position"
}
if down; then kept; exit 0; fi
[ -z "$state" ] || rm -f "$state.position"
RUN='setsid -f'
m -n -N -B -e "SET SESSION lock_wait_timeout = 1; FLUSH TABLES WITH READ LOCK; SELECT @@gtid_current_pos; SHUTDOWN WAIT FOR ALL SLAVES" </dev/null >"$said" 2>&1
RUN=
for try in $(seq 20); do
  sleep 0.1
  if down; then kept; exit 0; fi
  grep -q '^ERROR' "$said" 2>/dev/null && break
done
out=$(m -e 'SHUTDOWN WAIT FOR ALL SLAVES' 2>&1) && exit 0
case "$out" in *"Can't connect to server"*) exit 0 ;; esac
echo "$out" >&2; exit 1"#;

/// What the member agent runs to promote a replica in place: it applies all it received
/// (within 2 s; one that cannot is restarted to lead instead, and its stop applies it)
/// and takes writes; with synchronous replication each commit waits for a replica, as a
/// primary's start has it. Its stream ends after that, in a session of its own (`later`):
/// a semi-synchronous one's end first connects to the old primary to end it there, which
/// waits out a lost node; the old primary sends nothing meanwhile (fenced, or lost and
/// fencing itself before the operator promotes another). The other replicas follow it
/// (`follow_command`); its binary logs go to the archive from then on (`bootstrap.sh`).
const PROMOTE: &str = r#"received=$(m -e 'SHOW SLAVE STATUS\G' | sed -n 's/^ *Gtid_IO_Pos: \([0-9][-0-9,]*\)$/\1/p')
if [ -n "$received" ]; then
  applied=$(m -N -B -e "SELECT MASTER_GTID_WAIT('$received', 2)")
  [ "$applied" = 0 ] || { echo "what it received ($received) was not applied within 2 s" >&2; exit 1; }
fi
m -e "SET GLOBAL read_only = OFF${SEMI_SYNC:+; SET GLOBAL rpl_semi_sync_master_enabled = $SEMI_SYNC}"
later 'SET GLOBAL rpl_semi_sync_slave_enabled = OFF; STOP SLAVE; RESET SLAVE ALL'"#;

/// What the member agent runs to have a replica follow a newly promoted member at once:
/// its replication names that member (a start makes it follow the read-write Service
/// again), changed in a session of its own (`later`: the old stream's end may wait on a
/// lost primary), and the command succeeds once the replica streams from it (within 3 s).
/// A replica streaming from a primary whose node was lost would otherwise hold on to it
/// for `slave_net_timeout` and reach the new one through the Service only after that,
/// and under synchronous replication the new primary's commits wait for it. The address
/// is checked to be a name (it is written into the statement). A primary refuses.
const FOLLOW: &str = r#"host="$PLUGDB_PRIMARY_HOST"
case "$host" in ''|*[!a-z0-9.-]*) echo "not a member's address: $host" >&2; exit 2 ;; esac
[ "$(m -N -B -e 'SELECT @@read_only')" = 1 ] || { echo "not a replica" >&2; exit 2; }
confirms=$(m -N -B -e 'SELECT @@rpl_semi_sync_slave_enabled')
later "SET GLOBAL rpl_semi_sync_slave_enabled = OFF; STOP SLAVE; CHANGE MASTER TO MASTER_HOST = '$host'; SET GLOBAL rpl_semi_sync_slave_enabled = $confirms; START SLAVE"
for try in $(seq 30); do
  case "$(m -e 'SHOW SLAVE STATUS\G')" in *"Master_Host: $host"*"Slave_IO_Running: Yes"*) exit 0 ;; esac
  sleep 0.1
done
echo "not streaming from $host" >&2; exit 1"#;

/// What the member agent runs when the host says how many replicas confirm each commit
/// (`PLUGDB_SYNCHRONOUS_REPLICAS`, 0 or 1) and which (`PLUGDB_SYNCHRONOUS_MEMBERS`): the
/// primary waits for one, or none (`rpl_semi_sync_master_enabled`), from whichever
/// replica acknowledges first, as it cannot name them; so a replica acknowledges only
/// while it is named, or none are (`rpl_semi_sync_slave_enabled`, which its stream takes
/// when it connects: the stream starts again, in a session of its own, see [`FOLLOW`]).
/// One the host does not name (it does not stream, or fell behind) then confirms no
/// commit a failover could not find. It succeeds once the replica's stream works so, or
/// it has none (it takes the setting when it starts). A restart starts from `my.cnf`.
const SYNCHRONOUS: &str = r#"n="$PLUGDB_SYNCHRONOUS_REPLICAS" members="${PLUGDB_SYNCHRONOUS_MEMBERS:-}"
case "$n" in 0) on=OFF ;; 1) on=ON ;; *) echo "MariaDB waits for 0 or 1 replica, not $n" >&2; exit 2 ;; esac
case "$members" in *[!a-z0-9,-]*) echo "not a list of members: $members" >&2; exit 2 ;; esac
read_only=$(m -N -B -e 'SELECT @@read_only') || exit 1
if [ "$read_only" = 0 ]; then
  m -e "SET GLOBAL rpl_semi_sync_master_enabled = $on"
  exit
fi
case "${PLUGDB_POD_NAME:-}" in ''|*[!a-z0-9-]*) echo "not a member's name: ${PLUGDB_POD_NAME:-}" >&2; exit 2 ;; esac
case ",$members," in ,,|*",$PLUGDB_POD_NAME,"*) want=ON ;; *) want=OFF ;; esac
works() {
  said=$(m -e "SELECT IF(@@rpl_semi_sync_slave_enabled, 'enabled ON', 'enabled OFF') AS confirms; SHOW STATUS LIKE 'Rpl_semi_sync_slave_status'; SHOW SLAVE STATUS\G")
  case "$said" in *"enabled $want"*) ;; *) return 1 ;; esac
  case "$said" in *"Slave_IO_Running: Yes"*) ;; *) return 0 ;; esac
  case "$said" in *"Rpl_semi_sync_slave_status"?"$want"*) return 0 ;; esac
  return 1
}
works && exit 0
if [ -z "$(m -e 'SHOW SLAVE STATUS')" ]; then
  m -e "SET GLOBAL rpl_semi_sync_slave_enabled = $want"
  exit
fi
later "SET GLOBAL rpl_semi_sync_slave_enabled = OFF; STOP SLAVE IO_THREAD; SET GLOBAL rpl_semi_sync_slave_enabled = $want; START SLAVE IO_THREAD"
for try in $(seq 30); do
  sleep 0.1
  works && exit 0
done
echo "its stream does not confirm commits as asked ($want)" >&2; exit 1"#;

impl Agent for Mysql {
    fn status_command(_spec: DatabaseSpec) -> Vec<String> {
        as_root(STATUS)
    }

    fn fence_command(_spec: DatabaseSpec) -> Vec<String> {
        as_root(FENCE)
    }

    /// The mariadb client as root, over TCP to the local server (with TLS when the
    /// Database serves it).
    fn client_command(_spec: DatabaseSpec) -> Vec<String> {
        as_root("m")
    }

    /// In place, as the server runs: no restart (see [`PROMOTE`]).
    fn promote_command(_spec: DatabaseSpec) -> Vec<String> {
        as_root(PROMOTE)
    }

    /// Semi-synchronous replication off (0) or on, as the server runs: off, the commits
    /// waiting for a replica complete; a restart turns it on again (`my.cnf`). A replica
    /// acknowledges only while named (see [`SYNCHRONOUS`]).
    fn synchronous_command(spec: DatabaseSpec) -> Vec<String> {
        if spec.synchronous_replicas == 0 {
            return Vec::new();
        }
        as_root(SYNCHRONOUS)
    }

    /// See [`FOLLOW`].
    fn follow_command(_spec: DatabaseSpec) -> Vec<String> {
        as_root(FOLLOW)
    }

    /// User `app`, with every right on database `app` and none elsewhere; every member's
    /// start makes both (see `bootstrap.sh`).
    fn application(_spec: DatabaseSpec) -> Option<ApplicationLogin> {
        Some(ApplicationLogin {
            user: APPLICATION.into(),
            database: APPLICATION.into(),
            password_key: APPLICATION_KEY.into(),
            scheme: "mysql".into(),
        })
    }
}

/// mysqld_exporter beside each member, as `plugdb_monitor` over loopback, under its own
/// metric names (`mysql_up`, `mysql_global_status_*`, `mysql_slave_status_*`), which the
/// community's dashboards and rules use. With TLS, the server requires it of every TCP
/// login; over the pod's own loopback the exporter does not verify the server.
impl Metrics for Mysql {
    fn endpoint(spec: DatabaseSpec, cluster: ClusterContext) -> Option<MetricsEndpoint> {
        let mut command = vec![
            "/bin/mysqld_exporter".into(),
            format!("--web.listen-address=:{EXPORTER_PORT}"),
            format!("--mysqld.address=127.0.0.1:{PORT}"),
            "--mysqld.username=plugdb_monitor".into(),
        ];
        if spec.tls.is_some() {
            command.push("--tls.insecure-skip-verify".into());
        }
        Some(MetricsEndpoint {
            port: EXPORTER_PORT,
            path: "/metrics".into(),
            exporter: Some(Exporter {
                image: EXPORTER_IMAGE.into(),
                // Started again should it end (its container never ends: see kept_running).
                command: kept_running(&command),
                env: vec![env_secret("MYSQLD_EXPORTER_PASSWORD", &cluster.credentials_secret, MONITOR_KEY)],
            }),
        })
    }
}

export_engine!(Mysql);

#[cfg(test)]
mod tests;
