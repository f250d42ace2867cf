//! A planned switchover, when the Database's annotation [`SWITCHOVER`] names the member
//! to lead: the primary is fenced, and the member leads once its agent says it has
//! reached the position the fenced primary's says is its last (see
//! [`decide::switchover`]). Before the promotion the read-write Service leaves the old
//! primary and its fence runs again. Done or refused, the request goes.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::decide::{self, Primary, SwitchoverQuestion};
use super::members::Observed;
use super::{Context, Error, agent};
use crate::agent::Status;
use crate::crd::Database;
use crate::names::{ROLE_LABEL, SWITCHOVER};

/// Who is primary after the switchover stage, and what the agents said when asked (by pod).
pub(super) async fn carry_out(
    ctx: &Context,
    db: &Database,
    primary: &str,
    members: &[Observed],
    elects: bool,
) -> Result<(Primary, Option<Vec<(String, Status)>>), Error> {
    let target = db.annotations().get(SWITCHOVER).cloned();
    let (chosen, heard, drop) = match decide::switchover_question(target.as_deref(), primary, members, elects) {
        SwitchoverQuestion::None => return Ok((Primary::keep(primary), None)),
        SwitchoverQuestion::Drop(note) => (Primary { notes: vec![note], ..Primary::keep(primary) }, None, true),
        SwitchoverQuestion::Fence => {
            let target = target.as_deref().unwrap_or_default();
            let old = members.iter().find(|m| m.name == primary);
            let fenced = agent::fence(ctx, db, old).await?;
            let said = agent::statuses(ctx, db, members).await?;
            let of = |pod: &str| members.iter().zip(&said).find(|(m, _)| m.name == pod).and_then(|(_, s)| s.as_ref());
            let (mut chosen, refused) =
                decide::switchover(primary, target, fenced, old.is_some_and(|m| m.ready), (of(primary), of(target)));
            if chosen.failed_over {
                // What still followed the old primary (a replica's stream) reconnects through
                // the Service, which no longer selects it, to the new primary.
                let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &db.namespace().unwrap_or_default());
                let relabel = json!({"metadata": {"labels": {ROLE_LABEL: "replica"}}});
                pods.patch(primary, &PatchParams::default(), &Patch::Merge(&relabel)).await?;
                agent::fence(ctx, db, old).await?;
            }
            let drop = refused.is_some();
            chosen.notes.extend(refused);
            (chosen, Some(agent::by_pod(members, &said)), drop)
        }
    };
    if let Some(target) = target.filter(|_| drop) {
        remove_request(ctx, db, &target).await;
    }
    Ok((chosen, heard))
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
