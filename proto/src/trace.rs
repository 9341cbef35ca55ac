//! W3C trace-context propagation (`traceparent`, `tracestate`) as tower
//! layers for tonic.
//!
//! - [`ServerTraceLayer`] (server): opens one span per request, named after
//!   the gRPC method, whose parent is the context the caller sent. Handler
//!   spans (`#[tracing::instrument]`) nest inside it.
//! - [`ClientTraceLayer`] (client): writes the current span's context into
//!   the request headers. `ClientTraceLayer.layer(channel)` (or
//!   [`traced`]) gives a service any generated client accepts.
//!
//! The W3C propagator is used directly, not the process-global one, so the
//! layers behave the same whether or not [`crate::telemetry`] was set up.
//! Without an OpenTelemetry subscriber layer the current span has no valid
//! context and nothing is injected.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tower::{Layer, Service};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// The trace context carried by `headers` (empty if none or malformed).
pub fn extract(headers: &HeaderMap) -> opentelemetry::Context {
    // The SDK reads the ids as numbers and so takes short or signed ones
    // (`00-af76…` with 31 digits); W3C trace context has fixed widths.
    let malformed = headers
        .get("traceparent")
        .is_some_and(|v| !v.to_str().is_ok_and(fixed_widths));
    if malformed {
        return opentelemetry::Context::current();
    }
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// Whether `traceparent` starts with version, trace id, parent id and
/// flags of 2, 32, 16 and 2 hex digits (the SDK checks the rest).
fn fixed_widths(traceparent: &str) -> bool {
    let mut parts = traceparent.split('-');
    [2, 32, 16, 2].into_iter().all(|width| {
        parts
            .next()
            .is_some_and(|p| p.len() == width && p.bytes().all(|b| b.is_ascii_hexdigit()))
    })
}

/// Writes `cx` into `headers` as `traceparent`/`tracestate` (nothing if
/// `cx` holds no valid span).
pub fn inject(cx: &opentelemetry::Context, headers: &mut HeaderMap) {
    TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
}

/// The W3C `traceparent` of the current span, when it belongs to a trace
/// (an OpenTelemetry layer is installed and the span is not disabled).
pub fn current_traceparent() -> Option<String> {
    let mut headers = HeaderMap::new();
    inject(&tracing::Span::current().context(), &mut headers);
    headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Links the current span to the span `traceparent` names (a malformed
/// one links nothing), with `carina.link` saying why.
pub fn link_current_span(traceparent: &str, why: &'static str) {
    use opentelemetry::trace::TraceContextExt as _;
    let mut headers = HeaderMap::new();
    let Ok(value) = HeaderValue::from_str(traceparent) else {
        return;
    };
    headers.insert("traceparent", value);
    let cx = extract(&headers);
    let linked = cx.span().span_context().clone();
    if linked.is_valid() {
        tracing::Span::current().add_link_with_attributes(
            linked,
            vec![opentelemetry::KeyValue::new("carina.link", why)],
        );
    }
}

/// Server side: continue the caller's trace.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerTraceLayer;

impl<S> Layer<S> for ServerTraceLayer {
    type Service = ServerTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ServerTrace { inner }
    }
}

/// See [`ServerTraceLayer`].
#[derive(Debug, Clone)]
pub struct ServerTrace<S> {
    inner: S,
}

impl<S, B, RB> Service<http::Request<B>> for ServerTrace<S>
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
        let path = req.uri().path();
        let method = path.trim_start_matches('/');
        let (service, rpc) = method.split_once('/').unwrap_or((method, ""));
        let span = tracing::info_span!(
            "grpc.server",
            otel.name = %method,
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            rpc.system = "grpc",
            rpc.service = %service,
            rpc.method = %rpc,
            rpc.grpc.status_code = tracing::field::Empty,
        );
        // Fails only when no OpenTelemetry layer is installed; then there
        // is nothing to continue anyway.
        let _ = span.set_parent(extract(req.headers()));
        let future = span.in_scope(|| self.inner.call(req));
        Box::pin(async move {
            let result = future.instrument(span.clone()).await;
            let code = crate::metrics::response_code(&result);
            span.record("rpc.grpc.status_code", code as i64);
            if server_error(code) {
                span.record("otel.status_code", "ERROR");
            }
            result
        })
    }
}

/// Whether `code` marks a server span as failed: the codes the semantic
/// conventions for gRPC servers call errors (the others are the caller's).
pub fn server_error(code: tonic::Code) -> bool {
    use tonic::Code;
    matches!(
        code,
        Code::Unknown
            | Code::DeadlineExceeded
            | Code::Unimplemented
            | Code::Internal
            | Code::Unavailable
            | Code::DataLoss
    )
}

/// Client side: send the current trace along.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientTraceLayer;

impl<S> Layer<S> for ClientTraceLayer {
    type Service = ClientTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ClientTrace { inner }
    }
}

/// See [`ClientTraceLayer`].
#[derive(Debug, Clone)]
pub struct ClientTrace<S> {
    inner: S,
}

