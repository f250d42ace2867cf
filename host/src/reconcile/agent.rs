//! The member agents of a Database, from the operator's side: the questions the
//! failover, switchover and hear stages ask them, and what the operator keeps to ask them
//! ([`Agents`]): its own identity ([`tls::OperatorIdentity`], the same for every
//! Database) and each Database authority's certificate from Secret `<name>-agent` (which
//! [`super::secrets`] issues).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use super::apply::own_secret;
use super::decide::{Fenced, Setting};
use super::members::Observed;
use super::{Context, Error};
use crate::agent::{self, Answer, Request};
use crate::crd::Database;
use crate::names::Names;
use crate::plugin::MemberQuery;
use crate::tls;

/// What the operator keeps to ask each Database's agents: its own identity, each
/// Database authority's certificate as Secret `<name>-agent` had it at a version (read
/// once, not on every ask: the watch caches keep no Secret's values; the CA of
/// `<name>-tls`, which an elected leader's members are asked with, is kept the same way),
/// when it last asked for statuses, and what the primary a switchover fenced answered.
#[derive(Debug)]
pub struct Agents {
    identity: Arc<tls::OperatorIdentity>,
    client: Arc<[u8]>,
    pin: String,
    keys: Mutex<HashMap<String, Keys>>,
    asked: Mutex<HashMap<String, Instant>>,
    fences: Mutex<HashMap<String, (String, Fenced, Instant)>>,
    started: Instant,
}

/// How long what a primary fenced for a switchover answered is taken as its state: the
/// passes within it read the positions; one after it fences again.
pub const FENCE_KEPT: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Keys {
    version: String,
    ca: Arc<[u8]>,
}

impl Agents {
    /// Agents asked as `identity`.
    pub fn new(identity: tls::OperatorIdentity) -> Self {
        let client = identity.client_pem().into();
        let pin = agent::fingerprints(identity.authority.certificate.as_bytes()).into_iter().next().unwrap_or_default();
        let (keys, asked, fences) = (Mutex::default(), Mutex::default(), Mutex::default());
        Self { identity: Arc::new(identity), client, pin, keys, asked, fences, started: Instant::now() }
    }

    /// Keeps what the agent of `db`'s primary `pod`, fenced for a switchover, answered.
    pub fn keep_fence(&self, db: &Database, pod: &str, fenced: Fenced) {
        self.fences.lock().unwrap_or_else(|e| e.into_inner()).insert(key(db), (pod.into(), fenced, Instant::now()));
    }

    /// What the agent of `db`'s primary `pod` answered when fenced for a switchover, within
    /// the last [`FENCE_KEPT`].
    pub fn fence_said(&self, db: &Database, pod: &str) -> Option<Fenced> {
        let fences = self.fences.lock().unwrap_or_else(|e| e.into_inner());
        fences.get(&key(db)).filter(|(p, _, at)| p == pod && at.elapsed() < FENCE_KEPT).map(|(_, fenced, _)| *fenced)
    }

    /// Forgets the fence of `db`'s switchover, which is over.
    pub fn forget_fence(&self, db: &Database) {
        self.fences.lock().unwrap_or_else(|e| e.into_inner()).remove(&key(db));
    }

    /// The fingerprint of the operator's authority, which the agents are told to trust
    /// ([`agent::Trust::clients`]).
    pub fn pin(&self) -> &str {
        &self.pin
    }

    /// The operator's identity, whose authority the agents trust for clients.
    pub fn identity(&self) -> Arc<tls::OperatorIdentity> {
        self.identity.clone()
    }

    /// Whether `db`'s agents are asked for their statuses again: `every` after the last
    /// time, or after this operator started (a restarted operator reads nothing at once).
    pub fn due(&self, db: &Database, every: Duration) -> bool {
        let asked = self.asked.lock().unwrap_or_else(|e| e.into_inner()).get(&key(db)).copied();
        asked.unwrap_or(self.started).elapsed() >= every
    }

