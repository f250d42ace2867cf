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
/// comes first in memory, so an overflow traps instead of overwriting data. The
/// bundled plugins' deepest call (a render) uses under 4 KiB of it; a small stack keeps
/// everything a call touches (stack, statics, heap) in the first [`GUEST_RESIDENT`]
/// bytes, the part of a pool slot the host keeps mapped and resets by copying it whole
/// after every call, so each KiB costs time.
pub const GUEST_STACK: usize = 16 << 10;
/// The memory of a plugin built here that a call touches: two 64 KiB pages with the
/// bundled plugins. The host keeps this much of each pool slot mapped, and a reset
/// copies or clears only what a call made accessible. A plugin starts with the whole
/// pages its stack and statics need (the linker's default), and its heap is the rest of
/// the last one: the bundled plugins' statics end at 45-50 KiB, which leaves 15-20 KiB.
/// That holds an `info` or an etcd render, but not the postgres or mysql render with
/// the `agent` functions the host asks in the same instance (their scripts stay on a
/// heap nothing frees): those grow memory by one page. Kept mapped, that page costs its
/// clearing; unmapped after each call, it cost a page fault per 4 KiB touched and a TLB
/// shootdown, about a tenth of the call. A call that needs more still grows memory, up
/// to the host's cap.
pub const GUEST_RESIDENT: usize = 128 << 10;

