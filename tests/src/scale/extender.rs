//! The `carina-scheduler` binary as a process, and what kube-scheduler
//! does with it for one pod: `/filter` over every node, `/prioritize`
//! over the nodes that passed, and the best-scored node (ties broken by
//! the caller's turn, as kube-scheduler picks among equals).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::cluster::free_port;
use crate::process::{ChildGuard, tail, workspace_binary};

/// How long the extender may take to list its caches at start.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The extender process; stopped on drop.
#[derive(Debug)]
pub struct ExtenderProcess {
    child: ChildGuard,
    port: u16,
}

/// One pod's pass through the extender.
#[derive(Debug, Clone)]
pub struct Scheduled {
    /// The chosen node.
    pub node: String,
    pub filter: Duration,
    pub prioritize: Duration,
}

#[derive(Debug, Deserialize)]
struct FilterResult {
    #[serde(rename = "NodeNames", default)]
    node_names: Option<Vec<String>>,
    #[serde(rename = "FailedNodes", default)]
    failed: Option<Value>,
    #[serde(rename = "FailedAndUnresolvableNodes", default)]
    unresolvable: Option<Value>,
    #[serde(rename = "Error", default)]
    error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct HostPriority {
    #[serde(rename = "Host")]
    host: String,
    #[serde(rename = "Score")]
    score: i64,
}

impl ExtenderProcess {
    /// Starts `carina-scheduler` (strategy spreadout) against the cluster
    /// of `kubeconfig` and waits until `/readyz` answers 200 (its caches
    /// have listed).
    pub async fn start(kubeconfig: &Path, log: &Path) -> Result<ExtenderProcess> {
        let port = free_port()?;
        let args = vec![
            format!("--listen=127.0.0.1:{port}"),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--strategy=spreadout".to_string(),
        ];
        let filter = std::env::var("CARINA_TEST_RUST_LOG").unwrap_or_else(|_| "info".into());
        let mut child = ChildGuard::spawn(
            "carina-scheduler",
            &workspace_binary("carina-scheduler")?,
            &args,
            &[("RUST_LOG", &filter)],
            log,
        )?;
        // Waiting for a process to start: nothing to watch yet.
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            child.check_running()?;
            if let Ok(answer) = http(port, "GET", "/readyz", "").await
                && answer.0 == 200
            {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "carina-scheduler not ready within {START_TIMEOUT:?}; log:\n{}",
                    tail(log, 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(ExtenderProcess { child, port })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.pid()
    }

    pub fn check_running(&mut self) -> Result<()> {
        self.child.check_running()
    }

    /// `/filter` then `/prioritize` for pod `pod` (namespace `default`)
    /// using claim `claim`, over `nodes`; the best-scored node, the
    /// `turn`-th among equals.
    pub async fn schedule(
        &self,
        pod: &str,
        claim: &str,
        nodes: &[String],
        turn: usize,
    ) -> Result<Scheduled> {
        let body = |names: &[String]| {
            json!({
                "Pod": {
                    "metadata": {"name": pod, "namespace": "default", "uid": format!("uid-{pod}")},
                    "spec": {"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]},
                },
                "NodeNames": names,
            })
            .to_string()
        };
        let t0 = Instant::now();
        let (code, text) = http(self.port, "POST", "/filter", &body(nodes)).await?;
        let filter = t0.elapsed();
        if code != 200 {
            bail!("/filter for {pod}: HTTP {code}: {text}");
        }
        let passed: FilterResult =
            serde_json::from_str(&text).with_context(|| format!("/filter answer {text}"))?;
        if let Some(e) = passed.error.filter(|e| !e.is_empty()) {
            bail!("/filter for {pod}: {e}");
        }
        let names = passed.node_names.unwrap_or_default();
        if names.is_empty() {
            bail!(
                "/filter for {pod}: no node fits: {:?} {:?}",
                passed.failed,
                passed.unresolvable
            );
        }
        let t0 = Instant::now();
        let (code, text) = http(self.port, "POST", "/prioritize", &body(&names)).await?;
        let prioritize = t0.elapsed();
        if code != 200 {
            bail!("/prioritize for {pod}: HTTP {code}: {text}");
        }
        let scores: Vec<HostPriority> =
            serde_json::from_str(&text).with_context(|| format!("/prioritize answer {text}"))?;
        let best = scores.iter().map(|s| s.score).max().unwrap_or_default();
        let top: Vec<&str> = scores
            .iter()
            .filter(|s| s.score == best && names.contains(&s.host))
            .map(|s| s.host.as_str())
            .collect();
        let node = match top.len() {
            0 => names[turn % names.len()].clone(),
            n => top[turn % n].to_string(),
        };
        Ok(Scheduled {
            node,
            filter,
            prioritize,
        })
    }
}

/// One HTTP/1.0 exchange with the extender on loopback: status code and
/// body.
async fn http(port: u16, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .with_context(|| format!("{method} {path}: no HTTP response: {response}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("{method} {path}: bad status line: {head}"))?;
    Ok((code, body.to_string()))
}
