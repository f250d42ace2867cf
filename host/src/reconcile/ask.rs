//! Asking the members of an engine that elects its own leader what they know: the
//! plugin's `member-query`, sent from the operator to each member's pod address, the
//! way an in-cluster operator reaches its instances. Every request is bounded before
//! anything is spent on it (one client, 2 s to connect and 5 s per request, 16 KiB per
//! answer), and a member that does not answer in time is simply one without an answer.
//!
//! Over HTTPS each member is asked under its own DNS name (`<pod>.<headless Service>`,
//! which its certificate carries), connected to at its pod address, and verified
//! against the Database's certificate authority alone.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use futures::future::join_all;

use super::members::Observed;
use crate::plugin::MemberQuery;

/// Time a member's address has to take the connection: a lost node is given up on
/// after this.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Time a member has to answer, connection included: its agent may wait up to
/// 1.6 s for a fence to take, or run a promotion for up to 4 s
/// ([`crate::agent::ACTION_TIMEOUT`]), and a TLS handshake on a busy node takes its share.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(6);
/// The longest answer read; a longer one is no answer.
pub const MAX_ANSWER: usize = 16 << 10;

fn builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(ANSWER_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
}

/// The client every plain question goes through (HTTP, no proxy, no redirects).
pub fn client() -> reqwest::Client {
    builder().build().expect("an HTTP client with no TLS settings of its own builds")
}

/// How the members are reached.
pub enum Transport<'a> {
    /// Plain HTTP to each member's address, through the shared client.
    Plain(&'a reqwest::Client),
    /// HTTPS to `<pod>.<domain>` at the member's address, trusting only `ca` (PEM).
    Tls {
        /// The Database's certificate authority.
        ca: &'a [u8],
        /// The headless Service's name, under which each member has its own.
        domain: &'a str,
        /// The certificate and key (PEM) the operator shows, where the member asks for one.
        identity: Option<&'a [u8]>,
    },
}

/// Each member's answer to `query`, in the order of `members`: `None` for a member
/// that has no address yet, is being deleted, or did not answer 2xx within bounds.
pub async fn answers(transport: Transport<'_>, query: &MemberQuery, members: &[Observed]) -> Vec<Option<String>> {
    replies(transport, query, members).await.into_iter().map(Result::ok).collect()
}

/// Each member's answer to `query`, in the order of `members`, or why there is none: it
/// has no address yet, is being deleted, was not reached, or did not answer 2xx within
/// bounds (with the start of what it said then).
pub async fn replies(transport: Transport<'_>, query: &MemberQuery, members: &[Observed]) -> Vec<Result<String, String>> {
    let reachable = |m: &Observed| m.address.as_deref().filter(|_| !m.terminating)?.parse::<IpAddr>().ok();
    let (client, domain) = match transport {
        Transport::Plain(client) => (client.clone(), None),
        Transport::Tls { ca, domain, identity } => {
            let ca = match reqwest::Certificate::from_pem(ca) {
                Ok(ca) => ca,
                Err(e) => {
                    tracing::warn!("the Database's certificate authority is not PEM: {e}");
                    return vec![Err("no certificate authority to verify it by".into()); members.len()];
                }
            };
            let mut builder = builder().tls_certs_only([ca]);
            if let Some(pem) = identity {
                match reqwest::Identity::from_pem(pem) {
                    Ok(identity) => builder = builder.identity(identity),
                    Err(e) => {
                        tracing::warn!("the operator's certificate for the members is not PEM: {e}");
                        return vec![Err("no certificate to show it".into()); members.len()];
                    }
                }
            }
            for m in members {
                if let Some(ip) = reachable(m) {
                    builder = builder.resolve(&format!("{}.{domain}", m.name), SocketAddr::new(ip, query.port));
                }
            }
            let Ok(client) = builder.build().map_err(|e| tracing::warn!("no HTTPS client for the members: {e}")) else {
                return vec![Err("no HTTPS client".into()); members.len()];
            };
            (client, Some(domain))
        }
    };
    join_all(members.iter().map(|m| {
        let client = &client;
        async move {
            let ip = reachable(m).ok_or(if m.terminating { "being deleted" } else { "no address yet" })?;
            let base = match domain {
                Some(domain) => format!("https://{}.{domain}", m.name),
                None if ip.is_ipv6() => format!("http://[{ip}]"),
                None => format!("http://{ip}"),
            };
            let url = format!("{base}:{}{}", query.port, query.path);
            ask(client, query, &url).await.inspect_err(|e| tracing::debug!(member = %m.name, "no answer: {e}"))
        }
    }))
    .await
}

