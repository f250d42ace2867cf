//! `restoreFrom`: bootstrap a new Database from a backup of another. Plans that write
//! into the data volume run before the members exist; plans that load over the
//! network run once the new primary is up. Read only while the Database is new.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;

use super::backups::{self, JobState};
use super::{Context, Error, apply, bucket};
use crate::build::{BACKUP_MOUNT, Child, Names, labels, metadata_with};
use crate::crd::Database;
use crate::jobs::{self, Purpose, Storage, Transfer};
use crate::objects;
use crate::plugin::{BackupLocation, Capability, EngineSpec, Plugin, Workload};

/// Where the restore stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restore {
    /// No restore asked for, or it finished.
    Done,
    /// Members must wait: the restore writes their data volume first.
    HoldMembers,
    /// Running alongside the members; keep going.
    Running,
    /// It cannot happen; the reason is for the user.
    Failed(String),
    /// It cannot start yet (the bucket, its Secret or the backup is not there); retried.
    Waiting(String),
}

/// Name of the restore Job of `db`.
pub fn job_name(db: &Database) -> String {
    format!("{}-restore", db.name_any())
}

/// Where a restore stands, from its Job `job` alone (`None`: not started yet). A restore
/// into the data volume (`writes_data`) holds the members until it is done; one over the
/// network runs beside them.
pub fn progress(state: JobState, writes_data: bool, job: &str) -> Option<Restore> {
    match state {
        JobState::Succeeded => Some(Restore::Done),
        JobState::Failed => Some(Restore::Failed(format!("restore Job {job} failed; see its logs"))),
        JobState::Running if writes_data => Some(Restore::HoldMembers),
        JobState::Running => Some(Restore::Running),
        JobState::Missing => None,
    }
}

/// Advances the restore of a new Database. `members_ready`: whether the cluster is up
/// (network restores wait for it).
pub async fn reconcile(
    ctx: &Context,
    db: &Database,
    plugin: &Plugin,
    spec: &EngineSpec,
    workload: &Workload,
    members_ready: bool,
) -> Result<Restore, Error> {
    let Some(source) = &db.spec.restore_from else { return Ok(Restore::Done) };
    let ns = db.namespace().unwrap_or_default();
    let name = db.name_any();
    let job = ctx.caches.job(&ns, &job_name(db));
    if let Some(restore) = progress(backups::state(job.as_deref()), job.as_deref().is_some_and(writes_data), &job_name(db)) {
        return Ok(restore);
    }
    if let Some(why) = plugin.lacks(Capability::Restore) {
        return Ok(Restore::Failed(format!("spec.restoreFrom: {why}")));
    }
    // The backup's name, and where its artefact comes from.
    let (backup, transfer) = match &source.s3 {
        None => (source.backup.clone().unwrap_or_default(), None),
        Some(target) => {
            let layout_ns = source.namespace.as_deref().unwrap_or(&ns);
            let opened = match bucket::open(ctx, &ns, target, layout_ns, &source.database, "spec.restoreFrom.s3").await? {
                Ok(opened) => opened,
                Err(problem) => return Ok(Restore::Waiting(problem)),
            };
            let chosen = match &source.backup {
                Some(b) => opened.listed.iter().find(|l| l.name == *b && l.completed.is_some()),
                None => objects::newest(&opened.listed),
            };
            let Some(chosen) = chosen else {
                let what = source.backup.as_deref().map(|b| format!("backup {b}")).unwrap_or_else(|| "any backup".into());
                return Ok(Restore::Waiting(format!(
                    "spec.restoreFrom: bucket {} holds no complete {what} of {layout_ns}/{} (under {}/)",
                    target.bucket, source.database, opened.database
                )));
            };
            let Some(image) = ctx.operator_image.clone() else { return Ok(Restore::Failed(backups::NO_IMAGE.into())) };
            let key = opened.database.clone().join(chosen.name.as_str());
            (chosen.name.clone(), Some((target, key, image)))
        }
    };
    let location = BackupLocation {
        directory: BACKUP_MOUNT.into(),
        artifact: backup.clone(),
        host: format!("{}.{ns}.svc", Names(&name).primary()),
        credentials_secret: Names(&name).credentials(),
    };
    let plan = match ctx.call(plugin, "restore", (spec.clone(), location), |p, (spec, location)| p.restore(spec, location)).await? {
        Ok(plan) => plan,
        Err(e) => return Ok(Restore::Failed(format!("spec.restoreFrom: {e}"))),
    };
    if !plan.mounts_data && !members_ready {
        return Ok(Restore::Running);
    }
    let claim = Names(&name).data_claim(0);
    if plan.mounts_data {
        apply::create_once(ctx, &ns, &data_claim(db, &claim)).await?;
    }
    let storage = match &transfer {
        Some((target, key, image)) => Storage::Bucket(Transfer { target, key: key.as_ref(), image }),
        None => Storage::Volume { of: &source.database },
    };
    let job = jobs::job(
        db,
        &job_name(db),
        Purpose::Restore,
        &plan,
        storage,
        &backup,
        Some((&claim, &workload.data_mount_path)),
        workload.run_as_user,
    );
    apply::create_once(ctx, &ns, &job).await?;
    Ok(if plan.mounts_data { Restore::HoldMembers } else { Restore::Running })
}

/// The backup a restore read, as its Job records it (`database/backup`), for messages.
pub fn restored_from(ctx: &Context, db: &Database) -> String {
    let source = db.spec.restore_from.as_ref().map(|s| s.database.as_str()).unwrap_or_default();
    let job = ctx.caches.job(&db.namespace().unwrap_or_default(), &job_name(db));
    let backup = job.as_ref().and_then(|j| j.annotations().get(jobs::ARTIFACT).cloned()).unwrap_or_default();
    format!("{source}/{backup}")
}

fn writes_data(job: &Job) -> bool {
    job.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.name == "data"))
}

/// Member 0's data claim, made ahead of the StatefulSet (which adopts it by name).
fn data_claim(db: &Database, name: &str) -> Child {
    // Not owned by the Database: the StatefulSet's retention policy decides its fate.
    let claim = PersistentVolumeClaim {
        metadata: metadata_with(db, name, false, &labels(db)),
        spec: Some(crate::build::pod::data_claim_spec(db)),
        ..Default::default()
    };
    Child::new(name.to_string(), claim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_into_the_volume_holds_the_members_and_one_over_the_network_runs_beside_them() {
        let rows = [
            (JobState::Missing, true, None),
            (JobState::Running, true, Some(Restore::HoldMembers)),
            (JobState::Running, false, Some(Restore::Running)),
            (JobState::Succeeded, true, Some(Restore::Done)),
            (JobState::Succeeded, false, Some(Restore::Done)),
            (JobState::Failed, false, Some(Restore::Failed("restore Job orders-restore failed; see its logs".into()))),
        ];
        for (state, writes_data, expected) in rows {
            assert_eq!(progress(state, writes_data, "orders-restore"), expected, "{state:?}, writes data {writes_data}");
        }
    }
}
