//! Conditions and phase: deterministic, so an unchanged cluster writes nothing. The
//! end of a pass, [`conclude`], is a pure function of what the pass found and did.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::members::Observed;
use crate::crd::{DatabaseStatus, MemberStatus, Phase};

/// Condition types a Database reports.
pub mod kind {
    /// All members ready and serving the desired spec.
    pub const READY: &str = "Ready";
    /// Members are being created, rolled or upgraded.
    pub const PROGRESSING: &str = "Progressing";
    /// Fewer members ready than desired, or no safe failover.
    pub const DEGRADED: &str = "Degraded";
    /// The engine plugin is loaded and accepted the spec.
    pub const PLUGIN_READY: &str = "PluginReady";
    /// Backups are configured correctly and the latest one succeeded.
    pub const BACKUP_HEALTHY: &str = "BackupHealthy";
    /// `restoreFrom` was carried out (only on Databases that ask for it).
    pub const RESTORED: &str = "Restored";
}

/// The longest condition message kept; the rest is cut, so a status write never
/// fails for its size.
pub const MAX_MESSAGE: usize = 4096;

/// The `reason` of a condition or an Event: one word a program can match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The engine has no plugin loaded.
    EngineNotFound,
    /// The host or the plugin refuses the spec.
    InvalidSpec,
    /// The plugin's validate call failed.
    PluginFailed,
    /// The plugin's render call failed.
    RenderFailed,
    /// An upgrade plan was accepted and began.
    UpgradeStarted,
    /// The plugin refuses the version change.
    UpgradeRefused,
    /// The plugin refused to change the number of members.
    ScaleRefused,
    /// Every step of an upgrade plan is done.
    UpgradeCompleted,
    /// The backup an upgrade plan asks for cannot be taken.
    PreUpgradeBackupImpossible,
    /// A member was chosen to replace a lost primary.
    FailoverPromoted,
    /// The primary is lost and the plugin finds no member safe to promote.
    NoSafeFailover,
    /// The plugin's choose-primary call failed.
    FailoverFailed,
    /// The engine elected another member to lead (engine-elected leadership).
    LeaderElected,
    /// Members answer, but the plugin names none as leader (engine-elected leadership).
    NoLeader,
    /// The serving plugin rendered the spec.
    Rendered,
    /// Rendered, but a newer build of the plugin was refused.
    NewerVersionRejected,
    /// A restore writes the data volume before the members start.
    Restoring,
    /// The restore asked for is done.
    Restored,
    /// The restore asked for cannot happen.
    RestoreFailed,
    /// A member was restarted onto the current revision.
    MemberRestarted,
    /// A member whose node stayed lost was made again on another node.
    MemberMoved,
    /// Every member is ready on the current revision.
    AllMembersReady,
    /// Not every member is ready on the current revision.
    MembersNotReady,
    /// No member the Database ran with is down.
    AllMembersUp,
    /// Fewer members are ready than desired, after the Database ran.
    MembersDown,
    /// Something is in motion.
    Converging,
    /// Nothing is in motion.
    Steady,
    /// The API server refused to grow a member's claim.
    VolumeGrowFailed,
    /// Backups are configured and the latest succeeded.
    BackupsHealthy,
    /// Backups are misconfigured or the latest failed.
    BackupProblem,
    /// Retention removed backups from the bucket.
    BackupsPruned,
    /// The backup to restore cannot be read yet (its bucket or Secret); retried.
    RestoreWaiting,
    /// The final backup of a deleted Database is running.
    FinalBackupRunning,
    /// The final backup succeeded; the Database goes.
    FinalBackupTaken,
    /// The final backup failed; the Database stays.
    FinalBackupFailed,
    /// No final backup can be taken; the Database stays.
    FinalBackupImpossible,
    /// A Database that never ran went without a final backup.
    DeletedWithoutBackup,
    /// The API server refused a write for a reason a user can act on.
    WriteRefused,
    /// The spec asks for something the engine's plugin does not declare it can do.
    CapabilityMissing,
    /// The certificate `spec.tls.issuerRef` asks cert-manager for is not issued yet.
    CertificatePending,
    /// The certificate cannot come from `spec.tls.issuerRef`: cert-manager is not
    /// installed, or its issuer gives no `ca.crt`.
    CertificateUnavailable,
    /// An object with the name of one of the Database's children is not the Database's.
    NameTaken,
}

