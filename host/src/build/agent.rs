//! The member agent's containers in a member's pod (the agent itself: `crate::agent`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, HTTPGetAction, KeyToPath, Probe, ResourceRequirements, SecretVolumeSource,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::pod;
use crate::agent::protocol::{Check, LIVENESS_PATH, READINESS_PATH, Serve};
use crate::agent::{BIN_DIR, CERTS, FENCED_ENV, FENCED_FILE, FILES, OWN_ADDRESS_ENV, POD_NAME_ENV, PORT, STATE, metrics};
use crate::crd::Database;
use crate::names::Names;

/// `text` as the kubelet passes it on in a container's command: it reads `$(NAME)` as a
/// variable and `$$` as `$`, so every `$` is written `$$`. The plugin's commands reach
/// the agent as they were written (a `DO $$ … $$` block, a `$(…)` substitution).
fn verbatim(text: &str) -> String {
    text.replace('$', "$$")
}

/// The kubelet's HTTP GET of `path` on the agent's metrics port.
fn metrics_get(path: &str) -> HTTPGetAction {
    HTTPGetAction {
        path: Some(path.into()),
        port: IntOrString::Int(i32::from(metrics::PORT)),
        scheme: Some("HTTP".into()),
        ..Default::default()
    }
}

/// The agent's container, in every member of an engine with an agent.
pub const CONTAINER: &str = "agent";

/// The agent's CPU, requested and at most.
pub const AGENT_CPU: (&str, &str) = ("50m", "500m");

