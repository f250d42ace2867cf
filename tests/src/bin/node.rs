//! Runs a throwaway cluster — a control plane, CoreDNS and local-path-provisioner in the
//! network namespace `plugdb-node`, and three real nodes (containerd, runc, kubelet,
//! kube-proxy) in `plugdb-node-a`, `-b` and `-c` — until interrupted, then tears it all
//! down. For trying plugdb by
//! hand (`scripts/run.sh` uses it); needs root:
//!
//! `cargo run -p plugdb-tests --bin node -- KUBECONFIG_PATH`
//!
//! Once the nodes serve, it writes the kubeconfig there and the operator's image (imported
//! into every node) to `KUBECONFIG_PATH.image`.

use anyhow::{Context, Result};
use plugdb_tests::node::Nodes;

#[tokio::main]
async fn main() -> Result<()> {
    let target = std::env::args().nth(1).context("usage: node KUBECONFIG_PATH")?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let node = tokio::select! {
        node = Nodes::start() => node?,
        _ = tokio::signal::ctrl_c() => { plugdb_tests::node::teardown(&plugdb_tests::node::run_dir()); return Ok(()) }
        _ = term.recv() => { plugdb_tests::node::teardown(&plugdb_tests::node::run_dir()); return Ok(()) }
    };
    // The operator's image the nodes hold (members run their agent from it), beside the
    // kubeconfig: `plugdb run --image` takes it, as the chart's operator knows its own.
    std::fs::write(format!("{target}.image"), &node.operator_image)?;
    // Written last and atomically: its presence means the cluster serves.
    let tmp = format!("{target}.tmp");
    std::fs::copy(&node.kubeconfig, &tmp)?;
    std::fs::rename(&tmp, &target)?;
    eprintln!("nodes Ready; kubeconfig: {target}; logs under {}", node.dir().display());
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    drop(node);
    let _ = std::fs::remove_file(&target);
    let _ = std::fs::remove_file(format!("{target}.image"));
    Ok(())
}
