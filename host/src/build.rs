//! The pure half of reconciliation: from a Database, the plugin's workload and the
//! cluster's facts to the objects that should exist. No client, no I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::core::{ApiResource, Resource, ResourceExt};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::crd::{Database, DeletionPolicy, Parameter, SpreadRule};
use crate::plugin::{ClusterContext, EngineSpec, EnvSource, ParameterValue, ProbeAction, ResourceAmounts, Violation, Workload};
use crate::quantity;

/// The field manager of every write the operator makes.
pub const MANAGER: &str = "plugdb";
/// Annotation holding the hash of the desired object last applied.
pub const APPLIED_HASH: &str = "plugdb.io/applied-hash";
/// Annotation on the pod template holding the hash of the config files.
pub const CONFIG_HASH: &str = "plugdb.io/config-hash";
/// Label on member pods naming their role (`primary` or `replica`).
pub const ROLE_LABEL: &str = "plugdb.io/role";
/// Where config files are mounted in every member.
pub const CONFIG_MOUNT: &str = "/etc/plugdb";
/// Where the backup volume is mounted in backup and restore Jobs.
pub const BACKUP_MOUNT: &str = "/backups";
/// Longest Database name: pod names `<name>-<ordinal>` must stay valid label values.
pub const MAX_NAME: usize = 52;

/// Names of a Database's children.
pub struct Names<'a>(pub &'a str);

impl Names<'_> {
    /// Credentials Secret.
    pub fn credentials(&self) -> String {
        format!("{}-credentials", self.0)
    }
    /// Config ConfigMap.
    pub fn config(&self) -> String {
        format!("{}-config", self.0)
    }
    /// Primary (read-write) Service and the StatefulSet.
    pub fn primary(&self) -> String {
        self.0.to_string()
    }
    /// Read-only Service.
    pub fn replicas(&self) -> String {
        format!("{}-replicas", self.0)
    }
    /// Headless Service.
    pub fn headless(&self) -> String {
        format!("{}-headless", self.0)
    }
    /// Backup volume claim.
    pub fn backups(&self) -> String {
        format!("{}-backups", self.0)
    }
    /// Pod of member `ordinal`.
    pub fn pod(&self, ordinal: u32) -> String {
        format!("{}-{ordinal}", self.0)
    }
    /// Data volume claim of member `ordinal` (the StatefulSet's naming).
    pub fn data_claim(&self, ordinal: u32) -> String {
        format!("data-{}-{ordinal}", self.0)
    }
}

/// Labels every child and member pod carries.
pub fn labels(db: &Database) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), db.spec.engine.clone()),
        ("app.kubernetes.io/instance".to_string(), db.name_any()),
        ("app.kubernetes.io/managed-by".to_string(), MANAGER.to_string()),
    ])
}

/// Selector matching the member pods of a Database.
pub fn selector(db: &Database) -> BTreeMap<String, String> {
    let mut l = labels(db);
    l.remove("app.kubernetes.io/managed-by");
    l
}

/// The Database's spec as the plugin sees it, or what is wrong with it.
pub fn engine_spec(db: &Database, version: &str) -> Result<EngineSpec, Vec<Violation>> {
    let mut problems = Vec::new();
    let mut problem = |field: &str, message: String| problems.push(Violation { field: field.into(), message });
    let name = db.name_any();
    if name.len() > MAX_NAME {
        problem("metadata.name", format!("must be at most {MAX_NAME} characters so member pod names stay valid"));
    }
    let storage_bytes = quantity::bytes(&db.spec.storage.0).unwrap_or_else(|| {
        problem("spec.storage", format!("{:?} is not a quantity such as 10Gi", db.spec.storage.0));
        0
    });
    let mut amounts = |field: &str, map: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
        let mut out = ResourceAmounts::default();
        for (key, q) in map.into_iter().flatten() {
            match key.as_str() {
                "cpu" => {
                    out.cpu_millis = quantity::millis(&q.0).or_else(|| {
                        problem(&format!("{field}.cpu"), format!("{:?} is not a CPU quantity such as 500m", q.0));
                        None
                    })
                }
                "memory" => {
                    out.memory_bytes = quantity::bytes(&q.0).or_else(|| {
                        problem(&format!("{field}.memory"), format!("{:?} is not a memory quantity such as 1Gi", q.0));
                        None
                    })
                }
                other => problem(&format!("{field}.{other}"), "only cpu and memory are supported".into()),
            }
        }
        out
    };
    let resources = db.spec.resources.as_ref();
    let requests = amounts("spec.resources.requests", resources.map(|r| &r.requests));
    let limits = amounts("spec.resources.limits", resources.map(|r| &r.limits));
    let spec = EngineSpec {
        name,
        namespace: db.namespace().unwrap_or_default(),
        version: version.to_string(),
        replicas: db.spec.replicas.max(1) as u32,
        storage_bytes,
        requests,
        limits,
        parameters: db
            .spec
            .parameters
            .iter()
            .map(|(k, v)| {
                let value = match v {
                    Parameter::Integer(n) => ParameterValue::Integer(*n),
                    Parameter::Text(s) => ParameterValue::Text(s.clone()),
                };
                (k.clone(), value)
            })
            .collect(),
    };
    if problems.is_empty() { Ok(spec) } else { Err(problems) }
}

