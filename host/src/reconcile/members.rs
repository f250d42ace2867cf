//! The member pods: role labels, the host-driven rolling restart (replicas first,
//! primary last), and failover decisions.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::crd::MemberStatus;
use crate::names::{REVISION_LABEL, ROLE_LABEL};
use crate::plugin::Member;

/// How long a new member pod may take to become ready before it counts as down: the
/// new primary restarting to take its role after a failover must not be failed over.
/// A pod that was ready since its containers started has had its grace: it is down from
/// when it stopped being ready (a primary that hangs in its first minute is failed over
/// as an older one is).
pub const STARTUP_GRACE_SECONDS: i64 = 60;

/// Whether pod `p`, not ready since `transition`, was ready after its containers (as they
/// run now) started: its Ready condition turned false after each of them started, so it
/// had turned true before (a new pod's condition is false from before they start).
fn ready_since_started(p: &Pod, transition: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> bool {
    let containers = p.status.as_ref().and_then(|s| s.container_statuses.as_deref()).unwrap_or_default();
    let started = |c: &k8s_openapi::api::core::v1::ContainerStatus| c.state.as_ref()?.running.as_ref()?.started_at.clone();
    !containers.is_empty() && containers.iter().all(|c| started(c).is_some_and(|at| at.0 < transition.0))
}

/// What the host knows about one member pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Pod name.
    pub name: String,
    /// StatefulSet ordinal.
    pub ordinal: u32,
    /// Ready condition.
    pub ready: bool,
    /// Seconds it has been in its state: since the Ready condition last changed, and for
    /// a pod younger than [`STARTUP_GRACE_SECONDS`] that has not been ready yet, after
    /// that grace only (a member starting, as the new primary does after a failover, is
    /// not yet down).
    pub since_seconds: i64,
    /// StatefulSet revision the pod runs.
    pub revision: Option<String>,
    /// Its role label.
    pub role: Option<String>,
    /// Being deleted.
    pub terminating: bool,
    /// Why the scheduler could not place it, while it cannot.
    pub unschedulable: Option<String>,
    /// Its pod address, once it has one.
    pub address: Option<String>,
    /// The node it runs on, once scheduled.
    pub node: Option<String>,
    /// Why it is not ready, while it is not: what its pod says, or what its node does.
    pub down: Option<String>,
    /// When its Ready condition last changed (RFC 3339).
    pub ready_since: Option<String>,
    /// Which run of its containers this is: its Ready condition's last change and their
    /// restarts (`<time>+<restarts>`). What its agent was told to set as the engine runs
    /// holds while this does not change: an engine that restarts starts from its rendered
    /// configuration, whether or not its pod was ready.
    pub run: Option<String>,
    /// The primary its template was rendered for, and that template's hash without the
    /// primary's name (see [`crate::names::ROLE_FREE_HASH`]).
    pub rendered: Option<(String, String)>,
    /// Its pod runs the member agent.
    pub agent: bool,
    /// The operator asked its agent to fence it ([`crate::names::FENCED`]).
    pub fenced: bool,
    /// Its agent promoted it in place ([`crate::names::PROMOTED`]).
    pub promoted: bool,
    /// How long ago its agent promoted it in place, as its pod says.
    pub led_seconds: Option<i64>,
    /// The primary it was promoted in place to replace ([`crate::names::REPLACES`]).
    pub replaces: Option<String>,
    /// The member its agent had it follow, once promoted ([`crate::names::FOLLOWS`]).
    pub follows: Option<String>,
    /// Taken as down because its node stopped renewing its lease ([`cut_off`]), though
    /// its pod still says it is ready.
    pub cut_off: bool,
    /// Taken as down because it does not replicate ([`not_replicating`]), though its pod
    /// still says it is ready.
    pub not_replicating: bool,
    /// It has not replicated for long enough to be made again: restarted.
    pub remake: bool,
    /// Its node is lost (not ready, or cut off): deleting its pod cannot end it until the
    /// node is back, so the roll neither restarts it nor waits for it.
    pub node_lost: bool,
    /// A container of its pod fails each time it starts, and waits to be started again
    /// (`CrashLoopBackOff`): `down` names it with its last words.
    pub crash_loop: bool,
    /// Not ready only because a readiness probe fails: every container runs, and the
    /// agent's (which a fence makes not ready) is ready.
    pub probe_failing: bool,
    /// What its agent said in this pass: whether it streams from a primary (a replica
    /// that knows its lag); `None` when it gave no status (see [`next_to_roll`]).
    pub streaming: Option<bool>,
    /// What its agent was last told of synchronous commits (a synchronous setting's key,
    /// see [`crate::names::SYNCHRONOUS`]), and in which [`Self::run`]: a failover weighs the
    /// replicas a lost primary last had confirm its commits, whatever happened since.
    pub last_told: Option<(String, String)>,
}

