//! Tier 4: what a cluster admin applies. deploy/plugdb.yaml is the Helm chart
//! rendered (and checked for drift); every manifest passes a server-side dry run on
//! the real API server, the chart also with non-default values (each of which renders
//! what it says; a mistyped one fails the values schema), and the operator
//! runs under its ServiceAccount's own identity: the RBAC is enough to bring a
//! Database up, back it up and delete it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, ServiceAccount};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use plugdb::crd::Database;
use plugdb::metrics::Metrics;
use plugdb::plugin::{Limits, Registry, Runtime};
use plugdb::reconcile;
use plugdb_tests::ControlPlane;
use plugdb_tests::operator::{plugin_config_map, test_settings};
use serde_json::json;

fn documents(path: &str) -> Vec<serde_json::Value> {
    parse(&std::fs::read_to_string(plugdb_tests::workspace_root().join(path)).expect("manifest"))
}

fn parse(text: &str) -> Vec<serde_json::Value> {
    yaml_serde::Deserializer::from_str(text)
        .map(|doc| <serde_json::Value as serde::Deserialize>::deserialize(doc).expect("a YAML document"))
        .filter(|v| !v.is_null())
        .collect()
}

async fn apply(client: &Client, doc: &serde_json::Value, dry_run: bool) -> Result<DynamicObject, kube::Error> {
    let api_version = doc["apiVersion"].as_str().expect("apiVersion");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, doc["kind"].as_str().expect("kind"));
    let (resource, caps) = pinned_kind(client, &gvk).await?;
    let name = doc["metadata"]["name"].as_str().expect("name");
    let api: Api<DynamicObject> = match (caps.scope, doc["metadata"]["namespace"].as_str()) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &resource),
        (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
    };
    let params = if dry_run { PatchParams::apply("plugdb-admin").dry_run() } else { PatchParams::apply("plugdb-admin") };
    api.patch(name, &params, &Patch::Apply(doc)).await
}

async fn service_account_client(cp: &ControlPlane) -> Client {
    let sas: Api<ServiceAccount> = Api::namespaced(cp.client.clone(), "plugdb-system");
    let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}});
    let token: TokenRequest =
        sas.create_subresource("token", "plugdb", &PostParams::default(), &request).await.expect("a token for the plugdb ServiceAccount");
    let token = token.status.expect("status").token.expect("the token");
    let kubeconfig = kube::config::Kubeconfig::read_from(&cp.kubeconfig).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.expect("config");
    config.auth_info = kube::config::AuthInfo { token: Some(token.into()), ..Default::default() };
    Client::try_from(config).expect("client")
}

/// `helm SUBCOMMAND` on the chart with `args`: its standard output, or its error.
fn helm(subcommand: &[&str], args: &[&str]) -> Result<String, String> {
    let root = plugdb_tests::workspace_root();
    let helm = std::process::Command::new("bash").arg(root.join("scripts/helm.sh")).output().expect("scripts/helm.sh");
    assert!(helm.status.success(), "helm is missing and could not be built: {}", String::from_utf8_lossy(&helm.stderr));
    let helm = String::from_utf8_lossy(&helm.stdout).trim().to_string();
    let out = std::process::Command::new(helm).args(subcommand).args(args).current_dir(&root).output().expect("helm");
    if out.status.success() { Ok(String::from_utf8(out.stdout).expect("utf-8")) } else { Err(String::from_utf8_lossy(&out.stderr).into()) }
}

/// `helm template` of the chart with `args`.
fn helm_template(args: &[&str]) -> String {
    helm(&["template", "plugdb", "deploy/chart/plugdb", "--namespace", "plugdb-system"], args)
        .unwrap_or_else(|e| panic!("helm template {args:?} failed: {e}"))
}

/// The rendered object of `kind` (the only one), if there is one.
fn rendered<'a>(docs: &'a [serde_json::Value], kind: &str) -> Option<&'a serde_json::Value> {
    let mut of_kind = docs.iter().filter(|d| d["kind"] == kind);
    let one = of_kind.next();
    assert!(of_kind.next().is_none(), "more than one {kind}");
    one
}