impl Reason {
    /// The reason as the API shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::EngineNotFound => "EngineNotFound",
            Reason::InvalidSpec => "InvalidSpec",
            Reason::PluginFailed => "PluginFailed",
            Reason::RenderFailed => "RenderFailed",
            Reason::UpgradeStarted => "UpgradeStarted",
            Reason::UpgradeRefused => "UpgradeRefused",
            Reason::ScaleRefused => "ScaleRefused",
            Reason::UpgradeCompleted => "UpgradeCompleted",
            Reason::PreUpgradeBackupImpossible => "PreUpgradeBackupImpossible",
            Reason::FailoverPromoted => "FailoverPromoted",
            Reason::NoSafeFailover => "NoSafeFailover",
            Reason::FailoverFailed => "FailoverFailed",
            Reason::LeaderElected => "LeaderElected",
            Reason::NoLeader => "NoLeader",
            Reason::Rendered => "Rendered",
            Reason::NewerVersionRejected => "NewerVersionRejected",
            Reason::Restoring => "Restoring",
            Reason::Restored => "Restored",
            Reason::RestoreFailed => "RestoreFailed",
            Reason::MemberRestarted => "MemberRestarted",
            Reason::MemberMoved => "MemberMoved",
            Reason::AllMembersReady => "AllMembersReady",
            Reason::MembersNotReady => "MembersNotReady",
            Reason::AllMembersUp => "AllMembersUp",
            Reason::MembersDown => "MembersDown",
            Reason::Converging => "Converging",
            Reason::Steady => "Steady",
            Reason::VolumeGrowFailed => "VolumeGrowFailed",
            Reason::BackupsHealthy => "BackupsHealthy",
            Reason::BackupProblem => "BackupProblem",
            Reason::BackupsPruned => "BackupsPruned",
            Reason::RestoreWaiting => "RestoreWaiting",
            Reason::FinalBackupRunning => "FinalBackupRunning",
            Reason::FinalBackupTaken => "FinalBackupTaken",
            Reason::FinalBackupFailed => "FinalBackupFailed",
            Reason::FinalBackupImpossible => "FinalBackupImpossible",
            Reason::DeletedWithoutBackup => "DeletedWithoutBackup",
            Reason::WriteRefused => "WriteRefused",
            Reason::CapabilityMissing => "CapabilityMissing",
            Reason::CertificatePending => "CertificatePending",
            Reason::CertificateUnavailable => "CertificateUnavailable",
            Reason::NameTaken => "NameTaken",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Sets condition `type_`; `lastTransitionTime` moves only when the status changes.
pub fn set(conditions: &mut Vec<Condition>, type_: &str, ok: bool, reason: Reason, message: impl Into<String>, generation: Option<i64>) {
    let status = if ok { "True" } else { "False" };
    let mut message: String = message.into();
    if message.len() > MAX_MESSAGE {
        let more = message.len() - MAX_MESSAGE;
        message = format!("{}… ({more} more bytes)", crate::events::truncate(&message, MAX_MESSAGE));
    }
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        if c.status != status {
            c.last_transition_time = Time(k8s_openapi::jiff::Timestamp::now());
        }
        c.status = status.into();
        c.reason = reason.as_str().into();
        c.message = message;
        c.observed_generation = generation;
    } else {
        conditions.push(Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.as_str().into(),
            message,
            observed_generation: generation,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        });
    }
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}

/// Whether condition `type_` is currently True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

/// How long `Ready` has been False, as of `now`: how long the members have been coming
/// up (or down). Zero when it is True or not set yet.
pub fn not_ready_for(status: &DatabaseStatus, now: k8s_openapi::jiff::Timestamp) -> std::time::Duration {
    let since = status.conditions.iter().find(|c| c.type_ == kind::READY && c.status == "False").map(|c| c.last_transition_time.0);
    since.and_then(|t| now.duration_since(t).try_into().ok()).unwrap_or_default()
}

