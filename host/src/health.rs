//! What `/healthz` and `/readyz` say: the lease and the caches, as the operator sees
//! them. Liveness fails only when the operator is stuck (its lease loop stopped
//! trying), never for an API outage, which a restart would not fix.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The operator's own state, shared with the HTTP endpoints.
#[derive(Debug, Clone, Default)]
pub struct Health(Arc<Mutex<State>>);

#[derive(Debug, Default)]
struct State {
    /// Leader election is on, with this lease duration.
    lease: Option<Duration>,
    leading: bool,
    /// The holder this replica stands by for.
    following: Option<String>,
    /// Caches listed and plugins loaded in this term of leading.
    synced: bool,
    /// The last lease read or write that succeeded.
    contact: Option<Instant>,
    /// The last attempt to read or write the lease, and its error.
    attempt: Option<Instant>,
    problem: Option<String>,
}

impl Health {
    /// Health of an operator that elects a leader on a lease of `duration`.
    pub fn elected(duration: Duration) -> Self {
        Self(Arc::new(Mutex::new(State { lease: Some(duration), ..State::default() })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lease was read or written: this replica leads, or stands by for `holder`.
    pub fn lease_ok(&self, holder: Option<&str>) {
        let mut s = self.state();
        let now = Instant::now();
        (s.contact, s.attempt, s.problem) = (Some(now), Some(now), None);
        s.following = holder.map(str::to_string);
    }

    /// Reading or writing the lease failed.
    pub fn lease_failed(&self, problem: impl Into<String>) {
        let mut s = self.state();
        (s.attempt, s.problem) = (Some(Instant::now()), Some(problem.into()));
    }

    /// This replica starts or stops acting as the leader.
    pub fn set_leading(&self, leading: bool) {
        let mut s = self.state();
        s.leading = leading;
        s.synced &= leading;
        if leading {
            s.following = None;
        }
    }

    /// The leader's caches have listed and its plugins are loaded.
    pub fn set_synced(&self) {
        self.state().synced = true;
    }

    /// The last lease error, while it is not followed by a success.
    pub fn problem(&self) -> Option<String> {
        self.state().problem.clone()
    }

    /// Whether this replica acts as the leader now.
    pub fn leading(&self) -> bool {
        self.state().leading
    }

    /// `/readyz`: a leader whose caches are synced, or a follower that can see the
    /// lease. `Err` says why not.
    pub fn readiness(&self) -> Result<String, String> {
        let s = self.state();
        if let Some(lease) = s.lease {
            let silent = s.contact.map(|c| c.elapsed());
            if silent.is_none_or(|d| d > lease) {
                let since = silent.map(|d| format!(" for {}s", d.as_secs())).unwrap_or_default();
                let problem = s.problem.as_deref().unwrap_or("no answer yet");
                return Err(format!("cannot read the leader lease{since} ({problem}); not acting"));
            }
        }
        match (s.leading, s.synced, &s.following) {
            (true, true, _) => Ok("leading".into()),
            (true, false, _) => Err("leading; loading caches and plugins".into()),
            (false, _, Some(holder)) => Ok(format!("standing by for {holder}")),
            (false, _, None) => Err("not leading; waiting for the lease".into()),
        }
    }

    /// `/healthz`: fails only when the lease loop has stopped trying (the operator is
    /// stuck); an unreachable API server is reported, not fatal.
    pub fn liveness(&self) -> Result<String, String> {
        let s = self.state();
        if let (Some(lease), Some(attempt)) = (s.lease, s.attempt)
            && attempt.elapsed() > lease * 3
        {
            return Err(format!("the leader-election loop has not run for {}s", attempt.elapsed().as_secs()));
        }
        drop(s);
        Ok(self.readiness().unwrap_or_else(|why| format!("ok, not ready: {why}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_is_ready_once_synced_and_not_after_losing_the_api() {
        let health = Health::elected(Duration::from_millis(50));
        assert!(health.readiness().is_err(), "nothing read yet");
        health.lease_ok(Some("replica-b"));
        assert_eq!(health.readiness(), Ok("standing by for replica-b".into()));
        health.lease_ok(None);
        health.set_leading(true);
        assert!(health.readiness().is_err(), "caches not synced");
        health.set_synced();
        assert_eq!(health.readiness(), Ok("leading".into()));
        health.lease_failed("connection refused");
        std::thread::sleep(Duration::from_millis(60));
        let why = health.readiness().expect_err("silent for longer than the lease");
        assert!(why.contains("connection refused") && why.contains("not acting"), "{why}");
        assert!(health.liveness().is_ok(), "an outage is not fatal");
        std::thread::sleep(Duration::from_millis(150));
        assert!(health.liveness().is_err(), "a loop that stopped trying is");
    }

    #[test]
    fn without_election_readiness_is_the_caches() {
        let health = Health::default();
        health.set_leading(true);
        assert!(health.readiness().is_err());
        health.set_synced();
        assert!(health.readiness().is_ok() && health.liveness().is_ok());
    }
}
