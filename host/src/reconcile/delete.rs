//! Deleting a Database: under `Snapshot` a final backup must succeed before the
//! finalizer goes; under `Retain` and `Delete` it goes at once (what the owner references
//! remove is the API server's garbage collector's work).

use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::backups::{self, JobState};
use super::status::{self, Reason, kind};
use super::{Context, Error, FINALIZER, event, join, plugin_uid, set_finalizer, stop_with, write_status};
use crate::build;
use crate::crd::{Database, DeletionPolicy, Phase};
use crate::names::Names;

/// What deleting a Database takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Nothing of ours holds it.
    Gone,
    /// Let it go: `Retain` and `Delete` take no final backup.
    Release,
    /// It never ran (an unknown engine, a spec refused from the start): it has no
    /// members and no data, so it goes without a final backup.
    NeverRan,
    /// `Snapshot`: a final backup must succeed first.
    FinalBackup,
}

/// What deleting `db` takes; `has_members`: its StatefulSet exists.
pub fn ending(db: &Database, has_members: bool) -> Ending {
    let ran = db.status.as_ref().is_some_and(|s| s.current_version.is_some()) || has_members;
    if !db.finalizers().iter().any(|f| f == FINALIZER) {
        Ending::Gone
    } else if db.spec.deletion_policy != DeletionPolicy::Snapshot {
        Ending::Release
    } else if !ran {
        Ending::NeverRan
    } else {
        Ending::FinalBackup
    }
}

/// Deletion: under Snapshot, a final backup must succeed before the finalizer goes.
pub(super) async fn delete(db: &Database, ctx: &Context) -> Result<Action, Error> {
    let name = db.name_any();
    match ending(db, ctx.caches.stateful_set(db).is_some()) {
        Ending::Gone => return Ok(Action::await_change()),
        Ending::Release => {
            set_finalizer(ctx, db, false).await?;
            return Ok(Action::await_change());
        }
        Ending::NeverRan => {
            let note = "the Database never ran, so it holds no data: no final backup taken";
            event(ctx, db, false, Reason::DeletedWithoutBackup, note.into()).await;
            set_finalizer(ctx, db, false).await?;
            return Ok(Action::await_change());
        }
        Ending::FinalBackup => {}
    }
    let mut status = db.status.clone().unwrap_or_default();
    status.phase = Some(Phase::Deleting);
    let final_name = Names(&name).job("final");
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
                        Err(Error::Plugin(e)) => Err(cannot(e.to_string())),
                        Err(e) => return Err(e),
                        Ok(uid) => backups::ensure_backup(ctx, db, &plugin, &spec, &final_name, uid).await?.map_err(cannot),
                    }
                }
            }
        }
    };
    match outcome {
        Ok(JobState::Succeeded) => {
            event(ctx, db, false, Reason::FinalBackupTaken, format!("final backup {final_name} succeeded; deleting")).await;
            set_finalizer(ctx, db, false).await?;
            Ok(Action::await_change())
        }
        Ok(JobState::Failed) => {
            let message =
                format!("final backup {final_name} failed; the Database is kept. Delete the Job to retry, or set deletionPolicy: Retain");
            stop_with(ctx, db, status, kind::BACKUP_HEALTHY, Reason::FinalBackupFailed, message).await
        }
        Ok(_) => {
            status::set(
                &mut status.conditions,
                kind::BACKUP_HEALTHY,
                true,
                Reason::FinalBackupRunning,
                format!("waiting for final backup {final_name}"),
                db.metadata.generation,
            );
            write_status(ctx, db, status).await?;
            Ok(Action::requeue(ctx.settings.progress_requeue))
        }
        Err(message) => stop_with(ctx, db, status, kind::BACKUP_HEALTHY, Reason::FinalBackupImpossible, message).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::DatabaseStatus;

    fn database(policy: DeletionPolicy, finalizer: bool, ran: bool) -> Database {
        let mut db: Database = serde_json::from_value(serde_json::json!({
            "apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": "orders"},
            "spec": {"engine": "postgres", "storage": "1Gi"},
        }))
        .expect("a Database");
        db.spec.deletion_policy = policy;
        db.metadata.finalizers = finalizer.then(|| vec![FINALIZER.to_string()]);
        db.status = ran.then(|| DatabaseStatus { current_version: Some("17".into()), ..Default::default() });
        db
    }

    #[test]
    fn what_a_deletion_takes_follows_the_policy_and_whether_the_database_ran() {
        use DeletionPolicy::{Delete, Retain, Snapshot};
        // (policy, our finalizer, ran (status), members exist, what it takes)
        let rows = [
            (Snapshot, true, true, true, Ending::FinalBackup),
            (Snapshot, true, false, true, Ending::FinalBackup),
            (Snapshot, true, true, false, Ending::FinalBackup),
            (Snapshot, true, false, false, Ending::NeverRan),
            (Retain, true, true, true, Ending::Release),
            (Delete, true, true, true, Ending::Release),
            (Snapshot, false, true, true, Ending::Gone),
            (Retain, false, false, false, Ending::Gone),
        ];
        for (policy, finalizer, ran, members, expected) in rows {
            let db = database(policy, finalizer, ran);
            assert_eq!(ending(&db, members), expected, "{policy:?}, finalizer {finalizer}, ran {ran}, members {members}");
        }
    }
}
