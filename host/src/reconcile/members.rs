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
pub const STARTUP_GRACE_SECONDS: i64 = 60;

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
    /// a pod younger than [`STARTUP_GRACE_SECONDS`] after that grace only (a member
    /// starting, as the new primary does after a failover, is not yet down).
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
    /// The primary its template was rendered for, and that template's hash without the
    /// primary's name (see [`crate::names::ROLE_FREE_HASH`]).
    pub rendered: Option<(String, String)>,
    /// The operator asked its agent to fence it ([`crate::names::FENCED`]).
    pub fenced: bool,
    /// Its agent promoted it in place ([`crate::names::PROMOTED`]).
    pub promoted: bool,
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
}

impl Observed {
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
            rendered: None,
            fenced: false,
            promoted: false,
            follows: None,
            cut_off: false,
            not_replicating: false,
            remake: false,
            node_lost: false,
            crash_loop: false,
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
            let down = (!ready && unschedulable.is_none()).then(|| why_not_ready(p, ready_condition.as_ref()));
            let age = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| now.duration_since(t.0).as_secs();
            let transition = ready_condition.and_then(|c| c.last_transition_time);
            let ready_since = transition.as_ref().map(|t| t.0.to_string());
            let changed = transition.map(|t| age(&t)).unwrap_or(0);
            let started = p.metadata.creation_timestamp.as_ref().map(|t| age(t) - STARTUP_GRACE_SECONDS).unwrap_or(i64::MAX);
            let since_seconds = changed.min(started);
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
                rendered: p
                    .annotations()
                    .get(crate::names::PRIMARY_ANNOTATION)
                    .cloned()
                    .zip(p.annotations().get(crate::names::ROLE_FREE_HASH).cloned()),
                fenced: p.annotations().contains_key(crate::names::FENCED),
                promoted: p.annotations().contains_key(crate::names::PROMOTED),
                follows: p.annotations().get(crate::names::FOLLOWS).cloned(),
                cut_off: false,
                not_replicating: false,
                remake: false,
                node_lost: false,
                crash_loop: crash_looping(p).is_some(),
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

/// What a member's pod says about why it is not ready: a container crash looping (with
/// its last words), or waiting or ended (with its reason), else the Ready condition's own
/// words.
fn why_not_ready(pod: &Pod, ready: Option<&k8s_openapi::api::core::v1::PodCondition>) -> String {
    if let Some(looping) = crash_looping(pod) {
        return looping;
    }
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
/// the node is back, and the others must not wait for it (after a failover the replicas
/// left restart to follow the new primary, or synchronous commits wait for as long as
/// the node is away).
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
    // followed another leader. The primary last, and not while a member is away (it
    // would leave none serving).
    let away = members.iter().any(|m| m.node_lost);
    let follows_another = |m: &&Observed| m.rendered.as_ref().is_some_and(|(was, _)| was != primary);
    let replica = members
        .iter()
        .rev()
        .filter(outdated)
        .filter(|m| !away || follows_another(m))
        .find(|m| m.name != primary && !m.fenced && !m.node_lost);
    replica.or_else(|| the_primary.filter(outdated).filter(|_| !away))
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

/// `candidates` with the position each member's agent said, in the same order: a replica
/// takes the position it said as a replica; a member that says it is primary while it is
/// not the one in status is given none (it is never promoted on its own word).
pub fn with_positions(mut candidates: Vec<Member>, said: Vec<Option<crate::agent::Status>>) -> Vec<Member> {
    for (member, status) in candidates.iter_mut().zip(said) {
        member.position = status.filter(|s| s.primary == member.primary).map(|s| s.position);
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
mod tests {
    use super::*;

    fn m(ordinal: u32, ready: bool, revision: &str) -> Observed {
        Observed { ordinal, ready, since_seconds: 100, revision: Some(revision.into()), ..Observed::at(&format!("db-{ordinal}"), None) }
    }

    const NEW: Wanted = Wanted { revision: "new", role_free: "same" };

    /// After a failover the promoted member (to take its role) restarts first, then the
    /// old primary (to follow), then the other replicas (onto the new primary's history),
    /// highest ordinal first, only once every member is ready.
    #[test]
    fn a_failover_restarts_the_promoted_member_then_the_old_primary_then_the_replicas() {
        let rendered = |ordinal: u32, ready: bool| Observed { rendered: Some(("db-0".into(), "same".into())), ..m(ordinal, ready, "old") };
        let members = vec![rendered(0, false), rendered(1, true), rendered(2, true)];
        assert_eq!(next_to_roll(&members, NEW, "db-1", 3).map(|m| m.name.as_str()), Some("db-1"));
        let members = vec![rendered(0, false), m(1, true, "new"), rendered(2, true)];
        assert_eq!(next_to_roll(&members, NEW, "db-1", 3).map(|m| m.name.as_str()), Some("db-0"));
        let members = vec![m(0, true, "new"), m(1, true, "new"), rendered(2, true)];
        assert_eq!(next_to_roll(&members, NEW, "db-1", 3).map(|m| m.name.as_str()), Some("db-2"), "the other replica too");
        assert!(!rolled(&members, NEW, "db-1", 3));
        // Any other change of the template restarts it as well.
        let other = Wanted { revision: "new", role_free: "changed" };
        assert_eq!(next_to_roll(&members, other, "db-1", 3).map(|m| m.name.as_str()), Some("db-2"));
        assert!(!rolled(&members, other, "db-1", 3));
        let members = vec![m(0, true, "new"), m(1, true, "new"), m(2, true, "new")];
        assert!(rolled(&members, NEW, "db-1", 3));
    }

    /// A replica its agent had follow the member promoted in place runs on as it is: not
    /// restarted to follow it, unless it follows another or anything but the primary's
    /// name changed in its template.
    #[test]
    fn a_replica_that_follows_the_new_primary_is_not_restarted_for_it() {
        let replica = |ordinal: u32| Observed { rendered: Some(("db-0".into(), "same".into())), ..m(ordinal, true, "old") };
        let promoted = Observed { promoted: true, ..replica(1) };
        let follows = |whom: &str| Observed { follows: Some(whom.into()), ..replica(2) };
        let members = vec![m(0, true, "new"), promoted.clone(), follows("db-1")];
        assert_eq!(next_to_roll(&members, NEW, "db-1", 3), None, "follows db-1, which leads");
        assert!(rolled(&members, NEW, "db-1", 3));
        let members = vec![m(0, true, "new"), promoted.clone(), follows("db-0")];
        assert_eq!(next_to_roll(&members, NEW, "db-1", 3).map(|m| m.name.as_str()), Some("db-2"), "followed an earlier primary");
        let members = vec![m(0, true, "new"), promoted, follows("db-1")];
        let other = Wanted { revision: "new", role_free: "changed" };
        assert_eq!(next_to_roll(&members, other, "db-1", 3).map(|m| m.name.as_str()), Some("db-1"), "anything else changed: rolls");
        assert!(!rolled(&members, other, "db-1", 3));
    }

    /// A member its agent promoted in place leads as it runs: not restarted for its role,
    /// unless anything but the primary's name changed in its template.
    #[test]
    fn a_member_promoted_in_place_is_not_restarted_to_lead() {
        let replica = |ordinal: u32| Observed { rendered: Some(("db-0".into(), "same".into())), ..m(ordinal, true, "old") };
        let members = vec![Observed { fenced: true, ready: false, ..replica(0) }, Observed { promoted: true, ..replica(1) }, replica(2)];
        assert_eq!(next_to_roll(&members, NEW, "db-1", 3).map(|m| m.name.as_str()), Some("db-0"), "only the fenced old primary");
        let members = vec![m(0, true, "new"), Observed { promoted: true, ..replica(1) }, replica(2)];
        assert_eq!(next_to_roll(&members, NEW, "db-1", 3).map(|m| m.name.as_str()), Some("db-2"), "the other replica, onto its history");
        let members = vec![m(0, true, "new"), Observed { promoted: true, ..replica(1) }, m(2, true, "new")];
        assert!(rolled(&members, NEW, "db-1", 3));
        let restarted = vec![m(0, true, "new"), replica(1), replica(2)];
        assert_eq!(next_to_roll(&restarted, NEW, "db-1", 3).map(|m| m.name.as_str()), Some("db-1"), "not promoted in place: restarts");
        let other = Wanted { revision: "new", role_free: "changed" };
        assert_eq!(next_to_roll(&members, other, "db-1", 3).map(|m| m.name.as_str()), Some("db-1"), "anything else changed: first");
        // A failover back to db-0 (db-1's node lost, its agent fenced it unseen): db-1,
        // back and not ready, restarts to rejoin as a replica.
        // Whatever revision it has: the template naming db-0 again may be the one it started on.
        for (what, db1) in [("an older revision", replica(1)), ("the revision wanted", m(1, true, "new"))] {
            let back = vec![m(0, true, "new"), Observed { promoted: true, ready: false, ..db1 }, replica(2)];
            assert_eq!(next_to_roll(&back, NEW, "db-0", 3).map(|m| m.name.as_str()), Some("db-1"), "{what}: it led, it rejoins");
            assert!(!rolled(&back, NEW, "db-0", 3), "{what}");
        }
    }

    /// The old primary's node lost and db-1 promoted in place: db-2 restarts to follow it
    /// at once (synchronous commits wait for it), the lost member is neither restarted
    /// (its pod cannot go until the node is back) nor waited for, even once the
    /// operator's deletion of it hangs; a change of spec and the primary's own restart
    /// wait for it.
    #[test]
    fn a_member_on_a_lost_node_is_neither_restarted_nor_waited_for() {
        let replica = |ordinal: u32| Observed { rendered: Some(("db-0".into(), "same".into())), ..m(ordinal, true, "old") };
        let lost = Observed { ready: false, node_lost: true, ..replica(0) };
        let members = vec![lost.clone(), Observed { promoted: true, ..replica(1) }, replica(2)];
        assert_eq!(next_to_roll(&members, NEW, "db-1", 3).map(|m| m.name.as_str()), Some("db-2"), "the replica left follows");
        let deleting = Observed { terminating: true, ..lost.clone() };
        let members = vec![deleting, Observed { promoted: true, ..replica(1) }, replica(2)];
        assert_eq!(next_to_roll(&members, NEW, "db-1", 3).map(|m| m.name.as_str()), Some("db-2"), "its deletion hangs: not waited for");
        let members = vec![lost.clone(), replica(1), m(2, true, "new")];
        assert_eq!(next_to_roll(&members, NEW, "db-1", 3).map(|m| m.name.as_str()), Some("db-1"), "a new primary started as a replica");
        let members = vec![lost.clone(), m(1, true, "new"), m(2, true, "old")];
        assert_eq!(next_to_roll(&members, NEW, "db-2", 3), None, "the primary waits for the member away");
        let changed = vec![lost, Observed { rendered: Some(("db-1".into(), "same".into())), ..m(1, true, "old") }, m(2, true, "old")];
        assert_eq!(next_to_roll(&changed, NEW, "db-1", 3), None, "a change of spec waits for the member away");
        let members = vec![Observed { ready: false, ..replica(0) }, m(1, true, "new"), m(2, true, "new")];
        assert_eq!(next_to_roll(&members, NEW, "db-1", 3).map(|m| m.name.as_str()), Some("db-0"), "down on a node that runs: restarted");
    }

    /// A member fenced for a switchover that a failover overtook (db-1 promoted, then
    /// fenced for the switchover to db-2) keeps its fence until its pod is made again: it
    /// restarts as soon as its fence shows, and the primary fenced while the switchover
    /// waits is not restarted for it.
    #[test]
    fn a_fenced_member_that_does_not_lead_restarts() {
        let replica = |ordinal: u32, ready: bool| Observed { rendered: Some(("db-0".into(), "same".into())), ..m(ordinal, ready, "old") };
        let fenced = Observed { fenced: true, ..replica(1, false) };
        let members = vec![m(0, true, "new"), fenced.clone(), m(2, true, "new")];
        assert_eq!(next_to_roll(&members, NEW, "db-2", 3).map(|m| m.name.as_str()), Some("db-1"));
        assert!(!rolled(&members, NEW, "db-2", 3));
        let showing = vec![m(0, true, "new"), Observed { ready: true, ..fenced.clone() }, m(2, true, "new")];
        assert_eq!(next_to_roll(&showing, NEW, "db-2", 3), None, "not before its fence shows: a Service may still lead to it");
        let unfenced = vec![m(0, true, "new"), replica(1, true), m(2, true, "new")];
        assert_eq!(
            next_to_roll(&unfenced, NEW, "db-2", 3).map(|m| m.name.as_str()),
            Some("db-1"),
            "a replica that was not fenced restarts too, once every member is ready"
        );
        let waiting = vec![m(0, true, "new"), Observed { fenced: true, ..m(1, false, "new") }, m(2, true, "new")];
        assert_eq!(next_to_roll(&waiting, NEW, "db-1", 3), None, "the fenced primary stays while the switchover waits");
    }

    /// A ready member on a node that stopped renewing its lease is down since the node's
    /// last renewal, and a primary there is lost once that is long enough; members on
    /// other nodes, and one already down, are as their pods say.
    #[test]
    fn members_on_a_silent_node_are_down_since_its_last_renewal() {
        let on = |ordinal: u32, node: &str, ready: bool| Observed { node: Some(node.into()), ..m(ordinal, ready, "new") };
        let mut members = vec![on(0, "n1", true), on(1, "n2", true), on(2, "n1", false)];
        let silent = |node: &str| (node == "n1").then_some(std::time::Duration::from_secs(41));
        cut_off(&mut members, silent);
        assert!(!members[0].ready && members[0].cut_off && members[0].since_seconds == 41, "{:?}", members[0]);
        assert!(members[0].down.as_deref().is_some_and(|d| d.contains("node n1 has not renewed its lease for 41 s")), "{:?}", members[0]);
        assert!(members[1].ready && !members[1].cut_off, "its node renews its lease");
        assert!(!members[2].cut_off && members[2].since_seconds == 100, "down already: as its pod says");
        // Its node's silence decides, whatever the failover delay: not before its agent
        // has fenced it, and not later for a longer delay.
        let floor = CUT_OFF_FAILOVER_SECONDS;
        assert!(primary_lost(&members, "db-0", 300), "41 s of silence");
        let mut members = vec![on(0, "n1", true)];
        cut_off(&mut members, |_| Some(std::time::Duration::from_secs(floor as u64 - 1)));
        assert!(!primary_lost(&members, "db-0", 2), "its agent may not have fenced it yet");
        assert_eq!(primary_lost_in(&members, "db-0", 2), Some(std::time::Duration::from_secs(1)), "looked at again then");
        members[0].since_seconds = floor;
        assert!(primary_lost(&members, "db-0", 2), "it has");
        assert_eq!(primary_lost_in(&members, "db-0", 2), Some(std::time::Duration::ZERO));
        // A primary down as its pod says waits for the failover delay.
        let down = vec![m(0, false, "new")];
        assert_eq!(primary_lost_in(&down, "db-0", 130), Some(std::time::Duration::from_secs(30)));
        assert_eq!(primary_lost_in(&down, "db-1", 130), None, "not a member");
        assert_eq!(primary_lost_in(&[m(0, true, "new")], "db-0", 130), None, "ready: not down");
    }

    /// A ready replica whose agent has said for a minute that it streams nothing is down
    /// (named why), then made again half a minute later; one that streams, one heard
    /// that way only lately, one ready only lately, and any replica while the primary
    /// does not serve are as their pods say.
    #[test]
    fn a_ready_replica_that_streams_nothing_is_down_then_made_again() {
        let now: Timestamp = "2027-01-15T08:02:00Z".parse().expect("a time");
        let said = |pod: &str, lag: Option<&str>, heard: &str| MemberStatus {
            pod: pod.into(),
            role: "replica".into(),
            position: Some("0/3000148".into()),
            lag: lag.map(str::to_string),
            heard: Some(heard.into()),
            ..Default::default()
        };
        let primary = MemberStatus { pod: "db-0".into(), role: "primary".into(), position: Some("0/3000200".into()), ..Default::default() };
        let before = [
            primary.clone(),
            said("db-1", None, "2027-01-15T08:00:45Z"),
            said("db-2", Some("0s"), "2027-01-15T08:00:00Z"),
            said("db-3", None, "2027-01-15T08:01:30Z"),
            said("db-4", None, "2027-01-15T08:00:00Z"),
        ];
        let after = std::time::Duration::from_secs(60);
        let members = || {
            vec![
                m(0, true, "new"),
                m(1, true, "new"),
                m(2, true, "new"),
                m(3, true, "new"),
                Observed { since_seconds: 30, ..m(4, true, "new") },
            ]
        };
        let mut observed = members();
        not_replicating(&mut observed, "db-0", &before, now, after);
        let named: Vec<(&str, bool)> = observed.iter().filter(|m| m.not_replicating).map(|m| (m.name.as_str(), m.remake)).collect();
        assert_eq!(named, [("db-1", false)], "75 s without a stream; the others stream, were heard lately or started lately");
        assert!(!observed[1].ready, "down, though its pod is ready");
        let why = observed[1].down.as_deref().unwrap_or_default();
        assert!(why.contains("has not replicated from db-0 for 75 s"), "{why}");
        assert_eq!(next_to_roll(&observed, NEW, "db-0", 5), None, "named, not yet made again");
        let mut later = members();
        not_replicating(&mut later, "db-0", &before, "2027-01-15T08:02:15Z".parse().expect("a time"), after);
        assert!(later[1].remake, "90 s: made again");
        assert_eq!(next_to_roll(&later, NEW, "db-0", 5).map(|m| m.name.as_str()), Some("db-1"), "restarted");
        // One at the primary's last position is caught up, not stalled; without the
        // primary's position nobody is known to be behind.
        let caught_up = [MemberStatus { position: Some("0/3000148".into()), ..primary.clone() }, before[1].clone()];
        let mut observed = members();
        not_replicating(&mut observed, "db-0", &caught_up, now, after);
        assert!(observed.iter().all(|m| !m.not_replicating), "caught up");
        let mut observed = members();
        not_replicating(&mut observed, "db-0", &before[1..], now, after);
        assert!(observed.iter().all(|m| !m.not_replicating), "the primary's position unknown");
        for primary in [Observed { ready: false, ..m(0, true, "new") }, Observed { fenced: true, ..m(0, true, "new") }] {
            let mut observed = members();
            observed[0] = primary;
            not_replicating(&mut observed, "db-0", &before, now, after);
            assert!(observed.iter().all(|m| !m.not_replicating), "no primary serves: no replica streams");
        }
    }

    #[test]
    fn rolls_replicas_highest_first_then_the_primary() {
        let members = vec![m(0, true, "old"), m(1, true, "old"), m(2, true, "old")];
        assert_eq!(next_to_roll(&members, NEW, "db-0", 3).map(|m| m.name.as_str()), Some("db-2"));
        let members = vec![m(0, true, "old"), m(1, true, "old"), m(2, true, "new")];
        assert_eq!(next_to_roll(&members, NEW, "db-0", 3).map(|m| m.name.as_str()), Some("db-1"));
        let members = vec![m(0, true, "old"), m(1, true, "new"), m(2, true, "new")];
        assert_eq!(next_to_roll(&members, NEW, "db-0", 3).map(|m| m.name.as_str()), Some("db-0"));
        // After a failover the primary may be any member: it still goes last.
        let members = vec![m(0, true, "old"), m(1, true, "old"), m(2, true, "new")];
        assert_eq!(next_to_roll(&members, NEW, "db-1", 3).map(|m| m.name.as_str()), Some("db-0"));
    }

    #[test]
    fn after_a_failover_the_new_primary_restarts_first_then_the_old_one() {
        // db-0 was primary and is down; db-1 was promoted; the template names db-1 now.
        let members = vec![m(0, false, "old"), m(1, true, "old"), m(2, true, "old")];
        assert_eq!(next_to_roll(&members, NEW, "db-1", 3).map(|m| m.name.as_str()), Some("db-1"));
        let members = vec![m(0, false, "old"), m(1, true, "new"), m(2, true, "old")];
        assert_eq!(next_to_roll(&members, NEW, "db-1", 3).map(|m| m.name.as_str()), Some("db-0"));
        let members = vec![m(0, true, "new"), m(1, true, "new"), m(2, true, "old")];
        assert_eq!(next_to_roll(&members, NEW, "db-1", 3).map(|m| m.name.as_str()), Some("db-2"));
    }

    #[test]
    fn after_a_switchover_the_new_primary_restarts_first_though_every_member_is_ready() {
        // db-2 was started as a replica of db-0 and leads now; db-0, fenced, still looks ready.
        let as_replica = |o: u32| Observed { rendered: Some(("db-0".into(), "free".into())), ..m(o, true, "old") };
        let members = vec![as_replica(0), as_replica(1), as_replica(2)];
        assert_eq!(next_to_roll(&members, NEW, "db-2", 3).map(|m| m.name.as_str()), Some("db-2"));
        let members = vec![as_replica(0), as_replica(1), m(2, true, "new")];
        assert_eq!(next_to_roll(&members, NEW, "db-2", 3).map(|m| m.name.as_str()), Some("db-1"), "then the others");
    }

    #[test]
    fn never_rolls_while_a_member_is_down_or_missing() {
        assert_eq!(next_to_roll(&[m(0, true, "old"), m(1, false, "new")], NEW, "db-0", 2), None);
        assert_eq!(next_to_roll(&[m(0, true, "old")], NEW, "db-0", 2), None);
        assert!(rolled(&[m(0, true, "new"), m(1, true, "new")], NEW, "db-0", 2));
        assert!(!rolled(&[m(0, true, "new"), m(1, true, "old")], NEW, "db-0", 2));
    }

    /// A replica is given the position its agent said; a member whose agent says it is
    /// primary while it is not the primary in status, or that said nothing, is given none.
    #[test]
    fn members_are_given_only_the_position_their_agent_said_in_their_role() {
        let candidates = for_plugin(&[m(0, false, "r"), m(1, true, "r"), m(2, true, "r")], "db-0");
        let said = |primary: bool, position: &str| Some(crate::agent::Status { primary, position: position.into(), lag: None });
        let given = with_positions(candidates, vec![None, said(false, "0/5"), said(true, "0/9")]);
        let positions: Vec<Option<&str>> = given.iter().map(|m| m.position.as_deref()).collect();
        assert_eq!(positions, [None, Some("0/5"), None]);
    }

    /// A pod not ready since it was made is starting, not down, for its first minute: the
    /// new primary restarting into its role after a failover is not failed over again.
    #[test]
    fn a_new_pod_counts_as_down_only_after_its_startup_grace() {
        let now = Timestamp::now();
        let pod = |created_ago: i64, changed_ago: i64| -> Pod {
            let at = |ago: i64| (now - k8s_openapi::jiff::SignedDuration::from_secs(ago)).to_string();
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "db-0", "creationTimestamp": at(created_ago)},
                "status": {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": at(changed_ago)}]}
            }))
            .expect("pod")
        };
        let since = |p: Pod| observe("db", &[p], now)[0].since_seconds;
        assert!(since(pod(10, 10)) <= 0, "starting");
        assert!(!primary_lost(&observe("db", &[pod(40, 40)], now), "db-0", 30), "still within its grace");
        assert_eq!(since(pod(100, 100)), 100 - STARTUP_GRACE_SECONDS, "down once the grace is over");
        assert_eq!(since(pod(3600, 40)), 40, "an old pod: since its Ready condition changed");
        assert!(primary_lost(&observe("db", &[pod(3600, 40)], now), "db-0", 30));
    }

    /// A container that fails at each start is named with how often it restarted, its
    /// exit code and the end of its log; one that is merely starting is not.
    #[test]
    fn a_crash_looping_member_is_named_with_its_last_words() {
        let now = Timestamp::now();
        let pod = |waiting: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "db-0", "creationTimestamp": now.to_string()},
                "status": {
                    "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now.to_string()}],
                    "containerStatuses": [{
                        "name": "postgres", "ready": false, "restartCount": 4, "image": "postgres:17", "imageID": "",
                        "state": {"waiting": {"reason": waiting, "message": "back-off 40s restarting failed container"}},
                        "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                            "message": "starting\nFATAL:  could not map anonymous shared memory: Cannot allocate memory\n\n"}},
                    }],
                },
            }))
            .expect("pod")
        };
        let looping = &observe("db", &[pod("CrashLoopBackOff")], now)[0];
        assert!(looping.crash_loop);
        assert_eq!(
            looping.down.as_deref(),
            Some(
                "container postgres is crash looping (restarted 4 times, last with exit code 1): \
                 starting | FATAL:  could not map anonymous shared memory: Cannot allocate memory"
            )
        );
        let starting = &observe("db", &[pod("ContainerCreating")], now)[0];
        assert!(!starting.crash_loop);
        assert_eq!(starting.down.as_deref(), Some("container postgres ContainerCreating: back-off 40s restarting failed container"));
    }

    #[test]
    fn primary_is_lost_only_after_the_threshold() {
        let mut members = vec![m(0, false, "r"), m(1, true, "r")];
        assert!(primary_lost(&members, "db-0", 30));
        members[0].since_seconds = 5;
        assert!(!primary_lost(&members, "db-0", 30));
        assert!(!primary_lost(&members, "db-1", 30));
    }
}
