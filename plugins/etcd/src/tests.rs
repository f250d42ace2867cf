use super::*;

fn spec(replicas: u32, parameters: Vec<(&str, ParameterValue)>) -> DatabaseSpec {
    DatabaseSpec {
        name: "config".into(),
        namespace: "infra".into(),
        version: "3.5".into(),
        replicas,
        storage_bytes: 1 << 30,
        requests: ResourceAmounts { cpu_millis: None, memory_bytes: None },
        limits: ResourceAmounts { cpu_millis: None, memory_bytes: Some(512 << 20) },
        parameters: parameters.into_iter().map(|(n, value)| Parameter { name: n.into(), value }).collect(),
        tls: None,
        synchronous_replicas: 0,
    }
}

fn member(ordinal: u32, ready: bool, answer: Option<String>) -> Member {
    Member { pod: format!("config-{ordinal}"), ordinal, ready, primary: false, position: None, answer }
}

/// A status answer as etcd's gateway writes it.
fn said(id: u64, leader: u64, term: u64) -> Option<String> {
    Some(format!(
        r#"{{"header":{{"cluster_id":"1","member_id":"{id}","revision":"7","raft_term":"{term}"}},"version":"3.5.16","leader":"{leader}","raftTerm":"{term}"}}"#
    ))
}

fn cluster(primary: &str) -> ClusterContext {
    ClusterContext {
        primary_host: "config.infra.svc".into(),
        headless_host: "config-headless.infra.svc".into(),
        primary_pod: primary.into(),
        credentials_secret: "config-credentials".into(),
        config_mount_path: "/etc/plugdb".into(),
        archive_directory: None,
        restoring: false,
    }
}

/// A plan as words: `+N` adds member N by a Job, `-N` removes it, `=N` sets the count.
fn words(steps: &[ScaleStep]) -> Vec<String> {
    steps
        .iter()
        .map(|s| match s {
            ScaleStep::Members(n) => format!("={n}"),
            ScaleStep::Job(job) => {
                let member = job.env.iter().find(|e| e.name == "MEMBER").map(|e| match &e.source {
                    EnvSource::Value(v) => v.trim_start_matches("config-").to_string(),
                    _ => String::new(),
                });
                let script = job.command.join(" ");
                let sign = if script.contains("member add") {
                    "+"
                } else if script.contains("member remove") {
                    "-"
                } else {
                    "?"
                };
                format!("{sign}{}", member.unwrap_or_default())
            }
        })
        .collect()
}

#[test]
fn membership_changes_one_member_at_a_time_and_never_below_quorum() {
    let all_ready = |n: u32| (0..n).map(|o| member(o, true, None)).collect::<Vec<_>>();
    let with_down = |n: u32, down: u32| (0..n).map(|o| member(o, o != down, None)).collect::<Vec<_>>();
    type Row<'a> = (&'a str, u32, u32, Vec<Member>, Result<&'a [&'a str], &'a str>);
    let rows: Vec<Row> = vec![
        ("1 → 3: each member added before it starts", 1, 3, all_ready(1), Ok(&["+1", "=2", "+2", "=3"])),
        ("5 → 3: each member removed before it goes", 5, 3, all_ready(5), Ok(&["-4", "=4", "-3", "=3"])),
        ("3 → 1 on a healthy cluster", 3, 1, all_ready(3), Ok(&["-2", "=2", "-1", "=1"])),
        ("nothing to change", 3, 3, all_ready(3), Ok(&["=3"])),
        ("5 → 3 keeps quorum with one staying member down", 5, 3, with_down(5, 2), Ok(&["-4", "=4", "-3", "=3"])),
        (
            "3 → 2 with member 1 down: the two that stay have no quorum",
            3,
            2,
            with_down(3, 1),
            Err("would lose quorum: 1 of the 2 members that stay are ready (config-1 not ready), and a cluster of 2 needs 2"),
        ),
        (
            "3 → 5 on a cluster without quorum",
            3,
            5,
            vec![member(0, true, None), member(1, false, None), member(2, false, None)],
            Err("adding members needs a quorum: 1 of the 3 members are ready"),
        ),
        ("1 → 3 with member 0 down", 1, 3, with_down(1, 0), Err("adding members needs a quorum")),
    ];
    for (what, from, to, members, expected) in rows {
        let got = Etcd::plan_scale(spec(to, vec![]), from, members);
        match (expected, &got) {
            (Ok(plan), Ok(steps)) => assert_eq!(words(steps), plan.to_vec(), "{what}"),
            (Err(reason), Err(text)) => assert!(text.contains(reason), "{what}: {text}"),
            _ => panic!("{what}: expected {expected:?}, got {got:?}"),
        }
    }
}

