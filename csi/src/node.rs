//! The CSI Node service over a [`LocalVolumes`] back end.
//!
//! - **Stage** (`STAGE_UNSTAGE_VOLUME`): a block volume with mount access is
//!   formatted if blank (fs type from `volume_capability.mount.fs_type`,
//!   else `volume_context["csi.storage.k8s.io/fstype"]`, else ext4) and
//!   mounted at the staging path with the mount flags; with block access
//!   nothing is mounted there. A directory volume is bind-mounted there.
//! - **Publish**: mount access bind-mounts the staging path onto the target
//!   directory (read-only when `readonly` or the mode is
//!   `SINGLE_NODE_READER_ONLY`); block access bind-mounts the device node
//!   onto a target file. The service creates the target and removes it on
//!   unpublish; the CO creates its parent (and the staging directory, which
//!   is created here too if missing, and never removed).
//! - **Expand** grows a mounted filesystem to its device; **stats** are
//!   statvfs (or the device size for block access) plus a volume condition.
//!
//! Every answer is decided from what the kernel says now (mountinfo,
//! stat), never from memory, so each call is idempotent and survives a
//! restart: staged or published again with the same arguments is OK, with
//! incompatible ones `ALREADY_EXISTS`. A second call on a volume id whose
//! first call is still running is `ABORTED`.
//!
//! Codes: missing or malformed fields `INVALID_ARGUMENT` (naming the
//! field), a volume that is not on this node `NOT_FOUND`, a state that does
//! not allow the call (not staged, device of another kind, an occupied
//! device) `FAILED_PRECONDITION`, command failures `INTERNAL` with the
//! command line and stderr.

use std::collections::HashMap;
use std::fs::Metadata;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use carina_proto::csi;
use carina_proto::csi::node_service_capability::rpc::Type as RpcType;
use carina_proto::csi::volume_capability::access_mode::Mode;
use carina_sys::format::{self, FsType};
use carina_sys::mount::{self, MountEntry, MountTable};
use carina_sys::statvfs;
use tonic::{Code, Request, Response, Status};

use crate::busy::{BusyNames, Held, busy_message};
use crate::error::CsiError;
use crate::params::parse_fs_type;
use crate::types::{LocalKind, LocalVolume, LocalVolumes};
use crate::{TOPOLOGY_KEY, context};

/// The Node service; serve it with
/// `carina_proto::csi::node_server::NodeServer::new(NodeService::new(..))`.
#[derive(Debug)]
pub struct NodeService<L> {
    volumes: Arc<L>,
    busy: BusyNames,
}

impl<L> Clone for NodeService<L> {
    fn clone(&self) -> Self {
        NodeService {
            volumes: self.volumes.clone(),
            busy: self.busy.clone(),
        }
    }
}

/// How a workload uses the volume.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Access {
    Block,
    Mount {
        fs_type: Option<FsType>,
        flags: Vec<String>,
    },
}

/// A validated `volume_capability`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Capability {
    access: Access,
    mode: Mode,
}

/// What is at a path, seen from one volume.
#[derive(Debug)]
enum AtPath {
    Missing,
    /// Exists and is not a mount point.
    Unmounted(Metadata),
    /// A mount point showing this volume.
    Ours(MountEntry, Metadata),
    /// A mount point showing something else.
    Foreign(MountEntry),
}

impl<L: LocalVolumes> NodeService<L> {
    pub fn new(volumes: L) -> Self {
        Self::from_arc(Arc::new(volumes))
    }

    /// A service sharing `volumes` with its caller.
    pub fn from_arc(volumes: Arc<L>) -> Self {
        NodeService {
            volumes,
            busy: BusyNames::default(),
        }
    }

    /// Takes the volume id for one call, or `ABORTED` if a call holds it.
    fn lock(&self, volume_id: &str) -> Result<Held, CsiError> {
        self.busy
            .try_hold(volume_id)
            .ok_or_else(|| CsiError::Aborted(busy_message(volume_id)))
    }

    /// The volume, or `NOT_FOUND` if it is not on this node.
    async fn local(&self, volume_id: &str) -> Result<LocalVolume, CsiError> {
        self.volumes.find(volume_id).await?.ok_or_else(|| {
            CsiError::NotFound(format!(
                "volume {volume_id:?} does not exist on node {:?}",
                self.volumes.node_id()
            ))
        })
    }

