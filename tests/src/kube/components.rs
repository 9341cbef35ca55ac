//! The upstream control-plane components a test may start against the
//! cluster (kube-scheduler, kube-controller-manager), each waited on until
//! its `/healthz` answers and stopped on drop.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::{ApiServerMode, KubeCluster, PORT_ATTEMPTS, START_TIMEOUT, kube_binary, port_taken};
use crate::ports::free_ports;
use crate::process::{ChildGuard, tail};
use crate::unique;

impl KubeCluster {
    /// Starts kube-scheduler with `extenders` (entries of
    /// `KubeSchedulerConfiguration.extenders`: `urlPrefix`, `filterVerb`,
    /// `prioritizeVerb`, `weight`, `nodeCacheCapable`, ...; empty for none),
    /// leader election off, and waits for its `/healthz`.
    pub async fn start_scheduler(&self, extenders: &[serde_json::Value]) -> Result<Component> {
        let config = self.dir().join(format!("{}.json", unique("scheduler")));
        let doc = serde_json::json!({
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": self.kubeconfig},
            "leaderElection": {"leaderElect": false},
            "extenders": extenders,
        });
        std::fs::write(&config, serde_json::to_vec_pretty(&doc)?)?;
        let args = vec![format!("--config={}", config.display())];
        self.start_component("kube-scheduler", args).await
    }

    /// Starts kube-controller-manager with every default controller, leader
    /// election off, plus `extra_args`, and waits for its `/healthz`.
    /// Without a kubelet ([`ApiServerMode::Loopback`]) the node-lifecycle
    /// controller stays off: it would taint every Node unreachable (unless
    /// the test renews the Nodes' Leases itself and passes its own
    /// `--controllers`, which then replaces this choice).
    pub async fn start_controller_manager(&self, extra_args: &[&str]) -> Result<Component> {
        let controllers = match self.mode {
            ApiServerMode::Loopback => "*,-node-lifecycle-controller",
            ApiServerMode::WithKubelet { .. } => "*",
        };
        let chosen = extra_args.iter().any(|a| a.starts_with("--controllers="));
        let mut args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            "--leader-elect=false".to_string(),
            format!(
                "--service-account-private-key-file={}",
                self.pki.sa_private.display()
            ),
            format!("--root-ca-file={}", self.pki.ca_cert.display()),
            // Otherwise it creates the host's kubelet plugin directory.
            format!(
                "--flex-volume-plugin-dir={}",
                self.dir().join("flexvolume").display()
            ),
        ];
        if !chosen {
            args.push(format!("--controllers={controllers}"));
        }
        args.extend(extra_args.iter().map(|a| a.to_string()));
        self.start_component("kube-controller-manager", args).await
    }

    /// Starts a control-plane component with `args` plus what all share:
    /// delegated authentication and authorization through the admin
    /// kubeconfig, and `/healthz` served on a free loopback port with the
    /// apiserver's certificate (so the cluster CA verifies it).
    async fn start_component(&self, name: &str, args: Vec<String>) -> Result<Component> {
        let binary = kube_binary(name)?;
        let mut attempt = 1;
        loop {
            let [port] = free_ports()?;
            let kubeconfig = self.kubeconfig.display();
            let mut all = vec![
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                "--bind-address=127.0.0.1".to_string(),
                format!("--secure-port={port}"),
                format!("--tls-cert-file={}", self.pki.serving_cert.display()),
                format!("--tls-private-key-file={}", self.pki.serving_key.display()),
            ];
            all.extend(args.iter().cloned());
            let log = self.log_dir.join(format!("{}.log", unique(name)));
            let child = ChildGuard::spawn(name, &binary, &all, &[], &log)?;
            let mut component = Component {
                child,
                url: format!("https://127.0.0.1:{port}"),
            };
            match component.wait_healthy(&self.kubeconfig).await {
                Ok(()) => return Ok(component),
                Err(e) if attempt < PORT_ATTEMPTS && port_taken(&e) => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }
}

/// A running kube-scheduler or kube-controller-manager; stopped on drop.
#[derive(Debug)]
pub struct Component {
    child: ChildGuard,
    url: String,
}

impl Component {
    /// Its HTTPS endpoint (`/healthz`, `/metrics`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.child.log
    }

    /// Fails (with the log's tail) if it has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.child.check_running()
    }

    /// Polls `/healthz` (a component has nothing to watch) until `ok`.
    async fn wait_healthy(&mut self, kubeconfig: &Path) -> Result<()> {
        let mut config = carina_api::client::config(Some(kubeconfig)).await?;
        config.cluster_url = self.url.parse()?;
        let client = carina_api::client::client(config)?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            self.child.check_running()?;
            let healthz = http::Request::get("/healthz").body(Vec::new())?;
            let last =
                match tokio::time::timeout(Duration::from_secs(5), client.request_text(healthz))
                    .await
                {
                    Ok(Ok(text)) if text.trim() == "ok" => return Ok(()),
                    Ok(Ok(text)) => text,
                    Ok(Err(e)) => format!("{e:#}"),
                    Err(_) => "/healthz took over 5s".to_string(),
                };
            if Instant::now() > deadline {
                bail!(
                    "{} not healthy within {START_TIMEOUT:?}: {last}\nlog:\n{}",
                    self.child.name,
                    tail(&self.child.log, 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
