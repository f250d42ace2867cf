//! Tier 4 scenarios: upgrades, failover, backups and deletion, on a real control
//! plane with the kubelet stand-in.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use plugdb::crd::Database;
use plugdb::reconcile::members::POSITION_ANNOTATION;
use plugdb_tests::kubelet::NOT_READY;
use plugdb_tests::operator::Cluster;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);

fn condition<'a>(db: &'a Database, type_: &str) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    db.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

fn is_running(db: &Database, replicas: i32) -> bool {
    let s = db.status.clone().unwrap_or_default();
    s.phase.as_deref() == Some("Running") && s.ready_replicas == Some(replicas) && s.observed_generation == db.metadata.generation
}

fn database(name: &str, engine: &str, version: &str, replicas: i32, extra: serde_json::Value) -> serde_json::Value {
    let mut spec = json!({"engine": engine, "version": version, "replicas": replicas, "storage": {"size": "1Gi"}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    json!({"metadata": {"name": name}, "spec": spec})
}

async fn events(cluster: &Cluster, ns: &str, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(cluster.client.clone(), ns);
    let mut list = api.list(&ListParams::default()).await.expect("events").items;
    list.retain(|e| e.reason.as_deref() == Some(reason));
    list
}

async fn image(cluster: &Cluster, ns: &str, name: &str) -> String {
    let sts = Api::<StatefulSet>::namespaced(cluster.client.clone(), ns).get(name).await.expect("statefulset");
    sts.spec.expect("spec").template.spec.expect("pod").containers[0].image.clone().unwrap_or_default()
}

#[tokio::test]
async fn a_minor_upgrade_rolls_replicas_first_and_a_downgrade_is_refused() {
    let cluster = Cluster::start(&[("postgres", "postgres")]).await.expect("cluster");
    cluster.apply_database("shop", database("orders", "postgres", "15.2", 3, json!({}))).await.expect("apply");
    cluster.wait_database("shop", "orders", "Running", WAIT, |d| is_running(d, 3)).await.expect("running");

    cluster.apply_database("shop", database("orders", "postgres", "15.4", 3, json!({}))).await.expect("upgrade");
    let db = cluster
        .wait_database("shop", "orders", "upgraded to 15.4", WAIT, |d| {
            d.status.as_ref().and_then(|s| s.current_version.as_deref()) == Some("15.4") && is_running(d, 3)
        })
        .await
        .expect("upgraded");
    assert!(db.status.expect("status").upgrade.is_none());
    assert_eq!(image(&cluster, "shop", "orders").await, "docker.io/library/postgres:15.4");
    let mut restarts = events(&cluster, "shop", "MemberRestarted").await;
    restarts.sort_by_key(|e| e.event_time.clone().map(|t| t.0));
    let order: Vec<String> = restarts.iter().filter_map(|e| e.note.clone()).collect();
    assert_eq!(order.len(), 3, "{order:?}");
    assert!(
        order[0].contains("orders-2") && order[1].contains("orders-1") && order[2].contains("orders-0"),
        "replicas first, primary last: {order:?}"
    );
    assert_eq!(events(&cluster, "shop", "UpgradeCompleted").await.len(), 1);

    // A downgrade is refused by the plugin: a condition and an Event, nothing changes.
    cluster.apply_database("shop", database("orders", "postgres", "15.2", 3, json!({}))).await.expect("downgrade");
    let db = cluster
        .wait_database("shop", "orders", "UpgradeRefused", WAIT, |d| {
            condition(d, "Progressing").is_some_and(|c| c.reason == "UpgradeRefused")
        })
        .await
        .expect("refused");
    assert!(condition(&db, "Progressing").expect("condition").message.contains("downgrading"), "{:?}", condition(&db, "Progressing"));
    assert_eq!(db.status.as_ref().and_then(|s| s.current_version.as_deref()), Some("15.4"));
    assert_eq!(image(&cluster, "shop", "orders").await, "docker.io/library/postgres:15.4", "the running version stays");
    assert!(!events(&cluster, "shop", "UpgradeRefused").await.is_empty());
}

#[tokio::test]
async fn the_primary_fails_over_to_the_replica_the_plugin_chooses_and_never_to_an_unsafe_one() {
    let cluster = Cluster::start(&[("postgres", "postgres")]).await.expect("cluster");
    cluster.apply_database("shop", database("orders", "postgres", "15", 3, json!({}))).await.expect("apply");
    cluster.wait_database("shop", "orders", "Running", WAIT, |d| is_running(d, 3)).await.expect("running");
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), "shop");
    let annotate = |name: &'static str, key: &'static str, value: &'static str| {
        let pods = pods.clone();
        async move {
            pods.patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})))
                .await
                .expect("annotate");
        }
    };

    // No replica reports a position: the primary goes down, but nobody is promoted.
    annotate("orders-0", NOT_READY, "true").await;
    let db = cluster
        .wait_database("shop", "orders", "NoSafeFailover", WAIT, |d| condition(d, "Degraded").is_some_and(|c| c.reason == "NoSafeFailover"))
        .await
        .expect("no safe member");
    assert_eq!(db.status.and_then(|s| s.primary).as_deref(), Some("orders-0"), "never promote when no member is safe");

    // Replicas report positions: the most advanced one is promoted.
    annotate("orders-1", POSITION_ANNOTATION, "0/5000060").await;
    annotate("orders-2", POSITION_ANNOTATION, "0/3000060").await;
    let db = cluster
        .wait_database("shop", "orders", "orders-1 promoted", WAIT, |d| {
            d.status.as_ref().and_then(|s| s.primary.as_deref()) == Some("orders-1")
        })
        .await
        .expect("failover");
    assert_eq!(db.status.and_then(|s| s.primary).as_deref(), Some("orders-1"));
    let svc = Api::<Service>::namespaced(cluster.client.clone(), "shop").get("orders").await.expect("service");
    let selector = svc.spec.and_then(|s| s.selector).expect("selector");
    assert_eq!(selector["statefulset.kubernetes.io/pod-name"], "orders-1", "the primary Service moved");
    let promoted = events(&cluster, "shop", "FailoverPromoted").await;
    assert_eq!(promoted.len(), 1);
    assert!(promoted[0].note.as_deref().is_some_and(|n| n.contains("pg_ctl promote")), "{:?}", promoted[0].note);
    // The promoted member restarts first to take its role; the old primary comes back as a replica.
    let sts: Api<StatefulSet> = Api::namespaced(cluster.client.clone(), "shop");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let revision = sts.get("orders").await.expect("sts").status.and_then(|s| s.update_revision).unwrap_or_default();
        let mut current = 0;
        for name in ["orders-0", "orders-1", "orders-2"] {
            // A member being restarted is briefly absent: it is not current yet.
            let Some(pod) = pods.get_opt(name).await.expect("pod") else { continue };
            let env = pod.spec.as_ref().map(|s| s.containers[0].env.clone().unwrap_or_default()).unwrap_or_default();
            let names_new_primary = env.iter().any(|e| e.name == "PRIMARY_POD" && e.value.as_deref() == Some("orders-1"));
            current += usize::from(pod.labels().get("controller-revision-hash") == Some(&revision) && names_new_primary);
        }
        if current == 3 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "members restarted onto the new primary: {current}/3");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut restarts = events(&cluster, "shop", "MemberRestarted").await;
    restarts.sort_by_key(|e| e.event_time.clone().map(|t| t.0));
    assert!(restarts.first().and_then(|e| e.note.as_deref()).is_some_and(|n| n.contains("orders-1")), "the new primary first");
    let role = |p: Option<Pod>| p.and_then(|p| p.labels().get("plugdb.io/role").cloned());
    let deadline = tokio::time::Instant::now() + WAIT;
    while role(pods.get_opt("orders-1").await.expect("pod")).as_deref() != Some("primary") {
        assert!(tokio::time::Instant::now() < deadline, "orders-1 relabelled primary");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn scheduled_backups_run_on_time_under_deterministic_names_with_retention() {
    let cluster = Cluster::start(&[("postgres", "postgres")]).await.expect("cluster");
    let backup = json!({"backup": {"schedule": "*/2 * * * * *", "retention": 2}});
    cluster.apply_database("shop", database("orders", "postgres", "15", 1, backup)).await.expect("apply");
    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), "shop");
    let mut seen = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen.len() < 6 {
        assert!(tokio::time::Instant::now() < deadline, "backups did not keep coming: {seen:?}");
        let db = Api::<Database>::namespaced(cluster.client.clone(), "shop").get("orders").await.expect("db");
        if let Some(last) = db.status.as_ref().and_then(|s| s.last_backup.clone()) {
            assert!(last.name.starts_with("orders-2"), "named after its fire time: {}", last.name);
            seen.insert(last.name);
            assert!(db.status.as_ref().and_then(|s| s.next_backup.clone()).is_some());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), "shop");
    claims.get("orders-backups").await.expect("the backup volume");
    // Retention: six backups succeeded, yet at most 2 kept + 1 just finished + 1 running remain.
    let listed = jobs.list(&ListParams::default().labels("plugdb.io/backup-of=orders")).await.expect("jobs").items;
    assert!(listed.len() <= 4, "retention keeps 2: {:?}", listed.iter().map(|j| j.name_any()).collect::<Vec<_>>());

    // On demand: a new annotation value, one backup.
    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), "shop");
    dbs.patch(
        "orders",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"plugdb.io/backup-now": "before-migration"}}})),
    )
    .await
    .expect("annotate");
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let names: Vec<String> = jobs
            .list(&ListParams::default().labels("plugdb.io/backup-of=orders"))
            .await
            .expect("jobs")
            .items
            .iter()
            .map(|j| j.name_any())
            .collect();
        if names.iter().any(|n| n.starts_with("orders-manual-")) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no on-demand backup: {names:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // An invalid schedule is a clear condition.
    cluster
        .apply_database("shop", database("orders", "postgres", "15", 1, json!({"backup": {"schedule": "every night"}})))
        .await
        .expect("apply");
    let db = cluster
        .wait_database("shop", "orders", "BackupHealthy=False", WAIT, |d| {
            condition(d, "BackupHealthy").is_some_and(|c| c.status == "False")
        })
        .await
        .expect("condition");
    assert!(condition(&db, "BackupHealthy").expect("c").message.contains("spec.backup.schedule"), "{:?}", condition(&db, "BackupHealthy"));
}

