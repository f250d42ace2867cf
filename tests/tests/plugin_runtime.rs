//! Tier 2: real components, built from source, in the real wasmtime runtime.

use plugdb::plugin::{EngineSpec, Limits, ParameterValue, ProbeAction, ResourceAmounts, Runtime};

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
}

#[test]
fn a_500_kib_component_loads_and_answers() {
    let bytes = plugdb_tests::component("bulky");
    assert!(bytes.len() >= 500 << 10, "the benchmark's large component is {} bytes", bytes.len());
    let runtime = Runtime::new(Limits::default()).expect("runtime");
    let plugin = runtime.load(&bytes).expect("bulky loads");
    let workload = plugin.render(&spec("1"), &plugdb_tests::cluster("orders", "shop")).expect("render");
    assert!(workload.config_files[0].content.starts_with("checksum = "));
}
