//! The one place that knows the generated bindings: WIT types in, host types out.
//!
//! The host speaks two contracts: `plugdb:engine@0.2.0` (`wit/engine.wit`) and, adapted,
//! `plugdb:engine@0.1.0` (`wit/v0.1/engine.wit`). Each has its bindings and conversions
//! in a module of its own, written once by [`conversions!`] for the records both share;
//! a 0.1 plugin's answers mean what they meant, and what 0.1 cannot say is absent
//! (`point-in-time` is never declared, so the host never asks for it).
//!
//! Every conversion between the bindings and the host's types is here and in the two
//! contract modules, so that no other file sees a generated type.

use super::types as host;

use wasmtime::AsContextMut;
use wasmtime::component::{Component, ComponentExportIndex, ComponentNamedList, Instance, Lift, Linker, Lower};

/// The contract versions this host speaks, newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contract {
    /// `plugdb:engine@0.2.x`.
    V0_2,
    /// `plugdb:engine@0.1.x`, adapted.
    V0_1,
}

impl Contract {
    /// The version this host was written against.
    pub const CURRENT: Contract = Contract::V0_2;

    /// The contract a plugin built against `version` (semver) speaks, if this host speaks it:
    /// the same major and, for 0.x, the same minor.
    pub fn of(version: &str) -> Option<Self> {
        let mut it = version.split(['.', '-', '+']);
        let (major, minor): (u64, u64) = (it.next()?.parse().ok()?, it.next()?.parse().ok()?);
        match (major, minor) {
            (0, 2) => Some(Contract::V0_2),
            (0, 1) => Some(Contract::V0_1),
            _ => None,
        }
    }

    /// Its full version.
    pub fn version(self) -> &'static str {
        match self {
            Contract::V0_2 => "0.2.0",
            Contract::V0_1 => "0.1.0",
        }
    }
}

/// Links the host's imports of every contract into `linker`.
/// Where a plugin's one import, `log`, writes: the state of the call it is made in.
pub(crate) trait Logs: Send + 'static {
    /// A line the plugin logged at `level`.
    fn log_line(&mut self, level: tracing::Level, message: String);
}

/// Links the host's imports (`log`) for every contract version.
pub(crate) fn add_to_linker<T: Logs>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    v0_2::wit::EngineBase::add_to_linker::<_, wasmtime::component::HasSelf<dyn Logs>>(linker, |state: &mut T| -> &mut dyn Logs { state })?;
    v0_1::wit::Engine::add_to_linker::<_, wasmtime::component::HasSelf<dyn Logs>>(linker, |state: &mut T| -> &mut dyn Logs { state })
}

/// Where each function of the contract sits in one plugin's component, found once at
/// load, after the world's `EnginePre::new` type-checked them all: a call then fetches
/// and checks just the function it runs, not all seven.
#[derive(Clone)]
pub(crate) struct Exports {
    contract: Contract,
    info: ComponentExportIndex,
    validate: ComponentExportIndex,
    render: ComponentExportIndex,
    plan_upgrade: ComponentExportIndex,
    choose_primary: ComponentExportIndex,
    backup: ComponentExportIndex,
    restore: ComponentExportIndex,
    /// `None` for 0.1, which has no `plan-scale`.
    plan_scale: Option<ComponentExportIndex>,
    /// The optional `agent` interface's commands, in the order of [`AGENT_COMMANDS`]:
    /// each `None` when the plugin does not export it (0.1, or a plugin built before it).
    agent: [Option<ComponentExportIndex>; AGENT_COMMANDS.len()],
    /// `agent.application`, when the plugin exports it.
    application: Option<ComponentExportIndex>,
    /// `metrics.endpoint`, when the plugin exports it.
    metrics: Option<ComponentExportIndex>,
}

/// A workload's field that an agent command fills.
type CommandField = fn(&mut host::Workload) -> &mut Vec<String>;

/// The commands of the `agent` interface, each with the workload's field it fills. The
/// first, `status-command`, is the interface itself: without it, no agent.
const AGENT_COMMANDS: [(&str, CommandField); 6] = [
    ("status-command", |w| &mut w.status_command),
    ("fence-command", |w| &mut w.fence_command),
    ("client-command", |w| &mut w.client_command),
    ("promote-command", |w| &mut w.promote_command),
    ("synchronous-command", |w| &mut w.synchronous_command),
    ("follow-command", |w| &mut w.follow_command),
];

