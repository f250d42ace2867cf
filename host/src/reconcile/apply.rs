//! Writing children: created when absent, then server-side applied with one field
//! manager; skipped when the object already carries the hash of what would be applied.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::cache::Seen;
use super::owner;
use super::plan::{Plan, SecretWrite};
use super::status::Reason;
use super::{Context, Error};
use crate::build::{Child, Kind};
use crate::crd::{Database, DeletionPolicy, IssuerRef};
use crate::names::{APPLIED_HASH, MANAGER, Names, labels};
use crate::plugin::Credential;
use crate::tls;

/// Whether the cache holds `child` as the Database's own with the hash it would be
/// applied with: [`apply`] writes nothing for it.
pub fn unchanged(ctx: &Context, db: &Database, child: &Child) -> bool {
    matches!(ctx.caches.seen(child.kind, db, &child.name), Seen::Present { hash: Some(hash), .. } if hash == child.hash())
}

/// Writes `child` unless the live object already has its hash. Returns the written
/// object when a write was made.
///
/// A child that does not exist yet is created: the API server spends about half of
/// what a server-side apply costs it on a create. The create records its fields as
/// `MANAGER`'s `Update`; the first apply afterwards moves them to `MANAGER`'s `Apply`
/// entry ([`take_over_created_fields`]), so that a field a later render leaves out goes
/// from the object as it would from one applied from the start.
///
/// Only the Database's own object is written ([`owner`]): anything else with the
/// child's name stops the pass with [`Error::Taken`], untouched.
pub async fn apply(ctx: &Context, db: &Database, child: &Child) -> Result<(), Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &db.namespace().unwrap_or_default(), &child.resource);
    match ctx.caches.seen(child.kind, db, &child.name) {
        Seen::Present { hash, .. } if hash.as_deref() == Some(child.hash()) => return Ok(()),
        Seen::Present { created: true, .. } => take_over_created_fields(&api, db, child).await?,
        Seen::Present { created: false, .. } => {}
        // The cache may be behind a change of hands: the live object decides.
        Seen::Foreign => take_over_created_fields(&api, db, child).await?,
        Seen::Absent => match api.create(&post_params(), &serde_json::from_value(child.object.clone())?).await {
            Ok(_) => return Ok(()),
            // Not in the cache, which sees only plugdb's objects: made a moment ago, or
            // not plugdb's at all. Applied over only when it is the Database's.
            Err(kube::Error::Api(e)) if e.code == 409 => take_over_created_fields(&api, db, child).await?,
            Err(e) => return Err(e.into()),
        },
    }
    let mut object = child.object.clone();
    // A StatefulSet's claim templates are immutable: keep the live ones (volumes grow
    // by expanding their claims instead).
    if child.kind == Kind::StatefulSet
        && let Some(live) = ctx.caches.stateful_set(db)
        && let Some(templates) = live.claim_templates()
    {
        object["spec"]["volumeClaimTemplates"] = templates;
    }
    api.patch(&child.name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&object)).await?;
    Ok(())
}

pub(super) fn post_params() -> PostParams {
    PostParams { field_manager: Some(MANAGER.into()), ..Default::default() }
}

