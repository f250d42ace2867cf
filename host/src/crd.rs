//! The `Database` custom resource (`plugdb.io/v1alpha1`): its spec here, in the order
//! `kubectl explain` shows it (the doc comments are the field descriptions), and its
//! status in [`status`].

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

mod status;
pub use status::{BackupRecord, DatabaseStatus, MemberStatus, Phase, Recoverable, ScaleStatus, StorageGrowthStatus, UpgradeStatus};

/// Longest Database name: pod names `<name>-<ordinal>` must stay valid label values.
pub const MAX_NAME: usize = 52;
/// The read-only Service's suffix.
pub const REPLICAS: &str = "-replicas";
/// The headless Service's suffix.
pub const HEADLESS: &str = "-headless";
/// The primary's PodDisruptionBudget's suffix.
pub const PRIMARY_BUDGET: &str = "-primary";
/// The suffixes children take after the Database's name where a child of the same kind
/// is named as the Database alone (the read-write Service, the members' budget): a
/// Database named `<other><suffix>` would share that child with Database `<other>`, so
/// such names are refused when a Database is created.
pub const SHARED_SUFFIXES: [&str; 3] = [REPLICAS, HEADLESS, PRIMARY_BUDGET];

/// The rule refusing, when a Database is created, a name that ends in one of
/// [`SHARED_SUFFIXES`]: its children would share names with another Database's (an
/// existing one keeps its name and children).
fn shared_suffix_rule() -> kube::core::Rule {
    let suffixes = SHARED_SUFFIXES;
    let ends: Vec<String> = suffixes.iter().map(|s| format!("self.metadata.name.endsWith('{s}')")).collect();
    let message = format!(
        "metadata.name must not end in {}: another Database's children (its read-only and headless Services, its primary's disruption budget) are named so",
        suffixes.join(", ")
    );
    kube::core::Rule::new(format!("oldSelf.hasValue() || !({})", ends.join(" || ")))
        .optional_old_self(true)
        .message(kube::core::Message::Message(message))
}

/// The rule refusing, when a Database is created, a name longer than [`MAX_NAME`].
fn name_length_rule() -> kube::core::Rule {
    kube::core::Rule::new(format!("oldSelf.hasValue() || size(self.metadata.name) <= {MAX_NAME}")).optional_old_self(true).message(
        kube::core::Message::Message(format!(
            "metadata.name must be at most {MAX_NAME} characters: member pod names <name>-<ordinal> must stay valid label values"
        )),
    )
}

/// A database cluster of one engine: `kubectl apply` it and plugdb builds and runs it.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "plugdb.io",
    version = "v1alpha1",
    kind = "Database",
    namespaced,
    status = "DatabaseStatus",
    shortname = "db",
    scale = r#"{"specReplicasPath":".spec.replicas","statusReplicasPath":".status.readyReplicas","labelSelectorPath":".status.selector"}"#,
    category = "plugdb",
    doc = "A database cluster of one engine, run by plugdb. `spec.engine` names the engine plugin that decides everything engine-specific.",
    printcolumn = r#"{"name":"Engine","type":"string","jsonPath":".spec.engine"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.currentVersion"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    // Checked when a Database is created (an existing one keeps its name and children).
    validation = shared_suffix_rule(),
    validation = name_length_rule()
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)").message("storageClassName cannot be changed after creation"))]
#[x_kube(validation = Rule::new("!has(self.replication) || self.replication.mode != 'Synchronous' || self.replicas > self.replication.synchronousReplicas").message("replication.synchronousReplicas must be fewer than replicas: that many replicas must have each commit"))]
#[x_kube(validation = Rule::new("!has(self.storageGrowth) || !isQuantity(string(self.storage)) || !isQuantity(string(self.storageGrowth.limit)) || quantity(string(self.storageGrowth.limit)).compareTo(quantity(string(self.storage))) >= 0").message("storageGrowth.limit must be at least storage"))]
pub struct DatabaseSpec {
    /// Engine that runs this database, e.g. `postgres` or `mysql`: the name of a loaded
    /// engine plugin. Cannot be changed after creation.
    #[x_kube(validation = Rule::new("self == oldSelf").message("engine cannot be changed after creation"))]
    #[schemars(length(min = 1, max = 40), regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"))]
    pub engine: String,

    /// Engine version, e.g. `17` or `11.8`. Empty means the plugin's default version.
    /// Raising it upgrades the cluster through the plugin's upgrade plan.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 32))]
    pub version: String,

