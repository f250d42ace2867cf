//! A real Kubernetes control plane for tests: etcd, kube-apiserver and
//! kube-controller-manager as child processes on loopback, in a temporary
//! directory. Dropping the [`ControlPlane`] stops them and removes the directory,
//! also when the test panics.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

const TOKEN: &str = "plugdb-test-admin-token";

/// A running control plane. Each test starts its own.
pub struct ControlPlane {
    /// A client with cluster-admin rights.
    pub client: Client,
    /// Path of a kubeconfig for the admin user (usable by kubectl).
    pub kubeconfig: PathBuf,
    /// URL of the API server.
    pub server: String,
    processes: Processes,
    kubelet: Option<tokio::task::JoinHandle<()>>,
}

/// The child processes and their directory; stopped and removed on drop.
struct Processes {
    dir: tempfile::TempDir,
    children: Vec<(&'static str, Child)>,
}

/// What to start beside the API server.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Start kube-controller-manager (StatefulSet, Job, garbage collector, ...).
    pub controller_manager: bool,
    /// Run the kubelet stand-in that marks Pods ready and Job Pods succeeded.
    pub kubelet: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self { controller_manager: true, kubelet: true }
    }
}

/// Directory holding kube-apiserver, kube-controller-manager and kubectl:
/// `KUBEBUILDER_ASSETS` when set, else the cache filled by `scripts/control-plane.sh`
/// (which builds them once when missing).
pub fn binaries_dir() -> Result<PathBuf> {
    let script = crate::workspace_root().join("scripts/control-plane.sh");
    let out =
        Command::new("bash").arg(&script).stderr(Stdio::inherit()).output().with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({}): the control-plane binaries are missing and could not be built", script.display(), out.status);
    }
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    for bin in ["kube-apiserver", "kube-controller-manager"] {
        if !dir.join(bin).is_file() {
            bail!("{} has no {bin}", dir.display());
        }
    }
    Ok(dir)
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn spawn(name: &'static str, bin: &Path, args: &[String], log: &Path) -> Result<(&'static str, Child)> {
    let log = std::fs::File::create(log)?;
    let child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok((name, child))
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver, kube-controller-manager and the kubelet stand-in.
    pub async fn start() -> Result<Self> {
        Self::start_with(Options::default()).await
    }

    /// Starts a control plane with `options`.
    pub async fn start_with(options: Options) -> Result<Self> {
        let bins = binaries_dir()?;
        let etcd = etcd_bin_vendored::etcd_bin_path().map_err(|e| anyhow::anyhow!("{e}"))?;
        let dir = tempfile::Builder::new().prefix("plugdb-cp-").tempdir()?;
        let path = dir.path().to_path_buf();
        let mut procs = Processes { dir, children: Vec::new() };

        let (client_port, peer_port) = (free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let args: Vec<String> = [
            "--data-dir",
            &path.join("etcd").to_string_lossy(),
            "--name",
            "default",
            "--listen-client-urls",
            &etcd_url,
            "--advertise-client-urls",
            &etcd_url,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &format!("default={peer_url}"),
            "--unsafe-no-fsync",
            "--log-level",
            "warn",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        procs.children.push(spawn("etcd", etcd, &args, &path.join("etcd.log"))?);

        let key = path.join("sa.key");
        let status = Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&key)
            .arg("2048")
            .stderr(Stdio::null())
            .status()
            .context("running openssl (apt-get install openssl)")?;
        if !status.success() {
            bail!("openssl genrsa failed: {status}");
        }
        std::fs::write(path.join("tokens.csv"), format!("{TOKEN},plugdb-admin,plugdb-admin,\"system:masters\"\n"))?;
        let port = free_port()?;
        let server = format!("https://127.0.0.1:{port}");
        let certs = path.join("certs");
        let args: Vec<String> = [
            "--etcd-servers",
            &etcd_url,
            "--cert-dir",
            &certs.to_string_lossy(),
            "--secure-port",
            &port.to_string(),
            "--bind-address",
            "127.0.0.1",
            "--advertise-address",
            "127.0.0.1",
            "--service-cluster-ip-range",
            "10.0.0.0/16",
            "--service-account-issuer",
            "https://kubernetes.default.svc",
            "--service-account-key-file",
            &key.to_string_lossy(),
            "--service-account-signing-key-file",
            &key.to_string_lossy(),
            "--token-auth-file",
            &path.join("tokens.csv").to_string_lossy(),
            "--authorization-mode",
            "RBAC",
            "--enable-priority-and-fairness=false",
            "--v",
            "1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        procs.children.push(spawn("kube-apiserver", &bins.join("kube-apiserver"), &args, &path.join("kube-apiserver.log"))?);

        procs.wait_for_file(&certs.join("apiserver.crt")).await?;
        let kubeconfig_path = path.join("kubeconfig");
        std::fs::write(&kubeconfig_path, kubeconfig_yaml(&server, &certs.join("apiserver.crt"), TOKEN))?;
        let kubeconfig = Kubeconfig::read_from(&kubeconfig_path)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        let client = Client::try_from(config)?;
        procs.wait_ready(&client).await?;

        if options.controller_manager {
            let args: Vec<String> = [
                "--kubeconfig",
                &kubeconfig_path.to_string_lossy(),
                "--leader-elect=false",
                "--controllers",
                "*",
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &free_port()?.to_string(),
                "--service-account-private-key-file",
                &key.to_string_lossy(),
                "--root-ca-file",
                &certs.join("apiserver.crt").to_string_lossy(),
                "--concurrent-statefulset-syncs",
                "10",
                "--v",
                "1",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            procs.children.push(spawn(
                "kube-controller-manager",
                &bins.join("kube-controller-manager"),
                &args,
                &path.join("kube-controller-manager.log"),
            )?);
        }
        let kubelet = options.kubelet.then(|| tokio::spawn(crate::kubelet::run(client.clone())));
        Ok(Self { client, kubeconfig: kubeconfig_path, server, processes: procs, kubelet })
    }

    /// The last lines of a component's log, for error messages.
    pub fn log_tail(&self, name: &str) -> String {
        self.processes.log_tail(name)
    }

    /// The temporary directory holding data, certificates and logs.
    pub fn dir(&self) -> &Path {
        self.processes.dir.path()
    }

    /// Process ids of the running components.
    pub fn pids(&self) -> Vec<u32> {
        self.processes.children.iter().map(|(_, c)| c.id()).collect()
    }
}

impl Processes {
    async fn wait_for_file(&mut self, cert: &Path) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cert.is_file() {
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!("{} did not appear within 60 s; kube-apiserver log: {}", cert.display(), self.log_tail("kube-apiserver"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    async fn wait_ready(&mut self, client: &Client) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let req = http::Request::get("/readyz").body(Vec::new())?;
            match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                other => {
                    self.check_alive()?;
                    if Instant::now() > deadline {
                        bail!("kube-apiserver not ready within 90 s ({other:?}); log: {}", self.log_tail("kube-apiserver"));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn check_alive(&mut self) -> Result<()> {
        for (name, child) in &mut self.children {
            if let Some(status) = child.try_wait()? {
                let name = *name;
                bail!("{name} exited early ({status}); log: {}", self.log_tail(name));
            }
        }
        Ok(())
    }

    fn log_tail(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

fn kubeconfig_yaml(server: &str, ca: &Path, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: plugdb-test\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: plugdb-test\n  context:\n    cluster: plugdb-test\n    user: admin\n    namespace: default\ncurrent-context: plugdb-test\n",
        ca.display()
    )
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if let Some(kubelet) = self.kubelet.take() {
            kubelet.abort();
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        // Stop in reverse order of start: controllers first, etcd last.
        for (_, child) in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
