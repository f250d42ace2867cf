//! `plugdb connect DB [--replica | --member M]` (`kubectl plugdb connect DB`): the
//! engine's interactive client in a member — the primary unless a replica or a member
//! is asked for — logged in from the member's own environment: no password is typed.
//! The client is what the engine's plugin declares (`agent.client-command`), which the
//! operator keeps on the Database's StatefulSet; `kubectl exec` runs it.

use std::io::IsTerminal;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;

use super::status::{Found, Target};
use super::switchover::member_of;
use crate::crd::Database;
use crate::names::CLIENT_COMMAND;

/// Which member to connect to.
#[derive(Debug, Clone, Default)]
pub struct Connect {
    /// A member (pod or ordinal).
    pub member: Option<String>,
    /// A ready replica rather than the primary.
    pub replica: bool,
}

/// The member `what` names among `db`'s: the named one, a ready replica, or the primary.
pub fn member(db: &Database, what: &Connect) -> Result<String> {
    let name = db.name_any();
    let status = db.status.clone().unwrap_or_default();
    if let Some(m) = &what.member {
        return Ok(member_of(&name, m));
    }
    if what.replica {
        let replica = status.members.iter().find(|m| m.role == "replica" && m.ready).map(|m| m.pod.clone());
        return replica.with_context(|| format!("Database {name} has no ready replica (see `kubectl plugdb status {name}`)"));
    }
    status.primary.with_context(|| format!("Database {name} has no primary now (see `kubectl plugdb status {name}`)"))
}

/// The `kubectl` arguments that run the engine's client in the member `what` names of
/// Database `name`, with a terminal when `tty`.
pub async fn kubectl_args(target: &Target, name: &str, what: &Connect, tty: bool) -> Result<Vec<String>> {
    let Found { client, namespace, db, about, .. } = target.database(name).await?;
    let sts = Api::<StatefulSet>::namespaced(client.clone(), &namespace)
        .get_opt(name)
        .await
        .with_context(|| format!("reading StatefulSet {namespace}/{name}"))?
        .with_context(|| format!("{about} has no members yet"))?;
    let Some(argv) = sts.annotations().get(CLIENT_COMMAND) else {
        bail!("the {} plugin that renders {about} declares no client (agent.client-command)", db.spec.engine);
    };
    let argv: Vec<String> = serde_json::from_str(argv).with_context(|| format!("StatefulSet {namespace}/{name}: {CLIENT_COMMAND}"))?;
    let pod = member(&db, what)?;
    let found = Api::<Pod>::namespaced(client, &namespace).get_opt(&pod).await.with_context(|| format!("reading pod {pod}"))?;
    let container = found
        .as_ref()
        .and_then(|p| p.spec.as_ref())
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone())
        .with_context(|| format!("{about} has no pod {pod} now"))?;
    let mut args = vec!["exec".to_string(), if tty { "-it" } else { "-i" }.to_string(), "--namespace".into(), namespace];
    if let Some(context) = &target.context {
        args.extend(["--context".to_string(), context.clone()]);
    }
    args.extend([pod, "--container".into(), container, "--".into()]);
    args.extend(argv);
    Ok(args)
}

/// Runs the client through kubectl (`$KUBECTL`, else `kubectl` on the `PATH`), with
/// this process's standard input, output and error; its exit code.
pub fn run(args: &[String]) -> Result<i32> {
    let kubectl = std::env::var_os("KUBECTL").unwrap_or_else(|| "kubectl".into());
    let status = std::process::Command::new(&kubectl)
        .args(args)
        .status()
        .with_context(|| format!("running {} (kubectl is needed to connect)", kubectl.to_string_lossy()))?;
    Ok(status.code().unwrap_or(1))
}

/// Whether standard input is a terminal (then the client gets one).
pub fn interactive() -> bool {
    std::io::stdin().is_terminal()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_primary_unless_a_replica_or_a_member_is_asked_for() {
        let db: Database = serde_json::from_value(json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database",
            "metadata": {"name": "orders", "namespace": "shop"}, "spec": {"engine": "postgres", "storage": "1Gi", "replicas": 3},
            "status": {"primary": "orders-1", "members": [
                {"pod": "orders-0", "role": "replica", "ready": false},
                {"pod": "orders-1", "role": "primary", "ready": true},
                {"pod": "orders-2", "role": "replica", "ready": true}]}}))
        .expect("a Database");
        assert_eq!(member(&db, &Connect::default()).expect("primary"), "orders-1");
        assert_eq!(member(&db, &Connect { replica: true, ..Default::default() }).expect("replica"), "orders-2");
        assert_eq!(member(&db, &Connect { member: Some("0".into()), ..Default::default() }).expect("member"), "orders-0");
        let mut down = db.clone();
        down.status = None;
        assert!(format!("{:#}", member(&down, &Connect::default()).expect_err("no primary")).contains("no primary now"));
    }
}