/// What the plugin is told about the cluster around the workload.
pub fn cluster_context(db: &Database, primary_pod: &str) -> ClusterContext {
    let name = db.name_any();
    let n = Names(&name);
    let ns = db.namespace().unwrap_or_default();
    ClusterContext {
        primary_host: format!("{}.{ns}.svc", n.primary()),
        headless_host: format!("{}.{ns}.svc", n.headless()),
        primary_pod: primary_pod.to_string(),
        credentials_secret: n.credentials(),
        config_mount_path: CONFIG_MOUNT.into(),
    }
}

/// Every kind of object a Database owns. The watch caches and the write path match on
/// it exhaustively: a new kind of child does not compile until it is cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The credentials.
    Secret,
    /// The configuration files.
    ConfigMap,
    /// The read-write, read-only and headless Services.
    Service,
    /// The members.
    StatefulSet,
    /// The members' disruption budget.
    PodDisruptionBudget,
    /// Backups, restores and upgrade steps.
    Job,
    /// The backups volume and restored data volumes.
    PersistentVolumeClaim,
}

/// A Kubernetes type that plugdb makes as a child, and which [`Kind`] it is.
pub trait Owned: Resource<DynamicType = ()> {
    /// Its kind.
    const KIND: Kind;
}

macro_rules! owned {
    ($($ty:ty => $kind:ident),* $(,)?) => {
        $(impl Owned for $ty {
            const KIND: Kind = Kind::$kind;
        })*
    };
}

owned! {
    k8s_openapi::api::core::v1::Secret => Secret,
    ConfigMap => ConfigMap,
    Service => Service,
    StatefulSet => StatefulSet,
    PodDisruptionBudget => PodDisruptionBudget,
    k8s_openapi::api::batch::v1::Job => Job,
    k8s_openapi::api::core::v1::PersistentVolumeClaim => PersistentVolumeClaim,
}

/// A desired child: what kind, which name, the object to apply.
#[derive(Debug, Clone, PartialEq)]
pub struct Child {
    /// Which kind of child it is.
    pub kind: Kind,
    /// Its API resource.
    pub resource: ApiResource,
    /// Its name.
    pub name: String,
    /// The object, with apiVersion, kind and metadata (carrying [`APPLIED_HASH`]).
    pub object: Value,
}

impl Child {
    /// A child of kind `K`; records the hash of `object` in it.
    pub fn new<K: Owned>(name: String, mut object: Value) -> Self {
        let resource = ApiResource::erase::<K>(&());
        object["apiVersion"] = json!(resource.api_version);
        object["kind"] = json!(resource.kind);
        let hash = hex(&serde_json::to_vec(&object).unwrap_or_default());
        object["metadata"]["annotations"][APPLIED_HASH] = json!(hash);
        Self { kind: K::KIND, resource, name, object }
    }

    /// The hash recorded in the object.
    pub fn hash(&self) -> &str {
        self.object["metadata"]["annotations"][APPLIED_HASH].as_str().unwrap_or_default()
    }
}

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().take(16).map(|b| format!("{b:02x}")).collect()
}

fn owner(db: &Database) -> Option<OwnerReference> {
    db.controller_owner_ref(&())
}

fn metadata(db: &Database, name: &str, owned: bool) -> Value {
    metadata_with(db, name, owned, &labels(db))
}

/// Metadata of a child: name, namespace, `labels`, and an owner reference to the
/// Database when `owned`.
pub fn metadata_with(db: &Database, name: &str, owned: bool, labels: &BTreeMap<String, String>) -> Value {
    json!({
        "name": name,
        "namespace": db.namespace(),
        "labels": labels,
        "ownerReferences": if owned { owner(db).into_iter().collect::<Vec<_>>() } else { vec![] },
        "annotations": {},
    })
}

