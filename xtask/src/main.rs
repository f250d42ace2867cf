//! `cargo run -p xtask -- plugins [OUT_DIR]`: builds the engine plugins into components.

use anyhow::{Result, bail};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = xtask::workspace_root();
    match args.first().map(String::as_str) {
        Some("plugins") => {
            let out = args.get(1).map(Into::into).unwrap_or_else(|| root.join("target/plugins"));
            let crates = xtask::engine_plugins(&root)?;
            for c in xtask::build(&root, &crates, &root.join("target/wasm"), &out)? {
                println!("{}\t{}\t{}", c.name, c.size, c.path.display());
            }
            Ok(())
        }
        _ => bail!("usage: cargo run -p xtask -- plugins [OUT_DIR]"),
    }
}
