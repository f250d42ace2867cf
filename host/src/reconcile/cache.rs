//! The reconciler's read side: watch-fed caches of every object plugdb manages, so a
//! pass reads the objects it manages without asking the API server, and writes only
//! what differs (what it still reads beyond them, each when due, is listed in
//! `docs/architecture.md`).
//!
//! Only objects labelled `app.kubernetes.io/managed-by=plugdb` are watched, and each
//! cache keeps just what a pass reads: no managed fields, no Secret values, no pod or
//! StatefulSet pod templates; ConfigMaps, Services, PodDisruptionBudgets and
//! NetworkPolicies are watched as metadata only and kept as their name and applied hash
//! (all a pass needs); Databases are kept without the manifest `kubectl apply` copies
//! into an annotation.
//!
//! A watch learns what already exists as a stream of events, one object at a time,
//! where the API server offers it (Kubernetes 1.32, and 1.34 onwards): a restarted
//! operator then never holds a whole list of thousands of objects at once. Servers
//! without it are asked for one whole list each, served from their cache.

use std::fmt::Debug;
use std::sync::Arc;

use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, PartialObjectMeta, WatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::OnceCell;

use super::owner;
use crate::build::Kind;
use crate::crd::Database;
use crate::names::{APPLIED_HASH, MANAGER};
use crate::stamp::Stamper;

mod facts;
pub mod leases;
mod trim;
pub use facts::SetFacts;
use facts::{Applied, Facts};
pub(super) use trim::database_essentials;
use trim::{claim_essentials, key_names_only, no_managed_fields, node_essentials, pod_essentials};

/// Where `kubectl apply` keeps the whole manifest it last applied.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What a cache knows of one child of a Database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// No such object.
    Absent,
    /// The Database's own object, with the hash it was last applied with.
    Present {
        /// Its `plugdb.io/applied-hash` annotation.
        hash: Option<String>,
        /// Whether plugdb made it by a create whose fields no apply has taken over yet.
        created: bool,
    },
    /// An object with that name that is not the Database's (see [`super::owner`]).
    Foreign,
}

/// Caches of the managed objects, filled by watches that run as long as this value.
pub struct Caches {
    /// Stamps the Secrets the operator writes and judges those it reads.
    stamper: Stamper,
    listing: Option<Listing>,
    config_maps: Facts<Applied>,
    services: Facts<Applied>,
    budgets: Facts<Applied>,
    policies: Facts<Applied>,
    secrets: Store<Secret>,
    stateful_sets: Facts<SetFacts>,
    pods: Store<Pod>,
    jobs: Store<Job>,
    claims: Store<PersistentVolumeClaim>,
    nodes: Store<Node>,
    leases: leases::Leases,
    listed: tokio::sync::watch::Receiver<bool>,
    _tasks: Vec<AbortOnDrop>,
}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caches").finish_non_exhaustive()
    }
}

/// The watches of StatefulSets and Jobs, as the controller reads them: each change,
/// deletions included, wakes the owning Database once the cache holds it, so a
/// StatefulSet deleted by hand is made again at once. These watches fill their caches
/// only while the controller reads them (kube-runtime's own `owns_stream` input, with no
/// channel between). kube's shared-store subscriptions (kube-runtime 5.0) do not fit
/// here: they announce no deletions, and a subscriber whose object is already gone from
/// the store when it reads the announcement waits without being woken again.
pub struct Triggers {
    /// StatefulSets, including deleted ones.
    pub stateful_sets: Watch<StatefulSet>,
    /// Jobs, including deleted ones.
    pub jobs: Watch<Job>,
    /// Every node, as whether it is cordoned (see [`Caches::primaries_on`]).
    pub nodes: Watch<Node>,
}

/// A watch that fills a cache as it is read, yielding each touched object.
pub type Watch<K> = futures::stream::BoxStream<'static, Result<K, watcher::Error>>;

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// An API for `K` in `namespace`, or in all namespaces when `None`.
pub(super) fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// How watches list what exists when they start; asked of the API server once.
#[derive(Clone)]
pub(super) struct Listing {
    client: Client,
    namespace: Option<String>,
    streaming: Arc<OnceCell<bool>>,
}

impl Listing {
    fn new(client: &Client, namespace: Option<&str>) -> Self {
        Self { client: client.clone(), namespace: namespace.map(Into::into), streaming: Arc::default() }
    }

