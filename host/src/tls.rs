//! TLS for a Database (`spec.tls`): a certificate authority of its own and one
//! certificate for every name its Services and members answer to, or the cert-manager
//! `Certificate` that has an issuer of the user's issue it. Pure: the reconciler keeps
//! them in Secrets (see `reconcile::secrets::ensure_tls`).
//!
//! The authority's key never leaves its Secret (`<name>-ca`); the certificate, its key
//! and the authority's certificate go to `<name>-tls` (a `kubernetes.io/tls` Secret
//! with `ca.crt`), which members and Jobs mount at [`MOUNT`].

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use serde::Serialize;

use crate::crd::{Database, IssuerRef};
use crate::names::Names;
use crate::plugin::TlsFiles;

/// Where members and Jobs find the certificate.
pub const MOUNT: &str = "/etc/plugdb-tls";
/// The certificate (PEM), in [`MOUNT`] and in the Secret.
pub const CERTIFICATE: &str = "tls.crt";
/// Its private key (PEM).
pub const KEY: &str = "tls.key";
/// The authority's certificate (PEM).
pub const CA: &str = "ca.crt";
/// The authority's private key, in its own Secret only.
pub const CA_KEY: &str = "ca.key";
/// Annotation on the certificate's Secret: when it expires (RFC 3339).
pub const NOT_AFTER: &str = "plugdb.io/not-after";
/// Annotation on the certificate's Secret: a hash of the names it carries.
pub const NAMES: &str = "plugdb.io/names";
/// The annotation cert-manager puts on the Secrets it writes: the Certificate's name.
pub const CERTIFICATE_NAME: &str = "cert-manager.io/certificate-name";
/// How long a certificate is valid.
pub const VALIDITY_DAYS: i64 = 365;
/// How long before it expires a certificate is replaced.
pub const RENEW_BEFORE_DAYS: i64 = 30;
/// How long the authority is valid.
pub const AUTHORITY_DAYS: i64 = 3650;

/// The files as the plugin is told of them.
pub fn files() -> TlsFiles {
    TlsFiles { certificate: format!("{MOUNT}/{CERTIFICATE}"), key: format!("{MOUNT}/{KEY}"), ca: format!("{MOUNT}/{CA}") }
}

/// Every name the Database's Services and members answer to.
pub fn names(name: &str, namespace: &str) -> Vec<String> {
    let n = Names(name);
    let mut out = vec!["localhost".to_string()];
    for service in [n.primary(), n.replicas(), n.headless()] {
        for suffix in ["", &format!(".{namespace}"), &format!(".{namespace}.svc"), &format!(".{namespace}.svc.cluster.local")] {
            out.push(format!("{service}{suffix}"));
        }
    }
    for suffix in [format!(".{namespace}.svc"), format!(".{namespace}.svc.cluster.local")] {
        out.push(format!("*.{}{suffix}", n.headless()));
    }
    out
}

/// A hash of [`names`], recorded on the Secret so that a change of names re-issues.
pub fn names_hash(names: &[String]) -> String {
    crate::plugin::hex_digest(names.join(",").as_bytes())[..16].to_string()
}

/// A certificate and its key, PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate.
    pub certificate: String,
    /// Its private key.
    pub key: String,
    /// When it expires.
    pub not_after: DateTime<Utc>,
}

fn moment(t: DateTime<Utc>) -> Result<time::OffsetDateTime, String> {
    time::OffsetDateTime::from_unix_timestamp(t.timestamp()).map_err(|e| e.to_string())
}

/// The authority's parameters: the same every time for a Database, so that its key
/// alone (from the Secret) signs with the issuer name and key identifier its
/// certificate carries.
fn authority_params(name: &str, namespace: &str, now: DateTime<Utc>) -> Result<CertificateParams, String> {
    named_authority_params(&format!("plugdb {namespace}/{name} CA"), now)
}

fn named_authority_params(common: &str, now: DateTime<Utc>) -> Result<CertificateParams, String> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "plugdb");
    dn.push(DnType::CommonName, common);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.not_before = moment(now - chrono::Duration::hours(1))?;
    params.not_after = moment(now + chrono::Duration::days(AUTHORITY_DAYS))?;
    Ok(params)
}

/// A Database's certificate authority, PEM.
#[derive(Debug, Clone)]
pub struct Authority {
    /// Its certificate, which clients trust.
    pub certificate: String,
    /// Its private key, which signs.
    pub key: String,
}

