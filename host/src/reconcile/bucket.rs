//! The operator's side of object-storage backups: opening a Database's bucket with the
//! access key from the user's Secret (read when needed, never cached, logged or passed
//! to a plugin), and retention of the artefacts in it.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use object_store::ObjectStore;

use super::{Context, Error};
use crate::crd::{Recoverable, S3Target, SecretKey};
use crate::object_storage::{self, Bucket, Listed, Segment};

/// An opened bucket and the Database's place in it.
pub struct Opened {
    /// The client.
    pub store: Arc<dyn ObjectStore>,
    /// `<prefix>/<namespace>/<database>`.
    pub database: object_store::path::Path,
    /// The Database's backups in it, newest complete first.
    pub listed: Vec<Listed>,
    /// Its archived log segments, in name order.
    pub archive: Vec<Segment>,
}

/// The data of the Secret `name` of `ns`; `Ok(Err)` says it is missing.
async fn secret_data(ctx: &Context, ns: &str, name: &str, field: &str) -> Result<Result<Data, String>, Error> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    Ok(match secrets.get_opt(name).await? {
        Some(secret) => Ok(Data { name: name.to_string(), field: field.to_string(), data: secret.data.unwrap_or_default() }),
        None => Err(format!("{field}: Secret {name} not found in namespace {ns}")),
    })
}

/// A Secret's data, and the field that named it (for messages).
struct Data {
    name: String,
    field: String,
    data: std::collections::BTreeMap<String, k8s_openapi::ByteString>,
}

impl Data {
    /// The non-empty value of `key`, or what is missing.
    fn take(&mut self, key: &str) -> Result<Vec<u8>, String> {
        match self.data.remove(key) {
            Some(value) if !value.0.is_empty() => Ok(value.0),
            _ => Err(format!("{}: Secret {} has no key {key:?}", self.field, self.name)),
        }
    }
}

/// Opens `target` for the Database `database` of namespace `layout_ns` (its place in the
/// bucket), reading Secrets in `ns`, and lists that Database's backups: a missing
/// Secret or key, a bucket that does not exist or refuses the key, an endpoint that
/// does not answer, each comes back as `Ok(Err(message))` naming `field`.
pub async fn open(
    ctx: &Context,
    ns: &str,
    target: &S3Target,
    layout_ns: &str,
    database: &str,
    field: &str,
) -> Result<Result<Opened, String>, Error> {
    let credentials = &target.credentials;
    // One read of the credentials Secret for both keys.
    let keys = match secret_data(ctx, ns, &credentials.secret_name, &format!("{field}.credentials")).await? {
        Ok(mut data) => data.take(&credentials.access_key_id_key).and_then(|id| Ok((id, data.take(&credentials.secret_access_key_key)?))),
        Err(e) => Err(e),
    };
    let (access_key_id, secret_access_key) = match keys {
        Ok(keys) => keys,
        Err(e) => return Ok(Err(e)),
    };
    let ca_pem = match &target.ca {
        Some(SecretKey { name, key }) => match secret_data(ctx, ns, name, &format!("{field}.ca")).await?.and_then(|mut d| d.take(key)) {
            Ok(v) => Some(v),
            Err(e) => return Ok(Err(e)),
        },
        None => None,
    };
    let text = |bytes: Vec<u8>, what: &str| {
        String::from_utf8(bytes).map(|s| s.trim().to_string()).map_err(|_| format!("{field}.credentials: the {what} is not text"))
    };
    let (access_key_id, secret_access_key) = match (text(access_key_id, "access key id"), text(secret_access_key, "secret access key")) {
        (Ok(a), Ok(s)) => (a, s),
        (Err(e), _) | (_, Err(e)) => return Ok(Err(e)),
    };
    // The endpoint is the tenant's word: reached only where the operator may go for one.
    let checked = match ctx.egress.check(&target.endpoint).await {
        Ok(checked) => checked,
        Err(why) => return Ok(Err(format!("{field}.endpoint: {why}"))),
    };
    let bucket = Bucket::new(target, access_key_id, secret_access_key, ca_pem);
    let store = match bucket.store_resolving(Some(checked.resolver())) {
        Ok(store) => store,
        Err(e) => return Ok(Err(format!("{field}: {e}"))),
    };
    let database = object_storage::database_key(&target.prefix, layout_ns, database);
    let listed = match object_storage::list(store.as_ref(), &database).await {
        Ok(listed) => object_storage::archived(store.as_ref(), &database).await.map(|archive| (listed, archive)),
        Err(e) => Err(e),
    };
    Ok(match listed {
        Ok((listed, archive)) => Ok(Opened { store, database, listed, archive }),
        Err(e) => Err(format!("{field}: bucket {} at {}: {e}", target.bucket, target.endpoint)),
    })
}

/// What retention removes from the bucket.
#[derive(Debug, Default)]
pub struct Removal {
    /// The backups.
    pub backups: Vec<String>,
    /// The archived segments no kept backup replays.
    pub segments: Vec<Segment>,
}

/// What retention removes in the bucket: all but the newest `keep` complete backups and
/// those `running`, and the archived log the oldest kept one does not replay (its
/// manifest says where it starts); or what stopped the reading.
pub async fn to_remove(opened: &Opened, keep: usize, running: &[String]) -> Result<Removal, String> {
    let backups = object_storage::to_prune(&opened.listed, keep, running);
    let oldest_kept = opened.listed.iter().filter(|b| b.completed.is_some() && !backups.contains(&b.name)).min_by_key(|b| b.completed);
    let mut segments = Vec::new();
    if let Some(oldest) = oldest_kept
        && !opened.archive.is_empty()
        && let Some(manifest) = object_storage::manifest(opened.store.as_ref(), &opened.database.clone().join(oldest.name.as_str()))
            .await
            .map_err(|e| e.to_string())?
    {
        segments = object_storage::not_replayed(&opened.archive, manifest.started);
    }
    Ok(Removal { backups, segments })
}

/// Removes `removal` from the bucket, or says what stopped it.
pub async fn remove(opened: &Opened, removal: &Removal) -> Result<(), String> {
    let store = opened.store.as_ref();
    for name in &removal.backups {
        object_storage::remove(store, &opened.database.clone().join(name.as_str())).await.map_err(|e| e.to_string())?;
    }
    object_storage::remove_segments(store, &opened.database, &removal.segments).await.map_err(|e| e.to_string())?;
    Ok(())
}

/// The window last known, now that the bucket cannot be read: kept, marked unreachable
/// since the first failed read.
pub fn unreachable(known: Option<&Recoverable>, now: DateTime<Utc>) -> Option<Recoverable> {
    let since = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    known.cloned().map(|r| Recoverable { unreachable_since: r.unreachable_since.clone().or(Some(since)), ..r })
}