#[test]
fn the_chart_passes_helm_lint() {
    helm(&["lint", "--strict", "deploy/chart/plugdb"], &[]).unwrap_or_else(|e| panic!("helm lint: {e}"));
}

#[test]
fn a_mistyped_value_fails_at_install() {
    for (args, field) in [
        (["--set", "replica=2"], "replica"),
        (["--set", "logFormat=xml"], "logFormat"),
        (["--set", "replicas=0"], "replicas"),
        (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
        (["--set", "resources.limits.memory=lots"], "memory"),
        (["--set", "metrics.serviceMonitor.interval=often"], "interval"),
        (["--set", "networkPolicy.apiServer.cidrs={10.0.0.1}"], "cidrs"),
        (["--set", "engineImages.registry=https://mirror"], "registry"),
        (["--set", "egress.forbid={everything}"], "forbid"),
        (["--set", "alerts.runbookBaseURL=runbooks/"], "runbookBaseURL"),
    ] {
        let e = helm(&["template", "plugdb", "deploy/chart/plugdb"], &args).err().unwrap_or_else(|| panic!("{args:?} was accepted"));
        assert!(e.contains("schema") && e.contains(field), "{args:?}: the error should name {field}: {e}");
    }
}

#[test]
fn each_value_renders_what_it_says() {
    let defaults = parse(&helm_template(&[]));
    // Defaults: a metrics Service and a PodDisruptionBudget that lets one pod go; no
    // ServiceMonitor where its API is not served; no NetworkPolicy.
    let service = rendered(&defaults, "Service").expect("the metrics Service");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "http");
    assert_eq!(service["spec"]["selector"], rendered(&defaults, "Deployment").expect("the Deployment")["spec"]["selector"]["matchLabels"]);
    let pdb = rendered(&defaults, "PodDisruptionBudget").expect("a PodDisruptionBudget");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert!(rendered(&defaults, "ServiceMonitor").is_none(), "a ServiceMonitor without the Prometheus Operator's API");
    assert!(rendered(&defaults, "NetworkPolicy").is_none());

    let monitored = parse(&helm_template(&[
        "--api-versions",
        "monitoring.coreos.com/v1/ServiceMonitor",
        "--set",
        "metrics.serviceMonitor.labels.release=prom",
        "--set",
        "metrics.serviceMonitor.interval=15s",
    ]));
    let monitor = rendered(&monitored, "ServiceMonitor").expect("a ServiceMonitor where its API is served");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
    assert_eq!(monitor["spec"]["endpoints"][0]["interval"], "15s");
    assert_eq!(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"]);
    let off = parse(&helm_template(&[
        "--api-versions",
        "monitoring.coreos.com/v1/ServiceMonitor",
        "--set",
        "metrics.serviceMonitor.enabled=false",
    ]));
    assert!(rendered(&off, "ServiceMonitor").is_none());
    // The members' series: a PodMonitor where its API is served, over the namespace watched
    // or every one, keeping the series' own labels (namespace, database, member).
    assert!(rendered(&defaults, "PodMonitor").is_none(), "a PodMonitor without the Prometheus Operator's API");
    for (watched, namespaces) in [(None, json!({"any": true})), (Some("shop"), json!({"matchNames": ["shop"]}))] {
        let mut args = vec!["--api-versions", "monitoring.coreos.com/v1/PodMonitor", "--set", "metrics.podMonitor.labels.release=prom"];
        let watch = watched.map(|ns| format!("watchNamespace={ns}"));
        args.extend(watch.iter().flat_map(|w| ["--set", w.as_str()]));
        let members = parse(&helm_template(&args));
        let monitor = rendered(&members, "PodMonitor").expect("a PodMonitor where its API is served");
        assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
        assert_eq!(monitor["spec"]["selector"]["matchLabels"], json!({"app.kubernetes.io/managed-by": "plugdb"}));
        assert_eq!(monitor["spec"]["namespaceSelector"], namespaces, "{watched:?}");
        let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
        assert_eq!((&endpoint["port"], &endpoint["path"], &endpoint["honorLabels"]), (&json!("metrics"), &json!("/metrics"), &json!(true)));
        // The engine's series, labelled from the pod as the agent's are.
        let engine = &monitor["spec"]["podMetricsEndpoints"][1];
        assert_eq!(engine["port"], "engine-metrics");
        let labels: Vec<&str> =
            engine["relabelings"].as_array().expect("relabelings").iter().filter_map(|r| r["targetLabel"].as_str()).collect();
        assert_eq!(labels, ["namespace", "database", "engine", "member", "role"]);
    }
    let off =
        parse(&helm_template(&["--api-versions", "monitoring.coreos.com/v1/PodMonitor", "--set", "metrics.podMonitor.enabled=false"]));
    assert!(rendered(&off, "PodMonitor").is_none());
    // The alert rules: alerts/plugdb-rules.yaml as a PrometheusRule where its API is
    // served, each runbook under alerts.runbookBaseURL when it is set.
    assert!(rendered(&defaults, "PrometheusRule").is_none(), "a PrometheusRule without the Prometheus Operator's API");
    let file =
        std::fs::read_to_string(plugdb_tests::workspace_root().join("deploy/chart/plugdb/alerts/plugdb-rules.yaml")).expect("the rules");
    let file: serde_json::Value = yaml_serde::from_str(&file).expect("YAML");
    let rules = |args: &[&str]| {
        let args = [&["--api-versions", "monitoring.coreos.com/v1/PrometheusRule"], args].concat();
        rendered(&parse(&helm_template(&args)), "PrometheusRule").map(|r| r["spec"]["groups"].clone())
    };
    assert_eq!(rules(&[]).as_ref(), Some(&file["groups"]), "the same rules as the file");
    let published = rules(&["--set", "alerts.runbookBaseURL=https://runbooks.example/plugdb"]).expect("a PrometheusRule");
    let urls: Vec<&str> = published
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter_map(|r| r["annotations"]["runbook_url"].as_str())
        .collect();
    assert!(!urls.is_empty() && urls.iter().all(|u| u.starts_with("https://runbooks.example/plugdb/") && u.ends_with(".md")), "{urls:?}");
    assert_eq!(rules(&["--set", "alerts.enabled=false"]), None);
    // The dashboard: its file, whole, in a ConfigMap Grafana's sidecar loads by its label.
    let dashboard = rendered(&defaults, "ConfigMap").expect("the dashboard's ConfigMap");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let file = std::fs::read_to_string(plugdb_tests::workspace_root().join("deploy/chart/plugdb/dashboards/plugdb-database.json"))
        .expect("the dashboard");
    let held = dashboard["data"]["plugdb-database.json"].as_str().expect("the dashboard's JSON");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(held).expect("JSON"),
        serde_json::from_str::<serde_json::Value>(&file).expect("JSON")
    );
    let relabelled = parse(&helm_template(&["--set", "dashboard.label=grafana_dashboard_plugdb"]));
    assert_eq!(
        rendered(&relabelled, "ConfigMap").expect("the dashboard's ConfigMap")["metadata"]["labels"]["grafana_dashboard_plugdb"],
        "1"
    );
    assert!(rendered(&parse(&helm_template(&["--set", "dashboard.enabled=false"])), "ConfigMap").is_none());
    let off = parse(&helm_template(&["--set", "metrics.service.enabled=false", "--set", "podDisruptionBudget.enabled=false"]));
    assert!(rendered(&off, "Service").is_none() && rendered(&off, "PodDisruptionBudget").is_none());

    let fenced = parse(&helm_template(&["--set", "networkPolicy.enabled=true", "--set", "networkPolicy.apiServer.cidrs={10.0.0.1/32}"]));
    let policy = rendered(&fenced, "NetworkPolicy").expect("a NetworkPolicy");
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(policy["spec"]["ingress"], json!([{"ports": [{"port": "http"}], "from": [{"namespaceSelector": {}}]}]));
    let egress = policy["spec"]["egress"].as_array().expect("egress rules");
    assert!(egress.iter().any(|r| r["to"] == json!([{"ipBlock": {"cidr": "10.0.0.1/32"}}])), "the API server: {egress:?}");
    assert!(egress.iter().any(|r| r["to"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/managed-by"] == "plugdb"), "the members");

    let placed = parse(&helm_template(&[
        "--set",
        "imagePullSecrets[0].name=mirror",
        "--set",
        "nodeSelector.pool=ops",
        "--set",
        "tolerations[0].key=ops",
        "--set",
        "tolerations[0].operator=Exists",
        "--set",
        "resources.limits.memory=1Gi",
        "--set",
        "engineImages.registry=mirror.example:5000/hub",
        "--set",
        "engineImages.pullSecrets={mirror-pull,other}",
        "--set",
        "bundledEngines=false",
        "--set",
        "egress.forbid={10.96.0.0/12,10.244.0.0/16}",
        "--set",
        "egress.allow={10.96.12.7}",
        "--set-json",
        r#"affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"pool","operator":"In","values":["ops"]}]}]}}}"#,
        "--set",
        "image.repository=mirror.example/plugdb",
        "--set",
        "image.tag=1.2.3",
        "--set",
        "image.pullPolicy=Always",
        "--set",
        "finalizerPolicy=false",
    ]));
    let pod = &rendered(&placed, "Deployment").expect("the Deployment")["spec"]["template"]["spec"];
    assert_eq!(pod["imagePullSecrets"], json!([{"name": "mirror"}]));
    assert_eq!(pod["nodeSelector"], json!({"pool": "ops"}));
    assert_eq!(pod["tolerations"], json!([{"key": "ops", "operator": "Exists"}]));
    assert_eq!(pod["containers"][0]["resources"]["limits"]["memory"], "1Gi", "a limit given wins");
    let limit = |args: &[&str]| {
        let objects = parse(&helm_template(args));
        let pod = &rendered(&objects, "Deployment").expect("the Deployment")["spec"]["template"]["spec"];
        pod["containers"][0]["resources"]["limits"]["memory"].as_str().map(str::to_string)
    };
    let defaults_limit = limit(&[]);
    assert_eq!(defaults_limit.as_deref(), Some("423Mi"), "the plugins' 400 Mi and 24 Ki for each of 1,000 Databases");
    assert_eq!(limit(&["--set", "expectedDatabases=10000"]).as_deref(), Some("634Mi"), "the limit follows the count");
    let env = pod["containers"][0]["env"].as_array().expect("env");
    let var = |name: &str| env.iter().find(|e| e["name"] == name).map(|e| e["value"].clone());
    assert_eq!(var("PLUGDB_IMAGE_REGISTRY"), Some(json!("mirror.example:5000/hub")));
    assert_eq!(var("PLUGDB_IMAGE_PULL_SECRETS"), Some(json!("mirror-pull,other")));
    assert_eq!(var("PLUGDB_NO_BUNDLED_ENGINES"), Some(json!("true")));
    assert_eq!(var("PLUGDB_EGRESS_FORBID"), Some(json!("10.96.0.0/12,10.244.0.0/16")));
    assert_eq!(var("PLUGDB_EGRESS_ALLOW"), Some(json!("10.96.12.7")));
    assert_eq!(
        pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]["key"],
        "pool"
    );
    let container = &pod["containers"][0];
    assert_eq!((&container["image"], &container["imagePullPolicy"]), (&json!("mirror.example/plugdb:1.2.3"), &json!("Always")));
    assert_eq!(var("PLUGDB_IMAGE"), Some(json!("mirror.example/plugdb:1.2.3")), "Jobs and agents run the same image");
    assert!(rendered(&placed, "MutatingAdmissionPolicy").is_none() && rendered(&defaults, "MutatingAdmissionPolicy").is_some());
    let defaults = &rendered(&defaults, "Deployment").expect("the Deployment")["spec"]["template"]["spec"]["containers"][0]["env"];
    let unset =
        |e: &serde_json::Value| !e["name"].as_str().is_some_and(|n| n.starts_with("PLUGDB_IMAGE_") || n == "PLUGDB_NO_BUNDLED_ENGINES");
    assert!(defaults.as_array().expect("env").iter().all(unset), "{defaults}");
}

#[test]
fn deploy_plugdb_yaml_is_the_rendered_chart() {
    let checked_in = std::fs::read_to_string(plugdb_tests::workspace_root().join("deploy/plugdb.yaml")).expect("deploy/plugdb.yaml");
    let body: String =
        checked_in.lines().filter(|l| !l.starts_with("# Generated") && !l.starts_with("# (a test")).map(|l| format!("{l}\n")).collect();
    assert!(body == helm_template(&[]), "deploy/plugdb.yaml is stale: regenerate it with the command in its first line");
}

#[tokio::test]
async fn every_manifest_passes_a_server_side_dry_run_and_the_rbac_is_enough_to_run() {
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client.clone();
    for doc in documents("crds/plugdb.io_databases.yaml").iter().chain(&documents("deploy/namespace.yaml")) {
        apply(&admin, doc, false).await.expect("CRD and namespace");
    }
    apply(&admin, &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}), false).await.expect("namespace");
    let customised = parse(&helm_template(&[
        "--set",
        "watchNamespace=shop",
        "--set",
        "replicas=2",
        "--set",
        "logFormat=text",
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
        "--set",
        "podDisruptionBudget.maxUnavailable=50%",
        "--set",
        "imagePullSecrets[0].name=mirror",
    ]));
    for (source, doc) in documents("deploy/plugdb.yaml")
        .into_iter()
        .map(|d| ("deploy/plugdb.yaml", d))
        .chain(customised.into_iter().map(|d| ("chart with values", d)))
    {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        apply(&admin, &doc, true).await.unwrap_or_else(|e| panic!("{source}: {kind} refused by the API server: {e}"));
    }
    for doc in documents("deploy/plugdb.yaml") {
        apply(&admin, &doc, false).await.expect("deploy/plugdb.yaml");
    }
    runs_a_database_under_its_own_identity(&cp, "default", None).await;
}