/// A new authority for Database `namespace/name`: its certificate and key.
pub fn new_authority(name: &str, namespace: &str, now: DateTime<Utc>) -> Result<Authority, String> {
    let key = KeyPair::generate().map_err(|e| format!("generating the authority's key: {e}"))?;
    let params = authority_params(name, namespace, now)?;
    let certificate = params.self_signed(&key).map_err(|e| format!("signing the authority's certificate: {e}"))?;
    Ok(Authority { certificate: certificate.pem(), key: key.serialize_pem() })
}

/// What a certificate may be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// A member's: it serves, and connects to the others.
    ServerAndClient,
    /// A member agent's: it serves the operator, and can ask nobody.
    Server,
    /// The operator's, asking the agents: it serves nothing.
    Client,
}

/// A certificate for `names`, for servers and clients, signed by the authority whose key
/// is `authority_key` (PEM).
pub fn issue(name: &str, namespace: &str, authority_key: &str, names: &[String], now: DateTime<Utc>) -> Result<Issued, String> {
    issue_for(name, namespace, authority_key, (&Names(name).primary(), names), Use::ServerAndClient, now)
}

/// A certificate with common name `common` for `names`, for `usage`, signed by the
/// authority of Database `namespace/name` whose key is `authority_key` (PEM).
pub fn issue_for(
    name: &str,
    namespace: &str,
    authority_key: &str,
    (common, names): (&str, &[String]),
    usage: Use,
    now: DateTime<Utc>,
) -> Result<Issued, String> {
    issue_by(authority_params(name, namespace, now)?, authority_key, (common, names), usage, (now, VALIDITY_DAYS))
}

/// A certificate signed by the authority of `authority` (its parameters) whose key is
/// `authority_key` (PEM).
fn issue_by(
    authority: CertificateParams,
    authority_key: &str,
    (common, names): (&str, &[String]),
    usage: Use,
    (now, days): (DateTime<Utc>, i64),
) -> Result<Issued, String> {
    let signer = KeyPair::from_pem(authority_key).map_err(|e| format!("the authority's key in its Secret is unreadable: {e}"))?;
    let issuer = Issuer::new(authority, signer);
    let key = KeyPair::generate().map_err(|e| format!("generating a key: {e}"))?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(|e| format!("certificate names: {e}"))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "plugdb");
    dn.push(DnType::CommonName, common);
    params.distinguished_name = dn;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = match usage {
        Use::ServerAndClient => vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
        Use::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
        Use::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    let not_after = now + chrono::Duration::days(days);
    params.not_before = moment(now - chrono::Duration::hours(1))?;
    params.not_after = moment(not_after)?;
    let certificate = params.signed_by(&key, &issuer).map_err(|e| format!("signing the certificate: {e}"))?;
    Ok(Issued { certificate: certificate.pem(), key: key.serialize_pem(), not_after })
}

/// The common name of the operator's own authority, which member agents trust for clients.
const OPERATOR_AUTHORITY: &str = "plugdb operator (member agents' clients) CA";
/// The name the operator's client certificate carries.
const OPERATOR_CLIENT: &str = "plugdb-operator";

/// What the operator asks member agents with: an authority of its own, kept in its own
/// namespace (no Database's tenant reads it), and a certificate for clients it signed.
/// Member agents trust this authority alone for clients: not the Database's, whose
/// certificates its members and Jobs hold.
#[derive(Debug, Clone)]
pub struct OperatorIdentity {
    /// The authority: agents trust its certificate; its key signs the client certificate.
    pub authority: Authority,
    /// The client certificate the operator presents.
    pub client: Issued,
}

impl OperatorIdentity {
    /// A new authority and a client certificate from it.
    pub fn new(now: DateTime<Utc>) -> Result<Self, String> {
        let key = KeyPair::generate().map_err(|e| format!("generating the operator authority's key: {e}"))?;
        let certificate = named_authority_params(OPERATOR_AUTHORITY, now)?
            .self_signed(&key)
            .map_err(|e| format!("signing the operator authority's certificate: {e}"))?;
        let authority = Authority { certificate: certificate.pem(), key: key.serialize_pem() };
        let client = Self::client(&authority.key, now)?;
        Ok(Self { authority, client })
    }

