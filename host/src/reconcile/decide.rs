//! The decide stage: what a pass does, as pure functions of what it observed (the
//! caches, handed over as values) and what the plugin answered. Nothing here reads the
//! API server, writes, or calls a plugin. The stages in `converge` ask the plugin the
//! question a function here names, call it with the answer, and carry out what it
//! decided: the Jobs and pods it names, the status it sets, the [`Note`]s it makes.
//!
//! ```text
//! upgrade            upgrade_from → the plugin's plan → upgrade: the version rendered, a backup first
//! failover           failover_question → the plugin's choice → failover: who is primary
//! switchover         switchover_question (asked, or drain_target) → fence, the agents' positions → switchover: who is primary
//! elected            the members' answers → the plugin's choice → elected: who leads
//! scale              scale_question → the plugin's plan → scale: how many members now, which Job
//! roll               roll: role labels, the one member to restart, whether all are rolled
//! steps              steps: the upgrade plan's step in progress, its Job, the end of the upgrade
//! requeue            requeue: when the Database is looked at again
//! ```

use std::time::Duration;

use super::Settings;
use super::cache::SetFacts;
use super::members::{self, Observed};
use super::status::{ConditionType, Reason};
use crate::crd::{ScaleStatus, UpgradeStatus};
use crate::plugin::{FailoverDecision, JobPlan, Member, ScaleStep, UpgradePlan, UpgradeStep, hex_digest};

/// What the agent of a member said when asked to fence it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// Its engine takes no more writes (the fence command succeeded).
    Confirmed,
    /// Its engine did not confirm the fence, so its guard killed it (the fence command
    /// then succeeded): a hung engine, which could otherwise take writes once it ran again.
    Stopped,
    /// The agent marked it fenced; its fence command has not succeeded yet (a hung engine
    /// refuses nothing until it answers, or its start, after a restart, waits), nor has
    /// its engine been stopped.
    Ordered,
    /// No answer: no agent, or none reached (its node lost, say). A member cut off from
    /// the control plane and from every other member fences itself.
    Unknown,
}

/// The state of a Job, as far as the host cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Not created yet.
    Missing,
    /// Created, not finished.
    Running,
    /// Finished successfully.
    Succeeded,
    /// Failed for good.
    Failed,
}

/// What a decision tells the user: a condition set, an Event sent, or both, with one
/// reason and message. `converge` carries it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The condition set, when the note sets one: its type and status.
    pub condition: Option<(ConditionType, bool)>,
    /// The reason of the condition and the Event.
    pub reason: Reason,
    /// Their message.
    pub message: String,
    /// The Event sent.
    pub event: Event,
}

/// Which Event a [`Note`] sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// None.
    None,
    /// A Normal Event.
    Normal,
    /// A Warning Event.
    Warning,
    /// A Warning Event unless the status already says the reason (with the message, or
    /// with any message when `any_message`): once, not on every pass.
    WarningOnce {
        /// Another message with the same reason is not news either.
        any_message: bool,
    },
}

impl Note {
    /// The Event it sends over `status`: none, a Normal (`false`) or a Warning (`true`,
    /// once when the status already says it).
    pub fn sent(&self, status: Option<&crate::crd::DatabaseStatus>) -> Option<bool> {
        match self.event {
            Event::None => None,
            Event::Normal => Some(false),
            Event::Warning => Some(true),
            Event::WarningOnce { any_message } => {
                (!super::status::says(status, None, Some(self.reason), (!any_message).then_some(self.message.as_str()))).then_some(true)
            }
        }
    }

    /// A condition, with a Warning Event the first time it says this.
    fn warn_once(condition: ConditionType, status: bool, reason: Reason, message: String, any_message: bool) -> Self {
        Self { condition: Some((condition, status)), reason, message, event: Event::WarningOnce { any_message } }
    }

    /// A condition alone.
    fn condition(condition: ConditionType, status: bool, reason: Reason, message: String) -> Self {
        Self { condition: Some((condition, status)), reason, message, event: Event::None }
    }