async fn gone(cluster: &Cluster, ns: &str, name: &str) {
    let api: Api<Database> = Api::namespaced(cluster.client.clone(), ns);
    let deadline = tokio::time::Instant::now() + WAIT;
    while api.get_opt(name).await.expect("get").is_some() {
        assert!(tokio::time::Instant::now() < deadline, "{name} was not deleted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn deletion_follows_the_policy() {
    let cluster = Cluster::start(&[("postgres", "postgres"), ("minimal", "minimal")]).await.expect("cluster");
    for (name, policy) in [("snap", "Snapshot"), ("keep", "Retain"), ("drop", "Delete")] {
        cluster.apply_database("data", database(name, "postgres", "15", 1, json!({"deletionPolicy": policy}))).await.expect("apply");
    }
    cluster.apply_database("data", database("nosnap", "minimal", "1", 1, json!({}))).await.expect("apply");
    for name in ["snap", "keep", "drop", "nosnap"] {
        cluster.wait_database("data", name, "Running", WAIT, |d| is_running(d, 1)).await.expect("running");
    }
    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), "data");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), "data");
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), "data");
    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), "data");
    for name in ["snap", "keep", "drop"] {
        claims.get(&format!("data-{name}-0")).await.expect("a member volume");
        dbs.delete(name, &DeleteParams::default()).await.expect("delete");
    }

    // Snapshot: a final backup first, then the Database goes; volumes and credentials stay.
    gone(&cluster, "data", "snap").await;
    let final_job = jobs.get("snap-final").await.expect("the final backup Job");
    assert_eq!(final_job.status.and_then(|s| s.succeeded), Some(1));
    assert!(claims.get_opt("data-snap-0").await.expect("get").is_some(), "Snapshot keeps the volume");
    assert!(secrets.get_opt("snap-credentials").await.expect("get").is_some(), "and the credentials");

    // Retain: no final backup; volumes kept.
    gone(&cluster, "data", "keep").await;
    assert!(jobs.get_opt("keep-final").await.expect("get").is_none());
    assert!(claims.get_opt("data-keep-0").await.expect("get").is_some(), "Retain keeps the volume");

    // Delete: the volumes and credentials go too.
    gone(&cluster, "data", "drop").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while claims.get_opt("data-drop-0").await.expect("get").is_some() || secrets.get_opt("drop-credentials").await.expect("get").is_some() {
        assert!(tokio::time::Instant::now() < deadline, "Delete removes volumes and credentials");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A final backup that cannot be taken holds the deletion and says why.
    dbs.delete("nosnap", &DeleteParams::default()).await.expect("delete");
    let db = cluster
        .wait_database("data", "nosnap", "FinalBackupImpossible", WAIT, |d| {
            condition(d, "BackupHealthy").is_some_and(|c| c.reason == "FinalBackupImpossible")
        })
        .await
        .expect("held");
    assert!(condition(&db, "BackupHealthy").expect("c").message.contains("deletionPolicy: Retain"));
    cluster
        .apply_database("data", database("nosnap", "minimal", "1", 1, json!({"deletionPolicy": "Retain"})))
        .await
        .expect("switch policy");
    gone(&cluster, "data", "nosnap").await;
}

