//! Backups: scheduled, on demand, before upgrades and before deletion; all Jobs under
//! deterministic names, so a restarted operator never runs one twice.

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::Job;
use kube::{Api, ResourceExt};

use super::plan::Plan;
use super::{Context, Error, bucket};
use crate::build;
use crate::crd::{BackupRecord, Database, Recoverable};
use crate::jobs::{self, BACKUP_OF, Purpose, Storage, Transfer};
use crate::names::{BACKUP_MOUNT, Names};
use crate::object_storage;
use crate::plugin::{BackupLocation, Capability, EngineSpec, Plugin};
use crate::schedule;

/// Annotation that asks for a backup now; each new value makes one backup.
pub const BACKUP_NOW: &str = "plugdb.io/backup-now";

use super::decide::JobState;

/// The state of `job`.
pub fn state(job: Option<&Job>) -> JobState {
    let Some(job) = job else { return JobState::Missing };
    let conditions = job.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    let has = |t: &str| conditions.iter().any(|c| c.type_ == t && c.status == "True");
    if has("Complete") {
        JobState::Succeeded
    } else if has("Failed") {
        JobState::Failed
    } else {
        JobState::Running
    }
}

/// The backup `name`: its Job's state, the Job (from the plugin's plan, with the backup
/// volume it needs) planned when there is none yet.
pub(super) async fn backup(
    ctx: &Context,
    db: &Database,
    (plugin, spec): (&Plugin, &EngineSpec),
    name: &str,
    run_as_user: u32,
    made: &mut Plan,
) -> Result<Result<JobState, String>, Error> {
    let ns = db.namespace().unwrap_or_default();
    if let Some(job) = ctx.caches.job(db, name) {
        return Ok(Ok(state(Some(&job))));
    }
    if let Some(why) = plugin.lacks(Capability::Backup) {
        return Ok(Err(why));
    }
    let primary = db.status.as_ref().and_then(|s| s.primary.clone()).unwrap_or_else(|| Names(&db.name_any()).pod(0));
    let location = BackupLocation {
        directory: BACKUP_MOUNT.into(),
        artifact: name.into(),
        host: format!("{}.{ns}.svc", Names(&db.name_any()).primary()),
        credentials_secret: Names(&db.name_any()).credentials(),
        cluster: build::cluster_context(db, &primary, super::archiver(ctx, db, plugin).is_some()),
        archive_directory: None,
        point_in_time: None,
    };
    let job_plan = match ctx.ask::<crate::plugin::calls::Backup>(plugin, (spec.clone(), location)).await {
        Ok(job_plan) => job_plan,
        Err(Error::Plugin(e)) => return Ok(Err(e.to_string())),
        Err(e) => return Err(e),
    };
    let (db_name, key);
    let storage = match db.spec.backup.as_ref().and_then(|b| b.s3.as_ref()) {
        Some(target) => {
            // The bucket must answer with this key before a Job is made to write to it.
            if let Err(problem) = bucket::open(ctx, &ns, target, &ns, &db.name_any(), "spec.backup.s3").await? {
                return Ok(Err(problem));
            }
            let Some(image) = ctx.operator_image.as_deref() else { return Ok(Err(NO_IMAGE.into())) };
            key = object_storage::backup_key(&target.prefix, &ns, &db.name_any(), name);
            Storage::Bucket(Transfer { target, key: key.as_ref(), image, archive: false })
        }
        None => {
            made.make(jobs::backup_claim(db));
            db_name = db.name_any();
            Storage::Volume { of: &db_name }
        }
    };
    let request = jobs::Request { name, purpose: Purpose::Backup, plan: &job_plan, storage, artifact: name, data: None, run_as_user };
    made.make(jobs::job(db, &request, &ctx.settings.pull));
    Ok(Ok(JobState::Running))
}

