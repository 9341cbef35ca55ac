//! The engine's domain types: volumes, create requests and capacity.

use std::path::PathBuf;

use serde::Serialize;

use super::config::Policy;

/// A volume owned by this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Volume {
    pub name: String,
    pub group: String,
    pub policy: Policy,
    /// Exact size in bytes (after rounding to the group's allocation unit).
    pub size_bytes: u64,
    /// The block device (LVM and RAW volumes).
    pub device_path: Option<PathBuf>,
    /// The directory (HOST volumes).
    pub host_path: Option<PathBuf>,
    /// Device numbers of `device_path`; zero for HOST volumes.
    pub major: u32,
    pub minor: u32,
    /// RAW: the volume took a whole disk.
    pub exclusive: bool,
    /// The disk (RAW) or physical volume (LVM) the volume lives on.
    pub disk: Option<String>,
}

/// What a caller asks the engine to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRequest {
    pub name: String,
    pub group: String,
    pub size_bytes: u64,
    /// RAW only: take a whole, empty disk for this volume.
    pub exclusive: bool,
}

/// A volume another program (Go Carina) made on this node, to be taken
/// over in place under its own name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdoptRequest {
    /// The volume's name on disk, kept as its name here.
    pub name: String,
    pub group: String,
    /// The policy the caller expects the group to have.
    pub policy: Policy,
    /// RAW: the disk (its device name) holding the partition.
    pub disk: Option<String>,
    /// RAW: the partition's GPT name as the other program wrote it; it is
    /// renamed `name`.
    pub partition_label: Option<String>,
    /// The volume must be at least this large.
    pub size_bytes: u64,
}

/// Whether a HOST group enforces volume sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum QuotaMode {
    /// Block devices: the size is the device.
    NotApplicable,
    /// Project quota limits each directory to its size.
    ProjectQuota,
    /// No quota support: sizes are accounted, not enforced.
    AccountingOnly,
}

/// Capacity of one device group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupCapacity {
    pub group: String,
    pub policy: Policy,
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub reserve_bytes: u64,
    /// `free_bytes - reserve_bytes`, never below zero.
    pub allocatable_bytes: u64,
    /// The largest single volume that can be created now (contiguous
    /// allocation can make it smaller than `allocatable_bytes`).
    pub largest_allocatable_bytes: u64,
    /// Sizes are rounded up to a multiple of this.
    pub allocation_unit: u64,
    pub volume_count: u32,
    pub quota: QuotaMode,
    /// Disks (or, for HOST, the root directory) backing the group.
    pub disks: Vec<String>,
    /// LVM and RAW groups that took no disk at the last scan: the selector,
    /// its patterns and every disk seen with why it was not taken.
    pub no_disks: Option<String>,
}

impl GroupCapacity {
    /// `free - reserve` without underflow.
    pub fn allocatable(free_bytes: u64, reserve_bytes: u64) -> u64 {
        free_bytes.saturating_sub(reserve_bytes)
    }
}

/// Why a capacity update was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChangeReason {
    Start,
    Create,
    Resize,
    Delete,
    Rescan,
    Config,
}

/// The node's capacity at one moment; `generation` grows with every update
/// and counts from `incarnation`, chosen at each start of the engine. A
/// snapshot reflects every change that finished before it was taken, so a
/// change that returned at generation `g` is in every snapshot of the same
/// incarnation from `g` on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CapacitySnapshot {
    pub incarnation: String,
    pub generation: u64,
    pub reason: ChangeReason,
    pub groups: Vec<GroupCapacity>,
}
