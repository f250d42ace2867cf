use super::*;

fn m(ordinal: u32, ready: bool, revision: &str) -> Observed {
    Observed { ordinal, ready, since_seconds: 100, revision: Some(revision.into()), ..Observed::at(&format!("db-{ordinal}"), None) }
}

/// The member of 3 whose restart onto revision `NEW` comes next, `primary` leading.
fn next_of<'a>(members: &'a [Observed], primary: &str) -> Option<&'a str> {
    next_to_roll(members, NEW, primary, 3).map(|m| m.name.as_str())
}

const NEW: Wanted = Wanted { revision: "new", role_free: "same" };

/// After a failover the promoted member (to take its role) restarts first, then the
/// old primary (to follow), then the other replicas (onto the new primary's history),
/// highest ordinal first, only once every member is ready.
#[test]
fn a_failover_restarts_the_promoted_member_then_the_old_primary_then_the_replicas() {
    let rendered = |ordinal: u32, ready: bool| Observed { rendered: Some(("db-0".into(), "same".into())), ..m(ordinal, ready, "old") };
    let members = vec![rendered(0, false), rendered(1, true), rendered(2, true)];
    assert_eq!(next_of(&members, "db-1"), Some("db-1"));
    let members = vec![rendered(0, false), m(1, true, "new"), rendered(2, true)];
    assert_eq!(next_of(&members, "db-1"), Some("db-0"));
    let members = vec![m(0, true, "new"), m(1, true, "new"), rendered(2, true)];
    assert_eq!(next_of(&members, "db-1"), Some("db-2"), "the other replica too");
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
    assert_eq!(next_of(&members, "db-1"), Some("db-2"), "followed an earlier primary");
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
    assert_eq!(next_of(&members, "db-1"), Some("db-0"), "only the fenced old primary");
    let members = vec![m(0, true, "new"), Observed { promoted: true, ..replica(1) }, replica(2)];
    assert_eq!(next_of(&members, "db-1"), Some("db-2"), "the other replica, onto its history");
    let members = vec![m(0, true, "new"), Observed { promoted: true, ..replica(1) }, m(2, true, "new")];
    assert!(rolled(&members, NEW, "db-1", 3));
    let restarted = vec![m(0, true, "new"), replica(1), replica(2)];
    assert_eq!(next_of(&restarted, "db-1"), Some("db-1"), "not promoted in place: restarts");
    let other = Wanted { revision: "new", role_free: "changed" };
    assert_eq!(next_to_roll(&members, other, "db-1", 3).map(|m| m.name.as_str()), Some("db-1"), "anything else changed: first");
    // A failover back to db-0 (db-1's node lost, its agent fenced it unseen): db-1,
    // back and not ready, restarts to rejoin as a replica.
    // Whatever revision it has: the template naming db-0 again may be the one it started on.
    for (what, db1) in [("an older revision", replica(1)), ("the revision wanted", m(1, true, "new"))] {
        let back = vec![m(0, true, "new"), Observed { promoted: true, ready: false, ..db1 }, replica(2)];
        assert_eq!(next_of(&back, "db-0"), Some("db-1"), "{what}: it led, it rejoins");
        assert!(!rolled(&back, NEW, "db-0", 3), "{what}");
    }
}

