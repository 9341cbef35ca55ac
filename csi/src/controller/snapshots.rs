//! The snapshot RPCs: CreateSnapshot, DeleteSnapshot, ListSnapshots and
//! GetSnapshot, offered only when the provisioner makes copies.

use carina_proto::csi;
use tonic::Code;

use super::ControllerService;
use super::paging::Paging;
use super::request::snapshot_request;
use super::wire::wire_snapshot;
use crate::error::CsiError;
use crate::snapshot_id;
use crate::types::Provisioner;

impl<P: Provisioner> ControllerService<P> {
    #[tracing::instrument(name = "Controller/CreateSnapshot", skip_all, err(level = "info"), fields(carina.snapshot.name = %req.name, carina.volume.id = %req.source_volume_id))]
    pub(super) async fn create_snapshot(
        &self,
        req: csi::CreateSnapshotRequest,
    ) -> Result<csi::CreateSnapshotResponse, CsiError> {
        self.copies_offered("CreateSnapshot")?;
        let request = snapshot_request(&req)?;
        let _claim = self.claim(&request.local_name)?;
        let snapshot = self.provisioner.create_snapshot(&request).await?;
        tracing::info!(carina.snapshot.id = %snapshot.snapshot_id, size_bytes = snapshot.size_bytes, "snapshot ready");
        Ok(csi::CreateSnapshotResponse {
            snapshot: Some(wire_snapshot(&snapshot)),
        })
    }

    #[tracing::instrument(name = "Controller/DeleteSnapshot", skip_all, err(level = "info"), fields(carina.snapshot.id = %req.snapshot_id))]
    pub(super) async fn delete_snapshot(
        &self,
        req: csi::DeleteSnapshotRequest,
    ) -> Result<csi::DeleteSnapshotResponse, CsiError> {
        self.copies_offered("DeleteSnapshot")?;
        // No snapshot can have a malformed id: deleting it is done.
        let id = match snapshot_id::parse("snapshot_id", &req.snapshot_id) {
            Ok(id) => id,
            Err(CsiError::NotFound(_)) => return Ok(csi::DeleteSnapshotResponse {}),
            Err(e) => return Err(e),
        };
        let _claim = self.claim(&id.volume)?;
        match self.provisioner.delete_snapshot(&req.snapshot_id).await {
            Err(e) if e.code() != Code::NotFound => Err(e),
            _ => Ok(csi::DeleteSnapshotResponse {}),
        }
    }

    #[tracing::instrument(name = "Controller/ListSnapshots", skip_all, err(level = "info"), fields(max_entries = req.max_entries))]
    pub(super) async fn list_snapshots(
        &self,
        req: csi::ListSnapshotsRequest,
    ) -> Result<csi::ListSnapshotsResponse, CsiError> {
        self.copies_offered("ListSnapshots")?;
        let paging = Paging::of(req.max_entries, &req.starting_token)?;
        let mut snapshots = self.provisioner.list_snapshots().await?;
        snapshots.retain(|s| {
            (req.snapshot_id.is_empty() || s.snapshot_id == req.snapshot_id)
                && (req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id)
        });
        let (snapshots, next_token) = paging.page(snapshots, |s| &s.snapshot_id);
        Ok(csi::ListSnapshotsResponse {
            entries: snapshots
                .iter()
                .map(|s| csi::list_snapshots_response::Entry {
                    snapshot: Some(wire_snapshot(s)),
                })
                .collect(),
            next_token,
        })
    }

    #[tracing::instrument(name = "Controller/GetSnapshot", skip_all, err(level = "info"), fields(carina.snapshot.id = %req.snapshot_id))]
    pub(super) async fn get_snapshot(
        &self,
        req: csi::GetSnapshotRequest,
    ) -> Result<csi::GetSnapshotResponse, CsiError> {
        self.copies_offered("GetSnapshot")?;
        snapshot_id::parse("snapshot_id", &req.snapshot_id)?;
        let snapshot = self
            .provisioner
            .list_snapshots()
            .await?
            .into_iter()
            .find(|s| s.snapshot_id == req.snapshot_id)
            .ok_or_else(|| {
                CsiError::NotFound(format!("snapshot {:?} does not exist", req.snapshot_id))
            })?;
        Ok(csi::GetSnapshotResponse {
            snapshot: Some(wire_snapshot(&snapshot)),
        })
    }

    /// `UNIMPLEMENTED` for `rpc` when the provisioner makes no copies.
    fn copies_offered(&self, rpc: &str) -> Result<(), CsiError> {
        if self.provisioner.copies() {
            Ok(())
        } else {
            Err(CsiError::Unimplemented(format!(
                "{rpc} is not offered by this control plane"
            )))
        }
    }
}
