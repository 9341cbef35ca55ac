//! VolumeSnapshots and clones through the Kubernetes objects, with the
//! real upstream programs: etcd, kube-apiserver and
//! kube-controller-manager (the PV binder) from the harness, the
//! `snapshot.storage.k8s.io/v1` CRDs and `snapshot-controller` of
//! external-snapshotter (`tests/tools/build.sh csi-snapshotter`), and
//! beside `carina-controller --mode kube` the sidecars the Helm chart runs
//! with it: external-provisioner and external-snapshotter's
//! `csi-snapshotter` on the controller's CSI socket (the sidecar with the
//! chart's own arguments). The controller and both sidecars authenticate
//! as the chart's controller ServiceAccount with the chart's ClusterRole,
//! so the chart's RBAC is what they may do. One `carina-node` on an LVM
//! loop disk; no kubelet, so the test writes and reads the volumes'
//! devices itself.
//!
//! It proves, for a claim bound through an `Immediate` StorageClass and
//! holding a known pattern on its device:
//! - a VolumeSnapshot of it (class `carina.storage.io`, deletionPolicy
//!   Delete) becomes readyToUse with the claim's size as restoreSize; its
//!   VolumeSnapshotContent's handle is a `LogicVolume` on the claim's node
//!   with `spec.source {volume: <the claim's>, snapshot: true}`, named
//!   after csi-snapshotter's name for it;
//! - a claim with the VolumeSnapshot as `dataSource` is bound to a new
//!   volume whose device holds the same bytes over the source's size, and
//!   so does a claim with the first claim as `dataSource` (a clone);
//! - deleting the VolumeSnapshot deletes its content and its
//!   `LogicVolume`; deleting the claims deletes their volumes, and the
//!   volume group is empty at the end.
//!
//! And, on a node with an LVM and a RAW group, that an xfs claim's
//! restore and clone stage beside the still mounted claim (their
//! filesystems have UUIDs of their own), as kubelet stages them through
//! the node's CSI socket.
//!
//! Needs root and loop devices, `tests/tools/build.sh etcd kube helm
//! csi-provisioner csi-snapshotter`, and `cargo build --workspace --bins`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use carina_api::quantity::quantity_bytes;
use carina_api::{LogicVolume, LogicVolumeSource};
use carina_csi::names::local_name;
use carina_csi::snapshot_id::{self, local_snapshot_name};
use carina_csi::{DRIVER_NAME, context};
use carina_proto::csi;
use carina_proto::csi::node_client::NodeClient;
use carina_tests::cluster::{
    KubeControllerArgs, LvmNode, NodeArgs, Pki, Service, add_topology, as_chart_service_account,
    await_capacity, await_object, csi_provisioner, register_node,
};
use carina_tests::csi::mount_cap;
use carina_tests::grpc::unix_channel;
use carina_tests::kube::{Component, KubeCluster, gone};
use carina_tests::local::carina::tool_path;
use carina_tests::manifests::{Chart, find, objects};
use carina_tests::process::ChildGuard;
use carina_tests::workload::add_namespace;
use carina_tests::{LoopDisk, VgGuard, have_root, lvm, mounts_under, run, unique};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tonic::transport::Channel;

const NODE: &str = "node-snap";
const MIB: u64 = 1 << 20;
const DISK_BYTES: u64 = 1 << 30;
/// The claims' size; the pattern covers all of it.
const CLAIM: &str = "64Mi";
const CLAIM_BYTES: u64 = 64 * MIB;
/// Bound of every wait for the control plane.
const WAIT: Duration = Duration::from_secs(90);
const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";

