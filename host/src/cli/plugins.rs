//! `plugdb plugins` (`kubectl plugdb plugins`): the engines the operator serves — which
//! plugin serves each and where it came from (bundled with the operator, or a
//! ConfigMap), as its leader's `/metrics` says through the API server — and each plugin
//! ConfigMap in its namespace: what the plugin says about itself (loaded and
//! self-tested here as the operator loads it), whether its pinned digest matches, and
//! what the operator last said of it (serving, or why it was rejected).

use std::fmt::Write;
use std::path::Path;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::status::Target;
use crate::plugin::registry::{DIGEST_ANNOTATION, PLUGIN_LABEL};

/// What the operator last said of ConfigMap `name`: its newest plugin Event's reason and note.
fn verdict(events: &[Event], name: &str) -> Option<(String, String)> {
    events
        .iter()
        .filter(|e| e.regarding.as_ref().is_some_and(|r| r.kind.as_deref() == Some("ConfigMap") && r.name.as_deref() == Some(name)))
        .filter(|e| matches!(e.reason.as_deref(), Some("PluginLoaded" | "PluginRejected")))
        .max_by_key(|e| e.event_time.as_ref().map(|t| t.0).or(e.deprecated_last_timestamp.as_ref().map(|t| t.0)))
        .map(|e| (e.reason.clone().unwrap_or_default(), e.note.clone().unwrap_or_default()))
}

/// The series `plugdb_plugin_serving` of a metrics page: each one's labels.
pub fn serving_series(metrics: &str) -> Vec<Vec<(String, String)>> {
    let labels = |inside: &str| -> Vec<(String, String)> {
        inside
            .split("\",")
            .filter_map(|pair| pair.split_once("=\"").map(|(k, v)| (k.trim().to_string(), v.trim_end_matches('"').to_string())))
            .collect()
    };
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix("plugdb_plugin_serving{"))
        .filter_map(|l| l.rsplit_once("} ").filter(|(_, value)| value.trim() == "1").map(|(inside, _)| labels(inside)))
        .collect()
}

/// A path of an operator pod's http port, read through the API server.
async fn proxied(client: &Client, operator: &str, pod: &str, path: &str) -> Result<String> {
    let request = http::Request::get(format!("/api/v1/namespaces/{operator}/pods/{pod}:8080/proxy{path}")).body(Vec::new())?;
    Ok(client.request_text(request).await?)
}

/// What the operator serves, from its leader's metrics (any running replica when none
/// says it leads): the pod asked and a line per engine.
async fn served(client: &Client, operator: &str) -> Result<(String, Vec<String>)> {
    let params = ListParams::default().labels("app.kubernetes.io/name=plugdb");
    let pods = Api::<Pod>::namespaced(client.clone(), operator).list(&params).await?.items;
    let running: Vec<String> =
        pods.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).map(|p| p.name_any()).collect();
    let mut asked = None;
    for pod in &running {
        if proxied(client, operator, pod, "/readyz").await.is_ok_and(|r| r.contains("leading")) {
            asked = Some(format!("{pod}, leading"));
            break;
        }
    }
    let asked = asked.or_else(|| running.first().cloned()).with_context(|| format!("no operator pod runs in {operator}"))?;
    let pod = asked.split(',').next().unwrap_or_default();
    let metrics = proxied(client, operator, pod, "/metrics").await?;
    let lines = serving_series(&metrics)
        .iter()
        .map(|labels| {
            let get = |k: &str| labels.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str()).unwrap_or("?");
            format!("{:<10} {:<20} {:<32} sha256 {}", get("engine"), get("plugin"), get("source"), get("sha256"))
        })
        .collect();
    Ok((asked, lines))
}

/// The engines the operator in namespace `operator` serves, then its plugin ConfigMaps, one block each.
pub async fn plugins(target: &Target, operator: &str, compiler: &Path) -> Result<String> {
    let (client, _) = target.connect().await?;
    let mut out = String::new();
    match served(&client, operator).await {
        Ok((pod, lines)) => {
            let _ = writeln!(out, "served by the operator (pod {pod}):");
            for line in &lines {
                let _ = writeln!(out, "  {line}");
            }
            if lines.is_empty() {
                let _ = writeln!(out, "  no engine");
            }
        }
        // Reading a pod's port through the API server takes `get` on pods/proxy.
        Err(e) => {
            let _ = writeln!(out, "served by the operator: not known ({e:#}); its ConfigMaps:");
        }
    }
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), operator)
        .list(&ListParams::default().labels(PLUGIN_LABEL))
        .await
        .with_context(|| format!("listing the plugin ConfigMaps in {operator}"))?
        .items;
    let events = Api::<Event>::namespaced(client, operator).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    if config_maps.is_empty() {
        let _ = writeln!(out, "no plugin ConfigMaps (label {PLUGIN_LABEL}) in namespace {operator}");
    }
    for cm in &config_maps {
        let name = cm.name_any();
        let _ = writeln!(out, "{name} (ConfigMap {operator}/{name})");
        let loaded = crate::plugin::registry::decode(cm)
            .map_err(anyhow::Error::from)
            .and_then(|bytes| super::load_bytes(&bytes, compiler).map(|p| (p, bytes)));
        match loaded {
            Ok((plugin, _)) => {
                for line in super::describe(&plugin).lines() {
                    let _ = writeln!(out, "  {line}");
                }
                let pinned = cm.annotations().get(DIGEST_ANNOTATION);
                let digest = match pinned {
                    Some(d) if *d == plugin.digest() => "matches the pinned digest",
                    Some(_) => "differs from the pinned digest: the operator refuses it",
                    None => "no digest pinned",
                };
                let _ = writeln!(out, "  pinned:            {digest}");
            }
            Err(e) => {
                let _ = writeln!(out, "  problem:           {e:#}");
            }
        }
        let said = match verdict(&events, &name) {
            Some((reason, note)) if reason == "PluginLoaded" => format!("serving ({note})"),
            Some((_, note)) => format!("rejected: {note}"),
            None => "nothing said yet (not loaded, or its Events expired)".into(),
        };
        let _ = writeln!(out, "  operator:          {said}");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_serving_series_are_read_from_the_metrics_page() {
        let metrics = crate::metrics::Metrics::default();
        let labels = crate::metrics::ServingLabels {
            engine: "postgres".into(),
            plugin: "postgres@0.1.0".into(),
            sha256: "0cd5".into(),
            source: "bundled/postgres.wasm".into(),
        };
        metrics.plugin_serving.get_or_create(&labels).set(1);
        let series = super::serving_series(&metrics.encode());
        let expected: Vec<(String, String)> =
            [("engine", "postgres"), ("plugin", "postgres@0.1.0"), ("sha256", "0cd5"), ("source", "bundled/postgres.wasm")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        assert_eq!(series, vec![expected]);
    }
}
