//! TLS on the real node (`spec.tls`): the operator issues each Database a certificate
//! from an authority of its own, or cert-manager does from the issuer the Database
//! names; the engines serve it, refuse plaintext, and their members replicate over it,
//! verifying each other.

use std::path::PathBuf;
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::Api;
use plugdb::crd::Database;
use plugdb_tests::cert_manager::CertManager;
use plugdb_tests::node::Nodes;
use plugdb_tests::operator::Cluster;
use plugdb_tests::scenario::{Client, Engine, WAIT, database, is_running, pod_ip};
use serde_json::json;

const NAME: &str = "secure";

/// Runs `program ARGS` inside the node's namespace.
async fn run(program: impl AsRef<str>, args: Vec<String>, env: Vec<(&'static str, String)>) -> Output {
    let mut command = Nodes::command(program.as_ref());
    command.args(args).envs(env).stdin(std::process::Stdio::null());
    tokio::task::spawn_blocking(move || command.output()).await.expect("join").expect("the client runs")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout).trim(), String::from_utf8_lossy(&out.stderr).trim())
}

/// Writes `pem` to a file of the scenario's own and returns its path.
fn pem_file(ns: &str, name: &str, pem: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("plugdb-{ns}-{name}.pem"));
    std::fs::write(&path, pem).expect("write the PEM file");
    path
}

/// A TLS handshake with `ip:port` (after the engine's STARTTLS, if any) that verifies
/// the server's certificate against `ca` and for `name`.
async fn handshake(ip: &str, port: u16, starttls: Option<&str>, ca: &std::path::Path, name: &str) -> Output {
    let mut args: Vec<String> = vec!["s_client".into(), "-connect".into(), format!("{ip}:{port}")];
    if let Some(protocol) = starttls {
        args.extend(["-starttls".into(), protocol.into()]);
    }
    args.extend(["-CAfile".into(), ca.display().to_string(), "-verify_hostname".into(), name.into(), "-verify_return_error".into()]);
    run("openssl", args, vec![]).await
}

/// The Database's certificate Secret and its authority's certificate in a file, and a
/// stranger authority's certificate in another.
async fn authorities(cluster: &Cluster, ns: &str) -> (PathBuf, PathBuf) {
    let secret = Api::<Secret>::namespaced(cluster.client.clone(), ns).get(&format!("{NAME}-tls")).await.expect("the TLS Secret");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let data = secret.data.expect("data");
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        assert!(data.contains_key(key), "{key} in the TLS Secret");
    }
    let stranger = plugdb::tls::new_authority(NAME, ns, chrono::Utc::now()).expect("another authority");
    (pem_file(ns, "ca", &data["ca.crt"].0), pem_file(ns, "stranger", stranger.certificate.as_bytes()))
}

/// Asks until `check` holds, for up to `WAIT`.
async fn eventually<F>(what: &str, mut ask: impl FnMut() -> F, check: impl Fn(&Output) -> bool) -> Output
where
    F: std::future::Future<Output = Output>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        let out = ask().await;
        if check(&out) {
            return out;
        }
        assert!(Instant::now() < deadline, "{what}: last {}", text(&out));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Who issues the Database's certificate.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Issuer {
    /// The operator, from the Database's own authority.
    Own,
    /// cert-manager (started for the scenario), from a CA `Issuer` named in `spec.tls.issuerRef`.
    CertManager,
}