#[test]
fn the_leader_is_the_member_whose_id_is_the_leader_it_reports_in_the_newest_term() {
    type Row<'a> = (&'a str, Vec<Member>, Result<&'a str, &'a str>);
    let rows: Vec<Row> = vec![
        (
            "all agree on member 1",
            vec![member(0, true, said(10, 11, 3)), member(1, true, said(11, 11, 3)), member(2, true, said(12, 11, 3))],
            Ok("config-1"),
        ),
        ("the leader alone answers", vec![member(0, false, None), member(1, true, None), member(2, true, said(12, 12, 5))], Ok("config-2")),
        (
            "a deposed leader still believes it leads: the newer term wins",
            vec![member(0, true, said(10, 10, 3)), member(1, true, said(11, 12, 4)), member(2, true, said(12, 12, 4))],
            Ok("config-2"),
        ),
        (
            "followers of a leader that does not answer",
            vec![member(0, true, said(10, 12, 4)), member(1, true, said(11, 12, 4)), member(2, false, None)],
            Err("none of them leads"),
        ),
        ("nobody answers", vec![member(0, false, None), member(1, false, None)], Err("no member reports its status")),
        ("an answer that is not a status", vec![member(0, true, Some("<html>".into()))], Err("no member reports its status")),
    ];
    for (what, members, expected) in rows {
        let got = Etcd::choose_primary(spec(3, vec![]), members);
        match (expected, &got) {
            (Ok(pod), FailoverDecision::Elected(chosen)) => assert_eq!(chosen, pod, "{what}"),
            (Err(reason), FailoverDecision::NoSafeMember(text)) => assert!(text.contains(reason), "{what}: {text}"),
            _ => panic!("{what}: expected {expected:?}, got {got:?}"),
        }
    }
}

#[test]
fn parameters_are_etcds_own_variables_with_64_bit_integers_as_written() {
    let quota = ("quota-backend-bytes", ParameterValue::Integer(4_294_967_296));
    assert_eq!(Etcd::validate(spec(3, vec![quota.clone()])), vec![]);
    let workload = Etcd::render(spec(3, vec![quota]), cluster("config-0")).expect("render");
    let var = workload.env.iter().find(|e| e.name == "ETCD_QUOTA_BACKEND_BYTES").expect("the quota reaches etcd");
    assert_eq!(var.source, EnvSource::Value("4294967296".into()));
    assert_eq!(workload.env.iter().filter(|e| e.name == "ETCD_QUOTA_BACKEND_BYTES").count(), 1, "the user's, not also the derived one");

    // Unset: three quarters of the member's volume, at most 8 GiB.
    let derived = |storage_bytes: u64| {
        let workload = Etcd::render(DatabaseSpec { storage_bytes, ..spec(3, vec![]) }, cluster("config-0")).expect("render");
        workload.env.into_iter().find(|e| e.name == "ETCD_QUOTA_BACKEND_BYTES").map(|e| e.source)
    };
    assert_eq!(derived(1 << 30), Some(EnvSource::Value((768u64 << 20).to_string())));
    assert_eq!(derived(4 << 30), Some(EnvSource::Value((3u64 << 30).to_string())));
    assert_eq!(derived(100 << 30), Some(EnvSource::Value((8u64 << 30).to_string())));

    let refused =
        |parameters| Etcd::validate(spec(3, parameters)).into_iter().map(|v| format!("{}: {}", v.field, v.message)).collect::<Vec<_>>();
    assert_eq!(
        refused(vec![("heartbeat-interval", ParameterValue::Integer(200)), ("election-timeout", ParameterValue::Integer(500))]),
        vec!["spec.parameters.election-timeout: 500 ms must be at least 5 heartbeat intervals (1000 ms)"]
    );
    assert_eq!(
        refused(vec![("initial-cluster", ParameterValue::Text("x=http://y".into()))]),
        vec!["spec.parameters.initial-cluster: is managed by plugdb and cannot be set"]
    );
    assert!(refused(vec![]).is_empty());
}

