//! Growing the members' volumes before they fill (`spec.storageGrowth`), from what each
//! member's agent measured of its data volume with its status.

use k8s_openapi::jiff::Timestamp;

use super::Note;
use crate::agent::Status;
use crate::crd::StorageGrowth;
use crate::reconcile::status::{ConditionType, Reason};

/// What the volumes' use asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Autogrowth {
    /// Nothing new: no member over the threshold, none measured, or the last growth too
    /// recent.
    Wait,
    /// Every member's volume grows to `to` bytes.
    Grow {
        /// The new size.
        to: u64,
        /// What to tell the user.
        note: Note,
    },
    /// A member is over the threshold at the limit: nothing more to grow.
    AtLimit(Note),
}

/// The size a growth's `step` (`25%`, or a size such as `5Gi`) adds to `size` bytes.
pub fn step_bytes(step: &str, size: u64) -> Option<u64> {
    match step.strip_suffix('%') {
        Some(percent) => percent.parse::<u64>().ok().filter(|p| (1..=999).contains(p)).map(|p| size.saturating_mul(p).div_ceil(100)),
        None => crate::quantity::bytes(step).filter(|b| *b > 0),
    }
}

/// `bytes` as a quantity, in the largest binary unit it is a whole number of (`2Gi`,
/// `12800Mi`), as the API server writes it back; else in bytes.
pub fn quantity(bytes: u64) -> String {
    let units = [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)];
    match units.iter().find(|(_, shift)| bytes > 0 && bytes.is_multiple_of(1 << shift)) {
        Some((unit, shift)) => format!("{}{unit}", bytes >> shift),
        None => bytes.to_string(),
    }
}

/// How long before a volume over half full fills at the rate it fills at ([`FILLS_WITHIN`]
/// or sooner) makes it grow now, below the threshold.
pub const FILLS_WITHIN: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// What `rule` asks for, the volumes being `size` bytes now (every claim has it: a growth
/// the storage provider has not finished is waited for before this is asked), the members
/// having said `heard`, the last growth `last`: a volume past the threshold, or one over
/// half full that fills within [`FILLS_WITHIN`] at the rate its agent measured, grows
/// them all. When that member's log has waited [`crate::agent::ARCHIVE_STALLED`] or
/// longer to be archived, that is named as the cause: the log an engine cannot hand over
/// stays on its volume.
pub fn autogrowth(rule: &StorageGrowth, size: u64, heard: &[(String, Status)], last: Option<Timestamp>, now: Timestamp) -> Autogrowth {
    let percent = |v: &crate::agent::metrics::Volume| (v.used as u128 * 100 / v.size.max(1) as u128) as u64;
    let hours_left = |v: &crate::agent::metrics::Volume| {
        let rate = v.per_hour.filter(|r| *r > 0)?;
        Some(v.size.saturating_sub(v.used) as f64 / rate as f64).filter(|h| *h * 3600.0 < FILLS_WITHIN.as_secs_f64())
    };
    let measured: Vec<(&String, u64, Option<f64>)> =
        heard.iter().filter_map(|(pod, s)| s.volume.as_ref().map(|v| (pod, percent(v), hours_left(v)))).collect();
    let threshold = rule.threshold_percent;
    let fullest = measured.iter().filter(|(_, p, _)| *p >= threshold.max(1) as u64).max_by_key(|(_, p, _)| *p);
    let filling = || {
        let soon = measured.iter().filter(|(_, p, _)| *p >= 50).filter_map(|(pod, p, h)| Some((pod, p, (*h)?)));
        soon.min_by(|a, b| a.2.total_cmp(&b.2))
    };
    // Why, and the same in words that stay the same from one look to the next.
    let (pod, why, steady) = match (fullest, filling()) {
        (Some((pod, full, _)), _) => (pod, format!("was {full} % full"), format!("passed {threshold} % full")),
        (None, Some((pod, full, hours))) => {
            let why = format!("was {full} % full and would be full within {} h at the rate it fills", hours.ceil());
            (pod, why, "would be full within a day".to_string())
        }
        (None, None) => return Autogrowth::Wait,
    };
    let stalled = heard.iter().find(|(p, _)| p == *pod).and_then(|(_, s)| s.archive).filter(|a| a.oldest >= crate::agent::ARCHIVE_STALLED);
    let (cause, steady_cause) = match stalled {
        Some(a) => (
            format!(
                "; the cause: archiving is failing ({} log segments have waited up to {} min to be shipped, and the log the engine cannot hand over stays on its volume; see BackupHealthy)",
                a.segments,
                a.oldest.as_secs() / 60
            ),
            "; the cause: archiving is failing (see BackupHealthy)".to_string(),
        ),
        None => (String::new(), String::new()),
    };
    let limit = crate::quantity::bytes(&rule.limit.0).unwrap_or(size);
    let wanted = size.saturating_add(step_bytes(&rule.step, size).unwrap_or(0)).min(limit);
    // Whole MiB where that still grows the volume.
    let to = Some(wanted >> 20 << 20).filter(|to| *to > size).unwrap_or(wanted);
    if to <= size {
        let message = format!(
            "{pod}'s volume {steady} with every volume at the limit {}: nothing more grows; raise storageGrowth.limit or free space{steady_cause}",
            rule.limit.0
        );
        return Autogrowth::AtLimit(Note::warn_once(ConditionType::StorageGrowth, false, Reason::StorageLimitReached, message, true));
    }
    let interval = std::time::Duration::from_secs(60 * rule.interval_minutes.max(1) as u64);
    if last.is_some_and(|t| t <= now && now.duration_since(t).unsigned_abs() < interval) {
        return Autogrowth::Wait;
    }
    let message = format!("{pod}'s volume {why}: every member's volume grows from {} to {}{cause}", quantity(size), quantity(to));
    let note =
        Note { condition: Some((ConditionType::StorageGrowth, true)), reason: Reason::VolumesGrown, message, event: super::Event::Normal };
    Autogrowth::Grow { to, note }
}

