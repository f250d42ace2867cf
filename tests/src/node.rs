//! A real Kubernetes node for tests: containerd + runc + a real kubelet, kube-proxy,
//! CoreDNS and local-path-provisioner, joined to a control plane, all inside a
//! network namespace this harness creates (`/run/netns/plugdb-node`).
//!
//! Containment:
//! - every daemon starts as `nsenter --net=<namespace> CMD`, so iptables rules, the CNI
//!   bridge, pod interfaces and listeners exist only in that namespace; the machine's
//!   own namespace gains one veth end (`10.201.0.1/30`) with one route through it, to
//!   the pod range (the operator, running in the test process, asks members of engines
//!   that elect their leader who leads, as an in-cluster operator reaches its pods), and
//!   nothing else: no rules. Both go with the veth. Clients reach the API server at
//!   `10.201.0.2:6443` over the veth; Service addresses are reached from inside the
//!   namespace ([`Node::command`]).
//! - the global kernel settings the kubelet rewrites are saved first and put back;
//! - processes are recorded with their start time and stopped by those PIDs; what they
//!   left (containers' processes) is found by namespace and cgroup membership;
//! - teardown runs on drop, so also when a test fails, and from signal handlers
//!   ([`teardown`]); a later start tears down what a crashed run left first.
//!
//! One node serves a whole test run; its run directory is fixed (`PLUGDB_NODE_DIR`,
//! default `/tmp/plugdb-node`) so that a crashed run can be found and cleaned.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Client;
use kube::api::Api;

use crate::control_plane::{ControlPlane, Network, Options, Processes};

mod teardown;

use teardown::{cni_netns, remove_containers};
pub use teardown::{machine_state, state_difference, teardown};

/// Name of the network namespace the node lives in.
pub const NETNS: &str = "plugdb-node";
/// The node's name.
pub const NODE_NAME: &str = "plugdb-node";
/// Address of the machine's end of the veth pair.
pub const HOST_ADDRESS: &str = "10.201.0.1";
/// The node's address (its end of the veth pair): the API server, kubelet and DNS.
pub const NODE_ADDRESS: &str = "10.201.0.2";
/// The veth end in the machine's own namespace.
pub const VETH_HOST: &str = "plugdb-host";
const VETH_NODE: &str = "plugdb-eth0";
/// Pod addresses (CNI bridge + host-local), inside the namespace only.
pub const POD_CIDR: &str = "10.202.0.0/24";
const POD_GATEWAY: &str = "10.202.0.1";
/// The pod bridge inside the namespace.
const BRIDGE: &str = "cni0";
/// Service virtual IPs (kube-proxy, iptables mode), inside the namespace only.
pub const SERVICE_CIDR: &str = "10.203.0.0/16";
/// The cluster DNS Service address.
pub const DNS_ADDRESS: &str = "10.203.0.10";
/// The storage class local-path-provisioner serves; the default class.
pub const STORAGE_CLASS: &str = "local-path";
/// Image of the volume provisioner's helper pods.
const HELPER_IMAGE: &str = "localhost/plugdb/helper:1";
const PAUSE_IMAGE: &str = "localhost/plugdb/pause:1";
/// Kernel settings the kubelet rewrites at start (global, not per network namespace);
/// saved before the node starts and put back at teardown.
pub const GLOBAL_SYSCTLS: &[&str] = &[
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
];

/// The node's run directory: `PLUGDB_NODE_DIR`, else `/tmp/plugdb-node`.
pub fn run_dir() -> PathBuf {
    std::env::var_os("PLUGDB_NODE_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp/plugdb-node"))
}

/// Where containerd keeps images between runs, so that a second run imports nothing.
fn image_store() -> PathBuf {
    let cache = std::env::var_os("PLUGDB_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache"))
            .join("plugdb")
    });
    cache.join("containerd")
}

/// A running node with its control plane. Dropping it tears everything down.
pub struct Node {
    /// The control plane, inside the node's namespace.
    pub control_plane: ControlPlane,
    /// An admin client (from the machine's namespace, through the veth).
    pub client: Client,
    /// Path of an admin kubeconfig (usable by kubectl).
    pub kubeconfig: PathBuf,
    /// Directory holding kubectl and the other Kubernetes binaries.
    pub bin_dir: PathBuf,
    /// The operator's image (this build's `plugdb`), imported into the node.
    pub operator_image: String,
    daemons: Processes,
    dir: PathBuf,
    /// Held while the node runs (released by the kernel if the process dies).
    _lock: std::fs::File,
}

