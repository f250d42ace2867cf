use super::*;

#[test]
fn transition_time_moves_only_on_a_status_change() {
    let mut c = Vec::new();
    set(&mut c, ConditionType::Ready, false, Reason::MembersNotReady, "0/3 ready", Some(1));
    let first = c[0].last_transition_time.clone();
    set(&mut c, ConditionType::Ready, false, Reason::MembersNotReady, "1/3 ready", Some(1));
    assert_eq!(c[0].last_transition_time, first, "same status keeps the time");
    assert_eq!(c[0].message, "1/3 ready");
    std::thread::sleep(std::time::Duration::from_millis(2));
    set(&mut c, ConditionType::Ready, true, Reason::AllMembersReady, "3/3 ready", Some(1));
    assert_ne!(c[0].last_transition_time, first);
    assert!(is_true(&c, ConditionType::Ready));
}

/// Each member with its node, role and readiness; a position its agent said is kept
/// until it says another, and a member gone is gone.
#[test]
fn members_say_their_node_role_readiness_and_last_position() {
    let at = |name: &str, node: &str, ready: bool| Observed {
        ready,
        node: Some(node.into()),
        down: (!ready).then(|| "node n3 is not ready".into()),
        ready_since: Some("2026-11-27T17:00:00Z".into()),
        ..Observed::at(name, None)
    };
    let now = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("a time");
    let observed = [at("db-0", "n1", false), at("db-1", "n2", true), at("db-2", "n3", true)];
    let said = |position: &str, lag: Option<u64>| crate::agent::Status {
        primary: false,
        position: position.into(),
        lag: lag.map(std::time::Duration::from_millis),
        volume: None,
        archive: None,
        exporter: None,
        signals: Default::default(),
    };
    let heard = [("db-1".to_string(), said("0/3000148", None)), ("db-2".to_string(), said("0/3000100", Some(2500)))];
    let first = super::members(&[], &observed, Some("db-1"), (&heard, now));
    let roles: Vec<(&str, &str, bool)> = first.iter().map(|m| (m.pod.as_str(), m.role.as_str(), m.ready)).collect();
    assert_eq!(roles, [("db-0", "replica", false), ("db-1", "primary", true), ("db-2", "replica", true)]);
    assert_eq!(first[0].down.as_deref(), Some("node n3 is not ready"));
    assert_eq!((first[1].node.as_deref(), first[1].since.as_deref()), (Some("n2"), Some("2026-11-27T17:00:00Z")));
    assert_eq!((first[1].position.as_deref(), first[1].heard.as_deref()), (Some("0/3000148"), Some("2027-01-15T08:00:00Z")));
    assert_eq!((first[2].position.as_deref(), first[2].lag.as_deref()), (Some("0/3000100"), Some("2.5s")));
    assert_eq!((first[0].position.as_deref(), first[0].heard.as_deref()), (None, None), "its agent said nothing");

    let later = now + k8s_openapi::jiff::SignedDuration::from_secs(60);
    let again = super::members(&first, &observed[1..], Some("db-1"), (&[], later));
    assert_eq!(again.len(), 2, "db-0 is gone");
    assert_eq!((again[0].position.as_deref(), again[0].heard.as_deref()), (Some("0/3000148"), Some("2027-01-15T08:00:00Z")), "kept");
    assert_eq!(again[1].lag.as_deref(), Some("2.5s"), "kept");
    let caught_up = [("db-2".to_string(), said("0/3000148", Some(0)))];
    let third = super::members(&again, &observed[1..], Some("db-1"), (&caught_up, later));
    assert_eq!((third[1].lag.as_deref(), third[1].heard.as_deref()), (Some("0s"), Some("2027-01-15T08:01:00Z")));
    // Said again unchanged a minute on: nothing moves, so a steady Database writes nothing.
    let much_later = later + k8s_openapi::jiff::SignedDuration::from_secs(60);
    assert_eq!(super::members(&third, &observed[1..], Some("db-1"), (&caught_up, much_later)), third, "the same answer");

    // With the volume its agent measured: how full, in whole percent, kept until said again.
    let gi = 1u64 << 30;
    let measured = |used: u64| crate::agent::Status {
        volume: Some(crate::agent::metrics::Volume { size: 10 * gi, used, per_hour: None }),
        ..said("0/3000148", Some(0))
    };
    let fourth = super::members(&third, &observed[1..], Some("db-1"), (&[("db-2".to_string(), measured(2 * gi + 100))], much_later));
    assert_eq!(fourth[1].volume.as_deref(), Some("20% of 10.0Gi"));
    assert_eq!(fourth[1].heard, third[1].heard, "the same position and lag: said at the same time");
    let a_byte_more = super::members(&fourth, &observed[1..], Some("db-1"), (&[("db-2".to_string(), measured(2 * gi + 101))], much_later));
    assert_eq!(a_byte_more, fourth, "a write that does not pass a percent changes nothing");
    assert_eq!(
        super::members(&fourth, &observed[1..], Some("db-1"), (&[], much_later))[1].volume.as_deref(),
        Some("20% of 10.0Gi"),
        "kept"
    );
    let small = crate::agent::metrics::Volume { size: 512 << 10, used: 0, per_hour: None };
    assert_eq!(super::volume(&small), "0% of 512.0Ki");
}

