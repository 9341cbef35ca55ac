//! Starting the cluster's etcd and kube-apiserver (retrying when a port
//! picked as free was taken), restarting either as a crash would, and
//! waiting for both to be ready.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kube::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::pki::{Pki, kubeconfig_yaml};
use super::wait::client_from;
use super::{
    ApiServerMode, KubeCluster, PORT_ATTEMPTS, Relaunch, SERVICE_CLUSTER_IP_RANGE, START_TIMEOUT,
    etcd_binary, kube_binary, port_taken,
};
use crate::ports::free_ports;
use crate::process::{ChildGuard, tail};
use crate::unique;

impl KubeCluster {
    /// Starts etcd and kube-apiserver and waits until the apiserver answers
    /// `/readyz` with `ok` (at most [`START_TIMEOUT`]). Fails with the
    /// processes' log tails if either exits or the deadline passes.
    pub async fn start() -> Result<KubeCluster> {
        Self::start_with(ApiServerMode::Loopback).await
    }

    /// [`KubeCluster::start`] with the apiserver set up for `mode`.
    pub async fn start_with(mode: ApiServerMode) -> Result<KubeCluster> {
        let mut attempt = 1;
        loop {
            match Self::try_start(mode).await {
                Err(e) if attempt < PORT_ATTEMPTS && port_taken(&e) => {
                    eprintln!("kube test cluster: a port was taken, retrying: {e:#}");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn try_start(mode: ApiServerMode) -> Result<KubeCluster> {
        let etcd_bin = etcd_binary()?;
        let apiserver_bin = kube_binary("kube-apiserver")?;
        let dir = tempfile::Builder::new().prefix("carina-kube-").tempdir()?;
        let log_dir = match std::env::var_os("CARINA_TEST_LOG_DIR") {
            Some(logs) => PathBuf::from(logs).join(unique("kube")),
            None => dir.path().join("logs"),
        };
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("create {}", log_dir.display()))?;

        let host_ip = match mode {
            ApiServerMode::Loopback => None,
            ApiServerMode::WithKubelet { host_ip } => Some(host_ip),
        };
        let pki = Pki::write(&dir.path().join("pki"), host_ip)?;

        let [client_port, peer_port, secure_port] = free_ports()?;
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args = [
            "--name=carina-test".to_string(),
            format!("--data-dir={}", dir.path().join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=carina-test={peer_url}"),
            "--unsafe-no-fsync".to_string(),
            "--log-level=warn".to_string(),
        ];
        let mut etcd = ChildGuard::spawn(
            "etcd",
            &etcd_bin,
            &etcd_args,
            &[],
            &log_dir.join("etcd.log"),
        )?;
        let deadline = Instant::now() + START_TIMEOUT;
        wait_etcd_healthy(client_port, &mut etcd, deadline).await?;

        let server = format!("https://127.0.0.1:{secure_port}");
        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={secure_port}"),
            format!("--cert-dir={}", dir.path().join("apiserver").display()),
            format!("--tls-cert-file={}", pki.serving_cert.display()),
            format!("--tls-private-key-file={}", pki.serving_key.display()),
            format!("--client-ca-file={}", pki.ca_cert.display()),
            // Published in kube-system/extension-apiserver-authentication,
            // which components with delegated authentication read.
            format!("--requestheader-client-ca-file={}", pki.ca_cert.display()),
            "--requestheader-allowed-names=front-proxy-client".to_string(),
            "--requestheader-username-headers=X-Remote-User".to_string(),
            "--requestheader-group-headers=X-Remote-Group".to_string(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_string(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
            format!("--service-account-key-file={}", pki.sa_public.display()),
            format!(
                "--service-account-signing-key-file={}",
                pki.sa_private.display()
            ),
            format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
            "--allow-privileged=true".to_string(),
            "--profiling=false".to_string(),
        ];
        match host_ip {
            None => apiserver_args.extend([
                "--bind-address=127.0.0.1".to_string(),
                "--advertise-address=127.0.0.1".to_string(),
                "--authorization-mode=RBAC".to_string(),
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition".to_string(),
                // The `kubernetes` Service cannot point at a loopback
                // address; nothing here needs it.
                "--endpoint-reconciler-type=none".to_string(),
            ]),
            Some(ip) => apiserver_args.extend([
                "--bind-address=0.0.0.0".to_string(),
                format!("--advertise-address={ip}"),
                "--authorization-mode=Node,RBAC".to_string(),
                format!("--kubelet-client-certificate={}", pki.admin_cert.display()),
                format!("--kubelet-client-key={}", pki.admin_key.display()),
                // The Node's name is not in DNS.
                "--kubelet-preferred-address-types=InternalIP,Hostname".to_string(),
            ]),
        }
        let mut apiserver = ChildGuard::spawn(
            "kube-apiserver",
            &apiserver_bin,
            &apiserver_args,
            &[],
            &log_dir.join("kube-apiserver.log"),
        )?;

        let kubeconfig = dir.path().join("admin.kubeconfig");
        std::fs::write(
            &kubeconfig,
            kubeconfig_yaml(&server, &pki.ca_cert, &pki.admin_cert, &pki.admin_key),
        )?;
        let client = client_from(&kubeconfig).await?;

        wait_ready(&client, &mut etcd, &mut apiserver, deadline).await?;
        Ok(KubeCluster {
            client,
            server,
            kubeconfig,
            log_dir,
            pki,
            mode,
            etcd_start: Relaunch {
                program: etcd_bin,
                args: etcd_args.to_vec(),
            },
            apiserver_start: Relaunch {
                program: apiserver_bin,
                args: apiserver_args,
            },
            etcd_port: client_port,
            apiserver,
            etcd,
            dir,
        })
    }

    /// Kills kube-apiserver (SIGKILL, a crash), leaves it down for
    /// `down`, and starts it again with the same arguments (its log
    /// appended); returns once `/readyz` says ok.
    pub async fn restart_apiserver(&mut self, down: Duration) -> Result<()> {
        self.apiserver.kill();
        tokio::time::sleep(down).await;
        let r = &self.apiserver_start;
        self.apiserver = ChildGuard::spawn(
            "kube-apiserver",
            &r.program,
            &r.args,
            &[],
            &self.log_dir.join("kube-apiserver.log"),
        )?;
        let deadline = Instant::now() + START_TIMEOUT;
        wait_ready(&self.client, &mut self.etcd, &mut self.apiserver, deadline).await
    }

    /// Kills etcd (SIGKILL), leaves it down for `down`, and starts it again
    /// on the same data directory and ports; returns once etcd is healthy
    /// and the apiserver, which stayed up, is ready again.
    pub async fn restart_etcd(&mut self, down: Duration) -> Result<()> {
        self.etcd.kill();
        tokio::time::sleep(down).await;
        let r = &self.etcd_start;
        self.etcd = ChildGuard::spawn(
            "etcd",
            &r.program,
            &r.args,
            &[],
            &self.log_dir.join("etcd.log"),
        )?;
        let deadline = Instant::now() + START_TIMEOUT;
        wait_etcd_healthy(self.etcd_port, &mut self.etcd, deadline).await?;
        wait_ready(&self.client, &mut self.etcd, &mut self.apiserver, deadline).await
    }
}

/// Polls etcd's `/health` until it reports healthy, so the apiserver
/// starts against a serving etcd (and an etcd that cannot start fails with
/// its own log). This waits for an external process to start.
async fn wait_etcd_healthy(port: u16, etcd: &mut ChildGuard, deadline: Instant) -> Result<()> {
    loop {
        etcd.check_running()?;
        let last = match tokio::time::timeout(Duration::from_secs(5), etcd_health(port)).await {
            Ok(Ok(body)) if body.contains(r#""health":"true""#) => return Ok(()),
            Ok(Ok(body)) => body,
            Ok(Err(e)) => format!("{e:#}"),
            Err(_) => "/health took over 5s".to_string(),
        };
        if Instant::now() > deadline {
            bail!(
                "etcd not healthy within {START_TIMEOUT:?}: {last}\netcd log:\n{}",
                tail(&etcd.log, 40)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET /health` on etcd's plain-HTTP client port; the response body.
async fn etcd_health(port: u16) -> Result<String> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
    stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let response = String::from_utf8_lossy(&response);
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok(body.to_string())
}

/// Polls `/readyz` until it says `ok`, failing early when a process exits.
/// This waits for external processes to start; nothing to watch exists yet.
async fn wait_ready(
    client: &Client,
    etcd: &mut ChildGuard,
    apiserver: &mut ChildGuard,
    deadline: Instant,
) -> Result<()> {
    loop {
        etcd.check_running()?;
        apiserver.check_running()?;
        let readyz = http::Request::get("/readyz").body(Vec::new())?;
        let last =
            match tokio::time::timeout(Duration::from_secs(5), client.request_text(readyz)).await {
                Ok(Ok(text)) if text.trim() == "ok" => return Ok(()),
                Ok(Ok(text)) => text,
                Ok(Err(e)) => format!("{e:#}"),
                Err(_) => "/readyz took over 5s".to_string(),
            };
        if Instant::now() > deadline {
            bail!(
                "kube-apiserver not ready within {START_TIMEOUT:?}: {last}\n\
                 kube-apiserver log:\n{}\netcd log:\n{}",
                tail(&apiserver.log, 40),
                tail(&etcd.log, 20)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
