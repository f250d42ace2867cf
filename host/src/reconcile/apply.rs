//! Writing children: server-side apply with one field manager, skipped when the
//! object already carries the hash of what would be applied.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::cache::Seen;
use super::{Context, Error};
use crate::build::{Child, Kind, MANAGER, Names, labels};
use crate::crd::{Database, DeletionPolicy};
use crate::plugin::Credential;

/// Applies `child` unless the live object already has its hash. Returns the applied
/// object when a write was made.
pub async fn apply(ctx: &Context, namespace: &str, child: &Child) -> Result<Option<DynamicObject>, Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, &child.resource);
    if let Seen::Present { hash } = ctx.caches.seen(child.kind, namespace, &child.name)
        && hash.as_deref() == Some(child.hash())
    {
        return Ok(None);
    }
    let mut object = child.object.clone();
    // A StatefulSet's claim templates are immutable: keep the live ones (volumes grow
    // by expanding their claims instead).
    if child.kind == Kind::StatefulSet
        && let Some(live) = ctx.caches.stateful_set(namespace, &child.name)
        && let Some(templates) = live.spec.as_ref().and_then(|s| s.volume_claim_templates.as_ref())
    {
        object["spec"]["volumeClaimTemplates"] = serde_json::to_value(templates)?;
    }
    let applied = api.patch(&child.name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&object)).await?;
    Ok(Some(applied))
}

/// Creates a child only when it does not exist (claims, Jobs): never updates it.
pub async fn create_once(ctx: &Context, namespace: &str, child: &Child) -> Result<bool, Error> {
    if let Seen::Present { .. } = ctx.caches.seen(child.kind, namespace, &child.name) {
        return Ok(false);
    }
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, &child.resource);
    let object: DynamicObject = serde_json::from_value(child.object.clone())?;
    match api.create(&PostParams { field_manager: Some(MANAGER.into()), ..Default::default() }, &object).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
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
pub async fn ensure_credentials(ctx: &Context, db: &Database, wanted: &[Credential]) -> Result<bool, Error> {
    let ns = db.namespace().unwrap_or_default();
    let name = Names(&db.name_any()).credentials();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let live = ctx.caches.secret_keys(&ns, &name);
    let have = live.clone().unwrap_or_default();
    let mut missing = BTreeMap::new();
    for c in wanted.iter().filter(|c| !have.contains(&c.key)) {
        missing.insert(c.key.clone(), ByteString(generate(c.length)?.into_bytes()));
    }
    let owned = db.spec.deletion_policy == DeletionPolicy::Delete;
    let owners: Vec<_> = if owned { db.controller_owner_ref(&()).into_iter().collect() } else { vec![] };
    match live {
        None => {
            let secret = Secret {
                metadata: kube::api::ObjectMeta {
                    name: Some(name),
                    namespace: Some(ns),
                    labels: Some(labels(db)),
                    owner_references: Some(owners),
                    ..Default::default()
                },
                data: Some(missing),
                type_: Some("Opaque".into()),
                ..Default::default()
            };
            match api.create(&PostParams { field_manager: Some(MANAGER.into()), ..Default::default() }, &secret).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            }
        }
        Some(_) if missing.is_empty() => Ok(false),
        Some(_) => {
            // The cache may be behind a key added a moment ago: ask the API server before
            // adding, so a generated value is never replaced by another.
            let Some(live) = api.get_opt(&name).await? else { return Ok(false) };
            missing.retain(|k, _| !live.data.as_ref().is_some_and(|d| d.contains_key(k)));
            if missing.is_empty() {
                return Ok(false);
            }
            // Add only the missing keys; a merge patch leaves the others as they are, and
            // the resourceVersion makes it fail if the Secret changed since it was read.
            let patch = json!({"metadata": {"resourceVersion": live.resource_version()}, "data": missing});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(patch)).await?;
            Ok(true)
        }
    }
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