    /// Forgets `db`, which is gone.
    pub fn forget(&self, db: &Database) {
        let names = Names(&db.name_any());
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        for secret in [names.agent(), names.tls()] {
            keys.remove(&secret_key(db, &secret));
        }
        drop(keys);
        self.asked.lock().unwrap_or_else(|e| e.into_inner()).remove(&key(db));
        self.forget_fence(db);
    }

    fn kept(&self, db: &Database, secret: &str, version: Option<&str>) -> Option<Arc<[u8]>> {
        let keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.get(&secret_key(db, secret)).filter(|k| Some(k.version.as_str()) == version).map(|k| k.ca.clone())
    }
}

fn key(db: &Database) -> String {
    format!("{}/{}", db.namespace().unwrap_or_default(), db.name_any())
}

fn secret_key(db: &Database, secret: &str) -> String {
    format!("{}/{secret}", db.namespace().unwrap_or_default())
}

/// The Database authority's certificate, which `db`'s agents serve theirs from (Secret
/// `<name>-agent`, plugdb's own).
async fn authority(ctx: &Context, db: &Database) -> Result<Option<Arc<[u8]>>, Error> {
    certificate_authority(ctx, db, &Names(&db.name_any()).agent(), true).await
}

/// The CA (`ca.crt`) of Secret `secret` of `db`'s namespace: kept while the Secret's
/// version is the one the cache has, else read (the watch caches keep no Secret's
/// values); `owned`: only a Secret that is the Database's own counts.
pub(super) async fn certificate_authority(ctx: &Context, db: &Database, secret: &str, owned: bool) -> Result<Option<Arc<[u8]>>, Error> {
    let version = ctx.caches.secret(db, secret).and_then(|s| s.metadata.resource_version.clone());
    if let Some(kept) = ctx.agents.kept(db, secret, version.as_deref()) {
        return Ok(Some(kept));
    }
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &db.namespace().unwrap_or_default());
    let read = api.get_opt(secret).await?;
    let Some(read) = (if owned { own_secret(ctx, db, read)? } else { read }) else { return Ok(None) };
    let version = read.metadata.resource_version.clone().unwrap_or_default();
    let ca: Arc<[u8]> = read.data.unwrap_or_default().remove(tls::CA).map(|b| b.0).unwrap_or_default().into();
    ctx.agents.keys.lock().unwrap_or_else(|e| e.into_inner()).insert(secret_key(db, secret), Keys { version, ca: ca.clone() });
    Ok(Some(ca))
}

/// What the agents of `members` answer to `request`, or why they did not, in their order.
/// Nothing is asked while the Database has no agent certificates.
async fn ask(ctx: &Context, db: &Database, request: Request<'_>, members: &[Observed]) -> Result<Vec<Result<String, String>>, Error> {
    ask_again(ctx, db, request, members, |_| false).await
}

/// [`ask`], and once more of the members that did not answer for which `again` holds.
async fn ask_again(
    ctx: &Context,
    db: &Database,
    request: Request<'_>,
    members: &[Observed],
    again: impl Fn(&Observed) -> bool,
) -> Result<Vec<Result<String, String>>, Error> {
    let Some(ca) = authority(ctx, db).await? else { return Ok(vec![Err("no agent certificates yet".into()); members.len()]) };
    let body = (request.method() == "POST").then(String::new);
    let query = &MemberQuery { port: agent::PORT, path: request.path(), body, https: true };
    let domain = format!("{}.{}.svc", Names(&db.name_any()).headless(), db.namespace().unwrap_or_default());
    let transport = || super::ask::Transport::Tls { ca: &ca, domain: &domain, identity: Some(&ctx.agents.client) };
    let mut said = super::ask::replies(transport(), query, members).await;
    let silent: Vec<usize> = (0..members.len()).filter(|&i| said[i].is_err() && again(&members[i])).collect();
    if !silent.is_empty() {
        let those: Vec<Observed> = silent.iter().map(|&i| members[i].clone()).collect();
        for (&i, answer) in silent.iter().zip(super::ask::replies(transport(), query, &those).await) {
            said[i] = answer;
        }
    }
    Ok(said)
}

