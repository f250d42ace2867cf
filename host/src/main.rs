//! The `plugdb` command: the operator, and tools for people.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use kube::CustomResourceExt;
use plugdb::cli;
use plugdb::crd::Database;
use plugdb::health::Health;
use plugdb::logging::{self, LogFormat};
use plugdb::metrics::Metrics;
use plugdb::operator;
use plugdb::plugin::compiler;
use plugdb::serve;

/// A Kubernetes operator that runs databases of many engines through one Database
/// resource, with the engine logic in sandboxed WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "plugdb", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the operator.
    Run(RunArgs),
    /// One screen about a Database: its members (node, role, readiness, the position
    /// each last said), backups and recoverable window, what is not fine, its latest
    /// Events. Installed as `kubectl-plugdb`, this is `kubectl plugdb status DB`.
    Status {
        /// The Database.
        #[arg(value_name = "DATABASE")]
        name: String,
        #[command(flatten)]
        at: At,
    },
    /// Hand the primary role to MEMBER (a pod, `orders-2`, or an ordinal, `2`) with no
    /// acknowledged write lost, and wait until it leads or the operator says why not.
    /// Installed as `kubectl-plugdb`, this is `kubectl plugdb switchover DB MEMBER`.
    Switchover {
        /// The Database.
        #[arg(value_name = "DATABASE")]
        name: String,
        /// The member to lead.
        #[arg(value_name = "MEMBER")]
        member: String,
        #[command(flatten)]
        at: At,
    },
    /// Take a backup of the Database now and wait for it: its name and when it completed,
    /// or why it failed. (`kubectl plugdb backup DB`.)
    Backup {
        /// The Database.
        #[arg(value_name = "DATABASE")]
        name: String,
        #[command(flatten)]
        at: At,
    },
    /// Make a new Database, NEW, with the Database's spec, restored from its newest
    /// backup, a named one, or a moment of its recoverable window; follow it until it
    /// runs. (`kubectl plugdb restore DB --as NEW [--to TIME]`.)
    Restore {
        /// The Database whose backups are restored.
        #[arg(value_name = "DATABASE")]
        name: String,
        /// The new Database's name (in the same namespace).
        #[arg(long = "as", value_name = "NEW")]
        new: String,
        /// Recover to this moment (RFC 3339, e.g. 2026-11-23T10:15:30Z), inside the
        /// Database's recoverable window (`kubectl plugdb status DB` shows it).
        #[arg(long, value_name = "TIME", conflicts_with = "backup")]
        to: Option<String>,
        /// Restore this backup (as `status.lastBackup.name`) rather than the newest.
        #[arg(long, value_name = "NAME")]
        backup: Option<String>,
        /// Members of the new Database (the Database's number when not given).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..))]
        replicas: Option<i32>,
        #[command(flatten)]
        at: At,
    },
    /// The engine's interactive client (psql, mariadb; a shell with etcdctl) in a member,
    /// logged in with the Database's credentials: no password is typed. Runs `kubectl
    /// exec` (`$KUBECTL`, else `kubectl` on the PATH). (`kubectl plugdb connect DB`.)
    Connect {
        /// The Database.
        #[arg(value_name = "DATABASE")]
        name: String,
        /// A ready replica rather than the primary.
        #[arg(long, conflicts_with = "member")]
        replica: bool,
        /// This member (a pod, `orders-2`, or an ordinal, `2`).
        #[arg(short, long)]
        member: Option<String>,
        #[command(flatten)]
        at: At,
    },
    /// Print a member's log: the primary's, or MEMBER's, from its engine's container
    /// unless `--container` names another; with `--all`, every member's, merged in time
    /// order. (`kubectl plugdb logs DB`.)
    Logs {
        /// The Database.
        #[arg(value_name = "DATABASE")]
        name: String,
        /// The member (a pod, `orders-2`, or an ordinal, `2`); the primary when not given.
        #[arg(short, long, conflicts_with = "all")]
        member: Option<String>,
        /// Every member's log, merged in time order, each line with its time and member.
        #[arg(short, long)]
        all: bool,
        /// Only what was logged in the last DURATION (`90s`, `30m`, `1h`, `2d`).
        #[arg(long, value_name = "DURATION", value_parser = cli::logs::seconds)]
        since: Option<i64>,
        /// Only warnings and errors (`warning`), or errors (`error`).
        #[arg(long, value_name = "LEVEL")]
        level: Option<cli::logs::Level>,
        /// The container (e.g. `agent`, `archive`); the engine's when not given.
        #[arg(short, long)]
        container: Option<String>,
        /// Keep printing as the log grows.
        #[arg(short, long, conflicts_with_all = ["all", "level"])]
        follow: bool,
        /// Only the last N lines (of each member).
        #[arg(long, value_name = "N")]
        tail: Option<i64>,
        /// The container's previous run (after a restart).
        #[arg(short, long)]
        previous: bool,
        #[command(flatten)]
        at: At,
    },
    /// The engines the operator is given: each plugin ConfigMap, what its plugin says
    /// about itself, whether its digest matches the pinned one, and what the operator
    /// last said of it. (`kubectl plugdb plugins`.)
    Plugins {
        /// The operator's namespace, where it loads plugins from.
        #[arg(long, default_value = "plugdb-system")]
        operator_namespace: String,
        #[command(flatten)]
        at: At,
    },
    /// Print the Database CustomResourceDefinition.
    Crd,
    /// Print the objects plugdb would apply for a Database, without a cluster.
    Render {
        /// The Database manifest.
        #[arg(short = 'f', long = "filename", value_name = "DATABASE.yaml")]
        database: PathBuf,
        /// The engine's plugin component.
        #[arg(long, value_name = "PLUGIN.wasm")]
        plugin: PathBuf,
        /// Render as an operator run with `--image-registry` would.
        #[arg(long, value_parser = registry)]
        image_registry: Option<String>,
        /// Render as an operator run with `--image-pull-secret` would.
        #[arg(long = "image-pull-secret", value_name = "SECRET")]
        image_pull_secrets: Vec<String>,
    },
    /// Inspect and pack engine plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Move a backup between a directory and object storage (what backup and restore
    /// Jobs run; the bucket and key come from `PLUGDB_S3_*` and `AWS_*` variables).
    #[command(subcommand)]
    Transfer(TransferCommand),
    /// Ship the engine's finished log segments from a directory to object storage until
    /// stopped (the container beside each member of a Database with point-in-time
    /// recovery; the bucket comes from `PLUGDB_S3_*` and `AWS_*` variables).
    Archive(ArchiveArgs),
    /// The member agent beside each member's engine (see `plugdb::agent`).
    #[command(subcommand)]
    Agent(AgentCommand),
    /// The operator's own compiler process (see `plugin::compiler`); not for people.
    #[command(hide = true)]
    Compile(CompileArgs),
}

