//! The member agent: `plugdb agent`, beside the engine in every member of an engine
//! whose plugin declares `agent.status-command`. It answers one question, `GET /status`,
//! over HTTPS, to the operator alone: the line the plugin's status command prints
//! (`primary <position>` or `replica <position>`), read from the local engine when asked.
//!
//! Who may ask is settled by mutual TLS against the Database's own authority: the agent
//! serves a certificate for servers only and asks for a client certificate for clients
//! only, which only the operator holds (both in Secret `<name>-agent`), so one member's
//! agent cannot ask another's, and another Database's operator certificate is refused.
//! Everything is bounded: 16 connections at a time, one command at a time, 3 s a
//! connection, 4 KiB of request head, 1.5 s and 4 KiB of command output.
//!
//! The agent runs in the engine's image (its client tools and environment), from this
//! binary, which an init container copies out of the operator's image.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use std::collections::BTreeMap;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, KeyToPath, ResourceRequirements, SecretVolumeSource, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::build::{Names, pod};
use crate::crd::Database;

/// The port the agent serves on, in every member.
pub const PORT: u16 = 8443;
/// Where the agent's certificate is mounted.
pub const CERTS: &str = "/etc/plugdb-agent";
/// Where the init container copies the binary to, and the agent runs it from.
pub const BIN_DIR: &str = "/plugdb-bin";
/// The agent's certificate and key, and the authority's certificate, in [`CERTS`].
pub const FILES: [&str; 3] = [crate::tls::CERTIFICATE, crate::tls::KEY, crate::tls::CA];
/// The operator's certificate for asking the agents, in the Secret only.
pub const CLIENT_CERTIFICATE: &str = "client.crt";
/// Its key.
pub const CLIENT_KEY: &str = "client.key";
/// How long the status command may run.
pub const COMMAND_TIMEOUT: Duration = Duration::from_millis(1500);
/// The most of the status command's output that is read.
pub const MAX_OUTPUT: usize = 4 << 10;
const MAX_HEAD: usize = 4 << 10;
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(3);
const CONNECTIONS: usize = 16;

/// What a member says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// It says it takes writes.
    pub primary: bool,
    /// Its replication position, as the engine writes it.
    pub position: String,
}

/// The member's answer, `primary <position>` or `replica <position>` on one line, read as
/// coming from anyone: a position is 1-128 printable characters without spaces.
pub fn parse(answer: &str) -> Result<Status, String> {
    let line = answer.trim_end_matches(['\n', '\r']);
    let (role, position) = line.split_once(' ').ok_or("not `<role> <position>`")?;
    let primary = match role {
        "primary" => true,
        "replica" => false,
        _ => return Err(format!("role {:?} is neither primary nor replica", crate::events::truncate(role, 32))),
    };
    let printable = |c: char| c.is_ascii_graphic();
    if position.is_empty() || position.len() > 128 || !position.chars().all(printable) {
        return Err("the position is not 1-128 printable characters".into());
    }
    Ok(Status { primary, position: position.to_string() })
}

/// Serves `GET /status` on `port` until the process ends, answering with what `argv`
/// prints. The certificate is read again for each connection: a renewed one is served
/// without a restart.
pub async fn serve(port: u16, certs: PathBuf, argv: Vec<String>) -> anyhow::Result<()> {
    anyhow::ensure!(!argv.is_empty(), "no status command to run");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", port)).await.with_context(|| format!("listening on port {port}"))?;
    tracing::info!(port, command = %argv.join(" "), "the member agent serves");
    let (connections, command) = (Arc::new(Semaphore::new(CONNECTIONS)), Arc::new(Semaphore::new(1)));
    let argv = Arc::new(argv);
    loop {
        // An accept that fails (out of descriptors, say) is not the end of the agent: the
        // pod's readiness counts its containers, and the engine must not lose it for this.
        let (socket, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else { continue };
        let config = match server_config(&certs) {
            Ok(config) => config,
            Err(e) => {
                tracing::warn!("cannot serve {peer}: {e:#}");
                continue;
            }
        };
        let (argv, command) = (argv.clone(), command.clone());
        tokio::spawn(async move {
            let answered = tokio::time::timeout(CONNECTION_TIMEOUT, answer(socket, config, &argv, &command)).await;
            if let Ok(Err(e)) = answered {
                tracing::debug!("{peer}: {e:#}");
            }
            drop(permit);
        });
    }
}

/// The agent's TLS: its certificate, and client certificates for clients, from its authority.
fn server_config(certs: &Path) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let read = |file: &str| std::fs::read(certs.join(file)).with_context(|| format!("reading {}", certs.join(file).display()));
    let chain: Vec<CertificateDer> = CertificateDer::pem_slice_iter(&read(crate::tls::CERTIFICATE)?).collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(&read(crate::tls::KEY)?)?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(&read(crate::tls::CA)?) {
        roots.add(ca?)?;
    }
    let clients = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots)).build()?;
    Ok(Arc::new(rustls::ServerConfig::builder().with_client_cert_verifier(clients).with_single_cert(chain, key)?))
}

