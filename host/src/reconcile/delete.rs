//! Deleting a Database: under `Snapshot` a final backup must succeed before the
//! finalizer goes; under `Retain` and `Delete` it goes at once (what the owner references
//! remove is the API server's garbage collector's work).

use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::backups;
use super::decide::JobState;
use super::plan::Plan;
use super::status::{self, ConditionType, Reason};
use super::{Context, Error, FINALIZER, join, plugin_uid, set_finalizer, stopped, write_status};
use crate::build;
use crate::crd::{Database, DatabaseStatus, DeletionPolicy, Phase};
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

/// Deletion: under Snapshot, a final backup must succeed before the finalizer goes. The
/// same shape as a pass that converges: what is decided goes into a [`Plan`], carried
/// out in one place, then the status or the finalizer is written.
pub(super) async fn delete(db: &Database, ctx: &Context) -> Result<Action, Error> {
    let mut plan = Plan::default();
    let (status, action) = decide(db, ctx, &mut plan).await?;
    plan.carry_out(ctx, db).await?;
    match status {
        Some(status) => write_status(ctx, db, status).await?,
        None => set_finalizer(ctx, db, false).await?,
    }
    Ok(action)
}

/// Whether the namespace of `db` is being deleted (unknown, as when the operator may not
/// read namespaces: not).
async fn namespace_terminating(ctx: &Context, db: &Database) -> bool {
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    match api.get_opt(&db.namespace().unwrap_or_default()).await {
        Ok(found) => found.is_some_and(|n| n.metadata.deletion_timestamp.is_some()),
        Err(e) => {
            tracing::debug!(database = %db.name_any(), error = %e, "cannot read the Database's namespace");
            false
        }
    }
}

/// Says that `db` was deleted with its namespace, where its final backup cannot be made
/// (its finalizer goes then, or the namespace would never go), in a Warning. The Warning
/// cannot be in that namespace, which takes no new Event either: it is about the
/// namespace, in `default` (`kubectl get events -n default --field-selector
/// reason=DeletedWithoutBackup`), and in the operator's log.
async fn deleted_with_its_namespace(ctx: &Context, db: &Database) {
    let (ns, name) = (db.namespace().unwrap_or_default(), db.name_any());
    let last = db.status.as_ref().and_then(|s| s.last_backup.as_ref()).map_or_else(|| "none".into(), |b| b.name.clone());
    let note = format!(
        "Database {ns}/{name} was deleted with its namespace, which takes no new object: no final backup could be made \
         (deletionPolicy Snapshot; its last backup: {last})"
    );
    tracing::warn!(database = %name, namespace = %ns, "{note}");
    let namespace = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Namespace".into()),
        name: Some(ns),
        ..Default::default()
    };
    let about = db.object_ref(&());
    let reason = Reason::DeletedWithoutBackup.as_str();
    if let Err(e) = ctx.recorder.publish(&namespace, Some(&about), true, reason, &note).await {
        tracing::warn!(error = %e, reason, "could not record event");
    }
}

/// What deleting `db` takes now: Events and Jobs in `plan`; the status to write, or
/// `None` when the finalizer goes.
async fn decide(db: &Database, ctx: &Context, plan: &mut Plan) -> Result<(Option<DatabaseStatus>, Action), Error> {
    let name = db.name_any();
    match ending(db, ctx.caches.stateful_set(db).is_some()) {
        // Nothing of ours holds it, or nothing is owed: the finalizer goes (if still there).
        Ending::Gone | Ending::Release => return Ok((None, Action::await_change())),
        Ending::NeverRan => {
            let note = "the Database never ran, so it holds no data: no final backup taken";
            plan.tell(None, false, Reason::DeletedWithoutBackup, note.into());
            return Ok((None, Action::await_change()));
        }
        // A namespace being deleted takes no new object: no final backup can be made in
        // it, and the Database must not hold it.
        Ending::FinalBackup if namespace_terminating(ctx, db).await => {
            deleted_with_its_namespace(ctx, db).await;
            return Ok((None, Action::await_change()));
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
                        Ok(uid) => {
                            // Its bucket is looked at before its Job is made, not while it runs.
                            let answered = match ctx.caches.job(db, &final_name) {
                                Some(_) => None,
                                None => backups::look_at_bucket(ctx, db).await?,
                            };
                            backups::backup(ctx, db, (&plugin, &spec), (&final_name, uid), answered, plan).await?.map_err(cannot)
                        }
                    }
                }
            }
        }
    };
    let stop = |plan: &mut Plan, reason: Reason, message: String| {
        let (status, news) = stopped(db, status.clone(), ConditionType::BackupHealthy, reason, &message);
        if news {
            plan.tell(None, true, reason, message);
        }
        Ok((Some(status), Action::await_change()))
    };
    match outcome {
        Ok(JobState::Succeeded) => {
            plan.tell(None, false, Reason::FinalBackupTaken, format!("final backup {final_name} succeeded; deleting"));
            Ok((None, Action::await_change()))
        }
        Ok(JobState::Failed) => {
            let message =
                format!("final backup {final_name} failed; the Database is kept. Delete the Job to retry, or set deletionPolicy: Retain");
            stop(plan, Reason::FinalBackupFailed, message)
        }
        Ok(_) => {
            let message = format!("waiting for final backup {final_name}");
            status::set(
                &mut status.conditions,
                ConditionType::BackupHealthy,
                true,
                Reason::FinalBackupRunning,
                message,
                db.metadata.generation,
            );
            Ok((Some(status), Action::requeue(ctx.settings.progress_requeue)))
        }
        // A plugin that could not answer (its deadline passed on a busy machine, no plugin
        // loaded yet) may answer the next time: asked again in a while, the condition
        // saying why meanwhile.
        Err(message) => {
            let retry = Action::requeue(ctx.settings.progress_requeue * 6);
            stop(plan, Reason::FinalBackupImpossible, message).map(|(status, _)| (status, retry))
        }
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
