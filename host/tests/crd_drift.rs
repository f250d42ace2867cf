//! The checked-in CRD is generated from the Rust types; this fails when it is stale.

use kube::CustomResourceExt;
use plugdb::crd::Database;

#[test]
fn checked_in_crd_matches_the_rust_types() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/plugdb.io_databases.yaml");
    let checked_in = std::fs::read_to_string(path).expect("crds/plugdb.io_databases.yaml exists");
    let generated = yaml_serde::to_string(&Database::crd()).expect("CRD serialises");
    assert!(
        checked_in == generated,
        "crds/plugdb.io_databases.yaml is stale: regenerate it with `cargo run -p plugdb -- crd > crds/plugdb.io_databases.yaml`"
    );
}
