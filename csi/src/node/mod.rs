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
//!   is created here too if missing, and never removed). A volume with
//!   mount access must be staged first (`FAILED_PRECONDITION`), except one
//!   under a Go Carina id ([`crate::legacy`]): Go's node had no stage step,
//!   so until no pod uses a volume Go published the kubelet publishes it
//!   again without a stage call (and will never ask to unstage it). Such a
//!   publish mounts the volume straight onto the target, as Go did, and
//!   unpublish takes it away.
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
//!
//! The files of this module: `validate` checks the request at the edge,
//! `observe` reads what the kernel says, `plan` decides from that what a
//! stage or publish takes (pure functions), `filesystem` and `block` carry
//! the step out for mount and block access (`target` creates and removes
//! the paths), and `stats` answers stats and expansion. This file holds the
//! service and its RPCs, which run those in that order.

mod block;
mod filesystem;
mod observe;
mod plan;
mod stats;
mod target;
mod validate;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use carina_proto::csi;
use carina_proto::csi::node_service_capability::rpc::Type as RpcType;
use carina_sys::busy::{BusyNames, Held, busy_message};
use carina_sys::mkfs::MkfsOptions;
use carina_sys::mount;
use tonic::{Code, Request, Response, Status};

use crate::TOPOLOGY_KEY;
use crate::error::CsiError;
use crate::legacy::LegacyId;
use crate::types::{LocalVolume, LocalVolumes};

use observe::{AtPath, inspect, source};
use plan::{PublishStep, StageStep, plan_publish, plan_stage, publish_options};
use validate::{
    Access, absolute, capability, mkfs_options, publish_read_only, publish_staging, requested_fs,
    required, required_bytes,
};

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
    /// Links the current span (a trace of its own: kubelet sends no trace
    /// context) to the trace the volume was created in.
    async fn link_creation(&self, volume_id: &str) {
        if let Some(traceparent) = self.volumes.creation_trace(volume_id).await {
            carina_proto::trace::link_current_span(&traceparent, "volume creation");
        }
    }

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
        let mkfs = mkfs_options(requested_fs, &req.volume_context)?;
        let _busy = self.lock(&req.volume_id)?;
        let vol = self.local(&req.volume_id).await?;
        let src = source(&vol).await?;
        let at = inspect(&staging, &vol.kind, &src).await?;
        stage_at(&vol, &cap, (requested_fs, &mkfs), &staging, &at).await
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
        let staging = publish_staging(&req.staging_target_path)?;
        let cap = capability("volume_capability", req.volume_capability.as_ref())?;
        if target == staging {
            return Err(CsiError::invalid(
                "target_path",
                "must differ from staging_target_path",
            ));
        }
        let read_only = publish_read_only(req.readonly, &cap);
        let options = publish_options(read_only);
        let _busy = self.lock(&req.volume_id)?;
        let vol = self.local(&req.volume_id).await?;
        let src = source(&vol).await?;
        let parent = target.parent().unwrap_or(std::path::Path::new("/"));
        if !observe::stat(parent).await?.is_some_and(|m| m.is_dir()) {
            return Err(CsiError::FailedPrecondition(format!(
                "the parent directory of target_path, {}, does not exist (the CO creates it)",
                parent.display()
            )));
        }
        let at = inspect(&target, &vol.kind, &src).await?;
        // Mount access publishes the staged filesystem, so it must be there.
        let staged = match cap.access {
            Access::Mount { .. } => Some(inspect(&staging, &vol.kind, &src).await?),
            Access::Block => None,
        };
        if let Some(AtPath::Missing | AtPath::Unmounted(_)) = &staged
            && LegacyId::parse(&req.volume_id).is_some()
        {
            let requested_fs = requested_fs(&cap, &req.volume_context)?;
            let mkfs = mkfs_options(requested_fs, &req.volume_context)?;
            return publish_unstaged(&vol, &cap, (requested_fs, &mkfs), read_only, &target, &at)
                .await;
        }
        let step = plan_publish(
            &vol,
            &cap,
            read_only,
            &target,
            &staging,
            &at,
            staged.as_ref(),
        )?;
        match step {
            PublishStep::Done => Ok(()),
            PublishStep::BindStaging {
                staged,
                create_dir,
                single_writer,
            } => {
                filesystem::publish(
                    &vol,
                    staged,
                    &staging,
                    &target,
                    &options,
                    create_dir,
                    single_writer,
                )
                .await
            }
            PublishStep::BindDevice {
                device,
                create_file,
                single_writer,
            } => block::publish(&vol, device, &target, &options, create_file, single_writer).await,
        }
    }

    async fn unpublish(&self, req: csi::NodeUnpublishVolumeRequest) -> Result<(), CsiError> {
        required("volume_id", &req.volume_id)?;
        let target = absolute("target_path", &req.target_path)?;
        let _busy = self.lock(&req.volume_id)?;
        // Not looked up, like unstage: cleaning up must work without it.
        mount::unmount_all(&target).await?;
        target::remove_target(&target).await
    }

    async fn stats(
        &self,
        req: csi::NodeGetVolumeStatsRequest,
    ) -> Result<csi::NodeGetVolumeStatsResponse, CsiError> {
        required("volume_id", &req.volume_id)?;
        required("volume_path", &req.volume_path)?;
        let vol = self.local(&req.volume_id).await?;
        stats::volume_stats(&vol, &req.volume_path).await
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
        let required_bytes = required_bytes(req.capacity_range.as_ref())?;
        let _busy = self.lock(&req.volume_id)?;
        let vol = self.local(&req.volume_id).await?;
        stats::expand(&vol, &req.volume_path, cap, required_bytes).await
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

/// Publishes a volume under a Go Carina id that is not staged: mounts it
/// straight onto `target` (where `at` is), as Go Carina's node did, read
/// only when asked. The kubelet sends such a publish for a volume Go
/// published while a pod still used it, and since Go's node had no stage
/// step it will not unstage the volume either: a mount at the staging path
/// would stay behind, one at the target goes with unpublish. A single
/// writer seen elsewhere once mounted is unmounted again and refused.
async fn publish_unstaged(
    vol: &LocalVolume,
    cap: &validate::Capability,
    format: Format<'_>,
    read_only: bool,
    target: &std::path::Path,
    at: &AtPath,
) -> Result<(), CsiError> {
    if let AtPath::Unmounted(kind) = at
        && *kind != observe::FileKind::Directory
    {
        return Err(CsiError::FailedPrecondition(format!(
            "target_path {} exists and is not a directory",
            target.display()
        )));
    }
    let mut direct = cap.clone();
    if let Access::Mount { flags, .. } = &mut direct.access
        && read_only
        && !flags.iter().any(|f| f == "ro")
    {
        flags.push("ro".to_string());
    }
    if matches!(at, AtPath::Ours(..)) {
        return stage_at(vol, &direct, format, target, at).await;
    }
    stage_at(vol, &direct, format, target, at).await?;
    tracing::info!(
        target = %target.display(),
        "published a Go Carina volume the kubelet counts as staged straight onto its target, as Go did"
    );
    if direct.mode
        == carina_proto::csi::volume_capability::access_mode::Mode::SingleNodeSingleWriter
    {
        let table = mount::MountTable::read().await?;
        let others = table
            .at(target)
            .map(|m| plan::other_publications(&table, (m.major, m.minor, &m.root), &[target]))
            .unwrap_or_default();
        if let Err(refused) = plan::single_writer(vol, &others) {
            mount::unmount_all(target).await?;
            if matches!(at, AtPath::Missing) {
                target::remove_target(target).await?;
            }
            return Err(refused);
        }
    }
    Ok(())
}

/// The filesystem asked for, and the class's options for making it.
type Format<'a> = (Option<carina_sys::format::FsType>, &'a MkfsOptions);

