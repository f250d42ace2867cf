//! The engine's archived log, for point-in-time recovery: segments shipped from each
//! member as the engine finishes them (`plugdb archive`), the ones a restore replays,
//! and those no kept backup needs any more.

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt};

use super::{Bucket, Error, error, fetch, safe_relative, upload_file};

/// Where a Database's archived log lives, under its [`database_key`].
pub const ARCHIVE: &str = "_archive";

/// Give archived segments this much more time than the clocks say: the birth time of
/// a backup is the node's clock, a segment's time the object store's.
pub const CLOCK_SKEW: Duration = Duration::from_secs(300);

/// One archived log segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Its file name, as the engine wrote it.
    pub name: String,
    /// When it was stored.
    pub at: DateTime<Utc>,
}

/// The archived segments under `database` (a [`database_key`]), in name order.
pub async fn archived(store: &dyn ObjectStore, database: &Key) -> Result<Vec<Segment>, Error> {
    let key = database.clone().join(ARCHIVE);
    let objects: Vec<_> = store.list(Some(&key)).try_collect().await.map_err(|e| error(format!("listing {key}/"), e))?;
    let mut segments: Vec<Segment> =
        objects.into_iter().filter_map(|o| Some(Segment { name: o.location.filename()?.to_string(), at: o.last_modified })).collect();
    segments.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(segments)
}

/// The segments a backup that started at `started` replays (stored since, less [`CLOCK_SKEW`]).
pub fn needed_since(segments: &[Segment], started: DateTime<Utc>) -> impl Iterator<Item = &Segment> {
    let since = started - CLOCK_SKEW;
    segments.iter().filter(move |s| s.at >= since)
}

/// Ships every finished segment in `dir` (a file whose name does not start with `.`) to
/// `key`, in name order, deleting each once it is stored. Returns how many it shipped.
pub async fn ship(store: &dyn ObjectStore, dir: &Path, key: &Key) -> Result<usize, Error> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| error(format!("reading {}", dir.display()), e))? {
        let entry = entry.map_err(|e| error(format!("reading {}", dir.display()), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && entry.file_type().is_ok_and(|t| t.is_file()) {
            names.push(name);
        }
    }
    names.sort();
    for name in &names {
        let path = dir.join(name);
        upload_file(store, &key.clone().join(name.as_str()), &path).await?;
        std::fs::remove_file(&path).map_err(|e| error(format!("removing {} once archived", path.display()), e))?;
    }
    Ok(names.len())
}

/// Downloads the segments a restore from a backup that started at `started` replays,
/// from the archive of `database` (a [`database_key`]) into `dest`. Returns how many.
pub async fn download_archive(store: &dyn ObjectStore, database: &Key, started: DateTime<Utc>, dest: &Path) -> Result<usize, Error> {
    let segments = archived(store, database).await?;
    tokio::fs::create_dir_all(dest).await.map_err(|e| error(format!("creating {}", dest.display()), e))?;
    let mut count = 0;
    for segment in needed_since(&segments, started) {
        let key = database.clone().join(ARCHIVE).join(segment.name.as_str());
        fetch(store, &key, &dest.join(safe_relative(&segment.name)?)).await?;
        count += 1;
    }
    Ok(count)
}

/// The archived segments that no kept backup replays: stored before `oldest_started`
/// (the oldest kept backup's start) less [`CLOCK_SKEW`].
pub fn not_replayed(segments: &[Segment], oldest_started: DateTime<Utc>) -> Vec<Segment> {
    let before = oldest_started - CLOCK_SKEW;
    segments.iter().filter(|s| s.at < before).cloned().collect()
}

/// Removes archived `segments` (one already gone is no error). Returns how many.
pub async fn remove_segments(store: &dyn ObjectStore, database: &Key, segments: &[Segment]) -> Result<usize, Error> {
    let mut count = 0;
    for segment in segments {
        let key = database.clone().join(ARCHIVE).join(segment.name.as_str());
        match store.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => count += 1,
            Err(e) => return Err(error(format!("deleting {key}"), e)),
        }
    }
    Ok(count)
}

/// `plugdb archive`: ships `dir` to `key` with the bucket from the environment, every
/// `every`, until `stop` resolves; then once more after the directory stayed empty for
/// a few seconds (the engine archives its last segment as it shuts down).
pub async fn archive_from_env(dir: &Path, key: &str, every: Duration, stop: impl std::future::Future<Output = ()>) -> Result<(), Error> {
    let store = Bucket::from_env()?.store()?;
    let key = Key::from(key);
    tokio::pin!(stop);
    loop {
        match ship(store.as_ref(), dir, &key).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(segments = n, "archived"),
            // The engine keeps its segments until they are shipped: try again.
            Err(e) => tracing::warn!("archiving: {e}"),
        }
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep(every) => {}
        }
    }
    let mut quiet = 0;
    while quiet < 5 {
        quiet = match ship(store.as_ref(), dir, &key).await {
            Ok(0) => quiet + 1,
            Ok(_) => 0,
            Err(e) => {
                tracing::warn!("archiving: {e}");
                quiet + 1
            }
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}
