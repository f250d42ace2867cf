//! Three real Kubernetes nodes for tests, each containerd + runc + a real kubelet and
//! kube-proxy in a network namespace of its own, joined by a bridge in a fourth
//! namespace the harness creates (the hub), which also holds the control plane, CoreDNS
//! and local-path-provisioner. Nodes carry `topology.kubernetes.io/zone` a, b and c.
//! Volumes of [`GROWING_STORAGE_CLASS`] have capacities of their own and grow online
//! (csi-loop and the CSI sidecars, see the `csi` module); metrics-server serves the
//! resource metrics API, so a HorizontalPodAutoscaler works.
//!
//! ```text
//!  machine ── veth 10.201.0.1/30 ──┐
//!                                   hub (plugdb-node): API server etc. at 10.201.0.2,
//!                                   bridge plugdb-br 10.201.1.1/24
//!        ┌──────────────────────────┼──────────────────────────┐
//!  plugdb-node-a 10.201.1.11   plugdb-node-b 10.201.1.12   plugdb-node-c 10.201.1.13
//!  pods 10.202.1.0/24          pods 10.202.2.0/24          pods 10.202.3.0/24
//! ```
//!
//! Containment:
//! - every daemon starts as `nsenter --net=<namespace> CMD`, so iptables rules, bridges,
//!   pod interfaces and listeners exist only in the harness's namespaces; the machine's
//!   own namespace gains one veth end (`10.201.0.1/30`) with one route through it, to
//!   the pod range (the operator, running in the test process, asks members of engines
//!   that elect their leader who leads, as an in-cluster operator reaches its pods), and
//!   nothing else: no rules. Both go with the veth. Clients reach the API server at
//!   `10.201.0.2:6443` over the veth; Service addresses are reached from inside a node's
//!   namespace ([`Nodes::command`]).
//! - each kubelet has its own cgroup parent (`/plugdb-node-a`, ...), containerd root,
//!   state and socket, and pod log directory, so no node's pods mix with another's;
//! - the global kernel settings the kubelets rewrite are saved first and put back;
//! - processes are recorded with their start time and stopped by those PIDs; what they
//!   left (containers' processes) is found by namespace and cgroup membership;
//! - teardown runs on drop, so also when a test fails, and from signal handlers
//!   ([`teardown`]); a later start tears down what a crashed run left first.
//!
//! A node can be lost without warning ([`Nodes::cut`]: its link is cut, so the API
//! server sees it go `NotReady` and nothing on it answers) and come back
//! ([`Nodes::restore`]), or be drained and uncordoned the way an administrator does.
//!
//! One cluster serves a whole test run; its run directory is fixed (`PLUGDB_NODE_DIR`,
//! default `/tmp/plugdb-node`) so that a crashed run can be found and cleaned.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Client;
use kube::api::Api;

use crate::control_plane::{ControlPlane, Network, Options, Processes};

mod autoscaling;
mod csi;
mod teardown;

pub use csi::GROWING_STORAGE_CLASS;

use teardown::{cni_netns, remove_containers};
pub use teardown::{machine_state, state_difference, teardown};