    async fn stage(&self, req: csi::NodeStageVolumeRequest) -> Result<(), CsiError> {
        required("volume_id", &req.volume_id)?;
        let staging = absolute("staging_target_path", &req.staging_target_path)?;
        let cap = capability("volume_capability", req.volume_capability.as_ref())?;
        let requested_fs = requested_fs(&cap, &req.volume_context)?;
        let _busy = self.lock(&req.volume_id)?;
        let vol = self.local(&req.volume_id).await?;
        let src = source(&vol).await?;
        let at = inspect(&staging, &vol.kind, &src).await?;
        if let AtPath::Unmounted(meta) = &at
            && !meta.is_dir()
        {
            return Err(CsiError::invalid(
                "staging_target_path",
                format!("{} is not a directory", staging.display()),
            ));
        }
        match (&vol.kind, &cap.access) {
            (LocalKind::Directory { path }, Access::Block) => {
                Err(CsiError::FailedPrecondition(format!(
                    "volume {:?} is the directory {}; block access is not possible",
                    vol.volume_id,
                    path.display()
                )))
            }
            (LocalKind::Block { .. }, Access::Block) => match at {
                AtPath::Ours(m, _) | AtPath::Foreign(m) => Err(CsiError::AlreadyExists(format!(
                    "{} already has {} ({}) mounted; block access stages no filesystem",
                    staging.display(),
                    m.source.display(),
                    m.fs_type
                ))),
                AtPath::Missing => create_dir(&staging).await.map(|_| ()),
                AtPath::Unmounted(_) => Ok(()),
            },
            (LocalKind::Block { device }, Access::Mount { flags, .. }) => match at {
                AtPath::Ours(m, _) => {
                    let same_fs = requested_fs.is_none_or(|fs| fs.as_str() == m.fs_type);
                    if same_fs && m.read_only() == flags.iter().any(|f| f == "ro") {
                        return Ok(());
                    }
                    Err(CsiError::AlreadyExists(format!(
                        "volume {:?} is staged at {} as {}{}, incompatible with this request",
                        vol.volume_id,
                        staging.display(),
                        m.fs_type,
                        if m.read_only() { " (read-only)" } else { "" }
                    )))
                }
                AtPath::Foreign(m) => Err(occupied(&staging, &m)),
                at => {
                    let created = matches!(at, AtPath::Missing) && create_dir(&staging).await?;
                    let result = async {
                        let fs = format::ensure_filesystem(device, requested_fs).await?;
                        mount::mount(device, &staging, fs.fs.as_str(), flags).await?;
                        Ok::<_, CsiError>(())
                    }
                    .await;
                    undo_create_on_error(result, &staging, created).await
                }
            },
            (LocalKind::Directory { path }, Access::Mount { flags, .. }) => match at {
                AtPath::Ours(m, _) if m.read_only() == flags.iter().any(|f| f == "ro") => Ok(()),
                AtPath::Ours(..) => Err(CsiError::AlreadyExists(format!(
                    "volume {:?} is staged at {} with other mount flags",
                    vol.volume_id,
                    staging.display()
                ))),
                AtPath::Foreign(m) => Err(occupied(&staging, &m)),
                at => {
                    let created = matches!(at, AtPath::Missing) && create_dir(&staging).await?;
                    let result = mount::bind_mount(path, &staging, flags)
                        .await
                        .map_err(CsiError::from);
                    undo_create_on_error(result, &staging, created).await
                }
            },
        }
    }

    async fn unstage(&self, req: csi::NodeUnstageVolumeRequest) -> Result<(), CsiError> {
        required("volume_id", &req.volume_id)?;
        let staging = absolute("staging_target_path", &req.staging_target_path)?;
        let _busy = self.lock(&req.volume_id)?;
        // Not looked up: a CO must be able to clean up after the volume
        // itself is gone. The staging directory belongs to the CO.
        mount::unmount_all(&staging).await?;
        Ok(())
    }

