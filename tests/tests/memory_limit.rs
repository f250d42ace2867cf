//! Tier 4: the `plugdb` binary under its deployed memory limit (the Deployment's
//! `resources.limits.memory`), in a memory cgroup of its own, against a real API
//! server, while hostile plugins load and are called: a compile bomb, memory bombs,
//! aliased and oversized results, with as many postgres Databases in place as the
//! chart's default `expectedDatabases` (the count its memory limit is computed for). It
//! is never OOM-killed and a good engine keeps serving.

use std::path::PathBuf;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use plugdb::plugin::Limits;
use plugdb::plugin::registry::PLUGIN_LABEL;
use plugdb_tests::control_plane::{ControlPlane, Options};
use plugdb_tests::operator::{OPERATOR_NAMESPACE, prepare};

/// The Databases the chart's default memory limit is computed for: `expectedDatabases`
/// in its values.
fn expected_databases() -> usize {
    let text = std::fs::read_to_string(plugdb_tests::workspace_root().join("deploy/chart/plugdb/values.yaml")).expect("the chart's values");
    let values: serde_json::Value = yaml_serde::from_str(&text).expect("the chart's values as YAML");
    values["expectedDatabases"].as_u64().expect("expectedDatabases in the chart's values") as usize
}

/// The Deployment's memory limit, in bytes, as `deploy/plugdb.yaml` sets it.
fn deployed_limit() -> u64 {
    let text = std::fs::read_to_string(plugdb_tests::workspace_root().join("deploy/plugdb.yaml")).expect("deploy/plugdb.yaml");
    let limit = yaml_serde::Deserializer::from_str(&text)
        .filter_map(|doc| serde::Deserialize::deserialize(doc).ok())
        .find_map(|doc: serde_json::Value| {
            let container = doc.pointer("/spec/template/spec/containers/0")?;
            container.pointer("/resources/limits/memory")?.as_str().map(str::to_string)
        })
        .expect("a memory limit in the Deployment");
    let mib: u64 = limit.strip_suffix("Mi").and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{limit:?} is not in Mi"));
    mib << 20
}

/// A memory cgroup of its own, removed on drop (after the processes in it are stopped).
struct Cgroup(PathBuf);

impl Cgroup {
    fn create(limit: u64) -> Self {
        let dir = PathBuf::from(format!("/sys/fs/cgroup/memory/plugdb-test-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let cgroup = Self(dir);
        cgroup.write("memory.limit_in_bytes", &limit.to_string());
        cgroup
    }

    fn write(&self, file: &str, value: &str) {
        std::fs::write(self.0.join(file), value).unwrap_or_else(|e| panic!("writing {value} to {file}: {e}"));
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.0.join(file)).unwrap_or_else(|e| panic!("reading {file}: {e}"))
    }

    /// How many processes the kernel OOM-killed in this cgroup.
    fn oom_kills(&self) -> u64 {
        self.read("memory.oom_control").lines().find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok()).unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Compilers die with the operator; give them a moment to be reaped.
        for _ in 0..100 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove {}; processes left in it: {}", self.0.display(), self.read("cgroup.procs"));
    }
}

/// The operator process, killed by its PID on drop.
struct Operator(std::process::Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A postgres Database as the scale benchmark makes them.
fn postgres(name: &str) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "plugdb.io/v1alpha1", "kind": "Database",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"engine": "postgres", "version": "17", "replicas": 3, "storage": "10Gi",
                 "resources": {"limits": {"memory": "2Gi"}}, "parameters": {"max_connections": 200}},
    }))
    .expect("a Database")
}

fn database(name: &str, engine: &str, attack: Option<&str>) -> DynamicObject {
    let mut spec = serde_json::json!({"engine": engine, "version": "1", "replicas": 1, "storage": "1Gi"});
    if let Some(attack) = attack {
        spec["parameters"] = serde_json::json!({"attack": attack});
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "plugdb.io/v1alpha1", "kind": "Database",
        "metadata": {"name": name, "namespace": "default"}, "spec": spec,
    }))
    .expect("a Database")
}