#[tokio::test]
async fn a_new_database_restores_from_another_ones_backup_before_its_members_start() {
    let cluster = Cluster::start(&[("postgres", "postgres")]).await.expect("cluster");
    let backup = json!({"backup": {"schedule": "*/2 * * * * *", "retention": 3}});
    cluster.apply_database("shop", database("orders", "postgres", "15", 1, backup)).await.expect("apply");
    let source = cluster
        .wait_database("shop", "orders", "a backup exists", WAIT, |d| d.status.as_ref().is_some_and(|s| s.last_backup.is_some()))
        .await
        .expect("backup");
    let backup_name = source.status.and_then(|s| s.last_backup).expect("last backup").name;

    let restore = json!({"restoreFrom": {"database": "orders", "backup": backup_name}});
    cluster.apply_database("shop", database("copy", "postgres", "15", 1, restore)).await.expect("apply copy");
    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), "shop");
    let deadline = tokio::time::Instant::now() + WAIT;
    let job = loop {
        if let Some(job) = jobs.get_opt("copy-restore").await.expect("get") {
            break job;
        }
        assert!(tokio::time::Instant::now() < deadline, "no restore Job");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The physical restore writes member 0's volume from the source's backup volume.
    let pod = job.spec.expect("spec").template.spec.expect("pod");
    let claims: Vec<String> =
        pod.volumes.iter().flatten().filter_map(|v| v.persistent_volume_claim.as_ref().map(|c| c.claim_name.clone())).collect();
    assert_eq!(claims, ["orders-backups", "data-copy-0"]);
    let command = pod.containers[0].command.clone().unwrap_or_default().join(" ");
    assert!(command.contains("tar -xzf"), "{command}");
    let env = pod.containers[0].env.clone().unwrap_or_default();
    assert!(env.iter().any(|e| e.name == "BACKUP_NAME" && e.value.as_deref() == Some(backup_name.as_str())));

    let db = cluster.wait_database("shop", "copy", "Running after the restore", WAIT, |d| is_running(d, 1)).await.expect("running");
    assert_eq!(condition(&db, "Restored").map(|c| c.status.as_str()), Some("True"));
    let restored = jobs.get("copy-restore").await.expect("job");
    let sts = Api::<StatefulSet>::namespaced(cluster.client.clone(), "shop").get("copy").await.expect("statefulset");
    assert!(
        sts.metadata.creation_timestamp >= restored.status.and_then(|s| s.completion_time),
        "members start only after the restore completed"
    );
    assert!(!events(&cluster, "shop", "Restored").await.is_empty());
}

