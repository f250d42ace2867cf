//! What the operator says of a Database (`status`): written by the operator alone, read
//! by users, `kubectl plugdb` and the scenarios.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// What plugdb observed about the Database; written only by the operator.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseStatus {
    /// Summary of the lifecycle (the conditions say why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Members whose pods are ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// The label selector of the member pods (`kubectl scale`, and autoscalers, read it
    /// through the scale subresource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready, Progressing, Degraded, PluginReady, BackupHealthy, Restored, SynchronousReplication, MemberAgents, StorageGrowth.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Pod name of the current primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<String>,
    /// Each member: its pod, node, role and readiness, and what its agent last said.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberStatus>,
    /// Engine version the members run now (differs from spec.version during an upgrade,
    /// or when an upgrade was refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// The plugin that rendered the cluster, `engine@version`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// The most recent successful backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup: Option<BackupRecord>,
    /// When the next scheduled backup runs (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_backup: Option<String>,
    /// What a restore can reach now: the backups kept, the oldest and the newest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recoverable: Option<Recoverable>,
    /// An upgrade in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeStatus>,
    /// What growing the volumes on their own did (`spec.storageGrowth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_growth: Option<StorageGrowthStatus>,
    /// A change in the number of members in progress, following the plugin's plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<ScaleStatus>,
    /// The last `plugdb.io/backup-now` value acted on: each new value makes exactly one
    /// backup, whatever retention later removes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_request: Option<String>,
    /// The last scheduled backup started (named after its fire time): a fire time is
    /// backed up once, even after retention removed its Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scheduled_backup: Option<String>,
}

/// The members' volumes grown on their own, beyond `spec.storage`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageGrowthStatus {
    /// The size every member's volume was grown to last, e.g. `12800Mi`.
    pub size: String,
    /// How many times they were grown.
    pub count: i32,
    /// When (RFC 3339).
    pub last: String,
}

/// One member, as the operator last saw it.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// Its pod.
    pub pod: String,
    /// The node it runs on, once scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// `primary` or `replica` (the leader of an engine that elects its own is `primary`).
    pub role: String,
    /// Whether its pod is ready.
    pub ready: bool,
    /// Since when it has been ready, or not (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Why it is not ready, while it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down: Option<String>,
    /// Its replication position, as its agent last said (the operator asks the agents
    /// every half minute, and when the primary is lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<String>,
    /// How far behind the primary a replica said it was then (`0s`, `2.5s`), when it knew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<String>,
    /// When its agent said this position and lag (RFC 3339): it is asked every half
    /// minute, and the time moves when the answer changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heard: Option<String>,
    /// How full its data volume is, as its agent last measured it (`21% of 10.0Gi`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    /// Its engine's exporter, as its agent last looked at it (every half minute), when
    /// it runs one: `up`, `cannot reach its engine` (it cannot log in) or `does not answer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exporter: Option<String>,
}

/// Where a Database is in its life: `Pending` (waiting for its engine's plugin),
/// `Creating` (members not all ready yet), `Restoring` (loading a backup), `Running`
/// (every member ready on the desired spec), `Updating` (a change or an upgrade rolling out),
/// `Degraded` (it ran; now fewer members are ready, or a problem stops it), `Failed` (it
/// never ran and waits for a change of its spec or plugin), `Deleting` (waiting for the
/// final backup). The conditions say why.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum Phase {
    /// Waiting for its engine's plugin, which may still be on its way, or for the
    /// certificate cert-manager is to issue it.
    Pending,
    /// Members are being created and have not all been ready yet.
    Creating,
    /// Loading a backup (`restoreFrom`) before or while the members start.
    Restoring,
    /// Every member ready, on the desired spec.
    Running,
    /// A change or an upgrade is rolling out.
    Updating,
    /// It ran, and now fewer members are ready than desired, or a problem stops it.
    Degraded,
    /// It never ran, and cannot until its spec or plugin changes (see the conditions).
    Failed,
    /// Deleted; waiting for the final backup.
    Deleting,
}

impl Phase {
    /// Every phase.
    pub const ALL: [Phase; 8] = {
        use Phase::*;
        [Pending, Creating, Restoring, Running, Updating, Degraded, Failed, Deleting]
    };

    /// The phase's name, as the status shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Creating => "Creating",
            Phase::Restoring => "Restoring",
            Phase::Running => "Running",
            Phase::Updating => "Updating",
            Phase::Degraded => "Degraded",
            Phase::Failed => "Failed",
            Phase::Deleting => "Deleting",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The backups a restore can use: on the backup volume, those whose Jobs retention
/// keeps; in a bucket, the complete ones in it (as of the last backup).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Recoverable {
    /// How many complete backups there are.
    pub backups: i32,
    /// When the oldest completed (RFC 3339): the earliest moment a restore reaches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<String>,
    /// The latest moment a restore reaches (RFC 3339): when the newest backup completed
    /// or, with `pointInTime`, where the archived log ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<String>,
    /// The engine's log is archived: any moment from `first` to `last` can be restored
    /// (`restoreFrom.pointInTime`), not only the backups' own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub point_in_time: bool,
    /// When the bucket last confirmed this window (RFC 3339); it is read again after each
    /// backup, and at least hourly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed: Option<String>,
    /// Since when the bucket cannot be read (RFC 3339): the window is the last one known,
    /// as of `confirmed`, and `BackupHealthy` says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreachable_since: Option<String>,
}

/// A backup that finished.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupRecord {
    /// Backup name (also its Job's name); use it in `restoreFrom.backup`.
    pub name: String,
    /// When it completed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed: Option<String>,
}

/// Progress of an accepted scale plan.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScaleStatus {
    /// Members before.
    pub from: i32,
    /// Members asked for.
    pub to: i32,
    /// Index of the plan step in progress.
    pub step: i32,
}

/// Progress of an accepted upgrade plan.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStatus {
    /// Version the members ran before.
    pub from: String,
    /// Version being rolled out.
    pub to: String,
    /// Index of the plan step in progress.
    pub step: i32,
}
