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
use crate::tls::OperatorIdentity;

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
    /// Where the operator may send a request a tenant named (a backup bucket's endpoint).
    pub egress: crate::egress::Policy,
    /// Where the operator reaches the member agents from (its pods, or its address): the
    /// only peers the members' NetworkPolicies let reach the agent port. Empty: unknown,
    /// so that port is left open to all (the agent's TLS still refuses everyone else).
    pub agents_reached_from: Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer>,
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
            egress: crate::egress::Policy::default(),
            agents_reached_from: Vec::new(),
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
        .map(|id| LeaderElection::new(client.clone(), &options.plugin_namespace, crate::leader::LEASE, id, options.lease_duration));
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
    let agent_identity = tokio::select! {
        identity = agent_identity(&client, &options.plugin_namespace, retry) => identity,
        _ = &mut shutdown => return Ok(()),
    };
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
        metrics.leading.set(1);
        metrics.leadership_acquired.inc();
        let mut term = Term::start(&client, &registry, &metrics, &options, &health, &agent_identity);
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
                metrics.leading.set(0);
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
    fn start(
        client: &Client,
        registry: &Registry,
        metrics: &Arc<Metrics>,
        options: &Options,
        health: &Health,
        agent_identity: &OperatorIdentity,
    ) -> Self {
        let watch = Task(tokio::spawn(registry.clone().watch(client.clone(), options.plugin_namespace.clone())));
        let stamper = crate::stamp::Stamper::new(&agent_identity.authority.key);
        let (caches, triggers) = reconcile::cache::Caches::start(client, options.watch_namespace.as_deref(), stamper.clone());
        let ctx = Arc::new(
            reconcile::Context::new(client.clone(), registry.clone(), metrics.clone(), options.settings.clone(), caches)
                .with_operator_image(options.operator_image.clone())
                .with_agent_identity(agent_identity.clone())
                .with_egress(options.egress.clone())
                .with_agents_reached_from(options.agents_reached_from.clone()),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let health = health.clone();
        let (client, plugin_namespace, watch_namespace) =
            (client.clone(), options.plugin_namespace.clone(), options.watch_namespace.clone());
        let controller = Task(tokio::spawn(async move {
            // Before any pass judges a kept Secret by its stamp.
            let stamping =
                crate::stamp::Upgrade { client: &client, identity_namespace: &plugin_namespace, watched: watch_namespace.as_deref() };
            stamping.until_done(&stamper, Duration::from_secs(5)).await;
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

/// The Secret in the operator's namespace holding its identity towards member agents.
pub const AGENT_IDENTITY_SECRET: &str = "plugdb-agent-clients";

/// The operator's identity towards member agents ([`OperatorIdentity`]), from Secret
/// [`AGENT_IDENTITY_SECRET`] in its own namespace: made the first time (the replicas of
/// the operator share it; one made by another at the same moment is taken), its client
/// certificate issued again 30 days before it expires. Tried again every `retry` until it
/// is had: nothing asks an agent before.
async fn agent_identity(client: &Client, namespace: &str, retry: Duration) -> OperatorIdentity {
    loop {
        match read_or_make_agent_identity(client, namespace).await {
            Ok(identity) => return identity,
            Err(e) => tracing::warn!(error = %format!("{e:#}"), namespace, "the operator's agent identity: trying again"),
        }
        tokio::time::sleep(retry).await;
    }
}

async fn read_or_make_agent_identity(client: &Client, namespace: &str) -> anyhow::Result<OperatorIdentity> {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, Patch, PatchParams, PostParams};

    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let now = chrono::Utc::now();
    if let Some(secret) = api.get_opt(AGENT_IDENTITY_SECRET).await? {
        let identity = identity_of(&secret)?;
        if !crate::tls::due(Some(&identity.client.not_after.to_rfc3339()), now) {
            return Ok(identity);
        }
        let client = OperatorIdentity::client(&identity.authority.key, now).map_err(anyhow::Error::msg)?;
        let renewed = OperatorIdentity { client, ..identity };
        let mut written = identity_secret(&renewed);
        written.metadata.resource_version = secret.metadata.resource_version.clone();
        // Fails if the Secret changed since it was read (another replica renewed it).
        api.patch(AGENT_IDENTITY_SECRET, &PatchParams::default(), &Patch::Merge(&written)).await?;
        tracing::info!(namespace, "issued the operator's client certificate for member agents again");
        return Ok(renewed);
    }
    let made = OperatorIdentity::new(now).map_err(anyhow::Error::msg)?;
    match api.create(&PostParams::default(), &identity_secret(&made)).await {
        Ok(_) => {
            tracing::info!(namespace, secret = AGENT_IDENTITY_SECRET, "made the operator's identity for member agents");
            Ok(made)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => identity_of(&api.get(AGENT_IDENTITY_SECRET).await?),
        Err(e) => Err(e.into()),
    }
}

const CLIENT_CERTIFICATE: &str = "client.crt";
const CLIENT_KEY: &str = "client.key";

fn identity_secret(identity: &OperatorIdentity) -> k8s_openapi::api::core::v1::Secret {
    let bytes = |s: &str| k8s_openapi::ByteString(s.as_bytes().to_vec());
    k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(AGENT_IDENTITY_SECRET.into()),
            labels: Some([("app.kubernetes.io/managed-by".to_string(), "plugdb".to_string())].into()),
            annotations: Some([(crate::tls::NOT_AFTER.to_string(), identity.client.not_after.to_rfc3339())].into()),
            ..Default::default()
        },
        data: Some(
            [
                (crate::tls::CA, bytes(&identity.authority.certificate)),
                (crate::tls::CA_KEY, bytes(&identity.authority.key)),
                (CLIENT_CERTIFICATE, bytes(&identity.client.certificate)),
                (CLIENT_KEY, bytes(&identity.client.key)),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        ),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

fn identity_of(secret: &k8s_openapi::api::core::v1::Secret) -> anyhow::Result<OperatorIdentity> {
    let data = secret.data.clone().unwrap_or_default();
    let text = |key: &str| {
        data.get(key)
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .ok_or_else(|| anyhow::anyhow!("Secret {AGENT_IDENTITY_SECRET} has no {key}"))
    };
    // An unreadable expiry is taken as now: the client certificate is issued again.
    let not_after = kube::ResourceExt::annotations(secret)
        .get(crate::tls::NOT_AFTER)
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map_or_else(chrono::Utc::now, |t| t.with_timezone(&chrono::Utc));
    Ok(OperatorIdentity {
        authority: crate::tls::Authority { certificate: text(crate::tls::CA)?, key: text(crate::tls::CA_KEY)? },
        client: crate::tls::Issued { certificate: text(CLIENT_CERTIFICATE)?, key: text(CLIENT_KEY)?, not_after },
    })
}

/// A spawned task that is aborted when dropped: if `run` itself is cancelled, nothing
/// it started keeps reconciling.
struct Task(tokio::task::JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}
