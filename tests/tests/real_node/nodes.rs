//! Members on three real nodes: a node drained under a writer, and a node lost without
//! warning and brought back, with the members' data checked throughout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use plugdb::crd::Database;
use plugdb_tests::node::Nodes;
use plugdb_tests::operator::{Backing, Cluster};
use plugdb_tests::scenario::{Client, Engine, WAIT, database, is_running, pod_ip};
use serde_json::json;

/// How long a node stays lost.
const OUTAGE: Duration = Duration::from_secs(120);

pub fn nodes(cluster: &Cluster) -> &Nodes {
    let Backing::Node(nodes) = &cluster.backing else { panic!("needs the real nodes") };
    nodes
}

/// The node a pod runs on.
pub fn node_of(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_else(|| panic!("{} is not on a node", pod.name_any()))
}

/// A condition's status and message.
pub fn condition(db: &Database, type_: &str) -> Option<(String, String)> {
    let c = db.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.message.clone()))
}

/// Uncordons its nodes when dropped (`kubectl uncordon` of a schedulable node is a no-op).
struct Uncordon<'a>(&'a Nodes, Vec<String>);

impl Drop for Uncordon<'_> {
    fn drop(&mut self) {
        for node in &self.1 {
            let _ = self.0.kubectl().args(["uncordon", node]).output();
        }
    }
}

