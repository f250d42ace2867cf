//! Backups, decided: which backups are wanted (each fire time and each `backup-now`
//! value once), which Jobs retention removes, what the status says of them, and whether
//! the bucket is read this pass. Starting a backup (the plugin's plan, the bucket
//! answering) and reading the bucket are carried out around it, in `backups`.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::JobState;
use crate::crd::{BackupRecord, BackupSpec, DatabaseStatus, Recoverable};
use crate::names::Names;
use crate::schedule;

/// How often the window of a Database that archives its log is read again from the bucket.
pub const ARCHIVE_RECHECK: Duration = Duration::from_secs(30);

/// A segment stored at `t` holds the log up to a little before `t` (the archiver looks
/// every few seconds): the moments a restore reaches end this much earlier.
pub const ARCHIVE_SLACK: chrono::TimeDelta = chrono::TimeDelta::seconds(10);

/// One of the Database's backup Jobs, as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupJob {
    /// Its name, which is the backup's.
    pub name: String,
    /// How it is doing.
    pub state: JobState,
    /// When it was made (seconds since the epoch).
    pub created: Option<i64>,
    /// When it completed (RFC 3339).
    pub completed: Option<String>,
}

/// What the backup decision looks at.
#[derive(Debug, Clone)]
pub struct BackupFacts<'a> {
    /// The Database's name.
    pub database: &'a str,
    /// Its `spec.backup`.
    pub spec: Option<&'a BackupSpec>,
    /// When it was made: no fire time before it is backed up.
    pub created: DateTime<Utc>,
    /// Now.
    pub now: DateTime<Utc>,
    /// The `plugdb.io/backup-now` value on it.
    pub asked: Option<&'a str>,
    /// Its status as the pass found it.
    pub previous: &'a DatabaseStatus,
    /// Why its engine's plugin cannot back up, when it cannot.
    pub cannot: Option<&'a str>,
    /// Its backup Jobs.
    pub jobs: Vec<BackupJob>,
    /// Whether its members archive their log to the bucket.
    pub archiving: bool,
    /// How often the bucket confirms what a restore can reach.
    pub bucket_recheck: Duration,
}

/// A backup wanted this pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// Its name (and its Job's).
    pub name: String,
    /// Its Job is there already.
    pub exists: bool,
    /// The `backup-now` value that asks for it; none for a fire time.
    pub request: Option<String>,
}

/// A failed backup newer than the newest that succeeded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedBackup {
    /// Its name.
    pub name: String,
    /// What the status already says of it (read once, when first seen).
    pub known: Option<String>,
}

impl FailedBackup {
    /// The problem it is, without its cause.
    pub fn said(&self) -> String {
        format!("backup {} failed", self.name)
    }
}

/// The bucket, read this pass: what a restore can reach, and what retention prunes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketRead {
    /// The newest complete backups kept.
    pub retention: usize,
    /// Backups being written (or about to be), which stay however incomplete.
    pub running: Vec<String>,
    /// The members archive their log there: the window runs to the archive's end.
    pub archive: bool,
}

/// What the backup pass found.
#[derive(Debug, Default, Clone, PartialEq)]
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
    pub recheck: Option<Duration>,
}

impl BackupReport {
    /// `wanted` is under way: its fire time or its request is not asked for again.
    pub fn acted_on(&mut self, wanted: &Wanted) {
        match &wanted.request {
            Some(token) => self.request = Some(token.clone()),
            None => self.scheduled = Some(wanted.name.clone()),
        }
    }
}

/// What the backup decision chose.
#[derive(Debug, Clone, PartialEq)]
pub struct Backups {
    /// The backups wanted, in order: the fire time due, then the request.
    pub wanted: Vec<Wanted>,
    /// What the status says, before any is started and before the bucket is read.
    pub report: BackupReport,
    /// A failure whose cause the status should name (unless a problem above does).
    pub failed: Option<FailedBackup>,
    /// The successful backup Jobs beyond retention.
    pub remove: Vec<String>,
    /// The bucket, when it is read this pass.
    pub bucket: Option<BucketRead>,
}

