//! `plugdb:engine@0.1.0` (`wit/v0.1/engine.wit`), adapted: it never declares
//! `point-in-time`, so it is never given an archive directory or a point in time.

#[allow(missing_docs, clippy::all)]
pub(crate) mod wit {
    wasmtime::component::bindgen!({ world: "engine", path: "../wit/v0.1", ownership: Borrowing { duplicate_if_necessary: true } });
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
    }
}

fn point_in_time(_: w::Capabilities) -> bool {
    false
}

fn elects_leader(_: w::Capabilities) -> bool {
    false
}

fn tls(_: w::Capabilities) -> bool {
    false
}

fn member_query(_: &w::Workload) -> Option<host::MemberQuery> {
    None
}

fn member(m: &host::Member) -> w::Member<'_> {
    w::Member { pod: &m.pod, ordinal: m.ordinal, ready: m.ready, primary: m.primary, position: m.position.as_deref() }
}

fn decision(d: w::FailoverDecision) -> host::FailoverDecision {
    match d {
        w::FailoverDecision::Promote(p) => host::FailoverDecision::Promote { pod: p.pod, command: p.command },
        w::FailoverDecision::NoSafeMember(reason) => host::FailoverDecision::NoSafeMember(reason),
    }
}

fn init_containers(_: &w::Workload) -> Vec<host::InitContainer> {
    Vec::new()
}

fn cluster_context(c: &host::ClusterContext) -> w::ClusterContext<'_> {
    w::ClusterContext {
        primary_host: &c.primary_host,
        headless_host: &c.headless_host,
        primary_pod: &c.primary_pod,
        credentials_secret: &c.credentials_secret,
        config_mount_path: &c.config_mount_path,
    }
}

fn backup_location(l: &host::BackupLocation) -> w::BackupLocation<'_> {
    w::BackupLocation { directory: &l.directory, artifact: &l.artifact, host: &l.host, credentials_secret: &l.credentials_secret }
}

fn probe_action(a: w::ProbeAction) -> host::ProbeAction {
    match a {
        w::ProbeAction::Exec(cmd) => host::ProbeAction::Exec(cmd),
        w::ProbeAction::TcpSocket(port) => host::ProbeAction::TcpSocket(port),
    }
}