/// The chart's PodMonitor, ServiceMonitor and PrometheusRule are objects the Prometheus
/// Operator's real CRDs accept (generated from its module's API types, as its project
/// does): a server-side dry run of each, where those CRDs are served.
#[tokio::test]
async fn the_chart_s_monitoring_objects_pass_the_prometheus_operator_s_schemas() {
    let dir =
        std::process::Command::new("bash").arg(plugdb_tests::workspace_root().join("scripts/monitoring-crds.sh")).output().expect("run");
    assert!(dir.status.success(), "the Prometheus Operator's CRDs: {}", String::from_utf8_lossy(&dir.stderr));
    let dir = std::path::PathBuf::from(String::from_utf8_lossy(&dir.stdout).trim());
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client.clone();
    let kinds = ["podmonitors", "servicemonitors", "prometheusrules"];
    for kind in kinds {
        let text = std::fs::read_to_string(dir.join(format!("monitoring.coreos.com_{kind}.yaml"))).expect("a CRD");
        for crd in parse(&text) {
            apply(&admin, &crd, false).await.unwrap_or_else(|e| panic!("the {kind} CRD: {e}"));
        }
    }
    for doc in documents("deploy/namespace.yaml") {
        apply(&admin, &doc, false).await.expect("namespace");
    }
    let served =
        ["monitoring.coreos.com/v1/PodMonitor", "monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PrometheusRule"];
    let mut args: Vec<&str> = served.iter().flat_map(|a| ["--api-versions", *a]).collect();
    args.extend(["--set", "metrics.podMonitor.labels.release=prom"]);
    let chart = parse(&helm_template(&args));
    // The CRDs are established, and discovered, a moment after they are made: each is
    // tried until then, and refused only past it.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for kind in ["PodMonitor", "ServiceMonitor", "PrometheusRule"] {
        let doc = rendered(&chart, kind).unwrap_or_else(|| panic!("the chart renders a {kind} where its API is served"));
        loop {
            match apply(&admin, doc, true).await {
                Ok(_) => break,
                Err(_) if std::time::Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(500)).await,
                Err(e) => panic!("{kind} refused by the Prometheus Operator's schema: {e}"),
            }
        }
    }
}

