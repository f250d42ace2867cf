//! Out of the box: the chart installed with helm, the operator in a pod from its own
//! image with the engines bundled in it, then the README's example Database, with
//! nothing else applied.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use plugdb::crd::Database;
use plugdb_tests::operator::Cluster;
use plugdb_tests::scenario::{WAIT, is_running};
use serde_json::json;

const OPERATOR_NS: &str = "plugdb-helm";
const NS: &str = "helm-demo";

/// Runs `program` with `args` against the cluster; its output, or the failure with what it said.
fn run(cluster: &Cluster, program: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .env("KUBECONFIG", cluster.backing.kubeconfig())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{} {args:?}: {said}{}", program.display(), String::from_utf8_lossy(&out.stderr));
    said
}

/// Whatever happens, the chart's operator goes and the in-process one comes back, so
/// that the scenarios after this one see one operator.
struct Restore {
    cluster: Arc<Cluster>,
    helm: std::path::PathBuf,
    kubectl: std::path::PathBuf,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let _ = Command::new(&self.helm)
            .args(["uninstall", "plugdb", "--namespace", OPERATOR_NS, "--wait", "--timeout", "2m"])
            .env("KUBECONFIG", self.cluster.backing.kubeconfig())
            .output();
        // Its pods gone too, not only its Deployment: two operators must never act at once.
        let gone = Command::new(&self.kubectl)
            .args(["wait", "--for=delete", "pod", "-l", "app.kubernetes.io/name=plugdb", "-n", OPERATOR_NS, "--timeout=120s"])
            .env("KUBECONFIG", self.cluster.backing.kubeconfig())
            .output();
        if !gone.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("the chart's operator pods did not go: {gone:?}");
        }
        if let Err(e) = self.cluster.restart_operator() {
            eprintln!("the in-process operator did not restart: {e:#}");
        }
    }
}

pub async fn helm_install_then_the_example_runs(cluster: Arc<Cluster>) {
    plugdb_tests::release::note(NS);
    plugdb_tests::release::note(OPERATOR_NS);
    let root = plugdb_tests::workspace_root();
    let helm = plugdb_tests::cached_build("helm.sh", "helm").expect("helm");
    let kubectl = plugdb_tests::control_plane::binaries_dir().expect("the Kubernetes binaries").join("kubectl");
    // The in-process operator steps aside: the chart's is the only one reconciling.
    cluster.stop_operator();
    let _restore = Restore { cluster: cluster.clone(), helm: helm.clone(), kubectl: kubectl.clone() };

    // The operator's image, built locally as the engine images are: the binary and the
    // bundled engines; no plugin ConfigMap exists in the operator's namespace.
    let image = cluster.backing.operator_image().expect("the nodes' operator image");
    let (repository, tag) = image.rsplit_once(':').expect("an image with a tag");
    let chart = root.join("deploy/chart/plugdb");
    let install = {
        let (cluster, helm, chart) = (cluster.clone(), helm.clone(), chart.clone());
        let (repository, tag) = (format!("image.repository={repository}"), format!("image.tag={tag}"));
        tokio::task::spawn_blocking(move || {
            let args = ["install", "plugdb", chart.to_str().expect("path"), "--namespace", OPERATOR_NS, "--create-namespace"];
            let values = ["--set", &repository, "--set", &tag, "--set", "image.pullPolicy=Never", "--wait", "--timeout", "4m"];
            run(&cluster, &helm, &[&args[..], &values[..]].concat())
        })
    };
    install.await.expect("helm install");

    let example = root.join("examples/orders-db.yaml");
    run(&cluster, &kubectl, &["create", "namespace", NS]);
    run(&cluster, &kubectl, &["apply", "--namespace", NS, "-f", example.to_str().expect("path")]);
    let db = cluster.wait_database(NS, "orders", "the example Running", WAIT, |d| is_running(d, 3)).await.expect("running");
    // The chart's operator reaches the member agents through each member's NetworkPolicy,
    // which lets its pods alone in (`--agent-from`, from the chart): every member's
    // position, as its agent said it, reaches status.
    let positions = |d: &Database| d.status.iter().flat_map(|s| &s.members).filter(|m| m.position.is_some()).count();
    cluster.wait_database(NS, "orders", "each member's position", WAIT, |d| positions(d) == 3).await.expect("the agents answer");
    let plugin = db.status.as_ref().and_then(|s| s.plugin.clone()).unwrap_or_default();
    assert!(plugin.starts_with("postgres@"), "rendered by the bundled postgres plugin: {plugin}");
    let log = run(&cluster, &kubectl, &["logs", "--namespace", OPERATOR_NS, "deployment/plugdb"]);
    assert!(log.contains("~bundled/postgres.wasm") && log.contains("plugin loaded"), "the operator's log: {log}");
    let screen = crate::plugdb(&cluster, &["status", "orders", "--namespace", NS]).await;
    assert!(screen.starts_with(&format!("Database {NS}/orders: postgres 17, Running")), "{screen}");
    // `kubectl plugdb plugins`: the leader's own account of what serves each engine.
    let plugins = crate::plugdb(&cluster, &["plugins", "--operator-namespace", OPERATOR_NS]).await;
    assert!(plugins.starts_with("served by the operator (pod plugdb-") && plugins.contains(", leading):"), "{plugins}");
    for engine in ["postgres", "mysql", "etcd"] {
        let line =
            plugins.lines().find(|l| l.trim_start().starts_with(&format!("{engine} "))).unwrap_or_else(|| panic!("{engine}: {plugins}"));
        assert!(line.contains(&format!("bundled/{engine}.wasm")), "{line}");
    }

    // Gone again by the chart's operator, volumes and all.
    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), NS);
    dbs.patch("orders", &PatchParams::default(), &Patch::Merge(json!({"spec": {"deletionPolicy": "Delete"}}))).await.expect("policy");
    dbs.delete("orders", &DeleteParams::default()).await.expect("delete");
    let deadline = tokio::time::Instant::now() + WAIT;
    while dbs.get_opt("orders").await.expect("get").is_some() {
        assert!(tokio::time::Instant::now() < deadline, "the chart's operator did not delete the example");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
