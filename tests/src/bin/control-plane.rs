//! Runs a throwaway control plane (etcd, kube-apiserver, kube-controller-manager and
//! the kubelet stand-in) until interrupted, for trying plugdb by hand:
//!
//! `cargo run -p plugdb-tests --bin control-plane -- KUBECONFIG_PATH`

use anyhow::{Context, Result};
use plugdb_tests::ControlPlane;

#[tokio::main]
async fn main() -> Result<()> {
    let target = std::env::args().nth(1).context("usage: control-plane KUBECONFIG_PATH")?;
    let cp = ControlPlane::start().await?;
    // Written last and atomically: its presence means the control plane serves.
    let tmp = format!("{target}.tmp");
    std::fs::copy(&cp.kubeconfig, &tmp)?;
    std::fs::rename(&tmp, &target)?;
    eprintln!("control plane serving at {}; kubeconfig: {target}", cp.server);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    drop(cp);
    let _ = std::fs::remove_file(&target);
    Ok(())
}
