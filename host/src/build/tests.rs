use super::*;
use crate::crd::{DatabaseSpec, Spread, SpreadRule};
use crate::logging::LogFormat;
use crate::names::MAX_JOB_NAME;
use crate::plugin::{ConfigFile, EnvSource, EnvVar, Port, Probe, ProbeAction, SecretRef};
use k8s_openapi::api::apps::v1::StatefulSet;

fn database(policy: DeletionPolicy) -> Database {
    let spec: DatabaseSpec = serde_json::from_value(json!({
        "engine": "postgres",
        "version": "17",
        "replicas": 3,
        "storage": "10Gi", "storageClassName": "fast",
        "resources": {"limits": {"memory": "2Gi", "cpu": "1500m"}},
        "parameters": {"max_connections": 200, "work_mem": "8MB"},
        "deletionPolicy": match policy { DeletionPolicy::Snapshot => "Snapshot", DeletionPolicy::Retain => "Retain", DeletionPolicy::Delete => "Delete" },
    }))
    .expect("spec");
    let mut db = Database::new("orders", spec);
    db.metadata.namespace = Some("shop".into());
    db.metadata.uid = Some("0000-1111".into());
    db
}

/// The children of a Database with three members led by `primary`, its members' template
/// rendered for `rendered_for`.
fn rendered<'a>(w: &'a Workload, primary: &'a str, rendered_for: &'a str) -> Rendered<'a> {
    Rendered {
        workload: w,
        engine: "postgres",
        sidecars: Sidecars::default(),
        primary,
        rendered_for,
        replicas: 3,
        leadership: Leadership::HostChosen,
        tls: None,
    }
}

/// The members of a Database with three of them, their template rendered for `rendered_for`.
fn members(db: &Database, w: &Workload, sidecars: Sidecars<'_>, rendered_for: &str, tls: Option<&str>) -> Members {
    statefulset(db, &Rendered { sidecars, tls, ..rendered(w, rendered_for, rendered_for) })
}

fn workload(config: &str) -> Workload {
    Workload {
        image: "docker.io/library/postgres:17".into(),
        command: vec!["sh".into(), "/etc/plugdb/bootstrap.sh".into()],
        args: vec![],
        env: vec![
            EnvVar { name: "PGDATA".into(), source: EnvSource::Value("/var/lib/postgresql/data/pgdata".into()) },
            EnvVar {
                name: "POSTGRES_PASSWORD".into(),
                source: EnvSource::Secret(SecretRef { name: "orders-credentials".into(), key: "superuser-password".into() }),
            },
            EnvVar { name: "POD_NAME".into(), source: EnvSource::Field("metadata.name".into()) },
        ],
        ports: vec![Port { name: "postgres".into(), port: 5432 }],
        readiness: Some(Probe {
            action: ProbeAction::Exec(vec!["pg_isready".into()]),
            initial_delay_seconds: 5,
            period_seconds: 5,
            timeout_seconds: 3,
            failure_threshold: 3,
        }),
        liveness: Some(Probe {
            action: ProbeAction::TcpSocket(5432),
            initial_delay_seconds: 30,
            period_seconds: 10,
            timeout_seconds: 5,
            failure_threshold: 6,
        }),
        config_files: vec![ConfigFile { name: "postgresql.conf".into(), content: config.into() }],
        data_mount_path: "/var/lib/postgresql/data".into(),
        credentials: vec![],
        recommended: ResourceAmounts { cpu_millis: Some(500), memory_bytes: Some(1 << 30) },
        run_as_user: 999,
        init_containers: vec![],
        member_query: None,
        status_command: vec![],
        fence_command: vec![],
        client_command: vec![],
        promote_command: vec![],
        synchronous_command: vec![],
        follow_command: vec![],
        application: None,
        metrics: None,
    }
}

#[test]
fn engine_spec_converts_quantities_and_parameters() {
    let spec = engine_spec(&database(DeletionPolicy::Snapshot), "17").expect("valid");
    assert_eq!(spec.storage_bytes, 10 << 30);
    assert_eq!(spec.limits.memory_bytes, Some(2 << 30));
    assert_eq!(spec.limits.cpu_millis, Some(1500));
    assert_eq!(spec.replicas, 3);
    assert_eq!(
        spec.parameters,
        vec![("max_connections".into(), ParameterValue::Integer(200)), ("work_mem".into(), ParameterValue::Text("8MB".into()))]
    );
}

#[test]
fn engine_spec_names_each_bad_field() {
    let mut db = database(DeletionPolicy::Snapshot);
    db.spec.storage.0 = "ten gigs".into();
    db.spec
        .resources
        .as_mut()
        .expect("resources")
        .limits
        .insert("gpu".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()));
    db.metadata.name = Some("x".repeat(60));
    let fields: Vec<String> = engine_spec(&db, "17").expect_err("invalid").into_iter().map(|v| v.field).collect();
    assert_eq!(fields, ["metadata.name", "spec.storage", "spec.resources.limits.gpu"]);
}