    async fn publish(&self, req: csi::NodePublishVolumeRequest) -> Result<(), CsiError> {
        required("volume_id", &req.volume_id)?;
        let target = absolute("target_path", &req.target_path)?;
        let staging =
            absolute("staging_target_path", &req.staging_target_path).map_err(|e| match e {
                CsiError::InvalidArgument { field, reason } => CsiError::InvalidArgument {
                    field,
                    reason: format!("{reason} (the node has STAGE_UNSTAGE_VOLUME)"),
                },
                e => e,
            })?;
        let cap = capability("volume_capability", req.volume_capability.as_ref())?;
        if target == staging {
            return Err(CsiError::invalid(
                "target_path",
                "must differ from staging_target_path",
            ));
        }
        let read_only = req.readonly || cap.mode == Mode::SingleNodeReaderOnly;
        let options: Vec<String> = if read_only {
            vec!["ro".into()]
        } else {
            Vec::new()
        };
        let _busy = self.lock(&req.volume_id)?;
        let vol = self.local(&req.volume_id).await?;
        let src = source(&vol).await?;
        let parent = target.parent().unwrap_or(Path::new("/"));
        if !stat(parent).await?.is_some_and(|m| m.is_dir()) {
            return Err(CsiError::FailedPrecondition(format!(
                "the parent directory of target_path, {}, does not exist (the CO creates it)",
                parent.display()
            )));
        }
        let at = inspect(&target, &vol.kind, &src).await?;
        let incompatible = |m: &MountEntry| {
            CsiError::AlreadyExists(format!(
                "{} already has {}{} mounted, incompatible with this request (readonly={read_only})",
                target.display(),
                m.source.display(),
                if m.read_only() { " (read-only)" } else { "" },
            ))
        };
        match (&vol.kind, &cap.access) {
            (LocalKind::Directory { path }, Access::Block) => {
                Err(CsiError::FailedPrecondition(format!(
                    "volume {:?} is the directory {}; block access is not possible",
                    vol.volume_id,
                    path.display()
                )))
            }
            (_, Access::Mount { .. }) => {
                let staged = match inspect(&staging, &vol.kind, &src).await? {
                    AtPath::Ours(m, _) => m,
                    _ => {
                        return Err(CsiError::FailedPrecondition(format!(
                            "volume {:?} is not staged at {}",
                            vol.volume_id,
                            staging.display()
                        )));
                    }
                };
                match at {
                    AtPath::Ours(m, _) if m.read_only() == read_only => return Ok(()),
                    AtPath::Ours(m, _) | AtPath::Foreign(m) => return Err(incompatible(&m)),
                    AtPath::Unmounted(meta) if !meta.is_dir() => {
                        return Err(CsiError::FailedPrecondition(format!(
                            "target_path {} exists and is not a directory",
                            target.display()
                        )));
                    }
                    _ => {}
                }
                if cap.mode == Mode::SingleNodeSingleWriter {
                    let table = MountTable::read().await?;
                    let others = other_publications(
                        &table,
                        (staged.major, staged.minor, &staged.root),
                        &[&staged.mount_point, &target],
                    );
                    single_writer(&vol, &others)?;
                }
                let created = matches!(at, AtPath::Missing) && create_dir(&target).await?;
                let result = mount::bind_mount(&staging, &target, &options)
                    .await
                    .map_err(CsiError::from);
                undo_create_on_error(result, &target, created).await
            }
            (LocalKind::Block { device }, Access::Block) => {
                match at {
                    AtPath::Ours(m, _) if m.read_only() == read_only => return Ok(()),
                    AtPath::Ours(m, _) | AtPath::Foreign(m) => return Err(incompatible(&m)),
                    AtPath::Unmounted(meta) if meta.is_dir() => {
                        return Err(CsiError::FailedPrecondition(format!(
                            "target_path {} is a directory; block access needs a file",
                            target.display()
                        )));
                    }
                    _ => {}
                }
                if cap.mode == Mode::SingleNodeSingleWriter {
                    let table = MountTable::read().await?;
                    let device = canonical_or_self(device).await?;
                    if let Some((major, minor, root)) = table.locate(&device) {
                        let others = other_publications(&table, (major, minor, &root), &[&target]);
                        single_writer(&vol, &others)?;
                    }
                }
                let created = matches!(at, AtPath::Missing) && create_file(&target).await?;
                let result = mount::bind_mount(device, &target, &options)
                    .await
                    .map_err(CsiError::from);
                undo_create_on_error(result, &target, created).await
            }
        }
    }

    async fn unpublish(&self, req: csi::NodeUnpublishVolumeRequest) -> Result<(), CsiError> {
        required("volume_id", &req.volume_id)?;
        let target = absolute("target_path", &req.target_path)?;
        let _busy = self.lock(&req.volume_id)?;
        // Not looked up, like unstage: cleaning up must work without it.
        mount::unmount_all(&target).await?;
        remove_target(&target).await
    }