/// Records `name pid start-time` in `file`, so that a later run stops exactly this process.
pub(crate) fn record_pid(file: &Path, name: &str, pid: u32) -> Result<()> {
    let start = start_time(pid).unwrap_or_default();
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(file)?;
    writeln!(f, "{name} {pid} {start}")?;
    Ok(())
}

/// A live (not zombie) process's start time in clock ticks since boot (field 22 of
/// `/proc/PID/stat`).
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields are counted after its closing parenthesis.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18).map(str::to_string)
}

/// Runs `program args` and fails with its output when it fails.
fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program).args(args).stdin(Stdio::null()).output().with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!("{program} {} failed ({}): {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a workspace script that prints what it built, failing loudly when it cannot build.
fn script(name: &str, args: &[&std::ffi::OsStr]) -> Result<String> {
    let path = crate::workspace_root().join("scripts").join(name);
    let out = Command::new("bash")
        .arg(&path)
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", path.display()))?;
    if !out.status.success() {
        bail!("{} failed ({}): a part of the test node is missing and could not be built", path.display(), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What the machine must offer; each missing piece is named with how to get it.
fn check_prerequisites() -> Result<()> {
    if !is_root() {
        bail!("the test node needs root (network namespaces, mounts, cgroups): run the tests as root");
    }
    let mut missing = Vec::new();
    for (tool, package) in [
        ("containerd", "containerd"),
        ("ctr", "containerd"),
        ("runc", "runc"),
        ("nsenter", "util-linux"),
        ("ip", "iproute2"),
        ("iptables", "iptables"),
        ("sysctl", "procps"),
    ] {
        if which(tool).is_none() {
            missing.push(format!("{tool} (apt-get install {package})"));
        }
    }
    for plugin in ["bridge", "host-local", "loopback", "portmap"] {
        if !Path::new("/usr/lib/cni").join(plugin).is_file() {
            missing.push(format!("CNI plugin /usr/lib/cni/{plugin} (apt-get install containernetworking-plugins)"));
        }
    }
    if !Path::new("/sys/fs/cgroup/memory").is_dir() && !Path::new("/sys/fs/cgroup/cgroup.controllers").is_file() {
        missing.push("a cgroup filesystem at /sys/fs/cgroup".into());
    }
    if !missing.is_empty() {
        bail!("the test node cannot start; missing: {} (scripts/install-deps.sh installs them)", missing.join(", "));
    }
    Ok(())
}

fn is_root() -> bool {
    run("id", &["-u"]).is_ok_and(|s| s.trim() == "0")
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(tool)).find(|p| p.is_file())
}

impl Node {
    /// Builds what is missing (cached), tears down what a crashed run left, and starts
    /// the node and its control plane; returns once the node is Ready with DNS and a
    /// default storage class.
    pub async fn start() -> Result<Self> {
        check_prerequisites()?;
        let dir = run_dir();
        std::fs::create_dir_all(&dir)?;
        // One node per machine: its namespace, addresses and run directory are fixed.
        let lock = std::fs::File::create(dir.join("lock"))?;
        if lock.try_lock().is_err() {
            bail!("another test node is running on this machine (it holds {}); wait for it to finish", dir.join("lock").display());
        }
        let started = Self::start_in(&dir, lock).await;
        if started.is_err() {
            teardown(&dir);
        }
        started
    }

    async fn start_in(dir: &Path, lock: std::fs::File) -> Result<Self> {
        let dir = dir.to_path_buf();
        let report = teardown(&dir);
        if !report.is_empty() {
            eprintln!("node: cleaned up after an earlier run: {}", report.join("; "));
        }
        let started = Instant::now();
        let bin_dir = crate::control_plane::binaries_dir()?;
        let tools: BTreeMap<String, PathBuf> = script("node-tools.sh", &[])?
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), PathBuf::from(v))))
            .collect();
        let index = PathBuf::from(script("node-images.sh", &[])?.trim());
        // The operator's image around this build's binary: backup Jobs run it.
        let binary = crate::plugdb_binary();
        let operator_index = PathBuf::from(script("node-images.sh", &["--operator".as_ref(), binary.as_os_str()])?.trim());
        let operator_image = std::fs::read_to_string(&operator_index)?
            .split_whitespace()
            .nth(2)
            .context("the operator image index names no tag")?
            .to_string();

        std::fs::create_dir_all(&dir)?;
        save_sysctls(&dir)?;
        std::fs::write(dir.join("cni-netns-before"), cni_netns().join("\n"))?;
        create_namespace()?;

        let mut daemons = Processes::in_namespace(NETNS, dir.clone(), dir.join("pids"));
        start_containerd(&mut daemons, &dir).await?;
        import_images(&dir, &index)?;
        import_images(&dir, &operator_index)?;

        let control_plane = ControlPlane::start_with(Options {
            controller_manager: true,
            network: Network::Namespace {
                name: NETNS.into(),
                address: NODE_ADDRESS.into(),
                service_cidr: SERVICE_CIDR.into(),
                dir: dir.join("control-plane"),
            },
            feature_gates: None,
        })
        .await?;
        let client = control_plane.client.clone();
        let kubeconfig = control_plane.kubeconfig.clone();

        start_kubelet(&mut daemons, &dir, &bin_dir, &kubeconfig)?;
        start_kube_proxy(&mut daemons, &dir, &bin_dir, &kubeconfig)?;
        start_coredns(&mut daemons, &dir, &tools, &kubeconfig, &client).await?;
        start_local_path(&mut daemons, &dir, &tools, &kubeconfig, &client).await?;
        let node = Self { control_plane, client, kubeconfig, bin_dir, operator_image, daemons, dir, _lock: lock };
        node.wait_ready().await?;
        eprintln!("node: {NODE_NAME} Ready in {:.1} s", started.elapsed().as_secs_f64());
        Ok(node)
    }

    async fn wait_ready(&self) -> Result<()> {
        let nodes: Api<NodeObject> = Api::all(self.client.clone());
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let ready = nodes
                .get_opt(NODE_NAME)
                .await
                .ok()
                .flatten()
                .and_then(|n| n.status?.conditions)
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("node {NODE_NAME} not Ready within 120 s; kubelet log: {}", self.daemons.log_tail("kubelet"));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// A command that runs `program` in the node's network namespace, where pod and
    /// Service addresses are reachable (e.g. `psql -h <service IP>`).
    pub fn command(program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{NETNS}")).arg(program);
        c
    }

    /// Starts `command` logging to `<run dir>/<name>.log` and records its PID, so that
    /// teardown stops it too if the test cannot (a failure, an interrupt).
    pub fn spawn_recorded(&self, name: &str, command: &mut Command) -> Result<std::process::Child> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("{name}.log")))?;
        let child =
            command.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).spawn().with_context(|| format!("starting {name}"))?;
        record_pid(&self.dir.join("pids"), name, child.id())?;
        Ok(child)
    }

    /// `kubectl` against this cluster.
    pub fn kubectl(&self) -> Command {
        let mut c = Command::new(self.bin_dir.join("kubectl"));
        c.arg("--kubeconfig").arg(&self.kubeconfig);
        c
    }

    /// The run directory (logs of every daemon under it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last lines of a daemon's log (`kubelet`, `containerd`, ...).
    pub fn log_tail(&self, name: &str) -> String {
        self.daemons.log_tail(name)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Teardown stops every recorded process in order (containers before containerd);
        // the processes' own drops then only reap them.
        let report = teardown(&self.dir);
        if report.iter().any(|l| l.starts_with("failed")) {
            eprintln!("node teardown: {}", report.join("; "));
        }
    }
}

