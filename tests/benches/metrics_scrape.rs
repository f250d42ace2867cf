//! The operator's metrics, encoded for one scrape, at 100, 1,000 and 10,000 Databases:
//! the series each Database holds and the time a scrape's encoding takes per Database,
//! in-process (no API server, no HTTP), so that what the scale bench measures over a
//! loaded control plane can be told from what the encoding itself costs. The median of
//! 9 encodings at each size, in one run, written beside `$CRITERION_HOME` as
//! `metrics-scrape.md` (or printed).
//!
//! `cargo bench -p plugdb-tests --bench metrics_scrape`

use std::time::{Duration, Instant};

use plugdb::crd::Database;
use plugdb::metrics::Metrics;

/// A reconciled Database as the scale bench leaves it: running, its conditions said,
/// three members, backups scheduled.
fn database(i: usize) -> Database {
    let condition = |type_: &str, status: &str| serde_json::json!({"type": type_, "status": status, "reason": "Steady", "message": "", "lastTransitionTime": "2027-01-15T08:00:00Z"});
    serde_json::from_value(serde_json::json!({
        "apiVersion": "plugdb.io/v1alpha1", "kind": "Database",
        "metadata": {"name": format!("db-{i}"), "namespace": format!("ns-{}", i % 100)},
        "spec": {"engine": "postgres", "storage": "1Gi", "replicas": 3, "backup": {"schedule": "0 2 * * *"}},
        "status": {
            "phase": "Running",
            "readyReplicas": 3,
            "members": [
                {"pod": format!("db-{i}-0"), "node": "a", "role": "primary", "ready": true},
                {"pod": format!("db-{i}-1"), "node": "b", "role": "replica", "ready": true},
                {"pod": format!("db-{i}-2"), "node": "c", "role": "replica", "ready": true},
            ],
            "conditions": [condition("Ready", "True"), condition("Progressing", "True"), condition("Degraded", "False"),
                           condition("BackupHealthy", "True"), condition("Anomaly", "False")],
            "lastBackup": {"name": format!("db-{i}-2701150200"), "completed": "2027-01-15T02:00:30Z"},
        },
    }))
    .expect("a Database")
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let mut rows = vec![
        "| Databases | series per Database | bytes per Database | one scrape's encoding (median of 9) | per Database |".to_string(),
        "| --- | --- | --- | --- | --- |".to_string(),
    ];
    for size in [100, 1_000, 10_000] {
        let metrics = Metrics::default();
        for i in 0..size {
            let db = database(i);
            metrics.database(&db, db.status.as_ref());
        }
        let mut body = String::new();
        let times: Vec<Duration> = (0..9)
            .map(|_| {
                let start = Instant::now();
                body = std::hint::black_box(metrics.encode());
                start.elapsed()
            })
            .collect();
        let series = body.lines().filter(|l| !l.starts_with('#') && l.contains("database=\"")).count();
        let took = median(times);
        rows.push(format!(
            "| {size} | {:.2} | {} | {:.2} ms | {:.2} µs |",
            series as f64 / size as f64,
            body.len() / size,
            took.as_secs_f64() * 1000.0,
            took.as_secs_f64() * 1e6 / size as f64
        ));
    }
    let table = rows.join("\n") + "\n";
    print!("{table}");
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        let out = std::path::Path::new(&home).with_file_name("metrics-scrape.md");
        std::fs::write(&out, &table).expect("the report");
        eprintln!("written to {}", out.display());
    }
}
