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
    /// The primary is being replaced, and what that waits for: a switchover for its member
    /// to catch up with the fenced primary, or a failover for the old primary's fence to
    /// be confirmed.
    pub switching: Option<String>,
    /// What to tell the user.
    pub notes: Vec<Note>,
}

impl Primary {
    /// `name` stays primary.
    pub fn keep(name: &str) -> Self {
        Self { name: name.into(), failed_over: false, switching: None, notes: vec![] }
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
/// host chooses the primary, with another member to choose (a lone member's trouble is
/// named as it is: a crash loop, a member down). `lacks_failover` says why the plugin
/// cannot choose one.
pub fn failover_question(
    members: &[Observed],
    primary: &str,
    after: Duration,
    elects_leader: bool,
    lacks_failover: Option<String>,
) -> FailoverQuestion {
    let alone = members.iter().all(|m| m.name == primary);
    if elects_leader || alone || !members::primary_lost(members, primary, after.as_secs() as i64) {
        return FailoverQuestion::Keep;
    }
    match lacks_failover {
        Some(why) => FailoverQuestion::Refuse(no_safe_failover(format!("primary {primary} is not ready and no member is promoted: {why}"))),
        None => FailoverQuestion::Ask(members::for_plugin(members, primary)),
    }
}

/// Why a failover must wait for the replicas the lost primary last named to confirm its
/// commits (`told`, its record: [`Setting::key`]), while the Database still asks
/// for `synchronous` replicas: when as many of them as confirmed each commit are not
/// `candidates` that are ready and said their position, those could be the only members
/// holding the last commits, and promoting another would lose them. A replica not named
/// confirmed none of them, however ready; one named that answered has every commit that
/// one confirmed, and the plugin weighs it with the others. Asynchronous again, the user
/// accepts what the others have.
pub fn named_replicas_wait(told: Option<&str>, synchronous: u32, candidates: &[Member]) -> Option<String> {
    let told = Setting::parse(told?)?;
    let confirmed_each = told.replicas.min(synchronous);
    let answered = |name: &String| candidates.iter().any(|c| &c.pod == name && c.ready && !c.primary && c.position.is_some());
    let silent: Vec<&str> = told.members.iter().filter(|m| !answered(m)).map(String::as_str).collect();
    (confirmed_each > 0 && silent.len() >= confirmed_each as usize).then(|| {
        let (them, verb) = if silent.len() == 1 { ("it", "is") } else { ("they", "are") };
        format!(
            "{} {verb} named to confirm each commit ({confirmed_each} of {}) but {verb} not ready or gave no position: promoting \
             another could lose what only {them} confirmed; once {them} answer{}, or with spec.replication.mode Asynchronous \
             (accepting that loss), a replica is promoted",
            silent.join(", "),
            told.members.len(),
            if silent.len() == 1 { "s" } else { "" },
        )
    })
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
                    let waits = format!("failover to {pod}: waiting for {primary}'s engine to confirm its fence, or its agent to stop it");
                    return Primary { switching: Some(waits), notes: vec![no_safe_failover(message)], ..Primary::keep(primary) };
                }
                Fenced::Unknown => format!(
                    "its agent did not fence it (unreachable, or no fence command); a primary cut off from every member fences itself after {:?}",
                    crate::agent::ISOLATED_FENCE_AFTER
                ),
            };
            let message =
                format!("primary {primary} not ready for {after:?}{down}, {fence}; promoting {pod} (promotion: {})", command.join(" "));
            let note = Note::event(true, Reason::FailoverPromoted, message);
            return Primary { name: pod, failed_over: true, switching: None, notes: vec![note] };
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

/// Says in the promotion's note how many of the replicas asked (`following` of `asked`)
/// follow the new primary at once, told by their agents (the others find it on their
/// own).
pub fn told_to_follow(notes: &mut [Note], (following, asked): (usize, usize)) {
    let promoted = notes.iter_mut().find(|n| matches!(n.reason, Reason::FailoverPromoted | Reason::SwitchoverPromoted));
    if let Some(note) = promoted.filter(|_| asked > 0) {
        note.message.push_str(&format!("; {following} of {asked} replicas told to follow it"));
    }
}

/// The primary stays while its agent (`said`, in the order of `members`) answers as the
/// primary, its engine having answered the agent's query, when it is down only because
/// its node stopped renewing its lease ([`members::cut_off`]: the node lost the control
/// plane, not its clients), or only because its engine's readiness probe fails while
/// every container runs ([`Observed::probe_failing`]: a probe that timed out on a busy
/// node, or a pause of a few seconds). A hung engine does not answer its agent; a member
/// fenced, restarting or crashed is not kept.
pub fn answering_though_down(members: &[Observed], primary: &str, said: &[Option<crate::agent::Status>]) -> Option<Primary> {
    let (m, _) = members.iter().zip(said).find(|(m, s)| m.name == primary && !m.fenced && s.as_ref().is_some_and(|s| s.primary))?;
    let message = if m.cut_off {
        format!("primary {primary}'s node has not renewed its lease, but its agent answers as the primary: no failover")
    } else if m.probe_failing {
        let down = m.down.as_deref().unwrap_or("not ready");
        format!("primary {primary} is not ready ({down}), but its engine answers its agent as the primary: no failover")
    } else {
        return None;
    };
    Some(Primary { notes: vec![no_safe_failover(message)], ..Primary::keep(primary) })
}

/// The members that say they take writes while `primary` leads (`said`, in the order of
/// `members`): promoted behind the operator's back (a `pg_promote()` a database user ran),
/// or never told they no longer lead. A member already fenced says so of itself until it is
/// made again, and is not one. Each is fenced at once and made again to follow. One that
/// was never the primary is named: a second primary is an incident, whose writes no
/// other member has. The former primary back from a lost node (its pod made for it to
/// lead, or promoted in place; its own agent fenced it once it was cut off) is what a
/// failover leaves: an Event says it is fenced and follows.
pub fn second_primaries<'a>(members: &'a [Observed], primary: &str, said: &[Option<crate::agent::Status>]) -> Vec<(&'a Observed, Note)> {
    let leads = |s: &Option<crate::agent::Status>| s.as_ref().is_some_and(|s| s.primary);
    // Its pod made for it to lead, or promoted in place by its agent (a switchover).
    let led = |m: &Observed| m.promoted || m.rendered.as_ref().is_some_and(|(was, _)| *was == m.name);
    members
        .iter()
        .zip(said)
        .filter(|(m, s)| m.name != primary && !m.fenced && !m.terminating && leads(s))
        .map(|(m, _)| {
            let name = &m.name;
            let note = if led(m) {
                let message = format!("{name}, the primary before {primary}, is back and still leads as it did: fenced, and made again to follow {primary}");
                Note::event(true, Reason::FormerPrimaryBack, message)
            } else {
                let message = format!(
                    "{name} says it takes writes while {primary} is the primary: fenced (it takes no more, and is made again to follow {primary}); \
                     writes it took are not on the other members"
                );
                Note::warn_once(ConditionType::Degraded, true, Reason::SecondPrimary, message, false)
            };
            (m, note)
        })
        .collect()
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
            Note::warn_once(ConditionType::Degraded, true, Reason::NoLeader, format!("no member leads: {reason}"), true)
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
        Some(m) if m.not_replicating => refuse(format!("{target} is {}", m.down.as_deref().unwrap_or("not replicating"))),
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

/// How long a primary fenced for a switchover (asked for, or for a drain) may stay not
/// ready (its agent says so from its fence on) before it counts as lost: the member
/// chosen catches up and is promoted within it, unless it cannot, when the failover
/// takes over.
pub const SWITCHOVER_PATIENCE: Duration = Duration::from_secs(15);

/// The failover delay for `primary`: `after`, or at least [`SWITCHOVER_PATIENCE`] while a
/// switchover is under way (`switching`) and the primary is not ready because the
/// operator fenced it for that (not lost with its node: then nothing is waited for).
pub fn failover_delay(members: &[Observed], primary: &str, switching: bool, after: Duration) -> Duration {
    let fenced_for_it = switching && members.iter().any(|m| m.name == primary && m.fenced && !m.node_lost);
    if fenced_for_it { after.max(SWITCHOVER_PATIENCE) } else { after }
}

/// How many times the agent of a primary that serves is asked to fence it before a
/// switchover is refused: one answer lost on a busy node neither refuses the switchover
/// nor leaves a primary its agent fenced unseen.
pub const FENCE_ASKS: usize = 3;

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
            (Primary { name: target.into(), failed_over: true, switching: None, notes: vec![note] }, None)
        }
        (Fenced::Unknown, _) if primary_ready => {
            let message = format!(
                "switchover to {target} refused: the agent of {primary} did not fence it (no agent, or no answer to {FENCE_ASKS} asks)"
            );
            (Primary::keep(primary), Some(Note::event(true, Reason::SwitchoverRefused, message)))
        }
        _ => {
            let waits = match (fenced, said_primary, said_target) {
                (Fenced::Unknown, ..) => format!("the agent of {primary} to answer its fence"),
                (Fenced::Ordered, ..) => format!("{primary}'s engine to confirm its fence"),
                (_, None, _) => format!("the agent of {primary} to say its last position"),
                (_, _, None) => format!("the agent of {target} to say its position"),
                (_, Some(p), Some(t)) => format!("{target} (at {}) to reach {primary}'s last position {}", t.position, p.position),
            };
            let waits = format!("switchover to {target}: {primary} fenced; waiting for {waits}");
            (Primary { switching: Some(waits), ..Primary::keep(primary) }, None)
        }
    }
}

/// Members that should run their agent run none: the operator does not know its image.
pub fn no_agents() -> Note {
    let message =
        "the operator runs without its image (plugdb run --image): members run no agent, so no failover, fence or switchover happens";
    Note::warn_once(ConditionType::MemberAgents, false, Reason::NoOperatorImage, message.into(), false)
}

fn no_safe_failover(message: String) -> Note {
    Note::warn_once(ConditionType::Degraded, true, Reason::NoSafeFailover, message, true)
}

fn failover_failed(message: String) -> Note {
    Note::condition(ConditionType::Degraded, true, Reason::FailoverFailed, message)
}
