//! Tier 4: the reconciler's own bookkeeping on a real control plane. What it keeps per
//! Database goes with the Database (100 are created, reconciled and deleted; afterwards
//! it holds no state about any of them), and a write the API server refuses for a
//! reason the user can act on is reported once, as a Warning Event and a condition.

use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use plugdb::crd::{Database, DeletionPolicy};
use plugdb::reconcile::FINALIZER;
use plugdb_tests::ControlPlane;
use plugdb_tests::control_plane::Options;
use plugdb_tests::operator::{InProcess, prepare, test_settings, wait_for};

const COUNT: usize = 100;

#[tokio::test]
async fn deleting_100_databases_leaves_no_state_behind_in_the_reconciler() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("minimal", "minimal")]).await.expect("CRD and plugins");
    let operator = InProcess::start(&cp.kubeconfig, test_settings()).await.expect("operator");
    let entries = || operator.metric("plugdb_reconcile_state_entries", |_| true) as usize;

    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    for i in 0..COUNT {
        let db: Database = serde_json::from_value(serde_json::json!({
            "apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": format!("db-{i}")},
            // Half go at once; half through the operator's finalizer, which lets a
            // Database that never ran (its engine has no plugin) go without a backup.
            "spec": if i % 2 == 0 {
                serde_json::json!({"engine": "minimal", "storage": "1Gi", "deletionPolicy": "Retain"})
            } else {
                serde_json::json!({"engine": "absent", "storage": "1Gi", "deletionPolicy": "Snapshot"})
            },
        }))
        .expect("a Database");
        dbs.create(&PostParams::default(), &db).await.expect("create");
    }
    let mut most = 0;
    wait_for("every Database is reconciled", Duration::from_secs(180), async || {
        most = most.max(entries());
        let list = dbs.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        let reconciled = list.iter().filter(|d| d.status.as_ref().is_some_and(|s| s.observed_generation.is_some()));
        reconciled.filter(|d| d.finalizers().iter().any(|f| f == FINALIZER) == (d.spec.deletion_policy == DeletionPolicy::Snapshot)).count()
            == COUNT
    })
    .await;
    assert!(most > 0, "the reconciler keeps state while the Databases live");

    dbs.delete_collection(&DeleteParams::default(), &ListParams::default()).await.expect("delete all");
    wait_for("every Database is gone", Duration::from_secs(180), async || {
        most = most.max(entries());
        dbs.list(&ListParams::default()).await.is_ok_and(|l| l.items.is_empty())
    })
    .await;
    wait_for("no state is kept about them", Duration::from_secs(30), async || entries() == 0).await;
}

/// A quota that admits one Service: the operator's second Service is refused (403). The
/// Database says so in `Progressing` and in one Warning Event however often the pass is
/// retried; once the quota allows it, the Database converges and the condition follows.
#[tokio::test]
async fn a_write_the_api_server_refuses_is_reported_once_as_an_event_and_a_condition() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("minimal", "minimal")]).await.expect("CRD and plugins");
    let ns = "limited";
    let namespaces: Api<Namespace> = Api::all(cp.client.clone());
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).expect("ns"))
        .await
        .expect("namespace");
    let quotas: Api<ResourceQuota> = Api::namespaced(cp.client.clone(), ns);
    let quota = |services: &str| serde_json::json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "services"}, "spec": {"hard": {"services": services}}});
    quotas.patch("services", &PatchParams::apply("test"), &Patch::Apply(quota("1"))).await.expect("quota");
    wait_for("the quota is counted", Duration::from_secs(60), async || {
        quotas.get("services").await.is_ok_and(|q| q.status.and_then(|s| s.used).is_some_and(|u| u.contains_key("services")))
    })
    .await;

    let operator = InProcess::start(&cp.kubeconfig, test_settings()).await.expect("operator");
    let errors = || operator.metric("plugdb_reconcile_errors_total", |_| true) as u64;

    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), ns);
    let db = serde_json::json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": "cache"},
                                "spec": {"engine": "minimal", "storage": "1Gi"}});
    dbs.patch("cache", &PatchParams::apply("test"), &Patch::Apply(&db)).await.expect("database");
    let progressing = async || {
        let db = dbs.get("cache").await.ok()?;
        db.status?.conditions.into_iter().find(|c| c.type_ == "Progressing")
    };
    wait_for("the refusal is in the status", Duration::from_secs(60), async || {
        progressing().await.is_some_and(|c| c.status == "False" && c.reason == "WriteRefused" && c.message.contains("exceeded quota"))
    })
    .await;
    // Retried with backoff (1 s, 2 s, 4 s): the same refusal, told once.
    let first = errors();
    wait_for("two more tries", Duration::from_secs(30), async || errors() >= first + 2).await;
    let refusals = events_with_reason(&cp, ns, "WriteRefused").await;
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert_eq!(refusals[0].type_.as_deref(), Some("Warning"));
    assert!(refusals[0].series.is_none(), "repeated as a series: {:?}", refusals[0].series);
    assert!(refusals[0].note.as_deref().is_some_and(|n| n.contains("exceeded quota")), "{:?}", refusals[0].note);
    assert_eq!(refusals[0].regarding.as_ref().and_then(|r| r.name.as_deref()), Some("cache"));

    quotas.patch("services", &PatchParams::apply("test"), &Patch::Apply(quota("10"))).await.expect("quota raised");
    wait_for("the Database converges past the refusal", Duration::from_secs(60), async || {
        progressing().await.is_some_and(|c| c.reason != "WriteRefused")
    })
    .await;
}

