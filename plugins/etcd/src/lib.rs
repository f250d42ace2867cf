//! The `etcd` engine plugin: etcd 3.5, a consensus engine that elects its own leader.
//!
//! - Leadership is the engine's (`elects-leader`): the host asks every member for its
//!   status (`POST /v3/maintenance/status`) and the member whose id is the leader it
//!   reports leads; the host never promotes.
//! - Membership changes one member at a time through the scale plan: a Job adds a
//!   member to etcd's membership (as a learner, which promotes itself once it has caught
//!   up) before its pod starts, or removes it before its pod goes. A change that would
//!   leave the cluster without a quorum is refused.
//! - Members start from `start.sh` (a config file), which joins, rejoins or starts a
//!   new cluster from what the cluster lists. A member is alive (`alive.sh`) while that
//!   script waits to join, then while etcd listens to its peers: waiting is never
//!   restarted into a crash loop.
//! - Backups are snapshots (`etcdctl snapshot save`); a restore makes every member's
//!   data from one, as members of a new cluster that start together.
//! - TLS (`spec.tls`): clients and members reach each other over HTTPS with the
//!   Database's certificate; members verify each other both ways. Chosen at creation:
//!   a member's peer address, scheme included, is part of etcd's membership.
//! - The image is the project's etcd image: Debian's `etcd-server` and `etcd-client`
//!   (a shell for the start script, `etcdctl` for the Jobs).

use plugdb_sdk::parameters::{Catalog, Kind};
use plugdb_sdk::*;

const VERSIONS: &[&str] = &["3.5"];
const CLIENT_PORT: u16 = 2379;
const PEER_PORT: u16 = 2380;
/// etcd's own series (`--listen-metrics-urls`), over plain HTTP whatever `spec.tls` says:
/// they hold no keys or values.
const METRICS_PORT: u16 = 2381;
const UID: u32 = 999;
const DATA_MOUNT: &str = "/var/lib/etcd";
const START: &str = include_str!("start.sh");
/// The liveness probe: a member still waiting to join is alive.
const ALIVE: &str = include_str!("alive.sh");
/// `ctl`: etcdctl against the other members; shared by `start.sh` and the Jobs.
const CTL: &str = include_str!("ctl.sh");

/// What users may set; each becomes etcd's own `ETCD_<NAME>` variable.
const CATALOG: Catalog = Catalog {
    settable: &[
        ("auto-compaction-mode", Kind::Enum(&["periodic", "revision"])),
        ("auto-compaction-retention", Kind::Text(32)),
        ("election-timeout", Kind::Int(50, 50_000)),
        ("heartbeat-interval", Kind::Int(10, 10_000)),
        ("max-request-bytes", Kind::Int(1024, 64 << 20)),
        ("quota-backend-bytes", Kind::Int(0, 64 << 30)),
        ("snapshot-count", Kind::Int(1, 100_000_000)),
    ],
    reserved: &[
        "name",
        "data-dir",
        "listen-client-urls",
        "listen-peer-urls",
        "advertise-client-urls",
        "initial-advertise-peer-urls",
        "initial-cluster",
        "initial-cluster-state",
        "initial-cluster-token",
    ],
};

/// The engine.
pub struct Etcd;

fn image(version: &str) -> String {
    format!("docker.io/plugdb/etcd:{version}")
}

/// etcd's largest recommended backend (its default is 2 GiB).
const MAX_QUOTA: u64 = 8 << 30;

/// The backend quota a member's volume holds: three quarters of it, at most
/// [`MAX_QUOTA`]. etcd then refuses writes with `NOSPACE` (an alarm, cleared by compaction
/// and defragmentation) before its volume fills, which would stop it outright; a bigger
/// volume raises the quota (the members roll with it). `quota-backend-bytes` overrides it.
fn quota(spec: &DatabaseSpec) -> u64 {
    (spec.storage_bytes / 4 * 3).min(MAX_QUOTA)
}

