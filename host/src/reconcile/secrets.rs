//! The Secrets the members mount, decided into the pass's [`Plan`] (written first when
//! it is carried out, before anything that mounts them): the credentials (generated
//! once), the Database's authority (made once), its TLS certificate (issued by the
//! authority, or cert-manager's Certificate), and the member agents' certificates
//! (Secret `<name>-agent`, issued by the authority whether or not its clients use TLS).
//! What is read here is read from the cache, and from the API server only when the cache
//! may be behind a Secret written a moment ago: a generated value is never replaced.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject};
use serde_json::json;

use super::apply::{certificate_resource, own_secret, secret_metadata};
use super::owner;
use super::plan::{Plan, SecretWrite};
use super::status::Reason;
use super::{Context, Error};
use crate::agent;
use crate::crd::{Database, DeletionPolicy, IssuerRef};
use crate::names::{APPLIED_HASH, Names};
use crate::plugin::{ApplicationLogin, Credential, Workload};
use crate::tls::{self, Use};

const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// A random alphanumeric string from the operating system's CSPRNG.
fn generate(length: u32) -> Result<String, Error> {
    let mut out = String::with_capacity(length as usize);
    let mut buf = [0u8; 64];
    while out.len() < length as usize {
        getrandom::fill(&mut buf).map_err(|e| Error::Random(e.to_string()))?;
        // 248 = 4 × 62: rejecting bytes at or above it keeps the choice uniform.
        out.extend(buf.iter().filter(|b| **b < 248).map(|b| ALPHABET[(*b % 62) as usize] as char).take(length as usize - out.len()));
    }
    Ok(out)
}

/// Makes sure the credentials Secret holds every key the plugin asks for, and that the
/// application's login, when the plugin names one, is in Secret `<name>-app`. Keys are
/// generated once and never overwritten; both Secrets outlive the Database unless the
/// deletion policy is Delete.
pub(super) async fn ensure_credentials(ctx: &Context, db: &Database, workload: &Workload, plan: &mut Plan) -> Result<(), Error> {
    let generated = ensure_keys(ctx, db, &workload.credentials, plan).await?;
    match &workload.application {
        Some(login) => ensure_application(ctx, db, login, workload.ports.first().map_or(0, |p| p.port), &generated, plan).await,
        None => Ok(()),
    }
}

/// The keys of the credentials Secret the plugin asks for that it lacks, generated and
/// added to `plan`: what they will hold.
async fn ensure_keys(ctx: &Context, db: &Database, wanted: &[Credential], plan: &mut Plan) -> Result<BTreeMap<String, ByteString>, Error> {
    let ns = db.namespace().unwrap_or_default();
    let name = Names(&db.name_any()).credentials();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let live = ctx.caches.secret_keys(db, &name);
    let have = live.clone().unwrap_or_default();
    let mut missing = BTreeMap::new();
    for c in wanted.iter().filter(|c| !have.contains(&c.key)) {
        missing.insert(c.key.clone(), ByteString(generate(c.length)?.into_bytes()));
    }
    match live {
        None => {
            let secret = Secret {
                metadata: secret_metadata(db, &name, db.spec.deletion_policy == DeletionPolicy::Delete),
                data: Some(missing),
                type_: Some("Opaque".into()),
                ..Default::default()
            };
            plan.secret(SecretWrite::Make(secret.clone()));
            return Ok(secret.data.unwrap_or_default());
        }
        Some(_) if missing.is_empty() => {}
        Some(_) => {
            // The cache may be behind a key added a moment ago: ask the API server before
            // adding, so a generated value is never replaced by another.
            let Some(live) = own_secret(ctx, db, api.get_opt(&name).await?)? else { return Ok(BTreeMap::new()) };
            missing.retain(|k, _| !live.data.as_ref().is_some_and(|d| d.contains_key(k)));
            if !missing.is_empty() {
                // Add only the missing keys; a merge patch leaves the others as they are,
                // and the resourceVersion makes it fail if the Secret changed since it was read.
                // The stamp covers the keys added ([`crate::stamp`]).
                let stamp = ctx.caches.stamper().stamp_with(&live, &missing);
                let metadata = json!({"resourceVersion": live.resource_version(), "annotations": {crate::stamp::STAMP: stamp}});
                let patch = json!({"metadata": metadata, "data": missing});
                plan.secret(SecretWrite::AddKeys { name, patch });
            }
        }
    }
    Ok(missing)
}