/// Where the Database is, as kubectl takes it.
#[derive(Debug, Args)]
struct At {
    /// Its namespace (the kubeconfig context's when not given).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// The kubeconfig context (the current one when not given; `KUBECONFIG` says which
    /// files, as for kubectl).
    #[arg(long)]
    context: Option<String>,
}

impl At {
    fn target(self) -> cli::status::Target {
        cli::status::Target { context: self.context, namespace: self.namespace }
    }
}

/// Runs a command against a cluster on a runtime of its own, and prints what it says.
fn against_cluster(work: impl std::future::Future<Output = Result<String>>) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    print!("{}", runtime.block_on(work)?);
    Ok(())
}

#[derive(Debug, Args)]
struct ArchiveArgs {
    /// The directory the engine places finished segments in.
    #[arg(long, value_name = "PATH")]
    dir: PathBuf,
    /// The Database's archive in the bucket (`<prefix>/<namespace>/<database>/_archive`).
    #[arg(long, value_name = "KEY")]
    key: String,
    /// Seconds between two looks at the directory.
    #[arg(long, default_value_t = 2)]
    every: u64,
}

#[derive(Debug, Subcommand)]
enum AgentCommand {
    /// Copy this binary to FILE (the init container that gives the engine's image an agent).
    Install {
        #[arg(value_name = "FILE")]
        to: PathBuf,
    },
    /// Answer the operator's `GET /status` with what COMMAND prints, over mutual TLS (and
    /// `POST /fence`, given a fence command).
    Serve(Box<plugdb::agent::protocol::Serve>),
    /// Run COMMAND (the engine) as this process's child, and kill it when the agent says
    /// (see `plugdb::agent::guard`).
    Guard {
        /// The file whose writing orders the engine stopped.
        #[arg(long, value_name = "FILE")]
        stop: PathBuf,
        /// The engine's command.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Show what a plugin says about itself, its contract version and digest.
    Inspect {
        /// The plugin component.
        #[arg(value_name = "PLUGIN.wasm")]
        file: PathBuf,
    },
    /// Build a plugin crate (one that depends on plugdb-sdk) into a component, and
    /// self-test it: `<target>/plugdb/<crate>.wasm` unless `--out` says otherwise.
    Build {
        /// The crate's directory.
        #[arg(value_name = "DIR", default_value = ".")]
        dir: PathBuf,
        /// Where to write the component.
        #[arg(long, value_name = "FILE.wasm")]
        out: Option<PathBuf>,
    },
    /// Print a ConfigMap that loads the plugin (compressed when needed to fit).
    Pack {
        /// The plugin component.
        #[arg(value_name = "PLUGIN.wasm")]
        file: PathBuf,
        /// The operator's namespace, where it loads plugins from.
        #[arg(long, default_value = "plugdb-system")]
        namespace: String,
    },
}

#[derive(Debug, Subcommand)]
enum TransferCommand {
    /// Upload the artefact (a file or a directory), then its manifest, which completes it.
    Upload(TransferArgs),
    /// Download a complete backup, checking each file against its manifest.
    Download(TransferArgs),
}

#[derive(Debug, Args)]
struct TransferArgs {
    /// The artefact on disk.
    #[arg(long, value_name = "PATH")]
    artefact: PathBuf,
    /// The backup's key in the bucket (`<prefix>/<namespace>/<database>/<backup>`).
    #[arg(long, value_name = "KEY")]
    key: String,
    /// Download only: also the archived segments a replay from this backup needs, into this directory.
    #[arg(long, value_name = "DIR")]
    archive: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Where plugins are loaded from (ConfigMaps) and the leader Lease lives.
    #[arg(long, env = "POD_NAMESPACE", default_value = "plugdb-system")]
    namespace: String,
    /// Watch Databases in this namespace only (default: every namespace).
    #[arg(long, env = "PLUGDB_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,
    /// Serve /healthz, /readyz and /metrics here (`:8080` is every address; `:0` picks a
    /// free port, which the log names).
    #[arg(long, env = "PLUGDB_LISTEN", default_value = ":8080")]
    listen: String,
    /// Databases reconciled at once (0: no limit).
    #[arg(long, env = "PLUGDB_CONCURRENCY", default_value_t = operator::Options::default().settings.concurrency)]
    concurrency: u16,
    /// Call-thread seconds a second one engine's plugin calls may take on average
    /// (e.g. 0.5: half a thread); an engine past it waits, the others do not.
    #[arg(long, env = "PLUGDB_PLUGIN_CPU", value_name = "THREADS", value_parser = cpu_share,
          default_value_t = operator::Options::default().settings.plugin_cpu_per_engine)]
    plugin_cpu: f64,
    /// Act alone, without contending for the leader Lease (one replica only).
    #[arg(long, env = "PLUGDB_NO_LEADER_ELECTION")]
    no_leader_election: bool,
    /// Log lines as text or as JSON objects.
    #[arg(long, env = logging::FORMAT_ENV, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// This replica's name in the leader election (default: a name unique on this host).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// This operator's own image. Every member runs the member agent from it: without it,
    /// members have no agent, so failover, fencing, switchover, drains that hand the
    /// primary over and the members' positions are off. Backup and restore Jobs run
    /// `plugdb transfer` from it to reach object storage (`spec.backup.s3`).
    #[arg(long, env = "PLUGDB_IMAGE")]
    image: Option<String>,
    /// Networks (CIDR, or an address) an endpoint a tenant names (a backup bucket's) may
    /// not reach, besides loopback, link-local and the API server: the cluster's Service
    /// and Pod ranges and its nodes' addresses, say. Repeat, or comma-separate.
    #[arg(long = "egress-forbid", env = "PLUGDB_EGRESS_FORBID", value_name = "CIDR", value_delimiter = ',')]
    egress_forbid: Vec<plugdb::egress::Network>,
    /// Networks such an endpoint may reach all the same (an object store in the cluster).
    #[arg(long = "egress-allow", env = "PLUGDB_EGRESS_ALLOW", value_name = "CIDR", value_delimiter = ',')]
    egress_allow: Vec<plugdb::egress::Network>,
    /// Where this operator reaches the member agents from: its pods, as
    /// `<namespace>/<label>=<value>,…` (what the chart passes), or its address or
    /// network. The members' NetworkPolicies let these alone reach the agent port; without
    /// it, anyone may (the agent's TLS still answers the operator alone). Repeat for more.
    #[arg(long = "agent-from", env = "PLUGDB_AGENT_FROM", value_name = "PEER", value_parser = agent_from)]
    agent_from: Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer>,
    /// Pull every image the members and Jobs run from this registry (a host, with an
    /// optional path: `mirror.example:5000/hub`), under the image's own path
    /// (`postgres:17` → `mirror.example:5000/hub/library/postgres:17`).
    #[arg(long, env = "PLUGDB_IMAGE_REGISTRY", value_parser = registry)]
    image_registry: Option<String>,
    /// A Secret (in each Database's namespace) the members and Jobs pull images with;
    /// repeat for more, or give them comma-separated in the variable.
    #[arg(long = "image-pull-secret", env = "PLUGDB_IMAGE_PULL_SECRETS", value_name = "SECRET", value_delimiter = ',')]
    image_pull_secrets: Vec<String>,
    /// The engine plugins bundled with the operator (`*.wasm`), loaded at start; a
    /// plugin ConfigMap for the same engine takes precedence.
    #[arg(long, env = "PLUGDB_BUNDLED_ENGINES", value_name = "DIR", default_value = "/usr/local/lib/plugdb/engines")]
    bundled_engines: std::path::PathBuf,
    /// Load no bundled engine: only plugin ConfigMaps.
    #[arg(long, env = "PLUGDB_NO_BUNDLED_ENGINES")]
    no_bundled_engines: bool,
}

