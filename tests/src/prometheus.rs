//! A real Prometheus (Debian's package, unpacked once by `scripts/prometheus.sh`) for the
//! real-node scenarios, scraping what the chart's PodMonitor selects: the pods of a
//! namespace that carry `prometheus.io/scrape: "true"`, at their annotated port and path,
//! the series' own labels kept (`honor_labels`); and the operator's `/metrics`; with
//! plugdb's alert rules. Debian builds Prometheus without Kubernetes discovery, so the
//! pods are found as the PodMonitor would find them and written to a file Prometheus
//! watches (`file_sd_configs`), every second. It runs beside this process, which
//! reaches the pods as it does, listens on loopback, is recorded with the nodes'
//! daemons (their teardown stops it by its PID) and is stopped when dropped.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::node::Nodes;

/// How often it scrapes and evaluates its rules.
pub const INTERVAL: Duration = Duration::from_secs(5);

/// A running Prometheus.
pub struct Prometheus {
    /// `127.0.0.1:PORT`, its HTTP API.
    pub address: String,
    child: Child,
    discovery: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes the members in `namespace` of the cluster `nodes` run, and the operator's
    /// `/metrics` at `operator` (`host:port`), evaluating `rules`, every [`INTERVAL`].
    pub async fn start(nodes: &Nodes, namespace: &str, operator: &str, rules: &Path) -> Result<Self> {
        Self::start_every(nodes, namespace, operator, rules, INTERVAL).await
    }

    /// The same, scraping and evaluating every `interval` (whole seconds).
    pub async fn start_every(nodes: &Nodes, namespace: &str, operator: &str, rules: &Path, interval: Duration) -> Result<Self> {
        let bin = crate::cached_build("prometheus.sh", "Prometheus")?.join("prometheus");
        let dir = tempfile::tempdir()?;
        let seconds = interval.as_secs().max(1);
        let targets = dir.path().join("members.json");
        std::fs::write(&targets, "[]")?;
        let config = serde_json::json!({
            "global": {"scrape_interval": format!("{seconds}s"), "evaluation_interval": format!("{seconds}s")},
            "rule_files": [rules],
            "scrape_configs": [{
                "job_name": "plugdb-members",
                "honor_labels": true,
                "file_sd_configs": [{"files": [&targets], "refresh_interval": "1s"}],
            }, {
                "job_name": "plugdb-operator",
                "static_configs": [{"targets": [operator]}],
            }],
        });
        // JSON is YAML.
        std::fs::write(dir.path().join("prometheus.yml"), config.to_string())?;
        let port = crate::control_plane::free_port()?;
        let mut command = std::process::Command::new(bin);
        command
            .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn");
        let child = nodes.spawn_recorded(&format!("prometheus-{namespace}"), &mut command)?;
        let discovery = tokio::spawn(discover(nodes.client.clone(), namespace.to_string(), targets));
        let server = Self { address: format!("127.0.0.1:{port}"), child, discovery, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        while server.get("/-/ready").await.is_err() {
            if Instant::now() > deadline {
                bail!("Prometheus was not ready within 60 s: {}", nodes.log_tail(&format!("prometheus-{namespace}")));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(server)
    }

    /// The body of `GET path` (HTTP/1.0: the answer ends with the connection), when 200.
    async fn get(&self, path: &str) -> Result<String> {
        let mut stream = tokio::net::TcpStream::connect(&self.address).await?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: prometheus\r\n\r\n").as_bytes()).await?;
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer)).await.context("Prometheus answering")??;
        let (head, body) = answer.split_once("\r\n\r\n").context("an HTTP answer")?;
        if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
            bail!("{path}: {head}: {body}");
        }
        Ok(body.to_string())
    }

    /// The `data` of an API answer.
    async fn api(&self, path: &str) -> Result<serde_json::Value> {
        let answer: serde_json::Value = serde_json::from_str(&self.get(path).await?)?;
        if answer["status"] != "success" {
            bail!("{path}: {answer}");
        }
        Ok(answer["data"].clone())
    }