    async fn stats(
        &self,
        req: csi::NodeGetVolumeStatsRequest,
    ) -> Result<csi::NodeGetVolumeStatsResponse, CsiError> {
        required("volume_id", &req.volume_id)?;
        required("volume_path", &req.volume_path)?;
        let vol = self.local(&req.volume_id).await?;
        let path = PathBuf::from(&req.volume_path);
        let not_here = || {
            CsiError::NotFound(format!(
                "volume {:?} is not at {:?}",
                vol.volume_id, req.volume_path
            ))
        };
        if !path.is_absolute() {
            return Err(not_here());
        }
        let meta = stat(&path).await?.ok_or_else(not_here)?;
        let source_path = match &vol.kind {
            LocalKind::Block { device } => device,
            LocalKind::Directory { path } => path,
        };
        let abnormal = |message: String| csi::NodeGetVolumeStatsResponse {
            usage: Vec::new(),
            volume_condition: Some(csi::VolumeCondition {
                abnormal: true,
                message,
            }),
        };
        if mount::mount_at(&path).await?.is_none() {
            return Ok(abnormal(format!(
                "{} is no longer a mount point",
                path.display()
            )));
        }
        let Some(src) = stat(source_path).await? else {
            return Ok(abnormal(format!(
                "{} of volume {:?} is gone",
                source_path.display(),
                vol.volume_id
            )));
        };
        if !shows(&vol.kind, &src, &meta) {
            return Err(not_here());
        }
        let usage = if meta.file_type().is_block_device() {
            let size = format::device_size(&path).await?;
            vec![usage(csi::volume_usage::Unit::Bytes, size, 0, 0)]
        } else {
            filesystem_usage(&path).await?
        };
        Ok(csi::NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(csi::VolumeCondition {
                abnormal: false,
                message: String::new(),
            }),
        })
    }

    async fn expand(
        &self,
        req: csi::NodeExpandVolumeRequest,
    ) -> Result<csi::NodeExpandVolumeResponse, CsiError> {
        required("volume_id", &req.volume_id)?;
        required("volume_path", &req.volume_path)?;
        let cap = match &req.volume_capability {
            Some(c) => Some(capability("volume_capability", Some(c))?),
            None => None,
        };
        let required_bytes = match &req.capacity_range {
            Some(r) => {
                non_negative("capacity_range.required_bytes", r.required_bytes)?;
                non_negative("capacity_range.limit_bytes", r.limit_bytes)?;
                r.required_bytes.unsigned_abs()
            }
            None => 0,
        };
        let _busy = self.lock(&req.volume_id)?;
        let vol = self.local(&req.volume_id).await?;
        let path = PathBuf::from(&req.volume_path);
        let not_here = || {
            CsiError::NotFound(format!(
                "volume {:?} is not at {:?}",
                vol.volume_id, req.volume_path
            ))
        };
        if !path.is_absolute() {
            return Err(not_here());
        }
        let src = source(&vol).await?;
        let (entry, meta) = match inspect(&path, &vol.kind, &src).await? {
            AtPath::Ours(m, meta) => (m, meta),
            AtPath::Missing | AtPath::Foreign(_) => return Err(not_here()),
            AtPath::Unmounted(_) => {
                return Err(CsiError::FailedPrecondition(format!(
                    "{} is not a mount point; expansion needs the published volume",
                    path.display()
                )));
            }
        };
        let device = match &vol.kind {
            LocalKind::Directory { .. } => {
                return Ok(expanded(vol.size_bytes));
            }
            LocalKind::Block { device } => device,
        };
        let size = format::device_size(device).await?;
        if required_bytes > size {
            return Err(CsiError::OutOfRange(format!(
                "volume {:?} is {size} bytes, {required_bytes} required; grow it with ControllerExpandVolume first",
                vol.volume_id
            )));
        }
        // Block access: the device node is the volume; nothing to grow.
        if cap.is_some_and(|c| c.access == Access::Block) || meta.file_type().is_block_device() {
            return Ok(expanded(size));
        }
        let Some(fs) = FsType::from_name(&entry.fs_type) else {
            return Err(CsiError::FailedPrecondition(format!(
                "{} holds {}, which Carina cannot grow",
                path.display(),
                entry.fs_type
            )));
        };
        format::grow_filesystem(fs, device, &path).await?;
        Ok(expanded(size))
    }

    fn info(&self) -> csi::NodeGetInfoResponse {
        let node = self.volumes.node_id().to_string();
        csi::NodeGetInfoResponse {
            node_id: node.clone(),
            max_volumes_per_node: i64::try_from(self.volumes.max_volumes()).unwrap_or(i64::MAX),
            accessible_topology: Some(csi::Topology {
                segments: HashMap::from([(TOPOLOGY_KEY.to_string(), node)]),
            }),
        }
    }
}

/// The Node RPCs this service implements.
pub const NODE_CAPABILITIES: [RpcType; 5] = [
    RpcType::StageUnstageVolume,
    RpcType::ExpandVolume,
    RpcType::GetVolumeStats,
    RpcType::VolumeCondition,
    // The node accepts SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER,
    // as the controller does; the spec asks both sides to say so.
    RpcType::SingleNodeMultiWriter,
];

/// Answers a call, logging node-side failures at ERROR and the caller's
/// mistakes (and expected states) at INFO, inside the RPC's span.
fn answer<T>(result: Result<T, CsiError>) -> Result<Response<T>, Status> {
    match result {
        Ok(v) => Ok(Response::new(v)),
        Err(e) => {
            let status = Status::from(e);
            match status.code() {
                Code::Internal | Code::Unknown | Code::DeadlineExceeded | Code::Unavailable => {
                    tracing::error!(code = ?status.code(), error = %status.message(), "failed")
                }
                code => tracing::info!(code = ?code, error = %status.message(), "refused"),
            }
            Err(status)
        }
    }
}

