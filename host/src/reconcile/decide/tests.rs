//! Table tests of the decide stage: no API server, no plugin; the plugin's answers are
//! rows of the tables.

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetStatus};

use crate::reconcile::cache::SetFacts;

use super::*;

/// Member `ordinal` of Database `db`: ready or not (for `since` seconds), on `revision`.
fn member(ordinal: u32, ready: bool, since: i64, revision: &str) -> Observed {
    Observed {
        ordinal,
        ready,
        since_seconds: since,
        revision: Some(revision.into()),
        role: Some(if ordinal == 0 { "primary" } else { "replica" }.into()),
        ..Observed::at(&format!("db-{ordinal}"), None)
    }
}

fn job(command: &str) -> JobPlan {
    JobPlan { image: "engine:1".into(), command: vec![command.into()], env: vec![], mounts_data: false }
}

/// The reasons of `notes`, with whether each sends an Event.
fn said(notes: &[Note]) -> Vec<(Reason, bool)> {
    notes.iter().map(|n| (n.reason, n.event != Event::None)).collect()
}

const MINUTE: Duration = Duration::from_secs(60);

#[test]
fn an_upgrade_starts_once_waits_for_its_backup_and_a_refusal_keeps_the_running_version() {
    let plan = |backup_first| UpgradePlan { steps: vec![UpgradeStep::RollingRestart], backup_first };
    let started = UpgradeStatus { from: "16".into(), to: "17".into(), step: 0 };
    let elsewhere = UpgradeStatus { from: "16".into(), to: "18".into(), step: 2 };
    struct Row<'a> {
        what: &'a str,
        progress: Option<&'a UpgradeStatus>,
        backups: bool,
        backup: JobState,
        answer: Result<UpgradePlan, String>,
        // The version rendered, the backup to take, refused, what is said.
        expect: (&'a str, bool, bool, &'a [(Reason, bool)]),
    }
    let rows = [
        Row {
            what: "accepted: starts, with an Event",
            progress: None,
            backups: false,
            backup: JobState::Missing,
            answer: Ok(plan(false)),
            expect: ("17", false, false, &[(Reason::UpgradeStarted, true)]),
        },
        Row {
            what: "under way: not started again",
            progress: Some(&started),
            backups: false,
            backup: JobState::Missing,
            answer: Ok(plan(false)),
            expect: ("17", false, false, &[]),
        },
        Row {
            what: "the spec changed its mind: a new upgrade starts",
            progress: Some(&elsewhere),
            backups: false,
            backup: JobState::Missing,
            answer: Ok(plan(false)),
            expect: ("17", false, false, &[(Reason::UpgradeStarted, true)]),
        },
        Row {
            what: "a backup first: the running version until it is taken",
            progress: Some(&started),
            backups: true,
            backup: JobState::Missing,
            answer: Ok(plan(true)),
            expect: ("16", true, false, &[]),
        },
        Row {
            what: "the backup runs: still the running version",
            progress: Some(&started),
            backups: true,
            backup: JobState::Running,
            answer: Ok(plan(true)),
            expect: ("16", true, false, &[]),
        },
        Row {
            what: "a failed backup does not let the upgrade through",
            progress: Some(&started),
            backups: true,
            backup: JobState::Failed,
            answer: Ok(plan(true)),
            expect: ("16", true, false, &[]),
        },
        Row {
            what: "the backup succeeded: the new version",
            progress: Some(&started),
            backups: true,
            backup: JobState::Succeeded,
            answer: Ok(plan(true)),
            expect: ("17", false, false, &[]),
        },
        Row {
            what: "a backup asked for without backups configured: not waited for",
            progress: None,
            backups: false,
            backup: JobState::Missing,
            answer: Ok(plan(true)),
            expect: ("17", false, false, &[(Reason::UpgradeStarted, true)]),
        },
        Row {
            what: "refused: the running version, Progressing says why, once",
            progress: Some(&started),
            backups: true,
            backup: JobState::Missing,
            answer: Err("no downgrades".into()),
            expect: ("16", false, true, &[(Reason::UpgradeRefused, true)]),
        },
    ];
    for row in rows {
        let facts =
            UpgradeFacts { name: "db", running: "16", desired: "17", progress: row.progress, backups: row.backups, backup: row.backup };
        let up = upgrade(facts, row.answer);
        let (version, backup_first, refused, notes) = row.expect;
        assert_eq!(up.version, version, "{}", row.what);
        assert_eq!(up.backup_first, backup_first.then(|| pre_upgrade_backup("db", "17")), "{}", row.what);
        assert_eq!(up.refused, refused, "{}", row.what);
        assert_eq!(said(&up.notes), notes, "{}", row.what);
        match refused {
            true => assert_eq!((up.plan, up.progress), (None, None), "{}: a refusal leaves no upgrade in the status", row.what),
            false => assert_eq!(up.progress.map(|p| (p.from, p.to)), Some(("16".into(), "17".into())), "{}", row.what),
        }
    }
    assert_eq!(upgrade_from(Some("16"), "17"), Some("16"));
    assert_eq!(upgrade_from(Some("17"), "17"), None, "the running version is the desired one");
    assert_eq!(upgrade_from(None, "17"), None, "a new Database runs the desired version");
    assert_ne!(pre_upgrade_backup("db", "17"), pre_upgrade_backup("db", "18"), "one backup per target version");
}