    /// The namespace watched (all when `None`).
    pub(super) fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// A watcher configuration that lists by streaming where the server can.
    pub(super) async fn config(&self) -> watcher::Config {
        let streaming = *self.streaming.get_or_init(|| self.server_streams()).await;
        if streaming { watcher::Config::default().streaming_lists() } else { watcher::Config::default().any_semantic() }
    }

    /// Whether the API server accepts a watch that sends what exists first (it refuses
    /// one with 422 where the feature is off). Anything else unexpected lists whole.
    async fn server_streams(&self) -> bool {
        let api: Api<ConfigMap> = api(&self.client, self.namespace.as_deref());
        let params = WatchParams::streaming_lists().labels(&managed()).timeout(1);
        match api.watch_metadata(&params, "0").await {
            Ok(_) => true,
            Err(e) => {
                tracing::info!(error = %e, "the API server does not stream lists: watches list whole");
                false
            }
        }
    }
}

fn managed() -> String {
    format!("app.kubernetes.io/managed-by={MANAGER}")
}

/// A reflector for `K` into a new store, trimming each object with `trim`: a stream
/// that fills the store as it is read and yields every touched object after the store
/// has it. Failed watches are logged and retried.
fn cache<K>(api: Api<K>, listing: &Listing, trim: impl FnMut(&mut K) + Send + 'static) -> (Store<K>, Watch<K>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    cache_of(api, listing, Some(managed()), trim)
}

/// [`cache`] of the objects `labels` selects (all when `None`).
fn cache_of<K>(api: Api<K>, listing: &Listing, labels: Option<String>, trim: impl FnMut(&mut K) + Send + 'static) -> (Store<K>, Watch<K>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    let watch = reflector::reflector(writer, watch_events(api, listing.clone(), labels).modify(trim))
        .touched_objects()
        .inspect_err(|e| tracing::warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying"))
        .boxed();
    (reader, watch)
}

/// A cache that fills itself, for as long as the returned task lives.
fn filled<K>(api: Api<K>, listing: &Listing, trim: impl FnMut(&mut K) + Send + 'static) -> (Store<K>, AbortOnDrop)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, watch) = cache(api, listing, trim);
    (reader, AbortOnDrop(tokio::spawn(watch.for_each(|_| async {}))))
}

/// A cache of the facts `of` each object `api` lists, and its watch: a stream that
/// fills the facts as it is read and yields every touched object once they hold it.
fn facts<K, V>(api: Api<K>, listing: &Listing, of: fn(&K) -> V) -> (Facts<V>, Watch<K>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    let facts = Facts::new();
    let filling = facts.clone();
    let watch = watch_events(api, listing.clone(), Some(managed()))
        .inspect_ok(move |event| filling.apply(event, of))
        .touched_objects()
        .inspect_err(|e| tracing::warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying"))
        .boxed();
    (facts, watch)
}

/// [`facts`] that fill themselves, for as long as the returned task lives.
fn filled_facts<K, V>(api: Api<K>, listing: &Listing, of: fn(&K) -> V) -> (Facts<V>, AbortOnDrop)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    let (facts, watch) = facts(api, listing, of);
    (facts, AbortOnDrop(tokio::spawn(watch.for_each(|_| async {}))))
}

/// The events of a watch of the objects `labels` selects (all when `None`), retried
/// with backoff.
fn watch_events<K>(
    api: Api<K>,
    listing: Listing,
    labels: Option<String>,
) -> futures::stream::BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    futures::stream::once(async move {
        let config = listing.config().await;
        let config = match &labels {
            Some(labels) => config.labels(labels),
            None => config,
        };
        watcher(api, config).default_backoff()
    })
    .flatten()
    .boxed()
}

/// When `store` has first listed.
fn listing_done<K>(store: &Store<K>) -> futures::future::BoxFuture<'static, ()>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let store = store.clone();
    async move {
        let _ = store.wait_until_ready().await;
    }
    .boxed()
}

fn get<K>(store: &Store<K>, namespace: &str, name: &str) -> Option<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    store.get(&ObjectRef::new(name).within(namespace))
}

