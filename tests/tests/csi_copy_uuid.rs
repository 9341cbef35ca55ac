//! Copies of a filesystem volume mount beside their source, as a
//! database operator uses them, through the direct control plane's CSI
//! sockets: the Controller (a `DirectProvisioner` reaching an in-process
//! NodeStorage server over mutual TLS) and the node's CSI Node service on
//! the same engine, each on a unix socket and called through a tonic
//! client as the sidecars and kubelet call them.
//!
//! For each policy with block copies (LVM, RAW) and each filesystem (xfs,
//! ext4): a volume is staged, published and written; a snapshot of it is
//! taken; a clone of it and a volume restored from the snapshot are
//! created, and both are staged and published on the same node **while
//! the source stays mounted**. Both must stage (XFS refuses a second
//! filesystem with a UUID already mounted), show the source's data, and
//! carry a filesystem UUID of their own, different from the source's and
//! from each other's, as `blkid` reads it from the devices (probing) and
//! as its lookup by UUID resolves it.
//!
//! Needs root (loop devices, LVM, mounts).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use carina_controlplane::direct::DirectProvisioner;
use carina_controlplane::nodes::spec::{NodeList, NodeSpec};
use carina_csi::strategy::Strategy;
use carina_csi::{Topology, context};
use carina_node::csi_local::serve::CsiNodeServer;
use carina_proto::csi;
use carina_proto::csi::node_client::NodeClient;
use carina_proto::csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
use carina_proto::devcerts::{DevCa, Validity};
use carina_tests::csi::{ServedController, ServedCsi, create, delete, make, mount_cap};
use carina_tests::grpc::{TestNode, server_cert, start_engine};
use carina_tests::{LoopDisk, VgGuard, have_root, mounts_under, run, unique};
use tonic::transport::Channel;

const MIB: u64 = 1 << 20;
const NODE: &str = "node-a";
/// Above xfs's smallest (300 MiB), a whole number of LVM extents.
const VOLUME: u64 = 320 * MIB;
/// Room for four volumes (source, snapshot, clone, restore) and metadata.
const DISK: u64 = 1400 * MIB;
/// What the test writes into the source.
const DATA: usize = 6 * MIB as usize;

/// Unmounts (lazily, deepest first) every mount under its root on drop.
struct WorkDir {
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl WorkDir {
    fn new() -> Result<WorkDir> {
        let dir = tempfile::Builder::new()
            .prefix("carina-copy-uuid-")
            .tempdir()?;
        Ok(WorkDir {
            root: dir.path().canonicalize()?,
            _dir: dir,
        })
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let mut mounts = mounts_under(&self.root);
        mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in mounts {
            let _ = run("umount", &["-l", &m.to_string_lossy()]);
        }
    }
}

/// One node with one block group, the direct control plane's Controller
/// and the node's CSI Node service. Fields drop in order: the mounts
/// first, then the servers, the volume group and the disk.
struct Rig {
    work: WorkDir,
    controller: ServedController,
    node: NodeClient<Channel>,
    _node_csi: ServedCsi,
    _storage: TestNode,
    group: String,
    _vg: Option<VgGuard>,
    _disk: LoopDisk,
}

impl Rig {
    async fn start(policy: &str) -> Result<Rig> {
        let work = WorkDir::new()?;
        let disk = LoopDisk::new(DISK)?;
        let group = unique("uuid");
        let vg = (policy == "LVM").then(|| VgGuard::new(&group, &[&disk]));
        let engine = start_engine(&carina_tests::disk_group_config(
            &group,
            policy,
            &[&disk],
            0,
        ))
        .await?;
        let ca = DevCa::new("carina copy uuid test CA", Validity::days(1))?;
        let server = server_cert(&ca, NODE, Validity::days(1))?;
        let storage = TestNode::start_with(engine.clone(), NODE, ca, &server).await?;
        let list = NodeList::new(vec![NodeSpec {
            name: NODE.to_string(),
            endpoint: storage.endpoint(),
            topology: Topology::new(),
        }])?;
        let provisioner =
            DirectProvisioner::new(list, storage.client_tls("controller")?, Strategy::Binpack);
        let controller = ServedController::start(provisioner, "carina-copy-uuid-ctl-").await?;
        let node_server = CsiNodeServer::new(engine, NODE)
            .max_volumes(100)
            .grace_period(Duration::from_secs(5));
        let node_csi = ServedCsi::start("carina-copy-uuid-node-", |listener, shutdown| {
            node_server.serve(listener, shutdown)
        })
        .await?;
        Ok(Rig {
            work,
            controller,
            node: NodeClient::new(node_csi.channel.clone()),
            _node_csi: node_csi,
            _storage: storage,
            group,
            _vg: vg,
            _disk: disk,
        })
    }