/// The name of the on-demand backup (and its Job) of Database `database` that the
/// `plugdb.io/backup-now` value `token` asks for.
pub fn manual_backup(database: &str, token: &str) -> String {
    Names(database).job(&format!("manual-{}", &crate::plugin::hex_digest(token.as_bytes())[..10]))
}

/// The stamp of a scheduled backup's name (`orders-2611210200` → `2611210200`); stamps
/// order as their fire times do (a minute stamp is a prefix of its seconds stamps).
fn stamp(backup: &str) -> &str {
    backup.rsplit('-').next().unwrap_or_default()
}

/// The window of complete backups completed at `times`.
pub fn window(times: impl IntoIterator<Item = String>) -> Recoverable {
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

fn parsed(t: Option<&str>) -> Option<DateTime<Utc>> {
    t.and_then(|t| DateTime::parse_from_rfc3339(t).ok()).map(|t| t.with_timezone(&Utc))
}

/// Each fire time and each `backup-now` value makes one backup: what was already started
/// is in the status (`last_scheduled_backup`, `backup_request`), not only in the Jobs,
/// which retention removes. Retention counts every successful backup Job; in a bucket it
/// acts on the artefacts too, read when a backup completed, when the window is unknown,
/// stale (an archive's end moves) or unconfirmed for `bucket_recheck`, and on every pass
/// while the bucket cannot be read.
pub fn backups(facts: BackupFacts<'_>) -> Backups {
    let (previous, now) = (facts.previous, facts.now);
    let mut report =
        BackupReport { request: previous.backup_request.clone(), scheduled: previous.last_scheduled_backup.clone(), ..Default::default() };
    let enabled = facts.spec.filter(|b| b.enabled);
    let mut wanted = Vec::new();
    if let Some(b) = enabled {
        match schedule::parse(&b.schedule) {
            Ok(s) => {
                let due = schedule::due(&s, facts.created, now).map(|at| schedule::backup_name(facts.database, at));
                if let Some(due) = due.filter(|due| report.scheduled.as_deref().is_none_or(|last| stamp(last) < stamp(due))) {
                    wanted.push(Wanted { name: due, exists: false, request: None });
                }
                report.next = schedule::next(&s, now);
            }
            Err(e) => report.problem = Some(format!("spec.backup.schedule: {e}")),
        }
    }
    if let Some(token) = facts.asked.filter(|t| report.request.as_deref() != Some(*t)) {
        wanted.push(Wanted { name: manual_backup(facts.database, token), exists: false, request: Some(token.to_string()) });
    }
    // A plugin that does not declare backups is not asked for one: the condition says so
    // as soon as backups are configured or requested.
    if let Some(why) = facts.cannot.filter(|_| !wanted.is_empty() || enabled.is_some()) {
        report.problem = Some(format!("spec.backup: {why}"));
        wanted.clear();
    }
    let mut jobs = facts.jobs;
    for w in &mut wanted {
        w.exists = jobs.iter().any(|j| j.name == w.name);
    }

    jobs.sort_by_key(|j| std::cmp::Reverse(j.completed.clone().unwrap_or_default()));
    let succeeded: Vec<&BackupJob> = jobs.iter().filter(|j| j.state == JobState::Succeeded).collect();
    report.last = succeeded.first().map(|j| BackupRecord { name: j.name.clone(), completed: j.completed.clone() });
    report.running = jobs.iter().any(|j| j.state == JobState::Running);
    let newest_success = succeeded.first().and_then(|j| j.created);
    let failed =
        jobs.iter().filter(|j| j.state == JobState::Failed).max_by_key(|j| j.created).filter(|j| j.created > newest_success).map(|j| {
            let mut failed = FailedBackup { name: j.name.clone(), known: None };
            let said = failed.said();
            let known = previous.conditions.iter().find(|c| c.type_ == super::ConditionType::BackupHealthy.as_str());
            failed.known = known.map(|c| c.message.clone()).filter(|m| m.starts_with(&said));
            failed
        });

    let retention = facts.spec.map(|b| b.retention.max(1) as usize).unwrap_or(usize::MAX);
    let remove = succeeded.iter().skip(retention).map(|j| j.name.clone()).collect();
    let s3 = facts.spec.is_some_and(|b| b.s3.is_some());
    report.recoverable = match s3 {
        // The bucket is read when a backup completes; between, the last reading stands.
        // A reading that failed leaves it unknown, so the next pass reads (and prunes) again.
        true => previous.recoverable.clone(),
        false if succeeded.is_empty() && facts.spec.is_none() => None,
        false => Some(window(succeeded.iter().take(retention).filter_map(|j| j.completed.clone()))),
    };
    if facts.archiving {
        report.recheck = Some(ARCHIVE_RECHECK);
    }
    let kept = previous.recoverable.as_ref();
    let completed_now = report.last.as_ref().is_some_and(|last| previous.last_backup.as_ref().map(|b| &b.name) != Some(&last.name));
    // With an archive, the window's end moves between backups: read again once it is
    // older than a recheck.
    let stale = facts.archiving
        && parsed(kept.and_then(|r| r.last.as_deref()))
            .is_none_or(|last| now - last > chrono::TimeDelta::from_std(ARCHIVE_RECHECK).unwrap_or_default() + ARCHIVE_SLACK);
    let reconfirm = chrono::TimeDelta::from_std(facts.bucket_recheck).unwrap_or_default();
    let due = parsed(kept.and_then(|r| r.confirmed.as_deref())).map(|t| t + reconfirm);
    let unconfirmed = due.is_none_or(|due| due <= now) || kept.is_some_and(|r| r.unreachable_since.is_some());
    let mut bucket = None;
    if s3 {
        let read = completed_now || kept.is_none() || stale || unconfirmed;
        if read {
            let running = jobs.iter().filter(|j| j.state == JobState::Running).map(|j| j.name.clone());
            let running = running.chain(wanted.iter().map(|w| w.name.clone())).collect();
            bucket = Some(BucketRead { retention, running, archive: facts.archiving });
        }
        // Read now, the bucket is confirmed again a whole interval on.
        let until_due = due.filter(|_| !read).and_then(|due| (due - now).to_std().ok()).unwrap_or(facts.bucket_recheck);
        report.recheck = Some(report.recheck.map_or(until_due, |r| r.min(until_due)));
    }
    Backups { wanted, report, failed, remove, bucket }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::S3Target;
    use crate::reconcile::status::{self, ConditionType, Reason};

    fn at(t: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(t).expect("time").with_timezone(&Utc)
    }

    fn spec(schedule: &str, retention: i32, s3: bool) -> BackupSpec {
        let s3 = s3.then(|| {
            serde_json::from_value::<S3Target>(
                serde_json::json!({"endpoint": "https://s3.example", "bucket": "b", "credentials": {"secretName": "s3"}}),
            )
            .expect("s3")
        });
        BackupSpec { enabled: true, schedule: schedule.into(), retention, storage: None, s3 }
    }

    fn job(name: &str, state: JobState, created: i64, completed: Option<&str>) -> BackupJob {
        BackupJob { name: name.into(), state, created: Some(created), completed: completed.map(String::from) }
    }

    fn facts<'a>(spec: Option<&'a BackupSpec>, previous: &'a DatabaseStatus, jobs: Vec<BackupJob>) -> BackupFacts<'a> {
        BackupFacts {
            database: "orders",
            spec,
            created: at("2026-11-20T00:00:00Z"),
            now: at("2026-11-23T02:30:00Z"),
            asked: None,
            previous,
            cannot: None,
            jobs,
            archiving: false,
            bucket_recheck: Duration::from_secs(3600),
        }
    }

    fn names(wanted: &[Wanted]) -> Vec<(&str, bool)> {
        wanted.iter().map(|w| (w.name.as_str(), w.exists)).collect()
    }

    #[test]
    fn each_fire_time_and_each_request_makes_one_backup() {
        let daily = spec("0 2 * * *", 3, false);
        let due = schedule::backup_name("orders", at("2026-11-23T02:00:00Z"));
        let manual = manual_backup("orders", "now-1");
        let (due, manual) = (due.as_str(), manual.as_str());
        let started = |scheduled: Option<&str>, request: Option<&str>| DatabaseStatus {
            last_scheduled_backup: scheduled.map(String::from),
            backup_request: request.map(String::from),
            ..Default::default()
        };
        let rows = [
            // The fire time due, never started: wanted.
            (started(None, None), None, vec![], vec![(due, false)]),
            // Started once (its Job since removed by retention): never again.
            (started(Some(due), None), None, vec![], vec![]),
            // An earlier fire time started: the due one is newer.
            (started(Some("orders-2611220200"), None), None, vec![], vec![(due, false)]),
            // A new request beside it, its Job already made by a pass that did not finish.
            (started(Some(due), None), Some("now-1"), vec![job(manual, JobState::Running, 1, None)], vec![(manual, true)]),
            // The request already acted on.
            (started(Some(due), Some("now-1")), Some("now-1"), vec![], vec![]),
        ];
        for (previous, asked, jobs, want) in rows {
            let decided = backups(BackupFacts { asked, ..facts(Some(&daily), &previous, jobs) });
            assert_eq!(names(&decided.wanted), want, "{previous:?} {asked:?}");
            assert_eq!(decided.report.next, Some(at("2026-11-24T02:00:00Z")));
            let mut report = decided.report.clone();
            for w in &decided.wanted {
                report.acted_on(w);
            }
            assert_eq!(report.scheduled.as_deref(), Some(due), "a started fire time is recorded");
            assert_eq!(report.request.as_deref(), asked, "a request acted on is recorded");
        }
    }

    #[test]
    fn a_plugin_that_cannot_back_up_or_a_schedule_that_does_not_parse_is_the_problem() {
        let previous = DatabaseStatus::default();
        let daily = spec("0 2 * * *", 3, false);
        let cannot =
            backups(BackupFacts { cannot: Some("no backup capability"), asked: Some("x"), ..facts(Some(&daily), &previous, vec![]) });
        assert_eq!((cannot.wanted.len(), cannot.report.problem.as_deref()), (0, Some("spec.backup: no backup capability")));
        // Nothing configured nor asked: nothing to say.
        let quiet = backups(BackupFacts { cannot: Some("no backup capability"), ..facts(None, &previous, vec![]) });
        assert_eq!((quiet.report.problem, quiet.report.recoverable), (None, None));
        let bad = spec("61 * * * *", 3, false);
        let unparsed = backups(facts(Some(&bad), &previous, vec![]));
        assert!(unparsed.report.problem.as_deref().is_some_and(|p| p.starts_with("spec.backup.schedule: ")), "{:?}", unparsed.report);
        assert!(unparsed.wanted.is_empty());
    }

    #[test]
    fn retention_keeps_the_newest_successes_and_the_window_is_theirs() {
        let previous = DatabaseStatus::default();
        let two = spec("0 2 * * *", 2, false);
        let jobs = vec![
            job("orders-2611210200", JobState::Succeeded, 1, Some("2026-11-21T02:01:00Z")),
            job("orders-2611230200", JobState::Succeeded, 3, Some("2026-11-23T02:01:00Z")),
            job("orders-2611220200", JobState::Succeeded, 2, Some("2026-11-22T02:01:00Z")),
            job("orders-manual", JobState::Running, 4, None),
        ];
        let decided = backups(facts(Some(&two), &previous, jobs));
        assert_eq!(decided.remove, ["orders-2611210200"]);
        assert_eq!(decided.report.last.as_ref().map(|b| b.name.as_str()), Some("orders-2611230200"));
        assert!(decided.report.running);
        let window = decided.report.recoverable.expect("a window");
        assert_eq!((window.backups, window.first.as_deref()), (2, Some("2026-11-22T02:01:00Z")));
        assert_eq!(decided.bucket, None, "no bucket to read");
    }

    #[test]
    fn a_failure_newer_than_the_last_success_is_named_once() {
        let daily = spec("0 2 * * *", 3, false);
        let success = job("orders-2611220200", JobState::Succeeded, 10, Some("2026-11-22T02:01:00Z"));
        let condition = |message: &str| {
            let mut conditions = Vec::new();
            status::set(&mut conditions, ConditionType::BackupHealthy, false, Reason::BackupProblem, message.to_string(), None);
            conditions
        };
        let rows = [
            // Older than the success: past.
            (vec![job("orders-2611210200", JobState::Failed, 5, None), success.clone()], vec![], None),
            // Newer, first seen: its cause is to be read.
            (vec![success.clone(), job("orders-2611230200", JobState::Failed, 20, None)], vec![], Some(None)),
            // Newer, its cause already in the status: kept as said.
            (
                vec![success.clone(), job("orders-2611230200", JobState::Failed, 20, None)],
                condition("backup orders-2611230200 failed: container backup exited 1: disk full"),
                Some(Some("backup orders-2611230200 failed: container backup exited 1: disk full")),
            ),
            // A failure with no success at all.
            (vec![job("orders-2611230200", JobState::Failed, 20, None)], condition("backup orders-2611220200 failed"), Some(None)),
        ];
        for (jobs, conditions, want) in rows {
            let previous = DatabaseStatus { conditions, ..Default::default() };
            let failed = backups(facts(Some(&daily), &previous, jobs)).failed;
            assert_eq!(failed.as_ref().map(|f| f.known.as_deref()), want);
            assert!(failed.is_none_or(|f| f.said() == "backup orders-2611230200 failed"));
        }
    }

    #[test]
    fn the_bucket_is_read_when_its_reading_is_due() {
        let bucket = spec("0 2 * * *", 3, true);
        let now = "2026-11-23T02:30:00Z";
        let done = job("orders-2611230200", JobState::Succeeded, 3, Some("2026-11-23T02:01:00Z"));
        let read = |confirmed: &str, unreachable: Option<&str>, last_backup: Option<&str>, archiving: bool, last: Option<&str>| {
            let previous = DatabaseStatus {
                last_scheduled_backup: Some("orders-2611230200".into()),
                last_backup: last_backup.map(|name| BackupRecord { name: name.into(), completed: None }),
                recoverable: (!confirmed.is_empty()).then(|| Recoverable {
                    confirmed: Some(confirmed.into()),
                    unreachable_since: unreachable.map(String::from),
                    last: last.map(String::from),
                    ..window(Vec::new())
                }),
                ..Default::default()
            };
            let decided = backups(BackupFacts { archiving, ..facts(Some(&bucket), &previous, vec![done.clone()]) });
            (decided.bucket.is_some(), decided.report.recheck)
        };
        let minutes = |m: u64| Some(Duration::from_secs(m * 60));
        // Confirmed 10 minutes ago, the newest backup known: not read; due in 50 minutes.
        assert_eq!(read("2026-11-23T02:20:00Z", None, Some("orders-2611230200"), false, None), (false, minutes(50)));
        // Never read, an hour old, unreachable last time, or a backup completed since.
        assert!(read("", None, Some("orders-2611230200"), false, None).0);
        assert_eq!(read("2026-11-23T01:30:00Z", None, Some("orders-2611230200"), false, None), (true, minutes(60)));
        assert!(read("2026-11-23T02:20:00Z", Some(now), Some("orders-2611230200"), false, None).0);
        assert!(read("2026-11-23T02:20:00Z", None, Some("orders-2611220200"), false, None).0);
        // Archiving: the window's end is read again once older than a recheck.
        let fresh = read("2026-11-23T02:20:00Z", None, Some("orders-2611230200"), true, Some("2026-11-23T02:29:40Z"));
        assert_eq!(fresh, (false, Some(ARCHIVE_RECHECK)));
        let stale = read("2026-11-23T02:20:00Z", None, Some("orders-2611230200"), true, Some("2026-11-23T02:28:00Z"));
        assert_eq!(stale, (true, Some(ARCHIVE_RECHECK)));
    }

    #[test]
    fn a_bucket_read_keeps_what_is_being_written() {
        let bucket = spec("0 2 * * *", 3, true);
        let previous = DatabaseStatus::default();
        let jobs = vec![job("orders-manual-a", JobState::Running, 3, None), job("orders-2611220200", JobState::Failed, 2, None)];
        let decided = backups(facts(Some(&bucket), &previous, jobs));
        let due = schedule::backup_name("orders", at("2026-11-23T02:00:00Z"));
        assert_eq!(decided.bucket, Some(BucketRead { retention: 3, running: vec!["orders-manual-a".into(), due], archive: false }));
        assert_eq!(decided.report.recoverable, None, "the bucket says what a restore reaches");
    }

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
