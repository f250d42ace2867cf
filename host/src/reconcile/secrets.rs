//! The Secrets the members mount, decided into the pass's [`Plan`] (written first when
//! it is carried out, before anything that mounts them): the credentials (generated
//! once), the Database's authority (made once), its TLS certificate (issued by the
//! authority, or cert-manager's Certificate), and the member agents' certificates
//! (Secret `<name>-agent`, issued by the authority whether or not its clients use TLS).
//! The observe stage reads what the cache will not do ([`observe`]: it keeps no values,
//! and may be behind a Secret written a moment ago); the render stage decides from that
//! and the cache, reading nothing. Keys are added, and the application's login made, by
//! the end of the pass against the credentials as it finds them: a generated value is
//! never replaced.

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
use crate::plugin::{ApplicationLogin, Workload};
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
pub(super) fn ensure_credentials(ctx: &Context, db: &Database, workload: &Workload, plan: &mut Plan) -> Result<(), Error> {
    let n = Names(&db.name_any());
    let name = n.credentials();
    let live = ctx.caches.secret_keys(db, &name);
    let have = live.clone().unwrap_or_default();
    let mut missing = BTreeMap::new();
    for c in workload.credentials.iter().filter(|c| !have.contains(&c.key)) {
        missing.insert(c.key.clone(), ByteString(generate(c.length)?.into_bytes()));
    }
    match live {
        None => {
            let metadata = secret_metadata(db, &name, db.spec.deletion_policy == DeletionPolicy::Delete);
            plan.secret(SecretWrite::Make(Secret { metadata, data: Some(missing), type_: Some("Opaque".into()), ..Default::default() }));
        }
        // The cache may be behind a key added a moment ago: the end of the pass adds only
        // those the Secret still lacks.
        Some(_) if !missing.is_empty() => plan.secret(SecretWrite::AddKeys { name, missing }),
        Some(_) => {}
    }
    if let Some(login) = &workload.application
        && ctx.caches.secret_keys(db, &n.application()).is_none()
    {
        let port = workload.ports.first().map_or(0, |p| p.port);
        plan.secret(SecretWrite::Application { login: login.clone(), port });
    }
    Ok(())
}

