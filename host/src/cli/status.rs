//! `plugdb status DB` (`kubectl plugdb status DB`): one screen about a Database — its
//! engine, version and phase, each member with its node, role, readiness and the
//! position its agent last said, the last and next backup and the recoverable window,
//! the conditions that are not fine, and its latest Events.

use std::fmt::Write;

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::crd::Database;
use crate::reconcile::status::{ConditionType, Reason};

/// Events shown, the newest.
const EVENTS: usize = 5;
/// The longest message of a condition or an Event shown on its line.
const MESSAGE: usize = 160;

/// Where the Database is: the cluster (kubeconfig context) and namespace, as kubectl takes them.
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// The kubeconfig context; the current one when `None`.
    pub context: Option<String>,
    /// The namespace; the context's when `None`.
    pub namespace: Option<String>,
}

impl Target {
    /// A client for the target's cluster and the namespace to look in.
    pub async fn connect(&self) -> Result<(Client, String)> {
        let options = kube::config::KubeConfigOptions { context: self.context.clone(), ..Default::default() };
        let config = match kube::Config::from_kubeconfig(&options).await {
            Ok(config) => config,
            Err(_) if self.context.is_none() => {
                kube::Config::infer().await.context("finding the cluster ($KUBECONFIG, ~/.kube/config or in-cluster)")?
            }
            Err(e) => return Err(e).context("reading the kubeconfig"),
        };
        let namespace = self.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
        Ok((Client::try_from(config).context("connecting to the cluster")?, namespace))
    }
}

/// What a command about one Database works with: the cluster, the namespace, the
/// Databases there, the one named as read now, and how messages name it.
pub struct Found {
    /// The client.
    pub client: Client,
    /// The Database's namespace.
    pub namespace: String,
    /// Databases in that namespace.
    pub api: Api<Database>,
    /// The Database.
    pub db: Database,
    /// `Database <namespace>/<name>`.
    pub about: String,
}

impl Target {
    /// Database `name` in the target's namespace, or an error naming it.
    pub async fn database(&self, name: &str) -> Result<Found> {
        let (client, namespace) = self.connect().await?;
        let api = Api::<Database>::namespaced(client.clone(), &namespace);
        let about = format!("Database {namespace}/{name}");
        let db = api.get_opt(name).await.with_context(|| format!("reading {about}"))?.with_context(|| format!("{about} not found"))?;
        Ok(Found { client, namespace, api, db, about })
    }
}

/// The status screen of Database `name` in the target's namespace.
pub async fn status(target: &Target, name: &str) -> Result<String> {
    let Found { client, namespace, db, .. } = target.database(name).await?;
    let about = format!("regarding.kind=Database,regarding.name={name}");
    let events = Api::<Event>::namespaced(client.clone(), &namespace).list(&ListParams::default().fields(&about)).await.map(|l| l.items);
    // Events and the operator's lease are a help, not the point: a user who may not list
    // them still gets the rest.
    let leases = Api::<Lease>::all(client).list(&ListParams::default().fields(&format!("metadata.name={}", crate::leader::LEASE))).await;
    Ok(screen(&db, &events.unwrap_or_default(), leases.ok().map(|l| l.items).as_deref(), Timestamp::now()))
}

/// What the operator's leases (`leases`, when they could be read) say of it at `now`:
/// who holds one and when it renewed it, or that none renewed its lease in time (no
/// operator looks, and the status is only as new as its last look).
fn operator_line(leases: &[Lease], now: Timestamp) -> String {
    let renewed = |l: &Lease| {
        let spec = l.spec.as_ref()?;
        let at = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
        let lease = format!("{}/{}", l.namespace().unwrap_or_default(), l.name_any());
        Some((at, spec.holder_identity.clone()?, i64::from(spec.lease_duration_seconds.unwrap_or(15)), lease))
    };
    let Some((at, holder, lasts, lease)) = leases.iter().filter_map(renewed).max_by_key(|(at, ..)| *at) else {
        return format!(
            "operator: none holds lease {}: no operator looks (or it runs without leader election), this status may be stale",
            crate::leader::LEASE
        );
    };
    let since = now.duration_since(at).as_secs();
    if since > lasts {
        format!("operator: {holder} has not renewed lease {lease} for {since}s: no operator looks, this status may be stale")
    } else {
        format!("operator: {holder} (lease {lease} renewed {since}s ago)")
    }
}

