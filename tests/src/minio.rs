//! A real S3 server for the backup tests: MinIO, built once from its Go module by
//! `scripts/minio.sh`, started on loopback or inside the test node's network namespace
//! (where pods reach it at the hub's address), with its buckets made as directories of
//! its data directory before it starts. Stopped by the PID it was started with.
//!
//! MinIO refuses every write once the drive under its data directory is nearly full,
//! judged on the whole drive: on a shared disk with little room left, uploads fail
//! however small. Its data directory is therefore a tmpfs of its own ([`DATA_SIZE`]),
//! unmounted when the server is dropped (and by the node's teardown on the node).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use plugdb::object_storage::Bucket;

use crate::node::{HUB_ADDRESS, Nodes};

/// The server's access key.
pub const ACCESS_KEY: &str = "plugdb-test";
/// The server's secret key.
pub const SECRET_KEY: &str = "plugdb-test-secret-key";

/// The size of the tmpfs holding a server's data: room for every backup and archived
/// log a test writes. Memory is spent only for what is written.
pub const DATA_SIZE: &str = "4g";

/// A running MinIO server.
pub struct Minio {
    /// `http://ADDRESS:PORT`.
    pub endpoint: String,
    /// Where it keeps its buckets (a bucket is a directory).
    pub data: PathBuf,
    /// PEM of the CA that signed its certificate, when it serves HTTPS.
    pub ca_pem: Option<Vec<u8>>,
    child: Child,
    // Dropped in this order: the server stops, its tmpfs is unmounted, the directory goes.
    _mount: Tmpfs,
    _dir: Option<tempfile::TempDir>,
}

