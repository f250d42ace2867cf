//! The operator, running in-process against a real control plane, with the bundled
//! plugins loaded the way a cluster admin loads them: as ConfigMaps.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, CustomResourceExt};
use plugdb::crd::Database;
use plugdb::metrics::{Metrics, ReconcileLabels};
use plugdb::plugin::registry::PLUGIN_LABEL;
use plugdb::plugin::{Limits, Registry, Runtime};
use plugdb::reconcile::{self, Settings};

use crate::control_plane::ControlPlane;
use crate::node::Nodes;

/// Namespace the operator loads plugins from.
pub const OPERATOR_NAMESPACE: &str = "plugdb-system";

/// The sum of the samples of metric `name` (every label set) in a Prometheus text
/// exposition, over the lines that `keep` accepts.
pub fn metric_sum(text: &str, name: &str, keep: impl Fn(&str) -> bool) -> f64 {
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{')) && keep(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        // Not `sum()`: a float sum of nothing is -0, printed "-0".
        .fold(0.0, |total, n| total + n)
}

/// Requests a client made, as the operator's own `api_requests` metric counts them.
#[derive(Debug, Default)]
pub struct RequestCounts(Arc<Metrics>);

impl RequestCounts {
    /// Requests whose verb `keep` accepts.
    fn count(&self, keep: impl Fn(&str) -> bool) -> u64 {
        let verb = |line: &str| line.split_once("verb=\"").and_then(|(_, v)| v.split('"').next()).is_some_and(&keep);
        metric_sum(&self.0.encode(), "plugdb_api_requests_total", verb) as u64
    }

    /// Requests that may change state.
    pub fn writes(&self) -> u64 {
        self.count(|v| v != "watch" && v != "get")
    }

    /// Every request but watches, by verb and resource: what a failed comparison names.
    pub fn by_kind(&self) -> BTreeMap<String, u64> {
        let text = self.0.encode();
        let kinds = text.lines().filter(|l| l.starts_with("plugdb_api_requests_total{") && !l.contains("verb=\"watch\""));
        kinds.filter_map(|l| Some((l.split_once('{')?.1.split_once('}')?.0.to_string(), l.rsplit(' ').next()?.parse().ok()?))).collect()
    }
}

/// What the cluster runs on; dropped after the operator.
pub enum Backing {
    /// A control plane alone: no node runs Pods.
    ControlPlane(Box<ControlPlane>),
    /// A control plane with a real node.
    Node(Box<Nodes>),
}

impl Backing {
    /// Path of an admin kubeconfig.
    pub fn kubeconfig(&self) -> &std::path::Path {
        match self {
            Backing::ControlPlane(cp) => &cp.kubeconfig,
            Backing::Node(node) => &node.kubeconfig,
        }
    }

    /// Where the operator reaches the member agents from: this machine's address on the
    /// nodes' network (the members' NetworkPolicies let it alone reach the agent port).
    pub fn agents_reached_from(&self) -> Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer> {
        match self {
            Backing::ControlPlane(_) => Vec::new(),
            Backing::Node(_) => vec![plugdb::build::network::operator_peer(crate::node::HOST_ADDRESS).expect("an address")],
        }
    }

    /// The operator's image, where a node can run it.
    pub fn operator_image(&self) -> Option<String> {
        match self {
            Backing::ControlPlane(_) => None,
            Backing::Node(node) => Some(node.operator_image.clone()),
        }
    }
}

/// A control plane (with or without a real node) and the operator running against it.
pub struct Cluster {
    /// An admin client for the test's own reads and writes.
    pub client: Client,
    operator_client: Client,
    /// Requests made by the operator's reconciler.
    pub requests: Arc<RequestCounts>,
    operator: std::sync::Mutex<Operator>,
    /// The reconciler's timings (the tests' unless the cluster was started with others).
    settings: Settings,
    /// The control plane or node (declared last: dropped after the operator's tasks).
    pub backing: Backing,
}

/// One run of the operator: its registry, metrics and tasks.
struct Operator {
    registry: Registry,
    metrics: Arc<Metrics>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Operator {
    /// The operator's registry watch (on `admin`: its Events about plugin ConfigMaps are
    /// not the reconciler's requests) and controller (on `client`), with fast test timings.
    /// `backing`: its image on the node (the members' agent, backups to object storage),
    /// and where it reaches the agents from.
    fn start(admin: &Client, client: &Client, backing: &Backing, settings: Settings) -> Result<Self> {
        let metrics = Arc::new(Metrics::default());
        let registry = Registry::new(Runtime::new(Limits::default())?.with_metrics(metrics.clone()), metrics.clone());
        let (caches, triggers) = reconcile::cache::Caches::start(client, None, reconcile::fresh_stamper());
        let ctx = reconcile::Context::new(client.clone(), registry.clone(), metrics.clone(), settings, caches);
        let ctx = Arc::new(ctx.with_operator_image(backing.operator_image()).with_agents_reached_from(backing.agents_reached_from()));
        let tasks = vec![
            tokio::spawn(registry.clone().watch(admin.clone(), OPERATOR_NAMESPACE.into())),
            tokio::spawn(reconcile::run(ctx, triggers, std::future::pending())),
        ];
        Ok(Self { registry, metrics, tasks })
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}

/// The plugin ConfigMap for the component built from `component`.
pub fn plugin_config_map(engine: &str, component: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("engine-{engine}")),
            namespace: Some(OPERATOR_NAMESPACE.into()),
            labels: Some(BTreeMap::from([(PLUGIN_LABEL.to_string(), engine.to_string())])),
            ..Default::default()
        },
        binary_data: Some(BTreeMap::from([("plugin.wasm".to_string(), ByteString(crate::component(component)))])),
        ..Default::default()
    }
}