#[async_trait]
impl<L: LocalVolumes> csi::node_server::Node for NodeService<L> {
    #[tracing::instrument(name = "Node/NodeStageVolume", skip_all, fields(volume.id = %request.get_ref().volume_id))]
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        answer(
            self.stage(request.into_inner())
                .await
                .map(|()| csi::NodeStageVolumeResponse {}),
        )
    }

    #[tracing::instrument(name = "Node/NodeUnstageVolume", skip_all, fields(volume.id = %request.get_ref().volume_id))]
    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        answer(
            self.unstage(request.into_inner())
                .await
                .map(|()| csi::NodeUnstageVolumeResponse {}),
        )
    }

    #[tracing::instrument(name = "Node/NodePublishVolume", skip_all, fields(volume.id = %request.get_ref().volume_id))]
    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        answer(
            self.publish(request.into_inner())
                .await
                .map(|()| csi::NodePublishVolumeResponse {}),
        )
    }

    #[tracing::instrument(name = "Node/NodeUnpublishVolume", skip_all, fields(volume.id = %request.get_ref().volume_id))]
    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        answer(
            self.unpublish(request.into_inner())
                .await
                .map(|()| csi::NodeUnpublishVolumeResponse {}),
        )
    }

    #[tracing::instrument(name = "Node/NodeGetVolumeStats", skip_all, fields(volume.id = %request.get_ref().volume_id))]
    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        answer(self.stats(request.into_inner()).await)
    }

    #[tracing::instrument(name = "Node/NodeExpandVolume", skip_all, fields(volume.id = %request.get_ref().volume_id))]
    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        answer(self.expand(request.into_inner()).await)
    }

    #[tracing::instrument(name = "Node/NodeGetCapabilities", skip_all)]
    async fn node_get_capabilities(
        &self,
        _request: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        let capabilities = NODE_CAPABILITIES
            .iter()
            .map(|t| csi::NodeServiceCapability {
                r#type: Some(csi::node_service_capability::Type::Rpc(
                    csi::node_service_capability::Rpc { r#type: *t as i32 },
                )),
            })
            .collect();
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities,
        }))
    }

    #[tracing::instrument(name = "Node/NodeGetInfo", skip_all)]
    async fn node_get_info(
        &self,
        _request: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(self.info()))
    }
}

// ---------------------------------------------------------------------------
// Validation at the edge
// ---------------------------------------------------------------------------

fn required(field: &str, value: &str) -> Result<(), CsiError> {
    if value.is_empty() {
        return Err(CsiError::invalid(field, "must be set"));
    }
    Ok(())
}

fn non_negative(field: &str, value: i64) -> Result<(), CsiError> {
    if value < 0 {
        return Err(CsiError::invalid(field, format!("{value} is negative")));
    }
    Ok(())
}

/// A path field that must be set and absolute.
fn absolute(field: &str, value: &str) -> Result<PathBuf, CsiError> {
    required(field, value)?;
    if value.contains('\0') {
        return Err(CsiError::invalid(field, "must not contain NUL"));
    }
    let path = PathBuf::from(value);
    if !path.is_absolute() {
        return Err(CsiError::invalid(
            field,
            format!("{value:?} is not an absolute path"),
        ));
    }
    Ok(path)
}

/// Validates a volume capability with the one rule the controller uses too
/// ([`crate::capability::check`]), into the node's view of it.
fn capability(field: &str, cap: Option<&csi::VolumeCapability>) -> Result<Capability, CsiError> {
    let cap = cap.ok_or_else(|| CsiError::invalid(field, "is required"))?;
    let checked = crate::capability::check(field, cap)?;
    let access = match checked.access {
        crate::capability::Access::Block => Access::Block,
        crate::capability::Access::Mount { fs_type } => Access::Mount {
            fs_type,
            flags: checked.mount_flags,
        },
    };
    Ok(Capability {
        access,
        mode: checked.mode,
    })
}

/// The filesystem asked for: the capability's, else the volume context's
/// (the StorageClass parameter), else none (ext4 when formatting).
fn requested_fs(
    cap: &Capability,
    volume_context: &HashMap<String, String>,
) -> Result<Option<FsType>, CsiError> {
    match &cap.access {
        Access::Block => Ok(None),
        Access::Mount {
            fs_type: Some(fs), ..
        } => Ok(Some(*fs)),
        Access::Mount { fs_type: None, .. } => match volume_context.get(context::FS_TYPE) {
            Some(v) if !v.is_empty() => Ok(Some(parse_fs_type(
                &format!("volume_context[{:?}]", context::FS_TYPE),
                v,
            )?)),
            _ => Ok(None),
        },
    }
}

// ---------------------------------------------------------------------------
// What the kernel says
// ---------------------------------------------------------------------------

async fn stat(path: &Path) -> Result<Option<Metadata>, CsiError> {
    match tokio::fs::metadata(path).await {
        Ok(m) => Ok(Some(m)),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(CsiError::Internal(format!("stat {}: {e}", path.display()))),
    }
}

/// The volume's device or directory, which must exist and be of its kind.
async fn source(vol: &LocalVolume) -> Result<Metadata, CsiError> {
    let (path, what) = match &vol.kind {
        LocalKind::Block { device } => (device, "block device"),
        LocalKind::Directory { path } => (path, "directory"),
    };
    let meta = stat(path).await?.ok_or_else(|| {
        CsiError::FailedPrecondition(format!(
            "{what} {} of volume {:?} does not exist",
            path.display(),
            vol.volume_id
        ))
    })?;
    let right_kind = match vol.kind {
        LocalKind::Block { .. } => meta.file_type().is_block_device(),
        LocalKind::Directory { .. } => meta.is_dir(),
    };
    if !right_kind {
        return Err(CsiError::FailedPrecondition(format!(
            "{} of volume {:?} is not a {what}",
            path.display(),
            vol.volume_id
        )));
    }
    Ok(meta)
}

