//! The member agent: `plugdb agent`, beside the engine in every member of an engine
//! whose plugin declares `agent.status-command`. It answers the operator alone, over
//! HTTPS: `GET /status` with the line the plugin's status command prints (`primary
//! <position>`, or `replica <position>` and the replica's lag), read from the local engine when asked, and,
//! where the plugin declares `agent.fence-command`, `POST /fence`, which fences the member
//! (`fenced` once the fence command has succeeded, `fencing` while it has not yet),
//! `POST /stop`, which has the fenced member's engine killed by its guard when it does
//! not confirm the fence (`stopped` once the fence command then succeeds), and
//! `POST /promote` and `POST /synchronous/<n>` with `agent.promote-command` and
//! `agent.synchronous-command` (how many replicas must confirm each commit, 0-9), and
//! `POST /follow/<member>` with `agent.follow-command` (a replica follows the member the
//! operator has just promoted, named by its pod: an address under the members' name).
//!
//! Fencing: a fenced member takes no more writes for the rest of its pod's life. The
//! agent marks it in a file the engine's start also reads (so that a restarted engine
//! does not take writes again), runs the fence command until it succeeds and every few
//! seconds after, and reports the member not ready. The operator fences the old primary
//! before it promotes another member; an agent fences its primary on its own once the
//! member has been cut off from the control plane and from every other member for
//! [`ISOLATED_FENCE_AFTER`] (a node lost to the others, whose clients may still reach
//! it): sooner than the operator can see the node lost and promote a replica.
//!
//! Who may ask is settled by mutual TLS: the agent serves a certificate for servers only,
//! from the Database's own authority (Secret `<name>-agent`), and asks for a client
//! certificate from the operator's own authority ([`CLIENTS_CA`]), whose key and client
//! certificate live in the operator's namespace only: not the Database's authority, whose
//! certificates the members and Jobs hold (and the engine can read), so neither the
//! application, another member's agent, nor another Database's certificate is obeyed.
//! That authority is pinned in the agent's arguments ([`Trust::clients`], written into
//! the members' template by the operator): an authority put into the Secret by anyone
//! who may write Secrets in the Database's namespace is not trusted.
//! Everything is bounded: 16 connections at a time and [`PER_PEER`] from one address (idle
//! connections from a few places cannot take every slot from the operator), 5 s a
//! connection, one command at a time, 4 KiB of request head, 4 KiB of command output, and
//! 1.5 s a status or fence command (4 s a promotion or a change of synchronous replicas).
//!
//! The agent runs in the engine's image (its client tools and environment), from this
//! binary, which an init container copies out of the operator's image.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context as _;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

pub use isolation::control_plane;
pub use protocol::{Answer, Request};