/// Children are created (cheaper for the API server than an apply) and applied from
/// then on: a field a later render leaves out still goes, as from an applied object,
/// and the operator ends up owning its fields through one apply entry.
#[tokio::test]
async fn a_field_a_later_render_leaves_out_goes_from_a_created_child() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("minimal", "minimal")]).await.expect("CRD and plugins");
    let _operator = InProcess::start(&cp.kubeconfig, test_settings()).await.expect("operator");
    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    let db = |resources: serde_json::Value| {
        serde_json::json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": "cache"},
                           "spec": {"engine": "minimal", "storage": "1Gi", "resources": resources}})
    };
    dbs.patch("cache", &PatchParams::apply("test"), &Patch::Apply(db(serde_json::json!({"limits": {"memory": "512Mi"}}))))
        .await
        .expect("database");
    let sets: Api<StatefulSet> = Api::namespaced(cp.client.clone(), "default");
    let limits = async || {
        let set = sets.get_opt("cache").await.ok().flatten()?;
        let container = set.spec?.template.spec?.containers.into_iter().next()?;
        Some(container.resources.and_then(|r| r.limits).unwrap_or_default())
    };
    wait_for("the StatefulSet is made with the limit", Duration::from_secs(60), async || {
        limits().await.is_some_and(|l| l.contains_key("memory"))
    })
    .await;
    let created = sets.get("cache").await.expect("the StatefulSet");
    let operations: Vec<_> =
        created.managed_fields().iter().filter(|e| e.manager.as_deref() == Some("plugdb")).map(|e| e.operation.clone()).collect();
    assert_eq!(operations, [Some("Update".to_string())], "made by a create");

    dbs.patch("cache", &PatchParams::apply("test"), &Patch::Apply(db(serde_json::json!({})))).await.expect("limit removed");
    wait_for("the limit is gone from the StatefulSet", Duration::from_secs(60), async || limits().await.is_some_and(|l| l.is_empty()))
        .await;
    let applied = sets.get("cache").await.expect("the StatefulSet");
    let ours: Vec<_> = applied.managed_fields().iter().filter(|e| e.manager.as_deref() == Some("plugdb")).collect();
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert_eq!(ours[0].operation.as_deref(), Some("Apply"));
}