/// `--agent-from`'s value.
fn agent_from(text: &str) -> Result<k8s_openapi::api::networking::v1::NetworkPolicyPeer, String> {
    plugdb::build::network::operator_peer(text)
}

/// The API server's addresses and port, as the operator reaches it: a tenant's endpoint
/// may not name them. None when its name does not resolve (nothing else would work then).
async fn api_server(url: &http::Uri) -> Vec<std::net::SocketAddr> {
    let Some(host) = url.host() else { return Vec::new() };
    let port = url.port_u16().unwrap_or(if url.scheme_str() == Some("http") { 80 } else { 443 });
    let host = host.trim_start_matches('[').trim_end_matches(']');
    tokio::net::lookup_host((host, port)).await.map(Iterator::collect).unwrap_or_default()
}

/// `--image-registry`: a registry host and optional path, no scheme, no tag.
fn registry(value: &str) -> Result<String, String> {
    let ok = !value.is_empty()
        && !value.contains("://")
        && !value.contains('@')
        && value.chars().all(|c| c.is_ascii_alphanumeric() || "-._:/".contains(c));
    if ok {
        Ok(value.trim_end_matches('/').to_string())
    } else {
        Err(format!("{value:?} is not a registry (e.g. mirror.example:5000/hub)"))
    }
}