/// Secret `<name>-app`: the application's login, for clients to read (`username`,
/// `password`, `dbname`, `host` and `port` of the read-write Service, and a `uri` of
/// them all), made once from the credentials Secret's key (`generated` by this pass, or
/// read from the API server: the cache holds no values) and kept like the credentials.
async fn ensure_application(
    ctx: &Context,
    db: &Database,
    login: &ApplicationLogin,
    port: u16,
    generated: &BTreeMap<String, ByteString>,
    plan: &mut Plan,
) -> Result<(), Error> {
    let name = db.name_any();
    let n = Names(&name);
    if ctx.caches.secret_keys(db, &n.application()).is_some() {
        return Ok(());
    }
    let password = match generated.get(&login.password_key) {
        Some(value) => Some(value.0.clone()),
        None => {
            let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &db.namespace().unwrap_or_default());
            own_secret(ctx, db, api.get_opt(&n.credentials()).await?)?.and_then(|s| s.data?.remove(&login.password_key)).map(|v| v.0)
        }
    };
    // Not there yet: the pass that adds the key makes this Secret.
    let Some(password) = password.and_then(|p| String::from_utf8(p).ok()) else { return Ok(()) };
    let host = n.primary_host(&db.namespace().unwrap_or_default());
    let uri = format!("{}://{}:{password}@{host}:{port}/{}", login.scheme, login.user, login.database);
    let data = [
        ("username", login.user.clone()),
        ("password", password),
        ("dbname", login.database.clone()),
        ("host", host),
        ("port", port.to_string()),
        ("uri", uri),
    ];
    let secret = Secret {
        metadata: secret_metadata(db, &n.application(), db.spec.deletion_policy == DeletionPolicy::Delete),
        string_data: Some(data.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    plan.secret(SecretWrite::Make(secret));
    Ok(())
}

/// Where the Database's TLS certificate stands after [`ensure_tls`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Certified {
    /// The Database has no TLS.
    Off,
    /// Issued, in Secret `<name>-tls`; its stamp (its expiry) goes on the pod template,
    /// so that a renewal rolls the members.
    Issued(String),
    /// Not issued yet, and why: nothing is built until it is.
    Waiting(Reason, String),
}

/// The Database's TLS certificate, in Secret `<name>-tls`: from the cert-manager issuer
/// `spec.tls.issuerRef` names, else issued by the Database's own authority (`<name>-ca`,
/// made once and kept like the credentials), again 30 days before it expires or when
/// the names it must carry change.
pub(super) async fn ensure_tls(ctx: &Context, db: &Database, plan: &mut Plan) -> Result<Certified, Error> {
    if !db.spec.tls_enabled() {
        return Ok(Certified::Off);
    }
    if let Some(issuer) = db.spec.tls_issuer() {
        return ensure_certificate(ctx, db, issuer, plan).await;
    }
    let (ns, name) = (db.namespace().unwrap_or_default(), db.name_any());
    let n = Names(&name);
    let names = tls::names(&name, &ns);
    let hash = tls::names_hash(&names);
    let now = chrono::Utc::now();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let current = |s: &Secret| {
        let stamp = s.annotations().get(tls::NOT_AFTER);
        let ours = !s.annotations().contains_key(tls::CERTIFICATE_NAME);
        (ours && s.annotations().get(tls::NAMES) == Some(&hash) && !tls::due(stamp.map(String::as_str), now))
            .then(|| stamp.cloned())
            .flatten()
    };
    if let Some(stamp) = ctx.caches.secret(db, &n.tls()).and_then(|s| current(&s)) {
        return Ok(Certified::Issued(stamp));
    }
    // The cache may be behind a certificate issued a moment ago: ask before issuing.
    let live = own_secret(ctx, db, api.get_opt(&n.tls()).await?)?;
    if let Some(stamp) = live.as_ref().and_then(current) {
        return Ok(Certified::Issued(stamp));
    }
    if live.as_ref().and_then(|s| s.annotations().get(tls::CERTIFICATE_NAME)) == Some(&n.tls()) {
        // cert-manager issued it while `issuerRef` was set: its Certificate goes first
        // (or it would write the Secret again), then the Secret with its annotations.
        let certificates: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &certificate_resource());
        let certificate = certificates.get_opt(&n.tls()).await?;
        if let Some(certificate) = &certificate {
            owner::check_as(db, "Certificate", false, &certificate.metadata)?;
        }
        plan.secret(SecretWrite::Reclaim { name: n.tls(), certificate: certificate.is_some() });
    }
    let authority = authority(ctx, db, &api, plan).await?;
    let issued = tls::issue(&name, &ns, &authority.key, &names, now).map_err(Error::Tls)?;
    let stamp = issued.not_after.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let data = BTreeMap::from([
        (tls::CERTIFICATE.to_string(), ByteString(issued.certificate.into_bytes())),
        (tls::KEY.to_string(), ByteString(issued.key.into_bytes())),
        (tls::CA.to_string(), ByteString(authority.certificate.into_bytes())),
    ]);
    let annotations = BTreeMap::from([(tls::NOT_AFTER.to_string(), stamp.clone()), (tls::NAMES.to_string(), hash)]);
    let secret = Secret {
        metadata: kube::api::ObjectMeta { annotations: Some(annotations), ..secret_metadata(db, &n.tls(), true) },
        data: Some(data),
        type_: Some("kubernetes.io/tls".into()),
        ..Default::default()
    };
    plan.secret(SecretWrite::Apply(secret));
    tracing::info!(database = %format!("{ns}/{name}"), expires = %stamp, "issued the Database's TLS certificate");
    Ok(Certified::Issued(stamp))
}

