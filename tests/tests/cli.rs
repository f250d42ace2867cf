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
    let text = cli::inspect(&plugin, &plugdb_tests::plugdb_binary()).expect("inspect");
    assert!(text.contains("engine:            postgres"), "{text}");
    assert!(text.contains("contract:          plugdb:engine@0.2.0"), "{text}");
    let line = |name: &str| text.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_string();
    // Every capability the plugin declares.
    assert_eq!(line("capabilities:"), "capabilities:      backup, restore, failover, online-upgrade, point-in-time, tls");
    let etcd = cli::inspect(&plugdb_tests::component_path("etcd"), &plugdb_tests::plugdb_binary()).expect("inspect");
    assert!(etcd.lines().any(|l| l.starts_with("capabilities:") && l.contains("elects-leader")), "{etcd}");
    let yaml = cli::pack(&plugin, "plugdb-system", &plugdb_tests::plugdb_binary()).expect("pack");
    let cm: k8s_openapi::api::core::v1::ConfigMap = yaml_serde::from_str(&yaml).expect("a ConfigMap");
    assert_eq!(cm.metadata.labels.expect("labels")["plugdb.io/engine-plugin"], "postgres");
    let bytes = &cm.binary_data.expect("data")["plugin.wasm"].0;
    assert_eq!(cm.metadata.annotations.expect("annotations")["plugdb.io/sha256"], plugdb::plugin::hex_digest(bytes));
    let err = cli::inspect(std::path::Path::new("Cargo.toml"), &plugdb_tests::plugdb_binary()).expect_err("not a plugin");
    assert!(format!("{err:#}").contains("Cargo.toml: not a usable plugin"), "{err:#}");
}

#[test]
fn render_prints_the_objects_or_names_the_file_and_field() {
    let dir = tempfile::tempdir().expect("dir");
    let plugin = plugdb_tests::component_path("postgres");
    let good = write(
        dir.path(),
        "db.yaml",
        "apiVersion: plugdb.io/v1alpha1\nkind: Database\nmetadata: {name: orders}\nspec: {engine: postgres, version: \"15\", replicas: 2, storage: 5Gi}\n",
    );
    let out = cli::render(&good, &plugin, &plugdb_tests::plugdb_binary(), &Default::default()).expect("render");
    for kind in ["kind: ConfigMap", "kind: Service", "kind: StatefulSet", "kind: PodDisruptionBudget"] {
        assert!(out.contains(kind), "{kind} missing");
    }
    assert!(out.contains("image: docker.io/library/postgres:15"));

    let bad = write(
        dir.path(),
        "bad.yaml",
        "apiVersion: plugdb.io/v1alpha1\nkind: Database\nmetadata: {name: orders}\nspec: {engine: postgres, version: \"9\", storage: 5Gi, parameters: {max_connections: lots}}\n",
    );
    let err = format!("{:#}", cli::render(&bad, &plugin, &plugdb_tests::plugdb_binary(), &Default::default()).expect_err("invalid"));
    assert!(err.contains("bad.yaml") && err.contains("spec.version") && err.contains("spec.parameters.max_connections"), "{err}");

    let typo = write(
        dir.path(),
        "typo.yaml",
        "apiVersion: plugdb.io/v1alpha1\nkind: Database\nmetadata: {name: orders}\nspec: {engine: postgres, replicas: many, storage: 5Gi}\n",
    );
    let err = format!("{:#}", cli::render(&typo, &plugin, &plugdb_tests::plugdb_binary(), &Default::default()).expect_err("ill-typed"));
    assert!(err.contains("typo.yaml") && err.contains("replicas"), "{err}");
}

/// `--image-registry` and `--image-pull-secret`: every image the members run comes from
/// the mirror, under its own path, pulled with the Secret.
#[test]
fn render_pulls_every_image_from_the_mirror() {
    let dir = tempfile::tempdir().expect("dir");
    let db = write(
        dir.path(),
        "db.yaml",
        "apiVersion: plugdb.io/v1alpha1\nkind: Database\nmetadata: {name: orders}\nspec: {engine: postgres, version: \"15\", replicas: 2, storage: 5Gi}\n",
    );
    let out = std::process::Command::new(plugdb_tests::plugdb_binary())
        .args(["render", "-f"])
        .arg(&db)
        .arg("--plugin")
        .arg(plugdb_tests::component_path("postgres"))
        .args(["--image-registry", "mirror.example:5000/hub", "--image-pull-secret", "mirror-pull"])
        .output()
        .expect("plugdb render");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    let images: Vec<&str> = text.lines().filter_map(|l| l.trim().strip_prefix("image: ")).collect();
    assert!(!images.is_empty() && images.iter().all(|i| i.starts_with("mirror.example:5000/hub/")), "{images:?}");
    assert!(images.contains(&"mirror.example:5000/hub/library/postgres:15"), "{images:?}");
    let set = text.split("---\n").find(|d| d.contains("kind: StatefulSet")).expect("the StatefulSet");
    let set: k8s_openapi::api::apps::v1::StatefulSet = yaml_serde::from_str(set).expect("a StatefulSet");
    let secrets = set.spec.and_then(|s| s.template.spec).and_then(|p| p.image_pull_secrets).unwrap_or_default();
    assert_eq!(secrets.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["mirror-pull"]);
    let bad = std::process::Command::new(plugdb_tests::plugdb_binary())
        .args(["render", "-f", "db.yaml", "--plugin", "x.wasm", "--image-registry", "https://mirror"])
        .output()
        .expect("plugdb render");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not a registry"), "{bad:?}");
}