#[test]
fn a_lost_primary_is_replaced_only_after_the_delay_by_a_member_the_plugin_chooses() {
    let up = [member(0, true, 600, "r"), member(1, true, 600, "r")];
    let down_briefly = [member(0, false, 10, "r"), member(1, true, 600, "r")];
    let down = [member(0, false, 120, "r"), member(1, true, 600, "r")];
    // (what, members, elects its leader, lacks failover, expected question)
    type Row<'a> = (&'a str, &'a [Observed], bool, Option<&'a str>, &'a str);
    let rows: [Row; 7] = [
        ("all up", &up, false, None, "keep"),
        ("down for less than the delay", &down_briefly, false, None, "keep"),
        ("down past the delay: the plugin is asked", &down, false, None, "ask"),
        ("a lone member: nothing to promote (its own trouble is named)", &down[..1], false, None, "keep"),
        ("the engine elects its leader: never promoted", &down, true, None, "keep"),
        ("no failover in the plugin: Degraded says so", &down, false, Some("no choose-primary"), "refuse"),
        ("a primary that is not a member is not lost", &up[1..], false, None, "keep"),
    ];
    for (what, members, elects, lacks, expected) in rows {
        let question = failover_question(members, "db-0", MINUTE, elects, lacks.map(str::to_string));
        let got = match &question {
            FailoverQuestion::Keep => "keep",
            FailoverQuestion::Ask(candidates) => {
                assert_eq!(candidates.iter().map(|m| (m.pod.as_str(), m.primary)).collect::<Vec<_>>(), [("db-0", true), ("db-1", false)]);
                "ask"
            }
            FailoverQuestion::Refuse(note) => {
                assert_eq!((note.reason, note.condition), (Reason::NoSafeFailover, Some((ConditionType::Degraded, true))), "{what}");
                assert!(note.message.contains("no choose-primary"), "{what}: {}", note.message);
                "refuse"
            }
        };
        assert_eq!(got, expected, "{what}");
    }

    // (what, the plugin's answer, expected primary, failed over, what is said)
    type Answer<'a> = (&'a str, Result<FailoverDecision, String>, &'a str, bool, &'a [(Reason, bool)]);
    let answers: [Answer; 4] = [
        (
            "promotes a member",
            Ok(FailoverDecision::Promote { pod: "db-1".into(), command: vec![] }),
            "db-1",
            true,
            &[(Reason::FailoverPromoted, true)],
        ),
        (
            "no safe member: kept, Degraded",
            Ok(FailoverDecision::NoSafeMember("behind".into())),
            "db-0",
            false,
            &[(Reason::NoSafeFailover, true)],
        ),
        ("the call failed: kept, Degraded without an Event", Err("trap".into()), "db-0", false, &[(Reason::FailoverFailed, false)]),
        ("an election answer is not a promotion", Ok(FailoverDecision::Elected("db-1".into())), "db-0", false, &[]),
    ];
    for (what, answer, primary, failed_over, notes) in answers {
        let chosen = failover("db-0", MINUTE, None, answer, Fenced::Unknown);
        assert_eq!((chosen.name.as_str(), chosen.failed_over, said(&chosen.notes).as_slice()), (primary, failed_over, notes), "{what}");
    }
    // The Event says whether the old primary was fenced before the promotion.
    let fences = [
        (Fenced::Confirmed, "fenced by its agent;"),
        (Fenced::Stopped, "fenced by its agent, which stopped its engine"),
        (Fenced::Unknown, "its agent did not fence it"),
    ];
    let promote = || Ok(FailoverDecision::Promote { pod: "db-1".into(), command: vec![] });
    for (fenced, says) in fences {
        let chosen = failover("db-0", MINUTE, Some("node n1 has not renewed its lease for 31 s"), promote(), fenced);
        assert_eq!((chosen.name.as_str(), chosen.failed_over), ("db-1", true));
        assert!(chosen.notes[0].message.contains(says), "{}", chosen.notes[0].message);
        assert!(chosen.notes[0].message.contains("not ready for 60s (node n1 has not renewed its lease"), "{}", chosen.notes[0].message);
    }
    // An engine that neither confirmed its fence nor was stopped may take writes again:
    // nobody is promoted yet, and the pass comes back soon.
    let mut waiting = failover("db-0", MINUTE, None, promote(), Fenced::Ordered);
    assert_eq!((waiting.name.as_str(), waiting.failed_over), ("db-0", false));
    assert_eq!(
        waiting.switching.as_deref(),
        Some("failover to db-1: waiting for db-0's engine to confirm its fence, or its agent to stop it")
    );
    assert_eq!(said(&waiting.notes), [(Reason::NoSafeFailover, true)]);
    assert!(waiting.notes[0].message.contains("has not confirmed the fence and was not stopped; db-1 is promoted once it is"));
    // The promotion's Event says how many replicas were told to follow the new primary;
    // nothing when none was asked, and no other note is touched.
    let mut promoted = failover("db-0", MINUTE, None, promote(), Fenced::Confirmed);
    told_to_follow(&mut promoted.notes, (1, 2));
    assert!(promoted.notes[0].message.ends_with("; 1 of 2 replicas told to follow it"), "{}", promoted.notes[0].message);
    let mut alone = failover("db-0", MINUTE, None, promote(), Fenced::Confirmed);
    let before = alone.notes[0].message.clone();
    told_to_follow(&mut alone.notes, (0, 0));
    assert_eq!(alone.notes[0].message, before, "no replica asked: nothing said");
    told_to_follow(&mut waiting.notes, (1, 1));
    assert!(!waiting.notes[0].message.contains("told to follow"), "not a promotion");
}

