//! What a pass decided to write, gathered as its stages decide and carried out in one
//! place, in a fixed order, when the pass ends (however it ends):
//!
//! 0. the finalizer, when the deletion policy asks for one or no longer does;
//!    then each member that takes writes beside the primary fenced by its agent, and
//!    the primary's agent asked for the synchronous setting (what the status says of it
//!    waits for its answer), then the replicas' agents;
//! 1. the Secrets the members mount (credentials, the authority, the TLS and agent
//!    certificates) and cert-manager's Certificate, before anything that mounts them
//!    (keys are added to the credentials, and the application's login made from them,
//!    as the credentials are read then: a value written meanwhile is never replaced);
//! 2. the children (ConfigMaps, Services, the StatefulSet, disruption budgets), applied
//!    where they differ from what the cache holds;
//! 3. member volume claims grown to the spec;
//! 4. the Jobs and the volumes they need, made when absent, in the order decided;
//! 5. role labels on the members;
//! 6. the one member restart of a roll (a fenced member fenced again first);
//! 7. the replicas moved off a lost node: the volume claim, then the pod;
//! 8. the Jobs retention removes;
//! 9. the backups and archived log retention removes from the bucket;
//! 10. the switchover request removed, done or refused;
//! 11. the Events, in the order decided;
//!
//! then the caller writes the status, once: the old status with what the stages told
//! ([`Told`], which the plan keeps beside its writes) and what carrying out found
//! ([`Carried`]). A pass that fails part way sets the finalizer, sends the Events of
//! what it already did, and, when it promoted a member (which is not undone), writes the
//! status's primary: nothing else; a second primary it found is fenced all the same. The next pass decides the rest again from what it
//! finds, and finds the new primary leading.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::bucket;
use super::members::Observed;
use super::status::{ConditionType, Growth, Reason, Told};
use super::{Context, Error, apply, event_about, replication, secrets};
use crate::build::{Child, Kind};
use crate::crd::Database;
use crate::names::{MANAGER, Names, ROLE_LABEL};
use crate::plugin::ApplicationLogin;
use crate::tls;

/// The writes a pass decided, not yet carried out.
#[derive(Default)]
pub(super) struct Plan {
    /// The finalizer: whether the Database should have it.
    finalizer: Option<bool>,
    /// Members that take writes beside the primary, fenced by their agents.
    fences: Vec<Observed>,
    /// The synchronous setting the agents are asked for.
    synchronous: Option<replication::Step>,
    /// Secrets (and cert-manager's Certificate) written, in order.
    secrets: Vec<SecretWrite>,
    /// The Database's authority when this pass made it: what else the pass issues is
    /// issued by it.
    authority: Option<tls::Authority>,
    /// Applied where they differ, in order.
    applied: Vec<Child>,
    /// Member volume claims grown, and the size each is grown to.
    grown: Vec<(String, String)>,
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
    /// What retention removes from the bucket, and what the Event says of it.
    pruned: Option<(bucket::Opened, bucket::Removal, String)>,
    /// The switchover request removed, while it still names this member.
    request_done: Option<String>,
    /// Events, in the order decided.
    events: Vec<Said>,
    /// The member this pass promoted: the status says it leads even when the pass fails
    /// after the promotion, which is not undone.
    promoted: Option<String>,
    /// What the status says, as the stages decided it (the caller writes the status).
    pub(super) told: Told,
}

/// A write of a Secret the members mount, or of what issues one.
pub(super) enum SecretWrite {
    /// Made; one that exists meanwhile is kept when it is the Database's (the cache was
    /// behind a pass that made it).
    Make(Secret),
    /// The Database's authority made: one that appeared meanwhile fails the pass, since
    /// what this pass issued from its own would not verify.
    MakeAuthority(Secret),
    /// Keys added to Secret `name`, those it still lacks as it is read then, by a merge
    /// patch that carries the version read: a value written meanwhile is never replaced.
    AddKeys { name: String, missing: BTreeMap<String, ByteString> },
    /// The application's login made ([`secrets::application`]) with the password the
    /// credentials Secret holds as the writes before it left it (read when they did not
    /// write it); not yet while it lacks the key.
    Application { login: ApplicationLogin, port: u16 },
    /// Applied whole.
    Apply(Secret),
    /// cert-manager's Certificate applied.
    ApplyCertificate { name: String, object: Value },
    /// A certificate cert-manager issued, left behind when `issuerRef` is removed: its
    /// Certificate (when there is one) goes first, or it would write the Secret again.
    Reclaim { name: String, certificate: bool },
}

