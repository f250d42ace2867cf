//! Leader election on a `coordination.k8s.io` Lease, so that of several operator
//! replicas only one reconciles at a time. Holding the lease means renewing it;
//! a holder that stops renewing loses it once `duration` has passed.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};

/// One contender for the lease.
#[derive(Clone)]
pub struct LeaderElection {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
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
        Self { api: Api::namespaced(client, namespace), name: name.into(), identity: identity.into(), duration }
    }

    /// The identity this contender holds the lease under.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Acquires or renews the lease; `Ok(true)` when this contender holds it afterwards.
    pub async fn try_acquire(&self) -> Result<bool, kube::Error> {
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
                Ok(_) => Ok(true),
                Err(e) if conflict(&e) => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let ours = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let held = spec.holder_identity.as_deref().is_some_and(|h| !h.is_empty());
        let expires =
            spec.renew_time.as_ref().map(|t| t.0 + SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(seconds))));
        let expired = expires.is_none_or(|t| t < now);
        if held && !ours && !expired {
            return Ok(false);
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
            Ok(_) => Ok(true),
            Err(e) if conflict(&e) => Ok(false),
            Err(e) => Err(e),
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

    /// Waits until this contender holds the lease, retrying every `retry`.
    pub async fn acquire(&self, retry: Duration) {
        loop {
            match self.try_acquire().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "leader election: could not read or write the lease"),
            }
            tokio::time::sleep(retry).await;
        }
    }

    /// Renews every `every` while it can; returns when the lease is lost (another
    /// holder took it, or renewals failed for longer than the lease lasts).
    pub async fn keep(&self, every: Duration) {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(every).await;
            match self.try_acquire().await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: renewal failed");
                    if last_renewal.elapsed() >= self.duration {
                        return;
                    }
                }
            }
        }
    }
}