    /// Number of members: one primary plus `replicas - 1` read-only replicas.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 9))]
    pub replicas: i32,

    /// Size of each member's data volume, e.g. `50Gi`. May grow, never shrink.
    #[x_kube(
        validation = Rule::new("isQuantity(string(self)) && quantity(string(self)).isGreaterThan(quantity('0'))").message("storage must be a positive quantity such as 10Gi"),
        validation = Rule::new("!isQuantity(string(oldSelf)) || quantity(string(self)).compareTo(quantity(string(oldSelf))) >= 0").message("storage may grow but never shrink")
    )]
    pub storage: Quantity,

    /// Grow the members' volumes before they fill, from what each member's agent measures
    /// of its data volume (engines whose members run an agent: postgres, mysql). The
    /// storage class must allow expansion. Unset: volumes grow only with `storage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_growth: Option<StorageGrowth>,

    /// When a member's trouble is named before it is an outage (condition `Anomaly`, an
    /// Event and a series), from what each member's agent says of its engine. Unset: on,
    /// with the defaults below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anomalies: Option<Anomalies>,

    /// StorageClass of the members' volumes; unset uses the cluster's default class.
    /// Cannot be changed after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,

    /// How members are spread over nodes and zones, so one failure does not take several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<Spread>,

    /// CPU and memory of each member. Unset values take the plugin's recommendation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,

    /// Engine configuration parameters by name, e.g. `max_connections: 200`. Names and
    /// types are checked by the engine plugin.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, Parameter>,

    /// Scheduled backups. Unset means no scheduled backups (on-demand and final
    /// backups still work when the engine supports them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSpec>,

    /// What happens to data when the Database is deleted: `Snapshot` (default) takes a
    /// final backup, then keeps the volumes; `Retain` keeps the volumes; `Delete` removes them.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,

    /// Bootstrap this Database from a backup of another one (only read at creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("restoreFrom cannot be changed after creation"))]
    pub restore_from: Option<RestoreSource>,

    /// TLS for clients and between members. Unset or `enabled: false`: the engine's own
    /// default (plaintext for most).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,

    /// How replicas follow the primary. Unset: asynchronously.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationSpec>,

    /// What Prometheus can measure of the members beyond their agents' series. Unset:
    /// everything the engine's plugin offers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitoring: Option<Monitoring>,

    /// Who may connect to the members (the engine's ports and the agent's metrics), as
    /// NetworkPolicy peers: `podSelector` (pods of this namespace), `namespaceSelector`,
    /// `ipBlock`. The members, the Database's Jobs and the operator always may. Unset:
    /// any client. The members' agent port is the operator's alone either way. Enforced
    /// where the cluster's network enforces NetworkPolicies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clients: Option<Vec<NetworkPolicyPeer>>,
}

/// What Prometheus can measure of the members.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Monitoring {
    /// The engine's own series, under its community's metric names: its plugin's
    /// exporter beside each member (postgres_exporter, mysqld_exporter), or the engine's
    /// own endpoint (etcd), on the members' port `engine-metrics` (default true).
    /// `false`: no exporter runs and no port is opened for them; the agents' series stay.
    #[serde(default = "enabled")]
    pub engine_metrics: bool,
}

/// How a commit reaches the replicas before the primary acknowledges it. (An engine that
/// elects its leader, such as etcd, commits every write on a quorum whatever this says.)
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicationSpec {
    /// `Asynchronous` (default): the primary acknowledges a commit once it has it, and a
    /// failover may lose the last commits no replica had received. `Synchronous`: once
    /// `synchronousReplicas` replicas have it on disk too; a failover promotes the replica
    /// that has the most, so no acknowledged commit is lost.
    #[serde(default)]
    pub mode: ReplicationMode,
    /// `Synchronous`: how many replicas must have each commit (default 1); fewer than
    /// `spec.replicas`.
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 8))]
    pub synchronous_replicas: i32,
    /// `Synchronous`, while fewer replicas than `synchronousReplicas` are ready: `Wait`
    /// (default): commits wait until enough are back; `Degrade`: after
    /// `degradeAfterSeconds`, commits no longer wait (replication is asynchronous, as the
    /// `SynchronousReplication` condition says) until enough are back.
    #[serde(default)]
    pub when_too_few_replicas: TooFewReplicas,
    /// `Degrade`: how long commits may wait for too few replicas before they no longer
    /// wait (default 30).
    #[serde(default = "thirty")]
    #[schemars(range(min = 1, max = 3600))]
    pub degrade_after_seconds: i32,
}

