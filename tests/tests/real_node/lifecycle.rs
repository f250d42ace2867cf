//! The operator's own behaviour on the real node: the children it makes, quiet steady
//! state, plugins arriving and changing at run time, readable errors, scheduled backups.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use plugdb::crd::Database;
use plugdb_tests::operator::{Cluster, OPERATOR_NAMESPACE, plugin_config_map};
use plugdb_tests::prometheus::{INTERVAL, Prometheus};
use plugdb_tests::scenario::{Client, Engine, WAIT, database, is_running};
use serde_json::json;

fn condition<'a>(db: &'a Database, type_: &str) -> Option<&'a Condition> {
    db.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

async fn image(cluster: &Cluster, ns: &str, name: &str) -> String {
    let sts = Api::<StatefulSet>::namespaced(cluster.client.clone(), ns).get(name).await.expect("statefulset");
    sts.spec.expect("spec").template.spec.expect("pod").containers[0].image.clone().unwrap_or_default()
}

async fn gone(cluster: &Cluster, ns: &str, name: &str) {
    let api: Api<Database> = Api::namespaced(cluster.client.clone(), ns);
    let deadline = tokio::time::Instant::now() + WAIT;
    while api.get_opt(name).await.expect("get").is_some() {
        assert!(tokio::time::Instant::now() < deadline, "{name} was not deleted");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Three members Ready with every child the operator owns; the credentials are never
/// rewritten; a resync of a Database that runs makes no request at all, and a restarted
/// operator writes nothing. Runs alone: it counts the operator's requests.
pub async fn children_then_quiet(cluster: Arc<Cluster>) {
    let ns = "postgres-children";
    cluster
        .apply_database(ns, database("orders", Engine::Postgres, "15", 3, json!({"parameters": {"max_connections": 150}})))
        .await
        .expect("apply");
    let db = cluster.wait_database(ns, "orders", "3 members Ready", WAIT, |d| is_running(d, 3)).await.expect("running");
    let status = db.status.clone().expect("status");
    assert_eq!(status.primary.as_deref(), Some("orders-0"));
    assert_eq!(status.current_version.as_deref(), Some("15"));
    assert!(status.plugin.as_deref().is_some_and(|p| p.starts_with("postgres@")));
    for t in ["Ready", "PluginReady", "BackupHealthy"] {
        assert_eq!(condition(&db, t).map(|c| c.status.as_str()), Some("True"), "{t}");
    }

    let c = cluster.client.clone();
    let secret = Api::<Secret>::namespaced(c.clone(), ns).get("orders-credentials").await.expect("credentials");
    let data = secret.data.clone().expect("data");
    assert_eq!(data["superuser-password"].0.len(), 32);
    assert!(secret.owner_references().is_empty(), "credentials outlive the Database under Snapshot");
    let config = Api::<ConfigMap>::namespaced(c.clone(), ns).get("orders-config").await.expect("config");
    assert!(config.data.expect("data")["postgresql.conf"].contains("max_connections = 150"));
    let client = Client::new(&cluster, Engine::Postgres, ns, "orders").await;
    let primary = client.service_ip("orders").await;
    client.reachable(&primary).await;
    assert_eq!(client.setting(&primary, "max_connections").await.as_deref(), Ok("150"), "the engine runs the rendered file");
    for name in ["orders", "orders-replicas", "orders-headless"] {
        let svc = Api::<Service>::namespaced(c.clone(), ns).get(name).await.expect(name);
        assert_eq!(svc.owner_references()[0].name, "orders");
    }
    Api::<PodDisruptionBudget>::namespaced(c.clone(), ns).get("orders").await.expect("pdb");
    // The members' agent port is reached from the operator's address alone (the test
    // process's `--agent-from`); every other port from anyone (no `spec.clients`).
    let policy = Api::<NetworkPolicy>::namespaced(c.clone(), ns).get("orders").await.expect("the members' NetworkPolicy");
    assert_eq!(policy.owner_references()[0].name, "orders");
    let rules = policy.spec.and_then(|s| s.ingress).expect("ingress rules");
    assert_eq!(rules[0].from, None, "the engine: anyone");
    let agent = rules.iter().find(|r| r.ports.iter().flatten().any(|p| p.port == Some(IntOrString::Int(8443)) && p.end_port.is_none()));
    let from = agent.and_then(|r| r.from.clone()).expect("the agent port's rule names who reaches it");
    assert_eq!(from.len(), 1);
    assert_eq!(from[0].ip_block.as_ref().map(|b| b.cidr.as_str()), Some("10.201.0.1/32"), "{from:?}");
    let pods = Api::<Pod>::namespaced(c.clone(), ns).list(&ListParams::default().labels("plugdb.io/role=replica")).await.expect("pods");
    assert_eq!(pods.items.len(), 2, "two members labelled replica for the read-only Service");
    assert_eq!(image(&cluster, ns, "orders").await, "docker.io/library/postgres:15");

    // The credentials are never overwritten, even when a reconcile is forced.
    let dbs: Api<Database> = Api::namespaced(c.clone(), ns);
    let poke = |n: &str| json!({"metadata": {"annotations": {"poke": n}}});
    dbs.patch("orders", &PatchParams::default(), &Patch::Merge(poke("1"))).await.expect("poke");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = Api::<Secret>::namespaced(c.clone(), ns).get("orders-credentials").await.expect("credentials").data.expect("data");
    assert_eq!(after["superuser-password"], data["superuser-password"]);

    // Steady state: a resync is served from the caches and makes no request. The members'
    // agents are asked where each member is every half minute, the first time once the
    // operator has run that long (with the operator's certificate, read then and kept):
    // their first answers are in the status before anything is counted. After that, only
    // what they say moves without a change to anything (a checkpoint moves a position;
    // the status follows when they are next asked): a pass that wrote that alone into the
    // status is looked at again, a few times at most.
    let heard = |db: &Database| db.status.as_ref().is_some_and(|s| s.members.len() == 3 && s.members.iter().all(|m| m.heard.is_some()));
    cluster.wait_database(ns, "orders", "every member's agent said where it is", WAIT, heard).await.expect("heard");
    for attempt in 1.. {
        let (all, before) = (cluster.requests.by_kind(), dbs.get("orders").await.expect("orders").status);
        let reconciles = cluster.reconciles("postgres");
        dbs.patch("orders", &PatchParams::default(), &Patch::Merge(poke(&format!("steady-{attempt}")))).await.expect("poke");
        cluster.wait_until("the poke is reconciled", WAIT, || cluster.reconciles("postgres") > reconciles).await.expect("reconcile");
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (now, after) = (cluster.requests.by_kind(), dbs.get("orders").await.expect("orders").status);
        if now == all {
            break;
        }
        let status_only = now.iter().filter(|(kind, n)| all.get(*kind) != Some(n)).all(|(kind, _)| kind.contains("databases/status"));
        let heard_only = status_only && before != after && unheard(before) == unheard(after);
        assert!(heard_only && attempt < 5, "no requests in steady state: {all:?} became {now:?}");
    }

    // A restarted operator resyncs from its caches once its plugins are loaded: it never
    // reports the engine missing in between, and writes nothing. Its caches fill from
    // watches that stream what exists: it lists nothing whole and reads nothing.
    let all = cluster.requests.by_kind();
    cluster.restart_operator().expect("restart");
    cluster.wait_until("the restarted operator reconciles", WAIT, || cluster.reconciles("postgres") > 0).await.expect("resync");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(cluster.requests.by_kind(), all, "no write, list or read after a restart");
    for engine in ["postgres", "mysql"] {
        cluster.wait_engine(engine).await.expect("the restarted operator loads its plugins");
    }
}

/// `status` without what the member agents said (position, lag, when).
fn unheard(status: Option<plugdb::crd::DatabaseStatus>) -> Option<plugdb::crd::DatabaseStatus> {
    status.map(|mut s| {
        for m in &mut s.members {
            (m.position, m.lag, m.heard) = (None, None, None);
        }
        s
    })
}

/// Database `cache` of the test engine `minimal` (a server on its port), plus `extra` spec fields.
fn minimal(extra: serde_json::Value) -> serde_json::Value {
    let mut db = json!({"metadata": {"name": "cache"}, "spec": {"engine": "minimal", "version": "1", "storage": "64Mi",
        "resources": {"requests": {"cpu": "50m"}}}});
    if let (Some(spec), Some(extra)) = (db["spec"].as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    db
}

/// A Database of an engine nobody loaded waits with a condition and no children; the
/// plugin's ConfigMap brings it up with no restart; version 2 re-renders it; a broken
/// version 3 is refused while 2 keeps serving. Deleting it under the default policy is
/// held while the engine cannot take a final backup, and says why.
pub async fn plugins_arrive_and_change(cluster: Arc<Cluster>) {
    let ns = "minimal-plugins";
    cluster.apply_database(ns, minimal(json!({}))).await.expect("apply");
    let db = cluster
        .wait_database(ns, "cache", "PluginReady=False", WAIT, |d| condition(d, "PluginReady").is_some_and(|c| c.status == "False"))
        .await
        .expect("condition");
    let c = condition(&db, "PluginReady").expect("condition");
    assert_eq!(c.reason, "EngineNotFound");
    assert_eq!(db.status.as_ref().and_then(|s| s.phase), Some(plugdb::crd::Phase::Pending), "waiting for its plugin, not failed");
    assert!(c.message.contains("\"minimal\"") && c.message.contains("loaded: ") && c.message.contains("postgres"), "{}", c.message);
    assert!(Api::<StatefulSet>::namespaced(cluster.client.clone(), ns).get_opt("cache").await.expect("get").is_none(), "no children");

    let cms: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), OPERATOR_NAMESPACE);
    cms.create(&PostParams::default(), &plugin_config_map("minimal", "minimal")).await.expect("plugin");
    let db = cluster.wait_database(ns, "cache", "Running", WAIT, |d| is_running(d, 1)).await.expect("running");
    assert_eq!(db.status.and_then(|s| s.plugin).as_deref(), Some("minimal@1.0.0"));

    let mut v2 = plugin_config_map("minimal", "minimal-v2");
    v2.metadata.resource_version = cms.get("engine-minimal").await.expect("cm").metadata.resource_version;
    cms.replace("engine-minimal", &PostParams::default(), &v2).await.expect("swap");
    cluster
        .wait_database(ns, "cache", "re-rendered by minimal@2.0.0", WAIT, |d| {
            d.status.as_ref().and_then(|s| s.plugin.as_deref()) == Some("minimal@2.0.0")
        })
        .await
        .expect("hot swap");

    let mut broken = plugin_config_map("minimal", "minimal");
    broken.binary_data =
        Some(std::collections::BTreeMap::from([("plugin.wasm".to_string(), k8s_openapi::ByteString(b"not wasm".to_vec()))]));
    broken.metadata.resource_version = cms.get("engine-minimal").await.expect("cm").metadata.resource_version;
    cms.replace("engine-minimal", &PostParams::default(), &broken).await.expect("break");
    let db = cluster
        .wait_database(ns, "cache", "the rejection is reported", WAIT, |d| {
            condition(d, "PluginReady").is_some_and(|c| c.reason == "NewerVersionRejected")
        })
        .await
        .expect("reported");
    assert_eq!(db.status.as_ref().and_then(|s| s.plugin.as_deref()), Some("minimal@2.0.0"));
    let message = &condition(&db, "PluginReady").expect("c").message;
    assert!(message.contains("not a WebAssembly component"), "{message}");
    let build = plugdb::plugin::hex_digest(&plugdb_tests::component("minimal-v2"));
    assert!(message.contains(&format!("minimal@2.0.0 (sha256 {})", &build[..12])), "the serving build: {message}");
    assert!(is_running(&db, 1), "the running version keeps serving");
    scales_as_its_plugin_plans(&cluster, ns).await;

    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), ns);
    dbs.delete("cache", &DeleteParams::default()).await.expect("delete");
    let db = cluster
        .wait_database(ns, "cache", "FinalBackupImpossible", WAIT, |d| {
            condition(d, "BackupHealthy").is_some_and(|c| c.reason == "FinalBackupImpossible")
        })
        .await
        .expect("held");
    assert!(condition(&db, "BackupHealthy").expect("c").message.contains("deletionPolicy: Retain"));
    cluster.apply_database(ns, minimal(json!({"deletionPolicy": "Retain"}))).await.expect("policy");
    gone(&cluster, ns, "cache").await;
}