impl Observed {
    /// What its agent was last told of synchronous commits while its engine has run since
    /// (an engine that restarts starts from its rendered configuration).
    pub fn synchronous(&self) -> Option<&str> {
        self.last_told.as_ref().filter(|(_, run)| self.run.as_deref() == Some(run.as_str())).map(|(key, _)| key.as_str())
    }

    /// A ready member `name` at `address`, everything else unknown: what tests build
    /// their members from.
    #[cfg(test)]
    pub fn at(name: &str, address: Option<String>) -> Self {
        Observed {
            name: name.into(),
            ordinal: 0,
            ready: true,
            since_seconds: 0,
            revision: None,
            role: None,
            terminating: false,
            unschedulable: None,
            node: None,
            down: None,
            ready_since: None,
            run: None,
            rendered: None,
            agent: true,
            fenced: false,
            promoted: false,
            led_seconds: None,
            replaces: None,
            follows: None,
            cut_off: false,
            not_replicating: false,
            remake: false,
            node_lost: false,
            crash_loop: false,
            probe_failing: false,
            streaming: None,
            last_told: None,
            address,
        }
    }
}

/// The members of StatefulSet `sts` among `pods`, by ordinal.
pub fn observe<P: std::borrow::Borrow<Pod>>(sts: &str, pods: &[P], now: Timestamp) -> Vec<Observed> {
    let mut out: Vec<Observed> = pods
        .iter()
        .map(|p| p.borrow())
        .filter_map(|p| {
            let name = p.name_any();
            let ordinal = name.strip_prefix(sts)?.strip_prefix('-')?.parse().ok()?;
            let conditions = p.status.as_ref()?.conditions.as_ref()?;
            let ready_condition = conditions.iter().find(|c| c.type_ == "Ready").cloned();
            let unschedulable = conditions
                .iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                .map(|c| c.message.clone().unwrap_or_else(|| c.reason.clone().unwrap_or_default()));
            let ready = ready_condition.as_ref().is_some_and(|c| c.status == "True");
            let looping = crash_looping(p);
            let crash_loop = looping.is_some();
            let containers = p.status.as_ref().and_then(|s| s.container_statuses.as_deref()).unwrap_or_default();
            let running = |c: &&k8s_openapi::api::core::v1::ContainerStatus| c.state.as_ref().is_some_and(|s| s.running.is_some());
            let probe_failing = !ready
                && !containers.is_empty()
                && containers.iter().all(|c| running(&c) && (c.ready || c.name != crate::build::agent::CONTAINER));
            let down = (!ready && unschedulable.is_none()).then(|| looping.unwrap_or_else(|| why_not_ready(p, ready_condition.as_ref())));
            let age = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| now.duration_since(t.0).as_secs();
            let transition = ready_condition.and_then(|c| c.last_transition_time);
            let ready_since = transition.as_ref().map(|t| t.0.to_string());
            let restarts: i32 = containers.iter().map(|c| c.restart_count).sum();
            let run = ready_since.as_ref().map(|at| format!("{at}+{restarts}"));
            let served = !ready && transition.as_ref().is_some_and(|t| ready_since_started(p, t));
            let changed = transition.map(|t| age(&t)).unwrap_or(0);
            let started = match p.metadata.creation_timestamp.as_ref() {
                Some(created) if !served => age(created) - STARTUP_GRACE_SECONDS,
                _ => i64::MAX,
            };
            let since_seconds = changed.min(started);
            let told = p.annotations().get(crate::names::SYNCHRONOUS).and_then(|told| told.split_once('@'));
            let last_told = told.map(|(key, run)| (key.to_string(), run.to_string()));
            Some(Observed {
                ordinal,
                ready,
                since_seconds,
                revision: p.labels().get(REVISION_LABEL).cloned(),
                role: p.labels().get(ROLE_LABEL).cloned(),
                terminating: p.metadata.deletion_timestamp.is_some(),
                unschedulable,
                address: p.status.as_ref().and_then(|s| s.pod_ip.clone()),
                node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
                down,
                ready_since,
                run,
                rendered: p
                    .annotations()
                    .get(crate::names::PRIMARY_ANNOTATION)
                    .cloned()
                    .zip(p.annotations().get(crate::names::ROLE_FREE_HASH).cloned()),
                agent: p.spec.as_ref().is_some_and(|s| s.containers.iter().any(|c| c.name == crate::build::agent::CONTAINER)),
                fenced: p.annotations().contains_key(crate::names::FENCED),
                promoted: p.annotations().contains_key(crate::names::PROMOTED),
                led_seconds: p
                    .annotations()
                    .get(crate::names::PROMOTED)
                    .and_then(|t| t.parse::<Timestamp>().ok())
                    .map(|t| now.duration_since(t).as_secs()),
                replaces: p.annotations().get(crate::names::REPLACES).cloned(),
                follows: p.annotations().get(crate::names::FOLLOWS).cloned(),
                cut_off: false,
                not_replicating: false,
                remake: false,
                node_lost: false,
                crash_loop,
                probe_failing,
                streaming: None,
                last_told,
                name,
            })
        })
        .collect();
    out.sort_by_key(|m| m.ordinal);
    out
}

