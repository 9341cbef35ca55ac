//! The caller's trace continues on the node: a client span, a call through
//! `carina_proto::trace::traced`, and the server's spans carry the same
//! trace id with a remote parent.

use std::sync::{Arc, Mutex};

use carina_proto::nodestorage as pb;
use carina_proto::nodestorage::node_storage_client::NodeStorageClient;
use carina_proto::tls::connect;
use carina_proto::trace::traced;
use carina_tests::grpc::{TestNode, host_engine};
use carina_tests::unique;
use opentelemetry::trace::{SpanKind, TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

/// Keeps every finished span in memory.
#[derive(Debug, Clone, Default)]
struct Collect(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Collect {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        self.0.lock().expect("not poisoned").extend(batch);
        std::future::ready(Ok(()))
    }
}

// One thread: the server's tasks run where the thread-local subscriber is.
#[tokio::test(flavor = "current_thread")]
async fn server_spans_continue_the_callers_trace() {
    let spans = Collect::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let _default = tracing::subscriber::set_default(subscriber);

    let group = unique("g");
    let (engine, _dirs) = host_engine(&group, None).await.expect("engine");
    let node = TestNode::start(engine, "node-a").await.expect("server");
    let channel = connect(&node.endpoint(), &node.client_tls("reader").expect("tls"))
        .await
        .expect("connect");
    let mut client = NodeStorageClient::new(traced(channel));

    let caller = tracing::info_span!("caller");
    let trace_id = caller.context().span().span_context().trace_id();
    client
        .capacity(pb::CapacityRequest::default())
        .instrument(caller)
        .await
        .expect("Capacity");
    node.stop().await.expect("stop");
    provider.force_flush().expect("flush");

    let spans = spans.0.lock().expect("not poisoned").clone();
    let names: Vec<_> = spans.iter().map(|s| s.name.to_string()).collect();
    let server = spans
        .iter()
        .find(|s| s.name == "carina.nodestorage.v1.NodeStorage/Capacity")
        .unwrap_or_else(|| panic!("no server span in {names:?}"));
    assert_eq!(server.span_kind, SpanKind::Server);
    assert_eq!(server.span_context.trace_id(), trace_id, "same trace");
    assert!(server.parent_span_is_remote, "parent came over the wire");
    let handler = spans
        .iter()
        .find(|s| s.name == "NodeStorage/Capacity")
        .unwrap_or_else(|| panic!("no handler span in {names:?}"));
    assert_eq!(handler.span_context.trace_id(), trace_id);
    assert_eq!(handler.parent_span_id, server.span_context.span_id());
}
