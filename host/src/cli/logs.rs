//! `plugdb logs DB [--member N]` (`kubectl plugdb logs DB`): a member's log (the
//! primary's unless another is named), from its engine's container unless another is
//! named; with `--all`, every member's, merged in time order, each line named with its
//! member, and with `--since` and `--level`, only what is that recent and that grave.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};

use super::status::{Found, Target};
use super::switchover::member_of;

/// What to read: whose log, from which container, how much.
#[derive(Debug, Clone, Default)]
pub struct Logs {
    /// A member (pod or ordinal); the primary when `None`.
    pub member: Option<String>,
    /// Every member, merged in time order (instead of one).
    pub all: bool,
    /// A container of the member's pod; its first (the engine) when `None`.
    pub container: Option<String>,
    /// Keep printing as the log grows (one member).
    pub follow: bool,
    /// Only the last lines (of each member).
    pub tail: Option<i64>,
    /// Only the lines of the last this many seconds.
    pub since: Option<i64>,
    /// Only the lines of this level or graver.
    pub level: Option<Level>,
    /// The container's previous run (after a restart).
    pub previous: bool,
}

/// How grave a log line says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// A warning.
    Warning,
    /// An error (or worse: fatal, panic).
    Error,
}

impl std::str::FromStr for Level {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "warning" | "warn" => Ok(Level::Warning),
            "error" => Ok(Level::Error),
            other => Err(format!("{other:?}: the level is warning or error")),
        }
    }
}

/// The level `line` says, as the engines and plugdb write it: PostgreSQL's `WARNING:`,
/// `ERROR:`, `FATAL:`, `PANIC:`; MariaDB's `[Warning]`, `[ERROR]`; the operator's and
/// the agent's ` WARN `, ` ERROR `; etcd's `"level":"warn"`. `None`: no graver than
/// information.
pub fn level_of(line: &str) -> Option<Level> {
    // A JSON line says its level in a field of its own, and only there.
    let field = ["\"level\":\"", "\"error_severity\":\""].iter().find_map(|key| {
        let rest = &line[line.find(key)? + key.len()..];
        Some(rest[..rest.find('"')?].to_ascii_lowercase())
    });
    if let Some(level) = field {
        return match level.as_str() {
            "error" | "fatal" | "panic" | "dpanic" => Some(Level::Error),
            "warn" | "warning" => Some(Level::Warning),
            _ => None,
        };
    }
    let mut level = None;
    for word in line.split(|c: char| !c.is_ascii_alphabetic()) {
        match word {
            "ERROR" | "FATAL" | "PANIC" | "CRITICAL" => return Some(Level::Error),
            "WARN" | "WARNING" | "Warning" => level = Some(Level::Warning),
            _ => {}
        }
    }
    level
}

/// A duration as `--since` takes it: `90s`, `30m`, `1h`, `2d`; seconds.
pub fn seconds(text: &str) -> Result<i64, String> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "s" | "" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: a duration is a number and s, m, h or d (e.g. 30m)")),
    };
    number.parse::<i64>().ok().filter(|n| *n > 0).map(|n| n * scale).ok_or_else(|| format!("{text:?}: not a positive duration"))
}

/// Each member's lines (`(member, log)`, the log read with the kubelet's timestamps),
/// merged in time order (a member's own order kept), each `<time> <member> <line>`;
/// with `level`, only the lines that grave.
pub fn merged(logs: &[(String, String)], level: Option<Level>) -> String {
    let mut lines: Vec<(&str, usize, &str, &str)> = Vec::new();
    for (member, log) in logs {
        for (n, line) in log.lines().enumerate() {
            let (at, text) = line.split_once(' ').unwrap_or(("", line));
            if level.is_none_or(|wanted| level_of(text).is_some_and(|l| l >= wanted)) {
                lines.push((at, n, member, text));
            }
        }
    }
    // RFC 3339 in UTC with nanoseconds, as the kubelet writes it: in time order as text.
    lines.sort_by(|a, b| (a.0, a.2, a.1).cmp(&(b.0, b.2, b.1)));
    lines.iter().map(|(at, _, member, text)| format!("{at} {member} {text}\n")).collect()
}

/// Copies the log `what` names of Database `name` to standard output.
pub async fn logs(target: &Target, name: &str, what: &Logs) -> Result<()> {
    let Found { client, namespace, db, about, .. } = target.database(name).await?;
    let pods = Api::<Pod>::namespaced(client, &namespace);
    if what.all {
        anyhow::ensure!(!what.follow && what.member.is_none(), "--all merges what every member logged: without --follow or --member");
        let members = (0..db.spec.replicas.max(1) as u32).map(|o| crate::names::Names(name).pod(o));
        let mut logs = Vec::new();
        for member in members {
            let Some(pod) = pods.get_opt(&member).await.with_context(|| format!("reading pod {member}"))? else { continue };
            let container = container_of(&pod, &member, what.container.as_deref())?;
            let params = LogParams { timestamps: true, ..params(what, &container) };
            // A member that never started has no log yet: the others still are.
            match pods.logs(&member, &params).await {
                Ok(log) => logs.push((member, log)),
                Err(e) => eprintln!("{member}/{container}: no log ({e})"),
            }
        }
        anyhow::ensure!(!logs.is_empty(), "{about} has no member with a log now (see `kubectl plugdb status {name}`)");
        print!("{}", merged(&logs, what.level));
        return Ok(());
    }
    let member = match &what.member {
        Some(m) => member_of(name, m),
        None => db.status.and_then(|s| s.primary).unwrap_or_else(|| crate::names::Names(name).pod(0)),
    };
    let pod = pods
        .get_opt(&member)
        .await
        .with_context(|| format!("reading pod {member}"))?
        .with_context(|| format!("{about} has no pod {member} now (see `kubectl plugdb status {name}`)"))?;
    let container = container_of(&pod, &member, what.container.as_deref())?;
    if let Some(level) = what.level {
        let log =
            pods.logs(&member, &params(what, &container)).await.with_context(|| format!("reading the log of {member}/{container}"))?;
        print!("{}", log.lines().filter(|l| level_of(l).is_some_and(|l| l >= level)).map(|l| format!("{l}\n")).collect::<String>());
        return Ok(());
    }
    let stream =
        pods.log_stream(&member, &params(what, &container)).await.with_context(|| format!("reading the log of {member}/{container}"))?;
    let mut out = futures::io::AllowStdIo::new(std::io::stdout().lock());
    futures::io::copy(stream, &mut out).await.with_context(|| format!("reading the log of {member}/{container}"))?;
    Ok(())
}

