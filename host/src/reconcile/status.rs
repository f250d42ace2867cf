//! Conditions and phase: deterministic, so an unchanged cluster writes nothing. A pass's
//! status is a pure function of the old status and the pass: what its stages decided it
//! says ([`Told`], applied by [`after`]), then what follows from the members and from
//! carrying the plan out ([`conclude`], [`members`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::members::Observed;
use crate::crd::{BackupRecord, DatabaseStatus, MemberStatus, Phase, Recoverable, ScaleStatus, StorageGrowthStatus, UpgradeStatus};

/// The longest condition message kept; the rest is cut, so a status write never
/// fails for its size.
pub const MAX_MESSAGE: usize = 4096;

/// An enum of words the API shows, each variant's word its own name (what `as_str`
/// gives), and every variant in `ALL`.
macro_rules! words {
    ($(#[$meta:meta])* $kind:ident { $($(#[$doc:meta])* $name:ident,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $kind {
            $($(#[$doc])* $name,)*
        }

        impl $kind {
            /// Every variant.
            pub const ALL: &[$kind] = &[$($kind::$name,)*];

            /// The word as the API shows it: the variant's name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($kind::$name => stringify!($name),)*
                }
            }

            /// The variant whose word `word` is.
            pub fn parse(word: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.as_str() == word)
            }
        }
    };
}

words! {
    /// The type of a condition a Database reports.
    ConditionType {
        /// All members ready and serving the desired spec.
        Ready,
        /// Members are being created, rolled or upgraded.
        Progressing,
        /// Fewer members ready than desired, or no safe failover.
        Degraded,
        /// The engine plugin is loaded and accepted the spec.
        PluginReady,
        /// Backups are configured correctly and the latest one succeeded.
        BackupHealthy,
        /// `restoreFrom` was carried out (only on Databases that ask for it).
        Restored,
        /// Each commit waits for as many replicas as `spec.replication` asks (only on
        /// Databases that ask for synchronous replication).
        SynchronousReplication,
        /// False while members that should run their agent run none (the operator does not
        /// know its image): no failover, fence or switchover happens. Only then.
        MemberAgents,
        /// The members' volumes grow on their own before they fill; False once one passed
        /// the threshold at the limit (only on Databases with `spec.storageGrowth`).
        StorageGrowth,
        /// Every member's exporter reaches its engine (only on Databases whose members run
        /// an exporter): False names the members whose exporter cannot, or does not answer.
        EngineMetrics,
        /// A member shows trouble before it is an outage (`spec.anomalies`): True names
        /// each, the worst as the reason.
        Anomaly,
    }
}

words! {
    /// The `reason` of a condition or an Event: one word a program can match on.
    Reason {
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
        /// A member said it takes writes while another is the primary; it was fenced.
        SecondPrimary,
        /// The primary before a failover is back and still leads as it did; it was fenced.
        FormerPrimaryBack,
        /// The operator does not know its image: members run no agent.
        NoOperatorImage,
        /// A switchover's member has everything the fenced primary wrote and is promoted.
        SwitchoverPromoted,
        /// The primary's node is cordoned: a switchover moves the primary off it.
        SwitchoverForDrain,
        /// The member a switchover asked for leads; the request is removed.
        SwitchoverDone,
        /// A switchover cannot happen (the message says why); the request is removed.
        SwitchoverRefused,
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
        /// A member's engine fails each time it starts (`Degraded`, and an Event with its
        /// last words, once).
        CrashLoop,
        /// Something is in motion.
        Converging,
        /// Nothing is in motion.
        Steady,
        /// The API server refused to grow a member's claim.
        VolumeGrowFailed,
        /// The members' volumes grow on their own as `spec.storageGrowth` says.
        VolumesCanGrow,
        /// A member's volume passed the threshold: every member's volume was grown.
        VolumesGrown,
        /// A member's volume passed the threshold with the volumes at their limit.
        StorageLimitReached,
        /// `spec.storageGrowth` asks for growth the members cannot measure (no agent).
        VolumesNotMeasured,
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
        /// Each commit waits for as many replicas as the spec asks.
        SynchronousReplication,
        /// Too few replicas are ready for synchronous replication: commits wait.
        ReplicasMissing,
        /// Too few replicas were ready for longer than the spec allows: commits no longer wait.
        ReplicationDegraded,
        /// Every member's exporter reaches its engine.
        ExportersUp,
        /// A member's exporter cannot reach its engine, or does not answer.
        ExporterDown,
        /// No member shows an anomaly.
        NoAnomaly,
        /// A database's oldest transaction ID not yet frozen is old (wraparound nears).
        TransactionIdsAging,
        /// Log kept for a replica or the archive takes much of a member's volume.
        LogHoldsVolume,
        /// A member's connections near the most its engine lets in.
        ConnectionsNearLimit,
        /// A transaction has been open long.
        LongTransaction,
        /// A replica's lag keeps growing.
        LagGrowing,
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `message` as a condition says it: escaped and bounded ([`crate::said::bounded`]).
pub fn fit(message: &str) -> String {
    crate::said::bounded(message, MAX_MESSAGE)
}

/// Whether `status` already says something, so that saying it again is no news (an Event
/// says each thing once): a condition of `type_` (any, when `None`) with `reason` (any,
/// when `None`) and `message` (any, when `None`; compared as a condition holds it,
/// [`fit`]).
pub fn says(status: Option<&DatabaseStatus>, type_: Option<ConditionType>, reason: Option<Reason>, message: Option<&str>) -> bool {
    let message = message.map(fit);
    status.iter().flat_map(|s| &s.conditions).any(|c| {
        type_.is_none_or(|t| c.type_ == t.as_str())
            && reason.is_none_or(|r| c.reason == r.as_str())
            && message.as_ref().is_none_or(|m| &c.message == m)
    })
}

/// Sets condition `type_` (its message [`fit`]); `lastTransitionTime` moves only when
/// the status changes.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: ConditionType,
    ok: bool,
    reason: Reason,
    message: impl Into<String>,
    generation: Option<i64>,
) {
    let status = if ok { "True" } else { "False" };
    let message = fit(&message.into());
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_.as_str()) {
        if c.status != status {
            c.last_transition_time = Time(k8s_openapi::jiff::Timestamp::now());
        }
        c.status = status.into();
        c.reason = reason.as_str().into();
        c.message = message;
        c.observed_generation = generation;
    } else {
        conditions.push(Condition {
            type_: type_.as_str().into(),
            status: status.into(),
            reason: reason.as_str().into(),
            message,
            observed_generation: generation,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        });
    }
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}

