//! Backups in S3-compatible object storage: where they live, moving them, listing and
//! pruning them. The host owns the transport; a plugin only says how to produce and
//! consume a backup on disk (its `backup` and `restore` plans).
//!
//! Layout of a bucket, per Database:
//!
//! ```text
//! <prefix>/<namespace>/<database>/<backup>/files/<path>    the artefact, file by file
//! <prefix>/<namespace>/<database>/<backup>/manifest.json    written last: the backup is complete
//! <prefix>/<namespace>/<database>/_archive/<segment>       the engine's archived log, one object per segment
//! ```
//!
//! Backup names are DNS labels, so `_archive` is never one. The archive is shipped from
//! each member by `plugdb archive` (a container beside the engine, from the operator's
//! image), segment by segment as the engine finishes them: a point-in-time restore
//! takes a backup taken before the moment and replays the archive from it.
//!
//! A backup is complete only once its manifest exists, and the manifest names every
//! file with its size and SHA-256: an upload interrupted at any point leaves no
//! manifest, so a restore never picks a half backup, and retention removes it. Removal
//! deletes the manifest first for the same reason.
//!
//! The same code runs in the operator (listing, retention, checking that the bucket
//! answers) and in backup and restore Jobs (`plugdb transfer upload|download`, from the
//! operator's own image), so engine images need no S3 tools and a plugin never sees
//! the access key.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as Key;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::crd::S3Target;

/// Name of the object that completes a backup.
pub const MANIFEST: &str = "manifest.json";
const FILES: &str = "files";
/// Parts of a multipart upload (S3 wants at least 5 MiB but for the last).
const PART_BYTES: usize = 8 << 20;
/// Environment of the transfer containers (see [`Bucket::from_env`]).
pub const ENV_ENDPOINT: &str = "PLUGDB_S3_ENDPOINT";
/// The bucket.
pub const ENV_BUCKET: &str = "PLUGDB_S3_BUCKET";
/// The region.
pub const ENV_REGION: &str = "PLUGDB_S3_REGION";
/// A PEM file of the endpoint's CA.
pub const ENV_CA_FILE: &str = "PLUGDB_S3_CA_FILE";
/// The access key id (the name every S3 tool reads).
pub const ENV_ACCESS_KEY_ID: &str = "AWS_ACCESS_KEY_ID";
/// The secret access key.
pub const ENV_SECRET_ACCESS_KEY: &str = "AWS_SECRET_ACCESS_KEY";

/// A failure talking to the bucket or reading the artefact, for a person.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Error(String);

/// `what` failed with `e`, and every cause under it (a TLS or connection failure sits
/// a few sources down an HTTP error; each cause is said once), with no response body:
/// see [`without_body`].
fn error(what: impl std::fmt::Display, e: impl std::error::Error) -> Error {
    let mut text = format!("{what}: {e}");
    let mut source = e.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    Error(without_body(&text))
}

/// The most of an S3 error code that is said.
const MAX_CODE: usize = 64;

/// `text` up to the server's answer, which is said by its status and its S3 error code
/// (`<Code>`, letters and digits) alone: whatever else a server answers (the API server's
/// `/version`, a metadata service's keys) never reaches a status, an Event or a log.
pub fn without_body(text: &str) -> String {
    const ANSWERS: [&str; 2] = ["Server returned non-2xx status code: ", "Server returned error response: "];
    let Some((at, answer)) = ANSWERS.iter().filter_map(|a| Some((text.find(a)?, *a))).min_by_key(|(at, _)| *at) else {
        return text.to_string();
    };
    let rest = &text[at + answer.len()..];
    let status = match answer.starts_with("Server returned non-2xx") {
        true => rest.split(": ").next().unwrap_or_default().chars().filter(|c| c.is_ascii_alphanumeric() || *c == ' ').take(40).collect(),
        false => "an error".to_string(),
    };
    let code = rest
        .split_once("<Code>")
        .and_then(|(_, after)| after.split_once("</Code>"))
        .map(|(code, _)| code.chars().filter(char::is_ascii_alphanumeric).take(MAX_CODE).collect::<String>())
        .filter(|code| !code.is_empty());
    let said = format!("{}the server answered {}", &text[..at], status.trim());
    match code {
        Some(code) => format!("{said} ({code})"),
        None => said,
    }
}

