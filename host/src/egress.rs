//! Where the operator may send a request a tenant named (a backup bucket's
//! `spec.backup.s3.endpoint`): never to the cluster's own addresses, unless the
//! administrator allows them. A tenant who could point the operator at the API server, a
//! node's loopback or the cloud's metadata service would borrow the operator's place in
//! the network; what such a server answers would travel back in the Database's status.
//!
//! Refused by default: loopback, link-local (cloud metadata at 169.254.169.254),
//! unspecified and multicast addresses, the API server (its address and port), and the
//! networks the administrator names (`--egress-forbid`, e.g. the cluster's Service and Pod
//! ranges). `--egress-allow` names networks allowed all the same (an in-cluster object
//! store). A host name is resolved by the operator, checked, and connected to at the
//! addresses checked only (a name that resolves elsewhere a moment later changes nothing).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// An IP network: an address and how many leading bits are fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    address: IpAddr,
    prefix: u8,
}

impl Network {
    /// Whether `ip` is in this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let bits = |a: IpAddr| -> (u128, u8) {
            match a {
                IpAddr::V4(v4) => (u128::from(u32::from(v4)) << 96, 32),
                IpAddr::V6(v6) => (u128::from(v6), 128),
            }
        };
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let ((network, width), (candidate, candidate_width)) = (bits(self.address), bits(ip));
        if width != candidate_width {
            return false;
        }
        let mask = if self.prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(self.prefix)) };
        network & mask == candidate & mask
    }
}

impl std::str::FromStr for Network {
    type Err = String;

    /// `10.96.0.0/12`, `fd00::/8`, or an address alone (the whole address).
    fn from_str(s: &str) -> Result<Self, String> {
        let (address, prefix) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let address: IpAddr = address.trim().parse().map_err(|_| format!("{s:?} is not an address or a network (10.96.0.0/12)"))?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.trim().parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(|| format!("{s:?}: the prefix must be 0-{max}"))?,
            None => max,
        };
        Ok(Self { address, prefix })
    }
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.address, self.prefix)
    }
}

/// Networks no request a tenant names may reach, whatever the administrator says.
const ALWAYS: [&str; 10] = [
    "127.0.0.0/8",
    "::1/128",
    "169.254.0.0/16",
    "fe80::/10",
    "0.0.0.0/8",
    "::/128",
    "224.0.0.0/4",
    "ff00::/8",
    "100.100.100.200/32", // a cloud's metadata service outside link-local
    "fd00:ec2::254/128",  // and its IPv6 address
];

/// Where the operator may send a request a tenant named.
#[derive(Debug, Clone)]
pub struct Policy {
    forbidden: Vec<Network>,
    allowed: Vec<Network>,
    /// The API server, by address and port.
    api_server: Vec<SocketAddr>,
}

impl Default for Policy {
    fn default() -> Self {
        let forbidden = ALWAYS.iter().filter_map(|n| n.parse().ok()).collect();
        Self { forbidden, allowed: Vec::new(), api_server: Vec::new() }
    }
}

impl Policy {
    /// The default policy, also refusing `forbidden` and the API server at `api_server`,
    /// and allowing `allowed` all the same.
    pub fn new(forbidden: Vec<Network>, allowed: Vec<Network>, api_server: Vec<SocketAddr>) -> Self {
        let mut policy = Self::default();
        policy.forbidden.extend(forbidden);
        policy.allowed = allowed;
        policy.api_server = api_server;
        policy
    }

    /// Why `ip` (at `port`) may not be reached, if it may not.
    pub fn refusal(&self, ip: IpAddr, port: u16) -> Option<String> {
        if self.allowed.iter().any(|n| n.contains(ip)) {
            return None;
        }
        if self.api_server.iter().any(|a| a.ip() == ip && a.port() == port) {
            return Some(format!("{ip}:{port} is the cluster's API server"));
        }
        let network = self.forbidden.iter().find(|n| n.contains(ip))?;
        Some(format!("{ip} is in {network}, which the operator does not reach for a tenant (--egress-allow allows it)"))
    }

    /// The addresses of `url` the operator may reach, resolved now; an error names what
    /// may not be reached (every address must be allowed: a name is not half trusted).
    pub async fn check(&self, url: &str) -> Result<Checked, String> {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("{url:?}: only http and https endpoints"));
        }
        let host = parsed.host_str().ok_or_else(|| format!("{url:?} names no host"))?.to_string();
        let port = parsed.port_or_known_default().unwrap_or(443);
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addresses: Vec<IpAddr> = match bare.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => {
                tokio::net::lookup_host((bare, port)).await.map_err(|e| format!("{host} does not resolve: {e}"))?.map(|a| a.ip()).collect()
            }
        };
        if addresses.is_empty() {
            return Err(format!("{host} resolves to no address"));
        }
        if let Some(why) = addresses.iter().find_map(|ip| self.refusal(*ip, port)) {
            return Err(format!("{host}: {why}"));
        }
        Ok(Checked { host: bare.to_string(), addresses })
    }
}

