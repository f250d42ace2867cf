//! Host-side view of the plugin contract (`wit/engine.wit`). The rest of the host
//! speaks these types; only `convert` knows the generated bindings.

use serde::Serialize;

/// What a plugin says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginInfo {
    /// Engine name users write in `spec.engine`.
    pub engine: String,
    /// The plugin's own version.
    pub plugin_version: String,
    /// The contract version the plugin was built against.
    pub contract_version: String,
    /// Engine versions the plugin can run.
    pub supported_versions: Vec<String>,
    /// Version used when `spec.version` is empty.
    pub default_version: String,
    /// Port clients connect to.
    pub default_port: u16,
    /// Optional behaviour the plugin implements.
    pub capabilities: Capabilities,
}

/// Optional behaviour of a plugin.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// `backup` returns a plan.
    pub backup: bool,
    /// `restore` returns a plan.
    pub restore: bool,
    /// `choose-primary` can promote a replica.
    pub failover: bool,
    /// Minor versions upgrade by rolling restart.
    pub online_upgrade: bool,
    /// Major versions upgrade through Jobs.
    pub major_upgrade: bool,
    /// The engine archives its log and restores to a point in time (contract 0.2).
    pub point_in_time: bool,
    /// The engine elects its own leader; `choose-primary` names it (contract 0.2).
    pub elects_leader: bool,
    /// The engine is configured for TLS when the Database asks (contract 0.2).
    pub tls: bool,
}

/// One optional behaviour a plugin may declare; the host asks only for what is declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// Backups (scheduled, on demand, before upgrades and before deletion).
    Backup,
    /// Restores into a new Database.
    Restore,
    /// Choosing a replica to replace a lost primary.
    Failover,
    /// Minor versions upgraded by a rolling restart.
    OnlineUpgrade,
    /// Major versions upgraded through Jobs.
    MajorUpgrade,
    /// Archiving the engine's log and restoring to a point in time.
    PointInTime,
    /// The engine elects its own leader.
    ElectsLeader,
    /// Serving TLS with the certificate the host issues.
    Tls,
}

impl Capability {
    /// Every capability, in the contract's order.
    pub const ALL: [Capability; 8] = [
        Capability::Backup,
        Capability::Restore,
        Capability::Failover,
        Capability::OnlineUpgrade,
        Capability::MajorUpgrade,
        Capability::PointInTime,
        Capability::ElectsLeader,
        Capability::Tls,
    ];

    /// Its name in the contract.
    pub fn name(self) -> &'static str {
        match self {
            Capability::Backup => "backup",
            Capability::Restore => "restore",
            Capability::Failover => "failover",
            Capability::OnlineUpgrade => "online-upgrade",
            Capability::MajorUpgrade => "major-upgrade",
            Capability::PointInTime => "point-in-time",
            Capability::ElectsLeader => "elects-leader",
            Capability::Tls => "tls",
        }
    }
}

impl Capabilities {
    /// Every capability declared, by its name in the contract.
    pub fn declared(&self) -> Vec<&'static str> {
        Capability::ALL.into_iter().filter(|c| self.has(*c)).map(Capability::name).collect()
    }

    /// Whether `capability` is declared.
    pub fn has(&self, capability: Capability) -> bool {
        match capability {
            Capability::Backup => self.backup,
            Capability::Restore => self.restore,
            Capability::Failover => self.failover,
            Capability::OnlineUpgrade => self.online_upgrade,
            Capability::MajorUpgrade => self.major_upgrade,
            Capability::PointInTime => self.point_in_time,
            Capability::ElectsLeader => self.elects_leader,
            Capability::Tls => self.tls,
        }
    }
}

/// A scalar engine parameter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ParameterValue {
    /// Written as a string.
    Text(String),
    /// Written as an integer.
    Integer(i64),
}

/// CPU and memory as plain numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceAmounts {
    /// Thousandths of a CPU.
    pub cpu_millis: Option<u64>,
    /// Bytes of memory.
    pub memory_bytes: Option<u64>,
}

/// The part of a Database spec a plugin sees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineSpec {
    /// Database name.
    pub name: String,
    /// Database namespace.
    pub namespace: String,
    /// Engine version (defaulted).
    pub version: String,
    /// Number of members.
    pub replicas: u32,
    /// Volume size in bytes.
    pub storage_bytes: u64,
    /// Resource requests.
    pub requests: ResourceAmounts,
    /// Resource limits.
    pub limits: ResourceAmounts,
    /// Engine parameters, sorted by name.
    pub parameters: Vec<(String, ParameterValue)>,
    /// TLS files in every member and Job, when the Database asks for TLS (contract 0.2).
    pub tls: Option<TlsFiles>,
    /// Replicas that must have each commit; 0: asynchronous replication (contract 0.2).
    pub synchronous_replicas: u32,
}