fn seen<K>(store: &Store<K>, db: &Database, name: &str) -> Seen
where
    K: Resource<DynamicType = ()> + Clone + crate::build::Owned,
{
    match get(store, &db.namespace().unwrap_or_default(), name) {
        None => Seen::Absent,
        Some(o) if !owner::is_ours(db, K::KIND, o.meta()) => Seen::Foreign,
        Some(o) => Seen::Present { hash: o.annotations().get(APPLIED_HASH).cloned(), created: o.meta().managed_fields.is_some() },
    }
}

/// `o` when it is `db`'s own.
fn own<K>(db: &Database, o: Arc<K>) -> Option<Arc<K>>
where
    K: Resource + crate::build::Owned,
{
    owner::is_ours(db, K::KIND, o.meta()).then_some(o)
}

fn in_namespace<K, P>(store: &Store<K>, namespace: &str, predicate: P) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone,
    P: Fn(&K) -> bool,
{
    store.state_filter(|o| o.meta().namespace.as_deref() == Some(namespace) && predicate(o))
}

impl Caches {
    /// Starts watching managed objects in `namespace` (all when `None`); Secrets are
    /// judged by `stamper` as they come ([`crate::stamp`]).
    pub fn start(client: &Client, namespace: Option<&str>, stamper: Stamper) -> (Self, Triggers) {
        let listing = Listing::new(client, namespace);
        let l = &listing;
        let (config_maps, t1) = filled_facts(api::<PartialObjectMeta<ConfigMap>>(client, namespace), l, Applied::of);
        let (services, t2) = filled_facts(api::<PartialObjectMeta<Service>>(client, namespace), l, Applied::of);
        let (budgets, t3) = filled_facts(api::<PartialObjectMeta<PodDisruptionBudget>>(client, namespace), l, Applied::of);
        let (policies, t9) = filled_facts(api::<PartialObjectMeta<NetworkPolicy>>(client, namespace), l, Applied::of);
        let judge = stamper.clone();
        let (secrets, t4) = filled(api(client, namespace), l, move |s| key_names_only(&judge, s));
        let (pods, t5) = filled(api(client, namespace), l, pod_essentials);
        let (claims, t6) = filled(api(client, namespace), l, claim_essentials);
        let (stateful_sets, sts_watch) = facts(api(client, namespace), l, SetFacts::of);
        let (jobs, job_watch) = cache(api(client, namespace), l, no_managed_fields);
        let (nodes, node_watch) = cache_of(Api::all(client.clone()), l, None, node_essentials);
        // One waiter on the stores, many on `listed`: a store's first listing wakes only
        // the waker that polled it last.
        let (tell, listed) = tokio::sync::watch::channel(false);
        let waits = vec![
            config_maps.listed(),
            services.listed(),
            budgets.listed(),
            policies.listed(),
            listing_done(&secrets),
            listing_done(&pods),
            listing_done(&claims),
            stateful_sets.listed(),
            listing_done(&jobs),
        ];
        let t7 = AbortOnDrop(tokio::spawn(async move {
            futures::future::join_all(waits).await;
            let _ = tell.send(true);
        }));
        // Not waited for: an operator that may not read the leases still runs.
        let leases = leases::Leases::default();
        let filling = leases.clone();
        let lease_events = watch_events(Api::namespaced(client.clone(), leases::NAMESPACE), listing.clone(), None);
        let t8 = AbortOnDrop(tokio::spawn(lease_events.for_each(move |event| {
            match event {
                Ok(event) => filling.apply(&event, std::time::Instant::now()),
                Err(e) => tracing::debug!(error = %e, "cannot watch the nodes' leases; retrying"),
            }
            futures::future::ready(())
        })));
        let caches = Self {
            stamper,
            listing: Some(listing),
            config_maps,
            services,
            budgets,
            policies,
            secrets,
            stateful_sets,
            pods,
            jobs,
            claims,
            nodes,
            leases,
            listed,
            _tasks: vec![t1, t2, t3, t4, t5, t6, t7, t8, t9],
        };
        (caches, Triggers { stateful_sets: sts_watch, jobs: job_watch, nodes: node_watch })
    }

    /// Waits until every cache has listed once. The StatefulSet and Job caches list
    /// only while their [`Triggers`] are read. Any number of tasks may wait.
    pub async fn ready(&self) {
        let mut listed = self.listed.clone();
        let _ = listed.wait_for(|listed| *listed).await;
    }