/// Name of the hub's network namespace (control plane, DNS, provisioner); the nodes'
/// namespaces are named after the nodes, which begin with it.
pub const NETNS: &str = "plugdb-node";
/// The hub's address on its veth to the machine: the API server, DNS, MinIO.
pub const HUB_ADDRESS: &str = "10.201.0.2";
/// Address of the machine's end of the veth pair.
pub const HOST_ADDRESS: &str = "10.201.0.1";
/// The veth end in the machine's own namespace.
pub const VETH_HOST: &str = "plugdb-host";
const VETH_HUB: &str = "plugdb-eth0";
/// The bridge in the hub that joins the nodes, and its address.
const HUB_BRIDGE: &str = "plugdb-br";
const HUB_BRIDGE_ADDRESS: &str = "10.201.1.1";
/// Pod addresses of the whole cluster; each node has a /24 of it (CNI bridge +
/// host-local), inside its namespace only.
pub const POD_CIDR: &str = "10.202.0.0/16";
/// The pod bridge inside each node's namespace.
const BRIDGE: &str = "cni0";
/// Service virtual IPs (kube-proxy, iptables mode), inside the nodes' namespaces only.
pub const SERVICE_CIDR: &str = "10.203.0.0/16";
/// The cluster DNS Service address.
pub const DNS_ADDRESS: &str = "10.203.0.10";
/// The storage class local-path-provisioner serves; the default class.
pub const STORAGE_CLASS: &str = "local-path";
/// A second class of local-path-provisioner's: each node's volumes on a filesystem of
/// their own, [`SMALL_BYTES`] large (ext4 on a loop device), so that what a volume holds
/// fills it as it fills a disk: statfs, `df` and ENOSPC are that filesystem's, not the
/// machine's. Members on different nodes never share one.
pub const SMALL_STORAGE_CLASS: &str = "local-small";
/// A class a scenario may make over the default class's volumes, allowing expansion
/// (local-path has no resizer: its claims ask, and keep their capacity).
pub const GROWABLE_STORAGE_CLASS: &str = "plugdb-growable";
/// The size of each node's [`SMALL_STORAGE_CLASS`] filesystem.
pub const SMALL_BYTES: u64 = 1 << 30;
/// Image of the volume provisioner's helper pods.
pub const HELPER_IMAGE: &str = "localhost/plugdb/helper:1";
const PAUSE_IMAGE: &str = "localhost/plugdb/pause:1";
/// The nodes' zones, one node each; a node is named `plugdb-node-<zone>`.
pub const ZONES: [&str; 3] = ["a", "b", "c"];
/// Kernel settings the kubelet rewrites at start (global, not per network namespace);
/// saved before the nodes start and put back at teardown.
pub const GLOBAL_SYSCTLS: &[&str] = &[
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
];

/// Nodes whose link is cut now (bit per zone), so that clients run from one that is not.
static CUT: AtomicU8 = AtomicU8::new(0);
/// Nodes brought back by [`Nodes::restore`] since the last [`Nodes::restore_all`].
static RETURNED: AtomicU8 = AtomicU8::new(0);

/// One of the three nodes: where it lives and what it is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeSpec {
    index: usize,
}

impl NodeSpec {
    /// Every node, in zone order.
    pub fn all() -> impl Iterator<Item = NodeSpec> {
        (0..ZONES.len()).map(|index| NodeSpec { index })
    }

    /// The node called `name`.
    pub fn named(name: &str) -> Option<NodeSpec> {
        Self::all().find(|n| n.name() == name)
    }

    /// Its zone (`topology.kubernetes.io/zone`).
    pub fn zone(self) -> &'static str {
        ZONES[self.index]
    }

    /// The Node's name, also the name of its network namespace.
    pub fn name(self) -> String {
        format!("{NETNS}-{}", self.zone())
    }

    /// Its address on the hub's bridge: kubelet, node IP.
    pub fn address(self) -> String {
        format!("10.201.1.{}", 11 + self.index)
    }

    /// Its pod range.
    pub fn pod_cidr(self) -> String {
        format!("10.202.{}.0/24", 1 + self.index)
    }

    fn pod_gateway(self) -> String {
        format!("10.202.{}.1", 1 + self.index)
    }

    /// The veth end in the hub: cutting it loses the node.
    fn hub_link(self) -> String {
        format!("plugdb-{}", self.zone())
    }

    /// Its run directory (logs, kubelet and containerd state).
    fn dir(self, run: &Path) -> PathBuf {
        run.join(self.zone())
    }
}

/// The run directory: `PLUGDB_NODE_DIR`, else `/tmp/plugdb-node`.
pub fn run_dir() -> PathBuf {
    std::env::var_os("PLUGDB_NODE_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp/plugdb-node"))
}

/// Where a node's containerd keeps images between runs, so that a second run imports nothing.
fn image_store(node: NodeSpec) -> PathBuf {
    let cache = std::env::var_os("PLUGDB_CACHE").map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache"))
            .join("plugdb")
    });
    cache.join(format!("containerd-{}", node.zone()))
}

