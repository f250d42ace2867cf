//! `plugdb backup DB` and `plugdb restore DB --as NEW [--to TIME | --backup NAME]`
//! (`kubectl plugdb …`): a backup on demand, waited for; a new Database restored from
//! one of DB's backups, or to a moment, and followed until it runs.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};

use super::status::{Found, Target};
use crate::crd::{Database, Phase, RestoreSource};
use crate::reconcile::backups::BACKUP_NOW;
use crate::reconcile::decide::manual_backup;
use crate::reconcile::status::ConditionType;

/// How long a backup or a restore is waited for before the command says it is still under way.
const WAIT: Duration = Duration::from_secs(30 * 60);
/// How often the Database is read while waiting.
const POLL: Duration = Duration::from_secs(2);

/// The condition `BackupHealthy`'s message when it is not fine.
fn backup_problem(db: &Database) -> Option<String> {
    let conditions = db.status.iter().flat_map(|s| &s.conditions);
    conditions.filter(|c| c.type_ == ConditionType::BackupHealthy.as_str() && c.status == "False").map(|c| c.message.clone()).next()
}

/// Asks for a backup of Database `name` now and waits for it: its name and when it completed.
pub async fn backup(target: &Target, name: &str) -> Result<String> {
    let Found { api, about, .. } = target.database(name).await?;
    // Each new value of the annotation is one backup; the time makes it new.
    let token = Timestamp::now().to_string();
    let job = manual_backup(name, &token);
    let request = serde_json::json!({"metadata": {"annotations": {BACKUP_NOW: token}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&request)).await.with_context(|| format!("annotating {about}"))?;
    let started = Instant::now();
    while started.elapsed() < WAIT {
        tokio::time::sleep(POLL).await;
        let db = api.get(name).await.with_context(|| format!("reading {about}"))?;
        let status = db.status.clone().unwrap_or_default();
        if let Some(last) = status.last_backup.as_ref().filter(|b| b.name == job) {
            let at = last.completed.as_deref().unwrap_or("(time unknown)");
            return Ok(format!("backup {job} of {about} completed at {at} ({} s)\n", started.elapsed().as_secs()));
        }
        if let Some(problem) = backup_problem(&db).filter(|p| p.contains(&job) || p.starts_with("spec.backup")) {
            bail!("backup {job} of {about}: {problem}");
        }
    }
    bail!("backup {job} of {about} is still running after {} min: see `kubectl plugdb status {name}`", WAIT.as_secs() / 60)
}

/// What a restore starts from: a moment, a named backup, or the newest backup.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct From {
    /// A moment (RFC 3339) inside the source's recoverable window.
    pub to: Option<String>,
    /// A backup's name (as `status.lastBackup.name`).
    pub backup: Option<String>,
    /// Members of the new Database (the source's number when `None`).
    pub replicas: Option<i32>,
}

/// The Database `new` that restores `source` as `from` says: the source's spec (engine,
/// version, members, storage, backups, policy), bootstrapped from its backup. Backups
/// kept in object storage are read from there; others from the source's backup volume.
pub fn restored(source: &Database, new: &str, from: &From) -> Result<Database> {
    let namespace = source.namespace().unwrap_or_default();
    let about = format!("Database {namespace}/{}", source.name_any());
    let s3 = source.spec.backup.as_ref().and_then(|b| b.s3.clone());
    let status = source.status.clone().unwrap_or_default();
    if let Some(to) = &from.to {
        let at: Timestamp = to.parse().with_context(|| format!("--to {to}: not a time (RFC 3339, e.g. 2026-11-23T10:15:30Z)"))?;
        if s3.is_none() {
            bail!("--to: {about} keeps no backups in object storage (spec.backup.s3): a moment needs its archived log");
        }
        let window = status.recoverable.as_ref().filter(|r| r.point_in_time);
        let bound = |t: Option<&String>| t.and_then(|t| t.parse::<Timestamp>().ok());
        match window.map(|r| (bound(r.first.as_ref()), bound(r.last.as_ref()))) {
            None => bail!("--to: {about} has no recoverable window in its status (its engine archives no log, or no backup completed yet)"),
            Some((Some(first), Some(last))) if at < first || at > last => {
                bail!("--to {to}: outside {about}'s recoverable window, {first} to {last}")
            }
            Some(_) => {}
        }
    }
    let backup = match (&from.backup, &s3, &from.to) {
        (Some(b), _, _) => Some(b.clone()),
        // Object storage: the newest complete backup (or the one before the moment) is found there.
        (None, Some(_), _) => None,
        (None, None, _) => Some(status.last_backup.as_ref().map(|b| b.name.clone()).with_context(|| {
            format!("{about} has no completed backup yet: take one with `kubectl plugdb backup {}`", source.name_any())
        })?),
    };
    let mut spec = source.spec.clone();
    spec.replicas = from.replicas.unwrap_or(spec.replicas);
    spec.restore_from = Some(RestoreSource {
        database: source.name_any(),
        backup,
        namespace: s3.is_some().then(|| namespace.clone()),
        s3,
        point_in_time: from.to.clone(),
    });
    let mut db = Database::new(new, spec);
    db.metadata.namespace = Some(namespace);
    Ok(db)
}

