//! The pure half of reconciliation: from a Database, the plugin's workload and the
//! cluster's facts to the objects that should exist. No client, no I/O.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, PersistentVolumeClaim, PodSpec, PodTemplateSpec,
    ResourceRequirements, Service, ServicePort, ServiceSpec, Volume,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::{ApiResource, Resource, ResourceExt};
use serde_json::{Value, json};

use crate::crd::{Database, DeletionPolicy, Parameter, S3Target};
use crate::images::Pull;
use crate::names::{
    APPLIED_HASH, ARCHIVE_MOUNT, CLIENT_COMMAND, CONFIG_HASH, CONFIG_MOUNT, MAX_NAME, Names, PRIMARY_ANNOTATION, ROLE_FREE_HASH,
    ROLE_LABEL, TLS_STAMP, hex, labels, metadata, selector,
};
use crate::plugin::{ClusterContext, EngineSpec, ParameterValue, ResourceAmounts, Violation, Workload};
use crate::quantity;

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
        tls: db.spec.tls_enabled().then(crate::tls::files),
        synchronous_replicas: db.spec.synchronous_replicas(),
    };
    if problems.is_empty() { Ok(spec) } else { Err(problems) }
}

/// What the plugin is told about the cluster around the workload; `archive`: the
/// members archive their log (see [`Archiver`]).
pub fn cluster_context(db: &Database, primary_pod: &str, archive: bool) -> ClusterContext {
    let name = db.name_any();
    let n = Names(&name);
    let ns = db.namespace().unwrap_or_default();
    ClusterContext {
        primary_host: n.primary_host(&ns),
        headless_host: format!("{}.{ns}.svc", n.headless()),
        primary_pod: primary_pod.to_string(),
        credentials_secret: n.credentials(),
        config_mount_path: CONFIG_MOUNT.into(),
        archive_directory: archive.then(|| ARCHIVE_MOUNT.into()),
        restoring: false,
    }
}

/// The container beside each member that ships the engine's finished log segments from
/// [`ARCHIVE_MOUNT`] to the Database's bucket: `plugdb archive`, from the operator's image.
#[derive(Debug, Clone, Copy)]
pub struct Archiver<'a> {
    /// The Database's backup bucket.
    pub target: &'a S3Target,
    /// The operator's image.
    pub image: &'a str,
}

impl Archiver<'_> {
    fn container(&self, db: &Database) -> (Container, Option<Volume>) {
        let key = crate::object_storage::database_key(&self.target.prefix, &db.namespace().unwrap_or_default(), &db.name_any())
            .join(crate::object_storage::ARCHIVE);
        let mut mounts = vec![pod::mount("archive", ARCHIVE_MOUNT, false)];
        let ca = pod::bucket_ca(self.target);
        mounts.extend(ca.as_ref().map(|(_, mount)| mount.clone()));
        let container = Container {
            name: "archive".into(),
            image: Some(self.image.into()),
            command: Some(vec![
                crate::names::OPERATOR_BINARY.into(),
                "archive".into(),
                "--dir".into(),
                ARCHIVE_MOUNT.into(),
                "--key".into(),
                key.to_string(),
            ]),
            env: Some(pod::bucket_env(self.target)),
            volume_mounts: Some(mounts),
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([("cpu".into(), Quantity("10m".into())), ("memory".into(), Quantity("32Mi".into()))])),
                limits: Some(BTreeMap::from([("memory".into(), Quantity("128Mi".into()))])),
                ..Default::default()
            }),
            security_context: Some(pod::container_security(Some(true))),
            ..Default::default()
        };
        (container, ca.map(|(volume, _)| volume))
    }
}

/// What the host adds to the members' pods: the containers beside the engine, from the
/// operator's image, and where every image is pulled from.
#[derive(Debug, Clone, Copy)]
pub struct Sidecars<'a> {
    /// Ships the log for point-in-time recovery.
    pub archiver: Option<Archiver<'a>>,
    /// The member agent (when the plugin has a status command).
    pub agent: Option<AgentSidecar<'a>>,
    /// The registry and pull Secrets.
    pub pull: &'a Pull,
}

