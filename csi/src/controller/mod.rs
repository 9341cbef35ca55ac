//! The CSI Controller service over a [`Provisioner`].
//!
//! This module owns what the CSI spec asks of a controller and nothing about
//! where volumes live: request validation (errors name the field path),
//! the capability table, the per-volume in-flight lock, `ListVolumes`
//! pagination, and the conversions between the CSI wire and the domain
//! types. Every RPC this driver does not offer answers `UNIMPLEMENTED`.
//!
//! - Access: Carina volumes are local to one node, so only the single-node
//!   access modes are accepted (`SINGLE_NODE_WRITER`,
//!   `SINGLE_NODE_READER_ONLY`, `SINGLE_NODE_SINGLE_WRITER`,
//!   `SINGLE_NODE_MULTI_WRITER`), as block or as a mount with file system
//!   `ext4`, `xfs` or the default.
//! - In flight: a second CreateVolume, DeleteVolume or ControllerExpandVolume
//!   for a volume that already has one running answers `ABORTED` (the CO
//!   retries). The key is the node-local volume name (of a Go Carina id,
//!   its object's name), so a create by name and a delete by id of the
//!   same volume exclude each other too.
//! - Go Carina's ids (`volume-<pv>`, `host-<pv>`, `thin-<pv>`, which
//!   PersistentVolumes keep) are read beside ours wherever a volume id is
//!   ([`crate::legacy`]); the provisioner decides whether it serves the
//!   volume.
//! - Condition: `ListVolumes` and `ControllerGetVolume` report each
//!   volume's condition as its node sees it now (the provisioner asks);
//!   a node that cannot be asked, or no longer has the volume, makes the
//!   volume abnormal with a message naming the node.
//! - Pagination: volumes are listed in id order; a `next_token` names the
//!   last id returned, so a page boundary survives the deletion of that
//!   volume and volumes created meanwhile that sort later are seen. A token
//!   this service did not issue is `ABORTED`, as the spec asks.
//!
//! The verbs live in their own files: [`request`] validates requests into
//! domain requests, [`wire`] answers in the CSI wire forms, [`paging`]
//! pages lists, [`volumes`] and [`snapshots`] run the RPCs.

mod paging;
mod request;
mod snapshots;
#[cfg(test)]
mod tests;
mod volumes;
mod wire;

use std::sync::Arc;

use carina_proto::csi;
use carina_proto::csi::controller_server::{Controller, ControllerServer};
use carina_proto::csi::controller_service_capability::rpc::Type as Capability;
use carina_sys::busy::{BusyNames, Held, busy_message};
use tonic::{Request, Response, Status};

use crate::error::CsiError;
use crate::legacy::VolumeHandle;
use crate::types::{ProvisionedVolume, Provisioner};

pub use paging::{decode_token, encode_token};
pub use request::{snapshot_request, volume_request};
pub use volumes::tiered_capacity;
pub use wire::{wire_snapshot, wire_volume};

/// What the controller advertises. `SINGLE_NODE_MULTI_WRITER` is the spec's
/// switch for the `SINGLE_NODE_SINGLE_WRITER` and `SINGLE_NODE_MULTI_WRITER`
/// access modes; `VOLUME_CONDITION` says `ListVolumes` and
/// `ControllerGetVolume` (`GET_VOLUME`) report each volume's condition.
pub const CAPABILITIES: [Capability; 7] = [
    Capability::CreateDeleteVolume,
    Capability::ExpandVolume,
    Capability::GetCapacity,
    Capability::ListVolumes,
    Capability::SingleNodeMultiWriter,
    Capability::VolumeCondition,
    Capability::GetVolume,
];

/// The capabilities a provisioner that makes copies adds to
/// [`CAPABILITIES`].
pub const COPY_CAPABILITIES: [Capability; 4] = [
    Capability::CreateDeleteSnapshot,
    Capability::ListSnapshots,
    Capability::GetSnapshot,
    Capability::CloneVolume,
];