/// The container of `pod` to read: `named`, or its first (the engine's).
fn container_of(pod: &Pod, member: &str, named: Option<&str>) -> Result<String> {
    let containers: Vec<String> = pod.spec.iter().flat_map(|s| &s.containers).map(|c| c.name.clone()).collect();
    match named {
        Some(c) if !containers.iter().any(|have| have == c) => {
            anyhow::bail!("pod {member} has no container {c} (it has {})", containers.join(", "))
        }
        Some(c) => Ok(c.to_string()),
        None => containers.first().cloned().with_context(|| format!("pod {member} has no containers")),
    }
}

fn params(what: &Logs, container: &str) -> LogParams {
    LogParams {
        container: Some(container.to_string()),
        follow: what.follow,
        tail_lines: what.tail,
        since_seconds: what.since,
        previous: what.previous,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_engines_warnings_and_errors_are_told_from_the_rest() {
        let rows = [
            ("2026-12-03 06:00:01.123 UTC [42] WARNING:  could not flush dirty data", Some(Level::Warning)),
            ("2026-12-03 06:00:01.123 UTC [42] FATAL:  the database system is starting up", Some(Level::Error)),
            ("2026-12-03 06:00:01.123 UTC [42] LOG:  database system is ready to accept connections", None),
            (r#"{"timestamp":"2026-12-03 06:00:01","error_severity":"ERROR","message":"duplicate key"}"#, Some(Level::Error)),
            ("2026-12-03  6:00:01 0 [Warning] Aborted connection 7 to db: 'app'", Some(Level::Warning)),
            ("2026-12-03  6:00:01 0 [ERROR] Slave I/O: error connecting to master", Some(Level::Error)),
            ("2026-12-03  6:00:01 0 [Note] mariadbd: ready for connections.", None),
            ("2026-12-03T06:00:01.000Z  WARN plugdb::agent: cannot serve 10.0.0.7", Some(Level::Warning)),
            ("2026-12-03T06:00:01.000Z  INFO plugdb::agent: no error here", None),
            (r#"{"level":"warn","ts":"2026-12-03T06:00:01Z","msg":"slow fdatasync"}"#, Some(Level::Warning)),
            (r#"{"level":"info","ts":"2026-12-03T06:00:01Z","msg":"a Warning-free line"}"#, None),
        ];
        for (line, level) in rows {
            assert_eq!(level_of(line), level, "{line}");
        }
    }

    #[test]
    fn members_logs_merge_in_time_order_named_and_filtered_by_level() {
        let logs = [
            ("orders-0".to_string(), "2026-12-03T06:00:01.000000000Z LOG: a\n2026-12-03T06:00:03.000000000Z WARNING: c\n".to_string()),
            ("orders-1".to_string(), "2026-12-03T06:00:02.000000000Z [ERROR] b\n2026-12-03T06:00:03.000000000Z [Note] d\n".to_string()),
        ];
        let all = merged(&logs, None);
        let expected = "2026-12-03T06:00:01.000000000Z orders-0 LOG: a\n\
                        2026-12-03T06:00:02.000000000Z orders-1 [ERROR] b\n\
                        2026-12-03T06:00:03.000000000Z orders-0 WARNING: c\n\
                        2026-12-03T06:00:03.000000000Z orders-1 [Note] d\n";
        assert_eq!(all, expected);
        let warnings = merged(&logs, Some(Level::Warning));
        assert_eq!(warnings, "2026-12-03T06:00:02.000000000Z orders-1 [ERROR] b\n2026-12-03T06:00:03.000000000Z orders-0 WARNING: c\n");
        assert_eq!(merged(&logs, Some(Level::Error)), "2026-12-03T06:00:02.000000000Z orders-1 [ERROR] b\n");
    }

    #[test]
    fn since_takes_seconds_minutes_hours_and_days() {
        assert_eq!(["90s", "30m", "1h", "2d", "45"].map(seconds), [Ok(90), Ok(1800), Ok(3600), Ok(172_800), Ok(45)]);
        for bad in ["", "1w", "-1h", "0m", "h"] {
            assert!(seconds(bad).is_err(), "{bad:?}");
        }
        assert_eq!("Warn".parse::<Level>(), Ok(Level::Warning));
        assert!("info".parse::<Level>().is_err());
    }
}
