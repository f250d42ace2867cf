//! The one place that knows the generated bindings: WIT types in, host types out.

use super::types as host;

#[allow(missing_docs, clippy::all)]
pub(crate) mod wit {
    wasmtime::component::bindgen!({
        world: "engine",
        path: "../wit",
    });
}

use wit::plugdb::engine::types as w;

pub(crate) use w::LogLevel;
pub(crate) use wit::Engine as EngineWorld;
pub(crate) use wit::EnginePre as EngineWorldPre;
pub(crate) use wit::plugdb::engine::host::Host as HostImports;
pub(crate) use wit::plugdb::engine::types::Host as TypesImports;

use wasmtime::AsContextMut;
use wasmtime::component::{Component, ComponentExportIndex, ComponentNamedList, Instance, Lift, Lower};

/// Where each function of the contract sits in one plugin's component, found once at
/// load, after [`EngineWorldPre::new`] type-checked them all: a call then fetches and
/// checks just the function it runs, not all seven.
#[derive(Clone)]
pub(crate) struct Exports {
    info: ComponentExportIndex,
    validate: ComponentExportIndex,
    render: ComponentExportIndex,
    plan_upgrade: ComponentExportIndex,
    choose_primary: ComponentExportIndex,
    backup: ComponentExportIndex,
    restore: ComponentExportIndex,
}

impl Exports {
    /// The contract's functions in `component`, whose interface is exported as `interface`.
    pub(crate) fn find(component: &Component, interface: &str) -> Result<Self, String> {
        let (_, at) = component.get_export(None, interface).ok_or_else(|| format!("no export `{interface}`"))?;
        let index =
            |name: &str| component.get_export(Some(&at), name).map(|(_, i)| i).ok_or_else(|| format!("`{interface}` exports no `{name}`"));
        Ok(Self {
            info: index("info")?,
            validate: index("validate")?,
            render: index("render")?,
            plan_upgrade: index("plan-upgrade")?,
            choose_primary: index("choose-primary")?,
            backup: index("backup")?,
            restore: index("restore")?,
        })
    }

    pub(crate) fn info(&self, store: impl AsContextMut, instance: &Instance) -> wasmtime::Result<host::PluginInfo> {
        call::<(), (w::PluginInfo,)>(store, instance, &self.info, ()).map(|(i,)| i.into())
    }

    pub(crate) fn validate(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        spec: &host::EngineSpec,
    ) -> wasmtime::Result<Vec<host::Violation>> {
        let spec = w::DatabaseSpec::from(spec);
        call::<(&w::DatabaseSpec,), (Vec<w::Violation>,)>(store, instance, &self.validate, (&spec,))
            .map(|(v,)| v.into_iter().map(Into::into).collect())
    }

    pub(crate) fn render(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        spec: &host::EngineSpec,
        cluster: &host::ClusterContext,
    ) -> wasmtime::Result<Result<host::Workload, String>> {
        let (spec, cluster) = (w::DatabaseSpec::from(spec), w::ClusterContext::from(cluster));
        call::<(&w::DatabaseSpec, &w::ClusterContext), (Result<w::Workload, String>,)>(store, instance, &self.render, (&spec, &cluster))
            .map(|(r,)| r.map(Into::into))
    }

    pub(crate) fn plan_upgrade(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        spec: &host::EngineSpec,
        from: &str,
    ) -> wasmtime::Result<Result<host::UpgradePlan, String>> {
        let spec = w::DatabaseSpec::from(spec);
        call::<(&w::DatabaseSpec, &str), (Result<w::UpgradePlan, String>,)>(store, instance, &self.plan_upgrade, (&spec, from))
            .map(|(r,)| r.map(Into::into))
    }

