//! The members' NetworkPolicy: the member agent's port is reached from the operator
//! alone; every other port (the engine's, the agent's metrics) from the clients
//! `spec.clients` names, the members themselves and the Database's Jobs, or from anyone
//! when it names none.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::{AgentSidecar, Child, pod};
use crate::agent::PORT;
use crate::crd::Database;
use crate::names::{JOB_OF, metadata};

/// The NetworkPolicy selecting `db`'s members (named as the Database). `agent`: the
/// member agent runs beside the engine, and who the operator is (none known: anyone
/// reaches the agent's port, whose TLS alone then keeps others out).
pub fn network_policy(db: &Database, agent: Option<&AgentSidecar<'_>>) -> Child {
    let name = db.name_any();
    let operator = agent.map(|a| a.operator).unwrap_or_default();
    let pods = |selector: LabelSelector| NetworkPolicyPeer { pod_selector: Some(selector), ..Default::default() };
    let jobs = LabelSelector { match_labels: Some(BTreeMap::from([(JOB_OF.to_string(), name.clone())])), ..Default::default() };
    let clients = db.spec.clients.as_ref().map(|clients| {
        let own = [pods(pod::member_selector(db)), pods(jobs)];
        clients.iter().cloned().chain(own).chain(operator.iter().cloned()).collect()
    });
    let range = |protocol: &str, (from, to): (u16, u16)| NetworkPolicyPort {
        protocol: Some(protocol.into()),
        port: Some(IntOrString::Int(from.into())),
        end_port: (to > from).then_some(to.into()),
    };
    // Every port but the agent's, in two ranges around it.
    let others = ["TCP", "UDP"].iter().flat_map(|p| [range(p, (1, PORT - 1)), range(p, (PORT + 1, u16::MAX))]).collect();
    let mut ingress = vec![NetworkPolicyIngressRule { from: clients, ports: Some(others) }];
    if agent.is_some() {
        let from = (!operator.is_empty()).then(|| operator.to_vec());
        ingress.push(NetworkPolicyIngressRule { from, ports: Some(vec![range("TCP", (PORT, PORT))]) });
    }
    let spec = NetworkPolicySpec {
        pod_selector: Some(pod::member_selector(db)),
        policy_types: Some(vec!["Ingress".into()]),
        ingress: Some(ingress),
        egress: None,
    };
    Child::new(name.clone(), NetworkPolicy { metadata: metadata(db, &name, true), spec: Some(spec) })
}

/// Where the operator reaches the agents from, as `plugdb run --agent-from` gives it: an
/// address or network (`10.0.0.7`, `10.0.0.0/24`), or the operator's pods as
/// `<namespace>/<label>=<value>[,<label>=<value>…]`.
pub fn operator_peer(text: &str) -> Result<NetworkPolicyPeer, String> {
    let (first, rest) = text.split_once('/').unwrap_or((text, ""));
    if let Ok(address) = first.parse::<std::net::IpAddr>() {
        let longest = if address.is_ipv4() { 32 } else { 128 };
        let bits = if rest.is_empty() { Ok(longest) } else { rest.parse::<u8>().map_err(|_| format!("{rest:?} is no prefix length")) }?;
        if bits > longest {
            return Err(format!("a /{bits} network is longer than the address"));
        }
        let block = k8s_openapi::api::networking::v1::IPBlock { cidr: format!("{address}/{bits}"), except: None };
        return Ok(NetworkPolicyPeer { ip_block: Some(block), ..Default::default() });
    }
    let labels: Option<BTreeMap<String, String>> =
        rest.split(',').map(|pair| pair.split_once('=').map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))).collect();
    let namespace = |s: &str| {
        (1..=63).contains(&s.len())
            && !s.starts_with('-')
            && !s.ends_with('-')
            && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    let label = |s: &str| !s.is_empty() && s.len() <= 253 && s.chars().all(|c| c.is_ascii_alphanumeric() || "-._/".contains(c));
    match labels {
        Some(labels) if namespace(first) && labels.iter().all(|(k, v)| label(k) && (v.is_empty() || label(v))) => {
            let namespace = BTreeMap::from([("kubernetes.io/metadata.name".to_string(), first.to_string())]);
            Ok(NetworkPolicyPeer {
                namespace_selector: Some(LabelSelector { match_labels: Some(namespace), ..Default::default() }),
                pod_selector: Some(LabelSelector { match_labels: Some(labels), ..Default::default() }),
                ip_block: None,
            })
        }
        _ => {
            Err(format!("{text:?} is neither an address or network (10.0.0.0/24) nor the operator's pods (<namespace>/<label>=<value>,…)"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operator_is_an_address_a_network_or_its_pods() {
        let block = |t: &str| operator_peer(t).map(|p| p.ip_block.map(|b| b.cidr));
        assert_eq!(block("10.201.0.1"), Ok(Some("10.201.0.1/32".into())));
        assert_eq!(block("10.0.0.0/8"), Ok(Some("10.0.0.0/8".into())));
        assert_eq!(block("fd00::1"), Ok(Some("fd00::1/128".into())));
        let pods = operator_peer("plugdb-system/app.kubernetes.io/name=plugdb,app.kubernetes.io/instance=plugdb").expect("pods");
        let labels = pods.pod_selector.and_then(|s| s.match_labels).expect("labels");
        assert_eq!(labels.get("app.kubernetes.io/instance").map(String::as_str), Some("plugdb"));
        let namespace = pods.namespace_selector.and_then(|s| s.match_labels).expect("namespace");
        assert_eq!(namespace.get("kubernetes.io/metadata.name").map(String::as_str), Some("plugdb-system"));
        for wrong in ["10.0.0.0/33", "10.0.0.1/x", "plugdb-system", "Plugdb/app=x", "ns/app", "ns/a b=c", ""] {
            assert!(operator_peer(wrong).is_err(), "{wrong:?} is refused");
        }
    }
}