/// Dispatches a call to the module of the plugin's contract.
macro_rules! by_contract {
    ($self:ident, $f:ident($($arg:expr),*)) => {
        match $self.contract {
            Contract::V0_2 => v0_2::$f($self, $($arg),*),
            Contract::V0_1 => v0_1::$f($self, $($arg),*),
        }
    };
}

impl Exports {
    /// The contract's functions in `component`, whose interface is exported as
    /// `interface`, type-checked against `contract` through `pre`.
    pub(crate) fn find<T: 'static>(
        component: &Component,
        interface: &str,
        contract: Contract,
        pre: &wasmtime::component::InstancePre<T>,
    ) -> Result<Self, String> {
        match contract {
            Contract::V0_2 => v0_2::wit::EngineBasePre::new(pre.clone()).map(drop),
            Contract::V0_1 => v0_1::wit::EnginePre::new(pre.clone()).map(drop),
        }
        .map_err(|e| format!("{e:#}"))?;
        let (_, at) = component.get_export(None, interface).ok_or_else(|| format!("no export `{interface}`"))?;
        let index =
            |name: &str| component.get_export(Some(&at), name).map(|(_, i)| i).ok_or_else(|| format!("`{interface}` exports no `{name}`"));
        Ok(Self {
            contract,
            info: index("info")?,
            validate: index("validate")?,
            render: index("render")?,
            plan_upgrade: index("plan-upgrade")?,
            choose_primary: index("choose-primary")?,
            backup: index("backup")?,
            restore: index("restore")?,
            plan_scale: match contract {
                Contract::V0_2 => Some(index("plan-scale")?),
                Contract::V0_1 => None,
            },
            agent: AGENT_COMMANDS.map(|(name, _)| match contract {
                Contract::V0_2 => optional_export(component, interface, "agent", name),
                Contract::V0_1 => None,
            }),
            application: match contract {
                Contract::V0_2 => optional_export(component, interface, "agent", "application"),
                Contract::V0_1 => None,
            },
            metrics: match contract {
                Contract::V0_2 => optional_export(component, interface, "metrics", "endpoint"),
                Contract::V0_1 => None,
            },
        })
    }

    /// The contract the plugin speaks.
    pub(crate) fn contract(&self) -> Contract {
        self.contract
    }

    pub(crate) fn info(&self, store: impl AsContextMut, instance: &Instance) -> wasmtime::Result<host::PluginInfo> {
        by_contract!(self, info(store, instance))
    }

    pub(crate) fn validate(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        spec: &host::EngineSpec,
    ) -> wasmtime::Result<Vec<host::Violation>> {
        by_contract!(self, validate(store, instance, spec))
    }

    pub(crate) fn render(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        spec: &host::EngineSpec,
        cluster: &host::ClusterContext,
    ) -> wasmtime::Result<Result<host::Workload, String>> {
        let mut store = store;
        let mut workload = by_contract!(self, render(store.as_context_mut(), instance, spec, cluster))?;
        if let (Some(_), Ok(w)) = (&self.agent[0], &mut workload) {
            for (index, (_, field)) in self.agent.iter().zip(AGENT_COMMANDS) {
                if let Some(index) = index {
                    *field(w) = v0_2::agent_command(store.as_context_mut(), instance, index, spec)?;
                }
            }
        }
        if let (Some(index), Ok(w)) = (&self.application, &mut workload) {
            w.application = v0_2::application_login(store.as_context_mut(), instance, index, spec)?;
        }
        if let (Some(index), Ok(w)) = (&self.metrics, &mut workload) {
            w.metrics = v0_2::metrics_endpoint(store.as_context_mut(), instance, index, spec, cluster)?;
        }
        Ok(workload)
    }

    pub(crate) fn plan_upgrade(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        spec: &host::EngineSpec,
        from: &str,
    ) -> wasmtime::Result<Result<host::UpgradePlan, String>> {
        by_contract!(self, plan_upgrade(store, instance, spec, from))
    }

    pub(crate) fn choose_primary(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        spec: &host::EngineSpec,
        members: &[host::Member],
    ) -> wasmtime::Result<host::FailoverDecision> {
        by_contract!(self, choose_primary(store, instance, spec, members))
    }

    /// How to go from `from` members to `spec.replicas`. A 0.1 plugin cannot say: it
    /// scales in one step, as it always did.
    pub(crate) fn plan_scale(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        spec: &host::EngineSpec,
        from: u32,
        members: &[host::Member],
    ) -> wasmtime::Result<Result<Vec<host::ScaleStep>, String>> {
        match &self.plan_scale {
            Some(index) => v0_2::plan_scale(store, instance, index, spec, from, members),
            None => Ok(Ok(vec![host::ScaleStep::Members(spec.replicas)])),
        }
    }

    /// The plugin's Job for a backup to `location`.
    pub(crate) fn backup(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        spec: &host::EngineSpec,
        location: &host::BackupLocation,
    ) -> wasmtime::Result<Result<host::JobPlan, String>> {
        match self.contract {
            Contract::V0_2 => v0_2::job(store, instance, &self.backup, spec, location),
            Contract::V0_1 => v0_1::job(store, instance, &self.backup, spec, location),
        }
    }

    /// The plugin's Job restoring member `member` from `location`, or `None` when that
    /// member joins the restored ones instead. 0.1 restores member 0 alone.
    pub(crate) fn restore(
        &self,
        store: impl AsContextMut,
        instance: &Instance,
        spec: &host::EngineSpec,
        location: &host::BackupLocation,
        member: u32,
    ) -> wasmtime::Result<Result<Option<host::JobPlan>, String>> {
        match self.contract {
            Contract::V0_2 => v0_2::restore(store, instance, &self.restore, spec, location, member),
            Contract::V0_1 if member == 0 => v0_1::job(store, instance, &self.restore, spec, location).map(|r| r.map(Some)),
            Contract::V0_1 => Ok(Ok(None)),
        }
    }
}

