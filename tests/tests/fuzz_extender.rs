//! The scheduler extender's HTTP endpoints under hostile input: a real
//! `carina-scheduler` process, its caches synced against a real
//! kube-apiserver, gets requests with random methods and paths, request
//! bodies that are valid `ExtenderArgs` with a few bytes changed, random
//! bytes, and requests that are not HTTP at all. For every request:
//!
//! - the answer is a 2xx with a JSON body, or a 4xx that says what was
//!   wrong; never a 5xx other than `/readyz`'s 503, never a panic;
//! - the process keeps serving (`/healthz` answers after the run).
//!
//! Seeded; `CARINA_FUZZ_CASES` sets the number of requests (default
//! 2000), `CARINA_FUZZ_SEED` the seed.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use carina_tests::fuzz::{self, Rng};
use carina_tests::kube::KubeCluster;
use carina_tests::process::{ChildGuard, tail, workspace_binary};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the extender may take to start and sync its caches.
const START: Duration = Duration::from_secs(90);

/// Bound of one exchange; a hang is a failure.
const EXCHANGE: Duration = Duration::from_secs(10);

const ARGS: &str = r#"{"Pod":{"metadata":{"name":"p","namespace":"default","uid":"u"},"spec":{"volumes":[{"name":"d","persistentVolumeClaim":{"claimName":"c"}},{"name":"e","emptyDir":{}}]}},"NodeNames":["n1","n2"],"Nodes":{"items":[{"metadata":{"name":"n3","labels":{"kubernetes.io/hostname":"n3"}}}]}}"#;

/// One request: mostly well-formed HTTP with odd contents (`true`),
/// sometimes bytes that are not HTTP (`false`).
fn request(rng: &mut Rng) -> (Vec<u8>, bool) {
    if rng.below(10) == 0 {
        return (rng.bytes(200), false);
    }
    let method = ["POST", "POST", "POST", "GET", "PUT", "DELETE"][rng.below(6)];
    let path = [
        "/filter",
        "/prioritize",
        "/scheduler/filter",
        "/healthz",
        "/readyz",
        "/",
        "/%00",
        "/filter/../prioritize",
    ][rng.below(8)];
    let body = match rng.below(3) {
        0 => ARGS.as_bytes().to_vec(),
        1 => rng.mutate(ARGS.as_bytes().to_vec()),
        _ => rng.bytes(300),
    };
    let mut out = format!(
        "{method} {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend(body);
    (out, true)
}

/// One exchange on a new connection; the whole response. `end` closes
/// our side after the request (for bytes that are not HTTP, so the server
/// does not wait for the rest of a request that never comes; an HTTP
/// server may drop a request whose connection is half closed).
async fn exchange(port: u16, request: &[u8], end: bool) -> Result<Vec<u8>> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(request).await?;
    if end {
        stream.shutdown().await?;
    }
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    Ok(response)
}

#[tokio::test]
async fn the_extender_answers_every_request_with_a_sensible_status() -> Result<()> {
    let (seed, cases) = fuzz::settings(0x5C4E_D01E, 2000);
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let binary = workspace_binary("carina-scheduler")?;
    let port = carina_tests::ports::free_port()?;
    let log = cluster.log_dir().join("carina-scheduler.log");
    let kubeconfig = cluster.kubeconfig_path().to_string_lossy().into_owned();
    let mut child = ChildGuard::spawn(
        "carina-scheduler",
        &binary,
        &[format!("--listen=127.0.0.1:{port}")],
        &[("KUBECONFIG", kubeconfig.as_str())],
        &log,
    )?;
    // Waiting for a process to start and list: nothing to watch yet.
    let deadline = tokio::time::Instant::now() + START;
    loop {
        child.check_running()?;
        if let Ok(answer) = exchange(port, b"GET /readyz HTTP/1.0\r\n\r\n", false).await
            && answer.starts_with(b"HTTP/1.0 200")
        {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "carina-scheduler not ready within {START:?}:\n{}",
            tail(&log, 40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut rng = Rng::new(seed);
    let mut statuses = std::collections::BTreeMap::<String, usize>::new();
    for case in 0..cases {
        let (req, is_http) = request(&mut rng);
        let answer = tokio::time::timeout(EXCHANGE, exchange(port, &req, !is_http))
            .await
            .with_context(|| format!("case {case} (seed {seed}): no answer within {EXCHANGE:?}"))?
            .with_context(|| format!("case {case} (seed {seed})"))?;
        let text = String::from_utf8_lossy(&answer);
        let at = || {
            format!(
                "case {case} (seed {seed}), request {:?}",
                String::from_utf8_lossy(&req)
            )
        };
        // Bytes that are not HTTP get the HTTP layer's bare 400 or a closed
        // connection; what is HTTP gets our answer.
        let Some(status) = text.strip_prefix("HTTP/1.").and_then(|r| r.get(2..5)) else {
            ensure!(
                !is_http && answer.is_empty(),
                "{}: answer is not HTTP: {text:?}",
                at()
            );
            *statuses.entry("closed".into()).or_default() += 1;
            continue;
        };
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        match status.as_bytes()[0] {
            b'2' => {
                if req.starts_with(b"POST") {
                    serde_json::from_str::<serde_json::Value>(body)
                        .with_context(|| format!("{}: a 200 that is not JSON: {body:?}", at()))?;
                }
            }
            b'4' if !is_http => ensure!(status == "400", "{}: {status}", at()),
            b'4' => ensure!(
                !body.trim().is_empty(),
                "{}: {status} without a reason",
                at()
            ),
            b'5' if status == "503" && text.contains("caches not synced") => {}
            _ => bail!("{}: {status}: {body}", at()),
        }
        *statuses.entry(status.to_string()).or_default() += 1;
    }
    child.check_running()?;
    let health = exchange(port, b"GET /healthz HTTP/1.0\r\n\r\n", false).await?;
    assert!(
        health.ends_with(b"ok"),
        "{}",
        String::from_utf8_lossy(&health)
    );
    println!("extender: {cases} requests, answers by status: {statuses:?}");
    Ok(())
}
