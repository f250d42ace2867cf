//! Tier 4: two operators against one control plane. Only the lease holder reconciles;
//! when it dies without letting go, the other takes over once the lease runs out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use plugdb::crd::Database;
use plugdb::health::Health;
use plugdb::metrics::Metrics;
use plugdb::operator::{self, Options};
use plugdb_tests::ControlPlane;
use plugdb_tests::operator::{OPERATOR_NAMESPACE, counting_client, counting_client_via, prepare, test_settings};
use plugdb_tests::proxy::Proxy;
use serde_json::json;

const LEASE: Duration = Duration::from_secs(3);

async fn holder(client: &Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    leases.get_opt("plugdb-leader").await.ok().flatten()?.spec?.holder_identity
}

async fn wait_for(what: &str, timeout: Duration, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn options(identity: &str) -> Options {
    Options { identity: Some(identity.into()), lease_duration: LEASE, settings: test_settings(), ..Default::default() }
}

/// Whether a leader reconciled the current spec: status written for its generation
/// and the StatefulSet sized for `replicas` (no node runs the Pods on this tier).
async fn reconciled(dbs: &Api<Database>, replicas: i32) -> bool {
    let Some(db) = dbs.get_opt("orders").await.ok().flatten() else { return false };
    let current = db.status.as_ref().is_some_and(|s| s.observed_generation == db.metadata.generation && s.primary.is_some());
    let sts: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(dbs.clone().into_client(), "default");
    let sized = sts.get_opt("orders").await.ok().flatten().and_then(|s| s.spec).and_then(|s| s.replicas) == Some(replicas);
    current && sized
}

fn db(replicas: i32) -> serde_json::Value {
    json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": "orders"},
           "spec": {"engine": "postgres", "replicas": replicas, "storage": "1Gi"}})
}

#[tokio::test]
async fn only_the_leader_writes_and_a_follower_takes_over_when_it_dies() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("postgres", "postgres")]).await.expect("CRD and plugins");
    let (client_a, writes_a) = counting_client(&cp.kubeconfig).await.expect("client a");
    let (client_b, writes_b) = counting_client(&cp.kubeconfig).await.expect("client b");

    let a = tokio::spawn(operator::run(
        client_a,
        Arc::new(Metrics::default()),
        options("replica-a"),
        Health::elected(LEASE),
        std::future::pending(),
    ));
    wait_for("replica-a leads", Duration::from_secs(30), async || holder(&cp.client).await.as_deref() == Some("replica-a")).await;
    let (stop_b, stopped_b) = tokio::sync::oneshot::channel::<()>();
    let b = tokio::spawn(operator::run(client_b, Arc::new(Metrics::default()), options("replica-b"), Health::elected(LEASE), async move {
        let _ = stopped_b.await;
    }));

    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    dbs.patch("orders", &kube::api::PatchParams::apply("test"), &kube::api::Patch::Apply(&db(1))).await.expect("database");
    wait_for("reconciled under replica-a", Duration::from_secs(60), async || reconciled(&dbs, 1).await).await;
    assert_eq!(writes_b.writes(), 0, "the follower wrote nothing");
    assert!(writes_a.writes() > 0, "the leader did the work");

    // replica-a dies without releasing the lease.
    a.abort();
    let _ = a.await;
    let a_writes = writes_a.writes();
    let died = Instant::now();
    wait_for("replica-b takes the lease", LEASE * 4, async || holder(&cp.client).await.as_deref() == Some("replica-b")).await;
    let took_over = died.elapsed();
    assert!(took_over <= LEASE * 2, "took over after {took_over:?}, lease is {LEASE:?}");

    dbs.patch("orders", &kube::api::PatchParams::apply("test"), &kube::api::Patch::Apply(&db(2))).await.expect("scale");
    wait_for("2 members under replica-b", Duration::from_secs(60), async || reconciled(&dbs, 2).await).await;
    assert!(writes_b.writes() > 0, "the new leader reconciles");
    assert_eq!(writes_a.writes(), a_writes, "the dead leader writes nothing more");
    let screen = status_screen(&cp);
    let leading = format!("operator: replica-b (lease {OPERATOR_NAMESPACE}/plugdb-leader renewed ");
    assert!(screen.lines().any(|l| l.starts_with(&leading)), "{screen}");

    // A graceful stop releases the lease at once: no operator looks, and the screen says so.
    let _ = stop_b.send(());
    b.await.expect("join").expect("run");
    assert_eq!(holder(&cp.client).await, None);
    let screen = status_screen(&cp);
    assert!(
        screen.contains(
            "operator: none holds lease plugdb-leader: no operator looks (or it runs without leader election), this status may be stale"
        ),
        "{screen}"
    );
}