#[tokio::test]
async fn the_operator_under_its_deployed_memory_limit_is_never_oom_killed_by_hostile_plugins() {
    let limit = deployed_limit();
    let cp = ControlPlane::start_with(Options { controller_manager: false, ..Default::default() }).await.expect("control plane");
    prepare(&cp.client, &[("minimal", "minimal"), ("hostile", "hostile"), ("postgres", "postgres")]).await.expect("CRD and plugins");

    let cgroup = Cgroup::create(limit);
    let child = std::process::Command::new(plugdb_tests::plugdb_binary())
        .args(["run", "--listen", "127.0.0.1:0", "--no-leader-election", "--namespace", OPERATOR_NAMESPACE])
        .env("KUBECONFIG", &cp.kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the operator");
    let mut operator = Operator(child);
    cgroup.write("cgroup.procs", &operator.0.id().to_string());

    // The Databases the limit is computed for, reconciled before the attack.
    let expected = expected_databases();
    let gvk = GroupVersionKind::gvk("plugdb.io", "v1alpha1", "Database");
    let dbs: Api<DynamicObject> = Api::namespaced_with(cp.client.clone(), "default", &ApiResource::from_gvk(&gvk));
    let creates = (0..expected).map(|i| {
        let dbs = dbs.clone();
        async move { dbs.create(&PostParams::default(), &postgres(&format!("pg-{i:04}"))).await.map(|_| ()) }
    });
    futures::stream::iter(creates).buffer_unordered(16).try_collect::<()>().await.expect("the postgres Databases");
    let judged = |db: &DynamicObject| db.data.pointer("/status/phase").and_then(|p| p.as_str()).is_some();
    let mut reconciled = 0;
    for _ in 0..600 {
        assert!(operator.0.try_wait().expect("the operator's status").is_none(), "the operator exited ({} OOM kills)", cgroup.oom_kills());
        reconciled = dbs.list(&ListParams::default()).await.expect("list Databases").items.iter().filter(|d| judged(d)).count();
        if reconciled == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(reconciled, expected, "every postgres Database reconciled");
    let before: u64 = cgroup.read("memory.max_usage_in_bytes").trim().parse().expect("a number");
    eprintln!("peak memory with {expected} Databases reconciled: {} MiB", before >> 20);

    // A compile bomb within the shape limits, beside the plugins.
    let bomb = plugdb_tests::bomb::component("branches", &Limits::default().shape);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    std::io::Write::write_all(&mut gz, &bomb).expect("gzip");
    let mut cm = plugdb_tests::operator::plugin_config_map("bomb", "minimal");
    cm.metadata.labels = Some([(PLUGIN_LABEL.to_string(), "bomb".to_string())].into());
    cm.binary_data = Some([("plugin.wasm.gz".to_string(), k8s_openapi::ByteString(gz.finish().expect("gzip")))].into());
    let cms: Api<ConfigMap> = Api::namespaced(cp.client.clone(), OPERATOR_NAMESPACE);
    cms.create(&PostParams::default(), &cm).await.expect("the bomb's ConfigMap");

    let attacks = ["memory", "memory", "memory", "memory", "alias", "alias", "huge", "memory"];
    for (i, attack) in attacks.iter().enumerate() {
        dbs.create(&PostParams::default(), &database(&format!("hostile-{i}"), "hostile", Some(attack))).await.expect("a hostile Database");
    }
    dbs.create(&PostParams::default(), &database("good", "minimal", None)).await.expect("the good Database");

    // The bomb is refused, the good engine serves, every Database is judged.
    let sts: Api<StatefulSet> = Api::namespaced(cp.client.clone(), "default");
    let events: Api<Event> = Api::namespaced(cp.client.clone(), OPERATOR_NAMESPACE);
    let (mut refused, mut served, mut phases) = (None, false, 0);
    for _ in 0..360 {
        assert!(operator.0.try_wait().expect("the operator's status").is_none(), "the operator exited ({} OOM kills)", cgroup.oom_kills());
        refused = events.list(&ListParams::default()).await.expect("events").items.into_iter().find_map(|e| {
            let about_bomb = e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("engine-bomb");
            (about_bomb && e.reason.as_deref() == Some("PluginRejected")).then(|| e.note.unwrap_or_default())
        });
        served = sts.get_opt("good").await.expect("get the StatefulSet").is_some();
        phases = dbs.list(&ListParams::default()).await.expect("list Databases").items.iter().filter(|d| judged(d)).count();
        if refused.is_some() && served && phases == expected + attacks.len() + 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let refused = refused.expect("the bomb is refused with a PluginRejected Event");
    assert!(refused.starts_with("too big to compile: "), "{refused}");
    assert!(served, "the good Database got its StatefulSet");
    assert_eq!(phases, expected + attacks.len() + 1, "every Database has a phase");
    // Hostile renders are retried: keep the operator under attack a while longer.
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(operator.0.try_wait().expect("the operator's status").is_none(), "the operator exited ({} OOM kills)", cgroup.oom_kills());
    let peak: u64 = cgroup.read("memory.max_usage_in_bytes").trim().parse().expect("a number");
    eprintln!("peak memory of the operator and its compilers: {} MiB of {} MiB", peak >> 20, limit >> 20);
    assert_eq!(cgroup.oom_kills(), 0, "processes OOM-killed in the operator's cgroup (peak {} MiB)", peak >> 20);
    drop(operator);
}
