//! Jobs the host runs from plugin plans: backups, restores and upgrade steps.

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, PersistentVolumeClaim, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use crate::build::{BACKUP_MOUNT, Child, Names, labels, metadata_with, pod};
use crate::crd::{Database, DeletionPolicy};
use crate::plugin::JobPlan;

/// Label on backup Jobs naming their Database.
pub const BACKUP_OF: &str = "plugdb.io/backup-of";
/// Label on every Job naming its purpose: `backup`, `restore`, `upgrade`.
pub const PURPOSE: &str = "plugdb.io/purpose";

/// What a Job is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A backup (scheduled, on demand, pre-upgrade or final).
    Backup,
    /// A restore into a new Database.
    Restore,
    /// A step of an upgrade plan.
    Upgrade,
}

impl Purpose {
    fn label(self) -> &'static str {
        match self {
            Purpose::Backup => "backup",
            Purpose::Restore => "restore",
            Purpose::Upgrade => "upgrade",
        }
    }
}

/// A Job running `plan` with the backup volume of `backups_of` mounted at
/// [`BACKUP_MOUNT`], and the data volume `data_claim` when the plan needs it.
pub fn job(
    db: &Database,
    name: &str,
    purpose: Purpose,
    plan: &JobPlan,
    backups_of: &str,
    data_claim: Option<(&str, &str)>,
    run_as_user: u32,
) -> Child {
    let mut labels = labels(db);
    labels.insert(PURPOSE.into(), purpose.label().into());
    if purpose == Purpose::Backup {
        labels.insert(BACKUP_OF.into(), db.name_any());
    }
    let mut mounts = vec![pod::mount("backups", BACKUP_MOUNT, false)];
    let mut volumes = vec![pod::claim_volume("backups", &Names(backups_of).backups())];
    if plan.mounts_data
        && let Some((claim, path)) = data_claim
    {
        mounts.push(pod::mount("data", path, false));
        volumes.push(pod::claim_volume("data", claim));
    }
    let container = Container {
        name: purpose.label().into(),
        image: Some(plan.image.clone()),
        command: Some(plan.command.clone()),
        env: Some(pod::env(&plan.env)),
        volume_mounts: Some(mounts),
        security_context: Some(pod::container_security(None)),
        ..Default::default()
    };
    let spec = JobSpec {
        backoff_limit: Some(2),
        template: PodTemplateSpec {
            metadata: Some(ObjectMeta { labels: Some(labels.clone()), ..Default::default() }),
            spec: Some(PodSpec {
                restart_policy: Some("Never".into()),
                automount_service_account_token: Some(false),
                security_context: Some(pod::pod_security(run_as_user)),
                containers: vec![container],
                volumes: Some(volumes),
                ..Default::default()
            }),
        },
        ..Default::default()
    };
    // Backups outlive their Database (they are what restoreFrom reads); other Jobs do not.
    let metadata = metadata_with(db, name, purpose != Purpose::Backup, &labels);
    Child::new(name.to_string(), Job { metadata, spec: Some(spec), ..Default::default() })
}

/// The volume claim holding a Database's backups. Owned by the Database only under
/// the Delete policy: otherwise backups outlive it.
pub fn backup_claim(db: &Database) -> Child {
    let name = Names(&db.name_any()).backups();
    let size = db.spec.backup.as_ref().and_then(|b| b.storage.clone()).unwrap_or_else(|| db.spec.storage.clone());
    let owned = db.spec.deletion_policy == DeletionPolicy::Delete;
    // The cluster's default class: backups need not live where the data does.
    let claim = PersistentVolumeClaim {
        metadata: metadata_with(db, &name, owned, &labels(db)),
        spec: Some(pod::claim_spec(&size.0, None)),
        ..Default::default()
    };
    Child::new(name, claim)
}