/// `--plugin-cpu`: a positive number of threads.
fn cpu_share(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(threads) if threads > 0.0 && threads.is_finite() => Ok(threads),
        _ => Err(format!("{value:?} is not a positive number of threads (e.g. 0.5)")),
    }
}

#[derive(Debug, Args)]
struct CompileArgs {
    #[arg(long, value_parser = ["quick", "optimized"])]
    tier: String,
    #[arg(long)]
    memory_bytes: usize,
    #[arg(long)]
    stack_bytes: usize,
    #[arg(long)]
    data_bytes: u64,
}

/// `:8080` listens on every address, as Go programs read it.
fn listen_address(listen: &str) -> String {
    if listen.starts_with(':') { format!("0.0.0.0{listen}") } else { listen.to_string() }
}

/// This binary: the tools compile plugins with it, in a child process, as the operator does.
fn compiler() -> Result<PathBuf> {
    std::env::current_exe().context("finding the plugdb binary to compile plugins with")
}

/// `plugdb`, or `kubectl plugdb` when run as the kubectl plugin `kubectl-plugdb`.
fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let invoked = std::env::args_os().next().map(PathBuf::from);
    let name = invoked.as_deref().and_then(Path::file_name).and_then(|n| n.to_str()).unwrap_or("plugdb");
    let command = Cli::command().bin_name(if name.starts_with("kubectl-") { "kubectl plugdb" } else { "plugdb" });
    Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit())
}