/// How growing the member volumes stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Growth {
    /// Every claim asks for `spec.storage` (or more) and has it.
    Done,
    /// A claim asks for more than it has yet: the storage provider is growing it.
    Waiting(String),
    /// The API server refused to grow a claim; retried on later passes.
    Failed(String),
}

/// What one pass found and did: everything [`conclude`] needs.
#[derive(Debug)]
pub struct Pass<'a> {
    /// The spec's generation.
    pub generation: Option<i64>,
    /// Members the spec asks for.
    pub desired: usize,
    /// The members as observed.
    pub members: &'a [Observed],
    /// Every member ready on the StatefulSet's current revision.
    pub rolled: bool,
    /// The pass set something in motion: a failover, a member restart, a restore, an upgrade.
    pub moving: bool,
    /// Growing the member volumes.
    pub growth: &'a Growth,
    /// The pass refused an upgrade or a scale: `Progressing` already says why.
    pub plan_refused: bool,
    /// A restore is loading data while the members run.
    pub restoring: bool,
}

/// Ends a pass: ready members, `Ready`, `Progressing`, `Degraded` and the phase. Returns
/// whether the Database is still progressing (and should be looked at again soon).
pub fn conclude(status: &mut DatabaseStatus, pass: &Pass) -> bool {
    let (desired, generation) = (pass.desired, pass.generation);
    // A member on its way out (a scale-down, a restart) is not counted.
    let ready = pass.members.iter().filter(|m| m.ready && !m.terminating).count();
    let all_ready = ready == desired && pass.rolled;
    let progressing = pass.moving || pass.restoring || status.upgrade.is_some() || matches!(pass.growth, Growth::Waiting(_)) || !all_ready;
    status.ready_replicas = Some(ready as i32);
    status.observed_generation = generation;
    let down = down_members(pass.members);
    let mut ready_message = format!("{ready}/{desired} members ready{down}");
    if let Some(m) = pass.members.iter().find(|m| m.unschedulable.is_some()) {
        let why = crate::events::truncate(m.unschedulable.as_deref().unwrap_or_default(), 400);
        ready_message.push_str(&format!("; {} cannot be scheduled: {why}", m.name));
    }
    let reason = if all_ready { Reason::AllMembersReady } else { Reason::MembersNotReady };
    set(&mut status.conditions, kind::READY, all_ready, reason, ready_message, generation);
    match pass.growth {
        Growth::Failed(message) => {
            set(&mut status.conditions, kind::PROGRESSING, false, Reason::VolumeGrowFailed, message.clone(), generation)
        }
        _ if pass.plan_refused => {}
        growth => {
            let message = match growth {
                Growth::Waiting(message) => message.clone(),
                _ => progress_message(status, pass.rolled),
            };
            let reason = if progressing { Reason::Converging } else { Reason::Steady };
            set(&mut status.conditions, kind::PROGRESSING, progressing, reason, message, generation);
        }
    }
    // No safe failover (or no leader) stays the word until every member is back.
    let held = [Reason::NoSafeFailover, Reason::NoLeader];
    let no_primary =
        status.conditions.iter().any(|c| c.type_ == kind::DEGRADED && c.status == "True" && held.iter().any(|r| c.reason == r.as_str()));
    if !no_primary || ready == desired {
        let degraded = ready > 0 && ready < desired && status.current_version.is_some() && pass.members.len() == desired;
        let reason = if degraded { Reason::MembersDown } else { Reason::AllMembersUp };
        set(&mut status.conditions, kind::DEGRADED, degraded, reason, format!("{ready}/{desired} members ready{down}"), generation);
    }
    status.phase = Some(phase(status, pass.restoring, all_ready, ready));
    progressing
}