/// Whether `at` (the metadata of a mount point) shows the volume whose
/// device or directory has metadata `src`: a filesystem on the device, the
/// device node itself, or the directory.
fn shows(kind: &LocalKind, src: &Metadata, at: &Metadata) -> bool {
    match kind {
        LocalKind::Block { .. } if at.file_type().is_block_device() => at.rdev() == src.rdev(),
        LocalKind::Block { .. } => at.dev() == src.rdev(),
        LocalKind::Directory { .. } => at.dev() == src.dev() && at.ino() == src.ino(),
    }
}

/// What is at `path`, from mountinfo and stat.
async fn inspect(path: &Path, kind: &LocalKind, src: &Metadata) -> Result<AtPath, CsiError> {
    let Some(meta) = stat(path).await? else {
        return Ok(AtPath::Missing);
    };
    match mount::mount_at(path).await? {
        None => Ok(AtPath::Unmounted(meta)),
        Some(m) if shows(kind, src, &meta) => Ok(AtPath::Ours(m, meta)),
        Some(m) => Ok(AtPath::Foreign(m)),
    }
}

async fn canonical_or_self(path: &Path) -> Result<PathBuf, CsiError> {
    Ok(mount::canonical(path)
        .await?
        .unwrap_or_else(|| path.to_path_buf()))
}

/// Mount points other than `except` that show the same thing.
fn other_publications(
    table: &MountTable,
    (major, minor, root): (u32, u32, &Path),
    except: &[&Path],
) -> Vec<PathBuf> {
    table
        .mounts_of(major, minor, root)
        .into_iter()
        .filter(|p| !except.contains(p))
        .map(Path::to_path_buf)
        .collect()
}

fn single_writer(vol: &LocalVolume, others: &[PathBuf]) -> Result<(), CsiError> {
    match others.first() {
        None => Ok(()),
        Some(other) => Err(CsiError::FailedPrecondition(format!(
            "volume {:?} is SINGLE_NODE_SINGLE_WRITER and already published at {}",
            vol.volume_id,
            other.display()
        ))),
    }
}

fn occupied(path: &Path, m: &MountEntry) -> CsiError {
    CsiError::AlreadyExists(format!(
        "{} already has {} ({}) mounted, not this volume",
        path.display(),
        m.source.display(),
        m.fs_type
    ))
}

fn expanded(size: u64) -> csi::NodeExpandVolumeResponse {
    csi::NodeExpandVolumeResponse {
        capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
    }
}

fn usage(unit: csi::volume_usage::Unit, total: u64, available: u64, used: u64) -> csi::VolumeUsage {
    let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    csi::VolumeUsage {
        available: i(available),
        total: i(total),
        used: i(used),
        unit: unit as i32,
    }
}

/// Bytes and inodes of the filesystem at `path` (statvfs).
async fn filesystem_usage(path: &Path) -> Result<Vec<csi::VolumeUsage>, CsiError> {
    let p = path.to_path_buf();
    let st = tokio::task::spawn_blocking(move || statvfs::statvfs(&p))
        .await
        .map_err(|e| CsiError::Internal(format!("statvfs {}: {e}", path.display())))?
        .map_err(|e| CsiError::Internal(format!("statvfs {}: {e}", path.display())))?;
    let frsize = st.f_frsize;
    let bytes = |blocks: u64| blocks.saturating_mul(frsize);
    Ok(vec![
        usage(
            csi::volume_usage::Unit::Bytes,
            bytes(st.f_blocks),
            bytes(st.f_bavail),
            bytes(st.f_blocks.saturating_sub(st.f_bfree)),
        ),
        usage(
            csi::volume_usage::Unit::Inodes,
            st.f_files,
            st.f_ffree,
            st.f_files.saturating_sub(st.f_ffree),
        ),
    ])
}

// ---------------------------------------------------------------------------
// Creating and removing mount targets
// ---------------------------------------------------------------------------

/// Creates a directory (its parent must exist); `true` if this call made it.
async fn create_dir(path: &Path) -> Result<bool, CsiError> {
    match tokio::fs::create_dir(path).await {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(CsiError::FailedPrecondition(format!(
                "cannot create {}: its parent directory does not exist",
                path.display()
            )))
        }
        Err(e) => Err(CsiError::Internal(format!(
            "create directory {}: {e}",
            path.display()
        ))),
    }
}

/// Creates an empty file to bind a device node onto; `true` if made here.
async fn create_file(path: &Path) -> Result<bool, CsiError> {
    match tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(CsiError::Internal(format!(
            "create file {}: {e}",
            path.display()
        ))),
    }
}

