//! One trace per volume operation, read back from a real Jaeger: the kube
//! path with every binary exporting (a real kube-apiserver and etcd,
//! `carina-controller --mode kube` and `carina-node` as processes, an LVM
//! group on a loop disk), driven through the controller's CSI socket as
//! external-provisioner drives it (it sends no trace context).
//!
//! For create, expand and delete it asserts the span tree Jaeger's query
//! API returns: the services, the chain from the CSI call through the
//! LogicVolume write, the bridge's reconcile and the NodeStorage call to
//! the engine and the `lvm` command, with the semantic-convention and
//! `carina.*` attributes; and on the node side, that kubelet's calls (a
//! trace each) link to the volume's creation trace.
//!
//! Needs root and loop devices, etcd, kube-apiserver and jaeger from
//! `tests/tools/build.sh etcd kube jaeger`, and `cargo build --workspace --bins`.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result};
use carina_csi::TOPOLOGY_KEY;
use carina_csi::names::local_name as object_name;
use carina_proto::csi;
use carina_proto::csi::node_client::NodeClient;
use carina_tests::cluster::{KubeControllerArgs, NodeArgs, Pki, await_capacity, register_node};
use carina_tests::csi::{Csi, delete, make, mount_cap, on};
use carina_tests::grpc::unix_channel;
use carina_tests::jaeger::{Jaeger, Span, ancestors};
use carina_tests::kube::KubeCluster;
use carina_tests::{LoopDisk, VgGuard, disk_group_config, have_root, unique};

const NODE: &str = "node-t";
const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(60);
/// OTLP span kinds.
const SERVER: i64 = 2;

/// The span `service:name` of `spans`, or an error listing them all.
fn span<'a>(spans: &'a [Span], service: &str, name: &str) -> Result<&'a Span> {
    spans
        .iter()
        .find(|s| s.service == service && s.name == name)
        .with_context(|| {
            let all: Vec<String> = spans
                .iter()
                .map(|s| format!("{}:{}", s.service, s.name))
                .collect();
            format!("no span {service}:{name} in the trace: {all:?}")
        })
}

fn has(spans: &[Span], service: &str, name: &str) -> bool {
    spans.iter().any(|s| s.service == service && s.name == name)
}

/// Whether the bridge's and the node's parts of a trace have reached
/// Jaeger. Each process exports in batches, in the order its spans end: the
/// node's `rpc` server span ends after every node span below it (the
/// engine's, the command's), and the bridge's reconcile span, which may
/// end after the CSI call returns, ends after its client call. Once both
/// are in, so is everything `assert_tree` reads; waiting only for a command
/// span could read the trace between two batches.
fn node_side_done(spans: &[Span], rpc: &str) -> bool {
    has(
        spans,
        "carina-node",
        &format!("carina.nodestorage.v1.NodeStorage/{rpc}"),
    ) && has(spans, "carina-controller", &format!("bridge {rpc}"))
}