/// Where the host mounts the Database's TLS certificate (PEM files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsFiles {
    /// The certificate, for every Service and member name, server and client use.
    pub certificate: String,
    /// Its private key.
    pub key: String,
    /// The certificate authority that issued it.
    pub ca: String,
}

/// One problem with a spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Field path, e.g. `spec.parameters.max_connections`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// A key of a Secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SecretRef {
    /// Secret name.
    pub name: String,
    /// Key in the Secret.
    pub key: String,
}

/// Where an environment variable's value comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum EnvSource {
    /// A literal.
    Value(String),
    /// A Secret key.
    Secret(SecretRef),
    /// A Downward API field path.
    Field(String),
}

/// An environment variable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EnvVar {
    /// Variable name.
    pub name: String,
    /// Its value's source.
    pub source: EnvSource,
}

/// A named TCP port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Port {
    /// Port name.
    pub name: String,
    /// Port number.
    pub port: u16,
}

/// How a probe checks a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ProbeAction {
    /// Run a command.
    Exec(Vec<String>),
    /// Connect to a TCP port.
    TcpSocket(u16),
    /// An HTTP(S) GET of `path` on `port`.
    HttpGet {
        /// Absolute path.
        path: String,
        /// Port.
        port: u16,
        /// HTTPS instead of HTTP.
        https: bool,
    },
    /// The gRPC health check on a port.
    Grpc(u16),
}

/// A readiness or liveness probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    /// What the probe does.
    pub action: ProbeAction,
    /// Seconds before the first probe.
    pub initial_delay_seconds: u32,
    /// Seconds between probes.
    pub period_seconds: u32,
    /// Seconds before a probe times out.
    pub timeout_seconds: u32,
    /// Failures before the probe fails.
    pub failure_threshold: u32,
}

/// A configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConfigFile {
    /// File name, no slashes.
    pub name: String,
    /// File content.
    pub content: String,
}

/// A credential the host generates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Credential {
    /// Secret key.
    pub key: String,
    /// Generated length in characters.
    pub length: u32,
}

/// Facts about the cluster the host builds around the workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterContext {
    /// DNS name of the read-write Service.
    pub primary_host: String,
    /// DNS name of the headless Service.
    pub headless_host: String,
    /// Pod name of the current primary.
    pub primary_pod: String,
    /// Name of the credentials Secret.
    pub credentials_secret: String,
    /// Where config files are mounted.
    pub config_mount_path: String,
    /// Where the engine places finished log segments for the host to archive.
    pub archive_directory: Option<String>,
    /// A restore from a backup has not finished yet.
    pub restoring: bool,
}

/// A container run to completion before the engine's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InitContainer {
    /// Its name.
    pub name: String,
    /// Its image.
    pub image: String,
    /// Its argv.
    pub command: Vec<String>,
    /// Its environment.
    pub env: Vec<EnvVar>,
}

/// The engine container and what surrounds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    /// Container image.
    pub image: String,
    /// Entrypoint override.
    pub command: Vec<String>,
    /// Arguments.
    pub args: Vec<String>,
    /// Environment.
    pub env: Vec<EnvVar>,
    /// Ports.
    pub ports: Vec<Port>,
    /// Readiness probe.
    pub readiness: Option<Probe>,
    /// Liveness probe.
    pub liveness: Option<Probe>,
    /// Files for the config ConfigMap.
    pub config_files: Vec<ConfigFile>,
    /// Where the data volume is mounted.
    pub data_mount_path: String,
    /// Keys of the credentials Secret.
    pub credentials: Vec<Credential>,
    /// Recommended resources.
    pub recommended: ResourceAmounts,
    /// User and group the engine runs as.
    pub run_as_user: u32,
    /// Run before the engine, in order.
    pub init_containers: Vec<InitContainer>,
    /// How the host asks each member who leads (engine-elected leadership).
    pub member_query: Option<MemberQuery>,
    /// What the member agent runs to learn the member's role and position (the plugin's
    /// optional `agent.status-command`); empty: no agent.
    pub status_command: Vec<String>,
    /// What the member agent runs to fence the member (the plugin's optional
    /// `agent.fence-command`); empty: the member is never fenced.
    pub fence_command: Vec<String>,
    /// `agent.client-command`: a person's interactive client in a member (empty: none).
    pub client_command: Vec<String>,
    /// `agent.promote-command`: how the agent promotes its member in place (empty: by
    /// the member's restart in its new role).
    pub promote_command: Vec<String>,
    /// `agent.synchronous-command`: how the agent changes, as the primary runs, how many
    /// replicas must confirm each commit (empty: never lowered).
    pub synchronous_command: Vec<String>,
    /// `agent.follow-command`: how the agent has a replica follow a newly promoted member
    /// (empty: the replica finds it on its own).
    pub follow_command: Vec<String>,
    /// `agent.application`: the login the application is given (none: no Secret
    /// `<name>-app`).
    pub application: Option<ApplicationLogin>,
    /// `metrics.endpoint`: where Prometheus scrapes the engine's series, and the
    /// exporter beside it (none: the agent's series alone).
    pub metrics: Option<MetricsEndpoint>,
}

