//! The operator's stamp on the Secrets it writes. A Secret plugdb keeps after its
//! Database (credentials, the application's login, the Database's authority) has no
//! controller, so labels alone would name it: anyone who may create a Secret in the
//! namespace could make one with plugdb's labels before the Database exists and have
//! the engine start with a password, or an authority, of their choosing. Each Secret
//! plugdb writes carries [`STAMP`], a keyed digest (HMAC-SHA256) of its namespace, name,
//! Database and data under a key only the operator holds (derived from its own
//! authority's key, kept in its namespace). A Secret without a controller is a
//! Database's only when its stamp holds: one made by someone else, or changed since
//! plugdb wrote it, is not.
//!
//! The watch's cache keeps no Secret values, so a Secret is judged as it is read (the
//! cache's trim, and each read from the API server): [`Stamper::judge`] records the
//! verdict in [`HELD`], removing whatever the object said there itself.

use std::collections::BTreeMap;
use std::sync::Arc;

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use ring::hmac;
use serde_json::json;

use crate::names::{INSTANCE_LABEL, MANAGED_BY_LABEL, MANAGER};

/// The annotation holding a Secret's stamp.
pub const STAMP: &str = "plugdb.io/stamp";

/// The verdict on a Secret's stamp, as the operator judged it when it read the Secret
/// (never taken from the object itself: [`Stamper::judge`] overwrites it).
pub const HELD: &str = "plugdb.io/stamp-held";

/// Stamps Secrets and judges their stamps, with the operator's key.
#[derive(Clone)]
pub struct Stamper(Arc<hmac::Key>);

impl std::fmt::Debug for Stamper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stamper")
    }
}

impl Stamper {
    /// The stamper of the operator whose authority's private key is `authority_key`
    /// (PEM): the key is derived from it, so every replica of the operator, and every
    /// restart, stamps alike.
    pub fn new(authority_key: &str) -> Self {
        let root = hmac::Key::new(hmac::HMAC_SHA256, authority_key.as_bytes());
        let derived = hmac::sign(&root, b"plugdb.io/stamp v1");
        Self(Arc::new(hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref())))
    }

    /// The stamp `secret` should carry: a digest of [`message`].
    fn stamp_of(&self, secret: &Secret) -> String {
        hmac::sign(&self.0, &message(secret)).as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// What names the key without giving it away.
    pub fn fingerprint(&self) -> String {
        hmac::sign(&self.0, b"fingerprint").as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// `secret` with its stamp, as it is about to be written whole.
    pub fn stamped(&self, mut secret: Secret) -> Secret {
        let stamp = self.stamp_of(&secret);
        secret.metadata.annotations.get_or_insert_default().insert(STAMP.into(), stamp);
        secret
    }

    /// The stamp of `secret` once `added` is merged into its data (a merge patch that
    /// adds keys carries it).
    pub fn stamp_with(&self, secret: &Secret, added: &BTreeMap<String, ByteString>) -> String {
        let mut merged = secret.clone();
        merged.data.get_or_insert_default().extend(added.clone());
        self.stamp_of(&merged)
    }

    /// Records in [`HELD`] whether `secret`'s stamp holds, as read (values still there).
    pub fn judge(&self, secret: &mut Secret) {
        let tag = secret.annotations().get(STAMP).and_then(|s| unhex(s));
        let holds = tag.is_some_and(|tag| hmac::verify(&self.0, &message(secret), &tag).is_ok());
        let annotations = secret.metadata.annotations.get_or_insert_default();
        annotations.remove(HELD);
        if holds {
            annotations.insert(HELD.into(), "true".into());
        }
    }
}

/// The annotation on the operator's identity Secret that records which key stamped
/// what plugdb had kept ([`Upgrade`]): the key's fingerprint.
pub const STAMPED_WITH: &str = "plugdb.io/stamped-with";

/// The Secrets plugdb kept before its key stamped them (made by a plugdb from before
/// stamps, or before the operator's identity was made anew), stamped once per key:
/// when an operator leads with a key whose fingerprint its identity Secret does not
/// record yet, it stamps every Secret plugdb's labels name for a Database whose stamp does
/// not hold, then records the fingerprint. Until then no pass runs. What exists at that
/// moment is trusted as plugdb's (as the labels were before); nothing made afterwards is.
pub struct Upgrade<'a> {
    /// The API client.
    pub client: &'a Client,
    /// The namespace of the operator's identity Secret.
    pub identity_namespace: &'a str,
    /// The namespace the operator watches; all when `None`.
    pub watched: Option<&'a str>,
}

impl Upgrade<'_> {
    /// Stamps what is to be stamped, trying again every `retry` until it is done.
    pub async fn until_done(&self, stamper: &Stamper, retry: Duration) {
        loop {
            match self.stamp(stamper).await {
                Ok(None) => return,
                Ok(Some(stamped)) => {
                    tracing::info!(stamped, "stamped the Secrets plugdb had kept before its key stamped them");
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "stamping the Secrets plugdb had kept: trying again"),
            }
            tokio::time::sleep(retry).await;
        }
    }

    /// How many Secrets it stamped; `None` when this key had stamped them already.
    pub async fn stamp(&self, stamper: &Stamper) -> Result<Option<usize>, kube::Error> {
        let identities: Api<Secret> = Api::namespaced(self.client.clone(), self.identity_namespace);
        let identity = identities.get(crate::operator::AGENT_IDENTITY_SECRET).await?;
        let fingerprint = stamper.fingerprint();
        if identity.annotations().get(STAMPED_WITH) == Some(&fingerprint) {
            return Ok(None);
        }
        let listed: Api<Secret> = match self.watched {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let selector = format!("{MANAGED_BY_LABEL}={MANAGER},{INSTANCE_LABEL}");
        let mut stamped = 0;
        for secret in listed.list(&ListParams::default().labels(&selector)).await? {
            let mut judged = secret.clone();
            stamper.judge(&mut judged);
            if held(&judged.metadata) {
                continue;
            }
            let (ns, name) = (secret.namespace().unwrap_or_default(), secret.name_any());
            let stamp = stamper.stamp_of(&secret);
            // Fails if the Secret changed since it was listed: tried again, listed anew.
            let patch = json!({"metadata": {"resourceVersion": secret.resource_version(), "annotations": {STAMP: stamp}}});
            Api::<Secret>::namespaced(self.client.clone(), &ns).patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            tracing::info!(secret = %format!("{ns}/{name}"), "stamped a Secret plugdb had kept");
            stamped += 1;
        }
        let recorded = json!({"metadata": {"annotations": {STAMPED_WITH: fingerprint}}});
        identities.patch(crate::operator::AGENT_IDENTITY_SECRET, &PatchParams::default(), &Patch::Merge(&recorded)).await?;
        Ok(Some(stamped))
    }
}