/// With `watchNamespace`, the operator's rights over Databases and their children are a
/// Role in that namespace: it runs a Database there, and may not read a Secret elsewhere.
#[tokio::test]
async fn watching_one_namespace_the_operator_has_rights_in_that_one_alone() {
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.client.clone();
    for doc in documents("crds/plugdb.io_databases.yaml").iter().chain(&documents("deploy/namespace.yaml")) {
        apply(&admin, doc, false).await.expect("CRD and namespace");
    }
    apply(&admin, &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}), false).await.expect("namespace");
    let chart = parse(&helm_template(&["--set", "watchNamespace=shop"]));
    let roles: Vec<(&str, &str)> = chart
        .iter()
        .filter(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole")
        .map(|d| (d["kind"].as_str().unwrap_or_default(), d["metadata"]["namespace"].as_str().unwrap_or("-")))
        .collect();
    assert_eq!(roles, [("ClusterRole", "-"), ("Role", "shop"), ("Role", "plugdb-system"), ("Role", "kube-node-lease")]);
    let cluster_wide = chart.iter().find(|d| d["kind"] == "ClusterRole").expect("the ClusterRole");
    let resources: Vec<&str> = cluster_wide["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["resources"].as_array().into_iter().flatten())
        .filter_map(|r| r.as_str())
        .collect();
    assert_eq!(resources, ["nodes", "namespaces"], "nothing namespaced is granted cluster-wide");
    for doc in &chart {
        apply(&admin, doc, false).await.expect("the chart");
    }
    let operator = service_account_client(&cp).await;
    for ns in ["default", "plugdb-system"] {
        let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(operator.clone(), ns);
        let refused = secrets.list(&Default::default()).await.expect_err("a Secret outside the watched namespace");
        assert!(matches!(&refused, kube::Error::Api(e) if e.code == 403), "{ns}: {refused}");
    }
    runs_a_database_under_its_own_identity(&cp, "shop", Some("shop")).await;
}

/// The operator, with nothing but its ServiceAccount's token, watching `watch` (every
/// namespace: `None`): it reads nodes and their leases, and takes a Database in `ns`
/// from its creation (every child, a backup Job, the status) to its deletion under
/// `Delete` (its claims included).
async fn runs_a_database_under_its_own_identity(cp: &ControlPlane, ns: &str, watching: Option<&str>) {
    let admin = cp.client.clone();
    let operator = service_account_client(cp).await;
    // A member that is down has its node read, to say whether the node is lost.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(operator.clone());
    nodes.get_opt("no-such-node").await.expect("the operator's role lets it read a member's node");
    // And every node's cordon is watched, to switch over before a drain evicts a primary.
    nodes.list(&Default::default()).await.expect("the operator's role lets it list the nodes");
    // And their leases, to take a node whose kubelet went silent as cut off.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(operator.clone(), "kube-node-lease");
    leases.list(&Default::default()).await.expect("the operator's role lets it list the nodes' leases");
    stamps_what_plugdb_kept_once(&admin, &operator, ns, watching).await;
    let metrics = Arc::new(Metrics::default());
    let registry = Registry::new(Runtime::new(Limits::default()).expect("runtime"), metrics.clone());
    let watch = tokio::spawn(registry.clone().watch(operator.clone(), "plugdb-system".into()));
    let (caches, triggers) = reconcile::cache::Caches::start(&operator, watching, reconcile::fresh_stamper());
    let ctx = Arc::new(reconcile::Context::new(operator, registry.clone(), metrics, test_settings(), caches));
    let controller = tokio::spawn(reconcile::run(ctx, triggers, std::future::pending()));

    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "plugdb-system");
    cms.create(&PostParams::default(), &plugin_config_map("postgres", "postgres")).await.expect("plugin");
    // No node runs Pods here (the real-node tier runs them): what is checked is that
    // the requests the operator makes for a Database are allowed. It creates every
    // child, starts backup Jobs, writes status, and deletes under `Delete`, claims
    // included.
    let dbs: Api<Database> = Api::namespaced(admin.clone(), ns);
    let db = json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": "orders"},
                    "spec": {"engine": "postgres", "replicas": 2, "storage": "1Gi", "deletionPolicy": "Delete",
                             "backup": {"schedule": "*/2 * * * * *"}}});
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while dbs.patch("orders", &PatchParams::apply("admin"), &Patch::Apply(&db)).await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "the CRD was not established");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let made = children(&admin, ns).await;
        if made.iter().all(|(_, present)| *present) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not everything was made under the operator's own identity: {made:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The status is written at the end of the pass that made the last child: wait for it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let status = dbs.get("orders").await.expect("get").status.unwrap_or_default();
        if status.primary.is_some() || tokio::time::Instant::now() > deadline {
            assert_eq!(status.primary.as_deref(), Some("orders-0"), "status written under the operator's identity");
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    dbs.delete("orders", &Default::default()).await.expect("delete");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while dbs.get_opt("orders").await.expect("get").is_some() || !claims.list(&Default::default()).await.expect("claims").items.is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "deletion did not complete under the operator's identity");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    watch.abort();
    controller.abort();
}

