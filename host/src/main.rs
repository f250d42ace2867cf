//! The `plugdb` command: the operator, and tools for people.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use kube::CustomResourceExt;
use plugdb::cli;
use plugdb::crd::Database;
use plugdb::health::Health;
use plugdb::metrics::Metrics;
use plugdb::operator;
use plugdb::serve;

const USAGE: &str = "usage:
  plugdb run [--namespace NS] [--watch-namespace NS] [--listen ADDR] [--concurrency N] [--no-leader-election]
      Run the operator. Plugins are loaded from ConfigMaps in NS (default: $POD_NAMESPACE,
      else plugdb-system), where the leader Lease also lives; Databases are watched in
      --watch-namespace or cluster-wide. Uses the in-cluster config or $KUBECONFIG.
      Serves /healthz, /readyz, /metrics on ADDR (default :8080, every address;
      :0 picks a free port, which the log names). Reconciles at most
      N Databases at once (default 16; 0: no limit).
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

/// Refuses flags `run` does not know, so a misspelt flag is not silently ignored.
fn known_flags(args: &[String], with_value: &[&str], switches: &[&str]) -> Result<()> {
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        if with_value.contains(&arg.as_str()) {
            rest.next().with_context(|| format!("{arg} needs a value"))?;
        } else if !switches.contains(&arg.as_str()) {
            bail!("unknown argument {arg:?}\n{USAGE}");
        }
    }
    Ok(())
}

/// `:8080` listens on every address, as Go programs read it.
fn listen_address(listen: &str) -> String {
    if listen.starts_with(':') { format!("0.0.0.0{listen}") } else { listen.to_string() }
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
        // The operator's own compiler process (see `plugin::compiler`); not for people.
        Some("compile") => plugdb::plugin::compiler::serve(&args[1..]),
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
    known_flags(args, &["--namespace", "--watch-namespace", "--listen", "--concurrency"], &["--no-leader-election"])?;
    let json = std::env::var("PLUGDB_LOG_FORMAT").map(|f| f == "json").unwrap_or(false);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,kube=warn".into());
    if json {
        tracing_subscriber::fmt().json().with_env_filter(filter).init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout())).init();
    }
    let plugin_namespace =
        flag(args, "--namespace").or_else(|| std::env::var("POD_NAMESPACE").ok()).unwrap_or_else(|| "plugdb-system".into());
    let listen = listen_address(&flag(args, "--listen").unwrap_or_else(|| ":8080".into()));
    // Each replica contends for the lease under its pod name (or a unique local name).
    let identity = std::env::var("POD_NAME").unwrap_or_else(|_| format!("plugdb-{}", std::process::id()));
    let mut options = operator::Options {
        plugin_namespace,
        watch_namespace: flag(args, "--watch-namespace"),
        identity: (!args.iter().any(|a| a == "--no-leader-election")).then_some(identity),
        // Plugins are compiled by this same binary in a child process with its own limits.
        compiler: Some(std::env::current_exe().context("finding the plugdb binary to compile plugins with")?),
        ..Default::default()
    };
    if let Some(n) = flag(args, "--concurrency") {
        options.settings.concurrency = n.parse().with_context(|| format!("--concurrency: {n:?} is not a number from 0 to 65535"))?;
    }

    let metrics = Arc::new(Metrics::default());
    let health = if options.identity.is_some() { Health::elected(options.lease_duration) } else { Health::default() };
    let listener = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("listening on {listen}"))?;
    let listen = listener.local_addr().context("the address listened on")?;
    tokio::spawn(serve::serve(listener, metrics.clone(), health.clone()));
    tracing::info!(plugin_namespace = %options.plugin_namespace, watch_namespace = options.watch_namespace.as_deref().unwrap_or("(all)"), %listen, "plugdb starting; serving /healthz, /readyz and /metrics on {listen}");
    let config = kube::Config::infer().await.context("finding the cluster (in-cluster config or $KUBECONFIG)")?;
    let client = metrics.counted_client(config).context("connecting to the cluster")?;
    let shutdown = async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("a SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("shutting down");
    };
    operator::run(client, metrics, options, health, shutdown).await
}
