//! The kubelet stand-in. No container runtime exists on the test machines, so no
//! real kubelet can run Pods; this task plays its part for the control plane:
//! every Pod becomes Running and Ready, and every Pod owned by a Job Succeeded.
//! It runs nothing; tests that need a Pod *not* ready annotate it with
//! [`NOT_READY`], and Job Pods annotated with [`FAIL`] fail.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

/// Annotation that keeps a Pod (or makes it) not ready.
pub const NOT_READY: &str = "test.plugdb.io/not-ready";
/// Annotation on a Job's pod template that makes its Pods fail.
pub const FAIL: &str = "test.plugdb.io/fail";

/// Watches all Pods and reports them as a kubelet would. Runs until aborted.
pub async fn run(client: kube::Client) {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut events = watcher(pods, watcher::Config::default()).default_backoff().boxed();
    while let Some(event) = events.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
            _ => continue,
        };
        if let Some(patch) = status_for(&pod) {
            let api: Api<Pod> = Api::namespaced(client.clone(), pod.metadata.namespace.as_deref().unwrap_or("default"));
            let name = pod.metadata.name.clone().unwrap_or_default();
            let _ = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(patch)).await;
        }
    }
}

/// The status a kubelet would report for `pod`, or `None` when it already shows it.
fn status_for(pod: &Pod) -> Option<serde_json::Value> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let owned_by_job = pod.metadata.owner_references.iter().flatten().any(|o| o.kind == "Job");
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let (phase, ready) = if owned_by_job {
        (if annotations.contains_key(FAIL) { "Failed" } else { "Succeeded" }, false)
    } else {
        ("Running", !annotations.contains_key(NOT_READY))
    };
    let current_ready = status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True");
    if status.phase.as_deref() == Some(phase) && current_ready == ready {
        return None;
    }
    let ready = if ready { "True" } else { "False" };
    let exit_code = if phase == "Failed" { 1 } else { 0 };
    let container_state = if owned_by_job {
        json!({"terminated": {"exitCode": exit_code, "reason": if exit_code == 0 { "Completed" } else { "Error" }, "startedAt": now, "finishedAt": now}})
    } else {
        json!({"running": {"startedAt": now}})
    };
    let containers: Vec<_> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| json!({"name": c.name, "image": c.image, "imageID": "", "ready": ready == "True", "restartCount": 0, "started": true, "state": container_state}))
        .collect();
    Some(json!({
        "status": {
            "phase": phase,
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "hostIP": "127.0.0.1",
            "startTime": status.start_time.map(|t| t.0.to_string()).unwrap_or_else(|| now.clone()),
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": ready, "lastTransitionTime": now},
                {"type": "Ready", "status": ready, "lastTransitionTime": now},
            ],
            "containerStatuses": containers,
        }
    }))
}