/// Why a backup to or restore from a bucket cannot run on this operator.
pub const NO_IMAGE: &str = "spec.backup.s3: this operator runs without its own image (--image or PLUGDB_IMAGE), which backup and restore Jobs run to reach the bucket";

/// What the backup pass found.
#[derive(Debug, Default)]
pub struct BackupReport {
    /// The most recent successful backup.
    pub last: Option<BackupRecord>,
    /// Next scheduled fire time.
    pub next: Option<DateTime<Utc>>,
    /// Why backups are unhealthy, if they are.
    pub problem: Option<String>,
    /// A backup Job is running.
    pub running: bool,
    /// The `backup-now` value acted on so far.
    pub request: Option<String>,
    /// The last scheduled backup started so far.
    pub scheduled: Option<String>,
    /// What a restore can reach.
    pub recoverable: Option<Recoverable>,
    /// Look again this soon (the archive grows between backups).
    pub recheck: Option<std::time::Duration>,
}

/// How often the window of a Database that archives its log is read again from the bucket.
pub const ARCHIVE_RECHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// A segment stored at `t` holds the log up to a little before `t` (the archiver looks
/// every few seconds): the moments a restore reaches end this much earlier.
pub const ARCHIVE_SLACK: chrono::TimeDelta = chrono::TimeDelta::seconds(10);

/// The window of complete backups completed at `times`.
fn window(times: impl IntoIterator<Item = String>) -> Recoverable {
    let mut times: Vec<String> = times.into_iter().collect();
    times.sort();
    Recoverable {
        backups: times.len() as i32,
        first: times.first().cloned(),
        last: times.last().cloned(),
        point_in_time: false,
        confirmed: None,
        unreachable_since: None,
    }
}

/// The window of the complete backups completed at `completed`, extended by an archive
/// whose newest segment was stored at `archived`: any moment from the oldest backup to
/// the archive's end.
pub fn window_with_archive(completed: &[DateTime<Utc>], archived: Option<DateTime<Utc>>) -> Recoverable {
    let mut window = window(completed.iter().map(|t| t.to_rfc3339()));
    let first = completed.iter().min();
    if let (Some(first), Some(at)) = (first, archived) {
        let end = (at - ARCHIVE_SLACK).max(*first);
        let last = completed.iter().max().copied().unwrap_or(end).max(end);
        window.last = Some(last.to_rfc3339());
        window.point_in_time = true;
    }
    window
}

fn completed(job: &Job) -> Option<String> {
    job.status.as_ref()?.completion_time.as_ref().map(|t| t.0.to_string())
}

/// The stamp of a scheduled backup's name (`orders-2611210200` → `2611210200`); stamps
/// order as their fire times do (a minute stamp is a prefix of its seconds stamps).
fn stamp(backup: &str) -> &str {
    backup.rsplit('-').next().unwrap_or_default()
}

/// The name of the on-demand backup (and its Job) of Database `database` that the
/// `plugdb.io/backup-now` value `token` asks for.
pub fn manual_backup(database: &str, token: &str) -> String {
    Names(database).job(&format!("manual-{}", &crate::plugin::hex_digest(token.as_bytes())[..10]))
}

