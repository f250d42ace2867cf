//! Synchronous replication while too few replicas are ready (`spec.replication`): commits
//! wait, or, when the user allows it, after a bound the primary's agent lowers it to no
//! replica until enough are back. Pure, as the rest of [`super`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use super::*;
use crate::crd::{ReplicationMode, TooFewReplicas};

/// What the user asked of synchronous replication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Synchronous {
    /// Replicas each commit waits for.
    pub replicas: u32,
    /// With `whenTooFewReplicas: Degrade`: how long commits may wait for too few replicas.
    pub degrade_after: Option<Duration>,
}

impl Synchronous {
    /// The Database's, when it asks for synchronous replication.
    pub fn of(spec: &crate::crd::DatabaseSpec) -> Option<Self> {
        let r = spec.replication.as_ref().filter(|r| r.mode == ReplicationMode::Synchronous)?;
        let degrade_after =
            (r.when_too_few_replicas == TooFewReplicas::Degrade).then(|| Duration::from_secs(r.degrade_after_seconds.max(1) as u64));
        Some(Self { replicas: spec.synchronous_replicas(), degrade_after })
    }
}

/// What a pass does about synchronous replication.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicationPlan {
    /// Ask the primary's agent to make commits wait for this many replicas first; the
    /// note is said only once it did.
    pub set: Option<u32>,
    /// The condition (and Event) to say.
    pub note: Note,
    /// When to look again, should nothing change before.
    pub look_again: Option<Duration>,
}

/// How long a pass waits to ask again when the primary's agent did not do what it was asked.
pub const ASK_AGAIN: Duration = Duration::from_secs(2);

/// What to do, from the user's choice, how many replicas are `ready` (ready members other
/// than the primary, not fenced), and the condition as the last pass left it.
pub fn replication(sync: Synchronous, ready: u32, said: Option<&Condition>, now: Timestamp) -> ReplicationPlan {
    let n = sync.replicas;
    let reason = said.map(|c| c.reason.as_str());
    let degraded = reason == Some(Reason::ReplicationDegraded.as_str());
    let condition = ConditionType::SynchronousReplication;
    if ready >= n {
        let message = format!("each commit waits for {n} of the {ready} ready replicas");
        let mut note = Note::condition(condition, true, Reason::SynchronousReplication, message);
        if degraded {
            // Synchronous again: news.
            note.event = Event::Normal;
        }
        return ReplicationPlan { set: degraded.then_some(n), note, look_again: None };
    }
    let missing = format!("{ready} of the {n} replicas each commit waits for are ready");
    let Some(bound) = sync.degrade_after else {
        let message = format!("{missing}: commits wait until enough are back (whenTooFewReplicas: Wait)");
        return ReplicationPlan {
            set: None,
            note: Note::warn_once(condition, false, Reason::ReplicasMissing, message, true),
            look_again: None,
        };
    };
    let degraded_message =
        format!("{missing}, for longer than {}s: commits no longer wait for replicas until enough are back", bound.as_secs());
    if degraded {
        // Said again on every pass: a primary that restarted, or a new one, starts synchronous.
        return ReplicationPlan {
            set: Some(0),
            note: Note::condition(condition, false, Reason::ReplicationDegraded, degraded_message),
            look_again: None,
        };
    }
    let since = said.filter(|c| c.status == "False").map(|c| c.last_transition_time.0).unwrap_or(now);
    let waited: Duration = now.duration_since(since).try_into().unwrap_or_default();
    if waited >= bound {
        return ReplicationPlan {
            set: Some(0),
            note: Note { event: Event::Warning, ..Note::condition(condition, false, Reason::ReplicationDegraded, degraded_message) },
            look_again: None,
        };
    }
    let message = format!("{missing}: commits wait until enough are back, for at most {}s (whenTooFewReplicas: Degrade)", bound.as_secs());
    ReplicationPlan {
        set: None,
        note: Note::warn_once(condition, false, Reason::ReplicasMissing, message, true),
        look_again: Some(bound - waited),
    }
}