/// The Database's certificate from cert-manager: its `Certificate` `<name>-tls` is
/// applied when it differs from what it should be (one read a pass), and the
/// certificate counts as issued once cert-manager has written the Secret with all three
/// files. Renewals are cert-manager's; its `status.notAfter` is the stamp.
async fn ensure_certificate(ctx: &Context, db: &Database, issuer: &IssuerRef, plan: &mut Plan) -> Result<Certified, Error> {
    let (ns, name) = (db.namespace().unwrap_or_default(), db.name_any());
    let n = Names(&name);
    let wanted = tls::certificate(db, issuer);
    let mut object = serde_json::to_value(&wanted)?;
    let hash = crate::plugin::hex_digest(&serde_json::to_vec(&object)?)[..32].to_string();
    object["metadata"]["annotations"] = json!({ APPLIED_HASH: hash });
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &certificate_resource());
    let issuer_named = format!("{} {}", issuer.kind, issuer.name);
    // A 404 to a read is the resource missing, not the object (an object missing is
    // `None` to a read).
    let unserved = || {
        let message = format!(
            "spec.tls.issuerRef: {issuer_named} cannot issue the certificate: this cluster does not serve cert-manager's \
             Certificate (cert-manager.io/v1); install cert-manager, or remove issuerRef to have plugdb issue it"
        );
        Ok(Certified::Waiting(Reason::CertificateUnavailable, message))
    };
    let read = api.get_opt(&n.tls()).await;
    if let Ok(Some(live)) = &read {
        owner::check_as(db, "Certificate", false, &live.metadata)?;
    }
    let live = match read {
        Ok(live) => live,
        Err(kube::Error::Api(e)) if e.code == 404 => return unserved(),
        Err(e) => return Err(e.into()),
    };
    if live.as_ref().and_then(|l| l.annotations().get(APPLIED_HASH)) != Some(&hash) {
        plan.secret(SecretWrite::ApplyCertificate { name: n.tls(), object });
    }
    // What cert-manager says of the certificate it holds: a Certificate applied anew is
    // looked at again on the next pass.
    let status = live.map(|l| l.data["status"].clone()).unwrap_or_default();
    let Some(not_after) = status["notAfter"].as_str().map(str::to_string) else {
        let ready = status["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "Ready")).cloned();
        let said = ready.and_then(|c| c["message"].as_str().map(str::to_string)).unwrap_or_else(|| "not looked at yet".into());
        let message = format!("waiting for cert-manager to issue Certificate {ns}/{} from {issuer_named}: {said}", n.tls());
        return Ok(Certified::Waiting(Reason::CertificatePending, message));
    };
    let files = [tls::CERTIFICATE, tls::KEY, tls::CA];
    let complete = |keys: &[String]| files.iter().all(|f| keys.iter().any(|k| k == f));
    let mut keys = ctx.caches.secret_keys(db, &n.tls()).unwrap_or_default();
    if !complete(&keys) {
        // The cache may be behind the Secret cert-manager wrote a moment ago.
        let secret = own_secret(ctx, db, Api::<Secret>::namespaced(ctx.client.clone(), &ns).get_opt(&n.tls()).await?)?;
        keys = secret.and_then(|s| s.data).map(|d| d.into_keys().collect()).unwrap_or_default();
    }
    if !complete(&keys) {
        let message = format!(
            "spec.tls.issuerRef: Secret {ns}/{} from {issuer_named} holds {keys:?}, not {files:?}: members verify each other \
             with ca.crt, so the issuer must provide its CA (cert-manager's CA and Vault issuers do)",
            n.tls()
        );
        return Ok(Certified::Waiting(Reason::CertificateUnavailable, message));
    }
    Ok(Certified::Issued(not_after))
}

