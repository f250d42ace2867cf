//! `plugdb:engine@0.2.0`: the contract as `wit/engine.wit` states it.

#[allow(missing_docs, clippy::all)]
pub(crate) mod wit {
    wasmtime::component::bindgen!({ world: "engine-base", path: "../wit", ownership: Borrowing { duplicate_if_necessary: true } });
}
use wit::plugdb::engine::types as w;

conversions!();

fn database_spec<'a>(s: &'a host::EngineSpec, parameters: &'a [w::Parameter<'a>]) -> w::DatabaseSpec<'a> {
    w::DatabaseSpec {
        name: &s.name,
        namespace: &s.namespace,
        version: &s.version,
        replicas: s.replicas,
        storage_bytes: s.storage_bytes,
        requests: amounts(&s.requests),
        limits: amounts(&s.limits),
        parameters,
        tls: s.tls.as_ref().map(|t| w::TlsFiles { certificate: &t.certificate, key: &t.key, ca: &t.ca }),
        synchronous_replicas: s.synchronous_replicas,
    }
}

fn point_in_time(c: w::Capabilities) -> bool {
    c.contains(w::Capabilities::POINT_IN_TIME)
}

fn elects_leader(c: w::Capabilities) -> bool {
    c.contains(w::Capabilities::ELECTS_LEADER)
}

fn tls(c: w::Capabilities) -> bool {
    c.contains(w::Capabilities::TLS)
}

fn member_query(w: &w::Workload) -> Option<host::MemberQuery> {
    w.member_query.as_ref().map(|q| host::MemberQuery { port: q.port, path: q.path.clone(), body: q.body.clone(), https: q.https })
}

fn member(m: &host::Member) -> w::Member<'_> {
    w::Member {
        pod: &m.pod,
        ordinal: m.ordinal,
        ready: m.ready,
        primary: m.primary,
        position: m.position.as_deref(),
        answer: m.answer.as_deref(),
    }
}

fn decision(d: w::FailoverDecision) -> host::FailoverDecision {
    match d {
        w::FailoverDecision::Promote(p) => host::FailoverDecision::Promote { pod: p.pod, command: p.command },
        w::FailoverDecision::Elected(pod) => host::FailoverDecision::Elected(pod),
        w::FailoverDecision::NoSafeMember(reason) => host::FailoverDecision::NoSafeMember(reason),
    }
}

fn cluster_context(c: &host::ClusterContext) -> w::ClusterContext<'_> {
    w::ClusterContext {
        primary_host: &c.primary_host,
        headless_host: &c.headless_host,
        primary_pod: &c.primary_pod,
        credentials_secret: &c.credentials_secret,
        config_mount_path: &c.config_mount_path,
        archive_directory: c.archive_directory.as_deref(),
        restoring: c.restoring,
    }
}

fn init_containers(w: &w::Workload) -> Vec<host::InitContainer> {
    w.init_containers
        .iter()
        .map(|c| host::InitContainer {
            name: c.name.clone(),
            image: c.image.clone(),
            command: c.command.clone(),
            env: c.env.iter().cloned().map(env).collect(),
        })
        .collect()
}

fn backup_location(l: &host::BackupLocation) -> w::BackupLocation<'_> {
    w::BackupLocation {
        directory: &l.directory,
        artifact: &l.artifact,
        host: &l.host,
        credentials_secret: &l.credentials_secret,
        cluster: cluster_context(&l.cluster),
        archive_directory: l.archive_directory.as_deref(),
        point_in_time: l.point_in_time.as_deref(),
    }
}

pub(super) fn restore(
    store: impl AsContextMut,
    instance: &Instance,
    index: &ComponentExportIndex,
    spec: &host::EngineSpec,
    location: &host::BackupLocation,
    member: u32,
) -> wasmtime::Result<Result<Option<host::JobPlan>, String>> {
    let parameters = parameters(spec);
    let (spec, location) = (database_spec(spec, &parameters), backup_location(location));
    type Params<'a> = (&'a w::DatabaseSpec<'a>, &'a w::BackupLocation<'a>, u32);
    call::<Params, (Result<Option<w::JobPlan>, String>,)>(store, instance, index, (&spec, &location, member))
        .map(|(r,)| r.map(|plan| plan.map(job_plan)))
}

/// An optional `agent` command (`status-command`, `fence-command`: both `spec -> argv`),
/// type-checked here: the world the host checks at load (`engine-base`) leaves the
/// `agent` interface out.
pub(super) fn agent_command(
    mut store: impl AsContextMut,
    instance: &Instance,
    index: &ComponentExportIndex,
    spec: &host::EngineSpec,
) -> wasmtime::Result<Vec<String>> {
    let parameters = parameters(spec);
    let spec = database_spec(spec, &parameters);
    let func = instance.get_func(&mut store, index).ok_or_else(|| wasmtime::format_err!("an agent command is not a function"))?;
    let typed = func.typed::<(&w::DatabaseSpec,), (Vec<String>,)>(&store)?;
    typed.call(&mut store, (&spec,)).map(|(argv,)| argv)
}

