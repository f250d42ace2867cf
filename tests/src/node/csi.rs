//! Volumes that really grow: csi-loop (`tests/csi-loop`) on every node, driven by the
//! Kubernetes CSI sidecars, as [`GROWING_STORAGE_CLASS`].
//!
//! Each node runs the driver, which registers itself with the node's kubelet, and an
//! external-provisioner deployed per node (`--node-deployment`): it makes the volumes
//! of the claims scheduled to its node. One external-resizer, in the hub, records a
//! claim's new size; the node's kubelet then has the driver grow the mounted volume.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use kube::Client;

use super::NodeSpec;
use crate::control_plane::Processes;

/// The driver's name.
pub const DRIVER: &str = "loop.csi.plugdb.io";
/// The class of csi-loop's volumes: each its own XFS on a loop device on its node (at
/// least 300 MiB), grown online when its claim asks for more.
pub const GROWING_STORAGE_CLASS: &str = "csi-loop";

fn s(p: &Path) -> String {
    p.to_string_lossy().to_string()
}

fn tool<'a>(tools: &'a BTreeMap<String, PathBuf>, name: &str) -> Result<&'a PathBuf> {
    tools.get(name).with_context(|| format!("scripts/node-tools.sh did not report {name}"))
}

/// The driver's socket on `node`, where its kubelet looks for it.
fn socket(node: NodeSpec, run_dir: &Path) -> PathBuf {
    node.dir(run_dir).join("kubelet/plugins").join(DRIVER).join("csi.sock")
}

/// Starts the driver and a provisioner on `node` (after its kubelet).
pub(super) fn start_on_node(
    daemons: &mut Processes,
    node: NodeSpec,
    run_dir: &Path,
    tools: &BTreeMap<String, PathBuf>,
    kubeconfig: &Path,
) -> Result<()> {
    let dir = node.dir(run_dir);
    let socket = socket(node, run_dir);
    let driver = vec![
        "--name".into(),
        DRIVER.into(),
        "--node".into(),
        node.name(),
        "--dir".into(),
        s(&dir.join("csi-volumes")),
        "--endpoint".into(),
        s(&socket),
        "--registry".into(),
        s(&dir.join("kubelet/plugins_registry")),
    ];
    daemons.spawn("csi-loop", tool(tools, "csi-loop")?, &driver)?;
    // external-provisioner learns its node from NODE_NAME alone.
    let provisioner = vec![
        format!("NODE_NAME={}", node.name()),
        s(tool(tools, "csi-provisioner")?),
        format!("--csi-address={}", s(&socket)),
        format!("--kubeconfig={}", s(kubeconfig)),
        "--node-deployment=true".into(),
        "--strict-topology=true".into(),
        "--immediate-topology=false".into(),
        "--timeout=60s".into(),
        "--v=2".into(),
    ];
    daemons.spawn("csi-provisioner", Path::new("/usr/bin/env"), &provisioner)
}

/// Starts the resizer in the hub (it asks node a's driver what it can do) and makes the
/// driver's CSIDriver and [`GROWING_STORAGE_CLASS`].
pub(super) async fn start_in_hub(
    hub: &mut Processes,
    run_dir: &Path,
    tools: &BTreeMap<String, PathBuf>,
    kubeconfig: &Path,
    client: &Client,
) -> Result<()> {
    let first = NodeSpec::all().next().context("a node")?;
    crate::apply_yaml(
        client,
        "plugdb-node",
        &format!(
            r#"apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {{name: {DRIVER}}}
spec:
  attachRequired: false
  podInfoOnMount: false
  fsGroupPolicy: File
  volumeLifecycleModes: [Persistent]
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: {GROWING_STORAGE_CLASS}}}
provisioner: {DRIVER}
parameters: {{csi.storage.k8s.io/fstype: xfs}}
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
reclaimPolicy: Delete"#
        ),
    )
    .await?;
    let resizer = vec![
        format!("--csi-address={}", s(&socket(first, run_dir))),
        format!("--kubeconfig={}", s(kubeconfig)),
        "--leader-election=false".into(),
        "--timeout=60s".into(),
        "--v=2".into(),
    ];
    hub.spawn("csi-resizer", tool(tools, "csi-resizer")?, &resizer)
}