/// The minimal engine plans like a consensus engine: 1 → 3 grows one member at a time,
/// the third only once the second is ready; 3 → 1 would lose quorum and is refused,
/// the members staying. (An accepted scale-down: `tests/tests/reconciler.rs`.)
async fn scales_as_its_plugin_plans(cluster: &Cluster, ns: &str) {
    let sets: Api<StatefulSet> = Api::namespaced(cluster.client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    cluster.apply_database(ns, minimal(json!({"replicas": 3}))).await.expect("scale up");
    let (mut saw_two, deadline) = (false, tokio::time::Instant::now() + WAIT);
    loop {
        let replicas = sets.get("cache").await.expect("StatefulSet").spec.and_then(|s| s.replicas);
        let second_ready = pods.get_opt("cache-1").await.expect("get").is_some_and(|p| {
            p.status.and_then(|s| s.conditions).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        });
        saw_two |= replicas == Some(2);
        if replicas == Some(3) {
            assert!(saw_two && second_ready, "the third member came only after the second was ready");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "scaling to 3 did not reach the third member");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.wait_database(ns, "cache", "3 members", WAIT, |d| is_running(d, 3)).await.expect("3 running");

    cluster.apply_database(ns, minimal(json!({"replicas": 1}))).await.expect("scale down");
    let db = cluster
        .wait_database(ns, "cache", "ScaleRefused", WAIT, |d| condition(d, "Progressing").is_some_and(|c| c.reason == "ScaleRefused"))
        .await
        .expect("refused");
    assert!(condition(&db, "Progressing").expect("c").message.contains("would lose quorum"));
    assert_eq!(sets.get("cache").await.expect("StatefulSet").spec.and_then(|s| s.replicas), Some(3), "the members stay");
    assert_eq!(db.status.as_ref().and_then(|s| s.ready_replicas), Some(3));
}

/// A spec the plugin rejects: one condition naming every bad field, phase `Failed`,
/// no children.
pub async fn rejected_spec(cluster: Arc<Cluster>) {
    let ns = "postgres-rejected";
    let bad = json!({"parameters": {"max_connections": "lots", "fsync_everything": "yes"}});
    cluster.apply_database(ns, database("orders", Engine::Postgres, "13", 1, bad)).await.expect("apply");
    let db = cluster
        .wait_database(ns, "orders", "InvalidSpec", WAIT, |d| condition(d, "PluginReady").is_some_and(|c| c.reason == "InvalidSpec"))
        .await
        .expect("condition");
    let message = &condition(&db, "PluginReady").expect("condition").message;
    for part in ["spec.version", "spec.parameters.max_connections", "spec.parameters.fsync_everything"] {
        assert!(message.contains(part), "{message}");
    }
    assert_eq!(db.status.and_then(|s| s.phase), Some(plugdb::crd::Phase::Failed));
    assert!(Api::<StatefulSet>::namespaced(cluster.client.clone(), ns).get_opt("orders").await.expect("get").is_none());

    // It never ran: deleting it under the default policy (Snapshot) takes no final
    // backup, and is not held. Likewise for an engine nobody serves.
    cluster
        .apply_database(ns, json!({"metadata": {"name": "typo"}, "spec": {"engine": "postgress", "storage": "1Gi"}}))
        .await
        .expect("apply");
    cluster
        .wait_database(ns, "typo", "EngineNotFound", WAIT, |d| condition(d, "PluginReady").is_some_and(|c| c.reason == "EngineNotFound"))
        .await
        .expect("condition");
    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), ns);
    for name in ["orders", "typo"] {
        dbs.delete(name, &DeleteParams::default()).await.expect("delete");
        gone(&cluster, ns, name).await;
        assert!(Api::<Job>::namespaced(cluster.client.clone(), ns).get_opt(&format!("{name}-final")).await.expect("get").is_none());
        let backups = format!("{name}-backups");
        assert!(Api::<PersistentVolumeClaim>::namespaced(cluster.client.clone(), ns).get_opt(&backups).await.expect("get").is_none());
    }
}

