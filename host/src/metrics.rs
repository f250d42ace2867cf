//! Prometheus metrics of the operator, served at `/metrics`.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of plugin load outcomes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoadLabels {
    /// Engine the ConfigMap is labelled for (or the ConfigMap name when unknown).
    pub engine: String,
    /// `loaded`, `unchanged`, `rejected` or `unloaded`.
    pub outcome: String,
}

/// Labels of the plugin serving an engine.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServingLabels {
    /// The engine.
    pub engine: String,
    /// `name@version` of the plugin.
    pub plugin: String,
    /// The SHA-256 of its component.
    pub sha256: String,
    /// Where it came from: `configmap/<name>` or `bundled/<file>`.
    pub source: String,
}

/// Labels of plugin calls.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// Engine of the plugin.
    pub engine: String,
    /// Exported function.
    pub function: String,
    /// `ok`, `refused`, `timeout`, `trap`, `too-large` or `policy`.
    pub outcome: String,
}

/// Labels of answers from the memo of plugin calls.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemoLabels {
    /// Engine of the plugin.
    pub engine: String,
    /// `hit` (answered without a call) or `miss` (a call was made).
    pub outcome: String,
}

/// Labels of reconciles.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// Engine of the Database.
    pub engine: String,
}

/// Labels of a Database's member.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MemberLabels {
    /// The Database's namespace.
    pub namespace: String,
    /// The Database.
    pub database: String,
    /// The member's pod.
    pub member: String,
}

/// Labels of a Database. Its series share one copy of each (`Arc<str>`): a scrape reads
/// them once per series, and at 10,000 Databases a copy per series is more than the
/// processor's caches hold.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DatabaseLabels {
    /// Its namespace.
    pub namespace: Arc<str>,
    /// Its name.
    pub database: Arc<str>,
    /// Its engine.
    pub engine: Arc<str>,
}

/// Labels of a Database's condition, or its phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DatabaseStateLabels {
    /// Its namespace.
    pub namespace: Arc<str>,
    /// Its name.
    pub database: Arc<str>,
    /// Its engine.
    pub engine: Arc<str>,
    /// The condition's type (`Ready`, `Degraded`, `BackupHealthy`, …), or the phase.
    pub state: &'static str,
}

impl DatabaseLabels {
    /// `db`'s.
    fn of(db: &crate::crd::Database) -> Self {
        use kube::ResourceExt;
        let namespace = db.namespace().unwrap_or_default();
        DatabaseLabels { namespace: namespace.into(), database: db.name_any().into(), engine: db.spec.engine.as_str().into() }
    }

    /// The same, for its `state`.
    fn with(&self, state: &'static str) -> DatabaseStateLabels {
        let DatabaseLabels { namespace, database, engine } = self.clone();
        DatabaseStateLabels { namespace, database, engine, state }
    }
}

/// Labels of Kubernetes API requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `watch` for watches, else the HTTP method in lower case (`get`, `post`, `patch`, ...).
    pub verb: String,
    /// The resource, with its subresource if any: `statefulsets`, `databases/status`.
    pub resource: String,
}

/// The resource a request path addresses: `/apis/apps/v1/namespaces/shop/statefulsets/orders`
/// → `statefulsets`, `/apis/plugdb.io/v1alpha1/namespaces/shop/databases/orders/status` →
/// `databases/status`.
pub fn resource_of(path: &str) -> String {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.first() {
        Some(&"api") => segments.get(2..),
        Some(&"apis") => segments.get(3..),
        _ => None,
    }
    .unwrap_or_default();
    let rest = match rest {
        ["namespaces", _, resource, more @ ..] => std::iter::once(*resource).chain(more.iter().copied()).collect::<Vec<_>>(),
        other => other.to_vec(),
    };
    match rest.as_slice() {
        [] => "other".into(),
        [resource] | [resource, _] => (*resource).into(),
        [resource, _, sub, ..] => format!("{resource}/{sub}"),
    }
}