/// Three running nodes with their control plane. Dropping it tears everything down.
pub struct Nodes {
    /// The control plane, inside the hub's namespace.
    pub control_plane: ControlPlane,
    /// An admin client (from the machine's namespace, through the veth).
    pub client: Client,
    /// Path of an admin kubeconfig (usable by kubectl).
    pub kubeconfig: PathBuf,
    /// Directory holding kubectl and the other Kubernetes binaries.
    pub bin_dir: PathBuf,
    /// The operator's image (this build's `plugdb`), imported into every node.
    pub operator_image: String,
    hub: Processes,
    nodes: Vec<Processes>,
    dir: PathBuf,
    /// Held while the nodes run (released by the kernel if the process dies).
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

/// `ip ARGS` inside the network namespace `netns`.
fn ip_in(netns: &str, args: &[&str]) -> Result<String> {
    let mut full = vec!["-n", netns];
    full.extend_from_slice(args);
    run("ip", &full)
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
        bail!("{} failed ({}): a part of the test nodes is missing and could not be built", path.display(), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What the machine must offer; each missing piece is named with how to get it.
fn check_prerequisites() -> Result<()> {
    if !is_root() {
        bail!("the test nodes need root (network namespaces, mounts, cgroups): run the tests as root");
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
        ("mkfs.ext4", "e2fsprogs"),
        ("mkfs.xfs", "xfsprogs"),
        ("xfs_growfs", "xfsprogs"),
        ("mountpoint", "util-linux"),
        ("losetup", "mount"),
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
        bail!("the test nodes cannot start; missing: {} (scripts/install-deps.sh installs them)", missing.join(", "));
    }
    Ok(())
}

fn is_root() -> bool {
    run("id", &["-u"]).is_ok_and(|s| s.trim() == "0")
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(tool)).find(|p| p.is_file())
}

impl Nodes {
    /// Builds what is missing (cached), tears down what a crashed run left, and starts
    /// the control plane and the three nodes; returns once every node is Ready with DNS
    /// and a default storage class.
    pub async fn start() -> Result<Self> {
        check_prerequisites()?;
        let dir = run_dir();
        std::fs::create_dir_all(&dir)?;
        // One cluster per machine: its namespaces, addresses and run directory are fixed.
        let lock = std::fs::File::create(dir.join("lock"))?;
        if lock.try_lock().is_err() {
            bail!("other test nodes are running on this machine (they hold {}); wait for them to finish", dir.join("lock").display());
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
            eprintln!("nodes: cleaned up after an earlier run: {}", report.join("; "));
        }
        let started = Instant::now();
        let bin_dir = crate::control_plane::binaries_dir()?;
        let tools: BTreeMap<String, PathBuf> = script("node-tools.sh", &[])?
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), PathBuf::from(v))))
            .collect();
        let index = PathBuf::from(script("node-images.sh", &[])?.trim());
        // The operator's image around this build's binary and bundled engines: backup
        // Jobs and member agents run it, and so does the operator when installed by its chart.
        let binary = crate::plugdb_binary();
        let engines = crate::component_path("postgres").parent().context("the components' directory")?.to_path_buf();
        let operator_index =
            PathBuf::from(script("node-images.sh", &["--operator".as_ref(), binary.as_os_str(), engines.as_os_str()])?.trim());
        let operator_image = tag_of(&operator_index)?;
        // NetworkPolicies are enforced on every node, as a cluster's network does.
        let router = tools.get("kube-router").context("scripts/node-tools.sh did not report kube-router")?;
        let add_on = ["--add-on".as_ref(), "kube-router".as_ref(), router.as_os_str(), "iptables ipset".as_ref()];
        let policies_index = PathBuf::from(script("node-images.sh", &add_on)?.trim());
        let policies_image = tag_of(&policies_index)?;

        std::fs::create_dir_all(&dir)?;
        save_sysctls(&dir)?;
        std::fs::write(dir.join("cni-netns-before"), cni_netns().join("\n"))?;
        create_hub()?;
        let mut nodes = Vec::new();
        for node in NodeSpec::all() {
            create_node_namespace(node)?;
            create_cgroup_parent(node)?;
            let node_dir = node.dir(&dir);
            std::fs::create_dir_all(&node_dir)?;
            mount_small_filesystem(&node_dir)?;
            let mut daemons = Processes::in_namespace(&node.name(), node_dir.clone(), dir.join("pids"));
            start_containerd(&mut daemons, node, &node_dir).await?;
            nodes.push(daemons);
        }
        // The same archives into every node's store, side by side.
        std::thread::scope(|s| {
            let imports: Vec<_> = NodeSpec::all()
                .map(|node| {
                    let (dir, indices) = (&dir, [&index, &operator_index, &policies_index]);
                    s.spawn(move || indices.iter().try_for_each(|index| import_images(node, &node.dir(dir), index)))
                })
                .collect();
            imports.into_iter().try_for_each(|i| i.join().map_err(|_| anyhow::anyhow!("an image import panicked"))?)
        })?;

        let control_plane = ControlPlane::start_with(Options {
            controller_manager: true,
            network: Network::Namespace {
                name: NETNS.into(),
                address: HUB_ADDRESS.into(),
                service_cidr: SERVICE_CIDR.into(),
                dir: dir.join("control-plane"),
            },
            feature_gates: None,
        })
        .await?;
        let client = control_plane.client.clone();
        let kubeconfig = control_plane.kubeconfig.clone();

        std::fs::write(dir.join("resolv.conf"), format!("nameserver {DNS_ADDRESS}\n"))?;
        for (node, daemons) in NodeSpec::all().zip(nodes.iter_mut()) {
            start_kubelet(daemons, node, &dir, &bin_dir, &kubeconfig)?;
            start_kube_proxy(daemons, node, &node.dir(&dir), &bin_dir, &kubeconfig)?;
            csi::start_on_node(daemons, node, &dir, &tools, &kubeconfig)?;
        }
        let mut hub = Processes::in_namespace(NETNS, dir.clone(), dir.join("pids"));
        start_coredns(&mut hub, &dir, &tools, &kubeconfig, &client).await?;
        start_local_path(&mut hub, &dir, &tools, &kubeconfig, &client).await?;
        csi::start_in_hub(&mut hub, &dir, &tools, &kubeconfig, &client).await?;
        autoscaling::start(&mut hub, &dir, &tools, &kubeconfig, &client).await?;
        let nodes = Self { control_plane, client, kubeconfig, bin_dir, operator_image, hub, nodes, dir, _lock: lock };
        nodes.wait_ready().await?;
        enforce_network_policies(&nodes.client, &policies_image).await?;
        eprintln!(
            "nodes: {} Ready in {:.1} s",
            NodeSpec::all().map(NodeSpec::name).collect::<Vec<_>>().join(", "),
            started.elapsed().as_secs_f64()
        );
        Ok(nodes)
    }

    async fn wait_ready(&self) -> Result<()> {
        let api: Api<NodeObject> = Api::all(self.client.clone());
        let deadline = Instant::now() + Duration::from_secs(120);
        for (node, daemons) in NodeSpec::all().zip(&self.nodes) {
            while !is_ready(&api, &node.name()).await {
                if Instant::now() > deadline {
                    bail!("node {} not Ready within 120 s; kubelet log: {}", node.name(), daemons.log_tail("kubelet"));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        Ok(())
    }

    /// A command that runs `program` in the namespace of a node whose link is up, where
    /// pod and Service addresses are reachable (e.g. `psql -h <service IP>`): a client
    /// on a node that still runs.
    ///
    /// A node lost and brought back during the scenario is passed over while another
    /// runs: its side of the partition is the failure being tested, not the clients'
    /// (its stale Service rules still lead to an old primary: see docs/operations.md).
    pub fn command(program: &str) -> Command {
        let (cut, returned) = (CUT.load(Ordering::SeqCst), RETURNED.load(Ordering::SeqCst));
        let up = |n: &NodeSpec| cut & (1 << n.index) == 0;
        let node = NodeSpec::all()
            .find(|n| up(n) && returned & (1 << n.index) == 0)
            .or_else(|| NodeSpec::all().find(up))
            .unwrap_or(NodeSpec { index: 0 });
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", node.name())).arg(program);
        c
    }

    /// A command that runs `program` in the hub's namespace, beside the control plane:
    /// a server there (object storage) is reached by every node at [`HUB_ADDRESS`].
    pub fn hub_command(program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{NETNS}")).arg(program);
        c
    }

    /// Loses `node` without warning: its link to the others is cut, so its kubelet stops
    /// reporting (the API server marks it `NotReady`), nothing on it answers, and its
    /// members cannot reach anyone. Its processes keep running, as on a partitioned machine.
    pub fn cut(&self, node: &str) -> Result<()> {
        let spec = NodeSpec::named(node).with_context(|| format!("no node {node}"))?;
        ip_in(NETNS, &["link", "set", &spec.hub_link(), "down"])?;
        CUT.fetch_or(1 << spec.index, Ordering::SeqCst);
        Ok(())
    }

    /// Brings a node lost by [`Nodes::cut`] back.
    pub fn restore(&self, node: &str) -> Result<()> {
        let spec = NodeSpec::named(node).with_context(|| format!("no node {node}"))?;
        ip_in(NETNS, &["link", "set", &spec.hub_link(), "up"])?;
        CUT.fetch_and(!(1 << spec.index), Ordering::SeqCst);
        RETURNED.fetch_or(1 << spec.index, Ordering::SeqCst);
        Ok(())
    }

    /// Brings back every node lost by [`Nodes::cut`] and not restored (a scenario that
    /// failed while one was lost); returns their names.
    pub fn restore_all(&self) -> Vec<String> {
        let cut = CUT.load(Ordering::SeqCst);
        let lost: Vec<String> = NodeSpec::all().filter(|n| cut & (1 << n.index) != 0).map(NodeSpec::name).collect();
        for node in &lost {
            let _ = self.restore(node);
        }
        RETURNED.store(0, Ordering::SeqCst);
        lost
    }

    /// Whether `node` is Ready now, as the API server says.
    pub async fn ready(&self, node: &str) -> bool {
        is_ready(&Api::all(self.client.clone()), node).await
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

    /// The run directory (logs of every daemon under it; a node's under its zone).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last lines of a hub daemon's log (`coredns`, `local-path-provisioner`), or of
    /// a node's, as `a/kubelet`.
    pub fn log_tail(&self, name: &str) -> String {
        match name.split_once('/') {
            Some((zone, daemon)) => ZONES.iter().position(|z| *z == zone).map(|i| self.nodes[i].log_tail(daemon)).unwrap_or_default(),
            None => self.hub.log_tail(name),
        }
    }
}

async fn is_ready(api: &Api<NodeObject>, name: &str) -> bool {
    api.get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|n| n.status?.conditions)
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

impl Drop for Nodes {
    fn drop(&mut self) {
        // Teardown stops every recorded process in order (containers before containerd);
        // the processes' own drops then only reap them.
        let report = teardown(&self.dir);
        CUT.store(0, Ordering::SeqCst);
        if report.iter().any(|l| l.starts_with("failed")) {
            eprintln!("nodes teardown: {}", report.join("; "));
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

/// The hub: the machine's veth peer, the bridge the nodes join, a route to each node's
/// pods, and forwarding between them, all inside the hub's namespace but the veth end
/// and the pod range's route in the machine's.
fn create_hub() -> Result<()> {
    for (route, what) in [(POD_CIDR, "pod"), (SERVICE_CIDR, "Service"), ("10.201.0.0/30", "veth")] {
        let existing = run("ip", &["route", "show", "to", "match", route])?;
        if existing.lines().any(|l| !l.starts_with("default")) {
            bail!("the machine already routes the nodes' {what} range {route} ({}); the nodes would shadow it", existing.trim());
        }
    }
    run("ip", &["netns", "add", NETNS])?;
    ip_in(NETNS, &["link", "set", "lo", "up"])?;
    run("ip", &["link", "add", VETH_HOST, "type", "veth", "peer", "name", VETH_HUB, "netns", NETNS])?;
    run("ip", &["addr", "add", &format!("{HOST_ADDRESS}/30"), "dev", VETH_HOST])?;
    run("ip", &["link", "set", VETH_HOST, "up"])?;
    ip_in(NETNS, &["addr", "add", &format!("{HUB_ADDRESS}/30"), "dev", VETH_HUB])?;
    ip_in(NETNS, &["link", "set", VETH_HUB, "up"])?;
    // The pod range, through the veth only (removed with it).
    run("ip", &["route", "add", POD_CIDR, "via", HUB_ADDRESS, "dev", VETH_HOST])?;
    ip_in(NETNS, &["link", "add", HUB_BRIDGE, "type", "bridge"])?;
    ip_in(NETNS, &["addr", "add", &format!("{HUB_BRIDGE_ADDRESS}/24"), "dev", HUB_BRIDGE])?;
    ip_in(NETNS, &["link", "set", HUB_BRIDGE, "up"])?;
    run("nsenter", &[&format!("--net=/run/netns/{NETNS}"), "sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    Ok(())
}

/// A node's namespace: a veth to the hub's bridge, routes to the hub and to every other
/// node's pods over the bridge, and the node's own pod bridge.
fn create_node_namespace(node: NodeSpec) -> Result<()> {
    let ns = node.name();
    run("ip", &["netns", "add", &ns])?;
    ip_in(&ns, &["link", "set", "lo", "up"])?;
    ip_in(NETNS, &["link", "add", &node.hub_link(), "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
    ip_in(NETNS, &["link", "set", &node.hub_link(), "master", HUB_BRIDGE])?;
    ip_in(NETNS, &["link", "set", &node.hub_link(), "up"])?;
    ip_in(NETNS, &["route", "add", &node.pod_cidr(), "via", &node.address()])?;
    ip_in(&ns, &["addr", "add", &format!("{}/24", node.address()), "dev", "eth0"])?;
    ip_in(&ns, &["link", "set", "eth0", "up"])?;
    ip_in(&ns, &["route", "add", "10.201.0.0/30", "via", HUB_BRIDGE_ADDRESS])?;
    for other in NodeSpec::all().filter(|o| *o != node) {
        ip_in(&ns, &["route", "add", &other.pod_cidr(), "via", &other.address()])?;
    }
    run("nsenter", &[&format!("--net=/run/netns/{ns}"), "sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    // The pod bridge up front (the CNI bridge plugin adopts it), so that Service
    // addresses have a route from the namespace itself: kube-proxy rewrites them to pod
    // addresses; an address it does not serve stays on the bridge, never leaves.
    let gateway = node.pod_gateway();
    ip_in(&ns, &["link", "add", BRIDGE, "type", "bridge"])?;
    ip_in(&ns, &["addr", "add", &format!("{gateway}/24"), "dev", BRIDGE])?;
    ip_in(&ns, &["link", "set", BRIDGE, "up"])?;
    ip_in(&ns, &["route", "add", SERVICE_CIDR, "dev", BRIDGE, "src", &gateway])?;
    Ok(())
}

/// The cgroup v1 hierarchies mounted under `/sys/fs/cgroup` (one directory each).
pub(crate) fn cgroup_hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// The node's own cgroup parent in every hierarchy, so its pods never mix with another
/// node's; cpuset needs its CPUs and memory nodes copied from the root to take tasks.
fn create_cgroup_parent(node: NodeSpec) -> Result<()> {
    for hierarchy in cgroup_hierarchies() {
        let parent = hierarchy.join(node.name());
        std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(hierarchy.join(file)) {
                std::fs::write(parent.join(file), value.trim()).with_context(|| format!("writing {}", parent.join(file).display()))?;
            }
        }
    }
    Ok(())
}

async fn start_containerd(daemons: &mut Processes, node: NodeSpec, dir: &Path) -> Result<()> {
    let store = image_store(node);
    std::fs::create_dir_all(&store)?;
    let state = dir.join("containerd");
    std::fs::create_dir_all(dir.join("cni/net.d"))?;
    std::fs::write(
        dir.join("cni/net.d/10-plugdb.conflist"),
        serde_json::to_string_pretty(&serde_json::json!({
            "cniVersion": "1.0.0",
            "name": node.name(),
            "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": false, "hairpinMode": true,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": node.pod_cidr(), "gateway": node.pod_gateway()}]],
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
            bail!("containerd of {} did not serve {} within 30 s: {}", node.name(), socket.display(), daemons.log_tail("containerd"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Containers a crashed run left in the persistent store are stale: remove them.
    remove_containers(dir);
    Ok(())
}

/// `ctr` in containerd's Kubernetes namespace, for the node whose run directory is `dir`.
fn ctr(dir: &Path, args: &[&str]) -> Result<String> {
    let socket = dir.join("containerd/containerd.sock").to_string_lossy().to_string();
    let mut full = vec!["-a", &socket, "-n", "k8s.io"];
    full.extend_from_slice(args);
    run("ctr", &full)
}

/// Imports each image archive unless every one of its tags already names what this
/// harness imported from an archive with the same content (config digest).
fn import_images(node: NodeSpec, dir: &Path, index: &Path) -> Result<()> {
    let text = std::fs::read_to_string(index).with_context(|| format!("reading the image index {}", index.display()))?;
    let record = image_store(node).join("imported");
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
    // A tag imported earlier under a repository this index still names but no longer
    // lists (the operator's image is tagged by its content, so each build adds one)
    // goes, or every build's image stays in the node's store for good.
    let listed: Vec<&str> = text.lines().flat_map(|l| l.split_whitespace().skip(2)).collect();
    let repository = |tag: &str| tag.rsplit_once(':').map_or(tag.to_string(), |(repo, _)| repo.to_string());
    let repositories: Vec<String> = listed.iter().map(|t| repository(t)).collect();
    let stale: Vec<String> = records
        .iter()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|tag| !listed.contains(tag) && repositories.contains(&repository(tag)))
        .map(str::to_string)
        .collect();
    for tag in &stale {
        let _ = ctr(dir, &["images", "rm", "--sync", tag]);
    }
    records.retain(|l| l.split_whitespace().nth(1).is_none_or(|tag| !stale.iter().any(|s| s == tag)));
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
        eprintln!("{}: imported {imported} image archive(s)", node.name());
    }
    Ok(())
}

fn start_kubelet(daemons: &mut Processes, node: NodeSpec, run_dir: &Path, bin_dir: &Path, kubeconfig: &Path) -> Result<()> {
    let dir = node.dir(run_dir);
    let config = format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {address}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}
authorization: {{mode: AlwaysAllow}}
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
# Each node's pods under a parent of its own.
cgroupRoot: /{name}
podLogsDir: {logs}
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
        address = node.address(),
        name = node.name(),
        logs = dir.join("pod-logs").display(),
        socket = dir.join("containerd/containerd.sock").display(),
        resolv = run_dir.join("resolv.conf").display(),
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
        node.name(),
        "--node-ip".into(),
        node.address(),
        "--node-labels".into(),
        format!("topology.kubernetes.io/zone={}", node.zone()),
        "--v".into(),
        "1".into(),
    ];
    daemons.spawn("kubelet", &bin_dir.join("kubelet"), &args)
}

fn start_kube_proxy(daemons: &mut Processes, node: NodeSpec, dir: &Path, bin_dir: &Path, kubeconfig: &Path) -> Result<()> {
    let config = format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {{kubeconfig: {kubeconfig}}}
hostnameOverride: {name}
clusterCIDR: {POD_CIDR}
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {{maxPerCore: 0, min: 0}}
"#,
        kubeconfig = kubeconfig.display(),
        name = node.name(),
    );
    std::fs::write(dir.join("kube-proxy.yaml"), config)?;
    let args = vec!["--config".into(), dir.join("kube-proxy.yaml").to_string_lossy().to_string(), "--v".into(), "1".into()];
    daemons.spawn("kube-proxy", &bin_dir.join("kube-proxy"), &args)
}

/// CoreDNS as a process in the hub, serving the standard kube-dns Service.
async fn start_coredns(
    daemons: &mut Processes,
    dir: &Path,
    tools: &BTreeMap<String, PathBuf>,
    kubeconfig: &Path,
    client: &Client,
) -> Result<()> {
    let corefile = format!(
        ".:53 {{\n    bind {HUB_ADDRESS}\n    errors\n    kubernetes cluster.local in-addr.arpa ip6.arpa {{\n        kubeconfig {} plugdb-test\n        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n    }}\n    cache 5\n}}\n",
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
endpoints: [{{addresses: ["{HUB_ADDRESS}"], conditions: {{ready: true}}}}]"#
        ),
    )
    .await
}

/// The first tag an image index (`scripts/node-images.sh`) names.
fn tag_of(index: &Path) -> Result<String> {
    let text = std::fs::read_to_string(index).with_context(|| format!("reading the image index {}", index.display()))?;
    Ok(text.split_whitespace().nth(2).with_context(|| format!("the image index {} names no tag", index.display()))?.to_string())
}

/// kube-router's firewall, enforcing NetworkPolicies with iptables and ipset, as the
/// DaemonSet a cluster runs it as: on every node, in the node's network namespace
/// (`hostNetwork`, with `NET_ADMIN` and `NET_RAW`), its routing and Service proxy off
/// (the bridge and kube-proxy do those). Waits until it runs on each and has hooked its
/// chains into the node's forwarding.
async fn enforce_network_policies(client: &Client, image: &str) -> Result<()> {
    const NAME: &str = "kube-router";
    crate::apply_yaml(
        client,
        "plugdb-node",
        &format!(
            r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: {NAME}, namespace: kube-system}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {NAME}}}
rules:
- {{apiGroups: [""], resources: [pods, namespaces, nodes, services, endpoints], verbs: [get, list, watch]}}
- {{apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [get, list, watch]}}
- {{apiGroups: [networking.k8s.io], resources: [networkpolicies], verbs: [get, list, watch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {NAME}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {NAME}}}
subjects: [{{kind: ServiceAccount, name: {NAME}, namespace: kube-system}}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: {NAME}, namespace: kube-system}}
spec:
  selector: {{matchLabels: {{app: {NAME}}}}}
  template:
    metadata: {{labels: {{app: {NAME}}}}}
    spec:
      hostNetwork: true
      serviceAccountName: {NAME}
      tolerations: [{{operator: Exists}}]
      containers:
      - name: {NAME}
        image: {image}
        imagePullPolicy: Never
        command: [/usr/local/bin/{NAME}]
        args: ["--run-router=false", "--run-firewall=true", "--run-service-proxy=false", "--enable-cni=false",
               "--hostname-override=$(NODE_NAME)", "--service-cluster-ip-range={SERVICE_CIDR}", "--health-port=0", "--v=1"]
        env: [{{name: NODE_NAME, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}]
        securityContext: {{capabilities: {{add: [NET_ADMIN, NET_RAW]}}}}"#
        ),
    )
    .await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "kube-system");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let listed = pods.list(&kube::api::ListParams::default().labels(&format!("app={NAME}"))).await?;
        let running = |p: &&k8s_openapi::api::core::v1::Pod| {
            p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).is_some_and(|c| c.iter().all(|c| c.ready))
        };
        let running = listed.items.iter().filter(running).count();
        let hooked = |n: NodeSpec| run("nsenter", &[&format!("--net=/run/netns/{}", n.name()), "iptables", "-S", "KUBE-ROUTER-FORWARD"]);
        if running == NodeSpec::all().count() && NodeSpec::all().all(|n| hooked(n).is_ok()) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{NAME} runs on {running} of the nodes after 120 s");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The filesystem of a node's [`SMALL_STORAGE_CLASS`] volumes: a sparse file of
/// [`SMALL_BYTES`] in its run directory, formatted ext4 (no blocks reserved for root, so
/// that what is used is what the engine wrote) and mounted through a loop device that
/// goes with its unmount ([`teardown`] unmounts it).
fn mount_small_filesystem(node_dir: &Path) -> Result<()> {
    let (image, mount) = (node_dir.join("small.img"), node_dir.join("small"));
    std::fs::File::create(&image)?.set_len(SMALL_BYTES)?;
    std::fs::create_dir_all(&mount)?;
    let s = |p: &Path| p.to_string_lossy().to_string();
    run("mkfs.ext4", &["-q", "-F", "-m", "0", &s(&image)])?;
    run("mount", &["-o", "loop", &s(&image), &s(&mount)])?;
    Ok(())
}

/// local-path-provisioner as a process in the hub: the default storage class, each
/// node's volumes under its own run directory (node-local, as on real machines),
/// created and removed by helper pods on that node; and [`SMALL_STORAGE_CLASS`], each
/// node's volumes on its small filesystem.
async fn start_local_path(
    daemons: &mut Processes,
    dir: &Path,
    tools: &BTreeMap<String, PathBuf>,
    kubeconfig: &Path,
    client: &Client,
) -> Result<()> {
    let (mut paths, mut small) = (Vec::new(), Vec::new());
    for node in NodeSpec::all() {
        let volumes = node.dir(dir).join("volumes");
        std::fs::create_dir_all(&volumes)?;
        paths.push(serde_json::json!({"node": node.name(), "paths": [volumes]}));
        small.push(serde_json::json!({"node": node.name(), "paths": [node.dir(dir).join("small")]}));
    }
    let config = serde_json::json!({"storageClassConfigs": {
        STORAGE_CLASS: {"nodePathMap": paths},
        GROWABLE_STORAGE_CLASS: {"nodePathMap": paths},
        SMALL_STORAGE_CLASS: {"nodePathMap": small},
    }});
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
reclaimPolicy: Delete
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: {SMALL_STORAGE_CLASS}}}
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

/// A bench on the real nodes, run until it ends or is interrupted (SIGINT, SIGTERM):
/// either way the nodes are torn down (dropping what the bench holds tears them down).
/// The in-process operator logs to `log`.
pub async fn bench_until_interrupted(log: &str, bench: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let file = std::fs::File::create(log).with_context(|| format!("creating {log}"))?;
    let filter = plugdb::logging::filter("info,kube=warn");
    let subscriber = plugdb::logging::subscriber(plugdb::logging::LogFormat::Text, filter, std::sync::Mutex::new(file), false);
    tracing::subscriber::set_global_default(subscriber).context("the operator's log")?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("a SIGTERM handler")?;
    tokio::select! {
        done = bench => done,
        _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted"),
        _ = term.recv() => anyhow::bail!("terminated"),
    }
}
