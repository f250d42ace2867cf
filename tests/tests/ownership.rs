//! Tier 4: a Database takes only what is its own. Objects that already carry the name of
//! one of a Database's children — a user's Service, ConfigMap, Secret, volume claim or
//! Job, the API server's own `kubernetes` Service — are left exactly as they were: the
//! Database says whose name it is in `Ready`/`Progressing` and one Warning Event, and
//! deleting it leaves them in place. Names that would collide with another Database's
//! children are refused at admission.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use plugdb::crd::Database;
use plugdb_tests::ControlPlane;
use plugdb_tests::operator::{InProcess, prepare, test_settings, wait_for};
use serde_json::{Value, json};

fn database(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": name}, "spec": spec})
}

/// An object's uid, its version (the generation where it has one: a Job's controller
/// writes its status), owners, labels and annotations.
type Fingerprint = (Option<String>, Option<String>, Vec<String>, BTreeMap<String, String>, BTreeMap<String, String>);

/// The user's object as it must stay.
fn fingerprint<K: Resource>(o: &K) -> Fingerprint {
    let meta = o.meta();
    (
        meta.uid.clone(),
        meta.generation.map(|g| format!("generation {g}")).or_else(|| meta.resource_version.clone()),
        meta.owner_references.iter().flatten().map(|r| r.uid.clone()).collect(),
        meta.labels.clone().unwrap_or_default(),
        meta.annotations.clone().unwrap_or_default(),
    )
}

