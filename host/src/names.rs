//! What every child of a Database is called and labelled, and the paths and
//! annotations the pieces that render them share (`build`, `jobs`, `tls`, the member
//! agent): below all of them, so none imports another for a name.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::core::{Resource, ResourceExt};
use sha2::{Digest, Sha256};

use crate::crd::Database;

/// The Database's annotation asking for a planned switchover: the member (pod) to lead.
/// The operator removes it once that member leads, or when it cannot.
pub const SWITCHOVER: &str = "plugdb.io/switchover";
/// A StatefulSet's annotation: the engine's interactive client (a JSON argv) that
/// `kubectl plugdb connect` runs in a member's engine container.
pub const CLIENT_COMMAND: &str = "plugdb.io/client-command";
/// Where the operator's image holds the `plugdb` binary.
pub const OPERATOR_BINARY: &str = "/usr/local/bin/plugdb";
/// The field manager of every write the operator makes.
pub const MANAGER: &str = "plugdb";
/// Annotation holding the hash of the desired object last applied.
pub const APPLIED_HASH: &str = "plugdb.io/applied-hash";
/// Annotation on the pod template holding the hash of the config files.
pub const CONFIG_HASH: &str = "plugdb.io/config-hash";
/// Annotation on the pod template: the primary the workload was rendered for.
pub const PRIMARY_ANNOTATION: &str = "plugdb.io/primary";
/// Annotation on the pod template: a hash of it with the primary's name left out. A
/// member started as a replica whose pod has the hash of the current template runs what
/// it would run if restarted, but for the primary's name: a failover does not restart
/// it (it follows the read-write Service to the new primary).
pub const ROLE_FREE_HASH: &str = "plugdb.io/role-free-hash";
/// Annotation on the pod template naming the TLS certificate the members use (its expiry).
pub const TLS_STAMP: &str = "plugdb.io/tls-not-after";
/// Annotation on a member pod whose agent the operator asked to fence it: the fence
/// lasts until the pod is made again, so a fenced member that is not the primary (a
/// switchover or a failover moved on without it) is restarted to follow.
pub const FENCED: &str = "plugdb.io/fenced";
/// Annotation on a member pod whose agent promoted it in place: it leads as it runs, and
/// is not restarted to take the role (see `agent.promote-command`).
pub const PROMOTED: &str = "plugdb.io/promoted";
/// Annotation on a member pod the operator is promoting in place, naming the primary it
/// replaces: written with [`PROMOTED`] before its agent is asked, so that an operator
/// stopped before it recorded the promotion finds it (the member leads while the one it
/// replaces is still the primary in status) and finishes it.
pub const REPLACES: &str = "plugdb.io/replaces";
/// Annotation on a member pod whose agent had it follow the member named, promoted then
/// (see `agent.follow-command`): while that member leads, the replica is not restarted to
/// follow it.
pub const FOLLOWS: &str = "plugdb.io/follows";
/// Annotation on the primary's pod saying what its agent last had each commit wait for
/// (see `agent.synchronous-command`): `<n>` or `<n>/<member>,…`, then `@` and when it
/// became ready: it is asked again when either changes (a restarted engine starts from its
/// rendered configuration).
pub const SYNCHRONOUS: &str = "plugdb.io/synchronous";
/// Label on member pods naming their role (`primary` or `replica`).
pub const ROLE_LABEL: &str = "plugdb.io/role";
/// Where config files are mounted in every member.
pub const CONFIG_MOUNT: &str = "/etc/plugdb";
/// Where the Database's credentials Secret is mounted, read-only, in every member and Job
/// (one file per key, readable by the workload's group only): engines read passwords
/// there rather than from their environment. The contract names the same path
/// (`wit/engine.wit`, record `cluster-context`).
pub const CREDENTIALS_MOUNT: &str = "/etc/plugdb-credentials";
/// Where the backup volume is mounted in backup and restore Jobs.
pub const BACKUP_MOUNT: &str = "/backups";
/// Where members place finished log segments for `plugdb archive` to ship (point-in-time recovery).
pub const ARCHIVE_MOUNT: &str = "/plugdb/archive";
/// Label naming the Database a child or member belongs to.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// The label naming a Database's engine on everything made for it.
pub const NAME_LABEL: &str = "app.kubernetes.io/name";
/// The label the StatefulSet controller puts on each pod: the revision it runs.
pub const REVISION_LABEL: &str = "controller-revision-hash";
/// Label on a Job's pods naming its Database. Those pods never carry the members'
/// `app.kubernetes.io/instance`: nothing that selects members (the Services, the
/// disruption budget, the spreading rules) selects them.
pub const JOB_OF: &str = "plugdb.io/job-of";
/// Label naming who manages a child: [`MANAGER`].
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
// The longest Database name, and the suffixes its children take where they could
// collide with another Database's: admission's rules, kept with the CRD.
use crate::crd::{HEADLESS, PRIMARY_BUDGET, REPLICAS};
pub use crate::crd::{MAX_NAME, SHARED_SUFFIXES};