/// The old primary's node lost and db-1 promoted by its restart: db-2, whose agent says
/// it streams (from db-1, the member it reaches), is not restarted while db-0 is away
/// (its restart would stop synchronous commits while it lasts), one that streams
/// nothing is, one whose agent gave no status is not (on a guess), and both are once
/// db-0 is back.
#[test]
fn a_replica_that_streams_restarts_only_once_the_member_away_is_back() {
    let said = |ordinal: u32| Observed { rendered: Some(("db-0".into(), "same".into())), ..m(ordinal, true, "old") };
    let replica = |ordinal: u32| Observed { streaming: Some(false), ..said(ordinal) };
    let lost = Observed { ready: false, node_lost: true, ..replica(0) };
    let streaming = Observed { streaming: Some(true), ..replica(2) };
    let members = vec![lost.clone(), m(1, true, "new"), streaming.clone()];
    assert!(to_follow_while_away(&members, "db-1"), "its agent is asked");
    assert_eq!(next_of(&members, "db-1"), None, "streams: runs on");
    let members = vec![lost.clone(), m(1, true, "new"), replica(2)];
    assert_eq!(next_of(&members, "db-1"), Some("db-2"), "streams nothing: restarted to follow");
    assert_eq!(follow_grace_left(&members, "db-1"), None);
    let serving = |since_seconds| vec![lost.clone(), Observed { since_seconds, ..m(1, true, "new") }, replica(2)];
    assert_eq!(next_of(&serving(3), "db-1"), None, "the new primary serves for 3 s: not yet, it may reconnect");
    assert_eq!(follow_grace_left(&serving(3), "db-1"), Some(std::time::Duration::from_secs(7)), "looked at again then");
    assert_eq!(next_of(&serving(FOLLOW_GRACE_SECONDS), "db-1"), Some("db-2"));
    // Promoted in place, ready for an hour: it serves from its promotion.
    let in_place =
        |led| vec![lost.clone(), Observed { since_seconds: 3600, promoted: true, led_seconds: Some(led), ..m(1, true, "new") }, replica(2)];
    assert_eq!(next_of(&in_place(2), "db-1"), None, "promoted 2 s ago: not yet");
    assert_eq!(follow_grace_left(&in_place(2), "db-1"), Some(std::time::Duration::from_secs(8)));
    assert_eq!(next_of(&in_place(FOLLOW_GRACE_SECONDS), "db-1"), Some("db-2"));
    let silent = vec![lost.clone(), m(1, true, "new"), Observed { streaming: None, ..said(2) }];
    assert_eq!(next_of(&silent, "db-1"), None, "its agent gave no status: not restarted on a guess");
    let back = vec![m(0, true, "new"), m(1, true, "new"), streaming];
    assert!(!to_follow_while_away(&back, "db-1"));
    assert_eq!(next_of(&back, "db-1"), Some("db-2"), "the member away is back: restarted");
    let followed = vec![lost.clone(), m(1, true, "new"), m(2, true, "new")];
    assert!(!to_follow_while_away(&followed, "db-1"), "nothing to follow: the agents are asked as often as ever");
    let told = vec![lost.clone(), m(1, true, "new"), Observed { follows: Some("db-1".into()), ..replica(2) }];
    assert!(!to_follow_while_away(&told, "db-1"), "told to follow by its agent: runs on");
    let starting = vec![lost, m(1, false, "new"), replica(2)];
    assert!(!to_follow_while_away(&starting, "db-1"), "the new primary not ready yet: nothing restarts");
}