/// Carries out what staging `vol` at `staging` takes, where `at` is.
async fn stage_at(
    vol: &LocalVolume,
    cap: &validate::Capability,
    (requested_fs, mkfs): Format<'_>,
    staging: &std::path::Path,
    at: &AtPath,
) -> Result<(), CsiError> {
    match plan_stage(vol, cap, requested_fs, staging, at)? {
        StageStep::Done => Ok(()),
        StageStep::MakeDir => block::stage(staging).await,
        StageStep::MountDevice {
            device,
            fs,
            flags,
            create_dir,
        } => filesystem::stage_device(device, staging, (fs, mkfs), flags, create_dir).await,
        StageStep::BindDirectory {
            dir,
            flags,
            create_dir,
        } => filesystem::stage_directory(dir, staging, flags, create_dir).await,
    }
}

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
    #[tracing::instrument(name = "Node/NodeStageVolume", skip_all, fields(carina.volume.id = %request.get_ref().volume_id))]
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        self.link_creation(&request.get_ref().volume_id).await;
        answer(
            self.stage(request.into_inner())
                .await
                .map(|()| csi::NodeStageVolumeResponse {}),
        )
    }

    #[tracing::instrument(name = "Node/NodeUnstageVolume", skip_all, fields(carina.volume.id = %request.get_ref().volume_id))]
    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        self.link_creation(&request.get_ref().volume_id).await;
        answer(
            self.unstage(request.into_inner())
                .await
                .map(|()| csi::NodeUnstageVolumeResponse {}),
        )
    }

    #[tracing::instrument(name = "Node/NodePublishVolume", skip_all, fields(carina.volume.id = %request.get_ref().volume_id))]
    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        self.link_creation(&request.get_ref().volume_id).await;
        answer(
            self.publish(request.into_inner())
                .await
                .map(|()| csi::NodePublishVolumeResponse {}),
        )
    }

    #[tracing::instrument(name = "Node/NodeUnpublishVolume", skip_all, fields(carina.volume.id = %request.get_ref().volume_id))]
    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        self.link_creation(&request.get_ref().volume_id).await;
        answer(
            self.unpublish(request.into_inner())
                .await
                .map(|()| csi::NodeUnpublishVolumeResponse {}),
        )
    }

    #[tracing::instrument(name = "Node/NodeGetVolumeStats", skip_all, fields(carina.volume.id = %request.get_ref().volume_id))]
    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        answer(self.stats(request.into_inner()).await)
    }

    #[tracing::instrument(name = "Node/NodeExpandVolume", skip_all, fields(carina.volume.id = %request.get_ref().volume_id))]
    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        self.link_creation(&request.get_ref().volume_id).await;
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

#[cfg(test)]
mod tests;
