//! Members on the real node: scaling, the primary failing, configuration rolls and upgrades.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use plugdb_tests::operator::Cluster;
use serde_json::json;

use plugdb_tests::scenario::{Client, Engine, Failure, WAIT, database, identities, is_running, pod_ip, signal_engine};

async fn running(cluster: &Cluster, ns: &str, name: &str, replicas: i32) {
    cluster.wait_database(ns, name, &format!("{replicas} members Ready"), WAIT, |d| is_running(d, replicas)).await.expect("running");
}

/// 3 → 5: the new members join with the data; the running ones are not restarted.
pub async fn scale_up(cluster: Arc<Cluster>, engine: Engine, version: &str) {
    let ns = format!("{}-scale", engine.name());
    cluster.apply_database(&ns, database("orders", engine, version, 3, json!({}))).await.expect("apply");
    running(&cluster, &ns, "orders", 3).await;
    let client = Client::new(&cluster, engine, &ns, "orders").await;
    let primary = client.service_ip("orders").await;
    client.create_table(&primary).await;
    client.insert(&primary, 1..101).await;
    let before = identities(&client.members().await);

    cluster.apply_database(&ns, database("orders", engine, version, 5, json!({}))).await.expect("scale");
    running(&cluster, &ns, "orders", 5).await;
    let members = client.members().await;
    assert_eq!(members.len(), 5);
    let expected = client.checksum(&primary).await;
    for pod in &members {
        let got = client.eventually(&pod_ip(pod), "SELECT count(*) FROM orders", Duration::from_secs(60), |r| r == "100").await;
        assert_eq!(got, "100", "{} has the data", pod.name_any());
        assert_eq!(client.checksum(&pod_ip(pod)).await, expected, "{} has the same rows", pod.name_any());
    }
    let after = identities(&members);
    assert_eq!(&after[..3], &before[..], "the running members keep their pods and restart counts");

    // 5 → 3: the removed members' volumes are kept (a scale down never deletes data).
    cluster.apply_database(&ns, database("orders", engine, version, 3, json!({}))).await.expect("scale down");
    running(&cluster, &ns, "orders", 3).await;
    let deadline = Instant::now() + WAIT;
    while client.members().await.len() != 3 {
        assert!(Instant::now() < deadline, "members 3 and 4 stop");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let claims = Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(cluster.client.clone(), &ns);
    for i in 0..5 {
        claims.get(&format!("data-orders-{i}")).await.expect("every member's claim is kept");
    }
}

/// The primary's pod is deleted, then its engine process is killed: every acknowledged
/// write survives, writes are accepted again, and the members follow the primary.
pub async fn primary_failures(cluster: Arc<Cluster>, engine: Engine, version: &str) {
    let ns = format!("{}-failures", engine.name());
    cluster.apply_database(&ns, database("orders", engine, version, 3, json!({}))).await.expect("apply");
    running(&cluster, &ns, "orders", 3).await;
    let client = Arc::new(Client::new(&cluster, engine, &ns, "orders").await);
    let primary = client.service_ip("orders").await;
    client.create_table(&primary).await;

    let mut next = 1;
    for failure in [Failure::PodDeleted, Failure::EngineKilled] {
        let stop = Arc::new(AtomicBool::new(false));
        let writer = client.writer(next, stop.clone());
        tokio::time::sleep(Duration::from_secs(2)).await;
        let recovered = client.strike(failure).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.store(true, Ordering::SeqCst);
        let (acknowledged, _) = writer.await.expect("writer");
        eprintln!("{ns}: {failure}: writes accepted again {:.1} s after", recovered.as_secs_f64());
        assert!(!acknowledged.is_empty(), "the writer wrote before {failure}");
        running(&cluster, &ns, "orders", 3).await;
        let present = client.ids(&primary).await.expect("ids");
        let lost: Vec<&i64> = acknowledged.iter().filter(|id| !present.contains(id)).collect();
        assert!(lost.is_empty(), "{failure}: acknowledged writes lost: {lost:?}");
        // The next round's ids start past every row written so far: an insert that
        // committed but whose answer was lost in the failure is not acknowledged, yet its
        // id is taken (the recovery probes count down from 2,000,000,000).
        next = present.iter().copied().filter(|id| *id < 1_000_000_000).max().unwrap_or(next).max(next) + 1;
        // Every member catches up with the primary: a replica whose stream ended retries
        // every 5 s, each try bounded by its connect timeout but not by the cluster's DNS,
        // which a busy machine can keep it waiting on for tens of seconds.
        let expected = client.checksum(&primary).await;
        for pod in client.members().await {
            let ip = pod_ip(&pod);
            let deadline = Instant::now() + Duration::from_secs(180);
            while client.checksum(&ip).await != expected {
                assert!(Instant::now() < deadline, "{} follows the primary after {failure}", pod.name_any());
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

async fn restart_order(cluster: &Cluster, ns: &str) -> Vec<String> {
    let mut events = Api::<Event>::namespaced(cluster.client.clone(), ns).list(&ListParams::default()).await.expect("events").items;
    events.retain(|e| e.reason.as_deref() == Some("MemberRestarted"));
    events.sort_by_key(|e| e.event_time.clone().map(|t| t.0));
    events.iter().filter_map(|e| e.note.clone()).collect()
}

/// A parameter change restarts replicas first (highest ordinal first), the primary last,
/// and every member's engine reports the new value.
pub async fn parameter_roll(cluster: Arc<Cluster>) {
    let ns = "postgres-parameters";
    let with = |n: i64| json!({"parameters": {"max_connections": n}});
    cluster.apply_database(ns, database("orders", Engine::Postgres, "15", 3, with(100))).await.expect("apply");
    running(&cluster, ns, "orders", 3).await;
    let client = Client::new(&cluster, Engine::Postgres, ns, "orders").await;
    for pod in client.members().await {
        assert_eq!(client.setting(&pod_ip(&pod), "max_connections").await.as_deref(), Ok("100"));
    }
    cluster.apply_database(ns, database("orders", Engine::Postgres, "15", 3, with(150))).await.expect("change");
    let deadline = Instant::now() + WAIT;
    loop {
        let mut values = Vec::new();
        for pod in client.members().await {
            // A member being restarted has no address for a moment.
            let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else { continue };
            values.push(client.setting(&ip, "max_connections").await.unwrap_or_default());
        }
        if values.len() == 3 && values.iter().all(|v| v == "150") {
            break;
        }
        assert!(Instant::now() < deadline, "members report {values:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    running(&cluster, ns, "orders", 3).await;
    let order = restart_order(&cluster, ns).await;
    assert_eq!(order.len(), 3, "{order:?}");
    assert!(order[0].contains("orders-2") && order[1].contains("orders-1") && order[2].contains("orders-0"), "replicas first: {order:?}");
}

/// 15 → 15.<minor> with a writer running: members roll, no acknowledged write is lost.
pub async fn minor_upgrade(cluster: Arc<Cluster>) {
    let ns = "postgres-upgrade";
    cluster.apply_database(ns, database("orders", Engine::Postgres, "15", 3, json!({}))).await.expect("apply");
    running(&cluster, ns, "orders", 3).await;
    let client = Arc::new(Client::new(&cluster, Engine::Postgres, ns, "orders").await);
    let primary = client.service_ip("orders").await;
    client.create_table(&primary).await;
    let minor = client.query(&primary, "SHOW server_version").await.expect("version");
    let minor = minor.split_whitespace().next().unwrap_or_default().to_string();
    assert!(minor.starts_with("15."), "{minor}");

    let stop = Arc::new(AtomicBool::new(false));
    let writer = client.writer(1, stop.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.apply_database(ns, database("orders", Engine::Postgres, &minor, 3, json!({}))).await.expect("upgrade");
    cluster
        .wait_database(ns, "orders", "upgraded", WAIT, |d| {
            d.status.as_ref().and_then(|s| s.current_version.as_deref()) == Some(minor.as_str()) && is_running(d, 3)
        })
        .await
        .expect("upgraded");
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    let (acknowledged, longest) = writer.await.expect("writer");
    eprintln!("{ns}: longest pause between acknowledged writes during the roll: {:.1} s", longest.as_secs_f64());
    let present = client.ids(&primary).await.expect("ids");
    let lost: Vec<&i64> = acknowledged.iter().filter(|id| !present.contains(id)).collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    let order = restart_order(&cluster, ns).await;
    assert_eq!(order.len(), 3, "every member restarted onto the new image: {order:?}");
    assert!(order[0].contains("orders-2") && order[1].contains("orders-1") && order[2].contains("orders-0"), "replicas first: {order:?}");
    for pod in client.members().await {
        let image = pod.spec.as_ref().map(|s| s.containers[0].image.clone().unwrap_or_default()).unwrap_or_default();
        assert_eq!(image, format!("docker.io/library/postgres:{minor}"), "{}", pod.name_any());
    }

    // A downgrade is refused by the plugin: a condition and an Event; nothing restarts.
    let (major, patch) = minor.split_once('.').expect("major.minor");
    let lower = format!("{major}.{}", patch.parse::<u32>().expect("a minor number") - 1);
    let before = identities(&client.members().await);
    cluster.apply_database(ns, database("orders", Engine::Postgres, &lower, 3, json!({}))).await.expect("downgrade");
    let db = cluster
        .wait_database(ns, "orders", "UpgradeRefused", WAIT, |d| {
            d.status
                .as_ref()
                .is_some_and(|s| s.conditions.iter().any(|c| c.reason == "UpgradeRefused" && c.message.contains("downgrading")))
        })
        .await
        .expect("refused");
    assert_eq!(db.status.as_ref().and_then(|s| s.current_version.as_deref()), Some(minor.as_str()), "the running version stays");
    // A second, different refusal is an Event of its own with its own text.
    cluster.apply_database(ns, database("orders", Engine::Postgres, "17", 3, json!({}))).await.expect("major");
    cluster
        .wait_database(ns, "orders", "the major upgrade refused", WAIT, |d| {
            d.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.reason == "UpgradeRefused" && c.message.contains("major")))
        })
        .await
        .expect("refused");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = Api::<Event>::namespaced(cluster.client.clone(), ns).list(&ListParams::default()).await.expect("events").items;
        let notes: Vec<String> =
            events.iter().filter(|e| e.reason.as_deref() == Some("UpgradeRefused")).filter_map(|e| e.note.clone()).collect();
        if notes.iter().any(|n| n.contains("downgrading")) && notes.iter().any(|n| n.contains("major upgrade")) {
            break;
        }
        assert!(Instant::now() < deadline, "each refusal's Event shows its own text: {notes:#?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Back to the running version: the refusal is history, the condition says so.
    cluster.apply_database(ns, database("orders", Engine::Postgres, &minor, 3, json!({}))).await.expect("fixed");
    cluster
        .wait_database(ns, "orders", "Progressing=False Steady", WAIT, |d| {
            is_running(d, 3)
                && d.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Progressing" && c.reason == "Steady"))
        })
        .await
        .expect("the stale refusal is gone");
    assert_eq!(identities(&client.members().await), before, "no member restarted");
}

/// MariaDB 10.11 → 11.8: a backup first, then the members roll onto 11.8 and each brings
/// its own system tables up to date as it starts (no Job logs in as root over the
/// network); the data is there and the servers report 11.8.
pub async fn mariadb_major_upgrade(cluster: Arc<Cluster>) {
    let ns = "mysql-upgrade";
    let yearly = json!({"backup": {"schedule": "0 0 1 1 *"}});
    cluster.apply_database(ns, database("shop", Engine::Mysql, "10.11", 2, yearly.clone())).await.expect("apply");
    running(&cluster, ns, "shop", 2).await;
    let client = Client::new(&cluster, Engine::Mysql, ns, "shop").await;
    let primary = client.service_ip("shop").await;
    client.create_table(&primary).await;
    client.insert(&primary, 1..51).await;
    let before = client.checksum(&primary).await;

    cluster.apply_database(ns, database("shop", Engine::Mysql, "11.8", 2, yearly)).await.expect("upgrade");
    cluster
        .wait_database(ns, "shop", "upgraded to 11.8", WAIT, |d| {
            d.status.as_ref().and_then(|s| s.current_version.as_deref()) == Some("11.8") && is_running(d, 2)
        })
        .await
        .expect("upgraded");
    let jobs =
        Api::<k8s_openapi::api::batch::v1::Job>::namespaced(cluster.client.clone(), ns).list(&ListParams::default()).await.expect("jobs");
    let succeeded = |prefix: &str| {
        jobs.items.iter().any(|j| j.name_any().starts_with(prefix) && j.status.as_ref().and_then(|s| s.succeeded) == Some(1))
    };
    assert!(succeeded("shop-pre-"), "a pre-upgrade backup ran");
    assert!(!jobs.items.iter().any(|j| j.name_any().starts_with("shop-upgrade-")), "no upgrade Job");
    for (ordinal, pod) in client.members().await.iter().enumerate() {
        let version = client.query(&pod_ip(pod), "SELECT VERSION()").await.expect("version");
        assert!(version.starts_with("11.8."), "{} runs {version}", pod.name_any());
        // mariadb-upgrade records the version it brought the system tables to (11.x
        // renamed the file).
        let data = plugdb_tests::scenario::volume_path(&cluster, ns, &format!("data-shop-{ordinal}")).await.join("data");
        let info = ["mariadb_upgrade_info", "mysql_upgrade_info"].into_iter().find_map(|f| std::fs::read_to_string(data.join(f)).ok());
        let upgraded = info.unwrap_or_default();
        assert!(upgraded.starts_with("11.8."), "{}: system tables at {upgraded:?}", pod.name_any());
    }
    assert_eq!(client.checksum(&primary).await, before, "the data survived the upgrade");
}

/// The primary hangs (its engine gets SIGSTOP: the port still accepts connections, the
/// readiness probe fails), and so does one replica's agent, which runs that replica's
/// probes: the replica goes not ready too, and `status.members` says so. It never holds
/// the failover back: with nothing set by the test, the replica whose agent answers is
/// promoted, once the old primary's agent has fenced it (the failover's Event says so).
/// Writes are accepted again through the read-write Service with every earlier row
/// there; the old primary, stopped by its guard, comes back as a replica of the new one
/// with the new data, and so does the silent replica once its agent runs again.
pub async fn failover_promotion(cluster: Arc<Cluster>) {
    let ns = "postgres-failover";
    cluster.apply_database(ns, database("orders", Engine::Postgres, "15", 3, json!({}))).await.expect("apply");
    running(&cluster, ns, "orders", 3).await;
    let client = Client::new(&cluster, Engine::Postgres, ns, "orders").await;
    let service = client.service_ip("orders").await;
    client.create_table(&service).await;
    client.insert(&service, 1..101).await;
    let members = client.members().await;
    for pod in &members[1..] {
        client.eventually(&pod_ip(pod), "SELECT count(*) FROM orders", Duration::from_secs(60), |r| r == "100").await;
    }

    signal_engine(&members[0], "postgres", "STOP");
    plugdb_tests::scenario::signal_container(&members[1], "agent", "plugdb", "STOP");
    let hung = Instant::now();
    let (silent, chosen) = (members[1].name_any(), members[2].name_any());
    let other = members[1].clone();
    cluster
        .wait_database(ns, "orders", "the replica whose agent answers promoted", WAIT, |d| {
            d.status.as_ref().and_then(|s| s.primary.as_deref()) == Some(&chosen)
        })
        .await
        .expect("promoted past the replica whose agent is silent");
    let promoted = hung.elapsed();
    let named = |d: &plugdb::crd::Database| {
        d.status.as_ref().is_some_and(|s| s.members.iter().any(|m| m.pod == silent && !m.ready && m.down.is_some()))
    };
    cluster.wait_database(ns, "orders", "the replica whose agent is silent named not ready", WAIT, named).await.expect("named");
    plugdb_tests::scenario::signal_container(&members[1], "agent", "plugdb", "CONT");
    // The hung primary's agent answers: it fenced the old primary before the promotion.
    let events = Api::<Event>::namespaced(cluster.client.clone(), ns).list(&ListParams::default()).await.expect("events").items;
    let said = events.iter().find(|e| e.reason.as_deref() == Some("FailoverPromoted")).and_then(|e| e.note.clone());
    let said = said.expect("a FailoverPromoted Event");
    assert!(said.contains("primary orders-0") && said.contains("fenced by its agent"), "{said}");
    // The silent replica was asked to follow the promoted member and did not answer (or,
    // its agent running again by then, did): one that does not follow restarts instead.
    let followed = said.ends_with("; 1 of 1 replicas told to follow it");
    assert!(followed || said.ends_with("; 0 of 1 replicas told to follow it"), "{said}");
    // status.members: each member's node and role, and the position its agent said.
    let db = cluster
        .wait_database(ns, "orders", "the promoted member primary in status.members", WAIT, |d| {
            d.status.as_ref().is_some_and(|s| s.members.iter().any(|m| m.pod == chosen && m.role == "primary"))
        })
        .await
        .expect("status.members");
    let listed = db.status.map(|s| s.members).unwrap_or_default();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(listed.iter().all(|m| m.node.is_some()), "{listed:?}");
    let promoted_said = listed.iter().find(|m| m.pod == chosen).expect("the promoted member");
    assert!(promoted_said.position.is_some() && promoted_said.heard.is_some(), "what its agent said: {promoted_said:?}");

    let deadline = Instant::now() + WAIT;
    while client.query(&service, "INSERT INTO orders VALUES (101, 'after the failover')").await.is_err() {
        assert!(Instant::now() < deadline, "no write accepted by the new primary");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "{ns}: primary and {silent}'s agent hung; {chosen} promoted {:.1} s after, a write accepted {:.1} s after the hang",
        promoted.as_secs_f64(),
        hung.elapsed().as_secs_f64()
    );
    let ids = client.ids(&service).await.expect("ids");
    assert_eq!(ids, (1..102).collect::<Vec<i64>>(), "every row written before the hang, and the new one");

    running(&cluster, ns, "orders", 3).await;
    let expected = client.checksum(&service).await;
    let old = client.members().await.into_iter().next().expect("orders-0");
    let ip = pod_ip(&old);
    let in_recovery = client.eventually(&ip, "SELECT pg_is_in_recovery()", Duration::from_secs(60), |r| r == "t").await;
    assert_eq!(in_recovery, "t", "the old primary follows the new one");
    let deadline = Instant::now() + Duration::from_secs(60);
    while client.checksum(&ip).await != expected {
        assert!(Instant::now() < deadline, "the old primary has the rows written after the failover");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The other replica, following the new primary as its agent had it right after the
    // promotion, runs on as it was (it is not made again for it) and has every row; one
    // that did not follow restarts onto the new primary's timeline.
    let deadline = Instant::now() + WAIT;
    let now = loop {
        let now = client.members().await.into_iter().find(|p| p.name_any() == other.name_any()).expect("the other replica");
        let same = now.metadata.uid == other.metadata.uid;
        assert!(same || !followed, "{} runs on, following the new primary", other.name_any());
        if same == followed && client.checksum(&pod_ip(&now)).await == expected {
            break now;
        }
        assert!(Instant::now() < deadline, "{} never had the rows written after the failover", other.name_any());
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let in_recovery = client.eventually(&pod_ip(&now), "SELECT pg_is_in_recovery()", Duration::from_secs(60), |r| r == "t").await;
    assert_eq!(in_recovery, "t", "{} follows the new primary", now.name_any());
}

/// The primary hangs for a minute under a writer (every process of its engine stopped),
/// with synchronous replication and nothing set by the test. Its agent answers but its
/// engine cannot confirm the fence, so the guard the engine runs under kills it before a
/// replica is promoted (the failover's Event says so), and writes go on through the
/// read-write Service. When the minute is up nothing of the old engine is left to run
/// again and commit what it had in flight: no acknowledged write is lost, and every
/// member, the old primary following the new one, ends with the same rows. The
/// operator is killed mid-failover, as soon as it has asked for the fence (the old
/// primary's pod says so) and before it promoted anyone: the one started in its place
/// finishes the failover from what the cluster says. (It restarts the operator every
/// scenario shares: this one runs alone.)
pub async fn hung_primary_under_a_writer(cluster: Arc<Cluster>, engine: Engine, version: &str) {
    let ns = &format!("{}-hung", engine.name());
    let spec = json!({"replication": {"mode": "Synchronous"}});
    cluster.apply_database(ns, database("orders", engine, version, 3, spec)).await.expect("apply");
    running(&cluster, ns, "orders", 3).await;
    let client = Arc::new(Client::new(&cluster, engine, ns, "orders").await);
    let rw = client.service_ip("orders").await;
    client.create_table(&rw).await;
    client.insert(&rw, 1..11).await;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = client.writer(1000, stop.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let old = client.members().await.into_iter().find(|p| p.name_any() == "orders-0").expect("the primary");
    let container = old.spec.as_ref().map(|s| s.containers[0].name.clone()).expect("the engine's container");

    plugdb_tests::scenario::signal_all(&old, &container, "STOP");
    let hung = Instant::now();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(cluster.client.clone(), ns);
    let fenced = async || pods.get("orders-0").await.is_ok_and(|p| p.annotations().contains_key(plugdb::names::FENCED));
    while !fenced().await {
        assert!(hung.elapsed() < WAIT, "the operator never asked for the hung primary's fence");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let promoted_yet = Api::<plugdb::crd::Database>::namespaced(cluster.client.clone(), ns).get("orders").await.expect("get");
    let mid = promoted_yet.status.and_then(|s| s.primary).as_deref() == Some("orders-0");
    cluster.restart_operator().expect("the operator restarted");
    eprintln!("{ns}: the operator killed {:.1} s into the hang, once it fenced (nobody promoted yet: {mid})", hung.elapsed().as_secs_f64());
    let led_elsewhere = |d: &plugdb::crd::Database| d.status.as_ref().and_then(|s| s.primary.as_deref()).is_some_and(|p| p != "orders-0");
    cluster.wait_database(ns, "orders", "another member leads", WAIT, led_elsewhere).await.expect("a failover");
    let promoted = hung.elapsed();
    let events = Api::<Event>::namespaced(cluster.client.clone(), ns).list(&ListParams::default()).await.expect("events").items;
    let said = events.iter().find(|e| e.reason.as_deref() == Some("FailoverPromoted")).and_then(|e| e.note.clone());
    let said = said.expect("a FailoverPromoted Event");
    // Stopped by its guard on the killed operator's order or on the new one's (which
    // then finds it fenced, its stopped engine refusing connections): either way nothing
    // of the hung engine runs again (below).
    assert!(said.contains("primary orders-0") && said.contains("fenced by its agent"), "{said}");

    tokio::time::sleep(Duration::from_secs(60).saturating_sub(hung.elapsed())).await;
    let left = plugdb_tests::scenario::resume_all(&old, &container);
    assert_eq!(left, 0, "a process of the hung engine was left to run again");
    running(&cluster, ns, "orders", 3).await;
    let (written, longest) = crate::nodes::no_acknowledged_write_lost(&client, &stop, writer).await;
    let rw = client.service_ip("orders").await;
    let expected = client.checksum(&rw).await;
    for pod in client.members().await {
        let deadline = Instant::now() + WAIT;
        while client.checksum(&pod_ip(&pod)).await != expected {
            assert!(Instant::now() < deadline, "{} does not hold the new primary's rows", pod.name_any());
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    eprintln!(
        "{ns}: primary hung; another member led {:.1} s later; {written} acknowledged writes, none lost; at most {longest:?} between two",
        promoted.as_secs_f64()
    );
}

/// Synchronous replication under a frozen replica (`whenTooFewReplicas: Degrade`): with
/// two members each commit waits for the replica, named where the engine can name it
/// (postgres). Frozen (every process of its engine
/// stopped), a commit waits, and `SynchronousReplication` says why, until the replica
/// has been not ready for `degradeAfterSeconds`: then the primary's agent lowers
/// synchronous replication and the waiting commit completes. Thawed, commits wait for
/// the replica again, and it has every row.
pub async fn synchronous_commits_wait_then_degrade(cluster: Arc<Cluster>, engine: Engine, version: &str) {
    let ns = &format!("{}-synchronous", engine.name());
    let spec = json!({"replication": {"mode": "Synchronous", "whenTooFewReplicas": "Degrade", "degradeAfterSeconds": 10}});
    cluster.apply_database(ns, database("orders", engine, version, 2, spec)).await.expect("apply");
    running(&cluster, ns, "orders", 2).await;
    // (the setting, on and off; who confirms commits, and what it says)
    let (setting, on, off, confirming, confirms) = match engine {
        // The primary's agent names the ready replica: what a fresh start renders, `ANY 1 (*)`, is not it.
        Engine::Postgres => {
            ("SHOW synchronous_standby_names", "ANY 1 (\"orders-1\")", "", "SELECT sync_state FROM pg_stat_replication", "quorum")
        }
        Engine::Mysql => (
            "SELECT @@rpl_semi_sync_master_enabled",
            "1",
            "0",
            "SELECT variable_value FROM information_schema.global_status WHERE variable_name = 'RPL_SEMI_SYNC_MASTER_CLIENTS'",
            "1",
        ),
    };
    let says = |reason: &'static str| {
        move |d: &plugdb::crd::Database| {
            d.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "SynchronousReplication" && c.reason == reason))
        }
    };
    cluster.wait_database(ns, "orders", "commits wait for the replica", WAIT, says("SynchronousReplication")).await.expect("synchronous");
    let client = Arc::new(Client::new(&cluster, engine, ns, "orders").await);
    let rw = client.service_ip("orders").await;
    client.create_table(&rw).await;
    client.insert(&rw, 1..11).await;
    let members = client.members().await;
    let primary = pod_ip(&members[0]);
    assert_eq!(client.query(&primary, setting).await.as_deref(), Ok(on));
    // Who confirms commits is the administrator's to see.
    let state = client.eventually_administered(&members[0], confirming, Duration::from_secs(30), |r| r == confirms).await;
    assert_eq!(state, confirms, "the replica confirms commits");
    // The replica's agent is told it is named too (a MariaDB replica confirms only while
    // it is), and its pod records it.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(cluster.client.clone(), ns);
    let deadline = Instant::now() + WAIT;
    loop {
        let replica = pods.get("orders-1").await.expect("the replica's pod");
        if replica.annotations().get(plugdb::names::SYNCHRONOUS).is_some_and(|t| t.starts_with("1/orders-1@")) {
            break;
        }
        assert!(Instant::now() < deadline, "the replica's agent was never told it confirms: {:?}", replica.annotations());
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let container = members[1].spec.as_ref().map(|s| s.containers[0].name.clone()).expect("the engine's container");

    plugdb_tests::scenario::signal_all(&members[1], &container, "STOP");
    let frozen = Instant::now();
    let waiting = {
        let (client, rw) = (client.clone(), rw.clone());
        tokio::spawn(async move { client.query(&rw, "INSERT INTO orders VALUES (11, 'waited for the replica')").await })
    };
    let db = cluster.wait_database(ns, "orders", "too few replicas", WAIT, says("ReplicasMissing")).await.expect("ReplicasMissing");
    assert!(!waiting.is_finished(), "the commit waits for the frozen replica: {:?}", db.status);
    let missing = frozen.elapsed();
    cluster.wait_database(ns, "orders", "degraded", WAIT, says("ReplicationDegraded")).await.expect("degraded");
    let done = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("the waiting commit completes once degraded");
    done.expect("the writer").expect("the insert");
    let completed = frozen.elapsed();
    client.insert(&rw, 12..21).await;
    assert_eq!(client.query(&primary, setting).await.as_deref(), Ok(off), "lowered as the primary runs");
    let events = Api::<Event>::namespaced(cluster.client.clone(), ns).list(&ListParams::default()).await.expect("events").items;
    assert!(events.iter().any(|e| e.reason.as_deref() == Some("ReplicationDegraded")), "an Event says so");

    plugdb_tests::scenario::signal_all(&members[1], &container, "CONT");
    cluster.wait_database(ns, "orders", "synchronous again", WAIT, says("SynchronousReplication")).await.expect("restored");
    assert_eq!(client.query(&primary, setting).await.as_deref(), Ok(on));
    let rows = client.eventually(&pod_ip(&members[1]), "SELECT count(*) FROM orders", Duration::from_secs(60), |r| r == "20").await;
    assert_eq!(rows, "20", "the thawed replica has every row");
    let started = Instant::now();
    client.insert(&rw, 21..31).await;
    eprintln!(
        "{ns}: replica frozen; ReplicasMissing after {:.1} s, the waiting commit completed after {:.1} s (degradeAfterSeconds 10); \
         synchronous again once thawed, 10 commits in {:?}",
        missing.as_secs_f64(),
        completed.as_secs_f64(),
        started.elapsed()
    );
}
