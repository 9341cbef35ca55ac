//! Scraping a binary's `/metrics` over HTTP on loopback and reading it
//! with a Prometheus exposition parser (`prometheus-parse`), so a test
//! checks what a Prometheus server would read.

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The parsed `/metrics` of the process listening on `port`.
pub async fn scrape(port: u16) -> Result<prometheus_parse::Scrape> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .with_context(|| format!("connect to 127.0.0.1:{port}"))?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8(response).context("the answer is not UTF-8")?;
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("no HTTP answer: {text:?}");
    };
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        bail!("/metrics answered {head:?}");
    }
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .with_context(|| format!("parse the exposition:\n{body}"))
}

/// The value of the sample `metric` whose labels include all of
/// `labels`, if there is one.
pub fn value(
    scrape: &prometheus_parse::Scrape,
    metric: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(_) | prometheus_parse::Value::Summary(_) => f64::NAN,
        })
}