/// With no requeue due, a deleted child still wakes its Database: the StatefulSet is
/// made again from the deletion alone.
#[tokio::test]
async fn a_statefulset_deleted_by_hand_is_made_again_at_once() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("minimal", "minimal")]).await.expect("CRD and plugins");
    let hour = Duration::from_secs(3600);
    let settings = plugdb::reconcile::Settings { progress_requeue: hour, idle_requeue: hour, ..test_settings() };
    let _operator = InProcess::start(&cp.kubeconfig, settings).await.expect("operator");
    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    let db = serde_json::json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": "cache"},
                                "spec": {"engine": "minimal", "storage": "1Gi"}});
    dbs.patch("cache", &PatchParams::apply("test"), &Patch::Apply(&db)).await.expect("database");
    let sets: Api<StatefulSet> = Api::namespaced(cp.client.clone(), "default");
    wait_for("the StatefulSet is made", Duration::from_secs(60), async || sets.get_opt("cache").await.ok().flatten().is_some()).await;
    let first = sets.get("cache").await.expect("the StatefulSet").uid();
    sets.delete("cache", &DeleteParams::background()).await.expect("delete");
    wait_for("the StatefulSet is made again", Duration::from_secs(30), async || {
        sets.get_opt("cache").await.ok().flatten().is_some_and(|s| s.uid() != first)
    })
    .await;
}

/// An API server that cannot stream a watch's initial objects (the WatchList feature
/// off, as Kubernetes 1.33 ships): the operator's watches ask it for whole lists
/// instead, and a Database converges as on any other server.
#[tokio::test]
async fn an_api_server_that_does_not_stream_lists_is_listed_whole() {
    let options = Options { feature_gates: Some("WatchList=false".into()), ..Default::default() };
    let cp = ControlPlane::start_with(options).await.expect("control plane");
    prepare(&cp.client, &[("minimal", "minimal")]).await.expect("CRD and plugins");
    let _operator = InProcess::start(&cp.kubeconfig, test_settings()).await.expect("operator");
    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    let db = serde_json::json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": "cache"},
        "spec": {"engine": "minimal", "storage": "1Gi"}});
    dbs.patch("cache", &PatchParams::apply("test"), &Patch::Apply(db)).await.expect("apply");
    let sets: Api<StatefulSet> = Api::namespaced(cp.client.clone(), "default");
    wait_for("the Database is reconciled", Duration::from_secs(60), async || {
        let reconciled = dbs.get("cache").await.is_ok_and(|d| d.status.is_some_and(|s| s.observed_generation == Some(1)));
        reconciled && sets.get_opt("cache").await.is_ok_and(|s| s.is_some())
    })
    .await;
}

/// The host consults a plugin's declared capabilities: `minimal` declares neither
/// backups nor restores, so it is never asked for one, and a Database that wants one
/// gets a condition naming the field and the missing capability at once.
#[tokio::test]
async fn a_plugin_is_not_asked_for_what_it_does_not_declare() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("minimal", "minimal")]).await.expect("CRD and plugins");
    let _operator = InProcess::start(&cp.kubeconfig, test_settings()).await.expect("operator");
    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    let apply = async |name: &str, extra: serde_json::Value| {
        let mut spec = serde_json::json!({"engine": "minimal", "storage": "1Gi", "deletionPolicy": "Retain"});
        spec.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
        let db = serde_json::json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": name}, "spec": spec});
        dbs.patch(name, &PatchParams::apply("test"), &Patch::Apply(db)).await.expect("apply");
    };
    // A yearly schedule: no backup is due, the condition comes from the spec alone.
    apply("kept", serde_json::json!({"backup": {"schedule": "0 0 1 1 *"}})).await;
    apply("copied", serde_json::json!({"restoreFrom": {"database": "kept", "backup": "kept-1"}})).await;
    apply("secured", serde_json::json!({"tls": {"enabled": true}})).await;
    let condition = async |name: &str, type_: &str| {
        let db = dbs.get(name).await.ok()?;
        db.status?.conditions.into_iter().find(|c| c.type_ == type_ && c.status == "False")
    };
    wait_for("the three conditions", Duration::from_secs(60), async || {
        condition("kept", "BackupHealthy").await.is_some()
            && condition("copied", "Progressing").await.is_some()
            && condition("secured", "PluginReady").await.is_some()
    })
    .await;
    let tls = condition("secured", "PluginReady").await.expect("PluginReady");
    assert_eq!(tls.reason, "CapabilityMissing");
    assert!(tls.message.starts_with("spec.tls: ") && tls.message.contains("does not declare the tls capability"), "{tls:?}");
    let built = Api::<StatefulSet>::namespaced(cp.client.clone(), "default").get_opt("secured").await.expect("get");
    assert!(built.is_none(), "nothing is built for a Database its plugin cannot serve as asked");
    let backup = condition("kept", "BackupHealthy").await.expect("BackupHealthy").message;
    assert!(backup.starts_with("spec.backup: ") && backup.contains("does not declare the backup capability"), "{backup}");
    let restore = condition("copied", "Progressing").await.expect("Progressing");
    assert_eq!(restore.reason, "RestoreFailed");
    assert!(
        restore.message.contains("spec.restoreFrom") && restore.message.contains("does not declare the restore capability"),
        "{restore:?}"
    );
}