/// Function `name` of the optional interface `optional` beside the contract's `interface`
/// (`plugdb:engine/plugin@0.2.0` → `plugdb:engine/agent@0.2.0`), if the component exports it.
fn optional_export(component: &Component, interface: &str, optional: &str, name: &str) -> Option<ComponentExportIndex> {
    let beside = interface.replacen("/plugin@", &format!("/{optional}@"), 1);
    let (_, at) = component.get_export(None, &beside)?;
    component.get_export(Some(&at), name).map(|(_, i)| i)
}

/// Runs the export at `index` of `instance` with `params` as `P -> R`: the types each
/// contract module passes for that export, which `Exports::find` checked at load.
pub(crate) fn call<P, R>(mut store: impl AsContextMut, instance: &Instance, index: &ComponentExportIndex, params: P) -> wasmtime::Result<R>
where
    P: ComponentNamedList + Lower,
    R: ComponentNamedList + Lift,
{
    let func = instance.get_func(&mut store, index).ok_or_else(|| wasmtime::format_err!("the export is not a function"))?;
    debug_assert!(func.typed::<P, R>(&store).is_ok(), "the export's type was checked at load");
    // SAFETY: `Exports::find` type-checked every export of the contract through the
    // world's `EnginePre::new`, whose generated calls use these same `P` and `R` for
    // each export; an instance of the same component has the same export types.
    // Checking them again on every call cost about 0.5 µs of a 10 µs call.
    #[allow(unsafe_code)]
    let typed = unsafe { wasmtime::component::TypedFunc::<P, R>::new_unchecked(func) };
    typed.call(&mut store, params)
}