/// A setting the plugin accepts but the engine cannot start with (`huge_pages: on`, on
/// nodes with no huge pages): the member crash loops, and the Database says so in
/// `Degraded` (reason `CrashLoop`) and a Warning Event, with the engine's last words
/// from its log; without the setting, the member is restarted onto it and runs.
///
/// A real Prometheus, scraping what the chart's PodMonitor selects and loaded
/// with plugdb's alert rules, scrapes the member's agent throughout: every rule
/// evaluates, `PlugdbMemberDown` fires for the member whose engine never answers, and
/// resolves once it runs and says it is the primary, with its volume measured; the
/// operator's series say it is Ready; and every query of the chart's dashboard has series.
pub async fn crash_loop_named(cluster: Arc<Cluster>) {
    let ns = "postgres-crash-loop";
    let rules = plugdb_tests::workspace_root().join("deploy/chart/plugdb/alerts/plugdb-rules.yaml");
    // The operator's /metrics, served as `plugdb run` serves them.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port for the operator's metrics");
    let operator = listener.local_addr().expect("its address").to_string();
    let served = tokio::spawn(plugdb::serve::serve(listener, cluster.metrics(), plugdb::health::Health::default()));
    let prometheus = Prometheus::start(crate::nodes::nodes(&cluster), ns, &operator, &rules).await.expect("Prometheus");
    let huge = json!({"parameters": {"huge_pages": "on"}});
    cluster.apply_database(ns, database("orders", Engine::Postgres, "17", 1, huge)).await.expect("apply");
    let db = cluster
        .wait_database(ns, "orders", "Degraded: CrashLoop", WAIT, |d| condition(d, "Degraded").is_some_and(|c| c.reason == "CrashLoop"))
        .await
        .expect("the crash loop named");
    let message = &condition(&db, "Degraded").expect("condition").message;
    assert!(message.contains("orders-0: container postgres is crash looping (restarted"), "{message}");
    assert!(message.contains("shared memory"), "the engine's own last words: {message}");
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(cluster.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("events");
    let warned: Vec<String> =
        events.items.iter().filter(|e| e.reason.as_deref() == Some("CrashLoop")).filter_map(|e| e.note.clone()).collect();
    assert_eq!(warned.len(), 1, "one Warning, however long it loops: {warned:?}");
    assert!(warned[0].contains("shared memory"), "{}", warned[0]);
    let member_down = |labels: &serde_json::Value| labels["alertname"] == "PlugdbMemberDown" && labels["member"] == "orders-0";
    let alerted = Instant::now();
    prometheus.until_firing("PlugdbMemberDown", "orders-0", WAIT).await;
    eprintln!("{ns}: PlugdbMemberDown firing in a real Prometheus {:.0} s after the crash loop was named", alerted.elapsed().as_secs_f64());

    cluster.apply_database(ns, database("orders", Engine::Postgres, "17", 1, json!({}))).await.expect("apply");
    cluster.wait_database(ns, "orders", "Running without it", WAIT, |d| is_running(d, 1)).await.expect("running");
    let db = Api::<Database>::namespaced(cluster.client.clone(), ns).get("orders").await.expect("get");
    assert_eq!(condition(&db, "Degraded").map(|c| c.reason.as_str()), Some("AllMembersUp"));
    let deadline = Instant::now() + WAIT;
    loop {
        let up =
            prometheus.query(&format!(r#"plugdb_member_up{{namespace="{ns}",database="orders",role="primary"}} == 1"#)).await.expect("up");
        let volume = prometheus.query(&format!(r#"plugdb_member_volume_used_bytes{{namespace="{ns}",member="orders-0"}} > 0"#)).await;
        let alerts = prometheus.alerts().await.expect("alerts");
        if up.len() == 1 && volume.is_ok_and(|v| v.len() == 1) && !alerts.iter().any(|(labels, _)| member_down(labels)) {
            break;
        }
        assert!(Instant::now() < deadline, "the member never came back in Prometheus: up {up:?}, alerts {alerts:?}");
        tokio::time::sleep(INTERVAL).await;
    }
    let rules = prometheus.rules().await.expect("rules");
    assert!(rules.len() >= 20 && rules.iter().all(|(_, health)| health == "ok"), "every rule evaluates: {rules:?}");
    // The operator's series of the Database, as its status says: Ready, Running.
    let deadline = Instant::now() + WAIT;
    loop {
        let ready =
            prometheus.query(&format!(r#"plugdb_database_condition{{namespace="{ns}",database="orders",state="Ready"}} == 1"#)).await;
        let running =
            prometheus.query(&format!(r#"plugdb_database_phase{{namespace="{ns}",database="orders",state="Running"}} == 1"#)).await;
        if ready.as_ref().is_ok_and(|r| r.len() == 1) && running.as_ref().is_ok_and(|r| r.len() == 1) {
            break;
        }
        assert!(Instant::now() < deadline, "the operator's series never said it: {ready:?} {running:?}");
        tokio::time::sleep(INTERVAL).await;
    }
    // Two members, a daily schedule and a backup now: every panel of the chart's
    // dashboard has series in this Prometheus (a replica's lag, a backup's age, the
    // recoverable window among them).
    let backups = json!({"backup": {"schedule": "0 0 3 * * *", "retention": 2}});
    cluster.apply_database(ns, database("orders", Engine::Postgres, "17", 2, backups)).await.expect("apply");
    let token = json!({"metadata": {"annotations": {"plugdb.io/backup-now": "for-the-dashboard"}}});
    Api::<Database>::namespaced(cluster.client.clone(), ns)
        .patch("orders", &PatchParams::default(), &Patch::Merge(token))
        .await
        .expect("annotate");
    cluster
        .wait_database(ns, "orders", "2 members Running, a backup made", WAIT, |d| {
            is_running(d, 2) && d.status.as_ref().is_some_and(|s| s.last_backup.is_some())
        })
        .await
        .expect("running with a backup");
    let dashboard = std::fs::read_to_string(plugdb_tests::workspace_root().join("deploy/chart/plugdb/dashboards/plugdb-database.json"))
        .expect("the dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&dashboard).expect("JSON");
    let queries: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| Some(t["expr"].as_str()?.replace("$namespace", ns).replace("$database", "orders")))
        .collect();
    assert!(queries.len() >= 11, "{queries:?}");
    let deadline = Instant::now() + WAIT;
    loop {
        let mut empty = Vec::new();
        for query in &queries {
            if !prometheus.query(query).await.is_ok_and(|series| !series.is_empty()) {
                empty.push(query.as_str());
            }
        }
        if empty.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "dashboard queries without series: {empty:?}");
        tokio::time::sleep(INTERVAL).await;
    }
    eprintln!("{ns}: each of the dashboard's {} queries has series in a real Prometheus", queries.len());
    // The engine's own series, from each member's exporter, labelled as the agent's are:
    // both members up, the replica a replica.
    let deadline = Instant::now() + WAIT;
    loop {
        let up = prometheus.query(&format!(r#"pg_up{{namespace="{ns}",database="orders",engine="postgres"}} == 1"#)).await;
        let replica = prometheus
            .query(&format!(r#"pg_replication_is_replica{{namespace="{ns}",database="orders",member="orders-1",role="replica"}} == 1"#))
            .await;
        if up.as_ref().is_ok_and(|u| u.len() == 2) && replica.as_ref().is_ok_and(|r| r.len() == 1) {
            break;
        }
        assert!(Instant::now() < deadline, "the exporters' series never said it: {up:?} {replica:?}");
        tokio::time::sleep(INTERVAL).await;
    }
    served.abort();
}

/// Backups on a schedule (every 5 s here) run as real Jobs named after their fire time;
/// retention keeps the newest 2 successful ones. A `backup-now` value makes exactly one
/// backup, remembered in status: retention removing its Job does not make another, and
/// no fire time is backed up twice. A failed backup's condition says why, in its
/// container's words. A bad schedule is a condition naming the field.
pub async fn scheduled_backups(cluster: Arc<Cluster>) {
    let ns = "postgres-schedule";
    let backup = json!({"backup": {"schedule": "*/5 * * * * *", "retention": 2}});
    cluster.apply_database(ns, database("orders", Engine::Postgres, "15", 1, backup)).await.expect("apply");
    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), ns);
    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), ns);
    // Every backup Job seen, by name: the uids it was created with (one each).
    let mut created: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    fn watch(created: &mut std::collections::BTreeMap<String, BTreeSet<String>>, listed: &[Job]) {
        for j in listed {
            created.entry(j.name_any()).or_default().insert(j.uid().unwrap_or_default());
        }
    }
    let mut seen = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen.len() < 4 {
        assert!(tokio::time::Instant::now() < deadline, "backups did not keep coming: {seen:?}");
        let db = dbs.get("orders").await.expect("db");
        if let Some(last) = db.status.as_ref().and_then(|s| s.last_backup.clone()) {
            assert!(last.name.starts_with("orders-2"), "named after its fire time: {}", last.name);
            seen.insert(last.name);
            assert!(db.status.as_ref().and_then(|s| s.next_backup.clone()).is_some());
        }
        let listed = jobs.list(&ListParams::default().labels("plugdb.io/backup-of=orders")).await.expect("jobs").items;
        // Beyond the newest 2, a backup should be gone once the second newer one completed:
        // the pass that completion wakes removes it (given 10 s on a loaded machine).
        let completed = |j: &&Job| {
            j.status.as_ref().and_then(|s| s.completion_time.clone()).filter(|_| j.status.as_ref().and_then(|s| s.succeeded) == Some(1))
        };
        let mut done: Vec<&Job> = listed.iter().filter(|j| completed(j).is_some()).collect();
        done.sort_by_key(|j| std::cmp::Reverse(completed(j)));
        let now = k8s_openapi::jiff::Timestamp::now();
        // Each beyond the newest 2 has been surplus since the backup two newer completed.
        let overdue: Vec<String> = done
            .iter()
            .zip(done.iter().skip(2))
            .filter(|(newer, _)| completed(newer).is_some_and(|t| now.duration_since(t.0).as_secs() > 10))
            .map(|(_, kept)| kept.name_any())
            .collect();
        assert!(
            overdue.is_empty(),
            "retention keeps 2: {overdue:?} kept over 10 s after the backup two newer completed (of {:?})",
            done.iter().map(|j| j.name_any()).collect::<Vec<_>>()
        );
        watch(&mut created, &listed);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // And it catches up: soon at most the newest 2 and one just finished are kept.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let listed = jobs.list(&ListParams::default().labels("plugdb.io/backup-of=orders")).await.expect("jobs").items;
        let succeeded: Vec<String> =
            listed.iter().filter(|j| j.status.as_ref().and_then(|s| s.succeeded) == Some(1)).map(|j| j.name_any()).collect();
        watch(&mut created, &listed);
        if succeeded.len() <= 3 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "retention keeps 2 (and one just finished): {succeeded:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Api::<PersistentVolumeClaim>::namespaced(cluster.client.clone(), ns).get("orders-backups").await.expect("the backup volume");

    let token = json!({"metadata": {"annotations": {"plugdb.io/backup-now": "before-migration"}}});
    dbs.patch("orders", &PatchParams::default(), &Patch::Merge(token)).await.expect("annotate");
    let manual = |names: &std::collections::BTreeMap<String, BTreeSet<String>>| {
        names.iter().filter(|(n, _)| n.starts_with("orders-manual-")).map(|(_, uids)| uids.len()).sum::<usize>()
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut pruned = false;
    // Until retention has removed the manual backup's Job, and a while after.
    let mut after_pruned = 0;
    while after_pruned < 10 {
        assert!(tokio::time::Instant::now() < deadline, "the on-demand backup ran and was pruned: {created:?}");
        let listed = jobs.list(&ListParams::default().labels("plugdb.io/backup-of=orders")).await.expect("jobs").items;
        watch(&mut created, &listed);
        let present = listed.iter().any(|j| j.name_any().starts_with("orders-manual-"));
        pruned |= manual(&created) == 1 && !present;
        after_pruned += usize::from(pruned);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(manual(&created), 1, "one backup for one backup-now value: {created:?}");
    let twice: Vec<&String> = created.iter().filter(|(_, uids)| uids.len() > 1).map(|(n, _)| n).collect();
    assert!(twice.is_empty(), "backups made twice: {twice:?}");
    let db = dbs.get("orders").await.expect("db");
    assert_eq!(db.status.and_then(|s| s.backup_request).as_deref(), Some("before-migration"), "the request is remembered");

    // A backup that fails says why, in the failed container's own words: here the
    // password backup Jobs log in with no longer matches the server's, which an
    // administrator changed (the credentials Secret is plugdb's, stamped: a changed one
    // would not be this Database's any more).
    let client = Client::new(&cluster, Engine::Postgres, ns, "orders").await;
    let member = client.members().await.into_iter().next().expect("the member");
    client.administer(&member, "ALTER ROLE replicator PASSWORD 'not-the-password'").await.expect("password changed");
    let db = cluster
        .wait_database(ns, "orders", "a failed backup's condition naming its cause", WAIT, |d| {
            condition(d, "BackupHealthy").is_some_and(|c| c.status == "False" && c.message.contains("password authentication failed"))
        })
        .await
        .expect("the cause");
    let message = &condition(&db, "BackupHealthy").expect("c").message;
    assert!(message.starts_with("backup orders-") && message.contains("failed: container "), "{message}");
    assert!(!message.contains('\n') && message.len() < 700, "one bounded line: {message}");

    cluster
        .apply_database(ns, database("orders", Engine::Postgres, "15", 1, json!({"backup": {"schedule": "61 * * * *"}})))
        .await
        .expect("apply");
    let db = cluster
        .wait_database(ns, "orders", "BackupHealthy=False naming the schedule", WAIT, |d| {
            condition(d, "BackupHealthy").is_some_and(|c| c.status == "False" && c.message.contains("spec.backup.schedule"))
        })
        .await
        .expect("condition");
    let message = &condition(&db, "BackupHealthy").expect("c").message;
    assert!(message.contains("spec.backup.schedule") && message.contains("minute 61 is out of range 0-59"), "{message}");
    assert!(!message.contains('\n'), "one line: {message}");
}