    /// `CreateVolume` of `name` in the group, formatted `fs` when staged,
    /// filled from `source` if given.
    async fn volume(&mut self, name: &str, fs: &str, source: Option<Type>) -> Result<csi::Volume> {
        let mut req = create(name, VOLUME, fs);
        req.parameters
            .insert(context::GROUP.to_string(), self.group.clone());
        req.volume_content_source = source.map(|t| csi::VolumeContentSource { r#type: Some(t) });
        make(&mut self.controller.csi, req).await
    }

    /// Stages `v` at `<name>/staging` and publishes it at `<name>/pod`;
    /// returns the published directory.
    async fn stage_and_publish(
        &mut self,
        name: &str,
        v: &csi::Volume,
        fs: &str,
    ) -> Result<PathBuf> {
        let staging = self.work.path(&format!("{name}/staging"));
        let pod = self.work.path(&format!("{name}/pod"));
        std::fs::create_dir_all(&staging)?;
        self.node
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: v.volume_id.clone(),
                staging_target_path: staging.to_string_lossy().into_owned(),
                volume_capability: Some(mount_cap(fs)),
                volume_context: v.volume_context.clone(),
                ..Default::default()
            })
            .await
            .with_context(|| format!("NodeStageVolume of {name} ({})", v.volume_id))?;
        self.node
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: v.volume_id.clone(),
                staging_target_path: staging.to_string_lossy().into_owned(),
                target_path: pod.to_string_lossy().into_owned(),
                volume_capability: Some(mount_cap(fs)),
                volume_context: v.volume_context.clone(),
                ..Default::default()
            })
            .await
            .with_context(|| format!("NodePublishVolume of {name} ({})", v.volume_id))?;
        Ok(pod)
    }

    /// Unpublishes and unstages what [`Rig::stage_and_publish`] did.
    async fn unpublish_and_unstage(&mut self, name: &str, v: &csi::Volume) -> Result<()> {
        self.node
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: v.volume_id.clone(),
                target_path: self
                    .work
                    .path(&format!("{name}/pod"))
                    .to_string_lossy()
                    .into_owned(),
            })
            .await
            .with_context(|| format!("NodeUnpublishVolume of {name}"))?;
        self.node
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: v.volume_id.clone(),
                staging_target_path: self
                    .work
                    .path(&format!("{name}/staging"))
                    .to_string_lossy()
                    .into_owned(),
            })
            .await
            .with_context(|| format!("NodeUnstageVolume of {name}"))?;
        Ok(())
    }
}

fn device(v: &csi::Volume) -> Result<PathBuf> {
    v.volume_context
        .get(context::PATH)
        .map(PathBuf::from)
        .with_context(|| format!("no device in the context of {}", v.volume_id))
}

/// The filesystem UUID on `dev`, probed from the device itself.
fn probed_uuid(dev: &Path) -> Result<String> {
    let uuid = run(
        "blkid",
        &["-p", "-o", "value", "-s", "UUID", &dev.to_string_lossy()],
    )?;
    let uuid = uuid.trim().to_string();
    ensure!(!uuid.is_empty(), "{} has no filesystem UUID", dev.display());
    Ok(uuid)
}