/// The spec of a volume claim of `size` in storage class `class` (the cluster's default
/// when `None`).
pub fn claim_spec(size: &str, class: Option<&str>) -> Value {
    let mut spec = json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}});
    if let Some(class) = class {
        spec["storageClassName"] = json!(class);
    }
    spec
}

/// The spec of a member's data claim: `spec.storage` in `spec.storageClassName`.
pub fn data_claim_spec(db: &Database) -> Value {
    claim_spec(&db.spec.storage.0, db.spec.storage_class_name.as_deref())
}

/// Container environment from plugin variables.
pub fn env_json(env: &[crate::plugin::EnvVar]) -> Vec<Value> {
    env.iter()
        .map(|e| match &e.source {
            EnvSource::Value(v) => json!({"name": e.name, "value": v}),
            EnvSource::Secret(s) => json!({"name": e.name, "valueFrom": {"secretKeyRef": {"name": s.name, "key": s.key}}}),
            EnvSource::Field(f) => json!({"name": e.name, "valueFrom": {"fieldRef": {"fieldPath": f}}}),
        })
        .collect()
}

fn probe_json(p: &crate::plugin::Probe) -> Value {
    let mut probe = json!({
        "initialDelaySeconds": p.initial_delay_seconds,
        "periodSeconds": p.period_seconds,
        "timeoutSeconds": p.timeout_seconds,
        "failureThreshold": p.failure_threshold,
    });
    match &p.action {
        ProbeAction::Exec(cmd) => probe["exec"] = json!({"command": cmd}),
        ProbeAction::TcpSocket(port) => probe["tcpSocket"] = json!({"port": port}),
    }
    probe
}

fn resources_json(db: &Database, recommended: &ResourceAmounts) -> Value {
    let user = db.spec.resources.clone().unwrap_or_default();
    let mut requests: BTreeMap<String, String> = user.requests.into_iter().map(|(k, v)| (k, v.0)).collect();
    let limits: BTreeMap<String, String> = user.limits.into_iter().map(|(k, v)| (k, v.0)).collect();
    if !requests.contains_key("cpu")
        && !limits.contains_key("cpu")
        && let Some(m) = recommended.cpu_millis
    {
        requests.insert("cpu".into(), format!("{m}m"));
    }
    if !requests.contains_key("memory")
        && !limits.contains_key("memory")
        && let Some(b) = recommended.memory_bytes
    {
        requests.insert("memory".into(), b.to_string());
    }
    json!({"requests": requests, "limits": limits})
}

/// Hash of the config files: on the pod template, so a config change rolls the members.
pub fn config_hash(workload: &Workload) -> String {
    let files: Vec<(&str, &str)> = workload.config_files.iter().map(|f| (f.name.as_str(), f.content.as_str())).collect();
    hex(&serde_json::to_vec(&files).unwrap_or_default())
}

/// The ConfigMap holding the plugin's config files.
pub fn config_map(db: &Database, workload: &Workload) -> Child {
    let data: BTreeMap<&str, &str> = workload.config_files.iter().map(|f| (f.name.as_str(), f.content.as_str())).collect();
    let name = Names(&db.name_any()).config();
    Child::new::<ConfigMap>(name.clone(), json!({"metadata": metadata(db, &name, true), "data": data}))
}

fn service_ports(workload: &Workload) -> Vec<Value> {
    workload.ports.iter().map(|p| json!({"name": p.name, "port": p.port, "targetPort": p.name, "protocol": "TCP"})).collect()
}

/// The three Services: primary (read-write), replicas (read-only) and headless.
pub fn services(db: &Database, workload: &Workload, primary_pod: &str) -> Vec<Child> {
    let name = db.name_any();
    let names = Names(&name);
    let mut primary_selector = selector(db);
    primary_selector.insert("statefulset.kubernetes.io/pod-name".into(), primary_pod.into());
    let mut replica_selector = selector(db);
    replica_selector.insert(ROLE_LABEL.into(), "replica".into());
    let ports = service_ports(workload);
    vec![
        Child::new::<Service>(
            names.primary(),
            json!({"metadata": metadata(db, &names.primary(), true), "spec": {"selector": primary_selector, "ports": ports}}),
        ),
        Child::new::<Service>(
            names.replicas(),
            json!({"metadata": metadata(db, &names.replicas(), true), "spec": {"selector": replica_selector, "ports": ports}}),
        ),
        Child::new::<Service>(
            names.headless(),
            json!({"metadata": metadata(db, &names.headless(), true), "spec": {"clusterIP": "None", "publishNotReadyAddresses": true, "selector": selector(db), "ports": ports}}),
        ),
    ]
}

