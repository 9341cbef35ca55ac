//! Processes of a test cluster: a workspace binary run as a restartable
//! [`Service`] that is ready once its unix socket accepts connections, and
//! external-provisioner ([`csi_provisioner`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tonic::transport::Channel;

use crate::grpc::unix_channel;
use crate::kube::KubeCluster;
use crate::local::carina::tool_path;
use crate::process::{ChildGuard, tail, workspace_binary};
use crate::unique;

/// How long a process may take to open its socket.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a stopped process may take to exit before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(20);

/// A binary of this workspace run as a service that is ready once its
/// unix socket accepts connections; it can be stopped, killed, paused and
/// started again with the same arguments (and the same log, appended).
#[derive(Debug)]
pub struct Service {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    socket: PathBuf,
    log: PathBuf,
    child: Option<ChildGuard>,
}

impl Service {
    /// Starts workspace binary `binary` as `name` and waits (at most
    /// [`START_TIMEOUT`]) until `socket` accepts a connection.
    pub async fn start(
        binary: &str,
        name: &str,
        args: Vec<String>,
        socket: &Path,
        log: &Path,
    ) -> Result<Service> {
        Self::start_with_env(binary, name, args, &[], socket, log).await
    }

    /// [`Service::start`] with `env` added to the process's environment.
    pub async fn start_with_env(
        binary: &str,
        name: &str,
        args: Vec<String>,
        env: &[(String, String)],
        socket: &Path,
        log: &Path,
    ) -> Result<Service> {
        let mut service = Service {
            name: name.to_string(),
            program: workspace_binary(binary)?,
            args,
            env: env.to_vec(),
            socket: socket.to_path_buf(),
            log: log.to_path_buf(),
            child: None,
        };
        service.restart().await?;
        Ok(service)
    }

    /// Starts the process again (it must not be running) and waits for
    /// its socket; a stale socket left by a crash does not count.
    pub async fn restart(&mut self) -> Result<()> {
        if self.child.is_some() {
            bail!("{} is still running", self.name);
        }
        let filter = std::env::var("CARINA_TEST_RUST_LOG").unwrap_or_else(|_| "info".into());
        let mut env: Vec<(&str, &str)> = vec![("RUST_LOG", &filter)];
        env.extend(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let mut child = ChildGuard::spawn(&self.name, &self.program, &self.args, &env, &self.log)?;
        // Waiting for a process to start: there is nothing to watch.
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Err(e) = child.check_running() {
                child.kill();
                return Err(e);
            }
            if tokio::net::UnixStream::connect(&self.socket).await.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not accept connections on {} within {START_TIMEOUT:?}; log:\n{}",
                    self.name,
                    self.socket.display(),
                    tail(&self.log, 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.child = Some(child);
        Ok(())
    }

    /// SIGTERM, then waits up to [`STOP_GRACE`] for the exit (SIGKILL
    /// after that).
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if child.signal("TERM").is_ok() {
            let deadline = Instant::now() + STOP_GRACE;
            while child.check_running().is_ok() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // Reaps it; SIGKILL only if it is still running.
        child.kill();
    }

    /// SIGKILL: a crash, no shutdown code runs.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to the running process.
    pub fn signal(&self, signal: &str) -> Result<()> {
        match &self.child {
            Some(child) => child.signal(signal),
            None => bail!("{} is not running", self.name),
        }
    }

    /// Fails (with the log's tail) if the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.as_mut() {
            Some(child) => child.check_running(),
            None => bail!("{} is stopped", self.name),
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(ChildGuard::pid)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// A gRPC channel over the service's unix socket.
    pub async fn channel(&self) -> Result<Channel> {
        unix_channel(self.socket.clone())
            .await
            .with_context(|| format!("connect to {} at {}", self.name, self.socket.display()))
    }
}

/// external-provisioner (`tests/tools/build.sh csi-provisioner`) as a
/// process against `cluster`, calling the CSI controller on `socket`,
/// with `args` and `env` added; its log is `csi-provisioner.log` in the
/// cluster's log directory. Stopped on drop.
pub fn csi_provisioner(
    cluster: &KubeCluster,
    socket: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<ChildGuard> {
    let mut argv = vec![
        format!("--csi-address={}", socket.display()),
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        "--v=4".to_string(),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    ChildGuard::spawn(
        "csi-provisioner",
        &tool_path("csi-provisioner")?.join("csi-provisioner"),
        &argv,
        env,
        &cluster
            .log_dir()
            .join(format!("{}.log", unique("csi-provisioner"))),
    )
}
