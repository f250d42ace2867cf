//! Caches that keep, for each object, only the facts a pass reads of it, in a struct of
//! their own: the children a pass only applies (ConfigMaps, Services,
//! PodDisruptionBudgets) as [`Applied`], StatefulSets as [`SetFacts`].
//!
//! Kept whole (as a reflector store keeps them), an applied child cost about 1.2 KiB
//! (its metadata struct, and a map node for one annotation) and a StatefulSet without
//! its pod template about 5.6 KiB (the struct alone is 2.5 KiB); as facts, under 200
//! bytes and under 1 KiB. With five applied children and a StatefulSet per Database,
//! this was most of what the operator held per Database (docs/benchmarks.md).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use super::{Seen, owner};
use crate::crd::Database;
use crate::names::{APPLIED_HASH, PRIMARY_ANNOTATION, ROLE_FREE_HASH};

/// How plugdb last applied an object, and whose it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Its `plugdb.io/applied-hash` annotation.
    hash: Option<Box<str>>,
    /// Whether plugdb made it by a create whose fields no apply has taken over yet.
    created: bool,
    /// Its controller's uid. The kinds kept as facts are a Database's only by their
    /// controller reference: they never outlive it (see [`owner::check`]).
    controller: Option<Box<str>>,
}

impl Applied {
    pub(super) fn of<K: Resource>(o: &K) -> Self {
        let meta = o.meta();
        Self {
            hash: meta.annotations.as_ref().and_then(|a| a.get(APPLIED_HASH)).map(|h| h.as_str().into()),
            created: meta.managed_fields.iter().flatten().any(|e| owner::set_by_us(e, "Update")),
            controller: owner::controller(meta).map(|c| c.uid.as_str().into()),
        }
    }

    /// Whether it is `db`'s: `db` is its controller.
    fn is_of(&self, db: &Database) -> bool {
        self.controller.is_some() && self.controller.as_deref() == db.uid().as_deref()
    }

    fn seen_by(&self, db: &Database) -> Seen {
        match self.is_of(db) {
            true => Seen::Present { hash: self.hash.as_deref().map(str::to_string), created: self.created },
            false => Seen::Foreign,
        }
    }
}

/// What a pass reads of a Database's StatefulSet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetFacts {
    /// Its `spec.replicas`.
    pub replicas: Option<i32>,
    /// Whether its controller has seen its latest spec (`status.observedGeneration` is
    /// its generation): its revisions mean nothing before.
    pub observed: bool,
    /// The revision its members are to run (`status.updateRevision`).
    pub update_revision: Option<Box<str>>,
    /// Its `spec.volumeClaimTemplates` as JSON: they cannot change, so every apply
    /// sends them as they are.
    claim_templates: Option<Box<str>>,
    /// Its members' template, as the hash without the primary's name and the primary's
    /// name: the same pair, the same template.
    template: Option<(Box<str>, Box<str>)>,
    applied: Applied,
}

impl SetFacts {
    /// The facts of `set`.
    pub fn of(set: &StatefulSet) -> Self {
        let spec = set.spec.as_ref();
        let status = set.status.as_ref();
        let templates = spec.and_then(|s| s.volume_claim_templates.as_ref());
        Self {
            replicas: spec.and_then(|s| s.replicas),
            observed: status.and_then(|s| s.observed_generation) == set.metadata.generation,
            update_revision: status.and_then(|s| s.update_revision.as_deref()).map(Into::into),
            claim_templates: templates.and_then(|t| serde_json::to_string(t).ok()).map(Into::into),
            template: template_of(spec.and_then(|s| s.template.metadata.as_ref()).and_then(|m| m.annotations.as_ref())),
            applied: Applied::of(set),
        }
    }

    /// Whether its members' template is the one with hash `role_free` naming `primary`
    /// (that of a StatefulSet about to be applied): writing that one rolls no member.
    pub fn same_template(&self, role_free: &str, primary: &str) -> bool {
        self.template.as_ref().is_some_and(|(hash, named)| **hash == *role_free && **named == *primary)
    }

    /// Its volume claim templates.
    pub fn claim_templates(&self) -> Option<serde_json::Value> {
        self.claim_templates.as_deref().and_then(|t| serde_json::from_str(t).ok())
    }
}

/// Facts by namespace and name.
type Map<V> = HashMap<Box<str>, HashMap<Box<str>, V>>;