fn one() -> i32 {
    1
}

/// When and by how much the members' volumes grow on their own.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageGrowth {
    /// Grow once a member's data volume is this full, in percent (default 80).
    #[serde(default = "eighty")]
    #[schemars(range(min = 1, max = 99))]
    pub threshold_percent: i32,
    /// What one growth adds: a share of the size (`25%`, the default) or a size (`5Gi`).
    #[serde(default = "a_quarter")]
    #[x_kube(validation = Rule::new("self.matches('^[1-9][0-9]?[0-9]?%$') || (isQuantity(self) && quantity(self).isGreaterThan(quantity('0')))").message("step must be a percentage such as 25% or a positive size such as 5Gi"))]
    #[schemars(length(min = 1, max = 32))]
    pub step: String,
    /// The size no growth goes past, e.g. `100Gi` (at least `storage`).
    #[x_kube(validation = Rule::new("isQuantity(string(self)) && quantity(string(self)).isGreaterThan(quantity('0'))").message("limit must be a positive quantity such as 100Gi"))]
    pub limit: Quantity,
    /// The least time between two growths, in minutes (default 60): a growth the storage
    /// provider has not finished is never followed by another either.
    #[serde(default = "sixty")]
    #[schemars(range(min = 1, max = 10080))]
    pub interval_minutes: i32,
}

/// When a member's trouble is named (see `docs/operations.md`, "Anomalies").
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Anomalies {
    /// Name anomalies at all (default true).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Connections in use at or past this share of the most the engine lets in, in percent
    /// (default 90).
    #[serde(default = "ninety")]
    #[schemars(range(min = 1, max = 100))]
    pub connections_percent: i32,
    /// A transaction open this long or longer, in minutes (default 60): it holds back
    /// cleanup (postgres's vacuum, InnoDB's purge) and may hold locks.
    #[serde(default = "sixty")]
    #[schemars(range(min = 1, max = 10080))]
    pub transaction_minutes: i32,
    /// A database's oldest transaction ID not yet frozen this old or older, in millions
    /// (default 1000; postgres stops taking writes at about 2000).
    #[serde(default = "a_thousand")]
    #[schemars(range(min = 1, max = 2000))]
    pub transaction_id_age_millions: i32,
    /// Log the engine keeps for a replica or the archive (a replication slot's WAL, binary
    /// logs) at or past this share of the volume, in percent (default 30).
    #[serde(default = "thirty")]
    #[schemars(range(min = 1, max = 100))]
    pub log_held_percent: i32,
    /// A replica's lag at least this long, in seconds, that grew over the last quarter of
    /// an hour or more (default 60): a trend, not a spike.
    #[serde(default = "sixty")]
    #[schemars(range(min = 1, max = 86400))]
    pub lag_seconds: i32,
}

impl Default for Anomalies {
    fn default() -> Self {
        serde_json::from_value(serde_json::json!({})).expect("every field has a default")
    }
}

fn yes() -> bool {
    true
}

fn ninety() -> i32 {
    90
}

fn a_thousand() -> i32 {
    1000
}

fn eighty() -> i32 {
    80
}

fn a_quarter() -> String {
    "25%".into()
}

fn sixty() -> i32 {
    60
}

fn thirty() -> i32 {
    30
}

/// Asynchronous or synchronous replication.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
pub enum ReplicationMode {
    /// The primary acknowledges a commit once it has it.
    #[default]
    Asynchronous,
    /// The primary acknowledges a commit once `synchronousReplicas` replicas have it too.
    Synchronous,
}

/// What commits do while too few replicas are ready for synchronous replication.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
pub enum TooFewReplicas {
    /// They wait until enough replicas are back: no acknowledged commit is ever lost.
    #[default]
    Wait,
    /// After `degradeAfterSeconds` they no longer wait, until enough replicas are back.
    Degrade,
}

/// TLS for a Database: a certificate for every name of its Services and members in
/// Secret `<name>-tls` (`tls.crt`, `tls.key`, `ca.crt`), renewed 30 days before it
/// expires (rolling the members); the engine's plugin configures the engine to require
/// it. Clients verify the server against `ca.crt`. plugdb issues it from a certificate
/// authority of the Database's own (Secret `<name>-ca`), or cert-manager does from the
/// issuer `issuerRef` names.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// Whether the engine serves (and requires) TLS.
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// A cert-manager issuer to issue the certificate: plugdb then keeps a cert-manager
    /// `Certificate` `<name>-tls` instead of issuing it. The issuer must put its CA
    /// certificate in `ca.crt` (cert-manager's CA and Vault issuers do): members verify
    /// each other with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_ref: Option<IssuerRef>,
}

