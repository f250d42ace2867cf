//! Who leads, changed: the step a failover or a switchover stage decides ([`Lead`]) and
//! the end of the pass carries out first, before the rest of its plan. A pass that takes
//! such a step takes no other: the next one, at once, renders for whoever leads then.
//!
//! - A failover: the old primary fenced by its agent (stopped, when its engine does not
//!   confirm the fence: hung), then judged ([`decide::failover`]); promoted, the new
//!   primary gets the read-write Service, its agent promotes it in place, the other
//!   replicas' agents have them follow it, and the two are labelled by their new roles.
//! - A switchover, in two steps a pass each: the primary fenced ([`Lead::Fence`]), its
//!   answer kept for the next pass ([`super::agent::Agents::fence_said`]), which reads
//!   the positions the fenced primary and the target say; once the target has everything
//!   ([`decide::switchover`]), the handover: the read-write Service first, then the old
//!   primary's fence again (what still followed it, a replica's stream, is cut and
//!   reconnects through the Service, to the new primary), the promotion, the others
//!   following, the two labelled by their new roles (a drain may evict the old one from
//!   then on).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::decide::{self, Fenced, Primary};
use super::members::Observed;
use super::{Context, Error, agent};
use crate::crd::Database;
use crate::names::{MANAGER, ROLE_LABEL};
use crate::plugin::FailoverDecision;

/// A change of who leads, as a stage decided it.
pub(super) enum Lead {
    /// The primary a switchover moves from, fenced; the next pass reads the positions.
    Fence(Fence),
    /// The lead handed over.
    Handover(Handover),
}

/// The primary a switchover to `target` moves from, to fence.
pub(super) struct Fence {
    pub primary: String,
    /// Its pod, as observed.
    pub old: Option<Observed>,
    pub target: String,
    /// What the user is told of the switchover so far (a drain's).
    pub notes: Vec<decide::Note>,
}

/// The lead handed from `from` to `to`.
pub(super) struct Handover {
    pub from: String,
    /// The old primary's pod, as observed.
    pub old: Option<Observed>,
    pub to: String,
    /// Every member, as observed: those that are neither follow the new primary.
    pub members: Vec<Observed>,
    /// The read-write Service, when it exists.
    pub service: Option<String>,
    pub why: Why,
}

/// Why the lead changes hands.
pub(super) enum Why {
    /// `from` has been lost for `after` (`down` says why) and the plugin answered: judged
    /// once the old primary's agent answered its fence.
    Failover { after: Duration, down: Option<String>, answer: Result<FailoverDecision, String> },
    /// A switchover whose target has everything the fenced primary wrote: `chosen` says so.
    Switchover(Primary),
}

/// What the fence of a [`Lead`] came to: who leads and what the user is told, and what is
/// left to do when another member does.
pub(super) struct Led {
    pub primary: Primary,
    /// The switchover was refused: its request goes.
    pub over: bool,
    /// The handover, when it goes ahead.
    rest: Option<Handover>,
}

impl Lead {
    /// The old primary fenced, and judged: a failover's by its agent's answer (stopped,
    /// when its engine does not confirm the fence: hung); a switchover's first step by
    /// whether its agent answered at all.
    pub(super) async fn fence(self, ctx: &Context, db: &Database) -> Result<Led, Error> {
        let handover = match self {
            Lead::Fence(Fence { primary, old, target, notes }) => {
                let fenced = fence_serving(ctx, db, old.as_ref()).await?;
                ctx.agents.keep_fence(db, &primary, fenced);
                let (mut chosen, refused) =
                    decide::switchover(&primary, &target, fenced, old.as_ref().is_some_and(|m| m.ready), (None, None));
                let over = refused.is_some();
                chosen.notes = notes.into_iter().chain(refused).collect();
                return Ok(Led { primary: chosen, over, rest: None });
            }
            Lead::Handover(handover) => handover,
        };
        let chosen = match &handover.why {
            // The old primary takes no more writes before another is promoted.
            Why::Failover { after, down, answer } => {
                let fenced = match agent::fence(ctx, db, handover.old.as_ref()).await? {
                    Fenced::Ordered => agent::stop(ctx, db, handover.old.as_ref()).await?,
                    fenced => fenced,
                };
                decide::failover(&handover.from, *after, down.as_deref(), answer.clone(), fenced)
            }
            Why::Switchover(chosen) => chosen.clone(),
        };
        let rest = chosen.failed_over.then_some(handover);
        Ok(Led { primary: chosen, over: false, rest })
    }
}

