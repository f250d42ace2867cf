//! `plugdb logs DB [--member N]` (`kubectl plugdb logs DB`): a member's log (the
//! primary's unless another is named), from its engine's container unless another is
//! named.

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
    /// A container of the member's pod; its first (the engine) when `None`.
    pub container: Option<String>,
    /// Keep printing as the log grows.
    pub follow: bool,
    /// Only the last lines.
    pub tail: Option<i64>,
    /// The container's previous run (after a restart).
    pub previous: bool,
}

/// Copies the log `what` names of Database `name` to standard output.
pub async fn logs(target: &Target, name: &str, what: &Logs) -> Result<()> {
    let Found { client, namespace, db, about, .. } = target.database(name).await?;
    let member = match &what.member {
        Some(m) => member_of(name, m),
        None => db.status.and_then(|s| s.primary).unwrap_or_else(|| crate::names::Names(name).pod(0)),
    };
    let pods = Api::<Pod>::namespaced(client, &namespace);
    let pod = pods
        .get_opt(&member)
        .await
        .with_context(|| format!("reading pod {member}"))?
        .with_context(|| format!("{about} has no pod {member} now (see `kubectl plugdb status {name}`)"))?;
    let containers: Vec<String> = pod.spec.iter().flat_map(|s| &s.containers).map(|c| c.name.clone()).collect();
    let container = match &what.container {
        Some(c) if !containers.contains(c) => anyhow::bail!("pod {member} has no container {c} (it has {})", containers.join(", ")),
        Some(c) => c.clone(),
        None => containers.first().cloned().with_context(|| format!("pod {member} has no containers"))?,
    };
    let params = LogParams {
        container: Some(container.clone()),
        follow: what.follow,
        tail_lines: what.tail,
        previous: what.previous,
        ..Default::default()
    };
    let stream = pods.log_stream(&member, &params).await.with_context(|| format!("reading the log of {member}/{container}"))?;
    let mut out = futures::io::AllowStdIo::new(std::io::stdout().lock());
    futures::io::copy(stream, &mut out).await.with_context(|| format!("reading the log of {member}/{container}"))?;
    Ok(())
}
