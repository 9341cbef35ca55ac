//! The CSI Node service of an engine as the node tests drive it: the
//! server on a unix socket with its clients ([`CsiNode`]), an engine over
//! one LVM group on a loop disk ([`lvm`]), a work directory that unmounts
//! what is left under it ([`WorkDir`]), the requests kubelet sends, and
//! what `stat -f` and `blkid` say of the result.

use std::path::{Path, PathBuf};
use std::time::Duration;

use carina_node::csi_local::serve::CsiNodeServer;
use carina_node::engine::{CreateRequest, Engine};
use carina_proto::csi;
use carina_proto::csi::identity_client::IdentityClient;
use carina_proto::csi::node_client::NodeClient;
use carina_proto::csi::volume_capability::access_mode::Mode;
use carina_proto::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use tonic::transport::Channel;

use crate::csi::ServedCsi;
use crate::grpc::start_engine;
use crate::{LoopDisk, VgGuard, have_root, mounts_under, run, stat_fs, unique};

/// The node the server is, and the suffix of its volume ids.
pub const NODE: &str = "node-a";

/// Unmounts (lazily, deepest first) every mount under `root` on drop, then
/// removes `root`. Declare it last so it drops first.
#[derive(Debug)]
pub struct WorkDir {
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl WorkDir {
    /// A new work directory, canonical.
    pub fn new() -> WorkDir {
        let dir = tempfile::Builder::new()
            .prefix("carina-csi-")
            .tempdir()
            .expect("work dir");
        WorkDir {
            root: dir.path().canonicalize().expect("canonical"),
            _dir: dir,
        }
    }

    /// `rel` in the work directory.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Mount points at or under the work dir, as the kernel lists them.
    pub fn mounts(&self) -> Vec<PathBuf> {
        mounts_under(&self.root)
    }
}

impl Default for WorkDir {
    fn default() -> WorkDir {
        WorkDir::new()
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let mut mounts = self.mounts();
        mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in mounts {
            let _ = run("umount", &["-l", &m.to_string_lossy()]);
        }
    }
}

/// A CSI Node server for `engine` on a socket in a temp dir, and clients.
#[derive(Debug)]
pub struct CsiNode {
    pub node: NodeClient<Channel>,
    pub identity: IdentityClient<Channel>,
    _server: ServedCsi,
}

impl CsiNode {
    /// NodeStageVolume of `id` at `staging`.
    pub async fn stage(
        &mut self,
        id: &str,
        staging: &Path,
        cap: csi::VolumeCapability,
    ) -> Result<(), tonic::Status> {
        self.node
            .node_stage_volume(stage_req(id, staging, cap))
            .await
            .map(drop)
    }

    /// NodePublishVolume of `id` from `staging` at `target`.
    pub async fn publish(
        &mut self,
        id: &str,
        staging: &Path,
        target: &Path,
        cap: csi::VolumeCapability,
        readonly: bool,
    ) -> Result<(), tonic::Status> {
        self.node
            .node_publish_volume(publish_req(id, staging, target, cap, readonly))
            .await
            .map(drop)
    }

    /// NodeUnpublishVolume of `id` at `target`.
    pub async fn unpublish(&mut self, id: &str, target: &Path) -> Result<(), tonic::Status> {
        self.node
            .node_unpublish_volume(unpublish_req(id, target))
            .await
            .map(drop)
    }

    /// NodeUnstageVolume of `id` at `staging`.
    pub async fn unstage(&mut self, id: &str, staging: &Path) -> Result<(), tonic::Status> {
        self.node
            .node_unstage_volume(unstage_req(id, staging))
            .await
            .map(drop)
    }

    /// Stages `id` at `staging` and publishes it at `target`, read-write.
    pub async fn stage_and_publish(
        &mut self,
        id: &str,
        staging: &Path,
        target: &Path,
        cap: csi::VolumeCapability,
    ) {
        self.stage(id, staging, cap.clone()).await.expect("stage");
        self.publish(id, staging, target, cap, false)
            .await
            .expect("publish");
    }

    /// Unpublishes `id` from each of `targets`, then unstages it.
    pub async fn unpublish_and_unstage(&mut self, id: &str, staging: &Path, targets: &[&Path]) {
        for target in targets {
            self.unpublish(id, target).await.expect("unpublish");
        }
        self.unstage(id, staging).await.expect("unstage");
    }

