//! The resource metrics API an autoscaler reads: metrics-server in the hub, registered
//! with the API server's aggregation layer, reading each kubelet's resource metrics.
//! kube-controller-manager's HorizontalPodAutoscaler controller reads it from there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use kube::Client;

use super::HUB_ADDRESS;
use crate::control_plane::Processes;

/// Where metrics-server serves, in the hub.
const PORT: u16 = 4443;

/// Starts metrics-server and registers `v1beta1.metrics.k8s.io` at its address.
pub(super) async fn start(
    hub: &mut Processes,
    run_dir: &Path,
    tools: &BTreeMap<String, PathBuf>,
    kubeconfig: &Path,
    client: &Client,
) -> Result<()> {
    let server = tools.get("metrics-server").context("scripts/node-tools.sh did not report metrics-server")?;
    let kubeconfig = kubeconfig.to_string_lossy().to_string();
    let args = vec![
        format!("--kubeconfig={kubeconfig}"),
        format!("--authentication-kubeconfig={kubeconfig}"),
        format!("--authorization-kubeconfig={kubeconfig}"),
        format!("--secure-port={PORT}"),
        format!("--cert-dir={}", run_dir.join("metrics-server").display()),
        // The kubelets serve with certificates of their own making.
        "--kubelet-insecure-tls".into(),
        "--kubelet-preferred-address-types=InternalIP".into(),
        "--metric-resolution=15s".into(),
        "--v=1".into(),
    ];
    hub.spawn("metrics-server", server, &args)?;
    // A Service without a selector whose endpoint is the hub's address: the aggregation
    // layer reaches an extension API server at its endpoints.
    crate::apply_yaml(
        client,
        "plugdb-node",
        &format!(
            r#"apiVersion: v1
kind: Service
metadata: {{name: metrics-server, namespace: kube-system}}
spec:
  ports: [{{name: https, port: 443, targetPort: {PORT}}}]
---
apiVersion: v1
kind: Endpoints
metadata: {{name: metrics-server, namespace: kube-system}}
subsets: [{{addresses: [{{ip: {HUB_ADDRESS}}}], ports: [{{name: https, port: {PORT}}}]}}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {{name: v1beta1.metrics.k8s.io}}
spec:
  service: {{name: metrics-server, namespace: kube-system, port: 443}}
  group: metrics.k8s.io
  version: v1beta1
  insecureSkipTLSVerify: true
  groupPriorityMinimum: 100
  versionPriority: 100"#
        ),
    )
    .await
}
