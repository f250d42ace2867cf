//! A real database engine under test: how its members are started from what its
//! plugin renders, shared by the PostgreSQL and MariaDB tests.

use std::collections::BTreeMap;
use std::time::Duration;

use plugdb::plugin::{ClusterContext, EngineSpec, Limits, ParameterValue, Plugin, ResourceAmounts, Runtime};

use crate::local_pod::LocalPod;

/// Where the plugins' config files are "mounted".
pub const CONFIG_MOUNT: &str = "/etc/plugdb";

/// Test-only plumbing for one member: extra environment and extra arguments (PATH,
/// socket directories, the member's own loopback address).
pub type Plumbing = fn(&LocalPod) -> (Vec<(&'static str, String)>, Vec<String>);

/// An engine whose plugin's output runs on the real server installed here.
pub struct EngineUnderTest {
    /// Component built from `plugins/<component>`.
    pub component: &'static str,
    /// Engine version installed on this machine, in the plugin's terms.
    pub version: String,
    /// The plugin's data mount path.
    pub data_mount: &'static str,
    /// Credentials keys the plugin asks for.
    pub credential_keys: &'static [&'static str],
    /// Member plumbing.
    pub plumbing: Plumbing,
}

impl EngineUnderTest {
    /// The plugin, loaded in the real runtime.
    pub fn plugin(&self) -> Plugin {
        Runtime::new(Limits::default()).expect("runtime").load(&crate::component(self.component)).expect("the plugin loads")
    }

    /// A two-member spec named `name` with 1 GiB of memory and `parameters`.
    pub fn spec(&self, name: &str, parameters: Vec<(&str, ParameterValue)>) -> EngineSpec {
        EngineSpec {
            name: name.into(),
            namespace: "default".into(),
            version: self.version.clone(),
            replicas: 2,
            storage_bytes: 1 << 30,
            requests: ResourceAmounts::default(),
            limits: ResourceAmounts { cpu_millis: Some(1000), memory_bytes: Some(1 << 30) },
            parameters: parameters.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            tls: None,
            synchronous_replicas: 0,
        }
    }

    /// Credentials for a Database, distinct per `tag`.
    pub fn secrets(&self, tag: &str) -> BTreeMap<String, String> {
        self.credential_keys.iter().map(|k| (k.to_string(), format!("{k}-{tag}-Zq81xk3J"))).collect()
    }

    /// Starts member `ordinal` of `spec`, following `primary` (pod, address) when given,
    /// and waits for the plugin's readiness probe.
    pub fn start_member(
        &self,
        plugin: &Plugin,
        spec: &EngineSpec,
        ordinal: u32,
        primary: Option<(&str, &str)>,
        secrets: &BTreeMap<String, String>,
    ) -> LocalPod {
        let pod = LocalPod::new(&format!("{}-{ordinal}", spec.name), CONFIG_MOUNT, self.data_mount).expect("pod sandbox");
        self.run(pod, plugin, spec, primary, secrets, false)
    }

    /// Runs the rendered workload in `pod` (which may already hold data). With `archive`,
    /// it is rendered with the archive directory the operator gives members when their
    /// Database archives for point-in-time recovery ([`LocalPod::archive_dir`] stands in).
    pub fn run(
        &self,
        mut pod: LocalPod,
        plugin: &Plugin,
        spec: &EngineSpec,
        primary: Option<(&str, &str)>,
        secrets: &BTreeMap<String, String>,
        archive: bool,
    ) -> LocalPod {
        let (primary_pod, primary_host) =
            primary.map(|(p, h)| (p.to_string(), h.to_string())).unwrap_or((pod.name.clone(), pod.address.clone()));
        let cluster = ClusterContext {
            primary_host,
            headless_host: format!("{}-headless.default.svc", spec.name),
            primary_pod,
            credentials_secret: format!("{}-credentials", spec.name),
            config_mount_path: CONFIG_MOUNT.into(),
            archive_directory: archive.then(|| plugdb::names::ARCHIVE_MOUNT.into()),
            restoring: false,
        };
        let workload = plugin.render(spec, &cluster).expect("render");
        let (env, args) = (self.plumbing)(&pod);
        pod.set_env(&workload.env, secrets, &env).expect("env");
        pod.start(&workload, &args).expect("start");
        pod.wait_ready(&workload, Duration::from_secs(120)).expect("ready");
        pod
    }
}