/// The VolumeSnapshot CRDs the `csi-snapshotter` tool copied from
/// external-snapshotter's client module, applied by server-side apply and
/// waited for until Established.
async fn install_snapshot_crds(client: &Client) -> Result<()> {
    let dir = tool_path("csi-snapshotter")?.join("../crds");
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for kind in [
        "volumesnapshotclasses",
        "volumesnapshotcontents",
        "volumesnapshots",
    ] {
        let file = dir.join(format!("{SNAPSHOT_GROUP}_{kind}.yaml"));
        let text = std::fs::read_to_string(&file).with_context(|| {
            format!(
                "read {} (run tests/tools/build.sh csi-snapshotter)",
                file.display()
            )
        })?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_json::Value::deserialize(doc)?;
            if value.is_null() {
                continue;
            }
            let crd: CustomResourceDefinition =
                serde_json::from_value(value).with_context(|| file.display().to_string())?;
            let name = crd.name_any();
            api.patch(
                &name,
                &PatchParams::apply("carina-tests").force(),
                &Patch::Apply(&crd),
            )
            .await
            .with_context(|| format!("apply CRD {name}"))?;
            names.push(name);
        }
    }
    ensure!(names.len() == 3, "expected three CRDs, got {names:?}");
    for name in names {
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(WAIT, established)
            .await
            .with_context(|| format!("CRD {name} not Established within {WAIT:?}"))??;
    }
    Ok(())
}

/// The controller Deployment's container `name` as the chart renders it
/// with its default values.
fn chart_container(objs: &[Value], name: &str) -> Result<Value> {
    find(objs, "Deployment", "carina-controller")?["spec"]["template"]["spec"]["containers"]
        .as_array()
        .context("containers")?
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
        .with_context(|| format!("the chart renders no container {name}"))
}

/// A program of the `csi-snapshotter` tool as a process, its log in the
/// cluster's log directory; stopped on drop.
fn snapshot_tool(cluster: &KubeCluster, program: &str, args: Vec<String>) -> Result<ChildGuard> {
    ChildGuard::spawn(
        program,
        &tool_path("csi-snapshotter")?.join(program),
        &args,
        &[],
        &cluster.log_dir().join(format!("{}.log", unique(program))),
    )
}

/// The Kubernetes control plane of snapshots around one node: the
/// controller and its sidecars (external-provisioner, csi-snapshotter with
/// the chart's arguments) with the chart's rights, the cluster-wide
/// snapshot-controller and kube-controller-manager. Stopped on drop.
struct SnapshotPlane {
    provisioner: ChildGuard,
    snapshotter: ChildGuard,
    snapshot_controller: ChildGuard,
    _controllers: Component,
    _controller: Service,
}

impl SnapshotPlane {
    async fn start(cluster: &KubeCluster, pki: &Pki, dir: &Path, node: &str) -> Result<Self> {
        let client = cluster.client();
        add_topology(&client, node).await?;
        let chart = objects(&Chart::new()?.template("kube-system", None)?)?;
        let kubeconfig = as_chart_service_account(cluster, &chart, dir).await?;
        let controller = KubeControllerArgs::new(
            "carina-controller",
            // The chart's Lease name: its Role names no other (the cluster is
            // this test's own).
            "carina-controller",
            &kubeconfig,
            pki,
            dir,
            &cluster.log_dir().join("carina-controller.log"),
        )
        .start()
        .await?;
        await_capacity(&client, node, WAIT).await?;
        let as_sa = format!("--kubeconfig={}", kubeconfig.display());
        let provisioner = csi_provisioner(
            cluster,
            controller.socket(),
            &[
                &as_sa,
                "--feature-gates=Topology=true",
                "--extra-create-metadata",
                // Its Lease, as in the chart: only that name may be renewed.
                "--leader-election",
                "--leader-election-namespace=kube-system",
            ],
            &[],
        )?;
        // csi-snapshotter with the chart's arguments, on this socket.
        let mut snapshotter_args: Vec<String> = chart_container(&chart, "csi-snapshotter")?["args"]
            .as_array()
            .context("csi-snapshotter args")?
            .iter()
            .filter_map(|a| a.as_str())
            .map(|a| {
                if a.starts_with("--csi-address=") {
                    format!("--csi-address={}", controller.socket().display())
                } else {
                    a.to_string()
                }
            })
            .collect();
        snapshotter_args.extend([as_sa.clone(), "--v=4".to_string()]);
        let snapshotter = snapshot_tool(cluster, "csi-snapshotter", snapshotter_args)?;
        // The cluster-wide snapshot-controller, as an administrator installs it.
        let snapshot_controller = snapshot_tool(
            cluster,
            "snapshot-controller",
            vec![
                format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
                "--feature-gates=CSIVolumeGroupSnapshot=false".to_string(),
                "--v=4".to_string(),
            ],
        )?;
        let controllers = cluster.start_controller_manager(&[]).await?;
        Ok(SnapshotPlane {
            provisioner,
            snapshotter,
            snapshot_controller,
            _controllers: controllers,
            _controller: controller,
        })
    }