/// Moves the fields `MANAGER` set by creating the object into its apply entry, as
/// `kubectl` does when an object moves from client-side to server-side apply. Asked
/// only when the cache shows such a create or does not show the object as the
/// Database's (one read, and nothing more once moved); the write fails if the object
/// changed since the read. An object that is not the Database's is [`Error::Taken`].
async fn take_over_created_fields(api: &Api<DynamicObject>, db: &Database, child: &Child) -> Result<(), Error> {
    let Some(live) = live_own(api, db, child).await? else { return Ok(()) };
    let Some(entries) = created_fields_applied(live.managed_fields()) else { return Ok(()) };
    let patch = json!({"metadata": {"managedFields": entries, "resourceVersion": live.resource_version()}});
    api.patch(&child.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// The live object with `child`'s name, read from the API server, when there is one and
/// it is `db`'s; [`Error::Taken`] when it is not.
async fn live_own(api: &Api<DynamicObject>, db: &Database, child: &Child) -> Result<Option<DynamicObject>, Error> {
    let Some(live) = api.get_opt(&child.name).await? else { return Ok(None) };
    owner::check(db, child.kind, &live.metadata)?;
    Ok(Some(live))
}

/// `entries` with `MANAGER`'s `Update` entries merged into its `Apply` entry (made
/// when there is none); `None` when there is nothing to merge.
fn created_fields_applied(entries: &[ManagedFieldsEntry]) -> Option<Vec<ManagedFieldsEntry>> {
    if !entries.iter().any(|e| owner::set_by_us(e, "Update")) {
        return None;
    }
    let (mine, mut others): (Vec<_>, Vec<_>) =
        entries.iter().cloned().partition(|e| owner::set_by_us(e, "Update") || owner::set_by_us(e, "Apply"));
    let mut fields = Value::Object(Default::default());
    for entry in &mine {
        if let Some(FieldsV1(set)) = &entry.fields_v1 {
            union(&mut fields, set);
        }
    }
    // The apply entry's version and time where there is one, else the create's.
    let first = mine.iter().find(|e| owner::set_by_us(e, "Apply")).or(mine.first()).cloned().unwrap_or_default();
    others.push(ManagedFieldsEntry {
        operation: Some("Apply".into()),
        fields_type: Some("FieldsV1".into()),
        fields_v1: Some(FieldsV1(fields)),
        ..first
    });
    Some(others)
}

/// Adds the field set `from` to `into` (both in the `FieldsV1` form: a tree of path
/// elements).
fn union(into: &mut Value, from: &Value) {
    if let (Value::Object(into), Value::Object(from)) = (into, from) {
        for (key, value) in from {
            union(into.entry(key.clone()).or_insert_with(|| Value::Object(Default::default())), value);
        }
    }
}

/// Creates a child only when it does not exist (claims, Jobs): never updates it. An
/// object of that name that is not the Database's is [`Error::Taken`].
pub async fn create_once(ctx: &Context, db: &Database, child: &Child) -> Result<bool, Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &db.namespace().unwrap_or_default(), &child.resource);
    match ctx.caches.seen(child.kind, db, &child.name) {
        Seen::Present { .. } => return Ok(false),
        Seen::Foreign => return live_own(&api, db, child).await.map(|_| false),
        Seen::Absent => {}
    }
    let object: DynamicObject = serde_json::from_value(child.object.clone())?;
    match api.create(&post_params(), &object).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => live_own(&api, db, child).await.map(|_| false),
        Err(e) => Err(e.into()),
    }
}

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

/// Makes sure the credentials Secret holds every key the plugin asks for. Keys are
/// generated once and never overwritten; the Secret outlives the Database unless the
/// deletion policy is Delete.
pub(super) async fn ensure_credentials(ctx: &Context, db: &Database, wanted: &[Credential], plan: &mut Plan) -> Result<(), Error> {
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
            plan.secret(SecretWrite::Make(secret));
        }
        Some(_) if missing.is_empty() => {}
        Some(_) => {
            // The cache may be behind a key added a moment ago: ask the API server before
            // adding, so a generated value is never replaced by another.
            let Some(live) = own_secret(db, api.get_opt(&name).await?)? else { return Ok(()) };
            missing.retain(|k, _| !live.data.as_ref().is_some_and(|d| d.contains_key(k)));
            if !missing.is_empty() {
                // Add only the missing keys; a merge patch leaves the others as they are,
                // and the resourceVersion makes it fail if the Secret changed since it was read.
                let patch = json!({"metadata": {"resourceVersion": live.resource_version()}, "data": missing});
                plan.secret(SecretWrite::AddKeys { name, patch });
            }
        }
    }
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
    let live = own_secret(db, api.get_opt(&n.tls()).await?)?;
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
    let authority = authority(db, &api, plan).await?;
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