fn integer(spec: &DatabaseSpec, name: &str) -> Option<i64> {
    spec.parameters.iter().find(|p| p.name == name).and_then(parameter_integer)
}

fn scheme(spec: &DatabaseSpec) -> &'static str {
    if spec.tls.is_some() { "https" } else { "http" }
}

/// The cluster-wide variables of members and Jobs: who the members are, and how they
/// are reached (`SCHEME`; with TLS, etcdctl verifies them against the Database's authority).
fn cluster_env(spec: &DatabaseSpec, headless_host: &str) -> Vec<EnvVar> {
    let mut env = vec![
        env_value("HEADLESS_HOST", headless_host),
        env_value("CLUSTER_TOKEN", format!("{}-{}", spec.namespace, spec.name)),
        env_value("DATA_DIR", format!("{DATA_MOUNT}/data")),
        env_value("ETCDCTL_API", "3"),
        env_value("SCHEME", scheme(spec)),
    ];
    if let Some(tls) = &spec.tls {
        env.push(env_value("ETCDCTL_CACERT", tls.ca.clone()));
    }
    env
}

/// A member's TLS, in etcd's own variables: clients verify the member; members verify
/// each other both ways, trusting any certificate of the Database's authority (a peer
/// connects from its pod address, which no certificate names).
fn member_tls_env(tls: &TlsFiles) -> Vec<EnvVar> {
    vec![
        env_value("ETCD_CERT_FILE", tls.certificate.clone()),
        env_value("ETCD_KEY_FILE", tls.key.clone()),
        env_value("ETCD_PEER_CERT_FILE", tls.certificate.clone()),
        env_value("ETCD_PEER_KEY_FILE", tls.key.clone()),
        env_value("ETCD_PEER_TRUSTED_CA_FILE", tls.ca.clone()),
        env_value("ETCD_PEER_CLIENT_CERT_AUTH", "true"),
        env_value("ETCD_EXPERIMENTAL_PEER_SKIP_CLIENT_SAN_VERIFICATION", "true"),
    ]
}

/// A Job running `script` with etcdctl against the cluster, for member `ordinal`.
fn member_job(spec: &DatabaseSpec, ordinal: u32, script: &str) -> ScaleStep {
    let headless = format!("{}-headless.{}.svc", spec.name, spec.namespace);
    let mut env = cluster_env(spec, &headless);
    env.push(env_value("MEMBER", format!("{}-{ordinal}", spec.name)));
    let script = format!(
        "set -eu\n{CTL}\nSELF=$MEMBER; peer=\"$SCHEME://$MEMBER.$HEADLESS_HOST:{PEER_PORT}\"; \
         line=$(ctl member list | grep \", $peer, \" || true); {script}"
    );
    ScaleStep::Job(JobPlan { image: image(&spec.version), command: shell(&script), env, mounts_data: false })
}

/// etcd takes one learner at a time: an add waits (up to 10 minutes) for the one before
/// to be promoted.
const ADD: &str = "if [ -n \"$line\" ]; then echo \"$MEMBER is a member already\"; exit 0; fi; \
                   for _ in $(seq 200); do ctl member add \"$MEMBER\" --learner --peer-urls=\"$peer\" && exit 0; sleep 3; done; exit 1";
const REMOVE: &str = "if [ -z \"$line\" ]; then echo \"$MEMBER is not a member\"; \
                      else ctl member remove \"$(echo \"$line\" | cut -d, -f1)\"; fi";

/// Members a cluster of `size` needs to agree.
fn quorum(size: u32) -> u32 {
    size / 2 + 1
}

/// A value of `key` in an etcd JSON answer (the gateway writes 64-bit numbers as strings).
fn json_field<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let at = json.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = json[at..].trim_start().strip_prefix('"')?;
    Some(&rest[..rest.find('"')?])
}