    /// Fails naming the first of the upstream programs that exited.
    fn check_running(&mut self) -> Result<()> {
        for (name, process) in [
            ("csi-provisioner", &mut self.provisioner),
            ("csi-snapshotter", &mut self.snapshotter),
            ("snapshot-controller", &mut self.snapshot_controller),
        ] {
            process
                .check_running()
                .with_context(|| format!("{name} kept running"))?;
        }
        Ok(())
    }
}

fn snapshot_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(SNAPSHOT_GROUP, "v1", kind), plural)
}

/// A raw-block claim of [`CLAIM`] in `class`, filled from `source` (a
/// `dataSource`) when given.
fn claim(
    ns: &str,
    name: &str,
    class: &str,
    source: Option<Value>,
) -> Result<PersistentVolumeClaim> {
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "volumeMode": "Block",
        "storageClassName": class,
        "resources": {"requests": {"storage": CLAIM}},
    });
    if let Some(source) = source {
        spec["dataSource"] = source;
    }
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))?)
}

/// Waits, by watch, until claim `name` is Bound; returns its PV.
async fn bound_volume(client: &Client, ns: &str, name: &str) -> Result<PersistentVolume> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let claim = await_object(&claims, name, "Bound", WAIT, |c| {
        c.and_then(|c| c.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Bound")
    })
    .await?
    .with_context(|| format!("claim {name} deleted while waiting"))?;
    let pv = claim
        .spec
        .and_then(|s| s.volume_name)
        .with_context(|| format!("claim {name} is Bound without a volume"))?;
    Ok(Api::<PersistentVolume>::all(client.clone())
        .get(&pv)
        .await?)
}

/// The `LogicVolume` of `pv` (made) and its device on the node: the PV's
/// `carina.storage.io/path`, which the object's status names too.
async fn device_of(client: &Client, pv: &PersistentVolume) -> Result<(LogicVolume, PathBuf)> {
    let csi = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .with_context(|| format!("PV {} is not a CSI volume", pv.name_any()))?;
    assert_eq!(csi.driver, DRIVER_NAME);
    let path = csi
        .volume_attributes
        .as_ref()
        .and_then(|a| a.get(context::PATH))
        .with_context(|| format!("PV {} has no {}", pv.name_any(), context::PATH))?;
    let lv = Api::<LogicVolume>::all(client.clone())
        .get(&local_name(&pv.name_any()))
        .await
        .with_context(|| format!("the LogicVolume of PV {}", pv.name_any()))?;
    let status = lv
        .status
        .as_ref()
        .context("a made LogicVolume has a status")?;
    assert_eq!(
        status.path.as_deref(),
        Some(path.as_str()),
        "the PV and its LogicVolume name the same device"
    );
    assert_eq!(lv.spec.node_name, NODE);
    Ok((lv, PathBuf::from(path)))
}

/// The pattern's 8-byte word at word index `i`: every word differs, so a
/// block copied to the wrong place shows.
fn word(i: u64) -> [u8; 8] {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xC0FF_EE00_CAFE_0001).to_le_bytes()
}