/// The port the agent serves on, in every member.
pub const PORT: u16 = 8443;
/// Where the agent's certificate is mounted.
pub const CERTS: &str = "/etc/plugdb-agent";
/// Where the init container copies the binary to, and the agent runs it from.
pub const BIN_DIR: &str = "/plugdb-bin";
/// The operator's authority's certificate, in [`CERTS`]: the only one trusted for
/// clients, once its fingerprint is the one pinned ([`Trust::clients`]).
pub const CLIENTS_CA: &str = "clients-ca.crt";
/// Annotation on Secret `<name>-agent`: a hash of the [`CLIENTS_CA`] it holds, so that
/// another operator authority is written again.
pub const CLIENTS_HASH: &str = "plugdb.io/clients-ca";
/// The agent's certificate and key, the Database authority's certificate (the operator
/// verifies the agent by it) and the operator's authority's, in [`CERTS`].
pub const FILES: [&str; 4] = [crate::tls::CERTIFICATE, crate::tls::KEY, crate::tls::CA, CLIENTS_CA];
/// How long the status and fence commands may run.
pub const COMMAND_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long the promote and synchronous commands may run: a promotion ends recovery,
/// which a loaded server may take seconds to do (inside the operator's 6 s for an answer).
pub const ACTION_TIMEOUT: Duration = Duration::from_secs(4);
/// The most of the status command's output that is read.
pub const MAX_OUTPUT: usize = 4 << 10;
const MAX_HEAD: usize = 4 << 10;
/// How long one connection may take, handshake and answer: the longest command
/// ([`ACTION_TIMEOUT`]) and a handshake on a busy node, within the operator's wait
/// ([`crate::reconcile::ask::ANSWER_TIMEOUT`]), so that an answer is never cut short.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECTIONS: usize = 16;
/// The most connections at a time from one address: idle connections from a few places
/// cannot take every slot from the operator.
pub const PER_PEER: usize = 4;
/// Where the agent keeps its state: a volume of the pod, which the engine mounts read-only.
pub const STATE: &str = "/plugdb-agent";
/// The file in [`STATE`] whose presence says the member is fenced.
pub const FENCED_FILE: &str = "fenced";
/// The engine's variable holding the path of [`FENCED_FILE`].
pub const FENCED_ENV: &str = "PLUGDB_FENCED";
/// The agent's variable holding its pod's address.
pub const OWN_ADDRESS_ENV: &str = "PLUGDB_POD_IP";
/// The agent's variable holding its pod's name (the member its series are labelled with).
pub const POD_NAME_ENV: &str = "PLUGDB_POD_NAME";
/// How long a primary cut off from the control plane and from every other member goes
/// on taking writes before its agent fences it (counted from the last look that reached
/// one of them). Shorter fails a lost node's primary over sooner, and fences a primary
/// whose node only lost its network for a moment more often.
pub const ISOLATED_FENCE_AFTER: Duration = Duration::from_secs(8);
/// Within how long of its isolation a cut-off primary is fenced, at worst: its fence
/// delay, from the start of a look up to [`isolation::LOOK_EVERY`] and a look (two
/// [`isolation::LOOK_TIMEOUT`]s) before the isolation, the status command it waits for (one ask
/// under way) and runs itself, and the fence command (failed, the guard's look at its
/// stop order, [`guard::LOOK_EVERY`], after it). The operator replaces a lost
/// node's primary no sooner (`reconcile::members::CUT_OFF_FAILOVER_SECONDS`).
pub const FENCED_WITHIN: Duration = Duration::from_secs(16);
/// How long `POST /fence` waits for the fence command to succeed before it answers
/// `fencing` (ordered, the engine not confirmed yet) rather than `fenced`: inside the
/// operator's 2 s for an answer.
const FENCE_WAIT: Duration = Duration::from_millis(1600);

/// The variable holding the number of replicas `agent.synchronous-command` sets.
pub const SYNCHRONOUS_ENV: &str = "PLUGDB_SYNCHRONOUS_REPLICAS";
/// The variable holding the members (pods' names, split by `,`) that may confirm commits,
/// as `agent.synchronous-command` sets them; empty: any replica.
pub const SYNCHRONOUS_MEMBERS_ENV: &str = "PLUGDB_SYNCHRONOUS_MEMBERS";
/// The variable holding the address of the member `agent.follow-command` follows.
pub const PRIMARY_HOST_ENV: &str = "PLUGDB_PRIMARY_HOST";

/// The commands the agent runs, from the plugin (each empty when it declares none).
#[derive(Debug, Clone, Default)]
pub struct Commands {
    /// `agent.status-command`.
    pub status: Vec<String>,
    /// `agent.fence-command`, with what the fence needs.
    pub fence: Option<Fence>,
    /// `agent.promote-command` (served with a fence only: a fenced member is never promoted).
    pub promote: Vec<String>,
    /// `agent.synchronous-command`.
    pub synchronous: Vec<String>,
    /// `agent.follow-command` (served with a fence only, which knows the members' name).
    pub follow: Vec<String>,
    /// The engine's exec readiness probe, which the agent runs for the kubelet.
    pub readiness: Option<protocol::Check>,
    /// The engine's exec liveness probe, likewise.
    pub liveness: Option<protocol::Check>,
}