/// Where Prometheus scrapes a member's engine (`metrics.endpoint`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MetricsEndpoint {
    /// The port on the pod's address.
    pub port: u16,
    /// Absolute path.
    pub path: String,
    /// The container serving them; none: the engine itself.
    pub exporter: Option<Exporter>,
}

/// The engine's exporter, beside it in every member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Exporter {
    /// Its image.
    pub image: String,
    /// Its argv (empty: the image's entrypoint).
    pub command: Vec<String>,
    /// Its environment.
    pub env: Vec<EnvVar>,
}

/// The application's login (`agent.application`): a user of the engine that owns
/// its own database, whose password is a key of the credentials Secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationLogin {
    /// The user name.
    pub user: String,
    /// The database it owns.
    pub database: String,
    /// The credentials Secret's key holding its password.
    pub password_key: String,
    /// The scheme of the URI clients are given.
    pub scheme: String,
}

/// A request the host sends to every member of an engine that elects its leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemberQuery {
    /// Port on the member's pod address.
    pub port: u16,
    /// Absolute path.
    pub path: String,
    /// `None`: GET; otherwise POST of this JSON body.
    pub body: Option<String>,
    /// Over HTTPS (the Database's TLS certificate).
    pub https: bool,
}

/// A command run to completion in a Job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobPlan {
    /// Container image.
    pub image: String,
    /// Full argv.
    pub command: Vec<String>,
    /// Environment.
    pub env: Vec<EnvVar>,
    /// Whether the data volume is mounted.
    pub mounts_data: bool,
}

/// Where a backup is written or read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupLocation {
    /// Directory inside the Job's container.
    pub directory: String,
    /// Artefact name inside it.
    pub artifact: String,
    /// Host to connect to.
    pub host: String,
    /// Credentials Secret.
    pub credentials_secret: String,
    /// The Database the Job works for.
    pub cluster: ClusterContext,
    /// Restore to a point in time: where the archived log segments are.
    pub archive_directory: Option<String>,
    /// Restore to a point in time: the moment, RFC 3339 UTC.
    pub point_in_time: Option<String>,
}

/// One step of a change in the number of members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ScaleStep {
    /// Run a Job and wait for it.
    Job(JobPlan),
    /// Set the member count and wait until that many are ready.
    Members(u32),
}

/// One step of an upgrade.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum UpgradeStep {
    /// Restart members on the new image, replicas first.
    RollingRestart,
    /// Run a Job to completion.
    Job(JobPlan),
}

/// An accepted upgrade.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradePlan {
    /// Steps in order.
    pub steps: Vec<UpgradeStep>,
    /// Take a backup before the first step.
    pub backup_first: bool,
}

/// A member as the host observes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Member {
    /// Pod name.
    pub pod: String,
    /// StatefulSet ordinal.
    pub ordinal: u32,
    /// Ready condition.
    pub ready: bool,
    /// Current primary.
    pub primary: bool,
    /// Replication position, engine-specific.
    pub position: Option<String>,
    /// Its answer to the workload's member query (engine-elected leadership).
    pub answer: Option<String>,
}

/// The answer to a failover question.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum FailoverDecision {
    /// Promote this pod with this command.
    Promote {
        /// Pod to promote.
        pod: String,
        /// Command to run in it.
        command: Vec<String>,
    },
    /// The engine elected this pod (engine-elected leadership).
    Elected(String),
    /// No member is safe; the reason.
    NoSafeMember(String),
}
