//! Tier 3: what the mysql plugin emits, run by a real MariaDB server (Debian's,
//! started on loopback as an unprivileged user).

use std::time::{Duration, Instant};

use plugdb::plugin::{BackupLocation, EngineSpec, FailoverDecision, Member, ParameterValue};
use plugdb_tests::engine::{CONFIG_MOUNT, EngineUnderTest};
use plugdb_tests::local_pod::LocalPod;

const PATH: &str = "/usr/sbin:/usr/bin:/bin";

/// The MariaDB series installed by Debian on this machine (bookworm: 10.11).
fn server_version() -> String {
    let out =
        std::process::Command::new("/usr/sbin/mariadbd").arg("--version").output().expect("MariaDB is installed (scripts/install-deps.sh)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let version =
        text.split_whitespace().find(|w| w.contains("-MariaDB")).expect("a version").split('-').next().expect("version").to_string();
    let parts: Vec<&str> = version.split('.').collect();
    format!("{}.{}", parts[0], parts[1])
}

fn mariadb() -> EngineUnderTest {
    EngineUnderTest {
        component: "mysql",
        version: server_version(),
        data_mount: "/var/lib/mysql",
        credential_keys: &["root-password", "replication-password", "app-password", "monitor-password"],
        plumbing: |pod| {
            let socket = pod.run_dir().join("mysqld.sock").to_string_lossy().to_string();
            // Each container has a /tmp of its own; the local stand-in for it is the run directory.
            let tmp = pod.run_dir().to_string_lossy().to_string();
            let args = vec![format!("--bind-address={}", pod.address), format!("--pid-file={}/mysqld.pid", pod.run_dir().display())];
            (vec![("PATH", PATH.into()), ("MARIADB_SOCKET", socket), ("TMPDIR", tmp)], args)
        },
    }
}

/// Runs SQL as root over TCP with `password`; returns trimmed output.
fn sql(pod: &LocalPod, password: &str, query: &str) -> Result<String, String> {
    sql_as(pod, "root", password, query)
}

/// Runs SQL as `user` over TCP with `password`; returns trimmed output.
fn sql_as(pod: &LocalPod, user: &str, password: &str, query: &str) -> Result<String, String> {
    let out = pod
        .exec(&[
            "mariadb".into(),
            "-h".into(),
            pod.address.clone(),
            format!("-u{user}"),
            format!("-p{password}"),
            "-N".into(),
            "-B".into(),
            "-e".into(),
            query.into(),
        ])
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

const SAMPLE: &str = "CREATE DATABASE shop; USE shop; CREATE TABLE shop.orders (id INT PRIMARY KEY, item VARCHAR(40), qty INT) ENGINE=InnoDB; \
    INSERT INTO shop.orders SELECT seq, CONCAT('item-', seq), seq % 7 FROM seq_1_to_5000;";
const FINGERPRINT: &str =
    "SELECT CONCAT(COUNT(*), ':', MD5(GROUP_CONCAT(CONCAT_WS('|', id, item, qty) ORDER BY id SEPARATOR ','))) FROM shop.orders";

#[test]
fn the_server_runs_with_the_rendered_configuration() {
    let db = mariadb();
    let plugin = db.plugin();
    let s = db.spec(
        "settings",
        vec![
            ("max_connections", ParameterValue::Integer(77)),
            ("innodb_buffer_pool_size", ParameterValue::Text("256M".into())),
            ("long_query_time", ParameterValue::Text("2.5".into())),
            ("slow_query_log", ParameterValue::Text("ON".into())),
        ],
    );
    let secrets = db.secrets("settings");
    let pod = db.start_member(&plugin, &s, 0, None, &secrets);
    let pw = &secrets["root-password"];
    let var = |name: &str| sql(&pod, pw, &format!("SELECT @@{name}")).expect("variable");
    assert_eq!(var("max_connections"), "77");
    assert_eq!(var("innodb_buffer_pool_size"), (256u64 << 20).to_string());
    assert_eq!(var("long_query_time"), "2.500000");
    assert_eq!(var("slow_query_log"), "1");
    assert_eq!(var("log_bin"), "1");
    assert_eq!(var("binlog_format"), "ROW");
    assert_eq!(var("gtid_strict_mode"), "1");
    assert_eq!(var("slave_net_timeout"), "6", "a replica gives up on a lost primary within 6 s");
    assert_eq!(var("server_id"), "1", "member 0 has server id 1");
    assert_eq!(var("read_only"), "0", "the primary is writable");
    let err = sql(&pod, "wrong-password", "SELECT 1").expect_err("wrong password refused");
    assert!(err.contains("Access denied"), "{err}");
}

#[test]
fn backup_then_restore_gives_identical_data() {
    let db = mariadb();
    let plugin = db.plugin();
    let s = db.spec("source", vec![]);
    let source_secrets = db.secrets("source");
    let mut source = db.start_member(&plugin, &s, 0, None, &source_secrets);
    sql(&source, &source_secrets["root-password"], SAMPLE).expect("sample data");
    let before = sql(&source, &source_secrets["root-password"], FINGERPRINT).expect("fingerprint");
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
    source.run_job(&backup, &source_secrets, &[("PATH", PATH.into())]).expect("backup job");
    assert!(source.backup_dir().join("source-20260101-0000/dump.sql.gz").is_file());
    source.stop();

    // A new Database with its own credentials, restored from the artefact.
    let t = db.spec("target", vec![]);
    let target_secrets = db.secrets("target");
    let target = db.start_member(&plugin, &t, 0, None, &target_secrets);
    let restore = plugin
        .restore(&t, &BackupLocation { host: target.address.clone(), credentials_secret: "target-credentials".into(), ..location }, 0)
        .expect("restore plan")
        .expect("member 0 restores");
    target.run_job(&restore, &target_secrets, &[("PATH", PATH.into())]).expect("restore job");
    assert_eq!(sql(&target, &target_secrets["root-password"], FINGERPRINT).expect("fingerprint after restore"), before);
    assert!(sql(&target, &source_secrets["root-password"], "SELECT 1").is_err(), "the source's password does not open the target");
    assert_eq!(sql_as(&target, "app", &target_secrets["app-password"], "SELECT CURRENT_USER()"), Ok("app@%".into()));
    assert!(sql_as(&target, "app", &source_secrets["app-password"], "SELECT 1").is_err(), "nor the source's application password");
}

/// The application's login (the plugin's `agent.application`): `app` has every right on
/// database `app` and none elsewhere: no reading the server's files (the TLS key among
/// them), no account of another (the one the agent's commands log in as), no other
/// database, no replication. Every start applies it, also to a data directory made
/// before it existed.
#[test]
fn the_application_owns_its_database_and_nothing_else() {
    let db = mariadb();
    let plugin = db.plugin();
    let s = db.spec("tenant", vec![]);
    let secrets = db.secrets("tenant");
    let login = plugin.render(&s, &plugdb_tests::cluster("tenant", "default")).ok().and_then(|w| w.application);
    let login = login.expect("mysql names an application login");
    assert_eq!((login.user.as_str(), login.database.as_str(), login.password_key.as_str()), ("app", "app", "app-password"));
    let (root, app) = (secrets["root-password"].as_str(), secrets["app-password"].as_str());
    let mut m = db.start_member(&plugin, &s, 0, None, &secrets);
    sql_as(&m, "app", app, "CREATE TABLE app.orders (id INT PRIMARY KEY); INSERT INTO app.orders VALUES (1)")
        .expect("the application writes its own database");
    assert_eq!(sql_as(&m, "app", app, "SELECT LOAD_FILE(@@ssl_key), LOAD_FILE('/etc/passwd')"), Ok("NULL\tNULL".into()), "no FILE right");
    for attack in [
        "SELECT 1 INTO OUTFILE '/tmp/stolen'",
        "ALTER USER 'root'@'%' IDENTIFIED BY 'mine'",
        "CREATE USER intruder",
        "CREATE DATABASE other",
        "SELECT * FROM mysql.global_priv",
        "SHOW MASTER STATUS",
    ] {
        let err = sql_as(&m, "app", app, attack).expect_err(attack);
        assert!(err.contains("denied"), "{attack}: {err}");
    }

    // As if made before the login: the next start makes it again.
    sql(&m, root, "DROP USER 'app'@'%'; DROP DATABASE app").expect("drop");
    assert!(sql_as(&m, "app", app, "SELECT 1").is_err());
    m.stop();
    let m = db.run(m, &plugin, &s, None, &secrets, false);
    assert_eq!(
        sql_as(&m, "app", app, "SELECT CONCAT(CURRENT_USER(), ' ', COUNT(*)) FROM information_schema.schemata WHERE schema_name = 'app'"),
        Ok("app@% 1".into())
    );
}

/// The exporter's login (`plugdb_monitor`, from the member's loopback): it reads the
/// server's status, its replication and `performance_schema`, and none of the data.
#[test]
fn the_monitoring_user_reads_status_and_no_data() {
    let db = mariadb();
    let plugin = db.plugin();
    let s = db.spec("watched", vec![]);
    let secrets = db.secrets("watched");
    let (app, monitor) = (secrets["app-password"].as_str(), secrets["monitor-password"].as_str());
    let m = db.start_member(&plugin, &s, 0, None, &secrets);
    sql_as(&m, "app", app, "CREATE TABLE app.secrets (v TEXT); INSERT INTO app.secrets VALUES ('hidden')").expect("the application writes");
    for read in [
        "SHOW GLOBAL STATUS LIKE 'Threads_connected'",
        "SHOW REPLICA STATUS",
        "SELECT COUNT(*) FROM performance_schema.threads",
        "SHOW PROCESSLIST",
    ] {
        assert!(sql_as(&m, "plugdb_monitor", monitor, read).is_ok(), "{read}");
    }
    for attack in
        ["SELECT v FROM app.secrets", "SELECT * FROM mysql.global_priv", "CREATE DATABASE other", "SELECT 1 INTO OUTFILE '/tmp/x'"]
    {
        let err = sql_as(&m, "plugdb_monitor", monitor, attack).expect_err(attack);
        assert!(err.contains("denied"), "{attack}: {err}");
    }
    assert!(sql_as(&m, "plugdb_monitor", "wrong-password", "SELECT 1").is_err(), "a wrong password is refused");
}

#[test]
fn a_gtid_replica_is_promoted_by_the_plugins_choice_and_keeps_the_data() {
    let db = mariadb();
    let plugin = db.plugin();
    let s = db.spec("ha", vec![]);
    let secrets = db.secrets("ha");
    let pw = secrets["root-password"].clone();
    let mut primary = db.start_member(&plugin, &s, 0, None, &secrets);
    let rendered = plugin.render(&s, &plugdb_tests::cluster("ha", "default")).expect("render");
    let status_command = rendered.status_command;
    // A server that has written nothing yet (no GTID: `0-0-0`) still says its position.
    let fresh = primary.agent_status(&status_command).expect("a fresh primary's status");
    assert!(fresh.primary, "{fresh:?}");
    sql(&primary, &pw, SAMPLE).expect("sample data");
    let address = primary.address.clone();
    let mut replica = db.start_member(&plugin, &s, 1, Some(("ha-0", &address)), &secrets);
    let third = db.start_member(&plugin, &s, 2, Some(("ha-0", &address)), &secrets);

    assert_eq!(sql(&replica, &pw, "SELECT @@read_only").expect("read_only"), "1", "member 1 is read-only");
    let status = sql(&replica, &pw, "SHOW SLAVE STATUS\\G").expect("slave status");
    assert!(status.contains("Slave_Pos"), "replication uses GTIDs: {status}");
    assert_eq!(status.lines().filter(|l| l.trim() == "Yes").count(), 2, "IO and SQL threads run: {status}");
    sql(&primary, &pw, "INSERT INTO shop.orders VALUES (5001, 'late', 1)").expect("write on primary");
    let expected = sql(&primary, &pw, FINGERPRINT).expect("fingerprint");
    let deadline = Instant::now() + Duration::from_secs(30);
    while sql(&replica, &pw, FINGERPRINT).ok().as_deref() != Some(expected.as_str()) {
        assert!(Instant::now() < deadline, "the replica did not catch up:\n{}", replica.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    // What each member's agent answers, read from the engine by the plugin's status command.
    assert!(primary.agent_status(&status_command).expect("the primary's status").primary, "member 0 says it is primary");
    let said = replica.agent_status(&status_command).expect("the replica's status");
    assert!(!said.primary, "member 1 says it is a replica");
    assert_eq!(said.position, sql(&replica, &pw, "SELECT @@gtid_current_pos").expect("GTID position"), "its GTID position");
    assert!(said.lag.is_some_and(|lag| lag < Duration::from_secs(5)), "a replica caught up says it lags little: {said:?}");
    assert_eq!(primary.agent_status(&status_command).expect("the primary's status").lag, None, "a primary lags nothing");

    // Fenced by the plugin's fence command, as the agent does before a promotion. Its first
    // run ends before it sees the server down (a loaded server slow to end: a stand-in for
    // the client says it still answers), so the agent runs it again, which finds the server
    // down. And the first run's process group is ended, whole, as soon as the server was
    // asked to shut down (as the agent ends a command at its time limit, on a loaded node).
    // Its lock ends before the server does (the stand-in takes none): a commit lands after
    // the position the server said under it, and the position kept is the last all the
    // same. The old primary takes no more writes; fencing it again is harmless.
    let slow = primary.dir().join("slow-to-end");
    std::fs::create_dir_all(&slow).expect("a directory for the stand-in");
    let late =
        "SELECT @@gtid_current_pos; INSERT INTO shop.orders VALUES (9997, 'after the position said', 1); SHUTDOWN WAIT FOR ALL SLAVES";
    let client = format!(
        "#!/bin/sh\nn=$#\nfor a; do case \"$a\" in *'READ LOCK'*) a=\"{late}\" ;; esac; set -- \"$@\" \"$a\"; done; shift $n\n\
         case \"$*\" in *'SELECT 1'*) echo 1; exit 0 ;; *SHUTDOWN*) /usr/bin/mariadb \"$@\"; kill -9 0 ;; esac\nexec /usr/bin/mariadb \"$@\"\n"
    );
    std::fs::write(slow.join("mariadb"), client).expect("the stand-in");
    let runnable = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755);
    std::fs::set_permissions(slow.join("mariadb"), runnable).expect("its mode");
    let _ = primary.agent_fence_with(&rendered.fence_command, &[("PATH", format!("{}:{PATH}", slow.display()))]);
    primary.agent_fence(&rendered.fence_command).expect("fenced");
    sql(&primary, &pw, "INSERT INTO shop.orders VALUES (9998, 'fenced', 1)").expect_err("a fenced primary takes no writes");
    primary.agent_fence(&rendered.fence_command).expect("fenced again");
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
    // Promoted in place by its agent, as the server runs: it follows no one and takes writes.
    replica.agent_promote(&rendered.promote_command).expect("promoted in place");
    assert_eq!(sql(&replica, &pw, "SELECT @@read_only").expect("read_only"), "0", "promoted");
    // Its stream ends in a session of its own, a moment later.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sql(&replica, &pw, "SHOW SLAVE STATUS").as_deref() != Ok("") {
        assert!(Instant::now() < deadline, "it still follows:\n{}", replica.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(replica.agent_status(&status_command).expect("status").primary, "the promoted member says it is primary");
    // Asked again, as an operator stopped before it recorded the promotion asks: it leads as it is.
    replica.agent_promote(&rendered.promote_command).expect("promoted again: it leads already");
    sql(&replica, &pw, "INSERT INTO shop.orders VALUES (5002, 'after failover', 2)").expect("the new primary accepts writes");
    assert_eq!(sql(&replica, &pw, "SELECT COUNT(*) FROM shop.orders").expect("count"), "5003", "no data lost, the late commit's neither");

    // The other replica, told by its agent, follows the promoted member at once (by its
    // address, not the read-write Service's, which may still lead to the old primary).
    third.agent_follow(&rendered.follow_command, &replica.address).expect("follows the promoted member");
    let caught_up = |a: &LocalPod, b: &LocalPod| caught_up(a, b, &pw);
    caught_up(&third, &replica);
    let primary_refuses = replica.agent_follow(&rendered.follow_command, &third.address).expect_err("a primary follows no one");
    assert!(primary_refuses.contains("not a replica"), "{primary_refuses}");

    // The member promoted in place, lost in turn, rejoins once the third leads: it led,
    // so it starts again as a copy of the new primary, and follows it.
    replica.stop();
    third.agent_promote(&rendered.promote_command).expect("the third promoted in place");
    sql(&third, &pw, "INSERT INTO shop.orders VALUES (5003, 'after the second failover', 3)").expect("the third takes writes");
    let third_address = third.address.clone();
    let rejoined = db.run(replica, &plugin, &s, Some(("ha-2", &third_address)), &secrets, false);
    caught_up(&rejoined, &third);
    let status = sql(&rejoined, &pw, "SHOW SLAVE STATUS\\G").expect("slave status");
    assert_eq!(status.lines().filter(|l| l.trim() == "Yes").count(), 2, "it follows the third: {status}");
}

/// Semi-synchronous replication, named as the host names it: the primary waits for one
/// replica's acknowledgement, from whichever sends it, so a replica sends them only while
/// the host names it (or names none). The one left out still streams, asynchronously; the
/// primary counts it out, and in again once named. Its agent's command is idempotent, and
/// the primary's lowers and raises the wait.
#[test]
fn a_semi_synchronous_replica_confirms_commits_only_while_named() {
    let db = mariadb();
    let plugin = db.plugin();
    let s = EngineSpec { synchronous_replicas: 1, replicas: 3, ..db.spec("sync", vec![]) };
    let secrets = db.secrets("sync");
    let pw = secrets["root-password"].clone();
    let primary = db.start_member(&plugin, &s, 0, None, &secrets);
    let address = primary.address.clone();
    let named = db.start_member(&plugin, &s, 1, Some(("sync-0", &address)), &secrets);
    let other = db.start_member(&plugin, &s, 2, Some(("sync-0", &address)), &secrets);
    let command = plugin.render(&s, &plugdb_tests::cluster("sync", "default")).expect("render").synchronous_command;
    let status = |pod: &LocalPod, variable: &str| {
        let said = sql(pod, &pw, &format!("SHOW STATUS LIKE '{variable}'")).expect("status");
        said.split_whitespace().nth(1).unwrap_or_default().to_string()
    };
    let clients = |n: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while status(&primary, "Rpl_semi_sync_master_clients") != n {
            assert!(Instant::now() < deadline, "{n} semi-synchronous replicas expected:\n{}", primary.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    clients("2");
    let tell = |pod: &LocalPod, name: &str, n: &str, members: &str| {
        let env = [
            ("PLUGDB_POD_NAME", name.to_string()),
            ("PLUGDB_SYNCHRONOUS_REPLICAS", n.into()),
            ("PLUGDB_SYNCHRONOUS_MEMBERS", members.into()),
        ];
        pod.agent_run("synchronous", &command, &env)
    };
    tell(&named, "sync-1", "1", "sync-1").expect("the named replica told");
    tell(&other, "sync-2", "1", "sync-1").expect("the other told");
    assert_eq!(status(&other, "Rpl_semi_sync_slave_status"), "OFF", "left out, it acknowledges nothing");
    assert_eq!(status(&named, "Rpl_semi_sync_slave_status"), "ON");
    clients("1");
    sql(&primary, &pw, "CREATE DATABASE shop; CREATE TABLE shop.orders (id INT PRIMARY KEY); INSERT INTO shop.orders VALUES (1)")
        .expect("a commit");
    caught_up(&other, &primary, &pw);
    // Told again, nothing changes: no stream is started again.
    let streams =
        || sql(&primary, &pw, "SELECT GROUP_CONCAT(ID ORDER BY ID) FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'");
    let before = streams().expect("the streams");
    tell(&other, "sync-2", "1", "sync-1").expect("told again");
    tell(&named, "sync-1", "1", "sync-1").expect("told again");
    assert_eq!(streams().expect("the streams"), before, "the same two streams");
    // None named: any replica confirms.
    tell(&other, "sync-2", "1", "").expect("none named");
    assert_eq!(status(&other, "Rpl_semi_sync_slave_status"), "ON");
    clients("2");
    // Injected text is refused; the primary lowers the wait to none and raises it again.
    let refused = tell(&other, "sync-2", "1", "sync-1'; DROP DATABASE shop; --").expect_err("not a list of members");
    assert!(refused.contains("not a list of members"), "{refused}");
    tell(&primary, "sync-0", "0", "").expect("no replica waited for");
    assert_eq!(status(&primary, "Rpl_semi_sync_master_status"), "OFF");
    tell(&primary, "sync-0", "1", "sync-1").expect("one replica waited for");
    assert_eq!(status(&primary, "Rpl_semi_sync_master_status"), "ON");
    sql(&primary, &pw, "INSERT INTO shop.orders VALUES (2)").expect("a commit one replica confirmed");
}

/// A former primary whose last commit never reached the replica promoted in its place
/// (asynchronous replication) starts again as that member's replica: its data and GTID
/// position become a copy of the new primary's, and the commits only it had are gone.
#[test]
fn a_former_primary_with_a_commit_its_successor_never_had_rejoins_as_its_copy() {
    let db = mariadb();
    let plugin = db.plugin();
    let s = db.spec("rejoin", vec![]);
    let secrets = db.secrets("rejoin");
    let pw = secrets["root-password"].clone();
    let mut primary = db.start_member(&plugin, &s, 0, None, &secrets);
    sql(&primary, &pw, SAMPLE).expect("sample data");
    let address = primary.address.clone();
    let replica = db.start_member(&plugin, &s, 1, Some(("rejoin-0", &address)), &secrets);
    let caught_up = |a: &LocalPod, b: &LocalPod| caught_up(a, b, &pw);
    caught_up(&replica, &primary);
    sql(&replica, &pw, "STOP SLAVE").expect("the replica stops following");
    // Two: its GTID position gets ahead of the one the new primary's copy will say.
    for id in [7001, 7003] {
        sql(&primary, &pw, &format!("INSERT INTO shop.orders VALUES ({id}, 'never sent', 1)")).expect("a commit only the primary has");
    }
    primary.stop();

    let rendered = plugin.render(&s, &plugdb_tests::cluster("rejoin", "default")).expect("render");
    let position = replica.agent_status(&rendered.status_command).expect("the replica's status").position;
    let members = [
        Member { pod: "rejoin-0".into(), ordinal: 0, ready: false, primary: true, position: None, answer: None },
        Member { pod: "rejoin-1".into(), ordinal: 1, ready: true, primary: false, position: Some(position), answer: None },
    ];
    let FailoverDecision::Promote { .. } = plugin.choose_primary(&s, &members).expect("choose") else {
        panic!("the plugin should promote rejoin-1")
    };
    replica.agent_promote(&rendered.promote_command).expect("promoted in place");
    sql(&replica, &pw, "INSERT INTO shop.orders VALUES (7002, 'after the failover', 2)").expect("the new primary writes");

    let new_address = replica.address.clone();
    let old = db.run(primary, &plugin, &s, Some(("rejoin-1", &new_address)), &secrets, false);
    caught_up(&old, &replica);
    let unsent = sql(&old, &pw, "SELECT COUNT(*) FROM shop.orders WHERE id IN (7001, 7003)");
    assert_eq!(unsent.as_deref(), Ok("0"), "the unsent commits are gone");
    let status = sql(&old, &pw, "SHOW SLAVE STATUS\\G").expect("slave status");
    assert_eq!(status.lines().filter(|l| l.trim() == "Yes").count(), 2, "it follows the new primary: {status}");
}

/// Waits until member `a` holds what member `b` holds (a minute at most).
fn caught_up(a: &LocalPod, b: &LocalPod, pw: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while sql(a, pw, FINGERPRINT).ok() != sql(b, pw, FINGERPRINT).ok() {
        assert!(Instant::now() < deadline, "{} did not catch up with {}:\n{}", a.name, b.name, a.log());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every file in `dirs`, copied into `to`, readable by the members' user.
fn gather(dirs: &[std::path::PathBuf], to: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to).expect("archive copy");
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut names = Vec::new();
    for dir in dirs {
        for entry in std::fs::read_dir(dir).expect("archive").flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            std::fs::copy(entry.path(), to.join(&name)).expect("copy");
            std::fs::set_permissions(to.join(&name), std::fs::Permissions::from_mode(0o644)).expect("chmod");
            names.push(name);
        }
    }
    names.sort();
    names
}

/// Point-in-time recovery across a failover: the binary logs both primaries handed to
/// their archives (the new primary's repeat what it replicated from the old one),
/// replayed from the dump's GTID position into a new Database, give every transaction
/// before the moment once and none after it.
#[test]
fn a_point_in_time_restore_replays_the_archived_logs_of_both_primaries_once_each() {
    let db = mariadb();
    let plugin = db.plugin();
    let s = db.spec("pitr", vec![("archive_timeout", ParameterValue::Text("1s".into()))]);
    let secrets = db.secrets("pitr");
    let pw = secrets["root-password"].clone();
    let pod = |ordinal: u32| LocalPod::new(&format!("pitr-{ordinal}"), CONFIG_MOUNT, "/var/lib/mysql").expect("pod");
    let mut primary = db.run(pod(0), &plugin, &s, None, &secrets, true);
    sql(&primary, &pw, SAMPLE).expect("sample data");
    let address = primary.address.clone();
    let replica = db.run(pod(1), &plugin, &s, Some(("pitr-0", &address)), &secrets, true);

    let location = BackupLocation {
        directory: primary.backup_dir().to_string_lossy().into(),
        artifact: "pitr-base".into(),
        host: primary.address.clone(),
        credentials_secret: "pitr-credentials".into(),
        cluster: plugdb_tests::cluster("pitr", "default"),
        archive_directory: None,
        point_in_time: None,
    };
    let backup = plugin.backup(&s, &location).expect("backup plan");
    primary.run_job(&backup, &secrets, &[("PATH", PATH.into())]).expect("backup job");
    sql(&primary, &pw, "INSERT INTO shop.orders VALUES (6001, 'after the backup', 1)").expect("write");
    let expected = sql(&primary, &pw, FINGERPRINT).expect("fingerprint");
    let deadline = Instant::now() + Duration::from_secs(30);
    while sql(&replica, &pw, FINGERPRINT).ok().as_deref() != Some(expected.as_str()) {
        assert!(Instant::now() < deadline, "the replica did not catch up:\n{}", replica.log());
        std::thread::sleep(Duration::from_millis(200));
    }

    // Failover: the old primary stops (handing over its last log); member 1 is promoted
    // in place by its agent and, as it runs, hands over the logs it wrote as a replica.
    primary.stop();
    let rendered = plugin.render(&s, &plugdb_tests::cluster("pitr", "default")).expect("render");
    replica.agent_promote(&rendered.promote_command).expect("promoted in place");
    let promoted = replica;
    sql(&promoted, &pw, "INSERT INTO shop.orders VALUES (6002, 'after the failover', 2)").expect("write on the new primary");
    let before = sql(&promoted, &pw, FINGERPRINT).expect("fingerprint");
    assert!(before.starts_with("5002:"), "{before}");
    std::thread::sleep(Duration::from_secs(2));
    let moment = chrono::Utc::now();
    std::thread::sleep(Duration::from_secs(2));
    sql(&promoted, &pw, "INSERT INTO shop.orders VALUES (6003, 'after the moment', 3)").expect("write after the moment");
    let written = chrono::Utc::now().timestamp();
    // The running primary closes its log within archive_timeout and hands it over.
    let closed_at = |name: &str| name.split('-').nth(1).and_then(|t| t.parse::<i64>().ok()).unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_dir(promoted.archive_dir())
        .expect("archive")
        .flatten()
        .any(|e| closed_at(&e.file_name().to_string_lossy()) >= written)
    {
        assert!(Instant::now() < deadline, "no log closed after the last write was archived:\n{}", promoted.log());
        std::thread::sleep(Duration::from_millis(200));
    }

    let target_spec = db.spec("moment", vec![]);
    let target_secrets = db.secrets("moment");
    let target = db.start_member(&plugin, &target_spec, 0, None, &target_secrets);
    let download = target.dir().join("downloaded-archive");
    let names = gather(&[primary.archive_dir(), promoted.archive_dir()], &download);
    assert!(names.iter().any(|n| n.contains("-1-mysql-bin.")) && names.iter().any(|n| n.contains("-2-mysql-bin.")), "{names:?}");
    let restore = plugin
        .restore(
            &target_spec,
            &BackupLocation {
                host: target.address.clone(),
                credentials_secret: "moment-credentials".into(),
                archive_directory: Some(download.to_string_lossy().into()),
                point_in_time: Some(moment.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
                ..location
            },
            0,
        )
        .expect("restore plan")
        .expect("member 0 restores");
    let said = target.run_job(&restore, &target_secrets, &[("PATH", PATH.into())]).expect("restore job");
    assert!(said.contains("replayed"), "{said}");
    let tpw = &target_secrets["root-password"];
    assert_eq!(sql(&target, tpw, FINGERPRINT).expect("fingerprint after the restore"), before, "{said}");
    let missing = sql(&target, tpw, "SELECT COUNT(*) FROM shop.orders WHERE id = 6003").expect("count");
    assert_eq!(missing, "0", "the write after the moment is not replayed");
}

/// The buffer pool follows the member's memory (half of its limit) unless set: the same
/// plugin at 512 MiB and at 2 GiB.
#[test]
fn the_buffer_pool_follows_the_members_memory() {
    let db = mariadb();
    let plugin = db.plugin();
    for (memory, pool) in [(512u64 << 20, 256u64 << 20), (2 << 30, 1 << 30)] {
        let mut s = db.spec(&format!("sized{}", memory >> 20), vec![]);
        s.limits.memory_bytes = Some(memory);
        let secrets = db.secrets("sized");
        let pod = db.start_member(&plugin, &s, 0, None, &secrets);
        let said = sql(&pod, &secrets["root-password"], "SELECT @@innodb_buffer_pool_size").expect("variable");
        assert_eq!(said, pool.to_string(), "at {} MiB", memory >> 20);
    }
}
