//! Snapshots and clones as `LogicVolume`s: an object with `spec.source`
//! on its source's node, which the bridge makes (`CreateLV`) and fills
//! (`CopyLV`) before it reports it made. A snapshot's object is named
//! [`local_snapshot_name`] of the CSI snapshot name and has
//! `spec.source.snapshot`; its size is the source's. A clone, or a volume
//! from a snapshot, is named like any volume and is at least as large as
//! its source. The snapshot's creation time is its object's creation
//! (when the copy was asked for; a mounted source is frozen for the copy
//! right after).

use carina_api::{LOGICVOLUME_FINALIZER, LogicVolume, LogicVolumeSource, LogicVolumeSpec};
use carina_csi::legacy::VolumeHandle;
use carina_csi::names::is_local_name;
use carina_csi::snapshot_id::{self, is_snapshot_name};
use carina_csi::volume_id::VolumeId;
use carina_csi::{
    CapacityRange, ContentSource, CsiError, ProvisionedSnapshot, ProvisionedVolume,
    SnapshotRequest, VolumeRequest, sizes,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use kube::api::ObjectMeta;

use super::KubeProvisioner;
use super::object::new_object;
use super::outcome::{current_bytes, incompatible};
use super::placement::Target;

/// Whether `lv` is made (the bridge set `status.volumeID`).
fn is_made(lv: &LogicVolume) -> bool {
    lv.status
        .as_ref()
        .and_then(|s| s.volume_id.as_ref())
        .is_some()
}

/// The snapshot `lv` stands for, if it is one.
pub(super) fn snapshot_of(lv: &LogicVolume) -> Option<ProvisionedSnapshot> {
    let source = lv.spec.source.as_ref().filter(|s| s.snapshot)?;
    let name = lv.name_any();
    if !is_snapshot_name(&name) {
        return None;
    }
    let node = &lv.spec.node_name;
    let created = lv
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_nanosecond().clamp(0, i64::MAX as i128) as i64)
        .unwrap_or(0);
    Some(ProvisionedSnapshot {
        snapshot_id: VolumeId::new(name, node.clone()).encode(),
        source_volume_id: VolumeId::new(source.volume.clone(), node.clone()).encode(),
        size_bytes: current_bytes(lv).unwrap_or(0),
        created_unix_nanos: created,
        ready: is_made(lv) && lv.metadata.deletion_timestamp.is_none(),
    })
}

impl KubeProvisioner {
    /// The made, live object `name` on `node`, or `NotFound` saying `what`
    /// (without asking when no volume or snapshot can have that name).
    async fn made_source(
        &self,
        name: &str,
        node: &str,
        what: &str,
    ) -> Result<LogicVolume, CsiError> {
        if !is_local_name(name) && !is_snapshot_name(name) {
            return Err(CsiError::NotFound(format!("{what} does not exist")));
        }
        let lv = self.reads.lv(name).await?;
        lv.filter(|lv| {
            lv.spec.node_name == node && is_made(lv) && lv.metadata.deletion_timestamp.is_none()
        })
        .ok_or_else(|| CsiError::NotFound(format!("{what} does not exist")))
    }

    /// The id of a volume to copy. A Go Carina volume is not copied
    /// (`FAILED_PRECONDITION`, saying whether it must be taken over
    /// first); `NOT_FOUND` for an id of neither kind.
    async fn source_id(&self, volume_id: &str) -> Result<VolumeId, CsiError> {
        match VolumeHandle::parse(volume_id)? {
            VolumeHandle::Ours(id) => Ok(id),
            VolumeHandle::Go(id) => match self.find(volume_id).await? {
                None => Err(CsiError::NotFound(format!(
                    "source volume {:?} does not exist",
                    id.encode()
                ))),
                Some(lv) => Err(CsiError::FailedPrecondition(format!(
                    "source volume {:?} is a Go Carina volume taken over (LogicVolume {:?}); \
                     snapshots and clones of taken-over volumes are not offered",
                    id.encode(),
                    lv.name_any()
                ))),
            },
        }
    }

