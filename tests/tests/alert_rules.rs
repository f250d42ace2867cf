//! plugdb's alert rules and series, checked by the real promtool (Debian's prometheus
//! package, unpacked once by `scripts/prometheus.sh`): the rules load and their unit
//! tests pass, every alert has a runbook and a unit test in which it fires, and the
//! series the member agent and the operator serve pass `promtool check metrics`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use plugdb::agent::metrics::{Archive, Member, Volume, encode};
use plugdb::agent::parse;

fn alerts_dir() -> PathBuf {
    plugdb_tests::workspace_root().join("deploy/chart/plugdb/alerts")
}

/// `promtool` `args`, with `input` on its standard input: its exit and everything it said.
fn promtool(args: &[&str], input: Option<&str>) -> (bool, String) {
    let root = plugdb_tests::workspace_root();
    let found = Command::new("bash").arg(root.join("scripts/prometheus.sh")).output().expect("scripts/prometheus.sh");
    assert!(found.status.success(), "promtool is missing and could not be unpacked: {}", String::from_utf8_lossy(&found.stderr));
    let bin = PathBuf::from(String::from_utf8_lossy(&found.stdout).trim()).join("promtool");
    let mut child = Command::new(bin)
        .args(args)
        .current_dir(alerts_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input.unwrap_or_default().as_bytes()).expect("promtool's input");
    drop(stdin);
    let out = child.wait_with_output().expect("promtool ran");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn yaml(file: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(alerts_dir().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn the_rules_load_and_their_unit_tests_pass() {
    let (ok, said) = promtool(&["check", "rules", "plugdb-rules.yaml"], None);
    assert!(ok, "{said}");
    let (ok, said) = promtool(&["test", "rules", "plugdb-rules.test.yaml"], None);
    assert!(ok && said.contains("SUCCESS"), "{said}");
}

/// Each alert, at each severity, links a runbook that exists, and fires in a unit test.
#[test]
fn every_alert_has_a_runbook_and_fires_in_a_unit_test() {
    let rules = yaml("plugdb-rules.yaml");
    let tests = yaml("plugdb-rules.test.yaml");
    let fired: Vec<(String, String)> = tests["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().cloned().unwrap_or_default())
        .flat_map(|a| {
            let name = a["alertname"].as_str().unwrap_or_default().to_string();
            let expected = a["exp_alerts"].as_array().cloned().unwrap_or_default();
            expected.into_iter().map(move |e| (name.clone(), e["exp_labels"]["severity"].as_str().unwrap_or_default().to_string()))
        })
        .collect();
    let alerts: Vec<&serde_json::Value> =
        rules["groups"].as_array().expect("groups").iter().flat_map(|g| g["rules"].as_array().expect("rules")).collect();
    assert!(alerts.len() >= 20, "{} rules", alerts.len());
    for rule in alerts {
        let (name, severity) = (rule["alert"].as_str().expect("an alert"), rule["labels"]["severity"].as_str().expect("a severity"));
        assert!(["warning", "critical"].contains(&severity), "{name}: {severity}");
        let runbook = rule["annotations"]["runbook_url"].as_str().unwrap_or_else(|| panic!("{name}: no runbook"));
        assert!(plugdb_tests::workspace_root().join(runbook).is_file(), "{name}: {runbook} is missing");
        let title = std::fs::read_to_string(plugdb_tests::workspace_root().join(runbook)).expect("the runbook");
        assert!(title.lines().next().is_some_and(|l| l.contains(name)), "{runbook} is {name}'s");
        assert!(fired.iter().any(|(n, s)| n == name && s == severity), "{name} ({severity}) fires in no unit test");
    }
}

/// OpenMetrics, which the operator serves and Prometheus reads, in the older text format
/// promtool's lint reads: a counter's family is named with its `_total`, no `# EOF`.
fn as_text_format(open_metrics: &str) -> String {
    let counters: Vec<&str> = open_metrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let renamed = |line: &str| {
        for name in &counters {
            for head in ["# HELP ", "# TYPE "] {
                if let Some(rest) = line.strip_prefix(&format!("{head}{name} ")) {
                    return format!("{head}{name}_total {rest}");
                }
            }
        }
        line.to_string()
    };
    open_metrics.lines().filter(|l| *l != "# EOF").map(|l| renamed(l) + "\n").collect()
}

/// The agent's series (a replica that says its lag, a member whose engine is silent) and
/// the operator's (a Database's among them) pass promtool's lint: names, units, help and types as Prometheus wants.
#[test]
fn the_series_served_pass_promtool_check_metrics() {
    let member = Member {
        namespace: "shop".into(),
        database: "orders".into(),
        engine: "postgres".into(),
        member: "orders-1".into(),
        data: None,
        archive: None,
        exporter: None,
    };
    let replica = parse("replica 0/3000148 2.5").expect("a status");
    let volume = Some(Volume { size: 10 << 30, used: 1 << 30, per_hour: None });
    let archive = Some(Archive { pending: 3, oldest: 42.5 });
    for series in [encode(&member, Some(&replica), false, volume, archive), encode(&member, None, true, None, None)] {
        let (ok, said) = promtool(&["check", "metrics"], Some(&series));
        assert!(ok && said.trim().is_empty(), "{said}\n{series}");
    }
    let operator = plugdb::metrics::Metrics::default();
    operator.plugin_load("postgres", "loaded");
    operator.member_said("shop", "orders", "orders-1", Some((Some(Duration::from_millis(2500)), 1_800_000_000.0)));
    let db: plugdb::crd::Database = serde_json::from_value(serde_json::json!({
        "apiVersion": "plugdb.io/v1alpha1", "kind": "Database",
        "metadata": {"name": "orders", "namespace": "shop"},
        "spec": {"engine": "postgres", "storage": "1Gi", "backup": {"schedule": "0 2 * * *"}},
        "status": {
            "phase": "Running", "readyReplicas": 1,
            "conditions": [{"type": "Ready", "status": "True", "reason": "AllMembersReady", "message": "", "lastTransitionTime": "2027-01-15T08:00:00Z"}],
            "lastBackup": {"name": "orders-2701150200", "completed": "2027-01-15T02:00:30Z"},
        },
    }))
    .expect("a Database");
    operator.database(&db, db.status.as_ref());
    operator.promoted(&db, "failover");
    let series = as_text_format(&operator.encode());
    let (ok, said) = promtool(&["check", "metrics"], Some(&series));
    assert!(ok && said.trim().is_empty(), "{said}\n{series}");
}