/// What each member's agent last saw of its exporter is in its status, kept until said
/// again; `EngineMetrics` names the members whose exporter cannot reach its engine, and
/// goes once no member says anything of an exporter.
#[test]
fn the_exporters_that_cannot_reach_their_engine_are_named() {
    use crate::agent::exporter::Exporter;
    let now = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).expect("a time");
    let observed = [member(0, true), member(1, true), member(2, true)];
    let looked = |exporter: Option<Exporter>| crate::agent::Status {
        primary: false,
        position: "0/1".into(),
        lag: None,
        volume: None,
        archive: None,
        exporter,
        signals: Default::default(),
    };
    let heard: Vec<(String, crate::agent::Status)> =
        [Some(Exporter::Up), Some(Exporter::Down), None].into_iter().enumerate().map(|(n, e)| (format!("orders-{n}"), looked(e))).collect();
    let mut status = DatabaseStatus { members: super::members(&[], &observed, Some("orders-0"), (&heard, now)), ..Default::default() };
    let said: Vec<Option<&str>> = status.members.iter().map(|m| m.exporter.as_deref()).collect();
    assert_eq!(said, [Some("up"), Some("cannot reach its engine"), None]);
    engine_metrics(&mut status, Some(2));
    assert_eq!(
        condition(&status, ConditionType::EngineMetrics),
        ("False", "ExporterDown", "orders-1: its exporter cannot reach its engine")
    );

    // Not heard this pass: kept. Heard up again: True.
    status.members = super::members(&status.members, &observed, Some("orders-0"), (&[], now));
    assert_eq!(status.members[1].exporter.as_deref(), Some("cannot reach its engine"), "kept");
    let silent = [("orders-0".to_string(), looked(Some(Exporter::Silent))), ("orders-1".to_string(), looked(Some(Exporter::Up)))];
    status.members = super::members(&status.members, &observed, Some("orders-0"), (&silent, now));
    engine_metrics(&mut status, Some(2));
    assert_eq!(condition(&status, ConditionType::EngineMetrics), ("False", "ExporterDown", "orders-0: its exporter does not answer"));
    let up = [("orders-0".to_string(), looked(Some(Exporter::Up)))];
    status.members = super::members(&status.members, &observed, Some("orders-0"), (&up, now));
    engine_metrics(&mut status, Some(2));
    assert_eq!(condition(&status, ConditionType::EngineMetrics), ("True", "ExportersUp", "every member's exporter reaches its engine"));

    // Members that run no exporter (monitoring switched off, an engine serving its own): no condition.
    let mut none = DatabaseStatus { members: super::members(&[], &observed, Some("orders-0"), (&[], now)), ..status.clone() };
    none.members.iter_mut().for_each(|m| m.exporter = None);
    engine_metrics(&mut none, Some(2));
    assert!(none.conditions.iter().all(|c| c.type_ != "EngineMetrics"), "{:?}", none.conditions);
}

