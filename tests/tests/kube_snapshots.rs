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
//! The control plane is [`carina_tests::snapshots`]'s; that the copies of
//! a mounted xfs claim get UUIDs of their own is kube_snapshots_copy_uuid.
//!
//! Needs root and loop devices, `tests/tools/build.sh etcd kube helm
//! csi-provisioner csi-snapshotter`, and `cargo build --workspace --bins`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use carina_api::quantity::quantity_bytes;
use carina_api::{LogicVolume, LogicVolumeSource};
use carina_csi::names::local_name;
use carina_csi::snapshot_id::{self, local_snapshot_name};
use carina_csi::{DRIVER_NAME, context};
use carina_tests::cluster::{LvmNode, Pki};
use carina_tests::kube::gone;
use carina_tests::snapshots::{
    MIB, SNAPSHOT_GROUP, SnapshotPlane, WAIT, bound_volume, claim, create_snapshot_class, field,
    snapshot_cluster, snapshot_resource, take_snapshot, volume_snapshots, word,
};
use carina_tests::workload::add_namespace;
use carina_tests::{have_root, lvm, unique};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

const NODE: &str = "node-snap";
const DISK_BYTES: u64 = 1 << 30;
/// The claims' size; the pattern covers all of it.
const CLAIM: &str = "64Mi";
const CLAIM_BYTES: u64 = 64 * MIB;

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
    let (cluster, dir) = snapshot_cluster("carina-snapshots-").await?;
    let client = cluster.client();
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
        .create(
            &PostParams::default(),
            &claim(&ns, "source", &class, "Block", CLAIM, None)?,
        )
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
    let content_resource = snapshot_resource("VolumeSnapshotContent", "volumesnapshotcontents");
    let snapshot_class = unique("carina-snapclass");
    create_snapshot_class(&client, &snapshot_class).await?;
    let snapshots = volume_snapshots(&client, &ns);
    let contents: Api<DynamicObject> = Api::all_with(client.clone(), &content_resource);
    let snapshot = take_snapshot(&snapshots, "snap", &snapshot_class, "source").await?;
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
                &claim(&ns, name, &class, "Block", CLAIM, Some(source))?,
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