    /// CreateVolume with a content source: the new volume on the source's
    /// node, filled from it by the bridge.
    pub(super) async fn create_from(
        &self,
        req: &VolumeRequest,
        source: &ContentSource,
    ) -> Result<ProvisionedVolume, CsiError> {
        let (id, kind, snapshot) = match source {
            ContentSource::Snapshot(id) => (
                snapshot_id::parse("volume_content_source.snapshot.snapshot_id", id)?,
                "snapshot",
                true,
            ),
            ContentSource::Volume(id) => (self.source_id(id).await?, "volume", false),
        };
        let what = format!("source {kind} {:?}", id.encode());
        let source_lv = self.made_source(&id.volume, &id.node, &what).await?;
        if snapshot != source_lv.spec.source.as_ref().is_some_and(|s| s.snapshot) {
            return Err(CsiError::NotFound(format!("{what} does not exist")));
        }
        if source_lv.spec.cache.is_some() {
            return Err(CsiError::invalid(
                "volume_content_source",
                format!("{what} is a bcache (tiered) volume, which cannot be copied"),
            ));
        }
        let source_bytes = current_bytes(&source_lv).unwrap_or(0);
        if req.capacity.limit_bytes > 0 && source_bytes > req.capacity.limit_bytes {
            return Err(CsiError::OutOfRange(format!(
                "{what} has {source_bytes} bytes, above limit_bytes {}",
                req.capacity.limit_bytes
            )));
        }
        let node = source_lv.spec.node_name.clone();
        let group = req
            .parameters
            .group
            .clone()
            .unwrap_or_else(|| source_lv.spec.device_group.clone());
        let policy = self.reads.policy(&node, &group).await?;
        let name = req.local_name.clone();
        let wanted = CopyOf {
            volume: source_lv.name_any(),
            snapshot: false,
        };
        if let Some(existing) = self.reads.lv(&name).await? {
            return self.adopt_copy(existing, req, &wanted, policy).await;
        }
        if !req.accessibility.requisite.is_empty()
            && !req
                .accessibility
                .requisite
                .iter()
                .any(|t| super::records::node_spec(&node).matches(t))
        {
            return Err(CsiError::invalid(
                "accessibility_requirements",
                format!(
                    "a copy is made on its source's node {node}, which is outside the requisite topology"
                ),
            ));
        }
        let unit = self.reads.unit(&node, &group).await?;
        let range = CapacityRange {
            required_bytes: req.capacity.required_bytes.max(source_bytes),
            limit_bytes: req.capacity.limit_bytes,
        };
        let target = Target {
            node: node.clone(),
            group,
            size_bytes: sizes::allocation(&range, unit)?,
            policy: policy.clone(),
        };
        let mut object = new_object(&name, req, &target);
        object.spec.source = Some(wanted.spec());
        tracing::info!(carina.volume.name = %name, k8s.node.name = %node, source = %id.encode(), carina.volume.size_bytes = target.size_bytes, "creating LogicVolume filled from its source");
        let lv = self.create_or_existing(&object, None).await?.object();
        self.adopt_copy(lv, req, &wanted, policy).await
    }

    /// An object named like the request: waited for if it is the copy
    /// `wanted` and fits `req`, `ALREADY_EXISTS` otherwise.
    async fn adopt_copy(
        &self,
        lv: LogicVolume,
        req: &VolumeRequest,
        wanted: &CopyOf,
        policy: Option<String>,
    ) -> Result<ProvisionedVolume, CsiError> {
        if lv.metadata.deletion_timestamp.is_some() {
            return Err(CsiError::Aborted(format!(
                "an earlier LogicVolume {:?} is being deleted; retry once it is gone",
                lv.name_any()
            )));
        }
        let why = if !wanted.is(&lv) {
            Some(format!("it is not a copy of {:?}", wanted.volume))
        } else {
            incompatible(req, &lv, policy.as_deref())
        };
        if let Some(why) = why {
            return Err(CsiError::AlreadyExists(format!(
                "volume {:?} exists as LogicVolume {:?} on node {} but {why}",
                req.name,
                lv.name_any(),
                lv.spec.node_name
            )));
        }
        self.outcome(lv, req, policy).await
    }

