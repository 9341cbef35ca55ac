//! Storage capacity tracking with the real upstream programs and without
//! Carina's scheduler extender: etcd, kube-apiserver,
//! kube-controller-manager (the PV binder) and a plain kube-scheduler from
//! the harness; external-provisioner (`csi-provisioner`, built by
//! `tests/tools/build.sh`) with capacity tracking on, calling
//! `carina-controller --mode kube` on its CSI socket; two `carina-node`
//! processes on LVM loop disks of different sizes. The CSIDriver object
//! is the one the Helm chart renders with its default values.
//!
//! It proves:
//! - external-provisioner publishes one `CSIStorageCapacity` per node for
//!   the WaitForFirstConsumer class, from `GetCapacity` per topology
//!   segment and the class's parameters: the small node's object says it
//!   cannot take the claim, the large node's says it can;
//! - kube-scheduler places a pod whose claim fits only on the large node
//!   there, the claim is provisioned on that node and bound;
//! - a pod whose claim fits on no node stays Pending, and kube-scheduler
//!   says it is for lack of storage capacity; no volume is made for it.
//!
//! Needs root and loop devices, `tests/tools/build.sh etcd kube helm
//! csi-provisioner`, and `cargo build --workspace --bins`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use carina_api::LogicVolume;
use carina_csi::TOPOLOGY_KEY;
use carina_csi::names::local_name;
use carina_tests::cluster::{
    KubeControllerArgs, LvmNode, Pki, add_topology, await_capacity, csi_provisioner,
};
use carina_tests::kube::KubeCluster;
use carina_tests::manifests::{Chart, objects};
use carina_tests::workload::{self, add_class, add_namespace, failed_scheduling, scheduled_node};
use carina_tests::{have_root, unique};
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIStorageCapacity};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

const SMALL: &str = "node-small";
const LARGE: &str = "node-large";
const GIB: u64 = 1 << 30;
const WAIT: Duration = Duration::from_secs(90);
const CLASS: &str = "carina-capacity";
/// Where external-provisioner writes its CSIStorageCapacity objects.
const CAPACITY_NAMESPACE: &str = "kube-system";

/// The CSIDriver object of the chart with its default values.
fn chart_csidriver() -> Result<serde_json::Value> {
    let chart = Chart::new()?;
    let yaml = chart.template("kube-system", None)?;
    objects(&yaml)?
        .into_iter()
        .find(|o| o["kind"] == "CSIDriver")
        .context("the chart renders no CSIDriver")
}

/// The CSIStorageCapacity objects of `class`, by the node their topology
/// names: (capacity, maximumVolumeSize) in bytes.
fn capacities_by_node(
    objects: &[CSIStorageCapacity],
    class: &str,
) -> BTreeMap<String, (u64, Option<u64>)> {
    let bytes = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        carina_api::quantity::quantity_bytes(q).ok()
    };
    objects
        .iter()
        .filter(|c| c.storage_class_name == class)
        .filter_map(|c| {
            let node = c
                .node_topology
                .as_ref()?
                .match_labels
                .as_ref()?
                .get(TOPOLOGY_KEY)?
                .clone();
            let capacity = c.capacity.as_ref().and_then(bytes)?;
            Some((
                node,
                (capacity, c.maximum_volume_size.as_ref().and_then(bytes)),
            ))
        })
        .collect()
}

