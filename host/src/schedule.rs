//! Backup schedules: cron expressions in UTC, computed by the host.

use std::str::FromStr;

use chrono::{DateTime, Duration, Utc};
use cron::Schedule;

/// Missed fire times older than this are skipped rather than run late.
const STARTING_DEADLINE: Duration = Duration::hours(24);

/// Parses a schedule: five fields (minute precision) or six/seven (with seconds, years).
pub fn parse(expression: &str) -> Result<Schedule, String> {
    let fields = expression.split_whitespace().count();
    let full = if fields == 5 { format!("0 {expression}") } else { expression.to_string() };
    Schedule::from_str(&full).map_err(|e| format!("{expression:?} is not a cron schedule ({e}); e.g. \"0 2 * * *\" for 02:00 UTC daily"))
}

/// The fire time that should have a backup now: the latest one in
/// `(max(created, now - 24h), now]`, if any.
pub fn due(schedule: &Schedule, created: DateTime<Utc>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let start = created.max(now - STARTING_DEADLINE);
    schedule.after(&start).take_while(|t| *t <= now).last()
}

/// The first fire time after `now`.
pub fn next(schedule: &Schedule, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    schedule.after(&now).next()
}

/// The deterministic name of the backup for a fire time: the same after any restart.
/// Minute precision (`orders-2611210200`), seconds when the schedule has them; the
/// Database name is shortened when needed to keep within a Job name's 63 characters.
pub fn backup_name(database: &str, at: DateTime<Utc>) -> String {
    let stamp = if at.timestamp() % 60 == 0 { at.format("%y%m%d%H%M").to_string() } else { at.format("%y%m%d%H%M%S").to_string() };
    let keep = database.len().min(62 - stamp.len());
    format!("{}-{stamp}", database[..keep].trim_end_matches('-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).expect("time").with_timezone(&Utc)
    }

    #[test]
    fn five_and_six_field_schedules_parse() {
        assert!(parse("0 2 * * *").is_ok());
        assert!(parse("*/30 * * * * *").is_ok());
        let err = parse("every day").expect_err("invalid");
        assert!(err.contains("is not a cron schedule"), "{err}");
    }

    #[test]
    fn the_latest_missed_fire_is_due_once_and_next_follows() {
        let daily = parse("0 2 * * *").expect("schedule");
        let created = at("2026-11-01T00:00:00Z");
        assert_eq!(due(&daily, created, at("2026-11-21T01:59:00Z")), Some(at("2026-11-20T02:00:00Z")));
        assert_eq!(due(&daily, created, at("2026-11-21T02:00:00Z")), Some(at("2026-11-21T02:00:00Z")));
        assert_eq!(next(&daily, at("2026-11-21T02:00:00Z")), Some(at("2026-11-22T02:00:00Z")));
        // Nothing is due before the first fire after creation.
        assert_eq!(due(&daily, at("2026-11-21T03:00:00Z"), at("2026-11-21T04:00:00Z")), None);
    }

    #[test]
    fn names_are_deterministic_and_fit_a_job_name() {
        let name = backup_name(&"d".repeat(52), at("2026-11-21T02:00:00Z"));
        assert_eq!(name.len(), 63);
        assert!(name.ends_with("-2611210200"));
        let name = backup_name(&"d".repeat(52), at("2026-11-21T02:00:30Z"));
        assert_eq!(name.len(), 63);
        assert!(name.ends_with("-261121020030"));
        assert_eq!(backup_name("orders", at("2026-11-21T02:00:30Z")), "orders-261121020030");
    }
}
