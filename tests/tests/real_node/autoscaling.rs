//! The Database's scale subresource on the real nodes: `kubectl scale`, and a real
//! HorizontalPodAutoscaler on CPU (metrics-server through the aggregation layer,
//! kube-controller-manager's controller) driving the number of members.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::api::{Api, PostParams};
use plugdb::crd::Database;
use plugdb_tests::operator::Cluster;
use plugdb_tests::scenario::{Client, Engine, WAIT, database, is_running};
use serde_json::json;

/// A postgres Database of one member is scaled to two with `kubectl scale`; a
/// HorizontalPodAutoscaler on its engine container's CPU (2 to 3 members, at half of
/// what each asks for) reads the members' use and keeps two while they idle; a query
/// that keeps the primary's engine busy has it set three, and the third member runs.
pub async fn scaled_by_kubectl_then_by_cpu(cluster: Arc<Cluster>) {
    let ns = "postgres-autoscaling";
    let name = "busy";
    // A quarter of a core at most: the load below must not starve what runs beside it.
    let spec = json!({"resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "250m", "memory": "512Mi"}}});
    cluster.apply_database(ns, database(name, Engine::Postgres, "17", 1, spec)).await.expect("apply");
    cluster.wait_database(ns, name, "1 member Ready", WAIT, |d| is_running(d, 1)).await.expect("running");

    let kubectl = plugdb_tests::control_plane::binaries_dir().expect("the Kubernetes binaries").join("kubectl");
    let out = std::process::Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(cluster.backing.kubeconfig())
        .args(["scale", "database", name, "--replicas", "2", "-n", ns])
        .output()
        .expect("kubectl");
    assert!(out.status.success(), "kubectl scale: {}", String::from_utf8_lossy(&out.stderr));
    cluster.wait_database(ns, name, "2 members Ready", WAIT, |d| is_running(d, 2)).await.expect("scaled by kubectl");

    let autoscalers: Api<HorizontalPodAutoscaler> = Api::namespaced(cluster.client.clone(), ns);
    let hpa: HorizontalPodAutoscaler = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "name": name},
            "minReplicas": 2,
            "maxReplicas": 3,
            "metrics": [{"type": "ContainerResource", "containerResource": {
                "name": "cpu", "container": "postgres", "target": {"type": "Utilization", "averageUtilization": 50}}}],
        },
    }))
    .expect("a HorizontalPodAutoscaler");
    autoscalers.create(&PostParams::default(), &hpa).await.expect("the autoscaler");
    // It reads the members' CPU (metrics-server serves it), and keeps two while they idle.
    let deadline = tokio::time::Instant::now() + WAIT;
    let idle = loop {
        let hpa = autoscalers.get(name).await.expect("the autoscaler");
        let status = hpa.status.clone().unwrap_or_default();
        let used = status.current_metrics.iter().flatten().find_map(|m| m.container_resource.as_ref()?.current.average_utilization);
        if let Some(used) = used {
            break (used, status.desired_replicas);
        }
        let conditions = status.conditions.unwrap_or_default();
        assert!(tokio::time::Instant::now() < deadline, "the autoscaler read no CPU: {conditions:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    assert!(idle.0 < 50 && idle.1 == 2, "idle members: {}% of what they ask for, {} members wanted", idle.0, idle.1);

    // The primary's engine kept busy: a query on one core at a time, again and again.
    let client = Arc::new(Client::new(&cluster, Engine::Postgres, ns, name).await);
    let primary = client.service_ip(name).await;
    client.reachable(&primary).await;
    let load = {
        let (client, primary) = (client.clone(), primary.clone());
        tokio::spawn(async move {
            loop {
                let _ = client.query(&primary, "SELECT count(*) FROM generate_series(1, 100000000)").await;
            }
        })
    };
    let databases: Api<Database> = Api::namespaced(cluster.client.clone(), ns);
    let deadline = tokio::time::Instant::now() + WAIT;
    while databases.get(name).await.expect("the Database").spec.replicas != 3 {
        let hpa = autoscalers.get(name).await.expect("the autoscaler");
        assert!(tokio::time::Instant::now() < deadline, "the autoscaler did not scale the Database: {:?}", hpa.status);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    load.abort();
    cluster.wait_database(ns, name, "3 members Ready", WAIT, |d| is_running(d, 3)).await.expect("scaled by the autoscaler");
    let hpa = autoscalers.get(name).await.expect("the autoscaler");
    assert_eq!(hpa.status.map(|s| s.desired_replicas), Some(3));
}