fn save_sysctls(dir: &Path) -> Result<()> {
    let file = dir.join("sysctl-before");
    if file.exists() {
        return Ok(()); // an earlier run's values, not yet restored, are the machine's own
    }
    let mut saved = String::new();
    for key in GLOBAL_SYSCTLS {
        if let Ok(value) = run("sysctl", &["-n", key]) {
            saved.push_str(&format!("{key}={}\n", value.trim()));
        }
    }
    std::fs::write(file, saved)?;
    Ok(())
}

fn create_namespace() -> Result<()> {
    for (route, what) in [(POD_CIDR, "pod"), (SERVICE_CIDR, "Service"), ("10.201.0.0/30", "veth")] {
        let existing = run("ip", &["route", "show", "to", "match", route])?;
        if existing.lines().any(|l| !l.starts_with("default")) {
            bail!("the machine already routes the node's {what} range {route} ({}); the node would shadow it", existing.trim());
        }
    }
    run("ip", &["netns", "add", NETNS])?;
    run("ip", &["-n", NETNS, "link", "set", "lo", "up"])?;
    run("ip", &["link", "add", VETH_HOST, "type", "veth", "peer", "name", VETH_NODE, "netns", NETNS])?;
    run("ip", &["addr", "add", &format!("{HOST_ADDRESS}/30"), "dev", VETH_HOST])?;
    run("ip", &["link", "set", VETH_HOST, "up"])?;
    run("ip", &["-n", NETNS, "addr", "add", &format!("{NODE_ADDRESS}/30"), "dev", VETH_NODE])?;
    run("ip", &["-n", NETNS, "link", "set", VETH_NODE, "up"])?;
    // The pod range, through the veth only (removed with it).
    run("ip", &["route", "add", POD_CIDR, "via", NODE_ADDRESS, "dev", VETH_HOST])?;
    // Forwarding between the veth and the pod bridge, inside the namespace only.
    run("nsenter", &[&format!("--net=/run/netns/{NETNS}"), "sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    // The pod bridge up front (the CNI bridge plugin adopts it), so that Service
    // addresses have a route from the namespace itself: kube-proxy rewrites them to pod
    // addresses; an address it does not serve stays on the bridge, never leaves.
    run("ip", &["-n", NETNS, "link", "add", BRIDGE, "type", "bridge"])?;
    run("ip", &["-n", NETNS, "addr", "add", &format!("{POD_GATEWAY}/24"), "dev", BRIDGE])?;
    run("ip", &["-n", NETNS, "link", "set", BRIDGE, "up"])?;
    run("ip", &["-n", NETNS, "route", "add", SERVICE_CIDR, "dev", BRIDGE, "src", POD_GATEWAY])?;
    Ok(())
}

async fn start_containerd(daemons: &mut Processes, dir: &Path) -> Result<()> {
    let store = image_store();
    std::fs::create_dir_all(&store)?;
    let state = dir.join("containerd");
    std::fs::create_dir_all(dir.join("cni/net.d"))?;
    std::fs::write(
        dir.join("cni/net.d/10-plugdb.conflist"),
        serde_json::to_string_pretty(&serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "plugdb-node",
            "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": false, "hairpinMode": true,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GATEWAY}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": dir.join("cni/ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        }))?,
    )?;
    let config = format!(
        r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{state}/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # This machine lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
        root = store.display(),
        state = state.display(),
        cni = dir.join("cni/net.d").display(),
    );
    std::fs::write(dir.join("containerd.toml"), config)?;
    let config_arg = dir.join("containerd.toml").to_string_lossy().to_string();
    daemons.spawn("containerd", Path::new("containerd"), &["--config".into(), config_arg])?;
    let socket = state.join("containerd.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    while ctr(dir, &["version"]).is_err() {
        daemons.check_alive()?;
        if Instant::now() > deadline {
            bail!("containerd did not serve {} within 30 s: {}", socket.display(), daemons.log_tail("containerd"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Containers a crashed run left in the persistent store are stale: remove them.
    remove_containers(dir);
    Ok(())
}

/// `ctr` in containerd's Kubernetes namespace.
fn ctr(dir: &Path, args: &[&str]) -> Result<String> {
    let socket = dir.join("containerd/containerd.sock").to_string_lossy().to_string();
    let mut full = vec!["-a", &socket, "-n", "k8s.io"];
    full.extend_from_slice(args);
    run("ctr", &full)
}

/// Imports each image archive unless every one of its tags already names what this
/// harness imported from an archive with the same content (config digest).
fn import_images(dir: &Path, index: &Path) -> Result<()> {
    let text = std::fs::read_to_string(index).with_context(|| format!("reading the image index {}", index.display()))?;
    let record = image_store().join("imported");
    // One line per tag: `CONFIG_DIGEST TAG MANIFEST_DIGEST`.
    let mut records: Vec<String> = std::fs::read_to_string(&record).unwrap_or_default().lines().map(str::to_string).collect();
    // REF TYPE DIGEST ...: the manifest digest each tag names now.
    let listing = ctr(dir, &["images", "ls"])?;
    let target = |tag: &str| -> Option<String> {
        listing.lines().find(|l| l.split_whitespace().next() == Some(tag)).and_then(|l| l.split_whitespace().nth(2)).map(str::to_string)
    };
    let mut imported = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut fields = line.split_whitespace();
        let (Some(archive), Some(config)) = (fields.next(), fields.next()) else { continue };
        let tags: Vec<&str> = fields.collect();
        let current = tags.iter().all(|tag| target(tag).is_some_and(|manifest| records.contains(&format!("{config} {tag} {manifest}"))));
        if current {
            continue;
        }
        let first = tags.first().context("an image index line without a tag")?;
        ctr(dir, &["images", "import", "--index-name", first, archive])
            .with_context(|| format!("importing {archive} (built by scripts/node-images.sh)"))?;
        for tag in &tags[1..] {
            let _ = ctr(dir, &["images", "rm", tag]);
            ctr(dir, &["images", "tag", first, tag])?;
        }
        let listing = ctr(dir, &["images", "ls"])?;
        for tag in &tags {
            records.retain(|l| l.split_whitespace().nth(1) != Some(*tag));
            if let Some(manifest) =
                listing.lines().find(|l| l.split_whitespace().next() == Some(*tag)).and_then(|l| l.split_whitespace().nth(2))
            {
                records.push(format!("{config} {tag} {manifest}"));
            }
        }
        imported += 1;
    }
    std::fs::write(&record, records.join("\n") + "\n")?;
    // The CRI keeps a `sha256:<config>` reference per image; drop those no tag uses, or old layers stay.
    let listing = ctr(dir, &["images", "ls"])?;
    let named: Vec<&str> =
        listing.lines().skip(1).filter(|l| !l.starts_with("sha256:")).filter_map(|l| l.split_whitespace().nth(2)).collect();
    for line in listing.lines().skip(1).filter(|l| l.starts_with("sha256:")) {
        let mut f = line.split_whitespace();
        if let (Some(reference), Some(digest)) = (f.next(), f.nth(1))
            && !named.contains(&digest)
        {
            let _ = ctr(dir, &["images", "rm", "--sync", reference]);
        }
    }
    if imported > 0 {
        eprintln!("node: imported {imported} image archive(s)");
    }
    Ok(())
}

fn start_kubelet(daemons: &mut Processes, dir: &Path, bin_dir: &Path, kubeconfig: &Path) -> Result<()> {
    std::fs::write(dir.join("resolv.conf"), format!("nameserver {DNS_ADDRESS}\n"))?;
    let config = format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {NODE_ADDRESS}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}
authorization: {{mode: AlwaysAllow}}
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
# This machine has cgroup v1 only and no swap accounting; the kubelet would refuse to start.
failCgroupV1: false
failSwapOn: false
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
# No filesystem statistics for the container's overlay root here.
localStorageCapacityIsolation: false
# The kubelet sets vm.overcommit_memory and kernel.panic*; the harness restores them.
protectKernelDefaults: false
resolvConf: {resolv}
clusterDomain: cluster.local
clusterDNS: [{DNS_ADDRESS}]
evictionHard: {{memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 60
"#,
        socket = dir.join("containerd/containerd.sock").display(),
        resolv = dir.join("resolv.conf").display(),
    );
    std::fs::write(dir.join("kubelet.yaml"), config)?;
    let s = |p: PathBuf| p.to_string_lossy().to_string();
    let args = vec![
        "--config".into(),
        s(dir.join("kubelet.yaml")),
        "--kubeconfig".into(),
        s(kubeconfig.to_path_buf()),
        "--root-dir".into(),
        s(dir.join("kubelet")),
        "--cert-dir".into(),
        s(dir.join("kubelet/pki")),
        "--hostname-override".into(),
        NODE_NAME.into(),
        "--node-ip".into(),
        NODE_ADDRESS.into(),
        "--v".into(),
        "1".into(),
    ];
    daemons.spawn("kubelet", &bin_dir.join("kubelet"), &args)
}

fn start_kube_proxy(daemons: &mut Processes, dir: &Path, bin_dir: &Path, kubeconfig: &Path) -> Result<()> {
    let config = format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {{kubeconfig: {kubeconfig}}}
hostnameOverride: {NODE_NAME}
clusterCIDR: {POD_CIDR}
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {{maxPerCore: 0, min: 0}}
"#,
        kubeconfig = kubeconfig.display()
    );
    std::fs::write(dir.join("kube-proxy.yaml"), config)?;
    let args = vec!["--config".into(), dir.join("kube-proxy.yaml").to_string_lossy().to_string(), "--v".into(), "1".into()];
    daemons.spawn("kube-proxy", &bin_dir.join("kube-proxy"), &args)
}

/// CoreDNS as a node process inside the namespace, serving the standard kube-dns Service.
async fn start_coredns(
    daemons: &mut Processes,
    dir: &Path,
    tools: &BTreeMap<String, PathBuf>,
    kubeconfig: &Path,
    client: &Client,
) -> Result<()> {
    let corefile = format!(
        ".:53 {{\n    bind {NODE_ADDRESS}\n    errors\n    kubernetes cluster.local in-addr.arpa ip6.arpa {{\n        kubeconfig {} plugdb-test\n        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n    }}\n    cache 5\n}}\n",
        kubeconfig.display()
    );
    std::fs::write(dir.join("Corefile"), corefile)?;
    let coredns = tools.get("coredns").context("scripts/node-tools.sh did not report coredns")?;
    daemons.spawn("coredns", coredns, &["-conf".into(), dir.join("Corefile").to_string_lossy().to_string()])?;
    crate::apply_yaml(
        client,
        "plugdb-node",
        &format!(
            r#"apiVersion: v1
kind: Service
metadata: {{name: kube-dns, namespace: kube-system, labels: {{k8s-app: kube-dns}}}}
spec:
  clusterIP: {DNS_ADDRESS}
  ports: [{{name: dns, port: 53, protocol: UDP}}, {{name: dns-tcp, port: 53, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: kube-dns-node, namespace: kube-system, labels: {{kubernetes.io/service-name: kube-dns}}}}
addressType: IPv4
ports: [{{name: dns, port: 53, protocol: UDP}}, {{name: dns-tcp, port: 53, protocol: TCP}}]
endpoints: [{{addresses: ["{NODE_ADDRESS}"], conditions: {{ready: true}}}}]"#
        ),
    )
    .await
}

/// local-path-provisioner as a node process: the default storage class, volumes under
/// the run directory, created and removed by helper pods.
async fn start_local_path(
    daemons: &mut Processes,
    dir: &Path,
    tools: &BTreeMap<String, PathBuf>,
    kubeconfig: &Path,
    client: &Client,
) -> Result<()> {
    let volumes = dir.join("volumes");
    std::fs::create_dir_all(&volumes)?;
    let config = serde_json::json!({"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [volumes]}]});
    std::fs::write(dir.join("local-path.json"), config.to_string())?;
    let indent = |s: &str| s.lines().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n");
    crate::apply_yaml(
        client,
        "plugdb-node",
        &format!(
            r#"apiVersion: v1
kind: Namespace
metadata: {{name: local-path-storage}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: local-path-config, namespace: local-path-storage}}
data:
  config.json: |-
{config}
  setup: |-
    #!/bin/sh
    set -eu
    mkdir -m 0777 -p "$VOL_DIR"
  teardown: |-
    #!/bin/sh
    set -eu
    rm -rf "$VOL_DIR"
  helperPod.yaml: |-
    apiVersion: v1
    kind: Pod
    metadata: {{name: helper-pod}}
    spec:
      containers:
      - name: helper-pod
        image: {HELPER_IMAGE}
        imagePullPolicy: Never
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: {STORAGE_CLASS}
  annotations: {{storageclass.kubernetes.io/is-default-class: "true"}}
provisioner: rancher.io/local-path
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete"#,
            config = indent(&config.to_string()),
        ),
    )
    .await?;
    let provisioner = tools.get("local-path-provisioner").context("scripts/node-tools.sh did not report local-path-provisioner")?;
    let s = |p: &Path| p.to_string_lossy().to_string();
    let args = vec![
        "start".into(),
        "--kubeconfig".into(),
        s(kubeconfig),
        "--config".into(),
        s(&dir.join("local-path.json")),
        "--namespace".into(),
        "local-path-storage".into(),
        "--helper-image".into(),
        HELPER_IMAGE.into(),
        "--service-account-name".into(),
        "default".into(),
    ];
    daemons.spawn("local-path-provisioner", provisioner, &args)
}