/// A cache of facts `V` about one kind of object, filled from its watch's events.
pub(super) struct Facts<V> {
    map: Arc<RwLock<Map<V>>>,
    /// What a relist has found so far: it replaces the map when done, so objects
    /// deleted while the watch was down go with the old one.
    relisting: Arc<Mutex<Option<Map<V>>>>,
    listed: tokio::sync::watch::Sender<bool>,
}

impl<V> Clone for Facts<V> {
    fn clone(&self) -> Self {
        Self { map: self.map.clone(), relisting: self.relisting.clone(), listed: self.listed.clone() }
    }
}

impl<V: Clone> Facts<V> {
    pub(super) fn new() -> Self {
        Self { map: Arc::default(), relisting: Arc::default(), listed: tokio::sync::watch::Sender::new(false) }
    }

    /// Takes in one event of the watch, the object's facts being `of` it.
    pub(super) fn apply<K: Resource>(&self, event: &watcher::Event<K>, of: impl Fn(&K) -> V) {
        match event {
            watcher::Event::Init => *self.relisting() = Some(Map::new()),
            watcher::Event::InitApply(o) => insert(self.relisting().get_or_insert_default(), o, of(o)),
            watcher::Event::InitDone => {
                *self.write() = self.relisting().take().unwrap_or_default();
                self.listed.send_replace(true);
            }
            watcher::Event::Apply(o) => insert(&mut self.write(), o, of(o)),
            watcher::Event::Delete(o) => {
                if let Some(names) = self.write().get_mut(o.namespace().unwrap_or_default().as_str()) {
                    names.remove(o.name_any().as_str());
                }
            }
        }
    }

