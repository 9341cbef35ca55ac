//! CSI semantics for Carina: the Identity, Controller and Node services,
//! request validation, capability tables, idempotency and error codes.
//!
//! It knows neither Kubernetes nor LVM. The controller service is generic
//! over a [`Provisioner`] (the direct control plane, the Kubernetes one),
//! the node service over [`LocalVolumes`] (the node's engine). Domain types
//! live in [`types`]; [`error::CsiError`] is mapped to `tonic::Status` in
//! one place. [`strategy::Strategy`] is the placement order every control
//! plane and the scheduler extender share.

pub mod capability;
pub mod controller;
pub mod error;
pub mod identity;
pub mod legacy;
pub mod names;
pub mod node;
pub mod params;
pub mod sizes;
pub mod snapshot_id;
pub mod socket;
pub mod strategy;
pub mod types;
pub mod volume_id;

pub use error::CsiError;
pub use types::{
    Accessibility, CapacityInfo, CapacityRange, ContentSource, LocalKind, LocalVolume,
    LocalVolumes, ProvisionedSnapshot, ProvisionedVolume, Provisioner, SnapshotRequest, Topology,
    VolumeHealth, VolumeRequest,
};

/// The CSI driver name, as Carina has it.
pub const DRIVER_NAME: &str = "carina.storage.io";
/// The topology key every volume is pinned by.
pub const TOPOLOGY_KEY: &str = "topology.carina.storage.io/node";
/// `volume_context` keys (Carina's PV volume attributes).
pub mod context {
    pub const PATH: &str = "carina.storage.io/path";
    pub const NODE: &str = "carina.storage.io/node";
    pub const MAJOR: &str = "carina.storage.io/major";
    pub const MINOR: &str = "carina.storage.io/minor";
    pub const GROUP: &str = "carina.storage.io/disk-group-name";
    pub const POLICY: &str = "carina.storage.io/policy";
    pub const FS_TYPE: &str = "csi.storage.k8s.io/fstype";
    /// The class's checked mkfs options (the StorageClass parameter of
    /// the same name), for the node to use when it formats the volume.
    pub const MKFS_OPTIONS: &str = "carina.storage.io/mkfs-options";
}