/// The calls and conversions both contracts share, written against `w` (the
/// contract's `types` interface) in the module that invokes it.
macro_rules! conversions {
    () => {
        use super::host;
        use super::{Exports, call};
        use wasmtime::AsContextMut;
        use wasmtime::component::{ComponentExportIndex, Instance};

        pub(crate) use wit::plugdb::engine::host::Host as HostImports;
        pub(crate) use wit::plugdb::engine::types::Host as TypesImports;

        pub(super) fn info(e: &Exports, store: impl AsContextMut, instance: &Instance) -> wasmtime::Result<host::PluginInfo> {
            call::<(), (w::PluginInfo,)>(store, instance, &e.info, ()).map(|(i,)| plugin_info(i))
        }

        pub(super) fn validate(
            e: &Exports,
            store: impl AsContextMut,
            instance: &Instance,
            spec: &host::EngineSpec,
        ) -> wasmtime::Result<Vec<host::Violation>> {
            let parameters = parameters(spec);
            let spec = database_spec(spec, &parameters);
            call::<(&w::DatabaseSpec,), (Vec<w::Violation>,)>(store, instance, &e.validate, (&spec,))
                .map(|(v,)| v.into_iter().map(|v| host::Violation { field: v.field, message: v.message }).collect())
        }

        pub(super) fn render(
            e: &Exports,
            store: impl AsContextMut,
            instance: &Instance,
            spec: &host::EngineSpec,
            cluster: &host::ClusterContext,
        ) -> wasmtime::Result<Result<host::Workload, String>> {
            let parameters = parameters(spec);
            let (spec, cluster) = (database_spec(spec, &parameters), cluster_context(cluster));
            call::<(&w::DatabaseSpec, &w::ClusterContext), (Result<w::Workload, String>,)>(store, instance, &e.render, (&spec, &cluster))
                .map(|(r,)| r.map(workload))
        }

        pub(super) fn plan_upgrade(
            e: &Exports,
            store: impl AsContextMut,
            instance: &Instance,
            spec: &host::EngineSpec,
            from: &str,
        ) -> wasmtime::Result<Result<host::UpgradePlan, String>> {
            let parameters = parameters(spec);
            let spec = database_spec(spec, &parameters);
            call::<(&w::DatabaseSpec, &str), (Result<w::UpgradePlan, String>,)>(store, instance, &e.plan_upgrade, (&spec, from))
                .map(|(r,)| r.map(upgrade_plan))
        }

        pub(super) fn choose_primary(
            e: &Exports,
            store: impl AsContextMut,
            instance: &Instance,
            spec: &host::EngineSpec,
            members: &[host::Member],
        ) -> wasmtime::Result<host::FailoverDecision> {
            let parameters = parameters(spec);
            let spec = database_spec(spec, &parameters);
            let members: Vec<w::Member> = members.iter().map(member).collect();
            call::<(&w::DatabaseSpec, &[w::Member]), (w::FailoverDecision,)>(store, instance, &e.choose_primary, (&spec, &members))
                .map(|(d,)| decision(d))
        }

        pub(super) fn job(
            store: impl AsContextMut,
            instance: &Instance,
            index: &ComponentExportIndex,
            spec: &host::EngineSpec,
            location: &host::BackupLocation,
        ) -> wasmtime::Result<Result<host::JobPlan, String>> {
            let parameters = parameters(spec);
            let (spec, location) = (database_spec(spec, &parameters), backup_location(location));
            call::<(&w::DatabaseSpec, &w::BackupLocation), (Result<w::JobPlan, String>,)>(store, instance, index, (&spec, &location))
                .map(|(r,)| r.map(job_plan))
        }

        fn amounts(a: &host::ResourceAmounts) -> w::ResourceAmounts {
            w::ResourceAmounts { cpu_millis: a.cpu_millis, memory_bytes: a.memory_bytes }
        }

        /// The parameters of `s`, borrowed (the spec borrows them in turn: `database_spec`).
        fn parameters(s: &host::EngineSpec) -> Vec<w::Parameter<'_>> {
            s.parameters
                .iter()
                .map(|(name, value)| w::Parameter {
                    name,
                    value: match value {
                        host::ParameterValue::Text(t) => w::ParameterValue::Text(t),
                        host::ParameterValue::Integer(n) => w::ParameterValue::Integer(*n),
                    },
                })
                .collect()
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
                action: probe_action(p.action),
                initial_delay_seconds: p.initial_delay_seconds,
                period_seconds: p.period_seconds,
                timeout_seconds: p.timeout_seconds,
                failure_threshold: p.failure_threshold,
            }
        }

        fn workload(w: w::Workload) -> host::Workload {
            let (init_containers, member_query) = (init_containers(&w), member_query(&w));
            host::Workload {
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
                member_query,
                init_containers,
                status_command: Vec::new(),
                fence_command: Vec::new(),
                client_command: Vec::new(),
                promote_command: Vec::new(),
                synchronous_command: Vec::new(),
                follow_command: Vec::new(),
                application: None,
                metrics: None,
            }
        }

        fn job_plan(j: w::JobPlan) -> host::JobPlan {
            host::JobPlan { image: j.image, command: j.command, env: j.env.into_iter().map(env).collect(), mounts_data: j.mounts_data }
        }

        fn upgrade_plan(p: w::UpgradePlan) -> host::UpgradePlan {
            host::UpgradePlan {
                steps: p
                    .steps
                    .into_iter()
                    .map(|s| match s {
                        w::UpgradeStep::RollingRestart => host::UpgradeStep::RollingRestart,
                        w::UpgradeStep::Job(j) => host::UpgradeStep::Job(job_plan(j)),
                    })
                    .collect(),
                backup_first: p.backup_first,
            }
        }

        fn level(level: w::LogLevel) -> tracing::Level {
            match level {
                w::LogLevel::Trace => tracing::Level::TRACE,
                w::LogLevel::Debug => tracing::Level::DEBUG,
                w::LogLevel::Info => tracing::Level::INFO,
                w::LogLevel::Warn => tracing::Level::WARN,
                w::LogLevel::Error => tracing::Level::ERROR,
            }
        }

        impl TypesImports for dyn super::Logs {}

        impl HostImports for dyn super::Logs {
            fn log(&mut self, l: w::LogLevel, message: String) {
                self.log_line(level(l), message)
            }
        }

        fn capabilities(c: w::Capabilities) -> host::Capabilities {
            host::Capabilities {
                backup: c.contains(w::Capabilities::BACKUP),
                restore: c.contains(w::Capabilities::RESTORE),
                failover: c.contains(w::Capabilities::FAILOVER),
                online_upgrade: c.contains(w::Capabilities::ONLINE_UPGRADE),
                major_upgrade: c.contains(w::Capabilities::MAJOR_UPGRADE),
                point_in_time: point_in_time(c),
                elects_leader: elects_leader(c),
                tls: tls(c),
            }
        }

        fn plugin_info(i: w::PluginInfo) -> host::PluginInfo {
            host::PluginInfo {
                engine: i.engine,
                plugin_version: i.plugin_version,
                contract_version: i.contract_version,
                supported_versions: i.supported_versions,
                default_version: i.default_version,
                default_port: i.default_port,
                capabilities: capabilities(i.capabilities),
            }
        }
    };
}