    pub(super) async fn snapshot(
        &self,
        req: &SnapshotRequest,
    ) -> Result<ProvisionedSnapshot, CsiError> {
        let id = self.source_id(&req.source_volume_id).await?;
        let name = req.local_name.clone();
        let wanted = CopyOf {
            volume: id.volume.clone(),
            snapshot: true,
        };
        let conflict = |lv: &LogicVolume| {
            CsiError::AlreadyExists(format!(
                "snapshot {:?} exists (LogicVolume {name:?} on node {}) and is not of volume {:?}",
                req.name, lv.spec.node_name, req.source_volume_id
            ))
        };
        let existing = self.reads.lv(&name).await?;
        let lv = match existing {
            Some(lv) if !wanted.is(&lv) || lv.spec.node_name != id.node => {
                return Err(conflict(&lv));
            }
            Some(lv) => lv,
            None => {
                let what = format!("source volume {:?}", req.source_volume_id);
                let source = self.made_source(&id.volume, &id.node, &what).await?;
                if source.spec.cache.is_some() {
                    return Err(CsiError::invalid(
                        "source_volume_id",
                        format!("{what} is a bcache (tiered) volume, which cannot be copied"),
                    ));
                }
                let mut object = LogicVolume::new(
                    &name,
                    LogicVolumeSpec {
                        node_name: id.node.clone(),
                        size: Quantity(current_bytes(&source).unwrap_or(0).to_string()),
                        device_group: source.spec.device_group.clone(),
                        pvc: String::new(),
                        name_space: String::new(),
                        cache: None,
                        source: Some(wanted.spec()),
                    },
                );
                object.metadata = ObjectMeta {
                    name: Some(name.clone()),
                    finalizers: Some(vec![LOGICVOLUME_FINALIZER.to_string()]),
                    ..ObjectMeta::default()
                };
                tracing::info!(carina.snapshot.name = %name, k8s.node.name = %id.node, source = %id.volume, "creating the LogicVolume of a snapshot");
                let lv = self.create_or_existing(&object, None).await?.object();
                if !wanted.is(&lv) {
                    return Err(conflict(&lv));
                }
                lv
            }
        };
        if lv.metadata.deletion_timestamp.is_some() {
            return Err(CsiError::Aborted(format!(
                "an earlier snapshot LogicVolume {name:?} is being deleted; retry once it is gone"
            )));
        }
        let made = self.await_made(lv).await?;
        snapshot_of(&made).ok_or_else(|| {
            CsiError::Internal(format!("LogicVolume {name:?} does not read as a snapshot"))
        })
    }

    pub(super) async fn remove_snapshot(&self, snapshot_id: &str) -> Result<(), CsiError> {
        let id = match snapshot_id::parse("snapshot_id", snapshot_id) {
            Ok(id) => id,
            Err(CsiError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let lv = self
            .reads
            .lv(&id.volume)
            .await?
            .filter(|lv| lv.spec.node_name == id.node && snapshot_of(lv).is_some());
        match lv {
            Some(lv) => self.delete_object(lv).await,
            None => Ok(()),
        }
    }

    pub(super) async fn snapshots(&self) -> Result<Vec<ProvisionedSnapshot>, CsiError> {
        let lvs = self.reads.lvs().await?;
        let mut all: Vec<ProvisionedSnapshot> = lvs.iter().filter_map(snapshot_of).collect();
        all.sort_by(|a, b| a.snapshot_id.cmp(&b.snapshot_id));
        Ok(all)
    }
}

/// The copy an object is asked to be.
struct CopyOf {
    volume: String,
    snapshot: bool,
}

impl CopyOf {
    fn spec(&self) -> LogicVolumeSource {
        LogicVolumeSource {
            volume: self.volume.clone(),
            snapshot: self.snapshot,
        }
    }

    fn is(&self, lv: &LogicVolume) -> bool {
        lv.spec.source.as_ref() == Some(&self.spec())
    }
}