pub(super) fn application_login(
    mut store: impl AsContextMut,
    instance: &Instance,
    index: &ComponentExportIndex,
    spec: &host::EngineSpec,
) -> wasmtime::Result<Option<host::ApplicationLogin>> {
    let parameters = parameters(spec);
    let spec = database_spec(spec, &parameters);
    let func = instance.get_func(&mut store, index).ok_or_else(|| wasmtime::format_err!("application is not a function"))?;
    let typed = func.typed::<(&w::DatabaseSpec,), (Option<ApplicationLogin>,)>(&store)?;
    let (login,) = typed.call(&mut store, (&spec,))?;
    Ok(login.map(|l| host::ApplicationLogin { user: l.user, database: l.database, password_key: l.password_key, scheme: l.scheme }))
}

/// `agent.application-login`, a record of the optional `agent` interface, which the
/// world the host binds (`engine-base`) leaves out.
#[derive(wasmtime::component::ComponentType, wasmtime::component::Lift)]
#[component(record)]
struct ApplicationLogin {
    user: String,
    database: String,
    #[component(name = "password-key")]
    password_key: String,
    scheme: String,
}

pub(super) fn metrics_endpoint(
    mut store: impl AsContextMut,
    instance: &Instance,
    index: &ComponentExportIndex,
    spec: &host::EngineSpec,
    cluster: &host::ClusterContext,
) -> wasmtime::Result<Option<host::MetricsEndpoint>> {
    let parameters = parameters(spec);
    let (spec, cluster) = (database_spec(spec, &parameters), cluster_context(cluster));
    let func = instance.get_func(&mut store, index).ok_or_else(|| wasmtime::format_err!("endpoint is not a function"))?;
    let typed = func.typed::<(&w::DatabaseSpec, &w::ClusterContext), (Option<MetricsEndpoint>,)>(&store)?;
    let (endpoint,) = typed.call(&mut store, (&spec, &cluster))?;
    Ok(endpoint.map(|e| host::MetricsEndpoint {
        port: e.port,
        path: e.path,
        exporter: e.exporter.map(|x| host::Exporter { image: x.image, command: x.command, env: x.env.into_iter().map(env).collect() }),
    }))
}

/// `metrics.endpoint`, a record of the optional `metrics` interface, which the world the
/// host binds (`engine-base`) leaves out.
#[derive(wasmtime::component::ComponentType, wasmtime::component::Lift)]
#[component(record)]
struct MetricsEndpoint {
    port: u16,
    path: String,
    exporter: Option<Exporter>,
}

/// `metrics.exporter`.
#[derive(wasmtime::component::ComponentType, wasmtime::component::Lift)]
#[component(record)]
struct Exporter {
    image: String,
    command: Vec<String>,
    env: Vec<w::EnvVar>,
}

pub(super) fn plan_scale(
    store: impl AsContextMut,
    instance: &Instance,
    index: &ComponentExportIndex,
    spec: &host::EngineSpec,
    from: u32,
    members: &[host::Member],
) -> wasmtime::Result<Result<Vec<host::ScaleStep>, String>> {
    let parameters = parameters(spec);
    let spec = database_spec(spec, &parameters);
    let members: Vec<w::Member> = members.iter().map(member).collect();
    type Params<'a> = (&'a w::DatabaseSpec<'a>, u32, &'a [w::Member<'a>]);
    call::<Params, (Result<Vec<w::ScaleStep>, String>,)>(store, instance, index, (&spec, from, &members)).map(|(r,)| {
        r.map(|steps| {
            steps
                .into_iter()
                .map(|s| match s {
                    w::ScaleStep::Job(j) => host::ScaleStep::Job(job_plan(j)),
                    w::ScaleStep::Members(n) => host::ScaleStep::Members(n),
                })
                .collect()
        })
    })
}

fn probe_action(a: w::ProbeAction) -> host::ProbeAction {
    match a {
        w::ProbeAction::Exec(cmd) => host::ProbeAction::Exec(cmd),
        w::ProbeAction::TcpSocket(port) => host::ProbeAction::TcpSocket(port),
        w::ProbeAction::HttpGet(h) => host::ProbeAction::HttpGet { path: h.path, port: h.port, https: h.https },
        w::ProbeAction::Grpc(port) => host::ProbeAction::Grpc(port),
    }
}
