//! Conditions and phase: deterministic, so an unchanged cluster writes nothing.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

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

/// Sets condition `type_`; `lastTransitionTime` moves only when the status changes.
pub fn set(conditions: &mut Vec<Condition>, type_: &str, ok: bool, reason: &str, message: impl Into<String>, generation: Option<i64>) {
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
        c.reason = reason.into();
        c.message = message;
        c.observed_generation = generation;
    } else {
        conditions.push(Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_on_a_status_change() {
        let mut c = Vec::new();
        set(&mut c, kind::READY, false, "Creating", "0/3 ready", Some(1));
        let first = c[0].last_transition_time.clone();
        set(&mut c, kind::READY, false, "Creating", "1/3 ready", Some(1));
        assert_eq!(c[0].last_transition_time, first, "same status keeps the time");
        assert_eq!(c[0].message, "1/3 ready");
        std::thread::sleep(std::time::Duration::from_millis(2));
        set(&mut c, kind::READY, true, "AllReady", "3/3 ready", Some(1));
        assert_ne!(c[0].last_transition_time, first);
        assert!(is_true(&c, kind::READY));
    }
}
