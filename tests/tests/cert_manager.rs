//! Tier 4: `spec.tls.issuerRef` with a real cert-manager (its own controllers, built
//! from its Go module) on a real control plane. Until cert-manager is installed the
//! Database says so and builds nothing; then cert-manager issues the certificate from
//! the named issuer into the Secret members mount, a renewal rolls them, and without
//! `issuerRef` plugdb issues the certificate again itself.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use plugdb::crd::Database;
use plugdb::names::TLS_STAMP;
use plugdb_tests::ControlPlane;
use plugdb_tests::cert_manager::{CertManager, resource};
use plugdb_tests::operator::{InProcess, prepare, test_settings, wait_for};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);

fn database(name: &str, tls: serde_json::Value) -> Database {
    serde_json::from_value(json!({
        "apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": name},
        "spec": {"engine": "postgres", "version": "17", "replicas": 2, "storage": "1Gi", "tls": tls},
    }))
    .expect("a Database")
}

fn condition(db: &Database, type_: &str) -> Option<(String, String)> {
    let c = db.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)?;
    Some((c.reason.clone(), c.message.clone()))
}

/// The TLS stamp on StatefulSet `name`'s pod template, when it has one.
async fn stamp(client: &Client, name: &str) -> Option<String> {
    let sts = Api::<StatefulSet>::namespaced(client.clone(), "default").get_opt(name).await.ok()??;
    sts.spec?.template.metadata?.annotations?.get(TLS_STAMP).cloned()
}

async fn secret(client: &Client, name: &str) -> Option<Secret> {
    Api::<Secret>::namespaced(client.clone(), "default").get_opt(name).await.ok()?
}

fn file(secret: &Secret, key: &str) -> Vec<u8> {
    secret.data.as_ref().and_then(|d| d.get(key)).map(|v| v.0.clone()).unwrap_or_default()
}

/// `openssl verify` of `certificate` against `ca` for `host`.
fn verifies(dir: &Path, ca: &[u8], certificate: &[u8], host: &str) -> bool {
    std::fs::write(dir.join("ca.pem"), ca).expect("write");
    std::fs::write(dir.join("crt.pem"), certificate).expect("write");
    let out = std::process::Command::new("openssl")
        .args(["verify", "-purpose", "sslserver", "-verify_hostname", host, "-CAfile"])
        .arg(dir.join("ca.pem"))
        .arg(dir.join("crt.pem"))
        .output()
        .expect("openssl runs");
    out.status.success()
}