/// What carrying out the plan found that the status says.
#[derive(Debug, Default)]
pub(super) struct Carried {
    /// The API server refused to grow a claim: why.
    pub grow_refused: Option<String>,
    /// Retention could not remove from the bucket: why.
    pub prune_failed: Option<String>,
    /// What the status says once the agents did what they were asked.
    pub said: Vec<super::decide::Note>,
    /// When to look again, for what was not done.
    pub look_again: Option<std::time::Duration>,
}

impl Carried {
    /// How growing the volumes stands, given what the stage found (`found`).
    pub(super) fn growth(&self, found: Growth) -> Growth {
        self.grow_refused.clone().map(Growth::Failed).unwrap_or(found)
    }

    /// Tells the status what carrying out found, over what the stages `told` of the `old`
    /// status: a bucket retention could not prune is a backup problem, and the window it
    /// holds is unconfirmed.
    pub(super) fn tell(&self, told: &mut Told, old: &crate::crd::DatabaseStatus) {
        for note in &self.said {
            if let Some((condition, ok)) = note.condition {
                told.set(condition, ok, note.reason, note.message.clone());
            }
        }
        if let Some(problem) = &self.prune_failed {
            told.set(ConditionType::BackupHealthy, false, Reason::BackupProblem, problem.clone());
            if let Some(backups) = told.backups.as_mut() {
                backups.recoverable = bucket::unreachable(old.recoverable.as_ref(), chrono::Utc::now());
            }
        }
    }
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
    /// Adds the finalizer (`present`) or removes it, unless the Database is so already.
    pub(super) fn finalizer(&mut self, present: bool) {
        self.finalizer = Some(present);
    }

    /// Has the agent of `member`, a second primary, fence it.
    pub(super) fn fence(&mut self, member: Observed) {
        self.fences.push(member);
    }

    /// Asks the agents for a synchronous setting.
    pub(super) fn synchronous(&mut self, step: replication::Step) {
        self.synchronous = Some(step);
    }

    /// Removes the switchover request, while it still asks for `target`.
    pub(super) fn drop_request(&mut self, target: String) {
        self.request_done = Some(target);
    }

    /// Writes a Secret the members mount (or what issues one).
    pub(super) fn secret(&mut self, write: SecretWrite) {
        self.secrets.push(write);
    }

    /// The authority this pass made, if it made one.
    pub(super) fn authority(&self) -> Option<&tls::Authority> {
        self.authority.as_ref()
    }

    /// Makes the Database's authority (`secret` holds it).
    pub(super) fn make_authority(&mut self, authority: tls::Authority, secret: Secret) {
        self.authority = Some(authority);
        self.secrets.push(SecretWrite::MakeAuthority(secret));
    }

    /// Grows member volume claim `claim` to `size`.
    pub(super) fn grow(&mut self, claim: String, size: String) {
        self.grown.push((claim, size));
    }

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

    /// Removes `removal` from the `opened` bucket; `message` says what, once it is done.
    pub(super) fn prune(&mut self, opened: bucket::Opened, removal: bucket::Removal, message: String) {
        self.pruned = Some((opened, removal, message));
    }

    /// Member `pod` was promoted: it leads now, whatever else the pass does.
    pub(super) fn promoted(&mut self, pod: String) {
        self.told.primary = Some(pod.clone());
        self.promoted = Some(pod);
    }

    /// Sends an Event about the Database (`about`: a related object, such as a member).
    pub(super) fn tell(&mut self, about: Option<ObjectReference>, warning: bool, reason: Reason, note: String) {
        self.events.push(Said { about, warning, reason, note });
    }

    /// Carries the plan out, in the order the module gives. A write that fails ends it
    /// as [`Plan::after_failure`] says.
    pub(super) async fn carry_out(mut self, ctx: &Context, db: &Database) -> Result<Carried, Error> {
        let mut carried = Carried::default();
        let written = self.write(ctx, db, &mut carried).await;
        match written {
            Ok(()) => self.tell_all(ctx, db).await,
            Err(_) => self.failed(ctx, db).await,
        }
        written.map(|()| carried)
    }

