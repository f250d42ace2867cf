//! The tools for people, on real components: inspect, pack, render, and their errors.

use plugdb::cli;

fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

#[test]
fn inspect_and_pack_describe_a_real_plugin() {
    let plugin = plugdb_tests::component_path("postgres");
    let text = cli::inspect(&plugin).expect("inspect");
    assert!(text.contains("engine:            postgres"), "{text}");
    assert!(text.contains("contract:          plugdb:engine@0.1.0"), "{text}");
    let yaml = cli::pack(&plugin, "plugdb-system").expect("pack");
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_yaml::from_str(&yaml).expect("a ConfigMap");
    assert_eq!(cm.metadata.labels.expect("labels")["plugdb.io/engine-plugin"], "postgres");
    let bytes = &cm.binary_data.expect("data")["plugin.wasm"].0;
    assert_eq!(cm.metadata.annotations.expect("annotations")["plugdb.io/sha256"], plugdb::plugin::hex_digest(bytes));
    let err = cli::inspect(std::path::Path::new("Cargo.toml")).expect_err("not a plugin");
    assert!(format!("{err:#}").contains("Cargo.toml: not a usable plugin"), "{err:#}");
}

#[test]
fn render_prints_the_objects_or_names_the_file_and_field() {
    let dir = tempfile::tempdir().expect("dir");
    let plugin = plugdb_tests::component_path("postgres");
    let good = write(
        dir.path(),
        "db.yaml",
        "apiVersion: plugdb.io/v1alpha1\nkind: Database\nmetadata: {name: orders}\nspec: {engine: postgres, version: \"15\", replicas: 2, storage: {size: 5Gi}}\n",
    );
    let out = cli::render(&good, &plugin).expect("render");
    for kind in ["kind: ConfigMap", "kind: Service", "kind: StatefulSet", "kind: PodDisruptionBudget"] {
        assert!(out.contains(kind), "{kind} missing");
    }
    assert!(out.contains("image: docker.io/library/postgres:15"));

    let bad = write(
        dir.path(),
        "bad.yaml",
        "apiVersion: plugdb.io/v1alpha1\nkind: Database\nmetadata: {name: orders}\nspec: {engine: postgres, version: \"9\", storage: {size: 5Gi}, parameters: {max_connections: lots}}\n",
    );
    let err = format!("{:#}", cli::render(&bad, &plugin).expect_err("invalid"));
    assert!(err.contains("bad.yaml") && err.contains("spec.version") && err.contains("spec.parameters.max_connections"), "{err}");

    let typo = write(
        dir.path(),
        "typo.yaml",
        "apiVersion: plugdb.io/v1alpha1\nkind: Database\nmetadata: {name: orders}\nspec: {engine: postgres, replicas: many, storage: {size: 5Gi}}\n",
    );
    let err = format!("{:#}", cli::render(&typo, &plugin).expect_err("ill-typed"));
    assert!(err.contains("typo.yaml") && err.contains("replicas"), "{err}");
}
