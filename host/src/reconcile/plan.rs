//! What a pass decided to write, gathered as its stages decide and carried out in one
//! place, in a fixed order, when the pass ends (however it ends):
//!
//! 1. the children (ConfigMaps, Services, the StatefulSet, disruption budgets), applied
//!    where they differ from what the cache holds;
//! 2. the Jobs and the volumes they need, made when absent, in the order decided;
//! 3. role labels on the members;
//! 4. the one member restart of a roll (a fenced member fenced again first);
//! 5. the replicas moved off a lost node: the volume claim, then the pod;
//! 6. the Jobs retention removes;
//! 7. the Events, in the order decided;
//!
//! then the caller writes the status, once. A pass that fails part way sends the Events
//! of what it already did (a promotion is not undone) and nothing else: the next pass
//! decides the rest again from what it finds.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::members::Observed;
use super::status::Reason;
use super::{Context, Error, apply, event_about};
use crate::build::{Child, Kind};
use crate::crd::Database;
use crate::names::ROLE_LABEL;

/// The writes a pass decided, not yet carried out.
#[derive(Default)]
pub(super) struct Plan {
    /// Applied where they differ, in order.
    applied: Vec<Child>,
    /// Made when absent, in order: a Job's volume comes before the Job.
    made: Vec<Child>,
    /// Role labels to set, by member pod.
    labels: Vec<(String, &'static str)>,
    /// The member restarted in this pass.
    restart: Option<Restart>,
    /// Replicas moved off a lost node.
    moved: Vec<Move>,
    /// Jobs removed (and their pods with them).
    removed: Vec<String>,
    /// Events, in the order decided.
    events: Vec<Said>,
}

/// A member restarted onto the current revision.
struct Restart {
    pod: String,
    /// The member, when its agent fenced it: fenced again before it stops, so that a
    /// replica's stream that reconnected to it meanwhile is cut before its shutdown
    /// writes past the new primary's start.
    fenced: Option<Observed>,
}

/// A replica moved off its lost node.
struct Move {
    pod: String,
    /// Its volume claim, and the uid it must still have to be deleted.
    claim: Option<(String, Option<String>)>,
}

/// An Event to send.
struct Said {
    about: Option<ObjectReference>,
    warning: bool,
    reason: Reason,
    note: String,
}

impl Plan {
    /// Applies `child` unless the cache holds it as it is (see [`apply::apply`]).
    pub(super) fn apply(&mut self, child: Child) {
        self.applied.push(child);
    }

    /// Makes `child` (a Job, or a volume a Job needs) unless it exists.
    pub(super) fn make(&mut self, child: Child) {
        self.made.push(child);
    }

    /// Sets member `pod`'s role label to `role`.
    pub(super) fn label(&mut self, pod: String, role: &'static str) {
        self.labels.push((pod, role));
    }

    /// Restarts member `pod` (deletes it: its StatefulSet makes it again); `fenced` is the
    /// member when its agent fenced it.
    pub(super) fn restart(&mut self, pod: String, fenced: Option<Observed>) {
        self.restart = Some(Restart { pod, fenced });
    }

    /// Moves member `pod` off its lost node: `claim` (its volume claim, with the uid it
    /// must still have) is deleted, then the pod at once (its kubelet cannot confirm).
    pub(super) fn move_member(&mut self, pod: String, claim: Option<(String, Option<String>)>) {
        self.moved.push(Move { pod, claim });
    }

    /// Removes the Job `name`.
    pub(super) fn remove_job(&mut self, name: String) {
        self.removed.push(name);
    }

    /// Sends an Event about the Database (`about`: a related object, such as a member).
    pub(super) fn tell(&mut self, about: Option<ObjectReference>, warning: bool, reason: Reason, note: String) {
        self.events.push(Said { about, warning, reason, note });
    }

    /// Carries the plan out, in the order the module gives. The Events are sent even when
    /// a write before them failed: they say what the pass already did.
    pub(super) async fn carry_out(mut self, ctx: &Context, db: &Database) -> Result<(), Error> {
        let events = std::mem::take(&mut self.events);
        let written = self.write(ctx, db).await;
        Plan { events, ..Plan::default() }.tell_all(ctx, db).await;
        written
    }

    async fn write(&self, ctx: &Context, db: &Database) -> Result<(), Error> {
        let ns = db.namespace().unwrap_or_default();
        for child in &self.applied {
            apply::apply(ctx, db, child).await?;
        }
        for child in &self.made {
            if apply::create_once(ctx, db, child).await? && child.kind == Kind::Job {
                tracing::info!(database = %db.name_any(), namespace = %ns, job = %child.name, "job started");
            }
        }
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        for (name, role) in &self.labels {
            pods.patch(name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {ROLE_LABEL: role}}}))).await?;
        }
        if let Some(restart) = &self.restart {
            if restart.fenced.is_some() {
                super::agent::fence(ctx, db, restart.fenced.as_ref()).await?;
            }
            pods.delete(&restart.pod, &DeleteParams::default()).await?;
        }
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
        for Move { pod, claim } in &self.moved {
            if let Some((claim, uid)) = claim {
                let preconditions = Some(Preconditions { uid: uid.clone(), resource_version: None });
                claims.delete(claim, &DeleteParams { preconditions, ..Default::default() }).await?;
            }
            pods.delete(pod, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await?;
        }
        let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
        for job in &self.removed {
            // Its pods with it; one already gone is no error.
            let params = DeleteParams { propagation_policy: Some(PropagationPolicy::Background), ..Default::default() };
            match jobs.delete(job, &params).await {
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                done => _ = done?,
            }
        }
        Ok(())
    }

    /// Sends the Events only: what a pass that failed part way already did is said.
    pub(super) async fn tell_all(self, ctx: &Context, db: &Database) {
        for said in self.events {
            event_about(ctx, db, said.about, said.warning, said.reason, said.note).await;
        }
    }
}

/// A reference to member `pod` of `pods`, for an Event about it.
pub(super) fn member_ref(pods: &[std::sync::Arc<Pod>], pod: &str) -> Option<ObjectReference> {
    pods.iter().find(|p| p.name_any() == pod).map(|p| p.object_ref(&()))
}