    /// An Event alone.
    fn event(warning: bool, reason: Reason, message: String) -> Self {
        Self { condition: None, reason, message, event: if warning { Event::Warning } else { Event::Normal } }
    }
}

/// The state of a Job, by name, as the cache has it.
pub type Jobs<'a> = &'a dyn Fn(&str) -> JobState;

/// What the upgrade stage decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgrade {
    /// The version this pass renders: the desired one, or the running one while a
    /// pre-upgrade backup runs or after a refusal.
    pub version: String,
    /// The plugin's plan, when an upgrade is under way.
    pub plan: Option<UpgradePlan>,
    /// The upgrade's progress, for the status.
    pub progress: Option<UpgradeStatus>,
    /// The backup to take before the new version is rendered, when it is not done.
    pub backup_first: Option<String>,
    /// The plugin refused the upgrade; `Progressing` says why.
    pub refused: bool,
    /// What to tell the user.
    pub notes: Vec<Note>,
}

impl Upgrade {
    /// No version change: the desired version is rendered.
    pub fn none(desired: &str) -> Self {
        Self { version: desired.into(), plan: None, progress: None, backup_first: None, refused: false, notes: vec![] }
    }
}

/// The version to ask the plugin to plan an upgrade from: the running one, when the
/// spec asks for another.
pub fn upgrade_from<'a>(running: Option<&'a str>, desired: &str) -> Option<&'a str> {
    running.filter(|r| *r != desired)
}

/// The name of the backup taken before upgrading Database `name` to `version`.
pub fn pre_upgrade_backup(name: &str, version: &str) -> String {
    crate::names::Names(name).job(&format!("pre-{}", &hex_digest(version.as_bytes())[..10]))
}

/// What the upgrade stage looks at besides the plugin's answer.
#[derive(Debug, Clone, Copy)]
pub struct UpgradeFacts<'a> {
    /// The Database.
    pub name: &'a str,
    /// The version the members run.
    pub running: &'a str,
    /// The version the spec asks for.
    pub desired: &'a str,
    /// The progress the status had.
    pub progress: Option<&'a UpgradeStatus>,
    /// Backups are configured and enabled.
    pub backups: bool,
    /// The pre-upgrade backup's Job.
    pub backup: JobState,
}

/// An upgrade from `facts.running` to `facts.desired`, given the plugin's plan (or its
/// refusal): a refusal keeps the running version; an accepted plan starts (once), and
/// renders the new version unless it asks for a backup that has not succeeded yet.
pub fn upgrade(facts: UpgradeFacts<'_>, answer: Result<UpgradePlan, String>) -> Upgrade {
    let UpgradeFacts { name, running, desired, .. } = facts;
    let plan = match answer {
        Ok(plan) => plan,
        Err(e) => {
            let message = format!("upgrade from {running} to {desired} refused: {e}");
            let note = Note::warn_once(ConditionType::Progressing, false, Reason::UpgradeRefused, message, false);
            return Upgrade { refused: true, notes: vec![note], ..Upgrade::none(running) };
        }
    };
    let mut notes = vec![];
    let progress = match facts.progress.filter(|p| p.to == desired) {
        Some(p) => p.clone(),
        None => {
            let message = format!("upgrading from {running} to {desired}: {} step(s)", plan.steps.len());
            notes.push(Note::event(false, Reason::UpgradeStarted, message));
            UpgradeStatus { from: running.into(), to: desired.into(), step: 0 }
        }
    };
    let backup_first = (plan.backup_first && facts.backups).then(|| pre_upgrade_backup(name, desired));
    let waiting = backup_first.is_some() && facts.backup != JobState::Succeeded;
    Upgrade {
        version: if waiting { running } else { desired }.into(),
        backup_first: backup_first.filter(|_| waiting),
        plan: Some(plan),
        progress: Some(progress),
        refused: false,
        notes,
    }
}

