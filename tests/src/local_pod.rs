//! Runs what an engine plugin rendered as a local process, the way a kubelet would
//! run the container: the plugin's command and environment, secrets resolved from a
//! map, the config files and data volume "mounted" by rewriting their paths into a
//! temporary directory, and a loopback address of its own (127.77.x.y) so every
//! member can use the engine's standard port. Servers run as an unprivileged user.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use plugdb::plugin::{EnvSource, EnvVar, JobPlan, ProbeAction, Workload};

/// The unprivileged user servers run as when the tests run as root.
pub const TEST_USER: &str = "plugdb-test";

static NEXT_ADDRESS: AtomicU32 = AtomicU32::new(1);

/// A fresh loopback address for one member.
pub fn loopback_address() -> String {
    let n = NEXT_ADDRESS.fetch_add(1, Ordering::Relaxed);
    format!("127.77.{}.{}", std::process::id() % 250 + 1, n % 250 + 1)
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

/// uid and gid of [`TEST_USER`].
fn test_user_ids() -> Result<(u32, u32)> {
    let id = |flag: &str| -> Result<u32> {
        let out = Command::new("id").args([flag, TEST_USER]).output()?;
        if !out.status.success() {
            bail!("user {TEST_USER} does not exist; scripts/install-deps.sh creates it (useradd --system {TEST_USER})");
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
    };
    Ok((id("-u")?, id("-g")?))
}

/// A member's sandbox: its directories and the environment every command in it sees.
pub struct LocalPod {
    /// Pod name, e.g. `orders-0`.
    pub name: String,
    /// The member's own loopback address.
    pub address: String,
    dir: tempfile::TempDir,
    env: BTreeMap<String, String>,
    remaps: Vec<(String, PathBuf)>,
    server: Option<Child>,
}

impl LocalPod {
    /// A member named `name` whose config is mounted at `config_mount` and data at `data_mount`.
    pub fn new(name: &str, config_mount: &str, data_mount: &str) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("plugdb-pod-").tempdir()?;
        for sub in ["config", "data", "run", "backups", "archive", "credentials"] {
            std::fs::create_dir_all(dir.path().join(sub))?;
        }
        // The credentials first: the config mount's path is a prefix of theirs.
        let remaps = vec![
            (plugdb::names::CREDENTIALS_MOUNT.to_string(), dir.path().join("credentials")),
            (config_mount.to_string(), dir.path().join("config")),
            (data_mount.to_string(), dir.path().join("data")),
            (plugdb::names::ARCHIVE_MOUNT.to_string(), dir.path().join("archive")),
        ];
        let pod = Self { name: name.into(), address: loopback_address(), dir, env: BTreeMap::new(), remaps, server: None };
        pod.chown_all()?;
        Ok(pod)
    }

    /// The temporary directory standing in for the pod's volumes.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Where the engine's unix sockets go.
    pub fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// Stands in for the archive volume the member shares with the archiver.
    pub fn archive_dir(&self) -> PathBuf {
        self.dir.path().join("archive")
    }

    /// A shared directory for backups (stands in for the backup volume).
    pub fn backup_dir(&self) -> PathBuf {
        self.dir.path().join("backups")
    }

    fn chown_all(&self) -> Result<()> {
        if !is_root() {
            return Ok(());
        }
        let (uid, gid) = test_user_ids()?;
        let status = Command::new("chown").args(["-R", &format!("{uid}:{gid}")]).arg(self.dir.path()).status()?;
        if !status.success() {
            bail!("chown of {} failed", self.dir.path().display());
        }
        Ok(())
    }

    fn remap(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (from, to) in &self.remaps {
            out = out.replace(from.as_str(), &to.to_string_lossy());
        }
        out
    }

    /// Stands in for the credentials Secret the host mounts ([`plugdb::names::CREDENTIALS_MOUNT`]):
    /// each of `secrets` a file of its own, readable by the user the commands run as alone.
    fn mount_credentials(&self, secrets: &BTreeMap<String, String>) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.dir.path().join("credentials");
        for (key, value) in secrets {
            let file = dir.join(key);
            std::fs::write(&file, value)?;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o400))?;
        }
        self.chown_all()
    }

    /// Sets the environment from the plugin's variables, resolving secrets from `secrets`
    /// (also mounted as files) and Downward API fields from the pod, then `extra` on top
    /// (test-only plumbing such as PATH or socket directories).
    pub fn set_env(&mut self, env: &[EnvVar], secrets: &BTreeMap<String, String>, extra: &[(&str, String)]) -> Result<()> {
        self.mount_credentials(secrets)?;
        for var in env {
            let value = match &var.source {
                EnvSource::Value(v) => self.remap(v),
                EnvSource::Secret(s) => secrets.get(&s.key).cloned().with_context(|| format!("secret key {} not provided", s.key))?,
                EnvSource::Field(f) if f == "metadata.name" => self.name.clone(),
                EnvSource::Field(f) if f == "status.podIP" => self.address.clone(),
                EnvSource::Field(f) => bail!("field {f} not available locally"),
            };
            self.env.insert(var.name.clone(), value);
        }
        for (k, v) in extra {
            self.env.insert(k.to_string(), v.clone());
        }
        Ok(())
    }

    fn command(&self, argv: &[String]) -> Command {
        let argv: Vec<String> = argv.iter().map(|a| self.remap(a)).collect();
        let mut cmd = if is_root() {
            let mut c = Command::new("setpriv");
            c.args(["--reuid", TEST_USER, "--regid", TEST_USER, "--clear-groups", "--"]).args(&argv);
            c
        } else {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        };
        cmd.env_clear().envs(&self.env).env("HOME", self.dir.path()).current_dir(self.dir.path()).stdin(Stdio::null());
        cmd
    }

    /// Writes the workload's config files into the config "mount", read-only as a
    /// ConfigMap volume serves them (mode 0444).
    pub fn write_config(&self, workload: &Workload) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        for file in &workload.config_files {
            let path = self.dir.path().join("config").join(&file.name);
            let _ = std::fs::remove_file(&path);
            std::fs::write(&path, &file.content)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444))?;
        }
        self.chown_all()
    }

    /// Starts the workload's command with `args` appended, logging to `server.log`.
    pub fn start(&mut self, workload: &Workload, args: &[String]) -> Result<()> {
        self.write_config(workload)?;
        let mut argv: Vec<String> = workload.command.iter().chain(&workload.args).cloned().collect();
        argv.extend(args.iter().cloned());
        let log = std::fs::File::create(self.dir.path().join("server.log"))?;
        // The server's own, as runc gives a container's standard streams to its user: a
        // server that opens them again by path (`/proc/self/fd/2`) may.
        self.chown_all()?;
        let child = self.command(&argv).stdout(log.try_clone()?).stderr(log).spawn().with_context(|| format!("starting {argv:?}"))?;
        self.server = Some(child);
        Ok(())
    }

    /// What the member agent answers for this member: the plugin's status `command`, run in
    /// the pod's environment, where `localhost` (the pod itself, in a cluster) is the
    /// member's own loopback address.
    pub fn agent_status(&self, command: &[String]) -> Result<plugdb::agent::Status, String> {
        let argv: Vec<String> = command.iter().map(|a| a.replace("localhost", &self.address)).collect();
        let out = self.agent_command(&argv).output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("the status command failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        plugdb::agent::parse(&String::from_utf8_lossy(&out.stdout))
    }

    /// Waits until this member's agent, running `command`, says `position` (a replica
    /// reaching what a fenced primary said it wrote last), for at most `within`.
    pub fn reaches(&self, command: &[String], position: &str, within: std::time::Duration) -> Result<(), String> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let said = self.agent_status(command)?;
            if said.position == position {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(format!("still at {} after {within:?}, not {position}", said.position));
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// Runs a plugin's fence command as the member agent would.
    pub fn agent_fence(&self, command: &[String]) -> Result<(), String> {
        self.agent_fence_with(command, &[])
    }

    /// [`Self::agent_fence`] with `extra` variables on top of the pod's (a PATH that puts a
    /// stand-in before an engine's client, say).
    pub fn agent_fence_with(&self, command: &[String], extra: &[(&str, String)]) -> Result<(), String> {
        self.agent_run("fence", command, extra)
    }

    /// Runs a plugin's promote command as the member agent would.
    pub fn agent_promote(&self, command: &[String]) -> Result<(), String> {
        self.agent_run("promote", command, &[])
    }

    /// Runs the plugin's `what` command as the member agent would, with `extra` variables.
    pub fn agent_run(&self, what: &str, command: &[String], extra: &[(&str, String)]) -> Result<(), String> {
        let argv: Vec<String> = command.iter().map(|a| a.replace("localhost", &self.address)).collect();
        let out = self.agent_command(&argv).envs(extra.iter().map(|(k, v)| (*k, v))).output().map_err(|e| e.to_string())?;
        match out.status.success() {
            true => Ok(()),
            false => Err(format!("the {what} command failed: {}", String::from_utf8_lossy(&out.stderr))),
        }
    }

    /// Runs a plugin's follow command as the member agent would, with the address of the
    /// member to follow (`PLUGDB_PRIMARY_HOST`).
    pub fn agent_follow(&self, command: &[String], primary: &str) -> Result<(), String> {
        let argv: Vec<String> = command.iter().map(|a| a.replace("localhost", &self.address)).collect();
        let out = self.agent_command(&argv).env(plugdb::agent::PRIMARY_HOST_ENV, primary).output().map_err(|e| e.to_string())?;
        match out.status.success() {
            true => Ok(()),
            false => Err(format!("the follow command failed: {}", String::from_utf8_lossy(&out.stderr))),
        }
    }

    /// `argv` as the member agent runs it: in the pod's environment, with the path of the
    /// fence's mark in `PLUGDB_FENCED` (its directory the agent's own).
    fn agent_command(&self, argv: &[String]) -> Command {
        let mut cmd = self.command(argv);
        cmd.env("PLUGDB_FENCED", self.dir.path().join("agent-fenced"));
        // As the agent runs it: in a process group of its own, which it ends whole.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd
    }

    /// Runs `argv` in the pod's environment to completion.
    pub fn exec(&self, argv: &[String]) -> Result<Output> {
        self.command(argv).output().with_context(|| format!("running {argv:?}"))
    }

    /// Runs a plugin Job plan in this pod's sandbox (its data "mount" when the plan asks
    /// for it), with `extra` environment; fails with the Job's output when it fails.
    pub fn run_job(&self, job: &JobPlan, secrets: &BTreeMap<String, String>, extra: &[(&str, String)]) -> Result<String> {
        self.mount_credentials(secrets)?;
        let mut env = BTreeMap::new();
        for var in &job.env {
            let value = match &var.source {
                EnvSource::Value(v) => self.remap(v),
                EnvSource::Secret(s) => secrets.get(&s.key).cloned().with_context(|| format!("secret key {} not provided", s.key))?,
                EnvSource::Field(f) => bail!("field {f} not available to jobs"),
            };
            env.insert(var.name.clone(), value);
        }
        for (k, v) in extra {
            env.insert(k.to_string(), v.clone());
        }
        let mut cmd = self.command(&job.command);
        cmd.env_clear().envs(&env).env("HOME", self.dir.path());
        let out = cmd.output()?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if !out.status.success() {
            bail!("job {:?} failed ({}): {text}", job.command, out.status);
        }
        Ok(text)
    }

    /// Runs the readiness probe until it passes or `timeout` ends. It runs as the member
    /// agent runs it (in a member with an agent, its exec probes are the agent's), where
    /// `localhost` is the member's own loopback address.
    pub fn wait_ready(&mut self, workload: &Workload, timeout: Duration) -> Result<()> {
        let probe = workload.readiness.as_ref().context("the workload has no readiness probe")?;
        let ProbeAction::Exec(argv) = &probe.action else { bail!("only exec probes run locally") };
        let argv: Vec<String> = argv.iter().map(|a| a.replace("localhost", &self.address)).collect();
        let deadline = Instant::now() + timeout;
        loop {
            let probe = self.exec(&argv)?;
            if probe.status.success() {
                return Ok(());
            }
            if let Some(server) = self.server.as_mut()
                && let Some(status) = server.try_wait()?
            {
                bail!("{} exited ({status}) before it was ready:\n{}", self.name, self.log());
            }
            if Instant::now() > deadline {
                let said = format!("{}{}", String::from_utf8_lossy(&probe.stdout), String::from_utf8_lossy(&probe.stderr));
                bail!("{} not ready within {timeout:?}; the probe said: {said}\nlog:\n{}", self.name, self.log());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Stops the server (SIGTERM, then SIGKILL after 20 s) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.server.take() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for LocalPod {
    fn drop(&mut self) {
        self.stop();
    }
}