/// The member agent beside the engine: from the operator's image, obeying the operator's
/// authority alone (its fingerprint, [`crate::agent::Trust::clients`]).
#[derive(Debug, Clone, Copy)]
pub struct AgentSidecar<'a> {
    /// The operator's image, which the agent's binary is copied from.
    pub image: &'a str,
    /// The SHA-256 of the operator's authority's certificate.
    pub clients: &'a str,
    /// Where the operator reaches the agents from (`plugdb run --agent-from`): the only
    /// peers the members' NetworkPolicy lets reach the agent's port. Empty: unknown.
    pub operator: &'a [k8s_openapi::api::networking::v1::NetworkPolicyPeer],
    /// How the agent logs (the operator's own format).
    pub logs: crate::logging::LogFormat,
}

impl Default for Sidecars<'_> {
    fn default() -> Self {
        Self { archiver: None, agent: None, pull: &crate::images::DEFAULT }
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
    /// Who may reach the members.
    NetworkPolicy,
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

impl<K: Owned> Owned for kube::api::PartialObjectMeta<K> {
    const KIND: Kind = K::KIND;
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
    k8s_openapi::api::networking::v1::NetworkPolicy => NetworkPolicy,
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
    pub fn new<K: Owned + serde::Serialize>(name: String, object: K) -> Self {
        let resource = ApiResource::erase::<K>(&());
        let mut object = serde_json::to_value(&object).unwrap_or_default();
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

/// Hash of the config files: on the pod template, so a config change rolls the members.
pub fn config_hash(workload: &Workload) -> String {
    let files: Vec<(&str, &str)> = workload.config_files.iter().map(|f| (f.name.as_str(), f.content.as_str())).collect();
    hex(&serde_json::to_vec(&files).unwrap_or_default())
}

/// The ConfigMap holding the plugin's config files.
pub fn config_map(db: &Database, workload: &Workload) -> Child {
    let data = workload.config_files.iter().map(|f| (f.name.clone(), f.content.clone())).collect();
    let name = Names(&db.name_any()).config();
    Child::new(name.clone(), ConfigMap { metadata: metadata(db, &name, true), data: Some(data), ..Default::default() })
}

/// The label the StatefulSet controller puts on each of its pods: the pod's name.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";

/// The three Services: primary (read-write), replicas (read-only) and headless.
pub fn services(db: &Database, workload: &Workload, primary_pod: &str) -> Vec<Child> {
    let name = db.name_any();
    let names = Names(&name);
    let mut primary_selector = selector(db);
    primary_selector.insert(POD_NAME_LABEL.into(), primary_pod.into());
    let mut replica_selector = selector(db);
    replica_selector.insert(ROLE_LABEL.into(), "replica".into());
    let ports: Vec<ServicePort> = workload
        .ports
        .iter()
        .map(|p| ServicePort {
            name: Some(p.name.clone()),
            port: i32::from(p.port),
            target_port: Some(IntOrString::String(p.name.clone())),
            protocol: Some("TCP".into()),
            ..Default::default()
        })
        .collect();
    let service = |name: String, spec: ServiceSpec| {
        let metadata = metadata(db, &name, true);
        Child::new(name, Service { metadata, spec: Some(ServiceSpec { ports: Some(ports.clone()), ..spec }), ..Default::default() })
    };
    vec![
        service(names.primary(), ServiceSpec { selector: Some(primary_selector), ..Default::default() }),
        service(names.replicas(), ServiceSpec { selector: Some(replica_selector), ..Default::default() }),
        service(
            names.headless(),
            ServiceSpec {
                cluster_ip: Some("None".into()),
                publish_not_ready_addresses: Some(true),
                selector: Some(selector(db)),
                ..Default::default()
            },
        ),
    ]
}

/// What a Database's children are rendered from, besides the Database: the plugin's
/// workload and what the pass chose around it.
#[derive(Debug, Clone, Copy)]
pub struct Rendered<'a> {
    /// The plugin's workload.
    pub workload: &'a Workload,
    /// The engine's name (the engine container's).
    pub engine: &'a str,
    /// What runs beside the engine.
    pub sidecars: Sidecars<'a>,
    /// The member the read-write Service selects.
    pub primary: &'a str,
    /// The primary the workload was rendered for (for an engine that elects its leader,
    /// always member 0: a new leader restarts nothing).
    pub rendered_for: &'a str,
    /// How many members (the spec's once a scale plan got there).
    pub replicas: u32,
    /// Who leads the members.
    pub leadership: Leadership,
    /// The stamp (expiry) of the Database's certificate, when the members mount it: on the
    /// pod template, it rolls the members onto a renewed one.
    pub tls: Option<&'a str>,
}

/// The members' StatefulSet, typed, with what a pass compares of its template.
#[derive(Debug, Clone, PartialEq)]
pub struct Members {
    /// The StatefulSet.
    pub set: StatefulSet,
    /// The hash of its pod template with the primary's name blanked
    /// ([`ROLE_FREE_HASH`]): members that differ from it only by who leads are not rolled.
    pub role_free: String,
}

impl Members {
    /// The StatefulSet as a child to apply.
    pub fn child(self) -> Child {
        Child::new(self.set.name_any(), self.set)
    }
}

/// The members' StatefulSet, as [`Rendered`] says.
pub fn statefulset(db: &Database, rendered: &Rendered<'_>) -> Members {
    let Rendered { workload, engine, sidecars, rendered_for, replicas, tls, .. } = *rendered;
    let n = db.name_any();
    let names = Names(&n);
    // Passwords as files ([`CREDENTIALS_MOUNT`]), for the engine, its init containers and
    // its agent.
    let credentials = pod::credentials_volume(db);
    let container = Container {
        name: engine.into(),
        image: Some(workload.image.clone()),
        command: (!workload.command.is_empty()).then(|| workload.command.clone()),
        args: (!workload.args.is_empty()).then(|| workload.args.clone()),
        env: Some(pod::env(&workload.env)),
        ports: Some(
            workload
                .ports
                .iter()
                .map(|p| ContainerPort {
                    name: Some(p.name.clone()),
                    container_port: i32::from(p.port),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                })
                .collect(),
        ),
        resources: Some(pod::resources(db, &workload.recommended)),
        // A start that fails leaves the end of its log as the container's last words, which
        // the operator names when the member crash loops.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(vec![
            pod::mount("data", &workload.data_mount_path, false),
            pod::mount("config", CONFIG_MOUNT, true),
            credentials.1,
            pod::mount("tmp", "/tmp", false),
        ]),
        readiness_probe: workload.readiness.as_ref().map(pod::probe),
        liveness_probe: workload.liveness.as_ref().map(pod::probe),
        security_context: Some(pod::container_security(Some(true))),
        ..Default::default()
    };
    let retain = match db.spec.deletion_policy {
        DeletionPolicy::Delete => "Delete",
        DeletionPolicy::Snapshot | DeletionPolicy::Retain => "Retain",
    };
    let claim = PersistentVolumeClaim {
        metadata: ObjectMeta { name: Some("data".into()), labels: Some(labels(db)), ..Default::default() },
        spec: Some(pod::data_claim_spec(db)),
        ..Default::default()
    };
    // The plugin's init containers see what the engine sees, but the archive.
    let mut init: Vec<Container> = workload
        .init_containers
        .iter()
        .map(|c| Container {
            name: format!("init-{}", c.name),
            image: Some(c.image.clone()),
            command: Some(c.command.clone()),
            env: Some(pod::env(&c.env)),
            resources: container.resources.clone(),
            volume_mounts: container.volume_mounts.clone(),
            security_context: Some(pod::container_security(Some(true))),
            ..Default::default()
        })
        .collect();
    let mut container = container;
    let exporter = pod::engine_metrics(db, workload.metrics.as_ref(), &mut container);
    let mut containers = vec![container];
    let mut template_annotations = BTreeMap::from([(CONFIG_HASH.to_string(), config_hash(workload))]);
    let mut volumes = vec![
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource { name: names.config(), default_mode: Some(0o555), ..Default::default() }),
            ..Default::default()
        },
        credentials.0,
        Volume { name: "tmp".into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Default::default() },
    ];
    if let Some(archiver) = sidecars.archiver {
        let (sidecar, ca) = archiver.container(db);
        containers[0].volume_mounts.get_or_insert_default().push(pod::mount("archive", ARCHIVE_MOUNT, false));
        containers.push(sidecar);
        volumes.push(Volume { name: "archive".into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Default::default() });
        volumes.extend(ca);
    }
    if let Some(stamp) = tls {
        let (volume, mount) = pod::tls_volume(db);
        containers[0].volume_mounts.get_or_insert_default().push(mount.clone());
        for c in &mut init {
            c.volume_mounts.get_or_insert_default().push(mount.clone());
        }
        volumes.push(volume);
        template_annotations.insert(TLS_STAMP.to_string(), stamp.to_string());
    }
    if let Some(sidecar) = sidecars.agent.filter(|_| !workload.status_command.is_empty()) {
        // Beside the engine, with what it sees (its environment, files and certificate).
        let (copy, agent, agent_volumes) = agent::containers(db, sidecar, &mut containers[0], workload);
        init.insert(0, copy);
        containers.push(agent);
        volumes.extend(agent_volumes);
        // For a Prometheus that discovers pods by their annotations.
        let scraped = [
            ("prometheus.io/scrape", "true".to_string()),
            ("prometheus.io/port", crate::agent::metrics::PORT.to_string()),
            ("prometheus.io/path", "/metrics".into()),
        ];
        template_annotations.extend(scraped.map(|(k, v)| (k.to_string(), v)));
    }
    if let Some(exporter) = exporter {
        containers.push(exporter);
        volumes.push(Volume { name: "exporter-tmp".into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Default::default() });
    }
    let mut pod = PodSpec {
        automount_service_account_token: Some(false),
        termination_grace_period_seconds: Some(60),
        security_context: Some(pod::pod_security(workload.run_as_user)),
        init_containers: (!init.is_empty()).then_some(init),
        containers,
        volumes: Some(volumes),
        affinity: pod::affinity(db),
        topology_spread_constraints: pod::zone_spread(db),
        ..Default::default()
    };
    sidecars.pull.pod(&mut pod);
    // The template with the primary's name blanked wherever it is a whole value.
    let unnamed = serde_json::to_string(&(&template_annotations, &pod)).unwrap_or_default().replace(&format!("\"{rendered_for}\""), "\"\"");
    let role_free = hex(unnamed.as_bytes());
    template_annotations.insert(ROLE_FREE_HASH.to_string(), role_free.clone());
    template_annotations.insert(PRIMARY_ANNOTATION.to_string(), rendered_for.to_string());
    let spec = StatefulSetSpec {
        replicas: Some(replicas as i32),
        service_name: Some(names.headless()),
        pod_management_policy: Some("Parallel".into()),
        update_strategy: Some(StatefulSetUpdateStrategy { type_: Some("OnDelete".into()), rolling_update: None }),
        persistent_volume_claim_retention_policy: Some(StatefulSetPersistentVolumeClaimRetentionPolicy {
            when_deleted: Some(retain.into()),
            when_scaled: Some(retain.into()),
        }),
        selector: pod::member_selector(db),
        template: PodTemplateSpec {
            metadata: Some(ObjectMeta { labels: Some(labels(db)), annotations: Some(template_annotations), ..Default::default() }),
            spec: Some(pod),
        },
        volume_claim_templates: Some(vec![claim]),
        ..Default::default()
    };
    let mut metadata = metadata(db, &names.primary(), true);
    if !workload.client_command.is_empty() {
        // For `kubectl plugdb connect`, on the StatefulSet (not its pods: no member restarts for it).
        let argv = serde_json::to_string(&workload.client_command).unwrap_or_default();
        metadata.annotations.get_or_insert_default().insert(CLIENT_COMMAND.to_string(), argv);
    }
    Members { set: StatefulSet { metadata, spec: Some(spec), ..Default::default() }, role_free }
}

