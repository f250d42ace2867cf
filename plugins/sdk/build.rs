//! Rebuilds the bindings whenever the contract changes (`wit` links to the workspace's
//! `wit/`): the macro's own tracking is not always seen by cargo.

fn main() {
    println!("cargo:rerun-if-changed=wit/engine.wit");
}