/// Writes the pattern over the first `len` bytes of `dev`, synced.
fn write_pattern(dev: &Path, len: u64) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(dev)
        .with_context(|| format!("open {} for writing", dev.display()))?;
    let mut chunk = vec![0u8; MIB as usize];
    for mib in 0..len / MIB {
        for (w, out) in chunk.chunks_exact_mut(8).enumerate() {
            out.copy_from_slice(&word(mib * (MIB / 8) + w as u64));
        }
        f.write_all(&chunk)?;
    }
    f.sync_all()?;
    Ok(())
}

/// FNV-1a (64 bit) of the first `len` bytes of `dev`, and the offset of
/// the first MiB that differs from the pattern (`None`: all match).
fn checksum(dev: &Path, len: u64) -> Result<(u64, Option<u64>)> {
    let mut f = std::fs::File::open(dev).with_context(|| format!("open {}", dev.display()))?;
    let mut chunk = vec![0u8; MIB as usize];
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut first_bad = None;
    for mib in 0..len / MIB {
        f.read_exact(&mut chunk)
            .with_context(|| format!("read {} at {mib} MiB", dev.display()))?;
        for (w, bytes) in chunk.chunks_exact(8).enumerate() {
            if first_bad.is_none() && bytes != word(mib * (MIB / 8) + w as u64) {
                first_bad = Some(mib * MIB);
            }
            for b in bytes {
                hash = (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    }
    Ok((hash, first_bad))
}

fn field<'a>(o: &'a DynamicObject, path: &[&str]) -> &'a Value {
    path.iter().fold(&o.data, |v, k| &v[*k])
}

/// The names of all `LogicVolume`s.
async fn logic_volumes(client: &Client) -> Result<Vec<String>> {
    let mut names: Vec<String> = Api::<LogicVolume>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|lv| lv.name_any())
        .collect();
    names.sort();
    Ok(names)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_snapshots_and_clones_hold_the_source_data() -> Result<()> {
    if !have_root("volume_snapshots_and_clones_hold_the_source_data") {
        return Ok(());
    }
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();
    install_snapshot_crds(&client).await?;
    let dir = tempfile::Builder::new()
        .prefix("carina-snapshots-")
        .tempdir()?;
    let pki = Pki::write(&dir.path().join("pki"))?;
    let group = unique("snap");
    let node = LvmNode::start(&cluster, &pki, dir.path(), NODE, &group, DISK_BYTES).await?;
    let mut plane = SnapshotPlane::start(&cluster, &pki, dir.path(), NODE).await?;

    let ns = unique("snapshots");
    add_namespace(&client, &ns).await?;
    let class = unique("carina-snap");
    let storage_class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": class},
        "provisioner": DRIVER_NAME,
        "parameters": {"carina.storage.io/disk-group-name": group},
        "volumeBindingMode": "Immediate",
        "reclaimPolicy": "Delete",
    }))?;
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &storage_class)
        .await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let lvs: Api<LogicVolume> = Api::all(client.clone());

    // The source claim, with the pattern over all of it.
    claims
        .create(&PostParams::default(), &claim(&ns, "source", &class, None)?)
        .await?;
    let source_pv = bound_volume(&client, &ns, "source").await?;
    let (source_lv, source_dev) = device_of(&client, &source_pv).await?;
    let source_bytes = quantity_bytes(
        source_lv
            .status
            .as_ref()
            .and_then(|s| s.current_size.as_ref())
            .context("currentSize")?,
    )?;
    assert_eq!(source_bytes, CLAIM_BYTES, "{source_lv:?}");
    write_pattern(&source_dev, source_bytes)?;
    let (source_sum, bad) = checksum(&source_dev, source_bytes)?;
    assert_eq!(bad, None, "the source reads back as written");

    // A class and a snapshot of the claim.
    let class_resource = snapshot_resource("VolumeSnapshotClass", "volumesnapshotclasses");
    let snapshot_resource_ = snapshot_resource("VolumeSnapshot", "volumesnapshots");
    let content_resource = snapshot_resource("VolumeSnapshotContent", "volumesnapshotcontents");
    let snapshot_class = unique("carina-snapclass");
    Api::<DynamicObject>::all_with(client.clone(), &class_resource)
        .create(
            &PostParams::default(),
            &DynamicObject::new(&snapshot_class, &class_resource).data(json!({
                "driver": DRIVER_NAME,
                "deletionPolicy": "Delete",
            })),
        )
        .await
        .context("create the VolumeSnapshotClass")?;
    let snapshots: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &snapshot_resource_);
    let contents: Api<DynamicObject> = Api::all_with(client.clone(), &content_resource);
    snapshots
        .create(
            &PostParams::default(),
            &DynamicObject::new("snap", &snapshot_resource_)
                .within(&ns)
                .data(json!({"spec": {
                    "volumeSnapshotClassName": snapshot_class,
                    "source": {"persistentVolumeClaimName": "source"},
                }})),
        )
        .await
        .context("create the VolumeSnapshot")?;
    let snapshot = await_object(&snapshots, "snap", "readyToUse", WAIT, |s| {
        s.is_some_and(|s| field(s, &["status", "readyToUse"]) == &json!(true))
    })
    .await?
    .context("the VolumeSnapshot was deleted")?;
    let restore_size: Quantity =
        serde_json::from_value(field(&snapshot, &["status", "restoreSize"]).clone())
            .with_context(|| format!("restoreSize of {:?}", snapshot.data))?;
    assert_eq!(quantity_bytes(&restore_size)?, source_bytes, "restoreSize");
    let content_name = field(&snapshot, &["status", "boundVolumeSnapshotContentName"])
        .as_str()
        .context("boundVolumeSnapshotContentName")?
        .to_string();
    let content = contents.get(&content_name).await?;
    assert_eq!(field(&content, &["spec", "driver"]), &json!(DRIVER_NAME));
    assert_eq!(field(&content, &["status", "readyToUse"]), &json!(true));
    let handle = field(&content, &["status", "snapshotHandle"])
        .as_str()
        .context("snapshotHandle")?
        .to_string();
    let id = snapshot_id::parse("snapshotHandle", &handle)
        .map_err(|e| anyhow::anyhow!("snapshotHandle {handle:?}: {e:?}"))?;
    assert_eq!(id.node, NODE, "the snapshot is on its source's node");
    // csi-snapshotter names the snapshot `snapshot-<VolumeSnapshot uid>`.
    let snapshot_uid = snapshot.uid().context("uid")?;
    assert_eq!(
        id.volume,
        local_snapshot_name(&format!("snapshot-{snapshot_uid}"))
    );
    let snapshot_lv = lvs.get(&id.volume).await?;
    assert_eq!(
        snapshot_lv.spec.source,
        Some(LogicVolumeSource {
            volume: source_lv.name_any(),
            snapshot: true,
        }),
        "the snapshot's LogicVolume"
    );
    assert_eq!(snapshot_lv.spec.node_name, NODE);
    let snapshot_path = snapshot_lv
        .status
        .as_ref()
        .and_then(|s| s.path.clone())
        .context("the snapshot's device")?;
    let (sum, bad) = checksum(Path::new(&snapshot_path), source_bytes)?;
    assert_eq!((sum, bad), (source_sum, None), "the snapshot's data");

    // A claim restored from the snapshot, and a clone of the source claim.
    for (name, source) in [
        (
            "restored",
            json!({"apiGroup": SNAPSHOT_GROUP, "kind": "VolumeSnapshot", "name": "snap"}),
        ),
        (
            "clone",
            json!({"kind": "PersistentVolumeClaim", "name": "source"}),
        ),
    ] {
        claims
            .create(
                &PostParams::default(),
                &claim(&ns, name, &class, Some(source))?,
            )
            .await?;
    }
    let mut copies = Vec::new();
    for (name, from, from_snapshot) in [
        ("restored", id.volume.clone(), true),
        ("clone", source_lv.name_any(), false),
    ] {
        let pv = bound_volume(&client, &ns, name).await?;
        let (lv, dev) = device_of(&client, &pv).await?;
        assert_eq!(
            lv.spec.source,
            Some(LogicVolumeSource {
                volume: from.clone(),
                snapshot: false,
            }),
            "{name}: a copy of {from} (from a snapshot: {from_snapshot})"
        );
        assert_ne!(dev, source_dev, "{name} has a device of its own");
        let (sum, bad) = checksum(&dev, source_bytes)?;
        assert_eq!(
            (sum, bad),
            (source_sum, None),
            "{name}: the data of the source over its {source_bytes} bytes"
        );
        copies.push(lv.name_any());
    }

    // Deleting the snapshot deletes its content and its volume.
    snapshots.delete("snap", &DeleteParams::default()).await?;
    gone(&snapshots, "snap", WAIT).await?;
    gone(&contents, &content_name, WAIT).await?;
    gone(&lvs, &id.volume, WAIT).await?;

    // Deleting the claims deletes their volumes.
    for name in ["restored", "clone", "source"] {
        claims.delete(name, &DeleteParams::default()).await?;
    }
    for lv in copies.iter().chain([&source_lv.name_any()]) {
        gone(&lvs, lv, WAIT).await?;
    }
    assert_eq!(logic_volumes(&client).await?, Vec::<String>::new());
    let left = lvm(
        &[&node.disk.dev()],
        &["lvs", "--noheadings", "-o", "lv_name", &group],
    )?;
    if !left.trim().is_empty() {
        bail!("volumes left in {group}: {left}");
    }

    plane.check_running()?;
    drop(plane);
    drop(node);
    Ok(())
}