/// The condition while nothing grows: what the rule is (a message that stays the same
/// from one pass to the next).
pub fn growth_rule(rule: &StorageGrowth) -> Note {
    let message = format!(
        "volumes grow once one is {} % full, by {}, at most every {} min, up to {}",
        rule.threshold_percent, rule.step, rule.interval_minutes, rule.limit.0
    );
    Note::condition(ConditionType::StorageGrowth, true, Reason::VolumesCanGrow, message)
}

/// The condition when no member measures its volume (its engine's members run no agent).
pub fn not_measured(engine: &str) -> Note {
    let message = format!("the {engine} members run no agent to measure their volumes: they grow only with spec.storage");
    Note::warn_once(ConditionType::StorageGrowth, false, Reason::VolumesNotMeasured, message, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::metrics::Volume;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    const GI: u64 = 1 << 30;

    fn rule(step: &str, limit: &str) -> StorageGrowth {
        StorageGrowth { threshold_percent: 80, step: step.into(), limit: Quantity(limit.into()), interval_minutes: 60 }
    }

    fn heard(used_percent: &[(&str, u64)]) -> Vec<(String, Status)> {
        filling(&used_percent.iter().map(|(pod, p)| (*pod, *p, None)).collect::<Vec<_>>())
    }

    /// A member, how full its volume is in percent, and how many GiB an hour it fills by.
    type Fills<'a> = (&'a str, u64, Option<u64>);

    /// Members' volumes of 100 GiB, each this full in percent and filling by so many GiB an hour.
    fn filling(used: &[Fills]) -> Vec<(String, Status)> {
        let said = |percent: u64, per_hour: Option<u64>| Status {
            primary: false,
            position: "0/1".into(),
            lag: None,
            volume: Some(Volume { size: 100 * GI, used: percent * GI, per_hour: per_hour.map(|g| g * GI) }),
            archive: None,
            exporter: None,
            signals: Default::default(),
        };
        used.iter().map(|(pod, p, rate)| (pod.to_string(), said(*p, *rate))).collect()
    }

    /// (what, rule, size now, members' use in percent, the size grown to)
    type Row<'a> = (&'a str, &'a StorageGrowth, u64, &'a [(&'a str, u64)], Option<u64>);

    fn grown_to(decision: &Autogrowth) -> Option<u64> {
        match decision {
            Autogrowth::Grow { to, .. } => Some(*to),
            _ => None,
        }
    }

    #[test]
    fn the_volumes_grow_by_the_step_once_the_fullest_passes_the_threshold_never_past_the_limit() {
        let now: Timestamp = "2026-12-03T08:00:00Z".parse().expect("a time");
        let (quarter, five) = (rule("25%", "100Gi"), rule("5Gi", "12Gi"));
        let rows: [Row; 7] = [
            ("nothing measured", &quarter, 10 * GI, &[], None),
            ("every volume under the threshold", &quarter, 10 * GI, &[("db-0", 79), ("db-1", 12)], None),
            ("the fullest at the threshold: a quarter more", &quarter, 10 * GI, &[("db-0", 40), ("db-1", 80)], Some(12_800 << 20)),
            ("a full volume still grows", &quarter, 10 * GI, &[("db-2", 100)], Some(12_800 << 20)),
            ("a size as the step, up to the limit", &five, 10 * GI, &[("db-0", 91)], Some(12 * GI)),
            ("a step in whole MiB", &rule("10%", "100Gi"), 1_000_000_000, &[("db-0", 95)], Some(1049 << 20)),
            ("at the limit", &five, 12 * GI, &[("db-0", 95)], None),
        ];
        for (what, rule, size, used, expected) in rows {
            let decision = autogrowth(rule, size, &heard(used), None, now);
            assert_eq!(grown_to(&decision), expected, "{what}: {decision:?}");
        }
        let Autogrowth::Grow { note, .. } = autogrowth(&quarter, 10 * GI, &heard(&[("db-0", 40), ("db-1", 83)]), None, now) else {
            panic!("grows")
        };
        assert_eq!(note.message, "db-1's volume was 83 % full: every member's volume grows from 10Gi to 12800Mi");
        assert_eq!(
            (note.condition, note.reason, note.event),
            (Some((ConditionType::StorageGrowth, true)), Reason::VolumesGrown, super::super::Event::Normal)
        );
        let Autogrowth::AtLimit(note) = autogrowth(&five, 12 * GI, &heard(&[("db-0", 95)]), None, now) else { panic!("at the limit") };
        assert_eq!((note.condition, note.reason), (Some((ConditionType::StorageGrowth, false)), Reason::StorageLimitReached));
        assert!(note.message.starts_with("db-0's volume passed 80 % full with every volume at the limit 12Gi"), "{}", note.message);
    }

    /// Below the threshold, a volume over half full that fills within a day at the rate
    /// its agent measured grows them all now.
    #[test]
    fn a_volume_that_would_fill_within_a_day_grows_before_the_threshold() {
        let now: Timestamp = "2026-12-03T08:00:00Z".parse().expect("a time");
        let quarter = rule("25%", "100Gi");
        // (what, members: use in percent and GiB an hour, grows)
        let rows: [(&str, &[Fills], bool); 5] = [
            ("60 % full, 40 GiB left at 2 GiB/h: full in 20 h", &[("db-0", 60, Some(2))], true),
            ("60 % full at 1 GiB/h: 40 h", &[("db-0", 60, Some(1))], false),
            ("40 % full at 10 GiB/h: under half full", &[("db-0", 40, Some(10))], false),
            ("not filling", &[("db-0", 70, Some(0))], false),
            ("no rate known yet", &[("db-0", 70, None)], false),
        ];
        for (what, members, grows) in rows {
            let decision = autogrowth(&quarter, 10 * GI, &filling(members), None, now);
            assert_eq!(grown_to(&decision).is_some(), grows, "{what}: {decision:?}");
        }
        let Autogrowth::Grow { note, .. } = autogrowth(&quarter, 10 * GI, &filling(&[("db-1", 60, Some(2))]), None, now) else {
            panic!("grows")
        };
        assert_eq!(
            note.message,
            "db-1's volume was 60 % full and would be full within 20 h at the rate it fills: every member's volume grows from 10Gi to 12800Mi"
        );
        let Autogrowth::AtLimit(note) = autogrowth(&rule("5Gi", "10Gi"), 10 * GI, &filling(&[("db-1", 60, Some(2))]), None, now) else {
            panic!("at the limit")
        };
        assert!(
            note.message.starts_with("db-1's volume would be full within a day with every volume at the limit 10Gi"),
            "{}",
            note.message
        );
    }

    /// A volume filling while its member's log has long waited to be archived names the
    /// failing archive as the cause; a backlog younger than that, or another member's, does not.
    #[test]
    fn a_failing_archive_is_named_as_the_cause() {
        let now: Timestamp = "2026-12-03T08:00:00Z".parse().expect("a time");
        let backlog = |minutes: u64| Some(crate::agent::Backlog { segments: 40, oldest: std::time::Duration::from_secs(60 * minutes) });
        let with = |pod: &str, minutes: u64| {
            let mut members = heard(&[("db-0", 85), ("db-1", 30)]);
            members.iter_mut().filter(|(p, _)| p == pod).for_each(|(_, s)| s.archive = backlog(minutes));
            members
        };
        let message = |members: &[(String, Status)], rule: &StorageGrowth| match autogrowth(rule, 10 * GI, members, None, now) {
            Autogrowth::Grow { note, .. } | Autogrowth::AtLimit(note) => note.message,
            Autogrowth::Wait => panic!("a volume past the threshold"),
        };
        let quarter = rule("25%", "100Gi");
        assert!(
            message(&with("db-0", 12), &quarter).ends_with(
                "grows from 10Gi to 12800Mi; the cause: archiving is failing (40 log segments have waited up to 12 min to be shipped, \
                 and the log the engine cannot hand over stays on its volume; see BackupHealthy)"
            ),
            "{}",
            message(&with("db-0", 12), &quarter)
        );
        assert!(!message(&with("db-0", 4), &quarter).contains("cause"), "4 minutes is a backlog, not a failure");
        assert!(!message(&with("db-1", 12), &quarter).contains("cause"), "another member's archive is not this volume's cause");
        let at_limit = message(&with("db-0", 12), &rule("5Gi", "10Gi"));
        assert!(at_limit.ends_with("; the cause: archiving is failing (see BackupHealthy)"), "the same words each pass: {at_limit}");
    }

    #[test]
    fn a_growth_waits_out_the_interval_after_the_last() {
        let now: Timestamp = "2026-12-03T08:00:00Z".parse().expect("a time");
        let full = heard(&[("db-0", 90)]);
        let ago = |minutes: i64| Some(now.checked_sub(k8s_openapi::jiff::SignedDuration::from_mins(minutes)).expect("a time"));
        let quarter = rule("25%", "100Gi");
        assert_eq!(autogrowth(&quarter, 10 * GI, &full, ago(59), now), Autogrowth::Wait, "59 min after the last");
        assert!(grown_to(&autogrowth(&quarter, 10 * GI, &full, ago(60), now)).is_some(), "60 min after");
        let limited = autogrowth(&rule("5Gi", "10Gi"), 10 * GI, &full, ago(1), now);
        assert!(matches!(limited, Autogrowth::AtLimit(_)), "the limit is said whenever it is so: {limited:?}");
    }

    #[test]
    fn steps_are_shares_or_sizes() {
        assert_eq!(step_bytes("25%", 100), Some(25));
        assert_eq!(step_bytes("1%", 1), Some(1), "rounded up: a step always grows");
        assert_eq!(step_bytes("5Gi", 1), Some(5 * GI));
        assert_eq!([step_bytes("0%", 100), step_bytes("x%", 100), step_bytes("0", 100)], [None, None, None]);
        let quantities = [12_800 << 20, 2 << 30, 1_000_000_000, 1536].map(quantity);
        assert_eq!(quantities, ["12800Mi", "2Gi", "1000000000", "1536"].map(String::from));
    }
}
