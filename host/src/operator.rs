//! The operator as a whole: leader election, the plugin registry and the Database
//! controller, started together and stopped together.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;

use crate::leader::LeaderElection;
use crate::metrics::Metrics;
use crate::plugin::{Limits, Registry, Runtime, Tier};
use crate::reconcile::{self, Settings};

/// How the operator runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Namespace whose labelled ConfigMaps are the engine plugins (and where the Lease lives).
    pub plugin_namespace: String,
    /// Only reconcile Databases in this namespace; all namespaces when `None`.
    pub watch_namespace: Option<String>,
    /// Leader election: the identity of this replica; `None` runs without it.
    pub identity: Option<String>,
    /// How long a lease lasts without renewal.
    pub lease_duration: Duration,
    /// Reconciler timings.
    pub settings: Settings,
    /// Plugin call limits.
    pub limits: Limits,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            plugin_namespace: "plugdb-system".into(),
            watch_namespace: None,
            identity: None,
            lease_duration: Duration::from_secs(15),
            settings: Settings::default(),
            limits: Limits::default(),
        }
    }
}

/// Why the operator stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// `shutdown` completed.
    Shutdown,
    /// Another replica took the lease.
    LostLeadership,
}

/// Runs the operator until `shutdown` completes or leadership is lost. Nothing is
/// watched or written before the lease is held; the lease is released on shutdown.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    options: Options,
    on_leading: impl FnOnce(),
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<Stopped> {
    let election = options
        .identity
        .as_ref()
        .map(|id| LeaderElection::new(client.clone(), &options.plugin_namespace, "plugdb-leader", id, options.lease_duration));
    let retry = options.lease_duration / 5;
    tokio::pin!(shutdown);
    if let Some(e) = &election {
        tracing::info!(identity = e.identity(), "waiting to lead");
        tokio::select! {
            _ = e.acquire(retry) => tracing::info!(identity = e.identity(), "leading"),
            _ = &mut shutdown => return Ok(Stopped::Shutdown),
        }
    }
    on_leading();
    // Plugins serve from a quick compile at once; an optimised build replaces it when ready.
    let quick = Runtime::with_tier(options.limits, Tier::Quick)?.with_metrics(metrics.clone());
    let optimized = Runtime::new(options.limits)?.with_metrics(metrics.clone());
    let registry = Registry::new(quick, metrics.clone()).with_optimizer(optimized);
    let watch = Task(tokio::spawn(registry.clone().watch(client.clone(), options.plugin_namespace.clone())));
    let ctx = Arc::new(reconcile::Context::new(client, registry, metrics, options.settings, options.watch_namespace.clone()));
    let lost = async {
        match &election {
            Some(e) => e.keep(retry).await,
            None => std::future::pending().await,
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut controller = Task(tokio::spawn(reconcile::run(ctx, async move {
        let _ = stop_rx.await;
    })));
    let stopped = tokio::select! {
        _ = &mut shutdown => Stopped::Shutdown,
        _ = lost => Stopped::LostLeadership,
    };
    let _ = stop_tx.send(());
    let _ = (&mut controller.0).await;
    drop(watch);
    if let (Some(e), Stopped::Shutdown) = (&election, stopped) {
        e.release().await;
    }
    Ok(stopped)
}

/// A spawned task that is aborted when dropped: if `run` itself is cancelled, nothing
/// it started keeps reconciling.
struct Task(tokio::task::JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}