/// What reaching a bucket takes. `Debug` leaves the secret out.
#[derive(Clone)]
pub struct Bucket {
    /// Base URL of the service.
    pub endpoint: String,
    /// The bucket.
    pub bucket: String,
    /// Its region.
    pub region: String,
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// PEM of the CA that signed the endpoint's certificate.
    pub ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket").field("endpoint", &self.endpoint).field("bucket", &self.bucket).finish_non_exhaustive()
    }
}

impl Bucket {
    /// The bucket of `target` with the key and CA read from its Secrets.
    pub fn new(target: &S3Target, access_key_id: String, secret_access_key: String, ca_pem: Option<Vec<u8>>) -> Self {
        Self {
            endpoint: target.endpoint.trim_end_matches('/').to_string(),
            bucket: target.bucket.clone(),
            region: target.region.clone().unwrap_or_else(|| "us-east-1".into()),
            access_key_id,
            secret_access_key,
            ca_pem,
        }
    }

    /// The bucket a transfer container was given in its environment.
    pub fn from_env() -> Result<Self, Error> {
        let var = |name: &str| std::env::var(name).map_err(|_| Error(format!("the environment variable {name} is not set")));
        let ca_pem = match std::env::var_os(ENV_CA_FILE) {
            Some(path) => Some(std::fs::read(&path).map_err(|e| error(format!("reading the CA file {}", path.to_string_lossy()), e))?),
            None => None,
        };
        Ok(Self {
            endpoint: var(ENV_ENDPOINT)?,
            bucket: var(ENV_BUCKET)?,
            region: var(ENV_REGION).unwrap_or_else(|_| "us-east-1".into()),
            access_key_id: var(ENV_ACCESS_KEY_ID)?,
            secret_access_key: var(ENV_SECRET_ACCESS_KEY)?,
            ca_pem,
        })
    }

    /// A client for the bucket: path-style requests, bounded timeouts, a few retries.
    pub fn store(&self) -> Result<Arc<dyn ObjectStore>, Error> {
        self.store_resolving(None)
    }

    /// [`Bucket::store`], resolving the endpoint's host with `resolver` (the operator's:
    /// the addresses its egress policy checked) rather than the system's.
    pub fn store_resolving(&self, resolver: Option<Arc<dyn object_store::client::DnsResolver>>) -> Result<Arc<dyn ObjectStore>, Error> {
        // HTTPS through rustls with ring, the provider the Kubernetes client uses too.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut options =
            ClientOptions::new().with_connect_timeout(Duration::from_secs(10)).with_timeout(Duration::from_secs(300)).with_allow_http(true);
        if let Some(pem) = &self.ca_pem {
            let ca = object_store::Certificate::from_pem(pem).map_err(|e| error("the CA bundle", e))?;
            options = options.with_root_certificate(ca);
        }
        if let Some(resolver) = resolver {
            options = options.with_dns_resolver(resolver);
        }
        let retry = object_store::RetryConfig { max_retries: 3, retry_timeout: Duration::from_secs(60), ..Default::default() };
        let store = AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_bucket_name(&self.bucket)
            .with_region(&self.region)
            .with_access_key_id(&self.access_key_id)
            .with_secret_access_key(&self.secret_access_key)
            .with_virtual_hosted_style_request(false)
            .with_allow_http(self.endpoint.starts_with("http://"))
            .with_client_options(options)
            .with_retry(retry)
            .build()
            .map_err(|e| error(format!("bucket {} at {}", self.bucket, self.endpoint), e))?;
        Ok(Arc::new(store))
    }
}

/// Where one Database's backups live in its bucket: `<prefix>/<namespace>/<database>`.
pub fn database_key(prefix: &str, namespace: &str, database: &str) -> Key {
    let parts = prefix.split('/').filter(|p| !p.is_empty()).chain([namespace, database]);
    Key::from_iter(parts)
}

/// Where the backup `backup` of a Database lives.
pub fn backup_key(prefix: &str, namespace: &str, database: &str, backup: &str) -> Key {
    database_key(prefix, namespace, database).join(backup)
}

