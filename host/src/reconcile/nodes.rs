//! The nodes of members that are down, read once per pass and only while a member is
//! down: to say in the status when a member's node is lost, and to move a replica off
//! a node lost for longer than `spread.moveFromLostNodeAfter`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::Api;

use super::Context;
use super::members::Observed;
use super::plan::Plan;
use super::status::Reason;
use crate::crd::Database;
use crate::names::Names;

/// A node that is not ready: what it says, and for how long.
#[derive(Debug, Clone)]
pub struct Lost {
    /// `node n2 is not ready (Unknown): Kubelet stopped posting node status.`
    pub problem: String,
    /// Since its `Ready` condition last changed.
    pub for_: Duration,
}

/// The lost nodes among those of members that are down, by name.
#[derive(Debug, Default)]
pub struct LostNodes(BTreeMap<String, Lost>);

/// Reads the node of each member that is down, once per node, and gives each such
/// member on a lost node its node's reason (the pod's own status is stale then). A node
/// that cannot be read counts as not known to be lost.
pub async fn read(ctx: &Context, members: &mut [Observed]) -> LostNodes {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let mut asked: BTreeMap<String, Option<Lost>> = BTreeMap::new();
    for member in members.iter_mut().filter(|m| !m.ready) {
        let Some(node) = member.node.clone() else { continue };
        if !asked.contains_key(&node) {
            let lost = match api.get_opt(&node).await {
                Ok(Some(n)) => lost(&n),
                Ok(None) => Some(Lost { problem: format!("node {node} is gone"), for_: Duration::ZERO }),
                Err(e) => {
                    tracing::debug!(node = %node, error = %e, "cannot read a member's node");
                    None
                }
            };
            asked.insert(node.clone(), lost);
        }
        if let Some(Some(lost)) = asked.get(&node) {
            member.down = Some(lost.problem.clone());
            member.node_lost = true;
        }
    }
    LostNodes(asked.into_iter().filter_map(|(node, lost)| Some((node, lost?))).collect())
}

/// A node's `Ready` condition when it is not `True`, as a [`Lost`].
fn lost(node: &Node) -> Option<Lost> {
    let ready = node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")?;
    if ready.status == "True" {
        return None;
    }
    let why = ready.message.clone().or_else(|| ready.reason.clone()).unwrap_or_default();
    let since = ready.last_transition_time.as_ref().map(|t| k8s_openapi::jiff::Timestamp::now().duration_since(t.0).as_secs().max(0));
    Some(Lost {
        problem: format!("node {} is not ready ({}): {why}", node.name_any(), ready.status),
        for_: Duration::from_secs(since.unwrap_or(0) as u64),
    })
}

/// Moves each replica whose node has been lost for `after` or longer: its claim is
/// deleted and its pod deleted at once (its kubelet cannot confirm), so the StatefulSet
/// makes both anew on a node that runs and the member joins as a new replica does.
/// Never the primary. Returns when a replica still waiting will be due.
pub(super) fn move_replicas(
    ctx: &Context,
    db: &Database,
    after: Duration,
    (members, pods): (&[Observed], &[Arc<Pod>]),
    lost: &LostNodes,
    primary: &str,
    plan: &mut Plan,
) -> Option<Duration> {
    let name = db.name_any();
    let mut due: Option<Duration> = None;
    for member in members.iter().filter(|m| !m.ready && m.name != primary) {
        let Some((node, lost)) = member.node.as_deref().and_then(|n| Some((n, lost.0.get(n)?))) else { continue };
        if lost.for_ < after {
            let left = after - lost.for_;
            due = Some(due.map_or(left, |d| d.min(left)));
            continue;
        }
        let claim = Names(&name).data_claim(member.ordinal);
        let own = ctx.caches.claim(db, &claim).filter(|c| c.metadata.deletion_timestamp.is_none());
        plan.move_member(member.name.clone(), own.map(|c| (claim.clone(), c.metadata.uid.clone())));
        let note = format!(
            "{} moved from node {node}, lost for {} s: its volume {claim} deleted, the member made again from the primary on a node that runs",
            member.name,
            lost.for_.as_secs()
        );
        plan.tell(super::plan::member_ref(pods, &member.name), true, Reason::MemberMoved, note);
    }
    due
}
