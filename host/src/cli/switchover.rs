//! `plugdb switchover DB MEMBER` (`kubectl plugdb switchover DB MEMBER`): asks for a
//! planned switchover (the annotation `plugdb.io/switchover`) and waits for the operator
//! to carry it out or to say why it cannot.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};

use super::status::{Found, Target};
use crate::names::SWITCHOVER;

/// How long to wait for the operator before saying the switchover is still under way.
const WAIT: Duration = Duration::from_secs(180);

/// The member a user names: a pod of the Database (`orders-2`) or its ordinal (`2`).
pub fn member_of(database: &str, member: &str) -> String {
    match member.parse::<u32>() {
        Ok(ordinal) => crate::names::Names(database).pod(ordinal),
        Err(_) => member.to_string(),
    }
}

/// Asks for `member` of Database `name` to lead and waits: what happened, in a line.
pub async fn switchover(target: &Target, name: &str, member: &str) -> Result<String> {
    let Found { client, namespace, api, db, about } = target.database(name).await?;
    let member = member_of(name, member);
    let status = db.status.clone().unwrap_or_default();
    if status.primary.as_deref() == Some(member.as_str()) {
        return Ok(format!("{member} already leads {about}\n"));
    }
    if !status.members.iter().any(|m| m.pod == member) {
        let members: Vec<&str> = status.members.iter().map(|m| m.pod.as_str()).collect();
        bail!("{about} has no member {member} (its members: {})", members.join(", "));
    }
    let started = Instant::now();
    let since = k8s_openapi::jiff::Timestamp::now();
    let request = serde_json::json!({"metadata": {"annotations": {SWITCHOVER: member}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&request)).await.with_context(|| format!("annotating {about}"))?;
    let events = Api::<Event>::namespaced(client, &namespace);
    let fields = format!("regarding.kind=Database,regarding.name={name}");
    while started.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let db = api.get(name).await.with_context(|| format!("reading {about}"))?;
        if db.annotations().contains_key(SWITCHOVER) {
            continue;
        }
        if db.status.as_ref().and_then(|s| s.primary.as_deref()) == Some(member.as_str()) {
            return Ok(format!("{member} leads {about} ({} s)\n", started.elapsed().as_secs()));
        }
        // Removed without the member leading: refused; the operator's Event says why.
        let refused = events.list(&ListParams::default().fields(&fields)).await.map(|l| l.items).unwrap_or_default();
        let why = refused
            .iter()
            .filter(|e| e.reason.as_deref() == Some("SwitchoverRefused"))
            .filter(|e| e.event_time.as_ref().is_none_or(|t| t.0 >= since))
            .filter_map(|e| e.note.clone())
            .next_back();
        bail!("{}", why.unwrap_or_else(|| format!("switchover to {member} refused (see kubectl plugdb status {name})")));
    }
    bail!("the switchover of {about} to {member} is still under way after {} s: see `kubectl plugdb status {name}`", WAIT.as_secs())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_member_is_named_by_its_pod_or_its_ordinal() {
        assert_eq!(super::member_of("orders", "2"), "orders-2");
        assert_eq!(super::member_of("orders", "orders-1"), "orders-1");
    }
}