/// The old primary's node lost and db-1 promoted in place: db-2, which streams nothing,
/// restarts to follow it at once (synchronous commits wait for it), the lost member is neither restarted
/// (its pod cannot go until the node is back) nor waited for, even once the
/// operator's deletion of it hangs; a change of spec and the primary's own restart
/// wait for it.
#[test]
fn a_member_on_a_lost_node_is_neither_restarted_nor_waited_for() {
    let replica =
        |ordinal: u32| Observed { rendered: Some(("db-0".into(), "same".into())), streaming: Some(false), ..m(ordinal, true, "old") };
    let lost = Observed { ready: false, node_lost: true, ..replica(0) };
    let members = vec![lost.clone(), Observed { promoted: true, ..replica(1) }, replica(2)];
    assert_eq!(next_of(&members, "db-1"), Some("db-2"), "the replica left follows");
    let deleting = Observed { terminating: true, ..lost.clone() };
    let members = vec![deleting, Observed { promoted: true, ..replica(1) }, replica(2)];
    assert_eq!(next_of(&members, "db-1"), Some("db-2"), "its deletion hangs: not waited for");
    let members = vec![lost.clone(), replica(1), m(2, true, "new")];
    assert_eq!(next_of(&members, "db-1"), Some("db-1"), "a new primary started as a replica");
    let members = vec![lost.clone(), m(1, true, "new"), m(2, true, "old")];
    assert_eq!(next_to_roll(&members, NEW, "db-2", 3), None, "the primary waits for the member away");
    let changed = vec![lost, Observed { rendered: Some(("db-1".into(), "same".into())), ..m(1, true, "old") }, m(2, true, "old")];
    assert_eq!(next_to_roll(&changed, NEW, "db-1", 3), None, "a change of spec waits for the member away");
    let members = vec![Observed { ready: false, ..replica(0) }, m(1, true, "new"), m(2, true, "new")];
    assert_eq!(next_of(&members, "db-1"), Some("db-0"), "down on a node that runs: restarted");
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
    assert_eq!(next_of(&members, "db-2"), Some("db-1"));
    assert!(!rolled(&members, NEW, "db-2", 3));
    let showing = vec![m(0, true, "new"), Observed { ready: true, ..fenced.clone() }, m(2, true, "new")];
    assert_eq!(next_to_roll(&showing, NEW, "db-2", 3), None, "not before its fence shows: a Service may still lead to it");
    let unfenced = vec![m(0, true, "new"), replica(1, true), m(2, true, "new")];
    assert_eq!(next_of(&unfenced, "db-2"), Some("db-1"), "a replica that was not fenced restarts too, once every member is ready");
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
    assert_eq!(next_of(&members, "db-0"), Some("db-2"));
    let members = vec![m(0, true, "old"), m(1, true, "old"), m(2, true, "new")];
    assert_eq!(next_of(&members, "db-0"), Some("db-1"));
    let members = vec![m(0, true, "old"), m(1, true, "new"), m(2, true, "new")];
    assert_eq!(next_of(&members, "db-0"), Some("db-0"));
    // After a failover the primary may be any member: it still goes last.
    let members = vec![m(0, true, "old"), m(1, true, "old"), m(2, true, "new")];
    assert_eq!(next_of(&members, "db-1"), Some("db-0"));
}

#[test]
fn after_a_failover_the_new_primary_restarts_first_then_the_old_one() {
    // db-0 was primary and is down; db-1 was promoted; the template names db-1 now.
    let members = vec![m(0, false, "old"), m(1, true, "old"), m(2, true, "old")];
    assert_eq!(next_of(&members, "db-1"), Some("db-1"));
    let members = vec![m(0, false, "old"), m(1, true, "new"), m(2, true, "old")];
    assert_eq!(next_of(&members, "db-1"), Some("db-0"));
    let members = vec![m(0, true, "new"), m(1, true, "new"), m(2, true, "old")];
    assert_eq!(next_of(&members, "db-1"), Some("db-2"));
}

#[test]
fn after_a_switchover_the_new_primary_restarts_first_though_every_member_is_ready() {
    // db-2 was started as a replica of db-0 and leads now; db-0, fenced, still looks ready.
    let as_replica = |o: u32| Observed { rendered: Some(("db-0".into(), "free".into())), ..m(o, true, "old") };
    let members = vec![as_replica(0), as_replica(1), as_replica(2)];
    assert_eq!(next_of(&members, "db-2"), Some("db-2"));
    let members = vec![as_replica(0), as_replica(1), m(2, true, "new")];
    assert_eq!(next_of(&members, "db-2"), Some("db-1"), "then the others");
}

#[test]
fn never_rolls_while_a_member_is_down_or_missing() {
    assert_eq!(next_to_roll(&[m(0, true, "old"), m(1, false, "new")], NEW, "db-0", 2), None);
    assert_eq!(next_to_roll(&[m(0, true, "old")], NEW, "db-0", 2), None);
    assert!(rolled(&[m(0, true, "new"), m(1, true, "new")], NEW, "db-0", 2));
    assert!(!rolled(&[m(0, true, "new"), m(1, true, "old")], NEW, "db-0", 2));
}