/// The CSI Controller service. Cheap to clone; clones share the in-flight
/// set.
#[derive(Debug)]
pub struct ControllerService<P> {
    provisioner: Arc<P>,
    in_flight: BusyNames,
}

impl<P> Clone for ControllerService<P> {
    fn clone(&self) -> Self {
        ControllerService {
            provisioner: self.provisioner.clone(),
            in_flight: self.in_flight.clone(),
        }
    }
}

impl<P: Provisioner> ControllerService<P> {
    pub fn new(provisioner: Arc<P>) -> Self {
        ControllerService {
            provisioner,
            in_flight: BusyNames::default(),
        }
    }

    /// The tonic service to add to a server.
    pub fn into_server(self) -> ControllerServer<Self> {
        ControllerServer::new(self)
    }

    /// Claims `volume` for one call; `ABORTED` if a call on it is running.
    fn claim(&self, volume: &str) -> Result<Held, CsiError> {
        self.in_flight
            .try_hold(volume)
            .ok_or_else(|| CsiError::Aborted(busy_message(volume)))
    }

    /// The volume `volume_id` names: `NOT_FOUND` when there is none or the
    /// id is neither of a form this driver issues nor Go Carina's.
    async fn existing(&self, volume_id: &str) -> Result<ProvisionedVolume, CsiError> {
        VolumeHandle::parse(volume_id)?;
        self.provisioner
            .get_volume(volume_id)
            .await?
            .ok_or_else(|| CsiError::NotFound(format!("volume {volume_id:?} does not exist")))
    }
}

/// The in-flight key of a call on the volume `id`: the name of the
/// volume, and of its `LogicVolume` in the Kubernetes plane, that a create
/// by name takes too. Go Carina named both after the object, so a Go id's
/// key is the object's name.
fn claim_key(id: &VolumeHandle) -> String {
    match id {
        VolumeHandle::Ours(id) => id.volume.clone(),
        VolumeHandle::Go(id) => id.object.clone(),
    }
}

fn answer<T>(result: Result<T, CsiError>) -> Result<Response<T>, Status> {
    result.map(Response::new).map_err(Status::from)
}

fn unimplemented<T>(rpc: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!(
        "{rpc} is not offered by the Carina controller"
    )))
}

#[tonic::async_trait]
impl<P: Provisioner> Controller for ControllerService<P> {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        answer(self.create(request.into_inner()).await)
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        answer(self.delete(request.into_inner()).await)
    }

    async fn controller_publish_volume(
        &self,
        _request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        unimplemented("ControllerPublishVolume")
    }

    async fn controller_unpublish_volume(
        &self,
        _request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        unimplemented("ControllerUnpublishVolume")
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        answer(self.validate(request.into_inner()).await)
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        answer(self.list(request.into_inner()).await)
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        answer(self.capacity(request.into_inner()).await)
    }

    #[tracing::instrument(name = "Controller/ControllerGetCapabilities", skip_all)]
    async fn controller_get_capabilities(
        &self,
        _request: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use csi::controller_service_capability::{Rpc, Type};
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: CAPABILITIES
                .iter()
                .chain(if self.provisioner.copies() {
                    COPY_CAPABILITIES.iter()
                } else {
                    [].iter()
                })
                .map(|c| csi::ControllerServiceCapability {
                    r#type: Some(Type::Rpc(Rpc { r#type: *c as i32 })),
                })
                .collect(),
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        answer(ControllerService::create_snapshot(self, request.into_inner()).await)
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        answer(ControllerService::delete_snapshot(self, request.into_inner()).await)
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        answer(ControllerService::list_snapshots(self, request.into_inner()).await)
    }

    async fn get_snapshot(
        &self,
        request: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        answer(ControllerService::get_snapshot(self, request.into_inner()).await)
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        answer(self.expand(request.into_inner()).await)
    }

    async fn controller_get_volume(
        &self,
        request: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        answer(self.get(request.into_inner()).await)
    }

    async fn controller_modify_volume(
        &self,
        _request: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        unimplemented("ControllerModifyVolume")
    }
}