/// A two-member Database with `tls.enabled`: the server presents a certificate of the
/// issuer's authority for its Service name (and not of another authority), plaintext
/// is refused, a client that verifies the server writes, and the replica follows over
/// TLS, having verified the primary.
pub async fn sql_engine_serves_tls(cluster: Arc<Cluster>, engine: Engine, version: &str, issuer: Issuer) {
    let ns = match issuer {
        Issuer::Own => format!("{}-tls", engine.name()),
        Issuer::CertManager => format!("{}-cert-manager", engine.name()),
    };
    let (tls, cert_manager) = match issuer {
        Issuer::Own => (json!({"enabled": true}), None),
        Issuer::CertManager => {
            let namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).expect("a Namespace");
            Api::<Namespace>::all(cluster.client.clone()).create(&Default::default(), &namespace).await.expect("the namespace");
            let cert_manager = CertManager::start(&cluster.client, cluster.backing.kubeconfig()).await.expect("cert-manager");
            let ca = cert_manager.ca_issuer(&cluster.client, &ns, "corp").await.expect("a CA Issuer");
            (json!({"enabled": true, "issuerRef": {"name": "corp"}}), Some((cert_manager, ca)))
        }
    };
    cluster.apply_database(&ns, database(NAME, engine, version, 2, json!({"tls": tls}))).await.expect("apply");
    cluster.wait_database(&ns, NAME, "2 members Ready over TLS", WAIT, |d| is_running(d, 2)).await.expect("running");
    let (ca, stranger) = authorities(&cluster, &ns).await;
    if let Some((_, issuer_ca)) = &cert_manager {
        assert_eq!(&std::fs::read(&ca).expect("read"), issuer_ca, "the members' ca.crt is the cert-manager Issuer's CA");
    }
    let client = Client::new(&cluster, engine, &ns, NAME).await;
    let ip = client.service_ip(NAME).await;
    let service = format!("{NAME}.{ns}.svc");
    let (port, starttls) = (engine.port(), engine.name());

    let verified = handshake(&ip, port, Some(starttls), &ca, &service).await;
    assert!(verified.status.success(), "the server's certificate verifies for {service}: {}", text(&verified));
    let foreign = handshake(&ip, port, Some(starttls), &stranger, &service).await;
    assert!(!foreign.status.success(), "another authority's clients do not trust it");
    let misnamed = handshake(&ip, port, Some(starttls), &ca, &format!("{NAME}.elsewhere.svc")).await;
    assert!(!misnamed.status.success(), "it names this Database only");

    let secret = Api::<Secret>::namespaced(cluster.client.clone(), &ns).get(&format!("{NAME}-credentials")).await.expect("credentials");
    let password = String::from_utf8(secret.data.expect("data")[engine.password_key()].0.clone()).expect("text");
    let members = client.members().await;
    let replica = pod_ip(&members[1]);
    // The engine's exporter logs in over the member's loopback, which TLS covers too.
    let up = match engine {
        Engine::Postgres => "pg_up 1",
        Engine::Mysql => "mysql_up 1",
    };
    for pod in &members {
        plugdb_tests::scenario::engine_series(pod, up).await;
    }
    match engine {
        Engine::Postgres => {
            let psql = |conninfo: String, password: &str, sql: &str| {
                let args = vec![conninfo, "-XAtq".into(), "-v".into(), "ON_ERROR_STOP=1".into(), "-c".into(), sql.into()];
                run("psql", args, vec![("PGPASSWORD", password.to_string())])
            };
            let (_, app) = application(&cluster, &ns).await;
            let plain = psql(format!("host={ip} user=app dbname=app sslmode=disable connect_timeout=5"), &app, "SELECT 1").await;
            assert!(!plain.status.success(), "plaintext is refused: {}", text(&plain));
            let verifying = |user: &str| {
                format!(
                    "host={service} hostaddr={ip} user={user} dbname=app sslmode=verify-full sslrootcert={} connect_timeout=5",
                    ca.display()
                )
            };
            // The superuser's password, which the credentials Secret holds, is no login
            // over the network: the member's own agent alone logs in with it.
            let superuser = psql(verifying("postgres"), &password, "SELECT 1").await;
            assert!(
                !superuser.status.success() && text(&superuser).contains("pg_hba.conf rejects connection"),
                "the superuser over the network is refused: {}",
                text(&superuser)
            );
            let secure = verifying("app");
            let wrote = psql(
                secure.clone(),
                &app,
                "CREATE TABLE sealed (id int PRIMARY KEY); INSERT INTO sealed VALUES (7); \
                 SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            )
            .await;
            assert_eq!(text(&wrote), "t", "a verifying client writes over TLS");
            let replication = "SELECT count(*) FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid) WHERE s.ssl";
            client.eventually_administered(&members[0], replication, Duration::from_secs(60), |o| o == "1").await;
            let on_replica = format!("host={replica} user=app dbname=app sslmode=require connect_timeout=5");
            eventually("the row reaches the replica", || psql(on_replica.clone(), &app, "SELECT id FROM sealed"), |o| text(o) == "7").await;

            // The application's login: its own database, and not the server's key.
            let (login, app) = application(&cluster, &ns).await;
            assert_eq!(login["uri"], format!("postgresql://app:{}@{service}:5432/app", login["password"]));
            let as_app = |sql: &str| {
                let conninfo = format!(
                    "host={} hostaddr={ip} port={} user={} dbname={} sslmode=verify-full sslrootcert={} connect_timeout=5",
                    login["host"],
                    login["port"],
                    login["username"],
                    login["dbname"],
                    ca.display()
                );
                let args = vec![conninfo, "-XAtq".into(), "-v".into(), "ON_ERROR_STOP=1".into(), "-c".into(), sql.to_string()];
                run("psql", args, vec![("PGPASSWORD", app.clone())])
            };
            let wrote = as_app("CREATE TABLE mine (id int); INSERT INTO mine VALUES (1); SELECT count(*) FROM mine").await;
            assert_eq!(text(&wrote), "1", "the application writes its database");
            let key = as_app("SELECT pg_read_file(current_setting('ssl_key_file'))").await;
            assert!(!key.status.success() && text(&key).contains("permission denied"), "the application reads no key: {}", text(&key));
        }
        Engine::Mysql => {
            let (_, app) = application(&cluster, &ns).await;
            let mariadb = |host: String, (user, password): (&str, &str), tls: bool, sql: &str| {
                let mut args = vec!["-h".into(), host, format!("-u{user}"), "--connect-timeout=5".into(), "-N".into(), "-B".into()];
                args.push(if tls { format!("--ssl-ca={}", ca.display()) } else { "--skip-ssl".into() });
                args.extend(["app".into(), "-e".into(), sql.into()]);
                run("mariadb", args, vec![("MYSQL_PWD", password.to_string())])
            };
            let plain = mariadb(ip.clone(), ("app", &app), false, "SELECT 1").await;
            assert!(!plain.status.success(), "plaintext is refused: {}", text(&plain));
            // Root's password, which the credentials Secret holds, is no login over the
            // network: the member's own agent alone logs in with it.
            let root = mariadb(ip.clone(), ("root", &password), true, "SELECT 1").await;
            assert!(
                !root.status.success() && text(&root).contains("Access denied for user 'root'"),
                "root over the network: {}",
                text(&root)
            );
            let wrote = mariadb(
                ip.clone(),
                ("app", &app),
                true,
                "CREATE TABLE sealed (id int PRIMARY KEY); INSERT INTO sealed VALUES (7); SHOW SESSION STATUS LIKE 'Ssl_version'",
            )
            .await;
            assert!(wrote.status.success() && text(&wrote).contains("TLSv1."), "written over TLS: {}", text(&wrote));
            // How the replica follows is the administrator's to see, inside it.
            let status = client
                .eventually_administered(&members[1], "SHOW SLAVE STATUS\\G", Duration::from_secs(60), |o| {
                    o.contains("Slave_IO_Running: Yes")
                })
                .await;
            assert!(status.contains("Master_SSL_Allowed: Yes"), "{status}");
            assert!(status.contains("Master_SSL_Verify_Server_Cert: Yes"), "the replica verified the primary: {status}");
            let replica = replica.clone();
            eventually(
                "the row reaches the replica",
                || mariadb(replica.clone(), ("app", &app), true, "SELECT id FROM sealed"),
                |o| text(o) == "7",
            )
            .await;

            // The application's login: its own database, and not the server's key.
            let (login, app) = application(&cluster, &ns).await;
            assert_eq!(login["uri"], format!("mysql://app:{}@{service}:3306/app", login["password"]));
            let as_app = |sql: &str| {
                let args = vec![
                    "-h".into(),
                    ip.clone(),
                    format!("-u{}", login["username"]),
                    format!("--ssl-ca={}", ca.display()),
                    "-N".into(),
                    "-B".into(),
                    login["dbname"].clone(),
                    "-e".into(),
                    sql.to_string(),
                ];
                run("mariadb", args, vec![("MYSQL_PWD", app.clone())])
            };
            let wrote = as_app("CREATE TABLE mine (id int); INSERT INTO mine VALUES (1); SELECT count(*) FROM mine").await;
            assert_eq!(text(&wrote), "1", "the application writes its database: {}", String::from_utf8_lossy(&wrote.stderr));
            let key = as_app("SELECT LOAD_FILE(@@ssl_key) IS NULL").await;
            assert_eq!(text(&key), "1", "the application reads no key");
        }
    }
}