/// Waits, by watch, until external-provisioner has published an object
/// for `class` on every node of `nodes`; returns them by node.
async fn await_capacities(
    client: &Client,
    class: &str,
    nodes: &[&str],
) -> Result<BTreeMap<String, (u64, Option<u64>)>> {
    let api: Api<CSIStorageCapacity> = Api::namespaced(client.clone(), CAPACITY_NAMESPACE);
    let stream = watcher(api.clone(), watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let found = tokio::time::timeout(WAIT, async {
        while stream.try_next().await?.is_some() {
            let all = api.list(&ListParams::default()).await?.items;
            let by_node = capacities_by_node(&all, class);
            if nodes.iter().all(|n| by_node.contains_key(*n)) {
                return Ok(by_node);
            }
        }
        bail!("the watch of CSIStorageCapacity ended")
    })
    .await;
    match found {
        Ok(r) => r,
        Err(_) => {
            let all = api.list(&ListParams::default()).await?.items;
            bail!(
                "no CSIStorageCapacity for class {class} on each of {nodes:?} within {WAIT:?}; have {:?}",
                capacities_by_node(&all, class)
            )
        }
    }
}

#[tokio::test]
async fn kube_scheduler_places_claims_by_published_capacity() -> Result<()> {
    if !have_root("kube_scheduler_places_claims_by_published_capacity") {
        return Ok(());
    }
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();
    let dir = tempfile::Builder::new()
        .prefix("carina-capacity-")
        .tempdir()?;
    let pki = Pki::write(&dir.path().join("pki"))?;
    let group = unique("cap");

    // The chart's CSIDriver: without `storageCapacity: true` kube-scheduler
    // would not look at the objects.
    let driver: CSIDriver = serde_json::from_value(chart_csidriver()?)?;
    assert_eq!(
        driver.spec.storage_capacity,
        Some(true),
        "the chart's CSIDriver asks for capacity tracking"
    );
    Api::<CSIDriver>::all(client.clone())
        .create(&PostParams::default(), &driver)
        .await
        .context("create the CSIDriver")?;

    // A 1 GiB node and a 4 GiB node, one LVM group of the same name.
    let mut nodes = Vec::new();
    for (name, bytes) in [(SMALL, GIB), (LARGE, 4 * GIB)] {
        nodes.push(LvmNode::start(&cluster, &pki, dir.path(), name, &group, bytes).await?);
        add_topology(&client, name).await?;
    }
    let controller = KubeControllerArgs::new(
        "carina-controller",
        &unique("carina-controller"),
        cluster.kubeconfig_path(),
        &pki,
        dir.path(),
        &cluster.log_dir().join("carina-controller.log"),
    )
    .start()
    .await?;
    for n in [SMALL, LARGE] {
        await_capacity(&client, n, WAIT).await?;
    }

    // external-provisioner as the chart runs it, less what only a pod
    // has: the CSIStorageCapacity objects get no owner here (the chart's
    // Deployment owns them through the pod's ReplicaSet).
    let mut provisioner = csi_provisioner(
        &cluster,
        controller.socket(),
        &[
            "--enable-capacity",
            "--capacity-ownerref-level=-1",
            "--capacity-poll-interval=5s",
        ],
        &[("NAMESPACE", CAPACITY_NAMESPACE)],
    )?;
    let _controllers = cluster.start_controller_manager(&[]).await?;
    let _scheduler = cluster.start_scheduler(&[]).await?;

    let ns = unique("capacity");
    add_namespace(&client, &ns).await?;
    add_class(&client, CLASS, &group).await?;

    let published = await_capacities(&client, CLASS, &[SMALL, LARGE]).await?;
    let (small, _) = published[SMALL];
    let (large, _) = published[LARGE];
    assert!(
        small < 2 * GIB && large >= 2 * GIB,
        "a 2 GiB claim fits only the large node: {published:?}"
    );
    assert!(
        large < 10 * GIB,
        "a 10 GiB claim fits nowhere: {published:?}"
    );

    // Fits only on the large node.
    workload::pod_with_claim(&client, &ns, "fits-large", CLASS, "2Gi").await?;
    let node = scheduled_node(&client, &ns, "fits-large").await?;
    assert_eq!(
        node, LARGE,
        "kube-scheduler put the pod where its claim fits"
    );
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let claim = claims.get("fits-large").await?;
    let volume = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .context("the claim is bound")?;
    let lvs: Api<LogicVolume> = Api::all(client.clone());
    let lv = lvs
        .get(&local_name(&volume))
        .await
        .with_context(|| format!("the LogicVolume of {volume}"))?;
    assert_eq!(lv.spec.node_name, LARGE, "the volume is on the pod's node");

    // Fits nowhere: stays Pending, for capacity, and nothing is made.
    workload::pod_with_claim(&client, &ns, "fits-nowhere", CLASS, "10Gi").await?;
    let message = failed_scheduling(
        &client,
        &ns,
        "fits-nowhere",
        "did not have enough free storage",
    )
    .await?;
    assert!(message.contains("0/2 nodes are available"), "{message}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pending = pods.get("fits-nowhere").await?;
    assert_eq!(workload::node_of(Some(&pending)), None, "not scheduled");
    assert!(workload::unschedulable(&pending), "marked unschedulable");
    let claim = claims.get("fits-nowhere").await?;
    assert!(
        claim
            .annotations()
            .get("volume.kubernetes.io/selected-node")
            .is_none(),
        "no node was selected for the claim: {:?}",
        claim.annotations()
    );
    let made = lvs.list(&ListParams::default()).await?.items.len();
    assert_eq!(made, 1, "only the first claim got a volume");

    provisioner
        .check_running()
        .context("csi-provisioner kept running")?;
    drop(nodes);
    Ok(())
}