pub(crate) mod v0_2;

pub(crate) mod v0_1;

#[cfg(test)]
mod tests {
    use super::AGENT_COMMANDS;

    /// Every command of the WIT's `agent` interface has its row, and each row fills a field
    /// of its own: a command added to the contract but not here, or filling another's
    /// field, fails.
    #[test]
    fn each_agent_command_of_the_contract_fills_a_field_of_its_own() {
        let wit = include_str!("../../../wit/engine.wit");
        let agent = &wit[wit.find("interface agent {").expect("the agent interface")..];
        let agent = &agent[..agent.find("\n}").expect("its end")];
        let declared: Vec<&str> =
            agent.lines().filter_map(|l| l.trim().strip_suffix(": func(spec: database-spec) -> list<string>;")).collect();
        let mut rows: Vec<&str> = AGENT_COMMANDS.iter().map(|(name, _)| *name).collect();
        assert_eq!(rows.first(), Some(&"status-command"), "the interface itself comes first");
        rows.sort();
        let mut declared = declared;
        declared.sort();
        assert_eq!(rows, declared);
        let mut workload = super::super::policy::tests::workload();
        for (name, field) in AGENT_COMMANDS {
            field(&mut workload).push(name.to_string());
        }
        let filled = [
            &workload.status_command,
            &workload.fence_command,
            &workload.client_command,
            &workload.promote_command,
            &workload.synchronous_command,
            &workload.follow_command,
        ];
        assert!(filled.iter().all(|f| f.len() == 1), "each field filled once: {filled:?}");
    }
}