/// Says why a command failed in one message with its causes (`error: …: …`), never a
/// backtrace, whatever `RUST_BACKTRACE` says: what a user sees is the reason.
fn main() -> std::process::ExitCode {
    match command() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn command() -> Result<()> {
    match parse().command {
        Command::Run(args) => tokio::runtime::Runtime::new().context("starting the async runtime")?.block_on(run(args)),
        Command::Status { name, at } => against_cluster(cli::status::status(&at.target(), &name)),
        Command::Switchover { name, member, at } => against_cluster(cli::switchover::switchover(&at.target(), &name, &member)),
        Command::Backup { name, at } => against_cluster(cli::backup::backup(&at.target(), &name)),
        Command::Restore { name, new, to, backup, replicas, at } => {
            against_cluster(cli::backup::restore(&at.target(), &name, &new, &cli::backup::From { to, backup, replicas }))
        }
        Command::Connect { name, replica, member, at } => {
            let what = cli::connect::Connect { member, replica };
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
            let args = runtime.block_on(cli::connect::kubectl_args(&at.target(), &name, &what, cli::connect::interactive()))?;
            std::process::exit(cli::connect::run(&args)?)
        }
        Command::Logs { name, member, all, since, level, container, follow, tail, previous, at } => {
            let what = cli::logs::Logs { member, all, container, follow, tail, since, level, previous };
            against_cluster(async { cli::logs::logs(&at.target(), &name, &what).await.map(|()| String::new()) })
        }
        Command::Plugins { operator_namespace, at } => {
            let compiler = compiler()?;
            against_cluster(cli::plugins::plugins(&at.target(), &operator_namespace, &compiler))
        }
        Command::Crd => {
            print!("{}", yaml_serde::to_string(&Database::crd()).context("serialising the CRD")?);
            Ok(())
        }
        Command::Render { database, plugin, image_registry, image_pull_secrets } => {
            let pull = plugdb::images::Pull { registry: image_registry, secrets: image_pull_secrets };
            print!("{}", cli::render(&database, &plugin, &compiler()?, &pull)?);
            Ok(())
        }
        Command::Plugin(PluginCommand::Inspect { file }) => {
            print!("{}", cli::inspect(&file, &compiler()?)?);
            Ok(())
        }
        Command::Plugin(PluginCommand::Build { dir, out }) => {
            print!("{}", cli::build(&dir, out.as_deref(), &compiler()?)?);
            Ok(())
        }
        Command::Plugin(PluginCommand::Pack { file, namespace }) => {
            print!("{}", cli::pack(&file, &namespace, &compiler()?)?);
            Ok(())
        }
        Command::Transfer(command) => transfer(command),
        Command::Archive(args) => archive(args),
        Command::Agent(AgentCommand::Install { to }) => {
            let me = std::env::current_exe().context("finding this binary")?;
            std::fs::copy(&me, &to).with_context(|| format!("copying {} to {}", me.display(), to.display()))?;
            Ok(())
        }
        Command::Agent(AgentCommand::Guard { stop, command }) => std::process::exit(plugdb::agent::guard::guard(&stop, &command)?),
        Command::Agent(AgentCommand::Serve(serve)) => {
            let plugdb::agent::protocol::Serve {
                port,
                certs,
                clients,
                fence_command,
                promote_command,
                synchronous_command,
                follow_command,
                members,
                readiness,
                liveness,
                metrics_port,
                database,
                engine,
                data,
                archive: archive_dir,
                exporter,
                command,
            } = *serve;
            // As the operator that rendered it logs (its format in the member's environment).
            let format = std::env::var(logging::FORMAT_ENV).ok().and_then(|f| <LogFormat as clap::ValueEnum>::from_str(&f, true).ok());
            let log = logging::subscriber(format.unwrap_or(LogFormat::Text), logging::filter("info"), std::io::stderr, false);
            tracing_subscriber::util::SubscriberInitExt::try_init(log).context("setting up the log")?;
            let fence = match (fence_command, members) {
                (Some(argv), Some(members)) => Some(plugdb::agent::Fence {
                    argv,
                    mark: Path::new(plugdb::agent::STATE).join(plugdb::agent::FENCED_FILE),
                    stop: Path::new(plugdb::agent::STATE).join(plugdb::agent::guard::STOP_FILE),
                    members,
                    own: std::env::var(plugdb::agent::OWN_ADDRESS_ENV).ok().and_then(|a| a.parse().ok()),
                    control_plane: plugdb::agent::control_plane(),
                    cut_off_after: plugdb::agent::ISOLATED_FENCE_AFTER,
                }),
                _ => None,
            };
            let commands = plugdb::agent::Commands {
                status: command,
                fence,
                promote: promote_command.unwrap_or_default(),
                synchronous: synchronous_command.unwrap_or_default(),
                follow: follow_command.unwrap_or_default(),
                readiness,
                liveness,
            };
            let measured = match (metrics_port, database.as_deref().and_then(|d| d.split_once('/')), engine) {
                (Some(port), Some((namespace, database)), Some(engine)) => {
                    let member = std::env::var(plugdb::agent::POD_NAME_ENV).unwrap_or_default();
                    let (namespace, database) = (namespace.to_string(), database.to_string());
                    Some((
                        port,
                        plugdb::agent::metrics::Member { namespace, database, engine, member, data, archive: archive_dir, exporter },
                    ))
                }
                _ => None,
            };
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
            // The agent is its container's first process: without a handler it would ignore
            // SIGTERM, and every restart of the member would wait out its grace period.
            runtime.block_on(async {
                let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("a SIGTERM handler")?;
                tokio::select! {
                    served = plugdb::agent::serve(([0, 0, 0, 0], port).into(), plugdb::agent::Trust { certs, clients }, commands, measured) => served,
                    _ = term.recv() => Ok(()),
                    _ = tokio::signal::ctrl_c() => Ok(()),
                }
            })
        }
        Command::Compile(args) => compiler::serve(compiler::Request {
            tier: plugdb::plugin::Tier::named(&args.tier).context("compile: --tier is quick or optimized")?,
            memory_bytes: args.memory_bytes,
            stack_bytes: args.stack_bytes,
            data_bytes: args.data_bytes,
        }),
    }
}

fn transfer(command: TransferCommand) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    let (verb, moved) = match command {
        TransferCommand::Upload(a) => {
            ("uploaded", runtime.block_on(plugdb::object_storage::upload_from_env(&a.artefact, &a.key)).map(|manifest| (manifest, 0)))
        }
        TransferCommand::Download(a) => {
            ("downloaded", runtime.block_on(plugdb::object_storage::download_from_env(&a.key, &a.artefact, a.archive.as_deref())))
        }
    };
    let (manifest, segments) = moved?;
    eprintln!("plugdb transfer: {verb} {} files, {} bytes; {segments} archived segments", manifest.files.len(), manifest.bytes());
    Ok(())
}