    /// How watches list what exists when they start: `None` for caches that watch nothing.
    pub(super) fn listing(&self) -> Option<&Listing> {
        self.listing.as_ref()
    }

    /// Caches that hold `objects` (as the API server serves them, each with its `kind`)
    /// and watch nothing: a pass run against them reads what was built by hand, as the
    /// unit-speed tests of whole passes do. Each object is trimmed as a watch would trim
    /// it (Secrets judged by `stamper`); a kind no cache keeps is an error.
    pub fn holding(objects: &[serde_json::Value], stamper: Stamper) -> Result<Self, serde_json::Error> {
        use serde::de::Error as _;
        fn put<K>(
            store: &mut reflector::store::Writer<K>,
            object: &serde_json::Value,
            trim: impl FnOnce(&mut K),
        ) -> Result<(), serde_json::Error>
        where
            K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        {
            let mut o: K = serde_json::from_value(object.clone())?;
            trim(&mut o);
            store.apply_watcher_event(&watcher::Event::Apply(o));
            Ok(())
        }
        fn fact<K, V>(facts: &Facts<V>, object: &serde_json::Value, of: fn(&K) -> V) -> Result<(), serde_json::Error>
        where
            K: Resource<DynamicType = ()> + Clone + DeserializeOwned,
            V: Clone + Send + Sync + 'static,
        {
            facts.apply(&watcher::Event::Apply(serde_json::from_value::<K>(object.clone())?), of);
            Ok(())
        }
        let (config_maps, services, budgets, policies) = (Facts::new(), Facts::new(), Facts::new(), Facts::new());
        let stateful_sets = Facts::new();
        let (secrets, mut secrets_in) = reflector::store();
        let (pods, mut pods_in) = reflector::store();
        let (jobs, mut jobs_in) = reflector::store();
        let (claims, mut claims_in) = reflector::store();
        let (nodes, mut nodes_in) = reflector::store();
        for object in objects {
            match object["kind"].as_str().unwrap_or_default() {
                "ConfigMap" => fact::<ConfigMap, _>(&config_maps, object, Applied::of)?,
                "Service" => fact::<Service, _>(&services, object, Applied::of)?,
                "PodDisruptionBudget" => fact::<PodDisruptionBudget, _>(&budgets, object, Applied::of)?,
                "NetworkPolicy" => fact::<NetworkPolicy, _>(&policies, object, Applied::of)?,
                "StatefulSet" => fact::<StatefulSet, _>(&stateful_sets, object, SetFacts::of)?,
                "Secret" => put(&mut secrets_in, object, |s| key_names_only(&stamper, s))?,
                "Pod" => put(&mut pods_in, object, pod_essentials)?,
                "Job" => put(&mut jobs_in, object, no_managed_fields)?,
                "PersistentVolumeClaim" => put(&mut claims_in, object, claim_essentials)?,
                "Node" => put(&mut nodes_in, object, node_essentials)?,
                other => return Err(serde_json::Error::custom(format!("no cache keeps kind {other:?}"))),
            }
        }
        let (_, listed) = tokio::sync::watch::channel(true);
        Ok(Self {
            stamper,
            listing: None,
            config_maps,
            services,
            budgets,
            policies,
            secrets,
            stateful_sets,
            pods,
            jobs,
            claims,
            nodes,
            leases: leases::Leases::default(),
            listed,
            _tasks: Vec::new(),
        })
    }

    /// What the cache knows of `db`'s child `kind` `name`.
    pub fn seen(&self, kind: Kind, db: &Database, name: &str) -> Seen {
        match kind {
            Kind::ConfigMap => self.config_maps.seen(db, name),
            Kind::Service => self.services.seen(db, name),
            Kind::PodDisruptionBudget => self.budgets.seen(db, name),
            Kind::NetworkPolicy => self.policies.seen(db, name),
            Kind::Secret => seen(&self.secrets, db, name),
            Kind::StatefulSet => self.stateful_sets.seen(db, name),
            Kind::Job => seen(&self.jobs, db, name),
            Kind::PersistentVolumeClaim => seen(&self.claims, db, name),
        }
    }

