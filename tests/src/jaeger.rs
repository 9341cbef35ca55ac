//! A real Jaeger (`jaeger` from `tests/tools/build.sh jaeger`) with
//! in-memory storage on free loopback ports: binaries export to its OTLP
//! gRPC receiver ([`Jaeger::otlp_endpoint`]), tests read traces back
//! through its HTTP query API ([`Jaeger::find_traces`], [`Jaeger::trace`],
//! the `/api/v3` OTLP form, which keeps span kinds, links and their
//! attributes). The process stops when the guard is dropped.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::ports::free_ports;
use crate::process::{ChildGuard, tail, upstream_tool};

/// The pinned version's cache dir (`JAEGER_VERSION` in build.sh).
const TOOL_DIR: &str = "jaeger-v1.75.0";

/// A running Jaeger.
#[derive(Debug)]
pub struct Jaeger {
    child: ChildGuard,
    otlp_port: u16,
    query_port: u16,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// One span as the query API returns it.
#[derive(Debug, Clone)]
pub struct Span {
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// OTLP span kind: 1 internal, 2 server, 3 client.
    pub kind: i64,
    /// Attribute values as text (ints and bools too).
    pub attributes: BTreeMap<String, String>,
    /// (trace id, span id, attributes) of each link.
    pub links: Vec<(String, String, BTreeMap<String, String>)>,
}

impl Span {
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

impl Jaeger {
    /// Starts Jaeger with its output in `log` and waits for its query API.
    pub async fn start(log: &Path) -> Result<Jaeger> {
        Self::start_with_otlp_port(log, crate::ports::free_port()?).await
    }