/// A filesystem claim of `size` in `class`, filled from `source` when
/// given.
fn filesystem_claim(
    ns: &str,
    name: &str,
    class: &str,
    size: &str,
    source: Option<Value>,
) -> Result<PersistentVolumeClaim> {
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "volumeMode": "Filesystem",
        "storageClassName": class,
        "resources": {"requests": {"storage": size}},
    });
    if let Some(source) = source {
        spec["dataSource"] = source;
    }
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))?)
}

/// kubelet's part for one PV of an xfs claim, through the node's CSI
/// socket: stages it at `<dir>/<name>/staging` and publishes it at
/// `<dir>/<name>/pod`, which it returns.
async fn stage_and_publish(
    node: &mut NodeClient<Channel>,
    dir: &Path,
    name: &str,
    pv: &PersistentVolume,
) -> Result<PathBuf> {
    let source = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .with_context(|| format!("PV {} is not a CSI volume", pv.name_any()))?;
    let staging = dir.join(name).join("staging");
    let pod = dir.join(name).join("pod");
    std::fs::create_dir_all(&staging)?;
    let attributes = source.volume_attributes.clone().unwrap_or_default();
    node.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: source.volume_handle.clone(),
        staging_target_path: staging.to_string_lossy().into_owned(),
        volume_capability: Some(mount_cap("xfs")),
        volume_context: attributes.clone().into_iter().collect(),
        ..Default::default()
    })
    .await
    .with_context(|| format!("NodeStageVolume of {name} ({})", source.volume_handle))?;
    node.node_publish_volume(csi::NodePublishVolumeRequest {
        volume_id: source.volume_handle.clone(),
        staging_target_path: staging.to_string_lossy().into_owned(),
        target_path: pod.to_string_lossy().into_owned(),
        volume_capability: Some(mount_cap("xfs")),
        volume_context: attributes.into_iter().collect(),
        ..Default::default()
    })
    .await
    .with_context(|| format!("NodePublishVolume of {name} ({})", source.volume_handle))?;
    Ok(pod)
}