/// What the agent of `member` answers to `request` (`None`: no answer, or not one that
/// says it did what it was asked).
async fn post(ctx: &Context, db: &Database, member: &Observed, request: Request<'_>) -> Result<Option<Answer>, Error> {
    let said = ask(ctx, db, request, std::slice::from_ref(member)).await?;
    Ok(said.into_iter().next().and_then(Result::ok).as_deref().and_then(Answer::parse))
}

/// Asks the agent of `member` to fence it (before another member is promoted).
pub async fn fence(ctx: &Context, db: &Database, member: Option<&Observed>) -> Result<Fenced, Error> {
    let Some(member) = member else { return Ok(Fenced::Unknown) };
    let fenced = match post(ctx, db, member, Request::Fence).await? {
        Some(Answer::Fenced) => Fenced::Confirmed,
        Some(Answer::Fencing) => Fenced::Ordered,
        _ => return Ok(Fenced::Unknown),
    };
    if !member.fenced {
        // Said on the pod: once another member leads, this one is restarted to follow.
        mark(ctx, db, &member.name, crate::names::FENCED, "true").await?;
    }
    Ok(fenced)
}

/// Has the engine of `member`, fenced but not confirmed ([`Fenced::Ordered`]), stopped by
/// its guard: [`Fenced::Stopped`] once confirmed, else still [`Fenced::Ordered`] (an
/// agent reached a moment ago that does not answer now, or that cannot stop its engine,
/// has not shown the engine takes no writes).
pub async fn stop(ctx: &Context, db: &Database, member: Option<&Observed>) -> Result<Fenced, Error> {
    let Some(member) = member else { return Ok(Fenced::Ordered) };
    let stopped = post(ctx, db, member, Request::Stop).await? == Some(Answer::Stopped);
    Ok(if stopped { Fenced::Stopped } else { Fenced::Ordered })
}

/// Annotates member pod `pod` with `annotation` (`value`): what its agent did to it.
async fn mark(ctx: &Context, db: &Database, pod: &str, annotation: &str, value: &str) -> Result<(), Error> {
    annotate(ctx, db, pod, serde_json::json!({annotation: value})).await
}

/// Sets (or, `null`, removes) `annotations` of member `pod`.
async fn annotate(ctx: &Context, db: &Database, pod: &str, annotations: serde_json::Value) -> Result<(), Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &db.namespace().unwrap_or_default());
    let mark = serde_json::json!({"metadata": {"annotations": annotations}});
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&mark)).await?;
    Ok(())
}

/// Asks the agent of `member`, chosen to lead in place of `replacing`, to promote it in
/// place; says whether it did. Its pod says so first, and when ([`crate::names::PROMOTED`],
/// [`crate::names::REPLACES`]): an operator stopped before it recorded the promotion
/// finds it, and a promoted member is not restarted to lead. Otherwise (no promote
/// command, no answer, a failure) the marks go, and it is promoted by its restart.
pub async fn promote(ctx: &Context, db: &Database, member: Option<&Observed>, replacing: &str) -> Result<bool, Error> {
    let Some(member) = member.filter(|m| !m.fenced) else { return Ok(false) };
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let marks = |promoted: Option<&str>, replaces: Option<&str>| serde_json::json!({crate::names::PROMOTED: promoted, crate::names::REPLACES: replaces});
    annotate(ctx, db, &member.name, marks(Some(&now), Some(replacing))).await?;
    let said = ask(ctx, db, Request::Promote, std::slice::from_ref(member)).await?.into_iter().next();
    if said.as_ref().and_then(|s| s.as_deref().ok()).and_then(Answer::parse) != Some(Answer::Promoted) {
        let database = format!("{}/{}", db.namespace().unwrap_or_default(), db.name_any());
        let said = match said {
            Some(Ok(s) | Err(s)) => crate::said::bounded(s.trim(), 512),
            None => String::new(),
        };
        tracing::warn!(%database, member = %member.name, %said, "not promoted in place: it restarts to lead");
        annotate(ctx, db, &member.name, marks(None, None)).await?;
        return Ok(false);
    }
    Ok(true)
}

