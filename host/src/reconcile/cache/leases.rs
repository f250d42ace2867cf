//! When each node's kubelet last renewed its Lease (namespace `kube-node-lease`). A
//! kubelet renews its lease every 10 s; one that has gone unrenewed for
//! [`SILENT_AFTER`] belongs to a node cut off from the control plane — long before the
//! node controller marks the node not ready, and its pods with it
//! (`node-monitor-grace-period`, 40–50 s). A primary there is then down since its
//! node's last renewal, and its failover is not held back by that grace period.
//!
//! A renewal counts from when the operator saw it, not from the time the kubelet wrote
//! in it: a node's clock may differ from the operator's. At start, every lease counts
//! as renewed when listed. While no node at all is seen renewing, none counts as silent:
//! what went quiet is the operator's view (a watch that stalls, a control plane too busy
//! to write or tell), not every node at once (as the node controller stops evicting
//! when every node of a zone goes not ready at once).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::runtime::watcher;

/// The namespace of the nodes' leases.
pub const NAMESPACE: &str = "kube-node-lease";

/// How long a node's lease may go unrenewed before the node counts as cut off: two of
/// its kubelet's renewals missed.
pub const SILENT_AFTER: Duration = Duration::from_secs(20);

/// A node's last lease renewal seen: the renew time it carried, and when it was seen.
type Renewal = (Option<String>, Instant);

/// Each node's last lease renewal seen.
#[derive(Clone, Default)]
pub struct Leases(Arc<RwLock<State>>);

#[derive(Default)]
struct State {
    /// By node.
    renewals: HashMap<String, Renewal>,
    /// During a relist, the nodes it has found so far (those it does not find go when it
    /// is done).
    relisted: Option<HashSet<String>>,
}

impl Leases {
    /// Takes in one event of the leases' watch, at `now`.
    pub fn apply(&self, event: &watcher::Event<Lease>, now: Instant) {
        let renewed = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.as_ref()).map(|t| t.0.to_string());
        let mut guard = self.0.write().unwrap_or_else(|e| e.into_inner());
        let State { renewals: map, relisted } = &mut *guard;
        match event {
            // A relist keeps what was seen of the leases it finds again.
            watcher::Event::Init => *relisted = Some(HashSet::new()),
            watcher::Event::InitApply(l) | watcher::Event::Apply(l) => {
                if let Some(found) = relisted.as_mut() {
                    found.insert(l.name_any());
                }
                let renew = renewed(l);
                let entry = map.entry(l.name_any()).or_insert((None, now));
                if entry.0 != renew {
                    *entry = (renew, now);
                }
            }
            watcher::Event::InitDone => {
                let found = relisted.take().unwrap_or_default();
                map.retain(|node, _| found.contains(node));
            }
            watcher::Event::Delete(l) => {
                map.remove(&l.name_any());
            }
        }
    }

    /// How long node `name` has been silent at `now`, once that is [`SILENT_AFTER`] or
    /// longer; `None` for a node renewing its lease, or one whose lease is not known.
    pub fn silent_for(&self, name: &str, now: Instant) -> Option<Duration> {
        let guard = self.0.read().unwrap_or_else(|e| e.into_inner());
        guard.renewals.get(name).filter(|_| guard.any_renewing(now)).and_then(|(_, seen)| silence(*seen, now))
    }

    /// The nodes silent at `now`.
    pub fn silent(&self, now: Instant) -> HashSet<String> {
        let guard = self.0.read().unwrap_or_else(|e| e.into_inner());
        let silent = guard.renewals.iter().filter(|(_, (_, seen))| silence(*seen, now).is_some());
        silent.filter(|_| guard.any_renewing(now)).map(|(n, _)| n.clone()).collect()
    }
}

impl State {
    /// Whether some node has been seen renewing its lease within [`SILENT_AFTER`] of `now`.
    fn any_renewing(&self, now: Instant) -> bool {
        self.renewals.values().any(|(_, seen)| silence(*seen, now).is_none())
    }
}