/// All metrics of the operator.
pub struct Metrics {
    registry: Registry,
    /// Plugin loads by outcome.
    pub plugin_loads: Family<LoadLabels, Counter>,
    /// Engines currently loaded.
    pub plugins_loaded: Gauge,
    /// The plugin serving each engine (1 per engine), and where it came from.
    pub plugin_serving: Family<ServingLabels, Gauge>,
    /// Loaded engines whose optimised build serves (the rest serve their quick build).
    pub plugins_optimized: Gauge,
    /// Plugin calls by outcome.
    pub plugin_calls: Family<CallLabels, Counter>,
    /// Plugin calls answered from the memo (hit) or made (miss).
    pub plugin_memo: Family<MemoLabels, Counter>,
    /// Plugin log lines dropped, by engine: the engine logged more than its allowance.
    pub plugin_log_lines_dropped: Family<ReconcileLabels, Counter>,
    /// Reconciles by engine.
    pub reconciles: Family<ReconcileLabels, Counter>,
    /// Failed reconciles by engine.
    pub reconcile_errors: Family<ReconcileLabels, Counter>,
    /// Reconciles that ended early, to come back, because their engine's plugin calls
    /// were queued full or a slow call went on without them.
    pub reconciles_busy: Family<ReconcileLabels, Counter>,
    /// Reconcile durations in seconds by engine.
    pub reconcile_seconds: Family<ReconcileLabels, Histogram>,
    /// Requests made to the Kubernetes API by verb and resource.
    pub api_requests: Family<RequestLabels, Counter>,
    /// Entries of per-Database state the reconciler keeps (recent writes, failure counts).
    pub reconcile_state_entries: Gauge,
    /// 1 while this operator leads (it reconciles), 0 while it waits to.
    pub leading: Gauge,
    /// Times this operator became the leader.
    pub leadership_acquired: Counter,
    /// How far behind its primary each replica last said it was, while it knows.
    member_lag_seconds: Family<MemberLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// When each member's agent last answered the operator.
    member_heard: Family<MemberLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Each Database's phase (1, the one it is in) and conditions (1 True, 0 False), its
    /// members, backups and what a restore reaches, as its status last said.
    databases: DatabaseSeries,
    /// The length of the last scrape's answer.
    last_scrape: std::sync::atomic::AtomicUsize,
}