/// Writes the Database `new` restored from `name` and follows it until it runs or fails.
pub async fn restore(target: &Target, name: &str, new: &str, from: &From) -> Result<String> {
    let Found { api, about, namespace, db: source, .. } = target.database(name).await?;
    let db = restored(&source, new, from)?;
    let made = format!("Database {namespace}/{new}");
    api.create(&PostParams::default(), &db).await.with_context(|| format!("creating {made}"))?;
    let started = Instant::now();
    let mut said = String::new();
    while started.elapsed() < WAIT {
        tokio::time::sleep(POLL).await;
        let db = api.get(new).await.with_context(|| format!("reading {made}"))?;
        let status = db.status.clone().unwrap_or_default();
        let condition = |type_: ConditionType| status.conditions.iter().find(|c| c.type_ == type_.as_str());
        let progress = condition(ConditionType::Progressing);
        if let Some(c) = progress.filter(|c| c.reason == "RestoreFailed") {
            bail!("{made} could not be restored from {about}: {}", c.message);
        }
        let line = progress.map(|c| c.message.clone()).unwrap_or_default();
        if !line.is_empty() && line != said {
            eprintln!("{made}: {line}");
            said = line;
        }
        if status.phase == Some(Phase::Running) && condition(ConditionType::Restored).is_some_and(|c| c.status == "True") {
            return Ok(format!("{made} restored from {about} and Running ({} s)\n", started.elapsed().as_secs()));
        }
    }
    bail!("{made} is still being restored after {} min: see `kubectl plugdb status {new}`", WAIT.as_secs() / 60)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn source(spec: serde_json::Value, status: serde_json::Value) -> Database {
        serde_json::from_value(json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database",
            "metadata": {"name": "orders", "namespace": "shop"}, "spec": spec, "status": status}))
        .expect("a Database")
    }

    fn s3() -> serde_json::Value {
        json!({"engine": "postgres", "replicas": 3, "storage": "5Gi",
               "backup": {"schedule": "0 3 * * *", "s3": {"endpoint": "http://minio:9000", "bucket": "b", "credentials": {"secretName": "s3"}}}})
    }

    #[test]
    fn a_restore_keeps_the_spec_and_reads_where_the_backups_are() {
        let window =
            json!({"recoverable": {"backups": 2, "first": "2026-11-27T09:00:00Z", "last": "2026-11-28T10:00:00Z", "pointInTime": true}});
        let at = From { to: Some("2026-11-28T08:00:00Z".into()), backup: None, replicas: Some(2) };
        let db = restored(&source(s3(), window.clone()), "orders-copy", &at).expect("restored");
        assert_eq!(db.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(db.spec.replicas, 2, "--replicas");
        let from = db.spec.restore_from.expect("restoreFrom");
        assert_eq!((from.database.as_str(), from.namespace.as_deref(), from.backup), ("orders", Some("shop"), None));
        assert_eq!(from.point_in_time.as_deref(), Some("2026-11-28T08:00:00Z"));
        assert_eq!(from.s3.expect("s3").bucket, "b");

        let newest = restored(&source(s3(), window.clone()), "c", &From::default()).expect("the newest in the bucket");
        assert_eq!(newest.spec.restore_from.expect("restoreFrom").backup, None);

        let volume = json!({"engine": "postgres", "storage": "5Gi"});
        let kept = json!({"lastBackup": {"name": "orders-manual-0123456789", "completed": "2026-11-28T09:00:00Z"}});
        let db = restored(&source(volume.clone(), kept), "c", &From::default()).expect("from the volume");
        let from = db.spec.restore_from.expect("restoreFrom");
        assert_eq!((from.backup.as_deref(), from.s3.is_none(), from.namespace), (Some("orders-manual-0123456789"), true, None));

        for (spec, status, from, says) in [
            (volume.clone(), json!({}), From::default(), "no completed backup yet"),
            (volume, json!({}), at.clone(), "keeps no backups in object storage"),
            (s3(), json!({}), at, "no recoverable window"),
            (s3(), window.clone(), From { to: Some("2026-11-20T00:00:00Z".into()), ..Default::default() }, "outside"),
            (s3(), window, From { to: Some("yesterday".into()), ..Default::default() }, "not a time"),
        ] {
            let e = format!("{:#}", restored(&source(spec, status), "c", &from).expect_err(says));
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn the_backup_asked_for_is_named_as_the_operator_names_it() {
        let job = manual_backup("orders", "2026-11-28T10:00:00Z");
        assert!(job.starts_with("orders-manual-") && job.len() == "orders-manual-".len() + 10, "{job}");
        assert_ne!(job, manual_backup("orders", "2026-11-28T10:00:01Z"));
    }
}
