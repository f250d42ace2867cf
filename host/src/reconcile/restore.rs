//! `restoreFrom`: bootstrap a new Database from a backup of another. Plans that write
//! into the data volume run before the members exist; plans that load over the
//! network run once the new primary is up. Read only while the Database is new.

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;

use super::backups;
use super::bucket::{self, Opened};
use super::decide::{self, JobState};
use super::plan::Plan;
use super::{Context, Error};
use chrono::{DateTime, Utc};

use crate::build::Child;
use crate::crd::Database;
use crate::jobs::{self, Purpose, Storage, Transfer};
use crate::names::{BACKUP_MOUNT, Names, labels, metadata_with};
use crate::object_storage::{self, Listed, Segment};
use crate::plugin::{BackupLocation, Capability, EngineSpec, JobPlan, Plugin, Workload};

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

/// Name of the Job restoring member `ordinal` of `db` (member 0's: `<name>-restore`).
pub fn job_name(db: &Database, ordinal: u32) -> String {
    match ordinal {
        0 => Names(&db.name_any()).job("restore"),
        n => Names(&db.name_any()).job(&format!("restore-{n}")),
    }
}

/// The restore Jobs of `db` with their names, member 0's first. Member 0's is made
/// last, so there are none until every one exists.
fn restore_jobs(ctx: &Context, db: &Database, replicas: u32) -> Vec<(String, Arc<Job>)> {
    (0..replicas.max(1))
        .map_while(|ordinal| {
            let name = job_name(db, ordinal);
            ctx.caches.job(db, &name).map(|job| (name, job))
        })
        .collect()
}

/// How many members a restore of `db` writes: those with a restore Job (at least 1:
/// before its Jobs exist, and for a load over the network).
pub fn members_restored(ctx: &Context, db: &Database, replicas: u32) -> u32 {
    restore_jobs(ctx, db, replicas).len().max(1) as u32
}

/// Where a restore stands, from its Jobs alone: each with its name, state and whether
/// it writes a data volume (`None`: not started yet). Restores into data volumes hold
/// the members until every one is done; one over the network runs beside them.
pub fn progress(jobs: &[(String, JobState, bool)]) -> Option<Restore> {
    if jobs.is_empty() || jobs.iter().all(|(_, state, _)| *state == JobState::Missing) {
        return None;
    }
    if let Some((name, ..)) = jobs.iter().find(|(_, state, _)| *state == JobState::Failed) {
        return Some(Restore::Failed(format!("restore Job {name} failed; see its logs")));
    }
    if jobs.iter().all(|(_, state, _)| *state == JobState::Succeeded) {
        return Some(Restore::Done);
    }
    Some(if jobs.iter().any(|(_, _, writes_data)| *writes_data) { Restore::HoldMembers } else { Restore::Running })
}

/// The plans of the members that restore (member 0 first), from the plugin's answer for
/// every member: restored members come first, and a load over the network (member 0's)
/// is the only one.
pub fn restored_members(answers: Vec<Option<JobPlan>>) -> Result<Vec<JobPlan>, String> {
    let mut plans = Vec::new();
    let mut joins_from = None;
    for (ordinal, answer) in answers.into_iter().enumerate() {
        match (answer, joins_from) {
            (None, None) if ordinal == 0 => return Err("the plugin restores no member 0".into()),
            (None, None) => joins_from = Some(ordinal),
            (None, Some(_)) => {}
            (Some(_), Some(first)) => {
                return Err(format!("the plugin restores member {ordinal} but not member {first}: restored members must come first"));
            }
            (Some(plan), None) => plans.push(plan),
        }
    }
    if plans.len() > 1 && plans.iter().any(|p| !p.mounts_data) {
        return Err(
            "the plugin loads member 0 over the network and restores other members' volumes: a network load restores member 0 alone".into(),
        );
    }
    Ok(plans)
}

/// The bucket a restore of `db` starts from, read when the restore is `unfinished` and
/// its Jobs are not made yet (`None` otherwise).
pub(super) async fn observe(
    ctx: &Context,
    db: &Database,
    replicas: u32,
    unfinished: bool,
) -> Result<Option<Result<Opened, String>>, Error> {
    let Some((source, target)) = db.spec.restore_from.as_ref().and_then(|s| Some((s, s.s3.as_ref()?))).filter(|_| unfinished) else {
        return Ok(None);
    };
    let jobs: Vec<_> =
        restore_jobs(ctx, db, replicas).into_iter().map(|(name, job)| (name, backups::state(Some(job.as_ref())), false)).collect();
    if progress(&jobs).is_some() {
        return Ok(None);
    }
    let ns = db.namespace().unwrap_or_default();
    let layout_ns = source.namespace.as_deref().unwrap_or(&ns);
    Ok(Some(bucket::open(ctx, &ns, target, layout_ns, &source.database, "spec.restoreFrom.s3").await?))
}