/// The series of each Database, from its status.
#[derive(Default)]
struct DatabaseSeries {
    phase: Family<DatabaseStateLabels, Gauge>,
    condition: Family<DatabaseStateLabels, Gauge>,
    anomaly: Family<DatabaseStateLabels, Gauge>,
    members_desired: Family<DatabaseLabels, Gauge>,
    members_ready: Family<DatabaseLabels, Gauge>,
    member_nodes: Family<DatabaseLabels, Gauge>,
    backup_interval: Family<DatabaseLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    last_backup: Family<DatabaseLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    recoverable_from: Family<DatabaseLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    recoverable_to: Family<DatabaseLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    promotions: Family<DatabaseStateLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("plugdb");
        let plugin_loads = Family::<LoadLabels, Counter>::default();
        let plugins_loaded = Gauge::default();
        let plugins_optimized = Gauge::default();
        let plugin_serving = Family::<ServingLabels, Gauge>::default();
        let plugin_calls = Family::<CallLabels, Counter>::default();
        let plugin_memo = Family::<MemoLabels, Counter>::default();
        let plugin_log_lines_dropped = Family::<ReconcileLabels, Counter>::default();
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        let reconcile_errors = Family::<ReconcileLabels, Counter>::default();
        let reconciles_busy = Family::<ReconcileLabels, Counter>::default();
        let reconcile_seconds =
            Family::<ReconcileLabels, Histogram>::new_with_constructor(|| Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0]));
        registry.register("plugin_loads", "Plugin loads from ConfigMaps by outcome", plugin_loads.clone());
        registry.register("plugins_loaded", "Engine plugins currently loaded", plugins_loaded.clone());
        registry.register(
            "plugin_serving",
            "The plugin serving each engine: its version, digest and source (a ConfigMap, or bundled with the operator)",
            plugin_serving.clone(),
        );
        registry.register(
            "plugins_optimized",
            "Loaded engine plugins served by their optimised build (the others by their quick build, until it is ready)",
            plugins_optimized.clone(),
        );
        registry.register("plugin_calls", "Plugin calls by function and outcome", plugin_calls.clone());
        registry.register("plugin_memo", "Plugin calls answered from remembered results (hit) or made (miss)", plugin_memo.clone());
        registry.register(
            "plugin_log_lines_dropped",
            "Plugin log lines dropped by engine: the engine logged more than its allowance of bytes over time",
            plugin_log_lines_dropped.clone(),
        );
        registry.register("reconciles", "Reconciles by engine", reconciles.clone());
        registry.register("reconcile_errors", "Failed reconciles by engine", reconcile_errors.clone());
        registry.register(
            "reconciles_busy",
            "Reconciles by engine that ended early, to come back, because the engine's plugin calls were queued full or a slow call went on without them",
            reconciles_busy.clone(),
        );
        registry.register("reconcile_duration_seconds", "Reconcile durations by engine", reconcile_seconds.clone());
        let api_requests = Family::<RequestLabels, Counter>::default();
        registry.register("api_requests", "Requests made to the Kubernetes API by verb and resource", api_requests.clone());
        let reconcile_state_entries = Gauge::default();
        registry.register(
            "reconcile_state_entries",
            "Entries of per-Database state the reconciler keeps (recent writes, failure counts); dropped with the Database",
            reconcile_state_entries.clone(),
        );
        let (leading, leadership_acquired) = (Gauge::default(), Counter::default());
        registry.register("leader", "1 while this operator leads (reconciles), 0 while it waits to", leading.clone());
        registry.register("leadership_acquired", "Times this operator became the leader", leadership_acquired.clone());
        let member_lag_seconds = Family::<MemberLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "member_lag_seconds",
            "How far behind its primary each replica said it was when its agent last answered (no series while it does not know)",
            member_lag_seconds.clone(),
        );
        let member_heard = Family::<MemberLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register(
            "member_last_heard_timestamp_seconds",
            "When each member's agent last answered the operator (Unix time)",
            member_heard.clone(),
        );
        let databases = DatabaseSeries::default();
        registry.register("database_phase", "Each Database's phase: 1 for the one it is in (state)", databases.phase.clone());
        registry.register(
            "database_condition",
            "Each Database's conditions by type (state): 1 True, 0 False, no series while unknown",
            databases.condition.clone(),
        );
        registry.register(
            "database_anomaly",
            "1 for the anomaly (state: the Anomaly condition's reason) each Database names first; no series while it names none",
            databases.anomaly.clone(),
        );
        registry.register("database_members_desired", "The members each Database's spec asks for", databases.members_desired.clone());
        registry.register("database_members_ready", "Each Database's members whose pods are ready", databases.members_ready.clone());
        registry.register(
            "database_member_nodes",
            "The nodes each Database's ready members run on (fewer than its members: some share a node)",
            databases.member_nodes.clone(),
        );
        let times = [
            (
                "database_backup_interval_seconds",
                "How often each Database's backup schedule fires (between its next two fire times)",
                &databases.backup_interval,
            ),
            (
                "database_last_backup_timestamp_seconds",
                "When each Database's most recent successful backup completed (Unix time)",
                &databases.last_backup,
            ),
            (
                "database_recoverable_from_timestamp_seconds",
                "The earliest moment a restore of each Database reaches (Unix time)",
                &databases.recoverable_from,
            ),
            (
                "database_recoverable_to_timestamp_seconds",
                "The latest moment a restore of each Database reaches (Unix time)",
                &databases.recoverable_to,
            ),
        ];
        for (name, help, family) in times {
            registry.register(name, help, family.clone());
        }
        registry.register(
            "database_promotions",
            "Members promoted to lead each Database, by failover or switchover (state), since the operator started",
            databases.promotions.clone(),
        );
        Self {
            databases,
            registry,
            plugin_loads,
            plugins_loaded,
            plugin_serving,
            plugins_optimized,
            plugin_calls,
            plugin_memo,
            plugin_log_lines_dropped,
            reconciles,
            reconcile_errors,
            reconciles_busy,
            reconcile_seconds,
            api_requests,
            reconcile_state_entries,
            leading,
            leadership_acquired,
            member_lag_seconds,
            member_heard,
            last_scrape: Default::default(),
        }
    }
}