/// cert-manager's `Certificate` resource.
pub(super) fn certificate_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate"))
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
        let secret = own_secret(db, Api::<Secret>::namespaced(ctx.client.clone(), &ns).get_opt(&n.tls()).await?)?;
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
pub(super) async fn authority(db: &Database, api: &Api<Secret>, plan: &mut Plan) -> Result<tls::Authority, Error> {
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
    if let Some(live) = own_secret(db, api.get_opt(&secret_name).await?)? {
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

/// `secret` when it is `db`'s ([`Error::Taken`] when it is not).
pub(super) fn own_secret(db: &Database, secret: Option<Secret>) -> Result<Option<Secret>, Error> {
    if let Some(s) = &secret {
        owner::check(db, Kind::Secret, &s.metadata)?;
    }
    Ok(secret)
}

pub(super) fn secret_metadata(db: &Database, name: &str, owned: bool) -> kube::api::ObjectMeta {
    let owners: Vec<_> = if owned { db.controller_owner_ref(&()).into_iter().collect() } else { vec![] };
    kube::api::ObjectMeta {
        name: Some(name.into()),
        namespace: db.namespace(),
        labels: Some(labels(db)),
        owner_references: Some(owners),
        ..Default::default()
    }
}

/// Grows member claims to `spec.storage` (claims grow, never shrink). A StatefulSet's
/// claim templates cannot change, so the claims themselves are patched (in `plan`).
/// Returns whether a claim has less than it asks for (a refused growth is found when
/// the plan is carried out).
pub(super) fn grow_volumes(ctx: &Context, db: &Database, plan: &mut Plan) -> super::status::Growth {
    let Some(want) = crate::quantity::bytes(&db.spec.storage.0) else { return super::status::Growth::Done };
    let name = db.name_any();
    let mut growth = super::status::Growth::Done;
    for ordinal in 0..db.spec.replicas.max(1) as u32 {
        let claim = Names(&name).data_claim(ordinal);
        // An unbound claim cannot change; it is grown once it is bound.
        let Some(pvc) = ctx.caches.claim(db, &claim).filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")) else {
            continue;
        };
        let storage = |map: Option<&std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            map.and_then(|m| m.get("storage")).and_then(|q| crate::quantity::bytes(&q.0))
        };
        let requested = storage(pvc.spec.as_ref().and_then(|s| s.resources.as_ref()).and_then(|r| r.requests.as_ref()));
        if requested.is_some_and(|r| r < want) {
            plan.grow(claim.clone(), db.spec.storage.0.clone());
        }
        let capacity = storage(pvc.status.as_ref().and_then(|s| s.capacity.as_ref()));
        if growth == super::status::Growth::Done && capacity.is_some_and(|c| c < want) {
            growth =
                super::status::Growth::Waiting(format!("claim {claim} asks for {}; the storage provider is growing it", db.spec.storage.0));
        }
    }
    growth
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_values_have_the_length_and_alphabet_asked_for() {
        let a = super::generate(32).expect("random");
        let b = super::generate(32).expect("random");
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }

    fn entry(manager: &str, operation: &str, fields: serde_json::Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            api_version: Some("v1".into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    #[test]
    fn fields_a_create_set_join_the_apply_entry_and_others_keep_theirs() {
        let kubectl = entry("kubectl-edit", "Update", json!({"f:metadata": {"f:labels": {"f:team": {}}}}));
        let created = entry(MANAGER, "Update", json!({"f:data": {".": {}, "f:a": {}, "f:b": {}}}));
        let applied = entry(MANAGER, "Apply", json!({"f:data": {"f:c": {}}, "f:metadata": {"f:labels": {"f:app": {}}}}));
        let status = ManagedFieldsEntry { subresource: Some("status".into()), ..entry(MANAGER, "Update", json!({"f:status": {}})) };

        let merged = created_fields_applied(&[kubectl.clone(), created.clone(), status.clone()]).expect("a create to merge");
        assert_eq!(merged, [kubectl.clone(), status.clone(), entry(MANAGER, "Apply", json!({"f:data": {".": {}, "f:a": {}, "f:b": {}}}))]);

        let merged = created_fields_applied(&[applied.clone(), kubectl.clone(), created]).expect("a create to merge");
        let union = json!({"f:data": {".": {}, "f:a": {}, "f:b": {}, "f:c": {}}, "f:metadata": {"f:labels": {"f:app": {}}}});
        assert_eq!(merged, [kubectl.clone(), entry(MANAGER, "Apply", union)]);

        assert_eq!(created_fields_applied(&[applied, kubectl, status]), None, "nothing created: nothing to write");
    }
}
