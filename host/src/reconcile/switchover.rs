//! A planned switchover, when the Database's annotation [`SWITCHOVER`] names the member
//! to lead: the primary is fenced, and the member leads once its agent says it has
//! reached the position the fenced primary's says is its last (see
//! [`decide::switchover`]). Before the promotion the read-write Service leaves the old
//! primary and its fence runs again; the member's agent then promotes it in place where
//! the plugin says how (else it restarts to lead), and the other replicas' agents have
//! them follow it. Done or refused, the request goes.
//!
//! Unasked, the same happens when the primary's node is cordoned, as a drain begins:
//! the primary's disruption budget holds its eviction back until another member leads.

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::cache::Seen;
use super::decide::{self, Primary, SwitchoverQuestion};
use super::members::Observed;
use super::{Context, Error, agent};
use crate::agent::Status;
use crate::build::Kind;
use crate::crd::Database;
use crate::names::{MANAGER, Names, ROLE_LABEL, SWITCHOVER};

/// Who is primary after the switchover stage, and what the agents said when asked (by pod).
pub(super) async fn carry_out(
    ctx: &Context,
    db: &Database,
    primary: &str,
    members: &[Observed],
    elects: bool,
) -> Result<(Primary, Option<Vec<(String, Status)>>), Error> {
    let asked = db.annotations().get(SWITCHOVER).cloned();
    // Unasked, a drain of the primary's node moves the primary off it first.
    let drained = match asked {
        None if !elects => decide::drain_target(members, primary, |node| ctx.caches.cordoned(node)),
        _ => None,
    };
    let target = asked.clone().or_else(|| drained.map(|m| m.name.clone()));
    let (chosen, heard, drop) = match decide::switchover_question(target.as_deref(), primary, members, elects) {
        SwitchoverQuestion::None => return Ok((Primary::keep(primary), None)),
        SwitchoverQuestion::Drop(note) => (Primary { notes: vec![note], ..Primary::keep(primary) }, None, true),
        SwitchoverQuestion::Fence => {
            let target = target.as_deref().unwrap_or_default();
            let old = members.iter().find(|m| m.name == primary);
            let fenced = fence_serving(ctx, db, old).await?;
            let said = agent::statuses(ctx, db, members).await?;
            let of = |pod: &str| members.iter().zip(&said).find(|(m, _)| m.name == pod).and_then(|(_, s)| s.as_ref());
            let (mut chosen, refused) =
                decide::switchover(primary, target, fenced, old.is_some_and(|m| m.ready), (of(primary), of(target)));
            if let Some(waits) = &chosen.switching {
                tracing::info!("{waits}");
            }
            if chosen.failed_over {
                // The read-write Service leads to the new primary first; then what still
                // followed the old one (a replica's stream) is cut and reconnects through
                // it, to the new primary. Last, the old primary is labelled a replica: a
                // drain may evict it from then on, and its shutdown finds no one following.
                let ns = db.namespace().unwrap_or_default();
                let service = Names(&db.name_any()).primary();
                if matches!(ctx.caches.seen(Kind::Service, db, &service), Seen::Present { .. }) {
                    let select = json!({"spec": {"selector": {crate::build::POD_NAME_LABEL: target}}});
                    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
                    services
                        .patch(&service, &PatchParams { field_manager: Some(MANAGER.into()), ..Default::default() }, &Patch::Merge(&select))
                        .await?;
                }
                // Marked fenced by the first fence: run again, not marked again.
                agent::fence(ctx, db, old.map(|m| Observed { fenced: true, ..m.clone() }).as_ref()).await?;
                agent::promote(ctx, db, members.iter().find(|m| m.name == target), primary).await?;
                let followed = agent::follow(ctx, db, members, target, primary).await?;
                decide::told_to_follow(&mut chosen.notes, followed);
                let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
                let relabel = json!({"metadata": {"labels": {ROLE_LABEL: "replica"}}});
                pods.patch(primary, &PatchParams::default(), &Patch::Merge(&relabel)).await?;
            }
            let drop = refused.is_some();
            if let (Some(to), Some(node)) = (drained, old.and_then(|m| m.node.as_deref())) {
                chosen.notes.insert(0, decide::switching_for_drain(node, primary, &to.name));
            }
            chosen.notes.extend(refused);
            (chosen, Some(agent::by_pod(members, &said)), drop)
        }
    };
    if let Some(target) = asked.filter(|_| drop) {
        remove_request(ctx, db, &target).await;
    }
    Ok((chosen, heard))
}

/// Asks the agent of the primary `old` to fence it, again while a primary that serves
/// gives no answer (up to [`decide::FENCE_ASKS`] times; a fence asked twice is one fence).
async fn fence_serving(ctx: &Context, db: &Database, old: Option<&Observed>) -> Result<decide::Fenced, Error> {
    let mut fenced = agent::fence(ctx, db, old).await?;
    for _ in 1..decide::FENCE_ASKS {
        if fenced != decide::Fenced::Unknown || !old.is_some_and(|m| m.ready) {
            break;
        }
        fenced = agent::fence(ctx, db, old).await?;
    }
    Ok(fenced)
}

/// Removes the request, only while it still asks for `target`: a newer request stays.
async fn remove_request(ctx: &Context, db: &Database, target: &str) {
    let path = format!("/metadata/annotations/{}", SWITCHOVER.replace('/', "~1"));
    let patch = json!([{"op": "test", "path": path, "value": target}, {"op": "remove", "path": path}]);
    let api: Api<Database> = Api::namespaced(ctx.client.clone(), &db.namespace().unwrap_or_default());
    let patch = Patch::Json::<()>(serde_json::from_value(patch).expect("a JSON patch"));
    if let Err(e) = api.patch(&db.name_any(), &PatchParams::default(), &patch).await {
        tracing::debug!(database = %format!("{}/{}", db.namespace().unwrap_or_default(), db.name_any()), "the switchover request stays: {e}");
    }
}