/// What the stages of a pass decided the status says, in the order they decided it;
/// each field is `None` while no stage decided it.
#[derive(Debug, Default)]
pub struct Told {
    conditions: Vec<Change>,
    /// The plugin that serves the Database.
    pub plugin: Option<String>,
    /// The upgrade under way, or none.
    pub upgrade: Option<Option<UpgradeStatus>>,
    /// The scale plan under way, or none.
    pub scale: Option<Option<ScaleStatus>>,
    /// The volumes grown on their own, when they grew in this pass.
    pub storage_growth: Option<StorageGrowthStatus>,
    /// The member the read-write Service leads to.
    pub primary: Option<String>,
    /// The version the members run.
    pub current_version: Option<String>,
    /// What the backups stage found.
    pub backups: Option<Backups>,
    /// The phase, when a stage ended the pass with one.
    pub phase: Option<Phase>,
}

/// A condition set or gone.
#[derive(Debug)]
enum Change {
    Set { type_: ConditionType, ok: bool, reason: Reason, message: String },
    Gone(ConditionType),
}

/// The status's backup fields, as the backups stage found them.
#[derive(Debug, Default)]
pub struct Backups {
    /// `lastBackup`.
    pub last: Option<BackupRecord>,
    /// `nextBackup`.
    pub next: Option<String>,
    /// `recoverable`.
    pub recoverable: Option<Recoverable>,
    /// `backupRequest`.
    pub request: Option<String>,
    /// `lastScheduledBackup`.
    pub scheduled: Option<String>,
}

impl Told {
    /// Sets condition `type_` (see [`set`]).
    pub fn set(&mut self, type_: ConditionType, ok: bool, reason: Reason, message: impl Into<String>) {
        self.conditions.push(Change::Set { type_, ok, reason, message: message.into() });
    }

    /// Removes condition `type_`.
    pub fn remove(&mut self, type_: ConditionType) {
        self.conditions.push(Change::Gone(type_));
    }

    /// Whether an upgrade is under way, as `old` and what was told say.
    pub fn upgrading(&self, old: &DatabaseStatus) -> bool {
        self.upgrade.as_ref().map_or(old.upgrade.is_some(), Option::is_some)
    }
}

/// `old` with what a pass `told` over it, for the spec's `generation`: the status of a
/// pass that ends here, or the one [`conclude`] completes.
pub fn after(old: &DatabaseStatus, told: Told, generation: Option<i64>) -> DatabaseStatus {
    let mut status = old.clone();
    for change in told.conditions {
        match change {
            Change::Set { type_, ok, reason, message } => set(&mut status.conditions, type_, ok, reason, message, generation),
            Change::Gone(type_) => status.conditions.retain(|c| c.type_ != type_.as_str()),
        }
    }
    if told.plugin.is_some() {
        status.plugin = told.plugin;
    }
    if told.primary.is_some() {
        status.primary = told.primary;
    }
    if let Some(upgrade) = told.upgrade {
        status.upgrade = upgrade;
    }
    if let Some(scale) = told.scale {
        status.scale = scale;
    }
    if told.storage_growth.is_some() {
        status.storage_growth = told.storage_growth;
    }
    if told.current_version.is_some() {
        status.current_version = told.current_version;
    }
    if let Some(backups) = told.backups {
        (status.last_backup, status.next_backup, status.recoverable) = (backups.last, backups.next, backups.recoverable);
        (status.backup_request, status.last_scheduled_backup) = (backups.request, backups.scheduled);
    }
    if told.phase.is_some() {
        status.phase = told.phase;
    }
    status.observed_generation = generation;
    status
}