/// What a complete backup holds; its presence completes the backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Whether the artefact is one file or a directory of them.
    pub kind: ArtefactKind,
    /// Every file, paths relative to the artefact (a single file: its name).
    pub files: Vec<FileEntry>,
    /// When the artefact began to be written: its oldest file's birth time where the
    /// filesystem records one, else when the upload began. The archive needed to replay
    /// from this backup starts here.
    pub started: DateTime<Utc>,
    /// When the last file was uploaded.
    pub completed: DateTime<Utc>,
}

/// The shape of an artefact on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ArtefactKind {
    /// A single file.
    File,
    /// A directory tree.
    Directory,
}

/// One file of a backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileEntry {
    /// Path relative to the artefact, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Hex SHA-256 of the content.
    pub sha256: String,
}

impl Manifest {
    /// Bytes in all files.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
}

/// The files under `artefact` (itself when it is a file), relative and sorted.
fn files_of(artefact: &Path) -> Result<(ArtefactKind, Vec<(String, PathBuf)>), Error> {
    let meta = std::fs::metadata(artefact).map_err(|e| error(format!("the artefact {}", artefact.display()), e))?;
    if meta.is_file() {
        let name = artefact.file_name().and_then(|n| n.to_str()).unwrap_or("artefact");
        return Ok((ArtefactKind::File, vec![(name.to_string(), artefact.to_path_buf())]));
    }
    let mut files = Vec::new();
    let mut dirs = vec![artefact.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| error(format!("reading {}", dir.display()), e))? {
            let entry = entry.map_err(|e| error(format!("reading {}", dir.display()), e))?;
            let kind = entry.file_type().map_err(|e| error(format!("reading {}", entry.path().display()), e))?;
            let path = entry.path();
            if kind.is_dir() {
                dirs.push(path);
            } else if kind.is_file() {
                let relative = path.strip_prefix(artefact).map_err(|e| error(path.display(), e))?;
                let relative = relative.to_str().ok_or_else(|| Error(format!("{} is not UTF-8", path.display())))?;
                files.push((relative.to_string(), path));
            } else {
                return Err(Error(format!("{} is neither a file nor a directory; backups hold only those", path.display())));
            }
        }
    }
    files.sort();
    Ok((ArtefactKind::Directory, files))
}

/// Uploads the artefact at `artefact` (a file or a directory) to `key`, then its
/// manifest. Anything already under `key` is replaced by the new manifest's view.
pub async fn upload(store: &dyn ObjectStore, key: &Key, artefact: &Path) -> Result<Manifest, Error> {
    let (kind, files) = files_of(artefact)?;
    let started = born(artefact, &files).unwrap_or_else(Utc::now);
    let mut entries = Vec::with_capacity(files.len());
    for (relative, path) in files {
        let (bytes, sha256) = upload_file(store, &file_key(key, &relative), &path).await?;
        entries.push(FileEntry { path: relative, bytes, sha256 });
    }
    let manifest = Manifest { kind, files: entries, started, completed: Utc::now() };
    let json = serde_json::to_vec_pretty(&manifest).map_err(|e| error("the manifest", e))?;
    store
        .put(&key.clone().join(MANIFEST), PutPayload::from(json))
        .await
        .map_err(|e| error(format!("writing {}", key.clone().join(MANIFEST)), e))?;
    Ok(manifest)
}

/// When the artefact's first file was created, if the filesystem records birth times.
fn born(artefact: &Path, files: &[(String, PathBuf)]) -> Option<DateTime<Utc>> {
    let created = |p: &Path| std::fs::metadata(p).and_then(|m| m.created()).ok().map(DateTime::<Utc>::from);
    std::iter::once(artefact).chain(files.iter().map(|(_, p)| p.as_path())).filter_map(created).min()
}

fn file_key(key: &Key, relative: &str) -> Key {
    let mut k = key.clone().join(FILES);
    for part in relative.split('/') {
        k = k.join(part);
    }
    k
}