/// Every command explains itself; a misspelt flag or command is refused rather than
/// ignored.
#[test]
fn every_command_has_help_and_unknown_flags_are_errors() {
    let binary = plugdb_tests::plugdb_binary();
    let plugdb = |args: &[&str]| std::process::Command::new(&binary).args(args).output().expect("run plugdb");
    for command in [
        &["--help"][..],
        &["run", "--help"],
        &["crd", "--help"],
        &["render", "--help"],
        &["plugin", "inspect", "--help"],
        &["plugin", "pack", "--help"],
    ] {
        let out = plugdb(command);
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && help.contains("Usage: plugdb"), "{command:?}: {help}");
    }
    // The day-two verbs, under the kubectl plugin's name, take kubectl's --namespace and --context.
    let dir = tempfile::tempdir().expect("dir");
    let plugin = dir.path().join("kubectl-plugdb");
    std::os::unix::fs::symlink(&binary, &plugin).expect("a link");
    for verb in ["status", "switchover", "backup", "restore", "connect", "logs", "plugins"] {
        let out = std::process::Command::new(&plugin).args([verb, "--help"]).output().expect("run kubectl-plugdb");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && help.contains(&format!("Usage: kubectl plugdb {verb}")), "{verb}: {help}");
        assert!(help.contains("--namespace") && help.contains("--context"), "{verb}: {help}");
    }
    // Flags a Deployment sets are also read from the environment, and say so.
    let help = String::from_utf8_lossy(&plugdb(&["run", "--help"]).stdout).into_owned();
    for variable in [
        "POD_NAMESPACE",
        "PLUGDB_WATCH_NAMESPACE",
        "PLUGDB_LISTEN",
        "PLUGDB_CONCURRENCY",
        "PLUGDB_PLUGIN_CPU",
        "PLUGDB_LOG_FORMAT",
        "PLUGDB_IMAGE_REGISTRY",
        "PLUGDB_EGRESS_FORBID",
        "PLUGDB_EGRESS_ALLOW",
    ] {
        assert!(help.contains(&format!("env: {variable}")), "{variable} missing from: {help}");
    }
    // Without its image an operator runs members without agents: the help says what is off.
    let image = help.split("--image").nth(1).unwrap_or_default();
    assert!(image.contains("failover, fencing, switchover"), "--image says what needs it: {help}");
    // A failure says why in one line, never a backtrace, whatever RUST_BACKTRACE says.
    let missing = std::process::Command::new(plugdb_tests::plugdb_binary())
        .args(["plugin", "inspect", "/nonexistent/plugin.wasm"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("plugdb");
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success() && said.starts_with("error: "), "{said}");
    assert!(!said.contains("Stack backtrace") && !said.contains("backtrace"), "{said}");
    for (args, complaint) in [
        (&["run", "--listn", ":0"][..], "unexpected argument '--listn'"),
        (&["run", "--concurrency", "many"], "invalid value 'many' for '--concurrency <CONCURRENCY>'"),
        (&["run", "--plugin-cpu", "0"], "invalid value '0' for '--plugin-cpu <THREADS>': \"0\" is not a positive number of threads"),
        (&["plugin", "unpack", "x.wasm"], "unrecognized subcommand 'unpack'"),
        (&["render", "--plugin", "x.wasm"], "--filename <DATABASE.yaml>"),
    ] {
        let out = plugdb(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(complaint), "{args:?}: {stderr}");
    }
}