/// Names of a Database's children.
pub struct Names<'a>(pub &'a str);

impl Names<'_> {
    /// Credentials Secret.
    pub fn credentials(&self) -> String {
        format!("{}-credentials", self.0)
    }
    /// The application's login Secret (see `agent.application`).
    pub fn application(&self) -> String {
        format!("{}-app", self.0)
    }
    /// TLS certificate Secret (`kubernetes.io/tls`, with `ca.crt`).
    pub fn tls(&self) -> String {
        format!("{}-tls", self.0)
    }
    /// The member agents' certificates and the operator's for asking them.
    pub fn agent(&self) -> String {
        format!("{}-agent", self.0)
    }
    /// The Database's certificate authority (its key).
    pub fn authority(&self) -> String {
        format!("{}-ca", self.0)
    }
    /// Config ConfigMap.
    pub fn config(&self) -> String {
        format!("{}-config", self.0)
    }
    /// Primary (read-write) Service and the StatefulSet.
    pub fn primary(&self) -> String {
        self.0.to_string()
    }
    /// The read-write Service's DNS name in namespace `ns`: what members replicate from
    /// and applications connect to.
    pub fn primary_host(&self, ns: &str) -> String {
        format!("{}.{ns}.svc", self.primary())
    }
    /// Read-only Service.
    pub fn replicas(&self) -> String {
        format!("{}{REPLICAS}", self.0)
    }
    /// The primary's PodDisruptionBudget (the others' is named as the Database).
    pub fn primary_budget(&self) -> String {
        format!("{}{PRIMARY_BUDGET}", self.0)
    }
    /// Headless Service.
    pub fn headless(&self) -> String {
        format!("{}{HEADLESS}", self.0)
    }
    /// Backup volume claim.
    pub fn backups(&self) -> String {
        format!("{}-backups", self.0)
    }
    /// Pod of member `ordinal`.
    pub fn pod(&self, ordinal: u32) -> String {
        format!("{}-{ordinal}", self.0)
    }
    /// Data volume claim of member `ordinal` (the StatefulSet's naming).
    pub fn data_claim(&self, ordinal: u32) -> String {
        format!("data-{}-{ordinal}", self.0)
    }
    /// Job `<name>-<suffix>`. Where that passes the 63 characters a Job's name may have,
    /// the Database's part is shortened and told apart by a hash of the whole name.
    pub fn job(&self, suffix: &str) -> String {
        let whole = format!("{}-{suffix}", self.0);
        if whole.len() <= MAX_JOB_NAME {
            return whole;
        }
        let tag = &hex(self.0.as_bytes())[..6];
        let keep = MAX_JOB_NAME.saturating_sub(suffix.len() + tag.len() + 2).min(self.0.len());
        format!("{}-{tag}-{suffix}", self.0[..keep].trim_end_matches(['-', '.']))
    }
}

/// The longest name a Job may have (its pods carry it as a label value).
pub const MAX_JOB_NAME: usize = 63;

/// Labels every child and member pod carries.
pub fn labels(db: &Database) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME_LABEL.to_string(), db.spec.engine.clone()),
        (INSTANCE_LABEL.to_string(), db.name_any()),
        (MANAGED_BY_LABEL.to_string(), MANAGER.to_string()),
    ])
}

/// Selector matching the member pods of a Database.
pub fn selector(db: &Database) -> BTreeMap<String, String> {
    let mut l = labels(db);
    l.remove(MANAGED_BY_LABEL);
    l
}

/// [`selector`] as a label selector's text (`key=value,…`).
pub fn selector_text(db: &Database) -> String {
    selector(db).iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// The first 16 bytes of the SHA-256 of `bytes`, in hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().take(16).map(|b| format!("{b:02x}")).collect()
}

fn owner(db: &Database) -> Option<OwnerReference> {
    db.controller_owner_ref(&())
}

/// Metadata of a child with the Database's labels (see [`metadata_with`]).
pub(crate) fn metadata(db: &Database, name: &str, owned: bool) -> ObjectMeta {
    metadata_with(db, name, owned, &labels(db))
}

/// Metadata of a child: name, namespace, `labels`, and an owner reference to the
/// Database when `owned`.
pub fn metadata_with(db: &Database, name: &str, owned: bool, labels: &BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: db.namespace(),
        labels: Some(labels.clone()),
        owner_references: Some(if owned { owner(db).into_iter().collect() } else { vec![] }),
        annotations: Some(BTreeMap::new()),
        ..Default::default()
    }
}