/// What the scale stage decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scale {
    /// Members the StatefulSet has in this pass.
    pub granted: u32,
    /// The plan's Job to run now, by name.
    pub job: Option<(String, JobPlan)>,
    /// The plan's progress, for the status.
    pub progress: Option<ScaleStatus>,
    /// A plan is being followed.
    pub under_way: bool,
    /// The plugin refused the change; `Progressing` says why.
    pub refused: bool,
    /// What to tell the user.
    pub notes: Vec<Note>,
}

impl Scale {
    fn settled(granted: u32, under_way: bool) -> Self {
        Self { granted, job: None, progress: None, under_way, refused: false, notes: vec![] }
    }
}

/// Whether the plugin is asked for a scale plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScaleQuestion {
    /// No: this is how many members there are.
    Settled(Scale),
    /// Yes.
    Ask {
        /// The member count the plan starts from.
        from: u32,
    },
}

/// Whether the member count changes: `desired` members asked for, `restored` members
/// written by a restore that is not done, `current` members in the StatefulSet (none
/// yet: a new Database starts with the desired count), and the progress of the plan
/// being followed.
pub fn scale_question(desired: u32, restored: Option<u32>, current: Option<u32>, progress: Option<&ScaleStatus>) -> ScaleQuestion {
    if let Some(restored) = restored {
        // The members the restore writes start together; the others join once it is
        // done, as the plugin plans a scale from that many, and copy the restored data.
        let granted = desired.min(restored);
        return ScaleQuestion::Settled(Scale::settled(granted, desired > granted));
    }
    let Some(current) = current else { return ScaleQuestion::Settled(Scale::settled(desired, false)) };
    match progress.filter(|p| p.to as u32 == desired) {
        Some(p) => ScaleQuestion::Ask { from: p.from as u32 },
        None if current == desired => ScaleQuestion::Settled(Scale::settled(current, false)),
        None => ScaleQuestion::Ask { from: current },
    }
}

/// What the scale stage looks at besides the plugin's answer.
#[derive(Debug, Clone, Copy)]
pub struct ScaleFacts<'a> {
    /// The Database.
    pub name: &'a str,
    /// Members the plan starts from.
    pub from: u32,
    /// Members asked for.
    pub desired: u32,
    /// Members in the StatefulSet now.
    pub current: u32,
    /// The progress the status had.
    pub progress: Option<&'a ScaleStatus>,
    /// The members as observed.
    pub members: &'a [Observed],
}

/// A scale from `facts.from` to `facts.desired` members, given the plugin's plan (or
/// its refusal, which keeps the members there are): the step in progress, the members
/// granted so far, and the step's Job.
pub fn scale(facts: ScaleFacts<'_>, answer: Result<Vec<ScaleStep>, String>, jobs: Jobs<'_>) -> Scale {
    let ScaleFacts { name, from, desired, .. } = facts;
    let plan = match answer {
        Ok(steps) => steps,
        Err(e) => {
            let message = format!("scaling from {from} to {desired} members refused: {e}");
            let note = Note::warn_once(ConditionType::Progressing, false, Reason::ScaleRefused, message, false);
            return Scale { refused: true, notes: vec![note], ..Scale::settled(facts.current, false) };
        }
    };
    let progress = facts.progress.filter(|p| p.to as u32 == desired).cloned();
    let progress = progress.unwrap_or(ScaleStatus { from: from as i32, to: desired as i32, step: 0 });
    let job_name = |step: usize| crate::names::Names(name).job(&format!("scale-{from}-{desired}-{step}"));
    let ready = |n: u32| (0..n).all(|o| facts.members.iter().any(|m| m.ordinal == o && m.ready && !m.terminating));
    let (step, granted) = scale_progress(&plan, from, progress.step as usize, ready, |s| jobs(&job_name(s)) == JobState::Succeeded);
    let job = match plan.get(step) {
        Some(ScaleStep::Job(job)) => Some((job_name(step), job.clone())),
        _ => None,
    };
    let under_way = step < plan.len();
    Scale {
        granted,
        job,
        progress: under_way.then_some(ScaleStatus { step: step as i32, ..progress }),
        under_way,
        refused: false,
        notes: vec![],
    }
}

