use super::isolation::{LOOK_EVERY, LOOK_TIMEOUT, any_member_reachable, watch};
use super::*;
use crate::reconcile::ask::{Transport, answers};
use crate::reconcile::members::Observed;
use crate::tls::{Use, issue_for, new_authority};

fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

#[test]
fn a_status_is_a_role_and_a_position_on_one_line() {
    assert_eq!(
        parse("replica 0/3000148\n"),
        Ok(Status {
            primary: false,
            position: "0/3000148".into(),
            lag: None,
            volume: None,
            archive: None,
            exporter: None,
            signals: Default::default()
        })
    );
    assert_eq!(
        parse("primary 0-1-42,1-2-7"),
        Ok(Status {
            primary: true,
            position: "0-1-42,1-2-7".into(),
            lag: None,
            volume: None,
            archive: None,
            exporter: None,
            signals: Default::default()
        })
    );
    let lagging = Status {
        primary: false,
        position: "0-1-40".into(),
        lag: Some(Duration::from_millis(2500)),
        volume: None,
        archive: None,
        exporter: None,
        signals: Default::default(),
    };
    assert_eq!(parse("replica 0-1-40 2.5"), Ok(lagging));
    assert_eq!(parse("replica 0/5 0").map(|s| s.lag), Ok(Some(Duration::ZERO)));
    let bad_lags = [
        "replica 0/1 extra",
        "primary 0/1 0",
        "replica 0/1 -1",
        "replica 0/1 1e3",
        "replica 0/1 NaN",
        "replica 0/1 86401",
        "replica 0/1 .5",
    ];
    for bad in
        ["", "replica", "replica ", "leader 0/1", "replica \u{1b}[2J", &format!("replica {}", "9".repeat(129))].into_iter().chain(bad_lags)
    {
        assert!(parse(bad).is_err(), "{bad:?} is no status");
    }
    // The agent's line of the data volume, after the status.
    let measured = Some(metrics::Volume { size: 10_737_418_240, used: 8_589_934_592, per_hour: None });
    assert_eq!(parse("primary 0/5\nvolume 8589934592 10737418240\n").map(|s| s.volume), Ok(measured));
    let filling = measured.map(|v| metrics::Volume { per_hour: Some(1 << 30), ..v });
    assert_eq!(parse("primary 0/5\nvolume 8589934592 10737418240 1073741824\n").map(|s| s.volume), Ok(filling));
    for bad in [
        "primary 0/5\nvolume 2 1",
        "primary 0/5\nvolume 1",
        "primary 0/5\nvolume -1 2",
        "primary 0/5\nsize 1 2",
        "primary 0/5\nvolume 1 2\nvolume 1 2",
        "primary 0/5\nvolume 1 2 -3",
        "primary 0/5\nvolume 1 2 3 4",
    ] {
        assert!(parse(bad).is_err(), "{bad:?} is no status and volume");
    }
    // The agent's line of its archive directory, after the volume's.
    let backlog = |answer: &str| parse(answer).map(|s| (s.volume.is_some(), s.archive, s.exporter.is_some()));
    let waiting = Some(Backlog { segments: 12, oldest: Duration::from_secs(600) });
    assert_eq!(backlog("primary 0/5\nvolume 1 2\narchive 12 600\nexporter up\n"), Ok((true, waiting, true)));
    assert_eq!(backlog("primary 0/5\narchive 12 600"), Ok((false, waiting, false)));
    for bad in [
        "primary 0/5\narchive 12",
        "primary 0/5\narchive -1 2",
        "primary 0/5\narchive 1 2 3",
        "primary 0/5\narchive 1 99999999999",
        "primary 0/5\narchive 1 2\nvolume 1 2",
        "primary 0/5\narchive 1 2\narchive 1 2",
    ] {
        assert!(parse(bad).is_err(), "{bad:?} is no status and archive");
    }
    // The agent's line of the engine's exporter, last.
    let looked = |answer: &str| parse(answer).map(|s| (s.volume.is_some(), s.exporter));
    assert_eq!(looked("primary 0/5\nexporter up\n"), Ok((false, Some(exporter::Exporter::Up))));
    assert_eq!(looked("replica 0/5 0\nvolume 1 2\nexporter down"), Ok((true, Some(exporter::Exporter::Down))));
    assert_eq!(looked("replica 0/5\nexporter silent\n"), Ok((false, Some(exporter::Exporter::Silent))));
    for bad in [
        "primary 0/5\nexporter",
        "primary 0/5\nexporter maybe",
        "primary 0/5\nexporter up\nvolume 1 2",
        "primary 0/5\nexporter up\nexporter up",
    ] {
        assert!(parse(bad).is_err(), "{bad:?} is no status and exporter");
    }
}

/// An exporter says it cannot reach its engine in its `<namespace>_up` series; one that
/// does not answer, or answers anything but a page of series, is silent.
#[tokio::test]
async fn the_exporter_is_read_by_its_up_series_from_the_pods_loopback() {
    assert_eq!(exporter::read("# HELP pg_up ...\n# TYPE pg_up gauge\npg_up 1\npg_stat_x{a=\"b\"} 0\n"), exporter::Exporter::Up);
    assert_eq!(exporter::read("mysql_up 0\nmysql_global_status_uptime 12\n"), exporter::Exporter::Down);
    assert_eq!(exporter::read("go_goroutines 8\n"), exporter::Exporter::Up, "no up series: it answers");
    assert_eq!(exporter::read("pg_up{server=\"x\"} 0\n# pg_up 0\n"), exporter::Exporter::Up, "labelled or a comment: not its own word");
    // A page served on loopback, as an exporter serves it, then nothing there.
    let serve = |status: &'static str, body: &'static str| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let port = listener.local_addr().expect("address").port();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut head = [0u8; 1024];
            let n = socket.read(&mut head).await.expect("read");
            assert!(head[..n].starts_with(b"GET /metrics HTTP/1.0\r\n"), "{}", String::from_utf8_lossy(&head[..n]));
            socket.write_all(format!("HTTP/1.1 {status}\r\ncontent-type: text/plain\r\n\r\n{body}").as_bytes()).await.expect("write");
        });
        exporter::look(&exporter::At { port, path: "/metrics".into() }).await
    };
    assert_eq!(serve("200 OK", "pg_up 0\n").await, exporter::Exporter::Down);
    assert_eq!(serve("200 OK", "pg_up 1\n").await, exporter::Exporter::Up);
    assert_eq!(serve("500 Internal Server Error", "pg_up 1\n").await, exporter::Exporter::Silent);
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port").local_addr().expect("address").port();
    assert_eq!(exporter::look(&exporter::At { port: closed, path: "/metrics".into() }).await, exporter::Exporter::Silent);
}

