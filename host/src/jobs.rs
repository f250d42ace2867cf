//! Jobs the host runs from plugin plans: backups, restores and upgrade steps.

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, PersistentVolumeClaim, PodSpec, PodTemplateSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

use crate::build::{Child, pod};
use crate::crd::{Database, DeletionPolicy, S3Target};
use crate::names::{BACKUP_MOUNT, JOB_OF, Names, labels, metadata_with};
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
    /// A step of a scale plan.
    Scale,
}

impl Purpose {
    fn label(self) -> &'static str {
        match self {
            Purpose::Backup => "backup",
            Purpose::Restore => "restore",
            Purpose::Upgrade => "upgrade",
            Purpose::Scale => "scale",
        }
    }
}

/// Where a Job's artefact is kept.
#[derive(Debug, Clone, Copy)]
pub enum Storage<'a> {
    /// On the backup volume of this Database.
    Volume {
        /// The Database whose backup volume it is.
        of: &'a str,
    },
    /// A scratch directory that lives as long as the Job's pod (no artefact is kept).
    Scratch,
    /// In a bucket, moved by a transfer container of the operator's image: after the
    /// plan (an upload) or before it (a download), through a scratch volume.
    Bucket(Transfer<'a>),
}

/// A move of one artefact between a Job's scratch volume and a bucket.
#[derive(Debug, Clone, Copy)]
pub struct Transfer<'a> {
    /// The bucket.
    pub target: &'a S3Target,
    /// The backup's key in it (see [`crate::object_storage::backup_key`]).
    pub key: &'a str,
    /// The operator's image, which holds `plugdb transfer`.
    pub image: &'a str,
    /// A restore to a point in time: also download the archived log it replays, to [`RESTORE_ARCHIVE`].
    pub archive: bool,
}

/// Where the operator's image holds the `plugdb` binary.
pub const OPERATOR_BINARY: &str = "/usr/local/bin/plugdb";
/// Where a restore to a point in time finds the archived log segments it replays.
pub const RESTORE_ARCHIVE: &str = "/backups/_archive";

/// What a Job is asked to run, and with what.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The Job's name.
    pub name: &'a str,
    /// What it is for.
    pub purpose: Purpose,
    /// The plugin's plan: its image, command and environment.
    pub plan: &'a JobPlan,
    /// Where its artefact's directory ([`BACKUP_MOUNT`]) is.
    pub storage: Storage<'a>,
    /// The artefact's name under that directory ("" when it keeps none).
    pub artifact: &'a str,
    /// The data claim and where it is mounted, when the plan needs the data.
    pub data: Option<(&'a str, &'a str)>,
    /// The user it runs as (the engine's).
    pub run_as_user: u32,
}

