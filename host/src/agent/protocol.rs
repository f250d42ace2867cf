//! The member agent's protocol, written once for the agent that serves it, the operator
//! that asks, and the member that starts it: each [`Request`] (its method and path), each
//! [`Answer`] word the agent gives when it did what it was asked, and the agent's
//! arguments ([`Serve`]), which the member's rendering writes and the agent parses.

use std::path::PathBuf;

/// What the operator asks a member's agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    /// `GET /status`: the line the plugin's status command prints.
    Status,
    /// `POST /fence`: fence the member ([`Answer::Fenced`], or [`Answer::Fencing`] while
    /// the fence command has not succeeded yet).
    Fence,
    /// `POST /stop`: a fenced member that did not confirm its fence has its engine killed
    /// by its guard ([`Answer::Stopped`] once the fence command then succeeds).
    Stop,
    /// `POST /promote`: promote the member in place ([`Answer::Promoted`]).
    Promote,
    /// `POST /synchronous/<n>[/<member>,…]`: have each commit wait for `n` replicas, 0-9,
    /// of the members named (pods' names; none named: any replica) ([`Answer::Set`]).
    Synchronous(u8, &'a str),
    /// `POST /follow/<member>`: replicate from `member`, a pod's name, just promoted
    /// ([`Answer::Following`]).
    Follow(&'a str),
}

impl<'a> Request<'a> {
    /// Every request, as the agent's refusal of any other names them.
    pub const SERVED: &'static str =
        "GET /status, POST /fence, POST /stop, POST /promote, POST /synchronous/<n>[/<member>,…] and POST /follow/<member>";

    /// Its HTTP method.
    pub fn method(self) -> &'static str {
        match self {
            Request::Status => "GET",
            _ => "POST",
        }
    }

    /// Its path.
    pub fn path(self) -> String {
        match self {
            Request::Status => "/status".into(),
            Request::Fence => "/fence".into(),
            Request::Stop => "/stop".into(),
            Request::Promote => "/promote".into(),
            Request::Synchronous(n, "") => format!("/synchronous/{n}"),
            Request::Synchronous(n, members) => format!("/synchronous/{n}/{members}"),
            Request::Follow(member) => format!("/follow/{member}"),
        }
    }

    /// The request a head (`<method> <path> HTTP/1.1 …`) makes, read as coming from
    /// anyone: a number of replicas is one digit, a member a DNS label (1-63 characters of
    /// `[a-z0-9-]`, neither first nor last a `-`), which nothing can read as more than a
    /// name, and members a list of at most [`MAX_MEMBERS`] of them, split by `,`.
    pub fn parse(head: &'a [u8]) -> Option<Self> {
        let mut words = head.split(|b| *b == b' ');
        let (method, path) = (words.next()?, std::str::from_utf8(words.next()?).ok()?);
        words.next()?;
        let request = match path {
            "/status" => Request::Status,
            "/fence" => Request::Fence,
            "/stop" => Request::Stop,
            "/promote" => Request::Promote,
            _ => match (path.strip_prefix("/synchronous/"), path.strip_prefix("/follow/")) {
                (Some(n), _) if n.len() == 1 => Request::Synchronous(n.parse().ok()?, ""),
                (Some(set), _) => match set.split_once('/') {
                    Some((n, members)) if n.len() == 1 && is_members(members) => Request::Synchronous(n.parse().ok()?, members),
                    _ => return None,
                },
                (_, Some(member)) if is_label(member) => Request::Follow(member),
                _ => return None,
            },
        };
        (method == request.method().as_bytes()).then_some(request)
    }
}

/// The most members a synchronous set names: a Database's replicas (`spec.replicas` is at
/// most 9, one of them the primary).
pub const MAX_MEMBERS: usize = 8;

fn is_members(list: &str) -> bool {
    let names: Vec<&str> = list.split(',').collect();
    names.len() <= MAX_MEMBERS && names.iter().all(|name| is_label(name))
}

fn is_label(name: &str) -> bool {
    let label = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    (1..=63).contains(&name.len()) && name.chars().all(label) && !name.starts_with('-') && !name.ends_with('-')
}

/// The word the agent answers a request it carried out with (on a line of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// [`Request::Fence`]: the fence command succeeded.
    Fenced,
    /// [`Request::Fence`] or [`Request::Stop`]: ordered, not confirmed yet.
    Fencing,
    /// [`Request::Stop`]: the engine was stopped and the fence command then succeeded.
    Stopped,
    /// [`Request::Promote`].
    Promoted,
    /// [`Request::Synchronous`].
    Set,
    /// [`Request::Follow`].
    Following,
}