/// `query` sent to `url`.
async fn ask(client: &reqwest::Client, query: &MemberQuery, url: &str) -> Result<String, String> {
    let request = match &query.body {
        Some(body) => client.post(url).header(http::header::CONTENT_TYPE, "application/json").body(body.clone()),
        None => client.get(url),
    };
    let mut response = request.send().await.map_err(|e| format!("{url}: {}", causes(&e)))?;
    if !response.status().is_success() {
        let status = response.status();
        let said = response.chunk().await.ok().flatten().unwrap_or_default();
        let said = crate::said::cut(String::from_utf8_lossy(&said).trim(), 200).to_string();
        return Err(format!("{url}: status {status}: {said}"));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| format!("{url}: {e}"))? {
        if body.len() + chunk.len() > MAX_ANSWER {
            return Err(format!("{url}: the answer is longer than {MAX_ANSWER} bytes"));
        }
        body.extend_from_slice(&chunk);
    }
    String::from_utf8(body).map_err(|_| format!("{url}: the answer is not UTF-8"))
}

/// An error and what caused it, down to the first cause (a refused or timed-out connection
/// under "error sending request").
fn causes(e: &dyn std::error::Error) -> String {
    let mut said = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        said.push_str(&format!(": {c}"));
        cause = c.source();
    }
    said
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-connection-at-a-time HTTP server on loopback answering `status` and `body`.
    async fn server(status: &'static str, body: String) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut request = vec![0; 4096];
                let _ = socket.read(&mut request).await;
                let head = format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(body.as_bytes()).await;
            }
        });
        address.to_string()
    }

    fn member(name: &str, address: Option<String>) -> Observed {
        Observed::at(name, address)
    }

    #[tokio::test]
    async fn members_answer_within_bounds_or_not_at_all() {
        let ok = server("200 OK", r#"{"leader":"7"}"#.into()).await;
        let refused = server("503 Service Unavailable", "no leader".into()).await;
        let long = server("200 OK", "x".repeat(MAX_ANSWER + 1)).await;
        let (ok_ip, ok_port) = ok.split_once(':').expect("ip:port");
        let gone = Observed { terminating: true, ..member("db-2", Some(ok_ip.into())) };
        let members = [member("db-0", Some(ok_ip.into())), member("db-1", None), gone];
        let query = MemberQuery { port: ok_port.parse().expect("port"), path: "/status".into(), body: Some("{}".into()), https: false };
        let said = answers(Transport::Plain(&client()), &query, &members).await;
        assert_eq!(said, vec![Some(r#"{"leader":"7"}"#.to_string()), None, None], "no address, or being deleted: not asked");

        for (address, what) in [(refused.clone(), "a 503"), (long, "an answer over 16 KiB")] {
            let (ip, port) = address.split_once(':').expect("ip:port");
            let query = MemberQuery { port: port.parse().expect("port"), path: "/status".into(), body: None, https: false };
            let said = answers(Transport::Plain(&client()), &query, &[member("db-0", Some(ip.into()))]).await;
            assert_eq!(said, vec![None], "{what} is no answer");
        }
        // Why not, said: the agent's own words with a refusal, the cause of a failed connection.
        let (ip, port) = refused.split_once(':').expect("ip:port");
        let query = MemberQuery { port: port.parse().expect("port"), path: "/status".into(), body: None, https: false };
        let why = replies(Transport::Plain(&client()), &query, &[member("db-0", Some(ip.into())), member("db-1", None)]).await;
        assert!(why[0].as_ref().is_err_and(|e| e.contains("503") && e.contains("no leader")), "{why:?}");
        assert_eq!(why[1], Err("no address yet".into()));
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("its address").port();
        let query = MemberQuery { port: closed, path: "/status".into(), body: None, https: false };
        let why = replies(Transport::Plain(&client()), &query, &[member("db-0", Some("127.0.0.1".into()))]).await;
        assert!(why[0].as_ref().is_err_and(|e| e.to_lowercase().contains("refused")), "{why:?}");
    }
}
