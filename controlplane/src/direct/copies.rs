//! Copies in the direct control plane: snapshots and clones, each a
//! complete copy on its source's node (the node's `CopyLV`). A copy this
//! plane made and whose filling failed is removed again; a retry resumes.

use carina_csi::snapshot_id::{self, is_snapshot_name};
use carina_csi::volume_id::VolumeId;
use carina_csi::{
    ContentSource, CsiError, ProvisionedSnapshot, ProvisionedVolume, SnapshotRequest, VolumeRequest,
};
use carina_proto::nodestorage as pb;
use futures::future::join_all;
use tonic::Code;

use super::{DirectProvisioner, provisioned, unavailable_or};
use crate::nodes::copy::copy;
use crate::nodes::placement;
use crate::nodes::spec::NodeSpec;
use crate::nodes::volume::fs_type;

/// Copies: snapshots and clones, each a complete copy on its source's
/// node (see the node's `CopyLV`).
impl DirectProvisioner {
    /// The node holding volume `name` among `lookups` (one answer per
    /// node, in list order), failing when a node cannot say.
    pub(super) fn found<'a>(
        &'a self,
        name: &str,
        lookups: Vec<Result<Option<pb::LogicVolume>, CsiError>>,
    ) -> Result<Option<(&'a NodeSpec, pb::LogicVolume)>, CsiError> {
        for (node, found) in self.nodes.nodes.iter().zip(lookups) {
            let found = found.map_err(|e| {
                unavailable_or(e, |m| {
                    format!("cannot tell whether {name:?} already exists: {m}")
                })
            })?;
            if let Some(lv) = found {
                return Ok(Some((node, lv)));
            }
        }
        Ok(None)
    }

    /// The volume `name` on whichever node has it.
    pub(super) async fn find_anywhere(
        &self,
        name: &str,
    ) -> Result<Option<(&NodeSpec, pb::LogicVolume)>, CsiError> {
        let lookups = join_all(self.nodes.nodes.iter().map(|n| self.get_lv(n, name))).await;
        self.found(name, lookups)
    }

    /// Deletes `name` from `node` after a failed copy into it (best
    /// effort: a copy still running there keeps it, and a retry resumes).
    pub(super) async fn discard(&self, node: &NodeSpec, name: &str) {
        let req = pb::DeleteLvRequest {
            name: name.to_string(),
        };
        if let Err(e) = self
            .clients
            .call(node, &format!("DeleteLV {name}"), |mut c| async move {
                c.delete_lv(req).await
            })
            .await
        {
            tracing::warn!(k8s.node.name = %node.name, carina.volume.name = %name, error = %e, "could not remove the target of a failed copy");
        }
    }

    /// Makes `target` on `node` (in `group`, `size_bytes`) unless it is
    /// there, and fills it from `source`. A target this call made is
    /// removed again when the copy fails.
    pub(super) async fn create_and_copy(
        &self,
        node: &NodeSpec,
        source: &str,
        target: &str,
        group: &str,
        size_bytes: u64,
        snapshot: bool,
    ) -> Result<pb::LogicVolume, CsiError> {
        let create = pb::CreateLvRequest {
            name: target.to_string(),
            device_group: group.to_string(),
            size_bytes,
            exclusive: false,
        };
        let what = format!("CreateLV {target} in group {group:?}");
        let created = self
            .clients
            .call(
                node,
                &what,
                |mut c| async move { c.create_lv(create).await },
            )
            .await?
            .created;
        match copy(&self.clients, node, source, target, snapshot).await {
            Ok(lv) => Ok(lv),
            Err(e) => {
                if created {
                    self.discard(node, target).await;
                }
                Err(e)
            }
        }
    }

    /// CreateVolume with a content source: a clone of a volume or a
    /// volume from a snapshot, on the source's node.
    pub(super) async fn create_from(
        &self,
        req: &VolumeRequest,
        source: &ContentSource,
    ) -> Result<ProvisionedVolume, CsiError> {
        let (id, kind) = match source {
            ContentSource::Snapshot(id) => (
                snapshot_id::parse("volume_content_source.snapshot.snapshot_id", id)?,
                "snapshot",
            ),
            ContentSource::Volume(id) => {
                super::legacy::refuse_go_id(id)?;
                (VolumeId::parse(id)?, "volume")
            }
        };
        let not_found =
            || CsiError::NotFound(format!("source {kind} {:?} does not exist", id.encode()));
        let node = self.nodes.get(&id.node).ok_or_else(not_found)?;
        let Some(source_lv) = self.get_lv(node, &id.volume).await? else {
            return Err(self
                .uncopyable(node, &id.volume, "volume_content_source", not_found())
                .await);
        };
        let origin = source_lv.origin.as_ref();
        if kind == "snapshot" && !origin.is_some_and(|o| o.snapshot) {
            return Err(not_found());
        }
        if kind == "snapshot" && !origin.is_some_and(|o| o.complete) {
            return Err(CsiError::Unavailable(format!(
                "snapshot {:?} is not complete yet",
                id.encode()
            )));
        }
        if !req.accessibility.requisite.is_empty()
            && !req.accessibility.requisite.iter().any(|t| node.matches(t))
        {
            return Err(CsiError::invalid(
                "accessibility_requirements",
                format!(
                    "a copy is made on its source's node {}, which is outside the requisite topology",
                    node.name
                ),
            ));
        }
        if !placement::policy_suits(req, source_lv.policy()) {
            return Err(CsiError::invalid(
                "volume_capabilities",
                format!(
                    "the source is a {} volume, which cannot serve this access",
                    crate::policy::name(source_lv.policy())
                ),
            ));
        }
        if req.capacity.limit_bytes > 0 && source_lv.size_bytes > req.capacity.limit_bytes {
            return Err(CsiError::OutOfRange(format!(
                "the source {kind} has {} bytes, above limit_bytes {}",
                source_lv.size_bytes, req.capacity.limit_bytes
            )));
        }
        let group = req
            .parameters
            .group
            .clone()
            .unwrap_or_else(|| source_lv.device_group.clone());
        let size = req.capacity.required_bytes.max(source_lv.size_bytes);
        if let Some((at, lv)) = self.find_anywhere(&req.local_name).await? {
            let same = at.name == node.name
                && lv
                    .origin
                    .as_ref()
                    .is_some_and(|o| o.source == id.volume && !o.snapshot);
            if !same {
                return Err(CsiError::AlreadyExists(format!(
                    "volume {:?} exists on node {} and is not a copy of {kind} {:?}",
                    req.name,
                    at.name,
                    id.encode()
                )));
            }
            if lv.origin.as_ref().is_some_and(|o| o.complete) {
                return Ok(provisioned(node, &lv, fs_type(req)));
            }
        }
        tracing::info!(k8s.node.name = %node.name, carina.group = %group, carina.volume.size_bytes = size, source = %id.encode(), "filling a new volume from its source");
        let lv = self
            .create_and_copy(node, &id.volume, &req.local_name, &group, size, false)
            .await?;
        Ok(provisioned(node, &lv, fs_type(req)))
    }
}

