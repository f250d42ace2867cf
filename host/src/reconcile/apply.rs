//! Writing children: created when absent, then server-side applied with one field
//! manager; skipped when the object already carries the hash of what would be applied.
//! Also what every writer of the Database's objects shares: whose a Secret is, and its
//! metadata.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::cache::Seen;
use super::owner;
use super::{Context, Error};
use crate::build::{Child, Kind};
use crate::crd::Database;
use crate::names::{MANAGER, Names, labels};

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

/// cert-manager's `Certificate` resource.
pub(super) fn certificate_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate"))
}

/// `secret`, as read from the API server, when it is `db`'s ([`Error::Taken`] when it
/// is not); its stamp judged as the cache judges it ([`crate::stamp`]).
pub(super) fn own_secret(ctx: &Context, db: &Database, secret: Option<Secret>) -> Result<Option<Secret>, Error> {
    let Some(mut secret) = secret else { return Ok(None) };
    ctx.caches.stamper().judge(&mut secret);
    owner::check(db, Kind::Secret, &secret.metadata)?;
    Ok(Some(secret))
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

/// The member claims to grow to `size` (`spec.storage`, or what the volumes grew to on
/// their own; claims grow, never shrink: a StatefulSet's claim templates cannot change,
/// so the claims themselves are patched), and whether a claim has less than it asks for
/// (a refused growth is found when the plan is carried out).
pub(super) fn grow_volumes(ctx: &Context, db: &Database, size: &str) -> (Vec<String>, super::status::Growth) {
    let mut grown = Vec::new();
    let Some(want) = crate::quantity::bytes(size) else { return (grown, super::status::Growth::Done) };
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
            grown.push(claim.clone());
        }
        let capacity = storage(pvc.status.as_ref().and_then(|s| s.capacity.as_ref()));
        if growth == super::status::Growth::Done && capacity.is_some_and(|c| c < want) {
            growth = super::status::Growth::Waiting(format!("claim {claim} asks for {size}; the storage provider is growing it"));
        }
    }
    (grown, growth)
}

#[cfg(test)]
mod tests {
    use super::*;

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