/// `plugdb run` with `PLUGDB_LISTEN=127.0.0.1:0` serves on a free port and says which.
#[tokio::test]
async fn run_names_the_port_it_listens_on() {
    use std::io::BufRead;
    let binary = plugdb_tests::plugdb_binary();

    let cp = plugdb_tests::ControlPlane::start().await.expect("control plane");
    let mut child = std::process::Command::new(&binary)
        .args(["run", "--no-leader-election", "--namespace", "default"])
        .env("PLUGDB_LISTEN", "127.0.0.1:0")
        .env("KUBECONFIG", &cp.kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the operator");
    let stdout = child.stdout.take().expect("stdout");
    let line = std::io::BufReader::new(stdout).lines().map_while(Result::ok).find(|l| l.contains("plugdb starting")).expect("a start line");
    let digits = |s: &str| s.chars().take_while(char::is_ascii_digit).collect::<String>();
    let port: u16 = line.split("on 127.0.0.1:").nth(1).and_then(|p| digits(p).parse().ok()).unwrap_or_else(|| panic!("a port in {line:?}"));
    assert_ne!(port, 0, "{line}");
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("the named port serves");
    tokio::io::AsyncWriteExt::write_all(&mut stream, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.expect("write");
    let mut response = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut response).await.expect("read");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    child.kill().expect("stop the operator");
    child.wait().expect("reaped");
}

/// The README's drop-in command, run as written (the plugin's path swapped in) against
/// a real API server, for a plugin far bigger than client-side apply's annotation
/// allows: the ConfigMap lands, whole.
#[tokio::test]
async fn the_readme_drop_in_command_loads_a_plugin_of_any_size_up_to_the_configmap_limit() {
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use kube::api::{Api, PostParams};

    let readme = std::fs::read_to_string(plugdb_tests::workspace_root().join("README.md")).expect("README");
    let command = readme.lines().find(|l| l.starts_with("plugdb plugin pack redis.wasm |")).expect("the drop-in command");
    let command = command.split('#').next().unwrap_or_default().trim();
    let plugin = plugdb_tests::component_path("bulky");
    let size = std::fs::metadata(&plugin).expect("bulky").len();
    assert!(size > 1 << 20, "a plugin over 1 MiB before compression ({size} bytes)");

    let cp = plugdb_tests::ControlPlane::start().await.expect("control plane");
    let namespace =
        Namespace { metadata: kube::api::ObjectMeta { name: Some("plugdb-system".into()), ..Default::default() }, ..Default::default() };
    Api::<Namespace>::all(cp.client.clone()).create(&PostParams::default(), &namespace).await.expect("namespace");
    let bin = plugdb_tests::control_plane::binaries_dir().expect("kubectl");
    let plugdb = plugdb_tests::plugdb_binary();
    let path = format!("{}:{}:{}", plugdb.parent().expect("dir").display(), bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(command.replace("redis.wasm", &plugin.to_string_lossy()))
        .env("PATH", path)
        .env("KUBECONFIG", &cp.kubeconfig)
        .output()
        .expect("sh");
    assert!(out.status.success(), "{command}: {}", String::from_utf8_lossy(&out.stderr));
    let cm = Api::<ConfigMap>::namespaced(cp.client.clone(), "plugdb-system").get("engine-bulky").await.expect("the ConfigMap");
    let digest = plugdb::plugin::hex_digest(&std::fs::read(&plugin).expect("read"));
    assert_eq!(cm.metadata.annotations.expect("annotations")["plugdb.io/sha256"], digest);
    assert!(cm.binary_data.expect("data").contains_key("plugin.wasm.gz"), "compressed to fit");
}

/// `inspect`, `render`, `pack` and `build` compile as the operator does: a plugin whose
/// code makes the compiler spend without bound is stopped at the operator's limits, in a
/// child process, and named as such.
#[test]
fn the_tools_compile_a_plugin_within_the_operators_bounds() {
    let dir = tempfile::tempdir().expect("dir");
    let bomb = dir.path().join("bomb.wasm");
    std::fs::write(&bomb, plugdb_tests::bomb::component("branches", &plugdb::plugin::Limits::default().shape)).expect("write");
    let err = format!("{:#}", cli::inspect(&bomb, &plugdb_tests::plugdb_binary()).expect_err("a compile bomb is refused"));
    assert!(err.contains("bomb.wasm: not a usable plugin") && err.contains("the compiler was stopped"), "{err}");
}

/// A component with a custom section of `extra` bytes appended (a component may carry
/// custom sections; they are not code).
fn with_custom_section(component: &[u8], extra: Vec<u8>) -> Vec<u8> {
    use wasm_encoder::Section;
    let mut out = component.to_vec();
    wasm_encoder::CustomSection { name: "padding".into(), data: extra.into() }.append_to(&mut out);
    out
}

/// `pack` takes what the API server and the operator take: up to 1 MiB of data as it
/// is, and gzip-compressed up to 1 MiB beyond that.
#[test]
fn pack_accepts_whatever_fits_a_configmap_as_is_or_compressed() {
    let dir = tempfile::tempdir().expect("dir");
    let minimal = plugdb_tests::component("minimal");
    let mut noise = vec![0u8; 900 << 10];
    let mut seed = 0x9e37_79b9_u32;
    for b in &mut noise {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        *b = seed as u8;
    }
    for (name, extra, key) in [("raw.wasm", noise, "plugin.wasm"), ("zeros.wasm", vec![0u8; 2 << 20], "plugin.wasm.gz")] {
        let path = dir.path().join(name);
        let bytes = with_custom_section(&minimal, extra);
        std::fs::write(&path, &bytes).expect("write");
        plugdb::plugin::Runtime::new(plugdb::plugin::Limits::default()).expect("runtime").load(&bytes).expect("the operator loads it");
        let yaml = cli::pack(&path, "plugdb-system", &plugdb_tests::plugdb_binary()).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let cm: k8s_openapi::api::core::v1::ConfigMap = yaml_serde::from_str(&yaml).expect("a ConfigMap");
        let data = cm.binary_data.expect("data");
        assert!(data.contains_key(key), "{name}: {:?}", data.keys());
        assert!(data.values().map(|v| v.0.len()).sum::<usize>() <= 1 << 20, "{name}");
    }
}
