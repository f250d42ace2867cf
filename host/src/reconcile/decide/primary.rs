//! Who leads: the failover, a leader an engine elects, and a planned switchover (asked
//! for, or for a drain of the primary's node). Pure, as the rest of [`super`].

use super::*;

/// Who is primary after the failover or elected stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Primary {
    /// The primary's pod.
    pub name: String,
    /// Another member was promoted in this pass.
    pub failed_over: bool,
    /// The primary is being replaced: a switchover waits for its member to catch up with
    /// the fenced primary, or a failover for the old primary's fence to be confirmed.
    pub switching: bool,
    /// What to tell the user.
    pub notes: Vec<Note>,
}

impl Primary {
    /// `name` stays primary.
    pub fn keep(name: &str) -> Self {
        Self { name: name.into(), failed_over: false, switching: false, notes: vec![] }
    }
}

/// Whether the plugin is asked to replace the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailoverQuestion {
    /// No: the primary stays (it is not lost, or the engine elects its own leader).
    Keep,
    /// No: it is lost, but no member can be promoted.
    Refuse(Note),
    /// Yes, with these members.
    Ask(Vec<Member>),
}

/// Whether the primary must be replaced: lost for at least `after`, on an engine whose
/// host chooses the primary. `lacks_failover` says why the plugin cannot choose one.
pub fn failover_question(
    members: &[Observed],
    primary: &str,
    after: Duration,
    elects_leader: bool,
    lacks_failover: Option<String>,
) -> FailoverQuestion {
    if elects_leader || !members::primary_lost(members, primary, after.as_secs() as i64) {
        return FailoverQuestion::Keep;
    }
    match lacks_failover {
        Some(why) => FailoverQuestion::Refuse(no_safe_failover(format!("primary {primary} is not ready and no member is promoted: {why}"))),
        None => FailoverQuestion::Ask(members::for_plugin(members, primary)),
    }
}

/// The primary after the plugin chose (lost for `after`, and `down` as its pod or node
/// says): the member it promotes, or the lost one, with why. Nobody is promoted while the
/// old primary's agent answers but its engine has neither confirmed the fence nor been
/// stopped: it may take writes again.
pub fn failover(primary: &str, after: Duration, down: Option<&str>, answer: Result<FailoverDecision, String>, fenced: Fenced) -> Primary {
    let down = down.map(|d| format!(" ({d})")).unwrap_or_default();
    let note = match answer {
        Ok(FailoverDecision::Promote { pod, command }) => {
            let fence = match fenced {
                Fenced::Confirmed => "fenced by its agent".to_string(),
                Fenced::Stopped => "fenced by its agent, which stopped its engine (it did not confirm the fence)".to_string(),
                Fenced::Ordered => {
                    let message = format!(
                        "primary {primary} not ready for {after:?}{down}: its agent fenced it, but its engine has not confirmed the \
                         fence and was not stopped; {pod} is promoted once it is (a hung engine that ran again could take writes)"
                    );
                    return Primary { switching: true, notes: vec![no_safe_failover(message)], ..Primary::keep(primary) };
                }
                Fenced::Unknown => format!(
                    "its agent did not fence it (unreachable, or no fence command); a primary cut off from every member fences itself after {:?}",
                    crate::agent::ISOLATED_FENCE_AFTER
                ),
            };
            let message =
                format!("primary {primary} not ready for {after:?}{down}, {fence}; promoting {pod} (promotion: {})", command.join(" "));
            let note = Note::event(true, Reason::FailoverPromoted, message);
            return Primary { name: pod, failed_over: true, switching: false, notes: vec![note] };
        }
        Ok(FailoverDecision::NoSafeMember(reason)) => {
            no_safe_failover(format!("primary {primary} is not ready and no member is safe to promote: {reason}"))
        }
        // The policy lets `elected` through only for an engine that elects its leader.
        Ok(FailoverDecision::Elected(_)) => return Primary::keep(primary),
        Err(e) => failover_failed(e),
    };
    Primary { notes: vec![note], ..Primary::keep(primary) }
}

/// The primary stays when it is down only because its node stopped renewing its lease
/// ([`members::cut_off`]) and its agent (`said`, in the order of `members`) answers as the
/// primary: the node lost the control plane, not its clients.
pub fn answering_though_cut_off(members: &[Observed], primary: &str, said: &[Option<crate::agent::Status>]) -> Option<Primary> {
    let answers = members.iter().zip(said).any(|(m, s)| m.name == primary && m.cut_off && s.as_ref().is_some_and(|s| s.primary));
    let message = format!("primary {primary}'s node has not renewed its lease, but its agent answers as the primary: no failover");
    answers.then(|| Primary { notes: vec![no_safe_failover(message)], ..Primary::keep(primary) })
}