#[tokio::test]
async fn the_status_command_is_bounded_in_time_and_output() {
    assert_eq!(run(&sh("echo replica 0/5"), &[], COMMAND_TIMEOUT).await, Ok("replica 0/5\n".into()));
    let failed = run(&sh("echo 'connection refused' >&2; exit 2"), &[], COMMAND_TIMEOUT).await.expect_err("a failure");
    assert!(failed.contains("connection refused"), "{failed}");
    let started = std::time::Instant::now();
    let slow = run(&sh("sleep 30"), &[], COMMAND_TIMEOUT).await.expect_err("too slow");
    assert!(slow.contains("longer than"), "{slow}");
    assert!(started.elapsed() < Duration::from_secs(10), "stopped at the timeout, not after the command");
    let chatty = run(&sh("head -c 1000000 /dev/zero | tr '\\0' x"), &[], COMMAND_TIMEOUT).await.expect_err("too long");
    assert!(chatty.contains("more than"), "{chatty}");
}

/// What a status command's shell started (a client waiting on a locked server) ends with
/// it, in time or not: a client left behind would hold one of the engine's connections.
#[tokio::test]
async fn what_a_command_started_does_not_outlive_it() {
    let dir = std::env::temp_dir().join(format!("plugdb-agent-group-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory");
    let started = |file: &str| {
        let pid: i32 = std::fs::read_to_string(dir.join(file)).expect("the pid written").trim().parse().expect("a pid");
        rustix::process::Pid::from_raw(pid).expect("a pid")
    };
    // Alive is a process that can be signalled and is not a zombie waiting to be reaped.
    let alive = |pid: rustix::process::Pid| {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())).unwrap_or_default();
        rustix::process::test_kill_process(pid).is_ok() && !stat.rsplit(')').next().unwrap_or_default().trim_start().starts_with('Z')
    };
    let script = |file: &str, then: &str| sh(&format!("sleep 30 >/dev/null 2>&1 & echo $! > {}; {then}", dir.join(file).display()));
    let slow = run(&script("timed-out", "wait"), &[], Duration::from_millis(500)).await;
    assert!(slow.is_err_and(|e| e.contains("longer than")));
    let done = run(&script("done", "echo primary 0/1"), &[], COMMAND_TIMEOUT).await;
    assert_eq!(done, Ok("primary 0/1\n".into()));
    let gone = within(Duration::from_secs(5), || !alive(started("timed-out")) && !alive(started("done"))).await;
    let _ = std::fs::remove_dir_all(&dir);
    assert!(gone, "the sleeps the commands started were killed with them");
}

/// Certificates of one Database's authority, on disk as the agent's volume holds them,
/// the operator's identity (PEM certificate and key, from an authority of its own), and
/// what else holds a certificate: the agent's own and the Database's serving certificate
/// (for servers and clients, which its members and Jobs mount and the engine can read).
struct Issued {
    dir: tempdir::Dir,
    /// The operator's authority's fingerprint, as the member's template pins it.
    pin: String,
    ca: Vec<u8>,
    operator: Vec<u8>,
    agent: Vec<u8>,
    serving: Vec<u8>,
}

