//! Backup schedules: cron expressions in UTC, computed by the host.

use std::str::FromStr;

use chrono::{DateTime, Duration, Utc};
use cron::Schedule;

use crate::names::Names;

/// Missed fire times older than this are skipped rather than run late.
const STARTING_DEADLINE: Duration = Duration::hours(24);

/// The fields of a schedule with seconds, their names and ranges.
const FIELDS: [(&str, u32, u32); 7] = [
    ("second", 0, 59),
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of month", 1, 31),
    ("month", 1, 12),
    ("day of week", 0, 7),
    ("year", 1970, 2099),
];

const DAYS: [&str; 8] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN"];

/// Parses a schedule: the classic five fields (minute precision), or six/seven with
/// seconds first (and a year last). Days of week are `0`–`7` (`0` and `7` are Sunday,
/// as in classic cron) or `SUN`–`SAT`. Every error is one line naming the field.
pub fn parse(expression: &str) -> Result<Schedule, String> {
    let mut fields: Vec<String> = expression.split_whitespace().map(str::to_string).collect();
    if fields.len() == 5 {
        fields.insert(0, "0".into());
    } else if !(6..=7).contains(&fields.len()) {
        return Err(format!(
            "{expression:?} has {} fields; use five (minute hour day-of-month month day-of-week, e.g. \"0 2 * * *\" for 02:00 UTC daily) or six with seconds first",
            fields.len()
        ));
    }
    for (field, &(name, min, max)) in fields.iter_mut().zip(FIELDS.iter()) {
        check_field(field, name, min, max).map_err(|problem| format!("{expression:?}: {problem}"))?;
        if name == "day of week" {
            // The cron crate counts days from 1 (Sunday); names mean the same everywhere.
            *field = field
                .split(',')
                .map(|part| {
                    let (range, step) = part.split_once('/').map_or((part, None), |(r, s)| (r, Some(s)));
                    let named: Vec<&str> = range.split('-').map(|v| v.parse::<usize>().map_or(v, |d| DAYS[d])).collect();
                    match step {
                        Some(step) => format!("{}/{step}", named.join("-")),
                        None => named.join("-"),
                    }
                })
                .collect::<Vec<_>>()
                .join(",");
        }
    }
    Schedule::from_str(&fields.join(" ")).map_err(|e| {
        let reason = e.to_string().split_whitespace().collect::<Vec<_>>().join(" ");
        format!("{expression:?} is not a cron schedule ({reason}); e.g. \"0 2 * * *\" for 02:00 UTC daily")
    })
}

/// Checks the numbers in one field (`*`, `5`, `1-5`, `*/15`, `1,3`) against its range.
fn check_field(field: &str, name: &str, min: u32, max: u32) -> Result<(), String> {
    for part in field.split(',') {
        let (range, step) = part.split_once('/').map_or((part, None), |(r, s)| (r, Some(s)));
        if let Some(step) = step
            && !step.parse::<u32>().is_ok_and(|s| s >= 1)
        {
            return Err(format!("{name} step {step:?} must be a whole number of at least 1"));
        }
        for value in range.split('-') {
            if let Ok(n) = value.parse::<u32>()
                && !(min..=max).contains(&n)
            {
                return Err(format!("{name} {n} is out of range {min}-{max}"));
            }
        }
    }
    Ok(())
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

/// How long `schedule` waits between its next two fire times after `now`.
pub fn interval(schedule: &Schedule, now: DateTime<Utc>) -> Option<std::time::Duration> {
    let first = next(schedule, now)?;
    (next(schedule, first)? - first).to_std().ok()
}

/// The deterministic name of the backup for a fire time: the same after any restart.
/// Minute precision (`orders-2611210200`), seconds when the schedule has them; the
/// Database name is shortened when needed to keep within a Job name's 63 characters
/// (see [`Names::job`]).
pub fn backup_name(database: &str, at: DateTime<Utc>) -> String {
    let stamp = if at.timestamp() % 60 == 0 { at.format("%y%m%d%H%M").to_string() } else { at.format("%y%m%d%H%M%S").to_string() };
    Names(database).job(&stamp)
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
        assert!(err.contains("has 2 fields"), "{err}");
        let err = parse("0 0 every day * *").expect_err("invalid");
        assert!(err.contains("is not a cron schedule") && !err.contains('\n'), "{err}");
    }

    #[test]
    fn out_of_range_values_name_the_field_and_its_range_in_one_line() {
        assert_eq!(parse("61 * * * *").expect_err("minute 61"), "\"61 * * * *\": minute 61 is out of range 0-59");
        assert!(parse("59 * * * *").is_ok());
        assert_eq!(parse("0 24 * * *").expect_err("hour 24"), "\"0 24 * * *\": hour 24 is out of range 0-23");
        assert!(parse("0 0 1-40 * *").expect_err("day 40").contains("day of month 40 is out of range 1-31"));
        assert!(parse("*/0 * * * *").expect_err("step 0").contains("minute step \"0\""));
    }

    #[test]
    fn days_of_week_count_from_sunday_zero_as_in_classic_cron() {
        let weekdays = parse("0 2 * * 1-5").expect("schedule");
        let saturday = at("2026-11-21T00:00:00Z");
        assert_eq!(next(&weekdays, saturday), Some(at("2026-11-23T02:00:00Z")), "Monday, not Sunday");
        let sunday = parse("0 2 * * 0").expect("schedule");
        assert_eq!(next(&sunday, saturday), Some(at("2026-11-22T02:00:00Z")));
        assert_eq!(next(&parse("0 2 * * 7").expect("schedule"), saturday), Some(at("2026-11-22T02:00:00Z")));
        assert_eq!(next(&parse("0 2 * * SAT").expect("schedule"), saturday), Some(at("2026-11-21T02:00:00Z")));
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
        let (a, b) = (format!("{}a", "d".repeat(51)), format!("{}b", "d".repeat(51)));
        let at_two = at("2026-11-21T02:00:00Z");
        assert_ne!(backup_name(&a, at_two), backup_name(&b, at_two), "long names that share a beginning keep apart");
    }
}