#[test]
fn statefulset_carries_the_workload_under_host_policy() {
    let db = database(DeletionPolicy::Snapshot);
    let child = members(&db, &workload("a = 1\n"), Sidecars::default(), "orders-0", None).child();
    let sts: StatefulSet = serde_json::from_value(child.object.clone()).expect("a valid StatefulSet");
    let spec = sts.spec.expect("spec");
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(spec.update_strategy.and_then(|s| s.type_).as_deref(), Some("OnDelete"));
    let retention = spec.persistent_volume_claim_retention_policy.expect("retention");
    assert_eq!(retention.when_deleted.as_deref(), Some("Retain"));
    assert_eq!(retention.when_scaled.as_deref(), Some("Retain"));
    let pod = spec.template.spec.expect("pod spec");
    let security = pod.security_context.expect("pod security");
    assert_eq!((security.run_as_user, security.run_as_non_root), (Some(999), Some(true)));
    let container = &pod.containers[0];
    let csc = container.security_context.clone().expect("container security");
    assert_eq!(csc.privileged, Some(false));
    assert_eq!(csc.allow_privilege_escalation, Some(false));
    assert_eq!(csc.capabilities.and_then(|c| c.drop), Some(vec!["ALL".to_string()]));
    assert!(pod.host_network.is_none() && pod.host_pid.is_none());
    assert!(pod.volumes.iter().flatten().all(|v| v.host_path.is_none()));
    let env = container.env.clone().expect("env");
    assert_eq!(env[1].value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref()).map(|s| s.name.as_str()), Some("orders-credentials"));
    let resources = container.resources.clone().expect("resources");
    assert_eq!(resources.limits.expect("limits")["memory"].0, "2Gi");
    assert_eq!(resources.requests.unwrap_or_default().get("memory"), None, "the user set memory; no recommendation added");
    let claim = &spec.volume_claim_templates.expect("claims")[0];
    assert_eq!(claim.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()), Some("fast"));
    assert_eq!(sts.metadata.owner_references.expect("owner")[0].uid, "0000-1111");
}