/// A cert-manager issuer, as a `Certificate`'s `spec.issuerRef` names it.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuerRef {
    /// The issuer's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// `Issuer` (in the Database's namespace), `ClusterIssuer`, or an external issuer's kind.
    #[serde(default = "issuer_kind")]
    #[schemars(length(min = 1))]
    pub kind: String,
    /// The issuer's API group: `cert-manager.io`, or an external issuer's.
    #[serde(default = "issuer_group")]
    #[schemars(length(min = 1))]
    pub group: String,
}

fn issuer_kind() -> String {
    "Issuer".into()
}

fn issuer_group() -> String {
    "cert-manager.io".into()
}

impl DatabaseSpec {
    /// Whether the Database asks for TLS.
    pub fn tls_enabled(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.enabled)
    }

    /// The cert-manager issuer of the Database's certificate, when TLS is on and one is named.
    pub fn tls_issuer(&self) -> Option<&IssuerRef> {
        self.tls.as_ref().filter(|t| t.enabled).and_then(|t| t.issuer_ref.as_ref())
    }

    /// How many replicas must have each commit (0: asynchronous replication).
    pub fn synchronous_replicas(&self) -> u32 {
        match &self.replication {
            Some(r) if r.mode == ReplicationMode::Synchronous => r.synchronous_replicas.max(1) as u32,
            _ => 0,
        }
    }
}

/// An engine parameter's value: a whole number (64-bit) or text.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(untagged)]
pub enum Parameter {
    /// A YAML/JSON integer, e.g. `200` or `4294967296`.
    Integer(i64),
    /// Anything else, as text, e.g. `8MB`.
    Text(String),
}

impl schemars::JsonSchema for Parameter {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Parameter".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A parameter value: a whole number (64-bit) or text.",
            "x-kubernetes-int-or-string": true,
        })
    }
}

/// Scheduled backups.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// Whether scheduled backups run.
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// When to back up, in UTC: the classic five cron fields (`0 2 * * *`: 02:00 daily;
    /// days of week `0`-`7`, `0` and `7` being Sunday, or `SUN`-`SAT`), or six with
    /// seconds first (`*/30 * * * * *`).
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new("self.matches('^[[:space:]]*[^[:space:]]+([[:space:]]+[^[:space:]]+){4,6}[[:space:]]*$')").message("schedule must be five cron fields (minute hour day-of-month month day-of-week, e.g. \"0 2 * * *\" for 02:00 UTC daily), or six with seconds first"))]
    pub schedule: String,
    /// How many successful backups to keep; older ones are deleted.
    #[serde(default = "default_retention")]
    #[schemars(range(min = 1, max = 1000))]
    pub retention: i32,
    /// Size of the volume that holds this Database's backups (created once); used when
    /// no `s3` target is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<Quantity>,
    /// Keep backups in S3-compatible object storage instead of a volume: they then
    /// outlive the namespace, the storage class and the cluster. Each backup lands under
    /// `<prefix>/<namespace>/<database>/<backup>/`, its `manifest.json` written last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Target>,
}

/// An S3-compatible bucket (AWS S3, MinIO, Ceph RGW, ...), addressed path-style.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Target {
    /// Base URL of the service: `https://s3.eu-west-1.amazonaws.com`,
    /// `http://minio.storage.svc:9000`. Plain `http://` sends data unencrypted.
    #[schemars(length(min = 8, max = 256))]
    #[x_kube(validation = Rule::new("self.startsWith('https://') || self.startsWith('http://')").message("endpoint must start with https:// or http://"))]
    pub endpoint: String,
    /// Bucket name; it must exist.
    #[schemars(length(min = 3, max = 63))]
    pub bucket: String,
    /// Key prefix inside the bucket (no leading or trailing `/` needed).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 256))]
    pub prefix: String,
    /// Region the bucket lives in (`us-east-1` when unset; MinIO accepts any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub region: Option<String>,
    /// The Secret (in the Database's namespace) holding the access key. Its values are
    /// read by the operator and the transfer containers only: never passed to a plugin,
    /// never logged.
    pub credentials: S3Credentials,
    /// A PEM bundle of the CA that signed the endpoint's certificate, when it is not a
    /// public one: a key of a Secret in the Database's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<SecretKey>,
}