/// Streams one file to `key` in parts; returns its size and SHA-256.
async fn upload_file(store: &dyn ObjectStore, key: &Key, path: &Path) -> Result<(u64, String), Error> {
    let what = || format!("uploading {} to {key}", path.display());
    let mut file = tokio::fs::File::open(path).await.map_err(|e| error(what(), e))?;
    let mut upload = WriteMultipart::new_with_chunk_size(store.put_multipart(key).await.map_err(|e| error(what(), e))?, PART_BYTES);
    let mut hash = Sha256::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = match file.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                let _ = upload.abort().await;
                return Err(error(what(), e));
            }
        };
        hash.update(&buf[..n]);
        total += n as u64;
        upload.wait_for_capacity(4).await.map_err(|e| error(what(), e))?;
        upload.write(&buf[..n]);
    }
    upload.finish().await.map_err(|e| error(what(), e))?;
    Ok((total, hex(&hash.finalize())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The manifest of the backup at `key`; `None` when it is incomplete or missing.
pub async fn manifest(store: &dyn ObjectStore, key: &Key) -> Result<Option<Manifest>, Error> {
    let at = key.clone().join(MANIFEST);
    match store.get(&at).await {
        Ok(got) => {
            let bytes = got.bytes().await.map_err(|e| error(format!("reading {at}"), e))?;
            serde_json::from_slice(&bytes).map(Some).map_err(|e| error(format!("{at} is not a plugdb manifest"), e))
        }
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(error(format!("reading {at}"), e)),
    }
}

/// Downloads the complete backup at `key` to `dest` (a file or a directory, as it was
/// uploaded), checking every file's size and SHA-256 against the manifest.
pub async fn download(store: &dyn ObjectStore, key: &Key, dest: &Path) -> Result<Manifest, Error> {
    let manifest = manifest(store, key).await?.ok_or_else(|| Error(format!("{key} is not a complete backup: it has no {MANIFEST}")))?;
    for entry in &manifest.files {
        let path = match manifest.kind {
            ArtefactKind::File => dest.to_path_buf(),
            ArtefactKind::Directory => dest.join(safe_relative(&entry.path)?),
        };
        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent).await.map_err(|e| error(format!("creating {}", parent.display()), e))?;
        }
        download_file(store, &file_key(key, &entry.path), &path, entry).await?;
    }
    Ok(manifest)
}

/// `relative` as a path that stays inside the artefact (a manifest is data from the bucket).
fn safe_relative(relative: &str) -> Result<PathBuf, Error> {
    let path = PathBuf::from(relative);
    if relative.is_empty() || path.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(Error(format!("the manifest names the file {relative:?}, which leaves the artefact")));
    }
    Ok(path)
}

/// Streams the object at `key` into the file `path`; returns its size and SHA-256.
async fn fetch(store: &dyn ObjectStore, key: &Key, path: &Path) -> Result<(u64, String), Error> {
    let what = || format!("downloading {key} to {}", path.display());
    let mut stream = store.get(key).await.map_err(|e| error(what(), e))?.into_stream();
    let mut file = tokio::fs::File::create(path).await.map_err(|e| error(what(), e))?;
    let mut hash = Sha256::new();
    let mut total = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| error(what(), e))?;
        hash.update(&chunk);
        total += chunk.len() as u64;
        file.write_all(&chunk).await.map_err(|e| error(what(), e))?;
    }
    file.flush().await.map_err(|e| error(what(), e))?;
    Ok((total, hex(&hash.finalize())))
}

async fn download_file(store: &dyn ObjectStore, key: &Key, path: &Path, entry: &FileEntry) -> Result<(), Error> {
    let (total, sha256) = fetch(store, key, path).await?;
    if total != entry.bytes || sha256 != entry.sha256 {
        return Err(Error(format!(
            "{key} holds {total} bytes with SHA-256 {sha256}; the manifest says {} bytes, {}",
            entry.bytes, entry.sha256
        )));
    }
    Ok(())
}

/// One backup found under a Database's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The backup's name.
    pub name: String,
    /// When its manifest was written; `None`: incomplete (no manifest).
    pub completed: Option<DateTime<Utc>>,
    /// When its newest object was written.
    pub last_write: DateTime<Utc>,
}

