//! Fault injection: the `plugdb` binary, in a process of its own, is killed with
//! SIGKILL at random points of a Database's life and started again each time.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use plugdb::crd::Database;
use plugdb_tests::node::Nodes;
use plugdb_tests::operator::{Backing, Cluster, OPERATOR_NAMESPACE};
use plugdb_tests::scenario::{Engine, WAIT, database, is_running};
use serde_json::json;

const NS: &str = "fault-injection";
/// How many times the operator is killed over the sequence.
const KILLS: usize = 6;

/// A small deterministic generator (xorshift64*): the seed printed reproduces a run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// The operator binary, alone on the namespace; SIGKILLed when dropped.
struct Operator<'a> {
    node: &'a Nodes,
    child: Child,
    kills: usize,
}

impl<'a> Operator<'a> {
    fn start(node: &'a Nodes) -> Child {
        let mut command = Command::new(plugdb_tests::plugdb_binary());
        command
            .args(["run", "--no-leader-election", "--namespace", OPERATOR_NAMESPACE, "--watch-namespace", NS, "--listen", "127.0.0.1:0"])
            .env("KUBECONFIG", &node.kubeconfig)
            .env("RUST_LOG", "info,kube=warn");
        node.spawn_recorded("fault-operator", &mut command).expect("the operator binary starts")
    }

    /// SIGKILL (no chance to finish anything), then a fresh process.
    fn kill_and_restart(&mut self, why: &str) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
        self.kills += 1;
        eprintln!("{NS}: killed the operator ({why}); restarting");
        self.child = Self::start(self.node);
    }
}

impl Drop for Operator<'_> {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Restarts the shared in-process operator when the scenario ends, however it ends.
struct Resume<'a>(&'a Cluster);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        let _ = self.0.restart_operator();
    }
}

async fn wait(cluster: &Cluster, what: &str, check: impl Fn(&Database) -> bool) -> Database {
    cluster.wait_database(NS, "shop", what, WAIT, check).await.unwrap_or_else(|e| panic!("{e}"))
}