/// Under synchronous replication a failover waits while as many of the replicas the lost
/// primary last named to confirm its commits as confirmed each are not ready or silent:
/// a ready replica that was not named confirmed none of them.
#[test]
fn a_failover_waits_for_the_replicas_named_to_confirm_the_last_commits() {
    let candidate = |pod: &str, ready: bool, position: Option<&str>| Member {
        pod: pod.into(),
        ordinal: pod.trim_start_matches("db-").parse().unwrap_or(0),
        ready,
        primary: pod == "db-0",
        position: position.map(String::from),
        answer: None,
    };
    let members = |one: (bool, Option<&str>), two: (bool, Option<&str>)| {
        vec![candidate("db-0", false, None), candidate("db-1", one.0, one.1), candidate("db-2", two.0, two.1)]
    };
    let (up, down, silent) = ((true, Some("0/5")), (false, None), (true, None));
    // (what, the primary's record, spec's synchronous replicas, members, waits for)
    type Row<'a> = (&'a str, Option<&'a str>, u32, Vec<Member>, Option<&'a str>);
    let rows: [Row; 10] = [
        ("the named replica down, an unnamed one ready", Some("1/db-1"), 1, members(down, up), Some("db-1 is named")),
        ("the named replica ready but silent", Some("1/db-1"), 1, members(silent, up), Some("db-1 is named")),
        ("the named replica answers", Some("1/db-1"), 1, members(up, down), None),
        ("an unnamed replica down, the named one answers", Some("1/db-2"), 1, members(down, up), None),
        ("both named answer", Some("1/db-1,db-2"), 1, members(up, up), None),
        ("one of two named is down: a commit may be on it alone", Some("1/db-1,db-2"), 1, members(down, up), Some("db-1 is named")),
        ("neither of two named answers", Some("1/db-1,db-2"), 1, members(down, silent), Some("db-1, db-2 are named")),
        ("asynchronous again: the user accepts the loss", Some("1/db-1"), 0, members(down, up), None),
        ("degraded: commits waited for no replica", Some("0"), 1, members(down, up), None),
        ("any replica confirmed (none named), or no record", None, 1, members(down, up), None),
    ];
    for (what, told, synchronous, candidates, waits) in rows {
        let why = named_replicas_wait(told, synchronous, &candidates);
        match (waits, why.as_deref()) {
            (None, None) => {}
            (Some(named), Some(why)) => assert!(why.starts_with(named) && why.contains("could lose what only"), "{what}: {why}"),
            (_, why) => panic!("{what}: {why:?}"),
        }
    }
    assert_eq!(named_replicas_wait(Some("1"), 1, &members(down, up)), None, "any replica: the plugin weighs the ready ones");
}

/// A primary taken as down because its node went silent, or because its engine's
/// readiness probe fails while every container runs, stays while its agent answers as the
/// primary (its engine answered the agent); not once its agent is silent too (a hung
/// engine), or says it follows, nor when it is fenced, or its pod says it is down
/// otherwise (a container restarting or crashed).
#[test]
fn a_primary_whose_agent_answers_as_primary_stays_when_only_its_node_or_probe_says_down() {
    let status = |primary: bool| {
        Some(crate::agent::Status {
            primary,
            position: "0/1".into(),
            lag: None,
            volume: None,
            archive: None,
            exporter: None,
            signals: Default::default(),
        })
    };
    let cut = Observed { cut_off: true, ..member(0, false, 40, "r1") };
    let probing = Observed { probe_failing: true, down: Some("container postgres is not ready".into()), ..member(0, false, 40, "r1") };
    let fenced = Observed { fenced: true, ..probing.clone() };
    let down = member(0, false, 40, "r1");
    let members = |primary: &Observed| vec![primary.clone(), member(1, true, 0, "r1")];
    // (what, the primary, what its agent said, kept)
    let rows = [
        ("cut off, answering as the primary: kept", &cut, status(true), true),
        ("cut off, no answer: a failover", &cut, None, false),
        ("cut off, says it follows: a failover", &cut, status(false), false),
        ("its probe fails, its engine answers: kept", &probing, status(true), true),
        ("its probe fails, no answer (hung): a failover", &probing, None, false),
        ("fenced: a failover", &fenced, status(true), false),
        ("down by its pod otherwise: a failover", &down, status(true), false),
    ];
    for (what, primary, answer, kept) in rows {
        let chosen = answering_though_down(&members(primary), "db-0", &[answer, status(false)]);
        assert_eq!(chosen.as_ref().map(|c| (c.name.as_str(), c.failed_over)), kept.then_some(("db-0", false)), "{what}");
        if let Some(chosen) = chosen {
            assert_eq!(said(&chosen.notes), [(Reason::NoSafeFailover, true)], "{what}");
        }
    }
    let kept = answering_though_down(&members(&probing), "db-0", &[status(true), status(false)]).expect("kept");
    assert!(kept.notes[0].message.contains("container postgres is not ready"), "{}", kept.notes[0].message);
}

/// A member that says it takes writes while another leads is a second primary, unless
/// it is the primary, already fenced (a fenced primary says so of itself), or going.
#[test]
fn a_member_that_says_it_leads_beside_the_primary_is_a_second_primary() {
    let status = |primary: bool| {
        Some(crate::agent::Status {
            primary,
            position: "0/1".into(),
            lag: None,
            volume: None,
            archive: None,
            exporter: None,
            signals: Default::default(),
        })
    };
    let fenced = Observed { fenced: true, ..member(1, false, 5, "r1") };
    let going = Observed { terminating: true, ..member(1, true, 5, "r1") };
    // (what, member 1, what its agent said, a second primary)
    let rows = [
        ("promoted behind the operator's back", member(1, true, 0, "r1"), status(true), true),
        ("a replica", member(1, true, 0, "r1"), status(false), false),
        ("no answer", member(1, true, 0, "r1"), None, false),
        ("fenced already", fenced, status(true), false),
        ("being deleted", going, status(true), false),
    ];
    let made_to_lead = Observed { rendered: Some(("db-1".into(), "h".into())), ..member(1, true, 0, "r1") };
    let promoted_in_place = Observed { promoted: true, rendered: Some(("db-0".into(), "h".into())), ..member(1, true, 0, "r1") };
    for back in [made_to_lead, promoted_in_place] {
        let members = [member(0, true, 0, "r1"), back];
        let found = second_primaries(&members, "db-0", &[status(true), status(true)]);
        let said: Vec<_> = found.iter().map(|(m, n)| (m.name.as_str(), n.reason, n.condition)).collect();
        assert_eq!(said, [("db-1", Reason::FormerPrimaryBack, None)], "the former primary back: fenced, with an Event, no incident");
    }
    for (what, one, answer, second) in rows {
        let members = [member(0, true, 0, "r1"), one];
        let found = second_primaries(&members, "db-0", &[status(true), answer]);
        let names: Vec<&str> = found.iter().map(|(m, _)| m.name.as_str()).collect();
        assert_eq!(names, if second { vec!["db-1"] } else { vec![] }, "{what}");
        for (_, note) in &found {
            assert_eq!((note.reason, note.condition), (Reason::SecondPrimary, Some((ConditionType::Degraded, true))), "{what}");
            assert!(note.message.starts_with("db-1 says it takes writes while db-0 is the primary"), "{}", note.message);
        }
    }
}