/// Every backup under `database` (a [`database_key`]), complete or not, newest complete first.
pub async fn list(store: &dyn ObjectStore, database: &Key) -> Result<Vec<Listed>, Error> {
    let objects: Vec<_> = store.list(Some(database)).try_collect().await.map_err(|e| error(format!("listing {database}/"), e))?;
    let mut backups: Vec<Listed> = Vec::new();
    for object in objects {
        let Some(mut rest) = object.location.prefix_match(database) else { continue };
        let Some(name) = rest.next() else { continue };
        let name = name.as_ref().to_string();
        if name == ARCHIVE {
            continue;
        }
        let is_manifest = rest.next().is_some_and(|p| p.as_ref() == MANIFEST) && rest.next().is_none();
        let at = object.last_modified;
        match backups.iter_mut().find(|b| b.name == name) {
            Some(b) => b.last_write = b.last_write.max(at),
            None => backups.push(Listed { name: name.clone(), completed: None, last_write: at }),
        }
        if is_manifest && let Some(b) = backups.iter_mut().find(|b| b.name == name) {
            b.completed = Some(at);
        }
    }
    backups.sort_by(|a, b| b.completed.cmp(&a.completed).then_with(|| b.last_write.cmp(&a.last_write)));
    Ok(backups)
}

/// The newest complete backup of a listing.
pub fn newest(listed: &[Listed]) -> Option<&Listed> {
    listed.iter().filter(|b| b.completed.is_some()).max_by_key(|b| b.completed)
}

/// What retention removes from a listing: complete backups beyond the newest `keep`
/// (at least one is always kept), and incomplete ones no running Job is still writing
/// (named in `running`). Never a backup that is running or the only complete one.
pub fn to_prune(listed: &[Listed], keep: usize, running: &[String]) -> Vec<String> {
    let mut complete: Vec<&Listed> = listed.iter().filter(|b| b.completed.is_some()).collect();
    complete.sort_by_key(|b| std::cmp::Reverse(b.completed));
    let old = complete.iter().skip(keep.max(1)).map(|b| b.name.clone());
    let abandoned = listed.iter().filter(|b| b.completed.is_none()).map(|b| b.name.clone());
    old.chain(abandoned).filter(|name| !running.contains(name)).collect()
}

/// Removes the backup at `key`: its manifest first, so that it is never seen complete
/// with files missing.
pub async fn remove(store: &dyn ObjectStore, key: &Key) -> Result<(), Error> {
    match store.delete(&key.clone().join(MANIFEST)).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(error(format!("deleting {}", key.clone().join(MANIFEST)), e)),
    }
    let objects: Vec<_> = store.list(Some(key)).try_collect().await.map_err(|e| error(format!("listing {key}/"), e))?;
    for object in objects {
        match store.delete(&object.location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(error(format!("deleting {}", object.location), e)),
        }
    }
    Ok(())
}

/// `plugdb transfer upload`: the artefact at `from` to `to`, with the bucket from the environment.
pub async fn upload_from_env(from: &Path, to: &str) -> Result<Manifest, Error> {
    let store = Bucket::from_env()?.store()?;
    upload(store.as_ref(), &Key::from(to), from).await
}

/// `plugdb transfer download`: the backup at `from` into `to`, with the bucket from the
/// environment; with `archive`, also the archived segments replayed from it, into that
/// directory. Returns the manifest and how many segments.
pub async fn download_from_env(from: &str, to: &Path, archive: Option<&Path>) -> Result<(Manifest, usize), Error> {
    let store = Bucket::from_env()?.store()?;
    let key = Key::from(from);
    let manifest = download(store.as_ref(), &key, to).await?;
    let segments = match archive {
        Some(dir) => {
            // The backup's key is `<database>/<backup>`: the archive sits beside it.
            let parts: Vec<_> = key.parts().collect();
            let database = Key::from_iter(parts[..parts.len().saturating_sub(1)].iter().cloned());
            download_archive(store.as_ref(), &database, manifest.started, dir).await?
        }
        None => 0,
    };
    Ok((manifest, segments))
}

