//! cert-manager for the TLS tests: its CRDs and its own Certificate, Issuer and
//! ClusterIssuer controllers (the CA and self-signed issuers), built once from its Go
//! module by `scripts/cert-manager.sh` and run on this machine against a test's API
//! server. Stopped by the PID it was started with when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// cert-manager's controller, running.
pub struct CertManager {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// What `scripts/cert-manager.sh` built: the directory with the controller and `crds/`.
fn built() -> Result<PathBuf> {
    crate::cached_build("cert-manager.sh", "cert-manager")
}

/// The API resource of cert-manager kind `kind` (`Certificate`, `Issuer`, …).
pub fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cert-manager.io", "v1", kind))
}

impl CertManager {
    /// Installs cert-manager's CRDs in the cluster behind `client` and starts its
    /// controller against `kubeconfig`.
    pub async fn start(client: &Client, kubeconfig: &Path) -> Result<Self> {
        let built = built()?;
        install_crds(client, &built.join("crds")).await?;
        let dir = tempfile::tempdir()?;
        let log = dir.path().join("cert-manager.log");
        let file = std::fs::File::create(&log)?;
        let child = Command::new(built.join("cert-manager-controller"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("starting cert-manager's controller")?;
        Ok(Self { child, log, _dir: dir })
    }

    /// The controller's log, for a failing test's message.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// A CA `Issuer` `name` in `namespace`, bootstrapped the way cert-manager's own docs
    /// do: a self-signed Issuer signs a CA Certificate, whose Secret the CA Issuer signs
    /// with. Returns the CA's certificate (PEM) once the Issuer is Ready.
    pub async fn ca_issuer(&self, client: &Client, namespace: &str, name: &str) -> Result<Vec<u8>> {
        let apply = |kind: &str, object: serde_json::Value| {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource(kind));
            let name = object["metadata"]["name"].as_str().expect("named").to_string();
            let mut object: DynamicObject = serde_json::from_value(object).expect("an object");
            object.types = Some(kube::api::TypeMeta { api_version: "cert-manager.io/v1".into(), kind: kind.into() });
            async move { api.patch(&name, &PatchParams::apply("plugdb-tests"), &Patch::Apply(&object)).await }
        };
        let root = format!("{name}-root");
        apply("Issuer", json!({"metadata": {"name": root}, "spec": {"selfSigned": {}}})).await?;
        let spec = json!({
            "isCA": true, "commonName": format!("{name} test CA"), "secretName": format!("{name}-ca"),
            "privateKey": {"algorithm": "ECDSA", "size": 256}, "issuerRef": {"name": root, "kind": "Issuer"},
        });
        apply("Certificate", json!({"metadata": {"name": format!("{name}-ca")}, "spec": spec})).await?;
        apply("Issuer", json!({"metadata": {"name": name}, "spec": {"ca": {"secretName": format!("{name}-ca")}}})).await?;
        let issuers: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource("Issuer"));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let issuer = issuers.get(name).await?;
            if ready(&issuer) {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "Issuer {namespace}/{name} is not Ready after 60 s: {:?}\ncert-manager's log:\n{}",
                    issuer.data["status"],
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let secret = Api::<Secret>::namespaced(client.clone(), namespace).get(&format!("{name}-ca")).await?;
        let data = secret.data.unwrap_or_default();
        Ok(data.get("tls.crt").context("the CA Secret has tls.crt")?.0.clone())
    }
}

/// Whether a cert-manager object's `Ready` condition is `True`.
pub fn ready(object: &DynamicObject) -> bool {
    object.data["status"]["conditions"]
        .as_array()
        .is_some_and(|conditions| conditions.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

impl Drop for CertManager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn install_crds(client: &Client, dir: &Path) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = vec![];
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)?;
        let crd: CustomResourceDefinition = yaml_serde::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        crds.patch(&crd.name_any(), &PatchParams::apply("plugdb-tests").force(), &Patch::Apply(&crd)).await?;
        names.push(crd.name_any());
    }
    for name in names {
        let established = kube::runtime::wait::conditions::is_crd_established();
        tokio::time::timeout(Duration::from_secs(30), kube::runtime::wait::await_condition(crds.clone(), &name, established))
            .await
            .with_context(|| format!("CRD {name} established"))??;
    }
    Ok(())
}