#[test]
fn an_engine_that_elects_its_leader_is_followed_never_promoted() {
    // (what, the plugin's answer, expected leader, what is said)
    type Row<'a> = (&'a str, Result<FailoverDecision, String>, &'a str, &'a [(Reason, bool)]);
    let rows: [Row; 5] = [
        ("the same leader: nothing to say", Ok(FailoverDecision::Elected("db-0".into())), "db-0", &[]),
        ("a new leader: followed, with an Event", Ok(FailoverDecision::Elected("db-2".into())), "db-2", &[(Reason::LeaderElected, true)]),
        ("nobody leads: kept, Degraded", Ok(FailoverDecision::NoSafeMember("no quorum".into())), "db-0", &[(Reason::NoLeader, true)]),
        ("a promotion is not an election", Ok(FailoverDecision::Promote { pod: "db-1".into(), command: vec![] }), "db-0", &[]),
        ("the call failed: kept", Err("deadline".into()), "db-0", &[(Reason::FailoverFailed, false)]),
    ];
    for (what, answer, leader, notes) in rows {
        let chosen = elected("db-0", "etcd 0.2.0", answer);
        assert_eq!((chosen.name.as_str(), chosen.failed_over, said(&chosen.notes).as_slice()), (leader, false, notes), "{what}");
    }
}

#[test]
fn nothing_scales_until_the_plugin_plans_it_and_a_restore_starts_only_its_members() {
    let resumed = ScaleStatus { from: 1, to: 3, step: 2 };
    let abandoned = ScaleStatus { from: 1, to: 5, step: 1 };
    // (what, desired, members restored, StatefulSet members, progress, expected)
    type Row<'a> = (&'a str, u32, Option<u32>, Option<u32>, Option<&'a ScaleStatus>, ScaleQuestion);
    let settled =
        |granted, under_way| ScaleQuestion::Settled(Scale { granted, job: None, progress: None, under_way, refused: false, notes: vec![] });
    let rows: [Row; 7] = [
        ("a new Database starts with its members", 3, None, None, None, settled(3, false)),
        ("as many as asked: nothing to plan", 3, None, Some(3), None, settled(3, false)),
        ("more asked: planned from the members there are", 3, None, Some(1), None, ScaleQuestion::Ask { from: 1 }),
        ("fewer asked: planned too", 1, None, Some(3), None, ScaleQuestion::Ask { from: 3 }),
        ("a plan under way resumes from where it started", 3, None, Some(2), Some(&resumed), ScaleQuestion::Ask { from: 1 }),
        ("a plan for another count is dropped", 3, None, Some(2), Some(&abandoned), ScaleQuestion::Ask { from: 2 }),
        ("restoring one member of three: one starts", 3, Some(1), Some(3), None, settled(1, true)),
    ];
    for (what, desired, restored, current, progress, expected) in rows {
        assert_eq!(scale_question(desired, restored, current, progress), expected, "{what}");
    }
    assert_eq!(scale_question(3, Some(3), None, None), settled(3, false), "every member restored: all start together");

    let members = [member(0, true, 600, "r"), member(1, true, 5, "r")];
    let facts = ScaleFacts { name: "db", from: 1, desired: 3, current: 2, progress: None, members: &members };
    let plan = vec![ScaleStep::Members(2), ScaleStep::Job(job("member-add")), ScaleStep::Members(3)];
    let none_done = |_: &str| JobState::Missing;
    let scale_now = scale(facts, Ok(plan.clone()), &none_done);
    assert_eq!(scale_now.granted, 2, "two ready: on to the Job");
    assert_eq!(scale_now.job, Some(("db-scale-1-3-1".into(), job("member-add"))));
    assert_eq!(scale_now.progress, Some(ScaleStatus { from: 1, to: 3, step: 1 }));
    assert!(scale_now.under_way && !scale_now.refused && scale_now.notes.is_empty());

    let added = |name: &str| if name == "db-scale-1-3-1" { JobState::Succeeded } else { JobState::Missing };
    let scale_now = scale(facts, Ok(plan.clone()), &added);
    assert_eq!((scale_now.granted, scale_now.job.is_none()), (3, true), "the Job done: the third member");

    let members = [member(0, true, 600, "r"), member(1, true, 600, "r"), member(2, true, 1, "r")];
    let done = scale(ScaleFacts { members: &members, ..facts }, Ok(plan), &added);
    assert_eq!((done.granted, done.under_way, done.progress), (3, false, None), "all ready: the plan is done");

    let refused = scale(ScaleFacts { from: 3, desired: 1, current: 3, ..facts }, Err("losing quorum".into()), &none_done);
    assert_eq!((refused.granted, refused.refused, refused.progress), (3, true, None), "refused: the members stay");
    assert_eq!(said(&refused.notes), [(Reason::ScaleRefused, true)]);
    assert!(refused.notes[0].message.contains("from 3 to 1") && refused.notes[0].message.contains("losing quorum"));
}

