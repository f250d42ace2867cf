//! The member's own series, for Prometheus: `GET /metrics` on [`PORT`], plain HTTP (a
//! scraper reads them and nothing there orders the agent). A scrape reads the member as
//! the operator does, by the plugin's status command (at most one at a time and once
//! every [`FRESH_FOR`], beside the operator's commands, never in their way), and the data
//! volume by `statfs`. Nothing about a scrape can stop the member serving:
//! its connections are bounded apart from the operator's ([`CONNECTIONS`], [`PER_PEER`]
//! from one address, a few seconds each), and a port that cannot be opened is logged.
//!
//! The kubelet asks `GET /ready` here for the agent's readiness: `200` while the member
//! is not fenced, `503` with the fence's reason once it is. Answered from the mark
//! alone, with no command and no process started: an exec probe is a process in the
//! container every few seconds, which a busy node runs late (three late in a row made a
//! serving member not ready, and it was failed over).
//!
//! `GET /live` is the agent's liveness: answered at once while its loop runs. A hung
//! agent is restarted by it, well before the engine's own liveness probe, which the
//! agent runs, would restart the engine for it.
//!
//! It asks the engine's own exec probes here too, `GET /engine/ready` and `GET
//! /engine/live`: the agent runs the plugin's probe command in its container (the
//! engine's image, environment, files and data volume) with the probe's timeout, and
//! answers `200` when it exits 0, `503` with what it said otherwise. No `runc exec` per
//! look: the kubelet's exec probe starts a runtime, enters the container and starts the
//! command, every few seconds in every member; here the command alone starts. One run
//! of each at a time, and a run's answer serves every ask within [`CHECK_FRESH_FOR`] of
//! it: asks from elsewhere (a pod of the namespace) run it no more often.
//!
//! Every series carries `namespace`, `database`, `engine`, `member` and `role`
//! (`primary`, `replica`, or `unknown` while the status command does not answer).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use super::protocol::{LIVENESS_PATH, READINESS_PATH};
use super::{Agent, COMMAND_TIMEOUT, Status, parse, run};

/// The port the member's series are served on, in every member with an agent.
pub const PORT: u16 = 9188;
/// How long a status answer is served before the command runs again.
pub const FRESH_FOR: Duration = Duration::from_secs(10);
/// Connections at a time (the operator's are counted apart).
const CONNECTIONS: usize = 16;
/// Connections at a time from one address: a pod that holds some open leaves the
/// kubelet's and the scraper's their own. The kubelet may ask four at once (the agent's
/// readiness and liveness, the engine's readiness and liveness), and a slow answer may
/// still hold its connection when the next look of the same probe comes.
const PER_PEER: usize = 6;
/// How long one request may take to arrive, and a scrape to be answered (a status
/// command, its answer); a probe is answered within its own timeout.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a probe's answer serves the asks that follow it.
pub const CHECK_FRESH_FOR: Duration = Duration::from_secs(1);
const MAX_HEAD: usize = 1 << 10;

/// Who the member is, for the series' labels, and where its data volume is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The Database's namespace.
    pub namespace: String,
    /// The Database.
    pub database: String,
    /// Its engine.
    pub engine: String,
    /// The member's pod.
    pub member: String,
    /// The data volume's mount (no volume series without it).
    pub data: Option<PathBuf>,
    /// The directory the member shares with the archiver (no archive series without it).
    pub archive: Option<PathBuf>,
    /// The engine's exporter, looked at for the member's status.
    pub exporter: Option<super::exporter::At>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    namespace: String,
    database: String,
    engine: String,
    member: String,
    role: String,
}

/// The data volume's size and the bytes in use, as `statfs` says, and how fast it fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Volume {
    /// Its size.
    pub size: u64,
    /// What is used of it.
    pub used: u64,
    /// The bytes an hour it filled by over the agent's last looks ([`Filling`]),
    /// once they span long enough; 0 when it did not fill.
    pub per_hour: Option<u64>,
}

