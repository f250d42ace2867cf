//! Jobs the host runs from plugin plans: backups, restores and upgrade steps.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use serde_json::json;

use crate::build::{BACKUP_MOUNT, Child, Names, labels};
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
    let env: Vec<serde_json::Value> = crate::build::env_json(&plan.env);
    let mut mounts = vec![json!({"name": "backups", "mountPath": BACKUP_MOUNT})];
    let mut volumes = vec![json!({"name": "backups", "persistentVolumeClaim": {"claimName": Names(backups_of).backups()}})];
    if plan.mounts_data
        && let Some((claim, path)) = data_claim
    {
        mounts.push(json!({"name": "data", "mountPath": path}));
        volumes.push(json!({"name": "data", "persistentVolumeClaim": {"claimName": claim}}));
    }
    Child::new::<Job>(
        name.to_string(),
        json!({
            // Backups outlive their Database (they are what restoreFrom reads); other Jobs do not.
            "metadata": crate::build::metadata_with(db, name, purpose != Purpose::Backup, &labels),
            "spec": {
                "backoffLimit": 2,
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "restartPolicy": "Never",
                        "automountServiceAccountToken": false,
                        "securityContext": {"runAsUser": run_as_user, "runAsGroup": run_as_user, "fsGroup": run_as_user, "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [{
                            "name": purpose.label(),
                            "image": plan.image,
                            "command": plan.command,
                            "env": env,
                            "volumeMounts": mounts,
                            "securityContext": {"allowPrivilegeEscalation": false, "privileged": false, "capabilities": {"drop": ["ALL"]}},
                        }],
                        "volumes": volumes,
                    },
                },
            },
        }),
    )
}

/// The volume claim holding a Database's backups. Owned by the Database only under
/// the Delete policy: otherwise backups outlive it.
pub fn backup_claim(db: &Database) -> Child {
    let name = Names(&db.name_any()).backups();
    let size = db.spec.backup.as_ref().and_then(|b| b.storage.clone()).unwrap_or_else(|| db.spec.storage.clone());
    let owned = db.spec.deletion_policy == DeletionPolicy::Delete;
    Child::new::<PersistentVolumeClaim>(
        name.clone(),
        json!({
            "metadata": crate::build::metadata_with(db, &name, owned, &labels(db)),
            // The cluster's default class: backups need not live where the data does.
            "spec": crate::build::claim_spec(&size.0, None),
        }),
    )
}
