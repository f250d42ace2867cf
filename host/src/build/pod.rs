//! The pieces of a pod that members and Jobs share, as typed objects: environment,
//! probes, resources, security contexts, volumes, and where members may be placed.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, ExecAction, GRPCAction, HTTPGetAction, KeyToPath,
    ObjectFieldSelector, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, PodAffinityTerm, PodAntiAffinity,
    PodSecurityContext, Probe, ResourceRequirements, SeccompProfile, SecretKeySelector, SecretVolumeSource, SecurityContext,
    TCPSocketAction, TopologySpreadConstraint, Volume, VolumeMount, VolumeResourceRequirements, WeightedPodAffinityTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::crd::{Database, S3Target, SpreadRule};
use crate::names::selector;
use crate::object_storage;
use crate::plugin::{EnvSource, ProbeAction, ResourceAmounts};

/// Container environment from plugin variables.
pub fn env(vars: &[crate::plugin::EnvVar]) -> Vec<EnvVar> {
    vars.iter()
        .map(|e| {
            let (value, value_from) = match &e.source {
                EnvSource::Value(v) => (Some(v.clone()), None),
                EnvSource::Secret(s) => (
                    None,
                    Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector { name: s.name.clone(), key: s.key.clone(), optional: None }),
                        ..Default::default()
                    }),
                ),
                EnvSource::Field(f) => (
                    None,
                    Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector { field_path: f.clone(), api_version: None }),
                        ..Default::default()
                    }),
                ),
            };
            EnvVar { name: e.name.clone(), value, value_from }
        })
        .collect()
}

/// A probe from the plugin's.
pub fn probe(p: &crate::plugin::Probe) -> Probe {
    let mut probe = Probe {
        initial_delay_seconds: Some(p.initial_delay_seconds as i32),
        period_seconds: Some(p.period_seconds as i32),
        timeout_seconds: Some(p.timeout_seconds as i32),
        failure_threshold: Some(p.failure_threshold as i32),
        ..Default::default()
    };
    match &p.action {
        ProbeAction::Exec(command) => probe.exec = Some(ExecAction { command: Some(command.clone()) }),
        ProbeAction::TcpSocket(port) => probe.tcp_socket = Some(TCPSocketAction { port: IntOrString::Int(i32::from(*port)), host: None }),
        ProbeAction::HttpGet { path, port, https } => {
            probe.http_get = Some(HTTPGetAction {
                path: Some(path.clone()),
                port: IntOrString::Int(i32::from(*port)),
                scheme: Some(if *https { "HTTPS" } else { "HTTP" }.into()),
                ..Default::default()
            })
        }
        ProbeAction::Grpc(port) => probe.grpc = Some(GRPCAction { port: i32::from(*port), service: None }),
    }
    probe
}

/// The member's resources: the spec's, with the plugin's recommendation for what the
/// spec leaves unset (neither requested nor limited).
pub fn resources(db: &Database, recommended: &ResourceAmounts) -> ResourceRequirements {
    let user = db.spec.resources.clone().unwrap_or_default();
    let mut requests: BTreeMap<String, Quantity> = user.requests.into_iter().map(|(k, v)| (k, Quantity(v.0))).collect();
    let limits: BTreeMap<String, Quantity> = user.limits.into_iter().map(|(k, v)| (k, Quantity(v.0))).collect();
    if !requests.contains_key("cpu")
        && !limits.contains_key("cpu")
        && let Some(m) = recommended.cpu_millis
    {
        requests.insert("cpu".into(), Quantity(format!("{m}m")));
    }
    if !requests.contains_key("memory")
        && !limits.contains_key("memory")
        && let Some(b) = recommended.memory_bytes
    {
        requests.insert("memory".into(), Quantity(b.to_string()));
    }
    ResourceRequirements { requests: Some(requests), limits: Some(limits), ..Default::default() }
}

/// Pod-level security: the plugin's user and group, never root, the runtime's seccomp
/// profile.
pub fn pod_security(uid: u32) -> PodSecurityContext {
    let id = Some(i64::from(uid));
    PodSecurityContext {
        run_as_user: id,
        run_as_group: id,
        fs_group: id,
        run_as_non_root: Some(true),
        seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), localhost_profile: None }),
        ..Default::default()
    }
}