/// How long a node last seen renewing at `seen` has been silent at `now`, once it counts.
fn silence(seen: Instant, now: Instant) -> Option<Duration> {
    Some(now.saturating_duration_since(seen)).filter(|d| *d >= SILENT_AFTER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(node: &str, renewed: &str) -> Lease {
        let mut lease = Lease::default();
        lease.metadata.name = Some(node.into());
        lease.spec = Some(LeaseSpec { renew_time: Some(MicroTime(renewed.parse().expect("a time"))), ..Default::default() });
        lease
    }

    /// A node is silent once its lease has gone unrenewed for SILENT_AFTER as the
    /// operator saw it; an update that does not renew it (same renew time) changes
    /// nothing; a renewal ends the silence; a deleted lease is not known.
    #[test]
    fn a_node_is_silent_once_its_lease_goes_unrenewed() {
        let leases = Leases::default();
        let start = Instant::now();
        leases.apply(&watcher::Event::InitApply(lease("a", "2026-01-01T00:00:00Z")), start);
        leases.apply(&watcher::Event::InitApply(lease("b", "2026-01-01T00:00:00Z")), start);
        assert_eq!(leases.silent_for("a", start + Duration::from_secs(19)), None);
        let later = start + Duration::from_secs(15);
        leases.apply(&watcher::Event::Apply(lease("b", "2026-01-01T00:00:00Z")), later);
        leases.apply(&watcher::Event::Apply(lease("a", "2026-01-01T00:00:10Z")), later);
        let now = start + Duration::from_secs(25);
        assert_eq!(leases.silent_for("b", now), Some(Duration::from_secs(25)), "not renewed since it was listed");
        assert_eq!(leases.silent_for("a", now), None, "renewed 10 s ago");
        assert_eq!(leases.silent(now), HashSet::from(["b".to_string()]));
        leases.apply(&watcher::Event::Delete(lease("b", "2026-01-01T00:00:00Z")), now);
        assert_eq!(leases.silent_for("b", now), None);
        assert_eq!(leases.silent_for("c", now), None, "a node whose lease is not known");
        // A relist forgets the leases it no longer finds (deleted while the watch was down).
        leases.apply(&watcher::Event::Apply(lease("c", "2026-01-01T00:00:00Z")), start);
        leases.apply(&watcher::Event::Init, now);
        leases.apply(&watcher::Event::InitApply(lease("a", "2026-01-01T00:00:10Z")), now);
        leases.apply(&watcher::Event::InitApply(lease("d", "2026-01-01T00:00:10Z")), now);
        leases.apply(&watcher::Event::InitDone, now);
        let later = now + Duration::from_secs(30);
        leases.apply(&watcher::Event::Apply(lease("d", "2026-01-01T00:00:40Z")), later);
        assert_eq!(leases.silent(later), HashSet::from(["a".to_string()]), "c went with the relist");
    }

    /// While no node is seen renewing, none is silent: the operator's view went quiet.
    #[test]
    fn no_node_is_silent_while_none_is_seen_renewing() {
        let leases = Leases::default();
        let start = Instant::now();
        for node in ["a", "b", "c"] {
            leases.apply(&watcher::Event::InitApply(lease(node, "2026-01-01T00:00:00Z")), start);
        }
        let now = start + Duration::from_secs(25);
        assert_eq!((leases.silent_for("a", now), leases.silent(now)), (None, HashSet::new()), "every node at once: none");
        leases.apply(&watcher::Event::Apply(lease("b", "2026-01-01T00:00:20Z")), now);
        assert_eq!(leases.silent_for("a", now), Some(Duration::from_secs(25)), "another renews: a is silent");
        assert_eq!(leases.silent(now), HashSet::from(["a".to_string(), "c".to_string()]));
    }
}