#[tokio::test]
async fn objects_a_database_did_not_make_are_never_adopted_overwritten_or_deleted() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("minimal", "minimal"), ("postgres", "postgres")]).await.expect("CRD and plugins");
    let ns = "default";
    let client = cp.client.clone();
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let dbs: Api<Database> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();

    // The user's objects, made before any Database.
    let config: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "cfg-config"}, "data": {"app": "settings"}})).expect("cm");
    config_maps.create(&pp, &config).await.expect("user ConfigMap");
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "sec-credentials"}, "stringData": {"password": "not-yours"}})).expect("secret");
    secrets.create(&pp, &secret).await.expect("user Secret");
    let authority: Secret =
        serde_json::from_value(json!({"metadata": {"name": "tlsdb-ca"}, "stringData": {"ca.crt": "x", "ca.key": "y"}})).expect("secret");
    secrets.create(&pp, &authority).await.expect("user Secret named like an authority");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {"name": "claimdb-backups"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
    .expect("claim");
    claims.create(&pp, &claim).await.expect("user claim");
    let token = "2026-11-27T08:00:00Z";
    let job_name = format!("jobdb-manual-{}", &plugdb::plugin::hex_digest(token.as_bytes())[..10]);
    let job: Job = serde_json::from_value(json!({"metadata": {"name": job_name}, "spec": {"suspend": true,
        "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}))
    .expect("job");
    jobs.create(&pp, &job).await.expect("user Job");

    // Every foreign object, as it must stay; each read fails the test if it is gone.
    let fingerprints = async || {
        vec![
            fingerprint(&services.get("kubernetes").await.expect("the API server's Service")),
            fingerprint(&config_maps.get("cfg-config").await.expect("the user's ConfigMap")),
            fingerprint(&secrets.get("sec-credentials").await.expect("the user's Secret")),
            fingerprint(&secrets.get("tlsdb-ca").await.expect("the user's Secret named like an authority")),
            fingerprint(&claims.get("claimdb-backups").await.expect("the user's claim")),
            fingerprint(&jobs.get(&job_name).await.expect("the user's Job")),
        ]
    };
    let before = fingerprints().await;

    let _operator = InProcess::start(&cp.kubeconfig, test_settings()).await.expect("operator");
    let minimal = json!({"engine": "minimal", "storage": "1Gi", "deletionPolicy": "Retain"});
    let postgres = |extra: Value| {
        let mut spec = json!({"engine": "postgres", "storage": "1Gi", "deletionPolicy": "Retain"});
        spec.as_object_mut().expect("object").extend(extra.as_object().cloned().unwrap_or_default());
        spec
    };
    let apply = |name: &str, spec: Value| {
        let dbs = dbs.clone();
        let body = database(name, spec);
        let name = name.to_string();
        async move { dbs.patch(&name, &PatchParams::apply("test"), &Patch::Apply(body)).await.expect("database") }
    };
    apply("kubernetes", minimal.clone()).await;
    apply("cfg", minimal.clone()).await;
    apply("sec", minimal.clone()).await;
    apply("tlsdb", postgres(json!({"tls": {"enabled": true}}))).await;
    apply("claimdb", postgres(json!({}))).await;
    apply("jobdb", postgres(json!({}))).await;
    for name in ["claimdb", "jobdb"] {
        let annotate = json!({"metadata": {"annotations": {"plugdb.io/backup-now": token}}});
        dbs.patch(name, &PatchParams::default(), &Patch::Merge(annotate)).await.expect("backup asked for");
    }

    let expected = [
        (
            "kubernetes",
            "Service default/kubernetes exists and is not this Database's: nothing controls it (not made by plugdb)".to_string(),
        ),
        ("cfg", "ConfigMap default/cfg-config exists and is not this Database's: nothing controls it (not made by plugdb)".into()),
        ("sec", "Secret default/sec-credentials exists and is not this Database's: nothing controls it (not made by plugdb)".into()),
        ("tlsdb", "Secret default/tlsdb-ca exists and is not this Database's: nothing controls it (not made by plugdb)".into()),
        (
            "claimdb",
            "PersistentVolumeClaim default/claimdb-backups exists and is not this Database's: nothing controls it (not made by plugdb)"
                .into(),
        ),
        ("jobdb", format!("Job default/{job_name} exists and is not this Database's: nothing controls it (not made by plugdb)")),
    ];
    for (name, message) in &expected {
        wait_for(&format!("{name} says whose name it is"), Duration::from_secs(90), async || {
            let Ok(db) = dbs.get(name).await else { return false };
            let conditions = db.status.map(|s| s.conditions).unwrap_or_default();
            ["Ready", "Progressing"].iter().all(|t| {
                conditions.iter().any(|c| c.type_ == *t && c.status == "False" && c.reason == "NameTaken" && c.message == *message)
            })
        })
        .await;
    }
    // Passes go on being retried (with backoff): a few seconds more, then nothing of theirs may have changed.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let taken: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("NameTaken"))
        .collect();
    for (name, message) in &expected {
        let of: Vec<&Event> = taken.iter().filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(*name)).collect();
        assert_eq!(of.len(), 1, "{name}: one Warning Event however often the pass is retried: {of:?}");
        assert_eq!(of[0].type_.as_deref(), Some("Warning"));
        assert_eq!(of[0].note.as_deref(), Some(message.as_str()));
    }
    // The Database whose credentials name was taken made nothing that would mount them.
    let sets: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(client.clone(), ns);
    assert!(sets.get_opt("sec").await.expect("read").is_none(), "members of sec were made over a Secret that is not theirs");

    let now = fingerprints().await;
    assert_eq!(now, before, "an object a Database did not make changed");

    // Deleted, the Databases take none of them along.
    for (name, _) in &expected {
        dbs.delete(name, &DeleteParams::default()).await.expect("delete");
    }
    wait_for("the Databases are gone", Duration::from_secs(60), async || {
        dbs.list(&ListParams::default()).await.is_ok_and(|l| l.items.is_empty())
    })
    .await;
    // What the garbage collector would remove goes within moments of its owner: the
    // Databases' own ConfigMaps do.
    wait_for("the Databases' own children are collected", Duration::from_secs(60), async || {
        config_maps.get_opt("kubernetes-config").await.is_ok_and(|c| c.is_none())
    })
    .await;
    let after = fingerprints().await;
    assert_eq!(after, before, "deleting the Databases touched an object they did not make");
}

/// Two Databases can never name the same child: a name ending in `-replicas`,
/// `-headless` or `-primary` (another Database's read-only and headless Services and its
/// primary's disruption budget) or too long for
/// member pod names is refused when the Database is created, with the reason.
#[tokio::test]
async fn names_that_would_collide_with_another_databases_children_are_refused() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[]).await.expect("CRD");
    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    let spec = json!({"engine": "minimal", "storage": "1Gi"});
    for (name, said) in [
        ("coll-replicas", "metadata.name must not end in -replicas, -headless, -primary"),
        ("coll-headless", "metadata.name must not end in -replicas, -headless, -primary"),
        ("coll-primary", "metadata.name must not end in -replicas, -headless, -primary"),
        (&"d".repeat(53) as &str, "metadata.name must be at most 52 characters"),
    ] {
        let body: Database = serde_json::from_value(database(name, spec.clone())).expect("database");
        let refused = dbs.create(&PostParams::default(), &body).await.expect_err(name);
        assert!(refused.to_string().contains(said), "{name}: {refused}");
    }
    for name in ["coll", "coll-replica", "replicas", &"d".repeat(52)] {
        let body: Database = serde_json::from_value(database(name, spec.clone())).expect("database");
        dbs.create(&PostParams::default(), &body).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    }

    // A Database made before the rule keeps working: its spec can still change.
    let crds: Api<CustomResourceDefinition> = Api::all(cp.client.clone());
    let rules = "/spec/versions/0/schema/openAPIV3Schema/x-kubernetes-validations";
    let crd = serde_json::to_value(crds.get("databases.plugdb.io").await.expect("CRD")).expect("json");
    let original = crd.pointer(rules).cloned().expect("the root rules");
    let patch = |ops: Value| {
        let crds = crds.clone();
        async move {
            let ops: json_patch::Patch = serde_json::from_value(ops).expect("patch");
            crds.patch("databases.plugdb.io", &PatchParams::default(), &Patch::<()>::Json(ops)).await.expect("CRD patched");
        }
    };
    patch(json!([{"op": "remove", "path": rules}])).await;
    let old: Database = serde_json::from_value(database("old-replicas", spec.clone())).expect("database");
    wait_for("a name the rule refuses is admitted without it", Duration::from_secs(30), async || {
        dbs.create(&PostParams::default(), &old).await.is_ok()
    })
    .await;
    patch(json!([{"op": "add", "path": rules, "value": original}])).await;
    wait_for("the rule is back", Duration::from_secs(30), async || {
        let probe: Database = serde_json::from_value(database("probe-replicas", spec.clone())).expect("database");
        dbs.create(&PostParams { dry_run: true, ..Default::default() }, &probe).await.is_err()
    })
    .await;
    dbs.patch("old-replicas", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 2}}))).await.expect("update");
    assert_eq!(dbs.get("old-replicas").await.expect("old").spec.replicas, 2);
}
