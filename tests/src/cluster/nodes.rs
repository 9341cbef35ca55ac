//! The Kubernetes side of a test node: its `Node` object
//! ([`register_node`], [`ready_node_status`], [`add_topology`]), its
//! capacity record ([`publish_node_storage`], [`await_capacity`]), the
//! watch that waits for an object ([`await_object`]), and an LVM node
//! process registered as a Node ([`LvmNode`]).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use carina_api::{
    NODE_ENDPOINT_ANNOTATION, NodeStorageResource, NodeStorageResourceSpec,
    NodeStorageResourceStatus,
};
use carina_controlplane::kube::capacity::READY;
use carina_csi::{DRIVER_NAME, TOPOLOGY_KEY};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeStatus};
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use serde::de::DeserializeOwned;

use super::{NodeArgs, Pki, Service};
use crate::kube::KubeCluster;
use crate::{LoopDisk, VgGuard, disk_group_config};

/// Registers Node `name` as a kubelet would, without one: label
/// `kubernetes.io/hostname`, the annotation [`NODE_ENDPOINT_ANNOTATION`]
/// = `endpoint` (where the control plane reaches its NodeStorage), and a
/// status with an InternalIP of 127.0.0.1, allocatable resources and
/// `Ready=True`.
pub async fn register_node(client: &kube::Client, name: &str, endpoint: &str) -> Result<Node> {
    let api: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/hostname".to_string(),
                name.to_string(),
            )])),
            annotations: Some(BTreeMap::from([(
                NODE_ENDPOINT_ANNOTATION.to_string(),
                endpoint.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    api.create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("create Node {name}"))?;
    let status = NodeStatus {
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: "127.0.0.1".into(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: name.into(),
            },
        ]),
        ..ready_node_status("4", "8Gi")
    };
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({ "status": status })),
    )
    .await
    .with_context(|| format!("write the status of Node {name}"))
}

/// A Node status as a kubelet reports it: `Ready=True`, and `cpu`,
/// `memory` and 110 pods both as capacity and allocatable.
pub fn ready_node_status(cpu: &str, memory: &str) -> NodeStatus {
    let resources = BTreeMap::from([
        ("cpu".to_string(), Quantity(cpu.into())),
        ("memory".to_string(), Quantity(memory.into())),
        ("pods".to_string(), Quantity("110".into())),
    ]);
    NodeStatus {
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: Some("KubeletReady".into()),
            ..NodeCondition::default()
        }]),
        ..NodeStatus::default()
    }
}

/// Creates the `NodeStorageResource` of `node` and writes `status` into
/// it, as the capacity publisher does for a node without one running.
pub async fn publish_node_storage(
    client: &kube::Client,
    node: &str,
    status: NodeStorageResourceStatus,
) -> Result<()> {
    let api: Api<NodeStorageResource> = Api::all(client.clone());
    let nsr = NodeStorageResource::new(
        node,
        NodeStorageResourceSpec {
            node_name: node.into(),
        },
    );
    api.create(&PostParams::default(), &nsr)
        .await
        .with_context(|| format!("create NodeStorageResource {node}"))?;
    api.patch_status(
        node,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": status })),
    )
    .await
    .with_context(|| format!("write the status of NodeStorageResource {node}"))?;
    Ok(())
}

/// Waits, by watch, until the `NodeStorageResource` of `node` is `Ready`
/// with at least one group: the capacity publisher has a live stream from
/// the node, and placement can choose it.
pub async fn await_capacity(
    client: &kube::Client,
    node: &str,
    within: Duration,
) -> Result<NodeStorageResource> {
    let api: Api<NodeStorageResource> = Api::all(client.clone());
    let ready = await_object(&api, node, "Ready with capacity", within, |nsr| {
        nsr.and_then(|n| n.status.as_ref()).is_some_and(|s| {
            !s.groups.is_empty()
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == READY && c.status == "True")
        })
    })
    .await?;
    ready.with_context(|| format!("NodeStorageResource {node} deleted while waiting"))
}

/// Waits, by watch, until the object `name` satisfies `done` (which sees
/// `None` while it does not exist), at most `within`; returns it as
/// seen then. A watch that fails (an API server still initialising a new
/// CRD's storage answers 429) is started again after a short pause; the
/// last error goes into the timeout's message with the object as last
/// seen.
pub async fn await_object<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    within: Duration,
    done: impl Fn(Option<&K>) -> bool,
) -> Result<Option<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut last_error: Option<String> = None;
    loop {
        let watched = tokio::time::timeout_at(deadline, await_condition(api.clone(), name, &done));
        match watched.await {
            Ok(Ok(obj)) => return Ok(obj),
            Ok(Err(e)) => {
                last_error = Some(e.to_string());
                tokio::time::sleep_until(
                    deadline.min(tokio::time::Instant::now() + Duration::from_millis(500)),
                )
                .await;
            }
            Err(_) => {
                let last = api.get_opt(name).await.ok().flatten();
                bail!(
                    "{name}: not {what} within {within:?} (last watch error: {}); last seen: {last:#?}",
                    last_error.as_deref().unwrap_or("none")
                )
            }
        }
    }
}

/// Labels Node `name` with Carina's topology key and gives it the
/// CSINode that kubelet would write once the node plugin registered, so
/// external-provisioner and kube-scheduler see the node's topology.
pub async fn add_topology(client: &kube::Client, name: &str) -> Result<()> {
    Api::<Node>::all(client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {TOPOLOGY_KEY: name}}})),
        )
        .await
        .with_context(|| format!("label Node {name}"))?;
    let csinode: CSINode = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"drivers": [{
            "name": DRIVER_NAME,
            "nodeID": name,
            "topologyKeys": [TOPOLOGY_KEY],
        }]},
    }))?;
    Api::<CSINode>::all(client.clone())
        .create(&PostParams::default(), &csinode)
        .await
        .with_context(|| format!("create CSINode {name}"))?;
    Ok(())
}

/// A `carina-node` process registered as Node `name`, with one LVM group
/// `group` on a loop disk of its own. Dropped in field order: the process,
/// then the volume group, then the disk.
#[derive(Debug)]
pub struct LvmNode {
    pub args: NodeArgs,
    pub service: Service,
    pub vg: VgGuard,
    pub disk: LoopDisk,
}

impl LvmNode {
    /// Starts node `name` (files under `dir/<name>`, log `<name>.log` in
    /// the cluster's log directory) on a new `disk_bytes` loop disk and
    /// registers its Node with the endpoint annotation.
    pub async fn start(
        cluster: &KubeCluster,
        pki: &Pki,
        dir: &Path,
        name: &str,
        group: &str,
        disk_bytes: u64,
    ) -> Result<LvmNode> {
        let disk = LoopDisk::new(disk_bytes)?;
        let vg = VgGuard::new(group, &[&disk]);
        let config = disk_group_config(group, "LVM", &[&disk], 0);
        let args = NodeArgs::new(
            name,
            pki,
            &config,
            &dir.join(name),
            &cluster.log_dir().join(format!("{name}.log")),
        )?;
        let service = args.start().await?;
        register_node(&cluster.client(), name, &args.endpoint()).await?;
        Ok(LvmNode {
            args,
            service,
            vg,
            disk,
        })
    }
}
