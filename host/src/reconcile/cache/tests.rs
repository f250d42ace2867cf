//! The caches' trims: what a pass reads of each kind, and nothing else.

use super::trim::*;
use super::*;
use crate::names::*;
use crate::tls;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, OwnerReference};

fn meta(annotations: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some("orders".into()),
        namespace: Some("shop".into()),
        uid: Some("3f1c".into()),
        resource_version: Some("42".into()),
        labels: Some([("app.kubernetes.io/instance".to_string(), "orders".to_string())].into()),
        annotations: Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        owner_references: Some(vec![OwnerReference { name: "orders".into(), ..Default::default() }]),
        managed_fields: Some(vec![ManagedFieldsEntry { manager: Some("plugdb".into()), ..Default::default() }]),
        ..Default::default()
    }
}

#[test]
fn a_child_made_by_a_create_is_marked_until_an_apply_takes_its_fields_over() {
    let entry = |operation: &str, subresource: Option<&str>| ManagedFieldsEntry {
        manager: Some(MANAGER.into()),
        operation: Some(operation.into()),
        subresource: subresource.map(Into::into),
        ..Default::default()
    };
    let mut db =
        Database::new("orders", serde_json::from_value(serde_json::json!({"engine": "postgres", "storage": "1Gi"})).expect("spec"));
    db.metadata.namespace = Some("shop".into());
    db.metadata.uid = Some("db-1".into());
    let seen_with = |entries: Vec<ManagedFieldsEntry>, controller: &str| {
        let owner = OwnerReference {
            kind: "Database".into(),
            name: "orders".into(),
            uid: controller.into(),
            controller: Some(true),
            ..Default::default()
        };
        let metadata = ObjectMeta { managed_fields: Some(entries), owner_references: Some(vec![owner]), ..meta(&[]) };
        let store = Facts::new();
        store.apply(&watcher::Event::Apply(StatefulSet { metadata, ..Default::default() }), SetFacts::of);
        store.seen(&db, "orders")
    };
    assert_eq!(seen_with(vec![entry("Update", None)], "db-1"), Seen::Present { hash: None, created: true });
    let applied = vec![entry("Apply", None), entry("Update", Some("status"))];
    assert_eq!(seen_with(applied, "db-1"), Seen::Present { hash: None, created: false });
    assert_eq!(seen_with(vec![], "db-1"), Seen::Present { hash: None, created: false });
    assert_eq!(seen_with(vec![], "db-0"), Seen::Foreign, "an earlier Database's of the same name is not this one's");
}

#[test]
fn databases_are_kept_without_managed_fields_or_the_last_applied_manifest() {
    let mut db =
        Database::new("orders", serde_json::from_value(serde_json::json!({"engine": "postgres", "storage": "1Gi"})).expect("spec"));
    db.metadata = meta(&[(LAST_APPLIED, "{\"spec\":{}}"), ("plugdb.io/backup-now", "2026-11-24T10:00:00Z")]);
    database_essentials(&mut db);
    assert_eq!(db.metadata.managed_fields, None);
    let annotations: Vec<&str> = db.annotations().keys().map(String::as_str).collect();
    assert_eq!(annotations, ["plugdb.io/backup-now"], "the operator's own annotations stay");
    assert_eq!(db.metadata.resource_version.as_deref(), Some("42"), "the rest of the metadata stays");
}