    /// Serves the CSI Node service of `engine` as node [`NODE`].
    pub async fn start(engine: Engine) -> CsiNode {
        let server = CsiNodeServer::new(engine, NODE)
            .max_volumes(100)
            .grace_period(Duration::from_secs(5));
        let served = ServedCsi::start("carina-csi-sock-", |listener, shutdown| {
            server.serve(listener, shutdown)
        })
        .await
        .expect("serve and connect over the unix socket");
        CsiNode {
            node: NodeClient::new(served.channel.clone()),
            identity: IdentityClient::new(served.channel.clone()),
            _server: served,
        }
    }
}

/// An engine over one LVM group on a loop disk. Fields drop in order.
#[derive(Debug)]
pub struct Lvm {
    pub engine: Engine,
    pub group: String,
    _vg: VgGuard,
    _disk: LoopDisk,
}

/// An engine over one LVM group on a new loop disk of `disk_bytes`; none
/// (the test `test` skipped) without root.
pub async fn lvm(test: &str, disk_bytes: u64) -> Option<Lvm> {
    if !have_root(test) {
        return None;
    }
    let disk = LoopDisk::new(disk_bytes).expect("loop disk");
    let group = unique("vg");
    let vg = VgGuard::new(&group, &[&disk]);
    let engine = start_engine(&crate::disk_group_config(&group, "LVM", &[&disk], 0))
        .await
        .expect("engine");
    Some(Lvm {
        engine,
        group,
        _vg: vg,
        _disk: disk,
    })
}

impl Lvm {
    /// Creates a volume; returns its CSI id and device.
    pub async fn volume(&self, size: u64) -> (String, PathBuf) {
        let name = unique("pvc");
        let v = self
            .engine
            .create_volume(CreateRequest {
                name: name.clone(),
                group: self.group.clone(),
                size_bytes: size,
                exclusive: false,
            })
            .await
            .expect("create volume");
        (format!("{name}@{NODE}"), v.device_path.expect("device"))
    }
}

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

/// A mount capability of access mode `mode` and file system `fs`.
pub fn mount_cap(mode: Mode, fs: &str) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

/// A block capability, single node writer.
pub fn block_cap() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// NodeStageVolume of `id` at `staging`.
pub fn stage_req(
    id: &str,
    staging: &Path,
    cap: csi::VolumeCapability,
) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into_owned(),
        volume_capability: Some(cap),
        ..Default::default()
    }
}

/// NodePublishVolume of `id` from `staging` at `target`.
pub fn publish_req(
    id: &str,
    staging: &Path,
    target: &Path,
    cap: csi::VolumeCapability,
    readonly: bool,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into_owned(),
        target_path: target.to_string_lossy().into_owned(),
        volume_capability: Some(cap),
        readonly,
        ..Default::default()
    }
}

/// NodeUnpublishVolume of `id` at `target`.
pub fn unpublish_req(id: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: id.into(),
        target_path: target.to_string_lossy().into_owned(),
    }
}

/// NodeUnstageVolume of `id` at `staging`.
pub fn unstage_req(id: &str, staging: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into_owned(),
    }
}

/// NodeGetVolumeStats of `id` at `path`.
pub fn stats_req(id: &str, path: &Path) -> csi::NodeGetVolumeStatsRequest {
    csi::NodeGetVolumeStatsRequest {
        volume_id: id.into(),
        volume_path: path.to_string_lossy().into_owned(),
        staging_target_path: String::new(),
    }
}

/// `(total, available, used)` bytes and inodes, as `stat -f` reports them.
pub fn statfs(path: &Path) -> ((i64, i64, i64), (i64, i64, i64)) {
    let n: Vec<i64> = stat_fs(path, "%S %b %f %a %c %d");
    let (bsize, blocks, free, avail, files, ffree) = (n[0], n[1], n[2], n[3], n[4], n[5]);
    (
        (blocks * bsize, avail * bsize, (blocks - free) * bsize),
        (files, ffree, files - ffree),
    )
}

/// Usage of one unit from a stats answer: `(total, available, used)`.
pub fn usage_of(
    resp: &csi::NodeGetVolumeStatsResponse,
    unit: csi::volume_usage::Unit,
) -> (i64, i64, i64) {
    let u = resp
        .usage
        .iter()
        .find(|u| u.unit == unit as i32)
        .unwrap_or_else(|| panic!("no {unit:?} usage in {resp:?}"));
    (u.total, u.available, u.used)
}

/// The file system or partition table type `blkid` probes on `dev`.
pub fn blkid_type(dev: &Path) -> Option<String> {
    run(
        "blkid",
        &["-p", "-o", "value", "-s", "TYPE", &dev.to_string_lossy()],
    )
    .ok()
    .map(|s| s.trim().to_string())
    .filter(|s| !s.is_empty())
}