mod archive;
pub use archive::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_servers_answer_is_said_by_its_status_and_code_alone() {
        let listed = "listing shop/orders/: Generic S3 error: Error performing list request: Server returned non-2xx status code: \
            403 Forbidden: <?xml version=\"1.0\"?><Error><Code>SignatureDoesNotMatch</Code><Message>secret words</Message></Error>";
        assert_eq!(
            without_body(listed),
            "listing shop/orders/: Generic S3 error: Error performing list request: the server answered 403 Forbidden (SignatureDoesNotMatch)"
        );
        let version = "listing x/: Server returned non-2xx status code: 404 Not Found: {\"major\": \"1\", \"gitVersion\": \"v1.36.3\"}";
        assert_eq!(without_body(version), "listing x/: the server answered 404 Not Found");
        let escaped = "x: Server returned error response: <Code>\u{1b}[2JNo\nSuch</Code> and more";
        assert_eq!(without_body(escaped), "x: the server answered an error (2JNoSuch)");
        assert_eq!(without_body("connecting: connection refused"), "connecting: connection refused", "no answer, nothing taken");
    }

    /// A real answer from a server that is not a bucket (an API server's `/version`, say):
    /// its body is never in the error, its status and S3 code are.
    #[tokio::test]
    async fn a_listing_refused_says_no_body() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut head = [0u8; 4096];
                let _ = socket.read(&mut head).await;
                let body = "<Error><Code>AccessDenied</Code><Message>gitVersion v1.36.3 SECRET-BODY</Message></Error>";
                let answer = format!("HTTP/1.1 403 Forbidden\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
                let _ = socket.write_all(answer.as_bytes()).await;
            }
        });
        let bucket = Bucket {
            endpoint: format!("http://{address}"),
            bucket: "b".into(),
            region: "us-east-1".into(),
            access_key_id: "id".into(),
            secret_access_key: "key".into(),
            ca_pem: None,
        };
        let store = bucket.store().expect("a client");
        let e = list(store.as_ref(), &database_key("", "shop", "orders")).await.expect_err("refused");
        let said = e.to_string();
        assert!(said.contains("403") && said.contains("AccessDenied"), "{said}");
        assert!(!said.contains("SECRET-BODY") && !said.contains("gitVersion"), "{said}");
    }

    fn at(minute: u32) -> DateTime<Utc> {
        DateTime::from_timestamp(1_790_000_000 + i64::from(minute) * 60, 0).expect("time")
    }

    fn listed(name: &str, completed: Option<u32>, last_write: u32) -> Listed {
        Listed { name: name.into(), completed: completed.map(at), last_write: at(last_write) }
    }

    #[test]
    fn keys_follow_the_layout_whatever_the_prefix_slashes() {
        assert_eq!(backup_key("", "shop", "orders", "orders-1").as_ref(), "shop/orders/orders-1");
        assert_eq!(backup_key("/team-a/pg/", "shop", "orders", "b").as_ref(), "team-a/pg/shop/orders/b");
        assert_eq!(file_key(&Key::from("p/b"), "pg_wal/0001").as_ref(), "p/b/files/pg_wal/0001");
    }

    #[test]
    fn retention_keeps_the_newest_complete_and_what_still_runs() {
        let backups = [
            listed("b1", Some(1), 1),
            listed("b2", Some(2), 2),
            listed("b3", Some(3), 3),
            listed("half", None, 4),
            listed("writing", None, 5),
        ];
        let running = vec!["writing".to_string()];
        assert_eq!(to_prune(&backups, 2, &running), ["b1", "half"]);
        assert_eq!(to_prune(&backups, 5, &running), ["half"]);
        // Never the only complete one, whatever `keep` says.
        assert_eq!(to_prune(&backups[..1], 0, &[]), Vec::<String>::new());
        assert_eq!(newest(&backups).map(|b| b.name.as_str()), Some("b3"));
        assert_eq!(newest(&backups[3..]), None, "incomplete backups are never restored");
    }

    #[test]
    fn a_manifest_cannot_write_outside_the_artefact() {
        for bad in ["../etc/passwd", "/etc/passwd", "a/../../b", ""] {
            assert!(safe_relative(bad).is_err(), "{bad}");
        }
        assert_eq!(safe_relative("base/0001").expect("inside"), PathBuf::from("base/0001"));
    }
}