/// Takes each ready replica that does not replicate as down, while `primary` serves: the
/// status (`before`, what the agents last said) has it a replica that streams nothing
/// (it knows no lag) and is not at the primary's last position (it is behind, not
/// caught up), with the same answer for `after` or longer, and it has been ready that
/// long. Its pod is ready (its engine answers), but it would serve stale reads,
/// confirm no synchronous commit, and lead with what it lacks: it is no switchover
/// target and counts for no synchronous commit; half as long again, and it is made
/// again (restarted, see [`Wanted::runs`]).
pub fn not_replicating(members: &mut [Observed], primary: &str, before: &[MemberStatus], now: Timestamp, after: std::time::Duration) {
    let after = after.as_secs() as i64;
    let remake_after = after + after / 2;
    if !members.iter().any(|m| m.name == primary && m.ready && !m.fenced) {
        return;
    }
    let eligible = |m: &Observed| m.ready && !m.terminating && !m.fenced && m.name != primary && m.since_seconds >= after;
    let Some(leads_at) = before.iter().find(|b| b.pod == primary).and_then(|b| b.position.as_deref()) else { return };
    for m in members.iter_mut().filter(|m| eligible(m)) {
        let behind = |b: &&MemberStatus| b.position.as_deref().is_some_and(|p| p != leads_at);
        let said = before.iter().filter(behind).find(|b| b.pod == m.name && b.role == "replica" && b.lag.is_none());
        let heard = said.and_then(|b| b.heard.as_deref()?.parse::<Timestamp>().ok());
        let Some(silent) = heard.map(|at| now.duration_since(at).as_secs()).filter(|s| *s >= after) else { continue };
        m.down = Some(format!("ready, but it has not replicated from {primary} for {silent} s: its agent says it streams nothing"));
        (m.ready, m.not_replicating, m.remake) = (false, true, silent >= remake_after);
    }
}

/// Takes each ready member on a node that has been silent (its lease unrenewed, see
/// [`super::cache::leases`]) as down since the node's last renewal: its pod still says
/// it is ready only because its kubelet can no longer say otherwise.
pub fn cut_off(members: &mut [Observed], silent_for: impl Fn(&str) -> Option<std::time::Duration>) {
    for m in members.iter_mut().filter(|m| m.ready) {
        let Some(silent) = m.node.as_deref().and_then(&silent_for) else { continue };
        let node = m.node.as_deref().unwrap_or_default();
        m.down = Some(format!("node {node} has not renewed its lease for {} s: cut off from the control plane", silent.as_secs()));
        (m.ready, m.cut_off, m.node_lost, m.since_seconds) = (false, true, true, silent.as_secs() as i64);
    }
}