fn archive(args: ArchiveArgs) -> Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::new("info")).with_writer(std::io::stderr).init();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    runtime.block_on(async {
        let stop = async {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("a SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        plugdb::object_storage::archive_from_env(&args.dir, &args.key, std::time::Duration::from_secs(args.every.max(1)), stop).await
    })?;
    Ok(())
}

async fn run(args: RunArgs) -> Result<()> {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    // Also takes in records of crates that log through `log`.
    tracing_subscriber::util::SubscriberInitExt::try_init(logging::subscriber(
        args.log_format,
        logging::default_filter(),
        std::io::stdout,
        ansi,
    ))
    .context("setting up the log")?;
    let listen = listen_address(&args.listen);
    // Each replica contends for the lease under its pod name (or a unique local name).
    let identity = args.identity.unwrap_or_else(|| format!("plugdb-{}", std::process::id()));
    let mut options = operator::Options {
        plugin_namespace: args.namespace,
        watch_namespace: args.watch_namespace,
        identity: (!args.no_leader_election).then_some(identity),
        // Plugins are compiled by this same binary in a child process with its own limits.
        compiler: Some(compiler()?),
        operator_image: args.image,
        bundled: (!args.no_bundled_engines).then_some(args.bundled_engines),
        agents_reached_from: args.agent_from,
        ..Default::default()
    };
    options.settings.concurrency = args.concurrency;
    options.settings.plugin_cpu_per_engine = args.plugin_cpu;
    options.settings.pull = plugdb::images::Pull { registry: args.image_registry, secrets: args.image_pull_secrets };
    options.settings.agent_logs = args.log_format;

    let metrics = Arc::new(Metrics::default());
    let health = if options.identity.is_some() { Health::elected(options.lease_duration) } else { Health::default() };
    let listener = tokio::net::TcpListener::bind(&listen).await.with_context(|| format!("listening on {listen}"))?;
    let listen = listener.local_addr().context("the address listened on")?;
    tokio::spawn(serve::serve(listener, metrics.clone(), health.clone()));
    tracing::info!(plugin_namespace = %options.plugin_namespace, watch_namespace = options.watch_namespace.as_deref().unwrap_or("(all)"), %listen, "plugdb starting; serving /healthz, /readyz and /metrics on {listen}");
    let config = kube::Config::infer().await.context("finding the cluster (in-cluster config or $KUBECONFIG)")?;
    options.egress = plugdb::egress::Policy::new(args.egress_forbid, args.egress_allow, api_server(&config.cluster_url).await);
    if options.operator_image.is_none() {
        tracing::warn!(
            "no --image (PLUGDB_IMAGE): members run without the member agent, so failover, fencing, switchover and drains that hand the primary over are off, and backups to object storage cannot run"
        );
    }
    if options.operator_image.is_some() && options.agents_reached_from.is_empty() {
        tracing::warn!(
            "no --agent-from (PLUGDB_AGENT_FROM): the members' NetworkPolicies let anyone reach their agent port (the agent's TLS still answers this operator alone)"
        );
    }
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