/// Every device `blkid` finds with filesystem UUID `uuid` among all the
/// node's block devices (what `findfs`, `mount UUID=` and a
/// `/dev/disk/by-uuid` link choose from), canonical.
fn devices_with_uuid(uuid: &str) -> Result<Vec<PathBuf>> {
    // No cache: every device is probed now.
    let out = run(
        "blkid",
        &[
            "-c",
            "/dev/null",
            "-t",
            &format!("UUID={uuid}"),
            "-o",
            "device",
        ],
    )?;
    out.lines()
        .map(|l| Ok(std::fs::canonicalize(l.trim())?))
        .collect()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The scenario of the module header for one policy and filesystem.
async fn copies_mount_beside_their_source(test: &str, policy: &str, fs: &str) -> Result<()> {
    if !have_root(test) {
        return Ok(());
    }
    let mut rig = Rig::start(policy).await?;
    let data = pattern(7, DATA);

    // The source: staged, published, written, and left mounted.
    let source = rig.volume("pvc-source", fs, None).await?;
    let source_pod = rig.stage_and_publish("source", &source, fs).await?;
    {
        use std::io::Write;
        let mut f = std::fs::File::create(source_pod.join("data.bin"))?;
        f.write_all(&data)?;
        f.sync_all()?;
    }

    // A snapshot, a clone and a restore, made while the source is mounted
    // (so it is frozen for each copy).
    let snapshot = rig
        .controller
        .csi
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: source.volume_id.clone(),
            name: "snap-1".into(),
            ..Default::default()
        })
        .await
        .context("CreateSnapshot")?
        .into_inner()
        .snapshot
        .context("no snapshot")?;
    ensure!(snapshot.ready_to_use, "{snapshot:?}");
    let clone = rig
        .volume(
            "pvc-clone",
            fs,
            Some(Type::Volume(VolumeSource {
                volume_id: source.volume_id.clone(),
            })),
        )
        .await?;
    let restored = rig
        .volume(
            "pvc-restored",
            fs,
            Some(Type::Snapshot(SnapshotSource {
                snapshot_id: snapshot.snapshot_id.clone(),
            })),
        )
        .await?;

    // Both stage and publish beside the mounted source, with its data.
    for (name, copy) in [("clone", &clone), ("restored", &restored)] {
        let pod = rig
            .stage_and_publish(name, copy, fs)
            .await
            .with_context(|| format!("{policy} {fs}: the {name} beside its mounted source"))?;
        let read = std::fs::read(pod.join("data.bin"))
            .with_context(|| format!("read data.bin of the {name}"))?;
        ensure!(read == data, "{policy} {fs}: the {name} holds other data");
    }
    ensure!(
        std::fs::read(source_pod.join("data.bin"))? == data,
        "the source changed"
    );

    // Each filesystem has a UUID of its own, on the device and by lookup.
    let devices = [device(&source)?, device(&clone)?, device(&restored)?];
    let uuids = devices
        .iter()
        .map(|d| probed_uuid(d))
        .collect::<Result<Vec<_>>>()?;
    for (i, (uuid, dev)) in uuids.iter().zip(&devices).enumerate() {
        for (j, other) in uuids.iter().enumerate() {
            if i != j && uuid == other {
                bail!(
                    "{policy} {fs}: {} and {} share the UUID {uuid}",
                    dev.display(),
                    devices[j].display()
                );
            }
        }
        let owners = devices_with_uuid(uuid)?;
        ensure!(
            owners == vec![std::fs::canonicalize(dev)?],
            "{policy} {fs}: blkid resolves {uuid} to {owners:?}, not only {}",
            dev.display()
        );
    }

    // Taken down and deleted, in the order kubelet and the sidecars do.
    for (name, v) in [
        ("restored", &restored),
        ("clone", &clone),
        ("source", &source),
    ] {
        rig.unpublish_and_unstage(name, v).await?;
    }
    rig.controller
        .csi
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: snapshot.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .context("DeleteSnapshot")?;
    for v in [&restored, &clone, &source] {
        delete(&mut rig.controller.csi, &v.volume_id).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_xfs_clone_and_restore_mount_beside_the_source() -> Result<()> {
    copies_mount_beside_their_source(
        "lvm_xfs_clone_and_restore_mount_beside_the_source",
        "LVM",
        "xfs",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_xfs_clone_and_restore_mount_beside_the_source() -> Result<()> {
    copies_mount_beside_their_source(
        "raw_xfs_clone_and_restore_mount_beside_the_source",
        "RAW",
        "xfs",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_ext4_copies_have_uuids_of_their_own() -> Result<()> {
    copies_mount_beside_their_source("lvm_ext4_copies_have_uuids_of_their_own", "LVM", "ext4").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_ext4_copies_have_uuids_of_their_own() -> Result<()> {
    copies_mount_beside_their_source("raw_ext4_copies_have_uuids_of_their_own", "RAW", "ext4").await
}