/// The StatefulSet running the members.
pub fn statefulset(db: &Database, workload: &Workload, engine: &str) -> Child {
    let n = db.name_any();
    let names = Names(&n);
    let mut mounts = vec![
        json!({"name": "data", "mountPath": workload.data_mount_path}),
        json!({"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": true}),
    ];
    mounts.push(json!({"name": "tmp", "mountPath": "/tmp"}));
    let mut container = json!({
        "name": engine,
        "image": workload.image,
        "env": env_json(&workload.env),
        "ports": workload.ports.iter().map(|p| json!({"name": p.name, "containerPort": p.port, "protocol": "TCP"})).collect::<Vec<_>>(),
        "resources": resources_json(db, &workload.recommended),
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "privileged": false,
            "runAsNonRoot": true,
            "capabilities": {"drop": ["ALL"]},
        },
    });
    if !workload.command.is_empty() {
        container["command"] = json!(workload.command);
    }
    if !workload.args.is_empty() {
        container["args"] = json!(workload.args);
    }
    if let Some(p) = &workload.readiness {
        container["readinessProbe"] = probe_json(p);
    }
    if let Some(p) = &workload.liveness {
        container["livenessProbe"] = probe_json(p);
    }
    let retention = match db.spec.deletion_policy {
        DeletionPolicy::Delete => json!({"whenDeleted": "Delete", "whenScaled": "Delete"}),
        DeletionPolicy::Snapshot | DeletionPolicy::Retain => json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
    };
    let claim = json!({"metadata": {"name": "data", "labels": labels(db)}, "spec": data_claim_spec(db)});
    let uid = workload.run_as_user;
    let mut pod = json!({
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 60,
        "securityContext": {"runAsUser": uid, "runAsGroup": uid, "fsGroup": uid, "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [
            {"name": "config", "configMap": {"name": names.config(), "defaultMode": 0o555}},
            {"name": "tmp", "emptyDir": {}},
        ],
    });
    if let Some(affinity) = affinity(db) {
        pod["affinity"] = affinity;
    }
    if let Some(spread) = zone_spread(db) {
        pod["topologySpreadConstraints"] = spread;
    }
    Child::new::<StatefulSet>(
        names.primary(),
        json!({
            "metadata": metadata(db, &names.primary(), true),
            "spec": {
                "replicas": db.spec.replicas,
                "serviceName": names.headless(),
                "podManagementPolicy": "Parallel",
                "updateStrategy": {"type": "OnDelete"},
                "persistentVolumeClaimRetentionPolicy": retention,
                "selector": {"matchLabels": selector(db)},
                "template": {
                    "metadata": {"labels": labels(db), "annotations": {CONFIG_HASH: config_hash(workload)}},
                    "spec": pod,
                },
                "volumeClaimTemplates": [claim],
            },
        }),
    )
}

/// Members apart on nodes: preferred unless the spec says otherwise.
fn affinity(db: &Database) -> Option<Value> {
    let term = json!({"labelSelector": {"matchLabels": selector(db)}, "topologyKey": "kubernetes.io/hostname"});
    match db.spec.spread.as_ref().and_then(|s| s.nodes).unwrap_or(SpreadRule::Preferred) {
        SpreadRule::Ignored => None,
        SpreadRule::Preferred => Some(
            json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}}),
        ),
        SpreadRule::Required => Some(json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}})),
    }
}

/// Members even across zones, when the spec asks.
fn zone_spread(db: &Database) -> Option<Value> {
    let when = match db.spec.spread.as_ref().and_then(|s| s.zones).unwrap_or(SpreadRule::Ignored) {
        SpreadRule::Ignored => return None,
        SpreadRule::Preferred => "ScheduleAnyway",
        SpreadRule::Required => "DoNotSchedule",
    };
    Some(
        json!([{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": when, "labelSelector": {"matchLabels": selector(db)}}]),
    )
}

/// The PodDisruptionBudget: at most one member down at a time by voluntary disruption.
pub fn disruption_budget(db: &Database) -> Child {
    let n = db.name_any();
    Child::new::<PodDisruptionBudget>(
        n.clone(),
        json!({"metadata": metadata(db, &n, true), "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(db)}}}),
    )
}

/// Every child rendered from the workload, in apply order.
pub fn children(db: &Database, workload: &Workload, engine: &str, primary_pod: &str) -> Vec<Child> {
    let mut out = vec![config_map(db, workload)];
    out.extend(services(db, workload, primary_pod));
    out.push(statefulset(db, workload, engine));
    out.push(disruption_budget(db));
    out
}

#[cfg(test)]
mod tests;