/// Stops the writer and checks that every acknowledged write is on every member; returns
/// how many there were and the longest time without one. Each member is asked at its
/// address of the moment: one the operator makes again meanwhile (a replica that did not
/// replicate) has a new pod.
pub async fn no_acknowledged_write_lost(
    client: &Client,
    stop: &AtomicBool,
    writer: tokio::task::JoinHandle<(Vec<i64>, Duration)>,
) -> (usize, Duration) {
    stop.store(true, Ordering::SeqCst);
    let (acknowledged, longest) = writer.await.expect("writer");
    assert!(!acknowledged.is_empty(), "the writer wrote");
    let last = *acknowledged.last().expect("a last write");
    let has_last = format!("SELECT id FROM orders WHERE id = {last}");
    for name in client.members().await.iter().map(|p| p.name_any()) {
        let deadline = Instant::now() + WAIT;
        let ip = loop {
            let now = client.members().await.into_iter().find(|p| p.name_any() == name);
            let ip = now.and_then(|p| p.status?.pod_ip);
            let said = match &ip {
                Some(ip) => client.query(ip, &has_last).await,
                None => Err("no address yet".into()),
            };
            match (ip, said) {
                (Some(ip), Ok(rows)) if !rows.is_empty() => break ip,
                (_, said) => assert!(Instant::now() < deadline, "{name} never had write {last}: last answer {said:?}"),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let present = client.ids(&ip).await.expect("ids");
        let lost: Vec<&i64> = acknowledged.iter().filter(|id| !present.contains(id)).collect();
        assert!(lost.is_empty(), "{name}: acknowledged writes missing: {lost:?}");
    }
    (acknowledged.len(), longest)
}

/// After a failover: stops the writer and checks the acknowledged writes against the
/// new primary. `synchronous`: none is lost. Otherwise those lost, if any, are one run
/// of consecutive writes (the old primary's last, not yet replicated when it was lost);
/// every write acknowledged after them is there, on every member.
async fn lost_only_at_the_failover(d: Sql, synchronous: bool) {
    d.stop.store(true, Ordering::SeqCst);
    let (acknowledged, _) = d.writer.await.expect("writer");
    let rw = d.client.service_ip(d.name).await;
    let present = d.client.ids(&rw).await.expect("ids");
    let lost: Vec<usize> = acknowledged.iter().enumerate().filter(|(_, id)| !present.contains(id)).map(|(i, _)| i).collect();
    let mode = if synchronous { "synchronous" } else { "asynchronous" };
    eprintln!("{}: {} of {} acknowledged writes lost at the {mode} failover", d.name, lost.len(), acknowledged.len());
    assert!(!synchronous || lost.is_empty(), "{}: synchronous replication lost acknowledged writes {lost:?}", d.name);
    if let (Some(first), Some(last)) = (lost.first(), lost.last()) {
        assert_eq!(last - first + 1, lost.len(), "{}: the writes lost are one run, at the failover: {lost:?}", d.name);
        assert!(*last + 1 < acknowledged.len(), "{}: writes were acknowledged after the failover", d.name);
    }
    let kept: Vec<i64> = acknowledged.iter().filter(|id| present.contains(id)).copied().collect();
    let last = *kept.last().expect("writes kept");
    for pod in d.client.members().await {
        let ip = pod_ip(&pod);
        d.client.eventually(&ip, &format!("SELECT id FROM orders WHERE id = {last}"), WAIT, |r| !r.is_empty()).await;
        let on = d.client.ids(&ip).await.expect("ids");
        let missing: Vec<&i64> = kept.iter().filter(|id| !on.contains(id)).collect();
        assert!(missing.is_empty(), "{}: writes the primary has are missing: {missing:?}", pod.name_any());
    }
}

/// How long the Databases made here may take to run, and to run whole again after a
/// switchover before the test begins: up to six start at once, 18 members on three
/// nodes whose two cores the test command's other tiers share (a primary's first start
/// took 3.5 minutes there). Not a bound on the operator: what is timed comes after.
const STARTING: Duration = Duration::from_secs(2 * WAIT.as_secs());

/// A SQL Database of the node-loss scenario, with its writer.
struct Sql {
    name: &'static str,
    client: Arc<Client>,
    stop: Arc<AtomicBool>,
    writer: tokio::task::JoinHandle<(Vec<i64>, Duration)>,
}

impl Sql {
    /// Database `name` running with `replicas` members: a table with rows, and a writer.
    async fn start(cluster: &Cluster, ns: &str, name: &'static str, engine: Engine, replicas: i32) -> Sql {
        cluster.wait_database(ns, name, "members Ready", STARTING, |d| is_running(d, replicas)).await.expect("running");
        let client = Arc::new(Client::new(cluster, engine, ns, name).await);
        let rw = client.service_ip(name).await;
        client.create_table(&rw).await;
        client.insert(&rw, 1..101).await;
        let stop = Arc::new(AtomicBool::new(false));
        let writer = client.writer(1000, stop.clone());
        Sql { name, client, stop, writer }
    }

    async fn primary(&self, cluster: &Cluster, ns: &str) -> Pod {
        let db = cluster.wait_database(ns, self.name, "a primary", WAIT, |d| d.status.as_ref().is_some_and(|s| s.primary.is_some())).await;
        let primary = db.expect("a primary").status.and_then(|s| s.primary).expect("a primary");
        self.client.members().await.into_iter().find(|p| p.name_any() == primary).expect("the primary's pod")
    }

    /// Once `member` is back on `node` (where its volume is): whole again, the member
    /// holding the rows 500-509 written while it was away, and no acknowledged write
    /// lost. Stops the writer.
    async fn back_on(self, cluster: &Cluster, ns: &str, member: &str, node: &str) {
        cluster.wait_database(ns, self.name, "3 members Ready again", WAIT, |db| is_running(db, 3)).await.expect("the member rejoins");
        let back = self.client.members().await.into_iter().find(|p| p.name_any() == member).expect("the member");
        assert_eq!(node_of(&back), node, "{member} came back where its volume is");
        let caught_up = "SELECT count(*) FROM orders WHERE id >= 500 AND id < 510";
        self.client.eventually(&pod_ip(&back), caught_up, WAIT, |r| r.trim() == "10").await;
        let (written, longest) = no_acknowledged_write_lost(&self.client, &self.stop, self.writer).await;
        eprintln!("{ns}/{}: {written} acknowledged writes, none lost; at most {longest:?} between two", self.name);
    }

    /// Its member on `node`.
    /// Has a member off `node` lead, unless one does already (a switchover).
    async fn lead_off(&self, cluster: &Arc<Cluster>, ns: &str, node: &str) {
        if node_of(&self.primary(cluster, ns).await) == node {
            let elsewhere = self.client.members().await.into_iter().find(|p| node_of(p) != node).expect("a member elsewhere");
            lead_from(cluster, ns, self.name, &elsewhere.name_any()).await;
        }
        assert_ne!(node_of(&self.primary(cluster, ns).await), node, "{}'s primary is elsewhere", self.name);
    }

    async fn on(&self, node: &str) -> Pod {
        let on = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
        self.client.members().await.into_iter().find(on).expect("a member on the node")
    }
}

/// Which members take writes, asked over and over: each member of a Database, one after
/// another every 100 ms, from its own node (a member on a node cut off from the others
/// is asked from there, where its clients are), to insert a row of its own into table
/// `probe`. postgres is asked as a session that turns the read-only default off and
/// begins read-write (what any session may do: a fence must hold against it). mysql is
/// asked as an account without `READ_ONLY ADMIN` (a replica's `read_only` binds it, as it
/// binds applications).
pub(crate) struct Writers {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<(Instant, String, i64)>>,
}

impl Writers {
    pub(crate) async fn start(client: Arc<Client>, engine: Engine) -> Writers {
        let rw = client.service_ip(client.name()).await;
        client.reachable(&rw).await;
        // As the application, which no read-only setting lets write (it holds no
        // administrator's right).
        client.query(&rw, "CREATE TABLE IF NOT EXISTS probe (id BIGINT PRIMARY KEY)").await.expect("the probe table");
        let stop = Arc::new(AtomicBool::new(false));
        let until = stop.clone();
        let task = tokio::spawn(async move {
            let (mut took, mut id) = (Vec::new(), 0i64);
            while !until.load(Ordering::SeqCst) && Arc::strong_count(&until) > 1 {
                for pod in client.members().await {
                    let (Some(node), Some(ip)) =
                        (pod.spec.as_ref().and_then(|s| s.node_name.clone()), pod.status.as_ref().and_then(|s| s.pod_ip.clone()))
                    else {
                        continue;
                    };
                    id += 1;
                    let insert = match engine {
                        Engine::Postgres => {
                            format!("SET default_transaction_read_only = off; BEGIN READ WRITE; INSERT INTO probe VALUES ({id}); COMMIT")
                        }
                        Engine::Mysql => format!("INSERT INTO probe VALUES ({id})"),
                    };
                    if client.query_from(&node, &ip, &insert).await.is_ok() {
                        took.push((Instant::now(), pod.name_any(), id));
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            took
        });
        Writers { stop, task }
    }

    /// Stops asking; the members that took writes, in turn (each once per run), and when
    /// each write was acknowledged, by which member, with which id.
    pub(crate) async fn turns(self) -> (Vec<String>, Vec<(Instant, String, i64)>) {
        self.stop.store(true, Ordering::SeqCst);
        let took = self.task.await.expect("the probe");
        let mut turns: Vec<String> = Vec::new();
        for (_, member, _) in &took {
            if turns.last() != Some(member) {
                turns.push(member.clone());
            }
        }
        (turns, took)
    }

    /// The acknowledged writes `at` (a member leading now) does not hold: each was lost.
    pub(crate) async fn lost(client: &Client, at: &str, took: &[(Instant, String, i64)]) -> Vec<i64> {
        let held = client.query(at, "SELECT id FROM probe").await.expect("the probe's rows");
        let held: std::collections::BTreeSet<i64> = held.lines().filter_map(|l| l.trim().parse().ok()).collect();
        took.iter().map(|(.., id)| *id).filter(|id| !held.contains(id)).collect()
    }
}

/// Keeps new pods off `names` with a `NoSchedule` taint of the test's own (removed when
/// the guard it returns drops). Not a cordon: a cordon is a drain beginning, and the
/// operator switches a primary away from a cordoned node.
fn keep_off<'a>(nodes: &'a Nodes, names: &[String]) -> Untaint<'a> {
    for node in names {
        let out =
            nodes.kubectl().args(["taint", "nodes", node, &format!("{KEEP_OFF}=:NoSchedule"), "--overwrite"]).output().expect("kubectl");
        assert!(out.status.success(), "taint {node}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Untaint(nodes, names.to_vec())
}

const KEEP_OFF: &str = "plugdb.io/test-keep-off";

/// Removes [`keep_off`]'s taint from its nodes when dropped.
struct Untaint<'a>(&'a Nodes, Vec<String>);

impl Drop for Untaint<'_> {
    fn drop(&mut self) {
        for node in &self.1 {
            let _ = self.0.kubectl().args(["taint", "nodes", node, &format!("{KEEP_OFF}:NoSchedule-")]).output();
        }
    }
}

/// Has member `there` of Database `name` lead, unless it does already: a switchover,
/// asked again (twice at most) once the Database runs whole when the operator refuses it
/// (on a loaded machine a member's probe may fail just then), and waited for.
async fn lead_from(cluster: &Arc<Cluster>, ns: &str, name: &str, there: &str) {
    let led = |db: &Database| db.status.as_ref().and_then(|s| s.primary.as_deref()) == Some(there) && is_running(db, 3);
    let now = cluster.wait_database(ns, name, "running whole", STARTING, |db| is_running(db, 3)).await.expect("running");
    if led(&now) {
        return;
    }
    for attempt in 1.. {
        let (c, args) = (cluster.clone(), ["switchover", name, there, "--namespace", ns].map(str::to_string));
        let asked = tokio::task::spawn_blocking(move || crate::kubectl_plugdb_with(&c, &args.each_ref().map(String::as_str), None)).await;
        match asked {
            Ok(_) => break,
            Err(e) if attempt == 3 => panic!("switchover of {name} to {there}: {e}"),
            Err(_) => cluster.wait_database(ns, name, "running whole again", STARTING, |db| is_running(db, 3)).await.expect("running"),
        };
    }
    cluster.wait_database(ns, name, &format!("{there} primary"), STARTING, led).await.expect("switched over");
}

/// One node lost without warning for two minutes or more, then back, under six
/// Databases with a member on it:
/// - `pg` (postgres), members required apart, primary elsewhere, with a writer: it stays
///   writable through its read-write Service, and `Degraded` names the member on the
///   node and why (mysql members on the node are `lm`'s and `ls`'s primaries, below);
/// - `kv` (etcd), its leader moved onto the node first: the two members left elect a
///   leader, `status.primary` follows it, and writes go on;
/// - `mv` (postgres, `spread.moveFromLostNodeAfter: 30s`): its replica on the node is
///   made again on another node from a copy of the primary, with an Event, before the
///   node returns, and is not started again when it does;
/// - `lp` (postgres, synchronous replication, members apart), `ls` (mysql, synchronous)
///   and `lm` (mysql), their primary on the node: with nothing set by the test, the
///   operator asks the members' agents their positions and promotes a replica; writes
///   are accepted again through the read-write Service. Every member is asked to take a
///   write throughout, the old primary from its side of the cut: its agent fences it on
///   its own, before the promotion, and at no moment do two members take writes. `lp`
///   and `ls` lose no acknowledged write, and their old primary, cut off from every
///   replica, acknowledges none after the loss. `lm` replicates asynchronously: the
///   writes lost, if any, are the last ones the old primary acknowledged before the loss
///   (counted and shown), never one the new primary acknowledged. Back, the old primary
///   follows the new one.
///
/// Back: every member rejoins and catches up, and no acknowledged write is lost.
pub async fn node_lost_and_back(cluster: Arc<Cluster>) {
    let ns = "node-lost";
    let nodes = nodes(&cluster);
    let apart = json!({"spread": {"nodes": "Required"}});
    let etcd = crate::consensus::Etcd { ns, name: "kv" };
    let all: Vec<String> = plugdb_tests::node::NodeSpec::all().map(|n| n.name()).collect();
    let node = all[0].clone();
    let others: Vec<String> = all.iter().filter(|n| **n != node).cloned().collect();

    // Placed by taints before pg and my exist: mv's first two members away from the
    // node, then lm's first (its primary) and mv's third on it.
    let moved = json!({"spread": {"moveFromLostNodeAfter": "30s"}});
    {
        let _away = keep_off(nodes, std::slice::from_ref(&node));
        cluster.apply_database(ns, database("mv", Engine::Postgres, "15", 2, moved.clone())).await.expect("apply");
        cluster.wait_database(ns, "mv", "2 members Ready", STARTING, |d| is_running(d, 2)).await.expect("running");
    }
    let sync_spec = |synchronous: bool| if synchronous { json!({"replication": {"mode": "Synchronous"}}) } else { json!({}) };
    let lost_primaries = [("lm", Engine::Mysql, "10.11", false), ("ls", Engine::Mysql, "11.8", true)];
    {
        let _onto = keep_off(nodes, &others);
        // One member replicates to no one: synchronous once grown (admission refuses it before).
        for (name, engine, version, _) in lost_primaries {
            cluster.apply_database(ns, database(name, engine, version, 1, json!({}))).await.expect("apply");
        }
        cluster.apply_database(ns, database("mv", Engine::Postgres, "15", 3, moved)).await.expect("grow");
        for (name, ..) in lost_primaries {
            cluster.wait_database(ns, name, "1 member Ready", STARTING, |d| is_running(d, 1)).await.expect("running");
        }
        cluster.wait_database(ns, "mv", "3 members Ready", STARTING, |d| is_running(d, 3)).await.expect("running");
    }
    for (name, engine, version, synchronous) in lost_primaries {
        cluster.apply_database(ns, database(name, engine, version, 3, sync_spec(synchronous))).await.expect("grow");
    }
    cluster.apply_database(ns, database("pg", Engine::Postgres, "15", 3, apart.clone())).await.expect("apply");
    cluster.apply_database(ns, etcd.manifest(3, apart.clone())).await.expect("apply etcd");
    let mut apart_sql = vec![Sql::start(&cluster, ns, "pg", Engine::Postgres, 3).await];
    // The node to lose holds a replica of each: a primary there hands over first.
    for d in &apart_sql {
        d.lead_off(&cluster, ns, &node).await;
    }
    let mv = Sql::start(&cluster, ns, "mv", Engine::Postgres, 3).await;
    // mv's primary is elsewhere (its replica on the node is the one moved); on a loaded
    // machine a failover in the setup may have put it there: it hands over first.
    mv.lead_off(&cluster, ns, &node).await;
    let mv_member = mv.on(&node).await;
    // lp, made once mv's members are placed, has its primary handed to its member on the node.
    let synchronous = json!({"spread": {"nodes": "Required"}, "replication": {"mode": "Synchronous"}});
    cluster.apply_database(ns, database("lp", Engine::Postgres, "15", 3, synchronous)).await.expect("apply");
    let lp = Sql::start(&cluster, ns, "lp", Engine::Postgres, 3).await;
    let there = lp.on(&node).await.name_any();
    lead_from(&cluster, ns, "lp", &there).await;
    let mut failing_over = Vec::new();
    for (name, engine, _, synchronous) in lost_primaries {
        let d = Sql::start(&cluster, ns, name, engine, 3).await;
        // Placed there first; on a loaded machine a failover in the setup may have moved it.
        lead_from(&cluster, ns, name, &d.on(&node).await.name_any()).await;
        failing_over.push((d, engine, synchronous));
    }
    failing_over.push((lp, Engine::Postgres, true));
    let mut old_primaries = Vec::new();
    for (d, ..) in &failing_over {
        let old = d.primary(&cluster, ns).await;
        assert_eq!(node_of(&old), node, "{}'s primary is on the node", d.name);
        old_primaries.push(old.name_any());
    }
    // mv's primary, once more: on a loaded machine a failover while the others were set
    // up may have put it on the node since.
    mv.lead_off(&cluster, ns, &node).await;

    // etcd's leader is moved there, so that losing the node loses the leader. Every
    // member votes first: one that joined last is a learner until it has caught up.
    crate::consensus::running(&cluster, etcd, 3).await;
    let first = pod_ip(&crate::consensus::members(&cluster, etcd).await[0]);
    crate::consensus::eventually(&first, &["member", "list"], "three voting members", |list| {
        list.lines().filter(|l| l.trim_end().ends_with(", false")).count() == 3
    })
    .await;
    let leader = crate::consensus::leader_followed(&cluster, etcd, None).await;
    let kv = crate::consensus::members(&cluster, etcd).await;
    let target = kv.iter().find(|p| node_of(p) == node).expect("an etcd member on the node").name_any();
    if leader != target {
        let on_node = pod_ip(kv.iter().find(|p| p.name_any() == target).expect("target"));
        let status = crate::consensus::etcdctl(&on_node, &["endpoint", "status", "-w", "json"]).await.expect("status");
        let status: serde_json::Value = serde_json::from_str(&status).expect("json");
        let id = status[0]["Status"]["header"]["member_id"].as_u64().expect("a member id");
        let at = pod_ip(kv.iter().find(|p| p.name_any() == leader).expect("leader"));
        crate::consensus::etcdctl(&at, &["move-leader", &format!("{id:x}")]).await.expect("move the leadership");
        crate::consensus::leader_followed(&cluster, etcd, Some(&leader)).await;
    }
    let old_leader = crate::consensus::leader_followed(&cluster, etcd, None).await;
    assert_eq!(old_leader, target, "etcd's leader is on the node to lose");

    let mut writers = Vec::new();
    for (d, engine, _) in &failing_over {
        writers.push(Writers::start(d.client.clone(), *engine).await);
    }
    // Every member asked a few times first: a synchronous primary cut off takes no write after.
    tokio::time::sleep(Duration::from_secs(3)).await;
    eprintln!("{ns}: losing {node}");
    let lost = Instant::now();
    nodes.cut(&node).expect("cut the node");
    let away = async {
        let mut named = Vec::new();
        for d in &apart_sql {
            let member = d.on(&node).await.name_any();
            let said = format!("{member}: node {node} is not ready");
            let db = cluster
                .wait_database(ns, d.name, "Degraded names the member on the lost node", WAIT, |db| {
                    condition(db, "Degraded").is_some_and(|(status, message)| status == "True" && message.contains(&said))
                })
                .await
                .map_err(|e| format!("{e:#}"))?;
            if db.status.as_ref().and_then(|s| s.ready_replicas) != Some(2) {
                return Err(format!("{}: two members ready: {:?}", d.name, db.status));
            }
            // status.members says it too: which member, on which node, and why.
            let said = db.status.as_ref().and_then(|s| s.members.iter().find(|m| m.pod == member).cloned());
            match said {
                Some(m) if !m.ready && m.node.as_deref() == Some(node.as_str()) && m.down.as_deref().is_some_and(|d| d.contains(&node)) => {
                }
                other => return Err(format!("{}: status.members says of {member}: {other:?}", d.name)),
            }
            // Writable: rows through the read-write Service while the node is gone.
            d.client.insert(&d.client.service_ip(d.name).await, 500..510).await;
            named.push(member);
        }
        let elected = crate::consensus::leader_followed(&cluster, etcd, Some(&old_leader)).await;
        let new = crate::consensus::members(&cluster, etcd).await.into_iter().find(|p| p.name_any() == elected).ok_or("the new leader")?;
        crate::consensus::etcdctl(&pod_ip(&new), &["put", "written-while-away", "2"]).await?;
        let said = format!("{old_leader}: node {node} is not ready");
        cluster
            .wait_database(ns, etcd.name, "Degraded names etcd's lost member", WAIT, |db| {
                condition(db, "Degraded").is_some_and(|(status, message)| status == "True" && message.contains(&said))
            })
            .await
            .map_err(|e| format!("{e:#}"))?;
        // mv: whole again, its member on the node made anew elsewhere.
        let member = mv_member.name_any();
        let deadline = Instant::now() + WAIT;
        let moved = loop {
            let now = mv.client.members().await.into_iter().find(|p| p.name_any() == member);
            let db = cluster.wait_database(ns, "mv", "mv", WAIT, |_| true).await.map_err(|e| format!("{e:#}"))?;
            if let Some(pod) = now.filter(|p| p.metadata.uid != mv_member.metadata.uid && is_running(&db, 3)) {
                break pod;
            }
            if Instant::now() > deadline {
                return Err(format!("{member} was not made again elsewhere: {:?}", db.status));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        // lp, ls and lm: a replica promoted by the operator, from what the agents said.
        for ((d, ..), old) in failing_over.iter().zip(&old_primaries) {
            let db = cluster
                .wait_database(ns, d.name, "a replica promoted", WAIT, |db| {
                    db.status.as_ref().and_then(|s| s.primary.as_deref()).is_some_and(|p| p != old.as_str())
                })
                .await
                .map_err(|e| format!("{e:#}"))?;
            let promoted = db.status.and_then(|s| s.primary).unwrap_or_default();
            let service = d.client.service_ip(d.name).await;
            let deadline = Instant::now() + WAIT;
            while d.client.query(&service, "INSERT INTO orders VALUES (900, 'after the failover')").await.is_err() {
                if Instant::now() > deadline {
                    return Err(format!("{}: {promoted} never took a write through the read-write Service", d.name));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            eprintln!("{ns}: {}'s primary node lost → write accepted by {promoted} after {:.1} s", d.name, lost.elapsed().as_secs_f64());
        }
        Ok::<(Vec<String>, Pod), String>((named, moved))
    };
    let away = away.await;
    eprintln!("{ns}: all seen within {:.0} s of the loss", lost.elapsed().as_secs_f64());
    tokio::time::sleep(OUTAGE.saturating_sub(lost.elapsed())).await;
    nodes.restore(&node).expect("restore the node");
    let (named, moved) = away.unwrap_or_else(|e| panic!("while {node} was lost: {e}"));

    assert_ne!(node_of(&moved), node, "mv's member runs on another node");
    let events = Api::<Event>::namespaced(cluster.client.clone(), ns).list(&ListParams::default()).await.expect("events").items;
    let said = events.iter().find(|e| e.reason.as_deref() == Some("MemberMoved")).and_then(|e| e.note.clone());
    let said = said.expect("an Event says mv's member moved");
    let member = moved.name_any();
    assert!(said.contains(&member) && said.contains(&node) && said.contains(&format!("data-{member}")), "{said}");

    // lp, ls and lm failed over before the node controller's grace period ended: their
    // primary counted as down from its node's last lease renewal. The other replica,
    // which streamed from the lost primary, was told to follow the promoted member at
    // once (under synchronous replication its commits wait for it); on a machine this
    // busy it may not stream from it within the command's 3 s, and is then restarted as
    // well.
    for (d, _, _) in &failing_over {
        let promoted = events.iter().filter(|e| e.reason.as_deref() == Some("FailoverPromoted"));
        let of = |e: &&Event| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(d.name);
        let said: Vec<&str> = promoted.filter(of).filter_map(|e| e.note.as_deref()).collect();
        assert!(said.iter().any(|n| n.contains(&format!("node {node} has not renewed its lease"))), "{}: {said:?}", d.name);
        assert!(said.iter().any(|n| n.contains(" of 1 replicas told to follow it")), "{}: {said:?}", d.name);
    }
    for (d, member) in apart_sql.drain(..).zip(named) {
        d.back_on(&cluster, ns, &member, &node).await;
    }
    crate::consensus::running(&cluster, etcd, 3).await;
    crate::consensus::one_cluster_with(&cluster, etcd, 3, "written-while-away", "2").await;
    for (((d, engine, synchronous), writers), old) in failing_over.into_iter().zip(writers).zip(old_primaries) {
        let name = d.name;
        let db = cluster.wait_database(ns, name, "3 members Ready again", WAIT, |db| is_running(db, 3)).await.expect("back");
        let promoted = db.status.and_then(|s| s.primary).expect("a primary");
        assert_ne!(promoted, old, "{name}: the promoted member stays primary");
        let client = d.client.clone();
        lost_only_at_the_failover(d, synchronous).await;
        let old = client.members().await.into_iter().find(|p| p.name_any() == old).expect("the old primary");
        let (query, following) = match engine {
            Engine::Postgres => ("SELECT pg_is_in_recovery()", "t"),
            _ => ("SELECT @@read_only", "1"),
        };
        let now = client.eventually(&pod_ip(&old), query, WAIT, |r| r == following).await;
        assert_eq!(now, following, "{name}: the old primary follows the new one");
        // At no moment did two members take writes: the old primary, fenced before the
        // promotion, and then the promoted member alone, asked throughout (on a machine
        // this busy a promoted member whose engine stops answering may be failed over in
        // turn: each then in turn, none again once another took writes).
        let (turns, took) = writers.turns().await;
        let once: std::collections::BTreeSet<&String> = turns.iter().collect();
        assert!(
            turns.len() >= 2 && turns[0] == old.name_any() && turns.last() == Some(&promoted) && once.len() == turns.len(),
            "{name}: the members that took writes, in turn: {turns:?}"
        );
        let first_new = took.iter().filter(|(_, m, _)| *m == promoted).map(|(at, ..)| *at).min().expect("the new primary took writes");
        eprintln!("{ns}: {name}'s node lost → {promoted} took its first write {:.1} s after", (first_new - lost).as_secs_f64());
        let last_old = took.iter().filter(|(_, m, _)| *m == old.name_any()).map(|(at, ..)| *at).max().expect("the old primary took writes");
        if synchronous {
            // Its commits wait for a replica it no longer reaches (those in flight at the cut aside).
            assert!(last_old < lost + Duration::from_secs(1), "{name}: the old primary acknowledged a write it alone had");
        } else {
            assert!(last_old > lost, "{name}: the old primary was reached from its side of the cut");
        }
        eprintln!("{ns}: {name}'s old primary took its last write {:.1} s after the loss (fenced)", (last_old - lost).as_secs_f64());
    }
    let again = mv.client.members().await.into_iter().find(|p| p.name_any() == member).expect("mv's member");
    assert_eq!(again.metadata.uid, moved.metadata.uid, "the moved member stays where it went");
    no_acknowledged_write_lost(&mv.client, &mv.stop, mv.writer).await;
    // An old primary back from the node still leads as it did until it is made again:
    // what a failover leaves, no second primary.
    let events = Api::<Event>::namespaced(cluster.client.clone(), ns).list(&ListParams::default()).await.expect("events").items;
    let second: Vec<&str> =
        events.iter().filter(|e| e.reason.as_deref() == Some("SecondPrimary")).filter_map(|e| e.note.as_deref()).collect();
    assert!(second.is_empty(), "an old primary back is not a second primary: {second:?}");
}

/// A node drained under writers, after backups: a postgres and a mysql Database with
/// members required apart, the node holding postgres's primary and a member of the
/// other, and an etcd Database with a member there too. The primary is switched over
/// before it is evicted (an Event `SwitchoverForDrain`), with no acknowledged write lost.
/// The evictions honour the disruption budgets (which no backup Job's pod counts in),
/// the Databases serve throughout (etcd keeps its quorum: its writes go on), and each
/// evicted member, whose volume cannot leave its node, waits unscheduled with the
/// scheduler's reason in `Ready`. A second drain while they wait is refused by the
/// budgets. Uncordoned, the members return with their data.
pub async fn drain_under_writers(cluster: Arc<Cluster>) {
    let ns = "drain";
    let nodes = nodes(&cluster);
    let apart = json!({"spread": {"nodes": "Required"}});
    let etcd = crate::consensus::Etcd { ns, name: "kv" };
    cluster.apply_database(ns, database("pg", Engine::Postgres, "15", 3, apart.clone())).await.expect("apply");
    cluster.apply_database(ns, database("my", Engine::Mysql, "10.11", 3, apart.clone())).await.expect("apply");
    cluster.apply_database(ns, etcd.manifest(3, apart)).await.expect("apply etcd");
    let dbs = [Sql::start(&cluster, ns, "pg", Engine::Postgres, 3).await, Sql::start(&cluster, ns, "my", Engine::Mysql, 3).await];
    // Every etcd member votes first (one that joined last is a learner until caught up).
    crate::consensus::running(&cluster, etcd, 3).await;
    let first = pod_ip(&crate::consensus::members(&cluster, etcd).await[0]);
    crate::consensus::eventually(&first, &["member", "list"], "three voting members", |list| {
        list.lines().filter(|l| l.trim_end().ends_with(", false")).count() == 3
    })
    .await;
    let stop_kv = Arc::new(AtomicBool::new(false));
    let kv_writer = crate::consensus::writer(&cluster, etcd, "drain-", stop_kv.clone());
    // A backup of each first: its Job's pod must not count as a member for the budget.
    let api: Api<Database> = Api::namespaced(cluster.client.clone(), ns);
    for d in &dbs {
        let token = json!({"metadata": {"annotations": {"plugdb.io/backup-now": "before-the-drain"}}});
        api.patch(d.name, &PatchParams::default(), &Patch::Merge(token)).await.expect("annotate");
    }
    for d in &dbs {
        let backed_up = |db: &Database| db.status.as_ref().and_then(|s| s.last_backup.as_ref()).is_some();
        cluster.wait_database(ns, d.name, "a backup", WAIT, backed_up).await.expect("backed up");
    }
    let mut primaries = Vec::new();
    for d in &dbs {
        primaries.push(node_of(&d.primary(&cluster, ns).await));
    }
    let all: Vec<String> = plugdb_tests::node::NodeSpec::all().map(|n| n.name()).collect();
    let node = primaries[0].clone();
    let second = all.iter().find(|n| **n != node).expect("another node").clone();
    let mut members = Vec::new();
    for d in &dbs {
        members.push(d.on(&node).await.name_any());
    }
    let drain = |node: &str, timeout: &str| {
        let mut command = nodes.kubectl();
        command.args(["drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout", timeout]);
        command.output().expect("kubectl")
    };
    // Whatever happens below, no node stays cordoned for the scenarios after this one.
    let _uncordon = Uncordon(nodes, vec![node.clone(), second.clone()]);
    let out = drain(&node, "180s");
    assert!(out.status.success(), "drain {node}: {}", String::from_utf8_lossy(&out.stderr));
    // Each primary on the node was handed to a member elsewhere before its eviction.
    let events = Api::<Event>::namespaced(cluster.client.clone(), ns).list(&ListParams::default()).await.expect("events").items;
    for (d, was) in dbs.iter().zip(&primaries).filter(|(_, was)| **was == node) {
        let of = |e: &&Event| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(d.name);
        let switched = events.iter().filter(of).any(|e| e.reason.as_deref() == Some("SwitchoverForDrain"));
        assert!(switched, "{}: its primary on {was} was switched over for the drain", d.name);
        let now = d.primary(&cluster, ns).await;
        assert_ne!(node_of(&now), node, "{}: {} leads, elsewhere", d.name, now.name_any());
    }
    for (d, member) in dbs.iter().zip(&members) {
        let waits = format!("{member} cannot be scheduled");
        let db = cluster
            .wait_database(ns, d.name, "the evicted member waits", WAIT, |db| {
                condition(db, "Ready").is_some_and(|(_, m)| m.contains(&waits))
            })
            .await
            .expect("the member's wait is reported");
        let (_, message) = condition(&db, "Ready").expect("Ready");
        assert!(
            message.contains("unschedulable") && message.contains("PersistentVolume's node affinity"),
            "the scheduler's reason: {message}"
        );
    }

    // A member of each is down: the budgets refuse any other eviction. Once the others
    // serve (a new primary whose promotion in place did not finish in time restarts to
    // lead first).
    let mut on_second = Vec::new();
    for d in &dbs {
        let others_ready = |db: &Database| db.status.as_ref().is_some_and(|s| s.ready_replicas == Some(2));
        cluster.wait_database(ns, d.name, "the two members elsewhere Ready", WAIT, others_ready).await.expect("the others serve");
        on_second.push(d.on(&second).await);
    }
    let out = drain(&second, "15s");
    let uncordon = |node: &str| {
        let out = nodes.kubectl().args(["uncordon", node]).output().expect("kubectl");
        assert!(out.status.success(), "uncordon {node}: {}", String::from_utf8_lossy(&out.stderr));
    };
    uncordon(&second);
    assert!(!out.status.success(), "a second drain must wait for the budgets");
    assert!(String::from_utf8_lossy(&out.stderr).contains("disruption budget"), "{}", String::from_utf8_lossy(&out.stderr));
    for (d, before) in dbs.iter().zip(&on_second) {
        let still = d.on(&second).await;
        assert_eq!(still.metadata.uid, before.metadata.uid, "{} was not evicted", before.name_any());
        d.client.insert(&d.client.service_ip(d.name).await, 500..510).await;
    }

    uncordon(&node);
    for (d, member) in dbs.into_iter().zip(members) {
        d.back_on(&cluster, ns, &member, &node).await;
    }
    // etcd: quorum held throughout (its writes went on), and its member is back with them.
    crate::consensus::running(&cluster, etcd, 3).await;
    stop_kv.store(true, Ordering::SeqCst);
    let (acknowledged, longest) = kv_writer.await.expect("the etcd writer");
    eprintln!("{ns}: etcd took {} writes through the drain, at most {:.1} s apart", acknowledged.len(), longest.as_secs_f64());
    assert!(longest < Duration::from_secs(15), "etcd kept its quorum: writes at most {longest:?} apart");
    let last = *acknowledged.last().expect("etcd took writes");
    crate::consensus::one_cluster_with(&cluster, etcd, 3, &format!("drain-{last}"), &last.to_string()).await;
    for pod in crate::consensus::members(&cluster, etcd).await {
        let count =
            crate::consensus::etcdctl(&pod_ip(&pod), &["get", "drain-", "--prefix", "--count-only", "--consistency=s", "-w", "fields"])
                .await
                .expect("count");
        let count = count.lines().find_map(|l| l.strip_prefix("\"Count\" : ")).and_then(|c| c.trim().parse::<usize>().ok());
        assert!(count.is_some_and(|c| c >= acknowledged.len()), "{}: every acknowledged key: {count:?}", pod.name_any());
    }
}