    /// The writes, in order; what they found that the status and the Events say goes in
    /// `carried` and the Events.
    async fn write(&mut self, ctx: &Context, db: &Database, carried: &mut Carried) -> Result<(), Error> {
        let ns = db.namespace().unwrap_or_default();
        if let Some(present) = self.finalizer {
            super::set_finalizer(ctx, db, present).await?;
        }
        for member in std::mem::take(&mut self.fences) {
            super::agent::fence(ctx, db, Some(&member)).await?;
        }
        if let Some(step) = self.synchronous.take() {
            match synchronous(ctx, db, step).await? {
                Some(note) => {
                    if let Some(warning) = note.sent(db.status.as_ref()) {
                        self.tell(None, warning, note.reason, note.message.clone());
                    }
                    carried.said.push(note);
                }
                // Not done: the condition stays, and the primary's agent is asked again soon.
                None => carried.look_again = Some(super::decide::ASK_AGAIN),
            }
        }
        // The credentials Secret as a write before left it.
        let mut credentials = None;
        for write in &self.secrets {
            if let Some(written) = write_secret(ctx, db, write, credentials.take()).await? {
                credentials = Some(written);
            }
        }
        for child in &self.applied {
            apply::apply(ctx, db, child).await?;
        }
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
        for (claim, size) in std::mem::take(&mut self.grown) {
            let patch = Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": size}}}}));
            match claims.patch(&claim, &PatchParams::default(), &patch).await {
                Ok(_) => {}
                // Refused (a storage class that cannot expand, a quota): said, and tried
                // again on later passes.
                Err(kube::Error::Api(e)) if (400..500).contains(&e.code) => {
                    let refused = format!("claim {claim} cannot grow to {size}: {}", e.message);
                    if !super::status::says(db.status.as_ref(), None, Some(Reason::VolumeGrowFailed), Some(&refused)) {
                        self.tell(None, true, Reason::VolumeGrowFailed, refused.clone());
                    }
                    carried.grow_refused = Some(refused);
                    break;
                }
                Err(e) => return Err(e.into()),
            }
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
        if let Some((opened, removal, message)) = self.pruned.take() {
            match bucket::remove(&opened, &removal).await {
                Ok(()) => self.tell(None, false, Reason::BackupsPruned, message),
                Err(e) => carried.prune_failed = Some(format!("spec.backup.s3: retention: {e}")),
            }
        }
        if let Some(target) = self.request_done.take() {
            super::handover::remove_request(ctx, db, &target).await;
        }
        Ok(())
    }

    /// What a pass whose stage failed part way still carries out: the finalizer and the
    /// fence of a second primary, then what [`Plan::failed`] says.
    pub(super) async fn after_failure(self, ctx: &Context, db: &Database) {
        if let Some(present) = self.finalizer
            && let Err(e) = super::set_finalizer(ctx, db, present).await
        {
            tracing::warn!(error = %e, "could not set the finalizer");
        }
        for member in &self.fences {
            if let Err(e) = super::agent::fence(ctx, db, Some(member)).await {
                tracing::warn!(error = %e, member = %member.name, "could not fence a second primary");
            }
        }
        self.failed(ctx, db).await;
    }

    /// What a pass that failed still says: the Events of what it already did, and, when
    /// it promoted a member, that the member leads (the status's primary, nothing else).
    async fn failed(mut self, ctx: &Context, db: &Database) {
        let promoted = self.promoted.take();
        self.tell_all(ctx, db).await;
        let db = ctx.freshest(std::sync::Arc::new(db.clone()));
        let old = db.status.clone().unwrap_or_default();
        if let Some(primary) = promoted.filter(|p| old.primary.as_ref() != Some(p)) {
            let status = crate::crd::DatabaseStatus { primary: Some(primary), ..old };
            if let Err(e) = super::write_status(ctx, &db, status).await {
                tracing::warn!(error = %e, "could not record the new primary in the status");
            }
        }
    }

    /// Sends the Events only.
    async fn tell_all(self, ctx: &Context, db: &Database) {
        for said in self.events {
            event_about(ctx, db, said.about, said.warning, said.reason, said.note).await;
        }
    }
}

/// Asks the agents for the synchronous setting of `step`: the primary's first; only once
/// it did what it was asked (or was not asked) are the replicas told, and the note said.
async fn synchronous(ctx: &Context, db: &Database, step: replication::Step) -> Result<Option<super::decide::Note>, Error> {
    if let Some((leader, setting)) = &step.leader
        && !super::agent::synchronous(ctx, db, std::slice::from_ref(leader), setting).await?.contains(&true)
    {
        // Not done (its agent did not answer, or failed): the condition stays.
        return Ok(None);
    }
    if let Some(setting) = step.named.as_ref().filter(|_| !step.replicas.is_empty()) {
        super::agent::synchronous(ctx, db, &step.replicas, setting).await?;
    }
    Ok(Some(step.note))
}

/// A reference to member `pod` of `pods`, for an Event about it.
pub(super) fn member_ref(pods: &[std::sync::Arc<Pod>], pod: &str) -> Option<ObjectReference> {
    pods.iter().find(|p| p.name_any() == pod).map(|p| p.object_ref(&()))
}

/// Carries out `write`; `credentials`: the credentials Secret as a write before left it.
/// Returns the credentials Secret as this write leaves it, when it wrote it (or found it
/// made), else `credentials`.
async fn write_secret(ctx: &Context, db: &Database, write: &SecretWrite, credentials: Option<Secret>) -> Result<Option<Secret>, Error> {
    let ns = db.namespace().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let apply = PatchParams::apply(MANAGER).force();
    // Each Secret written whole carries plugdb's stamp ([`crate::stamp`]); keys added
    // carry theirs in the patch.
    let stamper = ctx.caches.stamper();
    let credentials_name = Names(&db.name_any()).credentials();
    match write {
        SecretWrite::Make(secret) => {
            let made = match api.create(&apply::post_params(), &stamper.stamped(secret.clone())).await {
                Ok(made) => Some(made),
                // Made a moment ago by another pass, or not plugdb's: used only when it is the
                // Database's (or kept for a Database of its name).
                Err(kube::Error::Api(e)) if e.code == 409 => apply::own_secret(ctx, db, api.get_opt(&secret.name_any()).await?)?,
                Err(e) => return Err(e.into()),
            };
            return Ok(if secret.name_any() == credentials_name { made } else { credentials });
        }
        SecretWrite::MakeAuthority(secret) => match api.create(&apply::post_params(), &stamper.stamped(secret.clone())).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let name = secret.name_any();
                apply::own_secret(ctx, db, api.get_opt(&name).await?)?;
                return Err(Error::Tls(format!("Secret {ns}/{name} was made by another pass meanwhile; tried again")));
            }
            Err(e) => return Err(e.into()),
        },
        SecretWrite::AddKeys { name, missing } => {
            let Some(mut live) = apply::own_secret(ctx, db, api.get_opt(name).await?)? else { return Ok(credentials) };
            let mut missing = missing.clone();
            missing.retain(|k, _| !live.data.as_ref().is_some_and(|d| d.contains_key(k)));
            if !missing.is_empty() {
                // Add only the missing keys; a merge patch leaves the others as they are,
                // and the resourceVersion makes it fail if the Secret changed since it was
                // read. The stamp covers the keys added ([`crate::stamp`]).
                let stamp = stamper.stamp_with(&live, &missing);
                let metadata = json!({"resourceVersion": live.resource_version(), "annotations": {crate::stamp::STAMP: stamp}});
                let patch = json!({"metadata": metadata, "data": missing});
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                live.data.get_or_insert_default().extend(missing);
            }
            return Ok(if *name == credentials_name { Some(live) } else { credentials });
        }
        SecretWrite::Application { login, port } => {
            let credentials = match credentials {
                Some(written) => Some(written),
                None => apply::own_secret(ctx, db, api.get_opt(&credentials_name).await?)?,
            };
            let password = credentials.as_ref().and_then(|s| s.data.as_ref()?.get(&login.password_key));
            let Some(password) = password.and_then(|p| String::from_utf8(p.0.clone()).ok()) else { return Ok(credentials) };
            let secret = secrets::application(db, login, *port, password);
            match api.create(&apply::post_params(), &stamper.stamped(secret)).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    _ = apply::own_secret(ctx, db, api.get_opt(&Names(&db.name_any()).application()).await?)?
                }
                Err(e) => return Err(e.into()),
            }
            return Ok(credentials);
        }
        SecretWrite::Apply(secret) => _ = api.patch(&secret.name_any(), &apply, &Patch::Apply(stamper.stamped(secret.clone()))).await?,
        SecretWrite::ApplyCertificate { name, object } => {
            let certificates: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &apply::certificate_resource());
            certificates.patch(name, &apply, &Patch::Apply(object)).await?;
        }
        SecretWrite::Reclaim { name, certificate } => {
            if *certificate {
                let certificates: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &apply::certificate_resource());
                ignore_missing(certificates.delete(name, &DeleteParams::default()).await.map(|_| ()))?;
            }
            ignore_missing(api.delete(name, &DeleteParams::default()).await.map(|_| ()))?;
        }
    }
    Ok(credentials)
}

/// One already gone is no error.
fn ignore_missing(result: Result<(), kube::Error>) -> Result<(), Error> {
    match result {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => Ok(other?),
    }
}
