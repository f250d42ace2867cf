//! The operator's side of object-storage backups: opening a Database's bucket with the
//! access key from the user's Secret (read when needed, never cached, logged or passed
//! to a plugin), and retention of the artefacts in it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use object_store::ObjectStore;

use super::{Context, Error};
use crate::crd::{S3Target, SecretKey};
use crate::objects::{self, Bucket, Listed};

/// An opened bucket and the Database's place in it.
pub struct Opened {
    /// The client.
    pub store: Arc<dyn ObjectStore>,
    /// `<prefix>/<namespace>/<database>`.
    pub database: object_store::path::Path,
    /// The Database's backups in it, newest complete first.
    pub listed: Vec<Listed>,
}

/// The value of `key` in the Secret `name` of `ns`; `Ok(Err)` says what is missing.
async fn secret_value(ctx: &Context, ns: &str, name: &str, key: &str, field: &str) -> Result<Result<Vec<u8>, String>, Error> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let Some(secret) = secrets.get_opt(name).await? else {
        return Ok(Err(format!("{field}: Secret {name} not found in namespace {ns}")));
    };
    match secret.data.and_then(|mut d| d.remove(key)) {
        Some(value) if !value.0.is_empty() => Ok(Ok(value.0)),
        _ => Ok(Err(format!("{field}: Secret {name} has no key {key:?}"))),
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
    let access_key_id =
        match secret_value(ctx, ns, &credentials.secret_name, &credentials.access_key_id_key, &format!("{field}.credentials")).await? {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
    let secret_access_key =
        match secret_value(ctx, ns, &credentials.secret_name, &credentials.secret_access_key_key, &format!("{field}.credentials")).await? {
            Ok(v) => v,
            Err(e) => return Ok(Err(e)),
        };
    let ca_pem = match &target.ca {
        Some(SecretKey { name, key }) => match secret_value(ctx, ns, name, key, &format!("{field}.ca")).await? {
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
    let bucket = Bucket::new(target, access_key_id, secret_access_key, ca_pem);
    let store = match bucket.store() {
        Ok(store) => store,
        Err(e) => return Ok(Err(format!("{field}: {e}"))),
    };
    let database = objects::database_key(&target.prefix, layout_ns, database);
    let listed = objects::list(store.as_ref(), &database).await;
    Ok(match listed {
        Ok(listed) => Ok(Opened { store, database, listed }),
        Err(e) => Err(format!("{field}: bucket {} at {}: {e}", target.bucket, target.endpoint)),
    })
}

/// Applies retention in the bucket: keeps the newest `keep` complete backups and those
/// `running`; returns the names removed, or what stopped it.
pub async fn prune(opened: &Opened, keep: usize, running: &[String]) -> Result<Vec<String>, String> {
    let mut removed = Vec::new();
    for name in objects::to_prune(&opened.listed, keep, running) {
        objects::remove(opened.store.as_ref(), &opened.database.clone().join(name.as_str())).await.map_err(|e| e.to_string())?;
        removed.push(name);
    }
    Ok(removed)
}