#[test]
fn not_ready_for_counts_from_when_ready_turned_false() {
    let mut status = DatabaseStatus::default();
    let now = k8s_openapi::jiff::Timestamp::now();
    assert_eq!(not_ready_for(&status, now), std::time::Duration::ZERO, "no Ready condition yet");
    set(&mut status.conditions, ConditionType::Ready, false, Reason::MembersNotReady, "0/3 ready", Some(1));
    status.conditions[0].last_transition_time = Time(now - k8s_openapi::jiff::SignedDuration::from_secs(90));
    assert_eq!(not_ready_for(&status, now), std::time::Duration::from_secs(90));
    set(&mut status.conditions, ConditionType::Ready, true, Reason::AllMembersReady, "3/3 ready", Some(1));
    assert_eq!(not_ready_for(&status, now), std::time::Duration::ZERO, "Ready");
}

use crate::crd::UpgradeStatus;

fn member(ordinal: u32, ready: bool) -> Observed {
    Observed { ordinal, ready, since_seconds: 60, revision: Some("r1".into()), ..Observed::at(&format!("orders-{ordinal}"), None) }
}

fn members(ready: &[bool]) -> Vec<Observed> {
    ready.iter().enumerate().map(|(i, r)| member(i as u32, *r)).collect()
}

fn condition(status: &DatabaseStatus, type_: ConditionType) -> (&str, &str, &str) {
    let c = status.conditions.iter().find(|c| c.type_ == type_.as_str()).unwrap_or_else(|| panic!("no {type_:?} condition"));
    (c.status.as_str(), c.reason.as_str(), c.message.as_str())
}

fn ran() -> DatabaseStatus {
    DatabaseStatus { current_version: Some("17".into()), ..Default::default() }
}

/// One row: the status before, what the pass found, and what the status says after.
struct Row {
    what: &'static str,
    before: DatabaseStatus,
    ready: &'static [bool],
    desired: usize,
    rolled: bool,
    growth: Growth,
    restoring: bool,
    phase: Phase,
    progressing: bool,
    ready_condition: (&'static str, &'static str),
    degraded: (&'static str, &'static str),
}