/// The operator, under its own identity, makes its identity Secret in its namespace and,
/// leading with a key for the first time, stamps the Secrets an older plugdb kept in
/// `ns` ([`plugdb::stamp::Upgrade`]); once per key: a Secret made with plugdb's labels
/// afterwards stays unstamped, and is no Database's.
async fn stamps_what_plugdb_kept_once(admin: &Client, operator: &Client, ns: &str, watching: Option<&str>) {
    use k8s_openapi::api::core::v1::Secret;
    use plugdb::stamp::{Upgrade, held};
    let labelled = |name: &str| -> Secret {
        let labels = json!({"app.kubernetes.io/managed-by": "plugdb", "app.kubernetes.io/instance": name});
        serde_json::from_value(
            json!({"metadata": {"name": format!("{name}-credentials"), "labels": labels}, "data": {"password": "czNjcmV0"}}),
        )
        .expect("a Secret")
    };
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), ns);
    secrets.create(&PostParams::default(), &labelled("older")).await.expect("kept by an older plugdb");
    let identity: Secret =
        serde_json::from_value(json!({"metadata": {"name": plugdb::operator::AGENT_IDENTITY_SECRET}})).expect("a Secret");
    let own: Api<Secret> = Api::namespaced(operator.clone(), "plugdb-system");
    own.create(&PostParams::default(), &identity).await.expect("the operator's role lets it make its identity Secret");
    let stamper = reconcile::fresh_stamper();
    let upgrade = Upgrade { client: operator, identity_namespace: "plugdb-system", watched: watching };
    assert_eq!(upgrade.stamp(&stamper).await.expect("the operator's role lets it stamp"), Some(1));
    secrets.create(&PostParams::default(), &labelled("later")).await.expect("made with plugdb's labels afterwards");
    assert_eq!(upgrade.stamp(&stamper).await.expect("looked"), None, "once per key");
    for (name, stamped) in [("older-credentials", true), ("later-credentials", false)] {
        let mut read = secrets.get(name).await.expect("get");
        stamper.judge(&mut read);
        assert_eq!(held(&read.metadata), stamped, "{name}");
        secrets.delete(name, &Default::default()).await.expect("delete");
    }
}

