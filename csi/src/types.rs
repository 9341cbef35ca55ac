//! Domain types of the CSI layer and the two traits it is generic over:
//! [`Provisioner`] (controller side: where and how volumes are made) and
//! [`LocalVolumes`] (node side: which local device or directory a volume
//! id is).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use async_trait::async_trait;

use crate::error::CsiError;
use crate::params::Parameters;

/// One topology segment (`topology.carina.storage.io/node` → node name).
pub type Topology = BTreeMap<String, String>;

/// A validated capacity range; zero means "not set".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapacityRange {
    pub required_bytes: u64,
    pub limit_bytes: u64,
}

/// Accessibility requirements of a CreateVolume request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accessibility {
    /// The volume must be accessible from at least one of these.
    pub requisite: Vec<Topology>,
    /// In order of preference (WaitForFirstConsumer puts the pod's node first).
    pub preferred: Vec<Topology>,
}

/// What a new volume is filled from (CreateVolume's
/// `volume_content_source`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentSource {
    /// A snapshot id.
    Snapshot(String),
    /// A volume id (a clone).
    Volume(String),
}

/// A validated CreateSnapshot request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRequest {
    /// The CSI name (idempotency key).
    pub name: String,
    /// The node-local name ([`crate::snapshot_id::local_snapshot_name`]).
    pub local_name: String,
    pub source_volume_id: String,
}

/// A snapshot as a control plane knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionedSnapshot {
    pub snapshot_id: String,
    pub source_volume_id: String,
    /// The source's size when the snapshot was taken.
    pub size_bytes: u64,
    /// When it was taken, nanoseconds since the Unix epoch.
    pub created_unix_nanos: i64,
    /// The copy is complete.
    pub ready: bool,
}

/// A validated CreateVolume request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRequest {
    /// The CSI name (idempotency key).
    pub name: String,
    /// The node-local volume name derived from it ([`crate::names::local_name`]).
    pub local_name: String,
    pub capacity: CapacityRange,
    pub parameters: Parameters,
    pub accessibility: Accessibility,
    /// Block access was requested (no filesystem).
    pub block: bool,
    /// Fill the volume from this snapshot or volume.
    pub source: Option<ContentSource>,
}

/// A volume as a control plane knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionedVolume {
    pub volume_id: String,
    pub capacity_bytes: u64,
    pub node: String,
    pub group: String,
    /// `volume_context` (Carina's attributes: path, node, major, minor, group).
    pub context: BTreeMap<String, String>,
}

/// A volume's condition as the controller learns it from the volume's
/// node (CSI's `VolumeCondition`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeHealth {
    /// The volume cannot be used as it is, or its node cannot say.
    pub abnormal: bool,
    /// What is wrong, naming the node and the device, disk or directory;
    /// empty when normal.
    pub message: String,
}

impl VolumeHealth {
    pub fn abnormal(message: impl Into<String>) -> VolumeHealth {
        VolumeHealth {
            abnormal: true,
            message: message.into(),
        }
    }
}

/// Capacity answer for GetCapacity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CapacityInfo {
    pub available_bytes: u64,
    /// The largest single volume that can be created now.
    pub maximum_volume_size: u64,
}

/// Where and how volumes are made: the controller service's back end.
///
/// Every method is idempotent; errors carry the CSI code to answer with.
#[async_trait]
pub trait Provisioner: Send + Sync + 'static {
    /// Creates the volume, or returns the existing one with this name if it
    /// satisfies the request (`AlreadyExists` if it does not). Sizes are
    /// chosen with [`crate::sizes::allocation`] against the group's unit.
    async fn create_volume(&self, req: &VolumeRequest) -> Result<ProvisionedVolume, CsiError>;

    /// Deletes the volume; a volume that does not exist is success.
    async fn delete_volume(&self, volume_id: &str) -> Result<(), CsiError>;

    /// Grows the volume to satisfy `range`; returns the new size.
    /// `NotFound` if the volume does not exist.
    async fn expand_volume(&self, volume_id: &str, range: &CapacityRange) -> Result<u64, CsiError>;

    /// The volume, if it exists.
    async fn get_volume(&self, volume_id: &str) -> Result<Option<ProvisionedVolume>, CsiError>;

    /// Every volume, sorted by id.
    async fn list_volumes(&self) -> Result<Vec<ProvisionedVolume>, CsiError>;

    /// The condition of each of `volumes` (in the same order) as their
    /// nodes see them now. Never fails: a node that cannot be asked, or
    /// that no longer has the volume, makes the volume abnormal with a
    /// message that says so.
    async fn volume_health(&self, volumes: &[ProvisionedVolume]) -> Vec<VolumeHealth>;

    /// The names of the device groups the nodes publish, for reading Go
    /// Carina's group shorthand ([`crate::params::compat::resolve_group`]).
    /// Asked only for a request that uses the shorthand; without an answer
    /// (the default) a shorthand names its `carina-vg-*` group.
    async fn group_names(&self) -> Result<BTreeSet<String>, CsiError> {
        Ok(BTreeSet::new())
    }

    /// Whether snapshots and clones are made ([`Self::create_snapshot`],
    /// [`Self::delete_snapshot`], [`Self::list_snapshots`] and requests
    /// with a [`ContentSource`]); the controller advertises them only
    /// then.
    fn copies(&self) -> bool {
        false
    }

    /// Takes a snapshot of the request's source volume, or returns the
    /// existing one of that name and source (`AlreadyExists` for another
    /// source).
    async fn create_snapshot(
        &self,
        req: &SnapshotRequest,
    ) -> Result<ProvisionedSnapshot, CsiError> {
        let _ = req;
        Err(CsiError::Unimplemented(
            "snapshots are not supported".into(),
        ))
    }

    /// Deletes the snapshot; one that does not exist is success.
    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), CsiError> {
        let _ = snapshot_id;
        Err(CsiError::Unimplemented(
            "snapshots are not supported".into(),
        ))
    }

    /// Every snapshot, sorted by id.
    async fn list_snapshots(&self) -> Result<Vec<ProvisionedSnapshot>, CsiError> {
        Err(CsiError::Unimplemented(
            "snapshots are not supported".into(),
        ))
    }

    /// Capacity available in `topology` (all nodes when `None`) and
    /// `group` (all groups when `None`).
    async fn capacity(
        &self,
        topology: Option<&Topology>,
        group: Option<&str>,
    ) -> Result<CapacityInfo, CsiError>;
}

/// What a volume is on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalKind {
    /// A block device (LVM and RAW volumes).
    Block { device: PathBuf },
    /// A directory (HOST volumes); mounted by bind mount, never formatted.
    Directory { path: PathBuf },
}

/// A volume that lives on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalVolume {
    pub volume_id: String,
    pub kind: LocalKind,
    pub size_bytes: u64,
}

/// The node service's back end: the node's own volumes.
#[async_trait]
pub trait LocalVolumes: Send + Sync + 'static {
    /// This node's id (its name), as NodeGetInfo reports it.
    fn node_id(&self) -> &str;

    /// Most volumes this node publishes (0: no limit).
    fn max_volumes(&self) -> u64 {
        0
    }

    /// The local volume for `volume_id`; `None` if it is not on this node.
    async fn find(&self, volume_id: &str) -> Result<Option<LocalVolume>, CsiError>;

    /// The W3C `traceparent` of the span that created `volume_id`, when
    /// the node kept one: the node's spans of the volume link to it.
    async fn creation_trace(&self, _volume_id: &str) -> Option<String> {
        None
    }
}