/// What a member's status says: (its id, the leader it knows, the term), if it says it.
fn status(answer: &str) -> Option<(&str, &str, u64)> {
    let term = json_field(answer, "raft_term").and_then(|t| t.parse().ok()).unwrap_or(0);
    Some((json_field(answer, "member_id")?, json_field(answer, "leader")?, term))
}

impl Engine for Etcd {
    fn info() -> PluginInfo {
        PluginInfo {
            engine: "etcd".into(),
            plugin_version: env!("CARGO_PKG_VERSION").into(),
            contract_version: CONTRACT_VERSION.into(),
            supported_versions: VERSIONS.iter().map(|v| v.to_string()).collect(),
            default_version: VERSIONS[0].into(),
            default_port: CLIENT_PORT,
            capabilities: Capabilities::BACKUP
                | Capabilities::RESTORE
                | Capabilities::ELECTS_LEADER
                | Capabilities::ONLINE_UPGRADE
                | Capabilities::TLS,
        }
    }

    fn validate(spec: DatabaseSpec) -> Vec<Violation> {
        let mut out = Vec::new();
        if !VERSIONS.contains(&spec.version.as_str()) {
            out.push(violation("spec.version", format!("etcd {:?} is not supported; use {}", spec.version, VERSIONS.join(", "))));
        }
        out.extend(check_memory(&spec, 128 << 20, "etcd"));
        out.extend(CATALOG.check(&spec.parameters));
        let heartbeat = integer(&spec, "heartbeat-interval").unwrap_or(100);
        if let Some(election) = integer(&spec, "election-timeout").filter(|e| *e < 5 * heartbeat) {
            out.push(violation(
                parameter_field("election-timeout"),
                format!("{election} ms must be at least 5 heartbeat intervals ({} ms)", 5 * heartbeat),
            ));
        }
        out
    }

    fn render(spec: DatabaseSpec, cluster: ClusterContext) -> Result<Workload, String> {
        if let Some(v) = Self::validate(spec.clone()).first() {
            return Err(format!("{}: {}", v.field, v.message));
        }
        let mut env = cluster_env(&spec, &cluster.headless_host);
        env.push(env_field("POD_NAME", "metadata.name"));
        for p in &spec.parameters {
            env.push(env_value(&format!("ETCD_{}", p.name.to_uppercase().replace('-', "_")), parameter_text(p)));
        }
        if integer(&spec, "quota-backend-bytes").is_none() {
            env.push(env_value("ETCD_QUOTA_BACKEND_BYTES", quota(&spec).to_string()));
        }
        env.push(env_value("ETCD_LISTEN_METRICS_URLS", format!("http://0.0.0.0:{METRICS_PORT}")));
        if let Some(tls) = &spec.tls {
            env.extend(member_tls_env(tls));
        }
        let https = spec.tls.is_some();
        let config = &cluster.config_mount_path;
        let probe = |action, initial_delay_seconds, failure_threshold| Probe {
            action,
            initial_delay_seconds,
            period_seconds: 5,
            timeout_seconds: 3,
            failure_threshold,
        };
        Ok(Workload {
            image: image(&spec.version),
            command: vec!["sh".into(), format!("{config}/start.sh")],
            args: vec![],
            env,
            ports: vec![Port { name: "client".into(), port: CLIENT_PORT }, Port { name: "peer".into(), port: PEER_PORT }],
            // Ready while the member serves with a leader; alive while it waits to join
            // or listens to its peers.
            readiness: Some(probe(ProbeAction::HttpGet(HttpGet { path: "/health".into(), port: CLIENT_PORT, https }), 2, 2)),
            liveness: Some(probe(ProbeAction::Exec(vec!["sh".into(), format!("{config}/alive.sh")]), 10, 12)),
            config_files: vec![
                ConfigFile { name: "start.sh".into(), content: format!("{CTL}\n{START}") },
                ConfigFile { name: "alive.sh".into(), content: ALIVE.into() },
            ],
            data_mount_path: DATA_MOUNT.into(),
            credentials: vec![],
            recommended: ResourceAmounts { cpu_millis: Some(250), memory_bytes: Some(512 << 20) },
            run_as_user: UID,
            init_containers: vec![],
            member_query: Some(MemberQuery { port: CLIENT_PORT, path: "/v3/maintenance/status".into(), body: Some("{}".into()), https }),
        })
    }

