//! Tier 2: real components, built from source, in the real wasmtime runtime.

use plugdb::plugin::{
    BackupLocation, Capability, Contract, EngineSpec, Limits, ParameterValue, ProbeAction, ResourceAmounts, Runtime, ScaleStep,
};

fn spec(version: &str) -> EngineSpec {
    EngineSpec {
        name: "orders".into(),
        namespace: "shop".into(),
        version: version.into(),
        replicas: 3,
        storage_bytes: 10 << 30,
        requests: ResourceAmounts::default(),
        limits: ResourceAmounts { cpu_millis: Some(2000), memory_bytes: Some(4 << 30) },
        parameters: vec![("greeting".into(), ParameterValue::Text("hi".into()))],
        tls: None,
        synchronous_replicas: 0,
    }
}

#[test]
fn minimal_plugin_loads_and_answers_every_function() {
    let runtime = Runtime::new(Limits::default()).expect("runtime");
    let plugin = runtime.load(&plugdb_tests::component("minimal")).expect("minimal plugin loads");

    let info = plugin.info();
    assert_eq!(info.engine, "minimal");
    assert_eq!(info.contract_version, plugdb::plugin::CONTRACT_VERSION);
    assert_eq!(plugin.id(), "minimal@1.0.0");
    assert_eq!(plugin.digest().len(), 64);

    assert!(plugin.validate(&spec("1")).expect("validate").is_empty());
    let mut bad = spec("9");
    bad.parameters.push(("colour".into(), ParameterValue::Integer(3)));
    let violations = plugin.validate(&bad).expect("validate");
    let fields: Vec<&str> = violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(fields, ["spec.version", "spec.parameters.colour"]);

    let workload = plugin.render(&spec("2"), &plugdb_tests::cluster("orders", "shop")).expect("render");
    assert_eq!(workload.image, "localhost/plugdb/minimal:2");
    assert_eq!(workload.config_files[0].content, "greeting = hi\nreplicas = 3\n");
    assert_eq!(workload.readiness.expect("readiness").action, ProbeAction::TcpSocket(7000));

    assert_eq!(plugin.plan_upgrade(&spec("2"), "1").expect("upgrade 1→2").steps.len(), 1);
    let refusal = plugin.plan_upgrade(&spec("1"), "2").expect_err("downgrade refused");
    assert!(refusal.to_string().contains("cannot move from version 2 to 1"), "{refusal}");

    // spec("1") asks for 3 members: from 1, one at a time; from 5, refused (no majority left).
    assert_eq!(plugin.plan_scale(&spec("1"), 1, &[]).expect("scale up"), [ScaleStep::Members(2), ScaleStep::Members(3)]);
    let refusal = plugin.plan_scale(&spec("1"), 7, &[]).expect_err("losing quorum is refused");
    assert!(refusal.to_string().contains("would lose quorum"), "{refusal}");
}

#[test]
fn a_plugin_built_for_contract_0_1_is_adapted_and_asked_only_what_0_1_can_answer() {
    let runtime = Runtime::new(Limits::default()).expect("runtime");
    let plugin = runtime.load(&plugdb_tests::component("contract-0-1")).expect("a 0.1 plugin loads");
    assert_eq!(plugin.contract(), Contract::V0_1);
    let info = plugin.info();
    assert_eq!((info.engine.as_str(), info.contract_version.as_str()), ("legacy", "0.1.0"));
    assert!(info.capabilities.backup && info.capabilities.restore);
    assert!(!info.capabilities.point_in_time, "0.1 has no word for it");
    assert!(plugin.lacks(plugdb::plugin::Capability::Tls).is_some_and(|why| why.contains("tls")), "nor for TLS");
    assert!(plugin.lacks(Capability::PointInTime).is_some());

    let mut s = spec("1");
    s.parameters.clear();
    assert!(plugin.validate(&s).expect("validate").is_empty());
    // What 0.2 adds to the records is dropped on the way in; the answers mean what they meant.
    let mut cluster = plugdb_tests::cluster("orders", "shop");
    cluster.archive_directory = Some("/plugdb/archive".into());
    let workload = plugin.render(&s, &cluster).expect("render");
    assert_eq!(workload.args, ["--primary", "orders.shop.svc"]);
    assert_eq!(workload.readiness.expect("readiness").action, ProbeAction::TcpSocket(7100));
    let location = BackupLocation {
        directory: "/backups".into(),
        artifact: "orders-1".into(),
        host: "orders.shop.svc".into(),
        credentials_secret: "orders-credentials".into(),
        cluster,
        archive_directory: None,
        point_in_time: None,
    };
    let job = plugin.backup(&s, &location).expect("backup plan");
    assert_eq!(job.command[2], "legacy-dump --host orders.shop.svc > /backups/orders-1");
    assert!(plugin.restore(&s, &location, 0).expect("restore plan").expect("member 0").command[2].starts_with("legacy-load"));
    assert_eq!(plugin.restore(&s, &location, 1).expect("restore plan"), None, "0.1 restores member 0 alone; the others join it");

    // 0.1 has no plan-scale: it scales in one step, as it always did.
    let mut five = s.clone();
    five.replicas = 5;
    assert_eq!(plugin.plan_scale(&five, 1, &[]).expect("a plan"), [ScaleStep::Members(5)]);

    let current = runtime.load(&plugdb_tests::component("minimal")).expect("minimal loads");
    assert_eq!(current.contract(), Contract::V0_2);
}

