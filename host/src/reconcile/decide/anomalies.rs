//! Trouble named before it is an outage (`spec.anomalies`), from what each member's agent
//! said of its engine with its status: connections near the most the engine lets in, a
//! transaction open too long, transaction IDs aging toward wraparound, log held on the
//! volume, a replica's lag that keeps growing. A crash loop is named by the members'
//! stage, and a volume that would fill within a day is grown by `spec.storageGrowth`.

use super::Note;
use crate::agent::Status;
use crate::crd::Anomalies;
use crate::reconcile::status::{ConditionType, Reason};

/// What `rule` finds in what the members said (`heard`, this pass), as the `Anomaly`
/// condition: True naming each member's trouble, the worst first (its reason the
/// condition's, and a Warning once per reason); False while none is found. `None` when no
/// member said anything this pass: the condition stays as the last pass that heard left it.
pub fn anomalies(rule: &Anomalies, heard: &[(String, Status)]) -> Option<Note> {
    if heard.is_empty() {
        return None;
    }
    let mut found: Vec<(Reason, String)> = heard.iter().flat_map(|(pod, said)| of_member(rule, pod, said)).collect();
    found.sort_by_key(|(reason, _)| ANOMALIES.iter().position(|r| r == reason));
    let Some((reason, _)) = found.first() else {
        let message = format!(
            "no member shows trouble (connections past {} %, a transaction open {} min, transaction IDs {} million old, log held past {} % of the volume, a replica's lag past {} s and growing)",
            rule.connections_percent, rule.transaction_minutes, rule.transaction_id_age_millions, rule.log_held_percent, rule.lag_seconds
        );
        return Some(Note::condition(ConditionType::Anomaly, false, Reason::NoAnomaly, message));
    };
    let message = found.iter().map(|(_, said)| said.as_str()).collect::<Vec<_>>().join("; ");
    Some(Note::warn_once(ConditionType::Anomaly, true, *reason, message, true))
}

/// The anomalies' reasons, the worst first: what stops writes soonest.
pub const ANOMALIES: [Reason; 5] =
    [Reason::TransactionIdsAging, Reason::LogHoldsVolume, Reason::ConnectionsNearLimit, Reason::LongTransaction, Reason::LagGrowing];

