//! The bridge, the capacity publisher and the config push against a real
//! kube-apiserver and two in-process NodeStorage servers (HOST groups on
//! temporary directories), reached through the Nodes' endpoint
//! annotation over mutual TLS with one test CA. Everything waited for is
//! watched, with a deadline.
//!
//! It proves: a `LogicVolume` is made on its node and only there, with
//! the status the provisioner reads (volume id, size, code 0, Ready); the
//! finalizer is added when missing; an expansion through `spec.size`; an
//! oversized request ends as `RESOURCE_EXHAUSTED` with a Warning Event,
//! an unknown group as `INVALID_ARGUMENT`; deletion removes the volume,
//! then the finalizer; each node's `NodeStorageResource` follows its
//! `WatchCapacity` stream; the ConfigMap's `nodeLabel` selectors reach
//! only the labelled nodes, also after a label change; a stopped node's
//! record turns Stale and stays; a node back on a new endpoint is Ready
//! again and is sent its configuration again. The node's spans continue
//! the trace named by the object's `traceparent` annotation.
//!
//! Needs etcd and kube-apiserver from `tests/tools/build.sh etcd kube`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result};
use carina_api::quantity::quantity_bytes;
use carina_api::{
    LOGICVOLUME_FINALIZER, LogicVolume, LogicVolumeSpec, NODE_ENDPOINT_ANNOTATION,
    NodeStorageResource, TRACEPARENT_ANNOTATION, capacity_key,
};
use carina_controlplane::kube::capacity::{NO_DISKS, READY, STALE};
use carina_controlplane::kube::config_push::{CONFIG_KEY, CONFIG_MAP_NAME};
use carina_csi::volume_id::VolumeId;
use carina_node::engine::{Config, Engine};
use carina_proto::devcerts::{DevCa, Validity};
use carina_proto::nodestorage as pb;
use carina_tests::bridge::Bridge;
use carina_tests::grpc::{self, EngineDirs, TestNode, host_config, host_engine, server_cert};
use carina_tests::kube::KubeCluster;
use carina_tests::spans::SpanCollector;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::json;
use tonic::Code;

const A: &str = "node-a";
const B: &str = "node-b";
/// A node whose endpoint nothing listens on.
const C: &str = "node-c";
const GROUP: &str = "g";
const MIB: u64 = 1 << 20;
/// Bound of every wait.
const DEADLINE: Duration = Duration::from_secs(30);
const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const LABEL_A: &str = "test.carina.storage.io/a";
const LABEL_B: &str = "test.carina.storage.io/b";
const LABEL_FAST: &str = "test.carina.storage.io/fast";
/// A group on node-a whose selector matches no disk.
const NO_DISK_GROUP: &str = "nodisk";
const NO_DISK_PATTERN: &str = "^/dev/carina-test-no-such-disk$";

/// Installs, once, a global subscriber: OpenTelemetry into `spans`, and
/// log lines at `RUST_LOG` (default `warn`) into the test output.
fn tracing_into(spans: &SpanCollector) -> SdkTracerProvider {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt;
    static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();
    PROVIDER
        .get_or_init(|| {
            let provider = spans.provider();
            let filter = tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
            let subscriber = tracing_subscriber::registry()
                .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_test_writer()
                        .with_filter(filter),
                );
            tracing::subscriber::set_global_default(subscriber).expect("first subscriber");
            provider
        })
        .clone()
}

/// One node: its server, engine and directories.
struct TestStorage {
    server: Option<TestNode>,
    engine: Engine,
    dirs: EngineDirs,
}

impl TestStorage {
    fn server(&self) -> &TestNode {
        self.server.as_ref().expect("server running")
    }
}

async fn start_node(ca: &DevCa, name: &str, engine: Engine) -> Result<TestNode> {
    let server = server_cert(ca, name, Validity::days(1))?;
    let same_ca = DevCa::from_pem(ca.cert_pem(), ca.key_pem())?;
    TestNode::start_with(engine, name, same_ca, &server).await
}