mod tempdir {
    /// A directory removed when dropped.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn issued(name: &str) -> Issued {
    let now = chrono::Utc::now();
    let authority = new_authority(name, "shop", now).expect("authority");
    let names = ["*.db-headless.shop.svc".to_string()];
    let server = issue_for(name, "shop", &authority.key, ("db-headless", &names), Use::Server, now).expect("server");
    let serving = crate::tls::issue(name, "shop", &authority.key, &crate::tls::names(name, "shop"), now).expect("serving");
    let operator = crate::tls::OperatorIdentity::new(now).expect("the operator's identity");
    let dir = std::env::temp_dir().join(format!("plugdb-agent-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join(crate::tls::CERTIFICATE), &server.certificate).expect("write");
    std::fs::write(dir.join(crate::tls::KEY), &server.key).expect("write");
    std::fs::write(dir.join(crate::tls::CA), &authority.certificate).expect("write");
    std::fs::write(dir.join(CLIENTS_CA), &operator.authority.certificate).expect("write");
    Issued {
        dir: tempdir::Dir(dir),
        pin: fingerprints(operator.authority.certificate.as_bytes()).remove(0),
        ca: authority.certificate.into_bytes(),
        operator: operator.client_pem(),
        agent: [server.certificate, server.key].concat().into_bytes(),
        serving: [serving.certificate, serving.key].concat().into_bytes(),
    }
}

impl Issued {
    /// What the agent is told to trust: its certificates here, and the operator's authority.
    fn trust(&self) -> Trust {
        Trust { certs: self.dir.0.clone(), clients: self.pin.clone() }
    }
}

fn member(name: &str) -> Observed {
    Observed::at(name, Some("127.0.0.1".into()))
}

/// A fence whose command notes in `dir` that it ran, cut off after a second.
fn fence_in(dir: &Path, control_plane: Option<String>) -> Fence {
    Fence {
        argv: sh(&format!("echo fenced >> {}/ran", dir.display())),
        mark: dir.join(FENCED_FILE),
        stop: dir.join(guard::STOP_FILE),
        // Unresolvable: as when the cluster's DNS is out of reach.
        members: "db-headless.shop.svc.invalid".into(),
        own: None,
        control_plane,
        cut_off_after: Duration::from_secs(1),
    }
}

/// The cluster's DNS out of reach (busy, or gone with the control plane): the members it
/// listed last are looked at instead, and only a member that never heard of another, or
/// reaches none of those it heard of, counts as cut off from them.
#[tokio::test]
async fn a_member_whose_dns_does_not_answer_looks_at_the_members_it_knew() {
    let dir = std::env::temp_dir().join(format!("plugdb-agent-dns-{}", std::process::id()));
    let fence = fence_in(&dir, None);
    let other = std::net::TcpListener::bind("127.0.0.1:0").expect("a member's port");
    let mut known = Vec::new();
    assert!(!any_member_reachable(&fence, &mut known).await, "never heard of another member");
    known.push(other.local_addr().expect("its address"));
    assert!(any_member_reachable(&fence, &mut known).await, "the member it heard of answers");
    // Gone: at its address nothing listens, and the address stays held (a port merely
    // let go may be another test's a moment later).
    let gone = tokio::net::TcpSocket::new_v4().expect("a socket");
    gone.bind("127.0.0.1:0".parse().expect("an address")).expect("bound, not listening");
    known = vec![gone.local_addr().expect("its address")];
    assert!(!any_member_reachable(&fence, &mut known).await, "the member it heard of is gone too");
}

/// Whether `check` holds within `within`.
async fn within(within: Duration, check: impl Fn() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    while !check() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    true
}

/// A control plane out of reach (an address nothing listens on) and one in reach (the
/// listener returned, kept open while the test runs).
fn control_planes() -> (String, std::net::TcpListener) {
    let closed = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        probe.local_addr().expect("address").to_string()
    };
    (closed, std::net::TcpListener::bind("127.0.0.1:0").expect("a port"))
}

/// A primary cut off from the control plane and from every other member fences itself;
/// a replica does not, nor does a primary that still reaches the control plane.
#[tokio::test]
async fn a_primary_cut_off_from_everyone_fences_itself() {
    let (closed, open) = control_planes();
    let cases = [
        ("primary 0/5", Some(closed.clone()), true),
        ("replica 0/5", Some(closed), false),
        ("primary 0/5", Some(open.local_addr().expect("address").to_string()), false),
        ("primary 0/5", None, false),
    ];
    let mut watched = Vec::new();
    for (i, (said, control_plane, fences)) in cases.into_iter().enumerate() {
        let dir = std::env::temp_dir().join(format!("plugdb-agent-cut-off-{i}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let fence = fence_in(&dir, control_plane);
        let agent = Agent::new(Commands { status: sh(&format!("echo {said}")), fence: Some(fence), ..Default::default() }, None, None);
        tokio::spawn(watch(Arc::new(agent)));
        watched.push((tempdir::Dir(dir), said, fences));
    }
    for (dir, said, fences) in &watched {
        let ran = dir.0.join("ran");
        if *fences {
            assert!(within(Duration::from_secs(15), || ran.exists()).await, "{said}, cut off: fenced");
            assert!(ready(&dir.0.join(FENCED_FILE)).is_err(), "a fenced member is not ready");
        }
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    for (dir, said, fences) in &watched {
        assert_eq!(dir.0.join("ran").exists(), *fences, "{said}: fenced only when primary and cut off from everyone");
        assert_eq!(ready(&dir.0.join(FENCED_FILE)).is_ok(), !*fences);
    }
}

/// A primary cut off from everyone whose fence command fails (its engine hung, or a
/// commit waiting for a replica it no longer reaches) orders its guard to stop the
/// engine, and its fence is then confirmed; a fence the operator ordered does not
/// (the operator orders the stop, `POST /stop`).
#[tokio::test]
async fn a_cut_off_primary_whose_fence_fails_is_stopped_by_its_guard() {
    let (closed, open) = control_planes();
    let mut watched = Vec::new();
    for (i, (control_plane, stops)) in [(closed, true), (open.local_addr().expect("address").to_string(), false)].into_iter().enumerate() {
        let dir = std::env::temp_dir().join(format!("plugdb-agent-cut-off-hung-{i}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let stop = dir.join(guard::STOP_FILE);
        // The engine confirms nothing until its guard has been told to stop it.
        let fence = Fence { argv: sh(&format!("test -e {}", stop.display())), ..fence_in(&dir, Some(control_plane)) };
        let agent = Arc::new(Agent::new(Commands { status: sh("echo primary 0/5"), fence: Some(fence), ..Default::default() }, None, None));
        if !stops {
            agent.mark_fenced("the operator fenced it").expect("mark");
        }
        tokio::spawn(watch(agent.clone()));
        watched.push((tempdir::Dir(dir), agent, stops));
    }
    for (dir, agent, stops) in &watched {
        if *stops {
            let confirmed = || agent.fence_runs.load(Ordering::SeqCst) > 0;
            assert!(within(Duration::from_secs(15), confirmed).await, "cut off: fenced, then confirmed once stopped");
            assert!(dir.0.join(guard::STOP_FILE).exists(), "the guard's order");
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (dir, agent, _) = &watched[1];
    assert!(!dir.0.join(guard::STOP_FILE).exists(), "an ordered fence that fails stops nothing by itself");
    assert_eq!(agent.fence_runs.load(Ordering::SeqCst), 0, "nor is it confirmed");
}

/// The agent answers the operator's certificate, and nobody else: no certificate, the
/// agent's own (for servers only), the Database's serving certificate (signed by the same
/// authority as the agent's, for clients too, and readable by the engine), or another
/// operator's. The operator alone promotes and fences the member, and a fenced member is
/// never promoted.
#[tokio::test]
async fn only_the_operator_is_answered() {
    let ours = issued("db");
    let theirs = issued("other");
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        probe.local_addr().expect("address").port()
    };
    let certs = ours.dir.0.clone();
    let fence = fence_in(&certs, None);
    let promote = sh(&format!("echo promoted >> {}/promoted", certs.display()));
    let synchronous =
        sh(&format!("echo \"$PLUGDB_SYNCHRONOUS_REPLICAS of [$PLUGDB_SYNCHRONOUS_MEMBERS]\" >> {}/synchronous", certs.display()));
    let follow = sh(&format!("echo \"$PLUGDB_PRIMARY_HOST\" >> {}/followed", certs.display()));
    let commands =
        Commands { status: sh("echo replica 0/3000148"), fence: Some(fence), promote, synchronous, follow, ..Default::default() };
    tokio::spawn(serve(([0, 0, 0, 0], port).into(), ours.trust(), commands, None));
    let status = crate::plugin::MemberQuery { port, path: "/status".into(), body: None, https: true };
    let fence = crate::plugin::MemberQuery { port, path: "/fence".into(), body: Some(String::new()), https: true };
    let ask_to = |query: &crate::plugin::MemberQuery, identity: Option<Vec<u8>>| {
        let (ca, query) = (ours.ca.clone(), query.clone());
        async move {
            let transport = Transport::Tls { ca: &ca, domain: "db-headless.shop.svc", identity: identity.as_deref() };
            answers(transport, &query, &[member("db-0")]).await.remove(0)
        }
    };
    let ask = |identity: Option<Vec<u8>>| ask_to(&status, identity);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let answer = loop {
        match ask(Some(ours.operator.clone())).await {
            Some(answer) => break answer,
            None if std::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            None => panic!("the operator was never answered"),
        }
    };
    assert_eq!(
        parse(&answer),
        Ok(Status {
            primary: false,
            position: "0/3000148".into(),
            lag: None,
            volume: None,
            archive: None,
            exporter: None,
            signals: Default::default()
        })
    );
    assert_eq!(ask(None).await, None, "no client certificate: refused");
    assert_eq!(ask(Some(ours.agent.clone())).await, None, "an agent's certificate asks nobody");
    assert_eq!(ask(Some(theirs.operator.clone())).await, None, "another operator is refused");
    assert_eq!(ask(Some(ours.serving.clone())).await, None, "the Database's own certificate is refused");

    let promote = crate::plugin::MemberQuery { port, path: "/promote".into(), body: Some(String::new()), https: true };
    let post = |path: &str| crate::plugin::MemberQuery { port, path: path.into(), body: Some(String::new()), https: true };
    let promoted = ours.dir.0.join("promoted");
    let synchronous = ours.dir.0.join("synchronous");
    let followed = ours.dir.0.join("followed");
    let (mark, ran) = (ours.dir.0.join(FENCED_FILE), ours.dir.0.join("ran"));
    for refused in [None, Some(ours.agent.clone()), Some(theirs.operator.clone()), Some(ours.serving.clone())] {
        assert_eq!(ask_to(&fence, refused.clone()).await, None, "only the operator fences");
        assert_eq!(ask_to(&promote, refused.clone()).await, None, "only the operator promotes");
        assert_eq!(ask_to(&post("/synchronous/0"), refused.clone()).await, None, "only the operator lowers synchronous replication");
        assert_eq!(ask_to(&post("/follow/db-2"), refused).await, None, "only the operator says whom to follow");
    }
    assert!(!followed.exists(), "following no one anyone else named");
    for not_a_member in ["/follow/", "/follow/Db-2", "/follow/db-2.evil.example", "/follow/-db", "/follow/db%20x", "/follow/db;id"] {
        assert_eq!(ask_to(&post(not_a_member), Some(ours.operator.clone())).await, None, "{not_a_member}: refused");
    }
    assert_eq!(ask_to(&post("/follow/db-2"), Some(ours.operator.clone())).await.as_deref(), Some("following\n"));
    let host = "db-2.db-headless.shop.svc.invalid\n";
    assert_eq!(std::fs::read_to_string(&followed).expect("the follow command ran"), host, "the member named, under the members' name");
    assert!(!promoted.exists(), "not promoted by anyone else");
    assert!(!synchronous.exists(), "synchronous replication not changed by anyone else");
    for not_a_number in
        ["/synchronous/10", "/synchronous/x", "/synchronous/", "/synchronous/1;2", "/synchronous/1/a;b", "/synchronous/1/$(id)"]
    {
        assert_eq!(ask_to(&post(not_a_number), Some(ours.operator.clone())).await, None, "{not_a_number}: refused");
    }
    assert_eq!(ask_to(&post("/synchronous/0"), Some(ours.operator.clone())).await.as_deref(), Some("set\n"));
    assert_eq!(ask_to(&post("/synchronous/2"), Some(ours.operator.clone())).await.as_deref(), Some("set\n"));
    assert_eq!(ask_to(&post("/synchronous/1/orders-1,orders-2"), Some(ours.operator.clone())).await.as_deref(), Some("set\n"));
    assert_eq!(
        std::fs::read_to_string(&synchronous).expect("the synchronous command ran"),
        "0 of []\n2 of []\n1 of [orders-1,orders-2]\n",
        "with the number and the members asked for"
    );
    assert_eq!(ask_to(&promote, Some(ours.operator.clone())).await.as_deref(), Some("promoted\n"));
    assert_eq!(std::fs::read_to_string(&promoted).expect("the promote command ran"), "promoted\n");
    assert!(ready(&mark).is_ok() && !ran.exists(), "not fenced by anyone else");
    assert_eq!(ask_to(&fence, Some(ours.operator.clone())).await.as_deref(), Some("fenced\n"));
    assert!(ready(&mark).is_err(), "fenced: not ready");
    assert!(within(Duration::from_secs(10), || ran.exists()).await, "the fence command ran");
    assert_eq!(ask_to(&promote, Some(ours.operator.clone())).await, None, "a fenced member is not promoted");
    assert_eq!(ask_to(&post("/synchronous/0"), Some(ours.operator.clone())).await, None, "nor has its synchronous replication changed");
    assert_eq!(ask_to(&post("/follow/db-1"), Some(ours.operator.clone())).await, None, "nor follows anyone");
    assert_eq!(std::fs::read_to_string(&followed).expect("followed once"), host);
    assert_eq!(std::fs::read_to_string(&promoted).expect("promoted once"), "promoted\n");
}

/// The authority the agent obeys is the one pinned in its arguments, not whatever Secret
/// `<name>-agent` holds: someone who may write Secrets in the Database's namespace and puts
/// an authority of their own there is not obeyed (and nor is anyone, until the operator's
/// is back).
#[tokio::test]
async fn an_authority_put_into_the_secret_is_not_obeyed() {
    let ours = issued("pinned");
    let tenant = issued("tenant");
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        probe.local_addr().expect("address").port()
    };
    let commands = Commands { status: sh("echo primary 0/7"), ..Default::default() };
    tokio::spawn(serve(([0, 0, 0, 0], port).into(), ours.trust(), commands, None));
    let status = crate::plugin::MemberQuery { port, path: "/status".into(), body: None, https: true };
    let ask = |identity: Vec<u8>| {
        let (ca, status) = (ours.ca.clone(), status.clone());
        async move {
            let transport = Transport::Tls { ca: &ca, domain: "db-headless.shop.svc", identity: Some(&identity) };
            answers(transport, &status, &[member("db-0")]).await.remove(0)
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ask(ours.operator.clone()).await.is_none() {
        assert!(std::time::Instant::now() < deadline, "the operator was never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let clients = ours.dir.0.join(CLIENTS_CA);
    let (operators, tenants) = (std::fs::read(&clients).expect("ours"), std::fs::read(tenant.dir.0.join(CLIENTS_CA)).expect("theirs"));
    std::fs::write(&clients, &tenants).expect("the tenant's authority instead");
    assert_eq!(ask(tenant.operator.clone()).await, None, "the tenant's authority in the Secret: its certificates are not obeyed");
    assert_eq!(ask(ours.operator.clone()).await, None, "nor, without its authority there, is the operator");
    std::fs::write(&clients, [tenants, operators].concat()).expect("both");
    assert_eq!(ask(tenant.operator.clone()).await, None, "beside the operator's: still not obeyed");
    assert_eq!(ask(ours.operator.clone()).await.as_deref(), Some("primary 0/7\n"), "the operator's alone is");
}

/// `count` connections to `port` from another address (127.0.0.2) that send nothing,
/// once the server has had a moment to accept them.
async fn idle_from_elsewhere(port: u16, count: usize) -> Vec<tokio::net::TcpStream> {
    let mut idle = Vec::new();
    for _ in 0..count {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket.bind("127.0.0.2:0".parse().expect("an address")).expect("bound to another address");
        idle.push(socket.connect(([127, 0, 0, 1], port).into()).await.expect("connected"));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    idle
}

/// Idle connections that never finish a handshake, from another address (a pod of the
/// tenant's), hold at most [`PER_PEER`] of the agent's slots: the operator is answered
/// at once while they hang on.
#[tokio::test]
async fn idle_connections_from_elsewhere_do_not_starve_the_operator() {
    let ours = issued("idle");
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        probe.local_addr().expect("address").port()
    };
    let commands = Commands { status: sh("echo replica 0/1"), ..Default::default() };
    tokio::spawn(serve(([0, 0, 0, 0], port).into(), ours.trust(), commands, None));
    let status = crate::plugin::MemberQuery { port, path: "/status".into(), body: None, https: true };
    let ask = || {
        let (ca, operator, status) = (ours.ca.clone(), ours.operator.clone(), status.clone());
        async move {
            let transport = Transport::Tls { ca: &ca, domain: "db-headless.shop.svc", identity: Some(&operator) };
            answers(transport, &status, &[member("db-0")]).await.remove(0)
        }
    };
    assert!(within(Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()).await, "serving");
    let idle = idle_from_elsewhere(port, 24).await;
    for _ in 0..5 {
        assert_eq!(ask().await.as_deref(), Some("replica 0/1\n"), "the operator is answered while 24 idle connections hang on");
    }
    drop(idle);
}

/// Serves `commands` as member `member` of shop/orders, its series on `metrics_port`,
/// once that port takes connections.
async fn serve_measured(ours: &Issued, port: u16, metrics_port: u16, commands: Commands, member: &str) {
    let member = metrics::Member {
        namespace: "shop".into(),
        database: "orders".into(),
        engine: "postgres".into(),
        member: member.into(),
        data: None,
        archive: None,
        exporter: None,
    };
    tokio::spawn(serve(([127, 0, 0, 1], port).into(), ours.trust(), commands, Some((metrics_port, member))));
    assert!(within(Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", metrics_port)).is_ok()).await, "serving");
}

/// Idle connections to the metrics port from another address (a pod of the tenant's)
/// hold at most six of its slots: the kubelet's look at the agent's readiness is
/// answered while they hang on, and the member is not made unready by them.
#[tokio::test]
async fn idle_connections_to_the_metrics_port_do_not_make_the_member_unready() {
    let ours = issued("idle-metrics");
    let (port, metrics_port) = (free_port(), free_port());
    let dir = ours.dir.0.clone();
    let commands = Commands { status: sh("echo replica 0/1"), fence: Some(fence_in(&dir, None)), ..Default::default() };
    serve_measured(&ours, port, metrics_port, commands, "orders-1").await;
    let idle = idle_from_elsewhere(metrics_port, 24).await;
    for _ in 0..5 {
        let ready = tokio::time::timeout(Duration::from_secs(2), http_get(metrics_port, "/ready")).await.expect("answered at once");
        assert!(ready.starts_with("HTTP/1.1 200"), "ready while 24 idle connections hang on: {ready}");
    }
    drop(idle);
}

/// An engine that does not confirm its fence (its fence command fails: hung) is stopped
/// when the operator asks, once fenced and not before; the stop is confirmed as the fence
/// is, by the fence command, which here succeeds once the guard's order is written.
#[tokio::test]
async fn a_fence_the_engine_does_not_confirm_is_confirmed_once_its_engine_is_stopped() {
    let ours = issued("hung");
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        probe.local_addr().expect("address").port()
    };
    let dir = ours.dir.0.clone();
    let stop = dir.join(guard::STOP_FILE);
    let fence = Fence { argv: sh(&format!("test -e {}", stop.display())), ..fence_in(&dir, None) };
    tokio::spawn(serve(
        ([0, 0, 0, 0], port).into(),
        ours.trust(),
        Commands { status: sh("echo primary 0/5"), fence: Some(fence), ..Default::default() },
        None,
    ));
    let ask = |path: &str, body: Option<String>| {
        let (ca, operator) = (ours.ca.clone(), ours.operator.clone());
        let query = crate::plugin::MemberQuery { port, path: path.into(), body, https: true };
        async move {
            let transport = Transport::Tls { ca: &ca, domain: "db-headless.shop.svc", identity: Some(&operator) };
            answers(transport, &query, &[member("db-0")]).await.remove(0)
        }
    };
    let post = |path: &str| ask(path, Some(String::new()));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ask("/status", None).await.is_none() {
        assert!(std::time::Instant::now() < deadline, "the agent never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(post("/stop").await, None, "a member not fenced is not stopped");
    assert!(!stop.exists());
    assert_eq!(post("/fence").await.as_deref(), Some("fencing\n"), "fenced, the engine not confirming");
    assert!(!stop.exists(), "a fence alone stops nothing");
    assert_eq!(post("/stop").await.as_deref(), Some("stopped\n"));
    assert!(stop.exists(), "the guard's order");
}

/// The operator waits [`FENCED_WITHIN`] of a node's isolation before it promotes another
/// member: a cut-off primary's agent has fenced it by then, whatever its timing.
#[test]
fn a_cut_off_primary_is_fenced_within_what_the_operator_waits_for() {
    let look = LOOK_EVERY + 2 * LOOK_TIMEOUT;
    // Its status command, waited for behind one ask under way, then its fence command,
    // and when that fails, the guard's look at the stop order.
    let commands = 3 * COMMAND_TIMEOUT + guard::LOOK_EVERY;
    assert!(ISOLATED_FENCE_AFTER + look + commands <= FENCED_WITHIN, "{:?}", ISOLATED_FENCE_AFTER + look + commands);
}

fn free_port() -> u16 {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    probe.local_addr().expect("address").port()
}

async fn http_get(port: u16, path: &str) -> String {
    crate::serve::tests::get(([127, 0, 0, 1], port).into(), path).await
}

/// A scrape gets the member's role, lag, fence and volume, labelled with who it is,
/// without a client certificate; the status command runs at most once every
/// `metrics::FRESH_FOR`, however often it is scraped.
#[tokio::test]
async fn the_members_series_are_served_to_a_scraper() {
    let ours = issued("measured");
    let (port, metrics_port) = (free_port(), free_port());
    let dir = ours.dir.0.clone();
    let runs = dir.join("runs");
    let status = sh(&format!("echo run >> {}; echo replica 0/5 2.5", runs.display()));
    let commands = Commands { status, fence: Some(fence_in(&dir, None)), ..Default::default() };
    // One finished segment waits to be shipped, one is being written.
    let archive = dir.join("archive");
    std::fs::create_dir_all(&archive).expect("the archive directory");
    std::fs::write(archive.join("000000010000000000000001"), "a segment").expect("a segment");
    std::fs::write(archive.join(".000000010000000000000002.partial"), "half").expect("a partial one");
    let member = metrics::Member {
        namespace: "shop".into(),
        database: "orders".into(),
        engine: "postgres".into(),
        member: "orders-1".into(),
        data: Some(dir.clone()),
        archive: Some(archive),
        exporter: None,
    };
    tokio::spawn(serve(([127, 0, 0, 1], port).into(), ours.trust(), commands, Some((metrics_port, member))));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", metrics_port)).await.is_err() {
        assert!(std::time::Instant::now() < deadline, "the series were never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let labels = r#"{namespace="shop",database="orders",engine="postgres",member="orders-1",role="replica"}"#;
    let scraped = http_get(metrics_port, "/metrics").await;
    assert!(scraped.starts_with("HTTP/1.1 200"), "{scraped}");
    for line in [
        format!("plugdb_member_up{labels} 1.0"),
        format!("plugdb_member_fenced{labels} 0.0"),
        format!("plugdb_member_replication_lag_seconds{labels} 2.5"),
    ] {
        assert!(scraped.lines().any(|l| l == line), "{line} in {scraped}");
    }
    let value = |name: &str, scraped: &str| -> f64 {
        let line = scraped.lines().find(|l| l.starts_with(&format!("{name}{labels} "))).unwrap_or_else(|| panic!("{name}: {scraped}"));
        line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("a number")
    };
    let (size, used) = (value("plugdb_member_volume_size_bytes", &scraped), value("plugdb_member_volume_used_bytes", &scraped));
    assert!(size > 0.0 && used > 0.0 && used <= size, "{used} of {size}");
    let ready = http_get(metrics_port, "/ready").await;
    assert!(ready.starts_with("HTTP/1.1 200"), "the kubelet's look at an unfenced member: {ready}");
    std::fs::write(dir.join(FENCED_FILE), "fenced by a test\n").expect("the mark");
    let fenced = http_get(metrics_port, "/metrics").await;
    assert!(fenced.contains(&format!("plugdb_member_fenced{labels} 1.0")), "{fenced}");
    let ready = http_get(metrics_port, "/ready").await;
    assert!(ready.starts_with("HTTP/1.1 503") && ready.contains("fenced: fenced by a test"), "a fenced member is not ready: {ready}");
    assert_eq!(std::fs::read_to_string(&runs).expect("runs").lines().count(), 1, "one status command for both scrapes, none to look");
    assert!(http_get(metrics_port, "/status").await.starts_with("HTTP/1.1 404"), "nothing but the series and readiness are served there");
    // The operator is told the member's volume and its archive's backlog with its status.
    std::fs::remove_file(dir.join(FENCED_FILE)).expect("unfenced");
    let status = crate::plugin::MemberQuery { port, path: "/status".into(), body: None, https: true };
    let transport = Transport::Tls { ca: &ours.ca, domain: "db-headless.shop.svc", identity: Some(&ours.operator) };
    let answer = answers(transport, &status, &[super::tests::member("db-0")]).await.remove(0).expect("the operator is answered");
    let said = parse(&answer).expect("a status");
    let volume = said.volume.expect("with the volume");
    assert!(volume.used > 0 && volume.used <= volume.size, "{volume:?}");
    assert_eq!(said.archive.map(|a| a.segments), Some(1), "one finished segment waits: {answer}");
}

/// The engine's exec probes run in the agent, asked over HTTP by the kubelet: `200` when
/// the command exits 0, `503` with what it said otherwise or once it runs past its
/// timeout; asks at once share one run, and one that is not given is not served.
#[tokio::test]
async fn the_engines_probes_run_in_the_agent_for_the_kubelet() {
    let ours = issued("probed");
    let (port, metrics_port) = (free_port(), free_port());
    let dir = ours.dir.0.clone();
    let (runs, up) = (dir.join("probe-runs"), dir.join("up"));
    let readiness = sh(&format!("echo run >> {}; test -f {} || {{ echo not up >&2; exit 1; }}", runs.display(), up.display()));
    let commands = Commands {
        status: sh("echo replica 0/1"),
        readiness: Some(protocol::Check { command: readiness, timeout_seconds: 1 }),
        liveness: Some(protocol::Check { command: sh("sleep 5"), timeout_seconds: 1 }),
        ..Default::default()
    };
    serve_measured(&ours, port, metrics_port, commands, "orders-1").await;
    let said = http_get(metrics_port, "/engine/ready").await;
    assert!(said.starts_with("HTTP/1.1 503") && said.contains("not up"), "a probe that fails, with what it said: {said}");
    std::fs::write(&up, "").expect("up");
    tokio::time::sleep(metrics::CHECK_FRESH_FOR).await;
    let runs_before = std::fs::read_to_string(&runs).expect("runs").lines().count();
    let asks: Vec<_> = (0..4).map(|_| tokio::spawn(http_get(metrics_port, "/engine/ready"))).collect();
    for ask in asks {
        let said = ask.await.expect("asked");
        assert!(said.starts_with("HTTP/1.1 200"), "{said}");
    }
    let ran = std::fs::read_to_string(&runs).expect("runs").lines().count() - runs_before;
    assert_eq!(ran, 1, "four asks at once (the kubelet's probes may all come together), one run");
    assert!(http_get(metrics_port, "/live").await.starts_with("HTTP/1.1 200"), "the agent's own liveness");
    let started = std::time::Instant::now();
    let hung = http_get(metrics_port, "/engine/live").await;
    assert!(hung.starts_with("HTTP/1.1 503") && hung.contains("longer than 1s"), "a probe past its timeout fails: {hung}");
    assert!(started.elapsed() < Duration::from_secs(3), "answered at its timeout: {:?}", started.elapsed());

    let (port, metrics_port) = (free_port(), free_port());
    let commands = Commands { status: sh("echo replica 0/1"), ..Default::default() };
    serve_measured(&ours, port, metrics_port, commands, "orders-2").await;
    assert!(http_get(metrics_port, "/engine/ready").await.starts_with("HTTP/1.1 404"), "no probe given: none served");
}

/// The filling rate is read over at least a quarter of an hour of looks (a burst of
/// writes is no trend), from one look a minute at most, over the last six hours.
#[test]
fn a_volume_fills_at_the_rate_its_looks_span() {
    let filling = metrics::Filling::default();
    let start = std::time::Instant::now();
    let at = |minutes: u64| start + Duration::from_secs(60 * minutes);
    assert_eq!(filling.look(at(0), 1 << 30), None, "one look");
    assert_eq!(filling.look(at(10), 2 << 30), None, "ten minutes: not yet");
    assert_eq!(filling.look(at(30), 2 << 30), Some(2 << 30), "a GiB in half an hour");
    assert_eq!(filling.look(at(60), 1 << 30), Some(0), "emptied again: not filling");
    let later = metrics::Filling::default();
    for minute in 0..=420 {
        later.look(at(minute), minute << 20);
    }
    assert_eq!(later.0.0.lock().expect("looks").len(), 361, "six hours of looks a minute apart, no more");
    assert_eq!(later.look(at(420), 420 << 20), Some(60 << 20), "a MiB a minute");
}

/// A scrape and the operator's commands never wait for each other (a fence is not held
/// back by a scrape of a hung engine); while a scrape's command runs, another scrape is
/// served the last answer (none yet: the member's role is unknown and it is not up).
#[tokio::test]
async fn a_scrape_and_the_operators_commands_do_not_wait_for_each_other() {
    let agent = Agent::new(Commands { status: sh("echo primary 0/5"), ..Default::default() }, None, None);
    let looks = metrics::Looks::default();
    let _operators = agent.command.try_acquire().expect("the operator's command lock");
    let said = tokio::time::timeout(Duration::from_secs(5), metrics::status(&agent, &looks)).await.expect("not held back");
    assert_eq!(said.map(|s| s.primary), Some(true));
    let hung = Agent::new(Commands { status: sh("sleep 1; echo primary 0/5"), ..Default::default() }, None, None);
    let looks = metrics::Looks::default();
    let (first, second) = tokio::join!(metrics::status(&hung, &looks), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = std::time::Instant::now();
        (metrics::status(&hung, &looks).await, started.elapsed())
    });
    assert_eq!(first.map(|s| s.primary), Some(true));
    assert!(second.0.is_none() && second.1 < Duration::from_millis(500), "the last answer (none), at once: {second:?}");
    let member = metrics::Member {
        namespace: "a".into(),
        database: "b".into(),
        engine: "c".into(),
        member: "b-0".into(),
        data: None,
        archive: None,
        exporter: None,
    };
    let unknown = metrics::encode(&member, None, false, None, None);
    assert!(unknown.contains(r#"plugdb_member_up{namespace="a",database="b",engine="c",member="b-0",role="unknown"} 0.0"#), "{unknown}");
    assert!(!unknown.contains("plugdb_member_volume_size_bytes{"), "no volume, no series: {unknown}");
}

/// What waits in the archive directory to be shipped: the segments the engine finished
/// (a name not starting with `.`; one being written is not counted), and how long the
/// oldest has waited; none waiting is 0 and 0, and no directory no series.
#[test]
fn the_archive_directory_is_measured_by_what_waits_there() {
    let dir = tempdir::Dir(std::env::temp_dir().join(format!("plugdb-agent-archive-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).expect("a directory");
    let none = metrics::archive(&dir.0).expect("readable");
    assert_eq!((none.pending, none.oldest), (0, 0.0));
    std::fs::write(dir.0.join("000000010000000000000003"), b"wal").expect("a segment");
    std::fs::write(dir.0.join(".000000010000000000000004"), b"half").expect("one being written");
    let old = std::fs::File::options().write(true).open(dir.0.join("000000010000000000000003")).expect("open");
    old.set_modified(std::time::SystemTime::now() - Duration::from_secs(600)).expect("aged");
    let waiting = metrics::archive(&dir.0).expect("readable");
    assert_eq!(waiting.pending, 1);
    assert!((599.0..700.0).contains(&waiting.oldest), "{}", waiting.oldest);
    let member = metrics::Member {
        namespace: "a".into(),
        database: "b".into(),
        engine: "c".into(),
        member: "b-0".into(),
        data: None,
        archive: Some(dir.0.clone()),
        exporter: None,
    };
    let series = metrics::encode(&member, None, false, None, Some(waiting));
    let labels = r#"{namespace="a",database="b",engine="c",member="b-0",role="unknown"}"#;
    assert!(series.contains(&format!("plugdb_member_archive_pending_segments{labels} 1.0")), "{series}");
    assert!(series.contains("plugdb_member_archive_oldest_pending_seconds{"), "{series}");
    assert!(metrics::archive(&dir.0.join("gone")).is_none());
    assert!(!metrics::encode(&member, None, false, None, None).contains("plugdb_member_archive_pending_segments{"));
}

/// The status command's second line says its engine's health, read as coming from
/// anyone: known keys with numbers, unknown keys passed over, anything else refused.
#[test]
fn an_engines_signals_are_read_from_the_status_commands_second_line() {
    let said = parse("primary 0/5\nsignals connections=18/20 transaction=3700 xid-age=1200000000 held=1073741824 next=7\nvolume 1 2\n");
    let expected = signals::Signals {
        connections: Some((18, 20)),
        transaction: Some(3700),
        xid_age: Some(1_200_000_000),
        held: Some(1 << 30),
        lag_growth: None,
    };
    assert_eq!(said.map(|s| s.signals), Ok(expected));
    let lagging = parse("replica 0/5 90\nvolume 1 2\nlagging 240\narchive 0 0\nexporter up\n").map(|s| s.signals.lag_growth);
    assert_eq!(lagging, Ok(Some(240)));
    for bad in [
        "primary 0/5\nsignals connections=18",
        "primary 0/5\nsignals connections=18/0",
        "primary 0/5\nsignals connections=5000/20",
        "primary 0/5\nsignals transaction=-1",
        "primary 0/5\nsignals transaction",
        "primary 0/5\nsignals xid-age=1e9",
        "primary 0/5\nsignals held=99999999999999999999",
        "primary 0/5\nsignals a=1 b=1 c=1 d=1 e=1 f=1 g=1 h=1 i=1",
        "primary 0/5\nvolume 1 2\nsignals held=1",
        "primary 0/5\nlagging -3",
        "primary 0/5\nlagging 3\nvolume 1 2",
    ] {
        assert!(parse(bad).is_err(), "{bad:?} is no status with signals");
    }
    assert!(parse(&format!("primary 0/5\nsignals x={}", "1".repeat(250))).is_err(), "a line over 256 characters");
}

/// An agent that measures its member's volume passes on the status command's signals
/// line, and nothing else it printed after its first line: the volume is the agent's to
/// say; a replica's lag is looked at for its trend.
#[tokio::test]
async fn the_agent_passes_on_the_signals_line_alone() {
    let data = std::env::temp_dir();
    let agent = Agent::new(Commands::default(), Some(data), None);
    let out = "replica 0/5 12\nsignals connections=3/100 transaction=0\nprimary 0/9\n".to_string();
    let answer = with_measures(out, &agent);
    assert!(answer.starts_with("replica 0/5 12\nsignals connections=3/100 transaction=0\nvolume "), "{answer}");
    assert!(!answer.contains("primary"), "{answer}");
    let other = "replica 0/5 12\nvolume 1 2\n".to_string();
    let answer = with_measures(other, &agent);
    assert!(answer.starts_with("replica 0/5 12\nvolume ") && !answer.contains("volume 1 2"), "the agent says the volume: {answer}");
}

/// A replica's lag growing is read over at least a quarter of an hour of looks (a spike
/// is no trend); a lag that falls grows by 0; a member that says no lag forgets it.
#[test]
fn a_lags_growth_is_a_trend_over_a_quarter_of_an_hour() {
    let trend = signals::LagTrend::default();
    let start = std::time::Instant::now();
    let at = |minutes: u64| start + Duration::from_secs(minutes * 60);
    assert_eq!(trend.look(at(0), "replica 0/5 10"), None, "one look");
    assert_eq!(trend.look(at(10), "replica 0/6 100"), None, "ten minutes: not yet");
    assert_eq!(trend.look(at(20), "replica 0/7 210"), Some(600), "200 s more in 20 min: 600 s an hour");
    assert_eq!(trend.look(at(40), "replica 0/8 5"), Some(0), "caught up: not growing");
    assert_eq!(trend.look(at(41), "primary 0/9"), None, "promoted: no lag");
    assert_eq!(trend.look(at(42), "replica 0/9 500"), None, "what it saw before is forgotten");
}