/// What member `pod` said that `rule` names, each in words that change only as the
/// trouble does (whole minutes, percents, millions).
fn of_member(rule: &Anomalies, pod: &str, said: &Status) -> Vec<(Reason, String)> {
    let s = said.signals;
    let mut found = Vec::new();
    if let Some(age) = s.xid_age.filter(|a| *a >= rule.transaction_id_age_millions.max(1) as u64 * 1_000_000) {
        let why = format!(
            "{pod}: its oldest transaction ID not yet frozen is {} million transactions old (vacuum is held back; at about 2000 million the engine stops taking writes)",
            age / 1_000_000
        );
        found.push((Reason::TransactionIdsAging, why));
    }
    if let (Some(held), Some(volume)) = (s.held, said.volume.as_ref()) {
        let percent = (held as u128 * 100 / volume.size.max(1) as u128) as u64;
        if percent >= rule.log_held_percent.max(1) as u64 {
            let why = format!(
                "{pod}: log kept for a replica or the archive takes {percent} % of its volume (a replication slot not read, or binary logs not yet purged)"
            );
            found.push((Reason::LogHoldsVolume, why));
        }
    }
    if let Some((n, max)) = s.connections {
        let percent = (n as u128 * 100 / max.max(1) as u128) as u64;
        if percent >= rule.connections_percent.max(1) as u64 {
            found.push((Reason::ConnectionsNearLimit, format!("{pod}: {n} of the {max} connections it lets in are in use ({percent} %)")));
        }
    }
    if let Some(open) = s.transaction.filter(|t| *t >= rule.transaction_minutes.max(1) as u64 * 60) {
        let why = format!("{pod}: a transaction has been open {} min (it holds back cleanup, and may hold locks)", open / 60);
        found.push((Reason::LongTransaction, why));
    }
    let lagging = said.lag.filter(|l| l.as_secs() >= rule.lag_seconds.max(1) as u64);
    if let (Some(lag), Some(_)) = (lagging, s.lag_growth.filter(|g| *g > 0)) {
        let why =
            format!("{pod}: its lag has kept growing over the last quarter of an hour or more and is {} min", lag.as_secs().div_ceil(60));
        found.push((Reason::LagGrowing, why));
    }
    found
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::agent::metrics::Volume;
    use crate::agent::signals::Signals;

    fn said(lag: Option<u64>, signals: Signals) -> Status {
        Status {
            primary: lag.is_none(),
            position: "0/1".into(),
            lag: lag.map(Duration::from_secs),
            volume: Some(Volume { size: 10 << 30, used: 1 << 30, per_hour: None }),
            archive: None,
            exporter: None,
            signals,
        }
    }

    /// Each rule names its member in words that change only with the trouble, the worst
    /// first as the reason; nothing past a rule is `NoAnomaly`; no member heard keeps
    /// the condition as it was.
    #[test]
    fn each_anomaly_is_named_for_its_member_the_worst_first() {
        let rule = Anomalies::default();
        let calm = Signals {
            connections: Some((10, 100)),
            transaction: Some(59 * 60),
            xid_age: Some(200_000_000),
            held: Some(1 << 30),
            ..Default::default()
        };
        let heard =
            [("db-0".to_string(), said(None, calm)), ("db-1".to_string(), said(Some(30), Signals { lag_growth: Some(500), ..calm }))];
        let note = anomalies(&rule, &heard).expect("heard");
        assert_eq!(
            (note.condition, note.reason, note.event),
            (Some((ConditionType::Anomaly, false)), Reason::NoAnomaly, crate::reconcile::decide::Event::None)
        );
        assert!(note.message.starts_with("no member shows trouble"), "{}", note.message);

        let busy = Signals { connections: Some((95, 100)), transaction: Some(3 * 3600 + 59), ..calm };
        let aging = Signals { xid_age: Some(1_500_000_000), held: Some(4 << 30), ..calm };
        let lagging = Signals { lag_growth: Some(500), ..calm };
        let heard = [
            ("db-0".to_string(), said(None, busy)),
            ("db-1".to_string(), said(Some(120), lagging)),
            ("db-2".to_string(), said(Some(5), aging)),
        ];
        let note = anomalies(&rule, &heard).expect("heard");
        assert_eq!((note.condition, note.reason), (Some((ConditionType::Anomaly, true)), Reason::TransactionIdsAging));
        assert_eq!(
            note.message,
            "db-2: its oldest transaction ID not yet frozen is 1500 million transactions old (vacuum is held back; at about 2000 million the engine stops taking writes); \
             db-2: log kept for a replica or the archive takes 40 % of its volume (a replication slot not read, or binary logs not yet purged); \
             db-0: 95 of the 100 connections it lets in are in use (95 %); \
             db-0: a transaction has been open 180 min (it holds back cleanup, and may hold locks); \
             db-1: its lag has kept growing over the last quarter of an hour or more and is 2 min"
        );
        assert_eq!(note.event, crate::reconcile::decide::Event::WarningOnce { any_message: true }, "a Warning once per reason");

        // A lag past the rule that does not grow, or one that grows below it, is no trend.
        let steady = [("db-1".to_string(), said(Some(600), Signals { lag_growth: Some(0), ..calm }))];
        assert_eq!(anomalies(&rule, &steady).map(|n| n.reason), Some(Reason::NoAnomaly));
        let small = [("db-1".to_string(), said(Some(30), lagging))];
        assert_eq!(anomalies(&rule, &small).map(|n| n.reason), Some(Reason::NoAnomaly));
        // The rule's own thresholds.
        let strict = Anomalies { transaction_minutes: 1, connections_percent: 10, ..Anomalies::default() };
        let one = [("db-0".to_string(), said(None, Signals { transaction: Some(61), ..calm }))];
        assert_eq!(anomalies(&strict, &one).map(|n| n.reason), Some(Reason::ConnectionsNearLimit));
        assert_eq!(anomalies(&rule, &[]), None, "nothing heard: the condition stays");
    }
}