/// The volume mounted at `path`, if it can be read.
pub fn volume(path: &std::path::Path) -> Option<Volume> {
    let fs = rustix::fs::statvfs(path).ok()?;
    let size = fs.f_blocks.saturating_mul(fs.f_frsize);
    Some(Volume { size, used: fs.f_blocks.saturating_sub(fs.f_bfree).saturating_mul(fs.f_frsize), per_hour: None })
}

/// What waits in the archive directory to be shipped: the log segments the engine
/// finished (every file whose name does not start with `.`), and how long the oldest
/// has waited.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Archive {
    /// The segments waiting.
    pub pending: u64,
    /// How long the oldest of them has waited, in seconds (0 when none waits).
    pub oldest: f64,
}

/// The archive directory at `path`, if it can be read.
pub fn archive(path: &std::path::Path) -> Option<Archive> {
    let now = std::time::SystemTime::now();
    let (mut pending, mut oldest) = (0, 0.0f64);
    for entry in std::fs::read_dir(path).ok()?.flatten() {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let Ok(modified) = entry.metadata().and_then(|m| m.modified()) else { continue };
        pending += 1;
        oldest = oldest.max(now.duration_since(modified).unwrap_or_default().as_secs_f64());
    }
    Some(Archive { pending, oldest })
}

/// How much a value grew an hour over its looks: one a minute at most is kept (a bounded
/// history however often it is asked), those older than a span are dropped, and the
/// growth is read between the first kept and now once they are far enough apart (0 when
/// it fell).
#[derive(Debug, Default)]
pub struct Trend(pub(super) std::sync::Mutex<std::collections::VecDeque<(std::time::Instant, u64)>>);

impl Trend {
    /// Notes `value` at `now`, keeping looks of the last `over`; the growth an hour once the
    /// looks span `at_least`.
    pub fn look(&self, now: std::time::Instant, value: u64, over: Duration, at_least: Duration) -> Option<u64> {
        let mut looks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        while looks.front().is_some_and(|(at, _)| now.saturating_duration_since(*at) > over) {
            looks.pop_front();
        }
        if looks.back().is_none_or(|(at, _)| now.saturating_duration_since(*at) >= Duration::from_secs(60)) {
            looks.push_back((now, value));
        }
        let (first, was) = *looks.front()?;
        let span = now.saturating_duration_since(first);
        (span >= at_least).then(|| (value.saturating_sub(was) as f64 * 3600.0 / span.as_secs_f64()) as u64)
    }

