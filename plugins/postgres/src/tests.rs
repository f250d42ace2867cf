use super::*;

fn spec(version: &str) -> DatabaseSpec {
    DatabaseSpec {
        name: "orders".into(),
        namespace: "shop".into(),
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
    type Case = (&'static str, &'static str, Result<(usize, bool), &'static str>);
    let cases: &[Case] = &[
        ("15.2", "15.2", Ok((0, false))),
        ("15.2", "15.4", Ok((1, true))),
        ("15", "15.4", Ok((1, true))),
        ("15.4", "15.2", Err("downgrading")),
        ("17", "15", Err("downgrading")),
        ("15.4", "17.0", Err("major upgrade from PostgreSQL 15 to 17")),
        ("15", "17", Err("major upgrade from PostgreSQL 15 to 17")),
        ("15", "16", Err("not supported")),
        ("15", "18", Err("not supported")),
        ("banana", "15", Err("cannot compare")),
    ];
    for (from, to, expected) in cases {
        let got = Postgres::plan_upgrade(spec(to), from.to_string());
        match (expected, &got) {
            (Ok((steps, backup)), Ok(plan)) => {
                assert_eq!(plan.steps.len(), *steps, "{from} → {to}");
                assert_eq!(plan.backup_first, *backup, "{from} → {to}");
                assert!(plan.steps.iter().all(|s| matches!(s, UpgradeStep::RollingRestart)), "{from} → {to}");
            }
            (Err(reason), Err(text)) => assert!(text.contains(reason), "{from} → {to}: {text}"),
            _ => panic!("{from} → {to}: expected {expected:?}, got {got:?}"),
        }
    }
}

fn member(ordinal: u32, ready: bool, primary: bool, position: Option<&str>) -> Member {
    Member { pod: format!("orders-{ordinal}"), ordinal, ready, primary, position: position.map(Into::into), answer: None }
}

#[test]
fn choose_primary_cases() {
    let cases: Vec<(&str, Vec<Member>, Option<&str>)> = vec![
        (
            "most advanced ready replica wins",
            vec![member(0, false, true, None), member(1, true, false, Some("0/3000060")), member(2, true, false, Some("0/3000148"))],
            Some("orders-2"),
        ),
        (
            "LSNs compare numerically, not as text",
            vec![member(0, false, true, None), member(1, true, false, Some("A/0")), member(2, true, false, Some("9/FFFFFFFF"))],
            Some("orders-1"),
        ),
        (
            "a tie goes to the lowest ordinal",
            vec![member(0, false, true, None), member(2, true, false, Some("0/5")), member(1, true, false, Some("0/5"))],
            Some("orders-1"),
        ),
        (
            "an unready replica is never chosen, however advanced",
            vec![member(0, false, true, None), member(1, false, false, Some("9/0")), member(2, true, false, Some("0/1"))],
            Some("orders-2"),
        ),
        ("no ready replica: no choice", vec![member(0, false, true, None), member(1, false, false, Some("0/1"))], None),
        ("no positions known: no choice", vec![member(0, false, true, None), member(1, true, false, None)], None),
        (
            "asynchronous: a ready replica whose agent is silent is no candidate, and holds nothing back",
            vec![member(0, false, true, None), member(1, true, false, None), member(2, true, false, Some("0/5"))],
            Some("orders-2"),
        ),
        ("unparseable position: no choice", vec![member(0, false, true, None), member(1, true, false, Some("garbage"))], None),
        ("the primary is ready: no failover", vec![member(0, true, true, None), member(1, true, false, Some("0/1"))], None),
    ];
    for (name, members, expected) in cases {
        match (Postgres::choose_primary(spec("15"), members), expected) {
            (FailoverDecision::Promote(p), Some(pod)) => {
                assert_eq!(p.pod, pod, "{name}");
                assert!(p.command.join(" ").contains("pg_ctl promote"), "{name}");
            }
            (FailoverDecision::NoSafeMember(reason), None) => assert!(!reason.is_empty(), "{name}"),
            (got, _) => panic!("{name}: got {got:?}"),
        }
    }
}

/// Under synchronous replication a silent ready replica may be one that confirmed the
/// last commits: no failover while as many are silent as each commit waited for.
#[test]
fn a_silent_replica_holds_a_synchronous_failover_back_only_when_it_may_hold_what_others_lack() {
    let synchronous = |n: u32| DatabaseSpec { synchronous_replicas: n, replicas: 4, ..spec("15") };
    let silent_one = || {
        vec![
            member(0, false, true, None),
            member(1, true, false, None),
            member(2, true, false, Some("0/5")),
            member(3, true, false, Some("0/7")),
        ]
    };
    match Postgres::choose_primary(synchronous(1), silent_one()) {
        FailoverDecision::NoSafeMember(why) => assert!(why.contains("orders-1") && why.contains("1 replica"), "{why}"),
        got => panic!("one silent, each commit on one replica: {got:?}"),
    }
    match Postgres::choose_primary(synchronous(2), silent_one()) {
        FailoverDecision::Promote(p) => assert_eq!(p.pod, "orders-3", "each commit on two replicas: one that answered has it"),
        got => panic!("one silent of two confirming: {got:?}"),
    }
}

#[test]
fn validate_reports_version_and_parameters_by_field() {
    let mut s = spec("14");
    s.parameters = vec![Parameter { name: "max_connections".into(), value: ParameterValue::Text("many".into()) }];
    let fields: Vec<String> = Postgres::validate(s).into_iter().map(|v| v.field).collect();
    assert_eq!(fields, ["spec.version", "spec.parameters.max_connections"]);
    for ok in ["15", "17", "17.2"] {
        assert!(Postgres::validate(spec(ok)).is_empty(), "{ok}");
    }
    for bad in ["", "17.", "17.2.1", "17.x", "18"] {
        assert!(!Postgres::validate(spec(bad)).is_empty(), "{bad}");
    }
}

#[test]
fn rendered_configuration_carries_derived_and_user_settings() {
    let mut s = spec("15");
    s.parameters = vec![
        Parameter { name: "max_connections".into(), value: ParameterValue::Integer(50) },
        Parameter { name: "work_mem".into(), value: ParameterValue::Text("8MB".into()) },
    ];
    let w = Postgres::render(s, cluster()).expect("renders");
    let conf = &w.config_files.iter().find(|f| f.name == "postgresql.conf").expect("postgresql.conf").content;
    assert!(conf.contains("max_connections = 50\n"), "{conf}");
    assert!(conf.contains("shared_buffers = '512MB'\n"), "{conf}");
    let work_mem: Vec<&str> = conf.lines().filter(|l| l.starts_with("work_mem")).collect();
    assert_eq!(work_mem, ["work_mem = '8MB'"], "the user's setting replaces the derived one");
    assert_eq!(w.image, "docker.io/library/postgres:15");
}

#[test]
fn scaling_does_not_change_the_configuration() {
    let (mut three, mut five) = (spec("15"), spec("15"));
    three.replicas = 3;
    five.replicas = 5;
    let files = |s| Postgres::render(s, cluster()).expect("renders").config_files;
    assert_eq!(files(three), files(five), "a scale keeps the members' configuration, so nothing restarts");
}

#[test]
fn an_archive_directory_turns_wal_archiving_on_and_a_point_in_time_restore_replays_to_it() {
    let cluster = |archive: Option<&str>| ClusterContext {
        primary_host: "orders.shop.svc".into(),
        headless_host: "orders-headless.shop.svc".into(),
        primary_pod: "orders-0".into(),
        credentials_secret: "orders-credentials".into(),
        config_mount_path: "/etc/plugdb".into(),
        archive_directory: archive.map(Into::into),
        restoring: false,
    };
    let conf = |s: DatabaseSpec, archive| {
        Postgres::render(s, cluster(archive))
            .expect("renders")
            .config_files
            .into_iter()
            .find(|f| f.name == "postgresql.conf")
            .expect("conf")
            .content
    };
    let plain = conf(spec("17"), None);
    assert!(!plain.contains("archive_mode"), "{plain}");
    let archived = conf(spec("17"), Some("/plugdb/archive"));
    assert!(archived.contains("archive_mode = on\n"), "{archived}");
    assert!(
        archived.contains("archive_command = 'cp %p /plugdb/archive/.%f && mv /plugdb/archive/.%f /plugdb/archive/%f'\n"),
        "{archived}"
    );
    assert!(archived.contains("archive_timeout = '60s'\n"), "{archived}");
    let mut quick = spec("17");
    quick.parameters = vec![Parameter { name: "archive_timeout".into(), value: ParameterValue::Text("10s".into()) }];
    let timeouts: Vec<String> =
        conf(quick, Some("/plugdb/archive")).lines().filter(|l| l.starts_with("archive_timeout")).map(String::from).collect();
    assert_eq!(timeouts, ["archive_timeout = '10s'"], "the user's setting replaces the default");

    let location = |at: Option<&str>| BackupLocation {
        directory: "/backups".into(),
        artifact: "orders-1".into(),
        host: "orders.shop.svc".into(),
        credentials_secret: "orders-credentials".into(),
        cluster: cluster(None),
        archive_directory: at.map(|_| "/backups/_archive".into()),
        point_in_time: at.map(Into::into),
    };
    let env = |at| Postgres::restore(spec("17"), location(at), 0).expect("restore plan").expect("member 0").env;
    assert_eq!(Postgres::restore(spec("17"), location(None), 1), Ok(None), "the replicas clone the restored primary");
    let named = |env: &[EnvVar], name: &str| env.iter().any(|e| e.name == name);
    assert!(!named(&env(None), "POINT_IN_TIME"));
    let pitr = env(Some("2026-11-23T10:15:30Z"));
    assert!(named(&pitr, "ARCHIVE_DIR"), "{pitr:?}");
    let target = pitr.iter().find(|e| e.name == "POINT_IN_TIME").map(|e| e.source.clone());
    assert_eq!(target, Some(EnvSource::Value("2026-11-23 10:15:30+00".into())), "a form postgres parses before zone names are loaded");
}

#[test]
fn with_tls_the_server_requires_it_and_every_client_verifies_the_server() {
    let cluster = cluster();
    let tls = TlsFiles {
        certificate: "/etc/plugdb-tls/tls.crt".into(),
        key: "/etc/plugdb-tls/tls.key".into(),
        ca: "/etc/plugdb-tls/ca.crt".into(),
    };
    let file = |w: &Workload, name: &str| w.config_files.iter().find(|f| f.name == name).expect("file").content.clone();
    let has = |env: &[EnvVar], name: &str, value: &str| env.contains(&env_value(name, value));

    let plain = Postgres::render(spec("17"), cluster.clone()).expect("renders");
    assert!(!file(&plain, "postgresql.conf").contains("ssl"), "no TLS unless asked");
    assert!(!file(&plain, "pg_hba.conf").contains("hostssl"));

    let secured = DatabaseSpec { tls: Some(tls), ..spec("17") };
    let w = Postgres::render(secured.clone(), cluster.clone()).expect("renders");
    let conf = file(&w, "postgresql.conf");
    assert!(conf.contains("ssl = on\n") && conf.contains("ssl_cert_file = '/etc/plugdb-tls/tls.crt'\n"), "{conf}");
    assert!(conf.contains("ssl_key_file = '/etc/plugdb-tls/tls.key'\n"), "{conf}");
    let hba = file(&w, "pg_hba.conf");
    for (user, address) in [("app", "10.1.2.3"), ("app", "fd00::5"), ("replicator", "10.1.2.3")] {
        assert_eq!(login(&hba, user, address), Some(("hostssl", "scram-sha-256")), "{user} from {address} over TLS only: {hba}");
    }
    assert!(
        has(&w.env, "PGSSLMODE", "verify-full") && has(&w.env, "PGSSLROOTCERT", "/etc/plugdb-tls/ca.crt"),
        "clones and replication verify"
    );

    let location = BackupLocation {
        directory: "/backups".into(),
        artifact: "orders-1".into(),
        host: "orders.shop.svc".into(),
        credentials_secret: "orders-credentials".into(),
        cluster,
        archive_directory: None,
        point_in_time: None,
    };
    let backup = Postgres::backup(secured, location).expect("backup");
    assert!(has(&backup.env, "PGSSLMODE", "verify-full"), "the backup Job verifies the primary");
    assert!(Postgres::info().capabilities & Capabilities::TLS == Capabilities::TLS);
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

/// Synchronous replication is quorum commit over any replicas as the server starts, which
/// the agent narrows to the members the host names, and lowers, as the server runs; a
/// setting that acknowledges commits no replica has is refused.
#[test]
fn synchronous_replication_waits_for_any_n_replicas_and_refuses_local_commits() {
    let conf = |spec: DatabaseSpec| {
        let w = Postgres::render(spec, cluster()).expect("renders");
        w.config_files.iter().find(|f| f.name == "postgresql.conf").expect("postgresql.conf").content.clone()
    };
    assert!(!conf(spec("17")).contains("synchronous_standby_names"), "asynchronous unless asked");
    assert!(Postgres::synchronous_command(spec("17")).is_empty(), "nothing to lower");
    let sync = DatabaseSpec { synchronous_replicas: 2, ..spec("17") };
    assert!(conf(sync.clone()).contains("synchronous_standby_names = 'ANY 2 (*)'\n"));
    let command = Postgres::synchronous_command(sync.clone()).join(" ");
    assert!(command.contains("PLUGDB_SYNCHRONOUS_REPLICAS") && command.contains("ALTER SYSTEM SET synchronous_standby_names"), "{command}");
    // The members named, or any replica: the setting the script makes, its SQL left out.
    let names = |n: &str, members: &str| {
        let script = SYNCHRONOUS.split("\nsql() ").next().expect("the setting").to_string() + "\nprintf %s \"$names\"";
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .env("PLUGDB_SYNCHRONOUS_REPLICAS", n)
            .env("PLUGDB_SYNCHRONOUS_MEMBERS", members)
            .output()
            .expect("sh runs");
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    assert_eq!(names("1", "orders-1,orders-2").as_deref(), Some(r#"ANY 1 ("orders-1", "orders-2")"#));
    assert_eq!(names("1", "orders-2").as_deref(), Some(r#"ANY 1 ("orders-2")"#));
    assert_eq!(names("2", "").as_deref(), Some("ANY 2 (*)"), "none named: any replica");
    assert_eq!(names("0", "orders-1").as_deref(), Some(""), "commits wait for none");
    assert_eq!(names("1", "a\"); DROP").as_deref(), None, "only names");
    let with = |value: &str| DatabaseSpec {
        parameters: vec![Parameter { name: "synchronous_commit".into(), value: ParameterValue::Text(value.into()) }],
        ..sync.clone()
    };
    for refused in ["off", "local"] {
        let v = Postgres::validate(with(refused));
        assert!(v.iter().any(|v| v.field == "spec.parameters.synchronous_commit"), "{refused}: {v:?}");
    }
    assert!(Postgres::validate(with("remote_apply")).is_empty());
    let async_off = DatabaseSpec { parameters: with("off").parameters, ..spec("17") };
    assert!(Postgres::validate(async_off).is_empty(), "asynchronous replication may commit locally");
}

/// The first rule of `hba` a TCP login of `user` to database `app` from `address` meets:
/// its type and method.
fn login<'a>(hba: &'a str, user: &str, address: &str) -> Option<(&'a str, &'a str)> {
    login_to(hba, "app", user, address)
}

/// The same, to `database`.
fn login_to<'a>(hba: &'a str, to: &str, user: &str, address: &str) -> Option<(&'a str, &'a str)> {
    let address: std::net::IpAddr = address.parse().expect("an address");
    let within = |cidr: &str| {
        let (net, bits) = cidr.split_once('/').expect("a CIDR");
        let bits: u32 = bits.parse().expect("a prefix");
        match (net.parse::<std::net::IpAddr>().expect("a network"), address) {
            (std::net::IpAddr::V4(n), std::net::IpAddr::V4(a)) => bits == 0 || (u32::from(n) ^ u32::from(a)) >> (32 - bits) == 0,
            (std::net::IpAddr::V6(n), std::net::IpAddr::V6(a)) => bits == 0 || (u128::from(n) ^ u128::from(a)) >> (128 - bits) == 0,
            _ => false,
        }
    };
    hba.lines().filter(|l| !l.starts_with('#')).map(|l| l.split_whitespace().collect::<Vec<_>>()).find_map(|rule| match rule[..] {
        [kind @ ("host" | "hostssl"), database, who, cidr, method]
            if (database == "all" || database == to) && (who == "all" || who == user) && within(cidr) =>
        {
            Some((kind, method))
        }
        _ => None,
    })
}

#[test]
fn the_superuser_logs_in_from_its_own_member_alone() {
    for tls in [false, true] {
        let spec = DatabaseSpec {
            tls: tls.then(|| TlsFiles { certificate: "/t/tls.crt".into(), key: "/t/tls.key".into(), ca: "/t/ca.crt".into() }),
            ..spec("17")
        };
        let w = Postgres::render(spec, cluster()).expect("renders");
        let hba = &w.config_files.iter().find(|f| f.name == "pg_hba.conf").expect("pg_hba").content;
        for address in ["127.0.0.1", "::1"] {
            assert_eq!(login(hba, "postgres", address).map(|r| r.1), Some("scram-sha-256"), "the agent, over loopback: {hba}");
        }
        for address in ["10.1.2.3", "192.168.0.7", "fd00::5"] {
            assert_eq!(login(hba, "postgres", address).map(|r| r.1), Some("reject"), "the superuser from {address}: {hba}");
            assert_eq!(login(hba, "app", address).map(|r| r.1), Some("scram-sha-256"), "the application from {address}: {hba}");
        }
    }
}

/// The exporter beside each member logs in as the monitoring user, to database
/// `postgres`, over the member's loopback: what pg_hba lets that user do, and nothing
/// from anywhere else (its password is in the credentials Secret a tenant may read). The
/// start makes it a member of `pg_monitor` alone.
#[test]
fn the_exporter_logs_in_as_the_monitoring_user_from_its_own_member_alone() {
    for tls in [false, true] {
        let spec = DatabaseSpec {
            tls: tls.then(|| TlsFiles { certificate: "/t/tls.crt".into(), key: "/t/tls.key".into(), ca: "/t/ca.crt".into() }),
            ..spec("17")
        };
        let w = Postgres::render(spec.clone(), cluster()).expect("renders");
        assert!(w.credentials.iter().any(|c| c.key == MONITOR_KEY), "its password is generated");
        let hba = &w.config_files.iter().find(|f| f.name == "pg_hba.conf").expect("pg_hba").content;
        assert_eq!(login_to(hba, "postgres", MONITOR, "127.0.0.1"), Some(("host", "scram-sha-256")), "{hba}");
        for address in ["10.1.2.3", "::1", "fd00::5"] {
            assert_eq!(login_to(hba, "postgres", MONITOR, address).map(|r| r.1), Some("reject"), "from {address}: {hba}");
        }
        assert_eq!(login_to(hba, "app", MONITOR, "127.0.0.1").map(|r| r.1), Some("reject"), "no other database: {hba}");
        let endpoint = Postgres::endpoint(spec, cluster()).expect("measured");
        let exporter = endpoint.exporter.expect("an exporter");
        assert_eq!((endpoint.port, exporter.image.as_str()), (9187, EXPORTER_IMAGE));
        let var = |name: &str| exporter.env.iter().find(|e| e.name == name).map(|e| e.source.clone());
        assert_eq!(var("DATA_SOURCE_USER"), Some(EnvSource::Value(MONITOR.into())));
        assert_eq!(var("DATA_SOURCE_URI"), Some(EnvSource::Value("127.0.0.1:5432/postgres?sslmode=disable".into())));
        let secret = SecretRef { name: cluster().credentials_secret, key: MONITOR_KEY.into() };
        assert_eq!(var("DATA_SOURCE_PASS"), Some(EnvSource::Secret(secret)));
    }
    assert!(BOOTSTRAP.contains("GRANT pg_monitor TO plugdb_monitor;"), "{BOOTSTRAP}");
    assert!(BOOTSTRAP.contains("\"$PLUGDB_CREDENTIALS/monitor-password\""), "{BOOTSTRAP}");
}

#[test]
fn a_former_primary_rewinds_as_the_replication_role() {
    let w = Postgres::render(spec("17"), cluster()).expect("renders");
    let grants = &w.config_files.iter().find(|f| f.name == "replicator.sql").expect("replicator.sql").content;
    for right in ["pg_ls_dir(text, boolean, boolean)", "pg_stat_file(text, boolean)", "pg_read_binary_file(text, bigint, bigint, boolean)"]
    {
        assert!(grants.contains(right), "{right}: {grants}");
    }
    assert!(grants.contains("GRANT pg_checkpoint TO replicator"), "{grants}");
    let bootstrap = &w.config_files.iter().find(|f| f.name == "bootstrap.sh").expect("bootstrap.sh").content;
    assert!(bootstrap.contains("source=\"host=$PRIMARY_HOST port=$PRIMARY_PORT user=replicator dbname=postgres"), "{bootstrap}");
    assert!(bootstrap.contains("single < \"$PLUGDB_CONFIG_DIR/replicator.sql\""), "{bootstrap}");
    assert!(PROMOTE.contains("-f \"$PLUGDB_CONFIG_DIR/replicator.sql\""), "granted as a member is promoted in place");
}

/// No password sits in an environment: the member, its agent's commands and the Jobs read
/// each from the credentials the host mounts, as they need it.
#[test]
fn passwords_are_read_from_the_mounted_credentials_never_the_environment() {
    let workload = Postgres::render(spec("17"), cluster()).expect("render");
    let location = BackupLocation {
        directory: "/backups".into(),
        artifact: "orders-1".into(),
        host: "orders.shop.svc".into(),
        credentials_secret: "orders-credentials".into(),
        cluster: cluster(),
        archive_directory: None,
        point_in_time: None,
    };
    let backup = Postgres::backup(spec("17"), location.clone()).expect("backup");
    let restore = Postgres::restore(spec("17"), location, 0).expect("restore").expect("member 0");
    for (what, env) in [("member", &workload.env), ("backup", &backup.env), ("restore", &restore.env)] {
        assert!(!env.iter().any(|e| matches!(e.source, EnvSource::Secret(_))), "{what}: a password in the environment");
        assert!(env.iter().any(|e| e.name == "PLUGDB_CREDENTIALS" && e.source == EnvSource::Value(CREDENTIALS_DIR.into())), "{what}");
    }
    let reads = |argv: &[String], key: &str| argv.last().is_some_and(|s| s.contains(&format!("\"$PLUGDB_CREDENTIALS/{key}\"")));
    assert!(reads(&backup.command, REPLICATION_KEY), "the backup logs in as the replication role");
    for command in [Postgres::status_command(spec("17")), Postgres::promote_command(spec("17")), Postgres::fence_command(spec("17"))] {
        assert!(reads(&command, SUPERUSER_KEY), "{command:?}");
    }
    assert!(include_str!("../../../wit/engine.wit").contains(&format!("`{CREDENTIALS_DIR}`")), "where the contract says they are");
    let bootstrap = BOOTSTRAP;
    for key in [SUPERUSER_KEY, REPLICATION_KEY, APPLICATION_KEY] {
        assert!(bootstrap.contains(&format!("\"$PLUGDB_CREDENTIALS/{key}\"")), "the bootstrap reads {key}");
    }
}
