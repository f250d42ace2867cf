//! `plugdb plugins` (`kubectl plugdb plugins`): the engines the operator is given — each
//! plugin ConfigMap in its namespace, what the plugin says about itself (loaded and
//! self-tested here as the operator loads it), whether its pinned digest matches, and
//! what the operator last said of it (serving, or why it was rejected).

use std::fmt::Write;
use std::path::Path;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

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

/// The plugins in the operator's namespace `operator` of the target's cluster, one block each.
pub async fn plugins(target: &Target, operator: &str, compiler: &Path) -> Result<String> {
    let (client, _) = target.connect().await?;
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), operator)
        .list(&ListParams::default().labels(PLUGIN_LABEL))
        .await
        .with_context(|| format!("listing the plugin ConfigMaps in {operator}"))?
        .items;
    let events = Api::<Event>::namespaced(client, operator).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    if config_maps.is_empty() {
        return Ok(format!("no plugin ConfigMaps (label {PLUGIN_LABEL}) in namespace {operator}\n"));
    }
    let mut out = String::new();
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