/// Secret `<name>-app`: the application's login, for clients to read (`username`,
/// `password`, `dbname`, `host` and `port` of the read-write Service, and a `uri` of
/// them all), made once with the credentials Secret's `password`, and kept like the
/// credentials.
pub(super) fn application(db: &Database, login: &ApplicationLogin, port: u16, password: String) -> Secret {
    let n = Names(&db.name_any());
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
    Secret {
        metadata: secret_metadata(db, &n.application(), db.spec.deletion_policy == DeletionPolicy::Delete),
        string_data: Some(data.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// What the API server holds of the Database's certificates where the cache will not do,
/// read by the observe stage ([`observe`]) when, and only when, the render stage needs
/// it: each `Some` was read this pass (holding `None` when absent).
#[derive(Debug, Default)]
pub(super) struct Held {
    /// When it was read: what is due is judged at this moment.
    at: chrono::DateTime<chrono::Utc>,
    /// The TLS Secret: plugdb's when the cache's is not current, cert-manager's when the
    /// cache's lacks a file.
    tls: Option<Option<Secret>>,
    /// cert-manager's Certificate: with `issuerRef`, and when plugdb issues over a
    /// certificate cert-manager issued.
    certificate: Option<CertificateRead>,
    /// The agents' Secret, when the cache's is not current.
    agent: Option<Option<Secret>>,
    /// The authority's Secret, when a certificate is issued.
    authority: Option<Option<Secret>>,
    /// The authority's certificate from the TLS Secret, for the questions asked of an
    /// elected leader's members over TLS ([`crate::reconcile::ask`]).
    pub tls_ca: Option<std::sync::Arc<[u8]>>,
}

/// cert-manager's Certificate as read.
#[derive(Debug)]
enum CertificateRead {
    /// The cluster does not serve the resource (cert-manager is not installed).
    Unserved,
    Read(Option<Box<DynamicObject>>),
}

/// Reads what the render stage needs of `db`'s certificates that the cache will not do
/// ([`Held`]); `agents`: whether its members run agents, whose Secret is then wanted;
/// `elects`: whether the plugin elects a leader (whose members are asked over TLS).
pub(super) async fn observe(ctx: &Context, db: &Database, agents: bool, elects: bool) -> Result<Held, Error> {
    let (ns, name) = (db.namespace().unwrap_or_default(), db.name_any());
    let n = Names(&name);
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let mut held = Held { at: chrono::Utc::now(), ..Held::default() };
    let mut issue = false;
    if db.spec.tls_enabled() {
        let cached = ctx.caches.secret(db, &n.tls());
        match db.spec.tls_issuer() {
            Some(_) => {
                let read = read_certificate(ctx, db, &n.tls()).await?;
                let said = matches!(&read, CertificateRead::Read(Some(c)) if c.data["status"]["notAfter"].is_string());
                held.certificate = Some(read);
                if !said {
                    // The render stage waits for cert-manager to issue it: nothing more is needed.
                    return Ok(held);
                }
                if !complete(&ctx.caches.secret_keys(db, &n.tls()).unwrap_or_default()) {
                    held.tls = Some(own_secret(ctx, db, api.get_opt(&n.tls()).await?)?);
                }
            }
            None if cached.is_none_or(|s| issued(db, &s, held.at).is_none()) => {
                let live = own_secret(ctx, db, api.get_opt(&n.tls()).await?)?;
                if live.as_ref().is_none_or(|s| issued(db, s, held.at).is_none()) {
                    issue = true;
                    if live.as_ref().and_then(|s| s.annotations().get(tls::CERTIFICATE_NAME)) == Some(&n.tls()) {
                        held.certificate = Some(read_certificate(ctx, db, &n.tls()).await?);
                    }
                }
                held.tls = Some(live);
            }
            None => {}
        }
        if elects {
            held.tls_ca = super::agent::certificate_authority(ctx, db, &n.tls(), false).await?;
        }
    }
    if agents && ctx.caches.secret(db, &n.agent()).is_none_or(|s| !agents_current(ctx, &s, held.at)) {
        let live = own_secret(ctx, db, api.get_opt(&n.agent()).await?)?;
        issue |= live.as_ref().is_none_or(|s| !agents_current(ctx, s, held.at));
        held.agent = Some(live);
    }
    if issue {
        held.authority = Some(own_secret(ctx, db, api.get_opt(&n.authority()).await?)?);
    }
    Ok(held)
}

/// cert-manager's Certificate `name`, checked to be the Database's when there is one.
async fn read_certificate(ctx: &Context, db: &Database, name: &str) -> Result<CertificateRead, Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &db.namespace().unwrap_or_default(), &certificate_resource());
    // A 404 to a read is the resource missing, not the object (an object missing is
    // `None` to a read).
    match api.get_opt(name).await {
        Ok(live) => {
            if let Some(live) = &live {
                owner::check_as(db, "Certificate", false, &live.metadata)?;
            }
            Ok(CertificateRead::Read(live.map(Box::new)))
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(CertificateRead::Unserved),
        Err(e) => Err(e.into()),
    }
}

/// The stamp of `secret`, plugdb's TLS certificate for `db`, while it is current: issued by
/// plugdb for the names it must carry, and not due at `now`.
fn issued(db: &Database, secret: &Secret, now: chrono::DateTime<chrono::Utc>) -> Option<String> {
    let hash = tls::names_hash(&tls::names(&db.name_any(), &db.namespace().unwrap_or_default()));
    let stamp = secret.annotations().get(tls::NOT_AFTER);
    let ours = !secret.annotations().contains_key(tls::CERTIFICATE_NAME);
    (ours && secret.annotations().get(tls::NAMES) == Some(&hash) && !tls::due(stamp.map(String::as_str), now)).then(|| stamp.cloned())?
}

/// Whether the agents' Secret is current at `now`: not due, and trusting the operator's
/// authority as it is.
fn agents_current(ctx: &Context, secret: &Secret, now: chrono::DateTime<chrono::Utc>) -> bool {
    let clients = tls::names_hash(std::slice::from_ref(&ctx.agents.identity().authority.certificate));
    !tls::due(secret.annotations().get(tls::NOT_AFTER).map(String::as_str), now)
        && secret.annotations().get(agent::CLIENTS_HASH) == Some(&clients)
}

/// Whether `keys` hold the three files of a certificate members verify each other with.
fn complete(keys: &[String]) -> bool {
    [tls::CERTIFICATE, tls::KEY, tls::CA].iter().all(|f| keys.iter().any(|k| k == f))
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
/// the names it must carry change; from the cache and what the observe stage `held`.
pub(super) fn ensure_tls(ctx: &Context, db: &Database, held: &Held, plan: &mut Plan) -> Result<Certified, Error> {
    if !db.spec.tls_enabled() {
        return Ok(Certified::Off);
    }
    if let Some(issuer) = db.spec.tls_issuer() {
        return Ok(certificate(ctx, db, issuer, held, plan));
    }
    let (ns, name) = (db.namespace().unwrap_or_default(), db.name_any());
    let n = Names(&name);
    let names = tls::names(&name, &ns);
    let cached = ctx.caches.secret(db, &n.tls());
    // The cache may be behind a certificate issued a moment ago: the observe stage read it then.
    let live = held.tls.clone().flatten();
    if let Some(stamp) = cached.and_then(|s| issued(db, &s, held.at)).or_else(|| live.as_ref().and_then(|s| issued(db, s, held.at))) {
        return Ok(Certified::Issued(stamp));
    }
    if live.as_ref().and_then(|s| s.annotations().get(tls::CERTIFICATE_NAME)) == Some(&n.tls()) {
        // cert-manager issued it while `issuerRef` was set: its Certificate goes first
        // (or it would write the Secret again), then the Secret with its annotations.
        let certificate = matches!(held.certificate, Some(CertificateRead::Read(Some(_))));
        plan.secret(SecretWrite::Reclaim { name: n.tls(), certificate });
    }
    let authority = authority(db, held, plan)?;
    let issued = tls::issue(&name, &ns, &authority.key, &names, held.at).map_err(Error::Tls)?;
    let stamp = issued.not_after.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let data = BTreeMap::from([
        (tls::CERTIFICATE.to_string(), ByteString(issued.certificate.into_bytes())),
        (tls::KEY.to_string(), ByteString(issued.key.into_bytes())),
        (tls::CA.to_string(), ByteString(authority.certificate.into_bytes())),
    ]);
    let annotations = BTreeMap::from([(tls::NOT_AFTER.to_string(), stamp.clone()), (tls::NAMES.to_string(), tls::names_hash(&names))]);
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
/// applied when it differs from what it should be (read each pass), and the
/// certificate counts as issued once cert-manager has written the Secret with all three
/// files. Renewals are cert-manager's; its `status.notAfter` is the stamp.
fn certificate(ctx: &Context, db: &Database, issuer: &IssuerRef, held: &Held, plan: &mut Plan) -> Certified {
    let (ns, name) = (db.namespace().unwrap_or_default(), db.name_any());
    let n = Names(&name);
    let issuer_named = format!("{} {}", issuer.kind, issuer.name);
    let live = match &held.certificate {
        Some(CertificateRead::Read(live)) => live.as_deref(),
        Some(CertificateRead::Unserved) | None => {
            let message = format!(
                "spec.tls.issuerRef: {issuer_named} cannot issue the certificate: this cluster does not serve cert-manager's \
                 Certificate (cert-manager.io/v1); install cert-manager, or remove issuerRef to have plugdb issue it"
            );
            return Certified::Waiting(Reason::CertificateUnavailable, message);
        }
    };
    let mut object = serde_json::to_value(tls::certificate(db, issuer)).unwrap_or_default();
    let hash = crate::plugin::hex_digest(&serde_json::to_vec(&object).unwrap_or_default())[..32].to_string();
    object["metadata"]["annotations"] = json!({ APPLIED_HASH: hash });
    if live.and_then(|l| l.annotations().get(APPLIED_HASH)) != Some(&hash) {
        plan.secret(SecretWrite::ApplyCertificate { name: n.tls(), object });
    }
    // What cert-manager says of the certificate it holds: a Certificate applied anew is
    // looked at again on the next pass.
    let status = live.map(|l| l.data["status"].clone()).unwrap_or_default();
    let Some(not_after) = status["notAfter"].as_str().map(str::to_string) else {
        let ready = status["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "Ready")).cloned();
        let said = ready.and_then(|c| c["message"].as_str().map(str::to_string)).unwrap_or_else(|| "not looked at yet".into());
        let message = format!("waiting for cert-manager to issue Certificate {ns}/{} from {issuer_named}: {said}", n.tls());
        return Certified::Waiting(Reason::CertificatePending, message);
    };
    // The cache may be behind the Secret cert-manager wrote a moment ago: the observe
    // stage read it then.
    let keys = match &held.tls {
        Some(live) => live.iter().flat_map(|s| s.data.iter().flat_map(|d| d.keys().cloned())).collect(),
        None => ctx.caches.secret_keys(db, &n.tls()).unwrap_or_default(),
    };
    if !complete(&keys) {
        let message = format!(
            "spec.tls.issuerRef: Secret {ns}/{} from {issuer_named} holds {keys:?}, not {:?}: members verify each other \
             with ca.crt, so the issuer must provide its CA (cert-manager's CA and Vault issuers do)",
            n.tls(),
            [tls::CERTIFICATE, tls::KEY, tls::CA]
        );
        return Certified::Waiting(Reason::CertificateUnavailable, message);
    }
    Certified::Issued(not_after)
}

/// The Database's certificate authority from its Secret, made the first time. It is kept
/// like the credentials (owned by the Database only under `Delete`): clients that trust
/// it keep trusting a Database created again over retained volumes.
fn authority(db: &Database, held: &Held, plan: &mut Plan) -> Result<tls::Authority, Error> {
    if let Some(made) = plan.authority() {
        return Ok(made.clone());
    }
    let (ns, name) = (db.namespace().unwrap_or_default(), db.name_any());
    let secret_name = Names(&name).authority();
    let read = |s: &Secret| -> Result<tls::Authority, Error> {
        let text = |key: &str| {
            s.data
                .as_ref()
                .and_then(|d| d.get(key))
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .ok_or_else(|| Error::Tls(format!("Secret {ns}/{secret_name} has no {key}")))
        };
        Ok(tls::Authority { certificate: text(tls::CA)?, key: text(tls::CA_KEY)? })
    };
    match &held.authority {
        Some(Some(live)) => return read(live),
        Some(None) => {}
        None => return Err(Error::Tls(format!("Secret {ns}/{secret_name} was not read before a certificate was issued"))),
    }
    let made = tls::new_authority(&name, &ns, held.at).map_err(Error::Tls)?;
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
pub(super) fn ensure_agents(ctx: &Context, db: &Database, held: &Held, plan: &mut Plan) -> Result<(), Error> {
    let (ns, name) = (db.namespace().unwrap_or_default(), db.name_any());
    let secret_name = Names(&name).agent();
    let current = |s: &Secret| agents_current(ctx, s, held.at);
    // The cache may be behind a Secret written a moment ago: the observe stage read it then.
    if ctx.caches.secret(db, &secret_name).is_some_and(|s| current(&s)) || held.agent.iter().flatten().any(current) {
        return Ok(());
    }
    let authority = authority(db, held, plan)?;
    let operator = ctx.agents.identity();
    let server = tls::issue_for(&name, &ns, &authority.key, (&Names(&name).headless(), &member_names(&name, &ns)), Use::Server, held.at)
        .map_err(Error::Tls)?;
    let stamp = server.not_after.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let bytes = |s: String| ByteString(s.into_bytes());
    let data = BTreeMap::from([
        (tls::CERTIFICATE.to_string(), bytes(server.certificate)),
        (tls::KEY.to_string(), bytes(server.key)),
        (tls::CA.to_string(), bytes(authority.certificate)),
        (agent::CLIENTS_CA.to_string(), bytes(operator.authority.certificate.clone())),
    ]);
    let clients = tls::names_hash(std::slice::from_ref(&operator.authority.certificate));
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