/// The control plane's view of a node's snapshot volume.
fn snapshot_of(node: &NodeSpec, lv: &pb::LogicVolume) -> Option<ProvisionedSnapshot> {
    let origin = lv.origin.as_ref().filter(|o| o.snapshot)?;
    is_snapshot_name(&lv.name).then(|| ProvisionedSnapshot {
        snapshot_id: VolumeId::new(lv.name.clone(), node.name.clone()).encode(),
        source_volume_id: VolumeId::new(origin.source.clone(), node.name.clone()).encode(),
        size_bytes: origin.source_size_bytes,
        created_unix_nanos: origin.completed_unix_nanos,
        ready: origin.complete,
    })
}

impl DirectProvisioner {
    /// Why the source `name` on `node`, which is no volume, cannot be
    /// copied: `INVALID_ARGUMENT` naming `field` when it is a bcache
    /// device, else `otherwise`.
    async fn uncopyable(
        &self,
        node: &NodeSpec,
        name: &str,
        field: &str,
        otherwise: CsiError,
    ) -> CsiError {
        match self.get_bcache(node, name).await {
            Ok(Some(_)) => CsiError::invalid(
                field,
                format!("{name:?} is a bcache (tiered) volume, which cannot be copied"),
            ),
            Ok(None) => otherwise,
            Err(e) => e,
        }
    }
}