#[test]
fn members_are_spread_over_nodes_by_default_and_as_strictly_as_asked() {
    let mut db = database(DeletionPolicy::Snapshot);
    let pod = |db: &Database| {
        members(db, &workload(""), Sidecars::default(), "orders-0", None).child().object["spec"]["template"]["spec"].clone()
    };
    let preferred = &pod(&db)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(preferred["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(preferred["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"], "orders");
    assert!(pod(&db).get("topologySpreadConstraints").is_none(), "zones are not assumed");

    db.spec.spread = Some(Spread { nodes: Some(SpreadRule::Required), zones: Some(SpreadRule::Preferred), ..Default::default() });
    let spec = pod(&db);
    assert_eq!(
        spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert!(spec["affinity"]["podAntiAffinity"].get("preferredDuringSchedulingIgnoredDuringExecution").is_none());
    assert_eq!(spec["topologySpreadConstraints"][0]["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(spec["topologySpreadConstraints"][0]["whenUnsatisfiable"], "ScheduleAnyway");

    db.spec.spread = Some(Spread { nodes: Some(SpreadRule::Ignored), zones: Some(SpreadRule::Required), ..Default::default() });
    let spec = pod(&db);
    assert!(spec.get("affinity").is_none());
    assert_eq!(spec["topologySpreadConstraints"][0]["whenUnsatisfiable"], "DoNotSchedule");
}

#[test]
fn deletion_policy_delete_lets_volumes_go() {
    let child = members(&database(DeletionPolicy::Delete), &workload(""), Sidecars::default(), "orders-0", None).child();
    assert_eq!(child.object["spec"]["persistentVolumeClaimRetentionPolicy"], json!({"whenDeleted": "Delete", "whenScaled": "Delete"}));
}

#[test]
fn a_config_change_changes_the_pod_template_and_the_hash() {
    let db = database(DeletionPolicy::Snapshot);
    let (a, b) = (
        members(&db, &workload("a = 1\n"), Sidecars::default(), "orders-0", None).child(),
        members(&db, &workload("a = 2\n"), Sidecars::default(), "orders-0", None).child(),
    );
    assert_ne!(
        a.object["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH],
        b.object["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH]
    );
    assert_ne!(a.hash(), b.hash());
    assert_eq!(
        a.hash(),
        members(&db, &workload("a = 1\n"), Sidecars::default(), "orders-0", None).child().hash(),
        "rendering is deterministic"
    );
}

#[test]
fn the_primary_service_follows_the_primary_pod() {
    let db = database(DeletionPolicy::Snapshot);
    let services = services(&db, &workload(""), "orders-2");
    assert_eq!(services[0].object["spec"]["selector"]["statefulset.kubernetes.io/pod-name"], "orders-2");
    assert_eq!(services[1].object["spec"]["selector"][ROLE_LABEL], "replica");
    assert_eq!(services[2].object["spec"]["clusterIP"], "None");
    let all: Vec<Child> = children(&db, &rendered(&workload(""), "orders-0", "orders-0")).into_iter().collect();
    // The members' template follows the primary the workload was rendered for, not the
    // one the Services select (an engine that elects its leader is rendered for member 0):
    // a new leader restarts nothing.
    let led_by = |leader: &str| children(&db, &rendered(&workload(""), leader, "orders-0")).members.set;
    assert_eq!(led_by("orders-1"), led_by("orders-2"));
    let kinds: Vec<String> = all.iter().map(|c| format!("{}/{}", c.resource.kind, c.name)).collect();
    assert_eq!(
        kinds,
        [
            "ConfigMap/orders-config",
            "Service/orders",
            "Service/orders-replicas",
            "Service/orders-headless",
            "StatefulSet/orders",
            "PodDisruptionBudget/orders",
            "PodDisruptionBudget/orders-primary",
            "NetworkPolicy/orders"
        ]
    );
}

/// The members' agent port is reached from where the operator says it runs, alone; every
/// other port from anyone, or, when `spec.clients` names some, from them, the members,
/// the Database's Jobs and the operator.
#[test]
fn the_agent_port_is_the_operators_and_the_rest_the_clients_named() {
    use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer};
    let operator = [crate::build::network::operator_peer("10.201.0.1").expect("an address")];
    let agent = AgentSidecar { image: "plugdb/plugdb:1", clients: "pin", operator: &operator, logs: LogFormat::Text };
    let policy = |db: &Database, agent: Option<&AgentSidecar<'_>>| -> NetworkPolicy {
        serde_json::from_value(crate::build::network::network_policy(db, agent).object).expect("a NetworkPolicy")
    };
    let ports = |rule: &k8s_openapi::api::networking::v1::NetworkPolicyIngressRule| -> Vec<(String, i32, Option<i32>)> {
        let port = |p: &k8s_openapi::api::networking::v1::NetworkPolicyPort| match p.port {
            Some(IntOrString::Int(n)) => n,
            _ => panic!("a numbered port"),
        };
        rule.ports.iter().flatten().map(|p| (p.protocol.clone().unwrap_or_default(), port(p), p.end_port)).collect()
    };
    let mut db = database(DeletionPolicy::Snapshot);
    let open = policy(&db, Some(&agent)).spec.expect("spec");
    assert_eq!(open.pod_selector.and_then(|s| s.match_labels), Some(crate::names::selector(&db)));
    assert_eq!(open.policy_types, Some(vec!["Ingress".to_string()]));
    let rules = open.ingress.expect("rules");
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0].from, None, "no clients named: anyone reaches the engine");
    let agent_port = i32::from(crate::agent::PORT);
    assert_eq!(
        ports(&rules[0]),
        [
            ("TCP".to_string(), 1, Some(agent_port - 1)),
            ("TCP".to_string(), agent_port + 1, Some(65535)),
            ("UDP".to_string(), 1, Some(agent_port - 1)),
            ("UDP".to_string(), agent_port + 1, Some(65535))
        ],
        "every port but the agent's"
    );
    assert_eq!(ports(&rules[1]), [("TCP".to_string(), agent_port, None)]);
    assert_eq!(rules[1].from.as_deref(), Some(&operator[..]), "the agent's port: the operator alone");

    let unknown = AgentSidecar { operator: &[], ..agent };
    let rules = policy(&db, Some(&unknown)).spec.and_then(|s| s.ingress).expect("rules");
    assert_eq!(rules[1].from, None, "an operator that does not say where it runs leaves the agent's port open");
    let rules = policy(&db, None).spec.and_then(|s| s.ingress).expect("rules");
    assert_eq!(rules.len(), 1, "no agent: no agent port");

    let shop: NetworkPolicyPeer = serde_json::from_value(json!({"podSelector": {"matchLabels": {"app": "shop"}}})).expect("a peer");
    db.spec.clients = Some(vec![shop.clone()]);
    let rules = policy(&db, Some(&agent)).spec.and_then(|s| s.ingress).expect("rules");
    let from = rules[0].from.clone().expect("sources");
    let selectors: Vec<_> = from.iter().map(|p| p.pod_selector.clone().and_then(|s| s.match_labels)).collect();
    assert_eq!(from[0], shop, "the clients named");
    assert_eq!(selectors[1], Some(crate::names::selector(&db)), "the members");
    assert_eq!(selectors[2], Some([(crate::names::JOB_OF.to_string(), "orders".to_string())].into()), "its Jobs");
    assert_eq!(from[3], operator[0], "the operator");
    assert_eq!(from.len(), 4);
}

/// Where the host chooses the primary, its eviction waits while another member could
/// lead (the operator switches over first), and the others' budget leaves it out (an
/// eviction is refused for a pod two budgets select). An engine electing its leader, or
/// a single member, holds nothing back but the one member down at a time.
#[test]
fn a_drain_waits_for_the_switchover_of_a_primary_among_several() {
    let db = database(DeletionPolicy::Snapshot);
    let spec = |c: &Child| (c.name.clone(), c.object["spec"].clone());
    let budgets: Vec<(String, serde_json::Value)> = disruption_budgets(&db, Leadership::HostChosen, 3).iter().map(spec).collect();
    let role = |s: &serde_json::Value| s["selector"]["matchExpressions"][0].clone();
    // Counted among the pods each selects: one of the two others may go.
    assert_eq!(budgets[0].0, "orders");
    assert_eq!(budgets[0].1["minAvailable"], 1);
    assert!(budgets[0].1.get("maxUnavailable").is_none(), "a budget of how many may go counts the primary as expected too");
    assert_eq!(role(&budgets[0].1), json!({"key": ROLE_LABEL, "operator": "NotIn", "values": ["primary"]}));
    assert_eq!(budgets[1].0, "orders-primary");
    assert_eq!(budgets[1].1["minAvailable"], 1, "the primary's eviction waits");
    assert_eq!(role(&budgets[1].1), json!({"key": ROLE_LABEL, "operator": "In", "values": ["primary"]}));
    assert!(budgets[1].1.get("unhealthyPodEvictionPolicy").is_none(), "a fenced primary waits for the switchover too");
    for (_, spec) in &budgets {
        assert_eq!(spec["selector"]["matchLabels"][crate::names::INSTANCE_LABEL], "orders");
    }
    let alone = disruption_budgets(&db, Leadership::HostChosen, 1);
    assert_eq!(alone[1].object["spec"]["minAvailable"], 0, "a single member is not held");
    let elected = disruption_budgets(&db, Leadership::Elected, 3);
    assert_eq!(elected.len(), 1);
    assert_eq!(elected[0].object["spec"]["maxUnavailable"], 1);
    assert!(elected[0].object["spec"]["selector"].get("matchExpressions").is_none(), "every member");
}

#[test]
fn an_archiver_ships_the_engines_log_beside_it_and_only_it_holds_the_key() {
    let mut db = database(DeletionPolicy::Snapshot);
    db.spec.backup = Some(
        serde_json::from_value(
            json!({"schedule": "0 2 * * *", "s3": {"endpoint": "https://s3.example", "bucket": "backups", "prefix": "pg/", "credentials": {"secretName": "s3"}}}),
        )
        .expect("backup"),
    );
    let target = db.spec.backup.as_ref().and_then(|b| b.s3.clone()).expect("target");
    let archiver = Archiver { target: &target, image: "plugdb/plugdb:1" };
    let set: StatefulSet = members(&db, &workload(""), Sidecars { archiver: Some(archiver), ..Default::default() }, "orders-0", None).set;
    let pod = set.spec.and_then(|s| s.template.spec).expect("pod");
    let names: Vec<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["postgres", "archive"]);
    let mounts = |i: usize| -> Vec<String> {
        pod.containers[i].volume_mounts.iter().flatten().filter(|m| m.name == "archive").map(|m| m.mount_path.clone()).collect()
    };
    assert_eq!((mounts(0), mounts(1)), (vec![ARCHIVE_MOUNT.to_string()], vec![ARCHIVE_MOUNT.to_string()]), "one directory, shared");
    assert_eq!(
        pod.containers[1].command.clone().unwrap_or_default(),
        [crate::names::OPERATOR_BINARY, "archive", "--dir", ARCHIVE_MOUNT, "--key", "pg/shop/orders/_archive"]
    );
    let keyed = |i: usize| {
        pod.containers[i]
            .env
            .iter()
            .flatten()
            .any(|e| e.value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref()).is_some_and(|s| s.name == "s3"))
    };
    assert!(keyed(1) && !keyed(0), "the access key reaches the archiver, never the engine");
    assert!(pod.volumes.unwrap_or_default().iter().any(|v| v.name == "archive" && v.empty_dir.is_some()));
    assert_eq!(cluster_context(&db, "orders-0", true).archive_directory.as_deref(), Some(ARCHIVE_MOUNT));
    assert_eq!(cluster_context(&db, "orders-0", false).archive_directory, None);
    // With the agent beside them, it reads the directory (read-only) for its series.
    let mut w = workload("");
    w.status_command = vec!["status".into()];
    let agent = AgentSidecar { image: "plugdb/plugdb:1", clients: "pin", operator: &[], logs: LogFormat::Text };
    let sidecars = Sidecars { archiver: Some(archiver), agent: Some(agent), ..Default::default() };
    let pod = members(&db, &w, sidecars, "orders-0", None).set.spec.and_then(|s| s.template.spec).expect("pod");
    let agent = pod.containers.iter().find(|c| c.name == "agent").expect("the agent");
    let read = agent.volume_mounts.iter().flatten().find(|m| m.name == "archive").expect("the archive, in the agent");
    assert_eq!((read.mount_path.as_str(), read.read_only), (ARCHIVE_MOUNT, Some(true)));
    let argv = agent.command.clone().unwrap_or_default();
    assert!(argv.windows(2).any(|w| w == ["--archive", ARCHIVE_MOUNT]), "{argv:?}");
    let format = |c: &Container| c.env.iter().flatten().find(|e| e.name == crate::logging::FORMAT_ENV).and_then(|e| e.value.clone());
    assert_eq!(format(agent), None, "the agent logs text, as the operator does");
    // An operator that logs JSON has its agents log JSON.
    let json = AgentSidecar { image: "plugdb/plugdb:1", clients: "pin", operator: &[], logs: LogFormat::Json };
    let sidecars = Sidecars { agent: Some(json), ..Default::default() };
    let pod = members(&db, &w, sidecars, "orders-0", None).set.spec.and_then(|s| s.template.spec).expect("pod");
    let agent = pod.containers.iter().find(|c| c.name == "agent").expect("the agent");
    assert_eq!(format(agent).as_deref(), Some("json"));
}

/// With a status command and the operator's image, every member gets the agent: its
/// binary copied out of the operator's image first, then the agent in the engine's image
/// with the engine's environment and files, and its data volume read-only (measured for
/// the member's series, on a port of their own that pods' annotations name), serving on
/// its port with the agent's certificate (never the operator's key).
#[test]
fn the_member_agent_runs_the_status_command_beside_the_engine() {
    let db = database(DeletionPolicy::Snapshot);
    let mut w = workload("");
    w.env = vec![EnvVar {
        name: "PGPASSWORD".into(),
        source: EnvSource::Secret(SecretRef { name: "orders-credentials".into(), key: "pw".into() }),
    }];
    let pin = "5e".repeat(32);
    let template = |w: &Workload, image: Option<&str>| -> k8s_openapi::api::core::v1::PodTemplateSpec {
        let agent = image.map(|image| AgentSidecar { image, clients: &pin, operator: &[], logs: LogFormat::Text });
        let set: StatefulSet = members(&db, w, Sidecars { agent, ..Default::default() }, "orders-0", None).set;
        set.spec.expect("spec").template
    };
    let pod = |w: &Workload, agent: Option<&str>| template(w, agent).spec.expect("pod");
    let scraped = |w: &Workload, agent: Option<&str>| {
        let annotations = template(w, agent).metadata.and_then(|m| m.annotations).unwrap_or_default();
        ["scrape", "port", "path"].map(|k| annotations.get(&format!("prometheus.io/{k}")).cloned())
    };
    assert_eq!(scraped(&w, Some("plugdb/plugdb:1")), [None, None, None], "no agent: nothing to scrape");
    let none = pod(&w, Some("plugdb/plugdb:1"));
    assert_eq!(none.containers.len(), 1, "no status command: no agent");
    w.status_command = vec!["sh".into(), "-c".into(), "echo replica 0/1".into()];
    assert_eq!(pod(&w, None).containers.len(), 1, "no operator image: no agent");
    let annotated = [Some("true".to_string()), Some("9188".into()), Some("/metrics".into())];
    assert_eq!(scraped(&w, Some("plugdb/plugdb:1")), annotated, "the member's series, for a Prometheus that reads annotations");

    let pod = pod(&w, Some("plugdb/plugdb:1"));
    let init = pod.init_containers.clone().unwrap_or_default();
    assert_eq!(init[0].name, "agent-install");
    assert_eq!(init[0].image.as_deref(), Some("plugdb/plugdb:1"));
    let agent = pod.containers.iter().find(|c| c.name == "agent").expect("the agent");
    assert_eq!(agent.image, pod.containers[0].image, "the engine's image, for its client tools");
    let env = agent.env.clone().unwrap_or_default();
    assert_eq!(env[..env.len() - 1], pod.containers[0].env.clone().unwrap_or_default()[..], "the engine's environment");
    let named = env.last().and_then(|e| e.value_from.as_ref()?.field_ref.as_ref()).map(|f| f.field_path.as_str());
    assert_eq!(named, Some("metadata.name"), "and its pod's name, for its series");
    let command = agent.command.clone().unwrap_or_default();
    assert_eq!(command[..3], ["/plugdb-bin/plugdb".to_string(), "agent".into(), "serve".into()]);
    assert_eq!(command[command.len() - 3..], w.status_command[..]);
    let after = |flag: &str| command.iter().position(|a| a == flag).map(|at| command[at + 1].as_str());
    let data = pod.containers[0].volume_mounts.iter().flatten().find(|m| m.name == "data").expect("data").mount_path.clone();
    assert_eq!(
        [after("--metrics-port"), after("--database"), after("--engine"), after("--data")],
        [Some("9188"), Some("shop/orders"), Some("postgres"), Some(data.as_str())]
    );
    assert_eq!(after("--clients"), Some(pin.as_str()), "the operator's authority, pinned: not whatever the Secret holds");
    let ports: Vec<(Option<String>, i32)> = agent.ports.iter().flatten().map(|p| (p.name.clone(), p.container_port)).collect();
    assert_eq!(ports, [(Some("agent".into()), 8443), (Some("metrics".into()), 9188)]);
    let mounts: Vec<&str> = agent.volume_mounts.iter().flatten().map(|m| m.name.as_str()).collect();
    let read_only = agent.volume_mounts.iter().flatten().find(|m| m.name == "data").and_then(|m| m.read_only);
    assert_eq!(read_only, Some(true), "the data, read-only: {mounts:?}");
    assert!(mounts.contains(&"config") && mounts.contains(&"agent-certs") && mounts.contains(&"agent-bin"), "{mounts:?}");
    assert!(agent.resources.as_ref().and_then(|r| r.limits.as_ref()).is_some_and(|l| l.contains_key("memory") && l.contains_key("cpu")));
    let certs = pod.volumes.iter().flatten().find(|v| v.name == "agent-certs").and_then(|v| v.secret.clone()).expect("certificates");
    assert_eq!(certs.secret_name.as_deref(), Some("orders-agent"));
    let keys: Vec<String> = certs.items.unwrap_or_default().into_iter().map(|i| i.key).collect();
    assert_eq!(keys, ["tls.crt", "tls.key", "ca.crt", "clients-ca.crt"], "the agent's own and the authorities' certificates, no other key");
    assert!(agent.readiness_probe.is_none() && !mounts.contains(&"agent-state"), "no fence command: never fenced");
    // The engine's exec probe runs in the agent, asked over HTTP, within the plugin's
    // timeout (the kubelet waits a second more); any other probe stays the kubelet's.
    let engine = &pod.containers[0];
    let ready = engine.readiness_probe.clone().expect("the engine's readiness");
    let asked = ready.http_get.as_ref().map(|g| (g.path.as_deref(), g.port.clone()));
    assert_eq!(
        (ready.exec.is_none(), asked, ready.timeout_seconds),
        (true, Some((Some("/engine/ready"), IntOrString::Int(9188))), Some(4))
    );
    let check = after("--readiness").map(|json| serde_json::from_str::<serde_json::Value>(json).expect("JSON"));
    assert_eq!(check, Some(serde_json::json!({"command": ["pg_isready"], "timeoutSeconds": 3})));
    let live = engine.liveness_probe.clone().expect("the engine's liveness");
    assert!(live.tcp_socket.is_some() && after("--liveness").is_none(), "a TCP probe is the kubelet's own");
    let alive = agent.liveness_probe.as_ref().and_then(|p| p.http_get.as_ref()).map(|g| (g.path.as_deref(), g.port.clone()));
    assert_eq!(alive, Some((Some("/live"), IntOrString::Int(9188))), "a hung agent is restarted");
    let agent_restarted = agent.liveness_probe.as_ref().map(|p| p.period_seconds.unwrap_or(10) * p.failure_threshold.unwrap_or(3));
    assert!(agent_restarted < Some(60), "before the engine's liveness (a minute) could restart the engine for it");
    let alone = |w: &Workload| template(w, None).spec.expect("pod").containers[0].readiness_probe.clone().expect("readiness");
    assert!(alone(&w).exec.is_some(), "no agent: the kubelet runs the command");

    // With a fence command: the agent fences the member, and says so in its readiness;
    // the engine sees the mark, read-only.
    // Written as the kubelet reads it back: `$(NAME)` and `$$` reach the agent as they were.
    w.fence_command = vec!["sh".into(), "-c".into(), "DO $$ $f$ $(HOME) $ $$".into()];
    let agent = Some(AgentSidecar { image: "plugdb/plugdb:1", clients: &pin, operator: &[], logs: LogFormat::Text });
    let set = members(&db, &w, Sidecars { agent, ..Default::default() }, "orders-0", None).set;
    let pod = set.spec.and_then(|s| s.template.spec).expect("pod");
    let agent = pod.containers.iter().find(|c| c.name == "agent").expect("the agent");
    let command = agent.command.clone().unwrap_or_default();
    let at = command.iter().position(|a| a == "--fence-command").expect("--fence-command");
    let kubelet = |a: &str| a.replace("$$", "$");
    assert!(!command[at + 1].replace("$$", "").contains('$'), "every $ escaped: {}", command[at + 1]);
    assert_eq!(serde_json::from_str::<Vec<String>>(&kubelet(&command[at + 1])).expect("JSON"), w.fence_command);
    let at = command.iter().position(|a| a == "--members").expect("--members");
    assert_eq!(command[at + 1], "orders-headless.shop.svc");
    let ready = agent.readiness_probe.as_ref().and_then(|p| p.http_get.as_ref()).expect("readiness over HTTP");
    assert_eq!((ready.path.as_deref(), &ready.port), (Some("/ready"), &IntOrString::Int(9188)));
    let state = |c: &k8s_openapi::api::core::v1::Container| {
        c.volume_mounts.iter().flatten().find(|m| m.name == "agent-state").map(|m| (m.mount_path.clone(), m.read_only))
    };
    assert_eq!(state(agent).map(|(path, read_only)| (path, read_only.unwrap_or(false))), Some(("/plugdb-agent".into(), false)));
    assert_eq!(state(&pod.containers[0]), Some(("/plugdb-agent".into(), Some(true))), "the engine reads the mark");
    let fenced = pod.containers[0].env.iter().flatten().find(|e| e.name == "PLUGDB_FENCED").and_then(|e| e.value.clone());
    assert_eq!(fenced.as_deref(), Some("/plugdb-agent/fenced"));
    assert!(pod.volumes.iter().flatten().any(|v| v.name == "agent-state" && v.empty_dir.is_some()), "ends with the pod");
    // The engine runs under the guard, which stops it when the agent says.
    let engine = pod.containers[0].command.clone().unwrap_or_default();
    let guard = ["/plugdb-bin/plugdb", "agent", "guard", "--stop", "/plugdb-agent/stop", "--"];
    assert_eq!((&engine[..guard.len()], &engine[guard.len()..]), (&guard.map(String::from)[..], &w.command[..]));
    let bin = pod.containers[0].volume_mounts.iter().flatten().find(|m| m.name == "agent-bin").map(|m| m.read_only);
    assert_eq!(bin, Some(Some(true)), "the engine runs the guard from the agent's binary, read-only");
}

#[test]
fn init_containers_run_before_the_engine_with_its_volumes_and_user() {
    let db = database(DeletionPolicy::Snapshot);
    let plain: StatefulSet = members(&db, &workload(""), Sidecars::default(), "orders-0", None).set;
    assert!(plain.spec.and_then(|s| s.template.spec).expect("pod").init_containers.is_none());

    let mut w = workload("");
    w.init_containers = vec![crate::plugin::InitContainer {
        name: "prepare".into(),
        image: "busybox:1".into(),
        command: vec!["mkdir".into(), "-p".into(), "/var/lib/postgresql/data/pgdata".into()],
        env: vec![],
    }];
    let set: StatefulSet = members(&db, &w, Sidecars::default(), "orders-0", None).set;
    let pod = set.spec.and_then(|s| s.template.spec).expect("pod");
    let init = pod.init_containers.expect("init containers");
    assert_eq!(init.len(), 1);
    assert_eq!((init[0].name.as_str(), init[0].image.as_deref()), ("init-prepare", Some("busybox:1")));
    assert_eq!(init[0].volume_mounts, pod.containers[0].volume_mounts, "the engine's data, config and /tmp");
    assert_eq!(init[0].security_context, pod.containers[0].security_context);
}

#[test]
fn with_tls_members_and_jobs_mount_the_certificate_and_a_renewal_rolls_the_members() {
    let mut db = database(DeletionPolicy::Snapshot);
    db.spec.tls = Some(crate::crd::TlsSpec { enabled: true, issuer_ref: None });
    let mut w = workload("");
    w.init_containers = vec![crate::plugin::InitContainer {
        name: "prepare".into(),
        image: "docker.io/library/busybox:1".into(),
        command: vec!["true".into()],
        env: vec![],
    }];
    let pod_of = |stamp: Option<&str>| -> (PodTemplateSpec, String) {
        let child = members(&db, &w, Sidecars::default(), "orders-0", stamp).child();
        let set: StatefulSet = serde_json::from_value(child.object.clone()).expect("StatefulSet");
        (set.spec.expect("spec").template, child.hash().to_string())
    };
    let (template, first) = pod_of(Some("2027-11-24T10:00:00Z"));
    assert_eq!(template.metadata.and_then(|m| m.annotations).expect("annotations")[TLS_STAMP], "2027-11-24T10:00:00Z");
    let pod = template.spec.expect("pod");
    let volume = pod.volumes.expect("volumes").into_iter().find(|v| v.name == "tls").expect("the tls volume");
    let secret = volume.secret.expect("a Secret volume");
    assert_eq!((secret.secret_name.as_deref(), secret.default_mode), (Some("orders-tls"), Some(0o440)));
    let mounted = |c: &Container| c.volume_mounts.iter().flatten().any(|m| m.name == "tls" && m.mount_path == crate::tls::MOUNT);
    assert!(mounted(&pod.containers[0]), "the engine has it");
    assert!(pod.init_containers.iter().flatten().all(mounted), "and its init containers");
    let (_, renewed) = pod_of(Some("2028-11-24T10:00:00Z"));
    assert_ne!(first, renewed, "a renewed certificate changes the template: the members roll onto it");
    let (plain, _) = pod_of(None);
    assert!(plain.spec.expect("pod").volumes.expect("volumes").iter().all(|v| v.name != "tls"));

    let plan = crate::plugin::JobPlan { image: "x".into(), command: vec!["true".into()], env: vec![], mounts_data: false };
    let request = crate::jobs::Request {
        name: "orders-1",
        purpose: crate::jobs::Purpose::Backup,
        plan: &plan,
        storage: crate::jobs::Storage::Scratch,
        artifact: "orders-1",
        data: None,
        run_as_user: 999,
    };
    let job = crate::jobs::job(&db, &request, &Default::default());
    let job: k8s_openapi::api::batch::v1::Job = serde_json::from_value(job.object).expect("Job");
    let pod = job.spec.expect("spec").template.spec.expect("pod");
    assert!(pod.containers.iter().chain(pod.init_containers.iter().flatten()).any(mounted), "a Job verifies the members too");
}

/// Passwords as files: the credentials Secret is mounted read-only, readable by the
/// workload's group alone, in the engine, its init containers and its agent, and in Jobs.
#[test]
fn members_and_jobs_mount_the_credentials_for_the_workload_s_group_alone() {
    let db = database(DeletionPolicy::Snapshot);
    let mut w = workload("");
    w.status_command = vec!["true".into()];
    w.init_containers =
        vec![crate::plugin::InitContainer { name: "prepare".into(), image: "busybox:1".into(), command: vec!["true".into()], env: vec![] }];
    let sidecars = Sidecars {
        agent: Some(AgentSidecar { image: "plugdb/plugdb:1", clients: "pin", operator: &[], logs: LogFormat::Text }),
        ..Default::default()
    };
    let set: StatefulSet = members(&db, &w, sidecars, "orders-0", None).set;
    let pod = set.spec.and_then(|s| s.template.spec).expect("pod");
    let is_credentials = |v: &&k8s_openapi::api::core::v1::Volume| v.name == "credentials";
    let secret = pod.volumes.iter().flatten().find(is_credentials).and_then(|v| v.secret.clone()).expect("the credentials volume");
    assert_eq!((secret.secret_name.as_deref(), secret.default_mode), (Some("orders-credentials"), Some(0o440)));
    let mounted = |c: &Container| {
        c.volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "credentials" && m.mount_path == crate::names::CREDENTIALS_MOUNT && m.read_only == Some(true))
    };
    assert!(mounted(&pod.containers[0]), "the engine has it");
    let agent = pod.containers.iter().find(|c| c.name == "agent").expect("the agent");
    assert!(mounted(agent), "its agent runs the engine's commands with it");
    assert!(pod.init_containers.iter().flatten().filter(|c| c.name == "init-prepare").all(mounted), "and its init containers");

    let plan = crate::plugin::JobPlan { image: "x".into(), command: vec!["true".into()], env: vec![], mounts_data: false };
    let request = crate::jobs::Request {
        name: "orders-1",
        purpose: crate::jobs::Purpose::Backup,
        plan: &plan,
        storage: crate::jobs::Storage::Scratch,
        artifact: "orders-1",
        data: None,
        run_as_user: 999,
    };
    let job: k8s_openapi::api::batch::v1::Job =
        serde_json::from_value(crate::jobs::job(&db, &request, &Default::default()).object).expect("Job");
    let pod = job.spec.expect("spec").template.spec.expect("pod");
    assert!(pod.containers.iter().any(mounted), "a Job logs in with them too");
    let contract = include_str!("../../../wit/engine.wit");
    assert!(contract.contains(&format!("`{}`", crate::names::CREDENTIALS_MOUNT)), "the contract names where they are");
}