/// The screen for `db`, its `events` and the operator's `leases` (`None`: not readable), at `now`.
pub fn screen(db: &Database, events: &[Event], leases: Option<&[Lease]>, now: Timestamp) -> String {
    let status = db.status.clone().unwrap_or_default();
    let mut out = String::new();
    let version = status.current_version.as_deref().unwrap_or(&db.spec.version);
    let phase = status.phase.as_ref().map(|p| format!("{p:?}")).unwrap_or_else(|| "(not seen by the operator yet)".into());
    let _ = writeln!(out, "Database {}/{}: {} {version}, {phase}", db.namespace().unwrap_or_default(), db.name_any(), db.spec.engine);
    let ready = status.ready_replicas.unwrap_or(0);
    let _ = writeln!(
        out,
        "members:  {ready}/{} ready, primary {}{}",
        db.spec.replicas,
        status.primary.as_deref().unwrap_or("(none)"),
        status.plugin.as_deref().map(|p| format!(", rendered by {p}")).unwrap_or_default()
    );
    if let Some(leases) = leases {
        let _ = writeln!(out, "{}", operator_line(leases, now));
    }
    if !status.members.is_empty() {
        let rows: Vec<[String; 9]> = status
            .members
            .iter()
            .map(|m| {
                [
                    m.pod.clone(),
                    m.node.clone().unwrap_or_else(|| "-".into()),
                    m.role.clone(),
                    if m.ready { "yes".into() } else { format!("no: {}", cut(m.down.as_deref().unwrap_or("not ready"), 60)) },
                    m.position.clone().unwrap_or_else(|| "-".into()),
                    m.lag.clone().unwrap_or_else(|| "-".into()),
                    m.heard.as_deref().map(|t| ago(t, now)).unwrap_or_else(|| "-".into()),
                    m.volume.clone().unwrap_or_else(|| "-".into()),
                    m.exporter.clone().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        table(&mut out, ["MEMBER", "NODE", "ROLE", "READY", "POSITION", "LAG", "SAID", "VOLUME", "EXPORTER"], &rows);
    }
    let rule = db
        .spec
        .storage_growth
        .as_ref()
        .map(|g| format!("; grows on its own once {} % full, by {}, up to {}", g.threshold_percent, g.step, g.limit.0));
    let grown = status.storage_growth.as_ref().map(|g| {
        let times = if g.count == 1 { "once".to_string() } else { format!("{} times", g.count) };
        format!("; grown to {} ({times}, last {})", g.size, ago(&g.last, now))
    });
    let _ = writeln!(out, "storage:  {} each{}{}", db.spec.storage.0, rule.unwrap_or_default(), grown.unwrap_or_default());
    let last = status.last_backup.as_ref().map(|b| {
        let when = b.completed.as_deref().map(|t| format!(", completed {}", ago(t, now))).unwrap_or_default();
        format!("{}{when}", b.name)
    });
    let _ = writeln!(
        out,
        "backups:  last {}; next {}",
        last.as_deref().unwrap_or("none"),
        status.next_backup.as_deref().unwrap_or("not scheduled")
    );
    if let Some(r) = &status.recoverable {
        let window = match (&r.first, &r.last) {
            (Some(first), Some(last)) if r.point_in_time => format!("any moment from {first} to {last}"),
            (Some(first), Some(last)) => format!("{} backups, from {first} to {last}", r.backups),
            _ => format!("{} backups", r.backups),
        };
        let confirmed = match (&r.unreachable_since, &r.confirmed) {
            (Some(since), Some(confirmed)) => format!(" (bucket unreachable since {since}; confirmed {})", ago(confirmed, now)),
            (None, Some(confirmed)) => format!(" (confirmed {})", ago(confirmed, now)),
            _ => String::new(),
        };
        let _ = writeln!(out, "recoverable: {window}{confirmed}");
    }
    let troubled: Vec<&Condition> = status.conditions.iter().filter(|c| !fine(c)).collect();
    if troubled.is_empty() {
        let _ = writeln!(out, "conditions: all fine");
    } else {
        let _ = writeln!(out, "conditions not fine:");
        for c in troubled {
            let _ = writeln!(out, "  {}={} {}: {}", c.type_, c.status, c.reason, cut(&c.message, MESSAGE));
        }
    }
    let mut events: Vec<&Event> = events.iter().collect();
    events.sort_by_key(|e| std::cmp::Reverse(when(e)));
    if !events.is_empty() {
        let _ = writeln!(out, "events (newest first):");
        for e in events.into_iter().take(EVENTS) {
            let at = when(e).map(|t| ago(&t.to_string(), now)).unwrap_or_else(|| "-".into());
            let kind = e.type_.as_deref().unwrap_or("Normal");
            let reason = e.reason.as_deref().unwrap_or("");
            let _ = writeln!(out, "  {at:>9}  {kind:<7}  {reason}: {}", cut(e.note.as_deref().unwrap_or(""), MESSAGE));
        }
    }
    out
}

/// Whether a condition says nothing is wrong: `Degraded` and `Anomaly` false,
/// `Progressing` true or settled, every other one true.
fn fine(c: &Condition) -> bool {
    match ConditionType::parse(&c.type_) {
        Some(ConditionType::Degraded | ConditionType::Anomaly) => c.status != "True",
        Some(ConditionType::Progressing) => c.status == "True" || c.reason == Reason::Steady.as_str(),
        _ => c.status == "True",
    }
}

/// When an Event last happened.
fn when(e: &Event) -> Option<Timestamp> {
    let series = e.series.as_ref().map(|s| s.last_observed_time.0);
    series.or(e.event_time.as_ref().map(|t| t.0)).or(e.deprecated_last_timestamp.as_ref().map(|t| t.0))
}

/// `3m ago` for an RFC 3339 time before `now`; the time itself when it cannot be read.
fn ago(rfc3339: &str, now: Timestamp) -> String {
    let Ok(then) = rfc3339.parse::<Timestamp>() else { return rfc3339.to_string() };
    let seconds = now.duration_since(then).as_secs();
    match seconds {
        s if s < 0 => rfc3339.to_string(),
        s if s < 120 => format!("{s}s ago"),
        s if s < 7200 => format!("{}m ago", s / 60),
        s if s < 172_800 => format!("{}h ago", s / 3600),
        s => format!("{}d ago", s / 86_400),
    }
}

fn cut(text: &str, max: usize) -> String {
    let line = text.replace('\n', " ");
    let kept = crate::said::cut(&line, max);
    if kept.len() < line.len() { format!("{kept}…") } else { line }
}

/// `rows` under `header`, each column as wide as its widest cell, indented two spaces.
fn table<const N: usize>(out: &mut String, header: [&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        format!("  {}", padded.join("  ").trim_end())
    };
    let _ = writeln!(out, "{}", line(header.to_vec()));
    for row in rows {
        let _ = writeln!(out, "{}", line(row.iter().map(String::as_str).collect()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{BackupRecord, DatabaseStatus, MemberStatus, Phase, Recoverable, StorageGrowthStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

    fn database() -> Database {
        let spec = serde_json::from_value(serde_json::json!({"engine": "postgres", "version": "17", "replicas": 3, "storage": "1Gi"}))
            .expect("spec");
        let mut db = Database::new("orders", spec);
        db.metadata.namespace = Some("shop".into());
        let member = |n: u32, node: &str, role: &str, ready: bool| MemberStatus {
            pod: format!("orders-{n}"),
            node: Some(node.into()),
            role: role.into(),
            ready,
            since: None,
            down: (!ready).then(|| "node plugdb-node-c is not ready (Unknown): Kubelet stopped posting node status.".into()),
            position: (n == 1).then(|| "0/3000148".into()),
            lag: (n == 0).then(|| "0.25s".into()),
            heard: (n == 1).then(|| "2026-11-28T10:00:00Z".into()),
            volume: (n == 1).then(|| "21% of 10.0Gi".into()),
            exporter: (n == 1).then(|| "cannot reach its engine".into()),
        };
        let condition = |type_: &str, status: &str, reason: &str, message: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time("2026-11-28T10:00:00Z".parse().expect("time")),
            observed_generation: None,
        };
        db.status = Some(DatabaseStatus {
            phase: Some(Phase::Degraded),
            ready_replicas: Some(2),
            primary: Some("orders-1".into()),
            current_version: Some("17".into()),
            plugin: Some("postgres@0.2.0".into()),
            members: vec![
                member(0, "plugdb-node-a", "replica", true),
                member(1, "plugdb-node-b", "primary", true),
                member(2, "plugdb-node-c", "replica", false),
            ],
            last_backup: Some(BackupRecord { name: "orders-261128090000".into(), completed: Some("2026-11-28T09:00:30Z".into()) }),
            next_backup: Some("2026-11-29T09:00:00Z".into()),
            recoverable: Some(Recoverable {
                backups: 2,
                first: Some("2026-11-27T09:00:30Z".into()),
                last: Some("2026-11-28T10:04:00Z".into()),
                point_in_time: true,
                confirmed: Some("2026-11-28T10:04:00Z".into()),
                unreachable_since: None,
            }),
            conditions: vec![
                condition("Ready", "False", "MembersNotReady", "2/3 members ready"),
                condition("Progressing", "False", "Steady", "every member runs the current spec"),
                condition("Degraded", "True", "MembersDown", "2/3 members ready; orders-2: node plugdb-node-c is not ready"),
                condition("PluginReady", "True", "Rendered", "rendered by postgres@0.2.0"),
                condition(
                    "Anomaly",
                    "True",
                    "LongTransaction",
                    "orders-0: a transaction has been open 75 min (it holds back cleanup, and may hold locks)",
                ),
            ],
            ..Default::default()
        });
        db
    }

    fn event(reason: &str, note: &str, at: &str) -> Event {
        Event {
            reason: Some(reason.into()),
            note: Some(note.into()),
            type_: Some("Warning".into()),
            event_time: Some(MicroTime(at.parse().expect("time"))),
            ..Default::default()
        }
    }

    /// What a person checks first is on the screen: each member's node, role, readiness
    /// and why not, the backups and the window, what is wrong, and the newest Events first.
    #[test]
    fn one_screen_says_who_runs_where_what_is_wrong_and_what_happened() {
        let now: Timestamp = "2026-11-28T10:05:00Z".parse().expect("now");
        let events = [
            event("FailoverPromoted", "promoted orders-1", "2026-11-28T09:59:00Z"),
            event("MemberDown", "orders-2: node lost", "2026-11-28T10:03:00Z"),
        ];
        let mut db = database();
        db.spec.storage_growth = serde_json::from_value(serde_json::json!({"limit": "4Gi"})).expect("storageGrowth");
        db.status.as_mut().expect("status").storage_growth =
            Some(StorageGrowthStatus { size: "2Gi".into(), count: 1, last: "2026-11-28T10:02:00Z".into() });
        let screen = screen(&db, &events, None, now);
        assert!(screen.starts_with("Database shop/orders: postgres 17, Degraded\n"), "{screen}");
        let storage = "storage:  1Gi each; grows on its own once 80 % full, by 25%, up to 4Gi; grown to 2Gi (once, last 3m ago)";
        assert!(screen.contains(storage), "{screen}");
        assert!(screen.contains("members:  2/3 ready, primary orders-1, rendered by postgres@0.2.0"), "{screen}");
        let lines: Vec<&str> = screen.lines().collect();
        let row = |pod: &str| lines.iter().find(|l| l.trim_start().starts_with(pod)).copied().unwrap_or_else(|| panic!("{pod}: {screen}"));
        assert!(row("orders-1").contains("plugdb-node-b") && row("orders-1").contains("primary") && row("orders-1").contains("0/3000148"));
        assert!(row("orders-1").contains("5m ago"), "when its agent said it: {screen}");
        assert!(row("orders-1").contains("21% of 10.0Gi"), "how full its volume is: {screen}");
        assert!(row("orders-1").ends_with("cannot reach its engine"), "what its exporter says: {screen}");
        assert!(row("orders-0").contains("0.25s"), "its lag: {screen}");
        assert!(row("orders-2").contains("no: node plugdb-node-c is not ready"), "{screen}");
        assert!(screen.contains("backups:  last orders-261128090000, completed 64m ago; next 2026-11-29T09:00:00Z"), "{screen}");
        assert!(
            screen.contains("recoverable: any moment from 2026-11-27T09:00:30Z to 2026-11-28T10:04:00Z (confirmed 60s ago)"),
            "{screen}"
        );
        assert!(screen.contains("  Degraded=True MembersDown:") && screen.contains("  Ready=False MembersNotReady:"), "{screen}");
        assert!(screen.contains("  Anomaly=True LongTransaction: orders-0: a transaction has been open 75 min"), "{screen}");
        assert!(!screen.contains("Progressing=") && !screen.contains("PluginReady="), "fine conditions are left out: {screen}");
        let newest = screen.find("MemberDown").expect("an Event");
        assert!(newest < screen.find("FailoverPromoted").expect("an Event"), "newest first: {screen}");
        assert!(!screen.contains("operator:"), "the operator's lease was not readable: nothing said of it");
    }

    /// The screen says whether an operator looks: its lease renewed within its duration,
    /// or not (the status is then only as new as the operator's last look).
    #[test]
    fn the_screen_says_when_no_operator_renewed_its_lease() {
        let now: Timestamp = "2026-11-28T10:05:00Z".parse().expect("now");
        let lease = |holder: &str, renewed: &str| Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(crate::leader::LEASE.into()),
                namespace: Some("plugdb-system".into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(renewed.parse().expect("time"))),
                ..Default::default()
            }),
        };
        let line = |leases: &[Lease]| {
            let screen = screen(&database(), &[], Some(leases), now);
            screen.lines().find(|l| l.starts_with("operator: ")).map(str::to_string).unwrap_or_else(|| panic!("{screen}"))
        };
        assert_eq!(
            line(&[lease("plugdb-7f9c", "2026-11-28T10:04:58Z")]),
            "operator: plugdb-7f9c (lease plugdb-system/plugdb-leader renewed 2s ago)"
        );
        assert_eq!(
            line(&[lease("plugdb-7f9c", "2026-11-28T10:04:25Z")]),
            "operator: plugdb-7f9c has not renewed lease plugdb-system/plugdb-leader for 35s: no operator looks, this status may be stale"
        );
        assert_eq!(
            line(&[]),
            "operator: none holds lease plugdb-leader: no operator looks (or it runs without leader election), this status may be stale"
        );
    }
}