#[test]
fn a_scale_plan_grants_members_step_by_step_and_waits_on_its_jobs() {
    let add = ScaleStep::Job(job("etcdctl"));
    // 1 → 3, one member at a time, each registered by a Job first.
    let plan = [add.clone(), ScaleStep::Members(2), add, ScaleStep::Members(3)];
    // (what, resumed at step, members ready, Jobs done, expected (step, granted))
    type Row<'a> = (&'a str, usize, u32, &'a [usize], (usize, u32));
    let rows: [Row; 6] = [
        ("the first Job runs; the members stay", 0, 1, &[], (0, 1)),
        ("the Job done: a second member, not yet ready", 0, 1, &[0], (1, 2)),
        ("it is ready: the next Job", 0, 2, &[0], (2, 2)),
        ("resumed at the second Job, done: the third member", 2, 2, &[0, 2], (3, 3)),
        ("all ready: the plan is done", 2, 3, &[0, 2], (4, 3)),
        ("a step done before is not looked at again", 1, 3, &[], (2, 2)),
    ];
    for (what, from, ready_members, done, expected) in rows {
        let ready = |n: u32| n <= ready_members;
        assert_eq!(scale_progress(&plan, 1, from, ready, |s| done.contains(&s)), expected, "{what}");
    }
    assert_eq!(scale_progress(&[ScaleStep::Members(5)], 3, 0, |_| false, |_| false), (0, 5), "one step: granted at once");
    assert_eq!(scale_progress(&[], 3, 0, |_| true, |_| true), (0, 3), "an empty plan keeps the start");
}

#[test]
fn members_roll_one_at_a_time_only_once_the_stateful_set_is_observed() {
    let set = |observed: i64, revision: &str| {
        SetFacts::of(&StatefulSet {
            metadata: kube::api::ObjectMeta { generation: Some(2), ..Default::default() },
            status: Some(StatefulSetStatus {
                observed_generation: Some(observed),
                update_revision: Some(revision.into()),
                ..Default::default()
            }),
            ..Default::default()
        })
    };
    let (seen, unseen) = (set(2, "new"), set(1, "new"));
    let old = [member(0, true, 600, "old"), member(1, true, 600, "old"), member(2, true, 600, "old")];
    let new = [member(0, true, 600, "new"), member(1, true, 600, "new"), member(2, true, 600, "new")];
    let one_down = [member(0, true, 600, "new"), member(1, false, 600, "old"), member(2, true, 600, "new")];
    // (what, members, StatefulSet, granted, expected restart, rolled)
    type Row<'a> = (&'a str, &'a [Observed], Option<&'a SetFacts>, u32, Option<&'a str>, bool);
    let rows: [Row; 7] = [
        ("replicas first, highest ordinal", &old, Some(&seen), 3, Some("db-2"), false),
        ("the controller has not seen the spec: nothing moves", &old, Some(&unseen), 3, None, false),
        ("no StatefulSet yet", &old, None, 3, None, false),
        ("all on the new revision: rolled", &new, Some(&seen), 3, None, true),
        ("a member down on the old revision restarts first", &one_down, Some(&seen), 3, Some("db-1"), false),
        ("fewer members than granted: not rolled", &new[..2], Some(&seen), 3, None, false),
        ("granted fewer during a scale: rolled at that count", &new[..2], Some(&seen), 2, None, true),
    ];
    for (what, members, set, granted, restart, done) in rows {
        let roll = roll(members, "db-0", set, "", (granted, false));
        assert_eq!((roll.restart.as_deref(), roll.done), (restart, done), "{what}");
        assert!(roll.labels.is_empty(), "{what}: the labels already say each role");
    }
    let promoting = roll(&old, "db-0", Some(&seen), "", (3, true));
    assert_eq!(promoting.restart, None, "a pass that promoted a member restarts none: it saw the members before");
    let after_failover = roll(&new, "db-1", Some(&seen), "", (3, true));
    assert_eq!(after_failover.labels, [("db-0".to_string(), "replica"), ("db-1".to_string(), "primary")], "roles follow the primary");
    let mut leaving = new.clone();
    leaving[0].terminating = true;
    assert_eq!(
        roll(&leaving, "db-1", Some(&seen), "", (3, false)).labels,
        [("db-1".to_string(), "primary")],
        "a terminating pod is not labelled"
    );
}

#[test]
fn upgrade_steps_run_in_order_each_waiting_for_the_one_before() {
    let roll_then_job = [UpgradeStep::RollingRestart, UpgradeStep::Job(job("mariadb-upgrade"))];
    // (what, from, rolled, jobs done, the step in progress after)
    let rows: [(&str, usize, bool, &[usize], usize); 6] = [
        ("members still rolling", 0, false, &[], 0),
        ("rolled: on to the Job", 0, true, &[], 1),
        ("the Job succeeded: the plan is done", 0, true, &[1], 2),
        ("a Job done early does not skip the roll", 0, false, &[1], 0),
        ("picks up where the status left off", 1, true, &[], 1),
        ("past the end stays there", 2, true, &[1], 2),
    ];
    for (what, from, rolled, done, expected) in rows {
        assert_eq!(next_step(&roll_then_job, from, rolled, |s| done.contains(&s)), expected, "{what}");
    }
    assert_eq!(next_step(&[], 0, false, |_| false), 0, "an empty plan has no step in progress");
}