#[test]
fn job_names_fit_whatever_the_database_name_and_long_ones_keep_apart() {
    let longest = "d".repeat(MAX_NAME);
    for suffix in ["final", "restore-8", "manual-0123456789", "pre-0123456789", "scale-1-9-12", "upgrade-01234567-12", "261121020030"] {
        let name = Names(&longest).job(suffix);
        assert!(name.len() <= MAX_JOB_NAME, "{name}: {} characters", name.len());
        assert!(name.ends_with(&format!("-{suffix}")), "{name}");
        let other = Names(&format!("{}e", &longest[..MAX_NAME - 1])).job(suffix);
        assert_ne!(name, other, "two long names that share a beginning name the same Job");
    }
    assert_eq!(Names("orders").job("final"), "orders-final", "short names are as they were");
}

/// A template rendered for another primary differs from the first only in the primary's
/// name: its role-free hash is the same (a replica need not restart to follow the new
/// primary); any other change gives another hash.
#[test]
fn the_role_free_hash_leaves_out_only_the_primarys_name() {
    let db = database(DeletionPolicy::Snapshot);
    let for_primary = |primary: &str, config: &str| {
        let mut w = workload(config);
        w.env.push(EnvVar { name: "PRIMARY_POD".into(), source: EnvSource::Value(primary.into()) });
        let members = members(&db, &w, Sidecars::default(), primary, None);
        let role_free = members.role_free.clone();
        let set = members.child().object;
        let annotations = set["spec"]["template"]["metadata"]["annotations"].clone();
        assert_eq!(annotations[ROLE_FREE_HASH].as_str(), Some(role_free.as_str()), "the template carries it");
        (role_free, annotations[PRIMARY_ANNOTATION].clone(), set)
    };
    let (before, named, set_before) = for_primary("orders-0", "a = 1\n");
    let (after, named_after, set_after) = for_primary("orders-1", "a = 1\n");
    assert_eq!((named, named_after), (json!("orders-0"), json!("orders-1")));
    assert_ne!(set_before, set_after, "the template itself names its primary");
    assert_eq!(before, after, "but for the primary's name it is the same");
    let (changed, _, _) = for_primary("orders-1", "a = 2\n");
    assert_ne!(changed, after, "any other change counts");
}