/// Whether condition `type_` is currently True.
pub fn is_true(conditions: &[Condition], type_: ConditionType) -> bool {
    conditions.iter().any(|c| c.type_ == type_.as_str() && c.status == "True")
}

/// How long `Ready` has been False, as of `now`: how long the members have been coming
/// up (or down). Zero when it is True or not set yet.
pub fn not_ready_for(status: &DatabaseStatus, now: k8s_openapi::jiff::Timestamp) -> std::time::Duration {
    let since = status
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Ready.as_str() && c.status == "False")
        .map(|c| c.last_transition_time.0);
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
    /// A second primary was fenced: `Degraded` says so until every member is back, from
    /// the next pass on (its pod, as this pass found it, is still ready).
    pub incident: bool,
    /// A switchover or failover under way, and what it waits for: what `Progressing` says.
    pub switching: Option<&'a str>,
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
        let why = crate::said::cut(m.unschedulable.as_deref().unwrap_or_default(), 400);
        ready_message.push_str(&format!("; {} cannot be scheduled: {why}", m.name));
    }
    // Every member serves, and a change (or an upgrade) rolls onto them.
    let rolling = ready == desired && !pass.rolled && status.current_version.is_some();
    if rolling {
        ready_message.push_str("; not all run the current spec yet");
    }
    let reason = if all_ready { Reason::AllMembersReady } else { Reason::MembersNotReady };
    set(&mut status.conditions, ConditionType::Ready, all_ready, reason, ready_message, generation);
    match pass.growth {
        Growth::Failed(message) => {
            set(&mut status.conditions, ConditionType::Progressing, false, Reason::VolumeGrowFailed, message.clone(), generation)
        }
        _ if pass.plan_refused => {}
        growth => {
            let message = match growth {
                Growth::Waiting(message) => message.clone(),
                _ => pass.switching.map_or_else(|| progress_message(status, pass.rolled), str::to_string),
            };
            let reason = if progressing { Reason::Converging } else { Reason::Steady };
            set(&mut status.conditions, ConditionType::Progressing, progressing, reason, message, generation);
        }
    }
    // A second primary fenced stays the word until every member is back; no safe
    // failover, or no leader, only until a primary serves again as well (a leader of an
    // engine that elects its own is ready only while it leads): a member down then is
    // named.
    let serves = pass.members.iter().any(|m| m.ready && status.primary.as_deref() == Some(m.name.as_str()));
    let held = |r: &str| {
        r == Reason::SecondPrimary.as_str() || ((r == Reason::NoSafeFailover.as_str() || r == Reason::NoLeader.as_str()) && !serves)
    };
    let no_primary = status.conditions.iter().any(|c| c.type_ == ConditionType::Degraded.as_str() && c.status == "True" && held(&c.reason));
    if !no_primary || (ready == desired && !pass.incident) {
        // A member crash looping is named, also before the Database first ran (a setting
        // its engine cannot start with).
        let looping = pass.members.iter().any(|m| m.crash_loop && !m.terminating);
        let degraded = looping || (ready > 0 && ready < desired && status.current_version.is_some() && pass.members.len() == desired);
        let reason = match (looping, degraded) {
            (true, _) => Reason::CrashLoop,
            (false, true) => Reason::MembersDown,
            (false, false) => Reason::AllMembersUp,
        };
        set(
            &mut status.conditions,
            ConditionType::Degraded,
            degraded,
            reason,
            format!("{ready}/{desired} members ready{down}"),
            generation,
        );
    }
    status.phase = Some(phase(status, pass.restoring, (all_ready, rolling), ready));
    progressing
}