/// Whether the operator judged the stamp of the Secret `meta` describes to hold.
pub fn held(meta: &ObjectMeta) -> bool {
    meta.annotations.as_ref().and_then(|a| a.get(HELD)).is_some_and(|v| v == "true")
}

/// What a Secret's stamp is a digest of: its namespace, name, Database (its instance
/// label) and every key and value (`stringData` as the API server stores it), each
/// with its length first, so that no two different Secrets read alike.
fn message(secret: &Secret) -> Vec<u8> {
    let meta = &secret.metadata;
    let instance = meta.labels.as_ref().and_then(|l| l.get(INSTANCE_LABEL)).map_or("", String::as_str);
    let mut data: BTreeMap<&str, &[u8]> = BTreeMap::new();
    for (key, value) in secret.data.iter().flatten() {
        data.insert(key, &value.0);
    }
    for (key, value) in secret.string_data.iter().flatten() {
        data.insert(key, value.as_bytes());
    }
    let mut message = Vec::new();
    let mut framed = |bytes: &[u8]| {
        message.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        message.extend_from_slice(bytes);
    };
    for field in [meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default(), instance] {
        framed(field.as_bytes());
    }
    for (key, value) in data {
        framed(key.as_bytes());
        framed(value);
    }
    message
}

/// The bytes hexadecimal `text` spells, if it does.
fn unhex(text: &str) -> Option<Vec<u8>> {
    text.len().is_multiple_of(2).then_some(())?;
    (0..text.len()).step_by(2).map(|i| text.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str, password: &str) -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "shop", "labels": {INSTANCE_LABEL: "orders"}},
            "data": {"password": k8s_openapi::ByteString(password.as_bytes().to_vec())},
        }))
        .expect("a Secret")
    }

    fn judged(stamper: &Stamper, mut secret: Secret) -> bool {
        stamper.judge(&mut secret);
        held(&secret.metadata)
    }

    #[test]
    fn a_stamp_holds_only_for_what_it_was_made_for_under_the_key_that_made_it() {
        let (ours, theirs) = (Stamper::new("the operator's key"), Stamper::new("someone else's key"));
        let made = ours.stamped(secret("orders-credentials", "s3cret"));
        assert!(judged(&ours, made.clone()), "as written");
        assert!(!judged(&theirs, made.clone()), "another key");
        assert!(!judged(&ours, secret("orders-credentials", "s3cret")), "no stamp");
        let mut changed = made.clone();
        changed.data.get_or_insert_default().insert("password".into(), ByteString(b"chosen".to_vec()));
        assert!(!judged(&ours, changed), "a value changed");
        let mut moved = made.clone();
        moved.metadata.name = Some("orders-app".into());
        assert!(!judged(&ours, moved), "another name (its stamp copied)");
        let mut relabelled = made.clone();
        relabelled.metadata.labels.get_or_insert_default().insert(INSTANCE_LABEL.into(), "ledger".into());
        assert!(!judged(&ours, relabelled), "another Database");
        let mut added = made.clone();
        added.data.get_or_insert_default().insert("extra".into(), ByteString(b"x".to_vec()));
        assert!(!judged(&ours, added), "a key added");
    }

    #[test]
    fn the_verdict_is_the_operators_never_the_objects() {
        let stamper = Stamper::new("the operator's key");
        let mut forged = secret("orders-credentials", "chosen");
        forged.metadata.annotations = Some([(HELD.to_string(), "true".to_string()), (STAMP.to_string(), "00".to_string())].into());
        assert!(!judged(&stamper, forged), "a verdict written on the object is replaced");
    }

    #[test]
    fn keys_added_by_a_patch_are_stamped_with_the_rest() {
        let stamper = Stamper::new("the operator's key");
        let made = stamper.stamped(secret("orders-credentials", "s3cret"));
        let added = BTreeMap::from([("replication".to_string(), ByteString(b"r".to_vec()))]);
        let mut patched = made.clone();
        patched.data.get_or_insert_default().extend(added.clone());
        patched.metadata.annotations.get_or_insert_default().insert(STAMP.into(), stamper.stamp_with(&made, &added));
        assert!(judged(&stamper, patched));
        let mut as_strings = secret("orders-app", "s3cret");
        as_strings.data = None;
        as_strings.string_data = Some([("password".to_string(), "s3cret".to_string())].into());
        let written = stamper.stamped(as_strings);
        let mut stored = secret("orders-app", "s3cret");
        stored.metadata.annotations = written.metadata.annotations;
        assert!(judged(&stamper, stored), "stringData is stamped as the API server stores it");
    }
}