impl Metrics {
    /// Says what member `member` of Database `namespace/database` said `at` (Unix
    /// seconds), when its agent answered: its lag, while it knows one. `None` (it is
    /// gone) removes its series.
    pub fn member_said(&self, namespace: &str, database: &str, member: &str, said: Option<(Option<std::time::Duration>, f64)>) {
        let labels = MemberLabels { namespace: namespace.into(), database: database.into(), member: member.into() };
        match said {
            Some((lag, at)) => {
                self.member_heard.get_or_create(&labels).set(at);
                match lag {
                    Some(lag) => drop(self.member_lag_seconds.get_or_create(&labels).set(lag.as_secs_f64())),
                    None => drop(self.member_lag_seconds.remove(&labels)),
                }
            }
            None => {
                self.member_lag_seconds.remove(&labels);
                self.member_heard.remove(&labels);
            }
        }
    }

    /// Sets Database `db`'s series from its spec and `status`; `None` (it is gone)
    /// removes them. Bounded: a series per phase it is in, per condition it has, and one
    /// each for its members, backups and recoverable window.
    pub fn database(&self, db: &crate::crd::Database, status: Option<&crate::crd::DatabaseStatus>) {
        let labels = DatabaseLabels::of(db);
        let state = |state: &'static str| labels.with(state);
        let series = &self.databases;
        let phase = status.and_then(|s| s.phase);
        for other in crate::crd::Phase::ALL.into_iter().filter(|p| Some(*p) != phase) {
            series.phase.remove(&state(other.as_str()));
        }
        if let Some(phase) = phase {
            series.phase.get_or_create(&state(phase.as_str())).set(1);
        }
        let conditions = status.map(|s| s.conditions.as_slice()).unwrap_or_default();
        for known in crate::reconcile::status::ConditionType::ALL.iter().map(|t| t.as_str()) {
            let value = match conditions.iter().find(|c| c.type_ == known).map(|c| c.status.as_str()) {
                Some("True") => Some(1),
                Some("False") => Some(0),
                _ => None,
            };
            match value {
                Some(value) => {
                    series.condition.get_or_create(&state(known)).set(value);
                }
                None => {
                    series.condition.remove(&state(known));
                }
            }
        }
        let anomaly =
            conditions.iter().find(|c| c.type_ == crate::reconcile::status::ConditionType::Anomaly.as_str() && c.status == "True");
        let anomaly = anomaly.map(|c| c.reason.as_str());
        for kind in crate::reconcile::decide::ANOMALIES.iter().map(|r| r.as_str()) {
            match Some(kind) == anomaly {
                true => drop(series.anomaly.get_or_create(&state(kind)).set(1)),
                false => drop(series.anomaly.remove(&state(kind))),
            }
        }
        let time =
            |at: Option<&str>| at.and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok()).map(|t| t.as_millisecond() as f64 / 1000.0);
        let recoverable = status.and_then(|s| s.recoverable.as_ref());
        let backups = db.spec.backup.as_ref().filter(|b| b.enabled && status.is_some());
        let interval = backups.and_then(|b| crate::schedule::interval(&crate::schedule::parse(&b.schedule).ok()?, chrono::Utc::now()));
        let times = [
            (&series.backup_interval, interval.map(|i| i.as_secs_f64())),
            (&series.last_backup, time(status.and_then(|s| s.last_backup.as_ref()?.completed.as_deref()))),
            (&series.recoverable_from, time(recoverable.and_then(|r| r.first.as_deref()))),
            (&series.recoverable_to, time(recoverable.and_then(|r| r.last.as_deref()))),
        ];
        for (family, at) in times {
            match at {
                Some(at) => {
                    family.get_or_create(&labels).set(at);
                }
                None => {
                    family.remove(&labels);
                }
            }
        }
        match status {
            Some(status) => {
                series.members_desired.get_or_create(&labels).set(i64::from(db.spec.replicas));
                series.members_ready.get_or_create(&labels).set(i64::from(status.ready_replicas.unwrap_or_default()));
                let mut nodes: Vec<&str> = status.members.iter().filter(|m| m.ready).filter_map(|m| m.node.as_deref()).collect();
                nodes.sort_unstable();
                nodes.dedup();
                series.member_nodes.get_or_create(&labels).set(nodes.len() as i64);
                // From 0, so that the first promotion is an increase.
                for how in ["failover", "switchover"] {
                    let _ = series.promotions.get_or_create(&state(how));
                }
            }
            None => {
                series.members_desired.remove(&labels);
                series.members_ready.remove(&labels);
                series.member_nodes.remove(&labels);
                for how in ["failover", "switchover"] {
                    series.promotions.remove(&state(how));
                }
            }
        }
    }

    /// Counts a member promoted to lead Database `db`: `how` is `failover` or `switchover`.
    pub fn promoted(&self, db: &crate::crd::Database, how: &'static str) {
        self.databases.promotions.get_or_create(&DatabaseLabels::of(db).with(how)).inc();
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        // As long as the last scrape: no copy of a long answer as it grows.
        let mut out = String::with_capacity(self.last_scrape.load(std::sync::atomic::Ordering::Relaxed));
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        self.last_scrape.store(out.len(), std::sync::atomic::Ordering::Relaxed);
        out
    }

    /// A client for `config` whose requests are counted in `api_requests`.
    pub fn counted_client(self: &Arc<Self>, config: kube::Config) -> Result<kube::Client, kube::Error> {
        let metrics = self.clone();
        let layer = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
            let watch = req.method() == http::Method::GET && req.uri().query().is_some_and(|q| q.split('&').any(|p| p == "watch=true"));
            let verb = if watch { "watch".to_string() } else { req.method().as_str().to_ascii_lowercase() };
            tracing::trace!(%verb, path = req.uri().path(), "API request");
            metrics.api_requests.get_or_create(&RequestLabels { verb, resource: resource_of(req.uri().path()) }).inc();
            req
        });
        Ok(kube::client::ClientBuilder::try_from(config)?.with_layer(&layer).build())
    }

    /// Counts one plugin load outcome.
    pub fn plugin_load(&self, engine: &str, outcome: &str) {
        self.plugin_loads.get_or_create(&LoadLabels { engine: engine.into(), outcome: outcome.into() }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::resource_of;

    #[test]
    fn a_members_lag_is_a_series_while_it_is_known_and_when_it_was_heard_while_it_is() {
        let metrics = super::Metrics::default();
        metrics.member_said("shop", "orders", "orders-1", Some((Some(std::time::Duration::from_millis(2500)), 1_800_000_000.0)));
        let labels = r#"{namespace="shop",database="orders",member="orders-1"}"#;
        let (lag, heard) =
            (format!("plugdb_member_lag_seconds{labels} 2.5"), format!("plugdb_member_last_heard_timestamp_seconds{labels} 1800000000.0"));
        assert!(metrics.encode().contains(&lag) && metrics.encode().contains(&heard), "{}", metrics.encode());
        metrics.member_said("shop", "orders", "orders-1", Some((None, 1_800_000_030.0)));
        assert!(!metrics.encode().contains("plugdb_member_lag_seconds{"), "no lag once it does not know: {}", metrics.encode());
        assert!(metrics.encode().contains(&format!("plugdb_member_last_heard_timestamp_seconds{labels} 1800000030.0")));
        metrics.member_said("shop", "orders", "orders-1", None);
        assert!(!metrics.encode().contains("orders-1"), "gone with the member");
    }

    /// A Database's series follow its status: the phase it is in alone, each condition
    /// it has, its members, its backups' schedule, last backup and recoverable window,
    /// and its promotions; all go with it.
    #[test]
    fn a_databases_series_follow_its_status_and_go_with_it() {
        let metrics = super::Metrics::default();
        let db: crate::crd::Database = serde_json::from_value(serde_json::json!({
            "apiVersion": "plugdb.io/v1alpha1", "kind": "Database",
            "metadata": {"name": "orders", "namespace": "shop"},
            "spec": {"engine": "postgres", "storage": "1Gi", "replicas": 3, "backup": {"schedule": "0 2 * * *"}},
            "status": {
                "phase": "Creating",
                "readyReplicas": 2,
                "members": [
                    {"pod": "orders-0", "node": "a", "role": "primary", "ready": true},
                    {"pod": "orders-1", "node": "a", "role": "replica", "ready": true},
                    {"pod": "orders-2", "node": "b", "role": "replica", "ready": false},
                ],
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "MembersStarting", "message": "", "lastTransitionTime": "2027-01-15T08:00:00Z"},
                    {"type": "BackupHealthy", "status": "True", "reason": "BackupSucceeded", "message": "", "lastTransitionTime": "2027-01-15T08:00:00Z"},
                    {"type": "Anomaly", "status": "True", "reason": "LongTransaction", "message": "", "lastTransitionTime": "2027-01-15T08:00:00Z"},
                ],
                "lastBackup": {"name": "orders-2701150200", "completed": "2027-01-15T02:00:30Z"},
                "recoverable": {"backups": 1, "first": "2027-01-15T02:00:30Z", "last": "2027-01-15T08:00:00Z"},
            },
        }))
        .expect("a Database");
        metrics.database(&db, db.status.as_ref());
        metrics.promoted(&db, "failover");
        let labels = r#"namespace="shop",database="orders",engine="postgres""#;
        let encoded = metrics.encode();
        for line in [
            format!("plugdb_database_phase{{{labels},state=\"Creating\"}} 1"),
            format!("plugdb_database_condition{{{labels},state=\"Ready\"}} 0"),
            format!("plugdb_database_condition{{{labels},state=\"BackupHealthy\"}} 1"),
            format!("plugdb_database_members_desired{{{labels}}} 3"),
            format!("plugdb_database_members_ready{{{labels}}} 2"),
            // Its two ready members share node a.
            format!("plugdb_database_member_nodes{{{labels}}} 1"),
            format!("plugdb_database_backup_interval_seconds{{{labels}}} 86400.0"),
            format!("plugdb_database_last_backup_timestamp_seconds{{{labels}}} 1799978430.0"),
            format!("plugdb_database_recoverable_to_timestamp_seconds{{{labels}}} 1800000000.0"),
            format!("plugdb_database_promotions_total{{{labels},state=\"failover\"}} 1"),
            format!("plugdb_database_promotions_total{{{labels},state=\"switchover\"}} 0"),
            format!("plugdb_database_anomaly{{{labels},state=\"LongTransaction\"}} 1"),
        ] {
            assert!(encoded.lines().any(|l| l == line), "{line} in {encoded}");
        }
        assert!(!encoded.contains(r#"state="Degraded""#), "no series for a condition it does not have: {encoded}");
        let mut running = db.status.clone().expect("status");
        running.phase = Some(crate::crd::Phase::Running);
        running.conditions.retain(|c| c.type_ != "Anomaly");
        metrics.database(&db, Some(&running));
        let encoded = metrics.encode();
        assert!(!encoded.contains("plugdb_database_anomaly{"), "no anomaly named, no series: {encoded}");
        assert!(encoded.contains(r#"state="Running"} 1"#) && !encoded.contains(r#"state="Creating""#), "one phase: {encoded}");
        metrics.database(&db, None);
        assert!(!metrics.encode().contains(r#"database="orders""#), "gone with it: {}", metrics.encode());
    }

    #[test]
    fn request_paths_name_their_resource() {
        assert_eq!(resource_of("/apis/apps/v1/namespaces/shop/statefulsets/orders"), "statefulsets");
        assert_eq!(resource_of("/apis/apps/v1/statefulsets"), "statefulsets");
        assert_eq!(resource_of("/api/v1/namespaces/shop/secrets"), "secrets");
        assert_eq!(resource_of("/apis/plugdb.io/v1alpha1/namespaces/shop/databases/orders/status"), "databases/status");
        assert_eq!(resource_of("/api/v1/namespaces/shop"), "namespaces");
        assert_eq!(resource_of("/version"), "other");
    }
}