impl<S, B> Service<http::Request<B>> for ClientTrace<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        inject(&tracing::Span::current().context(), req.headers_mut());
        self.inner.call(req)
    }
}

/// A channel that propagates the caller's trace: give it to a generated
/// client (`NodeStorageClient::new(traced(channel))`).
pub type TracedChannel = ClientTrace<tonic::transport::Channel>;

/// Wraps `channel` in [`ClientTraceLayer`].
pub fn traced(channel: tonic::transport::Channel) -> TracedChannel {
    ClientTraceLayer.layer(channel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use std::sync::{Arc, Mutex};
    use tower::ServiceExt;
    use tracing_subscriber::layer::SubscriberExt;

    fn subscriber() -> (impl tracing::Subscriber + Send + Sync, SdkTracerProvider) {
        let provider = SdkTracerProvider::builder().build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
        (tracing_subscriber::registry().with(layer), provider)
    }

    use carina_sys::testkit::{mutated_text, noisy_text};
    use proptest::prelude::*;

    /// The `traceparent` `headers` carry, re-written from what they hold.
    fn reinjected(traceparent: &str) -> Option<String> {
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", HeaderValue::from_str(traceparent).ok()?);
        let mut out = HeaderMap::new();
        inject(&extract(&headers), &mut out);
        Some(out.get("traceparent")?.to_str().ok()?.to_string())
    }

    proptest! {
        /// A `traceparent` of any text is continued or ignored, never a
        /// panic; one that is continued names the trace and span it held.
        #[test]
        fn traceparents_of_any_text(
            text in prop_oneof![
                noisy_text(),
                mutated_text("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
            ],
        ) {
            link_current_span(&text, "test");
            if let Some(out) = reinjected(&text) {
                let ids = out.get(3..52).expect("a traceparent's ids");
                prop_assert!(text.to_ascii_lowercase().contains(ids), "{:?} -> {:?}", text, out);
            }
        }

        /// A well-formed `traceparent` is continued exactly.
        #[test]
        fn valid_traceparents_round_trip(
            trace in "[0-9a-f]{32}".prop_filter("not all zero", |t| t.bytes().any(|b| b != b'0')),
            span in "[0-9a-f]{16}".prop_filter("not all zero", |s| s.bytes().any(|b| b != b'0')),
            flags in "0[01]",
        ) {
            let text = format!("00-{trace}-{span}-{flags}");
            prop_assert_eq!(reinjected(&text), Some(text));
        }
    }

    /// Found by `traceparents_of_any_text`: the SDK alone continued ids
    /// of the wrong width.
    #[test]
    fn ids_of_the_wrong_width_are_not_continued() {
        for text in [
            "00-af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-+af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
        ] {
            assert_eq!(reinjected(text), None, "{text}");
        }
    }

    fn trace_id_of(span: &tracing::Span) -> String {
        span.context().span().span_context().trace_id().to_string()
    }

    #[tokio::test]
    async fn client_injects_the_current_span() {
        let (subscriber, _provider) = subscriber();
        let _default = tracing::subscriber::set_default(subscriber);
        let seen = Arc::new(Mutex::new(HeaderMap::new()));
        let capture = {
            let seen = seen.clone();
            tower::service_fn(move |req: http::Request<()>| {
                let seen = seen.clone();
                async move {
                    *seen.lock().expect("not poisoned") = req.headers().clone();
                    Ok::<_, std::convert::Infallible>(())
                }
            })
        };
        let span = tracing::info_span!("caller");
        let want = trace_id_of(&span);
        ClientTraceLayer
            .layer(capture)
            .oneshot(http::Request::new(()))
            .instrument(span)
            .await
            .expect("infallible");
        let headers = seen.lock().expect("not poisoned").clone();
        let traceparent = headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .expect("traceparent sent");
        assert!(
            traceparent.starts_with(&format!("00-{want}-")),
            "{traceparent} vs {want}"
        );
    }

    #[tokio::test]
    async fn server_continues_the_callers_trace() {
        let (subscriber, _provider) = subscriber();
        let _default = tracing::subscriber::set_default(subscriber);
        let handler = tower::service_fn(|_req: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(trace_id_of(
                &tracing::Span::current(),
            )))
        });
        let tid = "4bf92f3577b34da6a3ce929d0e0e4736";
        let req = http::Request::builder()
            .uri("/carina.nodestorage.v1.NodeStorage/GetLV")
            .header("traceparent", format!("00-{tid}-00f067aa0ba902b7-01"))
            .body(())
            .expect("valid request");
        let got = ServerTraceLayer
            .layer(handler)
            .oneshot(req)
            .await
            .expect("infallible");
        assert_eq!(got.body(), tid);
    }

    #[test]
    fn invalid_context_injects_nothing() {
        let mut headers = HeaderMap::new();
        inject(&opentelemetry::Context::new(), &mut headers);
        assert!(headers.is_empty());
        let cx = extract(&headers);
        assert!(!cx.span().span_context().is_valid());
    }
}
