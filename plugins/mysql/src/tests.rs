use super::*;

fn spec(version: &str) -> DatabaseSpec {
    DatabaseSpec {
        name: "shop".into(),
        namespace: "retail".into(),
        version: version.into(),
        replicas: 3,
        storage_bytes: 10 << 30,
        requests: ResourceAmounts { cpu_millis: None, memory_bytes: None },
        limits: ResourceAmounts { cpu_millis: None, memory_bytes: Some(2 << 30) },
        parameters: vec![],
        tls: None,
        synchronous_replicas: 0,
    }
}

#[test]
fn plan_upgrade_cases() {
    type Case = (&'static str, &'static str, Result<usize, &'static str>);
    let cases: &[Case] = &[
        ("10.11.8", "10.11.8", Ok(0)),
        ("10.11.8", "10.11.9", Ok(1)),
        ("10.11", "10.11.9", Ok(1)),
        ("10.11.9", "11.8.6", Ok(1)),
        ("10.11", "11.8", Ok(1)),
        ("10.6", "11.8", Err("cannot plan an upgrade")),
        ("11.8", "10.11", Err("downgrading")),
        ("10.11.9", "10.11.8", Err("downgrading")),
        ("10.11", "12.0", Err("supported series")),
        ("5.7", "10.11", Err("supported series")),
    ];
    for (from, to, expected) in cases {
        let got = Mysql::plan_upgrade(spec(to), from.to_string());
        match (expected, &got) {
            (Ok(steps), Ok(plan)) => {
                assert_eq!(plan.steps.len(), *steps, "{from} → {to}");
                assert!(plan.steps.is_empty() || matches!(plan.steps[0], UpgradeStep::RollingRestart), "{from} → {to}");
            }
            (Err(reason), Err(text)) => assert!(text.contains(reason), "{from} → {to}: {text}"),
            _ => panic!("{from} → {to}: expected {expected:?}, got {got:?}"),
        }
    }
}

fn member(ordinal: u32, ready: bool, primary: bool, position: Option<&str>) -> Member {
    Member { pod: format!("shop-{ordinal}"), ordinal, ready, primary, position: position.map(Into::into), answer: None }
}

#[test]
fn choose_primary_cases() {
    let down = member(0, false, true, None);
    let cases: Vec<(&str, Vec<Member>, Option<&str>)> = vec![
        (
            "highest sequence wins",
            vec![down.clone(), member(1, true, false, Some("0-1-41")), member(2, true, false, Some("0-1-42"))],
            Some("shop-2"),
        ),
        (
            "sequences compare as numbers",
            vec![down.clone(), member(1, true, false, Some("0-1-100")), member(2, true, false, Some("0-1-99"))],
            Some("shop-1"),
        ),
        (
            "equal positions: lowest ordinal",
            vec![down.clone(), member(2, true, false, Some("0-1-7")), member(1, true, false, Some("0-1-7"))],
            Some("shop-1"),
        ),
        (
            "must cover every domain",
            vec![down.clone(), member(1, true, false, Some("0-1-50,1-2-3")), member(2, true, false, Some("0-1-50"))],
            Some("shop-1"),
        ),
        (
            "diverged replicas: no choice",
            vec![down.clone(), member(1, true, false, Some("0-1-50,1-2-3")), member(2, true, false, Some("0-1-51"))],
            None,
        ),
        (
            "unready replicas are never chosen",
            vec![down.clone(), member(1, false, false, Some("0-1-99")), member(2, true, false, Some("0-1-1"))],
            Some("shop-2"),
        ),
        ("no ready replica", vec![down.clone(), member(1, false, false, Some("0-1-1"))], None),
        ("no position", vec![down.clone(), member(1, true, false, None)], None),
        (
            "asynchronous: a ready replica whose agent is silent is no candidate, and holds nothing back",
            vec![down.clone(), member(1, true, false, None), member(2, true, false, Some("0-1-9"))],
            Some("shop-2"),
        ),
        ("garbage position", vec![down.clone(), member(1, true, false, Some("0/3000060"))], None),
        ("ready primary", vec![member(0, true, true, None), member(1, true, false, Some("0-1-1"))], None),
    ];
    for (name, members, expected) in cases {
        match (Mysql::choose_primary(spec("10.11"), members), expected) {
            (FailoverDecision::Promote(p), Some(pod)) => {
                assert_eq!(p.pod, pod, "{name}");
                assert!(p.command.join(" ").contains("RESET SLAVE ALL"), "{name}");
            }
            (FailoverDecision::NoSafeMember(reason), None) => assert!(!reason.is_empty(), "{name}"),
            (got, _) => panic!("{name}: got {got:?}"),
        }
    }
}

#[test]
fn validate_reports_version_and_parameters_by_field() {
    let mut s = spec("8.0");
    s.parameters = vec![
        Parameter { name: "max_connections".into(), value: ParameterValue::Integer(5) },
        Parameter { name: "server_id".into(), value: ParameterValue::Integer(7) },
        Parameter { name: "innodb_buffer_pool_size".into(), value: ParameterValue::Text("2 gigs".into()) },
    ];
    let fields: Vec<String> = Mysql::validate(s).into_iter().map(|v| v.field).collect();
    assert_eq!(
        fields,
        ["spec.version", "spec.parameters.max_connections", "spec.parameters.server_id", "spec.parameters.innodb_buffer_pool_size"]
    );
    for ok in ["10.11", "11.8", "11.8.6"] {
        assert!(Mysql::validate(spec(ok)).is_empty(), "{ok}");
    }
}

#[test]
fn configuration_derives_the_buffer_pool_and_takes_user_settings() {
    let mut s = spec("10.11");
    s.parameters = vec![Parameter { name: "max_connections".into(), value: ParameterValue::Integer(300) }];
    let cnf = my_cnf(&s);
    assert!(cnf.contains("innodb_buffer_pool_size = 1024M\n"), "{cnf}");
    assert!(cnf.contains("max_connections = 300\n") && !cnf.contains("max_connections = 151"), "{cnf}");
    assert!(cnf.contains("gtid_strict_mode = ON"), "{cnf}");
    assert!(cnf.contains("slave_net_timeout = 6\n"), "a replica gives up on a lost primary within 6 s: {cnf}");
}

#[test]
fn an_archive_directory_hands_binary_logs_over_and_a_point_in_time_restore_replays_to_it() {
    let cluster = |archive: Option<&str>| ClusterContext {
        primary_host: "orders.shop.svc".into(),
        headless_host: "orders-headless.shop.svc".into(),
        primary_pod: "orders-0".into(),
        credentials_secret: "orders-credentials".into(),
        config_mount_path: "/etc/plugdb".into(),
        archive_directory: archive.map(Into::into),
        restoring: false,
    };
    let value = |env: &[EnvVar], name: &str| {
        env.iter().find(|e| e.name == name).map(|e| match &e.source {
            EnvSource::Value(v) => v.clone(),
            other => panic!("{name}: {other:?}"),
        })
    };
    let plain = Mysql::render(spec("11.8"), cluster(None)).expect("renders");
    assert_eq!(value(&plain.env, "ARCHIVE_DIR"), None);
    let archived = Mysql::render(spec("11.8"), cluster(Some("/plugdb/archive"))).expect("renders");
    assert_eq!(value(&archived.env, "ARCHIVE_DIR").as_deref(), Some("/plugdb/archive"));
    assert_eq!(value(&archived.env, "ARCHIVE_TIMEOUT").as_deref(), Some("60"));
    for (setting, seconds) in [("5s", "5"), ("90", "90"), ("2min", "120"), ("1h", "3600"), ("0s", "1")] {
        let mut quick = spec("11.8");
        quick.parameters = vec![Parameter { name: ARCHIVE_TIMEOUT.into(), value: ParameterValue::Text(setting.into()) }];
        assert!(Mysql::validate(quick.clone()).is_empty(), "{setting}");
        let w = Mysql::render(quick.clone(), cluster(Some("/plugdb/archive"))).expect("renders");
        assert_eq!(value(&w.env, "ARCHIVE_TIMEOUT").as_deref(), Some(seconds), "{setting}");
        assert!(!my_cnf(&quick).contains("archive_timeout"), "a plugin setting, not a server variable");
    }
    let mut wrong = spec("11.8");
    wrong.parameters = vec![Parameter { name: ARCHIVE_TIMEOUT.into(), value: ParameterValue::Text("soon".into()) }];
    assert_eq!(Mysql::validate(wrong).first().map(|v| v.field.as_str()), Some("spec.parameters.archive_timeout"));

    let location = |at: Option<&str>| BackupLocation {
        directory: "/backups".into(),
        artifact: "orders-1".into(),
        host: "orders.shop.svc".into(),
        credentials_secret: "orders-credentials".into(),
        cluster: cluster(None),
        archive_directory: at.map(|_| "/backups/_archive".into()),
        point_in_time: at.map(Into::into),
    };
    let backup = Mysql::backup(spec("11.8"), location(None)).expect("backup plan").command.join(" ");
    assert!(backup.contains("--master-data=2"), "the dump records the GTID position a replay starts from: {backup}");
    let env = |at| Mysql::restore(spec("11.8"), location(at), 0).expect("restore plan").expect("member 0").env;
    assert_eq!(Mysql::restore(spec("11.8"), location(None), 1), Ok(None), "the replicas clone the restored primary");
    assert_eq!(value(&env(None), "POINT_IN_TIME"), None);
    for (at, stop) in [("2026-11-23T10:15:30Z", "2026-11-23 10:15:30"), ("2026-11-23T10:15:30.750Z", "2026-11-23 10:15:30")] {
        let pitr = env(Some(at));
        assert_eq!(value(&pitr, "ARCHIVE_DIR").as_deref(), Some("/backups/_archive"));
        assert_eq!(value(&pitr, "POINT_IN_TIME").as_deref(), Some(stop), "{at}");
    }
    assert!(Mysql::info().capabilities & Capabilities::POINT_IN_TIME == Capabilities::POINT_IN_TIME);
}

#[test]
fn with_tls_the_server_requires_it_and_replicas_and_jobs_verify_the_primary() {
    let cluster = cluster();
    let tls = TlsFiles {
        certificate: "/etc/plugdb-tls/tls.crt".into(),
        key: "/etc/plugdb-tls/tls.key".into(),
        ca: "/etc/plugdb-tls/ca.crt".into(),
    };
    let named = |env: &[EnvVar], name: &str| env.iter().any(|e| e.name == name);
    assert!(!my_cnf(&spec("11.8")).contains("ssl"), "no TLS unless asked");
    let plain = Mysql::render(spec("11.8"), cluster.clone()).expect("renders");
    assert!(!named(&plain.env, "CLIENT_TLS"));

    let secured = DatabaseSpec { tls: Some(tls), ..spec("11.8") };
    let cnf = my_cnf(&secured);
    assert!(cnf.contains("ssl_cert = /etc/plugdb-tls/tls.crt\n") && cnf.contains("ssl_ca = /etc/plugdb-tls/ca.crt\n"), "{cnf}");
    assert!(cnf.contains("require_secure_transport = ON\n"), "{cnf}");
    let w = Mysql::render(secured.clone(), cluster.clone()).expect("renders");
    assert!(w.env.contains(&env_value("CLIENT_TLS", "--ssl-ca=/etc/plugdb-tls/ca.crt --ssl-verify-server-cert")));
    let replication = w.env.iter().find(|e| e.name == "REPLICATION_TLS").map(|e| format!("{:?}", e.source)).unwrap_or_default();
    assert!(replication.contains("MASTER_SSL_VERIFY_SERVER_CERT=1"), "{replication}");

    let location = backup_location(cluster);
    let backup = Mysql::backup(secured.clone(), location.clone()).expect("backup");
    assert!(named(&backup.env, "CLIENT_TLS") && backup.command.join(" ").contains("${CLIENT_TLS:-}"));
    assert!(named(&Mysql::restore(secured, location, 0).expect("restore").expect("member 0").env, "CLIENT_TLS"));
    assert!(Mysql::info().capabilities & Capabilities::TLS == Capabilities::TLS);
}

/// The cluster facts of Database `shop/orders`, no archive, no restore.
fn cluster() -> ClusterContext {
    ClusterContext {
        primary_host: "orders.shop.svc".into(),
        headless_host: "orders-headless.shop.svc".into(),
        primary_pod: "orders-0".into(),
        credentials_secret: "orders-credentials".into(),
        config_mount_path: "/etc/plugdb".into(),
        archive_directory: None,
        restoring: false,
    }
}

/// Synchronous replication is semi-synchronous after sync, on every member (any may lead
/// next), waiting however long until the agent turns it off; MariaDB waits for one
/// replica, so more is refused.
#[test]
fn synchronous_replication_is_semi_synchronous_for_one_replica() {
    assert!(!my_cnf(&spec("11.8")).contains("semi_sync"), "asynchronous unless asked");
    assert!(Mysql::synchronous_command(spec("11.8")).is_empty());
    let sync = DatabaseSpec { synchronous_replicas: 1, ..spec("11.8") };
    let cnf = my_cnf(&sync);
    assert!(!cnf.contains("rpl_semi_sync_master_enabled"), "a replica must not wait for replicas of its own: {cnf}");
    let w = Mysql::render(sync.clone(), cluster()).expect("renders");
    assert!(w.env.contains(&env_value("SEMI_SYNC", "ON")), "the primary's start turns it on");
    for line in [
        "rpl_semi_sync_slave_enabled = ON",
        "rpl_semi_sync_master_wait_point = AFTER_SYNC",
        "rpl_semi_sync_master_wait_no_slave = ON",
        "rpl_semi_sync_master_timeout = 4294967295",
        "rpl_semi_sync_slave_kill_conn_timeout = 1",
    ] {
        assert!(cnf.lines().any(|l| l == line), "{line}: {cnf}");
    }
    assert!(Mysql::validate(sync.clone()).is_empty());
    let command = Mysql::synchronous_command(sync).join(" ");
    assert!(command.contains("SET GLOBAL rpl_semi_sync_master_enabled"), "{command}");
    let two = Mysql::validate(DatabaseSpec { synchronous_replicas: 2, ..spec("11.8") });
    assert!(two.iter().any(|v| v.field == "spec.replication.synchronousReplicas" && v.message.contains("one replica")), "{two:?}");
}

/// A hung server accepts the probe's connection and never answers: the probe ends by
/// itself, so the member goes not ready (and a hung primary is failed over).
#[test]
fn the_readiness_probe_ends_by_itself_on_a_hung_server() {
    let w = Mysql::render(spec("11.8"), cluster()).expect("renders");
    let Some(Probe { action: ProbeAction::Exec(argv), timeout_seconds, .. }) = w.readiness else { panic!("an exec readiness probe") };
    let script = argv.join(" ");
    assert!(script.contains("timeout 2 mariadb --protocol=TCP") && script.contains("--connect-timeout=2"), "{script}");
    assert!(!script.contains("--socket"), "over TCP: the agent runs it, in its own container: {script}");
    assert!(timeout_seconds > 2, "the kubelet's own timeout comes after the probe's");
}

/// Semi-synchronous replication: each commit waited for one replica, which a silent one
/// may be: no failover while it is silent.
#[test]
fn a_silent_replica_holds_a_semi_synchronous_failover_back() {
    let members = vec![member(0, false, true, None), member(1, true, false, None), member(2, true, false, Some("0-1-9"))];
    match Mysql::choose_primary(DatabaseSpec { synchronous_replicas: 1, ..spec("11.8") }, members) {
        FailoverDecision::NoSafeMember(why) => assert!(why.contains("shop-1"), "{why}"),
        got => panic!("{got:?}"),
    }
}

/// Root's password, which anyone who reads the credentials Secret has, is a login from the
/// member alone (socket and loopback), over the network only while a backup is restored;
/// backups and clones use the replication role; each member upgrades its own system
/// tables over the socket.
#[test]
fn root_logs_in_over_the_network_only_while_a_backup_is_restored() {
    let env = |restoring: bool| Mysql::render(spec("11.8"), ClusterContext { restoring, ..cluster() }).expect("renders").env;
    let restoring = |env: &[EnvVar]| env.iter().any(|e| e.name == "PLUGDB_RESTORING");
    assert!(!restoring(&env(false)) && restoring(&env(true)));
    let w = Mysql::render(spec("11.8"), cluster()).expect("renders");
    let file = |name: &str| w.config_files.iter().find(|f| f.name == name).expect(name).content.clone();
    let (accounts, bootstrap) = (file("accounts.sh"), file("bootstrap.sh"));
    assert!(accounts.contains(r#"for account in "'root'@'127.%'" "'root'@'::1'" "$@"; do"#), "{accounts}");
    assert!(bootstrap.contains(r#"root_hosts="'localhost', '127.%', '::1'""#), "{bootstrap}");
    assert!(bootstrap.contains("Host NOT IN ($root_hosts)"), "every other root login removed at each start");
    for network in ["mariadb -h \"$PRIMARY_HOST\"", "mariadb-dump -h \"$PRIMARY_HOST\""] {
        let line = bootstrap.lines().find(|l| l.contains(network)).unwrap_or_else(|| panic!("{network}"));
        assert!(line.contains("-ureplicator") && !line.contains("-uroot"), "{line}");
    }
    assert!(bootstrap.contains("mariadb-upgrade --socket="), "system tables upgraded over the socket");
    let location = backup_location(cluster());
    let backup = Mysql::backup(spec("11.8"), location.clone()).expect("a backup");
    assert!(backup.command.join(" ").contains("-ureplicator") && !backup.command.join(" ").contains("-uroot"));
    assert!(!backup.env.iter().any(|e| e.name == "MARIADB_ROOT_PASSWORD"), "a backup has no root password");
    let restore = Mysql::restore(spec("11.8"), location, 0).expect("a restore").expect("member 0");
    assert!(restore.command.join(" ").contains("accounts_sql \"'root'@'%'\""), "the restore keeps root's network login");
}

/// Backup `orders-1` of Database `orders` in `shop`, no archive, no point in time.
fn backup_location(cluster: ClusterContext) -> BackupLocation {
    BackupLocation {
        directory: "/backups".into(),
        artifact: "orders-1".into(),
        host: "orders.shop.svc".into(),
        credentials_secret: "orders-credentials".into(),
        cluster,
        archive_directory: None,
        point_in_time: None,
    }
}

/// No password sits in an environment: the member, its probe, its agent's commands and
/// the Jobs read each from the credentials the host mounts, as they need it.
#[test]
fn passwords_are_read_from_the_mounted_credentials_never_the_environment() {
    let workload = Mysql::render(spec("11.8"), cluster()).expect("render");
    let location = BackupLocation {
        directory: "/backups".into(),
        artifact: "orders-1".into(),
        host: "orders.shop.svc".into(),
        credentials_secret: "orders-credentials".into(),
        cluster: cluster(),
        archive_directory: None,
        point_in_time: None,
    };
    let backup = Mysql::backup(spec("11.8"), location.clone()).expect("backup");
    let restore = Mysql::restore(spec("11.8"), location, 0).expect("restore").expect("member 0");
    for (what, env) in [("member", &workload.env), ("backup", &backup.env), ("restore", &restore.env)] {
        assert!(!env.iter().any(|e| matches!(e.source, EnvSource::Secret(_))), "{what}: a password in the environment");
        assert!(env.iter().any(|e| e.name == "PLUGDB_CREDENTIALS" && e.source == EnvSource::Value(CREDENTIALS_DIR.into())), "{what}");
    }
    let reads = |argv: &[String], key: &str| argv.last().is_some_and(|s| s.contains(&format!("\"$PLUGDB_CREDENTIALS/{key}\"")));
    assert!(reads(&backup.command, REPLICATION_KEY), "the backup dumps as the replication role");
    for key in [ROOT_KEY, REPLICATION_KEY, APPLICATION_KEY] {
        assert!(reads(&restore.command, key), "the restore sets {key}");
        assert!(BOOTSTRAP.contains(&format!("\"$PLUGDB_CREDENTIALS/{key}\"")), "the bootstrap reads {key}");
    }
    let Some(ProbeAction::Exec(probe)) = workload.readiness.map(|p| p.action) else { panic!("an exec readiness probe") };
    for command in [probe, Mysql::status_command(spec("11.8")), Mysql::promote_command(spec("11.8")), Mysql::fence_command(spec("11.8"))] {
        assert!(reads(&command, ROOT_KEY), "{command:?}");
    }
}

/// The exporter beside each member logs in as `plugdb_monitor`, which exists from the
/// member's loopback alone and reads the server's status, never its data; with TLS it
/// speaks TLS, as the server requires of every TCP login.
#[test]
fn the_exporter_logs_in_as_the_monitoring_user_from_its_own_member_alone() {
    for tls in [false, true] {
        let spec = DatabaseSpec {
            tls: tls.then(|| TlsFiles { certificate: "/t/tls.crt".into(), key: "/t/tls.key".into(), ca: "/t/ca.crt".into() }),
            ..spec("11.8")
        };
        let w = Mysql::render(spec.clone(), cluster()).expect("renders");
        assert!(w.credentials.iter().any(|c| c.key == MONITOR_KEY), "its password is generated");
        let endpoint = Mysql::endpoint(spec, cluster()).expect("measured");
        let exporter = endpoint.exporter.expect("an exporter");
        assert_eq!((endpoint.port, exporter.image.as_str()), (9104, EXPORTER_IMAGE));
        assert!(exporter.command.contains(&"--mysqld.address=127.0.0.1:3306".to_string()), "{:?}", exporter.command);
        assert!(exporter.command.contains(&"--mysqld.username=plugdb_monitor".to_string()), "{:?}", exporter.command);
        assert_eq!(exporter.command.contains(&"--tls.insecure-skip-verify".to_string()), tls, "{:?}", exporter.command);
        let secret = SecretRef { name: cluster().credentials_secret, key: MONITOR_KEY.into() };
        assert_eq!(exporter.env, vec![EnvVar { name: "MYSQLD_EXPORTER_PASSWORD".into(), source: EnvSource::Secret(secret) }]);
    }
    let grants: Vec<&str> = ACCOUNTS.lines().filter(|l| l.contains("plugdb_monitor")).collect();
    assert!(grants.iter().all(|l| l.contains("'plugdb_monitor'@'127.%'")), "from the member alone: {grants:?}");
    assert!(grants.iter().any(|l| l.contains("GRANT PROCESS, REPLICATION CLIENT, SLAVE MONITOR ON *.*")), "{grants:?}");
    assert!(grants.iter().any(|l| l.contains("GRANT SELECT ON performance_schema.*")), "{grants:?}");
    assert!(!grants.iter().any(|l| l.contains("SELECT ON *.*") || l.contains("ALL PRIVILEGES")), "no data: {grants:?}");
    assert!(BOOTSTRAP.contains("\"$PLUGDB_CREDENTIALS/monitor-password\""), "{BOOTSTRAP}");
}