/// What a member says of itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// It says it takes writes.
    pub primary: bool,
    /// Its replication position, as the engine writes it.
    pub position: String,
    /// How far behind its primary a replica says it is, when it knows.
    pub lag: Option<Duration>,
    /// Its data volume, as its agent measured it (`statfs`), when it did.
    pub volume: Option<metrics::Volume>,
    /// The log segments waiting in its archive directory, when it ships its log.
    pub archive: Option<Backlog>,
    /// Its engine's exporter, as its agent last looked at it, when it runs one.
    pub exporter: Option<exporter::Exporter>,
    /// What it said of its engine's health.
    pub signals: signals::Signals,
}

/// The log segments a member's engine finished that wait to be shipped to the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backlog {
    /// How many.
    pub segments: u64,
    /// How long the oldest has waited.
    pub oldest: Duration,
}

/// How long a log segment waits to be shipped before its archiving is taken as failing
/// (the chart's `PlugdbArchiveStalled` warns past the same).
pub const ARCHIVE_STALLED: Duration = Duration::from_secs(300);

/// The most lag a member may say it has: a day (more is read as not known).
pub const MAX_LAG: Duration = Duration::from_secs(86_400);

/// The member's answer, `primary <position>` or `replica <position> [<lag>]` on one line,
/// read as coming from anyone: a position is 1-128 printable characters without spaces;
/// a lag, a replica's only, is seconds (`0`, `2.5`), at most [`MAX_LAG`]. The agent may
/// add, after the command's own second line `signals <key>=<value> …` of its engine's
/// health ([`signals::parse`]), a line `volume <used> <size> [<bytes an hour>]` of the
/// member's data volume (how fast it fills once it knows), a line `lagging <seconds an
/// hour>` of how fast a replica's lag grows, a line `archive <segments> <seconds the
/// oldest waited>` of its archive directory, then a line `exporter up|down|silent` of its
/// engine's exporter.
pub fn parse(answer: &str) -> Result<Status, String> {
    let mut lines = answer.trim_end_matches(['\n', '\r']).split('\n').map(|l| l.trim_end_matches('\r'));
    let line = lines.next().unwrap_or_default();
    let mut more = lines.peekable();
    let mut signals = more.next_if(|l| l.starts_with("signals ")).map(signals::parse).transpose()?.unwrap_or_default();
    let volume = more.next_if(|l| l.starts_with("volume ")).map(parse_volume).transpose()?;
    if let Some(l) = more.next_if(|l| l.starts_with("lagging ")) {
        signals.lag_growth = Some(signals::parse_lagging(l)?);
    }
    let archive = more.next_if(|l| l.starts_with("archive ")).map(parse_archive).transpose()?;
    let exporter = match more.next() {
        Some(l) => {
            let word = l.strip_prefix("exporter ").and_then(exporter::Exporter::parse);
            Some(word.ok_or_else(|| format!("{:?} is neither a volume nor `exporter up|down|silent`", crate::said::cut(l, 64)))?)
        }
        None => None,
    };
    if more.next().is_some() {
        return Err("more than a status, its signals, a volume, a lag's growth, an archive and an exporter".into());
    }
    let (role, rest) = line.split_once(' ').ok_or("not `<role> <position>`")?;
    let (position, lag) = match rest.split_once(' ') {
        Some((position, lag)) if role == "replica" => (position, Some(parse_lag(lag)?)),
        Some(_) => return Err("a primary says no lag".into()),
        None => (rest, None),
    };
    let primary = match role {
        "primary" => true,
        "replica" => false,
        _ => return Err(format!("role {:?} is neither primary nor replica", crate::said::cut(role, 32))),
    };
    let printable = |c: char| c.is_ascii_graphic();
    if position.is_empty() || position.len() > 128 || !position.chars().all(printable) {
        return Err("the position is not 1-128 printable characters".into());
    }
    Ok(Status { primary, position: position.to_string(), lag, volume, archive, exporter, signals })
}