/// Which of the children of Database `orders` in `ns` exist (by what they are).
async fn children(admin: &Client, ns: &str) -> Vec<(&'static str, bool)> {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::batch::v1::Job;
    use k8s_openapi::api::core::v1::{Secret, Service};
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;
    let exists = |found: Option<()>| found.is_some();
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), ns).get_opt("orders").await.expect("get").map(drop);
    let svc = Api::<Service>::namespaced(admin.clone(), ns).get_opt("orders-replicas").await.expect("get").map(drop);
    let secret = Api::<Secret>::namespaced(admin.clone(), ns).get_opt("orders-app").await.expect("get").map(drop);
    let config = Api::<ConfigMap>::namespaced(admin.clone(), ns).get_opt("orders-config").await.expect("get").map(drop);
    let pdb = Api::<PodDisruptionBudget>::namespaced(admin.clone(), ns).get_opt("orders").await.expect("get").map(drop);
    let claim = Api::<PersistentVolumeClaim>::namespaced(admin.clone(), ns).get_opt("orders-backups").await.expect("get").map(drop);
    let jobs =
        Api::<Job>::namespaced(admin.clone(), ns).list(&ListParams::default().labels("plugdb.io/backup-of=orders")).await.expect("jobs");
    vec![
        ("StatefulSet", exists(sts)),
        ("Service", exists(svc)),
        ("Secret", exists(secret)),
        ("ConfigMap", exists(config)),
        ("PodDisruptionBudget", exists(pdb)),
        ("backup claim", exists(claim)),
        ("backup Job", !jobs.items.is_empty()),
    ]
}

