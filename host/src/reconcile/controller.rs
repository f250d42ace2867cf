//! The controller: what wakes a pass (a Database's spec or annotations, its StatefulSet
//! and Jobs, a plugin of its engine, a cordon or a silent node under one of its members)
//! and the loop that runs the passes.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Predicate, WatchStreamExt, predicates, reflector, watcher};

use super::cache::{self, Triggers};
use super::{Context, error_policy, reconcile};
use crate::crd::Database;

/// Runs the controller until `shutdown` completes; in-flight reconciles finish first.
/// The controller reads the StatefulSet and Job watches (`triggers`, from the
/// [`cache::Caches::start`] that made `ctx`'s caches) from the start: they fill their caches as
/// it reads. Databases are watched, and so reconciled, once every cache has listed and
/// the plugins present at start are loaded.
pub async fn run(ctx: Arc<Context>, triggers: Triggers, shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static) {
    let Some(listing) = ctx.caches.listing().cloned() else {
        tracing::error!("caches that watch nothing cannot drive a controller");
        return;
    };
    let dbs: Api<Database> = cache::api(&ctx.client, listing.namespace());
    // Nothing is judged before the caches and the plugins are loaded: a restarted
    // operator must not report engines missing that are merely still loading. Until the
    // Databases have listed, kube holds every reconcile the other watches ask for.
    let loaded = ctx.clone();
    let watched = futures::stream::once(async move {
        loaded.loaded().await;
        watcher(dbs, listing.config().await)
    });
    // A Database's own status and finalizer writes do not start another pass: only its
    // spec (generation, which deletion also bumps) and annotations (backup-now) do.
    let (reader, writer) = reflector::store();
    // What is kept about a Database goes with it: when its deletion is seen, and for
    // any a relist no longer finds (deleted while the watch was down).
    let (keeper, known) = (ctx.clone(), reader.clone());
    let databases = watched
        .flatten()
        .default_backoff()
        .modify(cache::database_essentials)
        .reflect(writer)
        .inspect(move |event| match event {
            Ok(watcher::Event::Delete(db)) => keeper.forget(db),
            Ok(watcher::Event::InitDone) => keeper.forget_all_but(|key| known.get(key).is_some()),
            _ => {}
        })
        .applied_objects()
        .predicate_filter(predicates::generation.combine(predicates::annotations), Default::default());
    let plugin_changes = engine_changes(ctx.registry.subscribe(), reader.clone());
    let cordons = cordoned_primaries(triggers.nodes, ctx.clone());
    let silenced = silenced_nodes(ctx.clone());
    let config = kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency);
    Controller::for_stream(databases, reader)
        .with_config(config)
        .owns_stream(triggers.stateful_sets)
        .owns_stream(triggers.jobs)
        .reconcile_on(plugin_changes)
        .reconcile_on(cordons)
        .reconcile_on(silenced)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile loop");
            }
        })
        .await;
}

/// The Databases to pass over when a node is cordoned (a drain begins): those whose
/// primary runs there, to switch over before the primary's eviction, which its
/// disruption budget holds back meanwhile. Only a change of a node's cordon is read.
fn cordoned_primaries(
    nodes: cache::Watch<k8s_openapi::api::core::v1::Node>,
    ctx: Arc<Context>,
) -> impl futures::Stream<Item = ObjectRef<Database>> + Send + 'static {
    fn cordon(n: &k8s_openapi::api::core::v1::Node) -> Option<u64> {
        Some(u64::from(n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)))
    }
    nodes
        .predicate_filter(cordon, Default::default())
        .filter_map(|node| futures::future::ready(node.ok().filter(|n| cordon(n) == Some(1))))
        .flat_map(move |node| futures::stream::iter(ctx.caches.primaries_on(&node.name_any())))
}

/// How often the nodes' leases are looked at for a node that fell silent.
const SILENCE_CHECK: Duration = Duration::from_secs(2);

/// The Databases to pass over when a node falls silent (its lease unrenewed for
/// [`cache::leases::SILENT_AFTER`]): those with a member there, which a pass takes as
/// down from then on (see [`members::cut_off`]). Nothing else says so: the node's pods
/// change only once the node controller's grace period ends.
fn silenced_nodes(ctx: Arc<Context>) -> impl futures::Stream<Item = ObjectRef<Database>> + Send + 'static {
    futures::stream::unfold((ctx, std::collections::HashSet::new()), |(ctx, before)| async move {
        tokio::time::sleep(SILENCE_CHECK).await;
        let silent = ctx.caches.silent_nodes(std::time::Instant::now());
        let fell: Vec<ObjectRef<Database>> = silent.difference(&before).flat_map(|node| ctx.caches.members_on(node)).collect();
        for node in silent.difference(&before) {
            tracing::warn!(node = %node, "node has not renewed its lease for {:?}: its members count as down", cache::leases::SILENT_AFTER);
        }
        Some((futures::stream::iter(fell), (ctx, silent)))
    })
    .flatten()
}

/// The Databases to pass over when a plugin changes: those of the engine it serves. A
/// receiver that lagged behind has lost which engines changed, so it names them all.
fn engine_changes(
    changes: tokio::sync::broadcast::Receiver<String>,
    databases: reflector::Store<Database>,
) -> impl futures::Stream<Item = ObjectRef<Database>> + Send + 'static {
    use tokio::sync::broadcast::error::RecvError;
    futures::stream::unfold(changes, |mut rx| async move {
        match rx.recv().await {
            Ok(engine) => Some((Some(engine), rx)),
            Err(RecvError::Lagged(_)) => Some((None, rx)),
            Err(RecvError::Closed) => None,
        }
    })
    .flat_map(move |engine| {
        let of_engine = |db: &Database| engine.as_ref().is_none_or(|e| db.spec.engine == *e);
        futures::stream::iter(
            databases.state().iter().filter(|db| of_engine(db)).map(|db| ObjectRef::from_obj(db.as_ref())).collect::<Vec<_>>(),
        )
    })
}