/// The snapshot verbs of [`crate::direct::DirectProvisioner`]'s `Provisioner`.
impl DirectProvisioner {
    pub(super) async fn take_snapshot(
        &self,
        req: &SnapshotRequest,
    ) -> Result<ProvisionedSnapshot, CsiError> {
        let not_found = || {
            CsiError::NotFound(format!(
                "source volume {:?} does not exist",
                req.source_volume_id
            ))
        };
        super::legacy::refuse_go_id(&req.source_volume_id)?;
        let id = VolumeId::parse(&req.source_volume_id)?;
        let node = self.nodes.get(&id.node).ok_or_else(not_found)?;
        if let Some((at, lv)) = self.find_anywhere(&req.local_name).await? {
            let snapshot = snapshot_of(at, &lv);
            match snapshot {
                Some(s) if s.source_volume_id == req.source_volume_id => {
                    if s.ready {
                        return Ok(s);
                    }
                }
                _ => {
                    return Err(CsiError::AlreadyExists(format!(
                        "snapshot {:?} exists on node {} and is not of volume {:?}",
                        req.name, at.name, req.source_volume_id
                    )));
                }
            }
        }
        let Some(source) = self.get_lv(node, &id.volume).await? else {
            return Err(self
                .uncopyable(node, &id.volume, "source_volume_id", not_found())
                .await);
        };
        tracing::info!(k8s.node.name = %node.name, carina.group = %source.device_group, size_bytes = source.size_bytes, "taking a snapshot");
        let lv = self
            .create_and_copy(
                node,
                &id.volume,
                &req.local_name,
                &source.device_group,
                source.size_bytes,
                true,
            )
            .await?;
        snapshot_of(node, &lv).ok_or_else(|| {
            CsiError::Internal(format!(
                "node {}: the snapshot {:?} does not read back as one",
                node.name, req.local_name
            ))
        })
    }

    pub(super) async fn remove_snapshot(&self, snapshot_id: &str) -> Result<(), CsiError> {
        let id = match snapshot_id::parse("snapshot_id", snapshot_id) {
            Ok(id) => id,
            Err(CsiError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let Some(node) = self.nodes.get(&id.node) else {
            return Ok(());
        };
        let req = pb::DeleteLvRequest {
            name: id.volume.clone(),
        };
        match self
            .clients
            .call(
                node,
                &format!("DeleteLV {}", id.volume),
                |mut c| async move { c.delete_lv(req).await },
            )
            .await
        {
            Err(e) if e.code() == Code::NotFound => Ok(()),
            other => other.map(|_| ()),
        }
    }

    pub(super) async fn all_snapshots(&self) -> Result<Vec<ProvisionedSnapshot>, CsiError> {
        let lists = join_all(self.nodes.nodes.iter().map(|n| self.clients.list_all(n))).await;
        let mut all = Vec::new();
        for (node, lvs) in self.nodes.nodes.iter().zip(lists) {
            all.extend(lvs?.iter().filter_map(|lv| snapshot_of(node, lv)));
        }
        all.sort_by(|a, b| a.snapshot_id.cmp(&b.snapshot_id));
        Ok(all)
    }
}
