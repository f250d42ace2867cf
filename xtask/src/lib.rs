//! Builds engine plugins and test fixtures into WebAssembly components.
//!
//! Each crate is compiled for `wasm32-unknown-unknown` (no WASI) with the `plugin`
//! profile, then its core module is wrapped into a component with `wit-component`.
//! Two toolchains are supported, tried in this order:
//!
//! 1. the active rustup toolchain, when its `wasm32-unknown-unknown` target is installed;
//! 2. Debian's `rustc-web`/`cargo-web` (`/usr/bin/rustc`), building `std` from
//!    `rust-web-src` with `-Zbuild-std` and linking with `wasm-ld-19`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

const TARGET: &str = "wasm32-unknown-unknown";
const PROFILE: &str = "plugin";
/// The plugin's own stack in its linear memory (Rust's default is 1 MiB). The stack
/// comes first in memory, so an overflow traps instead of overwriting data; a small
/// one keeps everything a call touches (stack, statics, heap) in the first few hundred
/// KiB, the part of a pool slot the host keeps mapped between calls.
pub const GUEST_STACK: usize = 128 << 10;

/// A crate to build into a component.
#[derive(Debug, Clone)]
pub struct PluginCrate {
    /// Short name, also the file stem of the component (`postgres` → `postgres.wasm`).
    pub name: String,
    /// Cargo package name.
    pub package: String,
    /// Crate directory.
    pub dir: PathBuf,
}

impl PluginCrate {
    fn lib_file(&self) -> String {
        format!("{}.wasm", self.package.replace('-', "_"))
    }
}

/// A built component.
#[derive(Debug, Clone)]
pub struct Component {
    /// Short name of the crate it was built from.
    pub name: String,
    /// Where the component was written.
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
}

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives one level below the workspace root").to_path_buf()
}

/// Engine plugins: every crate under `plugins/` except the SDK, package `plugdb-plugin-<dir>`.
pub fn engine_plugins(root: &Path) -> Result<Vec<PluginCrate>> {
    crates_under(&root.join("plugins"), "plugdb-plugin-", &["sdk"])
}

/// Test fixtures: every crate under `tests/fixtures/`, package `plugdb-fixture-<dir>`.
pub fn fixtures(root: &Path) -> Result<Vec<PluginCrate>> {
    crates_under(&root.join("tests/fixtures"), "plugdb-fixture-", &[])
}

fn crates_under(dir: &Path, prefix: &str, skip: &[&str]) -> Result<Vec<PluginCrate>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_owned) else {
            continue;
        };
        if skip.contains(&name.as_str()) || !path.join("Cargo.toml").is_file() {
            continue;
        }
        found.push(PluginCrate { package: format!("{prefix}{name}"), name, dir: path });
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(found)
}

/// How to invoke a cargo that can target `wasm32-unknown-unknown`.
#[derive(Debug)]
enum Toolchain {
    Rustup { cargo: PathBuf },
    Debian,
}

const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_CARGO: &str = "/usr/bin/cargo";
const DEBIAN_RUST_SRC: &str = "/usr/lib/rustlib/src/rust/library";
const DEBIAN_WASM_LD: &str = "/usr/bin/wasm-ld-19";

fn detect_toolchain() -> Result<Toolchain> {
    let cargo = std::env::var_os("CARGO").map(PathBuf::from).unwrap_or_else(|| "cargo".into());
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .env_remove("RUSTC")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if let Some(sysroot) = sysroot
        && sysroot.join("lib/rustlib").join(TARGET).join("lib").is_dir()
    {
        return Ok(Toolchain::Rustup { cargo });
    }
    let missing: Vec<&str> =
        [DEBIAN_RUSTC, DEBIAN_CARGO, DEBIAN_RUST_SRC, DEBIAN_WASM_LD].into_iter().filter(|p| !Path::new(p).exists()).collect();
    if missing.is_empty() {
        return Ok(Toolchain::Debian);
    }
    bail!(
        "no Rust toolchain can build {TARGET}: the active toolchain lacks the target \
         (`rustup target add {TARGET}`) and the Debian route is incomplete, missing {} \
         (`apt-get install rustc-web cargo-web rust-web-src lld-19`)",
        missing.join(", ")
    )
}

/// A cargo command for `toolchain` with the calling build's environment removed.
fn cargo(toolchain: &Toolchain) -> Command {
    let mut cmd = match toolchain {
        Toolchain::Rustup { cargo } => Command::new(cargo),
        Toolchain::Debian => Command::new(DEBIAN_CARGO),
    };
    // A build script's environment belongs to the outer build; start clean.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with("CARGO_") || key.starts_with("RUSTC") || key.starts_with("DEP_") {
            cmd.env_remove(&*key);
        }
    }
    for key in
        ["RUSTFLAGS", "RUSTDOCFLAGS", "MAKEFLAGS", "MFLAGS", "TARGET", "HOST", "OUT_DIR", "PROFILE", "OPT_LEVEL", "DEBUG", "NUM_JOBS"]
    {
        cmd.env_remove(key);
    }
    if let Toolchain::Debian = toolchain {
        cmd.env("RUSTC", DEBIAN_RUSTC)
            .env("RUSTC_BOOTSTRAP", "1")
            .env("CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER", DEBIAN_WASM_LD)
            .arg("-Zbuild-std=std,panic_abort");
    }
    cmd
}

/// Compiles `crates` to core modules and wraps each into a component in `out_dir`.
///
/// `target_dir` is the cargo target directory used for the wasm build; it must differ
/// from the one of any cargo process that is waiting on this call.
pub fn build(root: &Path, crates: &[PluginCrate], target_dir: &Path, out_dir: &Path) -> Result<Vec<Component>> {
    if crates.is_empty() {
        return Ok(Vec::new());
    }
    let toolchain = detect_toolchain()?;
    // Plugin crates are plain libraries (so their logic unit-tests natively); the
    // cdylib is asked for here, one crate at a time, sharing one target directory.
    for c in crates {
        let mut cmd = cargo(&toolchain);
        cmd.current_dir(root)
            .args(["rustc", "--lib", "--crate-type", "cdylib", "--profile", PROFILE, "--target", TARGET, "-p", &c.package, "--target-dir"])
            .arg(target_dir)
            .args(["--", "-C", &format!("link-arg=-zstack-size={GUEST_STACK}")]);
        let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
        ensure!(status.success(), "building plugin {} failed ({status}): {cmd:?}", c.package);
    }

    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let module_dir = target_dir.join(TARGET).join(PROFILE);
    crates
        .iter()
        .map(|c| {
            let module = module_dir.join(c.lib_file());
            let bytes = std::fs::read(&module).with_context(|| format!("reading {}", module.display()))?;
            let component = componentize(&bytes).with_context(|| format!("turning {} into a component", module.display()))?;
            let path = out_dir.join(format!("{}.wasm", c.name));
            std::fs::write(&path, &component).with_context(|| format!("writing {}", path.display()))?;
            Ok(Component { name: c.name.clone(), size: component.len() as u64, path })
        })
        .collect()
}

/// Wraps a core module that carries wit-bindgen's component-type section into a component.
pub fn componentize(module: &[u8]) -> Result<Vec<u8>> {
    wit_component::ComponentEncoder::default().module(module)?.validate(true).encode()
}
