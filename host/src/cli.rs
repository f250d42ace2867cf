//! Tools for people: render a Database without a cluster, inspect and pack plugins; and,
//! against a cluster, a Database's status on one screen ([`status`]), a planned
//! switchover ([`switchover`]), a backup now and a restore ([`backup`]), the engine's
//! client in a member ([`connect`]), a member's log ([`logs`]), and the engines the
//! operator is given ([`plugins`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;

use crate::build;
use crate::crd::Database;
use crate::plugin::registry::{DIGEST_ANNOTATION, PLUGIN_LABEL};
use crate::plugin::{Limits, Plugin, Runtime};

pub mod backup;
pub mod connect;
pub mod logs;
pub mod plugins;
pub mod status;
pub mod switchover;

/// The most a ConfigMap's data can hold: its keys and decoded values together (the API
/// server's limit; base64 in the request does not count).
const CONFIG_MAP_BYTES: usize = 1 << 20;

/// Loads and self-tests the plugin component at `path` as the operator does: compiled
/// by `compiler` (the `plugdb` binary) in a child process held to the operator's time
/// and memory limits, then checked and self-tested under the same bounds.
pub fn load_plugin(path: &Path, compiler: &Path) -> Result<Plugin> {
    let bytes = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
    load_bytes(&bytes, compiler).with_context(|| format!("{}: not a usable plugin", path.display()))
}

/// Loads and self-tests plugin `bytes` as [`load_plugin`] does.
pub fn load_bytes(bytes: &[u8], compiler: &Path) -> Result<Plugin> {
    Ok(Runtime::new(Limits::default())?.with_compiler(compiler).load(bytes)?)
}

/// `plugdb plugin inspect FILE`: what the plugin says about itself.
pub fn inspect(path: &Path, compiler: &Path) -> Result<String> {
    Ok(describe(&load_plugin(path, compiler)?))
}

/// What a loaded plugin says about itself, a line per fact.
pub fn describe(plugin: &Plugin) -> String {
    let i = plugin.info();
    let caps = i.capabilities.declared();
    format!(
        "engine:            {}\nplugin version:    {}\ncontract:          plugdb:engine@{}\nengine versions:   {} (default {})\nport:              {}\ncapabilities:      {}\nsha256:            {}\nsize:              {} bytes\n",
        i.engine,
        i.plugin_version,
        i.contract_version,
        i.supported_versions.join(", "),
        i.default_version,
        i.default_port,
        if caps.is_empty() { "none".into() } else { caps.join(", ") },
        plugin.digest(),
        plugin.size()
    )
}

/// `plugdb plugin build [DIR]`: the crate at `dir` built into a component, loaded and
/// self-tested as the operator would.
pub fn build(dir: &Path, out: Option<&Path>, compiler: &Path) -> Result<String> {
    let built = xtask::build_dir(dir, out)?;
    let plugin = load_plugin(&built.path, compiler)?;
    Ok(format!("{} ({} bytes): {}, contract {}\n", built.path.display(), built.size, plugin.id(), plugin.info().contract_version))
}

/// `plugdb plugin pack FILE`: a ConfigMap that loads the plugin, gzip-compressed when
/// that is what it takes to fit, with its digest pinned.
pub fn pack(path: &Path, namespace: &str, compiler: &Path) -> Result<String> {
    let plugin = load_plugin(path, compiler)?;
    let bytes = std::fs::read(path)?;
    let engine = plugin.info().engine.clone();
    let fits = |key: &str, data: &[u8]| key.len() + data.len() <= CONFIG_MAP_BYTES;
    let (key, data) = if fits("plugin.wasm", &bytes) {
        ("plugin.wasm", bytes)
    } else {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&bytes)?;
        ("plugin.wasm.gz", gz.finish()?)
    };
    if !fits(key, &data) {
        bail!("{}: {} bytes even compressed; a ConfigMap holds at most 1 MiB", path.display(), data.len());
    }
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("engine-{engine}")),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(PLUGIN_LABEL.to_string(), engine.clone())])),
            annotations: Some(BTreeMap::from([
                (DIGEST_ANNOTATION.to_string(), plugin.digest().to_string()),
                ("plugdb.io/plugin-version".to_string(), plugin.id()),
            ])),
            ..Default::default()
        },
        binary_data: Some(BTreeMap::from([(key.to_string(), ByteString(data))])),
        ..Default::default()
    };
    let mut value = serde_json::to_value(&cm)?;
    value["apiVersion"] = "v1".into();
    value["kind"] = "ConfigMap".into();
    Ok(yaml_serde::to_string(&value)?)
}

/// `plugdb render -f db.yaml --plugin FILE`: the objects plugdb would apply, offline,
/// with images pulled as `pull` says.
pub fn render(database: &Path, plugin: &Path, compiler: &Path, pull: &crate::images::Pull) -> Result<String> {
    let text = std::fs::read_to_string(database).with_context(|| format!("{}: cannot read", database.display()))?;
    let mut db: Database = yaml_serde::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", database.display()))?;
    if db.metadata.namespace.is_none() {
        db.metadata.namespace = Some("default".into());
    }
    let plugin = load_plugin(plugin, compiler)?;
    let file = database.display();
    if db.spec.engine != plugin.info().engine {
        bail!("{file}: spec.engine is {:?} but the plugin serves {:?}", db.spec.engine, plugin.info().engine);
    }
    let version = if db.spec.version.is_empty() { plugin.info().default_version.clone() } else { db.spec.version.clone() };
    let problems =
        |v: Vec<crate::plugin::Violation>| anyhow::anyhow!("{file}: {}", v.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "));
    let spec = build::engine_spec(&db, &version).map_err(problems)?;
    let violations = plugin.validate(&spec)?;
    if !violations.is_empty() {
        return Err(problems(violations));
    }
    let primary = crate::names::Names(&db.metadata.name.clone().unwrap_or_default()).pod(0);
    let workload = plugin
        .render(&spec, &build::cluster_context(&db, &primary, false))
        .with_context(|| format!("{file}: the plugin could not render it"))?;
    let mut out = String::new();
    let rendered = build::Rendered {
        workload: &workload,
        engine: &db.spec.engine,
        sidecars: build::Sidecars { pull, ..Default::default() },
        primary: &primary,
        rendered_for: &primary,
        replicas: spec.replicas,
        leadership: build::Leadership::of(&plugin),
        tls: db.spec.tls_enabled().then_some("issued"),
    };
    for child in build::children(&db, &rendered) {
        out.push_str("---\n");
        out.push_str(&yaml_serde::to_string(&child.object)?);
    }
    Ok(out)
}
