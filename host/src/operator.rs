//! The operator as a whole: leader election, the plugin registry and the Database
//! controller, started together and stopped together.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;

use crate::health::Health;
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
    /// The `plugdb` binary that compiles plugins in a process of its own (bounded in
    /// time and memory); in this process when `None`.
    pub compiler: Option<std::path::PathBuf>,
    /// The operator's own image, run by backup and restore Jobs to move artefacts to and
    /// from object storage; backups to a bucket need it.
    pub operator_image: Option<String>,
    /// The directory of the plugins bundled with the operator, loaded at start (a
    /// ConfigMap for the same engine takes precedence); none when `None`.
    pub bundled: Option<std::path::PathBuf>,
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
            compiler: None,
            operator_image: None,
            bundled: None,
        }
    }
}

/// Runs the operator until `shutdown` completes. Nothing is watched or written before
/// the lease is held. A leader that cannot renew stops acting at once (its watches and
/// reconciles are dropped), keeps running, and contends again: it leads again when the
/// API server is back and nobody else took over, or stands by. The lease is released
/// on shutdown. Fails only if the controller stops by itself.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    options: Options,
    health: Health,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let election = options
        .identity
        .as_ref()
        .map(|id| LeaderElection::new(client.clone(), &options.plugin_namespace, "plugdb-leader", id, options.lease_duration));
    let retry = options.lease_duration / 5;
    // Plugins serve from a quick compile at once; an optimised build replaces it when
    // ready. Loaded plugins outlive a term of leading.
    let mut quick = Runtime::with_tier(options.limits, Tier::Quick)?.with_metrics(metrics.clone());
    let mut optimized = Runtime::new(options.limits)?.with_metrics(metrics.clone());
    if let Some(exe) = &options.compiler {
        (quick, optimized) = (quick.with_compiler(exe), optimized.with_compiler(exe));
    }
    let registry = Registry::new(quick, metrics.clone()).with_optimizer(optimized);
    if let Some(dir) = &options.bundled {
        match registry.load_bundled(dir).await {
            Ok(loaded) => {
                tracing::info!(dir = %dir.display(), plugins = loaded.len(), "bundled engines loaded (a ConfigMap for the same engine takes precedence)")
            }
            Err(e) => tracing::info!(dir = %dir.display(), error = %e, "no bundled engines"),
        }
    }
    tokio::pin!(shutdown);
    loop {
        let renewed = match &election {
            Some(e) => {
                tracing::info!(identity = e.identity(), "waiting to lead");
                tokio::select! {
                    renewed = e.acquire(retry, &health) => renewed,
                    _ = &mut shutdown => return Ok(()),
                }
            }
            None => std::time::Instant::now(),
        };
        tracing::info!(identity = options.identity.as_deref(), "leading");
        health.set_leading(true);
        let mut term = Term::start(&client, &registry, &metrics, &options, &health);
        let lost = async {
            match &election {
                Some(e) => e.keep(retry, renewed, &health).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut shutdown => {
                term.stop().await;
                health.set_leading(false);
                if let Some(e) = &election {
                    e.release().await;
                }
                return Ok(());
            }
            lost = lost => {
                // Stop acting before the lease can run out for the others.
                drop(term);
                health.set_leading(false);
                tracing::warn!(reason = %lost, "stopped leading: no more reconciles or writes until the lease is held again");
            }
            _ = &mut term.controller.0 => {
                health.set_leading(false);
                anyhow::bail!("the Database controller stopped by itself");
            }
        }
    }
}

/// One term of leading: the plugin watch and the controller, dropped together.
struct Term {
    _watch: Task,
    controller: Task,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Term {
    fn start(client: &Client, registry: &Registry, metrics: &Arc<Metrics>, options: &Options, health: &Health) -> Self {
        let watch = Task(tokio::spawn(registry.clone().watch(client.clone(), options.plugin_namespace.clone())));
        let (caches, triggers) = reconcile::cache::Caches::start(client, options.watch_namespace.as_deref());
        let ctx = Arc::new(
            reconcile::Context::new(client.clone(), registry.clone(), metrics.clone(), options.settings.clone(), caches)
                .with_operator_image(options.operator_image.clone()),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let health = health.clone();
        let controller = Task(tokio::spawn(async move {
            // Synced once every cache has listed: the controller itself reads the
            // watches that wake it, so it runs meanwhile (reconciling nothing yet).
            let synced = async {
                ctx.loaded().await;
                health.set_synced();
                std::future::pending::<()>().await
            };
            let controller = reconcile::run(ctx.clone(), triggers, async move {
                let _ = stopped.await;
            });
            tokio::select! {
                _ = synced => {}
                _ = controller => {}
            }
        }));
        Self { _watch: watch, controller, stop: Some(stop) }
    }

    /// A graceful stop: in-flight reconciles finish first.
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.controller.0).await;
    }
}

/// A spawned task that is aborted when dropped: if `run` itself is cancelled, nothing
/// it started keeps reconciling.
struct Task(tokio::task::JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}