/// The container of `pod` that fails each time it starts and waits to be started again,
/// named with how often it restarted and its last words (the end of its log, which the
/// kubelet keeps as its termination message: `FallbackToLogsOnError`), on one line.
fn crash_looping(pod: &Pod) -> Option<String> {
    let containers = pod.status.as_ref().and_then(|s| s.container_statuses.as_deref()).unwrap_or_default();
    let c = containers
        .iter()
        .find(|c| c.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref()) == Some("CrashLoopBackOff"))?;
    let ended = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    let words: Vec<&str> =
        ended.and_then(|t| t.message.as_deref()).unwrap_or_default().lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let exit = ended.map(|t| format!(", last with exit code {}", t.exit_code)).unwrap_or_default();
    let said = if words.is_empty() { String::new() } else { format!(": {}", crate::said::last(&words.join(" | "), 120)) };
    Some(format!("container {} is crash looping (restarted {} times{exit}){said}", c.name, c.restart_count))
}

/// What a member's pod says about why it is not ready (when no container crash loops):
/// a container waiting or ended (with its reason), else the Ready condition's own words.
fn why_not_ready(pod: &Pod, ready: Option<&k8s_openapi::api::core::v1::PodCondition>) -> String {
    let containers = pod.status.as_ref().and_then(|s| s.container_statuses.as_deref()).unwrap_or_default();
    let container = containers.iter().filter(|c| !c.ready).find_map(|c| {
        let state = c.state.as_ref()?;
        let (reason, message) = match (&state.waiting, &state.terminated) {
            (Some(w), _) => (w.reason.clone(), w.message.clone()),
            (_, Some(t)) => (t.reason.clone(), t.message.clone()),
            _ => return Some(format!("container {} is not ready", c.name)),
        };
        let why = [reason, message].into_iter().flatten().collect::<Vec<_>>().join(": ");
        Some(format!("container {} {}", c.name, if why.is_empty() { "is not running".to_string() } else { why }))
    });
    let condition = ready.and_then(|c| c.message.clone().or_else(|| c.reason.clone()));
    container.or(condition).unwrap_or_else(|| "not ready".into())
}

/// What the members should run: the StatefulSet's revision, and the hash of its
/// template without the primary's name.
#[derive(Debug, Clone, Copy)]
pub struct Wanted<'a> {
    /// The update revision.
    pub revision: &'a str,
    /// [`crate::names::ROLE_FREE_HASH`] of the template.
    pub role_free: &'a str,
}

impl Wanted<'_> {
    /// Whether `m` runs what it should: the revision, or, for the primary its agent
    /// promoted in place and for a replica its agent had follow it (streaming from it:
    /// see `agent.follow-command`), the same template but for the primary's name (each
    /// runs on as it is). Any other replica runs what it should only on the revision:
    /// once another member leads it restarts, so that it starts on the new primary's
    /// history (a replica that followed the old primary to its last record may hold what
    /// the new one never had, and could not follow it otherwise). A member the operator
    /// fenced that is not the
    /// primary runs nothing it should: its fence lasts until its pod is made again. The
    /// primary promoted in place runs nothing it should once another leads (it led: it
    /// must rejoin as a replica, and its agent may have fenced it where the operator
    /// could not see).
    fn runs(&self, m: &Observed, primary: &str) -> bool {
        if (m.fenced || m.promoted || m.remake) && m.name != primary {
            return false;
        }
        let same_but_primary = |(was, hash): &(String, String)| *was != m.name && !self.role_free.is_empty() && *hash == self.role_free;
        let same = m.rendered.as_ref().is_some_and(same_but_primary);
        let in_place = m.name == primary && m.promoted && same;
        let follows = m.name != primary && m.follows.as_deref() == Some(primary) && same;
        m.revision.as_deref() == Some(self.revision) || in_place || follows
    }
}

