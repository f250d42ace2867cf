//! etcd on the real node: a consensus engine that elects its own leader. The host asks
//! the members who leads and never promotes; membership changes through the plugin's
//! scale plan, one member at a time, and a change that would lose quorum is refused.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use plugdb::crd::Database;
use plugdb_tests::node::Nodes;
use plugdb_tests::operator::Cluster;
use plugdb_tests::scenario::{WAIT, is_running, pod_ip, signal_engine};
use serde_json::json;

/// An etcd Database of a scenario: its namespace and name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Etcd {
    pub(crate) ns: &'static str,
    pub(crate) name: &'static str,
}

impl Etcd {
    /// Its manifest with `replicas` members and `extra` in its spec.
    pub(crate) fn manifest(self, replicas: i32, extra: serde_json::Value) -> serde_json::Value {
        let mut manifest = json!({
            "metadata": {"name": self.name},
            "spec": {
                "engine": "etcd", "version": "3.5", "replicas": replicas, "storage": "1Gi",
                "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
                // 4 GiB: a 64-bit integer, as written.
                "parameters": {"quota-backend-bytes": 4294967296_i64},
            },
        });
        if let (Some(spec), Some(extra)) = (manifest["spec"].as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        manifest
    }
}

const CONSENSUS: Etcd = Etcd { ns: "etcd-consensus", name: "config" };

/// The etcd client the image recipe copies out of Debian's etcd-client.
pub fn etcdctl_binary() -> std::path::PathBuf {
    let cache = std::env::var_os("PLUGDB_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache/plugdb"));
    cache.join("images-v1/etcdctl-3.5")
}

/// `etcdctl ARGS` against the member at `ip`, from inside the node's namespace.
pub(crate) async fn etcdctl(ip: &str, args: &[&str]) -> Result<String, String> {
    let mut command = Nodes::command(&etcdctl_binary().to_string_lossy());
    command.arg(format!("--endpoints=http://{ip}:2379")).args(["--command-timeout=5s", "--dial-timeout=2s"]).args(args);
    let out = tokio::task::spawn_blocking(move || command.output()).await.expect("join").map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() { Ok(text) } else { Err(format!("{text}{}", String::from_utf8_lossy(&out.stderr))) }
}

