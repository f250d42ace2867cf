//! What a scenario leaves behind on the shared node: the namespaces it applied
//! Databases in are noted while it runs, described when it fails, and released when it
//! ends, so that its members' CPU and memory requests go back to the scenarios still
//! running.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::{ContainerStatus, Event, Namespace, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams};
use plugdb::crd::Database;

use crate::operator::Cluster;

tokio::task_local! {
    static APPLIED_IN: Arc<Mutex<BTreeSet<String>>>;
}

/// Notes that the running scenario applied a Database in `namespace`, or made the
/// namespace: it is released afterwards (nothing outside [`noting_namespaces`]).
pub fn note(namespace: &str) {
    let _ = APPLIED_IN.try_with(|seen| {
        if let Ok(mut seen) = seen.lock() {
            seen.insert(namespace.to_string());
        }
    });
}

/// Runs `work` and returns, beside its output, the namespaces it applied Databases in
/// (through [`Cluster::apply_database`], on its own task).
pub async fn noting_namespaces<T>(work: impl Future<Output = T>) -> (T, Vec<String>) {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let out = APPLIED_IN.scope(seen.clone(), work).await;
    let namespaces = seen.lock().map(|s| s.iter().cloned().collect()).unwrap_or_default();
    (out, namespaces)
}

/// Deletes `namespace` and waits up to `timeout` until it is gone. Its Databases are
/// first set to `deletionPolicy: Delete`, so none waits for a final backup.
pub async fn release(cluster: &Cluster, namespace: &str, timeout: Duration) -> Result<()> {
    let databases: Api<Database> = Api::namespaced(cluster.client.clone(), namespace);
    let delete = serde_json::json!({"spec": {"deletionPolicy": "Delete"}});
    for db in databases.list(&ListParams::default()).await? {
        databases.patch(&db.name_any(), &PatchParams::default(), &Patch::Merge(&delete)).await?;
    }
    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    if namespaces.get_opt(namespace).await?.is_some() {
        namespaces.delete(namespace, &DeleteParams::default()).await?;
    }
    let deadline = tokio::time::Instant::now() + timeout;
    while namespaces.get_opt(namespace).await?.is_some() {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "namespace {namespace} still terminating after {timeout:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// What went on in `namespace`: each pod's phase and containers, the last lines of
/// each container's log (more of those that are not ready: a ready one may still be
/// wrong, a replica that follows nobody), and the namespace's latest Events.
pub async fn describe(cluster: &Cluster, namespace: &str) -> String {
    let mut out = format!("--- namespace {namespace}\n");
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), namespace);
    match pods.list(&ListParams::default()).await {
        Ok(list) => {
            for pod in list {
                let status = pod.status.clone().unwrap_or_default();
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_else(|| "unscheduled".into());
                let _ = writeln!(out, "pod {} {} on {node}", pod.name_any(), status.phase.unwrap_or_default());
                let containers =
                    status.init_container_statuses.unwrap_or_default().into_iter().chain(status.container_statuses.unwrap_or_default());
                for c in containers {
                    let _ = writeln!(out, "  {}", container_line(&c));
                    // A container waiting to restart (crash looping) says why in its last run's log.
                    let previous = c.state.as_ref().is_some_and(|s| s.waiting.is_some()) && c.restart_count > 0;
                    if previous || c.state.as_ref().is_some_and(|s| s.running.is_some() || s.terminated.is_some()) {
                        let lines = if c.ready { 6 } else { 15 };
                        let params = LogParams { container: Some(c.name.clone()), tail_lines: Some(lines), previous, ..Default::default() };
                        match pods.logs(&pod.name_any(), &params).await {
                            Ok(log) => log.lines().for_each(|l| {
                                let _ = writeln!(out, "    | {l}");
                            }),
                            Err(e) => {
                                let _ = writeln!(out, "    (no log: {e})");
                            }
                        }
                    }
                }
            }
        }
        Err(e) => {
            let _ = writeln!(out, "(pods: {e})");
        }
    }
    let events: Api<Event> = Api::namespaced(cluster.client.clone(), namespace);
    match events.list(&ListParams::default()).await {
        Ok(list) => {
            let mut items = list.items;
            items.sort_by_key(|e| e.last_timestamp.clone().or(e.first_timestamp.clone()).map(|t| t.0));
            for e in items.iter().rev().take(25).rev() {
                let _ = writeln!(
                    out,
                    "event {} {} {}/{} (x{}): {}",
                    e.type_.as_deref().unwrap_or(""),
                    e.reason.as_deref().unwrap_or(""),
                    e.involved_object.kind.as_deref().unwrap_or(""),
                    e.involved_object.name.as_deref().unwrap_or(""),
                    e.count.unwrap_or(1),
                    e.message.as_deref().unwrap_or("").trim()
                );
            }
        }
        Err(e) => {
            let _ = writeln!(out, "(events: {e})");
        }
    }
    out
}

/// A container's name, readiness, restarts and state, on one line.
fn container_line(c: &ContainerStatus) -> String {
    let state = match c.state.as_ref() {
        Some(s) if s.running.is_some() => "running".to_string(),
        Some(s) if s.waiting.is_some() => {
            let w = s.waiting.as_ref().expect("checked");
            format!("waiting {} {}", w.reason.as_deref().unwrap_or(""), w.message.as_deref().unwrap_or(""))
        }
        Some(s) if s.terminated.is_some() => {
            let t = s.terminated.as_ref().expect("checked");
            format!("terminated {} exit {}", t.reason.as_deref().unwrap_or(""), t.exit_code)
        }
        _ => "unknown".to_string(),
    };
    format!("{} ready={} restarts={} {state}", c.name, c.ready, c.restart_count)
}
