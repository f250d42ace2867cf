//! What the scenarios share: Databases as a user writes them, waiting on real status,
//! and SQL sent to the real servers through their Services (from inside the node's
//! network namespace, where Service and pod addresses live).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use plugdb::crd::Database;
use plugdb_tests::node::Node;
use plugdb_tests::operator::Cluster;
use serde_json::json;

/// The MariaDB database the scenarios' tables live in.
const SCHEMA: &str = "plugdb";

/// How long a Database may take to reach a state on the real node.
pub const WAIT: Duration = Duration::from_secs(240);

/// The engines, as a client talks to them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// PostgreSQL (`psql`).
    Postgres,
    /// MariaDB (`mariadb`).
    Mysql,
}

impl Engine {
    /// The engine name in `spec.engine`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Postgres => "postgres",
            Engine::Mysql => "mysql",
        }
    }

    /// The credentials Secret key of the administrator's password.
    fn password_key(self) -> &'static str {
        match self {
            Engine::Postgres => "superuser-password",
            Engine::Mysql => "root-password",
        }
    }
}

/// A Database manifest: `replicas` members of `engine` at `version`, with small
/// requests so that several fit the node, plus `extra` spec fields.
pub fn database(name: &str, engine: Engine, version: &str, replicas: i32, extra: serde_json::Value) -> serde_json::Value {
    let mut spec = json!({
        "engine": engine.name(), "version": version, "replicas": replicas, "storage": {"size": "1Gi"},
        "resources": {"requests": {"cpu": "50m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    json!({"metadata": {"name": name}, "spec": spec})
}

/// Whether the Database reports `Running` with `replicas` ready for its current generation.
pub fn is_running(db: &Database, replicas: i32) -> bool {
    let s = db.status.clone().unwrap_or_default();
    s.phase.as_deref() == Some("Running") && s.ready_replicas == Some(replicas) && s.observed_generation == db.metadata.generation
}

/// A client of one Database's engine, authenticated with the password in its Secret.
pub struct Client {
    engine: Engine,
    password: String,
    namespace: String,
    name: String,
    kube: kube::Client,
}

impl Client {
    /// A client for Database `name` in `namespace`, with the password its credentials Secret holds.
    pub async fn new(cluster: &Cluster, engine: Engine, namespace: &str, name: &str) -> Self {
        let secret = Api::<Secret>::namespaced(cluster.client.clone(), namespace)
            .get(&format!("{name}-credentials"))
            .await
            .expect("the credentials Secret");
        let bytes = secret.data.expect("data")[engine.password_key()].0.clone();
        Self {
            engine,
            password: String::from_utf8(bytes).expect("a text password"),
            namespace: namespace.into(),
            name: name.into(),
            kube: cluster.client.clone(),
        }
    }

    /// The cluster IP of Service `service`.
    pub async fn service_ip(&self, service: &str) -> String {
        let svc = Api::<Service>::namespaced(self.kube.clone(), &self.namespace).get(service).await.expect("service");
        svc.spec.and_then(|s| s.cluster_ip).expect("a cluster IP")
    }

    /// The members' pods, by ordinal.
    pub async fn members(&self) -> Vec<Pod> {
        let selector = format!("app.kubernetes.io/instance={},app.kubernetes.io/managed-by=plugdb", self.name);
        let mut pods = Api::<Pod>::namespaced(self.kube.clone(), &self.namespace)
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("pods")
            .items;
        pods.retain(|p| p.owner_references().iter().any(|o| o.kind == "StatefulSet"));
        pods.sort_by_key(|p| p.name_any().rsplit('-').next().and_then(|o| o.parse::<u32>().ok()));
        pods
    }

    /// Makes what the scenarios' tables live in, through the primary at `host`: nothing
    /// for PostgreSQL (`public`), the database `plugdb` for MariaDB.
    pub async fn prepare(&self, host: &str) -> Result<(), String> {
        match self.engine {
            Engine::Postgres => Ok(()),
            Engine::Mysql => self.run(host, &self.password, None, &format!("CREATE DATABASE IF NOT EXISTS {SCHEMA}")).await.map(drop),
        }
    }

    /// Runs `sql` at `host` with `password`; the rows as text (tab-separated columns),
    /// or the client's error.
    pub async fn query_as(&self, host: &str, password: &str, sql: &str) -> Result<String, String> {
        self.run(host, password, Some(SCHEMA), sql).await
    }

    async fn run(&self, host: &str, password: &str, database: Option<&str>, sql: &str) -> Result<String, String> {
        let mut command = match self.engine {
            Engine::Postgres => {
                let mut c = Node::command("psql");
                c.arg(format!("host={host} user=postgres dbname=postgres connect_timeout=5"))
                    .args(["-XAtq", "-v", "ON_ERROR_STOP=1", "-F", "\t", "-c", sql])
                    .env("PGPASSWORD", password);
                c
            }
            Engine::Mysql => {
                let mut c = Node::command("mariadb");
                c.args(["-h", host, "-uroot", "--connect-timeout=5", "-N", "-B", "-e", sql]).env("MYSQL_PWD", password);
                if let Some(database) = database {
                    c.arg(format!("--database={database}"));
                }
                c
            }
        };
        command.stdin(std::process::Stdio::null());
        let out = tokio::process::Command::from(command).output().await.map_err(|e| format!("running the client: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// Runs `sql` at `host` with the Secret's password.
    pub async fn query(&self, host: &str, sql: &str) -> Result<String, String> {
        self.query_as(host, &self.password.clone(), sql).await
    }

    /// Runs `sql` at `host` until it succeeds and `check` accepts its rows, for up to `timeout`.
    pub async fn eventually(&self, host: &str, sql: &str, timeout: Duration, check: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let last = self.query(host, sql).await;
            if let Ok(rows) = &last
                && check(rows)
            {
                return rows.clone();
            }
            assert!(tokio::time::Instant::now() < deadline, "{sql:?} at {host}: last answer {last:?}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// The pod's IP.
pub fn pod_ip(pod: &Pod) -> String {
    pod.status.as_ref().and_then(|s| s.pod_ip.clone()).expect("a pod IP")
}