/// The engine's client is kept on the StatefulSet, not in its pods' template: declaring
/// one restarts no member.
#[test]
fn the_client_command_is_on_the_statefulset_not_in_the_pods() {
    let db = database(DeletionPolicy::Snapshot);
    let mut w = workload("");
    let set = |w: &Workload| -> StatefulSet { members(&db, w, Sidecars::default(), "orders-0", None).set };
    let without = set(&w);
    assert!(!without.annotations().contains_key(crate::names::CLIENT_COMMAND));
    w.client_command = vec!["sh".into(), "-c".into(), "exec psql".into()];
    let with = set(&w);
    let argv: Vec<String> = serde_json::from_str(&with.annotations()[crate::names::CLIENT_COMMAND]).expect("a JSON argv");
    assert_eq!(argv, w.client_command);
    assert_eq!(with.spec.map(|s| s.template), without.spec.map(|s| s.template), "the pods' template is the same");
}

/// The plugin's exporter runs beside the engine: its image and argv, the monitoring
/// password from the Database's Secret alone, the port the PodMonitor scrapes, limits
/// of its own, no volume but its `/tmp` and a read-only root. An engine that serves
/// its series itself gets the port on its own container. `spec.monitoring.engineMetrics:
/// false` runs and opens neither.
#[test]
fn the_engines_exporter_runs_beside_it_unless_switched_off() {
    use crate::plugin::{Exporter, MetricsEndpoint};
    let mut w = workload("");
    let password = EnvVar {
        name: "DATA_SOURCE_PASS".into(),
        source: EnvSource::Secret(SecretRef { name: "orders-credentials".into(), key: "monitor-password".into() }),
    };
    let exporter = Exporter { image: "quay.io/prometheuscommunity/postgres-exporter:v0.17.1".into(), command: vec![], env: vec![password] };
    w.metrics = Some(MetricsEndpoint { port: 9187, path: "/metrics".into(), exporter: Some(exporter) });
    let mut db = database(DeletionPolicy::Snapshot);
    let pod = |db: &Database, w: &Workload| {
        members(db, w, Sidecars::default(), "orders-0", None).set.spec.expect("spec").template.spec.expect("pod")
    };
    let port_of = |c: &k8s_openapi::api::core::v1::Container| {
        c.ports.iter().flatten().find(|p| p.name.as_deref() == Some("engine-metrics")).map(|p| p.container_port)
    };

    let spec = pod(&db, &w);
    let exporter = spec.containers.iter().find(|c| c.name == "exporter").expect("the exporter");
    assert_eq!(exporter.image.as_deref(), Some("quay.io/prometheuscommunity/postgres-exporter:v0.17.1"));
    assert_eq!(exporter.command, None, "the image's entrypoint");
    assert_eq!(port_of(exporter), Some(9187));
    let env = exporter.env.as_ref().expect("env");
    let secret = env[0].value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref()).expect("from the Secret");
    assert_eq!((secret.name.as_str(), secret.key.as_str()), ("orders-credentials", "monitor-password"));
    let limits = exporter.resources.as_ref().and_then(|r| r.limits.clone()).expect("limits");
    assert_eq!((limits["cpu"].0.as_str(), limits["memory"].0.as_str()), ("250m", "64Mi"));
    let mounts: Vec<&str> = exporter.volume_mounts.iter().flatten().map(|m| m.name.as_str()).collect();
    assert_eq!(mounts, ["exporter-tmp"], "no data, configuration or credentials");
    let security = exporter.security_context.as_ref().expect("security");
    assert_eq!((security.read_only_root_filesystem, security.allow_privilege_escalation), (Some(true), Some(false)));
    assert!(spec.volumes.iter().flatten().any(|v| v.name == "exporter-tmp"));
    assert_eq!(port_of(&spec.containers[0]), None, "the engine's container opens no port for it");

    // etcd's kind: the engine serves them.
    w.metrics.as_mut().expect("metrics").exporter = None;
    let spec = pod(&db, &w);
    assert!(!spec.containers.iter().any(|c| c.name == "exporter"));
    assert_eq!(port_of(&spec.containers[0]), Some(9187));

    // Switched off: neither.
    db.spec.monitoring = Some(crate::crd::Monitoring { engine_metrics: false });
    for exporter in [None, Some(Exporter { image: "x".into(), command: vec![], env: vec![] })] {
        w.metrics.as_mut().expect("metrics").exporter = exporter;
        let spec = pod(&db, &w);
        assert!(!spec.containers.iter().any(|c| c.name == "exporter" || port_of(c).is_some()), "{:?}", spec.containers);
    }
}
