//! Support for plugdb's integration tests: a real control plane (etcd,
//! kube-apiserver, kube-controller-manager) on loopback, a real node to run Pods on,
//! and the plugin components that `build.rs` built from source.

pub mod bomb;
pub mod cert_manager;
pub mod control_plane;
pub mod engine;
pub mod local_pod;
pub mod minio;
pub mod mock_api;
pub mod node;
pub mod operator;
pub mod pass;
pub mod prometheus;
pub mod proxy;
pub mod release;
pub mod scenario;

use std::path::{Path, PathBuf};

pub use control_plane::ControlPlane;

/// Directory holding every built component (`<name>.wasm`).
pub fn components_dir() -> &'static Path {
    Path::new(env!("PLUGDB_COMPONENTS_DIR"))
}

/// Path of the component built from `plugins/<name>` or `tests/fixtures/<name>`.
pub fn component_path(name: &str) -> PathBuf {
    components_dir().join(format!("{name}.wasm"))
}

/// Bytes of the component built from `plugins/<name>` or `tests/fixtures/<name>`.
pub fn component(name: &str) -> Vec<u8> {
    let path = component_path(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading component {}: {e} (built by tests/build.rs)", path.display()))
}

/// The `plugdb` binary built beside this executable: a test's (`target/<profile>/deps/`,
/// which `cargo test --workspace` builds it for) or a benchmark binary's (`target/<profile>/`).
pub fn plugdb_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the executable's path");
    let here = exe.parent().expect("target/<profile>[/deps]");
    let profile = if here.ends_with("deps") { here.parent().expect("target/<profile>") } else { here };
    let binary = profile.join("plugdb");
    assert!(binary.exists(), "{} is missing: build it with `cargo build -p plugdb` (cargo test --workspace does)", binary.display());
    binary
}

/// Runs `scripts/<script>`, which builds `what` once into a cache outside the work tree
/// and prints where it is, and returns that path; fails loudly when it cannot be built.
pub fn cached_build(script: &str, what: &str) -> anyhow::Result<PathBuf> {
    use anyhow::Context as _;
    let path = workspace_root().join("scripts").join(script);
    let out = std::process::Command::new("bash")
        .arg(&path)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running scripts/{script}"))?;
    if !out.status.success() {
        anyhow::bail!("scripts/{script} failed ({}): {what} is missing and could not be built", out.status);
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Server-side applies every document of `yaml` as `manager`, each kind found by discovery.
pub async fn apply_yaml(client: &kube::Client, manager: &str, yaml: &str) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    for doc in yaml.split("\n---\n") {
        let object: DynamicObject = yaml_serde::from_str(doc).with_context(|| format!("parsing {doc}"))?;
        let types = object.types.clone().context("apiVersion and kind")?;
        let gvk = kube::api::GroupVersionKind::try_from(&types)?;
        let (resource, caps) = kube::discovery::pinned_kind(client, &gvk).await?;
        let name = object.metadata.name.clone().context("metadata.name")?;
        let api: Api<DynamicObject> = match (&object.metadata.namespace, caps.scope) {
            (Some(ns), kube::discovery::Scope::Namespaced) => Api::namespaced_with(client.clone(), ns, &resource),
            _ => Api::all_with(client.clone(), &resource),
        };
        api.patch(&name, &PatchParams::apply(manager).force(), &Patch::Apply(&object)).await?;
    }
    Ok(())
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ sits below the workspace root").to_path_buf()
}

/// What the host would tell a plugin about Database `name` in `namespace` with member 0 primary.
pub fn cluster(name: &str, namespace: &str) -> plugdb::plugin::ClusterContext {
    plugdb::plugin::ClusterContext {
        primary_host: format!("{name}.{namespace}.svc"),
        headless_host: format!("{name}-headless.{namespace}.svc"),
        primary_pod: format!("{name}-0"),
        credentials_secret: format!("{name}-credentials"),
        config_mount_path: "/etc/plugdb".into(),
        archive_directory: None,
        restoring: false,
    }
}