/// `archive <segments> <seconds the oldest waited>`, each at most a billion.
fn parse_archive(line: &str) -> Result<Backlog, String> {
    let number = |s: &str| (s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u64>().ok()).flatten();
    let backlog = match line.split(' ').collect::<Vec<_>>()[..] {
        ["archive", segments, oldest] => match (number(segments), number(oldest)) {
            (Some(segments), Some(oldest)) if segments <= 1_000_000_000 && oldest <= 1_000_000_000 => {
                Some(Backlog { segments, oldest: Duration::from_secs(oldest) })
            }
            _ => None,
        },
        _ => None,
    };
    backlog.ok_or_else(|| format!("{:?} is not `archive <segments> <seconds>`", crate::said::cut(line, 64)))
}

/// `volume <used> <size> [<bytes an hour>]`, in bytes, used no more than the size.
fn parse_volume(line: &str) -> Result<metrics::Volume, String> {
    let bytes = |s: &str| (s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<u64>().ok()).flatten();
    let words: Vec<&str> = line.split(' ').collect();
    let volume = match words[..] {
        ["volume", used, size, ref rate @ ..] if rate.len() <= 1 => match (bytes(used), bytes(size), rate.first().map(|r| bytes(r))) {
            (Some(used), Some(size), None) if used <= size => Some(metrics::Volume { size, used, per_hour: None }),
            (Some(used), Some(size), Some(Some(per_hour))) if used <= size => {
                Some(metrics::Volume { size, used, per_hour: Some(per_hour) })
            }
            _ => None,
        },
        _ => None,
    };
    volume.ok_or_else(|| format!("{:?} is not `volume <used> <size> [<bytes an hour>]`", crate::said::cut(line, 64)))
}

/// The status command's `out`, and the member's data volume as a line of its own when it
/// can be measured (after the command's first line and its signals, when its second line
/// says them, alone: the rest is the agent's to say), with how fast it fills once the
/// agent knows; how fast a replica's lag grows, once it knows; what waits in its archive
/// directory, when it has one; then what the agent last saw of the engine's exporter,
/// when it runs one.
fn with_measures(out: String, agent: &Agent) -> String {
    let now = std::time::Instant::now();
    let mut lines = out.lines();
    let first = lines.next().unwrap_or_default();
    let said = lines.next().filter(|l| l.starts_with("signals ") && l.len() <= signals::MAX_LINE);
    let mut answer = match (agent.data.is_some(), said) {
        (false, _) => format!("{}\n", out.trim_end_matches('\n')),
        (true, Some(said)) => format!("{first}\n{said}\n"),
        (true, None) => format!("{first}\n"),
    };
    if let Some(v) = agent.data.as_deref().and_then(metrics::volume) {
        let rate = agent.filling.look(now, v.used).map(|r| format!(" {r}")).unwrap_or_default();
        answer.push_str(&format!("volume {} {}{rate}\n", v.used, v.size));
    }
    if let Some(growth) = agent.lagging.look(now, first) {
        answer.push_str(&format!("lagging {growth}\n"));
    }
    if let Some(a) = agent.archive.as_deref().and_then(metrics::archive) {
        answer.push_str(&format!("archive {} {}\n", a.pending, a.oldest as u64));
    }
    if let Some(exporter) = *agent.exporter.lock().unwrap_or_else(|e| e.into_inner()) {
        answer.push_str(&format!("exporter {}\n", exporter.word()));
    }
    answer
}

fn parse_lag(lag: &str) -> Result<Duration, String> {
    let digits = |s: &str| s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit());
    let (whole, fraction) = lag.split_once('.').unwrap_or((lag, "0"));
    let seconds = (!whole.is_empty() && digits(whole) && !fraction.is_empty() && digits(fraction))
        .then(|| lag.parse::<f64>().ok())
        .flatten()
        .map(Duration::from_secs_f64)
        .filter(|d| *d <= MAX_LAG);
    seconds.ok_or_else(|| format!("the lag {:?} is not seconds up to a day", crate::said::cut(lag, 32)))
}

