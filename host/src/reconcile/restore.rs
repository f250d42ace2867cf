//! `restoreFrom`: bootstrap a new Database from a backup of another. Plans that write
//! into the data volume run before the members exist; plans that load over the
//! network run once the new primary is up. Read only while the Database is new.

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use serde_json::json;

use super::backups::{self, JobState};
use super::{Ctx, Error, apply};
use crate::build::{BACKUP_MOUNT, Child, Names, labels, metadata_with};
use crate::crd::Database;
use crate::jobs::{self, Purpose};
use crate::plugin::{BackupLocation, EngineSpec, Plugin, Workload};

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
}

/// Name of the restore Job of `db`.
pub fn job_name(db: &Database) -> String {
    format!("{}-restore", db.name_any())
}

/// Advances the restore of a new Database. `members_ready`: whether the cluster is up
/// (network restores wait for it).
pub async fn reconcile(
    ctx: &Ctx,
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
    match backups::state(job.as_deref()) {
        JobState::Succeeded => return Ok(Restore::Done),
        JobState::Failed => return Ok(Restore::Failed(format!("restore Job {} failed; see its logs", job_name(db)))),
        // A restore into the data volume holds the members until it is done.
        JobState::Running if job.as_deref().is_some_and(writes_data) => return Ok(Restore::HoldMembers),
        JobState::Running => return Ok(Restore::Running),
        JobState::Missing => {}
    }
    let location = BackupLocation {
        directory: BACKUP_MOUNT.into(),
        artifact: source.backup.clone(),
        host: format!("{}.{ns}.svc", Names(&name).primary()),
        credentials_secret: Names(&name).credentials(),
    };
    let plan = match ctx.call(plugin, "restore", (spec.clone(), location), |p, (spec, location)| p.restore(spec, location)).await {
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
    let job = jobs::job(
        db,
        &job_name(db),
        Purpose::Restore,
        &plan,
        &source.database,
        Some((&claim, &workload.data_mount_path)),
        workload.run_as_user,
    );
    apply::create_once(ctx, &ns, &job).await?;
    Ok(if plan.mounts_data { Restore::HoldMembers } else { Restore::Running })
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
    let mut spec = json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": db.spec.storage.0}}});
    if let Some(class) = &db.spec.storage_class_name {
        spec["storageClassName"] = json!(class);
    }
    let labels = labels(db);
    // Not owned by the Database: the StatefulSet's retention policy decides its fate.
    Child::new::<k8s_openapi::api::core::v1::PersistentVolumeClaim>(
        name.to_string(),
        json!({"metadata": metadata_with(db, name, false, &labels), "spec": spec}),
    )
}