    fn plan_upgrade(spec: DatabaseSpec, from: String) -> Result<UpgradePlan, String> {
        if from == spec.version {
            return Ok(UpgradePlan { steps: vec![], backup_first: false });
        }
        Err(format!("etcd {from} cannot change to {}: this plugin runs {} only", spec.version, VERSIONS.join(", ")))
    }

    fn plan_scale(spec: DatabaseSpec, from: u32, members: Vec<Member>) -> Result<Vec<ScaleStep>, String> {
        let to = spec.replicas;
        let ready: Vec<&Member> = members.iter().filter(|m| m.ready).collect();
        let ready_below = |n: u32| ready.iter().filter(|m| m.ordinal < n).count() as u32;
        let not_ready = |n: u32| {
            let names: Vec<&str> = members.iter().filter(|m| m.ordinal < n && !m.ready).map(|m| m.pod.as_str()).collect();
            if names.is_empty() { String::new() } else { format!(" ({} not ready)", names.join(", ")) }
        };
        let mut steps = Vec::new();
        if to > from {
            // Each add needs a working cluster: the members there are keep their quorum.
            if ready_below(from) < quorum(from) {
                return Err(format!(
                    "adding members needs a quorum: {} of the {from} members are ready{}, and {} are needed",
                    ready_below(from),
                    not_ready(from),
                    quorum(from)
                ));
            }
            for n in from..to {
                steps.push(member_job(&spec, n, ADD));
                steps.push(ScaleStep::Members(n + 1));
            }
        } else if to < from {
            // The members that stay must hold the smaller cluster's quorum by themselves.
            if ready_below(to) < quorum(to) {
                return Err(format!(
                    "scaling from {from} to {to} members would lose quorum: {} of the {to} members that stay are ready{}, \
                     and a cluster of {to} needs {}",
                    ready_below(to),
                    not_ready(to),
                    quorum(to)
                ));
            }
            for n in (to..from).rev() {
                steps.push(member_job(&spec, n, REMOVE));
                steps.push(ScaleStep::Members(n));
            }
        }
        steps.push(ScaleStep::Members(to));
        steps.dedup();
        Ok(steps)
    }

    fn choose_primary(_spec: DatabaseSpec, members: Vec<Member>) -> FailoverDecision {
        let said: Vec<(&Member, (&str, &str, u64))> = members.iter().filter_map(|m| Some((m, status(m.answer.as_deref()?)?))).collect();
        // A deposed leader may still believe it leads: the newest term wins.
        let leader = said.iter().filter(|(_, (id, leader, _))| id == leader).max_by_key(|(m, (_, _, term))| (*term, u32::MAX - m.ordinal));
        match leader {
            Some((m, _)) => FailoverDecision::Elected(m.pod.clone()),
            None if said.is_empty() => FailoverDecision::NoSafeMember("no member reports its status".into()),
            None => FailoverDecision::NoSafeMember(format!(
                "{} of {} members answer and none of them leads (an election is under way, or the leader does not answer)",
                said.len(),
                members.len()
            )),
        }
    }

    fn backup(spec: DatabaseSpec, location: BackupLocation) -> Result<JobPlan, String> {
        let mut env = cluster_env(&spec, &location.cluster.headless_host);
        env.extend([
            env_value("BACKUP_DIR", location.directory.clone()),
            env_value("BACKUP_NAME", location.artifact.clone()),
            env_value("ENDPOINT", format!("{}://{}:{CLIENT_PORT}", scheme(&spec), location.host)),
        ]);
        Ok(JobPlan {
            image: image(&spec.version),
            command: shell(
                "set -eu; out=\"$BACKUP_DIR/$BACKUP_NAME\"; rm -rf \"$out.partial\"; mkdir -p \"$out.partial\"; \
                 etcdctl --endpoints=\"$ENDPOINT\" --command-timeout=300s snapshot save \"$out.partial/snapshot.db\"; \
                 mv \"$out.partial\" \"$out\"",
            ),
            env,
            mounts_data: false,
        })
    }