/// An admin client for the cluster behind `kubeconfig` whose requests are counted.
pub async fn counting_client(kubeconfig: &std::path::Path) -> Result<(Client, Arc<RequestCounts>)> {
    let config = kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(kubeconfig)?, &KubeConfigOptions::default()).await?;
    let requests = Arc::new(RequestCounts::default());
    Ok((requests.0.counted_client(config)?, requests))
}

/// Like [`counting_client`], through `server` (e.g. a [`crate::proxy::Proxy`] in front of
/// the API server) instead of the kubeconfig's address.
pub async fn counting_client_via(kubeconfig: &std::path::Path, server: &str) -> Result<(Client, Arc<RequestCounts>)> {
    let mut config = kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(kubeconfig)?, &KubeConfigOptions::default()).await?;
    config.cluster_url = server.parse()?;
    let requests = Arc::new(RequestCounts::default());
    Ok((requests.0.counted_client(config)?, requests))
}

/// Installs the CRD and the operator namespace, and loads `plugins` as ConfigMaps.
pub async fn prepare(client: &Client, plugins: &[(&str, &str)]) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Database::crd()).await?;
    let established = kube::runtime::wait::conditions::is_crd_established();
    tokio::time::timeout(Duration::from_secs(30), kube::runtime::wait::await_condition(crds, "databases.plugdb.io", established)).await??;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &Namespace { metadata: ObjectMeta { name: Some(OPERATOR_NAMESPACE.into()), ..Default::default() }, ..Default::default() },
        )
        .await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    for (engine, component) in plugins {
        cms.create(&PostParams::default(), &plugin_config_map(engine, component)).await?;
    }
    Ok(())
}