    /// The series an instant query gives: each one's labels and value.
    pub async fn query(&self, promql: &str) -> Result<Vec<(serde_json::Value, f64)>> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(promql))).await?;
        let result = data["result"].as_array().cloned().unwrap_or_default();
        Ok(result
            .into_iter()
            .map(|s| (s["metric"].clone(), s["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)))
            .collect())
    }

    /// The alerts pending or firing: each one's labels and state.
    pub async fn alerts(&self) -> Result<Vec<(serde_json::Value, String)>> {
        let data = self.api("/api/v1/alerts").await?;
        let alerts = data["alerts"].as_array().cloned().unwrap_or_default();
        Ok(alerts.into_iter().map(|a| (a["labels"].clone(), a["state"].as_str().unwrap_or_default().to_string())).collect())
    }

    /// Waits up to `within` until alert `name` fires at severity `warning` for `member`;
    /// panics with the alerts then if it never does.
    pub async fn until_firing(&self, name: &str, member: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let alerts = self.alerts().await.expect("alerts");
            let of = |l: &serde_json::Value| l["alertname"] == name && l["member"] == member && l["severity"] == "warning";
            if alerts.iter().any(|(labels, state)| of(labels) && state == "firing") {
                return;
            }
            assert!(Instant::now() < deadline, "{name} never fired for {member}: {alerts:?}");
            tokio::time::sleep(INTERVAL).await;
        }
    }

    /// Waits up to `within` until alert `name` is neither pending nor firing for `member`;
    /// panics with the alerts then if it still is.
    pub async fn until_resolved(&self, name: &str, member: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let alerts = self.alerts().await.expect("alerts");
            if !alerts.iter().any(|(labels, _)| labels["alertname"] == name && labels["member"] == member) {
                return;
            }
            assert!(Instant::now() < deadline, "{name} never resolved for {member}: {alerts:?}");
            tokio::time::sleep(INTERVAL).await;
        }
    }

    /// The health of each rule loaded (`ok` once evaluated without error).
    pub async fn rules(&self) -> Result<Vec<(String, String)>> {
        let data = self.api("/api/v1/rules").await?;
        let groups = data["groups"].as_array().cloned().unwrap_or_default();
        let rules = groups.iter().flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default());
        Ok(rules
            .map(|r| (r["name"].as_str().unwrap_or_default().to_string(), r["health"].as_str().unwrap_or_default().to_string()))
            .collect())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.discovery.abort();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every second, the pods of `namespace` the chart's PodMonitor would scrape, written to
/// `file` as Prometheus' file discovery reads it (whole, by a rename): each pod annotated
/// `prometheus.io/scrape: "true"` with an address, at its annotated port and path (the
/// agent's series, whose own labels are kept); and each container port named
/// `engine-metrics`, at `/metrics`, labelled from the pod as the PodMonitor's relabelings
/// label it (namespace, database, engine, member, role).
async fn discover(client: kube::Client, namespace: String, file: std::path::PathBuf) {
    use kube::api::{Api, ListParams};
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, &namespace);
    loop {
        if let Ok(listed) = pods.list(&ListParams::default()).await {
            let targets: Vec<serde_json::Value> = listed.items.iter().flat_map(|pod| targets(&namespace, pod)).collect();
            let written = file.with_extension("json.new");
            if std::fs::write(&written, serde_json::Value::from(targets).to_string()).is_ok() {
                let _ = std::fs::rename(&written, &file);
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The targets of one pod, as [`discover`] finds them.
fn targets(namespace: &str, pod: &k8s_openapi::api::core::v1::Pod) -> Vec<serde_json::Value> {
    let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()) else { return Vec::new() };
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let mut found = Vec::new();
    if annotations.get("prometheus.io/scrape").map(String::as_str) == Some("true")
        && let Some(port) = annotations.get("prometheus.io/port")
    {
        let path = annotations.get("prometheus.io/path").map_or("/metrics", String::as_str);
        found.push(serde_json::json!({"targets": [format!("{ip}:{port}")], "labels": {"__metrics_path__": path}}));
    }
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let label = |key: &str| labels.get(key).cloned().unwrap_or_default();
    let engine = pod.spec.iter().flat_map(|s| &s.containers).flat_map(|c| c.ports.iter().flatten());
    for port in engine.filter(|p| p.name.as_deref() == Some("engine-metrics")) {
        found.push(serde_json::json!({
            "targets": [format!("{ip}:{}", port.container_port)],
            "labels": {
                "namespace": namespace,
                "database": label("app.kubernetes.io/instance"),
                "engine": label("app.kubernetes.io/name"),
                "member": pod.metadata.name.clone().unwrap_or_default(),
                "role": label("plugdb.io/role"),
            },
        }));
    }
    found
}

/// The rule file `rules` with each rule's hold time (`for:`) capped at `cap`: the same
/// rules, the same expressions over the same series, for a scenario that cannot wait
/// out a rule's minutes (the hold times are checked by the rules' `promtool test rules`
/// tests). Writes it beside `into`'s other files and returns its path.
pub fn held_at_most(rules: &Path, cap: Duration, into: &Path) -> Result<std::path::PathBuf> {
    let text = std::fs::read_to_string(rules).with_context(|| format!("reading {}", rules.display()))?;
    let seconds = |held: &str| -> Option<u64> {
        let (number, unit) = held.split_at(held.len().checked_sub(1)?);
        let scale = match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            _ => return None,
        };
        Some(number.parse::<u64>().ok()? * scale)
    };
    let capped: Vec<String> = text
        .lines()
        .map(|line| match line.trim_start().strip_prefix("for: ").and_then(seconds) {
            Some(held) if held > cap.as_secs() => format!("{}for: {}s", &line[..line.len() - line.trim_start().len()], cap.as_secs()),
            _ => line.to_string(),
        })
        .collect();
    let path = into.join("rules-held-at-most.yaml");
    std::fs::write(&path, capped.join("\n") + "\n")?;
    Ok(path)
}

/// `text` as a URL's query value.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
