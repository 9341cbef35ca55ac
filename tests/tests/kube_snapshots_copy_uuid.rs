//! An xfs claim's restore and clone, on a node with an LVM and a RAW
//! group, stage beside the still mounted claim (their filesystems have
//! UUIDs of their own), as kubelet stages them through the node's CSI
//! socket; through the Kubernetes objects, with the snapshot control plane
//! of [`carina_tests::snapshots`] (the chart's controller and sidecars,
//! external-snapshotter's snapshot-controller).
//!
//! Needs root and loop devices, `tests/tools/build.sh etcd kube helm
//! csi-provisioner csi-snapshotter`, and `cargo build --workspace --bins`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};
use carina_api::LogicVolume;
use carina_csi::names::local_name;
use carina_csi::snapshot_id::local_snapshot_name;
use carina_csi::{DRIVER_NAME, context};
use carina_proto::csi;
use carina_proto::csi::node_client::NodeClient;
use carina_tests::cluster::{NodeArgs, Pki, register_node};
use carina_tests::csi::mount_cap;
use carina_tests::grpc::unix_channel;
use carina_tests::kube::gone;
use carina_tests::snapshots::{
    MIB, SNAPSHOT_GROUP, SnapshotPlane, WAIT, bound_volume, claim, create_snapshot_class,
    snapshot_cluster, take_snapshot, volume_snapshots, word,
};
use carina_tests::workload::add_namespace;
use carina_tests::{LoopDisk, VgGuard, have_root, mounts_under, run, unique};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use tonic::transport::Channel;

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
    let (cluster, dir) = snapshot_cluster("carina-xfs-copies-").await?;
    let client = cluster.client();
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
    create_snapshot_class(&client, &snapshot_class).await?;
    let snapshots = volume_snapshots(&client, &ns);
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
                &claim(&ns, &source, &class, "Filesystem", XFS_CLAIM, None)?,
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
        let ready = take_snapshot(&snapshots, &snap, &snapshot_class, &source).await?;
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
                    &claim(&ns, &name, &class, "Filesystem", XFS_CLAIM, Some(from))?,
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