/// Installs the chart's MutatingAdmissionPolicy and its binding from `deploy/plugdb.yaml`
/// (the API server then puts the final-backup finalizer on a Database as it is created)
/// and waits until the API server acts on them: a dry-run create comes back with it.
pub async fn install_finalizer_policy(client: &Client) -> Result<()> {
    let text = std::fs::read_to_string(crate::workspace_root().join("deploy/plugdb.yaml"))?;
    let policy: Vec<&str> = text.split("\n---\n").filter(|doc| doc.contains("\nkind: MutatingAdmissionPolicy")).collect();
    if policy.len() != 2 {
        bail!("deploy/plugdb.yaml holds {} of the policy's two objects (MutatingAdmissionPolicy and its binding)", policy.len());
    }
    crate::apply_yaml(client, "plugdb-admin", &policy.join("\n---\n")).await.context("applying the finalizer policy")?;
    let probe: Database = serde_json::from_value(serde_json::json!({
        "apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": "finalizer-policy-probe", "namespace": "default"},
        "spec": {"engine": "postgres", "storage": "1Gi"},
    }))?;
    let dbs: Api<Database> = Api::namespaced(client.clone(), "default");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let created = dbs.create(&PostParams { dry_run: true, ..Default::default() }, &probe).await;
        if created.is_ok_and(|db| db.metadata.finalizers.iter().flatten().any(|f| f == reconcile::FINALIZER)) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the API server did not act on the finalizer policy within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The whole operator (`operator::run`: plugin registry, reconciler, no leader
/// election) in this process against the cluster behind `kubeconfig`; stopped when
/// dropped.
pub struct InProcess {
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl InProcess {
    /// Starts it with `settings`.
    pub async fn start(kubeconfig: &std::path::Path, settings: Settings) -> Result<Self> {
        let (client, _) = counting_client(kubeconfig).await?;
        let metrics = Arc::new(Metrics::default());
        // The object store these tests run is on loopback: this operator is told it may
        // reach it (a tenant's endpoint there is refused by default).
        let loopback = "127.0.0.0/8".parse().map_err(anyhow::Error::msg)?;
        let egress = plugdb::egress::Policy::new(Vec::new(), vec![loopback], Vec::new());
        let options = plugdb::operator::Options { settings, egress, ..Default::default() };
        let health = plugdb::health::Health::default();
        let task = tokio::spawn(plugdb::operator::run(client, metrics.clone(), options, health, std::future::pending()));
        Ok(Self { metrics, task })
    }

    /// The sum of metric `name` over the label sets `keep` accepts.
    pub fn metric(&self, name: &str, keep: impl Fn(&str) -> bool) -> f64 {
        metric_sum(&self.metrics.encode(), name, keep)
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until `check` holds, looking every 100 ms; panics naming `what` after `timeout`.
pub async fn wait_for(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !check().await {
        assert!(std::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reconciler timings for tests: fast requeues, failover after 4 s (two probes that time
/// out on a busy machine make a primary not ready, and two more must for a failover).
pub fn test_settings() -> Settings {
    Settings {
        failover_after: Duration::from_secs(4),
        progress_requeue: Duration::from_millis(300),
        idle_requeue: Duration::from_secs(300),
        ..Settings::default()
    }
}

impl Cluster {
    /// Starts the operator on `backing`, installs the CRD and loads `plugins` (engine,
    /// component), with fast test timings.
    pub async fn on(backing: Backing, plugins: &[(&str, &str)]) -> Result<Self> {
        Self::with_settings(backing, plugins, test_settings()).await
    }

    /// [`Cluster::on`], the operator's reconciler with `settings` (the benchmarks': its
    /// defaults).
    pub async fn with_settings(backing: Backing, plugins: &[(&str, &str)], settings: Settings) -> Result<Self> {
        let client = match &backing {
            Backing::ControlPlane(cp) => cp.client.clone(),
            Backing::Node(node) => node.client.clone(),
        };
        prepare(&client, plugins).await?;

        // The operator gets a client of its own whose requests are counted.
        let (operator_client, requests) = counting_client(backing.kubeconfig()).await?;

        let operator = std::sync::Mutex::new(Operator::start(&client, &operator_client, &backing, settings.clone())?);
        let cluster = Self { client, operator_client, requests, operator, settings, backing };
        for (engine, _) in plugins {
            cluster.wait_engine(engine).await?;
        }
        Ok(cluster)
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Operator> {
        self.operator.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The metrics of the operator running now.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.current().metrics.clone()
    }

    /// Waits until the operator has loaded `engine`'s plugin.
    pub async fn wait_engine(&self, engine: &str) -> Result<()> {
        self.wait_until(&format!("engine {engine} loaded"), Duration::from_secs(60), || self.current().registry.get(engine).is_some()).await
    }

    /// Stops the operator and starts a fresh one (new registry, caches and metrics), as
    /// a restarted pod would be; its requests go on being counted in `requests`.
    pub fn restart_operator(&self) -> Result<()> {
        let fresh = Operator::start(&self.client, &self.operator_client, &self.backing, self.settings.clone())?;
        drop(std::mem::replace(&mut *self.current(), fresh));
        Ok(())
    }

    /// Stops the in-process operator until [`Cluster::restart_operator`], so that
    /// another (the `plugdb` binary, say) is the only one reconciling.
    pub fn stop_operator(&self) {
        let mut current = self.current();
        current.tasks.drain(..).for_each(|t| t.abort());
    }

    /// Reconciles the operator has run so far, of Databases of `engine`.
    pub fn reconciles(&self, engine: &str) -> u64 {
        self.current().metrics.reconciles.get_or_create(&ReconcileLabels { engine: engine.into() }).get()
    }

    /// Polls `check` every 100 ms until it holds or `timeout` ends.
    pub async fn wait_until(&self, what: &str, timeout: Duration, mut check: impl FnMut() -> bool) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        while !check() {
            if tokio::time::Instant::now() > deadline {
                bail!("timed out after {timeout:?} waiting until {what}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Applies a Database from JSON (`metadata` + `spec`) in `namespace`, creating the namespace.
    pub async fn apply_database(&self, namespace: &str, db: serde_json::Value) -> Result<Database> {
        crate::release::note(namespace);
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        if namespaces.get_opt(namespace).await?.is_none() {
            let made = namespaces
                .create(
                    &PostParams::default(),
                    &Namespace { metadata: ObjectMeta { name: Some(namespace.into()), ..Default::default() }, ..Default::default() },
                )
                .await;
            match made {
                // Made a moment ago by a Database applied beside this one.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                other => drop(other?),
            }
        }
        let mut object = db;
        object["apiVersion"] = "plugdb.io/v1alpha1".into();
        object["kind"] = "Database".into();
        let name = object["metadata"]["name"].as_str().context("metadata.name")?.to_string();
        let api: Api<Database> = Api::namespaced(self.client.clone(), namespace);
        Ok(api.patch(&name, &PatchParams::apply("test").force(), &Patch::Apply(&object)).await?)
    }

    /// Waits until the Database satisfies `check`, returning it; the error shows its last status.
    pub async fn wait_database(
        &self,
        namespace: &str,
        name: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Database) -> bool,
    ) -> Result<Database> {
        let api: Api<Database> = Api::namespaced(self.client.clone(), namespace);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let db = api.get_opt(name).await?;
            if let Some(db) = &db
                && check(db)
            {
                return Ok(db.clone());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("timed out waiting until {what}; last seen: {}", serde_json::to_string_pretty(&db.map(|d| d.status))?);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