/// The filesystem UUID on the device of `pv`, probed from the device.
fn uuid_of(pv: &PersistentVolume) -> Result<String> {
    let dev = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .and_then(|c| c.volume_attributes.as_ref())
        .and_then(|a| a.get(context::PATH))
        .with_context(|| format!("PV {} names no device", pv.name_any()))?;
    let uuid = run("blkid", &["-p", "-o", "value", "-s", "UUID", dev])?;
    ensure!(!uuid.trim().is_empty(), "{dev} has no filesystem UUID");
    Ok(uuid.trim().to_string())
}

/// Through the Kubernetes objects, for an LVM and a RAW group of one node:
/// an xfs claim is staged, published (through the node's CSI socket, as
/// kubelet would) and written; a claim restored from its VolumeSnapshot
/// and a clone of it are staged and published on the same node while the
/// source stays mounted. Both stage (a copy with the source's UUID does
/// not: XFS refuses a duplicate UUID), hold the source's data and have
/// UUIDs of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xfs_restores_and_clones_stage_beside_their_mounted_source() -> Result<()> {
    const NODE_XFS: &str = "node-xfs-copies";
    const XFS_CLAIM: &str = "320Mi";
    if !have_root("xfs_restores_and_clones_stage_beside_their_mounted_source") {
        return Ok(());
    }
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();
    install_snapshot_crds(&client).await?;
    let dir = tempfile::Builder::new()
        .prefix("carina-xfs-copies-")
        .tempdir()?;
    let work = dir.path().canonicalize()?;
    let pki = Pki::write(&work.join("pki"))?;
    // One node with an LVM and a RAW group, room for four volumes in each.
    let lvm_disk = LoopDisk::new(1400 * MIB)?;
    let raw_disk = LoopDisk::new(1400 * MIB)?;
    let lvm_group = unique("xfs-lvm");
    let raw_group = unique("xfs-raw");
    let _vg = VgGuard::new(&lvm_group, &[&lvm_disk]);
    let config = json!({
        "diskSelector": [
            {"name": lvm_group, "re": [lvm_disk.pattern()], "policy": "LVM", "reserveBytes": 0, "minDiskBytes": MIB},
            {"name": raw_group, "re": [raw_disk.pattern()], "policy": "RAW", "reserveBytes": 0, "minDiskBytes": MIB},
        ],
        "diskScanInterval": "0",
    });
    let args = NodeArgs::new(
        NODE_XFS,
        &pki,
        &config.to_string(),
        &work.join(NODE_XFS),
        &cluster.log_dir().join(format!("{NODE_XFS}.log")),
    )?;
    let _node_process = args.start().await?;
    register_node(&client, NODE_XFS, &args.endpoint()).await?;
    // Unmounts what the test staged, also when it fails (before the node
    // and the disks go).
    let unmount = Unmount(work.clone());
    let mut plane = SnapshotPlane::start(&cluster, &pki, &work, NODE_XFS).await?;
    let mut node = NodeClient::new(unix_channel(args.csi_socket.clone()).await?);

    let ns = unique("xfs-copies");
    add_namespace(&client, &ns).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let snapshot_class = unique("carina-xfs-snapclass");
    let class_resource = snapshot_resource("VolumeSnapshotClass", "volumesnapshotclasses");
    let snapshot_resource_ = snapshot_resource("VolumeSnapshot", "volumesnapshots");
    Api::<DynamicObject>::all_with(client.clone(), &class_resource)
        .create(
            &PostParams::default(),
            &DynamicObject::new(&snapshot_class, &class_resource).data(json!({
                "driver": DRIVER_NAME,
                "deletionPolicy": "Delete",
            })),
        )
        .await
        .context("create the VolumeSnapshotClass")?;
    let snapshots: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &snapshot_resource_);
    let data: Vec<u8> = (0..4 * MIB).flat_map(|i| word(i)[..1].to_vec()).collect();
    // The LogicVolumes made, to see them gone at the end.
    let mut made = Vec::new();

    for (policy, group) in [("lvm", &lvm_group), ("raw", &raw_group)] {
        let class = unique(&format!("carina-xfs-{policy}"));
        let storage_class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": class},
            "provisioner": DRIVER_NAME,
            "parameters": {
                "carina.storage.io/disk-group-name": group,
                "csi.storage.k8s.io/fstype": "xfs",
            },
            "volumeBindingMode": "Immediate",
            "reclaimPolicy": "Delete",
        }))?;
        Api::<StorageClass>::all(client.clone())
            .create(&PostParams::default(), &storage_class)
            .await?;

        let source = format!("{policy}-source");
        claims
            .create(
                &PostParams::default(),
                &filesystem_claim(&ns, &source, &class, XFS_CLAIM, None)?,
            )
            .await?;
        let source_pv = bound_volume(&client, &ns, &source).await?;
        made.push(local_name(&source_pv.name_any()));
        let source_pod = stage_and_publish(&mut node, &work, &source, &source_pv).await?;
        {
            let mut f = std::fs::File::create(source_pod.join("data.bin"))?;
            f.write_all(&data)?;
            f.sync_all()?;
        }

        let snap = format!("{policy}-snap");
        snapshots
            .create(
                &PostParams::default(),
                &DynamicObject::new(&snap, &snapshot_resource_)
                    .within(&ns)
                    .data(json!({"spec": {
                        "volumeSnapshotClassName": snapshot_class,
                        "source": {"persistentVolumeClaimName": source},
                    }})),
            )
            .await
            .context("create the VolumeSnapshot")?;
        let ready = await_object(&snapshots, &snap, "readyToUse", WAIT, |s| {
            s.is_some_and(|s| field(s, &["status", "readyToUse"]) == &json!(true))
        })
        .await?
        .context("the VolumeSnapshot was deleted")?;
        made.push(local_snapshot_name(&format!(
            "snapshot-{}",
            ready.uid().context("uid")?
        )));

        let mut uuids = vec![(source.clone(), uuid_of(&source_pv)?)];
        for (name, from) in [
            (
                format!("{policy}-restored"),
                json!({"apiGroup": SNAPSHOT_GROUP, "kind": "VolumeSnapshot", "name": snap}),
            ),
            (
                format!("{policy}-clone"),
                json!({"kind": "PersistentVolumeClaim", "name": source}),
            ),
        ] {
            claims
                .create(
                    &PostParams::default(),
                    &filesystem_claim(&ns, &name, &class, XFS_CLAIM, Some(from))?,
                )
                .await?;
            let pv = bound_volume(&client, &ns, &name).await?;
            made.push(local_name(&pv.name_any()));
            let pod = stage_and_publish(&mut node, &work, &name, &pv)
                .await
                .with_context(|| format!("{name} beside its mounted source"))?;
            let read = std::fs::read(pod.join("data.bin"))
                .with_context(|| format!("read data.bin of {name}"))?;
            ensure!(read == data, "{name} holds other data than its source");
            uuids.push((name, uuid_of(&pv)?));
        }
        for (i, (a, ua)) in uuids.iter().enumerate() {
            for (b, ub) in &uuids[i + 1..] {
                ensure!(ua != ub, "{a} and {b} share the filesystem UUID {ua}");
            }
        }
    }
    // Unmounted, then every claim and snapshot deleted with its volume.
    drop(unmount);
    for snap in ["lvm-snap", "raw-snap"] {
        snapshots.delete(snap, &DeleteParams::default()).await?;
    }
    for policy in ["lvm", "raw"] {
        for kind in ["restored", "clone", "source"] {
            claims
                .delete(&format!("{policy}-{kind}"), &DeleteParams::default())
                .await?;
        }
    }
    let lvs: Api<LogicVolume> = Api::all(client.clone());
    for lv in &made {
        gone(&lvs, lv, WAIT).await?;
    }
    plane.check_running()?;
    Ok(())
}

/// Unmounts (lazily, deepest first) every mount under its path on drop.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let mut mounts = mounts_under(&self.0);
        mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in mounts {
            let _ = run("umount", &["-l", &m.to_string_lossy()]);
        }
    }
}