/// The leader of an engine that elects its own, as the plugin reads the members'
/// answers; `primary` stays when none leads.
pub fn elected(primary: &str, plugin: &str, answer: Result<FailoverDecision, String>) -> Primary {
    let note = match answer {
        Ok(FailoverDecision::Elected(pod)) if pod == primary => return Primary::keep(primary),
        Ok(FailoverDecision::Elected(pod)) => {
            let message = format!("{plugin} elected {pod} to lead (was {primary})");
            return Primary { notes: vec![Note::event(false, Reason::LeaderElected, message)], ..Primary::keep(&pod) };
        }
        Ok(FailoverDecision::NoSafeMember(reason)) => {
            Note::warn_once(kind::DEGRADED, true, Reason::NoLeader, format!("no member leads: {reason}"), true)
        }
        // The policy lets only `elected` through for an engine that elects its leader.
        Ok(FailoverDecision::Promote { .. }) => return Primary::keep(primary),
        Err(e) => failover_failed(e),
    };
    Primary { notes: vec![note], ..Primary::keep(primary) }
}

/// What the failover stage does about a switchover the user asked for (annotation
/// [`crate::names::SWITCHOVER`], naming the member to lead).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SwitchoverQuestion {
    /// Nothing: none asked.
    None,
    /// The request is dropped: done (the member leads), or refused, as the note says.
    Drop(Note),
    /// The primary is fenced and the agents asked: the member is promoted once it has
    /// everything the fenced primary wrote.
    Fence,
}

/// Whether a switchover to `target` can start or go on: a ready member of an engine whose
/// host chooses the primary (whether its members have agents, to fence the primary and
/// say their positions, the fence tells).
pub fn switchover_question(target: Option<&str>, primary: &str, members: &[Observed], elects_leader: bool) -> SwitchoverQuestion {
    let Some(target) = target else { return SwitchoverQuestion::None };
    let refuse = |why: String| {
        let message = format!("switchover to {target} refused: {why}");
        SwitchoverQuestion::Drop(Note::event(true, Reason::SwitchoverRefused, message))
    };
    if target == primary {
        return SwitchoverQuestion::Drop(Note::event(false, Reason::SwitchoverDone, format!("switchover done: {target} is primary")));
    }
    match members.iter().find(|m| m.name == target && !m.terminating) {
        _ if elects_leader => refuse("the engine elects its own leader".into()),
        None => refuse(format!("{target} is not a member")),
        Some(m) if !m.ready => refuse(format!("{target} is not ready")),
        Some(_) => SwitchoverQuestion::Fence,
    }
}

/// The member to switch over to when the primary's node is cordoned (a drain begins,
/// and the primary's disruption budget holds its eviction back): the first ready member
/// whose node is not cordoned. None while the primary's node is not cordoned, or no
/// member can lead in its place, or another member is down (the budgets refuse the
/// drain then: the primary stays where it is, and serves).
pub fn drain_target<'a>(members: &'a [Observed], primary: &str, cordoned: impl Fn(&str) -> bool) -> Option<&'a Observed> {
    let on_cordoned = |m: &Observed| m.node.as_deref().is_some_and(&cordoned);
    members.iter().find(|m| m.name == primary).filter(|p| on_cordoned(p))?;
    if members.iter().any(|m| m.name != primary && (!m.ready || m.terminating)) {
        return None;
    }
    members.iter().find(|m| m.name != primary && !m.fenced && !on_cordoned(m))
}

/// What a switchover for a drain says while it fences the primary.
pub fn switching_for_drain(node: &str, primary: &str, target: &str) -> Note {
    let message = format!("node {node} of primary {primary} is cordoned: switching over to {target} before its eviction");
    Note::event(false, Reason::SwitchoverForDrain, message)
}

/// A switchover from `primary` to `target` once the primary's agent answered the fence
/// (`fenced`) and the agents said their statuses: the target leads once the primary is
/// fenced and the target, a replica, has reached the position the fenced primary says is
/// its last; until then the primary stays (fenced: a failover takes over if the target
/// never catches up). `primary_ready` says whether the primary still serves (refused,
/// not fenced, when its agent does not answer).
pub fn switchover(
    primary: &str,
    target: &str,
    fenced: Fenced,
    primary_ready: bool,
    (said_primary, said_target): (Option<&crate::agent::Status>, Option<&crate::agent::Status>),
) -> (Primary, Option<Note>) {
    let caught_up = match (said_primary, said_target) {
        (Some(p), Some(t)) if p.primary && !t.primary => (p.position == t.position).then(|| p.position.clone()),
        _ => None,
    };
    match (fenced, caught_up) {
        (Fenced::Confirmed, Some(position)) => {
            let message = format!("switchover: {primary} fenced; {target} has all it wrote (position {position}); promoting {target}");
            let note = Note::event(false, Reason::SwitchoverPromoted, message);
            (Primary { name: target.into(), failed_over: true, switching: false, notes: vec![note] }, None)
        }
        (Fenced::Unknown, _) if primary_ready => {
            let message = format!("switchover to {target} refused: the agent of {primary} did not fence it (no agent, or no answer)");
            (Primary::keep(primary), Some(Note::event(true, Reason::SwitchoverRefused, message)))
        }
        _ => (Primary { switching: true, ..Primary::keep(primary) }, None),
    }
}

fn no_safe_failover(message: String) -> Note {
    Note::warn_once(kind::DEGRADED, true, Reason::NoSafeFailover, message, true)
}

fn failover_failed(message: String) -> Note {
    Note::condition(kind::DEGRADED, true, Reason::FailoverFailed, message)
}