/// `db`'s Job carrying out `request`, its images pulled as `pull` says.
pub fn job(db: &Database, request: &Request<'_>, pull: &crate::images::Pull) -> Child {
    let Request { name, purpose, plan, storage, artifact, data: data_claim, run_as_user } = *request;
    let mut labels = labels(db);
    labels.insert(PURPOSE.into(), purpose.label().into());
    if purpose == Purpose::Backup {
        labels.insert(BACKUP_OF.into(), db.name_any());
    }
    let mut mounts = vec![pod::mount("backups", BACKUP_MOUNT, false)];
    let mut volumes = vec![match storage {
        Storage::Volume { of } => pod::claim_volume("backups", &Names(of).backups()),
        Storage::Bucket(_) | Storage::Scratch => {
            Volume { name: "backups".into(), empty_dir: Some(Default::default()), ..Default::default() }
        }
    }];
    if plan.mounts_data
        && let Some((claim, path)) = data_claim
    {
        mounts.push(pod::mount("data", path, false));
        volumes.push(pod::claim_volume("data", claim));
    }
    let (volume, mount) = pod::credentials_volume(db);
    mounts.push(mount);
    volumes.push(volume);
    if db.spec.tls_enabled() {
        // The certificate the members serve: a Job verifies them against its authority.
        let (volume, mount) = pod::tls_volume(db);
        mounts.push(mount);
        volumes.push(volume);
    }
    let engine = Container {
        name: purpose.label().into(),
        image: Some(plan.image.clone()),
        command: Some(plan.command.clone()),
        env: Some(pod::env(&plan.env)),
        volume_mounts: Some(mounts),
        security_context: Some(pod::container_security(None)),
        // A failed container's last log lines become its termination message: the cause
        // a failed backup's condition quotes.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };
    // Init containers run in order, each to completion: an upload starts only after the
    // engine's backup succeeded, the engine's restore only after the download did.
    let (init, main) = match storage {
        Storage::Volume { .. } | Storage::Scratch => (None, engine),
        Storage::Bucket(transfer) => {
            let path = format!("{BACKUP_MOUNT}/{artifact}");
            volumes.extend(pod::bucket_ca(transfer.target).map(|(volume, _)| volume));
            match purpose {
                Purpose::Restore => {
                    let archive = transfer.archive.then_some(RESTORE_ARCHIVE);
                    (Some(vec![transfer_container(&transfer, "download", &path, archive)]), engine)
                }
                _ => (Some(vec![engine]), transfer_container(&transfer, "upload", &path, None)),
            }
        }
    };
    let mut pod = PodSpec {
        restart_policy: Some("Never".into()),
        automount_service_account_token: Some(false),
        security_context: Some(pod::pod_security(run_as_user)),
        init_containers: init,
        containers: vec![main],
        volumes: Some(volumes),
        ..Default::default()
    };
    pull.pod(&mut pod);
    let spec = JobSpec {
        backoff_limit: Some(2),
        template: PodTemplateSpec {
            metadata: Some(ObjectMeta { labels: Some(pod_labels(&labels, db)), ..Default::default() }),
            spec: Some(pod),
        },
        ..Default::default()
    };
    // Backups outlive their Database (they are what restoreFrom reads); other Jobs do not.
    let mut metadata = metadata_with(db, name, purpose != Purpose::Backup, &labels);
    if !artifact.is_empty() {
        metadata.annotations.get_or_insert_default().insert(ARTIFACT.into(), artifact.into());
    }
    Child::new(name.to_string(), Job { metadata, spec: Some(spec), ..Default::default() })
}

/// The labels of a Job's pods: the Job's, with its Database named by [`JOB_OF`] instead
/// of the members' instance label.
fn pod_labels(job: &std::collections::BTreeMap<String, String>, db: &Database) -> std::collections::BTreeMap<String, String> {
    let mut labels = job.clone();
    labels.remove(crate::names::INSTANCE_LABEL);
    labels.insert(JOB_OF.into(), db.name_any());
    labels
}

/// Annotation on every backup and restore Job naming the backup it writes or reads.
pub const ARTIFACT: &str = "plugdb.io/backup";

/// The container that moves the artefact at `path` to (`upload`) or from (`download`)
/// the bucket. The access key reaches it from the user's Secret, and only it.
fn transfer_container(transfer: &Transfer<'_>, direction: &str, path: &str, archive: Option<&str>) -> Container {
    let mut mounts = vec![pod::mount("backups", BACKUP_MOUNT, false)];
    mounts.extend(pod::bucket_ca(transfer.target).map(|(_, mount)| mount));
    let mut command = vec![
        OPERATOR_BINARY.into(),
        "transfer".into(),
        direction.into(),
        "--artefact".into(),
        path.into(),
        "--key".into(),
        transfer.key.into(),
    ];
    if let Some(dir) = archive {
        command.extend(["--archive".into(), dir.into()]);
    }
    Container {
        name: direction.into(),
        image: Some(transfer.image.into()),
        command: Some(command),
        env: Some(pod::bucket_env(transfer.target)),
        volume_mounts: Some(mounts),
        security_context: Some(pod::container_security(None)),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::DatabaseSpec;
    use crate::plugin::{EnvSource, EnvVar as PlanEnv};

    fn database() -> Database {
        let spec: DatabaseSpec = serde_json::from_value(serde_json::json!({
            "engine": "postgres", "version": "17", "storage": "1Gi",
            "backup": {"schedule": "0 2 * * *", "s3": {
                "endpoint": "https://s3.example.com", "bucket": "backups", "prefix": "pg",
                "credentials": {"secretName": "s3"}, "ca": {"name": "s3-ca", "key": "ca.crt"}}},
        }))
        .expect("spec");
        let mut db = Database::new("orders", spec);
        db.metadata.namespace = Some("shop".into());
        db
    }

    fn plan() -> JobPlan {
        JobPlan {
            image: "postgres:17".into(),
            command: vec!["sh".into(), "-c".into(), "pg_basebackup".into()],
            env: vec![PlanEnv { name: "BACKUP_DIR".into(), source: EnvSource::Value("/backups".into()) }],
            mounts_data: false,
        }
    }

    fn pod_of(child: &Child) -> PodSpec {
        let job: Job = serde_json::from_value(child.object.clone()).expect("a valid Job");
        job.spec.and_then(|s| s.template.spec).expect("a pod")
    }

    /// A request of `purpose` for `plan` (as the engine's user 999, without the data).
    fn request<'a>(name: &'a str, purpose: Purpose, plan: &'a JobPlan, storage: Storage<'a>, artifact: &'a str) -> Request<'a> {
        Request { name, purpose, plan, storage, artifact, data: None, run_as_user: 999 }
    }

    /// A Job of `purpose` whose artefact `orders-1` is in the Database's bucket.
    fn in_bucket(db: &Database, name: &str, purpose: Purpose) -> Child {
        pulled(db, name, purpose, &Default::default())
    }

    /// [`in_bucket`], its images pulled as `pull` says.
    fn pulled(db: &Database, name: &str, purpose: Purpose, pull: &crate::images::Pull) -> Child {
        let target = db.spec.backup.as_ref().and_then(|b| b.s3.clone()).expect("target");
        let transfer = Transfer { target: &target, key: "pg/shop/orders/orders-1", image: "plugdb/plugdb:1", archive: false };
        job(db, &request(name, purpose, &plan(), Storage::Bucket(transfer), "orders-1"), pull)
    }

    #[test]
    fn every_container_of_a_job_is_pulled_from_the_mirror_with_the_secrets() {
        let pull = crate::images::Pull { registry: Some("mirror.example".into()), secrets: vec!["mirror-pull".into()] };
        let pod = pod_of(&pulled(&database(), "orders-1", Purpose::Backup, &pull));
        let images: Vec<&str> =
            pod.containers.iter().chain(pod.init_containers.iter().flatten()).filter_map(|c| c.image.as_deref()).collect();
        assert_eq!(images.len(), 2);
        assert!(images.iter().all(|i| i.starts_with("mirror.example/")), "{images:?}");
        let secrets: Vec<String> = pod.image_pull_secrets.unwrap_or_default().into_iter().map(|s| s.name).collect();
        assert_eq!(secrets, ["mirror-pull"]);
    }

    fn names(containers: &[Container]) -> Vec<&str> {
        containers.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn a_backup_to_a_bucket_uploads_after_the_engine_and_only_the_uploader_holds_the_key() {
        let db = database();
        let child = in_bucket(&db, "orders-1", Purpose::Backup);
        let pod = pod_of(&child);
        let init = pod.init_containers.clone().unwrap_or_default();
        assert_eq!(names(&init), ["backup"], "the engine's backup runs first, to completion");
        assert_eq!(names(&pod.containers), ["upload"]);
        let upload = &pod.containers[0];
        assert_eq!(upload.image.as_deref(), Some("plugdb/plugdb:1"));
        assert_eq!(
            upload.command.clone().unwrap_or_default(),
            [OPERATOR_BINARY, "transfer", "upload", "--artefact", "/backups/orders-1", "--key", "pg/shop/orders/orders-1"]
        );
        let keyed = |c: &Container| {
            c.env.iter().flatten().any(|e| e.value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref()).is_some_and(|s| s.name == "s3"))
        };
        assert!(keyed(upload), "the uploader reads the access key from the user's Secret");
        assert!(!keyed(&init[0]), "the plugin's container never sees it");
        let volumes = pod.volumes.unwrap_or_default();
        assert!(volumes.iter().any(|v| v.name == "backups" && v.empty_dir.is_some()), "scratch, no backup volume");
        assert!(volumes.iter().any(|v| v.secret.as_ref().is_some_and(|s| s.secret_name.as_deref() == Some("s3-ca"))));
        assert!(upload.env.iter().flatten().any(|e| e.name == crate::object_storage::ENV_CA_FILE));
    }

    #[test]
    fn a_restore_from_a_bucket_downloads_before_the_engine_and_a_volume_backup_is_one_container() {
        let db = database();
        let child = in_bucket(&db, "copy-restore", Purpose::Restore);
        let pod = pod_of(&child);
        assert_eq!(names(&pod.init_containers.clone().unwrap_or_default()), ["download"]);
        assert_eq!(names(&pod.containers), ["restore"]);
        assert_eq!(child.object["metadata"]["annotations"][ARTIFACT], "orders-1");

        let plan = plan();
        let child =
            job(&db, &request("orders-2", Purpose::Backup, &plan, Storage::Volume { of: "orders" }, "orders-2"), &Default::default());
        let pod = pod_of(&child);
        assert!(pod.init_containers.is_none());
        assert_eq!(names(&pod.containers), ["backup"]);
        let claim = pod.volumes.unwrap_or_default().into_iter().find_map(|v| v.persistent_volume_claim).expect("the backup volume");
        assert_eq!(claim.claim_name, "orders-backups");
    }

    #[test]
    fn a_restore_to_a_point_in_time_downloads_the_archive_too() {
        let db = database();
        let target = db.spec.backup.as_ref().and_then(|b| b.s3.clone()).expect("target");
        let transfer = Transfer { target: &target, key: "pg/shop/orders/orders-1", image: "plugdb/plugdb:1", archive: true };
        let plan = plan();
        let pod = pod_of(&job(
            &db,
            &request("copy-restore", Purpose::Restore, &plan, Storage::Bucket(transfer), "orders-1"),
            &Default::default(),
        ));
        let download = pod.init_containers.unwrap_or_default().remove(0);
        let command = download.command.unwrap_or_default();
        assert_eq!(command[command.len() - 2..], ["--archive".to_string(), RESTORE_ARCHIVE.to_string()]);
    }

    #[test]
    fn no_job_pod_is_selected_as_a_member() {
        let db = database();
        let members = crate::names::selector(&db);
        for purpose in [Purpose::Backup, Purpose::Restore, Purpose::Upgrade, Purpose::Scale] {
            let plan = plan();
            let child = job(&db, &request("orders-x", purpose, &plan, Storage::Scratch, ""), &Default::default());
            let job: Job = serde_json::from_value(child.object.clone()).expect("a valid Job");
            let labels = job.spec.and_then(|s| s.template.metadata).and_then(|m| m.labels).unwrap_or_default();
            assert!(
                !members.iter().all(|(k, v)| labels.get(k) == Some(v)),
                "{purpose:?}: its pods match the members' selector {members:?}"
            );
            assert_eq!(labels.get(JOB_OF).map(String::as_str), Some("orders"), "{purpose:?}");
        }
    }
}