/// Where the access key of an [`S3Target`] is.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Credentials {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// Key holding the access key id.
    #[serde(default = "access_key_id_key")]
    pub access_key_id_key: String,
    /// Key holding the secret access key.
    #[serde(default = "secret_access_key_key")]
    pub secret_access_key_key: String,
}

fn access_key_id_key() -> String {
    "accessKeyId".into()
}

fn secret_access_key_key() -> String {
    "secretAccessKey".into()
}

/// One key of a Secret in the Database's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKey {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

fn enabled() -> bool {
    true
}

fn default_retention() -> i32 {
    7
}

/// How members are spread over the cluster's failure domains.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Spread {
    /// Over nodes (`kubernetes.io/hostname`). `Preferred` (default): members go to
    /// different nodes when the scheduler can, and share one when they must.
    /// `Required`: a member waits unscheduled rather than share a node. `Ignored`: no rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<SpreadRule>,
    /// Over zones (`topology.kubernetes.io/zone`): `Ignored` (default), `Preferred`
    /// (at most one member more in any zone, when the scheduler can) or `Required`
    /// (members only on nodes that carry the zone label, kept even across zones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zones: Option<SpreadRule>,
    /// How long a member's node may stay lost (`NotReady`) before the member is made
    /// again on a node that runs, from a fresh copy of the primary as a new replica joins
    /// (e.g. `10m`; at least `30s`). Its volume on the lost node is deleted: set it where
    /// volumes cannot follow a member to another node (node-local storage) and a fresh
    /// copy is worth more than waiting for the node. Unset (default): a member waits for
    /// its node. Never the primary, and not for engines that elect their own leader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+[smh])+$') && duration(self) >= duration('30s')").message("moveFromLostNodeAfter must be a duration of at least 30s, such as 10m"))]
    #[schemars(length(max = 16))]
    pub move_from_lost_node_after: Option<String>,
}

impl Spread {
    /// `moveFromLostNodeAfter` as a duration, when set and well-formed.
    pub fn move_after(&self) -> Option<std::time::Duration> {
        let text = self.move_from_lost_node_after.as_deref()?;
        let (mut total, mut number) = (0u64, String::new());
        for c in text.chars() {
            match c {
                '0'..='9' => number.push(c),
                's' | 'm' | 'h' => {
                    let unit = match c {
                        's' => 1,
                        'm' => 60,
                        _ => 3600,
                    };
                    total = total.checked_add(number.parse::<u64>().ok()?.checked_mul(unit)?)?;
                    number.clear();
                }
                _ => return None,
            }
        }
        (number.is_empty() && total > 0).then(|| std::time::Duration::from_secs(total))
    }
}

/// How strictly members are kept apart.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum SpreadRule {
    /// No rule.
    Ignored,
    /// Apart when the scheduler can.
    Preferred,
    /// Apart, or not scheduled.
    Required,
}

/// What happens to data when the Database is deleted.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
pub enum DeletionPolicy {
    /// Take a final backup and wait for it, then delete; volumes are kept.
    #[default]
    Snapshot,
    /// Delete without a final backup; volumes are kept.
    Retain,
    /// Delete everything, volumes included.
    Delete,
}

/// A backup to bootstrap from: on the backup volume of a Database in this namespace, or
/// in object storage (`s3`), where the source Database may be long gone.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.s3) || has(self.backup)").message("backup is required unless the backup is read from s3"),
    validation = Rule::new("!has(self.pointInTime) || has(self.s3)").message("pointInTime needs s3: the archived log is read from the bucket")
)]
pub struct RestoreSource {
    /// The Database (same engine) whose backup this is.
    #[schemars(length(min = 1, max = 63))]
    pub database: String,
    /// Name of the backup (a backup Job's name, as in `status.lastBackup.name`). With
    /// `s3` it may be left out: the newest complete backup is restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub backup: Option<String>,
    /// The bucket holding the source's backups (as in its `spec.backup.s3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Target>,
    /// The source Database's namespace in the bucket's layout (default: this one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
    /// Recover to this moment (RFC 3339, e.g. `2026-11-23T10:15:30Z`): the newest backup
    /// completed before it, then the source's archived log replayed up to it. Needs `s3`,
    /// an engine that declares `point-in-time`, and a moment inside the source's
    /// `status.recoverable` window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 20, max = 40))]
    pub point_in_time: Option<String>,
}

fn default_replicas() -> i32 {
    1
}

/// CPU and memory of each member.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// Guaranteed amounts, e.g. `{cpu: 500m, memory: 1Gi}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Quantity>,
    /// Upper bounds, e.g. `{memory: 2Gi}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, Quantity>,
}