/// What a member needs for its agent, beside `engine` (the engine's container): the init
/// container that copies this binary out of the operator's image, the agent's container
/// (the engine's image, environment and files, and its data volume read-only, which it
/// measures: the member's series are served on [`metrics::PORT`]; obeying the
/// operator's authority alone, pinned in its arguments), and their volumes.
/// With a `fence` command the engine is given the agent's state, read-only, and the path
/// of the mark of a fenced member in [`FENCED_ENV`]; the agent reports a fenced member
/// not ready, and the engine's command runs under the agent's guard (`plugdb agent
/// guard`), which stops it when the agent says. With a `promote` command too, the agent
/// promotes its member in place when the operator asks, and with a `follow` command has
/// its replica follow a new primary; with a `synchronous` command, it changes how many
/// replicas confirm each commit when the operator asks.
pub fn containers(
    db: &Database,
    sidecar: super::AgentSidecar,
    engine: &mut Container,
    workload: &crate::plugin::Workload,
) -> (Container, Container, Vec<Volume>) {
    let status = &workload.status_command;
    let (fence, promote) = (&workload.fence_command, &workload.promote_command);
    let (synchronous, follow) = (&workload.synchronous_command, &workload.follow_command);
    let binary = format!("{BIN_DIR}/plugdb");
    let quantity = |q: &str| Quantity(q.into());
    let bounded = |(request, cpu): (&str, &str), memory: &str| ResourceRequirements {
        requests: Some(BTreeMap::from([("cpu".into(), quantity(request)), ("memory".into(), quantity("16Mi"))])),
        limits: Some(BTreeMap::from([("cpu".into(), quantity(cpu)), ("memory".into(), quantity(memory))])),
        ..Default::default()
    };
    let copy = Container {
        name: "agent-install".into(),
        image: Some(sidecar.image.into()),
        command: Some(vec![crate::names::OPERATOR_BINARY.into(), "agent".into(), "install".into(), binary.clone()]),
        volume_mounts: Some(vec![pod::mount("agent-bin", BIN_DIR, false)]),
        resources: Some(bounded(("10m", "500m"), "128Mi")),
        security_context: Some(pod::container_security(Some(true))),
        ..Default::default()
    };
    let given = |argv: &[String]| (!argv.is_empty()).then(|| argv.to_vec());
    // The data volume, read-only: the agent measures it for its series, and a fence may read
    // what a stopped engine left in it (its last position).
    let read_only = |name: &str| {
        engine.volume_mounts.iter().flatten().find(|m| m.name == name).map(|m| VolumeMount { read_only: Some(true), ..m.clone() })
    };
    let data = read_only("data");
    // The archive directory, read-only: what waits there to be shipped, for its series.
    let archive = read_only("archive");
    let mut serve = Serve {
        port: PORT,
        certs: CERTS.into(),
        clients: sidecar.clients.into(),
        fence_command: None,
        promote_command: None,
        follow_command: None,
        synchronous_command: given(synchronous),
        members: None,
        metrics_port: Some(metrics::PORT),
        database: Some(format!("{}/{}", db.namespace().unwrap_or_default(), db.name_any())),
        engine: Some(db.spec.engine.clone()),
        data: data.as_ref().map(|m| m.mount_path.clone().into()),
        archive: archive.as_ref().map(|m| m.mount_path.clone().into()),
        readiness: None,
        liveness: None,
        exporter: pod::exporter_at(db, workload.metrics.as_ref()),
        command: status.to_vec(),
    };
    // The engine's exec probes run in the agent, which the kubelet asks over HTTP: no
    // runtime started to enter the engine's container at each look. The agent answers
    // within the plugin's timeout; the kubelet waits a second more for its answer.
    let probes = [
        (&mut engine.readiness_probe, &mut serve.readiness, READINESS_PATH),
        (&mut engine.liveness_probe, &mut serve.liveness, LIVENESS_PATH),
    ];
    for (probe, check, path) in probes {
        let Some(probe) = probe.as_mut() else { continue };
        let Some(command) = probe.exec.take().and_then(|e| e.command) else { continue };
        let timeout_seconds = probe.timeout_seconds.unwrap_or(1).clamp(1, 60) as u32;
        *check = Some(Check { command, timeout_seconds });
        probe.http_get = Some(metrics_get(path));
        probe.timeout_seconds = Some(timeout_seconds as i32 + 1);
    }
    let seen = |m: &&VolumeMount| !["data", "archive"].contains(&m.name.as_str());
    let mut mounts: Vec<VolumeMount> = engine.volume_mounts.iter().flatten().filter(seen).cloned().collect();
    mounts.extend(data);
    mounts.extend(archive);
    mounts.push(pod::mount("agent-bin", BIN_DIR, true));
    mounts.push(pod::mount("agent-certs", CERTS, true));
    let mut env = engine.env.clone().unwrap_or_default();
    let name = crate::plugin::EnvVar { name: POD_NAME_ENV.into(), source: crate::plugin::EnvSource::Field("metadata.name".into()) };
    env.extend(pod::env(&[name]));
    if sidecar.logs == crate::logging::LogFormat::Json {
        // Only when not the default: a member's template changes with nothing else.
        let format =
            crate::plugin::EnvVar { name: crate::logging::FORMAT_ENV.into(), source: crate::plugin::EnvSource::Value("json".into()) };
        env.extend(pod::env(&[format]));
    }
    let mut readiness = None;
    if !fence.is_empty() {
        serve.members = Some(format!("{}.{}.svc", Names(&db.name_any()).headless(), db.namespace().unwrap_or_default()));
        (serve.fence_command, serve.promote_command, serve.follow_command) = (given(fence), given(promote), given(follow));
        mounts.push(pod::mount("agent-state", STATE, false));
        let own = crate::plugin::EnvVar { name: OWN_ADDRESS_ENV.into(), source: crate::plugin::EnvSource::Field("status.podIP".into()) };
        env.extend(pod::env(&[own]));
        readiness = Some(Probe {
            // Asked of the agent over HTTP, by the kubelet itself: no process in the
            // container. Three missed looks in a row, not one, make the member not ready
            // (a fence itself is held by the engine's start).
            http_get: Some(metrics_get("/ready")),
            period_seconds: Some(5),
            timeout_seconds: Some(5),
            failure_threshold: Some(3),
            ..Default::default()
        });
        engine.volume_mounts.get_or_insert_default().push(pod::mount("agent-state", STATE, true));
        // The engine runs under the guard, which kills it when the agent says (a fence
        // the engine does not confirm); without a command of its own there is nothing to
        // run under it, and such an engine is never stopped.
        if let Some(start) = engine.command.take() {
            let stop = format!("{STATE}/{}", crate::agent::guard::STOP_FILE);
            let guarded = [binary.clone(), "agent".into(), "guard".into(), "--stop".into(), stop, "--".into()];
            engine.command = Some(guarded.into_iter().chain(start).collect());
            engine.volume_mounts.get_or_insert_default().push(pod::mount("agent-bin", BIN_DIR, true));
        }
        let fenced = EnvVar { name: FENCED_ENV.into(), value: Some(format!("{STATE}/{FENCED_FILE}")), value_from: None };
        // The agent's commands see it too: a fence may keep what it found beside the mark.
        env.push(fenced.clone());
        engine.env.get_or_insert_default().push(fenced);
    }
    // A hung agent is restarted (30 s), before the engine's liveness probe, which it
    // runs, could restart the engine for it (the plugins' allow a minute).
    let liveness = Probe {
        http_get: Some(metrics_get("/live")),
        initial_delay_seconds: Some(10),
        period_seconds: Some(10),
        timeout_seconds: Some(5),
        failure_threshold: Some(3),
        ..Default::default()
    };
    let command = [binary.clone(), "agent".into(), "serve".into()].into_iter().chain(serve.argv().iter().map(|a| verbatim(a))).collect();
    let agent = Container {
        name: CONTAINER.into(),
        image: engine.image.clone(),
        command: Some(command),
        env: Some(env),
        readiness_probe: readiness,
        liveness_probe: Some(liveness),
        ports: Some(
            [("agent", PORT), ("metrics", metrics::PORT)]
                .map(|(name, port)| ContainerPort {
                    name: Some(name.into()),
                    container_port: i32::from(port),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                })
                .to_vec(),
        ),
        volume_mounts: Some(mounts),
        // Its answers decide a failover, and its commands (the engine's client) run in its
        // share of the CPU: under a busy engine, a share of 10m made a status command
        // outlast its 1.5 s. It bursts (a client started, a TLS handshake): no tight quota.
        resources: Some(bounded(AGENT_CPU, "64Mi")),
        security_context: Some(pod::container_security(Some(true))),
        ..Default::default()
    };
    let certificates = Volume {
        name: "agent-certs".into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(Names(&db.name_any()).agent()),
            items: Some(FILES.iter().map(|f| KeyToPath { key: f.to_string(), path: f.to_string(), mode: None }).collect()),
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Default::default()
    };
    let empty = |name: &str| Volume { name: name.into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Default::default() };
    let mut volumes = vec![empty("agent-bin"), certificates];
    if !fence.is_empty() {
        volumes.push(empty("agent-state"));
    }
    (copy, agent, volumes)
}