/// Removes what was created for a mount that then failed, so a failed
/// call leaves nothing behind.
async fn undo_create_on_error(
    result: Result<(), CsiError>,
    path: &Path,
    created: bool,
) -> Result<(), CsiError> {
    if result.is_err() && created {
        let removed = match stat(path).await {
            Ok(Some(m)) if m.is_dir() => tokio::fs::remove_dir(path).await,
            Ok(Some(_)) => tokio::fs::remove_file(path).await,
            _ => Ok(()),
        };
        if let Err(e) = removed {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove what a failed call created");
        }
    }
    result
}

/// Removes an unmounted publish target (the directory or file the service
/// created); a directory that is not empty is left and reported.
async fn remove_target(target: &Path) -> Result<(), CsiError> {
    let Some(meta) = tokio::fs::symlink_metadata(target).await.ok() else {
        return Ok(());
    };
    let removed = if meta.is_dir() {
        tokio::fs::remove_dir(target).await
    } else {
        tokio::fs::remove_file(target).await
    };
    match removed {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(CsiError::Internal(format!(
            "remove {} after unmounting it: {e}",
            target.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi::node_server::Node;
    use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::sync::Notify;

    /// Volumes in memory; `find` can be held until released.
    #[derive(Default)]
    struct Fake {
        volumes: HashMap<String, LocalVolume>,
        hold: AtomicBool,
        entered: Notify,
        release: Notify,
    }

    #[async_trait]
    impl LocalVolumes for Fake {
        fn node_id(&self) -> &str {
            "node-a"
        }
        fn max_volumes(&self) -> u64 {
            7
        }
        async fn find(&self, volume_id: &str) -> Result<Option<LocalVolume>, CsiError> {
            if self.hold.load(Ordering::SeqCst) {
                self.entered.notify_one();
                self.release.notified().await;
            }
            Ok(self.volumes.get(volume_id).cloned())
        }
    }

    fn fake() -> Fake {
        let mut f = Fake::default();
        f.volumes.insert(
            "v1@node-a".into(),
            LocalVolume {
                volume_id: "v1@node-a".into(),
                kind: LocalKind::Block {
                    device: "/dev/null-carina-test".into(),
                },
                size_bytes: 1 << 30,
            },
        );
        f
    }

    fn mount_cap(mode: Mode, fs: &str) -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: fs.into(),
                ..Default::default()
            })),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }

    fn stage_req(id: &str, cap: Option<csi::VolumeCapability>) -> csi::NodeStageVolumeRequest {
        csi::NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: "/carina-test/staging".into(),
            volume_capability: cap,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn malformed_requests_name_the_field() {
        let node = NodeService::new(fake());
        let ok_cap = || Some(mount_cap(Mode::SingleNodeWriter, "ext4"));
        let cases: Vec<(csi::NodeStageVolumeRequest, Code, &str)> = vec![
            (stage_req("", ok_cap()), Code::InvalidArgument, "volume_id"),
            (
                csi::NodeStageVolumeRequest {
                    staging_target_path: String::new(),
                    ..stage_req("v1@node-a", ok_cap())
                },
                Code::InvalidArgument,
                "staging_target_path",
            ),
            (
                csi::NodeStageVolumeRequest {
                    staging_target_path: "relative/path".into(),
                    ..stage_req("v1@node-a", ok_cap())
                },
                Code::InvalidArgument,
                "staging_target_path",
            ),
            (
                stage_req("v1@node-a", None),
                Code::InvalidArgument,
                "volume_capability",
            ),
            (
                stage_req(
                    "v1@node-a",
                    Some(mount_cap(Mode::MultiNodeMultiWriter, "ext4")),
                ),
                Code::InvalidArgument,
                "volume_capability.access_mode.mode",
            ),
            (
                stage_req("v1@node-a", Some(mount_cap(Mode::Unknown, "ext4"))),
                Code::InvalidArgument,
                "volume_capability.access_mode.mode",
            ),
            (
                stage_req(
                    "v1@node-a",
                    Some(mount_cap(Mode::SingleNodeWriter, "btrfs")),
                ),
                Code::InvalidArgument,
                "volume_capability.mount.fs_type",
            ),
            (
                stage_req(
                    "v1@node-a",
                    Some(csi::VolumeCapability {
                        access_type: None,
                        access_mode: Some(AccessMode { mode: 1 }),
                    }),
                ),
                Code::InvalidArgument,
                "volume_capability.access_type",
            ),
            (
                csi::NodeStageVolumeRequest {
                    volume_context: HashMap::from([(context::FS_TYPE.into(), "zfs".into())]),
                    ..stage_req("v1@node-a", Some(mount_cap(Mode::SingleNodeWriter, "")))
                },
                Code::InvalidArgument,
                "volume_context[\"csi.storage.k8s.io/fstype\"]",
            ),
            (
                stage_req("v9@node-b", ok_cap()),
                Code::NotFound,
                "does not exist on node \"node-a\"",
            ),
        ];
        for (req, code, text) in cases {
            let err = node
                .node_stage_volume(Request::new(req.clone()))
                .await
                .expect_err("refused");
            assert_eq!(err.code(), code, "{req:?}: {err:?}");
            assert!(err.message().contains(text), "{req:?}: {}", err.message());
        }

        let publish = |target: &str, staging: &str| csi::NodePublishVolumeRequest {
            volume_id: "v1@node-a".into(),
            target_path: target.into(),
            staging_target_path: staging.into(),
            volume_capability: Some(csi::VolumeCapability {
                access_type: Some(AccessType::Block(BlockVolume {})),
                access_mode: Some(AccessMode { mode: 1 }),
            }),
            ..Default::default()
        };
        for (req, field) in [
            (publish("", "/s"), "target_path"),
            (publish("t", "/s"), "target_path"),
            (publish("/t", ""), "staging_target_path"),
            (publish("/s", "/s"), "target_path"),
        ] {
            let err = node
                .node_publish_volume(Request::new(req))
                .await
                .expect_err("refused");
            assert_eq!(err.code(), Code::InvalidArgument);
            assert!(err.message().starts_with(field), "{}", err.message());
        }

        let err = node
            .node_unpublish_volume(Request::new(csi::NodeUnpublishVolumeRequest {
                volume_id: "v1@node-a".into(),
                target_path: String::new(),
            }))
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument);
        let err = node
            .node_get_volume_stats(Request::new(csi::NodeGetVolumeStatsRequest {
                volume_id: "v1@node-a".into(),
                ..Default::default()
            }))
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().starts_with("volume_path"));
        // Not found comes before the path check, as csi-sanity expects.
        let err = node
            .node_expand_volume(Request::new(csi::NodeExpandVolumeRequest {
                volume_id: "gone@node-a".into(),
                volume_path: "some/path".into(),
                ..Default::default()
            }))
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::NotFound);
    }

    #[tokio::test]
    async fn second_call_on_a_busy_volume_is_aborted() {
        let f = fake();
        f.hold.store(true, Ordering::SeqCst);
        let f = Arc::new(f);
        let node = NodeService::from_arc(f.clone());
        let first = {
            let node = node.clone();
            tokio::spawn(async move {
                node.node_stage_volume(Request::new(stage_req(
                    "v1@node-a",
                    Some(mount_cap(Mode::SingleNodeWriter, "")),
                )))
                .await
            })
        };
        f.entered.notified().await;
        let err = node
            .node_unstage_volume(Request::new(csi::NodeUnstageVolumeRequest {
                volume_id: "v1@node-a".into(),
                staging_target_path: "/carina-test/staging".into(),
            }))
            .await
            .expect_err("busy");
        assert_eq!(err.code(), Code::Aborted, "{err:?}");
        f.hold.store(false, Ordering::SeqCst);
        f.release.notify_one();
        // The first call goes on (and fails: the fake device does not exist).
        let first = first.await.expect("joined").expect_err("no such device");
        assert_eq!(first.code(), Code::FailedPrecondition, "{first:?}");
        // Released: the id is free again.
        let err = node
            .node_stage_volume(Request::new(stage_req(
                "v1@node-a",
                Some(mount_cap(Mode::SingleNodeWriter, "")),
            )))
            .await
            .expect_err("no such device");
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    }

    #[tokio::test]
    async fn info_and_capabilities() {
        let node = NodeService::new(fake());
        let info = node
            .node_get_info(Request::new(csi::NodeGetInfoRequest {}))
            .await
            .expect("info")
            .into_inner();
        assert_eq!(info.node_id, "node-a");
        assert_eq!(info.max_volumes_per_node, 7);
        assert_eq!(
            info.accessible_topology.expect("topology").segments,
            HashMap::from([(TOPOLOGY_KEY.to_string(), "node-a".to_string())])
        );
        let caps: Vec<i32> = node
            .node_get_capabilities(Request::new(csi::NodeGetCapabilitiesRequest {}))
            .await
            .expect("caps")
            .into_inner()
            .capabilities
            .into_iter()
            .filter_map(|c| c.r#type)
            .map(|csi::node_service_capability::Type::Rpc(r)| r.r#type)
            .collect();
        assert_eq!(caps, [1, 3, 2, 4, 5]);
    }

    #[test]
    fn requested_fs_prefers_the_capability() {
        let ctx = HashMap::from([(context::FS_TYPE.to_string(), "xfs".to_string())]);
        let cap = capability("c", Some(&mount_cap(Mode::SingleNodeWriter, "ext4"))).expect("ok");
        assert_eq!(requested_fs(&cap, &ctx).expect("ok"), Some(FsType::Ext4));
        let cap = capability("c", Some(&mount_cap(Mode::SingleNodeWriter, ""))).expect("ok");
        assert_eq!(requested_fs(&cap, &ctx).expect("ok"), Some(FsType::Xfs));
        assert_eq!(requested_fs(&cap, &HashMap::new()).expect("ok"), None);
    }
}