#[test]
fn members_are_asked_their_status_and_a_new_leader_renders_nothing_new() {
    let workload = Etcd::render(spec(3, vec![]), cluster("config-0")).expect("render");
    assert_eq!(
        workload.member_query,
        Some(MemberQuery { port: 2379, path: "/v3/maintenance/status".into(), body: Some("{}".into()), https: false })
    );
    assert!(Etcd::info().capabilities & Capabilities::ELECTS_LEADER == Capabilities::ELECTS_LEADER);
    assert_eq!(Etcd::render(spec(3, vec![]), cluster("config-2")), Ok(workload), "the workload does not depend on who leads");
}

#[test]
fn a_snapshot_is_restored_into_every_member_of_one_new_cluster_and_never_to_a_moment() {
    let location = |point_in_time: Option<&str>| BackupLocation {
        directory: "/backups".into(),
        artifact: "config-20261124".into(),
        host: "config.infra.svc".into(),
        credentials_secret: "config-credentials".into(),
        cluster: cluster("config-0"),
        archive_directory: None,
        point_in_time: point_in_time.map(Into::into),
    };
    let peer = |i: u32| format!("http://config-{i}.config-headless.infra.svc:2380");
    let initial = (0..3).map(|i| format!("config-{i}={}", peer(i))).collect::<Vec<_>>().join(",");
    for member in 0..3 {
        let job = Etcd::restore(spec(3, vec![]), location(None), member).expect("restore").expect("every member restores");
        assert!(job.mounts_data, "into the member's own volume, before it starts");
        assert!(job.env.contains(&env_value("MEMBER", format!("config-{member}"))), "{:?}", job.env);
        assert!(job.env.contains(&env_value("PEER", peer(member))), "{:?}", job.env);
        assert!(job.env.contains(&env_value("INITIAL_CLUSTER", initial.clone())), "{:?}", job.env);
        assert!(job.command.join(" ").contains("snapshot restore"));
    }
    let refused = Etcd::restore(spec(3, vec![]), location(Some("2026-11-24T10:00:00Z")), 0).expect_err("no point in time");
    assert!(refused.contains("no log to replay"), "{refused}");
    let backup = Etcd::backup(spec(3, vec![]), location(None)).expect("backup");
    assert!(backup.command.join(" ").contains("snapshot save"), "{:?}", backup.command);
}

fn tls() -> TlsFiles {
    TlsFiles { certificate: "/etc/plugdb-tls/tls.crt".into(), key: "/etc/plugdb-tls/tls.key".into(), ca: "/etc/plugdb-tls/ca.crt".into() }
}

fn value(env: &[EnvVar], name: &str) -> Option<String> {
    env.iter().find(|e| e.name == name).and_then(|e| match &e.source {
        EnvSource::Value(v) => Some(v.clone()),
        _ => None,
    })
}