/// How the agent fences its member, from the plugin's fence command.
#[derive(Debug, Clone)]
pub struct Fence {
    /// The fence command.
    pub argv: Vec<String>,
    /// [`FENCED_FILE`], in the volume the engine mounts too.
    pub mark: PathBuf,
    /// [`guard::STOP_FILE`], beside it: written, the engine's guard kills the engine.
    pub stop: PathBuf,
    /// The name under which the cluster's DNS lists every member (the headless Service).
    pub members: String,
    /// This member's own address (not another member).
    pub own: Option<std::net::IpAddr>,
    /// The control plane's address (`host:port`); without it the member never fences itself.
    pub control_plane: Option<String>,
    /// How long the member may be cut off before it fences itself, if primary
    /// ([`ISOLATED_FENCE_AFTER`]).
    pub cut_off_after: Duration,
}

/// What every connection shares: the commands (one runs at a time) and the fence.
struct Agent {
    commands: Commands,
    /// Where the member's data volume is mounted, measured for each status asked.
    data: Option<PathBuf>,
    /// How fast it fills.
    filling: metrics::Filling,
    /// How fast a replica's lag grows.
    lagging: signals::LagTrend,
    /// The directory the member shares with its archiver, looked at for each status asked.
    archive: Option<PathBuf>,
    /// What the engine's exporter said at the last look, when it runs one.
    exporter: Arc<std::sync::Mutex<Option<exporter::Exporter>>>,
    command: Semaphore,
    fenced: tokio::sync::Notify,
    /// How many times the fence command has succeeded (once: the engine takes no more writes).
    fence_runs: std::sync::atomic::AtomicU64,
    /// The operator asked for the fence command to run again now.
    rerun: std::sync::atomic::AtomicBool,
}

impl Agent {
    fn new(commands: Commands, data: Option<PathBuf>, archive: Option<PathBuf>) -> Self {
        Agent {
            commands,
            data,
            archive,
            filling: metrics::Filling::default(),
            lagging: signals::LagTrend::default(),
            exporter: Arc::default(),
            command: Semaphore::new(1),
            fenced: tokio::sync::Notify::new(),
            fence_runs: Default::default(),
            rerun: Default::default(),
        }
    }

    fn is_fenced(&self) -> bool {
        self.commands.fence.as_ref().is_some_and(|f| f.mark.exists())
    }

    /// Marks the member fenced (the watcher runs the fence command).
    fn mark_fenced(&self, why: &str) -> std::io::Result<()> {
        let Some(fence) = &self.commands.fence else { return Ok(()) };
        if !fence.mark.exists() {
            std::fs::write(&fence.mark, format!("{why}\n"))?;
            tracing::warn!("fencing this member: {why}");
        }
        self.fenced.notify_one();
        Ok(())
    }

    async fn run(&self, argv: &[String]) -> Result<String, String> {
        let _one_at_a_time = self.command.acquire().await.map_err(|e| e.to_string())?;
        run(argv, &[], COMMAND_TIMEOUT).await
    }

    /// Runs the command `argv`, unless the member is fenced: its fence mark is read under
    /// the command lock, which the fence command takes too.
    async fn run_unfenced(&self, argv: &[String], env: &[(&str, &str)], done: Answer) -> (&'static str, String) {
        let done = done.word();
        let Ok(_one_at_a_time) = self.command.acquire().await else { return ("503 Service Unavailable", "stopping\n".into()) };
        if self.is_fenced() {
            return ("409 Conflict", format!("fenced: not {done}\n"));
        }
        match run(argv, env, ACTION_TIMEOUT).await {
            Ok(_) => ("200 OK", format!("{done}\n")),
            Err(e) => {
                tracing::warn!(said = %crate::said::escaped(&e), "not {done}");
                ("500 Internal Server Error", format!("not {done}: {e}\n"))
            }
        }
    }
}