    /// A client certificate signed by the authority whose key is `authority_key`, as long
    /// as the authority lasts: the operator checks it when it starts, and one that runs for
    /// years without a restart still asks its agents (its key never leaves its namespace).
    pub fn client(authority_key: &str, now: DateTime<Utc>) -> Result<Issued, String> {
        let names = [OPERATOR_CLIENT.to_string()];
        let authority = named_authority_params(OPERATOR_AUTHORITY, now)?;
        issue_by(authority, authority_key, (OPERATOR_CLIENT, &names), Use::Client, (now, AUTHORITY_DAYS - RENEW_BEFORE_DAYS))
    }

    /// The client certificate and its key, PEM, as a TLS client presents them.
    pub fn client_pem(&self) -> Vec<u8> {
        [self.client.certificate.as_str(), self.client.key.as_str()].concat().into_bytes()
    }
}

/// Whether a certificate expiring at `not_after` (as recorded on its Secret) is due for
/// replacement at `now`; an unreadable record is.
pub fn due(not_after: Option<&str>, now: DateTime<Utc>) -> bool {
    let expires = not_after.and_then(|t| DateTime::parse_from_rfc3339(t).ok());
    expires.is_none_or(|t| t.with_timezone(&Utc) - chrono::Duration::days(RENEW_BEFORE_DAYS) <= now)
}

/// cert-manager's `Certificate` (`cert-manager.io/v1`), the fields plugdb sets.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Certificate {
    /// `cert-manager.io/v1`.
    pub api_version: &'static str,
    /// `Certificate`.
    pub kind: &'static str,
    /// Name `<name>-tls`, owned by the Database.
    pub metadata: ObjectMeta,
    /// What to issue.
    pub spec: CertificateSpec,
}

/// The `spec` of a [`Certificate`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSpec {
    /// The Secret cert-manager writes: `<name>-tls`, the one members mount.
    pub secret_name: String,
    /// Labels for that Secret, so that plugdb's watch sees it.
    pub secret_template: SecretTemplate,
    /// The Database's primary Service.
    pub common_name: String,
    /// Every name of [`names`].
    pub dns_names: Vec<String>,
    /// How long a certificate is valid (Go duration).
    pub duration: String,
    /// How long before it expires it is replaced (Go duration).
    pub renew_before: String,
    /// For servers and clients, as plugdb's own certificates.
    pub usages: Vec<&'static str>,
    /// A new ECDSA P-256 key at every issuance.
    pub private_key: PrivateKey,
    /// The issuer `spec.tls.issuerRef` names.
    pub issuer_ref: IssuerRef,
}

/// `spec.secretTemplate` of a [`Certificate`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SecretTemplate {
    /// The Database's labels.
    pub labels: BTreeMap<String, String>,
}

/// `spec.privateKey` of a [`Certificate`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PrivateKey {
    /// `ECDSA`.
    pub algorithm: &'static str,
    /// 256.
    pub size: u16,
    /// `Always`: every renewal makes a new key.
    pub rotation_policy: &'static str,
}