    /// Forgets every look.
    pub fn forget(&self) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

/// How fast the data volume fills: its use at each status asked for (every half minute,
/// when the operator asks) over the last [`FILLING_OVER`], in bytes an hour once the
/// looks span [`FILLING_AT_LEAST`].
#[derive(Debug, Default)]
pub struct Filling(pub(super) Trend);

/// The span of the looks a filling rate is read over.
pub const FILLING_OVER: Duration = Duration::from_secs(6 * 3600);
/// The least span a filling rate is read over: a burst of writes is not a trend.
pub const FILLING_AT_LEAST: Duration = Duration::from_secs(15 * 60);

impl Filling {
    /// Notes `used` at `now`; the bytes an hour the volume filled by since the first look
    /// kept (0 when it did not), once the looks span long enough.
    pub fn look(&self, now: std::time::Instant, used: u64) -> Option<u64> {
        self.0.look(now, used, FILLING_OVER, FILLING_AT_LEAST)
    }
}

/// The series of `member` at one look: what its status command said (`None`: no answer),
/// whether it is fenced, its volume, and what waits in its archive directory.
pub fn encode(member: &Member, said: Option<&Status>, fenced: bool, volume: Option<Volume>, archive: Option<Archive>) -> String {
    let role = match said {
        Some(s) if s.primary => "primary",
        Some(_) => "replica",
        None => "unknown",
    };
    let labels = Labels {
        namespace: member.namespace.clone(),
        database: member.database.clone(),
        engine: member.engine.clone(),
        member: member.member.clone(),
        role: role.into(),
    };
    let mut registry = Registry::with_prefix("plugdb_member");
    let gauge = |registry: &mut Registry, name: &str, help: &str, value: Option<f64>| {
        let family = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        if let Some(value) = value {
            family.get_or_create(&labels).set(value);
        }
        registry.register(name, help, family);
    };
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    gauge(&mut registry, "up", "Whether the member's engine answered its status command at the last look", Some(flag(said.is_some())));
    gauge(
        &mut registry,
        "fenced",
        "Whether the member is fenced: it takes no more writes for the rest of its pod's life",
        Some(flag(fenced)),
    );
    let lag = said.and_then(|s| s.lag).map(|l| l.as_secs_f64());
    gauge(
        &mut registry,
        "replication_lag_seconds",
        "How far behind its primary a replica says it is (no series while it does not know)",
        lag,
    );
    let (size, used) = (volume.map(|v| v.size as f64), volume.map(|v| v.used as f64));
    gauge(&mut registry, "volume_size_bytes", "The size of the member's data volume", size);
    gauge(&mut registry, "volume_used_bytes", "The bytes in use on the member's data volume", used);
    let (pending, oldest) = (archive.map(|a| a.pending as f64), archive.map(|a| a.oldest));
    gauge(
        &mut registry,
        "archive_pending_segments",
        "The log segments the engine finished that wait in the archive directory to be shipped to the bucket",
        pending,
    );
    gauge(&mut registry, "archive_oldest_pending_seconds", "How long the oldest segment waiting to be shipped has waited", oldest);
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// What scrapes share: the last status answer, when it was had, and the one status
/// command a scrape may run at a time; and the engine's probes, each with its last
/// answer (a probe's lock is held while it runs).
#[derive(Debug)]
pub(super) struct Looks {
    last: Mutex<Option<(Instant, Option<Status>)>>,
    running: Semaphore,
    readiness: Checked,
    liveness: Checked,
}

/// A probe's last answer and when it was had.
type Checked = tokio::sync::Mutex<Option<(Instant, Result<(), String>)>>;

impl Default for Looks {
    fn default() -> Self {
        Looks { last: Mutex::default(), running: Semaphore::new(1), readiness: Checked::default(), liveness: Checked::default() }
    }
}

/// Serves the member's series on `listener` for as long as the agent runs.
pub(super) async fn serve(listener: tokio::net::TcpListener, agent: Arc<Agent>, member: Member) {
    let (member, looks, connections) = (Arc::new(member), Arc::new(Looks::default()), Arc::new(Semaphore::new(CONNECTIONS)));
    let peers = super::Peers::bounded(PER_PEER);
    loop {
        let Ok((socket, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Some(peer_permit) = peers.admit(peer.ip()) else { continue };
        let Ok(permit) = connections.clone().try_acquire_owned() else { continue };
        let (agent, member, looks) = (agent.clone(), member.clone(), looks.clone());
        tokio::spawn(async move {
            let _ = scrape(socket, &agent, &member, &looks).await;
            drop((permit, peer_permit));
        });
    }
}

/// One connection: its request within [`CONNECTION_TIMEOUT`], and the answer within
/// that again, or a probe's within its own timeout.
async fn scrape(mut socket: tokio::net::TcpStream, agent: &Agent, member: &Member, looks: &Looks) -> std::io::Result<()> {
    let timed_out = || std::io::Error::from(std::io::ErrorKind::TimedOut);
    let head = tokio::time::timeout(CONNECTION_TIMEOUT, read_head(&mut socket)).await.map_err(|_| timed_out())??;
    let probes =
        [(READINESS_PATH, &agent.commands.readiness, &looks.readiness), (LIVENESS_PATH, &agent.commands.liveness, &looks.liveness)];
    let probe = probes.into_iter().find_map(|(path, check, last)| {
        let asked = head.starts_with(format!("GET {path} ").as_bytes());
        Some((check.as_ref().filter(|_| asked)?, last))
    });
    let within = probe.map_or(Duration::ZERO, |(check, _)| Duration::from_secs(u64::from(check.timeout_seconds)));
    let answered = tokio::time::timeout(CONNECTION_TIMEOUT + within, async {
        let said = match probe {
            Some((check, last)) => match checked(check, last).await {
                Ok(()) => ("200 OK", "text/plain", "ok\n".to_string()),
                Err(e) => ("503 Service Unavailable", "text/plain", format!("{e}\n")),
            },
            None => served(&head, agent, member, looks).await,
        };
        answer(&mut socket, said).await
    });
    answered.await.map_err(|_| timed_out())?
}

/// The request's head, up to its blank line (or [`MAX_HEAD`]).
async fn read_head(socket: &mut tokio::net::TcpStream) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() <= MAX_HEAD {
        let mut chunk = [0u8; 256];
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&chunk[..n]);
    }
    Ok(head)
}

async fn answer(socket: &mut tokio::net::TcpStream, (status, content_type, body): (&str, &str, String)) -> std::io::Result<()> {
    let response =
        format!("HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
    socket.write_all(response.as_bytes()).await?;
    socket.write_all(body.as_bytes()).await?;
    socket.shutdown().await
}

/// The engine's probe `check`: its answer within [`CHECK_FRESH_FOR`] (one had while this
/// ask waited for the run under way), else its command's now.
pub(super) async fn checked(check: &super::protocol::Check, last: &Checked) -> Result<(), String> {
    let mut last = last.lock().await;
    if let Some((_, said)) = last.as_ref().filter(|(at, _)| at.elapsed() < CHECK_FRESH_FOR) {
        return said.clone();
    }
    let said = run(&check.command, &[], Duration::from_secs(u64::from(check.timeout_seconds))).await.map(drop);
    *last = Some((Instant::now(), said.clone()));
    said
}

/// The answer to a request that is not a probe: the series, the agent's readiness, or
/// what is served.
async fn served(head: &[u8], agent: &Agent, member: &Member, looks: &Looks) -> (&'static str, &'static str, String) {
    if head.starts_with(b"GET /metrics ") {
        let said = status(agent, looks).await;
        let (volume, archive) = (member.data.as_deref().and_then(volume), member.archive.as_deref().and_then(archive));
        let series = encode(member, said.as_ref(), agent.is_fenced(), volume, archive);
        ("200 OK", "application/openmetrics-text; version=1.0.0; charset=utf-8", series)
    } else if head.starts_with(b"GET /live ") {
        ("200 OK", "text/plain", "alive\n".to_string())
    } else if head.starts_with(b"GET /ready ") {
        match agent.commands.fence.as_ref().map_or(Ok(()), |f| super::ready(&f.mark)) {
            Ok(()) => ("200 OK", "text/plain", "ready\n".to_string()),
            Err(fenced) => ("503 Service Unavailable", "text/plain", format!("{fenced}\n")),
        }
    } else {
        ("404 Not Found", "text/plain", "only GET /metrics, /live, /ready, /engine/ready and /engine/live are served here\n".to_string())
    }
}

/// What the member says of itself: the last answer while it is fresh, or while another
/// scrape's command runs, else the status command's answer now. A scrape's command runs
/// beside the operator's, never holding or waiting for their lock: a fence is not held
/// back by a scrape of a hung engine.
pub(super) async fn status(agent: &Agent, looks: &Looks) -> Option<Status> {
    let cached = looks.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some((_, said)) = cached.as_ref().filter(|(at, _)| at.elapsed() < FRESH_FOR) {
        return said.clone();
    }
    let Ok(_one_scrape_at_a_time) = looks.running.try_acquire() else { return cached.and_then(|(_, said)| said) };
    let said = run(&agent.commands.status, &[], COMMAND_TIMEOUT).await.ok().and_then(|out| parse(&out).ok());
    *looks.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), said.clone()));
    said
}
