//! Tearing the node down, and checking that it left the machine as it found it.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{GLOBAL_SYSCTLS, NETNS, NodeSpec, VETH_HOST, cgroup_hierarchies, ctr, image_store, run, start_time};

/// The sandbox network namespaces containerd made (`/run/netns/cni-*`).
pub(super) fn cni_netns() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().to_string_lossy().to_string())
        .filter(|p| p.starts_with("/run/netns/cni-"))
        .collect();
    out.sort();
    out
}

/// Kills and deletes every task and container in containerd's Kubernetes namespace.
pub(super) fn remove_containers(dir: &Path) {
    let ids = |kind: &str| -> Vec<String> {
        ctr(dir, &[kind, "ls", "-q"]).map(|s| s.lines().map(str::to_string).filter(|l| !l.is_empty()).collect()).unwrap_or_default()
    };
    for task in ids("tasks") {
        let _ = ctr(dir, &["tasks", "kill", "-s", "SIGKILL", &task]);
    }
    for task in ids("tasks") {
        let _ = ctr(dir, &["tasks", "delete", "-f", &task]);
    }
    for container in ids("containers") {
        let _ = ctr(dir, &["containers", "delete", &container]);
    }
}

/// Stops recorded processes: SIGTERM to all, SIGKILL to those alive after `grace`. A
/// PID whose start time differs from the recorded one belongs to someone else now and
/// is left alone. Returns the names of those stopped.
fn stop_recorded(processes: &[&(String, u32, String)], grace: Duration) -> Vec<String> {
    fn alive((_, pid, start): &(String, u32, String)) -> bool {
        start_time(*pid).as_deref() == Some(start.as_str())
    }
    let targets: Vec<&(String, u32, String)> = processes.iter().copied().filter(|p| alive(p)).collect();
    for (_, pid, _) in &targets {
        let _ = run("kill", &["-TERM", &pid.to_string()]);
    }
    let deadline = Instant::now() + grace;
    while targets.iter().any(|p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    for (_, pid, _) in targets.iter().filter(|p| alive(p)) {
        let _ = run("kill", &["-KILL", &pid.to_string()]);
    }
    targets.iter().map(|(name, pid, _)| format!("stopped {name} ({pid})")).collect()
}

/// Tears down whatever a node in `dir` left, in order: recorded processes (by PID),
/// containers, containerd, leftover processes in the namespace or the pods' cgroups,
/// mounts, sandbox namespaces, the node namespace and its veth, cgroups, kernel
/// settings. Idempotent; returns what it did (empty when there was nothing).
pub fn teardown(dir: &Path) -> Vec<String> {
    let mut report = Vec::new();
    let pid_files = [dir.join("pids"), dir.join("control-plane/pids")];
    let mut recorded: Vec<(String, u32, String)> = Vec::new();
    for file in &pid_files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        recorded.extend(text.lines().filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.to_string(), f.next()?.parse().ok()?, f.next().unwrap_or_default().to_string()))
        }));
    }
    // Everything but containerd first; containerd stays to remove the containers.
    let (runtime, others): (Vec<_>, Vec<_>) = recorded.iter().partition(|(n, ..)| n == "containerd");
    report.extend(stop_recorded(&others, Duration::from_secs(3)));
    for node in NodeSpec::all() {
        let node_dir = node.dir(dir);
        if node_dir.join("containerd/containerd.sock").exists() && ctr(&node_dir, &["version"]).is_ok() {
            remove_containers(&node_dir);
        }
    }
    report.extend(stop_recorded(&runtime, Duration::from_secs(5)));
    for file in &pid_files {
        let _ = std::fs::remove_file(file);
    }

    // Leftovers by membership, never by name: the harness's namespaces (shims) or a pod cgroup.
    let namespaces: Vec<String> = std::iter::once(NETNS.to_string()).chain(NodeSpec::all().map(NodeSpec::name)).collect();
    let inode = |path: String| std::fs::metadata(path).ok().map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    let netns_inodes: Vec<u64> = namespaces.iter().filter_map(|ns| inode(format!("/run/netns/{ns}"))).collect();
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let in_netns = inode(format!("/proc/{pid}/ns/net")).is_some_and(|i| netns_inodes.contains(&i));
        let in_pods = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .is_ok_and(|c| c.contains(":/kubepods") || c.contains(&format!(":/{NETNS}-")));
        if in_netns || in_pods {
            let _ = run("kill", &["-KILL", &pid.to_string()]);
            report.push(format!("killed leftover process {pid}"));
        }
    }

    // Mounts under the run directory and the image stores (deepest first), then sandbox namespaces.
    let roots: Vec<String> =
        std::iter::once(dir.to_path_buf()).chain(NodeSpec::all().map(image_store)).map(|p| format!("{}/", p.display())).collect();
    let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
        .filter(|m| roots.iter().any(|r| m.starts_with(r)))
        .collect();
    mounts.sort_by(|a, b| b.cmp(a));
    for m in &mounts {
        if run("umount", &["-l", m]).is_ok() {
            report.push(format!("unmounted {m}"));
        }
    }
    // Loop devices go with their unmount (the small filesystems) or the volume's
    // unpublish (csi-loop's); one still bound to a file of the run is released.
    let loops = run("losetup", &["--list", "--noheadings", "--output", "NAME,BACK-FILE"]).unwrap_or_default();
    let root = format!("{}/", dir.display());
    for device in loops.lines().filter_map(|l| l.split_once(' ')).filter(|(_, file)| file.trim().starts_with(&root)).map(|(d, _)| d) {
        if run("losetup", &["--detach", device]).is_ok() {
            report.push(format!("detached {device}"));
        }
    }
    let before = std::fs::read_to_string(dir.join("cni-netns-before")).unwrap_or_default();
    if dir.join("cni-netns-before").exists() {
        for ns in cni_netns().into_iter().filter(|ns| !before.lines().any(|b| b == ns)) {
            let _ = run("umount", &["-l", &ns]);
            let _ = std::fs::remove_file(&ns);
            report.push(format!("removed {ns}"));
        }
        let _ = std::fs::remove_file(dir.join("cni-netns-before"));
    }
    // The nodes' namespaces first (their veths go with them), the hub's last.
    for ns in namespaces.iter().rev() {
        if Path::new(&format!("/run/netns/{ns}")).exists() {
            match run("ip", &["netns", "delete", ns]) {
                Ok(_) => report.push(format!("deleted network namespace {ns}")),
                Err(e) => report.push(format!("failed to delete network namespace {ns}: {e:#}")),
            }
        }
    }
    // The veth goes with the namespace, once nothing holds it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while run("ip", &["link", "show", VETH_HOST]).is_ok() {
        if Instant::now() > deadline {
            let _ = run("ip", &["link", "delete", VETH_HOST]);
            report.push(format!("deleted {VETH_HOST}"));
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // The kubelets' cgroup parents, leaves first (and an older run's single `kubepods`).
    for hierarchy in cgroup_hierarchies() {
        let parents = NodeSpec::all().map(|n| n.name()).chain(std::iter::once("kubepods".to_string()));
        for top in parents.map(|p| hierarchy.join(p)).filter(|t| t.is_dir()) {
            remove_cgroup_tree(&top);
            report.push(format!("removed {}", top.display()));
        }
    }

    if let Ok(saved) = std::fs::read_to_string(dir.join("sysctl-before")) {
        for line in saved.lines().filter(|l| l.contains('=')) {
            if let Err(e) = run("sysctl", &["-qw", line]) {
                report.push(format!("failed to restore {line}: {e:#}"));
            }
        }
        let _ = std::fs::remove_file(dir.join("sysctl-before"));
        report.push("restored kernel settings".into());
    }
    // Per-run state goes; logs stay for a look after a failure, until the next start.
    let node_state = NodeSpec::all().flat_map(|n| {
        ["kubelet", "containerd", "cni", "volumes", "small", "small.img", "csi-volumes", "pod-logs"].map(|s| n.dir(dir).join(s))
    });
    for path in [dir.join("control-plane"), dir.join("metrics-server")].into_iter().chain(node_state) {
        let removed = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        if path.exists() && removed.is_err() {
            report.push(format!("failed to remove {}", path.display()));
        }
    }
    report
}