    pub(crate) fn choose_primary(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        spec: &host::EngineSpec,
        members: &[host::Member],
    ) -> wasmtime::Result<host::FailoverDecision> {
        let (spec, members): (_, Vec<w::Member>) = (w::DatabaseSpec::from(spec), members.iter().map(Into::into).collect());
        call::<(&w::DatabaseSpec, &[w::Member]), (w::FailoverDecision,)>(store, instance, &self.choose_primary, (&spec, &members))
            .map(|(d,)| d.into())
    }

    /// The plugin's Job for a backup to, or a restore from, `location`.
    pub(crate) fn job(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        kind: JobKind,
        spec: &host::EngineSpec,
        location: &host::BackupLocation,
    ) -> wasmtime::Result<Result<host::JobPlan, String>> {
        let index = match kind {
            JobKind::Backup => &self.backup,
            JobKind::Restore => &self.restore,
        };
        let (spec, location) = (w::DatabaseSpec::from(spec), w::BackupLocation::from(location));
        call::<(&w::DatabaseSpec, &w::BackupLocation), (Result<w::JobPlan, String>,)>(store, instance, index, (&spec, &location))
            .map(|(r,)| r.map(Into::into))
    }
}

/// Which of the contract's Job functions to call.
#[derive(Clone, Copy)]
pub(crate) enum JobKind {
    Backup,
    Restore,
}

/// Runs the export at `index` of `instance` with `params`, type-checked as `P -> R`.
fn call<P, R>(mut store: impl AsContextMut, instance: &Instance, index: &ComponentExportIndex, params: P) -> wasmtime::Result<R>
where
    P: ComponentNamedList + Lower,
    R: ComponentNamedList + Lift,
{
    let func = instance.get_func(&mut store, index).ok_or_else(|| wasmtime::format_err!("the export is not a function"))?;
    func.typed::<P, R>(&store)?.call(&mut store, params)
}

impl From<w::PluginInfo> for host::PluginInfo {
    fn from(i: w::PluginInfo) -> Self {
        let c = i.capabilities;
        Self {
            engine: i.engine,
            plugin_version: i.plugin_version,
            contract_version: i.contract_version,
            supported_versions: i.supported_versions,
            default_version: i.default_version,
            default_port: i.default_port,
            capabilities: host::Capabilities {
                backup: c.contains(w::Capabilities::BACKUP),
                restore: c.contains(w::Capabilities::RESTORE),
                failover: c.contains(w::Capabilities::FAILOVER),
                online_upgrade: c.contains(w::Capabilities::ONLINE_UPGRADE),
                major_upgrade: c.contains(w::Capabilities::MAJOR_UPGRADE),
            },
        }
    }
}

fn amounts(a: &host::ResourceAmounts) -> w::ResourceAmounts {
    w::ResourceAmounts { cpu_millis: a.cpu_millis, memory_bytes: a.memory_bytes }
}

impl From<&host::EngineSpec> for w::DatabaseSpec {
    fn from(s: &host::EngineSpec) -> Self {
        Self {
            name: s.name.clone(),
            namespace: s.namespace.clone(),
            version: s.version.clone(),
            replicas: s.replicas,
            storage_bytes: s.storage_bytes,
            requests: amounts(&s.requests),
            limits: amounts(&s.limits),
            parameters: s
                .parameters
                .iter()
                .map(|(name, value)| w::Parameter {
                    name: name.clone(),
                    value: match value {
                        host::ParameterValue::Text(t) => w::ParameterValue::Text(t.clone()),
                        host::ParameterValue::Integer(n) => w::ParameterValue::Integer(*n),
                    },
                })
                .collect(),
        }
    }
}

impl From<&host::ClusterContext> for w::ClusterContext {
    fn from(c: &host::ClusterContext) -> Self {
        Self {
            primary_host: c.primary_host.clone(),
            headless_host: c.headless_host.clone(),
            primary_pod: c.primary_pod.clone(),
            credentials_secret: c.credentials_secret.clone(),
            config_mount_path: c.config_mount_path.clone(),
        }
    }
}

