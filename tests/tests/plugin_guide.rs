//! The plugin author's guide (`docs/plugin-guide.md`), followed literally: its commands
//! run as written, in a crate it creates in an empty directory outside this workspace,
//! and its files written where it says; the plugin it builds ends up serving its
//! Database in a running operator (on a real API server).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::Api;
use plugdb::crd::Database;
use plugdb_tests::ControlPlane;
use plugdb_tests::operator::{Backing, Cluster, wait_for};

/// What the guide asks for, in order.
#[derive(Debug)]
enum Step {
    /// A `sh` block: commands to run.
    Run(String),
    /// A block introduced by "`<path>`:": a file to write.
    Write(String, String),
}

/// The steps of the guide: every `sh` block, and every block that a line ending in
/// "`<path>`:" introduces.
fn steps(guide: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut lines = guide.lines().peekable();
    let mut before = "";
    while let Some(line) = lines.next() {
        let Some(info) = line.strip_prefix("```").filter(|i| !i.is_empty()) else {
            if !line.trim().is_empty() {
                before = line;
            }
            continue;
        };
        let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
        let body = body.join("\n") + "\n";
        let file = before.strip_suffix("`:").and_then(|b| b.rsplit_once('`')).map(|(_, path)| path.to_string());
        match (info, file) {
            ("sh", _) => steps.push(Step::Run(body)),
            (_, Some(path)) => steps.push(Step::Write(path, body)),
            _ => {}
        }
        before = "";
    }
    steps
}

#[tokio::test]
async fn the_plugin_guide_followed_literally_ends_with_a_database_served() {
    let root = plugdb_tests::workspace_root();
    let guide = std::fs::read_to_string(root.join("docs/plugin-guide.md")).expect("the guide");
    let steps = steps(&guide);
    assert!(steps.len() >= 5, "the guide's steps: {steps:#?}");

    let cp = ControlPlane::start().await.expect("control plane");
    let kubeconfig = cp.kubeconfig.clone();
    let cluster = Cluster::on(Backing::ControlPlane(Box::new(cp)), &[]).await.expect("operator");
    let work = tempfile::tempdir().expect("an empty directory");
    let kubectl = plugdb_tests::control_plane::binaries_dir().expect("kubectl");
    let plugdb = plugdb_tests::plugdb_binary();
    let path = format!("{}:{}:{}", plugdb.parent().expect("dir").display(), kubectl.display(), std::env::var("PATH").unwrap_or_default());

    // The first command creates the crate; the guide runs the rest inside it.
    let mut dir = work.path().to_path_buf();
    for step in &steps {
        match step {
            Step::Run(script) => {
                let mut sh = Command::new("sh");
                sh.arg("-ec").arg(script).current_dir(&dir).env("PATH", &path).env("PLUGDB", &root).env("KUBECONFIG", &kubeconfig);
                // The test's own cargo environment is not the author's.
                for (key, _) in std::env::vars_os() {
                    if key.to_string_lossy().starts_with("CARGO_") && key != "CARGO_HOME" {
                        sh.env_remove(&key);
                    }
                }
                let out = sh.output().expect("sh");
                assert!(
                    out.status.success(),
                    "{script}failed in {}:\n{}{}",
                    dir.display(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                if dir == work.path() {
                    dir = only_directory(work.path());
                }
            }
            Step::Write(file, text) => std::fs::write(dir.join(file), text).expect("write the guide's file"),
        }
    }

    // The plugin serves the Database: the operator rendered its workload.
    let dbs: Api<Database> = Api::namespaced(cluster.client.clone(), "default");
    let sets: Api<StatefulSet> = Api::namespaced(cluster.client.clone(), "default");
    wait_for("the guide's Database rendered by its plugin", Duration::from_secs(60), async || {
        let rendered = dbs.get_opt("cache").await.ok().flatten().and_then(|d| d.status).is_some_and(|s| {
            s.plugin.as_deref().is_some_and(|p| p.starts_with("redis@"))
                && s.conditions.iter().any(|c| c.type_ == "PluginReady" && c.status == "True")
        });
        let image = sets
            .get_opt("cache")
            .await
            .ok()
            .flatten()
            .and_then(|s| s.spec)
            .and_then(|s| s.template.spec)
            .and_then(|p| p.containers.first().and_then(|c| c.image.clone()));
        rendered && image.as_deref() == Some("docker.io/library/redis:7.2")
    })
    .await;
}

/// The one directory the guide's first command made in `dir`.
fn only_directory(dir: &Path) -> std::path::PathBuf {
    let dirs: Vec<_> = std::fs::read_dir(dir).expect("read").flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    assert_eq!(dirs.len(), 1, "the first command makes the crate's directory: {dirs:?}");
    dirs.into_iter().next().expect("one")
}