    /// Every member restores the snapshot into its own volume as a member of a new
    /// cluster of `spec.replicas` (etcd's own way), so they start together with the data.
    fn restore(spec: DatabaseSpec, location: BackupLocation, member: u32) -> Result<Option<JobPlan>, String> {
        if location.point_in_time.is_some() {
            return Err("etcd restores snapshots as they were taken; it keeps no log to replay to a moment".into());
        }
        let peer = |i: u32| format!("{}://{}-{i}.{}:{PEER_PORT}", scheme(&spec), spec.name, location.cluster.headless_host);
        let initial: Vec<String> = (0..spec.replicas).map(|i| format!("{}-{i}={}", spec.name, peer(i))).collect();
        let mut env = cluster_env(&spec, &location.cluster.headless_host);
        env.extend([
            env_value("BACKUP_DIR", location.directory.clone()),
            env_value("BACKUP_NAME", location.artifact.clone()),
            env_value("MEMBER", format!("{}-{member}", spec.name)),
            env_value("PEER", peer(member)),
            env_value("INITIAL_CLUSTER", initial.join(",")),
        ]);
        Ok(Some(JobPlan {
            image: image(&spec.version),
            command: shell(
                "set -eu; src=\"$BACKUP_DIR/$BACKUP_NAME/snapshot.db\"; \
                 test -f \"$src\" || { echo \"backup $src not found\" >&2; exit 1; }; \
                 if [ -d \"$DATA_DIR/member\" ]; then echo \"refusing to restore over the existing data in $DATA_DIR\" >&2; exit 1; fi; \
                 tmp=\"$DATA_DIR.restore\"; rm -rf \"$tmp\"; \
                 if command -v etcdutl >/dev/null; then tool=etcdutl; else tool=etcdctl; fi; \
                 \"$tool\" snapshot restore \"$src\" --data-dir \"$tmp\" --name \"$MEMBER\" --initial-cluster \"$INITIAL_CLUSTER\" \
                   --initial-cluster-token \"$CLUSTER_TOKEN\" --initial-advertise-peer-urls \"$PEER\"; \
                 mkdir -p \"$DATA_DIR\"; chmod 700 \"$DATA_DIR\"; mv \"$tmp/member\" \"$DATA_DIR/member\"; rm -rf \"$tmp\"; \
                 echo \"restored $BACKUP_NAME into $MEMBER\"",
            ),
            env,
            mounts_data: true,
        }))
    }
}

/// No member agent: the members elect their leader and answer `member-query`.
impl Agent for Etcd {
    /// A shell in which etcdctl talks to this member (with TLS, verified against the
    /// Database's authority): etcd has no interactive client of its own.
    fn client_command(_spec: DatabaseSpec) -> Vec<String> {
        shell(&format!(
            "export ETCDCTL_ENDPOINTS=\"$SCHEME://localhost:{CLIENT_PORT}\"
echo \"etcdctl talks to this member ($ETCDCTL_ENDPOINTS); e.g. etcdctl endpoint status -w table\" >&2
exec sh"
        ))
    }
}

/// etcd serves its own series (`etcd_server_has_leader`, `etcd_mvcc_db_total_size_in_bytes`,
/// …), which the community's etcd dashboards and rules use: no exporter.
impl Metrics for Etcd {
    fn endpoint(_spec: DatabaseSpec, _cluster: ClusterContext) -> Option<MetricsEndpoint> {
        Some(MetricsEndpoint { port: METRICS_PORT, path: "/metrics".into(), exporter: None })
    }
}

export_engine!(Etcd);

#[cfg(test)]
mod tests;