/// Runs scheduled and on-demand backups, applies retention and reports. Each fire time
/// and each `backup-now` value makes one backup: what was already started is in the
/// Database's status (`last_scheduled_backup`, `backup_request`), not only in its Jobs,
/// which retention removes.
pub(super) async fn reconcile(
    ctx: &Context,
    db: &Database,
    (plugin, spec): (&Plugin, &EngineSpec),
    run_as_user: u32,
    plan: &mut Plan,
) -> Result<BackupReport, Error> {
    let previous = db.status.clone().unwrap_or_default();
    let mut report =
        BackupReport { request: previous.backup_request.clone(), scheduled: previous.last_scheduled_backup.clone(), ..Default::default() };
    let ns = db.namespace().unwrap_or_default();
    let name = db.name_any();
    let now = Utc::now();

    let mut wanted: Vec<String> = Vec::new();
    if let Some(b) = db.spec.backup.as_ref().filter(|b| b.enabled) {
        match schedule::parse(&b.schedule) {
            Ok(s) => {
                let created =
                    db.metadata.creation_timestamp.as_ref().and_then(|t| DateTime::from_timestamp(t.0.as_second(), 0)).unwrap_or(now);
                if let Some(at) = schedule::due(&s, created, now) {
                    let due = schedule::backup_name(&name, at);
                    if report.scheduled.as_deref().is_none_or(|last| stamp(last) < stamp(&due)) {
                        wanted.push(due);
                    }
                }
                report.next = schedule::next(&s, now);
            }
            Err(e) => report.problem = Some(format!("spec.backup.schedule: {e}")),
        }
    }
    let manual = |token: &str| manual_backup(&name, token);
    let request = db.annotations().get(BACKUP_NOW).filter(|t| report.request.as_ref() != Some(*t)).cloned();
    if let Some(token) = &request {
        wanted.push(manual(token));
    }

    // A plugin that does not declare backups is not asked for one: the condition says so
    // as soon as backups are configured or requested.
    if (!wanted.is_empty() || db.spec.backup.as_ref().is_some_and(|b| b.enabled))
        && let Some(why) = plugin.lacks(Capability::Backup)
    {
        report.problem = Some(format!("spec.backup: {why}"));
        wanted.clear();
    }
    let mut backups = ctx.caches.jobs_labelled(db, BACKUP_OF, &name);
    for job_name in &wanted {
        if !backups.iter().any(|j| j.name_any() == *job_name) {
            if let Err(reason) = backup(ctx, db, (plugin, spec), job_name, run_as_user, plan).await? {
                report.problem = Some(format!("the {} plugin cannot back up: {reason}", spec.name));
                continue;
            }
            report.running = true;
        }
        match &request {
            Some(token) if manual(token) == *job_name => report.request = Some(token.clone()),
            _ => report.scheduled = Some(job_name.clone()),
        }
    }

    backups.sort_by_key(|j| std::cmp::Reverse(completed(j).unwrap_or_default()));
    let succeeded: Vec<&Job> = backups.iter().map(|j| j.as_ref()).filter(|j| state(Some(j)) == JobState::Succeeded).collect();
    report.last = succeeded.first().map(|j| BackupRecord { name: j.name_any(), completed: completed(j) });
    report.running |= backups.iter().any(|j| state(Some(j)) == JobState::Running);
    if let Some(failed) =
        backups.iter().filter(|j| state(Some(j)) == JobState::Failed).max_by_key(|j| j.metadata.creation_timestamp.clone())
        && failed.metadata.creation_timestamp > succeeded.first().and_then(|j| j.metadata.creation_timestamp.clone())
    {
        let said = format!("backup {} failed", failed.name_any());
        // The cause is read once, when the failure is first seen; the status keeps it.
        let known =
            previous.conditions.iter().find(|c| c.type_ == super::status::ConditionType::BackupHealthy.as_str()).map(|c| &c.message);
        let problem = match known.filter(|m| m.starts_with(&said)) {
            Some(known) => known.clone(),
            None => match failure_cause(ctx, &ns, &failed.name_any()).await {
                Some(cause) => format!("{said}: {cause}"),
                None => said,
            },
        };
        report.problem.get_or_insert(problem);
    }

    // Retention counts every successful backup Job. In a bucket it acts on the artefacts
    // too, each time a new backup completed: the newest `retention` complete ones stay,
    // with any still being written.
    let retention = db.spec.backup.as_ref().map(|b| b.retention.max(1) as usize).unwrap_or(usize::MAX);
    for old in succeeded.iter().skip(retention) {
        plan.remove_job(old.name_any());
    }
    let completed_now = report.last.as_ref().is_some_and(|last| previous.last_backup.as_ref().map(|b| &b.name) != Some(&last.name));
    let s3 = db.spec.backup.as_ref().and_then(|b| b.s3.as_ref());
    report.recoverable = match s3 {
        // The bucket is read when a backup completes; between, the last reading stands.
        // A reading that failed leaves it unknown, so the next pass reads (and prunes) again.
        Some(_) => previous.recoverable.clone(),
        None if succeeded.is_empty() && db.spec.backup.is_none() => None,
        None => Some(window(succeeded.iter().take(retention).filter_map(|j| completed(j)))),
    };
    let archiving = super::archiver(ctx, db, plugin).is_some();
    if archiving {
        report.recheck = Some(ARCHIVE_RECHECK);
    }
    // With an archive, the window's end moves between backups: read again once it is
    // older than a recheck.
    let stale = archiving
        && previous.recoverable.as_ref().and_then(|r| r.last.as_deref()).and_then(|t| DateTime::parse_from_rfc3339(t).ok()).is_none_or(
            |last| now - last.with_timezone(&Utc) > chrono::TimeDelta::from_std(ARCHIVE_RECHECK).unwrap_or_default() + ARCHIVE_SLACK,
        );
    // The bucket confirms the window at least every `bucket_recheck`, and on every pass
    // while it cannot be read.
    let reconfirm = ctx.settings.bucket_recheck;
    let confirmed = previous.recoverable.as_ref().and_then(|r| r.confirmed.as_deref()).and_then(|t| DateTime::parse_from_rfc3339(t).ok());
    let due = confirmed.map(|t| t.with_timezone(&Utc) + chrono::TimeDelta::from_std(reconfirm).unwrap_or_default());
    let unconfirmed = due.is_none_or(|due| due <= now) || previous.recoverable.as_ref().is_some_and(|r| r.unreachable_since.is_some());
    if s3.is_some() {
        let until_due = due.and_then(|due| (due - now).to_std().ok()).unwrap_or(reconfirm);
        report.recheck = Some(report.recheck.map_or(until_due, |r| r.min(until_due)));
    }
    if let Some(target) = s3
        && (completed_now || previous.recoverable.is_none() || stale || unconfirmed)
    {
        let mut running: Vec<String> = backups.iter().filter(|j| state(Some(j)) == JobState::Running).map(|j| j.name_any()).collect();
        running.extend(wanted);
        match bucket::open(ctx, &ns, target, &ns, &name, "spec.backup.s3").await? {
            Ok(opened) => match bucket::to_remove(&opened, retention, &running).await {
                Ok(removal) => {
                    let kept: Vec<DateTime<Utc>> =
                        opened.listed.iter().filter(|b| !removal.backups.contains(&b.name)).filter_map(|b| b.completed).collect();
                    let archived = opened.archive.iter().map(|s| s.at).max().filter(|_| archiving);
                    let stamp = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                    report.recoverable = Some(Recoverable { confirmed: Some(stamp), ..window_with_archive(&kept, archived) });
                    if removal.backups.is_empty() && removal.segments.is_empty() {
                        return Ok(report);
                    }
                    let incomplete = |name: &String| opened.listed.iter().any(|b| &b.name == name && b.completed.is_none());
                    let (unfinished, old): (Vec<String>, Vec<String>) = removal.backups.iter().cloned().partition(incomplete);
                    let listed = |names: &[String]| if names.is_empty() { "none".to_string() } else { names.join(", ") };
                    let message = format!(
                        "removed from bucket {}: {} backup(s) beyond the newest {retention} ({}); {} incomplete one(s) no Job writes any more ({}); and {} archived log segment(s) no kept backup replays",
                        target.bucket,
                        old.len(),
                        listed(&old),
                        unfinished.len(),
                        listed(&unfinished),
                        removal.segments.len()
                    );
                    plan.prune(opened, removal, message);
                }
                Err(e) => {
                    report.problem = Some(format!("spec.backup.s3: retention: {e}"));
                    report.recoverable = bucket::unreachable(previous.recoverable.as_ref(), now);
                }
            },
            Err(problem) => {
                report.problem = Some(problem);
                report.recoverable = bucket::unreachable(previous.recoverable.as_ref(), now);
            }
        }
    }
    Ok(report)
}

