//! Tier 3: what the postgres plugin emits, run by a real PostgreSQL server
//! (Debian's, started on loopback as an unprivileged user).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use plugdb::plugin::{BackupLocation, EngineSpec, FailoverDecision, Member, ParameterValue};
use plugdb_tests::engine::{CONFIG_MOUNT, EngineUnderTest};
use plugdb_tests::local_pod::LocalPod;

/// The newest PostgreSQL installed by Debian on this machine (bookworm: 15).
fn server_version() -> String {
    let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is installed (scripts/install-deps.sh)")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort();
    versions.last().expect("a PostgreSQL version").to_string()
}

fn postgres() -> EngineUnderTest {
    EngineUnderTest {
        component: "postgres",
        version: server_version(),
        data_mount: "/var/lib/postgresql/data",
        credential_keys: &["superuser-password", "replication-password", "app-password", "monitor-password"],
        plumbing: |pod| {
            let run = pod.run_dir().to_string_lossy().to_string();
            let path = format!("/usr/lib/postgresql/{}/bin:/usr/bin:/bin", server_version());
            let args =
                vec!["-c".into(), format!("listen_addresses={}", pod.address), "-c".into(), format!("unix_socket_directories={run}")];
            (vec![("PATH", path), ("PGHOST", run)], args)
        },
    }
}