/// One connection: the TLS handshake (which refuses anyone but the operator), one
/// request, one answer.
async fn answer(
    socket: tokio::net::TcpStream,
    config: Arc<rustls::ServerConfig>,
    argv: &[String],
    command: &Semaphore,
) -> anyhow::Result<()> {
    let mut stream = tokio_rustls::TlsAcceptor::from(config).accept(socket).await.context("handshake")?;
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        anyhow::ensure!(head.len() <= MAX_HEAD, "a request head over {MAX_HEAD} bytes");
        let mut chunk = [0u8; 512];
        let n = stream.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "the connection ended inside the request");
        head.extend_from_slice(&chunk[..n]);
    }
    let (status, body) = if head.starts_with(b"GET /status ") {
        let _one_at_a_time = command.acquire().await?;
        match run(argv).await {
            Ok(out) => ("200 OK", out),
            Err(e) => ("503 Service Unavailable", e),
        }
    } else {
        ("404 Not Found", "only GET /status is served\n".to_string())
    };
    let response = format!("HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
    stream.write_all(response.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await?;
    Ok(())
}

/// What `argv` prints, when it exits 0 within [`COMMAND_TIMEOUT`] with at most
/// [`MAX_OUTPUT`] bytes of UTF-8; otherwise why not, with the end of what it said.
pub async fn run(argv: &[String]) -> Result<String, String> {
    let (program, args) = argv.split_first().ok_or("no command")?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    let mut stdout = child.stdout.take().ok_or("no stdout")?.take(MAX_OUTPUT as u64 + 1);
    let mut stderr = child.stderr.take().ok_or("no stderr")?.take(MAX_OUTPUT as u64);
    let finished = async {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        // Standard output first: past the bound there is nothing to wait for (the
        // command is killed when dropped).
        stdout.read_to_end(&mut out).await.map_err(|e| e.to_string())?;
        if out.len() > MAX_OUTPUT {
            return Err(format!("the status command printed more than {MAX_OUTPUT} bytes"));
        }
        stderr.read_to_end(&mut err).await.map_err(|e| e.to_string())?;
        let status = child.wait().await.map_err(|e| e.to_string())?;
        Ok((status, out, err))
    };
    let (status, out, err) = tokio::time::timeout(COMMAND_TIMEOUT, finished)
        .await
        .map_err(|_| format!("the status command ran longer than {COMMAND_TIMEOUT:?}"))??;
    let said = || crate::events::truncate(String::from_utf8_lossy(&err).trim(), 512).to_string();
    if !status.success() {
        return Err(format!("the status command failed ({status}): {}", said()));
    }
    String::from_utf8(out).map_err(|_| "the status command printed something other than UTF-8".into())
}

/// What a member needs for its agent, beside `engine` (the engine's container): the init
/// container that copies this binary out of the operator's `image`, the agent's container
/// (the engine's image, environment and files, but not its data), and their volumes.
pub fn containers(db: &Database, image: &str, engine: &Container, argv: &[String]) -> (Container, Container, Vec<Volume>) {
    let binary = format!("{BIN_DIR}/plugdb");
    let quantity = |q: &str| Quantity(q.into());
    let bounded = |cpu: &str, memory: &str| ResourceRequirements {
        requests: Some(BTreeMap::from([("cpu".into(), quantity("10m")), ("memory".into(), quantity("16Mi"))])),
        limits: Some(BTreeMap::from([("cpu".into(), quantity(cpu)), ("memory".into(), quantity(memory))])),
        ..Default::default()
    };
    let copy = Container {
        name: "agent-install".into(),
        image: Some(image.into()),
        command: Some(vec![crate::jobs::OPERATOR_BINARY.into(), "agent".into(), "install".into(), binary.clone()]),
        volume_mounts: Some(vec![pod::mount("agent-bin", BIN_DIR, false)]),
        resources: Some(bounded("500m", "128Mi")),
        security_context: Some(pod::container_security(Some(true))),
        ..Default::default()
    };
    let mut command =
        vec![binary, "agent".into(), "serve".into(), "--port".into(), PORT.to_string(), "--certs".into(), CERTS.into(), "--".into()];
    command.extend(argv.iter().cloned());
    let seen = |m: &&VolumeMount| !["data", "archive"].contains(&m.name.as_str());
    let mut mounts: Vec<VolumeMount> = engine.volume_mounts.iter().flatten().filter(seen).cloned().collect();
    mounts.push(pod::mount("agent-bin", BIN_DIR, true));
    mounts.push(pod::mount("agent-certs", CERTS, true));
    let agent = Container {
        name: "agent".into(),
        image: engine.image.clone(),
        command: Some(command),
        env: engine.env.clone(),
        ports: Some(vec![ContainerPort {
            name: Some("agent".into()),
            container_port: i32::from(PORT),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        volume_mounts: Some(mounts),
        resources: Some(bounded("200m", "64Mi")),
        security_context: Some(pod::container_security(Some(true))),
        ..Default::default()
    };
    let certificates = Volume {
        name: "agent-certs".into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(Names(&db.name_any()).agent()),
            items: Some(FILES.iter().map(|f| KeyToPath { key: f.to_string(), path: f.to_string(), mode: None }).collect()),
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Default::default()
    };
    let binary = Volume { name: "agent-bin".into(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Default::default() };
    (copy, agent, vec![binary, certificates])
}

#[cfg(test)]
mod tests;
