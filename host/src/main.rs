//! The `plugdb` command: the operator, and tools for people.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use kube::CustomResourceExt;
use plugdb::cli;
use plugdb::crd::Database;
use plugdb::metrics::Metrics;
use plugdb::plugin::{Limits, Registry, Runtime};
use plugdb::reconcile::{self, Settings};
use plugdb::serve::{self, Readiness};

const USAGE: &str = "usage:
  plugdb run [--namespace NS] [--watch-namespace NS] [--listen ADDR]
      Run the operator. Plugins are loaded from ConfigMaps in NS (default: $POD_NAMESPACE,
      else plugdb-system); Databases are watched in --watch-namespace or cluster-wide.
      Uses the in-cluster config or $KUBECONFIG. Serves /healthz, /readyz, /metrics on ADDR
      (default 0.0.0.0:8080).
  plugdb crd
      Print the Database CustomResourceDefinition.
  plugdb render -f DATABASE.yaml --plugin PLUGIN.wasm
      Print the objects plugdb would apply for a Database, without a cluster.
  plugdb plugin inspect PLUGIN.wasm
      Show what a plugin says about itself, its contract version and digest.
  plugdb plugin pack PLUGIN.wasm [--namespace NS]
      Print a ConfigMap that loads the plugin (compressed when needed to fit).";

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("crd") => {
            let yaml = serde_yaml::to_string(&Database::crd()).context("serialising the CRD")?;
            print!("{yaml}");
            Ok(())
        }
        Some("run") => run(&args[1..]).await,
        Some("render") => {
            let (Some(db), Some(plugin)) = (flag(&args, "-f"), flag(&args, "--plugin")) else { bail!("{USAGE}") };
            print!("{}", cli::render(Path::new(&db), Path::new(&plugin))?);
            Ok(())
        }
        Some("plugin") => match (args.get(1).map(String::as_str), args.get(2)) {
            (Some("inspect"), Some(file)) => {
                print!("{}", cli::inspect(Path::new(file))?);
                Ok(())
            }
            (Some("pack"), Some(file)) => {
                let ns = flag(&args, "--namespace").unwrap_or_else(|| "plugdb-system".into());
                print!("{}", cli::pack(Path::new(file), &ns)?);
                Ok(())
            }
            _ => bail!("{USAGE}"),
        },
        _ => bail!("{USAGE}"),
    }
}

async fn run(args: &[String]) -> Result<()> {
    let json = std::env::var("PLUGDB_LOG_FORMAT").map(|f| f == "json").unwrap_or(false);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn".into());
    if json {
        tracing_subscriber::fmt().json().with_env_filter(filter).init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let namespace = flag(args, "--namespace").or_else(|| std::env::var("POD_NAMESPACE").ok()).unwrap_or_else(|| "plugdb-system".into());
    let watch = flag(args, "--watch-namespace");
    let listen = flag(args, "--listen").unwrap_or_else(|| "0.0.0.0:8080".into());

    let client = kube::Client::try_default().await.context("connecting to the cluster (in-cluster config or $KUBECONFIG)")?;
    let metrics = Arc::new(Metrics::default());
    let runtime = Runtime::new(Limits::default())?.with_metrics(metrics.clone());
    let registry = Registry::new(runtime, metrics.clone());
    let readiness = Readiness::default();
    let listener = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("listening on {listen}"))?;
    tokio::spawn(serve::serve(listener, metrics.clone(), readiness.clone()));
    tokio::spawn(registry.clone().watch(client.clone(), namespace.clone()));
    tracing::info!(plugin_namespace = %namespace, watch_namespace = watch.as_deref().unwrap_or("(all)"), %listen, "plugdb starting");
    let ctx = Arc::new(reconcile::Context::new(client, registry, metrics, Settings::default()));
    readiness.set_ready();
    reconcile::run(ctx, watch).await;
    tracing::info!("plugdb stopped");
    Ok(())
}