    /// [`Jaeger::start`] with its OTLP/gRPC receiver on `otlp_port`.
    pub async fn start_with_otlp_port(log: &Path, otlp_port: u16) -> Result<Jaeger> {
        let program = upstream_tool("CARINA_JAEGER", TOOL_DIR, "jaeger")?;
        let [query_port, query_grpc_port] = free_ports::<2>()?;
        let dir = tempfile::Builder::new()
            .prefix("carina-jaeger-")
            .tempdir()?;
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            format!(
                r#"service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: info
extensions:
  jaeger_query:
    enable_tracing: false
    storage:
      traces: memory
    http:
      endpoint: 127.0.0.1:{query_port}
    grpc:
      endpoint: 127.0.0.1:{query_grpc_port}
  jaeger_storage:
    backends:
      memory:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{otlp_port}
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memory
"#
            ),
        )?;
        let args = vec!["--config".to_string(), config.display().to_string()];
        let child = ChildGuard::spawn("jaeger", &program, &args, &[], log)?;
        let mut jaeger = Jaeger {
            child,
            otlp_port,
            query_port,
            log: log.to_path_buf(),
            _dir: dir,
        };
        // A process starting: nothing to watch but its port.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            jaeger.child.check_running()?;
            if jaeger.get("/api/services").await.is_ok() {
                return Ok(jaeger);
            }
            if Instant::now() > deadline {
                bail!(
                    "jaeger's query API did not answer within 60 s; log:\n{}",
                    tail(&jaeger.log, 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Where OTLP/gRPC exporters send spans (`OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub fn otlp_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.otlp_port)
    }

    /// The environment that makes a Carina binary export every span here
    /// quickly: the endpoint, sampling everything, a short batch delay.
    pub fn exporter_env(&self) -> Vec<(String, String)> {
        [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.otlp_endpoint()),
            ("OTEL_TRACES_SAMPLER", "always_on".to_string()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// GET `path` on the query API; its JSON body.
    pub async fn get(&self, path: &str) -> Result<Value> {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.query_port)).await?;
        stream
            .write_all(
                format!(
                    "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nAccept: application/json\r\n\r\n"
                )
                .as_bytes(),
            )
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        let response = String::from_utf8(response).context("a UTF-8 answer")?;
        let (head, body) = response
            .split_once("\r\n\r\n")
            .with_context(|| format!("GET {path}: no header end in {response:?}"))?;
        let status = head.lines().next().unwrap_or_default();
        if !status.contains(" 200 ") {
            bail!("GET {path}: {status}: {body}");
        }
        serde_json::from_str(body).with_context(|| format!("GET {path}: JSON: {body}"))
    }

    /// The ids of the traces that have a span `operation` of `service`,
    /// newest first as Jaeger orders them (the v1 search API).
    pub async fn find_traces(&self, service: &str, operation: &str) -> Result<Vec<String>> {
        let found = self
            .get(&format!(
                "/api/traces?service={}&operation={}&lookback=1h&limit=100",
                encode(service),
                encode(operation)
            ))
            .await?;
        Ok(found["data"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["traceID"].as_str().map(str::to_string))
            .collect())
    }

    /// Every span of trace `trace_id` (the v3 API, OTLP form).
    pub async fn trace(&self, trace_id: &str) -> Result<Vec<Span>> {
        let body = self.get(&format!("/api/v3/traces/{trace_id}")).await?;
        spans_of(&body)
    }

    /// Waits (at most `within`) until `service` has a trace with a span
    /// `operation` whose whole trace passes `complete`; that trace.
    pub async fn await_trace(
        &self,
        service: &str,
        operation: &str,
        within: Duration,
        complete: impl Fn(&[Span]) -> bool,
    ) -> Result<Vec<Span>> {
        let deadline = Instant::now() + within;
        let mut last = Vec::new();
        loop {
            for id in self.find_traces(service, operation).await? {
                let spans = self.trace(&id).await?;
                if complete(&spans) {
                    return Ok(spans);
                }
                last = spans;
            }
            if Instant::now() > deadline {
                let names: Vec<String> = last
                    .iter()
                    .map(|s| format!("{}:{}", s.service, s.name))
                    .collect();
                bail!(
                    "no complete trace of {service} {operation} in Jaeger within {within:?}; \
                     the last one had {names:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// Percent-encodes a query parameter value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The text of an OTLP/JSON `AnyValue`.
fn any_value(v: &Value) -> String {
    for key in ["stringValue", "intValue", "boolValue", "doubleValue"] {
        if let Some(x) = v.get(key) {
            return match x {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
        }
    }
    v.to_string()
}

fn attributes(list: &Value) -> BTreeMap<String, String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|kv| Some((kv["key"].as_str()?.to_string(), any_value(&kv["value"]))))
        .collect()
}

/// The spans of an `/api/v3/traces` answer.
pub fn spans_of(body: &Value) -> Result<Vec<Span>> {
    let mut spans = Vec::new();
    let resources = body["result"]["resourceSpans"]
        .as_array()
        .with_context(|| format!("no result.resourceSpans in {body}"))?;
    for rs in resources {
        let resource = attributes(&rs["resource"]["attributes"]);
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
            for s in ss["spans"].as_array().into_iter().flatten() {
                let text = |k: &str| s[k].as_str().unwrap_or_default().to_string();
                spans.push(Span {
                    service: service.clone(),
                    trace_id: text("traceId"),
                    span_id: text("spanId"),
                    parent_span_id: text("parentSpanId"),
                    name: text("name"),
                    kind: s["kind"].as_i64().unwrap_or_default(),
                    attributes: attributes(&s["attributes"]),
                    links: s["links"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|l| {
                            (
                                l["traceId"].as_str().unwrap_or_default().to_string(),
                                l["spanId"].as_str().unwrap_or_default().to_string(),
                                attributes(&l["attributes"]),
                            )
                        })
                        .collect(),
                });
            }
        }
    }
    Ok(spans)
}

/// The chain of span names from `span` up to its trace's root (nearest
/// first), as `service:name`.
pub fn ancestors(spans: &[Span], span: &Span) -> Vec<String> {
    let mut chain = Vec::new();
    let mut parent = span.parent_span_id.clone();
    while !parent.is_empty() {
        let Some(p) = spans.iter().find(|s| s.span_id == parent) else {
            chain.push(format!("<missing {parent}>"));
            break;
        };
        chain.push(format!("{}:{}", p.service, p.name));
        parent = p.parent_span_id.clone();
    }
    chain
}
