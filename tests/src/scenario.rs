//! What the real-node scenarios and the node benchmark share: Databases as a user
//! writes them, SQL sent to the real servers through their Services (from inside the
//! node's network namespace, where Service and pod addresses live), and the failures
//! they strike the primary with.

use std::time::Duration;

use crate::node::Nodes;
use crate::operator::Cluster;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use plugdb::crd::Database;
use serde_json::json;

/// The database the scenarios' tables live in: the application's.
const SCHEMA: &str = "app";

/// The user a scenario's client logs in as over the network, and the credentials Secret
/// key of its password: the application's (the administrator logs in from its own
/// member alone).
const LOGIN: (&str, &str) = ("app", "app-password");

/// How long a Database may take to reach a state on the real node.
pub const WAIT: Duration = Duration::from_secs(240);

/// The longest one SQL statement of a scenario may take.
pub const QUERY_LIMIT: Duration = WAIT;

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

    /// The engine's server binary, as its process is named.
    pub fn binary(self) -> &'static str {
        match self {
            Engine::Postgres => "postgres",
            Engine::Mysql => "mariadbd",
        }
    }

    /// The port its server listens on.
    pub fn port(self) -> u16 {
        match self {
            Engine::Postgres => 5432,
            Engine::Mysql => 3306,
        }
    }

    /// The credentials Secret key of the administrator's password.
    pub fn password_key(self) -> &'static str {
        match self {
            Engine::Postgres => "superuser-password",
            Engine::Mysql => "root-password",
        }
    }

    fn administrator(self) -> &'static str {
        match self {
            Engine::Postgres => "postgres",
            Engine::Mysql => "root",
        }
    }
}