#[test]
fn with_tls_members_clients_and_jobs_speak_https_and_peers_verify_each_other() {
    let plain = Etcd::render(spec(3, vec![]), cluster("config-0")).expect("render");
    assert_eq!(value(&plain.env, "SCHEME").as_deref(), Some("http"));
    assert_eq!(value(&plain.env, "ETCD_CERT_FILE"), None);

    let secured = DatabaseSpec { tls: Some(tls()), ..spec(3, vec![]) };
    let w = Etcd::render(secured.clone(), cluster("config-0")).expect("render");
    assert_eq!(value(&w.env, "SCHEME").as_deref(), Some("https"));
    assert_eq!(value(&w.env, "ETCD_CERT_FILE").as_deref(), Some("/etc/plugdb-tls/tls.crt"));
    assert_eq!(value(&w.env, "ETCD_PEER_TRUSTED_CA_FILE").as_deref(), Some("/etc/plugdb-tls/ca.crt"));
    assert_eq!(value(&w.env, "ETCD_PEER_CLIENT_CERT_AUTH").as_deref(), Some("true"));
    assert_eq!(value(&w.env, "ETCDCTL_CACERT").as_deref(), Some("/etc/plugdb-tls/ca.crt"), "etcdctl verifies the members");
    assert!(w.member_query.is_some_and(|q| q.https), "the host asks over HTTPS");
    assert!(matches!(w.readiness.map(|p| p.action), Some(ProbeAction::HttpGet(HttpGet { https: true, .. }))));
    assert!(Etcd::info().capabilities & Capabilities::TLS == Capabilities::TLS);

    let added = Etcd::plan_scale(secured.clone(), 1, vec![member(0, true, None)]).expect("plan");
    let ScaleStep::Job(job) = &added[0] else { panic!("a Job first: {added:?}") };
    assert_eq!(value(&job.env, "SCHEME").as_deref(), Some("https"));
    assert_eq!(value(&job.env, "ETCDCTL_CACERT").as_deref(), Some("/etc/plugdb-tls/ca.crt"));
    let location = BackupLocation {
        directory: "/backups".into(),
        artifact: "config-1".into(),
        host: "config.infra.svc".into(),
        credentials_secret: "config-credentials".into(),
        cluster: cluster("config-0"),
        archive_directory: None,
        point_in_time: None,
    };
    let backup = Etcd::backup(secured, location).expect("backup");
    assert_eq!(value(&backup.env, "ENDPOINT").as_deref(), Some("https://config.infra.svc:2379"));
}