#[test]
fn an_upgrade_runs_its_jobs_by_name_and_completes_once_the_members_rolled() {
    let plan = UpgradePlan { steps: vec![UpgradeStep::RollingRestart, UpgradeStep::Job(job("mariadb-upgrade"))], backup_first: false };
    let at = |step| UpgradeStatus { from: "11.4".into(), to: "11.8".into(), step };
    let job_name = format!("db-upgrade-{}-1", &hex_digest(b"11.8")[..8]);
    let upgraded = |name: &str| if name.ends_with("-1") { JobState::Succeeded } else { JobState::Running };
    let running = |_: &str| JobState::Running;

    let rolling = steps("db", Some(&at(0)), "11.8", Some(&plan), false, &running);
    assert_eq!((rolling.job, rolling.progress, rolling.under_way), (None, Some(at(0)), true), "the members roll first");

    let job_now = steps("db", Some(&at(0)), "11.8", Some(&plan), true, &running);
    assert_eq!(job_now.job, Some((job_name, job("mariadb-upgrade"))), "rolled: the Job runs");
    assert_eq!(job_now.progress, Some(at(1)));

    let done = steps("db", Some(&at(1)), "11.8", Some(&plan), true, &upgraded);
    assert_eq!((done.completed.as_deref(), done.progress, said(&done.notes)), (Some("11.8"), None, vec![(Reason::UpgradeCompleted, true)]));

    let backing_up = steps("db", Some(&at(0)), "11.4", Some(&plan), true, &upgraded);
    assert_eq!((backing_up.job, backing_up.progress, backing_up.under_way), (None, Some(at(0)), true), "the old version renders: waiting");
    let none = steps("db", None, "11.8", None, true, &upgraded);
    assert_eq!((none.progress, none.under_way, none.completed), (None, false, None), "no upgrade");
}

#[test]
fn a_database_waiting_only_for_its_members_is_looked_at_again_when_its_primary_would_count_as_lost_or_less_often_the_longer_it_waits() {
    let settings = Settings::default();
    let (progress, after) = (settings.progress_requeue, settings.failover_after);
    let steady = Settled {
        moving: false,
        waiting_for_members: false,
        waited: Duration::ZERO,
        primary_lost_in: None,
        grow_failed: false,
        next: MINUTE * 5,
    };
    let waiting = Settled { waiting_for_members: true, ..steady };
    let secs = Duration::from_secs;
    // (what, how the pass left it, expected requeue)
    let rows = [
        ("something moves: soon", Settled { moving: true, ..waiting }, progress),
        ("a backup runs while steady: soon", Settled { moving: true, ..steady }, progress),
        ("members coming up: the StatefulSet's status wakes it; a safety net after", waiting, progress * MEMBER_WAIT),
        ("coming up for 10 s: the shortest net", Settled { waited: secs(10), ..waiting }, progress * MEMBER_WAIT),
        ("coming up for 100 s: as long again", Settled { waited: secs(100), ..waiting }, secs(100)),
        ("coming up for an hour: as often as a steady Database", Settled { waited: MINUTE * 60, ..waiting }, settings.idle_requeue),
        (
            "long down, primary down 3 s: its delay still counts",
            Settled { waited: MINUTE * 60, primary_lost_in: Some(after - secs(3)), ..waiting },
            after - secs(3),
        ),
        (
            "the primary down for 3 s: when its delay runs out",
            Settled { primary_lost_in: Some(after - secs(3)), ..waiting },
            after - secs(3),
        ),
        ("lost in 1 s: then, though sooner than a progress requeue", Settled { primary_lost_in: Some(secs(1)), ..waiting }, secs(1)),
        ("down past the delay, no failover possible: soon", Settled { primary_lost_in: Some(secs(0)), ..waiting }, progress),
        ("just down: when its delay runs out", Settled { primary_lost_in: Some(after), ..waiting }, after),
        (
            "the primary lost, no member safe to promote, nothing else waited for: soon",
            Settled { primary_lost_in: Some(secs(0)), ..steady },
            progress,
        ),
        ("a refused volume grow: a while", Settled { grow_failed: true, ..steady }, progress * 6),
        ("steady: when due", steady, MINUTE * 5),
    ];
    for (what, settled, expected) in rows {
        assert_eq!(requeue(&settings, &settled), expected, "{what}");
    }
}

/// A switchover goes to a ready member of an engine whose host chooses the primary; a
/// request for the primary, another engine's or a member not ready is dropped, with why.
#[test]
fn a_switchover_is_asked_only_of_a_ready_member() {
    let members = [member(0, true, 0, "r"), member(1, true, 0, "r"), member(2, false, 5, "r")];
    let dropped = |q: SwitchoverQuestion| match q {
        SwitchoverQuestion::Drop(note) => (note.reason, note.message),
        other => panic!("{other:?}"),
    };
    assert_eq!(switchover_question(None, "db-0", &members, false), SwitchoverQuestion::None);
    assert_eq!(switchover_question(Some("db-1"), "db-0", &members, false), SwitchoverQuestion::Fence);
    let (reason, message) = dropped(switchover_question(Some("db-0"), "db-0", &members, false));
    assert_eq!((reason, message.as_str()), (Reason::SwitchoverDone, "switchover done: db-0 is primary"));
    for (target, elects, why) in
        [("db-1", true, "elects its own leader"), ("db-7", false, "db-7 is not a member"), ("db-2", false, "db-2 is not ready")]
    {
        let (reason, message) = dropped(switchover_question(Some(target), "db-0", &members, elects));
        assert_eq!(reason, Reason::SwitchoverRefused, "{message}");
        assert!(message.starts_with(&format!("switchover to {target} refused: ")) && message.contains(why), "{message}");
    }
    // A replica that does not replicate is refused before the primary is fenced, with why.
    let why = "ready, but it has not replicated from db-0 for 75 s: its agent says it streams nothing";
    let stalled = Observed { ready: false, not_replicating: true, down: Some(why.into()), ..member(1, true, 0, "r") };
    let (reason, message) = dropped(switchover_question(Some("db-1"), "db-0", &[members[0].clone(), stalled], false));
    assert_eq!((reason, message), (Reason::SwitchoverRefused, format!("switchover to db-1 refused: db-1 is {why}")));
}