    /// `db`'s Secret `name`: its metadata and key names (values are not cached). A
    /// Secret of that name that is not the Database's is not returned.
    pub fn secret(&self, db: &Database, name: &str) -> Option<Arc<Secret>> {
        get(&self.secrets, &db.namespace().unwrap_or_default(), name).and_then(|s| own(db, s))
    }

    /// The key names of `db`'s Secret `name` (see [`Caches::secret`]).
    pub fn secret_keys(&self, db: &Database, name: &str) -> Option<Vec<String>> {
        self.secret(db, name).map(|s| s.data.iter().flat_map(|d| d.keys().cloned()).collect())
    }

    /// What stamps the Secrets the operator writes and judges those it reads.
    pub fn stamper(&self) -> &Stamper {
        &self.stamper
    }

    /// What a pass reads of `db`'s StatefulSet.
    pub fn stateful_set(&self, db: &Database) -> Option<SetFacts> {
        self.stateful_sets.own(db)
    }

    /// `db`'s Job `name`; a Job of that name that is not the Database's is not returned.
    pub fn job(&self, db: &Database, name: &str) -> Option<Arc<Job>> {
        get(&self.jobs, &db.namespace().unwrap_or_default(), name).and_then(|j| own(db, j))
    }

    /// `db`'s Jobs labelled `key=value`.
    pub fn jobs_labelled(&self, db: &Database, key: &str, value: &str) -> Vec<Arc<Job>> {
        let ns = db.namespace().unwrap_or_default();
        in_namespace(&self.jobs, &ns, |j| j.labels().get(key).map(String::as_str) == Some(value) && owner::is_ours(db, Kind::Job, j.meta()))
    }

    /// `db`'s volume claim `name`.
    pub fn claim(&self, db: &Database, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        get(&self.claims, &db.namespace().unwrap_or_default(), name).and_then(|c| own(db, c))
    }

    /// Whether node `name` is cordoned (marked unschedulable, as a drain begins), as far
    /// as the node watch knows.
    pub fn cordoned(&self, name: &str) -> bool {
        self.nodes.get(&ObjectRef::new(name)).is_some_and(|n| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true))
    }

    /// The Databases whose primary runs on node `name`, by their members' labels.
    pub fn primaries_on(&self, name: &str) -> Vec<ObjectRef<Database>> {
        self.databases_on(name, |p| p.labels().get(crate::names::ROLE_LABEL).map(String::as_str) == Some("primary"))
    }

    /// The Databases with a member on node `name`, by their members' labels.
    pub fn members_on(&self, name: &str) -> Vec<ObjectRef<Database>> {
        self.databases_on(name, |_| true)
    }

    /// The Databases of the pods on node `name` that `which` keeps, each once.
    fn databases_on(&self, name: &str, which: impl Fn(&Pod) -> bool) -> Vec<ObjectRef<Database>> {
        let on = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name) && which(p);
        let mut dbs: Vec<ObjectRef<Database>> = self
            .pods
            .state_filter(on)
            .iter()
            .filter_map(|p| {
                let db = p.labels().get(crate::names::INSTANCE_LABEL)?;
                Some(ObjectRef::new(db).within(p.metadata.namespace.as_deref()?))
            })
            .collect();
        dbs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        dbs.dedup();
        dbs
    }

    /// How long node `name` has been silent at `now` (see [`leases`]), once it counts as
    /// cut off.
    pub fn silent_for(&self, name: &str, now: std::time::Instant) -> Option<std::time::Duration> {
        self.leases.silent_for(name, now)
    }

    /// The nodes silent at `now` (see [`leases`]).
    pub fn silent_nodes(&self, now: std::time::Instant) -> std::collections::HashSet<String> {
        self.leases.silent(now)
    }

    /// `db`'s member pods: those its StatefulSet made, whose labels include all of
    /// `selector`; metadata and conditions only.
    pub fn pods(&self, db: &Database, selector: &std::collections::BTreeMap<String, String>) -> Vec<Arc<Pod>> {
        let name = db.name_any();
        let members = |p: &Pod| owner::controller(p.meta()).is_some_and(|c| c.kind == "StatefulSet" && c.name == name);
        in_namespace(&self.pods, &db.namespace().unwrap_or_default(), |p| {
            members(p) && selector.iter().all(|(k, v)| p.labels().get(k) == Some(v))
        })
    }
}

#[cfg(test)]
mod tests;