/// The chart's MutatingAdmissionPolicy: a Database whose deletion takes a final backup
/// carries the finalizer from the request that creates it, keeps it through updates
/// that drop it, and loses it only when its policy no longer takes a backup. No
/// operator runs here: what is seen is the API server's doing.
#[tokio::test]
async fn the_admission_policy_puts_the_finalizer_on_as_a_database_is_created() {
    let cp = ControlPlane::start_with(plugdb_tests::control_plane::Options { controller_manager: false, ..Default::default() })
        .await
        .expect("control plane");
    let admin = cp.client.clone();
    for doc in documents("crds/plugdb.io_databases.yaml").iter().chain(&documents("deploy/namespace.yaml")) {
        apply(&admin, doc, false).await.expect("CRD and namespace");
    }
    plugdb_tests::operator::install_finalizer_policy(&admin).await.expect("the policy, acted on");
    let dbs: Api<Database> = Api::namespaced(admin.clone(), "default");
    let database = |name: &str, deletion: &str| -> Database {
        serde_json::from_value(json!({"apiVersion": "plugdb.io/v1alpha1", "kind": "Database", "metadata": {"name": name},
                                      "spec": {"engine": "postgres", "storage": "1Gi", "deletionPolicy": deletion}}))
        .expect("a Database")
    };
    let has_finalizer = |db: &Database| db.metadata.finalizers.iter().flatten().any(|f| f == reconcile::FINALIZER);

    let kept = dbs.create(&PostParams::default(), &database("kept", "Snapshot")).await.expect("create");
    assert!(has_finalizer(&kept), "created with the finalizer: {:?}", kept.metadata.finalizers);
    let retained = dbs.create(&PostParams::default(), &database("retained", "Retain")).await.expect("create");
    assert!(!has_finalizer(&retained), "no final backup, no finalizer: {:?}", retained.metadata.finalizers);

    // An update that drops it gets it back, as long as deletion takes a backup.
    let dropped =
        dbs.patch("kept", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await.expect("patch");
    assert!(has_finalizer(&dropped), "put back on update: {:?}", dropped.metadata.finalizers);
    let retain = json!({"metadata": {"finalizers": null}, "spec": {"deletionPolicy": "Retain"}});
    let now_retained = dbs.patch("kept", &PatchParams::default(), &Patch::Merge(retain)).await.expect("patch");
    assert!(!has_finalizer(&now_retained), "left off once deletion keeps the volumes: {:?}", now_retained.metadata.finalizers);

    dbs.delete("retained", &Default::default()).await.expect("delete");
    assert!(dbs.get_opt("retained").await.expect("get").is_none(), "nothing holds a Database the policy left alone");
}