/// `ctl` as `sh` runs it, with `getent` answering for the pods in `pods`: the endpoints it
/// gives etcdctl when it runs in member `me`.
fn endpoints_from(me: &str, pods: &[u32]) -> String {
    let known = pods.iter().map(|i| format!("config-{i}.*")).collect::<Vec<_>>().join("|");
    let script = format!(
        "{CTL}\ngetent() {{ case \"$2\" in {known}) return 0;; *) return 2;; esac; }}\n\
         SCHEME=https HEADLESS_HOST=config-headless.infra.svc SELF={me}; others"
    );
    let out = std::process::Command::new("sh").arg("-c").arg(script).output().expect("sh runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn members_and_jobs_reach_every_other_member_by_its_own_name_not_one_through_the_service() {
    // A learner refuses nearly every request, its own promotion included: through the
    // headless Service's name etcdctl is pinned to whichever member the name resolves
    // to first, so each member is named, and the one asking is left out.
    let w = Etcd::render(spec(3, vec![]), cluster("config-0")).expect("render");
    let start = &w.config_files.iter().find(|f| f.name == "start.sh").expect("start.sh").content;
    assert!(start.starts_with(CTL), "start.sh defines ctl first");
    let added = Etcd::plan_scale(spec(3, vec![]), 2, vec![member(0, true, None), member(1, true, None)]).expect("plan");
    let ScaleStep::Job(job) = &added[0] else { panic!("a Job first: {added:?}") };
    assert!(job.command.join(" ").contains(CTL), "the Job's script defines ctl");

    let url = |i: u32| format!("https://config-{i}.config-headless.infra.svc:2379");
    assert_eq!(endpoints_from("config-1", &[0, 1, 2]), format!("{},{}", url(0), url(2)));
    assert_eq!(endpoints_from("config-3", &[0, 1, 2, 4]), format!("{},{},{},{}", url(0), url(1), url(2), url(4)), "a gap is skipped");
    assert_eq!(endpoints_from("config-0", &[0]), "https://config-headless.infra.svc:2379", "alone: the Service's name");
}

/// The member's liveness probe as the kubelet runs it, against a `/proc` in which the
/// container's first process is `comm` and the kernel lists `tcp6` sockets: whether it
/// succeeds.
fn alive(comm: &str, tcp6: &str) -> bool {
    let w = Etcd::render(spec(3, vec![]), cluster("config-0")).expect("render");
    let ProbeAction::Exec(command) = &w.liveness.as_ref().expect("a liveness probe").action else { panic!("an exec probe") };
    assert_eq!(command, &["sh", "/etc/plugdb/alive.sh"], "the probe runs the script it ships");
    let script = &w.config_files.iter().find(|f| f.name == "alive.sh").expect("alive.sh").content;
    let proc = std::env::temp_dir().join(format!("plugdb-etcd-alive-{}-{comm}-{}", std::process::id(), tcp6.len()));
    std::fs::create_dir_all(proc.join("1")).and_then(|_| std::fs::create_dir_all(proc.join("net"))).expect("a made-up /proc");
    std::fs::write(proc.join("1/comm"), format!("{comm}\n")).expect("comm");
    let header = "  sl  local_address                         remote_address                        st\n";
    std::fs::write(proc.join("net/tcp6"), format!("{header}{tcp6}")).expect("tcp6");
    let status = std::process::Command::new("sh").arg("-c").arg(script).env("PROC", &proc).status().expect("sh runs");
    std::fs::remove_dir_all(&proc).expect("cleaned up");
    status.success()
}

#[test]
fn a_member_waiting_to_join_is_alive_and_etcd_is_alive_while_it_listens_to_its_peers() {
    let any = "00000000000000000000000000000000";
    let peer_listening = format!("   0: {any}:094C {any}:0000 0A 00000000:00000000 00:00000000 00000000   999\n");
    let client_listening = format!("   0: {any}:094B {any}:0000 0A 00000000:00000000 00:00000000 00000000   999\n");
    let peer_connected =
        format!("   1: {any}:094C 0100007F000000000000000000000000:A1B2 01 00000000:00000000 00:00000000 00000000   999\n");
    assert!(alive("sh", ""), "the start script waiting to be added (nothing listening) is not restarted");
    assert!(alive("etcd", &peer_listening), "etcd listening to its peers");
    assert!(!alive("etcd", ""), "etcd listening to nothing");
    assert!(!alive("etcd", &client_listening), "etcd listening to clients only");
    assert!(!alive("etcd", &peer_connected), "a connection on the peer port is not a listener");
}

/// etcd serves its own series, over plain HTTP on a port of their own: no exporter, and
/// the members listen there.
#[test]
fn etcd_serves_its_own_series() {
    let endpoint = Etcd::endpoint(spec(3, vec![]), cluster("config-0")).expect("measured");
    assert_eq!((endpoint.port, endpoint.path.as_str(), endpoint.exporter), (METRICS_PORT, "/metrics", None));
    let workload = Etcd::render(spec(3, vec![]), cluster("config-0")).expect("render");
    let var = workload.env.iter().find(|e| e.name == "ETCD_LISTEN_METRICS_URLS").expect("etcd listens for them");
    assert_eq!(var.source, EnvSource::Value(format!("http://0.0.0.0:{METRICS_PORT}")));
    assert!(!workload.ports.iter().any(|p| p.port == METRICS_PORT), "not one of the engine's ports");
}