/// Who leads the members, for their disruption budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leadership {
    /// The host chooses the primary, and switches over before a drain evicts it.
    HostChosen,
    /// The engine elects its own leader (a leader's eviction is one member down).
    Elected,
}

impl Leadership {
    /// Who leads the members of `plugin`'s engine.
    pub fn of(plugin: &crate::plugin::Plugin) -> Self {
        if plugin.info().capabilities.elects_leader { Self::Elected } else { Self::HostChosen }
    }
}

/// The PodDisruptionBudgets: at most one member down at a time by voluntary disruption.
/// Where the host chooses the primary, the primary's own budget holds its eviction back
/// while another member could lead (a drain waits while the operator switches over; see
/// [`crate::reconcile`]'s switchover stage), and the other budget counts the others: an
/// eviction API refuses a pod two budgets select. A single member is evicted as any.
/// Both say how many must stay (`minAvailable`): a budget that says how many may go
/// counts every member of the StatefulSet as expected, the primary with the others.
pub fn disruption_budgets(db: &Database, leadership: Leadership, replicas: u32) -> Vec<Child> {
    let n = db.name_any();
    let budget = |name: String, selector: LabelSelector, stay: IntOrString| {
        let (max_unavailable, min_available) = match leadership {
            Leadership::Elected => (Some(stay), None),
            Leadership::HostChosen => (None, Some(stay)),
        };
        let spec =
            PodDisruptionBudgetSpec { max_unavailable, min_available, selector: Some(selector), unhealthy_pod_eviction_policy: None };
        Child::new(name.clone(), PodDisruptionBudget { metadata: metadata(db, &name, true), spec: Some(spec), ..Default::default() })
    };
    let members = pod::member_selector(db);
    if leadership == Leadership::Elected {
        return vec![budget(n, members, IntOrString::Int(1))];
    }
    let role = |operator: &str| LabelSelectorRequirement {
        key: ROLE_LABEL.into(),
        operator: operator.into(),
        values: Some(vec!["primary".into()]),
    };
    let with = |requirement| LabelSelector { match_expressions: Some(vec![requirement]), ..members.clone() };
    let others_stay = replicas.saturating_sub(2) as i32;
    let primary_stays = i32::from(replicas > 1);
    vec![
        budget(n.clone(), with(role("NotIn")), IntOrString::Int(others_stay)),
        // Held back too while it is not ready: fenced for the switchover, it is evicted
        // once another member leads; down, once a failover has promoted another.
        budget(Names(&n).primary_budget(), with(role("In")), IntOrString::Int(primary_stays)),
    ]
}