/// A Database manifest: `replicas` members of `engine` at `version`, with small
/// requests so that several fit the node, plus `extra` spec fields.
pub fn database(name: &str, engine: Engine, version: &str, replicas: i32, extra: serde_json::Value) -> serde_json::Value {
    let mut spec = json!({
        "engine": engine.name(), "version": version, "replicas": replicas, "storage": "1Gi",
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
    s.phase == Some(plugdb::crd::Phase::Running) && s.ready_replicas == Some(replicas) && s.observed_generation == db.metadata.generation
}

/// A client of one Database's engine, authenticated with the passwords in its Secret.
pub struct Client {
    engine: Engine,
    password: String,
    administrator_password: String,
    namespace: String,
    name: String,
    kube: kube::Client,
}

impl Client {
    /// The Database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A client for Database `name` in `namespace`, with the passwords its credentials Secret holds.
    pub async fn new(cluster: &Cluster, engine: Engine, namespace: &str, name: &str) -> Self {
        let secret = Api::<Secret>::namespaced(cluster.client.clone(), namespace)
            .get(&format!("{name}-credentials"))
            .await
            .expect("the credentials Secret");
        let data = secret.data.expect("data");
        let password = |key: &str| String::from_utf8(data[key].0.clone()).expect("a text password");
        Self {
            engine,
            password: password(LOGIN.1),
            administrator_password: password(engine.password_key()),
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

    /// Whether the server at `host` lets the application in (its database is there).
    async fn prepare(&self, host: &str) -> Result<(), String> {
        self.run(host, &self.password, Some(SCHEMA), "SELECT 1").await.map(drop)
    }

    /// Runs `sql` at `host` with `password`; the rows as text (tab-separated columns),
    /// or the client's error.
    pub async fn query_as(&self, host: &str, password: &str, sql: &str) -> Result<String, String> {
        self.run(host, password, Some(SCHEMA), sql).await
    }

    async fn run(&self, host: &str, password: &str, database: Option<&str>, sql: &str) -> Result<String, String> {
        self.run_as(Nodes::command, (LOGIN.0, password), host, database, sql).await
    }

    /// Runs `sql` as the engine's administrator inside member `pod`: from its own network
    /// namespace, over loopback (PostgreSQL's superuser logs in from nowhere else), in
    /// the scenarios' database.
    pub async fn administer(&self, pod: &Pod, sql: &str) -> Result<String, String> {
        let engine = pod.spec.as_ref().and_then(|s| s.containers.first()).map(|c| c.name.clone()).expect("an engine container");
        let pid = first_process(pod, &engine);
        let inside = |program: &str| {
            let mut c = std::process::Command::new("nsenter");
            c.arg(format!("--net=/proc/{pid}/ns/net")).arg(program);
            c
        };
        let administrator = (self.engine.administrator(), self.administrator_password.as_str());
        self.run_as(inside, administrator, "127.0.0.1", Some(SCHEMA), sql).await
    }

    /// Logs in at `host` as the engine's administrator, over the network: refused (the
    /// server's words) once every member keeps the administrator to itself.
    pub async fn administrator_over_the_network(&self, host: &str) -> Result<String, String> {
        let administrator = (self.engine.administrator(), self.administrator_password.as_str());
        self.run_as(Nodes::command, administrator, host, Some(SCHEMA), "SELECT 1").await
    }

    /// Runs `sql` at `host` from node `node`'s network (where a member on a node cut off
    /// from the others is still reached).
    pub async fn query_from(&self, node: &str, host: &str, sql: &str) -> Result<String, String> {
        let from = |program: &str| {
            let mut c = std::process::Command::new("nsenter");
            c.arg(format!("--net=/run/netns/{node}")).arg(program);
            c
        };
        self.run_as(from, (LOGIN.0, &self.password), host, Some(SCHEMA), sql).await
    }

    async fn run_as(
        &self,
        command: impl Fn(&str) -> std::process::Command,
        (user, password): (&str, &str),
        host: &str,
        database: Option<&str>,
        sql: &str,
    ) -> Result<String, String> {
        let mut command = match self.engine {
            Engine::Postgres => {
                let mut c = command("psql");
                c.arg(format!("host={host} user={user} dbname={SCHEMA} connect_timeout=5"))
                    .args(["-XAtq", "-v", "ON_ERROR_STOP=1", "-F", "\t", "-c", sql])
                    .env("PGPASSWORD", password);
                c
            }
            Engine::Mysql => {
                let mut c = command("mariadb");
                c.args(["-h", host, &format!("-u{user}"), "--connect-timeout=5", "-e", sql]).env("MYSQL_PWD", password);
                // Rows alone, but a vertical answer (`\G`) keeps its field names.
                if !sql.ends_with("\\G") {
                    c.args(["-N", "-B"]);
                }
                if let Some(database) = database {
                    c.arg(format!("--database={database}"));
                }
                c
            }
        };
        command.stdin(std::process::Stdio::null());
        let mut command = tokio::process::Command::from(command);
        // A statement may wait on purpose (a synchronous commit), never for ever: a client
        // still waiting after QUERY_LIMIT is stopped and that is its answer.
        let out = tokio::time::timeout(QUERY_LIMIT, command.kill_on_drop(true).output())
            .await
            .map_err(|_| format!("no answer within {QUERY_LIMIT:?}: the client was stopped"))?
            .map_err(|e| format!("running the client: {e}"))?;
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

    /// Runs `sql` at `host`, again while the client could not connect (it sent nothing)
    /// for up to 30 s: a busy node can take longer than the client's 5 s to answer a new
    /// connection. Any other error is the answer at once.
    async fn query_reaching(&self, host: &str, sql: &str) -> Result<String, String> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match self.query(host, sql).await {
                Err(e) if not_connected(&e) && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                answer => return answer,
            }
        }
    }

    /// Runs `sql` at `host` until it succeeds and `check` accepts its rows, for up to `timeout`.
    pub async fn eventually(&self, host: &str, sql: &str, timeout: Duration, check: impl Fn(&str) -> bool) -> String {
        accepted(&format!("{sql:?} at {host}"), timeout, || self.query(host, sql), check).await
    }

    /// [`Self::eventually`] as the administrator inside `pod` ([`Self::administer`]).
    pub async fn eventually_administered(&self, pod: &Pod, sql: &str, timeout: Duration, check: impl Fn(&str) -> bool) -> String {
        accepted(&format!("{sql:?} in {}", pod.name_any()), timeout, || self.administer(pod, sql), check).await
    }
}

/// Asks until the answer succeeds and `check` accepts its rows, for up to `timeout`.
async fn accepted<F: Future<Output = Result<String, String>>>(
    what: &str,
    timeout: Duration,
    ask: impl Fn() -> F,
    check: impl Fn(&str) -> bool,
) -> String {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = ask().await;
        if let Ok(rows) = &last
            && check(rows)
        {
            return rows.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: last answer {last:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Whether a client's error says it never reached the server (so it ran nothing).
fn not_connected(error: &str) -> bool {
    // psql: `connection to server at "…", port 5432 failed: …`; mariadb: ERROR 2002 or 2003.
    (error.contains("connection to server") && error.contains("failed")) || ["ERROR 2002", "ERROR 2003"].iter().any(|c| error.contains(c))
}

/// The pod's IP.
pub fn pod_ip(pod: &Pod) -> String {
    pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_else(|| panic!("{} has no IP", pod.name_any()))
}

/// The series of `pod`'s member agent: `GET /metrics` at the port its
/// `prometheus.io/port` annotation names.
pub async fn agent_series(pod: &Pod) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let name = pod.name_any();
    let port = pod.metadata.annotations.as_ref().and_then(|a| a.get("prometheus.io/port")?.parse::<u16>().ok());
    let port = port.unwrap_or_else(|| panic!("{name}: no metrics port annotated"));
    let mut stream = tokio::net::TcpStream::connect((pod_ip(pod).as_str(), port)).await.expect("the metrics port answers");
    stream.write_all(b"GET /metrics HTTP/1.0\r\nhost: member\r\n\r\n").await.expect("asked");
    let mut scraped = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut scraped)).await.expect("answered").expect("the series");
    scraped
}

/// The engine's series, as the chart's PodMonitor scrapes them from `pod`: `GET
/// /metrics` at its container port named `engine-metrics`, until a line of them is
/// `line` (`pg_up 1`), for a minute at most (the exporter starts beside the engine).
/// Panics, with what was scraped last, if it never is.
pub async fn engine_series(pod: &Pod, line: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let name = pod.name_any();
    let port = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("engine-metrics"))
        .map(|p| p.container_port)
        .unwrap_or_else(|| panic!("{name}: no port engine-metrics"));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut scraped = String::new();
        if let Ok(mut stream) = tokio::net::TcpStream::connect((pod_ip(pod).as_str(), port as u16)).await {
            let _ = stream.write_all(b"GET /metrics HTTP/1.0\r\nhost: member\r\n\r\n").await;
            let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut scraped)).await;
        }
        if scraped.lines().any(|l| l == line) {
            return scraped;
        }
        let tail: String = scraped.lines().filter(|l| !l.starts_with('#')).take(20).collect::<Vec<_>>().join("\n");
        assert!(std::time::Instant::now() < deadline, "{name}: the engine's series never said {line:?}: {tail}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Each member's pod UID and its container's restart count, by pod name.
pub fn identities(pods: &[Pod]) -> Vec<(String, String, i32)> {
    pods.iter()
        .map(|p| {
            let restarts =
                p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).map(|c| c.iter().map(|c| c.restart_count).sum()).unwrap_or(0);
            (p.name_any(), p.uid().unwrap_or_default(), restarts)
        })
        .collect()
}

impl Client {
    /// Waits until the server behind `host` answers (and has the scenarios' MariaDB
    /// database): kube-proxy programs a new Service's rules a moment after its members
    /// are ready, as any client of a new Database sees.
    pub async fn reachable(&self, host: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while let Err(e) = self.prepare(host).await {
            assert!(tokio::time::Instant::now() < deadline, "{host} does not answer: {e}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Creates the scenarios' table through `host` (the primary), once it answers.
    pub async fn create_table(&self, host: &str) {
        self.reachable(host).await;
        self.query_reaching(host, "CREATE TABLE IF NOT EXISTS orders (id INT PRIMARY KEY, item TEXT)")
            .await
            .expect("create through the primary");
    }

    /// Inserts rows `ids` through `host`.
    pub async fn insert(&self, host: &str, ids: std::ops::Range<i64>) {
        let values: Vec<String> = ids.map(|i| format!("({i}, 'item {i}')")).collect();
        self.query_reaching(host, &format!("INSERT INTO orders VALUES {}", values.join(", "))).await.expect("insert through the primary");
    }

    /// A checksum of every row of the scenarios' table at `host`.
    pub async fn checksum(&self, host: &str) -> String {
        let sql = match self.engine {
            Engine::Postgres => "SELECT count(*) || ' ' || md5(string_agg(id || ':' || item, ',' ORDER BY id)) FROM orders",
            Engine::Mysql => "SELECT CONCAT(COUNT(*), ' ', MD5(GROUP_CONCAT(CONCAT(id, ':', item) ORDER BY id SEPARATOR ','))) FROM orders",
        };
        self.query_reaching(host, sql).await.expect("checksum")
    }

    /// The ids in the scenarios' table at `host`.
    pub async fn ids(&self, host: &str) -> Result<Vec<i64>, String> {
        let rows = self.query(host, "SELECT id FROM orders ORDER BY id").await?;
        Ok(rows.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// The value of setting `name` as the server at `host` reports it.
    pub async fn setting(&self, host: &str, name: &str) -> Result<String, String> {
        match self.engine {
            Engine::Postgres => self.query(host, &format!("SHOW {name}")).await,
            Engine::Mysql => self.query(host, &format!("SELECT @@{name}")).await,
        }
    }

    /// Writes one row at a time through the primary Service, from `first`, until
    /// `stop` is set; returns the ids whose insert was acknowledged and the longest time
    /// without an acknowledged write.
    pub fn writer(
        self: &std::sync::Arc<Self>,
        first: i64,
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> tokio::task::JoinHandle<(Vec<i64>, Duration)> {
        let client = self.clone();
        tokio::spawn(async move {
            let host = client.service_ip(&client.name).await;
            let (mut acknowledged, mut id) = (Vec::new(), first);
            let (mut last, mut longest) = (tokio::time::Instant::now(), Duration::ZERO);
            // Until told to stop, or until the scenario that holds `stop` is gone.
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && std::sync::Arc::strong_count(&stop) > 1 {
                match client.query(&host, &format!("INSERT INTO orders VALUES ({id}, 'written during the change')")).await {
                    Ok(_) => {
                        acknowledged.push(id);
                        longest = longest.max(last.elapsed());
                        last = tokio::time::Instant::now();
                        id += 1;
                    }
                    // An insert that committed while its answer was lost in the failure:
                    // not acknowledged, but its id is taken.
                    Err(e) if e.contains("Duplicate entry") || e.contains("duplicate key value") => id += 1,
                    Err(_) => {}
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (acknowledged, longest)
        })
    }
}

/// The host path of the volume bound to claim `claim` (local-path volumes live on the node).
pub async fn volume_path(cluster: &Cluster, namespace: &str, claim: &str) -> std::path::PathBuf {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let pvc = Api::<PersistentVolumeClaim>::namespaced(cluster.client.clone(), namespace).get(claim).await.expect("claim");
    let volume = pvc.spec.and_then(|s| s.volume_name).expect("a bound claim");
    let pv = Api::<PersistentVolume>::all(cluster.client.clone()).get(&volume).await.expect("volume");
    let spec = pv.spec.expect("volume spec");
    let path = spec.host_path.map(|h| h.path).or(spec.local.map(|l| l.path)).expect("a node-local volume");
    path.into()
}

/// The size and the bytes in use of the engine's data volume in member `pod`, as `df`
/// in its engine container reads them (in the container's own mount namespace).
pub fn df_in(pod: &Pod) -> (u64, u64) {
    let spec = pod.spec.as_ref().expect("a pod spec");
    let engine = spec.containers.first().expect("an engine container");
    let mount = engine.volume_mounts.iter().flatten().find(|m| m.name == "data").expect("the engine mounts its data volume");
    let pid = first_process(pod, &engine.name);
    let out = std::process::Command::new("nsenter")
        .args(["--target", &pid.to_string(), "--mount", "df", "-B1", "--output=size,used", &mount.mount_path])
        .output()
        .expect("nsenter df");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let numbers: Vec<u64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    match numbers[..] {
        [size, used] => (size, used),
        _ => panic!("df in {}: {text} {}", pod.name_any(), String::from_utf8_lossy(&out.stderr)),
    }
}

/// Sends `signal` (`KILL`, `STOP`, `CONT`) to the engine's main process in `pod`, from
/// the node (as the kernel would on a crash or a hang): the oldest process named
/// `binary` in the pod's engine container (its first; the agent and archiver follow).
pub fn signal_engine(pod: &Pod, binary: &str, signal: &str) {
    let engine = pod.spec.as_ref().and_then(|s| s.containers.first()).map(|c| c.name.clone()).expect("an engine container");
    signal_container(pod, &engine, binary, signal)
}

/// The network namespace of `pod` (as its container `container`'s first process has it):
/// `nsenter --net=<this>` runs a client as that pod, from its address.
pub fn network_of(pod: &Pod, container: &str) -> String {
    let pid = first_process(pod, container);
    format!("/proc/{pid}/ns/net")
}

/// The first process of container `container` of `pod`, the one it started with (the
/// oldest: process ids wrap, and a short-lived one may have a lower one).
fn first_process(pod: &Pod, container: &str) -> u32 {
    oldest(processes(pod, container)).unwrap_or_else(|| panic!("no process in {}", pod.name_any()))
}

/// The process of `pids` started first.
fn oldest(pids: impl Iterator<Item = u32>) -> Option<u32> {
    let started = |pid: u32| -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
    };
    pids.filter_map(|pid| Some((started(pid)?, pid))).min().map(|(_, pid)| pid)
}

/// The processes of container `container` of `pod`.
fn processes(pod: &Pod, container: &str) -> impl Iterator<Item = u32> {
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == container))
        .and_then(|c| c.container_id.clone())
        .expect("a running container");
    let id = id.rsplit('/').next().unwrap_or_default().to_string();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(move |pid| std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(&id)))
}

/// What container `container` of `pod` has used: CPU seconds since it started and the
/// most memory it has held (its cgroup's `cpuacct.usage` and
/// `memory.max_usage_in_bytes`, cgroup v1), read from the node.
pub fn container_usage(pod: &Pod, container: &str) -> Option<(f64, u64)> {
    let pid = first_process(pod, container);
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = |controller: &str| {
        cgroups.lines().find_map(|l| {
            let (_, rest) = l.split_once(':')?;
            let (names, path) = rest.split_once(':')?;
            names.split(',').any(|n| n == controller).then(|| path.to_string())
        })
    };
    let read = |controller: &str, file: &str| -> Option<u64> {
        std::fs::read_to_string(format!("/sys/fs/cgroup/{controller}{}/{file}", path(controller)?)).ok()?.trim().parse().ok()
    };
    Some((read("cpuacct", "cpuacct.usage")? as f64 / 1e9, read("memory", "memory.max_usage_in_bytes")?))
}

/// The processes of the engine in container `container` of `pod`: every one but the
/// guard the engine runs under (`plugdb agent guard`), which only waits on it.
fn engine_processes(pod: &Pod, container: &str) -> Vec<String> {
    let guard = |pid: &u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "plugdb");
    processes(pod, container).filter(|pid| !guard(pid)).map(|p| p.to_string()).collect()
}

/// Sends `signal` to every process of the engine in container `container` of `pod`
/// (`STOP`: the whole engine hangs, its replication too).
pub fn signal_all(pod: &Pod, container: &str, signal: &str) {
    let pids = engine_processes(pod, container);
    assert!(!pids.is_empty(), "no process of the engine in {container} of {}", pod.name_any());
    let status = std::process::Command::new("kill").arg(format!("-{signal}")).args(&pids).status().expect("kill");
    assert!(status.success(), "kill -{signal} {pids:?}");
}

/// Lets what is left of the engine stopped by [`signal_all`] run again (SIGCONT); says
/// how many of its processes were still there to run.
pub fn resume_all(pod: &Pod, container: &str) -> usize {
    let pids = engine_processes(pod, container);
    if !pids.is_empty() {
        // One may end between the look and the signal: what is left runs again all the same.
        let _ = std::process::Command::new("kill").arg("-CONT").args(&pids).status();
    }
    pids.len()
}

/// Sends `signal` to the oldest process named `binary` in container `engine` of `pod`.
pub fn signal_container(pod: &Pod, engine: &str, binary: &str, signal: &str) {
    let named = |pid: &u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == binary);
    let pid = oldest(processes(pod, engine).filter(named)).unwrap_or_else(|| panic!("no {binary} process in {}", pod.name_any()));
    let status = std::process::Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status().expect("kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// A failure struck at the primary member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Its pod is deleted (the StatefulSet makes it again on the same volume).
    PodDeleted,
    /// Its engine's main process gets SIGKILL (the container restarts).
    EngineKilled,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Failure::PodDeleted => "the primary's pod deleted",
            Failure::EngineKilled => "kill -9 of the engine in the primary",
        })
    }
}

impl Client {
    /// Strikes `failure` at member 0 (the primary) and returns the time until a write
    /// through the primary Service is accepted again (probing every 200 ms).
    pub async fn strike(&self, failure: Failure) -> Duration {
        let pods: Api<Pod> = Api::namespaced(self.kube.clone(), &self.namespace);
        let primary = self.service_ip(&self.name).await;
        let pod_name = format!("{}-0", self.name);
        let struck = tokio::time::Instant::now();
        match failure {
            Failure::PodDeleted => {
                pods.delete(&pod_name, &kube::api::DeleteParams::default()).await.expect("delete the primary's pod");
            }
            Failure::EngineKilled => {
                let pod = pods.get(&pod_name).await.expect("the primary's pod");
                signal_engine(&pod, self.engine.binary(), "KILL");
            }
        }
        let mut probe = 0;
        loop {
            probe += 1;
            let sql = format!("INSERT INTO orders VALUES ({}, 'probe')", 2_000_000_000 - probe);
            // The first probes could reach the old process before the failure lands.
            if struck.elapsed() > Duration::from_secs(2) && self.query(&primary, &sql).await.is_ok() {
                return struck.elapsed();
            }
            assert!(struck.elapsed() < WAIT, "no write accepted after {failure}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