/// A scale the plugin refuses (a quorum engine losing its majority) leaves the members
/// as they are and says why; one it accepts goes ahead, as the plan says.
#[tokio::test]
async fn nothing_scales_before_the_plugin_accepts_the_plan() {
    use k8s_openapi::api::apps::v1::StatefulSet;
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("minimal", "minimal")]).await.expect("CRD and plugins");
    let _operator = InProcess::start(&cp.kubeconfig, test_settings()).await.expect("operator");
    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    let sets: Api<StatefulSet> = Api::namespaced(cp.client.clone(), "default");
    let apply = async |replicas: i32| {
        let spec = serde_json::json!({"engine": "minimal", "storage": "1Gi", "replicas": replicas, "deletionPolicy": "Retain"});
        let db = serde_json::json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": "quorum"}, "spec": spec});
        dbs.patch("quorum", &PatchParams::apply("test"), &Patch::Apply(db)).await.expect("apply");
    };
    let members = async || sets.get_opt("quorum").await.ok().flatten().and_then(|s| s.spec).and_then(|s| s.replicas);
    // A new Database starts with the spec's members.
    apply(3).await;
    wait_for("3 members", Duration::from_secs(60), async || members().await == Some(3)).await;

    // 3 → 1 loses quorum: refused, the members stay, Progressing says why.
    apply(1).await;
    let refused = async || {
        let db = dbs.get("quorum").await.ok()?;
        db.status?.conditions.into_iter().find(|c| c.type_ == "Progressing" && c.reason == "ScaleRefused")
    };
    wait_for("the refusal", Duration::from_secs(60), async || refused().await.is_some()).await;
    let message = refused().await.expect("ScaleRefused").message;
    assert!(message.contains("from 3 to 1") && message.contains("would lose quorum"), "{message}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(members().await, Some(3), "a refused plan changes nothing");

    // 3 → 2 keeps a majority: accepted, the StatefulSet follows.
    apply(2).await;
    wait_for("2 members", Duration::from_secs(60), async || members().await == Some(2)).await;
    wait_for("the refusal gone", Duration::from_secs(60), async || refused().await.is_none()).await;
}

/// `kubectl scale db quorum --replicas 2`: the Database's scale subresource sets
/// `spec.replicas`, which the plugin's plan then carries out (here one member at a
/// time, each once the one before is ready: no node runs them here, so one step), and
/// says the members' selector, which an autoscaler reads.
#[tokio::test]
async fn the_scale_subresource_scales_through_the_plugins_plan() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("minimal", "minimal")]).await.expect("CRD and plugins");
    let _operator = InProcess::start(&cp.kubeconfig, test_settings()).await.expect("operator");
    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    let sets: Api<StatefulSet> = Api::namespaced(cp.client.clone(), "default");
    let spec = serde_json::json!({"engine": "minimal", "storage": "1Gi", "replicas": 1, "deletionPolicy": "Retain"});
    let db = serde_json::json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": "quorum"}, "spec": spec});
    dbs.patch("quorum", &PatchParams::apply("test"), &Patch::Apply(db)).await.expect("apply");
    let members = async || sets.get_opt("quorum").await.ok().flatten().and_then(|s| s.spec).and_then(|s| s.replicas);
    wait_for("1 member", Duration::from_secs(60), async || members().await == Some(1)).await;
    let selector = "app.kubernetes.io/instance=quorum,app.kubernetes.io/name=minimal";
    wait_for("the selector in the scale subresource", Duration::from_secs(60), async || {
        dbs.get_scale("quorum").await.ok().and_then(|s| s.status).and_then(|s| s.selector).as_deref() == Some(selector)
    })
    .await;

    let scale = serde_json::json!({"spec": {"replicas": 2}});
    dbs.patch_scale("quorum", &PatchParams::default(), &Patch::Merge(&scale)).await.expect("scaled through the subresource");
    assert_eq!(dbs.get("quorum").await.expect("get").spec.replicas, 2);
    wait_for("2 members", Duration::from_secs(60), async || members().await == Some(2)).await;
    // Past the schema's bound (9): refused by the API server, as a spec would be.
    let refused = dbs.patch_scale("quorum", &PatchParams::default(), &Patch::Merge(serde_json::json!({"spec": {"replicas": 12}}))).await;
    assert!(refused.is_err(), "12 members refused: {refused:?}");
}