/// Every child of a Database, rendered.
#[derive(Debug, Clone)]
pub struct Children {
    /// The configuration files.
    pub config: Child,
    /// The read-write, read-only and headless Services.
    pub services: Vec<Child>,
    /// The members.
    pub members: Members,
    /// The members' disruption budgets (they follow who leads).
    pub budgets: Vec<Child>,
    /// Who may reach the members.
    pub policy: Child,
}

impl IntoIterator for Children {
    type Item = Child;
    type IntoIter = std::vec::IntoIter<Child>;

    /// The children in apply order: what the members mount and are reached by first.
    fn into_iter(self) -> Self::IntoIter {
        let mut out = vec![self.config];
        out.extend(self.services);
        out.push(self.members.child());
        out.extend(self.budgets);
        out.push(self.policy);
        out.into_iter()
    }
}

/// Every child rendered from the workload: the Services select `rendered.primary`; the
/// members' template is the workload's, rendered for `rendered.rendered_for`.
pub fn children(db: &Database, rendered: &Rendered<'_>) -> Children {
    Children {
        config: config_map(db, rendered.workload),
        services: services(db, rendered.workload, rendered.primary),
        members: statefulset(db, rendered),
        budgets: disruption_budgets(db, rendered.leadership, rendered.replicas),
        policy: network::network_policy(db, rendered.sidecars.agent.as_ref()),
    }
}

pub mod agent;
pub mod network;
pub mod pod;

#[cfg(test)]
mod tests;