/// Asks the agents of the other replicas, all but `primary`, just promoted, and `old`,
/// the primary before it, to have their members follow `primary` at once: a replica
/// streaming from a primary whose node was lost would otherwise hold on to it until its
/// own timeout, and synchronous commits wait for it. Each replica whose agent may answer
/// is asked (it has an address, on a node that answers, and is neither fenced nor being
/// deleted), ready or not: one that missed a readiness look on a busy node, or that had
/// stopped streaming from the lost primary, follows as well. Each that does is marked so
/// ([`crate::names::FOLLOWS`]): it is not restarted to follow `primary`. Says how many
/// did, of how many asked; one that does not finds the new primary on its own, and
/// restarts to follow it.
pub async fn follow(ctx: &Context, db: &Database, members: &[Observed], primary: &str, old: &str) -> Result<(usize, usize), Error> {
    let answers = |m: &&Observed| m.address.is_some() && !m.node_lost && !m.terminating && !m.fenced;
    let replicas: Vec<Observed> = members.iter().filter(|m| m.name != primary && m.name != old).filter(answers).cloned().collect();
    if replicas.is_empty() {
        return Ok((0, 0));
    }
    let said = ask(ctx, db, Request::Follow(primary), &replicas).await?;
    let mut following = 0;
    for (replica, _) in replicas.iter().zip(&said).filter(|(_, a)| a.as_deref().ok().and_then(Answer::parse) == Some(Answer::Following)) {
        mark(ctx, db, &replica.name, crate::names::FOLLOWS, primary).await?;
        following += 1;
    }
    let database = format!("{}/{}", db.namespace().unwrap_or_default(), db.name_any());
    tracing::info!(%database, %primary, following, of = replicas.len(), "replicas told to follow the new primary");
    Ok((following, replicas.len()))
}

/// Asks the agents of `members` to work as `setting` says: the primary's has each commit
/// wait for that many of the members named, and a replica's has it confirm commits only
/// when it is named (an engine whose primary cannot name them, MariaDB's, leaves it to
/// the replicas). Says which did, in the order of `members`. Each pod that did records
/// it ([`crate::names::SYNCHRONOUS`]) with its run ([`Observed::run`]): it is not asked
/// again until either changes (a restarted engine starts from its rendered configuration).
pub async fn synchronous(ctx: &Context, db: &Database, members: &[Observed], setting: &Setting) -> Result<Vec<bool>, Error> {
    let Ok(n) = u8::try_from(setting.replicas) else { return Ok(vec![false; members.len()]) };
    let named = setting.members.join(",");
    let said = ask(ctx, db, Request::Synchronous(n, &named), members).await?;
    let done: Vec<bool> = said.iter().map(|a| a.as_deref().ok().and_then(Answer::parse) == Some(Answer::Set)).collect();
    let database = format!("{}/{}", db.namespace().unwrap_or_default(), db.name_any());
    for (member, _) in members.iter().zip(&done).filter(|(_, done)| **done) {
        let told = format!("{}@{}", setting.key(), member.run.as_deref().unwrap_or_default());
        mark(ctx, db, &member.name, crate::names::SYNCHRONOUS, &told).await?;
        tracing::info!(%database, member = %member.name, replicas = n, members = %named, "told how many replicas confirm each commit (of those members, when named)");
    }
    Ok(done)
}