/// `status.members`: each member as observed, its role from `primary`, with what its
/// agent said this pass (`heard`, at the time given: its position and lag), or before
/// (kept from `before`).
pub fn members(
    before: &[MemberStatus],
    observed: &[Observed],
    primary: Option<&str>,
    (heard, now): (&[(String, crate::agent::Status)], k8s_openapi::jiff::Timestamp),
) -> Vec<MemberStatus> {
    let at = k8s_openapi::jiff::Timestamp::from_second(now.as_second()).map_or_else(|_| now.to_string(), |t| t.to_string());
    observed
        .iter()
        .map(|m| {
            let earlier = before.iter().find(|b| b.pod == m.name);
            let said = heard.iter().find(|(pod, _)| *pod == m.name).map(|(_, s)| {
                let (position, lag) = (Some(s.position.clone()), s.lag.map(lag));
                // The time moves when the answer changes: the same answer again writes nothing.
                let same = earlier.filter(|b| b.position == position && b.lag == lag).and_then(|b| b.heard.clone());
                (position, lag, Some(same.unwrap_or_else(|| at.clone())))
            });
            let kept = || earlier.map(|b| (b.position.clone(), b.lag.clone(), b.heard.clone()));
            let (position, lag, said_at) = said.or_else(kept).unwrap_or_default();
            let measured = heard.iter().find(|(pod, _)| *pod == m.name).and_then(|(_, s)| s.volume.as_ref()).map(volume);
            let volume = measured.or_else(|| earlier.and_then(|b| b.volume.clone()));
            let looked = heard.iter().find(|(pod, _)| *pod == m.name).and_then(|(_, s)| s.exporter).map(|e| e.said().to_string());
            let exporter = looked.or_else(|| earlier.and_then(|b| b.exporter.clone()));
            MemberStatus {
                pod: m.name.clone(),
                node: m.node.clone(),
                role: if primary == Some(m.name.as_str()) { "primary" } else { "replica" }.into(),
                ready: m.ready,
                since: m.ready_since.clone(),
                down: m.down.as_deref().map(|d| crate::said::cut(d, 200).to_string()),
                position,
                lag,
                heard: said_at,
                volume,
                exporter,
            }
        })
        .collect()
}

/// `EngineMetrics`, from what the members' agents last said of their exporters: True
/// while every one that said reaches its engine, False naming those that do not;
/// none while no member said (no exporter runs).
pub fn engine_metrics(status: &mut DatabaseStatus, generation: Option<i64>) {
    let said: Vec<(&str, &str)> = status.members.iter().filter_map(|m| Some((m.pod.as_str(), m.exporter.as_deref()?))).collect();
    if said.is_empty() {
        status.conditions.retain(|c| c.type_ != ConditionType::EngineMetrics.as_str());
        return;
    }
    let up = crate::agent::exporter::Exporter::Up.said();
    let down: Vec<String> = said.iter().filter(|(_, e)| *e != up).map(|(pod, e)| format!("{pod}: its exporter {e}")).collect();
    let (ok, reason, message) = match down.is_empty() {
        true => (true, Reason::ExportersUp, "every member's exporter reaches its engine".to_string()),
        false => (false, Reason::ExporterDown, down.join("; ")),
    };
    set(&mut status.conditions, ConditionType::EngineMetrics, ok, reason, message, generation);
}

/// A volume as status says it: how full, in whole percent, of its size (`21% of 10.0Gi`):
/// it changes as the use passes a percent, not with every write.
pub fn volume(v: &crate::agent::metrics::Volume) -> String {
    let percent = v.used as u128 * 100 / v.size.max(1) as u128;
    let size = v.size as f64;
    let (value, unit) = [(1u64 << 40, "Ti"), (1 << 30, "Gi"), (1 << 20, "Mi"), (1 << 10, "Ki")]
        .into_iter()
        .find(|(scale, _)| v.size >= *scale)
        .map_or((size, "B"), |(scale, unit)| (size / scale as f64, unit));
    format!("{percent}% of {value:.1}{unit}")
}

/// A lag as status says it: `0s`, `2.5s`, `61.25s` (to the millisecond).
pub fn lag(lag: std::time::Duration) -> String {
    format!("{}s", lag.as_millis() as f64 / 1000.0)
}

/// Each member that is down and why (its node lost, its container crashing), for the
/// conditions' messages: `; orders-2: node n2 is not ready: ...`. Bounded: a few members,
/// each reason truncated.
fn down_members(members: &[Observed]) -> String {
    let down: Vec<String> = members
        .iter()
        .filter(|m| !m.ready && !m.terminating)
        .filter_map(|m| Some(format!("; {}: {}", m.name, crate::said::cut(m.down.as_deref()?, 200))))
        .collect();
    match down.len() {
        0..=3 => down.concat(),
        n => format!("{}; and {} more", down[..3].concat(), n - 3),
    }
}

/// The phase: a restore that loads over the network keeps a Database `Restoring` while
/// its members already run, since its data is not there yet.
fn phase(status: &DatabaseStatus, restoring: bool, (all_ready, rolling): (bool, bool), ready: usize) -> Phase {
    if restoring {
        Phase::Restoring
    } else if status.upgrade.is_some() || rolling {
        Phase::Updating
    } else if all_ready {
        Phase::Running
    } else if is_true(&status.conditions, ConditionType::Degraded) || (ready > 0 && is_true(&status.conditions, ConditionType::Ready)) {
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
mod tests;