fn node_object(name: &str, endpoint: &str, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            annotations: Some(BTreeMap::from([(
                NODE_ENDPOINT_ANNOTATION.to_string(),
                endpoint.to_string(),
            )])),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        ..Node::default()
    }
}

fn logic_volume(name: &str, node: &str, group: &str, size: &str, finalizer: bool) -> LogicVolume {
    let mut lv = LogicVolume::new(
        name,
        LogicVolumeSpec {
            source: None,
            node_name: node.to_string(),
            size: Quantity(size.to_string()),
            device_group: group.to_string(),
            pvc: format!("claim-{name}"),
            name_space: "default".to_string(),
            cache: None,
        },
    );
    lv.metadata.annotations = Some(BTreeMap::from([(
        TRACEPARENT_ANNOTATION.to_string(),
        TRACEPARENT.to_string(),
    )]));
    if finalizer {
        lv.metadata.finalizers = Some(vec![LOGICVOLUME_FINALIZER.to_string()]);
    }
    lv
}

/// [`carina_tests::kube::wait_for`] within [`DEADLINE`].
async fn wait_for<K>(api: &Api<K>, name: &str, what: &str, done: impl Fn(&K) -> bool) -> Result<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    carina_tests::kube::wait_for(api, name, what, DEADLINE, done).await
}

/// [`carina_tests::kube::gone`] within [`DEADLINE`].
async fn gone<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    carina_tests::kube::gone(api, name, DEADLINE).await
}

/// The status of a `LogicVolume` once the bridge answered (a volume id or
/// a non-zero code) for its current generation.
async fn answered(api: &Api<LogicVolume>, name: &str) -> Result<LogicVolume> {
    wait_for(api, name, "answer", |lv| {
        lv.status.as_ref().is_some_and(|s| {
            s.observed_generation.is_some()
                && s.observed_generation == lv.metadata.generation
                && (s.code.is_some_and(|c| c != 0) || s.volume_id.is_some())
        })
    })
    .await
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn lv_ready(lv: &LogicVolume) -> Option<&Condition> {
    condition(&lv.status.as_ref()?.conditions, "Ready")
}

fn nsr_condition<'a>(nsr: &'a NodeStorageResource, type_: &str) -> Option<&'a str> {
    condition(&nsr.status.as_ref()?.conditions, type_).map(|c| c.status.as_str())
}

fn nsr_groups(nsr: &NodeStorageResource) -> Vec<String> {
    nsr.status
        .iter()
        .flat_map(|s| s.groups.iter().map(|g| g.name.clone()))
        .collect()
}

fn volume_count(nsr: &NodeStorageResource, group: &str) -> Option<u32> {
    nsr.status
        .as_ref()?
        .groups
        .iter()
        .find(|g| g.name == group)
        .map(|g| g.volume_count)
}

async fn get_lv(node: &TestNode, name: &str) -> Result<Option<pb::LogicVolume>> {
    grpc::get_lv(&mut node.client("controller").await?, name).await
}

async fn group_names(engine: &Engine) -> Vec<String> {
    engine
        .config()
        .await
        .groups
        .iter()
        .map(|g| g.name.clone())
        .collect()
}

