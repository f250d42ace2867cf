//! The end of a pass, where what the stages decided is carried out: a change of who
//! leads first ([`Pass::lead`], a pass of its own), else the plan; then the status,
//! written once, and when the Database is looked at again, from what the stages found.

use super::*;
use crate::reconcile::handover::Lead;

/// What the stages found that the end of a pass weighs: the status it concludes, and when
/// the Database is looked at again.
pub(super) struct Found<'f> {
    pub(super) members: &'f Members,
    pub(super) primary: &'f Primary,
    pub(super) scale: &'f Scale,
    pub(super) rolled: &'f Rolled,
    pub(super) applied: &'f Applied,
    pub(super) restoring: restore::Restore,
    pub(super) report: &'f BackupReport,
    /// The plugin refused the upgrade or the scale asked for.
    pub(super) plan_refused: bool,
    /// An upgrade's steps run.
    pub(super) upgrading: bool,
    /// A second primary was fenced.
    pub(super) incident: bool,
    /// The engine elects its leader (no failover to wait for).
    pub(super) elects: bool,
    /// When stages asked to look again.
    pub(super) due: [Option<Duration>; 3],
    /// The members answer who leads; their agents say their lag: both asked again at
    /// their polls.
    pub(super) polled: (bool, bool),
}

impl Pass<'_> {
    /// The end of a pass: the plan carried out and the status written once
    /// ([`Pass::conclude`]), then when to look again: soon while anything moves, at
    /// each time a stage named, and at the leader and member polls.
    pub(super) async fn end(&mut self, found: Found<'_>) -> Result<Action, Error> {
        let ctx = self.ctx;
        let Found { members, primary, scale, rolled, applied, restoring, report, plan_refused, upgrading, incident, elects, due, polled } =
            found;
        let (leader_polled, agents_polled) = polled;
        let moving = primary.failed_over || primary.switching.is_some() || rolled.restarted || upgrading || scale.under_way || incident;
        let in_motion = moving
            || restoring == restore::Restore::Running
            || matches!(applied.growth, Growth::Waiting(_))
            || report.running
            || self.plan.told.upgrading(&self.old);
        let (progressing, waited, growth, carried_due) = self
            .conclude(
                status::Pass {
                    generation: self.db.metadata.generation,
                    desired: scale.granted as usize,
                    members: &members.observed,
                    rolled: rolled.done,
                    moving,
                    growth: &applied.growth,
                    plan_refused,
                    restoring: restoring == restore::Restore::Running,
                    incident,
                    switching: primary.switching.as_deref(),
                },
                &members.heard,
            )
            .await?;
        let settled = decide::Settled {
            moving: in_motion,
            waiting_for_members: progressing && !in_motion,
            waited,
            primary_lost_in: (!elects)
                .then(|| super::members::primary_lost_in(&members.observed, &primary.name, ctx.settings.failover_after.as_secs() as i64))
                .flatten(),
            grow_failed: matches!(growth, Growth::Failed(_)),
            next: self.next_look(report),
        };
        let polls = [leader_polled.then_some(ctx.settings.leader_poll), agents_polled.then_some(ctx.settings.member_poll)];
        // A member waits for its node's loss, commits for too few replicas, or a replica
        // for a new primary to serve long enough: looked at again then. Who leads, and a
        // replica's lag, change without a pod changing: asked again at their polls.
        let requeue =
            due.into_iter().chain(polls).chain([carried_due]).flatten().fold(decide::requeue(&ctx.settings, &settled), Duration::min);
        Ok(Action::requeue(requeue))
    }

    /// The end of a pass that changes who leads: the step carried out first (see
    /// [`crate::reconcile::handover`]), what it came to said, then the plan so far and the
    /// status (who leads, what the change waits for, where the members are; the rest as it
    /// was). The next pass, at once, renders for whoever leads then; one that waits for
    /// a fence to be confirmed, or for a member to catch up, is soon.
    pub(super) async fn lead(&mut self, step: Lead, members: &Members) -> Result<Action, Error> {
        let mut led = step.fence(self.ctx, self.db).await?;
        if led.primary.failed_over {
            // Decided, the old primary fenced: the status says who leads however the
            // rest goes (a member not promoted in place restarts to lead).
            self.plan.promoted(led.primary.name.clone());
        }
        let handed = led.hand_over(self.ctx, self.db).await;
        self.chosen(&led.primary);
        handed?;
        if let Some(target) = self.db.annotations().get(crate::names::SWITCHOVER).filter(|_| led.over) {
            self.plan.drop_request(target.clone());
        }
        if let Some(waits) = &led.primary.switching {
            self.plan.told.set(ConditionType::Progressing, true, Reason::Converging, waits.clone());
        }
        let mut status = self.told();
        let now = k8s_openapi::jiff::Timestamp::now();
        status.members = status::members(&status.members, &members.observed, status.primary.as_deref(), (&members.heard, now));
        self.finish(status).await?;
        let confirmed = self.ctx.agents.fence_said(self.db, &led.primary.name) == Some(decide::Fenced::Confirmed);
        let at_once = led.primary.failed_over || (led.primary.switching.is_some() && confirmed);
        Ok(Action::requeue(if at_once { Duration::ZERO } else { self.ctx.settings.progress_requeue }))
    }

    /// The end of the pass: the plan carried out, then the status, which follows from
    /// what the stages found and decided and what carrying out found, written once.
    /// Returns whether the Database is still progressing, how long it has not been
    /// Ready, how growing its volumes stands, and when to look again for what carrying
    /// out left undone.
    async fn conclude(
        &mut self,
        pass: status::Pass<'_>,
        heard: &[(String, crate::agent::Status)],
    ) -> Result<(bool, Duration, Growth, Option<Duration>), Error> {
        let mut told = std::mem::take(&mut self.plan.told);
        let carried = std::mem::take(&mut self.plan).carry_out(self.ctx, self.db).await?;
        carried.tell(&mut told, &self.old);
        let mut status = status::after(&self.old, told, self.generation);
        let growth = carried.growth(pass.growth.clone());
        let pass = status::Pass { growth: &growth, ..pass };
        let now = k8s_openapi::jiff::Timestamp::now();
        let progressing = status::conclude(&mut status, &pass);
        status.selector = Some(crate::names::selector_text(self.db));
        let members = status::members(&status.members, pass.members, status.primary.as_deref(), (heard, now));
        let gone = status.members.iter().filter(|b| !members.iter().any(|m| m.pod == b.pod));
        let at = now.as_millisecond() as f64 / 1000.0;
        for (pod, said) in gone.map(|b| (&b.pod, None)).chain(heard.iter().map(|(pod, said)| (pod, Some((said.lag, at))))) {
            self.ctx.metrics.member_said(&self.ns, &self.name, pod, said);
        }
        status.members = members;
        status::engine_metrics(&mut status, self.generation);
        let waited = status::not_ready_for(&status, now);
        write_status(self.ctx, self.db, status).await?;
        Ok((progressing, waited, growth, carried.look_again))
    }

    /// The end of a pass that stopped or waits: the plan carried out, then the status
    /// written once.
    pub(super) async fn finish(&mut self, status: DatabaseStatus) -> Result<(), Error> {
        std::mem::take(&mut self.plan).carry_out(self.ctx, self.db).await?;
        write_status(self.ctx, self.db, status).await
    }

    /// When a steady Database is looked at again: at the next backup, the next read of
    /// its archive's window, or the idle resync.
    fn next_look(&self, report: &BackupReport) -> std::time::Duration {
        let idle = self.ctx.settings.idle_requeue;
        crate::reconcile::until_next_backup(report).min(idle).min(report.recheck.unwrap_or(idle))
    }
}