/// Asserts the tree of one operation's trace: the controller's CSI server
/// span is the root; the node's `rpc` server span and the `command` span
/// below it lead up to it; each is where and what it should be.
fn assert_tree(spans: &[Span], csi_method: &str, rpc: &str, command: &str) -> Result<()> {
    let root = span(
        spans,
        "carina-controller",
        &format!("csi.v1.Controller/{csi_method}"),
    )?;
    assert!(
        root.parent_span_id.is_empty(),
        "{csi_method} starts the trace"
    );
    assert_eq!(root.kind, SERVER);
    assert_eq!(root.attr("rpc.system"), Some("grpc"));
    assert_eq!(root.attr("rpc.service"), Some("csi.v1.Controller"));
    assert_eq!(root.attr("rpc.method"), Some(csi_method));
    assert_eq!(root.attr("rpc.grpc.status_code"), Some("0"));
    let trace = &root.trace_id;
    assert!(spans.iter().all(|s| &s.trace_id == trace), "one trace");

    let server = span(
        spans,
        "carina-node",
        &format!("carina.nodestorage.v1.NodeStorage/{rpc}"),
    )?;
    assert_eq!(server.kind, SERVER);
    assert_eq!(server.attr("rpc.method"), Some(rpc));
    assert_eq!(server.attr("rpc.grpc.status_code"), Some("0"));
    let chain = ancestors(spans, server);
    assert_eq!(
        chain.first().map(String::as_str),
        Some(format!("carina-controller:bridge {rpc}").as_str()),
        "{rpc} is called by the bridge's reconcile of the object: {chain:?}"
    );
    assert_eq!(
        chain.last().map(String::as_str),
        Some(format!("carina-controller:csi.v1.Controller/{csi_method}").as_str()),
        "{chain:?}"
    );

    let cmd = span(spans, "carina-node", command)?;
    let line = cmd
        .attr("carina.command.line")
        .context("carina.command.line")?;
    assert!(
        line.starts_with(&command.replace('.', " ")),
        "{command}: {line}"
    );
    assert_eq!(cmd.attr("carina.command.exit_code"), Some("0"));
    assert!(cmd.attr("carina.command.duration_ms").is_some());
    let chain = ancestors(spans, cmd);
    assert!(
        chain
            .iter()
            .any(|s| s == &format!("carina-node:carina.nodestorage.v1.NodeStorage/{rpc}")),
        "{command} runs under {rpc}: {chain:?}"
    );
    let backend = spans
        .iter()
        .find(|s| {
            s.service == "carina-node"
                && s.name.starts_with("lvm.")
                && s.attr("carina.policy") == Some("LVM")
        })
        .context("an lvm.* backend span with carina.policy")?;
    assert!(backend.attr("carina.group").is_some(), "{backend:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_volume_operation_is_one_trace_in_jaeger() -> Result<()> {
    if !have_root("each_volume_operation_is_one_trace_in_jaeger") {
        return Ok(());
    }
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let jaeger = Jaeger::start(&cluster.log_dir().join("jaeger.log")).await?;
    let dir = tempfile::Builder::new()
        .prefix("carina-traces-")
        .tempdir()?;
    let pki = Pki::write(&dir.path().join("pki"))?;

    let group = unique("tr");
    let disk = LoopDisk::new(1 << 30)?;
    let _vg = VgGuard::new(&group, &[&disk]);
    let mut node_args = NodeArgs::new(
        NODE,
        &pki,
        &disk_group_config(&group, "LVM", &[&disk], 0),
        &dir.path().join(NODE),
        &cluster.log_dir().join(format!("{NODE}.log")),
    )?;
    node_args.env = jaeger.exporter_env();
    let mut node = node_args.start().await?;
    register_node(&cluster.client(), NODE, &node_args.endpoint()).await?;
    let mut ctl_args = KubeControllerArgs::new(
        "ctl-traces",
        &unique("carina-controller"),
        cluster.kubeconfig_path(),
        &pki,
        dir.path(),
        &cluster.log_dir().join("ctl-traces.log"),
    );
    ctl_args.env = jaeger.exporter_env();
    let mut ctl = ctl_args.start().await?;
    await_capacity(&cluster.client(), NODE, WAIT).await?;
    let mut csi = Csi::new(ctl.channel().await?);

    // Create, expand, delete, as external-provisioner and the resizer
    // send them for a claim placed on the node.
    let name = unique("pvc-traced");
    let object = object_name(&name);
    let volume = make(
        &mut csi,
        csi::CreateVolumeRequest {
            parameters: HashMap::from([(
                "carina.storage.io/disk-group-name".to_string(),
                group.clone(),
            )]),
            accessibility_requirements: Some(csi::TopologyRequirement {
                requisite: vec![on(NODE)],
                preferred: vec![on(NODE)],
            }),
            ..carina_tests::csi::create(&name, 64 * MIB, "ext4")
        },
    )
    .await?;
    assert_eq!(
        volume.accessible_topology[0]
            .segments
            .get(TOPOLOGY_KEY)
            .map(String::as_str),
        Some(NODE)
    );
    csi.controller_expand_volume(csi::ControllerExpandVolumeRequest {
        volume_id: volume.volume_id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: (128 * MIB) as i64,
            limit_bytes: 0,
        }),
        volume_capability: Some(mount_cap("ext4")),
        ..Default::default()
    })
    .await
    .context("ControllerExpandVolume")?;

    // Kubelet's calls on the node's CSI socket (idempotent ones that
    // need no mount), before the delete forgets the creation trace.
    let mut kubelet = NodeClient::new(unix_channel(node_args.csi_socket.clone()).await?);
    let paths = tempfile::tempdir()?;
    kubelet
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: volume.volume_id.clone(),
            staging_target_path: paths.path().join("staging").display().to_string(),
        })
        .await
        .context("NodeUnstageVolume")?;
    delete(&mut csi, &volume.volume_id).await?;

    // Create: the CSI call, the LogicVolume write, the bridge, CreateLV,
    // the engine and lvcreate, in one trace.
    let created = jaeger
        .await_trace(
            "carina-controller",
            "csi.v1.Controller/CreateVolume",
            WAIT,
            |spans| node_side_done(spans, "CreateLV"),
        )
        .await?;
    assert_tree(&created, "CreateVolume", "CreateLV", "lvm.lvcreate")?;
    let write = span(&created, "carina-controller", "kube.create_object")?;
    assert!(
        ancestors(&created, write)
            .iter()
            .any(|s| s == "carina-controller:kube.create_volume"),
        "the LogicVolume write is part of the create"
    );
    let engine = created
        .iter()
        .find(|s| s.service == "carina-node" && s.attr("carina.volume.name") == Some(&object))
        .context("a node span naming the volume")?;
    assert!(
        engine.attr("carina.volume.size_bytes").is_some(),
        "{engine:?}"
    );

    // Expand and delete, each its own trace.
    let expanded = jaeger
        .await_trace(
            "carina-controller",
            "csi.v1.Controller/ControllerExpandVolume",
            WAIT,
            |spans| node_side_done(spans, "ResizeLV"),
        )
        .await?;
    assert_tree(
        &expanded,
        "ControllerExpandVolume",
        "ResizeLV",
        "lvm.lvextend",
    )?;
    let deleted = jaeger
        .await_trace(
            "carina-controller",
            "csi.v1.Controller/DeleteVolume",
            WAIT,
            |spans| node_side_done(spans, "DeleteLV"),
        )
        .await?;
    assert_tree(&deleted, "DeleteVolume", "DeleteLV", "lvm.lvremove")?;
    let traces = [&created, &expanded, &deleted].map(|t| t[0].trace_id.clone());
    assert!(
        traces[0] != traces[1] && traces[1] != traces[2] && traces[0] != traces[2],
        "{traces:?}"
    );

    // Kubelet's call is a trace of its own, linked to the creation trace.
    let unstaged = jaeger
        .await_trace(
            "carina-node",
            "csi.v1.Node/NodeUnstageVolume",
            WAIT,
            |spans| has(spans, "carina-node", "Node/NodeUnstageVolume"),
        )
        .await?;
    let rpc = span(&unstaged, "carina-node", "csi.v1.Node/NodeUnstageVolume")?;
    assert!(rpc.parent_span_id.is_empty(), "kubelet sends no context");
    assert_ne!(rpc.trace_id, traces[0]);
    let handler = span(&unstaged, "carina-node", "Node/NodeUnstageVolume")?;
    let links: Vec<_> = handler.links.iter().collect();
    assert_eq!(links.len(), 1, "{handler:?}");
    assert_eq!(links[0].0, traces[0], "linked to the creation trace");
    assert!(
        created.iter().any(|s| s.span_id == links[0].1),
        "the linked span is in the creation trace"
    );
    assert_eq!(
        links[0].2.get("carina.link").map(String::as_str),
        Some("volume creation")
    );

    ctl.check_running()?;
    ctl.stop().await;
    node.check_running()?;
    node.stop().await;
    Ok(())
}