/// Advances the restore of a new Database from what the pass observed (`bucket`, the
/// bucket it starts from: [`observe`]). `members_ready`: whether the cluster is up
/// (network restores wait for it).
pub(super) async fn reconcile(
    ctx: &Context,
    db: &Database,
    (plugin, spec, workload): (&Plugin, &EngineSpec, &Workload),
    bucket: Option<Result<Opened, String>>,
    members_ready: bool,
    plan: &mut Plan,
) -> Result<Restore, Error> {
    let Some(source) = &db.spec.restore_from else { return Ok(Restore::Done) };
    let ns = db.namespace().unwrap_or_default();
    let name = db.name_any();
    let jobs: Vec<(String, JobState, bool)> = restore_jobs(ctx, db, spec.replicas)
        .into_iter()
        .map(|(name, job)| (name, backups::state(Some(job.as_ref())), writes_data(&job)))
        .collect();
    if let Some(restore) = progress(&jobs) {
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
            let opened = match bucket {
                Some(Ok(opened)) => opened,
                Some(Err(problem)) => return Ok(Restore::Waiting(problem)),
                None => return Ok(Restore::Waiting(format!("spec.restoreFrom.s3: bucket {} was not looked at yet", target.bucket))),
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
        cluster: super::cluster(ctx, db, plugin, &Names(&name).pod(0)),
        archive_directory: point_in_time.map(|_| jobs::RESTORE_ARCHIVE.into()),
        point_in_time: point_in_time.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)),
    };
    let mut answers = Vec::new();
    for member in 0..spec.replicas.max(1) {
        let input = (spec.clone(), location.clone(), member);
        match ctx.ask::<crate::plugin::calls::Restore>(plugin, input).await {
            Ok(answer) => answers.push(answer),
            Err(Error::Plugin(e)) => return Ok(Restore::Failed(format!("spec.restoreFrom: {e}"))),
            Err(e) => return Err(e),
        }
    }
    let plans = match restored_members(answers) {
        Ok(plans) => plans,
        Err(e) => return Ok(Restore::Failed(format!("spec.restoreFrom: {e}"))),
    };
    let into_volumes = plans.iter().all(|p| p.mounts_data);
    if !into_volumes && !members_ready {
        return Ok(Restore::Running);
    }
    let storage = || match &transfer {
        Some((target, key, image)) => Storage::Bucket(Transfer { target, key: key.as_ref(), image, archive: point_in_time.is_some() }),
        None => Storage::Volume { of: &source.database },
    };
    for (ordinal, member) in plans.iter().enumerate().rev() {
        let claim = Names(&name).data_claim(ordinal as u32);
        if member.mounts_data {
            plan.make(data_claim(db, &claim));
        }
        let job_name = job_name(db, ordinal as u32);
        let request = jobs::Request {
            name: &job_name,
            purpose: Purpose::Restore,
            plan: member,
            storage: storage(),
            artifact: &backup,
            data: Some((&claim, &workload.data_mount_path)),
            run_as_user: workload.run_as_user,
        };
        plan.make(jobs::job(db, &request, &ctx.settings.pull));
    }
    Ok(if into_volumes { Restore::HoldMembers } else { Restore::Running })
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
            None => object_storage::newest(listed),
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
        Some(end) if end - decide::ARCHIVE_SLACK >= t => Choice::Backup(chosen.name.clone()),
        end => Choice::Wait(format!(
            "the archived log reaches {}, not yet pointInTime {}",
            end.map(|e| (e - decide::ARCHIVE_SLACK).to_rfc3339()).unwrap_or_else(|| "nothing".into()),
            t.to_rfc3339()
        )),
    }
}

/// The backup a restore read, as its Job records it (`database/backup`), for messages.
pub fn restored_from(ctx: &Context, db: &Database) -> String {
    let source = db.spec.restore_from.as_ref().map(|s| s.database.as_str()).unwrap_or_default();
    let job = ctx.caches.job(db, &job_name(db, 0));
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

/// A member's data claim, made ahead of the StatefulSet (which adopts it by name).
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
    fn restores_into_volumes_hold_the_members_until_every_one_is_done_and_one_over_the_network_runs_beside_them() {
        use JobState::*;
        let jobs = |rows: &[(JobState, bool)]| -> Vec<(String, JobState, bool)> {
            rows.iter().enumerate().map(|(i, (state, data))| (format!("orders-restore-{i}"), *state, *data)).collect()
        };
        let failed = |i: usize| Some(Restore::Failed(format!("restore Job orders-restore-{i} failed; see its logs")));
        type Row = (&'static [(JobState, bool)], Option<Restore>);
        let rows: &[Row] = &[
            (&[], None),
            (&[(Missing, true)], None),
            (&[(Running, true)], Some(Restore::HoldMembers)),
            (&[(Running, false)], Some(Restore::Running)),
            (&[(Succeeded, true)], Some(Restore::Done)),
            (&[(Succeeded, false)], Some(Restore::Done)),
            (&[(Failed, false)], failed(0)),
            // Every member's volume: done only when all are.
            (&[(Succeeded, true), (Running, true), (Succeeded, true)], Some(Restore::HoldMembers)),
            (&[(Succeeded, true), (Succeeded, true), (Succeeded, true)], Some(Restore::Done)),
            (&[(Running, true), (Failed, true), (Succeeded, true)], failed(1)),
        ];
        for (states, expected) in rows {
            assert_eq!(&progress(&jobs(states)), expected, "{states:?}");
        }
    }

    #[test]
    fn the_restored_members_come_first_and_a_network_load_restores_member_0_alone() {
        let plan = |mounts_data: bool| JobPlan { mounts_data, ..Default::default() };
        let count = |answers: Vec<Option<JobPlan>>| restored_members(answers).map(|p| p.len());
        assert_eq!(count(vec![Some(plan(true)), None, None]), Ok(1), "member 0 restored, the others join it");
        assert_eq!(count(vec![Some(plan(true)), Some(plan(true)), Some(plan(true))]), Ok(3), "every member restored");
        assert_eq!(count(vec![Some(plan(false)), None]), Ok(1), "member 0 loaded over the network");
        assert_eq!(count(vec![Some(plan(true)), Some(plan(true)), None]), Ok(2));
        let refused = |answers: Vec<Option<JobPlan>>, words: &str| {
            let e = restored_members(answers).expect_err("refused");
            assert!(e.contains(words), "{e}");
        };
        refused(vec![None, Some(plan(true))], "no member 0");
        refused(vec![Some(plan(true)), None, Some(plan(true))], "member 2 but not member 1");
        refused(vec![Some(plan(false)), Some(plan(true))], "network");
    }
}
