//! Backups: scheduled, on demand, before upgrades and before deletion; all Jobs under
//! deterministic names, so a restarted operator never runs one twice. Which backups a
//! pass wants, what retention removes and when the bucket is read is
//! [`decide::backups`]'s (pure); this module reads what it says to when the pass
//! observes ([`observe`]), and carries it out ([`reconcile`]).

use chrono::{DateTime, Utc};
use k8s_openapi::api::batch::v1::Job;
use kube::{Api, ResourceExt};

use super::decide::{self, BackupFacts, BackupJob, BackupReport, BucketRead, window_with_archive};
use super::plan::Plan;
use super::{Context, Error, bucket};
use crate::crd::{Database, Recoverable};
use crate::jobs::{self, BACKUP_OF, Purpose, Storage, Transfer};
use crate::names::{BACKUP_MOUNT, Names};
use crate::object_storage;
use crate::plugin::{BackupLocation, Capability, EngineSpec, Plugin};

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
/// volume it needs) planned when there is none yet. A bucket must answer with the
/// Database's key before a Job is made to write to it: `answered` says whether it did
/// when it was looked at (`None`: it was not, and no Job is made to write to it).
pub(super) async fn backup(
    ctx: &Context,
    db: &Database,
    (plugin, spec): (&Plugin, &EngineSpec),
    (name, run_as_user): (&str, u32),
    answered: Option<Result<(), String>>,
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
        cluster: super::cluster(ctx, db, plugin, &primary),
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
            if let Err(problem) = answered.unwrap_or_else(|| Err(format!("spec.backup.s3: bucket {} was not looked at", target.bucket))) {
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

/// The Database's backup Jobs, as the decision reads them.
fn observed_jobs(jobs: &[std::sync::Arc<Job>]) -> Vec<BackupJob> {
    let completed = |job: &Job| job.status.as_ref()?.completion_time.as_ref().map(|t| t.0.to_string());
    let created = |job: &Job| job.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second());
    jobs.iter().map(|j| BackupJob { name: j.name_any(), state: state(Some(j)), created: created(j), completed: completed(j) }).collect()
}

/// What the backups stage works from, read when the pass observes: which backups are
/// wanted, what retention removes and when the bucket is read ([`decide::backups`]), and
/// what that says to read over the network: a failed backup's cause (its pod's words,
/// once), and the bucket, when a backup is to start (it must answer first) or its
/// listing is due (then what retention removes from it, too).
pub(super) struct Seen {
    decided: decide::Backups,
    cause: Option<String>,
    bucket: Option<Result<Bucket, String>>,
}

/// The bucket as a pass found it.
struct Bucket {
    opened: bucket::Opened,
    /// What retention removes, when the listing was due.
    removal: Option<Result<bucket::Removal, String>>,
}

impl Seen {
    /// Whether the bucket answered with the Database's key, when it was looked at.
    pub(super) fn answered(&self) -> Option<Result<(), String>> {
        self.bucket.as_ref().map(|b| b.as_ref().map(|_| ()).map_err(Clone::clone))
    }
}

/// Whether the bucket of `db`'s backups answers with its key (`None`: it has none, or
/// the plugin cannot back up); read by a pass that makes a backup outside the schedule
/// (a final one).
pub(super) async fn look_at_bucket(ctx: &Context, db: &Database) -> Result<Option<Result<(), String>>, Error> {
    let (ns, name) = (db.namespace().unwrap_or_default(), db.name_any());
    Ok(match db.spec.backup.as_ref().and_then(|b| b.s3.as_ref()) {
        Some(target) => Some(bucket::open(ctx, &ns, target, &ns, &name, "spec.backup.s3").await?.map(|_| ())),
        None => None,
    })
}

/// What the backups of `db` need read this pass, read (see [`Seen`]); `before_upgrade`:
/// a backup before an upgrade may start in this pass, which the bucket must answer first.
pub(super) async fn observe(ctx: &Context, db: &Database, plugin: &Plugin, before_upgrade: bool) -> Result<Seen, Error> {
    let previous = db.status.clone().unwrap_or_default();
    let (ns, name, now) = (db.namespace().unwrap_or_default(), db.name_any(), Utc::now());
    let cannot = plugin.lacks(Capability::Backup);
    let created = db.metadata.creation_timestamp.as_ref().and_then(|t| DateTime::from_timestamp(t.0.as_second(), 0)).unwrap_or(now);
    let decided = decide::backups(BackupFacts {
        database: &name,
        spec: db.spec.backup.as_ref(),
        created,
        now,
        asked: db.annotations().get(BACKUP_NOW).map(String::as_str),
        previous: &previous,
        cannot: cannot.as_deref(),
        jobs: observed_jobs(&ctx.caches.jobs_labelled(db, BACKUP_OF, &name)),
        archiving: super::archiver(ctx, db, plugin).is_some(),
        bucket_recheck: ctx.settings.bucket_recheck,
    });
    // The cause is read once, when the failure is first seen; the status keeps it.
    let cause = match decided.failed.as_ref().filter(|f| f.known.is_none()) {
        Some(failed) => read_cause(ctx, &ns, &failed.name).await,
        None => None,
    };
    let starts = cannot.is_none() && (before_upgrade || decided.wanted.iter().any(|w| !w.exists));
    let target = db.spec.backup.as_ref().and_then(|b| b.s3.as_ref()).filter(|_| starts || decided.bucket.is_some());
    let bucket = match target {
        Some(target) => Some(match bucket::open(ctx, &ns, target, &ns, &name, "spec.backup.s3").await? {
            Ok(opened) => {
                let removal = match &decided.bucket {
                    Some(read) => Some(bucket::to_remove(&opened, read.retention, &read.running).await),
                    None => None,
                };
                Ok(Bucket { opened, removal })
            }
            Err(problem) => Err(problem),
        }),
        None => None,
    };
    Ok(Seen { decided, cause, bucket })
}

/// Runs scheduled and on-demand backups, applies retention and reports, as the pass
/// `seen` them: the backups wanted are started (the plugin's plan, the bucket having
/// answered), a failure is said with its cause, and the bucket is pruned when due.
pub(super) async fn reconcile(
    ctx: &Context,
    db: &Database,
    seen: Seen,
    (plugin, spec): (&Plugin, &EngineSpec),
    run_as_user: u32,
    plan: &mut Plan,
) -> Result<BackupReport, Error> {
    let answered = seen.answered();
    let Seen { decided, cause, bucket } = seen;
    let mut report = decided.report;
    for wanted in &decided.wanted {
        if !wanted.exists {
            let job = (wanted.name.as_str(), run_as_user);
            if let Err(reason) = backup(ctx, db, (plugin, spec), job, answered.clone(), plan).await? {
                report.problem = Some(format!("the {} plugin cannot back up: {reason}", spec.name));
                continue;
            }
            report.running = true;
        }
        report.acted_on(wanted);
    }
    if let Some(failed) = decided.failed {
        let problem = match (failed.known.clone(), cause) {
            (Some(known), _) => known,
            (None, Some(cause)) => format!("{}: {cause}", failed.said()),
            (None, None) => failed.said(),
        };
        report.problem.get_or_insert(problem);
    }
    for job in decided.remove {
        plan.remove_job(job);
    }
    if let (Some(read), Some(bucket), Some(target)) = (decided.bucket, bucket, db.spec.backup.as_ref().and_then(|b| b.s3.as_ref())) {
        prune(db, target, read, bucket, (&mut report, plan));
    }
    Ok(report)
}

/// What the bucket holds: what a restore can reach, confirmed now, and what retention
/// prunes (the newest `retention` complete backups stay, with any still being written).
/// A bucket that could not be read leaves the window unknown and says why.
fn prune(
    db: &Database,
    target: &crate::crd::S3Target,
    read: BucketRead,
    bucket: Result<Bucket, String>,
    (report, plan): (&mut BackupReport, &mut Plan),
) {
    let now = Utc::now();
    let previous = db.status.as_ref().and_then(|s| s.recoverable.as_ref());
    let removal = bucket.and_then(|b| match b.removal {
        Some(Ok(removal)) => Ok((b.opened, removal)),
        Some(Err(e)) => Err(format!("spec.backup.s3: retention: {e}")),
        None => Err("spec.backup.s3: the bucket was not listed".into()),
    });
    let (opened, removal) = match removal {
        Ok(read) => read,
        Err(problem) => {
            report.problem = Some(problem);
            report.recoverable = bucket::unreachable(previous, now);
            return;
        }
    };
    let retention = read.retention;
    let kept: Vec<DateTime<Utc>> =
        opened.listed.iter().filter(|b| !removal.backups.contains(&b.name)).filter_map(|b| b.completed).collect();
    let archived = opened.archive.iter().map(|s| s.at).max().filter(|_| read.archive);
    let stamp = now.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    report.recoverable = Some(Recoverable { confirmed: Some(stamp), ..window_with_archive(&kept, archived) });
    if removal.backups.is_empty() && removal.segments.is_empty() {
        return;
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

/// The longest cause of a failed Job the status and its Event quote.
const MAX_CAUSE: usize = 400;

/// Why Job `name` failed, in its failed container's own words: the end of its
/// termination message (its log's last lines: Jobs' containers fall back to them), on one
/// line, control characters escaped and bounded. `None` when no pod says.
async fn read_cause(ctx: &Context, ns: &str, name: &str) -> Option<String> {
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
