//! The interface every device-group policy implements. The engine holds
//! one backend per configured group and serialises mutations per group, so
//! a backend's free-space check and its allocation cannot race.

use async_trait::async_trait;

use super::config::GroupConfig;
use super::disks::Disk;
use super::error::Result;
use super::volume::{CreateRequest, GroupCapacity, Volume};

/// One device group (an LVM VG, a set of RAW disks, a HOST root).
///
/// The engine guarantees: names and sizes are validated before a call;
/// `create`, `resize`, `delete` and `rescan` of one group never run
/// concurrently; no two calls for the same volume name run concurrently.
#[async_trait]
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// The group's configuration.
    fn config(&self) -> &GroupConfig;

    /// Brings the group up: takes the disks assigned to it (creating the
    /// VG, claiming blank disks), re-establishes device nodes of existing
    /// volumes. Called at start, on every rescan and after a configuration
    /// change, with the disks discovery assigned to this group.
    async fn rescan(&self, disks: &[Disk]) -> Result<()>;

    /// Creates a volume of `req.size_bytes` rounded up to the allocation
    /// unit. The engine has already checked that no volume of that name
    /// exists in any group. Not enough space is `ResourceExhausted`; a
    /// failure leaves nothing behind.
    async fn create(&self, req: &CreateRequest) -> Result<Volume>;

    /// The volume of that name owned by us in this group, if any.
    async fn get(&self, name: &str) -> Result<Option<Volume>>;

    /// Every volume owned by us in this group (foreign ones are ignored).
    async fn list(&self) -> Result<Vec<Volume>>;

    /// Grows `name` to at least `size_bytes` (rounded up). A smaller size
    /// than the current one is `FailedPrecondition`; the same size is a
    /// no-op returning the volume.
    async fn resize(&self, name: &str, size_bytes: u64) -> Result<Volume>;

    /// Removes the volume; `VolumeNotFound` if we own none of that name.
    async fn delete(&self, name: &str) -> Result<()>;

    /// Current capacity.
    async fn capacity(&self) -> Result<GroupCapacity>;

    /// Rounds a requested size the way `create` will.
    fn round_size(&self, size_bytes: u64) -> Option<u64>;
}