#[test]
fn the_end_of_a_pass_follows_from_what_it_found() {
    let upgrading = DatabaseStatus { upgrade: Some(UpgradeStatus { from: "15".into(), to: "15.18".into(), step: 1 }), ..ran() };
    let rows = [
        Row {
            what: "a new Database, no member ready",
            before: DatabaseStatus::default(),
            ready: &[false, false, false],
            desired: 3,
            rolled: false,
            growth: Growth::Done,
            restoring: false,
            phase: Phase::Creating,
            progressing: true,
            ready_condition: ("False", "MembersNotReady"),
            degraded: ("False", "AllMembersUp"),
        },
        Row {
            what: "every member ready on the current revision",
            before: ran(),
            ready: &[true, true, true],
            desired: 3,
            rolled: true,
            growth: Growth::Done,
            restoring: false,
            phase: Phase::Running,
            progressing: false,
            ready_condition: ("True", "AllMembersReady"),
            degraded: ("False", "AllMembersUp"),
        },
        Row {
            what: "a member down after the Database ran",
            before: ran(),
            ready: &[true, false, true],
            desired: 3,
            rolled: false,
            growth: Growth::Done,
            restoring: false,
            phase: Phase::Degraded,
            progressing: true,
            ready_condition: ("False", "MembersNotReady"),
            degraded: ("True", "MembersDown"),
        },
        Row {
            what: "a scale-up: the new member is not there yet",
            before: ran(),
            ready: &[true, true, true],
            desired: 5,
            rolled: false,
            growth: Growth::Done,
            restoring: false,
            phase: Phase::Creating,
            progressing: true,
            ready_condition: ("False", "MembersNotReady"),
            degraded: ("False", "AllMembersUp"),
        },
        Row {
            what: "a change rolling: every member ready, not all on the current revision",
            before: ran(),
            ready: &[true, true, true],
            desired: 3,
            rolled: false,
            growth: Growth::Done,
            restoring: false,
            phase: Phase::Updating,
            progressing: true,
            ready_condition: ("False", "MembersNotReady"),
            degraded: ("False", "AllMembersUp"),
        },
        Row {
            what: "an upgrade rolling",
            before: upgrading.clone(),
            ready: &[true, true, true],
            desired: 3,
            rolled: false,
            growth: Growth::Done,
            restoring: false,
            phase: Phase::Updating,
            progressing: true,
            ready_condition: ("False", "MembersNotReady"),
            degraded: ("False", "AllMembersUp"),
        },
        Row {
            what: "a restore loading while the members run",
            before: ran(),
            ready: &[true],
            desired: 1,
            rolled: true,
            growth: Growth::Done,
            restoring: true,
            phase: Phase::Restoring,
            progressing: true,
            ready_condition: ("True", "AllMembersReady"),
            degraded: ("False", "AllMembersUp"),
        },
        Row {
            what: "a volume still growing",
            before: ran(),
            ready: &[true],
            desired: 1,
            rolled: true,
            growth: Growth::Waiting("claim data-orders-0 asks for 2Gi".into()),
            restoring: false,
            phase: Phase::Running,
            progressing: true,
            ready_condition: ("True", "AllMembersReady"),
            degraded: ("False", "AllMembersUp"),
        },
    ];
    for row in rows {
        let mut status = row.before.clone();
        let members = members(row.ready);
        let pass = Pass {
            generation: Some(2),
            desired: row.desired,
            members: &members,
            rolled: row.rolled,
            moving: false,
            growth: &row.growth,
            plan_refused: false,
            restoring: row.restoring,
            incident: false,
            switching: None,
        };
        let progressing = conclude(&mut status, &pass);
        let what = row.what;
        assert_eq!(status.phase, Some(row.phase), "{what}");
        assert_eq!(progressing, row.progressing, "{what}");
        assert_eq!(condition(&status, ConditionType::Progressing).0, if row.progressing { "True" } else { "False" }, "{what}");
        let (ok, reason, _) = condition(&status, ConditionType::Ready);
        assert_eq!((ok, reason), row.ready_condition, "{what}");
        let (ok, reason, _) = condition(&status, ConditionType::Degraded);
        assert_eq!((ok, reason), row.degraded, "{what}");
        assert_eq!(status.ready_replicas, Some(row.ready.iter().filter(|r| **r).count() as i32), "{what}");
        assert_eq!(status.observed_generation, Some(2), "{what}");
    }
}

#[test]
fn a_refusal_or_a_failed_grow_keeps_its_reason_and_no_safe_failover_lasts_until_all_are_back() {
    let members3 = members(&[false, true, true]);
    let pass = |growth, plan_refused| Pass {
        generation: Some(1),
        desired: 3,
        members: &members3,
        rolled: false,
        moving: false,
        growth,
        plan_refused,
        restoring: false,
        incident: false,
        switching: None,
    };
    let mut status = ran();
    set(&mut status.conditions, ConditionType::Progressing, false, Reason::UpgradeRefused, "downgrade refused", Some(1));
    set(&mut status.conditions, ConditionType::Degraded, true, Reason::NoSafeFailover, "no replica reports a position", Some(1));
    conclude(&mut status, &pass(&Growth::Done, true));
    assert_eq!(condition(&status, ConditionType::Progressing), ("False", "UpgradeRefused", "downgrade refused"));
    assert_eq!(condition(&status, ConditionType::Degraded), ("True", "NoSafeFailover", "no replica reports a position"));

    let failed = Growth::Failed("claim data-orders-0 cannot grow".into());
    conclude(&mut status, &pass(&failed, false));
    assert_eq!(condition(&status, ConditionType::Progressing), ("False", "VolumeGrowFailed", "claim data-orders-0 cannot grow"));

    // Once a member is promoted and serves, no safe failover is no longer the word.
    let promoted = DatabaseStatus { primary: Some("orders-1".into()), ..status.clone() };
    let mut after = promoted.clone();
    conclude(&mut after, &pass(&Growth::Done, false));
    assert_eq!(condition(&after, ConditionType::Degraded).1, "MembersDown");

    let all = members(&[true, true, true]);
    conclude(&mut status, &Pass { members: &all, rolled: true, ..pass(&Growth::Done, false) });
    assert_eq!(condition(&status, ConditionType::Degraded).1, "AllMembersUp");
    assert_eq!(condition(&status, ConditionType::Progressing).1, "Steady");
    assert_eq!(status.phase, Some(Phase::Running));
}