impl Led {
    /// The rest of a handover that goes ahead: the read-write Service, (a switchover's)
    /// the old primary's fence again, the promotion, the others following, the labels.
    pub(super) async fn hand_over(&mut self, ctx: &Context, db: &Database) -> Result<(), Error> {
        let Some(Handover { from, old, to, members, service, why }) = self.rest.take() else { return Ok(()) };
        let switchover = matches!(why, Why::Switchover(_));
        let ns = db.namespace().unwrap_or_default();
        if let Some(service) = service {
            let select = json!({"spec": {"selector": {crate::build::POD_NAME_LABEL: &to}}});
            let params = PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() };
            Api::<Service>::namespaced(ctx.client.clone(), &ns).patch(&service, &params, &Patch::Merge(&select)).await?;
        }
        if switchover {
            // Marked fenced by the first fence: run again, not marked again.
            agent::fence(ctx, db, old.map(|m| Observed { fenced: true, ..m }).as_ref()).await?;
        }
        agent::promote(ctx, db, members.iter().find(|m| m.name == to), &from).await?;
        let followed = agent::follow(ctx, db, &members, &to, &from).await?;
        decide::told_to_follow(&mut self.primary.notes, followed);
        // Labelled by role: the old primary a replica (a drain may evict it from then on),
        // the new one the primary.
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        for (pod, role) in [(&from, "replica"), (&to, "primary")] {
            let relabel = json!({"metadata": {"labels": {ROLE_LABEL: role}}});
            match pods.patch(pod, &PatchParams::default(), &Patch::Merge(&relabel)).await {
                // A lost primary's pod may be gone.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                done => _ = done?,
            }
        }
        if switchover {
            ctx.agents.forget_fence(db);
        }
        Ok(())
    }
}

/// Asks the agent of the primary `old` to fence it, again while a primary that serves
/// gives no answer (up to [`decide::FENCE_ASKS`] times; a fence asked twice is one fence).
async fn fence_serving(ctx: &Context, db: &Database, old: Option<&Observed>) -> Result<Fenced, Error> {
    let mut fenced = agent::fence(ctx, db, old).await?;
    for _ in 1..decide::FENCE_ASKS {
        if fenced != Fenced::Unknown || !old.is_some_and(|m| m.ready) {
            break;
        }
        fenced = agent::fence(ctx, db, old).await?;
    }
    Ok(fenced)
}

/// Removes `db`'s switchover request, only while it still asks for `target`: a newer
/// request stays.
pub(super) async fn remove_request(ctx: &Context, db: &Database, target: &str) {
    let path = format!("/metadata/annotations/{}", crate::names::SWITCHOVER.replace('/', "~1"));
    let patch = json!([{"op": "test", "path": path, "value": target}, {"op": "remove", "path": path}]);
    let api: Api<Database> = Api::namespaced(ctx.client.clone(), &db.namespace().unwrap_or_default());
    let patch = Patch::Json::<()>(serde_json::from_value(patch).expect("a JSON patch"));
    if let Err(e) = api.patch(&db.name_any(), &PatchParams::default(), &patch).await {
        let database = format!("{}/{}", db.namespace().unwrap_or_default(), db.name_any());
        tracing::debug!(%database, uid = ?db.meta().uid, "the switchover request stays: {e}");
    }
}