fn controlled(mut meta: ObjectMeta) -> ObjectMeta {
    let controller = OwnerReference {
        api_version: "plugdb.io/v1alpha1".into(),
        kind: "Database".into(),
        name: "orders".into(),
        uid: "db-1".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let other = OwnerReference { kind: "Backup".into(), name: "b".into(), uid: "b-1".into(), ..Default::default() };
    meta.owner_references = Some(vec![other, controller]);
    meta
}

#[test]
fn a_secret_keeps_its_key_names_and_what_says_whose_and_until_when() {
    let mut secret = Secret {
        metadata: controlled(meta(&[(tls::NOT_AFTER, "2027-01-01T00:00:00Z"), ("kubectl.kubernetes.io/restartedAt", "x")])),
        data: Some([("password".to_string(), k8s_openapi::ByteString(b"s3cret".to_vec()))].into()),
        ..Default::default()
    };
    secret.metadata.labels.get_or_insert_default().insert("team".into(), "a".into());
    let stamper = crate::stamp::Stamper::new("the operator's key");
    key_names_only(&stamper, &mut secret);
    assert_eq!(secret.data, Some([("password".to_string(), k8s_openapi::ByteString(Vec::new()))].into()), "no value");
    let annotations: Vec<&str> = secret.annotations().keys().map(String::as_str).collect();
    assert_eq!(annotations, [tls::NOT_AFTER]);
    assert_eq!(secret.metadata.labels, None, "a Database controls it: its labels say nothing more");
    assert_eq!(secret.metadata.resource_version.as_deref(), Some("42"));
    assert_eq!(secret.metadata.owner_references.as_ref().map(Vec::len), Some(1));

    let mut kept = Secret { metadata: meta(&[]), ..Default::default() };
    kept.metadata.owner_references = None;
    kept.metadata.labels.get_or_insert_default().insert("team".into(), "a".into());
    let unstamped = kept.clone();
    let mut kept = stamper.stamped(kept);
    key_names_only(&stamper, &mut kept);
    let labels: Vec<&str> = kept.labels().keys().map(String::as_str).collect();
    assert_eq!(labels, [INSTANCE_LABEL], "kept credentials: the label that says which Database's they were");
    assert!(crate::stamp::held(&kept.metadata), "and that plugdb's stamp held while the values were there");
    let mut unstamped = unstamped;
    key_names_only(&stamper, &mut unstamped);
    assert!(!crate::stamp::held(&unstamped.metadata), "none held without it");
}

#[test]
fn a_pod_keeps_what_says_whose_member_it_is_and_why_it_is_not_ready() {
    use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStateWaiting, PodCondition};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let condition = |type_: &str, status: &str| PodCondition { type_: type_.into(), status: status.into(), ..Default::default() };
    let container = |name: &str, ready: bool| ContainerStatus {
        name: name.into(),
        ready,
        image: "postgres:17".into(),
        state: (!ready).then(|| ContainerState {
            waiting: Some(ContainerStateWaiting { reason: Some("CrashLoopBackOff".into()), message: Some("back-off".into()) }),
            ..Default::default()
        }),
        last_state: Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 1,
                message: Some(format!("{}FATAL: the last words\n", "an early line\n".repeat(100))),
                ..Default::default()
            }),
            ..Default::default()
        }),
        restart_count: 3,
        ..Default::default()
    };
    let mut metadata = meta(&[(PRIMARY_ANNOTATION, "orders-0"), (FENCED, "x"), ("kubectl.kubernetes.io/restartedAt", "now")]);
    metadata.labels.get_or_insert_default().extend([
        (ROLE_LABEL.to_string(), "primary".to_string()),
        (REVISION_LABEL.to_string(), "orders-7f".to_string()),
        ("statefulset.kubernetes.io/pod-name".to_string(), "orders-0".to_string()),
    ]);
    metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let mut pod = Pod {
        metadata,
        spec: Some(PodSpec { node_name: Some("node-a".into()), ..Default::default() }),
        status: Some(PodStatus {
            conditions: Some(vec![condition("Initialized", "True"), condition("Ready", "False"), condition("PodScheduled", "True")]),
            container_statuses: Some(vec![container("agent", true), container("postgres", false)]),
            pod_ip: Some("10.0.0.5".into()),
            ..Default::default()
        }),
    };
    pod_essentials(&mut pod);
    let labels: Vec<&str> = pod.labels().keys().map(String::as_str).collect();
    assert_eq!(labels, [INSTANCE_LABEL, REVISION_LABEL, ROLE_LABEL]);
    let annotations: Vec<&str> = pod.annotations().keys().map(String::as_str).collect();
    assert_eq!(annotations, [FENCED, PRIMARY_ANNOTATION]);
    assert!(pod.metadata.creation_timestamp.is_some(), "a member's age counts");
    let status = pod.status.as_ref().expect("status");
    let conditions: Vec<&str> = status.conditions.iter().flatten().map(|c| c.type_.as_str()).collect();
    assert_eq!(conditions, ["Ready", "PodScheduled"]);
    let containers = status.container_statuses.as_deref().unwrap_or_default();
    assert_eq!(containers.len(), 1, "a ready container says nothing a pass reads");
    assert_eq!(containers[0].name, "postgres");
    assert_eq!(containers[0].state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref()), Some("CrashLoopBackOff"));
    assert_eq!(containers[0].image, "", "no image");
    assert_eq!(containers[0].restart_count, 3);
    let ended =
        containers[0].last_state.as_ref().and_then(|s| s.terminated.as_ref()).and_then(|t| t.message.as_deref()).unwrap_or_default();
    assert!(ended.ends_with("FATAL: the last words") && ended.len() <= 200, "the end of its last words, bounded: {ended:?}");
    assert_eq!(status.pod_ip.as_deref(), Some("10.0.0.5"));
    assert_eq!(pod.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some("node-a"));
}
