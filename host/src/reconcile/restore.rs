//! `restoreFrom`: bootstrap a new Database from a backup of another. Plans that write
//! into the data volume run before the members exist; plans that load over the
//! network run once the new primary is up. Read only while the Database is new.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;

use super::backups::{self, JobState};
use super::{Context, Error, apply, bucket};
use chrono::{DateTime, Utc};

use crate::build::{self, BACKUP_MOUNT, Child, Names, labels, metadata_with};
use crate::crd::Database;
use crate::jobs::{self, Purpose, Storage, Transfer};
use crate::objects::{self, Listed, Segment};
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
    let point_in_time = match source.point_in_time.as_deref().map(parse_moment).transpose() {
        Ok(t) => t,
        Err(problem) => return Ok(Restore::Failed(problem)),
    };
    if point_in_time.is_some()
        && let Some(why) = plugin.lacks(Capability::PointInTime)
    {
        return Ok(Restore::Failed(format!("spec.restoreFrom.pointInTime: {why}")));
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
            let what = format!("{layout_ns}/{} in bucket {} (under {}/)", source.database, target.bucket, opened.database);
            let chosen = match choose(&opened.listed, &opened.archive, source.backup.as_deref(), point_in_time) {
                Choice::Backup(name) => name,
                Choice::Wait(why) => return Ok(Restore::Waiting(format!("spec.restoreFrom: {why} of {what}"))),
                Choice::Refuse(why) => return Ok(Restore::Failed(format!("spec.restoreFrom: {why} of {what}"))),
            };
            let Some(image) = ctx.operator_image.clone() else { return Ok(Restore::Failed(backups::NO_IMAGE.into())) };
            let key = opened.database.clone().join(chosen.as_str());
            (chosen, Some((target, key, image)))
        }
    };
    let location = BackupLocation {
        directory: BACKUP_MOUNT.into(),
        artifact: backup.clone(),
        host: format!("{}.{ns}.svc", Names(&name).primary()),
        credentials_secret: Names(&name).credentials(),
        cluster: build::cluster_context(db, &Names(&name).pod(0), super::archiver(ctx, db, plugin).is_some()),
        archive_directory: point_in_time.map(|_| jobs::RESTORE_ARCHIVE.into()),
        point_in_time: point_in_time.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)),
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
        Some((target, key, image)) => Storage::Bucket(Transfer { target, key: key.as_ref(), image, archive: point_in_time.is_some() }),
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

/// `spec.restoreFrom.pointInTime` as a moment.
fn parse_moment(text: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("spec.restoreFrom.pointInTime: {text:?} is not an RFC 3339 time such as 2026-11-23T10:15:30Z ({e})"))
}

/// What a restore from a bucket starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// This backup.
    Backup(String),
    /// Nothing fits yet, but may (a backup or the archive still to come); why.
    Wait(String),
    /// Nothing ever will; why.
    Refuse(String),
}

/// The backup to restore from `listed`: the one named, or the newest complete one; to
/// a point in time, the newest completed at or before it, with `archive` reaching past it.
pub fn choose(listed: &[Listed], archive: &[Segment], named: Option<&str>, point_in_time: Option<DateTime<Utc>>) -> Choice {
    let complete = || listed.iter().filter(|b| b.completed.is_some());
    let chosen = match named {
        Some(name) => complete().find(|b| b.name == name),
        None => match point_in_time {
            Some(t) => complete().filter(|b| b.completed.is_some_and(|c| c <= t)).max_by_key(|b| b.completed),
            None => objects::newest(listed),
        },
    };
    let Some(chosen) = chosen else {
        let earliest = complete().filter_map(|b| b.completed).min();
        return match (named, point_in_time, earliest) {
            (None, Some(t), Some(earliest)) => {
                Choice::Refuse(format!("no backup completed by {} (the earliest completed at {})", t.to_rfc3339(), earliest.to_rfc3339()))
            }
            (Some(name), _, _) => Choice::Wait(format!("no complete backup {name}")),
            (None, _, _) => Choice::Wait("no complete backup".into()),
        };
    };
    let Some(t) = point_in_time else { return Choice::Backup(chosen.name.clone()) };
    if chosen.completed.is_some_and(|c| c > t) {
        return Choice::Refuse(format!(
            "backup {} completed at {}, after pointInTime {}",
            chosen.name,
            chosen.completed.map(|c| c.to_rfc3339()).unwrap_or_default(),
            t.to_rfc3339()
        ));
    }
    match archive.iter().map(|s| s.at).max() {
        Some(end) if end - backups::ARCHIVE_SLACK >= t => Choice::Backup(chosen.name.clone()),
        end => Choice::Wait(format!(
            "the archived log reaches {}, not yet pointInTime {}",
            end.map(|e| (e - backups::ARCHIVE_SLACK).to_rfc3339()).unwrap_or_else(|| "nothing".into()),
            t.to_rfc3339()
        )),
    }
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
    fn a_restore_takes_the_newest_backup_before_its_moment_and_waits_for_the_archive_to_pass_it() {
        let at = |minute: u32| DateTime::parse_from_rfc3339(&format!("2026-11-23T10:{minute:02}:00Z")).expect("time").with_timezone(&Utc);
        let backup = |name: &str, completed: Option<u32>| Listed { name: name.into(), completed: completed.map(at), last_write: at(0) };
        let listed = [backup("b10", Some(10)), backup("b20", Some(20)), backup("b30", Some(30)), backup("b40", None)];
        let archive = [Segment { name: "0001".into(), at: at(35) }];
        let backup_named = |name: &str| Choice::Backup(name.into());
        let refused = |c: &Choice| matches!(c, Choice::Refuse(_));
        let waits = |c: &Choice| matches!(c, Choice::Wait(_));
        // Without a moment: the newest complete, or the one named.
        assert_eq!(choose(&listed, &[], None, None), backup_named("b30"));
        assert_eq!(choose(&listed, &[], Some("b10"), None), backup_named("b10"));
        assert!(waits(&choose(&listed, &[], Some("b40"), None)), "an incomplete backup is never restored");
        // To a moment: the newest completed by then, the archive reaching past it.
        assert_eq!(choose(&listed, &archive, None, Some(at(25))), backup_named("b20"));
        assert_eq!(choose(&listed, &archive, None, Some(at(20))), backup_named("b20"));
        assert_eq!(choose(&listed, &archive, Some("b10"), Some(at(25))), backup_named("b10"));
        assert!(refused(&choose(&listed, &archive, Some("b30"), Some(at(25)))), "a backup after the moment cannot reach it");
        assert!(refused(&choose(&listed, &archive, None, Some(at(5)))), "before the first backup");
        assert!(
            waits(&choose(&listed, &archive, None, Some(at(35) - chrono::TimeDelta::seconds(5)))),
            "the archive's newest segment holds the log up to a little before it"
        );
        assert!(waits(&choose(&listed, &[], None, Some(at(25)))), "no archive yet");
        assert!(waits(&choose(&[], &archive, None, Some(at(25)))), "no backup yet");
    }

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
