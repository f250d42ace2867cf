//! Who reaches the members, as the nodes' NetworkPolicy enforcer (kube-router's firewall)
//! applies each Database's policy: a tenant's pod in the Database's namespace reaches the
//! engine but never the member agents, which the operator still asks; `spec.clients`
//! narrows the engine to the pods it names while the members go on replicating.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use plugdb::crd::Database;
use plugdb_tests::node::HELPER_IMAGE;
use plugdb_tests::operator::Cluster;
use plugdb_tests::scenario::{Client, Engine, WAIT, network_of, pod_ip};
use serde_json::json;

/// Whether a TCP connection to `ip:port` opens within 3 s from the network namespace
/// `from` (none: this machine's, where the operator runs).
async fn connects(from: Option<&str>, ip: &str, port: u16) -> bool {
    let mut command = match from {
        Some(net) => {
            let mut c = tokio::process::Command::new("nsenter");
            c.arg(format!("--net={net}")).arg("timeout");
            c
        }
        None => tokio::process::Command::new("timeout"),
    };
    command.args(["3", "bash", "-c", &format!("exec 3<>/dev/tcp/{ip}/{port}")]).stdin(std::process::Stdio::null());
    command.stderr(std::process::Stdio::null()).status().await.is_ok_and(|s| s.success())
}

/// Waits until [`connects`] answers `expected`.
async fn until_connects(what: &str, from: Option<&str>, ip: &str, port: u16, expected: bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while connects(from, ip, port).await != expected {
        assert!(
            Instant::now() < deadline,
            "{what}: after 60 s a connection to {ip}:{port} still {}",
            if expected { "fails" } else { "opens" }
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A tenant's pod in `ns`, running; its network namespace.
async fn tenant(cluster: &Cluster, ns: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    let pod = json!({
        "metadata": {"name": "tenant", "labels": {"app": "tenant"}},
        "spec": {
            "containers": [{"name": "tenant", "image": HELPER_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}],
            "terminationGracePeriodSeconds": 0
        }
    });
    pods.create(&PostParams::default(), &serde_json::from_value(pod).expect("a pod")).await.expect("the tenant's pod");
    let deadline = Instant::now() + WAIT;
    loop {
        let pod = pods.get("tenant").await.expect("the tenant's pod");
        if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            return network_of(&pod, "tenant");
        }
        assert!(Instant::now() < deadline, "the tenant's pod does not run");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A tenant's pod reaches the engine of Database `orders` in `ns` but not its agents,
/// which the operator's address reaches; named clients alone reach the engine once
/// `spec.clients` names some, and the members replicate meanwhile.
pub async fn members_reached_as_allowed(cluster: &Cluster, client: &Client, engine: Engine, ns: &str) {
    let (port, agent) = (engine.port(), plugdb::agent::PORT);
    let tenant = tenant(cluster, ns).await;
    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), ns);
    let led_by = dbs.get("orders").await.expect("the Database").status.and_then(|s| s.primary).expect("a primary");
    let members = client.members().await;
    let primary = members.iter().find(|p| p.name_any() == led_by).expect("the primary");
    let follower = members.iter().find(|p| p.name_any() != led_by).expect("a replica");
    let ip = pod_ip(primary);
    until_connects("the tenant, to the engine", Some(&tenant), &ip, port, true).await;
    assert!(!connects(Some(&tenant), &ip, agent).await, "the tenant's pod never reaches a member's agent");
    assert!(connects(None, &ip, agent).await, "the operator's address does");

    // The engine for the pods `spec.clients` names alone; the members still replicate.
    let clients = |clients: serde_json::Value| Patch::Merge(json!({"spec": {"clients": clients}}));
    dbs.patch("orders", &PatchParams::default(), &clients(json!([{"podSelector": {"matchLabels": {"app": "shop"}}}])))
        .await
        .expect("clients named");
    until_connects("the tenant, not named", Some(&tenant), &ip, port, false).await;
    let table = "CREATE TABLE fenced_in (id int PRIMARY KEY); INSERT INTO fenced_in VALUES (1)";
    client.administer(primary, table).await.expect("written on the primary");
    client.eventually_administered(follower, "SELECT count(*) FROM fenced_in", Duration::from_secs(60), |o| o == "1").await;
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    pods.patch("tenant", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"app": "shop"}}}))).await.expect("labelled");
    until_connects("the tenant, named", Some(&tenant), &ip, port, true).await;
    assert!(!connects(Some(&tenant), &ip, agent).await, "a client named reaches no agent either");

    dbs.patch("orders", &PatchParams::default(), &clients(serde_json::Value::Null)).await.expect("clients unset");
    pods.delete("tenant", &Default::default()).await.expect("the tenant's pod goes");
    eprintln!("{ns}: a tenant's pod reaches the engine, not the agents; spec.clients narrows the engine to the pods named");
}