#[tokio::test]
async fn a_major_upgrade_backs_up_first_rolls_then_runs_the_plugins_upgrade_job() {
    let cluster = Cluster::start(&[("mysql", "mysql")]).await.expect("cluster");
    let yearly = json!({"backup": {"schedule": "0 0 1 1 *"}});
    cluster.apply_database("shop", database("shop", "mysql", "10.11", 2, yearly.clone())).await.expect("apply");
    cluster.wait_database("shop", "shop", "Running", WAIT, |d| is_running(d, 2)).await.expect("running");

    cluster.apply_database("shop", database("shop", "mysql", "11.8", 2, yearly)).await.expect("upgrade");
    let db = cluster
        .wait_database("shop", "shop", "upgraded to 11.8", WAIT, |d| {
            d.status.as_ref().and_then(|s| s.current_version.as_deref()) == Some("11.8") && is_running(d, 2)
        })
        .await
        .expect("upgraded");
    assert!(db.status.expect("status").upgrade.is_none());
    assert_eq!(image(&cluster, "shop", "shop").await, "docker.io/library/mariadb:11.8");

    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), "shop");
    let all = jobs.list(&ListParams::default()).await.expect("jobs").items;
    let named = |prefix: &str| all.iter().find(|j| j.name_any().starts_with(prefix)).cloned();
    let backup = named("shop-pre-").expect("a pre-upgrade backup Job");
    let upgrade = named("shop-upgrade-").expect("the plugin's upgrade Job");
    assert_eq!(backup.status.as_ref().and_then(|s| s.succeeded), Some(1));
    assert_eq!(upgrade.status.as_ref().and_then(|s| s.succeeded), Some(1));
    let command = upgrade
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers[0].command.clone().unwrap_or_default().join(" "))
        .unwrap_or_default();
    assert!(command.contains("mariadb-upgrade"), "{command}");
    assert!(
        backup.status.and_then(|s| s.completion_time) <= upgrade.metadata.creation_timestamp,
        "the backup finished before the upgrade step started"
    );
    assert_eq!(events(&cluster, "shop", "UpgradeCompleted").await.len(), 1);
}