/// A tmpfs mounted at a directory, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path) -> Result<Self> {
        std::fs::create_dir_all(at)?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={DATA_SIZE},mode=0700"), "plugdb-minio"])
            .arg(at)
            .output()
            .context("running mount")?;
        if !out.status.success() {
            bail!("mounting a tmpfs at {} for MinIO's data failed: {}", at.display(), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(Self(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

fn binary() -> Result<PathBuf> {
    crate::cached_build("minio.sh", "MinIO")
}

/// Adds the server's arguments and settings to `command` (MinIO's own command line).
fn server(command: &mut Command, data: &Path, host: &str, port: u16) {
    command
        .args(["server", "--quiet", "--address", &format!("{host}:{port}"), "--console-address", &format!("{host}:0")])
        .arg(data)
        .env("MINIO_ROOT_USER", ACCESS_KEY)
        .env("MINIO_ROOT_PASSWORD", SECRET_KEY)
        .env("MINIO_BROWSER", "off")
        .env("MINIO_UPDATE", "off");
}

impl Minio {
    /// A server on a free loopback port holding `buckets`, for tests without a node.
    pub async fn on_loopback(buckets: &[&str]) -> Result<Self> {
        Self::loopback(buckets, false).await
    }

    /// The same over HTTPS, with a certificate for 127.0.0.1 signed by a CA made for
    /// it (in [`Minio::ca_pem`]).
    pub async fn on_loopback_tls(buckets: &[&str]) -> Result<Self> {
        Self::loopback(buckets, true).await
    }

    async fn loopback(buckets: &[&str], tls: bool) -> Result<Self> {
        let minio = binary()?;
        let dir = tempfile::tempdir()?;
        let data = dir.path().join("data");
        let mount = Tmpfs::mount(&data)?;
        make_buckets(&data, buckets)?;
        let port = crate::control_plane::free_port()?;
        let log = std::fs::File::create(dir.path().join("minio.log"))?;
        let mut command = Command::new(&minio);
        server(&mut command, &data, "127.0.0.1", port);
        let ca_pem = if tls {
            let certs = dir.path().join("certs");
            let ca = make_certificates(&certs, "127.0.0.1")?;
            command.arg("--certs-dir").arg(&certs);
            Some(ca)
        } else {
            None
        };
        let child = command.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).spawn().context("starting minio")?;
        let scheme = if tls { "https" } else { "http" };
        let server = Self { endpoint: format!("{scheme}://127.0.0.1:{port}"), data, ca_pem, child, _mount: mount, _dir: Some(dir) };
        server.wait_live(&server.log_at()).await?;
        Ok(server)
    }

    /// A server inside the hub's network namespace at its address and `port`,
    /// holding `buckets`: pods reach it there, and so does this process (over the veth).
    /// Recorded with the node's daemons, so its teardown stops it too.
    pub async fn on_node(node: &Nodes, port: u16, buckets: &[&str]) -> Result<Self> {
        let minio = binary()?;
        let data = node.dir().join(format!("minio-{port}"));
        let _ = std::fs::remove_dir_all(&data);
        let mount = Tmpfs::mount(&data)?;
        make_buckets(&data, buckets)?;
        let mut command = Nodes::hub_command(&minio.to_string_lossy());
        server(&mut command, &data, HUB_ADDRESS, port);
        let name = format!("minio-{port}");
        let child = node.spawn_recorded(&name, &mut command)?;
        let server = Self { endpoint: format!("http://{HUB_ADDRESS}:{port}"), data, ca_pem: None, child, _mount: mount, _dir: None };
        server.wait_live(&node.dir().join(format!("{name}.log"))).await?;
        Ok(server)
    }

    fn log_at(&self) -> PathBuf {
        self.data.parent().map(|d| d.join("minio.log")).unwrap_or_default()
    }

    async fn wait_live(&self, log: &Path) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let store = self.bucket(ACCESS_KEY, SECRET_KEY, "plugdb-probe").store()?;
        loop {
            // Any answer from the S3 API (here: no such bucket) means it serves.
            match plugdb::object_storage::list(store.as_ref(), &"x".into()).await {
                Err(e) if !e.to_string().contains("NoSuchBucket") && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) if !e.to_string().contains("NoSuchBucket") => {
                    bail!("minio did not answer within 60 s ({e}); its log: {}", std::fs::read_to_string(log).unwrap_or_default())
                }
                _ => return Ok(()),
            }
        }
    }

    /// How a client reaches `bucket` with this key.
    pub fn bucket(&self, access_key: &str, secret_key: &str, bucket: &str) -> Bucket {
        Bucket {
            endpoint: self.endpoint.clone(),
            bucket: bucket.into(),
            region: "us-east-1".into(),
            access_key_id: access_key.into(),
            secret_access_key: secret_key.into(),
            ca_pem: self.ca_pem.clone(),
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// A CA and a certificate for the IP address `ip` signed by it, in MinIO's layout
/// (`public.crt`, `private.key` in `dir`); returns the CA's PEM.
fn make_certificates(dir: &Path, ip: &str) -> Result<Vec<u8>> {
    std::fs::create_dir_all(dir)?;
    let openssl = |args: &[&str]| -> Result<()> {
        let out = Command::new("openssl").args(args).current_dir(dir).stdin(Stdio::null()).output().context("running openssl")?;
        if !out.status.success() {
            bail!("openssl {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(&[&["req", "-x509"][..], &ec, &["-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=plugdb test CA"]].concat())?;
    openssl(&[&["req"][..], &ec, &["-keyout", "private.key", "-out", "server.csr", "-subj", &format!("/CN={ip}")]].concat())?;
    std::fs::write(dir.join("san.ext"), format!("subjectAltName=IP:{ip}\n"))?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "public.crt",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ])?;
    let ca = std::fs::read(dir.join("ca.crt"))?;
    for scratch in ["ca.key", "ca.crt", "ca.srl", "server.csr", "san.ext"] {
        let _ = std::fs::remove_file(dir.join(scratch));
    }
    Ok(ca)
}

fn make_buckets(data: &Path, buckets: &[&str]) -> Result<()> {
    for bucket in buckets {
        std::fs::create_dir_all(data.join(bucket))?;
    }
    Ok(())
}

impl Drop for Minio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
