//! The `Database` custom resource (`plugdb.io/v1alpha1`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// A database cluster of one engine: `kubectl apply` it and plugdb builds and runs it.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "plugdb.io",
    version = "v1alpha1",
    kind = "Database",
    namespaced,
    status = "DatabaseStatus",
    shortname = "db",
    category = "plugdb",
    doc = "A database cluster of one engine, run by plugdb. `spec.engine` names the engine plugin that decides everything engine-specific.",
    printcolumn = r#"{"name":"Engine","type":"string","jsonPath":".spec.engine"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseSpec {
    /// Engine that runs this database, e.g. `postgres` or `mysql`: the name of a loaded
    /// engine plugin. Cannot be changed after creation.
    #[x_kube(validation = Rule::new("self == oldSelf").message("engine cannot be changed after creation"))]
    #[schemars(length(min = 1, max = 40), regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"))]
    pub engine: String,

    /// Engine version, e.g. `17` or `11.4`. Empty means the plugin's default version.
    /// Raising it upgrades the cluster through the plugin's upgrade plan.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 32))]
    pub version: String,

    /// Number of members: one primary plus `replicas - 1` read-only replicas.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 9))]
    pub replicas: i32,

    /// The data volume of each member.
    pub storage: StorageSpec,

    /// CPU and memory of each member. Unset values take the plugin's recommendation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,

    /// Engine configuration parameters by name, e.g. `max_connections: 200`. Names and
    /// types are checked by the engine plugin.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, IntOrString>,
}

fn default_replicas() -> i32 {
    1
}

/// The persistent volume of each member.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(oldSelf.size) || quantity(self.size).compareTo(quantity(oldSelf.size)) >= 0").message("storage.size may grow but never shrink"))]
pub struct StorageSpec {
    /// Size of each member's volume, e.g. `10Gi`. May grow, never shrink.
    #[x_kube(validation = Rule::new("isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))").message("storage.size must be a positive quantity such as 10Gi"))]
    pub size: Quantity,

    /// StorageClass of the volumes; empty uses the cluster's default class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_name: Option<String>,
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

/// What plugdb observed about the Database; written only by the operator.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatabaseStatus {
    /// Summary of the lifecycle: Pending, Creating, Running, Updating, Degraded, Failed, Deleting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Members whose pods are ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready, Progressing, Degraded, PluginReady, BackupHealthy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