/// A bucket read that fails (a refused key) is tried again on the next passes, not only
/// after the next backup: once the key is right, the window appears and `BackupHealthy`
/// clears, with no backup in between. The bucket confirms the window again every
/// `bucket_recheck`; when it stops answering, the last window known stays in status, as
/// of when it was confirmed, saying since when the bucket is unreachable, until it
/// answers again.
#[tokio::test]
async fn a_failed_bucket_read_is_retried_on_the_next_pass_and_the_window_known_is_kept() {
    use k8s_openapi::api::core::v1::Secret;
    use plugdb_tests::minio::{ACCESS_KEY, Minio, SECRET_KEY};
    let minio = Minio::on_loopback(&["backups"]).await.expect("minio");
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("postgres", "postgres")]).await.expect("CRD and plugins");
    let settings = plugdb::reconcile::Settings { bucket_recheck: Duration::from_secs(2), ..test_settings() };
    let _operator = InProcess::start(&cp.kubeconfig, settings).await.expect("operator");
    let secrets: Api<Secret> = Api::namespaced(cp.client.clone(), "default");
    let key = async |secret_key: &str| {
        let secret = Secret {
            metadata: kube::api::ObjectMeta { name: Some("s3".into()), ..Default::default() },
            string_data: Some(
                [("accessKeyId".to_string(), ACCESS_KEY.to_string()), ("secretAccessKey".to_string(), secret_key.to_string())].into(),
            ),
            ..Default::default()
        };
        secrets.patch("s3", &PatchParams::apply("test").force(), &Patch::Apply(&secret)).await.expect("the S3 Secret");
    };
    key("not-the-secret-key").await;
    let s3 = serde_json::json!({"endpoint": minio.endpoint, "bucket": "backups", "credentials": {"secretName": "s3"}});
    let spec = serde_json::json!({"engine": "postgres", "storage": "1Gi", "deletionPolicy": "Delete",
        "backup": {"schedule": "0 0 1 1 *", "s3": s3}});
    let db = serde_json::json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": "kept"}, "spec": spec});
    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    dbs.patch("kept", &PatchParams::apply("test"), &Patch::Apply(db)).await.expect("apply");

    let backup_healthy = async || {
        let status = dbs.get("kept").await.ok()?.status?;
        let healthy = status.conditions.iter().find(|c| c.type_ == "BackupHealthy")?.clone();
        Some((healthy, status.recoverable))
    };
    wait_for("the refused key reported", Duration::from_secs(60), async || {
        backup_healthy().await.is_some_and(|(c, _)| c.status == "False" && c.message.contains("SignatureDoesNotMatch"))
    })
    .await;
    assert!(backup_healthy().await.and_then(|(_, r)| r).is_none(), "the window is unknown after a failed read");

    key(SECRET_KEY).await;
    wait_for("the window read again", Duration::from_secs(60), async || {
        backup_healthy().await.is_some_and(|(c, r)| c.status == "True" && r.is_some_and(|r| r.backups == 0 && r.confirmed.is_some()))
    })
    .await;

    key("not-the-secret-key").await;
    wait_for("the outage reported, the window kept", Duration::from_secs(60), async || {
        backup_healthy().await.is_some_and(|(c, r)| c.status == "False" && r.is_some_and(|r| r.unreachable_since.is_some()))
    })
    .await;
    let (_, kept) = backup_healthy().await.expect("status");
    let kept = kept.expect("the window last known");
    assert_eq!(kept.backups, 0);
    let (confirmed, since) = (kept.confirmed.expect("confirmed"), kept.unreachable_since.expect("unreachable"));
    assert!(confirmed <= since, "confirmed {confirmed}, before the bucket stopped answering at {since}");

    key(SECRET_KEY).await;
    wait_for("confirmed again", Duration::from_secs(60), async || {
        backup_healthy().await.is_some_and(|(c, r)| {
            c.status == "True" && r.is_some_and(|r| r.unreachable_since.is_none() && r.confirmed.as_deref() > Some(confirmed.as_str()))
        })
    })
    .await;
}