    /// Resolves once the watch has listed what exists.
    pub(super) fn listed(&self) -> futures::future::BoxFuture<'static, ()> {
        let mut listed = self.listed.subscribe();
        Box::pin(async move {
            let _ = listed.wait_for(|l| *l).await;
        })
    }

    /// The facts of object `name` in `db`'s namespace.
    pub(super) fn get(&self, db: &Database, name: &str) -> Option<V> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        map.get(db.namespace().unwrap_or_default().as_str()).and_then(|names| names.get(name)).cloned()
    }

    fn relisting(&self) -> std::sync::MutexGuard<'_, Option<Map<V>>> {
        self.relisting.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Map<V>> {
        self.map.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl Facts<Applied> {
    /// What this cache knows of `db`'s child `name`.
    pub(super) fn seen(&self, db: &Database, name: &str) -> Seen {
        self.get(db, name).map_or(Seen::Absent, |child| child.seen_by(db))
    }
}

impl Facts<SetFacts> {
    /// What this cache knows of `db`'s StatefulSet `name`.
    pub(super) fn seen(&self, db: &Database, name: &str) -> Seen {
        self.get(db, name).map_or(Seen::Absent, |set| set.applied.seen_by(db))
    }

    /// `db`'s StatefulSet, when it is `db`'s.
    pub(super) fn own(&self, db: &Database) -> Option<SetFacts> {
        self.get(db, &db.name_any()).filter(|set| set.applied.is_of(db))
    }
}

fn insert<K: Resource, V>(map: &mut Map<V>, o: &K, facts: V) {
    let meta = o.meta();
    let (Some(namespace), Some(name)) = (meta.namespace.as_deref(), meta.name.as_deref()) else { return };
    map.entry(namespace.into()).or_default().insert(name.into(), facts);
}

/// The identity of a members' template, from its annotations.
fn template_of(annotations: Option<&BTreeMap<String, String>>) -> Option<(Box<str>, Box<str>)> {
    let a = annotations?;
    Some((a.get(ROLE_FREE_HASH)?.as_str().into(), a.get(PRIMARY_ANNOTATION)?.as_str().into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use k8s_openapi::api::apps::v1::{StatefulSetSpec, StatefulSetStatus};
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta, OwnerReference};
    use kube::api::PartialObjectMeta;

    use crate::names::MANAGER;

    fn database() -> Database {
        let mut db =
            Database::new("orders", serde_json::from_value(serde_json::json!({"engine": "postgres", "storage": "1Gi"})).expect("spec"));
        db.metadata.namespace = Some("shop".into());
        db.metadata.uid = Some("db-1".into());
        db
    }

    fn meta(name: &str, controller: Option<&str>, hash: Option<&str>, operation: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            annotations: hash.map(|h| [(APPLIED_HASH.to_string(), h.to_string())].into()),
            owner_references: controller.map(|uid| {
                vec![OwnerReference {
                    kind: "Database".into(),
                    name: "orders".into(),
                    uid: uid.into(),
                    controller: Some(true),
                    ..Default::default()
                }]
            }),
            managed_fields: Some(vec![ManagedFieldsEntry {
                manager: Some(MANAGER.into()),
                operation: Some(operation.into()),
                ..Default::default()
            }]),
            ..Default::default()
        }
    }

    fn service(name: &str, controller: Option<&str>, hash: Option<&str>, operation: &str) -> PartialObjectMeta<Service> {
        PartialObjectMeta { metadata: meta(name, controller, hash, operation), ..Default::default() }
    }

    #[test]
    fn a_child_is_seen_as_its_hash_its_create_mark_and_whose_it_is() {
        let db = database();
        let store = Facts::new();
        for s in [
            service("orders", Some("db-1"), Some("b790"), "Apply"),
            service("orders-created", Some("db-1"), None, "Update"),
            service("orders-earlier", Some("db-0"), Some("b790"), "Apply"),
            service("orders-users", None, None, "Update"),
            service("orders-gone", Some("db-1"), None, "Apply"),
        ] {
            store.apply(&watcher::Event::Apply(s), Applied::of);
        }
        store.apply(&watcher::Event::Delete(service("orders-gone", Some("db-1"), None, "Apply")), Applied::of);
        assert_eq!(store.seen(&db, "orders"), Seen::Present { hash: Some("b790".into()), created: false });
        assert_eq!(store.seen(&db, "orders-created"), Seen::Present { hash: None, created: true });
        assert_eq!(store.seen(&db, "orders-earlier"), Seen::Foreign, "an earlier Database's of the same name");
        assert_eq!(store.seen(&db, "orders-users"), Seen::Foreign, "no controller: not plugdb's to write");
        assert_eq!(store.seen(&db, "orders-gone"), Seen::Absent);
    }

    #[test]
    fn a_relist_replaces_what_was_known_once_it_is_done() {
        let db = database();
        let store = Facts::new();
        let listed = store.listed();
        store.apply(&watcher::Event::<PartialObjectMeta<Service>>::Init, Applied::of);
        store.apply(&watcher::Event::InitApply(service("orders", Some("db-1"), Some("a"), "Apply")), Applied::of);
        store.apply(&watcher::Event::<PartialObjectMeta<Service>>::InitDone, Applied::of);
        assert!(listed.now_or_never().is_some(), "listed once the first list is done");
        store.apply(&watcher::Event::<PartialObjectMeta<Service>>::Init, Applied::of);
        store.apply(&watcher::Event::InitApply(service("orders-config", Some("db-1"), Some("c"), "Apply")), Applied::of);
        assert_eq!(store.seen(&db, "orders"), Seen::Present { hash: Some("a".into()), created: false }, "until the relist is done");
        store.apply(&watcher::Event::<PartialObjectMeta<Service>>::InitDone, Applied::of);
        assert_eq!(store.seen(&db, "orders"), Seen::Absent, "deleted while the watch was down");
        assert_eq!(store.seen(&db, "orders-config"), Seen::Present { hash: Some("c".into()), created: false });
    }

    #[test]
    fn a_stateful_set_is_its_replicas_claims_revision_and_whether_its_controller_has_seen_it() {
        let db = database();
        let claim =
            PersistentVolumeClaim { metadata: ObjectMeta { name: Some("data".into()), ..Default::default() }, ..Default::default() };
        let set = |observed: i64| StatefulSet {
            metadata: ObjectMeta { generation: Some(3), ..meta("orders", Some("db-1"), Some("b790"), "Apply") },
            spec: Some(StatefulSetSpec { replicas: Some(3), volume_claim_templates: Some(vec![claim.clone()]), ..Default::default() }),
            status: Some(StatefulSetStatus {
                observed_generation: Some(observed),
                update_revision: Some("orders-7f".into()),
                ..Default::default()
            }),
        };
        let store = Facts::new();
        store.apply(&watcher::Event::Apply(set(2)), SetFacts::of);
        let facts = store.own(&db).expect("the Database's StatefulSet");
        assert_eq!((facts.replicas, facts.observed, facts.update_revision.as_deref()), (Some(3), false, Some("orders-7f")));
        assert_eq!(facts.claim_templates(), Some(serde_json::to_value([&claim]).expect("json")));
        assert_eq!(store.seen(&db, "orders"), Seen::Present { hash: Some("b790".into()), created: false });
        store.apply(&watcher::Event::Apply(set(3)), SetFacts::of);
        assert!(store.own(&db).is_some_and(|s| s.observed), "its controller has seen generation 3");

        let mut other = database();
        other.metadata.uid = Some("db-2".into());
        assert_eq!(store.own(&other), None, "another Database of the same name");
    }
}
