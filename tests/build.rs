//! Builds every engine plugin and fixture into a component before the tests compile,
//! and tells the tests where they are (`PLUGDB_COMPONENTS_DIR`).

fn main() {
    let root = xtask::workspace_root();
    for dir in ["plugins", "tests/fixtures", "wit"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("components");
    let crates = match (xtask::engine_plugins(&root), xtask::fixtures(&root)) {
        (Ok(mut plugins), Ok(fixtures)) => {
            plugins.extend(fixtures);
            plugins
        }
        (Err(e), _) | (_, Err(e)) => panic!("finding plugin crates: {e:#}"),
    };
    if let Err(e) = xtask::build(&root, &crates, &root.join("target/wasm"), &out) {
        panic!("building plugin components: {e:#}");
    }
    println!("cargo:rustc-env=PLUGDB_COMPONENTS_DIR={}", out.display());
}