impl Answer {
    const ALL: [Answer; 6] = [Answer::Fenced, Answer::Fencing, Answer::Stopped, Answer::Promoted, Answer::Set, Answer::Following];

    /// The word.
    pub fn word(self) -> &'static str {
        match self {
            Answer::Fenced => "fenced",
            Answer::Fencing => "fencing",
            Answer::Stopped => "stopped",
            Answer::Promoted => "promoted",
            Answer::Set => "set",
            Answer::Following => "following",
        }
    }

    /// The answer an agent's body says, if any.
    pub fn parse(body: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.word() == body.trim())
    }
}

/// The agent's arguments (`plugdb agent serve …`): the member's rendering writes them
/// ([`Serve::argv`]) and the agent parses them, with the same names.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Serve {
    /// The port to serve on.
    #[arg(long, default_value_t = super::PORT)]
    pub port: u16,
    /// The directory holding tls.crt, tls.key, ca.crt and clients-ca.crt.
    #[arg(long, value_name = "DIR")]
    pub certs: PathBuf,
    /// The SHA-256 (hex) of the one certificate in clients-ca.crt whose client
    /// certificates are obeyed: the operator's authority.
    #[arg(long, value_name = "SHA256", value_parser = fingerprint)]
    pub clients: String,
    /// The plugin's fence command, as a JSON list of strings.
    #[arg(long, value_name = "JSON", requires = "members", value_parser = command)]
    pub fence_command: Option<Argv>,
    /// The plugin's promote command, as a JSON list of strings (with a fence only: a
    /// fenced member is never promoted).
    #[arg(long, value_name = "JSON", requires = "fence_command", value_parser = command)]
    pub promote_command: Option<Argv>,
    /// The plugin's follow command, as a JSON list of strings (with a fence only: the
    /// new primary's address is named under `--members`).
    #[arg(long, value_name = "JSON", requires = "fence_command", value_parser = command)]
    pub follow_command: Option<Argv>,
    /// The plugin's synchronous command, as a JSON list of strings.
    #[arg(long, value_name = "JSON", value_parser = command)]
    pub synchronous_command: Option<Argv>,
    /// The name under which the cluster's DNS lists every member.
    #[arg(long, value_name = "HOST")]
    pub members: Option<String>,
    /// The engine's readiness probe, run here for the kubelet (`GET /engine/ready` on the
    /// metrics port), as JSON: `{"command": [...], "timeoutSeconds": n}`.
    #[arg(long, value_name = "JSON", requires = "metrics_port", value_parser = check)]
    pub readiness: Option<Check>,
    /// The engine's liveness probe, run here for the kubelet (`GET /engine/live`).
    #[arg(long, value_name = "JSON", requires = "metrics_port", value_parser = check)]
    pub liveness: Option<Check>,
    /// Serve the member's series at `GET /metrics` on this port (plain HTTP).
    #[arg(long, value_name = "PORT", requires = "database")]
    pub metrics_port: Option<u16>,
    /// The member's Database, `<namespace>/<name>`, and its engine: the series' labels.
    #[arg(long, value_name = "NAMESPACE/NAME", requires = "engine")]
    pub database: Option<String>,
    /// The member's engine.
    #[arg(long, value_name = "ENGINE")]
    pub engine: Option<String>,
    /// Where the member's data volume is mounted: its size and use are measured.
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// The directory the member shares with the archiver (read-only here): the log
    /// segments waiting there to be shipped are measured.
    #[arg(long, value_name = "DIR")]
    pub archive: Option<PathBuf>,
    /// The engine's exporter, `http://127.0.0.1:<port><path>`: whether it answers and
    /// reaches its engine is said with each status.
    #[arg(long, value_name = "URL")]
    pub exporter: Option<super::exporter::At>,
    /// The plugin's status command.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// A plugin's command, one argument of the agent's as JSON (a name of its own, so that
/// the argument parser takes it as one value).
pub type Argv = Vec<String>;

/// An engine's exec probe the agent runs in its own container for the kubelet, which
/// asks it over HTTP: the command (exit 0 is success) and how long it may run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Check {
    /// The probe's command.
    pub command: Argv,
    /// How long it may run: the probe's timeout.
    pub timeout_seconds: u32,
}

/// The path of the engine's readiness probe on the metrics port.
pub const READINESS_PATH: &str = "/engine/ready";
/// The path of the engine's liveness probe on the metrics port.
pub const LIVENESS_PATH: &str = "/engine/live";