/// A replica is given the position its agent said; a member whose agent says it is
/// primary while it is not the primary in status, or that said nothing, is given none,
/// unless the operator was promoting it to replace that very primary (and did not fence it).
#[test]
fn members_are_given_only_the_position_their_agent_said_in_their_role() {
    let members = [m(0, false, "r"), m(1, true, "r"), m(2, true, "r")];
    let said = |primary: bool, position: &str| {
        Some(crate::agent::Status {
            primary,
            position: position.into(),
            lag: None,
            volume: None,
            archive: None,
            exporter: None,
            signals: Default::default(),
        })
    };
    let positions = |members: &[Observed]| -> Vec<Option<String>> {
        let given = with_positions(for_plugin(members, "db-0"), members, vec![None, said(false, "0/5"), said(true, "0/9")]);
        given.into_iter().map(|m| m.position).collect()
    };
    let some = |p: &str| Some(p.to_string());
    assert_eq!(positions(&members), [None, some("0/5"), None]);
    let replacing = |primary: &str| Observed { replaces: Some(primary.into()), ..m(2, true, "r") };
    let cut_short = [m(0, false, "r"), m(1, true, "r"), replacing("db-0")];
    assert_eq!(positions(&cut_short), [None, some("0/5"), some("0/9")], "its promotion cut short: a candidate with what it has");
    let earlier = [m(0, false, "r"), m(1, true, "r"), replacing("db-1")];
    assert_eq!(positions(&earlier), [None, some("0/5"), None], "promoted to replace another, long ago");
    let fenced = [m(0, false, "r"), m(1, true, "r"), Observed { fenced: true, ..replacing("db-0") }];
    assert_eq!(positions(&fenced), [None, some("0/5"), None], "fenced since");
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

    // Ready once its containers ran, then not: its grace is over (a primary hung in its
    // pod's first minute). Not ready since before they started: still starting.
    let running = |created_ago: i64, started_ago: i64, changed_ago: i64| -> Pod {
        let mut p = serde_json::to_value(pod(created_ago, changed_ago)).expect("a pod");
        let at = (now - k8s_openapi::jiff::SignedDuration::from_secs(started_ago)).to_string();
        let status = |name: &str| {
            serde_json::json!({"name": name, "ready": false, "restartCount": 0, "image": "e", "imageID": "",
                                                     "state": {"running": {"startedAt": at}}})
        };
        p["status"]["containerStatuses"] = serde_json::json!([status("engine"), status("agent")]);
        serde_json::from_value(p).expect("a pod")
    };
    assert_eq!(since(running(30, 25, 10)), 10, "served, then hung: down since then");
    assert!(primary_lost(&observe("db", &[running(30, 25, 10)], now), "db-0", 6));
    assert!(since(running(30, 25, 30)) <= 0, "never ready since it started: still starting");
    assert!(!primary_lost(&observe("db", &[running(30, 25, 30)], now), "db-0", 6));
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

/// Not ready only because a probe fails: every container runs and the agent's is ready.
/// A fenced member (its agent not ready) and a restarting engine are down otherwise.
#[test]
fn a_member_whose_running_engine_fails_its_probe_is_told_apart() {
    let now = Timestamp::now();
    let pod = |engine: serde_json::Value, agent_ready: bool| -> Pod {
        let running = serde_json::json!({"running": {"startedAt": now.to_string()}});
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db-0", "creationTimestamp": now.to_string()},
            "status": {
                "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now.to_string()}],
                "containerStatuses": [
                    {"name": "postgres", "ready": false, "restartCount": 0, "image": "e", "imageID": "", "state": engine},
                    {"name": "agent", "ready": agent_ready, "restartCount": 0, "image": "e", "imageID": "", "state": running},
                ],
            },
        }))
        .expect("pod")
    };
    let running = serde_json::json!({"running": {"startedAt": now.to_string()}});
    let restarting = serde_json::json!({"waiting": {"reason": "ContainerCreating"}});
    let probing = |p: Pod| observe("db", &[p], now)[0].probe_failing;
    assert!(probing(pod(running.clone(), true)), "its engine runs, its probe fails");
    assert!(!probing(pod(running, false)), "fenced: its agent says it is not ready");
    assert!(!probing(pod(restarting, true)), "its engine restarts");
}

#[test]
fn primary_is_lost_only_after_the_threshold() {
    let mut members = vec![m(0, false, "r"), m(1, true, "r")];
    assert!(primary_lost(&members, "db-0", 30));
    members[0].since_seconds = 5;
    assert!(!primary_lost(&members, "db-0", 30));
    assert!(!primary_lost(&members, "db-1", 30));
}