/// Container-level security: no privilege, no escalation, every capability dropped.
pub fn container_security(run_as_non_root: Option<bool>) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        run_as_non_root,
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: None }),
        ..Default::default()
    }
}

/// A mount of volume `name` at `path`.
pub fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount { name: name.into(), mount_path: path.into(), read_only: read_only.then_some(true), ..Default::default() }
}

/// Volume `name` backed by claim `claim`.
pub fn claim_volume(name: &str, claim: &str) -> Volume {
    Volume {
        name: name.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource { claim_name: claim.into(), read_only: None }),
        ..Default::default()
    }
}

/// The spec of a volume claim of `size` in storage class `class` (the cluster's default
/// when `None`).
pub fn claim_spec(size: &str, class: Option<&str>) -> PersistentVolumeClaimSpec {
    PersistentVolumeClaimSpec {
        access_modes: Some(vec!["ReadWriteOnce".into()]),
        resources: Some(VolumeResourceRequirements {
            requests: Some(BTreeMap::from([("storage".into(), Quantity(size.into()))])),
            limits: None,
        }),
        storage_class_name: class.map(Into::into),
        ..Default::default()
    }
}

/// The spec of a member's data claim: `spec.storage` in `spec.storageClassName`.
pub fn data_claim_spec(db: &Database) -> PersistentVolumeClaimSpec {
    claim_spec(&db.spec.storage.0, db.spec.storage_class_name.as_deref())
}

/// Selects the members of `db`.
pub fn member_selector(db: &Database) -> LabelSelector {
    LabelSelector { match_labels: Some(selector(db)), match_expressions: None }
}

/// Members apart on nodes: preferred unless the spec says otherwise.
pub fn affinity(db: &Database) -> Option<Affinity> {
    let term =
        PodAffinityTerm { label_selector: Some(member_selector(db)), topology_key: "kubernetes.io/hostname".into(), ..Default::default() };
    let anti = match db.spec.spread.as_ref().and_then(|s| s.nodes).unwrap_or(SpreadRule::Preferred) {
        SpreadRule::Ignored => return None,
        SpreadRule::Preferred => PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
                weight: 100,
                pod_affinity_term: term,
            }]),
            ..Default::default()
        },
        SpreadRule::Required => {
            PodAntiAffinity { required_during_scheduling_ignored_during_execution: Some(vec![term]), ..Default::default() }
        }
    };
    Some(Affinity { pod_anti_affinity: Some(anti), ..Default::default() })
}

/// Members even across zones, when the spec asks.
pub fn zone_spread(db: &Database) -> Option<Vec<TopologySpreadConstraint>> {
    let when = match db.spec.spread.as_ref().and_then(|s| s.zones).unwrap_or(SpreadRule::Ignored) {
        SpreadRule::Ignored => return None,
        SpreadRule::Preferred => "ScheduleAnyway",
        SpreadRule::Required => "DoNotSchedule",
    };
    Some(vec![TopologySpreadConstraint {
        max_skew: 1,
        topology_key: "topology.kubernetes.io/zone".into(),
        when_unsatisfiable: when.into(),
        label_selector: Some(member_selector(db)),
        ..Default::default()
    }])
}

const CA_MOUNT: &str = "/etc/plugdb/s3-ca";

/// The environment `plugdb transfer` and `plugdb archive` read the bucket `target` from:
/// the access key from the user's Secret (a reference: the key never enters an object
/// plugdb writes).
pub fn bucket_env(target: &S3Target) -> Vec<EnvVar> {
    let value = |name: &str, value: &str| EnvVar { name: name.into(), value: Some(value.into()), ..Default::default() };
    let secret = |name: &str, key: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector { name: target.credentials.secret_name.clone(), key: key.into(), optional: None }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut env = vec![
        value(object_storage::ENV_ENDPOINT, &target.endpoint),
        value(object_storage::ENV_BUCKET, &target.bucket),
        value(object_storage::ENV_REGION, target.region.as_deref().unwrap_or("us-east-1")),
        secret(object_storage::ENV_ACCESS_KEY_ID, &target.credentials.access_key_id_key),
        secret(object_storage::ENV_SECRET_ACCESS_KEY, &target.credentials.secret_access_key_key),
    ];
    if target.ca.is_some() {
        env.push(value(object_storage::ENV_CA_FILE, &format!("{CA_MOUNT}/ca.pem")));
    }
    env
}