/// The member leads only once the primary is fenced and the member says the position the
/// fenced primary says is its last; an unfenced primary that serves refuses the switchover.
#[test]
fn a_switchover_promotes_only_a_member_with_all_the_fenced_primary_wrote() {
    let said = |primary: bool, position: &str| crate::agent::Status {
        primary,
        position: position.into(),
        lag: None,
        volume: None,
        archive: None,
        exporter: None,
        signals: Default::default(),
    };
    let (last, behind, same) = (said(true, "0/5000"), said(false, "0/4F00"), said(false, "0/5000"));
    let promoted = switchover("db-0", "db-1", Fenced::Confirmed, false, (Some(&last), Some(&same)));
    assert_eq!((promoted.0.name.as_str(), promoted.0.failed_over, promoted.1), ("db-1", true, None));
    assert_eq!(promoted.0.notes[0].reason, Reason::SwitchoverPromoted);
    // (what, the fence, the primary ready, what the primary and the member said)
    type Row<'a> = (&'a str, Fenced, bool, Option<&'a crate::agent::Status>, Option<&'a crate::agent::Status>);
    let waits: [(Row, &str); 5] = [
        (("behind", Fenced::Confirmed, false, Some(&last), Some(&behind)), "db-1 (at 0/4F00) to reach db-0's last position 0/5000"),
        (("the fence not confirmed", Fenced::Ordered, true, Some(&last), Some(&same)), "db-0's engine to confirm its fence"),
        (("the primary silent", Fenced::Confirmed, false, None, Some(&same)), "the agent of db-0 to say its last position"),
        (("the member silent", Fenced::Confirmed, false, Some(&last), None), "the agent of db-1 to say its position"),
        (
            ("the primary's agent gone after the fence", Fenced::Unknown, false, Some(&last), Some(&same)),
            "the agent of db-0 to answer its fence",
        ),
    ];
    for ((what, fenced, ready, primary, target), waiting) in waits {
        let (kept, refused) = switchover("db-0", "db-1", fenced, ready, (primary, target));
        assert_eq!((kept.name.as_str(), kept.failed_over, refused), ("db-0", false, None), "{what}");
        assert_eq!(kept.switching, Some(format!("switchover to db-1: db-0 fenced; waiting for {waiting}")), "{what}");
    }
    let said_primary = said(true, "0/5000");
    let (kept, refused) = switchover("db-0", "db-1", Fenced::Confirmed, false, (Some(&last), Some(&said_primary)));
    assert_eq!((kept.name.as_str(), refused), ("db-0", None), "a member that says it is primary is not a replica that caught up");
    let (kept, refused) = switchover("db-0", "db-1", Fenced::Unknown, true, (Some(&last), Some(&same)));
    assert_eq!((kept.name.as_str(), kept.switching), ("db-0", None));
    assert!(refused.is_some_and(|n| n.reason == Reason::SwitchoverRefused && n.message.contains("did not fence it")));
}

/// A drain of the primary's node moves the primary to the first ready member on a node
/// that is not cordoned; nothing moves while the primary's node is not cordoned, or when
/// no member could lead in its place.
#[test]
fn a_cordoned_primary_switches_over_to_a_ready_member_elsewhere() {
    let on = |ordinal: u32, ready: bool, node: &str| Observed { node: Some(node.into()), ..member(ordinal, ready, 100, "r") };
    let members = vec![on(0, true, "n1"), on(1, true, "n1"), on(2, true, "n3"), on(3, true, "n4")];
    let target = |cordoned: &[&str], members: &[Observed]| drain_target(members, "db-0", |n| cordoned.contains(&n)).map(|m| m.name.clone());
    assert_eq!(target(&["n1"], &members).as_deref(), Some("db-2"), "db-1 shares the cordoned node");
    assert_eq!(target(&["n2", "n3"], &members), None, "the primary's node is not cordoned");
    assert_eq!(target(&["n1", "n3", "n4"], &members), None, "no member elsewhere");
    let one_down = vec![on(0, true, "n1"), on(1, false, "n2"), on(2, true, "n3")];
    assert_eq!(target(&["n1"], &one_down), None, "another member is down: the budgets refuse the drain, the primary stays");
    let fenced = vec![on(0, true, "n1"), Observed { fenced: true, ..on(2, true, "n3") }];
    assert_eq!(target(&["n1"], &fenced), None, "a fenced member does not lead");
}

