//! Prometheus metrics shared by the binaries: the latency of every gRPC
//! call a server answers ([`GrpcMetricsLayer`], by method and status code)
//! and a plain HTTP/1 server for `/metrics` ([`serve`]). Label values are
//! bounded: a method the server does not offer counts as `other`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use tokio::net::TcpListener;
use tower::{Layer, Service};

/// The content type of every binary's `/metrics` page: the Prometheus
/// text format 0.0.4, which [`encode`] writes and `promtool check metrics`
/// validates.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Buckets for operation latencies: 1 ms to about 65 s.
pub fn latency_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.001, 2.0, 17)
}

/// A histogram family of latencies in [`latency_buckets`].
pub fn latency_family<L>() -> Family<L, Histogram>
where
    L: Clone + std::hash::Hash + Eq,
{
    Family::new_with_constructor(|| Histogram::new(latency_buckets()))
}

/// `s` as a label value of the text exposition format: backslash, double
/// quote and newline escaped.
pub fn escape_label(s: &str) -> String {
    s.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The exposition text of `registry`, followed by the process's trace
/// export counters ([`crate::telemetry::export_metrics`]), which every
/// binary reports, in the text format 0.0.4 ([`CONTENT_TYPE`]).
pub fn encode(registry: &Registry) -> String {
    use prometheus_client::encoding::text::encode_registry;
    let mut open = String::new();
    // Writing into a String cannot fail.
    let _ = encode_registry(&mut open, registry);
    let _ = encode_registry(&mut open, crate::telemetry::export_metrics().registry());
    text_004(&open)
}

/// prometheus-client's OpenMetrics text as 0.0.4. Histograms and gauges
/// read the same in both (`# UNIT` lines are comments in 0.0.4); a counter
/// family is named without the `_total` of its sample in OpenMetrics and
/// with it in 0.0.4, so its `# HELP` and `# TYPE` lines take the suffix.
/// The closing `# EOF` goes.
fn text_004(open: &str) -> String {
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len() + 16 * counters.len());
    for line in open.lines().filter(|l| *l != "# EOF") {
        let meta = ["# HELP ", "# TYPE "].into_iter().find_map(|kind| {
            let (family, rest) = line.strip_prefix(kind)?.split_once(' ')?;
            counters.contains(family).then_some((kind, family, rest))
        });
        match meta {
            Some((kind, family, rest)) => out.push_str(&format!("{kind}{family}_total {rest}")),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The labels of one answered gRPC call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GrpcCall {
    /// `csi.v1.Controller/CreateVolume`; `other` for a method the server
    /// does not offer.
    pub method: String,
    /// The gRPC status code name (`OK`, `NOT_FOUND`, ...).
    pub code: &'static str,
}

/// Latencies of the gRPC calls a server answered.
#[derive(Clone, Debug)]
pub struct GrpcMetrics {
    calls: Family<GrpcCall, Histogram>,
}

impl GrpcMetrics {
    /// Registers `<prefix>_grpc_server_duration_seconds` in `registry`.
    pub fn register(registry: &mut Registry) -> GrpcMetrics {
        let calls = latency_family();
        registry.register_with_unit(
            "grpc_server_duration",
            "Time to answer one gRPC call, by method and status code",
            Unit::Seconds,
            calls.clone(),
        );
        GrpcMetrics { calls }
    }

    /// One answered call of `path` (`/csi.v1.Controller/CreateVolume`).
    pub fn observe(&self, path: &str, code: tonic::Code, seconds: f64) {
        // Unknown methods are UNIMPLEMENTED: their paths are the caller's.
        let method = if code == tonic::Code::Unimplemented {
            "other".to_string()
        } else {
            path.trim_start_matches('/').to_string()
        };
        self.calls
            .get_or_create(&GrpcCall {
                method,
                code: crate::code_name(code),
            })
            .observe(seconds);
    }

    /// The layer that times every call of a server.
    pub fn layer(&self) -> GrpcMetricsLayer {
        GrpcMetricsLayer {
            metrics: self.clone(),
        }
    }
}

/// Times every call of the services below it (see [`GrpcMetrics`]). The
/// code is the `grpc-status` of the response headers: a failed unary
/// call answers trailers-only, so a response without one is `OK`.
#[derive(Clone, Debug)]
pub struct GrpcMetricsLayer {
    metrics: GrpcMetrics,
}

impl<S> Layer<S> for GrpcMetricsLayer {
    type Service = GrpcTimed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcTimed {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// See [`GrpcMetricsLayer`].
#[derive(Clone, Debug)]
pub struct GrpcTimed<S> {
    inner: S,
    metrics: GrpcMetrics,
}

impl<S, B, RB> Service<http::Request<B>> for GrpcTimed<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = req.uri().path().to_string();
        let started = Instant::now();
        let metrics = self.metrics.clone();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let result = answer.await;
            let code = response_code(&result);
            metrics.observe(&path, code, started.elapsed().as_secs_f64());
            result
        })
    }
}

/// The gRPC status of an answer: the `grpc-status` of its headers (a
/// failed unary call answers trailers-only), `OK` without one, `UNKNOWN`
/// when the service failed outright.
pub fn response_code<RB, E>(result: &Result<http::Response<RB>, E>) -> tonic::Code {
    match result {
        Ok(response) => response
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i32>().ok())
            .map_or(tonic::Code::Ok, tonic::Code::from_i32),
        Err(_) => tonic::Code::Unknown,
    }
}