/// Puts `key<n>` = `n` through every member of `etcd` (etcdctl picks one that answers),
/// every 200 ms until `stop` is set; returns the keys acknowledged and the longest time
/// without an acknowledged put.
pub(crate) fn writer(
    cluster: &Cluster,
    etcd: Etcd,
    key: &'static str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<(Vec<u64>, Duration)> {
    let client = cluster.client.clone();
    tokio::spawn(async move {
        let (mut acknowledged, mut n, mut last, mut longest) = (Vec::new(), 0u64, Instant::now(), Duration::ZERO);
        while !stop.load(std::sync::atomic::Ordering::SeqCst) && std::sync::Arc::strong_count(&stop) > 1 {
            let selector = format!("app.kubernetes.io/instance={},app.kubernetes.io/managed-by=plugdb", etcd.name);
            let pods = Api::<Pod>::namespaced(client.clone(), etcd.ns).list(&ListParams::default().labels(&selector)).await;
            let endpoints: Vec<String> = pods
                .map(|l| l.items)
                .unwrap_or_default()
                .iter()
                .filter_map(|p| p.status.as_ref()?.pod_ip.as_ref().map(|ip| format!("http://{ip}:2379")))
                .collect();
            let mut command = Nodes::command(&etcdctl_binary().to_string_lossy());
            command.arg(format!("--endpoints={}", endpoints.join(","))).args(["--command-timeout=5s", "--dial-timeout=2s"]);
            command.args(["put", &format!("{key}{n}"), &n.to_string()]);
            let out = tokio::task::spawn_blocking(move || command.output()).await.expect("join");
            if out.is_ok_and(|o| o.status.success()) {
                acknowledged.push(n);
                longest = longest.max(last.elapsed());
                last = Instant::now();
            }
            n += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        (acknowledged, longest)
    })
}

/// `check` of what `etcdctl ARGS` says at `ip`, tried until it holds or `WAIT` ends.
pub(crate) async fn eventually(ip: &str, args: &[&str], what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let said = etcdctl(ip, args).await;
        if let Ok(text) = &said
            && check(text)
        {
            return text.clone();
        }
        assert!(Instant::now() < deadline, "{what}: etcdctl {args:?} at {ip} last said {said:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub(crate) async fn members(cluster: &Cluster, etcd: Etcd) -> Vec<Pod> {
    let selector = format!("app.kubernetes.io/instance={},app.kubernetes.io/managed-by=plugdb", etcd.name);
    let mut pods =
        Api::<Pod>::namespaced(cluster.client.clone(), etcd.ns).list(&ListParams::default().labels(&selector)).await.expect("pods").items;
    pods.retain(|p| p.owner_references().iter().any(|o| o.kind == "StatefulSet"));
    pods.sort_by_key(|p| p.name_any().rsplit('-').next().and_then(|o| o.parse::<u32>().ok()));
    pods
}

/// Waits until exactly `count` member pods are left (the others gone).
async fn members_become(cluster: &Cluster, etcd: Etcd, count: usize) {
    let deadline = Instant::now() + WAIT;
    while members(cluster, etcd).await.len() != count {
        assert!(Instant::now() < deadline, "{count} member pods are left");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub(crate) async fn running(cluster: &Cluster, etcd: Etcd, replicas: i32) -> Database {
    let what = format!("{replicas} etcd members Ready");
    cluster.wait_database(etcd.ns, etcd.name, &what, WAIT, |d| is_running(d, replicas)).await.expect("running")
}

/// The member that etcd itself says leads, asked at every member.
async fn real_leader(pods: &[Pod]) -> Option<String> {
    for pod in pods {
        let Ok(text) = etcdctl(&pod_ip(pod), &["endpoint", "status", "-w", "json"]).await else { continue };
        let status: serde_json::Value = serde_json::from_str(&text).ok()?;
        let status = &status[0]["Status"];
        if status["header"]["member_id"] == status["leader"] && status["leader"].is_u64() {
            return Some(pod.name_any());
        }
    }
    None
}

/// Waits until `status.primary` names the member etcd says leads (other than `not`), and
/// the pods' role labels agree; returns it.
pub(crate) async fn leader_followed(cluster: &Cluster, etcd: Etcd, not: Option<&str>) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let pods = members(cluster, etcd).await;
        let db = Api::<Database>::namespaced(cluster.client.clone(), etcd.ns).get(etcd.name).await.expect("database");
        let primary = db.status.and_then(|s| s.primary);
        let leader = real_leader(&pods).await;
        let labelled: Vec<String> =
            pods.iter().filter(|p| p.labels().get("plugdb.io/role").map(String::as_str) == Some("primary")).map(|p| p.name_any()).collect();
        if let Some(leader) = leader.clone().filter(|l| Some(l.as_str()) != not && primary.as_ref() == Some(l) && labelled == [l.clone()]) {
            return leader;
        }
        assert!(Instant::now() < deadline, "status.primary {primary:?} and the labels {labelled:?} follow etcd's leader {leader:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every member lists exactly `names` as the cluster's members and serves `key` = `value`
/// from its own copy (a serializable read).
pub(crate) async fn one_cluster_with(cluster: &Cluster, etcd: Etcd, count: usize, key: &str, value: &str) {
    let pods = members(cluster, etcd).await;
    assert_eq!(pods.len(), count, "{count} member pods");
    let names: Vec<String> = (0..count).map(|i| format!("{}-{i}", etcd.name)).collect();
    for pod in &pods {
        let ip = pod_ip(pod);
        eventually(&ip, &["member", "list"], &format!("{} lists {names:?}", pod.name_any()), |list| {
            let mut listed: Vec<&str> = list.lines().filter_map(|l| l.split(", ").nth(2)).collect();
            listed.sort();
            listed == names.iter().map(String::as_str).collect::<Vec<_>>()
        })
        .await;
        let got =
            eventually(&ip, &["get", key, "--print-value-only", "--consistency=s"], &format!("{} holds {key}", pod.name_any()), |v| {
                v == value
            })
            .await;
        assert_eq!(got, value);
    }
}

/// Created with one member; grows to 3; the leader's etcd is killed and another member
/// is elected, followed by the Service, with every write kept; 3 → 5 → 3 keeps one
/// cluster with the data; a scale-down that would lose quorum is refused until the
/// member that was down is back.
pub async fn elects_its_leader_and_changes_membership_safely(cluster: Arc<Cluster>) {
    let etcd = CONSENSUS;
    cluster.apply_database(etcd.ns, etcd.manifest(1, json!({}))).await.expect("apply");
    running(&cluster, etcd, 1).await;
    let first = members(&cluster, etcd).await;
    etcdctl(&pod_ip(&first[0]), &["put", "written-first", "1"]).await.expect("put");

    cluster.apply_database(etcd.ns, etcd.manifest(3, json!({}))).await.expect("scale to 3");
    running(&cluster, etcd, 3).await;
    one_cluster_with(&cluster, etcd, 3, "written-first", "1").await;
    // etcd's own series, at the members' port engine-metrics: each has a leader.
    for pod in &members(&cluster, etcd).await {
        plugdb_tests::scenario::engine_series(pod, "etcd_server_has_leader 1").await;
    }
    let leader = leader_followed(&cluster, etcd, None).await;

    // The engine elects a new leader; the host follows and promotes nothing.
    let pods = members(&cluster, etcd).await;
    let old = pods.iter().find(|p| p.name_any() == leader).expect("the leader's pod");
    signal_engine(old, "etcd", "KILL");
    let elected = leader_followed(&cluster, etcd, Some(&leader)).await;
    let new = members(&cluster, etcd).await.into_iter().find(|p| p.name_any() == elected).expect("the new leader's pod");
    etcdctl(&pod_ip(&new), &["put", "written-after-the-kill", "2"]).await.expect("a write through the new leader");
    running(&cluster, etcd, 3).await;
    one_cluster_with(&cluster, etcd, 3, "written-first", "1").await;
    one_cluster_with(&cluster, etcd, 3, "written-after-the-kill", "2").await;
    // `kubectl plugdb connect`: a shell in the leader's container with etcdctl set up for it.
    let input = "etcdctl get written-after-the-kill --print-value-only\n";
    let said = crate::plugdb_with_input(&cluster, &["connect", etcd.name, "-n", etcd.ns], Some(input)).await;
    assert!(said.lines().any(|l| l.trim() == "2"), "etcdctl through kubectl plugdb connect: {said}");
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(cluster.client.clone(), etcd.ns)
        .list(&ListParams::default())
        .await
        .expect("events");
    let reasons: Vec<String> = events.items.iter().filter_map(|e| e.reason.clone()).collect();
    assert!(reasons.iter().any(|r| r == "LeaderElected"), "the new leader is announced: {reasons:?}");
    assert!(!reasons.iter().any(|r| r == "FailoverPromoted"), "the host promotes nothing: {reasons:?}");

    // 3 → 5 → 3: one cluster throughout, with the data.
    cluster.apply_database(etcd.ns, etcd.manifest(5, json!({}))).await.expect("scale to 5");
    running(&cluster, etcd, 5).await;
    one_cluster_with(&cluster, etcd, 5, "written-after-the-kill", "2").await;
    cluster.apply_database(etcd.ns, etcd.manifest(3, json!({}))).await.expect("scale to 3");
    running(&cluster, etcd, 3).await;
    members_become(&cluster, etcd, 3).await;
    one_cluster_with(&cluster, etcd, 3, "written-first", "1").await;

    // Member 1 hangs: 3 → 2 would leave the two that stay without a quorum.
    let hung = members(&cluster, etcd).await.into_iter().find(|p| p.name_any() == format!("{}-1", etcd.name)).expect("member 1");
    signal_engine(&hung, "etcd", "STOP");
    cluster
        .wait_database(etcd.ns, etcd.name, "member 1 not ready", WAIT, |d| d.status.as_ref().and_then(|s| s.ready_replicas) == Some(2))
        .await
        .expect("member 1 not ready");
    cluster.apply_database(etcd.ns, etcd.manifest(2, json!({}))).await.expect("ask for 2");
    let refused = cluster
        .wait_database(etcd.ns, etcd.name, "the scale-down refused", WAIT, |d| {
            d.status
                .as_ref()
                .is_some_and(|s| s.conditions.iter().any(|c| c.reason == "ScaleRefused" && c.message.contains("would lose quorum")))
        })
        .await
        .expect("refused");
    let message = refused.status.expect("status").conditions.into_iter().find(|c| c.reason == "ScaleRefused").expect("condition").message;
    assert!(message.contains(&format!("{}-1 not ready", etcd.name)), "the refusal names the member: {message}");
    let sets: Api<StatefulSet> = Api::namespaced(cluster.client.clone(), etcd.ns);
    assert_eq!(sets.get(etcd.name).await.expect("set").spec.and_then(|s| s.replicas), Some(3), "nothing scales while refused");

    // Back: the plan is accepted and member 2 leaves the cluster before its pod goes.
    signal_engine(&hung, "etcd", "CONT");
    running(&cluster, etcd, 2).await;
    members_become(&cluster, etcd, 2).await;
    one_cluster_with(&cluster, etcd, 2, "written-after-the-kill", "2").await;
}

/// A snapshot of a 3-member cluster, taken by a backup Job, restores into a new
/// 3-member Database: every member is made from the snapshot (one Job each) before any
/// member starts, as a member of one new cluster, and every member serves the keys
/// written before the backup, not the one written after.
pub async fn snapshot_restores_into_a_new_cluster(cluster: Arc<Cluster>) {
    let source = Etcd { ns: "etcd-backups", name: "config" };
    cluster.apply_database(source.ns, source.manifest(3, json!({}))).await.expect("apply");
    running(&cluster, source, 3).await;
    let leader = leader_followed(&cluster, source, None).await;
    let pods = members(&cluster, source).await;
    let at = pod_ip(pods.iter().find(|p| p.name_any() == leader).expect("the leader's pod"));
    for i in 0..20 {
        etcdctl(&at, &["put", &format!("key-{i:02}"), &format!("value-{i}")]).await.expect("put");
    }

    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), source.ns);
    let token = json!({"metadata": {"annotations": {"plugdb.io/backup-now": "before-copy"}}});
    dbs.patch(source.name, &PatchParams::default(), &Patch::Merge(token)).await.expect("annotate");
    let backed_up = cluster
        .wait_database(source.ns, source.name, "a backup", WAIT, |d| d.status.as_ref().and_then(|s| s.last_backup.as_ref()).is_some())
        .await
        .expect("backup");
    let backup = backed_up.status.and_then(|s| s.last_backup).expect("last backup").name;
    etcdctl(&at, &["put", "written-after-the-backup", "1"]).await.expect("put");

    let copy = Etcd { ns: source.ns, name: "copy" };
    let restore = json!({"restoreFrom": {"database": source.name, "backup": backup}});
    cluster.apply_database(copy.ns, copy.manifest(3, restore)).await.expect("apply the copy");
    let restored = running(&cluster, copy, 3).await;
    assert!(restored.status.is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Restored" && c.status == "True")));
    let set = Api::<StatefulSet>::namespaced(cluster.client.clone(), copy.ns).get(copy.name).await.expect("set");
    for job in ["copy-restore", "copy-restore-1", "copy-restore-2"] {
        let job = Api::<Job>::namespaced(cluster.client.clone(), copy.ns).get(job).await.expect("a restore Job for every member");
        let done = job.status.and_then(|s| s.completion_time);
        assert!(done.is_some() && set.metadata.creation_timestamp >= done, "members start only after every restore");
    }

    one_cluster_with(&cluster, copy, 3, "key-19", "value-19").await;
    for pod in members(&cluster, copy).await {
        let ip = pod_ip(&pod);
        let keys = etcdctl(&ip, &["get", "key-", "--prefix", "--keys-only", "--consistency=s"]).await.expect("keys");
        assert_eq!(keys.lines().filter(|l| !l.is_empty()).count(), 20, "{} holds every key backed up", pod.name_any());
        let later = etcdctl(&ip, &["get", "written-after-the-backup", "--print-value-only", "--consistency=s"]).await.expect("get");
        assert_eq!(later, "", "{} holds nothing written after the backup", pod.name_any());
    }
    leader_followed(&cluster, copy, None).await;
}