/// The ConfigMap text: `g` per node (each at its own root, selected by
/// its own label), `fast` for the nodes labelled fast, and on node-a an
/// LVM group `nodisk` whose pattern matches no disk.
fn config_json(root_a: &Path, root_b: &Path, root_fast: &Path) -> String {
    json!({
        "diskSelector": [
            {"name": GROUP, "policy": "HOST", "root": root_a, "reserveBytes": 0, "nodeLabel": LABEL_A},
            {"name": GROUP, "policy": "HOST", "root": root_b, "reserveBytes": 0, "nodeLabel": LABEL_B},
            {"name": "fast", "policy": "HOST", "root": root_fast, "reserveBytes": 0, "nodeLabel": LABEL_FAST},
            {"name": NO_DISK_GROUP, "policy": "LVM", "re": [NO_DISK_PATTERN], "nodeLabel": LABEL_A},
        ],
        "diskScanInterval": "0",
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bridge_capacity_and_config_on_a_real_apiserver() -> Result<()> {
    let spans = SpanCollector::default();
    let provider = tracing_into(&spans);
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();

    let ca = DevCa::new("carina bridge test CA", Validity::days(1))?;
    let mut storage = Vec::new();
    for name in [A, B] {
        let (engine, dirs) = host_engine(GROUP, None).await?;
        let server = start_node(&ca, name, engine.clone()).await?;
        storage.push(TestStorage {
            server: Some(server),
            engine,
            dirs,
        });
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, s, labels) in [
        (A, &storage[0], vec![(LABEL_A, ""), (LABEL_FAST, "yes")]),
        (B, &storage[1], vec![(LABEL_B, "")]),
    ] {
        let endpoint = s.server().endpoint();
        nodes
            .create(
                &PostParams::default(),
                &node_object(name, &endpoint, &labels),
            )
            .await
            .with_context(|| format!("create Node {name}"))?;
    }
    let tls = storage[0].server().client_tls("controller")?;
    let running = Bridge::start(
        client.clone(),
        tls,
        Duration::from_secs(5),
        "kube-bridge-test",
    );

    let lvs: Api<LogicVolume> = Api::all(client.clone());
    let nsrs: Api<NodeStorageResource> = Api::all(client.clone());

    // Each node publishes its capacity record.
    let mut generation_b = 0;
    for name in [A, B] {
        let nsr = wait_for(&nsrs, name, "Ready capacity", |n| {
            nsr_condition(n, READY) == Some("True") && volume_count(n, GROUP) == Some(0)
        })
        .await?;
        assert_eq!(nsr.spec.node_name, name);
        assert_eq!(nsr_condition(&nsr, STALE), Some("False"));
        let status = nsr.status.as_ref().context("status")?;
        assert!(
            status.capacity.contains_key(&capacity_key(GROUP)),
            "{status:?}"
        );
        assert!(status.allocatable.contains_key(&capacity_key(GROUP)));
        assert!(status.sync_time.is_some());
        let owner = nsr.owner_references();
        assert_eq!(
            owner
                .iter()
                .map(|o| (o.kind.as_str(), o.name.as_str()))
                .collect::<Vec<_>>(),
            [("Node", name)]
        );
        if name == B {
            generation_b = status.node_generation.context("nodeGeneration")?;
        }
    }

    // A volume on node-b, created without the finalizer (the bridge adds
    // it), and one on node-a with it, as the provisioner writes them.
    lvs.create(
        &PostParams::default(),
        &logic_volume("vol-b", B, GROUP, "64Mi", false),
    )
    .await?;
    lvs.create(
        &PostParams::default(),
        &logic_volume("vol-a", A, GROUP, "32Mi", true),
    )
    .await?;
    for (name, node, size) in [("vol-b", B, 64 * MIB), ("vol-a", A, 32 * MIB)] {
        let lv = answered(&lvs, name).await?;
        let status = lv.status.as_ref().context("status")?;
        assert_eq!(status.code, Some(0), "{status:?}");
        assert_eq!(status.status.as_deref(), Some("Success"));
        assert_eq!(
            status.volume_id.as_deref(),
            Some(VolumeId::new(name, node).encode().as_str())
        );
        let current = status.current_size.as_ref().context("currentSize")?;
        assert_eq!(quantity_bytes(current)?, size);
        // HOST volumes have no device numbers.
        assert_eq!((status.device_major, status.device_minor), (None, None));
        let ready = lv_ready(&lv).context("Ready condition")?;
        assert_eq!(ready.status, "True");
        assert!(lv.finalizers().contains(&LOGICVOLUME_FINALIZER.to_string()));
        let (here, there) = if node == A {
            (&storage[0], &storage[1])
        } else {
            (&storage[1], &storage[0])
        };
        let made = get_lv(here.server(), name)
            .await?
            .context("volume on its node")?;
        assert_eq!((made.size_bytes, made.device_group.as_str()), (size, GROUP));
        // The bridge records where the volume is (the HOST directory).
        assert_eq!(status.path.as_ref(), Some(&made.host_path), "status.path");
        assert!(
            get_lv(there.server(), name).await?.is_none(),
            "{name} also on the other node"
        );
    }

    // The node's handling of CreateLV continued the object's trace.
    let traced: Vec<String> = spans
        .flush(&provider)
        .iter()
        .filter(|s| s.span_context.trace_id().to_string() == TRACE_ID)
        .map(|s| s.name.to_string())
        .collect();
    assert!(
        traced
            .iter()
            .any(|n| n == "carina.nodestorage.v1.NodeStorage/CreateLV"),
        "{traced:?}"
    );

    // node-b's record shows its new volume after the next update, and
    // from the version the bridge recorded on the object: the scheduler
    // tells from these two when the record counts the volume.
    let nsr_b = wait_for(&nsrs, B, "the new volume", |n| {
        volume_count(n, GROUP) == Some(1)
    })
    .await?;
    assert!(
        nsr_b.status.as_ref().and_then(|s| s.node_generation) > Some(generation_b),
        "{nsr_b:?}"
    );
    let lv_b = lvs.get("vol-b").await?;
    let lv_status = lv_b.status.as_ref().context("status")?;
    let record = nsr_b.status.as_ref().context("record")?;
    assert!(lv_status.node_incarnation.is_some(), "{lv_status:?}");
    assert_eq!(lv_status.node_incarnation, record.node_incarnation);
    assert!(
        lv_status.capacity_generation > Some(generation_b)
            && lv_status.capacity_generation <= record.node_generation,
        "{lv_status:?} {record:?}"
    );
    wait_for(&nsrs, A, "the new volume", |n| {
        volume_count(n, GROUP) == Some(1)
    })
    .await?;

    // Expansion through spec.size.
    lvs.patch(
        "vol-b",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"size": "128Mi"}})),
    )
    .await?;
    let grown = wait_for(&lvs, "vol-b", "expansion", |lv| {
        lv.status.as_ref().is_some_and(|s| {
            s.observed_generation == lv.metadata.generation
                && s.current_size.as_ref().map(|q| q.0.as_str()) == Some("128Mi")
        })
    })
    .await?;
    assert_eq!(grown.status.as_ref().and_then(|s| s.code), Some(0));
    let made = get_lv(storage[1].server(), "vol-b")
        .await?
        .context("vol-b on node-b")?;
    assert_eq!(made.size_bytes, 128 * MIB);

    // A burst of volumes on both nodes, carried out concurrently.
    let burst: Vec<(String, &str)> = (0..12)
        .map(|i| (format!("burst-{i}"), if i % 2 == 0 { A } else { B }))
        .collect();
    for (name, node) in &burst {
        lvs.create(
            &PostParams::default(),
            &logic_volume(name, node, GROUP, "8Mi", true),
        )
        .await?;
    }
    for (name, _) in &burst {
        let lv = answered(&lvs, name).await?;
        assert_eq!(lv.status.as_ref().and_then(|s| s.code), Some(0), "{lv:?}");
    }
    for (name, _) in &burst {
        lvs.delete(name, &DeleteParams::default()).await?;
    }
    for (name, node) in &burst {
        gone(&lvs, name).await?;
        let on = if *node == A { &storage[0] } else { &storage[1] };
        assert!(get_lv(on.server(), name).await?.is_none(), "{name}");
    }

    // More than the group holds: RESOURCE_EXHAUSTED, a Warning Event, no
    // volume. An unknown group: INVALID_ARGUMENT.
    lvs.create(
        &PostParams::default(),
        &logic_volume("vol-big", A, GROUP, "1Ei", true),
    )
    .await?;
    lvs.create(
        &PostParams::default(),
        &logic_volume("vol-nogroup", A, "no-such-group", "1Mi", true),
    )
    .await?;
    for (name, code) in [
        ("vol-big", Code::ResourceExhausted),
        ("vol-nogroup", Code::InvalidArgument),
    ] {
        let lv = answered(&lvs, name).await?;
        let status = lv.status.as_ref().context("status")?;
        assert_eq!(status.code, Some(code as i32), "{status:?}");
        assert_eq!(status.status.as_deref(), Some("Failed"));
        assert!(status.volume_id.is_none());
        assert!(status.message.as_deref().is_some_and(|m| !m.is_empty()));
        let ready = lv_ready(&lv).context("Ready condition")?;
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason, carina_proto::code_name(code));
        assert!(get_lv(storage[0].server(), name).await?.is_none());
    }
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let warnings: Vec<Event> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("vol-big")
                && e.type_.as_deref() == Some("Warning")
        })
        .collect();
    assert!(
        warnings
            .iter()
            .any(|e| e.reason.as_deref() == Some("CreateFailed")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("RESOURCE_EXHAUSTED"))),
        "{warnings:#?}"
    );

    // Deletion: the volume goes from its node, then the object.
    for name in ["vol-b", "vol-big", "vol-nogroup"] {
        lvs.delete(name, &DeleteParams::default()).await?;
    }
    for name in ["vol-b", "vol-big", "vol-nogroup"] {
        gone(&lvs, name).await?;
    }
    assert!(get_lv(storage[1].server(), "vol-b").await?.is_none());
    assert!(get_lv(storage[0].server(), "vol-a").await?.is_some());

    // A node nothing listens for: UNAVAILABLE, retried; deleting the
    // object keeps it while the node cannot be asked; once the Node
    // object is gone there is nothing left to delete on, and it goes. The
    // unreachable node never gets a capacity record.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    nodes
        .create(
            &PostParams::default(),
            &node_object(C, &closed.to_string(), &[]),
        )
        .await?;
    lvs.create(
        &PostParams::default(),
        &logic_volume("vol-c", C, GROUP, "8Mi", true),
    )
    .await?;
    let lv = answered(&lvs, "vol-c").await?;
    let status = lv.status.as_ref().context("status")?;
    assert_eq!(status.code, Some(Code::Unavailable as i32), "{status:?}");
    assert_eq!(
        lv_ready(&lv).map(|c| c.reason.as_str()),
        Some("UNAVAILABLE")
    );
    lvs.delete("vol-c", &DeleteParams::default()).await?;
    let held = wait_for(&lvs, "vol-c", "a failed delete", |lv| {
        lv.status
            .as_ref()
            .and_then(|s| s.message.as_deref())
            .is_some_and(|m| m.contains("DeleteLV"))
    })
    .await?;
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(
        held.finalizers()
            .contains(&LOGICVOLUME_FINALIZER.to_string())
    );
    assert_eq!(
        held.status.as_ref().and_then(|s| s.code),
        Some(Code::Unavailable as i32)
    );
    assert!(
        nsrs.get_opt(C).await?.is_none(),
        "a record for a node never reached"
    );
    nodes.delete(C, &DeleteParams::default()).await?;
    gone(&lvs, "vol-c").await?;

    // The ConfigMap: `g` stays where it is on each node, `fast` reaches
    // only node-a (labelled), and node-b once it gets the label.
    let fast_root = tempfile::Builder::new().prefix("carina-fast-").tempdir()?;
    let text = config_json(
        &storage[0].dirs.root,
        &storage[1].dirs.root,
        fast_root.path(),
    );
    // After the deletions are published, the only change left on node-b
    // is the configuration it is sent.
    let nsr_b = wait_for(&nsrs, B, "no volume", |n| volume_count(n, GROUP) == Some(0)).await?;
    let before_b = nsr_b.status.as_ref().and_then(|s| s.node_generation);
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP_NAME.to_string()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(CONFIG_KEY.to_string(), text)])),
        ..ConfigMap::default()
    };
    configmaps.create(&PostParams::default(), &cm).await?;
    let nsr_a = wait_for(&nsrs, A, "groups fast and nodisk", |n| {
        let mut groups = nsr_groups(n);
        groups.sort();
        groups == ["fast", GROUP, NO_DISK_GROUP]
    })
    .await?;
    // The group that took no disk is visible from Kubernetes, with why.
    assert_eq!(nsr_condition(&nsr_a, NO_DISKS), Some("True"));
    let why = condition(
        &nsr_a.status.as_ref().context("status")?.conditions,
        NO_DISKS,
    )
    .context("NoDisks")?;
    assert!(why.message.contains(NO_DISK_GROUP), "{why:?}");
    assert!(why.message.contains(NO_DISK_PATTERN), "{why:?}");
    let group = nsr_a
        .status
        .iter()
        .flat_map(|s| &s.groups)
        .find(|g| g.name == NO_DISK_GROUP)
        .context("the nodisk group")?;
    assert!(
        group
            .no_disks
            .as_deref()
            .is_some_and(|m| m.contains(NO_DISK_PATTERN))
    );
    // node-b was sent its own configuration too (it rescans on it).
    wait_for(&nsrs, B, "a configuration rescan", |n| {
        n.status.as_ref().and_then(|s| s.node_generation) > before_b
    })
    .await?;
    let mut a_groups = group_names(&storage[0].engine).await;
    a_groups.sort();
    assert_eq!(a_groups, ["fast", GROUP, NO_DISK_GROUP]);
    assert_eq!(group_names(&storage[1].engine).await, [GROUP]);
    let b_config = storage[1].engine.config().await;
    assert!(b_config.source.contains(LABEL_B), "{}", b_config.source);
    assert!(!b_config.source.contains(LABEL_FAST), "{}", b_config.source);
    let nsr_b = nsrs.get(B).await?;
    assert_eq!(nsr_groups(&nsr_b), [GROUP]);
    assert_eq!(nsr_condition(&nsr_b, NO_DISKS), Some("False"));
    // The volumes stayed.
    assert!(get_lv(storage[0].server(), "vol-a").await?.is_some());

    nodes
        .patch(
            B,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {LABEL_FAST: "now"}}})),
        )
        .await?;
    wait_for(&nsrs, B, "group fast after labelling", |n| {
        nsr_groups(n).contains(&"fast".to_string())
    })
    .await?;
    assert!(
        group_names(&storage[1].engine)
            .await
            .contains(&"fast".to_string())
    );

    // node-b stops: its record turns stale and stays, figures kept.
    let server_b = storage[1].server.take().context("node-b running")?;
    server_b.stop().await?;
    let stale = wait_for(&nsrs, B, "Stale=True", |n| {
        nsr_condition(n, STALE) == Some("True")
    })
    .await?;
    assert_eq!(nsr_condition(&stale, READY), Some("False"));
    let mark =
        condition(&stale.status.as_ref().context("status")?.conditions, STALE).context("Stale")?;
    assert!(
        !mark.reason.is_empty() && !mark.message.is_empty(),
        "{mark:?}"
    );
    assert!(nsr_groups(&stale).contains(&GROUP.to_string()));
    assert_eq!(nsr_condition(&nsrs.get(A).await?, STALE), Some("False"));

    // node-b restarts from its own file (no `fast`) on a new endpoint: it
    // is Ready again and is sent its configuration again.
    let plain = Config::from_json(&host_config(GROUP, &storage[1].dirs.root, 0))?;
    storage[1].engine.apply_config(plain).await?;
    assert_eq!(group_names(&storage[1].engine).await, [GROUP]);
    let server_b = start_node(&ca, B, storage[1].engine.clone()).await?;
    let endpoint = server_b.endpoint();
    storage[1].server = Some(server_b);
    nodes
        .patch(
            B,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {NODE_ENDPOINT_ANNOTATION: endpoint}}}),
            ),
        )
        .await?;
    wait_for(&nsrs, B, "Ready again with fast", |n| {
        nsr_condition(n, STALE) == Some("False")
            && nsr_condition(n, READY) == Some("True")
            && nsr_groups(n).contains(&"fast".to_string())
    })
    .await?;
    assert!(
        group_names(&storage[1].engine)
            .await
            .contains(&"fast".to_string())
    );
    assert!(nsrs.get_opt(B).await?.is_some());

    running.stop().await?;
    Ok(())
}