/// `plugdb status orders`, as a user runs it against the control plane.
fn status_screen(cp: &ControlPlane) -> String {
    let out = std::process::Command::new(plugdb_tests::plugdb_binary())
        .args(["status", "orders", "--namespace", "default"])
        .env("KUBECONFIG", &cp.kubeconfig)
        .output()
        .expect("plugdb status");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// When and how often each of two replicas acted as the leader, sampled every 10 ms.
#[derive(Default)]
struct Terms {
    /// (replica, started, stopped) for every term seen.
    seen: Vec<(&'static str, Instant, Option<Instant>)>,
}

impl Terms {
    fn sample(&mut self, replica: &'static str, leading: bool) {
        let open = self.seen.iter_mut().rev().find(|(r, _, stop)| *r == replica && stop.is_none());
        match (open, leading) {
            (None, true) => self.seen.push((replica, Instant::now(), None)),
            (Some(term), false) => term.2 = Some(Instant::now()),
            _ => {}
        }
    }

    /// Terms of different replicas that overlap.
    fn overlaps(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, a) in self.seen.iter().enumerate() {
            for b in &self.seen[i + 1..] {
                let (a_end, b_end) = (a.2.unwrap_or_else(Instant::now), b.2.unwrap_or_else(Instant::now));
                if a.0 != b.0 && a.1 < b_end && b.1 < a_end {
                    out.push(format!("{} and {} led at once", a.0, b.0));
                }
            }
        }
        out
    }
}

/// The API server becomes unreachable for one replica for three lease durations
/// (bytes stop flowing; nothing is refused). It stops acting within the renew
/// deadline but keeps running and says why; alone, it leads again when the API comes
/// back and reconciles what changed meanwhile. With a second replica, that one takes
/// over only after the first stopped, and the first then stands by: never two leaders.
#[tokio::test]
async fn an_api_outage_longer_than_the_lease_pauses_the_leader_and_never_makes_two() {
    let cp = ControlPlane::start().await.expect("control plane");
    prepare(&cp.client, &[("postgres", "postgres")]).await.expect("CRD and plugins");
    let upstream = cp.server.trim_start_matches("https://").to_string();
    let proxy = Proxy::start(&upstream).await.expect("proxy");
    let (client_a, writes_a) = counting_client_via(&cp.kubeconfig, &format!("https://{}", proxy.address)).await.expect("client a");
    let (client_b, _) = counting_client(&cp.kubeconfig).await.expect("client b");
    let (health_a, health_b) = (Health::elected(LEASE), Health::elected(LEASE));
    let terms = Arc::new(std::sync::Mutex::new(Terms::default()));
    let sampler = {
        let (terms, a, b) = (terms.clone(), health_a.clone(), health_b.clone());
        tokio::spawn(async move {
            loop {
                {
                    let mut t = terms.lock().expect("terms");
                    t.sample("replica-a", a.leading());
                    t.sample("replica-b", b.leading());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let a =
        tokio::spawn(operator::run(client_a, Arc::new(Metrics::default()), options("replica-a"), health_a.clone(), std::future::pending()));
    let dbs: Api<Database> = Api::namespaced(cp.client.clone(), "default");
    dbs.patch("orders", &kube::api::PatchParams::apply("test"), &kube::api::Patch::Apply(&db(1))).await.expect("database");
    wait_for("reconciled under replica-a", Duration::from_secs(60), async || reconciled(&dbs, 1).await).await;
    wait_for("replica-a is ready", Duration::from_secs(10), async || health_a.readiness() == Ok("leading".into())).await;

    // Alone: the outage pauses it; it keeps running and leads again afterwards.
    proxy.cut();
    let cut = Instant::now();
    wait_for("replica-a stops acting", LEASE * 3, async || !health_a.leading()).await;
    let stopped = cut.elapsed();
    assert!(stopped < LEASE, "stopped acting {stopped:?} into the outage, before the {LEASE:?} lease could run out");
    wait_for("replica-a says why it is not ready", LEASE * 3, async || health_a.readiness().is_err_and(|why| why.contains("not acting")))
        .await;
    dbs.patch("orders", &kube::api::PatchParams::apply("test"), &kube::api::Patch::Apply(&db(2))).await.expect("scale");
    tokio::time::sleep((LEASE * 3).saturating_sub(cut.elapsed())).await;
    assert!(!a.is_finished(), "the operator keeps running through the outage");
    assert!(health_a.liveness().is_ok(), "an outage is not a reason to be restarted: {:?}", health_a.liveness());
    proxy.restore();
    wait_for("replica-a leads again", Duration::from_secs(30), async || health_a.leading()).await;
    wait_for("the change made during the outage is reconciled", Duration::from_secs(60), async || reconciled(&dbs, 2).await).await;

    // With a second replica: it takes over only after the first stopped acting.
    let b =
        tokio::spawn(operator::run(client_b, Arc::new(Metrics::default()), options("replica-b"), health_b.clone(), std::future::pending()));
    wait_for("replica-b stands by", Duration::from_secs(30), async || health_b.readiness() == Ok("standing by for replica-a".into())).await;
    proxy.cut();
    wait_for("replica-b takes over", LEASE * 4, async || health_b.leading()).await;
    let writes_when_b_led = writes_a.writes();
    tokio::time::sleep(LEASE).await;
    proxy.restore();
    wait_for("replica-a stands by for replica-b", Duration::from_secs(30), async || {
        health_a.readiness() == Ok("standing by for replica-b".into())
    })
    .await;
    dbs.patch("orders", &kube::api::PatchParams::apply("test"), &kube::api::Patch::Apply(&db(3))).await.expect("scale");
    wait_for("reconciled under replica-b", Duration::from_secs(60), async || reconciled(&dbs, 3).await).await;
    assert_eq!(writes_a.writes(), writes_when_b_led, "replica-a wrote nothing once replica-b led");
    assert_eq!(holder(&cp.client).await.as_deref(), Some("replica-b"));
    sampler.abort();
    let terms = terms.lock().expect("terms");
    assert!(terms.overlaps().is_empty(), "{:?}", terms.overlaps());
    // a, paused, a again (a connection flushed after the outage may cost it one more
    // pause), then b for good.
    let led: Vec<&str> = terms.seen.iter().map(|t| t.0).collect();
    let (last, before) = led.split_last().expect("terms");
    assert!(*last == "replica-b" && before.len() >= 2 && before.iter().all(|r| *r == "replica-a"), "{led:?}");
    a.abort();
    b.abort();
}