/// Serves `GET /status` (and `POST /fence`, with a `fence`, `POST /promote`, with a
/// `promote` command too, and `POST /synchronous/<n>[/<member>,…]`, with a `synchronous` command) at
/// `address` (in a member, every address of its pod on [`PORT`]) until the process ends, answering with what `status` prints. The certificate
/// is read again for each connection: a renewed one is served without a restart.
/// With `measured` (a port, and who the member is), the member's series are served too
/// ([`metrics`]), at the same address.
pub async fn serve(
    address: std::net::SocketAddr,
    trust: Trust,
    mut commands: Commands,
    measured: Option<(u16, metrics::Member)>,
) -> anyhow::Result<()> {
    anyhow::ensure!(!commands.status.is_empty(), "no status command to run");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let listener = tokio::net::TcpListener::bind(address).await.with_context(|| format!("listening at {address}"))?;
    tracing::info!(%address, command = %commands.status.join(" "), fence = commands.fence.is_some(), "the member agent serves");
    let connections = Arc::new(Semaphore::new(CONNECTIONS));
    let peers = Peers::bounded(PER_PEER);
    if commands.fence.is_none() {
        commands.promote.clear();
        commands.follow.clear();
    }
    let (data, archive) = measured.as_ref().map(|(_, m)| (m.data.clone(), m.archive.clone())).unwrap_or_default();
    let agent = Arc::new(Agent::new(commands, data, archive));
    if let Some(at) = measured.as_ref().and_then(|(_, member)| member.exporter.clone()) {
        tokio::spawn(exporter::watch(at, agent.exporter.clone()));
    }
    if agent.commands.fence.is_some() {
        tokio::spawn(isolation::watch(agent.clone()));
    }
    if let Some((port, member)) = measured {
        // Nothing about metrics stops the member serving: a port that cannot be opened is said.
        let at = std::net::SocketAddr::new(address.ip(), port);
        match tokio::net::TcpListener::bind(at).await {
            Ok(listener) => drop(tokio::spawn(metrics::serve(listener, agent.clone(), member))),
            Err(e) => tracing::warn!("the member's series are not served: listening at {at}: {e}"),
        }
    }
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
        let Some(peer_permit) = peers.admit(peer.ip()) else { continue };
        let Ok(permit) = connections.clone().try_acquire_owned() else { continue };
        let config = match server_config(&trust) {
            Ok(config) => config,
            Err(e) => {
                tracing::warn!("cannot serve {peer}: {e:#}");
                continue;
            }
        };
        let agent = agent.clone();
        tokio::spawn(async move {
            let answered = tokio::time::timeout(CONNECTION_TIMEOUT, answer(socket, config, &agent)).await;
            if let Ok(Err(e)) = answered {
                tracing::debug!("{peer}: {e:#}");
            }
            drop((permit, peer_permit));
        });
    }
}

/// How many connections each address has open, and how many one may have.
#[derive(Clone)]
struct Peers {
    open: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
    limit: usize,
}

/// One connection counted for its address until dropped.
struct PeerPermit {
    peers: Peers,
    ip: std::net::IpAddr,
}

impl Peers {
    fn bounded(limit: usize) -> Peers {
        Peers { open: Arc::default(), limit }
    }

    fn admit(&self, ip: std::net::IpAddr) -> Option<PeerPermit> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(ip).or_default();
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(PeerPermit { peers: self.clone(), ip })
    }
}

impl Drop for PeerPermit {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Where the agent's certificates are ([`FILES`]), and the fingerprint of the one
/// authority whose client certificates it obeys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trust {
    /// The directory holding [`FILES`].
    pub certs: PathBuf,
    /// The SHA-256 of the operator's authority's certificate (DER), hex: of the
    /// certificates in [`CLIENTS_CA`], only this one is trusted.
    pub clients: String,
}

/// The SHA-256 (hex) of each certificate in `pem`, in order; what is not a certificate
/// is skipped.
pub fn fingerprints(pem: &[u8]) -> Vec<String> {
    CertificateDer::pem_slice_iter(pem).flatten().map(|c| crate::plugin::hex_digest(&c)).collect()
}

