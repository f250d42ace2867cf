//! Synchronous replication: the decision ([`decide::replication`]) over the members as
//! observed, and, when it says so, the step the plan carries out ([`Step`]): the
//! primary's agent asked to change how many replicas each commit waits for, and which
//! (`agent.synchronous-command`); then each replica's agent, told which replicas confirm
//! (a MariaDB replica confirms only when named).

use std::time::Duration;

use super::decide::{self, Event, Note, Replicas, Setting, Synchronous};
use super::members::Observed;
use super::status::{ConditionType, Told};
use crate::crd::{Database, DatabaseStatus, Phase};

/// What a pass decided about synchronous replication.
#[derive(Default)]
pub(super) struct Decided {
    /// What the status says (said at once).
    pub notes: Vec<Note>,
    /// When to look again.
    pub due: Option<Duration>,
    /// What the agents are asked, and what is said once the primary's did it.
    pub step: Option<Step>,
}

/// The agents asked for a setting: the primary's first (`leader`, with `set`), then, when
/// it did or was not asked, the `replicas` told which confirm (`named`).
pub(super) struct Step {
    pub leader: Option<(Observed, Setting)>,
    pub replicas: Vec<Observed>,
    pub named: Option<Setting>,
    /// Said once the primary's agent did what it was asked.
    pub note: Note,
}

/// What the pass decides about synchronous replication, and when to look again. A
/// Database with asynchronous replication, or of an engine that elects its leader (which
/// commits on a quorum whatever the spec says), says nothing (and loses the condition).
/// `named`: the agents run the plugin's synchronous command, and the ready replicas alone
/// confirm commits: the primary's is asked to have them, and, while enough are ready, each
/// replica whose agent answered in this pass (`heard`) is told the same, unless its pod
/// says it was.
pub(super) fn decide(
    db: &Database,
    (status, told): (&DatabaseStatus, &mut Told),
    (members, primary, heard): (&[Observed], &str, &[&str]),
    (elects, named): (bool, bool),
) -> Decided {
    let Some(sync) = Synchronous::of(&db.spec).filter(|_| !elects) else {
        told.remove(ConditionType::SynchronousReplication);
        return Decided::default();
    };
    let ready: Vec<String> =
        members.iter().filter(|m| m.ready && !m.fenced && !m.terminating && m.name != primary).map(|m| m.name.clone()).collect();
    let leader = members.iter().find(|m| m.name == primary && m.ready);
    let replicas = Replicas { ready: &ready, told: leader.and_then(Observed::synchronous), named };
    let said = status.conditions.iter().find(|c| c.type_ == ConditionType::SynchronousReplication.as_str());
    let plan = decide::replication(sync, replicas, said, k8s_openapi::jiff::Timestamp::now());
    let mut note = plan.note;
    if matches!(status.phase, None | Some(Phase::Pending | Phase::Creating | Phase::Restoring)) {
        // Replicas still joining are no news.
        note.event = Event::None;
    }
    let key = plan.named.as_ref().map(Setting::key);
    let untold = |m: &&Observed| {
        m.name != primary && !m.fenced && !m.terminating && heard.contains(&m.name.as_str()) && m.synchronous() != key.as_deref()
    };
    let replicas: Vec<Observed> = plan.named.as_ref().map(|_| members.iter().filter(untold).cloned().collect()).unwrap_or_default();
    let leader = match (plan.set, leader) {
        (None, _) => None,
        (Some(setting), Some(leader)) => Some((leader.clone(), setting)),
        // No primary to ask: not done, and the condition stays.
        (Some(_), None) => return Decided { notes: Vec::new(), due: Some(decide::ASK_AGAIN), step: None },
    };
    if leader.is_none() && replicas.is_empty() {
        return Decided { notes: vec![note], due: plan.look_again, step: None };
    }
    Decided { notes: Vec::new(), due: plan.look_again, step: Some(Step { leader, replicas, named: plan.named, note }) }
}
