//! The `plugdb` command: the operator and tools for people.

use anyhow::{Context, Result, bail};
use kube::CustomResourceExt;
use plugdb::crd::Database;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("crd") => {
            let yaml = serde_yaml::to_string(&Database::crd()).context("serialising the CRD")?;
            print!("{yaml}");
            Ok(())
        }
        _ => bail!("usage: plugdb crd"),
    }
}