/// The Database's certificate authority from its Secret, made the first time. It is kept
/// like the credentials (owned by the Database only under `Delete`): clients that trust
/// it keep trusting a Database created again over retained volumes.
pub(super) async fn authority(ctx: &Context, db: &Database, api: &Api<Secret>, plan: &mut Plan) -> Result<tls::Authority, Error> {
    if let Some(made) = plan.authority() {
        return Ok(made.clone());
    }
    let (ns, name) = (db.namespace().unwrap_or_default(), db.name_any());
    let secret_name = Names(&name).authority();
    let read = |s: Secret| -> Result<tls::Authority, Error> {
        let data = s.data.unwrap_or_default();
        let text = |key: &str| {
            data.get(key)
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .ok_or_else(|| Error::Tls(format!("Secret {ns}/{secret_name} has no {key}")))
        };
        Ok(tls::Authority { certificate: text(tls::CA)?, key: text(tls::CA_KEY)? })
    };
    if let Some(live) = own_secret(ctx, db, api.get_opt(&secret_name).await?)? {
        return read(live);
    }
    let made = tls::new_authority(&name, &ns, chrono::Utc::now()).map_err(Error::Tls)?;
    let secret = Secret {
        metadata: secret_metadata(db, &secret_name, db.spec.deletion_policy == DeletionPolicy::Delete),
        data: Some(BTreeMap::from([
            (tls::CA.to_string(), ByteString(made.certificate.clone().into_bytes())),
            (tls::CA_KEY.to_string(), ByteString(made.key.clone().into_bytes())),
        ])),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    plan.make_authority(made.clone(), secret);
    Ok(made)
}

/// The agents' names: every member under the headless Service.
fn member_names(name: &str, namespace: &str) -> Vec<String> {
    let headless = Names(name).headless();
    [format!("*.{headless}.{namespace}.svc"), format!("*.{headless}.{namespace}.svc.cluster.local")].into()
}

/// Secret `<name>-agent`: the agents' certificate (for servers only) and the Database
/// authority's, issued once and again 30 days before they expire, and the certificate of
/// the operator's own authority, the only one the agents trust for clients (again when
/// the operator's is another). The agents read them on every connection: a renewal
/// restarts nothing.
pub(super) async fn ensure_agents(ctx: &Context, db: &Database, plan: &mut Plan) -> Result<(), Error> {
    let (ns, name) = (db.namespace().unwrap_or_default(), db.name_any());
    let secret_name = Names(&name).agent();
    let now = chrono::Utc::now();
    let operator = ctx.agents.identity();
    let clients = tls::names_hash(std::slice::from_ref(&operator.authority.certificate));
    let current = |s: &Secret| {
        !tls::due(s.annotations().get(tls::NOT_AFTER).map(String::as_str), now)
            && s.annotations().get(agent::CLIENTS_HASH) == Some(&clients)
    };
    if ctx.caches.secret(db, &secret_name).is_some_and(|s| current(&s)) {
        return Ok(());
    }
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    // The cache may be behind a Secret written a moment ago: ask before issuing.
    if own_secret(ctx, db, api.get_opt(&secret_name).await?)?.is_some_and(|s| current(&s)) {
        return Ok(());
    }
    let authority = authority(ctx, db, &api, plan).await?;
    let server = tls::issue_for(&name, &ns, &authority.key, (&Names(&name).headless(), &member_names(&name, &ns)), Use::Server, now)
        .map_err(Error::Tls)?;
    let stamp = server.not_after.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let bytes = |s: String| ByteString(s.into_bytes());
    let data = BTreeMap::from([
        (tls::CERTIFICATE.to_string(), bytes(server.certificate)),
        (tls::KEY.to_string(), bytes(server.key)),
        (tls::CA.to_string(), bytes(authority.certificate)),
        (agent::CLIENTS_CA.to_string(), bytes(operator.authority.certificate.clone())),
    ]);
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            annotations: Some(BTreeMap::from([(tls::NOT_AFTER.to_string(), stamp.clone()), (agent::CLIENTS_HASH.to_string(), clients)])),
            ..secret_metadata(db, &secret_name, true)
        },
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    plan.secret(SecretWrite::Apply(secret));
    tracing::info!(database = %format!("{ns}/{name}"), expires = %stamp, "issued the member agents' certificates");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn generated_values_have_the_length_and_alphabet_asked_for() {
        let a = super::generate(32).expect("random");
        let b = super::generate(32).expect("random");
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }
}