/// Where a scale plan stands: the first step not done yet, from step `from` of a plan
/// that started at `start` members, and the member count the StatefulSet has
/// meanwhile. A `members(n)` step is done once members 0..n are ready (`ready(n)`), a
/// Job once it succeeded (`job_done(step)`). Steps run in order.
pub fn scale_progress(
    steps: &[ScaleStep],
    start: u32,
    from: usize,
    ready: impl Fn(u32) -> bool,
    job_done: impl Fn(usize) -> bool,
) -> (usize, u32) {
    let count = |s: &ScaleStep| if let ScaleStep::Members(n) = s { Some(*n) } else { None };
    let mut granted = steps[..from.min(steps.len())].iter().rev().find_map(count).unwrap_or(start);
    let mut step = from;
    while let Some(s) = steps.get(step) {
        let done = match s {
            ScaleStep::Members(n) => {
                granted = *n;
                ready(*n)
            }
            ScaleStep::Job(_) => job_done(step),
        };
        if !done {
            break;
        }
        step += 1;
    }
    (step, granted)
}

/// What the members stage does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roll {
    /// Members whose role label changes: (pod, role).
    pub labels: Vec<(String, &'static str)>,
    /// The member to restart onto the current revision.
    pub restart: Option<String>,
    /// Every member ready on the StatefulSet's current revision.
    pub done: bool,
    /// When to look again: a replica may follow a new primary on its own before then
    /// ([`members::follow_grace_left`]).
    pub look_again: Option<Duration>,
}

/// Role labels, and the next member restart of a roll (one at a time, replicas first,
/// primary last) among the `granted` members, once the StatefulSet controller has seen
/// the StatefulSet's latest spec (revisions mean nothing before). A pass that
/// `promoted` a member restarts none: what it saw of the members is from before the
/// promotion (the promoted one not yet marked so, and so taken for one to restart).
pub fn roll(members: &[Observed], primary: &str, set: Option<&SetFacts>, role_free: &str, (granted, promoted): (u32, bool)) -> Roll {
    let current = set.is_some_and(|s| s.observed);
    let revision = set.and_then(|s| s.update_revision.as_deref()).unwrap_or_default();
    let wanted = members::Wanted { revision, role_free };
    let labels = members
        .iter()
        .filter(|m| !m.terminating)
        .map(|m| (m, if m.name == primary { "primary" } else { "replica" }))
        .filter(|(m, role)| m.role.as_deref() != Some(*role))
        .map(|(m, role)| (m.name.clone(), role))
        .collect();
    let desired = granted.max(1) as usize;
    let restart = members::next_to_roll(members, wanted, primary, desired).filter(|_| current && !promoted).map(|m| m.name.clone());
    let look_again = members::follow_grace_left(members, primary);
    Roll { labels, restart, done: current && members::rolled(members, wanted, primary, desired), look_again }
}

/// What the steps stage decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Steps {
    /// The step's Job to run now, by name.
    pub job: Option<(String, JobPlan)>,
    /// The upgrade's progress, for the status; `None` once it is done.
    pub progress: Option<UpgradeStatus>,
    /// The version the members now run, when the upgrade completed in this pass.
    pub completed: Option<String>,
    /// An upgrade is under way in this pass.
    pub under_way: bool,
    /// What to tell the user.
    pub notes: Vec<Note>,
}