/// No member led (none answered in time, say): `Degraded` says so while the primary is
/// down, and names a member down once a leader serves again, though not every member is
/// back (its node lost).
#[test]
fn no_leader_lasts_only_until_a_leader_serves() {
    fn pass(members: &[Observed]) -> Pass<'_> {
        Pass {
            generation: Some(1),
            desired: 3,
            members,
            rolled: false,
            moving: false,
            growth: &Growth::Done,
            plan_refused: false,
            restoring: false,
            incident: false,
            switching: None,
        }
    }
    let mut status = DatabaseStatus { primary: Some("orders-0".into()), ..ran() };
    set(&mut status.conditions, ConditionType::Degraded, true, Reason::NoLeader, "no member leads: no member reports its status", Some(1));
    let none_serve = members(&[false, true, false]);
    conclude(&mut status, &pass(&none_serve));
    assert_eq!(condition(&status, ConditionType::Degraded).1, "NoLeader");
    let mut lost = members(&[true, true, false]);
    lost[2].down = Some("node plugdb-node-a is not ready".into());
    conclude(&mut status, &pass(&lost));
    let (state, reason, message) = condition(&status, ConditionType::Degraded);
    assert_eq!((state, reason), ("True", "MembersDown"));
    assert!(message.contains("orders-2: node plugdb-node-a is not ready"), "{message}");
}

#[test]
fn an_unschedulable_member_is_named_in_ready() {
    let mut stuck = members(&[true, false]);
    stuck[1].unschedulable = Some("0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules.".into());
    let mut status = ran();
    let growth = Growth::Done;
    let pass = Pass {
        generation: None,
        desired: 2,
        members: &stuck,
        rolled: false,
        moving: false,
        growth: &growth,
        plan_refused: false,
        restoring: false,
        incident: false,
        switching: None,
    };
    conclude(&mut status, &pass);
    let (_, _, message) = condition(&status, ConditionType::Ready);
    assert_eq!(
        message,
        "1/2 members ready; orders-1 cannot be scheduled: 0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules."
    );
}

#[test]
fn down_members_are_named_with_why_in_degraded_and_ready() {
    let mut five = members(&[true, false, false, false, false]);
    five[1].down = Some("node n2 is not ready (Unknown): Kubelet stopped posting node status.".into());
    five[2].down = Some("container postgres CrashLoopBackOff: back-off 10s".into());
    five[3].down = Some("not ready".into());
    five[4].down = Some("not ready".into());
    let mut status = ran();
    let growth = Growth::Done;
    let pass = Pass {
        generation: None,
        desired: 5,
        members: &five,
        rolled: true,
        moving: false,
        growth: &growth,
        plan_refused: false,
        restoring: false,
        incident: false,
        switching: None,
    };
    conclude(&mut status, &pass);
    let (state, _, message) = condition(&status, ConditionType::Degraded);
    assert_eq!(state, "True");
    assert_eq!(
        message,
        "1/5 members ready; orders-1: node n2 is not ready (Unknown): Kubelet stopped posting node status.; \
         orders-2: container postgres CrashLoopBackOff: back-off 10s; orders-3: not ready; and 1 more"
    );
    assert!(condition(&status, ConditionType::Ready).2.starts_with("1/5 members ready; orders-1: node n2"));
}

