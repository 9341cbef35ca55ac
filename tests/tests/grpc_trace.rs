//! The caller's trace continues on the node: a client span, a call through
//! `carina_proto::trace::traced`, and the server's spans carry the same
//! trace id with a remote parent.

use carina_proto::nodestorage as pb;
use carina_proto::nodestorage::node_storage_client::NodeStorageClient;
use carina_proto::telemetry::{self, TelemetryConfig};
use carina_proto::tls::connect;
use carina_proto::trace::{TracedChannel, traced};
use carina_tests::grpc::{TestNode, create_lv, host_engine, start_engine};
use carina_tests::spans::{SpanCollector, names as span_names};
use carina_tests::{LoopDisk, VgGuard, have_root, unique};
use opentelemetry::trace::{SpanKind, TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::trace::SpanData;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

/// A NodeStorage client of `role` whose calls carry the current trace.
async fn traced_client(node: &TestNode, role: &str) -> NodeStorageClient<TracedChannel> {
    let channel = connect(&node.endpoint(), &node.client_tls(role).expect("tls"))
        .await
        .expect("connect");
    NodeStorageClient::new(traced(channel))
}

// One thread: the server's tasks run where the thread-local subscriber is.
#[tokio::test(flavor = "current_thread")]
async fn server_spans_continue_the_callers_trace() {
    let spans = SpanCollector::default();
    let provider = spans.provider();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let _default = tracing::subscriber::set_default(subscriber);

    let group = unique("g");
    let (engine, _dirs) = host_engine(&group, None).await.expect("engine");
    let node = TestNode::start(engine, "node-a").await.expect("server");
    let mut client = traced_client(&node, "reader").await;

    let caller = tracing::info_span!("caller");
    let trace_id = caller.context().span().span_context().trace_id();
    client
        .capacity(pb::CapacityRequest::default())
        .instrument(caller)
        .await
        .expect("Capacity");
    node.stop().await.expect("stop");

    let spans = spans.flush(&provider);
    let names = span_names(&spans);
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

/// With the production subscriber and its default filters, a CreateLV's
/// trace reaches the exporter down to the `lvcreate` it ran: the command
/// span carries the command line, exit code and duration, and hangs below
/// the RPC's span.
#[tokio::test(flavor = "current_thread")]
async fn a_create_lv_trace_contains_its_lvcreate_span() {
    if !have_root("a_create_lv_trace_contains_its_lvcreate_span") {
        return;
    }
    let spans = SpanCollector::default();
    let provider = spans.provider();
    // What carina-node runs with when nothing is set but the exporter.
    let config = TelemetryConfig::from_lookup("carina-node", |_| None).expect("config");
    assert_eq!(config.trace_filter, "info", "the default");
    let subscriber = telemetry::subscriber(&config, Some(&provider)).expect("subscriber");
    let _default = tracing::subscriber::set_default(subscriber);

    let disk = LoopDisk::new(64 << 20).expect("loop disk");
    let group = unique("vg");
    let _vg = VgGuard::new(&group, &[&disk]);
    let config_json = carina_tests::disk_group_config(&group, "LVM", &[&disk], 0);
    let engine = start_engine(&config_json).await.expect("engine");
    let node = TestNode::start(engine, "node-a").await.expect("server");
    let mut client = traced_client(&node, "controller").await;
    let caller = tracing::info_span!("caller");
    let trace_id = caller.context().span().span_context().trace_id();
    let name = unique("lv");
    client
        .create_lv(create_lv(&name, &group, 8 << 20))
        .instrument(caller)
        .await
        .expect("CreateLV");
    client
        .delete_lv(pb::DeleteLvRequest { name })
        .await
        .expect("DeleteLV");
    let refused = tracing::info_span!("refused caller");
    let refused_trace = refused.context().span().span_context().trace_id();
    let status = client
        .create_lv(create_lv(&unique("lv"), &group, 0))
        .instrument(refused)
        .await
        .expect_err("size 0 is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    node.stop().await.expect("stop");

    let spans = spans.flush(&provider);
    let names = span_names(&spans);
    let in_trace: Vec<&SpanData> = spans
        .iter()
        .filter(|s| s.span_context.trace_id() == trace_id)
        .collect();
    let lvcreate = in_trace
        .iter()
        .find(|s| s.name == "lvm.lvcreate")
        .unwrap_or_else(|| panic!("no lvcreate span in the CreateLV trace; spans: {names:?}"));
    let attr = |key: &str| attribute(lvcreate, key);
    let line = attr("carina.command.line").expect("carina.command.line");
    assert!(line.starts_with("lvm lvcreate "), "{line}");
    assert_eq!(attr("carina.command.exit_code").as_deref(), Some("0"));
    assert!(
        attr("carina.command.duration_ms").is_some(),
        "duration recorded"
    );
    // Its ancestors lead up to the caller's span, through the RPC.
    let by_id = |id| in_trace.iter().find(|s| s.span_context.span_id() == id);
    let mut chain = Vec::new();
    let mut parent = by_id(lvcreate.parent_span_id);
    while let Some(p) = parent {
        chain.push(p.name.to_string());
        parent = by_id(p.parent_span_id);
    }
    assert_eq!(
        chain.last().map(String::as_str),
        Some("caller"),
        "{chain:?}"
    );
    assert_eq!(
        chain.first().map(String::as_str),
        Some("lvm.create"),
        "the backend's span, the same for every policy: {chain:?}"
    );
    assert!(
        chain
            .iter()
            .any(|n| n.contains("CreateLV") || n.contains("create")),
        "{chain:?}"
    );

    // Attribute names follow the semantic conventions (rpc.*) and ours
    // are under carina.*.
    let rpc = |trace| {
        spans
            .iter()
            .find(|s| {
                s.span_context.trace_id() == trace
                    && s.name == "carina.nodestorage.v1.NodeStorage/CreateLV"
            })
            .unwrap_or_else(|| panic!("no CreateLV server span; spans: {names:?}"))
    };
    let server = rpc(trace_id);
    assert_eq!(server.span_kind, opentelemetry::trace::SpanKind::Server);
    for (key, want) in [
        ("rpc.system", "grpc"),
        ("rpc.service", "carina.nodestorage.v1.NodeStorage"),
        ("rpc.method", "CreateLV"),
        ("rpc.grpc.status_code", "0"),
    ] {
        assert_eq!(attribute(server, key).as_deref(), Some(want), "{key}");
    }
    let backend = in_trace
        .iter()
        .find(|s| s.name == "lvm.create")
        .expect("backend span");
    assert_eq!(attribute(backend, "carina.group"), Some(group.clone()));
    assert_eq!(attribute(backend, "carina.policy").as_deref(), Some("LVM"));
    assert!(
        in_trace
            .iter()
            .any(|s| attribute(s, "carina.volume.size_bytes").as_deref() == Some("8388608")),
        "the size is on a span of the trace"
    );
    // A refused call carries its code; INVALID_ARGUMENT is the caller's
    // error, so the server span is not marked failed.
    let refused = rpc(refused_trace);
    assert_eq!(
        attribute(refused, "rpc.grpc.status_code").as_deref(),
        Some("3")
    );
    assert_eq!(refused.status, opentelemetry::trace::Status::Unset);
}

/// The value of attribute `key` of `span`, as text.
fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// JSON log lines a node writes while serving a call name the caller's
/// trace: a refused CreateLV logs its error inside the RPC's span, and
/// that line's `trace_id` is the caller's.
#[tokio::test(flavor = "current_thread")]
async fn json_log_lines_name_the_callers_trace() {
    #[derive(Clone, Default)]
    struct Buffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let spans = SpanCollector::default();
    let provider = spans.provider();
    let config = TelemetryConfig::from_lookup("carina-node", |k| {
        (k == "CARINA_LOG_FORMAT").then(|| "json".to_string())
    })
    .expect("config");
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = telemetry::subscriber_to(&config, Some(&provider), move || writer.clone())
        .expect("subscriber");
    let _default = tracing::subscriber::set_default(subscriber);

    let group = unique("g");
    let (engine, _dirs) = host_engine(&group, None).await.expect("engine");
    let node = TestNode::start(engine, "node-a").await.expect("server");
    let mut client = traced_client(&node, "controller").await;
    let caller = tracing::info_span!("caller");
    let trace_id = caller.context().span().span_context().trace_id();
    let refused = client
        .create_lv(create_lv("json-log", "no-such-group", 1 << 20))
        .instrument(caller)
        .await
        .expect_err("unknown group");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    node.stop().await.expect("stop");

    let text = String::from_utf8(buffer.0.lock().unwrap_or_else(|p| p.into_inner()).clone())
        .expect("UTF-8");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    let in_trace: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["trace_id"] == trace_id.to_string().as_str())
        .collect();
    assert!(
        in_trace
            .iter()
            .any(|l| l.to_string().contains("no-such-group")),
        "a line of the refusal in trace {trace_id}; lines:\n{text}"
    );
    // Each such line's span is one the exporter got, in the same trace.
    let exported = spans.flush(&provider);
    for line in in_trace {
        let span_id = line["span_id"].as_str().expect("span_id");
        assert!(
            exported
                .iter()
                .any(|s| s.span_context.span_id().to_string() == span_id
                    && s.span_context.trace_id() == trace_id),
            "span {span_id} of {line} was exported"
        );
    }
}

/// The node keeps the trace a volume was created in: its CSI node spans,
/// each a trace of its own (kubelet sends no context), link back to it,
/// a retried create keeps the first trace, and a delete forgets it.
#[tokio::test(flavor = "current_thread")]
async fn node_spans_link_to_the_volumes_creation_trace() {
    use carina_csi::node::NodeService;
    use carina_csi::volume_id::VolumeId;
    use carina_node::csi_local::EngineVolumes;
    use carina_node::engine::{Config, Engine, EngineOptions};
    use carina_proto::csi;
    use carina_proto::csi::node_server::Node as _;

    let spans = SpanCollector::default();
    let provider = spans.provider();
    let config = TelemetryConfig::from_lookup("carina-node", |_| None).expect("config");
    let subscriber = telemetry::subscriber(&config, Some(&provider)).expect("subscriber");
    let _default = tracing::subscriber::set_default(subscriber);

    let dirs = tempfile::tempdir().expect("tempdir");
    let group = unique("g");
    let engine = Engine::start(
        Config::from_json(&carina_tests::grpc::host_config(&group, dirs.path(), 0))
            .expect("config"),
        EngineOptions {
            trace_dir: Some(dirs.path().join("state/traces")),
            ..Default::default()
        },
    )
    .await
    .expect("engine");
    let node = TestNode::start(engine.clone(), "node-a")
        .await
        .expect("server");
    let mut client = traced_client(&node, "controller").await;
    let name = unique("lv");
    let creator = tracing::info_span!("creator");
    let creation = creator.context().span().span_context().trace_id();
    client
        .create_lv(create_lv(&name, &group, 8 << 20))
        .instrument(creator)
        .await
        .expect("CreateLV");
    let kept = engine.creation_trace(&name).expect("a creation trace kept");
    assert!(kept.starts_with(&format!("00-{creation}-")), "{kept}");
    // A retried create, in another trace, keeps the first.
    client
        .create_lv(create_lv(&name, &group, 8 << 20))
        .instrument(tracing::info_span!("retry"))
        .await
        .expect("CreateLV again");
    assert_eq!(engine.creation_trace(&name), Some(kept));

    // Kubelet's calls, outside any trace.
    let csi_node = NodeService::new(EngineVolumes::new(engine.clone(), "node-a"));
    let volume_id = VolumeId::new(&name, "node-a").encode();
    let paths = tempfile::tempdir().expect("tempdir");
    csi_node
        .node_unpublish_volume(tonic::Request::new(csi::NodeUnpublishVolumeRequest {
            volume_id: volume_id.clone(),
            target_path: paths.path().join("target").display().to_string(),
        }))
        .await
        .expect("NodeUnpublishVolume");
    csi_node
        .node_unstage_volume(tonic::Request::new(csi::NodeUnstageVolumeRequest {
            volume_id: volume_id.clone(),
            staging_target_path: paths.path().join("staging").display().to_string(),
        }))
        .await
        .expect("NodeUnstageVolume");

    client
        .delete_lv(pb::DeleteLvRequest { name: name.clone() })
        .await
        .expect("DeleteLV");
    assert_eq!(
        engine.creation_trace(&name),
        None,
        "forgotten with the volume"
    );
    node.stop().await.expect("stop");

    let spans = spans.flush(&provider);
    let names = span_names(&spans);
    for rpc in ["Node/NodeUnpublishVolume", "Node/NodeUnstageVolume"] {
        let span = spans
            .iter()
            .find(|s| s.name == rpc)
            .unwrap_or_else(|| panic!("no {rpc} span in {names:?}"));
        assert_ne!(
            span.span_context.trace_id(),
            creation,
            "{rpc}: a trace of its own"
        );
        let links: Vec<_> = span.links.iter().collect();
        assert_eq!(links.len(), 1, "{rpc}: {links:?}");
        assert_eq!(links[0].span_context.trace_id(), creation, "{rpc}");
        assert!(
            links[0].attributes.iter().any(
                |kv| kv.key.as_str() == "carina.link" && kv.value.as_str() == "volume creation"
            ),
            "{rpc}: {:?}",
            links[0].attributes
        );
    }
}