/// The cert-manager `Certificate` that has Database `db`'s certificate issued by
/// `issuer`, into the Secret members mount: the same names, uses and lifetime as a
/// certificate plugdb issues itself.
pub fn certificate(db: &Database, issuer: &IssuerRef) -> Certificate {
    let (name, ns) = (db.name_any(), db.namespace().unwrap_or_default());
    let n = Names(&name);
    let mut metadata = crate::names::metadata_with(db, &n.tls(), true, &crate::names::labels(db));
    metadata.annotations = None;
    Certificate {
        api_version: "cert-manager.io/v1",
        kind: "Certificate",
        metadata,
        spec: CertificateSpec {
            secret_name: n.tls(),
            secret_template: SecretTemplate { labels: crate::names::labels(db) },
            common_name: n.primary(),
            dns_names: names(&name, &ns),
            duration: format!("{}h", VALIDITY_DAYS * 24),
            renew_before: format!("{}h", RENEW_BEFORE_DAYS * 24),
            usages: vec!["digital signature", "key encipherment", "server auth", "client auth"],
            private_key: PrivateKey { algorithm: "ECDSA", size: 256, rotation_policy: "Always" },
            issuer_ref: issuer.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use rustls::client::danger::ServerCertVerifier;
    use rustls_pki_types::pem::PemObject;

    use super::*;

    #[test]
    fn names_cover_every_service_and_member() {
        let names = names("orders", "shop");
        for wanted in
            ["orders", "orders.shop.svc", "orders-replicas.shop.svc.cluster.local", "orders-headless", "*.orders-headless.shop.svc"]
        {
            assert!(names.iter().any(|n| n == wanted), "{wanted} in {names:?}");
        }
    }

    /// The Certificate asks cert-manager for what plugdb would issue itself (the same
    /// names, uses, lifetime and Secret), from the issuer named, owned by the Database,
    /// with the Secret labelled for plugdb's watch.
    #[test]
    fn a_cert_manager_certificate_asks_for_what_plugdb_would_issue() {
        let mut db =
            Database::new("orders", serde_json::from_value(serde_json::json!({"engine": "postgres", "storage": "1Gi"})).expect("spec"));
        db.metadata.namespace = Some("shop".into());
        db.metadata.uid = Some("3f1c".into());
        let issuer = IssuerRef { name: "corp-ca".into(), kind: "ClusterIssuer".into(), group: "cert-manager.io".into() };
        let certificate = serde_json::to_value(certificate(&db, &issuer)).expect("json");
        assert_eq!(certificate["apiVersion"], "cert-manager.io/v1");
        assert_eq!(certificate["metadata"]["name"], "orders-tls");
        assert_eq!(certificate["metadata"]["ownerReferences"][0]["uid"], "3f1c");
        let spec = &certificate["spec"];
        assert_eq!(spec["secretName"], "orders-tls", "the Secret members mount");
        assert_eq!(spec["secretTemplate"]["labels"]["app.kubernetes.io/managed-by"], "plugdb", "seen by plugdb's Secret watch");
        assert_eq!(spec["dnsNames"], serde_json::json!(names("orders", "shop")));
        assert_eq!(spec["issuerRef"], serde_json::json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}));
        assert_eq!(spec["duration"], "8760h");
        assert_eq!(spec["renewBefore"], "720h");
        assert_eq!(spec["usages"], serde_json::json!(["digital signature", "key encipherment", "server auth", "client auth"]));
        assert_eq!(spec["privateKey"]["rotationPolicy"], "Always");
    }

    #[test]
    fn renewal_is_due_thirty_days_before_expiry_or_without_a_record() {
        let now = Utc::now();
        let at = |days: i64| (now + chrono::Duration::days(days)).to_rfc3339();
        assert!(!due(Some(&at(31)), now));
        assert!(due(Some(&at(29)), now));
        assert!(due(None, now));
        assert!(due(Some("yesterday"), now));
    }

    /// The certificate verifies against the authority for a member's name, for server
    /// use, and a second certificate signed with the authority's key alone (as after a
    /// restart) verifies too.
    #[test]
    fn certificates_chain_to_the_database_authority() {
        let now = Utc::now();
        let authority = new_authority("orders", "shop", now).expect("authority");
        let names = names("orders", "shop");
        let first = issue("orders", "shop", &authority.key, &names, now).expect("issued");
        let later = issue("orders", "shop", &authority.key, &names, now + chrono::Duration::days(300)).expect("issued later");
        let der = |pem: &str| rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem");
        let roots = {
            let mut store = rustls::RootCertStore::empty();
            store.add(der(&authority.certificate)).expect("root");
            std::sync::Arc::new(store)
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        let verifier = rustls::client::WebPkiServerVerifier::builder(roots).build().expect("verifier");
        for (issued, at) in [(&first, now), (&later, now + chrono::Duration::days(300))] {
            let name = rustls_pki_types::ServerName::try_from("orders-1.orders-headless.shop.svc").expect("name");
            let when = rustls_pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(at.timestamp() as u64));
            verifier.verify_server_cert(&der(&issued.certificate), &[], &name, &[], when).expect("verifies for a member's name");
            let other = rustls_pki_types::ServerName::try_from("orders-1.elsewhere.shop.svc").expect("name");
            assert!(verifier.verify_server_cert(&der(&issued.certificate), &[], &other, &[], when).is_err(), "not for another name");
        }
        let stranger = new_authority("orders", "shop", now).expect("another authority");
        let forged = issue("orders", "shop", &stranger.key, &names, now).expect("issued");
        let name = rustls_pki_types::ServerName::try_from("orders.shop.svc").expect("name");
        let when = rustls_pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(now.timestamp() as u64));
        assert!(
            verifier.verify_server_cert(&der(&forged.certificate), &[], &name, &[], when).is_err(),
            "another authority's is not trusted"
        );
    }
}