/// The volume holding the bucket's private CA, and its mount, when `target` names one.
pub fn bucket_ca(target: &S3Target) -> Option<(Volume, VolumeMount)> {
    let ca = target.ca.as_ref()?;
    let volume = Volume {
        name: "s3-ca".into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(ca.name.clone()),
            items: Some(vec![KeyToPath { key: ca.key.clone(), path: "ca.pem".into(), mode: None }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    Some((volume, mount("s3-ca", CA_MOUNT, true)))
}

/// The volume holding the Database's credentials Secret, and its mount at
/// [`crate::names::CREDENTIALS_MOUNT`]: readable by the workload's group (its fsGroup)
/// only. Optional: an engine that asks for no credentials has no such Secret.
pub fn credentials_volume(db: &Database) -> (Volume, VolumeMount) {
    let volume = Volume {
        name: "credentials".into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(crate::names::Names(&kube::ResourceExt::name_any(db)).credentials()),
            default_mode: Some(0o440),
            optional: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    (volume, mount("credentials", crate::names::CREDENTIALS_MOUNT, true))
}

/// The volume holding the Database's TLS certificate (`<name>-tls`), and its mount at
/// [`crate::tls::MOUNT`]: readable by the workload's group (its fsGroup) only, as
/// PostgreSQL requires of a key owned by root.
pub fn tls_volume(db: &Database) -> (Volume, VolumeMount) {
    let volume = Volume {
        name: "tls".into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(crate::names::Names(&kube::ResourceExt::name_any(db)).tls()),
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Default::default()
    };
    (volume, mount("tls", crate::tls::MOUNT, true))
}

/// Whether the Database's members serve their engine's series (`spec.monitoring.engineMetrics`).
fn measured(db: &Database) -> bool {
    db.spec.monitoring.as_ref().is_none_or(|m| m.engine_metrics)
}

/// Where a member's agent finds the engine's exporter, when [`engine_metrics`] runs one.
pub fn exporter_at(db: &Database, metrics: Option<&crate::plugin::MetricsEndpoint>) -> Option<crate::agent::exporter::At> {
    let metrics = metrics.filter(|m| m.exporter.is_some() && measured(db))?;
    Some(crate::agent::exporter::At { port: metrics.port, path: metrics.path.clone() })
}

/// The name of the members' port that serves the engine's series (the chart's
/// PodMonitor scrapes it by this name).
pub const ENGINE_METRICS_PORT: &str = "engine-metrics";

/// The engine's series for Prometheus, as the plugin's `metrics.endpoint` says, unless
/// `spec.monitoring.engineMetrics` is off: a port named [`ENGINE_METRICS_PORT`] on
/// `engine` (which serves them itself), or the exporter's container beside it, with that
/// port, its own small resources, no volume but its own `/tmp`, and nothing it may
/// escalate to.
pub fn engine_metrics(db: &Database, metrics: Option<&crate::plugin::MetricsEndpoint>, engine: &mut Container) -> Option<Container> {
    let metrics = metrics.filter(|_| measured(db))?;
    let port = ContainerPort {
        name: Some(ENGINE_METRICS_PORT.into()),
        container_port: i32::from(metrics.port),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    let Some(exporter) = &metrics.exporter else {
        engine.ports.get_or_insert_default().push(port);
        return None;
    };
    let quantity = |q: &str| Quantity(q.into());
    Some(Container {
        name: "exporter".into(),
        image: Some(exporter.image.clone()),
        command: (!exporter.command.is_empty()).then(|| exporter.command.clone()),
        env: Some(env(&exporter.env)),
        ports: Some(vec![port]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".into(), quantity("10m")), ("memory".into(), quantity("32Mi"))])),
            limits: Some(BTreeMap::from([("cpu".into(), quantity("250m")), ("memory".into(), quantity("64Mi"))])),
            ..Default::default()
        }),
        volume_mounts: Some(vec![mount("exporter-tmp", "/tmp", false)]),
        security_context: Some(SecurityContext { read_only_root_filesystem: Some(true), ..container_security(Some(true)) }),
        ..Default::default()
    })
}