/// `status.members`: each member as observed, its role from `primary`, with the
/// positions its agent said this pass (`heard`, at the time given), or before (kept
/// from `before`).
pub fn members(
    before: &[MemberStatus],
    observed: &[Observed],
    primary: Option<&str>,
    (heard, now): (&[(String, String)], k8s_openapi::jiff::Timestamp),
) -> Vec<MemberStatus> {
    observed
        .iter()
        .map(|m| {
            let at = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).map_or_else(|_| now.to_string(), |t| t.to_string());
            let said = heard.iter().find(|(pod, _)| *pod == m.name).map(|(_, position)| (position.clone(), at.clone()));
            let kept = || before.iter().find(|b| b.pod == m.name).and_then(|b| b.position.clone().zip(b.heard.clone()));
            let (position, heard) = said.or_else(kept).unzip();
            MemberStatus {
                pod: m.name.clone(),
                node: m.node.clone(),
                role: if primary == Some(m.name.as_str()) { "primary" } else { "replica" }.into(),
                ready: m.ready,
                since: m.ready_since.clone(),
                down: m.down.as_deref().map(|d| crate::events::truncate(d, 200).to_string()),
                position,
                heard,
            }
        })
        .collect()
}

/// Each member that is down and why (its node lost, its container crashing), for the
/// conditions' messages: `; orders-2: node n2 is not ready: ...`. Bounded: a few members,
/// each reason truncated.
fn down_members(members: &[Observed]) -> String {
    let down: Vec<String> = members
        .iter()
        .filter(|m| !m.ready && !m.terminating)
        .filter_map(|m| Some(format!("; {}: {}", m.name, crate::events::truncate(m.down.as_deref()?, 200))))
        .collect();
    match down.len() {
        0..=3 => down.concat(),
        n => format!("{}; and {} more", down[..3].concat(), n - 3),
    }
}

/// The phase: a restore that loads over the network keeps a Database `Restoring` while
/// its members already run, since its data is not there yet.
fn phase(status: &DatabaseStatus, restoring: bool, all_ready: bool, ready: usize) -> Phase {
    if restoring {
        Phase::Restoring
    } else if status.upgrade.is_some() {
        Phase::Updating
    } else if all_ready {
        Phase::Running
    } else if is_true(&status.conditions, kind::DEGRADED) || (ready > 0 && is_true(&status.conditions, kind::READY)) {
        Phase::Degraded
    } else {
        Phase::Creating
    }
}