/// What a pass told goes over the old status, in the order told; what it did not tell
/// stays as it was.
#[test]
fn what_a_pass_told_goes_over_the_old_status_and_nothing_else_changes() {
    let mut old = DatabaseStatus {
        primary: Some("orders-0".into()),
        current_version: Some("17".into()),
        plugin: Some("postgres@0.1.0".into()),
        observed_generation: Some(1),
        ..Default::default()
    };
    set(&mut old.conditions, ConditionType::PluginReady, true, Reason::Rendered, "rendered", Some(1));
    set(&mut old.conditions, ConditionType::SynchronousReplication, true, Reason::SynchronousReplication, "1 replica", Some(1));
    assert_eq!(after(&old, Told::default(), Some(2)), DatabaseStatus { observed_generation: Some(2), ..old.clone() }, "nothing told");

    let mut told = Told::default();
    told.set(ConditionType::Progressing, true, Reason::Converging, "first");
    told.set(ConditionType::Progressing, false, Reason::UpgradeRefused, "second");
    told.remove(ConditionType::SynchronousReplication);
    told.primary = Some("orders-1".into());
    told.phase = Some(Phase::Restoring);
    let new = after(&old, told, Some(2));
    assert_eq!((new.primary.as_deref(), new.phase), (Some("orders-1"), Some(Phase::Restoring)));
    assert_eq!((&new.current_version, &new.plugin), (&old.current_version, &old.plugin));
    let progressing = new.conditions.iter().find(|c| c.type_ == ConditionType::Progressing.as_str()).expect("Progressing");
    assert_eq!((progressing.status.as_str(), progressing.reason.as_str()), ("False", "UpgradeRefused"), "the later one");
    assert!(new.conditions.iter().all(|c| c.type_ != ConditionType::SynchronousReplication.as_str()), "removed");
    assert_eq!(new.conditions.iter().find(|c| c.type_ == ConditionType::PluginReady.as_str()), old.conditions.first(), "untold: as it was");
}

/// A member crash looping is `Degraded` (reason `CrashLoop`), named with why, also in a
/// Database that never ran (its only member cannot start), and no more once it runs.
#[test]
fn a_crash_looping_member_degrades_even_a_database_that_never_ran() {
    let mut looping = members(&[false]);
    looping[0].crash_loop = true;
    looping[0].down = Some("container postgres is crash looping (restarted 3 times): FATAL: no".into());
    let growth = Growth::Done;
    let pass = Pass {
        generation: Some(1),
        desired: 1,
        members: &looping,
        rolled: false,
        moving: false,
        growth: &growth,
        plan_refused: false,
        restoring: false,
        incident: false,
        switching: None,
    };
    let mut status = DatabaseStatus::default();
    conclude(&mut status, &pass);
    let (degraded, reason, message) = condition(&status, ConditionType::Degraded);
    assert_eq!((degraded, reason), ("True", "CrashLoop"));
    assert!(message.contains("orders-0: container postgres is crash looping"), "{message}");

    let running = members(&[true]);
    conclude(&mut status, &Pass { members: &running, rolled: true, ..pass });
    assert_eq!(condition(&status, ConditionType::Degraded).1, "AllMembersUp");
}

#[test]
fn every_condition_type_and_reason_is_read_back_from_its_word() {
    for t in ConditionType::ALL {
        assert_eq!(ConditionType::parse(t.as_str()), Some(*t));
    }
    for r in Reason::ALL {
        assert_eq!(Reason::parse(r.as_str()), Some(*r));
    }
    assert_eq!(ConditionType::parse("ready"), None, "the API's words are matched exactly");
}

#[test]
fn what_the_status_already_says_is_no_news() {
    let mut status = DatabaseStatus::default();
    let long = format!("backup orders-1 failed: {}\u{7}", "x".repeat(MAX_MESSAGE));
    set(&mut status.conditions, ConditionType::BackupHealthy, false, Reason::BackupProblem, long.clone(), None);
    let says = |t, r, m| says(Some(&status), t, r, m);
    // As the condition holds it: bounded and escaped, however the message came.
    assert!(says(Some(ConditionType::BackupHealthy), Some(Reason::BackupProblem), Some(&long)));
    assert!(says(None, Some(Reason::BackupProblem), None), "the reason alone");
    assert!(says(Some(ConditionType::BackupHealthy), None, Some(&long)), "the type and message");
    assert!(!says(Some(ConditionType::Ready), None, None), "another type");
    assert!(!says(None, Some(Reason::BackupsHealthy), None), "another reason");
    assert!(!says(None, None, Some("backup orders-2 failed")), "another message");
    assert!(!super::says(None, None, None, None), "no status says nothing");
}