/// The linker arguments every plugin is built with.
fn link_args() -> [String; 2] {
    ["-C".into(), format!("link-arg=-zstack-size={GUEST_STACK}")]
}

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
        if (key.starts_with("CARGO_") && key != "CARGO_HOME") || key.starts_with("RUSTC") || key.starts_with("DEP_") {
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
            .arg("--")
            .args(link_args());
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

/// Builds the plugin crate at `dir` (any crate that depends on `plugdb-sdk`, inside this
/// workspace or not) into a component: `out`, or `<target>/plugdb/<lib name>.wasm`.
///
/// The crate is compiled as a `cdylib` with the release profile tuned as the bundled
/// plugins' `plugin` profile is (opt-level 3, fat LTO, one codegen unit, `panic =
/// abort`, stripped), set through the environment so that the crate's own
/// `Cargo.toml` needs nothing plugdb-specific; its target directory is cargo's usual
/// one for it (`CARGO_TARGET_DIR` or `<workspace>/target`).
pub fn build_dir(dir: &Path, out: Option<&Path>) -> Result<Component> {
    let manifest = dir.join("Cargo.toml");
    ensure!(manifest.is_file(), "{}: no Cargo.toml; run this in a plugin crate or name its directory", dir.display());
    let toolchain = detect_toolchain()?;
    // The caller's target directory, which `cargo` (made for build scripts) drops.
    let with_target_dir = |mut cmd: Command| {
        if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
            cmd.env("CARGO_TARGET_DIR", dir);
        }
        cmd
    };
    let metadata = with_target_dir(cargo(&toolchain))
        .args(["metadata", "--no-deps", "--format-version", "1", "--manifest-path"])
        .arg(&manifest)
        .output()
        .with_context(|| format!("running cargo metadata for {}", manifest.display()))?;
    ensure!(metadata.status.success(), "cargo metadata for {}: {}", manifest.display(), String::from_utf8_lossy(&metadata.stderr));
    let (package, lib, target_dir) = lib_of(&metadata.stdout, &manifest)?;

    let mut cmd = with_target_dir(cargo(&toolchain));
    cmd.args(["rustc", "--lib", "--crate-type", "cdylib", "--release", "--target", TARGET, "--manifest-path"])
        .arg(&manifest)
        .args(["-p", &package, "--"])
        .args(link_args())
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3")
        .env("CARGO_PROFILE_RELEASE_LTO", "true")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
        .env("CARGO_PROFILE_RELEASE_STRIP", "true")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false");
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    ensure!(status.success(), "building plugin {package} failed ({status})");

    let module = target_dir.join(TARGET).join("release").join(format!("{lib}.wasm"));
    let bytes = std::fs::read(&module).with_context(|| format!("reading {}", module.display()))?;
    let component = componentize(&bytes).with_context(|| format!("turning {} into a component", module.display()))?;
    let path = match out {
        Some(path) => path.to_path_buf(),
        None => target_dir.join("plugdb").join(format!("{lib}.wasm")),
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(&path, &component).with_context(|| format!("writing {}", path.display()))?;
    Ok(Component { name: lib, size: component.len() as u64, path })
}

/// The package at `manifest`, its library's name and the target directory, from
/// `cargo metadata` output.
fn lib_of(metadata: &[u8], manifest: &Path) -> Result<(String, String, PathBuf)> {
    let json: serde_json::Value = serde_json::from_slice(metadata).context("reading cargo metadata")?;
    let manifest = manifest.canonicalize().with_context(|| format!("resolving {}", manifest.display()))?;
    let packages = json["packages"].as_array().map(Vec::as_slice).unwrap_or_default();
    let package = packages
        .iter()
        .find(|p| p["manifest_path"].as_str().and_then(|m| Path::new(m).canonicalize().ok()).is_some_and(|m| m == manifest))
        .with_context(|| format!("{} is a workspace without a package; name the plugin crate's directory", manifest.display()))?;
    let name = package["name"].as_str().context("a package without a name")?.to_string();
    let lib = package["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "lib" || k == "cdylib")))
        .and_then(|t| t["name"].as_str())
        .with_context(|| format!("package {name} has no library target: a plugin is a `cargo new --lib` crate"))?
        .replace('-', "_");
    let target = json["target_directory"].as_str().context("cargo metadata names no target directory")?;
    Ok((name, lib, PathBuf::from(target)))
}

/// Wraps a core module that carries wit-bindgen's component-type section into a
/// component, without its post-return functions (see [`without_post_returns`]).
pub fn componentize(module: &[u8]) -> Result<Vec<u8>> {
    let module = without_post_returns(module).context("reading the core module's sections")?;
    wit_component::ComponentEncoder::default().module(&module)?.validate(true).encode()
}

/// What wit-bindgen names the export that frees a call's result once it has been copied out.
const POST_RETURN_PREFIX: &[u8] = b"cabi_post_";

/// `module` without wit-bindgen's post-return exports. A post-return function frees
/// what a call returned once the host has copied it out; plugdb gives every call an
/// instance of its own and throws it away afterwards, so there is nothing to free.
/// Without them the host neither looks them up on every instantiation nor calls one
/// after every call. Every other byte of the module is kept as it is.
fn without_post_returns(module: &[u8]) -> Result<Vec<u8>> {
    ensure!(module.len() >= 8 && module[..4] == *b"\0asm", "not a WebAssembly module");
    let mut out = module[..8].to_vec();
    let mut at = 8;
    while at < module.len() {
        let (start, id) = (at, module[at]);
        let (size, body_at) = leb_u32(module, at + 1)?;
        let body = module.get(body_at..body_at + size as usize).context("a section runs past the end of the module")?;
        at = body_at + body.len();
        if id != EXPORT_SECTION {
            out.extend_from_slice(&module[start..at]);
            continue;
        }
        let (count, mut entry_at) = leb_u32(body, 0)?;
        let (mut kept, mut entries) = (0, Vec::with_capacity(body.len()));
        for _ in 0..count {
            let (name_len, name_at) = leb_u32(body, entry_at)?;
            let name = body.get(name_at..name_at + name_len as usize).context("an export name runs past its section")?;
            // The kind (one byte), then the index.
            let (_, end) = leb_u32(body, name_at + name.len() + 1)?;
            if !name.starts_with(POST_RETURN_PREFIX) {
                entries.extend_from_slice(&body[entry_at..end]);
                kept += 1;
            }
            entry_at = end;
        }
        let mut section = Vec::with_capacity(entries.len() + 5);
        push_leb_u32(&mut section, kept);
        section.extend_from_slice(&entries);
        out.push(EXPORT_SECTION);
        push_leb_u32(&mut out, section.len() as u32);
        out.extend_from_slice(&section);
    }
    Ok(out)
}

/// The id of a core module's export section.
const EXPORT_SECTION: u8 = 7;

/// The unsigned LEB128 number at `at` in `bytes`, and where what follows it starts.
fn leb_u32(bytes: &[u8], mut at: usize) -> Result<(u32, usize)> {
    let mut value: u64 = 0;
    for shift in (0..35).step_by(7) {
        let byte = *bytes.get(at).context("a number runs past the end of the module")?;
        at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return u32::try_from(value).map(|v| (v, at)).context("a number too big for 32 bits");
        }
    }
    bail!("a number longer than 5 bytes")
}

fn push_leb_u32(out: &mut Vec<u8>, mut value: u32) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A section: its id, its size, its bytes.
    fn section(id: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![id];
        push_leb_u32(&mut out, body.len() as u32);
        out.extend_from_slice(body);
        out
    }

    /// An export section entry naming memory 0.
    fn memory_export(name: &str) -> Vec<u8> {
        let mut out = Vec::new();
        push_leb_u32(&mut out, name.len() as u32);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&[2, 0]);
        out
    }

    fn module(exports: &[&str]) -> Vec<u8> {
        let mut out = b"\0asm\x01\0\0\0".to_vec();
        // One memory of one page, then the exports, then a custom section after them.
        out.extend(section(5, &[1, 0, 1]));
        let mut body = vec![exports.len() as u8];
        exports.iter().for_each(|name| body.extend(memory_export(name)));
        out.extend(section(EXPORT_SECTION, &body));
        out.extend(section(0, b"\x04note kept as it is"));
        out
    }

    #[test]
    fn post_return_exports_are_dropped_and_every_other_byte_kept() {
        let long_name = "x".repeat(200); // a name whose length takes two LEB bytes
        let original = module(&["memory", "cabi_post_plugdb:engine/plugin@0.2.0#render", &long_name, "cabi_post_info"]);
        assert_eq!(without_post_returns(&original).expect("a valid module"), module(&["memory", &long_name]));
        let untouched = module(&["memory", "cabi_realloc"]);
        assert_eq!(without_post_returns(&untouched).expect("a valid module"), untouched);
    }

    #[test]
    fn a_truncated_module_is_an_error() {
        let original = module(&["memory", "cabi_post_info"]);
        for cut in [3, 9, original.len() - 1] {
            assert!(without_post_returns(&original[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn numbers_read_back_as_written() {
        for value in [0, 1, 127, 128, 16_383, 16_384, u32::MAX] {
            let mut bytes = Vec::new();
            push_leb_u32(&mut bytes, value);
            assert_eq!(leb_u32(&bytes, 0).expect("a number"), (value, bytes.len()));
        }
        assert!(leb_u32(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x01], 0).is_err());
    }
}