#[test]
fn built_plugins_carry_no_post_return_functions_and_still_answer() {
    // Every call runs in an instance of its own that is thrown away afterwards, so a
    // function that frees a call's result has nothing to do: the build leaves them out.
    let runtime = Runtime::new(Limits::default()).expect("runtime");
    for name in ["postgres", "mysql", "etcd", "minimal"] {
        let bytes = plugdb_tests::component(name);
        assert!(!bytes.windows(10).any(|w| w == b"cabi_post_"), "{name} still exports a post-return function");
        let plugin = runtime.load(&bytes).unwrap_or_else(|e| panic!("{name} loads: {e}"));
        let cluster = plugdb_tests::cluster("orders", "shop");
        let spec = EngineSpec { parameters: Vec::new(), ..spec(&plugin.info().default_version) };
        plugin.render(&spec, &cluster).unwrap_or_else(|e| panic!("{name} renders: {e}"));
    }
}

#[test]
fn a_500_kib_component_loads_and_answers() {
    let bytes = plugdb_tests::component("bulky");
    assert!(bytes.len() >= 500 << 10, "the benchmark's large component is {} bytes", bytes.len());
    let runtime = Runtime::new(Limits::default()).expect("runtime");
    let plugin = runtime.load(&bytes).expect("bulky loads");
    let mut cluster = plugdb_tests::cluster("orders", "shop");
    cluster.restoring = true;
    let workload = plugin.render(&spec("1"), &cluster).expect("render");
    assert!(workload.config_files[0].content.starts_with("checksum = "));
    assert!(workload.config_files[0].content.ends_with("restoring = true\n"), "render is told a restore is under way");
    let init = &workload.init_containers;
    assert_eq!(init.len(), 1);
    assert_eq!(
        (init[0].name.as_str(), init[0].command.as_slice()),
        ("prepare", ["bulky-prepare".to_string(), "/data".to_string()].as_slice())
    );
}

#[test]
fn an_engine_that_elects_its_leader_names_it_from_the_members_answers_and_is_never_asked_to_promote() {
    use plugdb::plugin::{FailoverDecision, Member};
    let runtime = Runtime::new(Limits::default()).expect("runtime");
    let plugin = runtime.load(&plugdb_tests::component("etcd")).expect("the etcd plugin loads");
    assert!(plugin.info().capabilities.elects_leader);
    let etcd = EngineSpec {
        version: "3.5".into(),
        parameters: vec![("quota-backend-bytes".into(), ParameterValue::Integer(4_294_967_296))],
        ..spec("3.5")
    };
    // The host policy accepts its member query (only an engine that elects its leader may have one).
    let workload = plugin.render(&etcd, &plugdb_tests::cluster("orders", "shop")).expect("render");
    let query = workload.member_query.expect("a member query");
    assert_eq!((query.port, query.path.as_str()), (2379, "/v3/maintenance/status"));

    let status = |id: u64, leader: u64| Some(format!(r#"{{"header":{{"member_id":"{id}","raft_term":"2"}},"leader":"{leader}"}}"#));
    let member = |ordinal: u32, answer| Member {
        pod: format!("orders-{ordinal}"),
        ordinal,
        ready: true,
        primary: ordinal == 0,
        position: None,
        answer,
    };
    let members = [member(0, status(10, 12)), member(1, None), member(2, status(12, 12))];
    assert_eq!(plugin.choose_primary(&etcd, &members).expect("choose"), FailoverDecision::Elected("orders-2".into()));

    // A host-chosen engine is not asked this way: postgres answers as before.
    let postgres = runtime.load(&plugdb_tests::component("postgres")).expect("postgres loads");
    assert!(!postgres.info().capabilities.elects_leader);
    let pg = EngineSpec { version: "17".into(), parameters: vec![], ..spec("17") };
    assert!(postgres.render(&pg, &plugdb_tests::cluster("orders", "shop")).expect("render").member_query.is_none());
}

/// With TLS, the real components configure their engines for it, and the host policy
/// lets an engine ask its members over HTTPS only when the Database has TLS.
#[test]
fn with_tls_the_engines_are_configured_for_it_and_members_are_asked_over_https() {
    let runtime = Runtime::new(Limits::default()).expect("runtime");
    let tls = Some(plugdb::tls::files());
    let cluster = plugdb_tests::cluster("orders", "shop");

    let etcd = runtime.load(&plugdb_tests::component("etcd")).expect("etcd loads");
    assert!(etcd.info().capabilities.tls);
    let secured = EngineSpec { version: "3.5".into(), parameters: vec![], tls: tls.clone(), ..spec("3.5") };
    let workload = etcd.render(&secured, &cluster).expect("render with TLS passes host policy");
    assert!(workload.member_query.is_some_and(|q| q.https));

    let postgres = runtime.load(&plugdb_tests::component("postgres")).expect("postgres loads");
    let pg = EngineSpec { version: "17".into(), parameters: vec![], tls: tls.clone(), ..spec("17") };
    let conf = postgres.render(&pg, &cluster).expect("render").config_files;
    let conf = &conf.iter().find(|f| f.name == "postgresql.conf").expect("postgresql.conf").content;
    assert!(conf.contains(&format!("ssl_cert_file = '{}/tls.crt'", plugdb::tls::MOUNT)), "{conf}");

    let mysql = runtime.load(&plugdb_tests::component("mysql")).expect("mysql loads");
    let my = EngineSpec { version: "11.8".into(), parameters: vec![], tls, ..spec("11.8") };
    let cnf = mysql.render(&my, &cluster).expect("render").config_files;
    assert!(cnf.iter().any(|f| f.content.contains("require_secure_transport = ON")));
}