/// What a `/metrics` page is made by: each scrape awaits one call.
pub type Render = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = String> + Send>> + Send + Sync>;

/// A [`Render`] of a synchronous function.
pub fn render_with(f: impl Fn() -> String + Send + Sync + 'static) -> Render {
    Arc::new(move || {
        let page = f();
        Box::pin(std::future::ready(page))
    })
}

/// Serves `GET /metrics` with what `render` gives, as `content_type`, on
/// `listener`, until `shutdown` completes; other paths are 404.
pub async fn serve(
    listener: TcpListener,
    content_type: &'static str,
    render: Render,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let render = render.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let page = (req.uri().path() == "/metrics").then(|| render());
                async move {
                    let response = match page {
                        Some(page) => hyper::Response::builder()
                            .header("content-type", content_type)
                            .body(page.await),
                        None => hyper::Response::builder()
                            .status(404)
                            .body("not found: try /metrics\n".to_string()),
                    };
                    Ok::<_, Infallible>(response.unwrap_or_default())
                }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!(error = %e, "metrics: connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;

    /// Sample lines, in order, of an exposition text.
    fn samples(text: &str) -> Vec<&str> {
        text.lines().filter(|l| !l.starts_with('#')).collect()
    }

    /// Counters are typed under the `_total` their samples carry; gauges,
    /// histograms and every sample are as prometheus-client wrote them.
    #[test]
    fn the_page_is_text_004() {
        let mut registry = Registry::default();
        let calls = Counter::<u64>::default();
        let depth = Gauge::<i64>::default();
        let took = latency_family::<Vec<(String, String)>>();
        registry.register("demo_calls", "Calls", calls.clone());
        registry.register("demo_depth", "Depth", depth.clone());
        registry.register_with_unit("demo_took", "Took", Unit::Seconds, took.clone());
        calls.inc_by(3);
        depth.set(2);
        took.get_or_create(&vec![("m".into(), "x".into())])
            .observe(0.5);
        let mut open = String::new();
        prometheus_client::encoding::text::encode_registry(&mut open, &registry).expect("encode");

        let page = text_004(&open);
        assert_eq!(samples(&page), samples(&open));
        assert!(page.contains("# HELP demo_calls_total Calls.\n"), "{page}");
        assert!(
            page.contains("# TYPE demo_calls_total counter\ndemo_calls_total 3\n"),
            "{page}"
        );
        assert!(page.contains("# TYPE demo_depth gauge\n"), "{page}");
        assert!(
            page.contains("# TYPE demo_took_seconds histogram\n"),
            "{page}"
        );
        assert!(!page.contains("# EOF"), "{page}");
    }
}