/// The longest cause of a failed Job the status and its Event quote.
const MAX_CAUSE: usize = 400;

/// Why Job `name` failed, in its failed container's own words: the end of its
/// termination message (its log's last lines: Jobs' containers fall back to them), on one
/// line, control characters escaped and bounded. `None` when no pod says.
async fn failure_cause(ctx: &Context, ns: &str, name: &str) -> Option<String> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(ctx.client.clone(), ns);
    let listed = pods.list(&kube::api::ListParams::default().labels(&format!("batch.kubernetes.io/job-name={name}"))).await.ok()?;
    let mut pods = listed.items;
    pods.sort_by_key(|p| std::cmp::Reverse(p.metadata.creation_timestamp.clone()));
    let status = pods.iter().filter_map(|p| p.status.as_ref()).find_map(|s| {
        s.init_container_statuses.iter().flatten().chain(s.container_statuses.iter().flatten()).find_map(|c| {
            let t = c.state.as_ref()?.terminated.as_ref()?;
            (t.exit_code != 0).then(|| (c.name.clone(), t.exit_code, t.message.clone().or(t.reason.clone()).unwrap_or_default()))
        })
    })?;
    let (container, code, message) = status;
    let lines: Vec<&str> = message.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let mut tail = String::new();
    for line in lines.iter().rev() {
        if tail.len() + line.len() > MAX_CAUSE {
            break;
        }
        tail = if tail.is_empty() { line.to_string() } else { format!("{line} | {tail}") };
    }
    if tail.is_empty() {
        tail = crate::said::cut(lines.last().copied().unwrap_or_default(), MAX_CAUSE).to_string();
    }
    Some(crate::said::escaped(&format!("container {container} exited {code}: {tail}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_runs_from_the_oldest_to_the_newest_complete_backup() {
        let times = ["2026-11-23T10:00:00Z", "2026-11-21T10:00:00Z", "2026-11-22T10:00:00Z"].map(String::from);
        let w = window(times);
        assert_eq!((w.backups, w.first.as_deref(), w.last.as_deref()), (3, Some("2026-11-21T10:00:00Z"), Some("2026-11-23T10:00:00Z")));
        assert_eq!(
            window(Vec::new()),
            Recoverable { backups: 0, first: None, last: None, point_in_time: false, confirmed: None, unreachable_since: None }
        );
    }

    #[test]
    fn an_archive_extends_the_window_past_the_newest_backup() {
        let at = |t: &str| DateTime::parse_from_rfc3339(t).expect("time").with_timezone(&Utc);
        let backups = [at("2026-11-22T10:00:00Z"), at("2026-11-23T10:00:00Z")];
        let rows = [
            // No archive: only the backups' own moments.
            (None, "2026-11-23T10:00:00+00:00", false),
            // The archive's end, less the slack of its newest segment.
            (Some("2026-11-23T12:00:10Z"), "2026-11-23T12:00:00+00:00", true),
            // An archive older than the newest backup does not shorten the window.
            (Some("2026-11-23T09:00:00Z"), "2026-11-23T10:00:00+00:00", true),
        ];
        for (archived, last, continuous) in rows {
            let w = window_with_archive(&backups, archived.map(at));
            assert_eq!((w.backups, w.first.as_deref()), (2, Some("2026-11-22T10:00:00+00:00")), "{archived:?}");
            assert_eq!((w.last.as_deref(), w.point_in_time), (Some(last), continuous), "{archived:?}");
        }
        assert!(!window_with_archive(&[], Some(at("2026-11-23T12:00:00Z"))).point_in_time, "no backup: nothing to replay from");
    }
}