/// The pod to delete next to roll members onto what they should run ([`Wanted`]), one
/// at a time:
/// 1. after a failover or a switchover, the new primary, started as a replica (or
///    outdated while the old primary is down), takes no writes until it restarts as the
///    primary: it restarts first, whatever the others do;
/// 2. members down on the old revision serve nothing: they restart next;
/// 3. otherwise only while every member is ready: replicas (highest ordinal first),
///    then the primary. A fenced member is not among them: it restarts once its fence
///    shows (it is not ready, so no Service leads to it any more, and nothing that
///    reconnects through one follows it into its shutdown).
///
/// A member on a lost node is left out of all three: its pod cannot be deleted until
/// the node is back, and the others must not wait for it (after a failover a replica
/// left that does not stream restarts to follow the new primary, or synchronous commits
/// wait for as long as the node is away; one that streams is not restarted then: its
/// restart would stop those commits while it lasts).
pub fn next_to_roll<'a>(members: &'a [Observed], wanted: Wanted<'_>, primary: &str, desired: usize) -> Option<&'a Observed> {
    if members.iter().any(|m| m.terminating && !m.node_lost) {
        return None;
    }
    let outdated = |m: &&Observed| !wanted.runs(m, primary);
    let the_primary = members.iter().find(|m| m.name == primary);
    let promoted = |p: &&Observed| p.rendered.as_ref().is_some_and(|(was, _)| *was != p.name);
    if let Some(p) = the_primary.filter(outdated).filter(promoted) {
        return Some(p);
    }
    let broken = members.iter().filter(outdated).find(|m| !m.ready && !m.node_lost && m.name != primary);
    if let (Some(p), Some(_)) = (the_primary.filter(outdated).filter(|p| p.ready), broken) {
        return Some(p);
    }
    if let Some(m) = broken {
        return Some(m);
    }
    if members.len() < desired || members.iter().any(|m| !m.ready && !m.node_lost) {
        return None;
    }
    // While a member is away only what a new primary needs restarts: a replica that
    // followed another leader, once its agent says it streams nothing (one that streams
    // does from the primary, the one a replica reaches: the other is fenced or away; one
    // whose agent is silent is made again if it does not replicate). It restarts once the member
    // is back, when another replica can confirm synchronous commits meanwhile. The
    // primary last, and not while a member is away (it would leave none serving).
    let away = members.iter().any(|m| m.node_lost);
    let grace_over = follow_grace_left(members, primary).is_none();
    let to_follow = |m: &&Observed| grace_over && follows_another(m, primary) && m.streaming == Some(false);
    let replica =
        members.iter().rev().filter(outdated).filter(|m| !away || to_follow(m)).find(|m| m.name != primary && !m.fenced && !m.node_lost);
    replica.or_else(|| the_primary.filter(outdated).filter(|_| !away))
}

/// Whether `m` was rendered to follow a member other than `primary` (which led before).
fn follows_another(m: &Observed, primary: &str) -> bool {
    m.rendered.as_ref().is_some_and(|(was, _)| was != primary)
}

/// How long a new primary serves before a replica that does not stream from it yet is
/// restarted to follow it, while a member is away: a MariaDB replica reconnects through
/// the read-write Service every 2 s once it leads.
pub const FOLLOW_GRACE_SECONDS: i64 = 10;

/// What is left of [`FOLLOW_GRACE_SECONDS`] while the roll would restart a replica to
/// follow `primary` (see [`to_follow_while_away`]): looked at again then. A primary
/// serves from when it was ready, or, promoted in place (ready long before), from its
/// promotion.
pub fn follow_grace_left(members: &[Observed], primary: &str) -> Option<std::time::Duration> {
    let leader = members.iter().find(|m| m.name == primary && m.ready)?;
    let serving = leader.led_seconds.map_or(leader.since_seconds, |led| led.min(leader.since_seconds));
    let left = FOLLOW_GRACE_SECONDS - serving;
    (left > 0 && to_follow_while_away(members, primary)).then(|| std::time::Duration::from_secs(left as u64))
}