fn progress_message(status: &DatabaseStatus, rolled: bool) -> String {
    match &status.upgrade {
        Some(u) => format!("upgrading {} → {} (step {})", u.from, u.to, u.step),
        None if !rolled => "members are being created or restarted".into(),
        None => "steady".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_on_a_status_change() {
        let mut c = Vec::new();
        set(&mut c, kind::READY, false, Reason::MembersNotReady, "0/3 ready", Some(1));
        let first = c[0].last_transition_time.clone();
        set(&mut c, kind::READY, false, Reason::MembersNotReady, "1/3 ready", Some(1));
        assert_eq!(c[0].last_transition_time, first, "same status keeps the time");
        assert_eq!(c[0].message, "1/3 ready");
        std::thread::sleep(std::time::Duration::from_millis(2));
        set(&mut c, kind::READY, true, Reason::AllMembersReady, "3/3 ready", Some(1));
        assert_ne!(c[0].last_transition_time, first);
        assert!(is_true(&c, kind::READY));
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
        let heard = [("db-1".to_string(), "0/3000148".to_string())];
        let first = super::members(&[], &observed, Some("db-1"), (&heard, now));
        let roles: Vec<(&str, &str, bool)> = first.iter().map(|m| (m.pod.as_str(), m.role.as_str(), m.ready)).collect();
        assert_eq!(roles, [("db-0", "replica", false), ("db-1", "primary", true), ("db-2", "replica", true)]);
        assert_eq!(first[0].down.as_deref(), Some("node n3 is not ready"));
        assert_eq!((first[1].node.as_deref(), first[1].since.as_deref()), (Some("n2"), Some("2026-11-27T17:00:00Z")));
        assert_eq!((first[1].position.as_deref(), first[1].heard.as_deref()), (Some("0/3000148"), Some("2027-01-15T08:00:00Z")));
        assert_eq!(first[2].position, None, "its agent said nothing");

        let later = now + k8s_openapi::jiff::SignedDuration::from_secs(60);
        let again = super::members(&first, &observed[1..], Some("db-1"), (&[], later));
        assert_eq!(again.len(), 2, "db-0 is gone");
        assert_eq!((again[0].position.as_deref(), again[0].heard.as_deref()), (Some("0/3000148"), Some("2027-01-15T08:00:00Z")), "kept");
    }

    #[test]
    fn not_ready_for_counts_from_when_ready_turned_false() {
        let mut status = DatabaseStatus::default();
        let now = k8s_openapi::jiff::Timestamp::now();
        assert_eq!(not_ready_for(&status, now), std::time::Duration::ZERO, "no Ready condition yet");
        set(&mut status.conditions, kind::READY, false, Reason::MembersNotReady, "0/3 ready", Some(1));
        status.conditions[0].last_transition_time = Time(now - k8s_openapi::jiff::SignedDuration::from_secs(90));
        assert_eq!(not_ready_for(&status, now), std::time::Duration::from_secs(90));
        set(&mut status.conditions, kind::READY, true, Reason::AllMembersReady, "3/3 ready", Some(1));
        assert_eq!(not_ready_for(&status, now), std::time::Duration::ZERO, "Ready");
    }

    use crate::crd::UpgradeStatus;

    fn member(ordinal: u32, ready: bool) -> Observed {
        Observed {
            name: format!("orders-{ordinal}"),
            ordinal,
            ready,
            since_seconds: 60,
            revision: Some("r1".into()),
            role: None,
            terminating: false,
            unschedulable: None,
            node: None,
            down: None,
            ready_since: None,
            address: None,
        }
    }

    fn members(ready: &[bool]) -> Vec<Observed> {
        ready.iter().enumerate().map(|(i, r)| member(i as u32, *r)).collect()
    }

    fn condition<'a>(status: &'a DatabaseStatus, type_: &str) -> (&'a str, &'a str, &'a str) {
        let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("no {type_} condition"));
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
            };
            let progressing = conclude(&mut status, &pass);
            let what = row.what;
            assert_eq!(status.phase, Some(row.phase), "{what}");
            assert_eq!(progressing, row.progressing, "{what}");
            assert_eq!(condition(&status, kind::PROGRESSING).0, if row.progressing { "True" } else { "False" }, "{what}");
            let (ok, reason, _) = condition(&status, kind::READY);
            assert_eq!((ok, reason), row.ready_condition, "{what}");
            let (ok, reason, _) = condition(&status, kind::DEGRADED);
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
        };
        let mut status = ran();
        set(&mut status.conditions, kind::PROGRESSING, false, Reason::UpgradeRefused, "downgrade refused", Some(1));
        set(&mut status.conditions, kind::DEGRADED, true, Reason::NoSafeFailover, "no replica reports a position", Some(1));
        conclude(&mut status, &pass(&Growth::Done, true));
        assert_eq!(condition(&status, kind::PROGRESSING), ("False", "UpgradeRefused", "downgrade refused"));
        assert_eq!(condition(&status, kind::DEGRADED), ("True", "NoSafeFailover", "no replica reports a position"));

        let failed = Growth::Failed("claim data-orders-0 cannot grow".into());
        conclude(&mut status, &pass(&failed, false));
        assert_eq!(condition(&status, kind::PROGRESSING), ("False", "VolumeGrowFailed", "claim data-orders-0 cannot grow"));

        let all = members(&[true, true, true]);
        conclude(&mut status, &Pass { members: &all, rolled: true, ..pass(&Growth::Done, false) });
        assert_eq!(condition(&status, kind::DEGRADED).1, "AllMembersUp");
        assert_eq!(condition(&status, kind::PROGRESSING).1, "Steady");
        assert_eq!(status.phase, Some(Phase::Running));
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
        };
        conclude(&mut status, &pass);
        let (_, _, message) = condition(&status, kind::READY);
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
        };
        conclude(&mut status, &pass);
        let (state, _, message) = condition(&status, kind::DEGRADED);
        assert_eq!(state, "True");
        assert_eq!(
            message,
            "1/5 members ready; orders-1: node n2 is not ready (Unknown): Kubelet stopped posting node status.; \
             orders-2: container postgres CrashLoopBackOff: back-off 10s; orders-3: not ready; and 1 more"
        );
        assert!(condition(&status, kind::READY).2.starts_with("1/5 members ready; orders-1: node n2"));
    }
}
