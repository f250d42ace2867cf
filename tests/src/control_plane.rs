//! A real Kubernetes control plane for tests: etcd, kube-apiserver and
//! kube-controller-manager as child processes, on loopback in a temporary directory,
//! or inside the test node's network namespace (with kube-scheduler) in the node's
//! run directory. Dropping the [`ControlPlane`] stops them (and removes a temporary
//! directory), also when the test panics.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};

const TOKEN: &str = "plugdb-test-admin-token";

/// The name the API server's front proxy client certificate carries.
const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// The files of the aggregation layer's front proxy: an authority and the client
/// certificate the API server presents to extension API servers.
struct FrontProxy {
    ca: String,
    cert: String,
    key: String,
}

/// Makes the front proxy's authority and client certificate in `dir` (once).
fn front_proxy(dir: &Path) -> Result<FrontProxy> {
    let file = |name: &str| dir.join(name).to_string_lossy().to_string();
    let proxy = FrontProxy { ca: file("front-proxy-ca.crt"), cert: file("front-proxy-client.crt"), key: file("front-proxy-client.key") };
    if Path::new(&proxy.cert).is_file() {
        return Ok(proxy);
    }
    let (ca_key, csr) = (file("front-proxy-ca.key"), file("front-proxy-client.csr"));
    let subject = format!("/CN={FRONT_PROXY_CLIENT}");
    let steps: [&[&str]; 3] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &ca_key,
            "-out",
            &proxy.ca,
            "-subj",
            "/CN=front-proxy-ca",
            "-days",
            "30",
        ],
        &["req", "-newkey", "rsa:2048", "-nodes", "-keyout", &proxy.key, "-out", &csr, "-subj", &subject],
        &["x509", "-req", "-in", &csr, "-CA", &proxy.ca, "-CAkey", &ca_key, "-CAcreateserial", "-out", &proxy.cert, "-days", "30"],
    ];
    for args in steps {
        let out = Command::new("openssl").args(args).output().context("running openssl")?;
        if !out.status.success() {
            bail!("openssl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        }
    }
    Ok(proxy)
}

/// A running control plane. Each test starts its own.
pub struct ControlPlane {
    /// A client with cluster-admin rights.
    pub client: Client,
    /// Path of a kubeconfig for the admin user (usable by kubectl).
    pub kubeconfig: PathBuf,
    /// URL of the API server.
    pub server: String,
    processes: Processes,
}

/// Where the processes live; a temporary directory is removed on drop.
enum Dir {
    Temporary(tempfile::TempDir),
    Kept(PathBuf),
}

impl Dir {
    fn path(&self) -> &Path {
        match self {
            Dir::Temporary(t) => t.path(),
            Dir::Kept(p) => p,
        }
    }
}

/// The child processes and their directory; stopped (and a temporary directory
/// removed) on drop.
pub(crate) struct Processes {
    dir: Dir,
    children: Vec<(&'static str, Child)>,
    /// Launcher prefix (`nsenter --net=...`) for processes in a network namespace.
    launcher: Vec<String>,
    /// File where each started process is recorded as `name pid start-time`.
    pid_file: Option<PathBuf>,
}

/// The network the control plane serves on.
#[derive(Debug, Clone, Default)]
pub enum Network {
    /// Loopback of this network namespace, on free ports.
    #[default]
    Loopback,
    /// Inside the network namespace at `/run/netns/<name>`, the API server reachable
    /// at `address`:6443; with kube-scheduler, for a real node.
    Namespace {
        /// Name of the namespace.
        name: String,
        /// The node's address, on the namespace's side of its veth pair.
        address: String,
        /// Service virtual IP range.
        service_cidr: String,
        /// Directory for data, certificates, logs and the PID file.
        dir: PathBuf,
    },
}

/// What to start beside the API server.
#[derive(Debug, Clone)]
pub struct Options {
    /// Start kube-controller-manager (StatefulSet, Job, garbage collector, ...).
    pub controller_manager: bool,
    /// Where to serve.
    pub network: Network,
    /// kube-apiserver `--feature-gates`, when not its defaults.
    pub feature_gates: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self { controller_manager: true, network: Network::Loopback, feature_gates: None }
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

/// A port for one of the control plane's servers, free now. It is taken below the
/// kernel's ephemeral range: a port the kernel hands out for `bind(:0)` comes from the
/// range it also gives outgoing connections, so one of them could take it before the
/// server binds it (etcd then fails with "address already in use").
pub fn free_port() -> Result<u16> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOWEST: u32 = 10_000;
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let first_ephemeral: u32 = ephemeral.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(32_768);
    let span = first_ephemeral.saturating_sub(LOWEST).max(1);
    // Test binaries run one after another and their tests side by side: the process id
    // spreads the processes apart, the counter the control planes within one.
    let start = std::process::id().wrapping_mul(7_919);
    for _ in 0..span.min(1_000) {
        let port = LOWEST + start.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return Ok(port as u16);
        }
    }
    bail!("no free port between {LOWEST} and {first_ephemeral}")
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and kube-controller-manager.
    pub async fn start() -> Result<Self> {
        Self::start_with(Options::default()).await
    }

    /// Starts a control plane with `options`.
    pub async fn start_with(options: Options) -> Result<Self> {
        let bins = binaries_dir()?;
        let etcd = etcd_bin_vendored::etcd_bin_path().map_err(|e| anyhow::anyhow!("{e}"))?;
        let (mut procs, server, bind, ports) = match &options.network {
            Network::Loopback => {
                let dir = tempfile::Builder::new().prefix("plugdb-cp-").tempdir()?;
                let procs = Processes { dir: Dir::Temporary(dir), children: Vec::new(), launcher: Vec::new(), pid_file: None };
                let ports = Ports {
                    etcd: free_port()?,
                    peer: free_port()?,
                    apiserver: free_port()?,
                    controller_manager: free_port()?,
                    scheduler: 0,
                };
                (procs, format!("https://127.0.0.1:{}", ports.apiserver), ("127.0.0.1".to_string(), "127.0.0.1".to_string()), ports)
            }
            Network::Namespace { name, address, dir, .. } => {
                std::fs::create_dir_all(dir)?;
                let procs = Processes::in_namespace(name, dir.clone(), dir.join("pids"));
                // A network namespace of its own: the usual ports are free.
                let ports = Ports { etcd: 2379, peer: 2380, apiserver: 6443, controller_manager: 10257, scheduler: 10259 };
                (procs, format!("https://{address}:6443"), ("0.0.0.0".to_string(), address.clone()), ports)
            }
        };
        let service_cidr = match &options.network {
            Network::Namespace { service_cidr, .. } => service_cidr.clone(),
            Network::Loopback => "10.0.0.0/16".into(),
        };
        let path = procs.dir.path().to_path_buf();

        let etcd_url = format!("http://127.0.0.1:{}", ports.etcd);
        let peer_url = format!("http://127.0.0.1:{}", ports.peer);
        let data = path.join("etcd").to_string_lossy().to_string();
        let cluster = format!("default={peer_url}");
        let args = strings(&[
            "--data-dir",
            &data,
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
            &cluster,
            "--unsafe-no-fsync",
            "--log-level",
            "warn",
        ]);
        procs.spawn("etcd", etcd, &args)?;

        let key = path.join("sa.key");
        if !key.is_file() {
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
        }
        let key = key.to_string_lossy().to_string();
        let proxy = front_proxy(&path)?;
        std::fs::write(path.join("tokens.csv"), format!("{TOKEN},plugdb-admin,plugdb-admin,\"system:masters\"\n"))?;
        let certs = path.join("certs");
        let (certs_arg, tokens) = (certs.to_string_lossy().to_string(), path.join("tokens.csv").to_string_lossy().to_string());
        let port = ports.apiserver.to_string();
        let mut args = strings(&[
            "--etcd-servers",
            &etcd_url,
            "--cert-dir",
            &certs_arg,
            "--secure-port",
            &port,
            "--bind-address",
            &bind.0,
            "--advertise-address",
            &bind.1,
            "--service-cluster-ip-range",
            &service_cidr,
            "--service-account-issuer",
            "https://kubernetes.default.svc",
            "--service-account-key-file",
            &key,
            "--service-account-signing-key-file",
            &key,
            "--token-auth-file",
            &tokens,
            "--authorization-mode",
            "RBAC",
            "--enable-priority-and-fairness=false",
            // Logs and exec reach the kubelet by the node's address, not its name.
            "--kubelet-preferred-address-types",
            "InternalIP",
            // The aggregation layer (metrics-server's API), reaching an extension API
            // server at its endpoints' addresses.
            "--requestheader-client-ca-file",
            &proxy.ca,
            "--requestheader-allowed-names",
            FRONT_PROXY_CLIENT,
            "--requestheader-username-headers",
            "X-Remote-User",
            "--requestheader-group-headers",
            "X-Remote-Group",
            "--requestheader-extra-headers-prefix",
            "X-Remote-Extra-",
            "--proxy-client-cert-file",
            &proxy.cert,
            "--proxy-client-key-file",
            &proxy.key,
            "--enable-aggregator-routing=true",
            "--v",
            "1",
        ]);
        if let Some(gates) = &options.feature_gates {
            args.push(format!("--feature-gates={gates}"));
        }
        procs.spawn("kube-apiserver", &bins.join("kube-apiserver"), &args)?;

        procs.wait_for_file(&certs.join("apiserver.crt")).await?;
        let kubeconfig_path = path.join("kubeconfig");
        std::fs::write(&kubeconfig_path, kubeconfig_yaml(&server, &certs.join("apiserver.crt"), TOKEN))?;
        let kubeconfig = Kubeconfig::read_from(&kubeconfig_path)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        let client = Client::try_from(config)?;
        procs.wait_ready(&client).await?;

        let kubeconfig_arg = kubeconfig_path.to_string_lossy().to_string();
        if options.controller_manager {
            let ca = certs.join("apiserver.crt").to_string_lossy().to_string();
            let port = ports.controller_manager.to_string();
            let args = strings(&[
                "--kubeconfig",
                &kubeconfig_arg,
                "--leader-elect=false",
                "--controllers",
                "*",
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &port,
                "--service-account-private-key-file",
                &key,
                "--root-ca-file",
                &ca,
                "--concurrent-statefulset-syncs",
                "10",
                "--v",
                "1",
            ]);
            procs.spawn("kube-controller-manager", &bins.join("kube-controller-manager"), &args)?;
        }
        if let Network::Namespace { .. } = options.network {
            let port = ports.scheduler.to_string();
            let args = strings(&[
                "--kubeconfig",
                &kubeconfig_arg,
                "--authentication-kubeconfig",
                &kubeconfig_arg,
                "--authorization-kubeconfig",
                &kubeconfig_arg,
                "--leader-elect=false",
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &port,
                "--v",
                "1",
            ]);
            procs.spawn("kube-scheduler", &bins.join("kube-scheduler"), &args)?;
        }
        Ok(Self { client, kubeconfig: kubeconfig_path, server, processes: procs })
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

    /// Process id of component `name` (`etcd`, `kube-apiserver`, ...), if it runs.
    pub fn pid_of(&self, name: &str) -> Option<u32> {
        self.processes.children.iter().find(|(n, _)| *n == name).map(|(_, c)| c.id())
    }
}

/// Ports of the components.
struct Ports {
    etcd: u16,
    peer: u16,
    apiserver: u16,
    controller_manager: u16,
    scheduler: u16,
}

impl Processes {
    /// Processes in the network namespace `/run/netns/<netns>`, logging in `dir` (kept),
    /// recorded in `pid_file`.
    pub(crate) fn in_namespace(netns: &str, dir: PathBuf, pid_file: PathBuf) -> Self {
        Self {
            dir: Dir::Kept(dir),
            children: Vec::new(),
            launcher: vec!["nsenter".into(), format!("--net=/run/netns/{netns}")],
            pid_file: Some(pid_file),
        }
    }

    /// Starts `bin` with `args` (through the launcher), logging to `<dir>/<name>.log`,
    /// and records its PID.
    pub(crate) fn spawn(&mut self, name: &'static str, bin: &Path, args: &[String]) -> Result<()> {
        let log = std::fs::File::create(self.dir.path().join(format!("{name}.log")))?;
        let mut command = match self.launcher.split_first() {
            Some((launcher, rest)) => {
                let mut c = Command::new(launcher);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let child = command
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        if let Some(file) = &self.pid_file {
            crate::node::record_pid(file, name, child.id())?;
        }
        self.children.push((name, child));
        Ok(())
    }

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

    pub(crate) fn check_alive(&mut self) -> Result<()> {
        for (name, child) in &mut self.children {
            if let Some(status) = child.try_wait()? {
                let name = *name;
                bail!("{name} exited early ({status}); log: {}", self.log_tail(name));
            }
        }
        Ok(())
    }

    pub(crate) fn log_tail(&self, name: &str) -> String {
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

impl Processes {
    /// Stops the processes in reverse order of start: controllers first, etcd last.
    pub(crate) fn stop(&mut self) {
        for (_, child) in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.clear();
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        self.stop();
    }
}