/// Runs SQL as postgres over TCP (password from the pod's PGPASSWORD); returns trimmed output.
fn sql(pod: &LocalPod, query: &str) -> Result<String, String> {
    let out = pod
        .exec(&[
            "psql".into(),
            "-h".into(),
            pod.address.clone(),
            "-U".into(),
            "postgres".into(),
            "-d".into(),
            "postgres".into(),
            "-v".into(),
            "ON_ERROR_STOP=1".into(),
            "-Atc".into(),
            query.into(),
        ])
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// Runs SQL as `user` in `database` over TCP with `password`; returns trimmed output.
fn sql_as(pod: &LocalPod, (user, password): (&str, &str), database: &str, query: &str) -> Result<String, String> {
    let argv = ["env", &format!("PGPASSWORD={password}"), "psql", "-h", &pod.address, "-U", user, "-d", database];
    let argv: Vec<String> = argv.iter().chain(&["-v", "ON_ERROR_STOP=1", "-Atc", query]).map(|a| a.to_string()).collect();
    let out = pod.exec(&argv).map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

fn with_password(pod: &mut LocalPod, password: &str) {
    pod.set_env(&[], &BTreeMap::new(), &[("PGPASSWORD", password.to_string())]).expect("env");
}

/// What the plugin grants the replication role so that it can rewind a former primary.
const REPLICATOR_GRANTS: &str = "GRANT EXECUTE ON FUNCTION pg_catalog.pg_ls_dir(text, boolean, boolean) TO replicator; \
    GRANT EXECUTE ON FUNCTION pg_catalog.pg_stat_file(text, boolean) TO replicator; \
    GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text) TO replicator; \
    GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text, bigint, bigint, boolean) TO replicator; \
    GRANT pg_checkpoint TO replicator";

const SAMPLE: &str = "CREATE TABLE orders (id int PRIMARY KEY, item text, qty int); \
    INSERT INTO orders SELECT g, 'item-' || g, g % 7 FROM generate_series(1, 5000) g;";
const FINGERPRINT: &str = "SELECT count(*) || ':' || md5(string_agg(o::text, ',' ORDER BY id)) FROM orders o";

#[test]
fn the_server_runs_with_the_rendered_configuration() {
    let pg = postgres();
    let plugin = pg.plugin();
    let s = pg.spec(
        "settings",
        vec![
            ("max_connections", ParameterValue::Integer(50)),
            ("work_mem", ParameterValue::Text("8MB".into())),
            ("statement_timeout", ParameterValue::Text("30s".into())),
            ("random_page_cost", ParameterValue::Text("1.1".into())),
        ],
    );
    let secrets = pg.secrets("settings");
    let mut m = pg.start_member(&plugin, &s, 0, None, &secrets);
    with_password(&mut m, &secrets["superuser-password"]);
    let show = |name: &str| sql(&m, &format!("SHOW {name}")).expect("SHOW");
    // What the plugin meant: memory-derived settings from the 1Gi limit, and the user's.
    assert_eq!(show("shared_buffers"), "256MB");
    assert_eq!(show("effective_cache_size"), "768MB");
    assert_eq!(show("maintenance_work_mem"), "64MB");
    assert_eq!(show("max_connections"), "50");
    assert_eq!(show("work_mem"), "8MB");
    assert_eq!(show("statement_timeout"), "30s");
    assert_eq!(show("random_page_cost"), "1.1");
    assert_eq!(show("wal_level"), "replica");
    assert_eq!(show("password_encryption"), "scram-sha-256");
    // A copy of the rendered pg_hba, beside the data: the one a fence rewrites.
    let hba = show("hba_file");
    assert!(hba.ends_with("/pg_hba.conf") && !hba.contains("/config/"), "{hba}");

    // pg_hba: a wrong password is refused over TCP and on the socket.
    with_password(&mut m, "wrong-password");
    let err = sql(&m, "SELECT 1").expect_err("wrong password refused");
    assert!(err.contains("password authentication failed"), "{err}");
    let out = m
        .exec(&["psql".into(), "-U".into(), "postgres".into(), "-d".into(), "postgres".into(), "-Atc".into(), "SELECT 1".into()])
        .expect("psql");
    assert!(!out.status.success(), "socket login without the right password refused");

    // The engine logs one JSON object a line to its standard error (the container's
    // log), the refused logins among them, and writes no log file on the volume.
    let log = m.log();
    let records: Vec<serde_json::Value> = log.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let said = |severity: &str, text: &str| {
        records.iter().any(|r| r["error_severity"] == severity && r["message"].as_str().is_some_and(|m| m.contains(text)))
    };
    assert!(said("LOG", "database system is ready to accept connections"), "{log}");
    assert!(said("FATAL", "password authentication failed for user \"postgres\""), "{log}");
    let files = m.exec(&["sh".into(), "-c".into(), r#"test -L "$PGDATA/../log/postgres.json" && find "$PGDATA/../log/" -type f"#.into()]);
    assert!(files.is_ok_and(|out| out.status.success() && out.stdout.is_empty()), "no log file on the volume");
}

#[test]
fn backup_then_restore_gives_identical_data() {
    let pg = postgres();
    let plugin = pg.plugin();
    let s = pg.spec("source", vec![]);
    let source_secrets = pg.secrets("source");
    let mut source = pg.start_member(&plugin, &s, 0, None, &source_secrets);
    with_password(&mut source, &source_secrets["superuser-password"]);
    sql(&source, SAMPLE).expect("sample data");
    let before = sql(&source, FINGERPRINT).expect("fingerprint");
    assert!(before.starts_with("5000:"), "{before}");

    let location = BackupLocation {
        directory: source.backup_dir().to_string_lossy().into(),
        artifact: "source-20260101-0000".into(),
        host: source.address.clone(),
        credentials_secret: "source-credentials".into(),
        cluster: plugdb_tests::cluster("source", "default"),
        archive_directory: None,
        point_in_time: None,
    };
    let backup = plugin.backup(&s, &location).expect("backup plan");
    source
        .run_job(&backup, &source_secrets, &[("PATH", format!("/usr/lib/postgresql/{}/bin:/usr/bin:/bin", server_version()))])
        .expect("backup job");
    assert!(source.backup_dir().join("source-20260101-0000/base.tar.gz").is_file());
    source.stop();

    // A new Database, new credentials, restored from the artefact.
    let t = pg.spec("target", vec![]);
    let target_secrets = pg.secrets("target");
    let target = LocalPod::new("target-0", CONFIG_MOUNT, pg.data_mount).expect("pod");
    let restore =
        plugin.restore(&t, &BackupLocation { credentials_secret: "target-credentials".into(), ..location }, 0).expect("restore plan");
    let restore = restore.expect("member 0 restores");
    target.run_job(&restore, &target_secrets, &[("PATH", "/usr/bin:/bin".into())]).expect("restore job");
    // Restoring twice over the same volume is refused, not a silent overwrite.
    let again = target.run_job(&restore, &target_secrets, &[("PATH", "/usr/bin:/bin".into())]).expect_err("second restore refused");
    assert!(again.to_string().contains("refusing to restore"), "{again}");

    let mut target = pg.run(target, &plugin, &t, None, &target_secrets, false);
    // The restored cluster answers to the new Database's password, with the same data.
    with_password(&mut target, &target_secrets["superuser-password"]);
    assert_eq!(sql(&target, FINGERPRINT).expect("fingerprint after restore"), before);
    // So does its application login, and not to the source's.
    assert_eq!(sql_as(&target, ("app", &target_secrets["app-password"]), "app", "SELECT current_user"), Ok("app".into()));
    assert!(sql_as(&target, ("app", &source_secrets["app-password"]), "app", "SELECT 1").is_err(), "the source's password is refused");
}

#[test]
fn a_streaming_replica_is_promoted_by_the_plugins_choice_and_keeps_the_data() {
    let pg = postgres();
    let plugin = pg.plugin();
    let s = pg.spec("ha", vec![]);
    let secrets = pg.secrets("ha");
    let mut primary = pg.start_member(&plugin, &s, 0, None, &secrets);
    with_password(&mut primary, &secrets["superuser-password"]);
    sql(&primary, SAMPLE).expect("sample data");
    let address = primary.address.clone();
    let mut replica = pg.start_member(&plugin, &s, 1, Some(("ha-0", &address)), &secrets);
    with_password(&mut replica, &secrets["superuser-password"]);
    let mut other = pg.start_member(&plugin, &s, 2, Some(("ha-0", &address)), &secrets);
    with_password(&mut other, &secrets["superuser-password"]);

    assert_eq!(sql(&replica, "SELECT pg_is_in_recovery()").expect("recovery"), "t", "member 1 is a standby");
    // Told which replicas confirm commits (as every member's agent is): the primary names
    // them; a standby has nothing to do.
    let sync = EngineSpec { synchronous_replicas: 1, ..s.clone() };
    let synchronous = plugin.render(&sync, &plugdb_tests::cluster("ha", "default")).expect("render").synchronous_command;
    let tell = |pod: &LocalPod, n: &str, members: &str| {
        pod.agent_run(
            "synchronous",
            &synchronous,
            &[("PLUGDB_SYNCHRONOUS_REPLICAS", n.into()), ("PLUGDB_SYNCHRONOUS_MEMBERS", members.into())],
        )
    };
    tell(&replica, "1", "ha-2").expect("a standby told");
    assert_eq!(sql(&replica, "SHOW synchronous_standby_names").expect("its setting"), "", "a standby names none");
    tell(&primary, "1", "ha-1").expect("the primary told");
    assert_eq!(sql(&primary, "SHOW synchronous_standby_names").expect("its setting"), r#"ANY 1 ("ha-1")"#);
    tell(&primary, "0", "").expect("no replica waited for");
    // As a Database made before the replication role could rewind: the promotion below
    // grants it what a rewind reads.
    sql(&primary, &REPLICATOR_GRANTS.replace("GRANT", "REVOKE").replace(" TO ", " FROM ")).expect("revoked");
    sql(&primary, "INSERT INTO orders VALUES (5001, 'late', 1)").expect("write on primary");
    let expected = sql(&primary, FINGERPRINT).expect("fingerprint");
    let deadline = Instant::now() + Duration::from_secs(30);
    while sql(&replica, FINGERPRINT).ok().as_deref() != Some(expected.as_str()) {
        assert!(Instant::now() < deadline, "the replica did not catch up:\n{}", replica.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    // A database user's functions shadowing the server's, first in the role's search_path:
    // what the agent says is still the server's own (its role, its position).
    const LIAR: &str = "CREATE SCHEMA liar; \
        CREATE FUNCTION liar.pg_is_in_recovery() RETURNS boolean LANGUAGE sql AS 'SELECT true'; \
        CREATE FUNCTION liar.pg_current_wal_lsn() RETURNS pg_lsn LANGUAGE sql AS 'SELECT ''FF/FFFFFFFF''::pg_lsn'; \
        CREATE FUNCTION liar.pg_last_wal_receive_lsn() RETURNS pg_lsn LANGUAGE sql AS 'SELECT ''FF/FFFFFFFF''::pg_lsn'; \
        CREATE FUNCTION liar.pg_last_wal_replay_lsn() RETURNS pg_lsn LANGUAGE sql AS 'SELECT ''FF/FFFFFFFF''::pg_lsn'; \
        ALTER ROLE postgres SET search_path = liar, pg_catalog, public";
    sql(&primary, LIAR).expect("the liar's functions");
    let deadline = Instant::now() + Duration::from_secs(30);
    while sql(&replica, "SELECT count(*) FROM pg_namespace WHERE nspname = 'liar'").ok().as_deref() != Some("1") {
        assert!(Instant::now() < deadline, "the liar's schema did not reach the replica");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(sql(&primary, "SELECT pg_is_in_recovery()").expect("the liar answers"), "t", "the role's sessions are lied to");
    {
        let command = &plugin.render(&s, &plugdb_tests::cluster("ha", "default")).expect("render").status_command;
        let (on_primary, on_replica) = (primary.agent_status(command).expect("status"), replica.agent_status(command).expect("status"));
        assert!(on_primary.primary && on_primary.position != "FF/FFFFFFFF", "the primary's own word: {on_primary:?}");
        assert!(!on_replica.primary && on_replica.position != "FF/FFFFFFFF", "the replica's own word: {on_replica:?}");
    }
    sql(&primary, "ALTER ROLE postgres RESET search_path; DROP SCHEMA liar CASCADE").expect("the liar gone");
    let err = sql(&replica, "INSERT INTO orders VALUES (9999, 'x', 1)").expect_err("a standby refuses writes");
    assert!(err.contains("read-only"), "{err}");
    // What each member's agent answers, read from the engine by the plugin's status command.
    let rendered = plugin.render(&s, &plugdb_tests::cluster("ha", "default")).expect("render");
    let status_command = rendered.status_command;
    assert!(primary.agent_status(&status_command).expect("the primary's status").primary, "member 0 says it is primary");
    let said = replica.agent_status(&status_command).expect("the replica's status");
    assert!(!said.primary, "member 1 says it is a replica");
    // Its replay position (a record the primary writes on its own may land between two looks).
    let same = (0..20).any(|_| {
        let replayed = sql(&replica, "SELECT pg_last_wal_replay_lsn()").expect("replay position");
        replica.agent_status(&status_command).is_ok_and(|s| s.position == replayed)
    });
    assert!(same, "the agent says the replay position: {said:?}");
    assert!(said.lag.is_some_and(|lag| lag < Duration::from_secs(5)), "a replica caught up says it lags little: {said:?}");
    assert_eq!(primary.agent_status(&status_command).expect("the primary's status").lag, None, "a primary lags nothing");

    // Fenced by the plugin's fence command, as the agent does before a promotion: the old
    // primary takes no more writes; fencing it again is harmless.
    primary.agent_fence(&rendered.fence_command).expect("fenced");
    let err = sql(&primary, "INSERT INTO orders VALUES (9998, 'fenced', 1)").expect_err("a fenced primary takes no writes");
    assert!(err.contains("read-only"), "{err}");
    primary.agent_fence(&rendered.fence_command).expect("fenced again");
    // The rules it now serves let in replication and the superuser from the member's own
    // addresses (its agent) alone: no session from elsewhere gets in to turn the
    // read-only default off.
    const RULES: &str = "SELECT concat_ws(' ', type, array_to_string(database, ','), array_to_string(user_name, ','), address, error) \
        FROM pg_hba_file_rules ORDER BY line_number";
    let rules = sql(&primary, RULES).expect("the fenced rules");
    assert_eq!(rules, "local all postgres\nhost all postgres samehost\nhost replication replicator all", "fenced");
    // The fenced primary says the last position it wrote, and the replica reaches it: what
    // a planned switchover waits for before it promotes the replica.
    let last = primary.agent_status(&status_command).expect("the fenced primary's status");
    assert!(last.primary, "{last:?}");
    replica.reaches(&status_command, &last.position, Duration::from_secs(10)).expect("the replica reaches the fenced primary");
    primary.stop();
    let members = [
        Member { pod: "ha-0".into(), ordinal: 0, ready: false, primary: true, position: None, answer: None },
        Member { pod: "ha-1".into(), ordinal: 1, ready: true, primary: false, position: Some(last.position), answer: None },
    ];
    let FailoverDecision::Promote { pod, .. } = plugin.choose_primary(&s, &members).expect("choose") else {
        panic!("the plugin should promote ha-1")
    };
    assert_eq!(pod, "ha-1");
    // In place, as its agent promotes it.
    replica.agent_promote(&rendered.promote_command).expect("promoted");

    assert_eq!(sql(&replica, "SELECT pg_is_in_recovery()").expect("recovery"), "f", "promoted");
    assert!(replica.agent_status(&status_command).expect("status").primary, "the promoted member says it is primary");
    // Asked again, as an operator stopped before it recorded the promotion asks: it leads as it is.
    replica.agent_promote(&rendered.promote_command).expect("promoted again: it leads already");
    sql(&replica, "INSERT INTO orders VALUES (5002, 'after failover', 2)").expect("the new primary accepts writes");
    let after = sql(&replica, "SELECT count(*) FROM orders").expect("count");
    assert_eq!(after, "5002", "no data lost");

    // The old primary rejoins as a replica of the promoted member: rewound from it as the
    // replication role (the superuser logs in from its own member alone), not copied afresh.
    let mut rejoined = pg.run(primary, &plugin, &s, Some(("ha-1", &replica.address)), &secrets, false);
    with_password(&mut rejoined, &secrets["superuser-password"]);
    let log = rejoined.log();
    assert!(!log.contains("permission denied") && !log.contains("waiting to rewind"), "rewound at once:\n{log}");
    assert_eq!(sql(&rejoined, "SELECT pg_is_in_recovery()").expect("recovery"), "t", "the old primary follows");
    let deadline = Instant::now() + Duration::from_secs(30);
    while sql(&rejoined, "SELECT count(*) FROM orders").ok().as_deref() != Some("5002") {
        assert!(Instant::now() < deadline, "the old primary never caught up:\n{}", rejoined.log());
        std::thread::sleep(Duration::from_millis(200));
    }

    // The other replica, which streamed from the old primary, follows the promoted member
    // once its agent is told to (the old one is gone: it would wait for it for ever).
    let follow = &rendered.follow_command;
    let err = replica.agent_follow(follow, &other.address).expect_err("a primary follows no one");
    assert!(err.contains("not a replica"), "{err}");
    let err = other.agent_follow(follow, "ha-1' port=1").expect_err("only a name is followed");
    assert!(err.contains("not a member's address"), "{err}");
    other.agent_follow(follow, &replica.address).expect("told to follow the promoted member");
    let deadline = Instant::now() + Duration::from_secs(30);
    while sql(&other, "SELECT count(*) FROM orders").ok().as_deref() != Some("5002") {
        assert!(Instant::now() < deadline, "the other replica never followed the promoted member:\n{}", other.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    let upstream = sql(&other, "SELECT sender_host FROM pg_stat_wal_receiver WHERE status = 'streaming'").expect("its stream");
    assert_eq!(upstream, replica.address, "it streams from the promoted member");

    // With no replica left, the plugin refuses to choose.
    let lonely = [Member { pod: "ha-1".into(), ordinal: 1, ready: false, primary: true, position: None, answer: None }];
    assert!(matches!(plugin.choose_primary(&s, &lonely).expect("choose"), FailoverDecision::NoSafeMember(_)));
}

/// A member started again over its data (a roll, a restart) starts as the first time,
/// its config files mounted read-only as a ConfigMap volume mounts them.
#[test]
fn a_member_started_again_serves_again() {
    let pg = postgres();
    let plugin = pg.plugin();
    let s = pg.spec("again", vec![]);
    let secrets = pg.secrets("again");
    let mut m = pg.start_member(&plugin, &s, 0, None, &secrets);
    m.stop();
    let mut m = pg.run(m, &plugin, &s, None, &secrets, false);
    with_password(&mut m, &secrets["superuser-password"]);
    sql(&m, "CREATE TABLE orders (id int PRIMARY KEY, item text, qty int)").expect("serves again");
}

/// The application's login (the plugin's `agent.application`): user `app` owns database
/// `app` and may do anything in it, and nothing a superuser may: read the server's files
/// (the TLS key among them), change another role (the one the agent's commands log in
/// as), make roles or databases, or replicate. A data directory made before the login
/// existed gains it at the primary's next start, with the password the credentials hold.
#[test]
fn the_application_owns_its_database_and_nothing_else() {
    let pg = postgres();
    let plugin = pg.plugin();
    let s = pg.spec("tenant", vec![]);
    let secrets = pg.secrets("tenant");
    let login = plugin.render(&s, &plugdb_tests::cluster("tenant", "default")).ok().and_then(|w| w.application);
    let login = login.expect("postgres names an application login");
    assert_eq!((login.user.as_str(), login.database.as_str(), login.password_key.as_str()), ("app", "app", "app-password"));
    let app = ("app", secrets["app-password"].as_str());
    let superuser = ("postgres", secrets["superuser-password"].as_str());
    let mut m = pg.start_member(&plugin, &s, 0, None, &secrets);
    sql_as(&m, app, "app", "CREATE TABLE orders (id int PRIMARY KEY); INSERT INTO orders VALUES (1)")
        .expect("the application writes its own database");
    assert_eq!(
        sql_as(
            &m,
            app,
            "app",
            "SELECT rolsuper::text || rolreplication::text || rolcreaterole::text || rolcreatedb::text FROM pg_roles WHERE rolname = current_user"
        ),
        Ok("falsefalsefalsefalse".into())
    );
    for attack in [
        "SELECT pg_read_file('postgresql.conf')",
        "ALTER ROLE postgres SET search_path = public",
        "CREATE ROLE intruder SUPERUSER",
        "CREATE DATABASE other",
        "COPY orders TO '/tmp/stolen'",
    ] {
        let err = sql_as(&m, app, "app", attack).expect_err(attack);
        assert!(["permission denied", "must be superuser", "must have privileges"].iter().any(|r| err.contains(r)), "{attack}: {err}");
    }
    assert!(sql_as(&m, ("app", "wrong-password"), "app", "SELECT 1").is_err(), "a wrong password is refused");

    // As if made before the login: no user, no database, no mark. The next start makes them.
    sql_as(&m, superuser, "postgres", "DROP DATABASE app").expect("drop");
    sql_as(&m, superuser, "postgres", "DROP ROLE app").expect("drop");
    std::fs::remove_file(m.dir().join("data/pgdata/plugdb-application")).expect("the start marked the data directory");
    m.stop();
    let m = pg.run(m, &plugin, &s, None, &secrets, false);
    assert_eq!(sql_as(&m, app, "app", "SELECT current_user || '@' || current_database()"), Ok("app@app".into()));
    assert_eq!(
        sql_as(&m, superuser, "postgres", "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'app'"),
        Ok("app".into())
    );
}

/// The exporter's login (`plugdb_monitor`, password `monitor-password`): made by the
/// primary's start, a member of `pg_monitor` alone, it reads the statistics and
/// settings the exporter reads, and no table, and writes nothing.
#[test]
fn the_monitoring_user_reads_statistics_and_no_data() {
    let pg = postgres();
    let plugin = pg.plugin();
    let s = pg.spec("watched", vec![]);
    let secrets = pg.secrets("watched");
    let monitor = ("plugdb_monitor", secrets["monitor-password"].as_str());
    let app = ("app", secrets["app-password"].as_str());
    let m = pg.start_member(&plugin, &s, 0, None, &secrets);
    sql_as(&m, app, "app", "CREATE TABLE secrets (v text); INSERT INTO secrets VALUES ('hidden')").expect("the application writes");
    assert_eq!(
        sql_as(
            &m,
            monitor,
            "postgres",
            "SELECT string_agg(b.rolname, ',') FROM pg_auth_members a JOIN pg_roles b ON b.oid = a.roleid JOIN pg_roles r ON r.oid = a.member WHERE r.rolname = current_user"
        ),
        Ok("pg_monitor".into())
    );
    let seen = sql_as(&m, monitor, "postgres", "SELECT count(*) > 0 FROM pg_stat_activity WHERE query <> '' AND pid <> pg_backend_pid()");
    assert!(seen.is_ok(), "{seen:?}");
    assert_eq!(
        sql_as(&m, monitor, "postgres", "SELECT setting FROM pg_settings WHERE name = 'data_directory' LIMIT 1").map(|d| !d.is_empty()),
        Ok(true)
    );
    for attack in ["CREATE TABLE t (i int)", "SELECT pg_read_file('postgresql.conf')", "CREATE ROLE intruder"] {
        assert!(sql_as(&m, monitor, "postgres", attack).is_err(), "{attack}");
    }
    let err = sql_as(&m, monitor, "app", "SELECT v FROM secrets").expect_err("no other database");
    assert!(err.contains("pg_hba.conf rejects"), "{err}");
    assert!(sql_as(&m, ("plugdb_monitor", "wrong-password"), "postgres", "SELECT 1").is_err(), "a wrong password is refused");
}

/// Memory settings follow the member's memory limit unless set (the plugin guide has the
/// formulas): the same plugin at 512 MiB and at 2 GiB.
#[test]
fn memory_settings_follow_the_members_memory() {
    let pg = postgres();
    let plugin = pg.plugin();
    let sizes = [(512u64 << 20, ["128MB", "384MB", "32MB", "1310kB"]), (2 << 30, ["512MB", "1536MB", "128MB", "5242kB"])];
    for (memory, expected) in sizes {
        let mut s = pg.spec(&format!("sized{}", memory >> 20), vec![]);
        s.limits.memory_bytes = Some(memory);
        let secrets = pg.secrets("sized");
        let mut m = pg.start_member(&plugin, &s, 0, None, &secrets);
        with_password(&mut m, &secrets["superuser-password"]);
        let shown: Vec<String> = ["shared_buffers", "effective_cache_size", "maintenance_work_mem", "work_mem"]
            .iter()
            .map(|name| sql(&m, &format!("SHOW {name}")).expect("SHOW"))
            .collect();
        assert_eq!(shown, expected, "at {} MiB", memory >> 20);
    }
}