/// A host and the addresses it was checked at.
#[derive(Debug, Clone)]
pub struct Checked {
    host: String,
    addresses: Vec<IpAddr>,
}

impl Checked {
    /// A resolver that answers for this host with the checked addresses alone, and for no
    /// other host: the client connects where the check looked, nowhere else.
    pub fn resolver(&self) -> Arc<dyn object_store::client::DnsResolver> {
        Arc::new(Pinned(self.clone()))
    }
}

#[derive(Debug)]
struct Pinned(Checked);

impl object_store::client::DnsResolver for Pinned {
    fn resolve(&self, host: &str) -> object_store::client::DnsFuture {
        let answer = if host.eq_ignore_ascii_case(&self.0.host) {
            Ok(self.0.addresses.clone())
        } else {
            Err(format!("{host} was not checked").into())
        };
        Box::pin(async move { answer })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_hold_their_addresses_only() {
        let n: Network = "10.96.0.0/12".parse().expect("network");
        assert!(n.contains("10.96.0.1".parse().expect("ip")));
        assert!(n.contains("10.111.255.255".parse().expect("ip")));
        assert!(!n.contains("10.112.0.0".parse().expect("ip")));
        assert!(!n.contains("fd00::1".parse().expect("ip")), "another family");
        let one: Network = "192.0.2.7".parse().expect("an address alone");
        assert!(one.contains("192.0.2.7".parse().expect("ip")) && !one.contains("192.0.2.8".parse().expect("ip")));
        let all: Network = "0.0.0.0/0".parse().expect("everything");
        assert!(all.contains("203.0.113.9".parse().expect("ip")));
        for bad in ["10.0.0.0/33", "fd00::/129", "ten", "10.0.0.0/x", ""] {
            assert!(bad.parse::<Network>().is_err(), "{bad:?}");
        }
    }

    /// Loopback, link-local (metadata), IPv4 mapped into IPv6, the API server's socket and
    /// the administrator's networks are refused; elsewhere, and what is allowed, is not.
    #[tokio::test]
    async fn a_tenant_cannot_point_the_operator_at_the_cluster() {
        let api_server: SocketAddr = "10.201.0.2:6443".parse().expect("socket");
        let policy = Policy::new(vec!["10.96.0.0/12".parse().expect("services")], vec![], vec![api_server]);
        for refused in [
            "http://127.0.0.1:9000",
            "https://localhost:9000",
            "http://169.254.169.254/latest/meta-data",
            "http://[::1]:9000",
            "http://[::ffff:127.0.0.1]:9000",
            "https://10.201.0.2:6443",
            "http://10.100.0.1",
            "http://0.0.0.0:80",
            "file:///etc/passwd",
            "http://",
        ] {
            assert!(policy.check(refused).await.is_err(), "{refused} refused");
        }
        let why = policy.check("https://10.201.0.2:6443").await.expect_err("the API server");
        assert!(why.contains("API server"), "{why}");
        for reached in ["http://10.201.0.2:9000", "https://192.0.2.10", "http://[2001:db8::1]:9000"] {
            assert!(policy.check(reached).await.is_ok(), "{reached} reached");
        }
        let allowing = Policy::new(vec![], vec!["127.0.0.1/32".parse().expect("allowed")], vec![]);
        assert!(allowing.check("http://127.0.0.1:9000").await.is_ok(), "allowed by the administrator");
        assert!(allowing.check("http://127.0.0.2:9000").await.is_err(), "only what is allowed");
    }

    #[tokio::test]
    async fn the_resolver_answers_for_the_checked_host_alone() {
        let policy = Policy::new(vec![], vec![], vec![]);
        let checked = policy.check("http://192.0.2.10:9000").await.expect("allowed");
        let resolver = checked.resolver();
        let resolver: &dyn object_store::client::DnsResolver = resolver.as_ref();
        assert_eq!(resolver.resolve("192.0.2.10").await.expect("checked"), vec!["192.0.2.10".parse::<IpAddr>().expect("ip")]);
        assert!(resolver.resolve("metadata.internal").await.is_err(), "nothing else");
    }
}
