//! The engine's exporter as the member's agent sees it, from inside the pod: whether it
//! answers on the pod's loopback, and whether it says it reaches its engine. Exporters
//! say that in a series `<namespace>_up` of their own (`pg_up`, `mysql_up`), 0 while
//! they cannot log in; the agent says what it last saw with each status it gives, for
//! the member's status and the Database's `EngineMetrics` condition.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How often the agent looks at the exporter: as often as the operator asks for status.
pub const LOOK_EVERY: Duration = Duration::from_secs(30);
/// How long one look may take: an exporter reads its engine for each scrape.
const LOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of an answer that is read.
const MAX_ANSWER: u64 = 16 << 20;

/// What the exporter said at the agent's last look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exporter {
    /// It answered, and reaches its engine.
    Up,
    /// It answered that it cannot reach its engine (a `<namespace>_up` of 0).
    Down,
    /// It did not answer.
    Silent,
}

impl Exporter {
    const ALL: [Exporter; 3] = [Exporter::Up, Exporter::Down, Exporter::Silent];

    /// The word the agent's status says it with.
    pub fn word(self) -> &'static str {
        match self {
            Exporter::Up => "up",
            Exporter::Down => "down",
            Exporter::Silent => "silent",
        }
    }

    /// The state `word` names.
    pub fn parse(word: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.word() == word)
    }

    /// How the member's status says it.
    pub fn said(self) -> &'static str {
        match self {
            Exporter::Up => "up",
            Exporter::Down => "cannot reach its engine",
            Exporter::Silent => "does not answer",
        }
    }
}

/// Where the agent finds the exporter: a port and a path on the pod's loopback, given as
/// `http://127.0.0.1:<port><path>` (nothing else is read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    /// Its port.
    pub port: u16,
    /// Its path, as a plugin's metrics path may be (the policy's `http_path_ok`).
    pub path: String,
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://127.0.0.1:{}{}", self.port, self.path)
    }
}

impl std::str::FromStr for At {
    type Err = String;

    fn from_str(url: &str) -> Result<Self, String> {
        let rest = url.strip_prefix("http://127.0.0.1:").ok_or("not http://127.0.0.1:<port><path>")?;
        let (port, path) = rest.split_at(rest.find('/').ok_or("no path")?);
        let port = port.parse::<u16>().ok().filter(|p| *p > 0).ok_or("not a port")?;
        let path_ok = crate::plugin::policy::http_path_ok(path);
        path_ok.then(|| At { port, path: path.to_string() }).ok_or_else(|| "the path is not / and at most 256 printable characters".into())
    }
}

/// What a scrape's `body` says of the exporter's engine: `Down` when a series
/// `<namespace>_up` (no labels) is 0, else `Up`.
pub fn read(body: &str) -> Exporter {
    let down = body.lines().filter(|l| !l.starts_with('#')).any(|line| {
        let mut words = line.split_ascii_whitespace();
        let (Some(name), Some(value)) = (words.next(), words.next()) else { return false };
        name.ends_with("_up") && !name.contains('{') && value.parse::<f64>().is_ok_and(|v| v == 0.0)
    });
    if down { Exporter::Down } else { Exporter::Up }
}

/// One look at the exporter at `at`.
pub async fn look(at: &At) -> Exporter {
    let scrape = async {
        let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", at.port)).await?;
        let request = format!("GET {} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nAccept: text/plain\r\n\r\n", at.path, at.port);
        socket.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        socket.take(MAX_ANSWER).read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let Ok(Ok(answer)) = tokio::time::timeout(LOOK_TIMEOUT, scrape).await else { return Exporter::Silent };
    let text = String::from_utf8_lossy(&answer);
    let ok = text.lines().next().is_some_and(|status| status.starts_with("HTTP/1.") && status.split(' ').nth(1) == Some("200"));
    match text.split_once("\r\n\r\n") {
        Some((_, body)) if ok => read(body),
        _ => Exporter::Silent,
    }
}

/// Looks at the exporter at `at` every [`LOOK_EVERY`] (the first time after one), keeping
/// the last look in `last`.
pub async fn watch(at: At, last: std::sync::Arc<std::sync::Mutex<Option<Exporter>>>) {
    let mut said = None;
    loop {
        // Not at once: a member's exporter starts with its engine, which takes a while.
        tokio::time::sleep(LOOK_EVERY).await;
        let now = look(&at).await;
        if said != Some(now) {
            match now {
                Exporter::Up => tracing::info!(exporter = %at, "the engine's exporter reaches its engine"),
                _ => tracing::warn!(exporter = %at, "the engine's exporter {}", now.said()),
            }
            said = Some(now);
        }
        *last.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
    }
}