/// Whether the roll would restart a replica to follow `primary` while a member is away
/// ([`next_to_roll`]), but for what its agent says now: its agent is asked in the pass
/// that decides.
pub fn to_follow_while_away(members: &[Observed], primary: &str) -> bool {
    let told = |m: &Observed| m.follows.as_deref() == Some(primary);
    members.iter().any(|m| m.node_lost)
        && members.iter().all(|m| m.ready || m.node_lost)
        && members.iter().any(|m| m.name != primary && !m.fenced && !m.node_lost && follows_another(m, primary) && !told(m))
}

/// Whether every member runs what it should (see [`Wanted`]) and is ready.
pub fn rolled(members: &[Observed], wanted: Wanted<'_>, primary: &str, desired: usize) -> bool {
    members.len() == desired && members.iter().all(|m| m.ready && !m.terminating && wanted.runs(m, primary))
}

/// The members as the plugin sees them for a failover question, without positions
/// (their agents say them: [`with_positions`]).
pub fn for_plugin(members: &[Observed], primary: &str) -> Vec<Member> {
    members
        .iter()
        .map(|m| Member {
            pod: m.name.clone(),
            ordinal: m.ordinal,
            ready: m.ready,
            primary: m.name == primary,
            position: None,
            answer: None,
        })
        .collect()
}

/// `candidates` (of `members`, in the same order) with the position each member's agent
/// said: a replica takes the position it said as a replica; a member that says it is
/// primary while it is not the one in status is given none (it is never promoted on its
/// own word), unless the operator was promoting it in place to replace that primary
/// ([`Observed::replaces`]) and was stopped before it recorded it: then it is a candidate
/// with what it has, and, chosen, promoted again (a promotion is asked for as often as it
/// takes) and recorded.
pub fn with_positions(mut candidates: Vec<Member>, members: &[Observed], said: Vec<Option<crate::agent::Status>>) -> Vec<Member> {
    let primary = candidates.iter().find(|c| c.primary).map(|c| c.pod.clone());
    for ((member, observed), status) in candidates.iter_mut().zip(members).zip(said) {
        let cut_short = !member.primary && !observed.fenced && primary.is_some() && observed.replaces == primary;
        member.position = status.filter(|s| s.primary == member.primary || (s.primary && cut_short)).map(|s| s.position);
    }
    candidates
}

/// The least time since its node's last lease renewal seen before a primary taken as
/// down by that silence ([`cut_off`]) is replaced, whatever the failover delay: its node
/// may have been cut off up to a renewal interval (10 s, and a little jitter) after that
/// renewal, and its agent fences it within [`crate::agent::FENCED_WITHIN`] of its
/// isolation. So a lost node's primary is replaced 16–27 s after the loss; the node's
/// silence ([`super::cache::leases::SILENT_AFTER`], two missed renewals) is what keeps a
/// slow kubelet from counting as a lost node.
pub const CUT_OFF_FAILOVER_SECONDS: i64 = 11 + crate::agent::FENCED_WITHIN.as_secs() as i64;

/// How long primary `m` must be down before it counts as lost: the failover delay, or
/// for a primary whose node went silent [`CUT_OFF_FAILOVER_SECONDS`] after the node's
/// last renewal (the silence says more than a pod's readiness can).
fn lost_after(m: &Observed, after_seconds: i64) -> i64 {
    if m.cut_off { CUT_OFF_FAILOVER_SECONDS } else { after_seconds }
}

/// Whether the primary has been not ready (or missing) for at least `after_seconds`
/// (or, when its node went silent, [`CUT_OFF_FAILOVER_SECONDS`]).
pub fn primary_lost(members: &[Observed], primary: &str, after_seconds: i64) -> bool {
    primary_lost_in(members, primary, after_seconds).is_some_and(|left| left.is_zero())
}

/// How long until primary `primary`, a member that is down, counts as lost (zero once it
/// does): when to look at it again.
pub fn primary_lost_in(members: &[Observed], primary: &str, after_seconds: i64) -> Option<std::time::Duration> {
    let m = members.iter().find(|m| m.name == primary && !m.ready && !m.terminating)?;
    Some(std::time::Duration::from_secs((lost_after(m, after_seconds) - m.since_seconds).max(0) as u64))
}

#[cfg(test)]
mod tests;
