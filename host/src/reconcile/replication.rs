//! Synchronous replication, carried out: the decision ([`decide::replication`]) and, when
//! it says so, the primary's agent asked to change how many replicas each commit waits
//! for, and which (`agent.synchronous-command`); then each replica's agent, told which
//! replicas confirm (a MariaDB replica confirms only when named).

use std::time::Duration;

use super::decide::{self, Event, Note, Replicas, Synchronous};
use super::members::Observed;
use super::status::{ConditionType, Told};
use super::{Context, Error};
use crate::crd::{Database, DatabaseStatus, Phase};

/// What the pass says about synchronous replication, and when to look again. A Database
/// with asynchronous replication, or of an engine that elects its leader (which commits
/// on a quorum whatever the spec says), says nothing (and loses the condition). `named`:
/// the agents run the plugin's synchronous command, and the ready replicas alone confirm
/// commits: the primary's is asked to have them, and, while enough are ready, each replica
/// whose agent answered in this pass (`heard`) is told the same, unless its pod says it was.
pub async fn reconcile(
    ctx: &Context,
    db: &Database,
    (status, told): (&DatabaseStatus, &mut Told),
    (members, primary, heard): (&[Observed], &str, &[&str]),
    (elects, named): (bool, bool),
) -> Result<(Vec<Note>, Option<Duration>), Error> {
    let Some(sync) = Synchronous::of(&db.spec).filter(|_| !elects) else {
        told.remove(ConditionType::SynchronousReplication);
        return Ok((Vec::new(), None));
    };
    let ready: Vec<String> =
        members.iter().filter(|m| m.ready && !m.fenced && !m.terminating && m.name != primary).map(|m| m.name.clone()).collect();
    let leader = members.iter().find(|m| m.name == primary && m.ready);
    let replicas = Replicas { ready: &ready, told: leader.and_then(Observed::synchronous), named };
    let said = status.conditions.iter().find(|c| c.type_ == ConditionType::SynchronousReplication.as_str());
    let plan = decide::replication(sync, replicas, said, k8s_openapi::jiff::Timestamp::now());
    if let Some(setting) = plan.set
        && !super::agent::synchronous(ctx, db, leader.map(std::slice::from_ref).unwrap_or_default(), &setting).await?.contains(&true)
    {
        // Not done (no primary, or its agent did not answer): the condition stays.
        return Ok((Vec::new(), Some(decide::ASK_AGAIN)));
    }
    if let Some(setting) = plan.named {
        let key = setting.key();
        let untold = |m: &&Observed| {
            m.name != primary && !m.fenced && !m.terminating && heard.contains(&m.name.as_str()) && m.synchronous() != Some(&key)
        };
        let replicas: Vec<Observed> = members.iter().filter(untold).cloned().collect();
        if !replicas.is_empty() {
            super::agent::synchronous(ctx, db, &replicas, &setting).await?;
        }
    }
    let mut note = plan.note;
    if matches!(status.phase, None | Some(Phase::Pending | Phase::Creating | Phase::Restoring)) {
        // Replicas still joining are no news.
        note.event = Event::None;
    }
    Ok((vec![note], plan.look_again))
}
