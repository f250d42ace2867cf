//! Deleting a Database: under `Snapshot` a final backup must succeed before the
//! finalizer goes; under `Retain` and `Delete` it goes at once (what the owner references
//! remove is the API server's garbage collector's work).

use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::backups::{self, JobState};
use super::status::{self, kind};
use super::{Ctx, Error, FINALIZER, event, join, plugin_uid, set_finalizer, stop_with, write_status};
use crate::build::{self, Names};
use crate::crd::{Database, DeletionPolicy, Phase};

/// Deletion: under Snapshot, a final backup must succeed before the finalizer goes.
pub(super) async fn delete(db: &Database, ctx: &Ctx) -> Result<Action, Error> {
    if !db.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    if db.spec.deletion_policy != DeletionPolicy::Snapshot {
        set_finalizer(ctx, db, false).await?;
        return Ok(Action::await_change());
    }
    let name = db.name_any();
    // A Database that never ran (an unknown engine, a spec refused from the start) has
    // no members and no data: there is nothing to back up.
    let ns = db.namespace().unwrap_or_default();
    if db.status.as_ref().is_none_or(|s| s.current_version.is_none()) && ctx.caches.stateful_set(&ns, &Names(&name).primary()).is_none() {
        event(ctx, db, false, "DeletedWithoutBackup", "the Database never ran, so it holds no data: no final backup taken".into()).await;
        set_finalizer(ctx, db, false).await?;
        return Ok(Action::await_change());
    }
    let mut status = db.status.clone().unwrap_or_default();
    status.phase = Some(Phase::Deleting);
    let final_name = format!("{name}-final");
    let outcome = match ctx.registry.get(&db.spec.engine) {
        None => Err(format!(
            "no plugin serves engine {:?}, so no final backup can be taken; set deletionPolicy: Retain to delete without one",
            db.spec.engine
        )),
        Some(plugin) => {
            let version =
                db.status.as_ref().and_then(|s| s.current_version.clone()).unwrap_or_else(|| plugin.info().default_version.clone());
            match build::engine_spec(db, &version) {
                Err(v) => Err(join(&v)),
                Ok(spec) => {
                    let cannot = |reason: String| {
                        format!("the plugin cannot take a final backup: {reason}; set deletionPolicy: Retain to delete without one")
                    };
                    match plugin_uid(ctx, &plugin, &spec, db).await {
                        Err(e) => Err(cannot(e.to_string())),
                        Ok(uid) => backups::ensure_backup(ctx, db, &plugin, &spec, &final_name, uid).await?.map_err(cannot),
                    }
                }
            }
        }
    };
    match outcome {
        Ok(JobState::Succeeded) => {
            event(ctx, db, false, "FinalBackupTaken", format!("final backup {final_name} succeeded; deleting")).await;
            set_finalizer(ctx, db, false).await?;
            Ok(Action::await_change())
        }
        Ok(JobState::Failed) => {
            let message =
                format!("final backup {final_name} failed; the Database is kept. Delete the Job to retry, or set deletionPolicy: Retain");
            stop_with(ctx, db, status, kind::BACKUP_HEALTHY, "FinalBackupFailed", message).await
        }
        Ok(_) => {
            status::set(
                &mut status.conditions,
                kind::BACKUP_HEALTHY,
                true,
                "FinalBackupRunning",
                format!("waiting for final backup {final_name}"),
                db.metadata.generation,
            );
            write_status(ctx, db, status).await?;
            Ok(Action::requeue(ctx.settings.progress_requeue))
        }
        Err(message) => stop_with(ctx, db, status, kind::BACKUP_HEALTHY, "FinalBackupImpossible", message).await,
    }
}