/// Secret `<NAME>-app` as text, and its password.
async fn application(cluster: &Cluster, ns: &str) -> (std::collections::BTreeMap<String, String>, String) {
    let secret = Api::<Secret>::namespaced(cluster.client.clone(), ns).get(&format!("{NAME}-app")).await.expect("the application's login");
    let login: std::collections::BTreeMap<String, String> =
        secret.data.expect("data").into_iter().map(|(k, v)| (k, String::from_utf8(v.0).expect("text"))).collect();
    let password = login["password"].clone();
    (login, password)
}

/// Three etcd members with `tls.enabled`: they joined one another over HTTPS (the
/// scale plan's Jobs and the members' own etcdctl verify them), the operator asks
/// them who leads over HTTPS and follows the leader, clients must use TLS, and each
/// member's certificate verifies for its own name.
pub async fn etcd_serves_tls(cluster: Arc<Cluster>) {
    let ns = "etcd-tls";
    let manifest = json!({
        "metadata": {"name": NAME},
        "spec": {
            "engine": "etcd", "version": "3.5", "replicas": 3, "storage": "1Gi",
            "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
            "tls": {"enabled": true},
        },
    });
    cluster.apply_database(ns, manifest).await.expect("apply");
    let db = cluster.wait_database(ns, NAME, "3 members Ready over TLS", WAIT, |d| is_running(d, 3)).await.expect("running");
    let (ca, stranger) = authorities(&cluster, ns).await;
    let selector = format!("app.kubernetes.io/instance={NAME},app.kubernetes.io/managed-by=plugdb");
    let mut client = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(cluster.client.clone(), ns)
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .expect("pods")
        .items;
    client.retain(|p| p.metadata.owner_references.iter().flatten().any(|o| o.kind == "StatefulSet"));
    let etcdctl = |ip: String, scheme: &'static str, args: Vec<&'static str>| {
        let mut all = vec![format!("--endpoints={scheme}://{ip}:2379"), "--command-timeout=5s".into(), "--dial-timeout=2s".into()];
        // The handshakes below verify the certificates for the members' names; etcdctl
        // reaches them by address, which no certificate names.
        if scheme == "https" {
            all.extend([format!("--cacert={}", ca.display()), "--insecure-skip-tls-verify".into()]);
        }
        all.extend(args.into_iter().map(String::from));
        run(crate::consensus::etcdctl_binary().display().to_string(), all, vec![])
    };

    for (i, pod) in client.iter().enumerate() {
        let name = format!("{NAME}-{i}.{NAME}-headless.{ns}.svc");
        let verified = handshake(&pod_ip(pod), 2379, None, &ca, &name).await;
        assert!(verified.status.success(), "{name}'s certificate verifies: {}", text(&verified));
        assert!(!handshake(&pod_ip(pod), 2379, None, &stranger, &name).await.status.success(), "not for another authority");
    }
    let first = pod_ip(&client[0]);
    let plain = etcdctl(first.clone(), "http", vec!["get", "k"]).await;
    assert!(!plain.status.success(), "plaintext clients are refused: {}", text(&plain));
    let list = etcdctl(first.clone(), "https", vec!["member", "list"]).await;
    let list = text(&list);
    let peers: Vec<&str> = list.lines().collect();
    assert_eq!(peers.len(), 3, "{list}");
    assert!(
        peers.iter().all(|l| l.contains(", started, ") && l.contains(", https://") && l.ends_with("false")),
        "voters over HTTPS: {list}"
    );
    let put = etcdctl(first.clone(), "https", vec!["put", "sealed", "7"]).await;
    assert!(put.status.success(), "{}", text(&put));
    for pod in &client {
        let got = eventually(
            "the key on every member",
            || etcdctl(pod_ip(pod), "https", vec!["get", "--consistency=s", "sealed", "--print-value-only"]),
            |o| text(o) == "7",
        )
        .await;
        assert!(got.status.success());
    }

    // The operator asked over HTTPS: status.primary is the member etcd says leads.
    let mut leader = None;
    for pod in &client {
        let status = etcdctl(pod_ip(pod), "https", vec!["endpoint", "status", "-w", "json"]).await;
        let said: serde_json::Value = serde_json::from_str(&String::from_utf8_lossy(&status.stdout)).expect("json");
        if said[0]["Status"]["header"]["member_id"] == said[0]["Status"]["leader"] {
            leader = pod.metadata.name.clone();
        }
    }
    let leader = leader.expect("a member leads");
    assert!(db.status.is_some());
    cluster
        .wait_database(ns, NAME, "status.primary names the leader", WAIT, |d: &Database| {
            d.status.as_ref().and_then(|s| s.primary.as_deref()) == Some(leader.as_str())
        })
        .await
        .expect("the operator follows the leader over HTTPS");
}
