//! The stages whose work runs as Jobs: a scale plan's step, a restore, an upgrade's
//! steps, and the backups with their retention. Each plans its Jobs (see [`Plan`]).

use super::*;

impl Pass<'_> {
    /// Whether a restore was asked for and has not completed.
    pub(super) fn restore_unfinished(&self) -> bool {
        self.db.spec.restore_from.is_some() && !status::is_true(&self.old.conditions, ConditionType::Restored)
    }

    /// A restore asked for and not yet done (the `Restored` condition remembers it). A
    /// physical restore holds the members back: the pass ends until its Job is done.
    pub(super) async fn restore(
        &mut self,
        plugin: &Plugin,
        spec: &EngineSpec,
        workload: &Workload,
        bucket: Option<Result<super::super::bucket::Opened, String>>,
    ) -> Flow<restore::Restore> {
        let (ctx, db) = (self.ctx, self.db);
        if !self.restore_unfinished() {
            return Ok(ControlFlow::Continue(restore::Restore::Done));
        }
        let was_ready = status::is_true(&self.old.conditions, ConditionType::Ready);
        let restoring = restore::reconcile(ctx, db, (plugin, spec, workload), bucket, was_ready, &mut self.plan).await?;
        match &restoring {
            restore::Restore::Done => {
                let message = format!("restored from backup {}", restore::restored_from(ctx, db));
                self.plan.tell(None, false, Reason::Restored, message.clone());
                self.plan.told.set(ConditionType::Restored, true, Reason::Restored, message);
            }
            restore::Restore::Failed(reason) => return self.stop(ConditionType::Progressing, Reason::RestoreFailed, reason.clone()).await,
            // Nothing starts before the data is there; the pass is tried again.
            restore::Restore::Waiting(reason) => return self.wait(Reason::RestoreWaiting, reason.clone(), Some(Phase::Restoring)).await,
            restore::Restore::HoldMembers => {
                self.plan.told.phase = Some(Phase::Restoring);
                let message = format!("restoring into the members' data volumes (Jobs {}*)", restore::job_name(db, 0));
                self.plan.told.set(ConditionType::Progressing, true, Reason::Restoring, message);
                let status = self.told();
                self.finish(status).await?;
                return Ok(ControlFlow::Break(Action::requeue(ctx.settings.progress_requeue)));
            }
            restore::Restore::Running => {}
        }
        Ok(ControlFlow::Continue(restoring))
    }

    /// The upgrade plan's steps, in order, once the new version is rendered (until then a
    /// pre-upgrade backup runs). Returns whether an upgrade is under way in this pass.
    pub(super) fn steps(&mut self, upgrade: &Upgrade, workload: &Workload, rolled: bool) -> bool {
        let (ctx, db) = (self.ctx, self.db);
        let jobs = |name: &str| self.job_state(name);
        let steps = decide::steps(&self.name, upgrade.progress.as_ref(), &upgrade.version, upgrade.plan.as_ref(), rolled, &jobs);
        if let Some((name, job)) = &steps.job {
            // Upgrade steps keep no artefact: the backup volume when there is one, else scratch.
            let storage = match db.spec.backup.as_ref().and_then(|b| b.s3.as_ref()) {
                Some(_) => jobs::Storage::Scratch,
                None => jobs::Storage::Volume { of: &self.name },
            };
            let request = jobs::Request {
                name,
                purpose: Purpose::Upgrade,
                plan: job,
                storage,
                artifact: "",
                data: None,
                run_as_user: workload.run_as_user,
            };
            self.plan.make(jobs::job(db, &request, &ctx.settings.pull));
        }
        self.say(&steps.notes);
        if steps.completed.is_some() {
            self.plan.told.current_version = steps.completed;
        }
        self.plan.told.upgrade = Some(steps.progress);
        steps.under_way
    }

    /// How many members the StatefulSet gets in this pass: the spec's count once the
    /// plugin's scale plan got there, step by step; a refused plan keeps the count the
    /// members have and says why in `Progressing` (an Event the first time). A new
    /// Database starts with the spec's count.
    pub(super) async fn scale(&mut self, plugin: &Plugin, spec: &EngineSpec, members: &Members) -> Result<Scale, Error> {
        let ctx = self.ctx;
        let desired = spec.replicas;
        let restored = self.restore_unfinished().then(|| restore::members_restored(ctx, self.db, desired));
        let set = ctx.caches.stateful_set(self.db);
        let current = set.and_then(|s| s.replicas).map(|r| r.max(1) as u32);
        let progress = self.old.scale.clone();
        let scale = match decide::scale_question(desired, restored, current, progress.as_ref()) {
            ScaleQuestion::Settled(scale) => scale,
            ScaleQuestion::Ask { from } => {
                let now = members::for_plugin(&members.observed, self.old.primary.as_deref().unwrap_or_default());
                let input = (spec.clone(), from, now);
                let answer = match ctx.ask::<PlanScale>(plugin, input).await {
                    Err(Error::Plugin(e)) => Err(e.to_string()),
                    asked => Ok(asked?),
                };
                let current = current.unwrap_or(desired);
                let facts = decide::ScaleFacts {
                    name: &self.name,
                    from,
                    desired,
                    current,
                    progress: progress.as_ref(),
                    members: &members.observed,
                };
                let jobs = |name: &str| self.job_state(name);
                decide::scale(facts, answer, &jobs)
            }
        };
        self.say(&scale.notes);
        self.plan.told.scale = Some(scale.progress.clone());
        Ok(scale)
    }

    /// Starts the scale plan's Job of this pass, once, as the engine's user.
    pub(super) fn scale_job(&mut self, scale: &Scale, workload: &Workload) {
        if let Some((name, job)) = &scale.job {
            let storage = jobs::Storage::Scratch;
            let request = jobs::Request {
                name,
                purpose: Purpose::Scale,
                plan: job,
                storage,
                artifact: "",
                data: None,
                run_as_user: workload.run_as_user,
            };
            self.plan.make(jobs::job(self.db, &request, &self.ctx.settings.pull));
        }
    }

    /// Scheduled and requested backups, and retention, as the pass `seen` them.
    pub(super) async fn backups(
        &mut self,
        plugin: &Plugin,
        spec: &EngineSpec,
        workload: &Workload,
        seen: backups::Seen,
    ) -> Result<BackupReport, Error> {
        let report = backups::reconcile(self.ctx, self.db, seen, (plugin, spec), workload.run_as_user, &mut self.plan).await?;
        let told = &mut self.plan.told;
        told.backups = Some(status::Backups {
            last: report.last.clone(),
            next: report.next.map(|t| t.to_rfc3339()),
            recoverable: report.recoverable.clone(),
            request: report.request.clone(),
            scheduled: report.scheduled.clone(),
        });
        match &report.problem {
            Some(p) => told.set(ConditionType::BackupHealthy, false, Reason::BackupProblem, p.clone()),
            None => told.set(ConditionType::BackupHealthy, true, Reason::BackupsHealthy, crate::reconcile::backup_message(&report)),
        }
        Ok(report)
    }
}