/// The upgrade plan's steps, in order, once `version` (the one rendered) is the one the
/// upgrade goes to; until then (a pre-upgrade backup runs) nothing moves. A rolling
/// restart is done once the members are `rolled`, a Job once it succeeded.
pub fn steps(
    name: &str,
    progress: Option<&UpgradeStatus>,
    version: &str,
    plan: Option<&UpgradePlan>,
    rolled: bool,
    jobs: Jobs<'_>,
) -> Steps {
    let unchanged = Steps { job: None, progress: progress.cloned(), completed: None, under_way: progress.is_some(), notes: vec![] };
    let (Some(progress), Some(plan)) = (progress.filter(|u| u.to == version), plan) else { return unchanged };
    let job_name = |step: usize| crate::names::Names(name).job(&format!("upgrade-{}-{step}", &hex_digest(progress.to.as_bytes())[..8]));
    let step = next_step(&plan.steps, progress.step as usize, rolled, |s| jobs(&job_name(s)) == JobState::Succeeded);
    let job = match plan.steps.get(step) {
        Some(UpgradeStep::Job(job)) => Some((job_name(step), job.clone())),
        _ => None,
    };
    if step >= plan.steps.len() && rolled {
        let message = format!("upgraded from {} to {}", progress.from, progress.to);
        let note = Note::event(false, Reason::UpgradeCompleted, message);
        return Steps { job, progress: None, completed: Some(progress.to.clone()), under_way: true, notes: vec![note] };
    }
    Steps { job, progress: Some(UpgradeStatus { step: step as i32, ..progress.clone() }), completed: None, under_way: true, notes: vec![] }
}

/// The first step of an upgrade plan not done yet, starting at `from`: a rolling restart
/// is done once every member runs the current revision, a Job once it succeeded
/// (`job_done`). Steps run in order; a step waits for the one before it.
pub fn next_step(steps: &[UpgradeStep], from: usize, rolled: bool, job_done: impl Fn(usize) -> bool) -> usize {
    let mut step = from;
    while let Some(s) = steps.get(step) {
        let done = match s {
            UpgradeStep::RollingRestart => rolled,
            UpgradeStep::Job(_) => job_done(step),
        };
        if !done {
            break;
        }
        step += 1;
    }
    step
}

/// How a pass left the Database, for when to look at it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// The pass set something in motion that no watch reports the end of in time: a
    /// failover, a restart, an upgrade or scale step, a restore, a volume growing, a backup.
    pub moving: bool,
    /// Nothing in motion, but not every member is ready yet.
    pub waiting_for_members: bool,
    /// How long the Database has not been Ready.
    pub waited: Duration,
    /// How long until the primary, down, counts as lost, on an engine whose host chooses it.
    pub primary_lost_in: Option<Duration>,
    /// The API server refused to grow a volume.
    pub grow_failed: bool,
    /// When a steady Database is looked at again.
    pub next: Duration,
}

/// How much longer than `progress_requeue` a Database waiting for its members waits at
/// least: a member that becomes ready changes its StatefulSet's status, which wakes the
/// pass at once; the requeue is only a safety net.
pub const MEMBER_WAIT: u32 = 6;

/// When to look again: soon while something moves; while the primary is down, when its
/// failover delay runs out and soon after; while members are only coming up, after the
/// safety net, which grows with
/// the wait (as long again as the Database has not been Ready, from `MEMBER_WAIT`
/// progress requeues up to the idle one), so members that stay down for long cost a
/// few passes, not one every half minute; a while after a refused volume grow; else
/// when a steady Database is due.
pub fn requeue(settings: &Settings, settled: &Settled) -> Duration {
    let progress = settings.progress_requeue;
    if settled.moving {
        return progress;
    }
    let then = if settled.waiting_for_members {
        let least = progress * MEMBER_WAIT;
        settled.waited.clamp(least, settings.idle_requeue.max(least))
    } else if settled.grow_failed {
        progress * 6
    } else {
        settled.next
    };
    // A primary down is looked at again once it counts as lost (whole seconds from now),
    // not before or after, and soon while it stays lost: a replica's agent that did not
    // answer the last failover question may answer the next (whatever else the pass
    // concluded).
    let again = |left: Duration| if left.is_zero() { progress } else { left };
    settled.primary_lost_in.map_or(then, |left| then.min(again(left)))
}

mod anomalies;
pub use anomalies::*;
mod backups;
pub use backups::*;
mod primary;
pub use primary::*;
mod replication;
pub use replication::*;
mod volumes;
pub use volumes::*;

#[cfg(test)]
mod tests;