#[tokio::test]
async fn a_cert_manager_issuer_issues_the_certificate_and_its_renewal_rolls_the_members() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("postgres", "postgres")]).await.expect("CRD and plugins");
    let _operator = InProcess::start(&cp.kubeconfig, test_settings()).await.expect("operator");
    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    let issued_by_corp = json!({"enabled": true, "issuerRef": {"name": "corp"}});

    // Before cert-manager is installed: the Database says what is missing and waits.
    dbs.create(&PostParams::default(), &database("orders", issued_by_corp.clone())).await.expect("create");
    let mut said = None;
    wait_for("the Database says cert-manager is missing", WAIT, async || {
        said = dbs.get("orders").await.ok().and_then(|d| condition(&d, "Progressing"));
        said.as_ref().is_some_and(|(reason, _)| reason == "CertificateUnavailable")
    })
    .await;
    let (_, message) = said.expect("said");
    assert!(message.starts_with("spec.tls.issuerRef: Issuer corp cannot issue") && message.contains("cert-manager.io/v1"), "{message}");
    assert_eq!(dbs.get("orders").await.expect("read").status.and_then(|s| s.phase).map(|p| p.to_string()).as_deref(), Some("Pending"));
    assert!(stamp(&cp.client, "orders").await.is_none() && secret(&cp.client, "orders-tls").await.is_none(), "nothing is built meanwhile");

    // cert-manager arrives, with a CA Issuer: the waiting Database gets its certificate.
    let cert_manager = CertManager::start(&cp.client, &cp.kubeconfig).await.expect("cert-manager");
    let corp_ca = cert_manager.ca_issuer(&cp.client, "default", "corp").await.expect("a CA issuer");
    let mut first = None;
    wait_for("the members mount cert-manager's certificate", WAIT, async || {
        first = stamp(&cp.client, "orders").await;
        first.is_some()
    })
    .await;
    let first = first.expect("stamped");
    let certificates: Api<DynamicObject> = Api::namespaced_with(cp.client.clone(), "default", &resource("Certificate"));
    let certificate = certificates.get("orders-tls").await.expect("plugdb's Certificate");
    assert_eq!(certificate.data["spec"]["issuerRef"]["name"], "corp");
    assert_eq!(certificate.data["spec"]["secretName"], "orders-tls");
    assert_eq!(certificate.data["status"]["notAfter"], first.as_str(), "the stamp is cert-manager's expiry");
    assert_eq!(certificate.owner_references()[0].kind, "Database", "it goes with the Database");
    let issued = secret(&cp.client, "orders-tls").await.expect("the Secret");
    assert_eq!(
        issued.annotations().get("cert-manager.io/certificate-name").map(String::as_str),
        Some("orders-tls"),
        "written by cert-manager"
    );
    assert_eq!(file(&issued, "ca.crt"), corp_ca, "ca.crt is the issuer's CA");
    let dir = tempfile::tempdir().expect("dir");
    assert!(verifies(dir.path(), &corp_ca, &file(&issued, "tls.crt"), "orders-1.orders-headless.default.svc"), "for a member's name");
    assert!(!verifies(dir.path(), &corp_ca, &file(&issued, "tls.crt"), "orders.elsewhere.svc"), "not for another name");
    let progressing = condition(&dbs.get("orders").await.expect("read"), "Progressing").expect("Progressing");
    assert_ne!(progressing.0, "CertificateUnavailable", "the wait is over: {progressing:?}");

    // A renewal (what `cmctl renew` asks for): a new certificate, and the members roll.
    let issuing = json!({"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "Ready", "message": "ready"},
        {"type": "Issuing", "status": "True", "reason": "ManuallyTriggered", "message": "renewal asked by the test"},
    ]}});
    tokio::time::sleep(Duration::from_millis(1100)).await; // a later second: a different expiry
    certificates.patch_status("orders-tls", &PatchParams::default(), &Patch::Merge(&issuing)).await.expect("ask for a renewal");
    let mut renewed = None;
    wait_for("the renewed certificate rolls the members", WAIT, async || {
        renewed = stamp(&cp.client, "orders").await.filter(|s| *s != first);
        renewed.is_some()
    })
    .await;
    let reissued = secret(&cp.client, "orders-tls").await.expect("the Secret");
    assert_ne!(file(&reissued, "tls.crt"), file(&issued, "tls.crt"), "a new certificate");
    assert_ne!(file(&reissued, "tls.key"), file(&issued, "tls.key"), "with a new key");

    // Without issuerRef, plugdb issues it again from the Database's own authority.
    let own = json!({"spec": {"tls": {"enabled": true, "issuerRef": null}}});
    dbs.patch("orders", &PatchParams::default(), &Patch::Merge(&own)).await.expect("drop issuerRef");
    wait_for("plugdb's own certificate replaces cert-manager's", WAIT, async || {
        let Some(s) = secret(&cp.client, "orders-tls").await else { return false };
        s.annotations().contains_key("plugdb.io/not-after") && !s.annotations().contains_key("cert-manager.io/certificate-name")
    })
    .await;
    assert!(certificates.get_opt("orders-tls").await.expect("read").is_none(), "the Certificate is gone, so cert-manager writes no more");
    let own_ca = file(&secret(&cp.client, "orders-ca").await.expect("the Database's authority"), "ca.crt");
    let now = secret(&cp.client, "orders-tls").await.expect("the Secret");
    assert_eq!(file(&now, "ca.crt"), own_ca);
    assert!(verifies(dir.path(), &own_ca, &file(&now, "tls.crt"), "orders.default.svc"));
    drop(cert_manager);
}