/// A certificate's SHA-256, 64 lowercase hex digits.
fn fingerprint(hex: &str) -> Result<String, String> {
    let valid = hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    valid.then(|| hex.to_string()).ok_or_else(|| "not a SHA-256 in lowercase hex".to_string())
}

/// A probe given as JSON: a command, and from 1 to 60 seconds to run in.
fn check(json: &str) -> Result<Check, String> {
    let check: Check = serde_json::from_str(json).map_err(|e| format!("not a probe (command, timeoutSeconds): {e}"))?;
    if check.command.is_empty() || !(1..=60).contains(&check.timeout_seconds) {
        return Err("a probe needs a command and from 1 to 60 seconds".into());
    }
    Ok(check)
}

/// A command given as JSON.
fn command(json: &str) -> Result<Argv, String> {
    serde_json::from_str(json).map_err(|e| format!("not a JSON list of strings: {e}"))
}

impl Serve {
    /// The arguments after `plugdb agent serve` that say this, each as the agent reads it.
    pub fn argv(&self) -> Vec<String> {
        let mut argv = vec!["--port".into(), self.port.to_string(), "--certs".into(), self.certs.display().to_string()];
        argv.extend(["--clients".into(), self.clients.clone()]);
        let json = |argv: &[String]| serde_json::to_string(argv).expect("a list of strings is JSON");
        let commands = [
            ("--fence-command", &self.fence_command),
            ("--promote-command", &self.promote_command),
            ("--follow-command", &self.follow_command),
            ("--synchronous-command", &self.synchronous_command),
        ];
        for (flag, command) in commands {
            if let Some(command) = command {
                argv.extend([flag.to_string(), json(command)]);
            }
        }
        let checks = [("--readiness", &self.readiness), ("--liveness", &self.liveness)];
        for (flag, check) in checks {
            if let Some(check) = check {
                argv.extend([flag.to_string(), serde_json::to_string(check).expect("a probe is JSON")]);
            }
        }
        let given = [
            ("--members", self.members.clone()),
            ("--metrics-port", self.metrics_port.map(|p| p.to_string())),
            ("--database", self.database.clone()),
            ("--engine", self.engine.clone()),
            ("--data", self.data.as_ref().map(|d| d.display().to_string())),
            ("--archive", self.archive.as_ref().map(|d| d.display().to_string())),
            ("--exporter", self.exporter.as_ref().map(ToString::to_string)),
        ];
        for (flag, value) in given {
            if let Some(value) = value {
                argv.extend([flag.to_string(), value]);
            }
        }
        argv.push("--".into());
        argv.extend(self.command.iter().cloned());
        argv
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn every_request_is_read_back_as_it_is_asked_and_nothing_else_is() {
        let requests = [
            Request::Status,
            Request::Fence,
            Request::Stop,
            Request::Promote,
            Request::Synchronous(0, ""),
            Request::Synchronous(9, ""),
            Request::Synchronous(1, "orders-1"),
            Request::Synchronous(2, "orders-1,orders-2"),
            Request::Follow("orders-2"),
        ];
        for request in requests {
            let head = format!("{} {} HTTP/1.1\r\nhost: x\r\n\r\n", request.method(), request.path());
            assert_eq!(Request::parse(head.as_bytes()), Some(request), "{head}");
        }
        for head in [
            "POST /status HTTP/1.1",
            "GET /fence HTTP/1.1",
            "POST /fence",
            "POST /synchronous/10 HTTP/1.1",
            "POST /synchronous/x HTTP/1.1",
            "POST /synchronous/1/ HTTP/1.1",
            "POST /synchronous/1/a,,b HTTP/1.1",
            "POST /synchronous/1/a,B HTTP/1.1",
            "POST /synchronous/1/a;b HTTP/1.1",
            "POST /synchronous/1/a%2Cb HTTP/1.1",
            "POST /synchronous/12/a HTTP/1.1",
            "POST /follow/-a HTTP/1.1",
            "POST /follow/a.b HTTP/1.1",
            "POST /follow/A HTTP/1.1",
            "POST /follow/ HTTP/1.1",
            "POST /follow/a%2Fb HTTP/1.1",
            "POST /fencex HTTP/1.1",
        ] {
            assert_eq!(Request::parse(head.as_bytes()), None, "{head}");
        }
        assert_eq!(Request::parse(format!("POST /follow/{} HTTP/1.1", "a".repeat(64)).as_bytes()), None);
        let many = |n: usize| format!("POST /synchronous/1/{} HTTP/1.1", vec!["a"; n].join(","));
        assert!(Request::parse(many(MAX_MEMBERS).as_bytes()).is_some());
        assert_eq!(Request::parse(many(MAX_MEMBERS + 1).as_bytes()), None);
    }

    #[test]
    fn every_answer_word_is_read_back() {
        for answer in Answer::ALL {
            assert_eq!(Answer::parse(&format!("{}\n", answer.word())), Some(answer));
        }
        assert_eq!(Answer::parse("not promoted: …"), None);
    }

    #[derive(Parser)]
    struct Agent {
        #[command(flatten)]
        serve: Serve,
    }

    #[test]
    fn the_arguments_a_member_is_given_are_the_ones_the_agent_reads() {
        let full = Serve {
            port: 8443,
            certs: "/etc/plugdb-agent".into(),
            clients: "0a".repeat(32),
            fence_command: Some(vec!["sh".into(), "-c".into(), "fence \"$X\"".into()]),
            promote_command: Some(vec!["promote".into()]),
            follow_command: Some(vec!["follow".into()]),
            synchronous_command: Some(vec!["sync".into()]),
            members: Some("orders-headless.shop.svc".into()),
            readiness: Some(Check { command: vec!["sh".into(), "-c".into(), "ready \"$X\"".into()], timeout_seconds: 2 }),
            liveness: Some(Check { command: vec!["live".into()], timeout_seconds: 5 }),
            metrics_port: Some(9188),
            database: Some("shop/orders".into()),
            engine: Some("postgres".into()),
            data: Some("/var/lib/postgresql/data".into()),
            archive: Some("/plugdb/archive".into()),
            exporter: Some("http://127.0.0.1:9187/metrics".parse().expect("an exporter")),
            command: vec!["psql".into(), "--flag".into()],
        };
        let bare = Serve {
            fence_command: None,
            promote_command: None,
            follow_command: None,
            synchronous_command: None,
            members: None,
            readiness: None,
            liveness: None,
            metrics_port: None,
            database: None,
            engine: None,
            data: None,
            archive: None,
            exporter: None,
            ..full.clone()
        };
        for serve in [full, bare] {
            let read = Agent::try_parse_from(std::iter::once("agent".to_string()).chain(serve.argv())).expect("parses");
            assert_eq!(read.serve, serve);
        }
        let pinned =
            |clients: &str| Agent::try_parse_from(["agent", "--certs", "/c", "--clients", clients, "--", "psql"]).map(|a| a.serve.clients);
        assert_eq!(pinned(&"0a".repeat(32)).ok(), Some("0a".repeat(32)));
        assert!(pinned(&"0A".repeat(32)).is_err(), "upper case: not the form the operator writes");
        assert!(pinned("0a0a").is_err(), "too short");
        assert!(Agent::try_parse_from(["agent", "--certs", "/c", "--", "psql"]).is_err(), "no pin: the agent does not start");
        let probed = |json: &str| {
            let argv = ["agent", "--certs", "/c", "--clients", &"0a".repeat(32), "--metrics-port", "9188", "--database", "a/b"];
            Agent::try_parse_from(argv.into_iter().chain(["--engine", "e", "--readiness", json, "--", "psql"])).map(|a| a.serve.readiness)
        };
        assert!(probed(r#"{"command": ["true"], "timeoutSeconds": 2}"#).is_ok_and(|c| c.is_some()));
        // The exporter is looked at on the pod's loopback alone.
        let exporter =
            |url: &str| Agent::try_parse_from(["agent", "--certs", "/c", "--clients", &"0a".repeat(32), "--exporter", url, "--", "psql"]);
        assert!(
            exporter("http://127.0.0.1:9104/metrics")
                .is_ok_and(|a| a.serve.exporter.is_some_and(|e| e.port == 9104 && e.path == "/metrics"))
        );
        for elsewhere in [
            "http://10.0.0.7:9104/metrics",
            "http://127.0.0.1:0/metrics",
            "http://127.0.0.1:9104",
            "https://127.0.0.1:9104/m",
            "http://127.0.0.1:9104/a b",
        ] {
            assert!(exporter(elsewhere).is_err(), "{elsewhere}");
        }
        for bad in [r#"{"command": [], "timeoutSeconds": 2}"#, r#"{"command": ["true"], "timeoutSeconds": 0}"#, r#"["true"]"#] {
            assert!(probed(bad).is_err(), "{bad}");
        }
    }
}