/// A namespace deleted with its Databases in it finishes. Their final backup (`Snapshot`,
/// the default) cannot be made in a namespace that takes no new object: the postgres
/// one's backup Job is refused, the minimal one's plugin takes no backup at all. Neither
/// holds the namespace: each finalizer goes, and a Warning about the namespace (which
/// takes no Event any more) says so, in `default`.
#[tokio::test]
async fn a_namespace_deleted_with_its_databases_finishes_and_says_no_final_backup_was_made() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("postgres", "postgres"), ("minimal", "minimal")]).await.expect("CRD and plugins");
    let ns = "doomed";
    let namespaces: Api<Namespace> = Api::all(cp.client.clone());
    namespaces
        .create(&PostParams::default(), &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).expect("ns"))
        .await
        .expect("namespace");
    let _operator = InProcess::start(&cp.kubeconfig, test_settings()).await.expect("operator");
    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), ns);
    for (name, engine) in [("orders", "postgres"), ("cache", "minimal")] {
        let db = serde_json::json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": name},
                                    "spec": {"engine": engine, "storage": "1Gi"}});
        dbs.patch(name, &PatchParams::apply("test"), &Patch::Apply(&db)).await.expect("database");
    }
    let sets: Api<StatefulSet> = Api::namespaced(cp.client.clone(), ns);
    wait_for("both Databases have members and hold their final backup", Duration::from_secs(240), async || {
        let list = dbs.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        let held = list.iter().filter(|d| d.finalizers().iter().any(|f| f == FINALIZER)).count();
        held == 2 && sets.list(&ListParams::default()).await.is_ok_and(|l| l.items.len() == 2)
    })
    .await;
    // The members ran (no node runs them here, so the status says so as the operator
    // would have): the namespace's deletion may take the StatefulSets before the
    // operator's pass sees the Databases go, and a Database that never ran owes no backup.
    let ran = async || {
        let list = dbs.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        list.iter().filter(|d| d.status.as_ref().is_some_and(|s| s.current_version.is_some())).count() == 2
    };
    while !ran().await {
        for name in ["orders", "cache"] {
            let ran = serde_json::json!({"status": {"currentVersion": "17"}});
            dbs.patch_status(name, &PatchParams::default(), &Patch::Merge(&ran)).await.expect("the status says it ran");
        }
        // A pass under way may write the status it had read before: look again after it.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    namespaces.delete(ns, &DeleteParams::default()).await.expect("delete the namespace");
    wait_for("the namespace is gone", Duration::from_secs(300), async || namespaces.get_opt(ns).await.is_ok_and(|n| n.is_none())).await;
    let said = events_with_reason(&cp, "default", "DeletedWithoutBackup").await;
    for name in ["orders", "cache"] {
        let about = said.iter().find(|e| e.related.as_ref().and_then(|r| r.name.as_deref()) == Some(name)).expect(name);
        assert_eq!(about.type_.as_deref(), Some("Warning"));
        assert_eq!(about.regarding.as_ref().map(|r| (r.kind.as_deref(), r.name.as_deref())), Some((Some("Namespace"), Some(ns))));
        let note = about.note.as_deref().unwrap_or_default();
        assert!(note.starts_with(&format!("Database {ns}/{name} was deleted with its namespace")), "{note}");
    }
}

/// The Events of namespace `ns` with reason `reason`.
async fn events_with_reason(cp: &ControlPlane, ns: &str, reason: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(cp.client.clone(), ns);
    let all = events.list(&ListParams::default()).await.expect("events").items;
    all.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).collect()
}
