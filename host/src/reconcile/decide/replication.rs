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

/// What the primary's agent is asked to make each commit wait for, and each replica's
/// told (whether it is named).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// How many replicas confirm each commit (0: none).
    pub replicas: u32,
    /// The members that may (pods' names); none: any replica.
    pub members: Vec<String>,
}

impl Setting {
    /// How the agent is asked for it, and the primary's pod records it: `<n>` or
    /// `<n>/<member>,…`.
    pub fn key(&self) -> String {
        match self.members.as_slice() {
            [] => self.replicas.to_string(),
            members => format!("{}/{}", self.replicas, members.join(",")),
        }
    }

    /// The setting a [`Setting::key`] says, if it is one.
    pub fn parse(key: &str) -> Option<Setting> {
        let (replicas, members) = key.split_once('/').unwrap_or((key, ""));
        let members = members.split(',').filter(|m| !m.is_empty()).map(String::from).collect();
        Some(Setting { replicas: replicas.parse().ok()?, members })
    }
}

/// The primary's replicas, as a pass sees them.
#[derive(Debug, Clone, Copy)]
pub struct Replicas<'a> {
    /// The ready ones (ready, not fenced, not the primary): only these confirm commits.
    pub ready: &'a [String],
    /// What the primary's agent last had commits wait for ([`Setting::key`]), as its
    /// pod says, while its engine has not restarted since.
    pub told: Option<&'a str>,
    /// The agents can be asked to name the replicas that confirm (they run the plugin's
    /// synchronous command: the primary's, and each replica's, see
    /// [`crate::reconcile::replication`]); otherwise the primary's is asked only to lower
    /// synchronous replication and raise it again, and any replica confirms.
    pub named: bool,
}

/// What a pass does about synchronous replication.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicationPlan {
    /// Ask the primary's agent to make commits wait for this first; the note is said
    /// only once it did.
    pub set: Option<Setting>,
    /// The condition (and Event) to say.
    pub note: Note,
    /// When to look again, should nothing change before.
    pub look_again: Option<Duration>,
    /// While enough replicas are ready and the agents name them: the setting the primary
    /// works with, asked for or not, which each replica's agent is told too.
    pub named: Option<Setting>,
}

/// How long a pass waits to ask again when the primary's agent did not do what it was asked.
pub const ASK_AGAIN: Duration = Duration::from_secs(2);

/// What to do, from the user's choice, the primary's `replicas`, and the condition as
/// the last pass left it. While enough replicas are ready, each commit waits for the
/// ready ones alone: one that is not (it does not stream, or it fell behind) is never
/// counted, so a commit is only ever confirmed by a member a failover may choose.
pub fn replication(sync: Synchronous, replicas: Replicas, said: Option<&Condition>, now: Timestamp) -> ReplicationPlan {
    let n = sync.replicas;
    let ready = replicas.ready.len() as u32;
    let reason = said.map(|c| c.reason.as_str());
    let degraded = reason == Some(Reason::ReplicationDegraded.as_str());
    let condition = ConditionType::SynchronousReplication;
    // Ask for `setting` when the primary does not already work so.
    let unless_told = |setting: Setting| (replicas.told != Some(setting.key().as_str())).then_some(setting);
    if ready >= n {
        let message = format!("each commit waits for {n} of the {ready} ready replicas");
        let mut note = Note::condition(condition, true, Reason::SynchronousReplication, message);
        if degraded {
            // Synchronous again: news.
            note.event = Event::Normal;
        }
        let named = replicas.named.then(|| Setting { replicas: n, members: replicas.ready.to_vec() });
        let set = match &named {
            Some(setting) => unless_told(setting.clone()),
            None => degraded.then_some(Setting { replicas: n, members: vec![] }),
        };
        return ReplicationPlan { set, note, look_again: None, named };
    }
    let missing = format!("{ready} of the {n} replicas each commit waits for are ready");
    let Some(bound) = sync.degrade_after else {
        let message = format!("{missing}: commits wait until enough are back (whenTooFewReplicas: Wait)");
        return ReplicationPlan {
            set: None,
            note: Note::warn_once(condition, false, Reason::ReplicasMissing, message, true),
            look_again: None,
            named: None,
        };
    };
    let degraded_message =
        format!("{missing}, for longer than {}s: commits no longer wait for replicas until enough are back", bound.as_secs());
    let none = Setting { replicas: 0, members: vec![] };
    if degraded {
        // A primary that restarted, or a new one, starts synchronous: asked again.
        return ReplicationPlan {
            set: unless_told(none),
            note: Note::condition(condition, false, Reason::ReplicationDegraded, degraded_message),
            look_again: None,
            named: None,
        };
    }
    let since = said.filter(|c| c.status == "False").map(|c| c.last_transition_time.0).unwrap_or(now);
    let waited: Duration = now.duration_since(since).try_into().unwrap_or_default();
    if waited >= bound {
        return ReplicationPlan {
            set: Some(none),
            note: Note { event: Event::Warning, ..Note::condition(condition, false, Reason::ReplicationDegraded, degraded_message) },
            look_again: None,
            named: None,
        };
    }
    let message = format!("{missing}: commits wait until enough are back, for at most {}s (whenTooFewReplicas: Degrade)", bound.as_secs());
    ReplicationPlan {
        set: None,
        note: Note::warn_once(condition, false, Reason::ReplicasMissing, message, true),
        look_again: Some(bound - waited),
        named: None,
    }
}