/// What the agents said (as [`statuses`] gives it), by pod, for those that said something.
pub fn by_pod(members: &[Observed], said: &[Option<agent::Status>]) -> Vec<(String, agent::Status)> {
    members.iter().zip(said).filter_map(|(m, s)| Some((m.name.clone(), s.clone()?))).collect()
}

/// What each member's agent says of it, in the order of `members`: `None` for a member
/// without an agent, one that did not answer in time, or one whose answer is not a
/// status. A ready member whose agent did not answer is asked once more (a status
/// command that outlasted its bound on a busy node answers the next time: a failover
/// waits for every ready member's word), and named in the log when it still does not.
pub async fn statuses(ctx: &Context, db: &Database, members: &[Observed]) -> Result<Vec<Option<agent::Status>>, Error> {
    let database = format!("{}/{}", db.namespace().unwrap_or_default(), db.name_any());
    ctx.agents.asked.lock().unwrap_or_else(|e| e.into_inner()).insert(key(db), Instant::now());
    let expected = |m: &Observed| m.ready && !m.cut_off && !m.terminating;
    let answers = ask_again(ctx, db, Request::Status, members, expected).await?;
    Ok(members
        .iter()
        .zip(answers)
        .map(|(m, answer)| {
            let answer = answer.map_err(|e| {
                if expected(m) {
                    tracing::warn!(database = %database, member = %m.name, "the agent of a ready member gave no status, asked twice: {e}");
                }
            });
            let said = agent::parse(&answer.ok()?)
                .map_err(|e| tracing::warn!(database = %database, member = %m.name, "the agent's answer is not a status: {e}"));
            said.ok()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_are_asked_again_once_the_last_ask_is_old_and_not_at_start() {
        let db = |name: &str| {
            let mut db = Database::new(
                name,
                serde_json::from_value(serde_json::json!({"engine": "postgres", "version": "17", "storage": "1Gi"})).expect("spec"),
            );
            db.metadata.namespace = Some("shop".into());
            db
        };
        let agents = Agents::new(tls::OperatorIdentity::new(chrono::Utc::now()).expect("identity"));
        assert!(!agents.due(&db("orders"), Duration::from_secs(30)), "not at once after the operator starts");
        assert!(agents.due(&db("orders"), Duration::ZERO));
        agents.asked.lock().expect("lock").insert(key(&db("orders")), Instant::now() - Duration::from_secs(31));
        assert!(agents.due(&db("orders"), Duration::from_secs(30)), "31 s after the last ask");
        agents.asked.lock().expect("lock").insert(key(&db("orders")), Instant::now());
        assert!(!agents.due(&db("orders"), Duration::from_secs(30)));
        agents.forget(&db("orders"));
        assert!(agents.asked.lock().expect("lock").is_empty());
    }

    #[test]
    fn a_switchover_fence_is_kept_for_its_primary_a_while_and_then_forgotten() {
        let mut db =
            Database::new("orders", serde_json::from_value(serde_json::json!({"engine": "postgres", "storage": "1Gi"})).expect("spec"));
        db.metadata.namespace = Some("shop".into());
        let agents = Agents::new(tls::OperatorIdentity::new(chrono::Utc::now()).expect("identity"));
        assert_eq!(agents.fence_said(&db, "orders-0"), None);
        agents.keep_fence(&db, "orders-0", Fenced::Confirmed);
        assert_eq!(agents.fence_said(&db, "orders-0"), Some(Fenced::Confirmed));
        assert_eq!(agents.fence_said(&db, "orders-1"), None, "another member's");
        let old = Instant::now() - FENCE_KEPT;
        agents.fences.lock().expect("lock").insert(key(&db), ("orders-0".into(), Fenced::Confirmed, old));
        assert_eq!(agents.fence_said(&db, "orders-0"), None, "too old: fenced again");
        agents.keep_fence(&db, "orders-0", Fenced::Ordered);
        agents.forget_fence(&db);
        assert_eq!(agents.fence_said(&db, "orders-0"), None);
    }
}