impl From<&host::BackupLocation> for w::BackupLocation {
    fn from(l: &host::BackupLocation) -> Self {
        Self {
            directory: l.directory.clone(),
            artifact: l.artifact.clone(),
            host: l.host.clone(),
            credentials_secret: l.credentials_secret.clone(),
        }
    }
}

impl From<&host::Member> for w::Member {
    fn from(m: &host::Member) -> Self {
        Self { pod: m.pod.clone(), ordinal: m.ordinal, ready: m.ready, primary: m.primary, position: m.position.clone() }
    }
}

impl From<w::Violation> for host::Violation {
    fn from(v: w::Violation) -> Self {
        Self { field: v.field, message: v.message }
    }
}

fn env(e: w::EnvVar) -> host::EnvVar {
    host::EnvVar {
        name: e.name,
        source: match e.source {
            w::EnvSource::Value(v) => host::EnvSource::Value(v),
            w::EnvSource::Secret(s) => host::EnvSource::Secret(host::SecretRef { name: s.name, key: s.key }),
            w::EnvSource::Field(f) => host::EnvSource::Field(f),
        },
    }
}

fn probe(p: w::Probe) -> host::Probe {
    host::Probe {
        action: match p.action {
            w::ProbeAction::Exec(cmd) => host::ProbeAction::Exec(cmd),
            w::ProbeAction::TcpSocket(port) => host::ProbeAction::TcpSocket(port),
        },
        initial_delay_seconds: p.initial_delay_seconds,
        period_seconds: p.period_seconds,
        timeout_seconds: p.timeout_seconds,
        failure_threshold: p.failure_threshold,
    }
}

impl From<w::Workload> for host::Workload {
    fn from(w: w::Workload) -> Self {
        Self {
            image: w.image,
            command: w.command,
            args: w.args,
            env: w.env.into_iter().map(env).collect(),
            ports: w.ports.into_iter().map(|p| host::Port { name: p.name, port: p.port }).collect(),
            readiness: w.readiness.map(probe),
            liveness: w.liveness.map(probe),
            config_files: w.config_files.into_iter().map(|f| host::ConfigFile { name: f.name, content: f.content }).collect(),
            data_mount_path: w.data_mount_path,
            credentials: w.credentials.into_iter().map(|c| host::Credential { key: c.key, length: c.length }).collect(),
            recommended: host::ResourceAmounts { cpu_millis: w.recommended.cpu_millis, memory_bytes: w.recommended.memory_bytes },
            run_as_user: w.run_as_user,
        }
    }
}

impl From<w::JobPlan> for host::JobPlan {
    fn from(j: w::JobPlan) -> Self {
        Self { image: j.image, command: j.command, env: j.env.into_iter().map(env).collect(), mounts_data: j.mounts_data }
    }
}

impl From<w::UpgradePlan> for host::UpgradePlan {
    fn from(p: w::UpgradePlan) -> Self {
        Self {
            steps: p
                .steps
                .into_iter()
                .map(|s| match s {
                    w::UpgradeStep::RollingRestart => host::UpgradeStep::RollingRestart,
                    w::UpgradeStep::Job(j) => host::UpgradeStep::Job(j.into()),
                })
                .collect(),
            backup_first: p.backup_first,
        }
    }
}

impl From<w::FailoverDecision> for host::FailoverDecision {
    fn from(d: w::FailoverDecision) -> Self {
        match d {
            w::FailoverDecision::Promote(p) => host::FailoverDecision::Promote { pod: p.pod, command: p.command },
            w::FailoverDecision::NoSafeMember(reason) => host::FailoverDecision::NoSafeMember(reason),
        }
    }
}

/// Maps a log level to tracing's.
pub(crate) fn tracing_level(level: LogLevel) -> tracing::Level {
    match level {
        LogLevel::Trace => tracing::Level::TRACE,
        LogLevel::Debug => tracing::Level::DEBUG,
        LogLevel::Info => tracing::Level::INFO,
        LogLevel::Warn => tracing::Level::WARN,
        LogLevel::Error => tracing::Level::ERROR,
    }
}