/// Create → scale → backup → upgrade → delete, a MariaDB Database, with the operator
/// killed (SIGKILL) at random moments after each step's change, `KILLS` times in all.
/// At the end of each step the Database has converged; before the deletion there is
/// exactly one of each child, the credentials Secret is the one first made, and every
/// backup Job ran as one Job (one uid per name, watched all along); the
/// deletion takes one final backup and keeps the volumes.
pub async fn killed_at_random_points(cluster: Arc<Cluster>) {
    let Backing::Node(node) = &cluster.backing else { panic!("this scenario needs the real node") };
    let seed = std::env::var("PLUGDB_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1) | 1
    });
    eprintln!("{NS}: seed {seed} (PLUGDB_FAULT_SEED={seed} reproduces the kill points)");
    let mut rng = Rng(seed);
    // Which steps are followed by a kill, and after how long (0-6 s).
    let mut plan: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for _ in 0..KILLS {
        plan.entry(rng.below(5) as usize).or_default().push(rng.below(6000));
    }

    cluster.stop_operator();
    let _resume = Resume(&cluster);
    let mut operator = Operator { node, child: Operator::start(node), kills: 0 };

    // Every Job uid ever seen per Job name, while the sequence runs.
    let jobs: Api<Job> = Api::namespaced(cluster.client.clone(), NS);
    let seen = Arc::new(std::sync::Mutex::new(BTreeMap::<String, BTreeSet<String>>::new()));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (jobs, seen, done) = (jobs.clone(), seen.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) && Arc::strong_count(&done) > 1 {
                for job in jobs.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
                    seen.lock().expect("seen").entry(job.name_any()).or_default().insert(job.uid().unwrap_or_default());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let yearly = json!({"backup": {"schedule": "0 0 1 1 *"}});
    let steps = ["create", "scale", "backup", "upgrade", "delete"];

    // 1. Create.
    cluster.apply_database(NS, database("shop", Engine::Mysql, "10.11", 1, yearly.clone())).await.expect("create");
    inject(&mut operator, &plan, 0, steps[0]).await;
    wait(&cluster, "1 member Ready", |d| is_running(d, 1)).await;
    let secrets: Api<Secret> = Api::namespaced(cluster.client.clone(), NS);
    let credentials = secrets.get("shop-credentials").await.expect("the credentials Secret");

    // 2. Scale.
    cluster.apply_database(NS, database("shop", Engine::Mysql, "10.11", 2, yearly.clone())).await.expect("scale");
    inject(&mut operator, &plan, 1, steps[1]).await;
    wait(&cluster, "2 members Ready", |d| is_running(d, 2)).await;

    // 3. Back up on request.
    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), NS);
    let annotate = json!({"metadata": {"annotations": {"plugdb.io/backup-now": "fault-1"}}});
    dbs.patch("shop", &PatchParams::default(), &Patch::Merge(&annotate)).await.expect("backup-now");
    inject(&mut operator, &plan, 2, steps[2]).await;
    wait(&cluster, "the requested backup", |d| {
        d.status.as_ref().is_some_and(|s| {
            s.backup_request.as_deref() == Some("fault-1") && s.last_backup.as_ref().is_some_and(|b| b.name.starts_with("shop-manual-"))
        })
    })
    .await;

    // 4. Upgrade 10.11 → 11.8: a pre-upgrade backup, then the members roll (each upgrades
    // its own system tables as it starts).
    cluster.apply_database(NS, database("shop", Engine::Mysql, "11.8", 2, yearly)).await.expect("upgrade");
    inject(&mut operator, &plan, 3, steps[3]).await;
    wait(&cluster, "upgraded to 11.8", |d| {
        d.status.as_ref().and_then(|s| s.current_version.as_deref()) == Some("11.8") && is_running(d, 2)
    })
    .await;

    // Exactly one of each child (two budgets: the primary's and the others'; two Secrets:
    // the credentials and the application's login); the
    // credentials survived every kill.
    let count = async |kind: &str| -> usize {
        let by_instance = ListParams::default().labels("app.kubernetes.io/instance=shop");
        let c = cluster.client.clone();
        match kind {
            "StatefulSet" => Api::<StatefulSet>::namespaced(c, NS).list(&by_instance).await.expect("list").items.len(),
            "Service" => Api::<Service>::namespaced(c, NS).list(&by_instance).await.expect("list").items.len(),
            "ConfigMap" => Api::<ConfigMap>::namespaced(c, NS).list(&by_instance).await.expect("list").items.len(),
            "PodDisruptionBudget" => Api::<PodDisruptionBudget>::namespaced(c, NS).list(&by_instance).await.expect("list").items.len(),
            "NetworkPolicy" => Api::<NetworkPolicy>::namespaced(c, NS).list(&by_instance).await.expect("list").items.len(),
            _ => Api::<Secret>::namespaced(c, NS).list(&by_instance).await.expect("list").items.len(),
        }
    };
    for (kind, expected) in
        [("StatefulSet", 1), ("Service", 3), ("ConfigMap", 1), ("PodDisruptionBudget", 2), ("NetworkPolicy", 1), ("Secret", 2)]
    {
        assert_eq!(count(kind).await, expected, "{kind}s of shop");
    }
    let now = secrets.get("shop-credentials").await.expect("the credentials Secret");
    assert_eq!(now.uid(), credentials.uid(), "the credentials Secret was never replaced");
    assert_eq!(now.data, credentials.data, "the credentials never changed");

    // 5. Delete under the default policy: one final backup, volumes kept.
    dbs.delete("shop", &DeleteParams::default()).await.expect("delete");
    inject(&mut operator, &plan, 4, steps[4]).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while dbs.get_opt("shop").await.expect("get").is_some() {
        assert!(tokio::time::Instant::now() < deadline, "shop was not deleted");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    done.store(true, Ordering::Relaxed);
    watcher.await.expect("job watcher");
    assert_eq!(operator.kills, KILLS, "every planned kill happened");

    let seen = seen.lock().expect("seen").clone();
    let twice: Vec<(&String, &BTreeSet<String>)> = seen.iter().filter(|(_, uids)| uids.len() > 1).collect();
    assert!(twice.is_empty(), "Jobs run more than once: {twice:?}");
    let started = |prefix: &str| seen.keys().filter(|n| n.starts_with(prefix)).count();
    assert_eq!(started("shop-manual-"), 1, "one backup for the request: {seen:?}");
    assert_eq!(started("shop-pre-"), 1, "one pre-upgrade backup: {seen:?}");
    assert_eq!(started("shop-final"), 1, "one final backup: {seen:?}");
    let claims = Api::<PersistentVolumeClaim>::namespaced(cluster.client.clone(), NS);
    for claim in ["data-shop-0", "data-shop-1"] {
        claims.get(claim).await.expect("the data volumes are kept under the default policy");
    }
}

/// The kills planned after `step`: each after its delay from the step's change (the
/// operator may be anywhere in its work: starting, reconciling, writing status).
async fn inject(operator: &mut Operator<'_>, plan: &BTreeMap<usize, Vec<u64>>, step: usize, name: &str) {
    for delay in plan.get(&step).into_iter().flatten() {
        tokio::time::sleep(Duration::from_millis(*delay)).await;
        operator.kill_and_restart(&format!("{delay} ms after the {name} step's change"));
    }
}