/// The agent's TLS: its certificate, and client certificates for clients, from the
/// operator's authority alone: the one of [`CLIENTS_CA`] pinned in `trust`.
fn server_config(trust: &Trust) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let certs = &trust.certs;
    let read = |file: &str| std::fs::read(certs.join(file)).with_context(|| format!("reading {}", certs.join(file).display()));
    let chain: Vec<CertificateDer> = CertificateDer::pem_slice_iter(&read(crate::tls::CERTIFICATE)?).collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(&read(crate::tls::KEY)?)?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(&read(CLIENTS_CA)?) {
        let ca = ca?;
        if crate::plugin::hex_digest(&ca) == trust.clients {
            roots.add(ca)?;
        }
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "{} holds no certificate of the operator's authority (SHA-256 {}): no client is trusted",
        certs.join(CLIENTS_CA).display(),
        trust.clients
    );
    let clients = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots)).build()?;
    Ok(Arc::new(rustls::ServerConfig::builder().with_client_cert_verifier(clients).with_single_cert(chain, key)?))
}

/// One connection: the TLS handshake (which refuses anyone but the operator), one
/// request, one answer.
async fn answer(socket: tokio::net::TcpStream, config: Arc<rustls::ServerConfig>, agent: &Agent) -> anyhow::Result<()> {
    let mut stream = tokio_rustls::TlsAcceptor::from(config).accept(socket).await.context("handshake")?;
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        anyhow::ensure!(head.len() <= MAX_HEAD, "a request head over {MAX_HEAD} bytes");
        let mut chunk = [0u8; 512];
        let n = stream.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "the connection ended inside the request");
        head.extend_from_slice(&chunk[..n]);
    }
    let word = |answer: Answer| format!("{}\n", answer.word());
    let fence = agent.commands.fence.as_ref();
    let (status, body) = match Request::parse(&head) {
        Some(Request::Status) => match agent.run(&agent.commands.status).await {
            Ok(out) => ("200 OK", with_measures(out, agent)),
            Err(e) => ("503 Service Unavailable", e),
        },
        Some(Request::Fence) if fence.is_some() => {
            // Each ask runs the fence command again (a fence may also cut what the member
            // still serves, such as its replication to others), and waits for that run.
            let before = agent.fence_runs.load(Ordering::SeqCst);
            agent.rerun.store(true, Ordering::SeqCst);
            match agent.mark_fenced("the operator fenced it before promoting another member") {
                Ok(()) => ("200 OK", word(if fence_ran(agent, before).await { Answer::Fenced } else { Answer::Fencing })),
                Err(e) => ("500 Internal Server Error", format!("cannot mark the member fenced: {e}\n")),
            }
        }
        Some(Request::Stop) if let Some(fence) = fence => {
            // Only a fenced member's engine is stopped, and its stop is confirmed as its fence
            // is: by the fence command, which a stopped engine does not refuse.
            let before = agent.fence_runs.load(Ordering::SeqCst);
            if !agent.is_fenced() {
                ("409 Conflict", "not fenced: not stopped\n".to_string())
            } else if let Err(e) = std::fs::write(&fence.stop, "its fence was not confirmed\n") {
                ("500 Internal Server Error", format!("cannot order the engine stopped: {e}\n"))
            } else {
                tracing::warn!("the engine did not confirm its fence: its guard stops it");
                agent.rerun.store(true, Ordering::SeqCst);
                agent.fenced.notify_one();
                let ran = fence_ran(agent, before).await;
                ("200 OK", word(if ran { Answer::Stopped } else { Answer::Fencing }))
            }
        }
        Some(Request::Promote) if !agent.commands.promote.is_empty() => {
            // Never a fenced member (a fenced primary must not lead again as it runs).
            let answer = agent.run_unfenced(&agent.commands.promote, &[], Answer::Promoted).await;
            if answer.0 == "200 OK" {
                tracing::warn!("promoted in place: this member leads");
            }
            answer
        }
        Some(Request::Synchronous(n, members)) if !agent.commands.synchronous.is_empty() => {
            let n = n.to_string();
            let env = [(SYNCHRONOUS_ENV, n.as_str()), (SYNCHRONOUS_MEMBERS_ENV, members)];
            let answer = agent.run_unfenced(&agent.commands.synchronous, &env, Answer::Set).await;
            if answer.0 == "200 OK" {
                tracing::info!(members, "commits now wait for {n} replicas");
            }
            answer
        }
        Some(Request::Follow(member)) if let Some(fence) = fence.filter(|_| !agent.commands.follow.is_empty()) => {
            let host = format!("{member}.{}", fence.members);
            let answer = agent.run_unfenced(&agent.commands.follow, &[(PRIMARY_HOST_ENV, &host)], Answer::Following).await;
            if answer.0 == "200 OK" {
                tracing::info!("follows {host}");
            }
            answer
        }
        _ => ("404 Not Found", format!("only {} are served\n", Request::SERVED)),
    };
    let response = format!("HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
    stream.write_all(response.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await?;
    Ok(())
}

/// Whether the fence command succeeds within [`FENCE_WAIT`], after `before` successes.
async fn fence_ran(agent: &Agent, before: u64) -> bool {
    let deadline = tokio::time::Instant::now() + FENCE_WAIT;
    let ran = || agent.fence_runs.load(Ordering::SeqCst) > before;
    while !ran() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ran()
}

/// Whether the member is ready as far as its agent knows: not fenced (the agent's
/// readiness, `GET /ready` on the metrics port).
pub fn ready(mark: &Path) -> Result<(), String> {
    match std::fs::read_to_string(mark) {
        Ok(why) => Err(format!("fenced: {}", why.trim())),
        Err(_) => Ok(()),
    }
}

/// What `argv` prints, when it exits 0 within `timeout` with at most [`MAX_OUTPUT`]
/// bytes of UTF-8; otherwise why not, with the end of what it said. The command runs in
/// a process group of its own, killed whole once it is done or out of time: a client it
/// started (a shell's) does not outlive it, holding a connection to the engine.
pub async fn run(argv: &[String], env: &[(&str, &str)], timeout: Duration) -> Result<String, String> {
    let (program, args) = argv.split_first().ok_or("no command")?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    let _group = child.id().and_then(|id| rustix::process::Pid::from_raw(id as i32)).map(Group);
    let mut stdout = child.stdout.take().ok_or("no stdout")?.take(MAX_OUTPUT as u64 + 1);
    let mut stderr = child.stderr.take().ok_or("no stderr")?.take(MAX_OUTPUT as u64);
    let finished = async {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        // Standard output first: past the bound there is nothing to wait for (the
        // command is killed when dropped).
        stdout.read_to_end(&mut out).await.map_err(|e| e.to_string())?;
        if out.len() > MAX_OUTPUT {
            return Err(format!("the command printed more than {MAX_OUTPUT} bytes"));
        }
        stderr.read_to_end(&mut err).await.map_err(|e| e.to_string())?;
        let status = child.wait().await.map_err(|e| e.to_string())?;
        Ok((status, out, err))
    };
    let (status, out, err) =
        tokio::time::timeout(timeout, finished).await.map_err(|_| format!("the command ran longer than {timeout:?}"))??;
    let said = || crate::said::cut(String::from_utf8_lossy(&err).trim(), 512).to_string();
    if !status.success() {
        return Err(format!("the command failed ({status}): {}", said()));
    }
    String::from_utf8(out).map_err(|_| "the command printed something other than UTF-8".into())
}

/// A command's process group, killed when dropped (whatever of it still runs).
struct Group(rustix::process::Pid);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process_group(self.0, rustix::process::Signal::KILL);
    }
}

pub mod exporter;
pub mod guard;
mod isolation;
pub mod metrics;
pub mod protocol;
pub mod signals;

#[cfg(test)]
mod tests;