/// Synchronous replication with too few replicas ready: commits wait (the user's choice,
/// or until the bound), then the primary is asked to wait for none, and once enough are
/// back to wait for them again; the condition says which, and when it changed.
#[test]
fn too_few_replicas_for_synchronous_commits_wait_or_degrade_after_the_bound_and_recover() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    let now = k8s_openapi::jiff::Timestamp::now();
    let ago = |s: i64| now - k8s_openapi::jiff::SignedDuration::from_secs(s);
    let condition = |status: bool, reason: Reason, since: i64| Condition {
        type_: ConditionType::SynchronousReplication.as_str().into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.as_str().into(),
        message: String::new(),
        observed_generation: None,
        last_transition_time: Time(ago(since)),
    };
    let wait = Synchronous { replicas: 1, degrade_after: None };
    let degrade = Synchronous { replicas: 2, degrade_after: Some(Duration::from_secs(30)) };
    let healthy = condition(true, Reason::SynchronousReplication, 600);
    let missing = |since| condition(false, Reason::ReplicasMissing, since);
    let degraded = condition(false, Reason::ReplicationDegraded, 5);
    // (what, the choice, ready replicas, the condition before; what is set, the condition after, look again)
    type Row<'a> = (&'a str, Synchronous, u32, Option<&'a Condition>, Option<u32>, (bool, Reason), Option<u64>);
    let rows: [Row; 9] = [
        ("enough, at creation", wait, 1, None, None, (true, Reason::SynchronousReplication), None),
        ("enough, steady", degrade, 2, Some(&healthy), None, (true, Reason::SynchronousReplication), None),
        ("too few, waiting by choice", wait, 0, Some(&healthy), None, (false, Reason::ReplicasMissing), None),
        ("too few, just now", degrade, 1, Some(&healthy), None, (false, Reason::ReplicasMissing), Some(30)),
        ("too few for 20 s", degrade, 1, Some(&missing(20)), None, (false, Reason::ReplicasMissing), Some(10)),
        ("too few for 30 s: degraded", degrade, 1, Some(&missing(30)), Some(0), (false, Reason::ReplicationDegraded), None),
        ("degraded, still too few: said again", degrade, 0, Some(&degraded), Some(0), (false, Reason::ReplicationDegraded), None),
        ("degraded, enough again: restored", degrade, 2, Some(&degraded), Some(2), (true, Reason::SynchronousReplication), None),
        ("waiting, enough again", degrade, 3, Some(&missing(20)), None, (true, Reason::SynchronousReplication), None),
    ];
    let names: Vec<String> = (1..=3).map(|i| format!("db-{i}")).collect();
    let unnamed = |ready: u32| Replicas { ready: &names[..ready as usize], told: None, named: false };
    for (what, sync, ready, said, set, (status, reason), look_again) in rows {
        let plan = replication(sync, unnamed(ready), said, now);
        assert_eq!(plan.set, set.map(|replicas| Setting { replicas, members: vec![] }), "{what}");
        assert_eq!((plan.note.condition, plan.note.reason), (Some((ConditionType::SynchronousReplication, status)), reason), "{what}");
        assert_eq!(plan.look_again.map(|d| d.as_secs()), look_again, "{what}");
    }
    let degrading = replication(degrade, unnamed(1), Some(&missing(31)), now);
    assert_eq!(degrading.note.event, Event::Warning, "degrading is news");
    assert!(degrading.note.message.contains("1 of the 2 replicas"), "{}", degrading.note.message);
    assert_eq!(replication(degrade, unnamed(2), Some(&degraded), now).note.event, Event::Normal, "so is recovering");
}

/// With a primary whose agent names the replicas that confirm, each commit waits for the
/// ready replicas alone: the set follows them as they change, is asked for only when the
/// primary does not already work so (or its engine restarted since), and stays as it was
/// while too few are ready (commits wait for the named ones, or none once degraded).
#[test]
fn only_ready_replicas_confirm_synchronous_commits() {
    let now = k8s_openapi::jiff::Timestamp::now();
    let sync = Synchronous { replicas: 1, degrade_after: Some(Duration::from_secs(30)) };
    let ready = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let (both, one) = (ready(&["db-1", "db-2"]), ready(&["db-2"]));
    let key = |plan: ReplicationPlan| plan.set.map(|s| s.key());
    // (what, ready replicas, what the primary was told; what is asked for)
    type Row<'a> = (&'a str, &'a [String], Option<&'a str>, Option<&'a str>);
    let rows: [Row; 6] = [
        ("a new primary, or one whose engine restarted: any replica confirms", &both, None, Some("1/db-1,db-2")),
        ("told already", &both, Some("1/db-1,db-2"), None),
        ("db-1 is not ready: it no longer confirms", &one, Some("1/db-1,db-2"), Some("1/db-2")),
        ("db-1 is ready again", &both, Some("1/db-2"), Some("1/db-1,db-2")),
        ("none ready: commits wait for those named", &[], Some("1/db-2"), None),
        ("told to wait for none, enough again", &one, Some("0"), Some("1/db-2")),
    ];
    for (what, ready, told, asked) in rows {
        let plan = replication(sync, Replicas { ready, told, named: true }, None, now);
        assert_eq!(key(plan).as_deref(), asked, "{what}");
    }
    let degraded = k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
        type_: ConditionType::SynchronousReplication.as_str().into(),
        status: "False".into(),
        reason: Reason::ReplicationDegraded.as_str().into(),
        message: String::new(),
        observed_generation: None,
        last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
    };
    let still = |told| key(replication(sync, Replicas { ready: &[], told, named: true }, Some(&degraded), now));
    assert_eq!(still(Some("1/db-2")).as_deref(), Some("0"), "degraded: a primary that waits is told to wait for none");
    assert_eq!(still(Some("0")), None, "and only once");
    // The replicas are told what the primary works with, whether or not it is asked again;
    // nothing while too few are ready, or once degraded.
    let named = |ready, told, said| replication(sync, Replicas { ready, told, named: true }, said, now).named.map(|s| s.key());
    assert_eq!(named(&both, Some("1/db-1,db-2"), None).as_deref(), Some("1/db-1,db-2"));
    assert_eq!(named(&one, None, None).as_deref(), Some("1/db-2"));
    assert_eq!(named(&[], Some("1/db-2"), None), None);
    assert_eq!(named(&[], Some("1/db-2"), Some(&degraded)), None);
}

/// A primary fenced for an asked switchover is given the switchover's patience before it
/// counts as lost; unasked, unfenced, or on a lost node, the failover delay alone.
#[test]
fn a_primary_fenced_for_a_switchover_is_given_time_before_it_counts_as_lost() {
    let after = Duration::from_secs(2);
    let fenced = Observed { fenced: true, ..member(0, false, 5, "r1") };
    let members = [fenced.clone(), member(1, true, 5, "r1")];
    assert_eq!(failover_delay(&members, "db-0", true, after), SWITCHOVER_PATIENCE, "fenced for the switchover asked");
    assert_eq!(failover_delay(&members, "db-0", false, after), after, "no switchover asked");
    assert_eq!(failover_delay(&[member(0, false, 5, "r1")], "db-0", true, after), after, "not fenced: down of itself");
    let lost = [Observed { node_lost: true, ..fenced }, member(1, true, 5, "r1")];
    assert_eq!(failover_delay(&lost, "db-0", true, after), after, "its node lost");
    assert_eq!(failover_delay(&members, "db-0", true, Duration::from_secs(30)), Duration::from_secs(30), "a longer delay stands");
}