fn remove_cgroup_tree(path: &Path) {
    for child in std::fs::read_dir(path).into_iter().flatten().flatten() {
        if child.path().is_dir() {
            remove_cgroup_tree(&child.path());
        }
    }
    let _ = std::fs::remove_dir(path);
}

/// What the machine's own network namespace and kernel settings hold: links,
/// addresses, routes, iptables rules (legacy and nft, v4 and v6, without counters),
/// network namespaces, the per-namespace and global settings the node touches. Taken
/// before a node starts and after its teardown, the two must be equal.
pub fn machine_state() -> String {
    let mut out = String::new();
    let mut section = |title: &str, program: &str, args: &[&str]| {
        out.push_str(&format!("## {title}\n"));
        if let Ok(text) = run(program, args) {
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                // Packet counters change by themselves.
                let line = line.split_whitespace().filter(|w| !(w.starts_with('[') && w.ends_with(']'))).collect::<Vec<_>>().join(" ");
                out.push_str(&line);
                out.push('\n');
            }
        }
    };
    section("links", "ip", &["-br", "link"]);
    section("addresses", "ip", &["-br", "addr"]);
    section("routes", "ip", &["route"]);
    section("routes v6", "ip", &["-6", "route"]);
    section("iptables", "iptables-save", &[]);
    section("ip6tables", "ip6tables-save", &[]);
    section("iptables legacy", "iptables-legacy-save", &[]);
    section("network namespaces", "ip", &["netns", "list"]);
    section("loop devices", "losetup", &["--list", "--noheadings", "--output", "NAME,BACK-FILE"]);
    let mut keys: Vec<&str> = GLOBAL_SYSCTLS.to_vec();
    keys.extend(["net.ipv4.ip_forward", "net.ipv4.conf.all.route_localnet", "net.bridge.bridge-nf-call-iptables"]);
    out.push_str("## settings\n");
    for key in keys {
        let value = run("sysctl", &["-n", key]).unwrap_or_default();
        out.push_str(&format!("{key} = {}\n", value.trim()));
    }
    out
}

/// The lines of `after` that are not in `before`, and those gone, marked `+` and `-`.
pub fn state_difference(before: &str, after: &str) -> Vec<String> {
    let gone = before.lines().filter(|l| !after.lines().any(|a| a == *l)).map(|l| format!("- {l}"));
    let new = after.lines().filter(|l| !before.lines().any(|b| b == *l)).map(|l| format!("+ {l}"));
    gone.chain(new).collect()
}
