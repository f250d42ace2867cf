//! Leader election on a `coordination.k8s.io` Lease, so that of several operator
//! replicas only one reconciles at a time. Holding the lease means renewing it; a
//! holder that cannot renew within the renew deadline (two thirds of the lease) stops
//! acting, and the others take over only after seeing the lease unchanged for a whole
//! lease duration on their own clocks: two leaders never act at once.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};

use crate::health::Health;

/// The name of the operator's lease, in its namespace: who holds it leads, and its
/// renewals say the operator is alive (`kubectl plugdb status` reads them).
pub const LEASE: &str = "plugdb-leader";

/// One contender for the lease.
#[derive(Clone)]
pub struct LeaderElection {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    /// Another holder's lease as last seen (its resourceVersion), and when this
    /// replica first saw that version: expiry is judged on this clock only.
    observed: Arc<Mutex<Option<(String, Instant)>>>,
}

/// Whether this contender holds the lease after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// It holds the lease.
    Leading,
    /// Another replica holds it.
    Following(String),
}

/// Why a leader stopped leading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// Another replica holds the lease.
    TakenBy(String),
    /// No renewal succeeded within the renew deadline.
    Unrenewed(String),
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lost::TakenBy(holder) => write!(f, "{holder} holds the lease"),
            Lost::Unrenewed(problem) => write!(f, "the lease could not be renewed in time ({problem})"),
        }
    }
}

impl std::fmt::Debug for LeaderElection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElection").field("lease", &self.name).field("identity", &self.identity).finish()
    }
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

impl LeaderElection {
    /// Contends for Lease `name` in `namespace` as `identity`.
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str, duration: Duration) -> Self {
        Self { api: Api::namespaced(client, namespace), name: name.into(), identity: identity.into(), duration, observed: Arc::default() }
    }

    /// How long a leader may go without a renewal before it stops acting.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }

    /// The identity this contender holds the lease under.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Acquires or renews the lease, or finds who holds it.
    pub async fn try_acquire(&self) -> Result<Attempt, kube::Error> {
        let now = Timestamp::now();
        let seconds = self.duration.as_secs().max(1) as i32;
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.name.clone()), ..Default::default() },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Leading),
                Err(e) if conflict(&e) => Ok(Attempt::Following(String::new())),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let ours = holder.as_deref() == Some(self.identity.as_str());
        if let Some(other) = holder.as_ref().filter(|_| !ours) {
            // Another holder's lease runs out once it has stayed unchanged for its
            // duration as this replica saw it; the clocks of the two never meet.
            let version = lease.metadata.resource_version.clone().unwrap_or_default();
            let duration = Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(seconds)).unwrap_or(1));
            let mut observed = self.observed.lock().unwrap_or_else(|e| e.into_inner());
            let since = match observed.as_ref() {
                Some((seen, at)) if *seen == version => *at,
                _ => observed.insert((version, Instant::now())).1,
            };
            if since.elapsed() < duration {
                return Ok(Attempt::Following(other.clone()));
            }
        }
        let mut next = lease.clone();
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!ours);
        next.spec = Some(LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(seconds),
            acquire_time: if ours { spec.acquire_time } else { Some(MicroTime(now)) },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..spec
        });
        // The resourceVersion makes this a compare-and-swap: of two contenders, one wins.
        match self.api.replace(&lease.name_any(), &PostParams::default(), &next).await {
            Ok(_) => Ok(Attempt::Leading),
            Err(e) if conflict(&e) => Ok(Attempt::Following(holder.unwrap_or_default())),
            Err(e) => Err(e),
        }
    }

    /// One attempt bounded by `limit`, reported to `health`.
    async fn attempt(&self, limit: Duration, health: &Health) -> Option<Attempt> {
        match tokio::time::timeout(limit, self.try_acquire()).await {
            Ok(Ok(attempt)) => {
                health.lease_ok(match &attempt {
                    Attempt::Leading => None,
                    Attempt::Following(holder) => Some(holder.as_str()),
                });
                Some(attempt)
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "leader election: could not read or write the lease");
                health.lease_failed(e.to_string());
                None
            }
            Err(_) => {
                tracing::warn!(timeout = ?limit, "leader election: the API server did not answer in time");
                health.lease_failed(format!("no answer within {limit:?}"));
                None
            }
        }
    }

    /// Gives the lease up, if held, so another replica takes over without waiting.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else { return };
        if lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) != Some(self.identity.as_str()) {
            return;
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
        }
        let _ = self.api.replace(&self.name, &PostParams::default(), &lease).await;
    }

    /// Waits until this contender holds the lease, trying every `retry`; returns when
    /// the successful attempt started (the lease counts from then).
    pub async fn acquire(&self, retry: Duration, health: &Health) -> Instant {
        loop {
            let started = Instant::now();
            if self.attempt(self.renew_deadline(), health).await == Some(Attempt::Leading) {
                return started;
            }
            tokio::time::sleep(retry).await;
        }
    }

    /// Renews every `every` after the renewal that started at `renewed`; returns when
    /// the lease is lost: another holder has it, or no renewal succeeded within the
    /// renew deadline. The caller must stop acting at once: the lease may run out for
    /// the others a third of its duration later.
    pub async fn keep(&self, every: Duration, mut renewed: Instant, health: &Health) -> Lost {
        loop {
            let left = self.renew_deadline().saturating_sub(renewed.elapsed());
            tokio::time::sleep(every.min(left)).await;
            let started = Instant::now();
            let left = self.renew_deadline().saturating_sub(renewed.elapsed());
            match self.attempt(left, health).await {
                Some(Attempt::Leading) => renewed = started,
                Some(Attempt::Following(holder)) => return Lost::TakenBy(holder),
                None if renewed.elapsed() >= self.renew_deadline() => {
                    return Lost::Unrenewed(health.problem().unwrap_or_else(|| "no answer".into()));
                }
                None => {}
            }
        }
    }
}
