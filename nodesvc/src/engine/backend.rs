//! The interface every device-group policy implements. The engine holds
//! one backend per configured group and serialises mutations per group, so
//! a backend's free-space check and its allocation cannot race.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::config::GroupConfig;
use super::disks::Disk;
use super::error::Result;
use super::volume::{AdoptRequest, CreateRequest, GroupCapacity, Volume};

/// One device group (an LVM VG, a set of RAW disks, a HOST root).
///
/// # The contract between the engine and a backend
///
/// The engine makes the request-level checks once and the backends trust
/// them, so each answer (and its error code and message) has one source:
///
/// - names are valid volume names and sizes are positive and at most
///   2^63 (`INVALID_ARGUMENT` otherwise, from the engine);
/// - sizes handed to [`create`](Self::create) and [`resize`](Self::resize)
///   are already rounded up with this backend's
///   [`round_size`](Self::round_size) (a size that cannot be rounded is
///   refused by the engine);
/// - repeats are answered by the engine: a `create` of a name the engine
///   knows is either the existing volume (same group and rounded size) or
///   `ALREADY_EXISTS`; a `resize` to the current size is a no-op and one to
///   a smaller size is refused (`FAILED_PRECONDITION`) — neither reaches
///   the backend;
/// - `create`, `resize`, `delete` and `rescan` of one group never run
///   concurrently (but for the part of a create a backend runs after
///   releasing the group's lock, see
///   [`create_releasing`](Backend::create_releasing)), and no two calls
///   for the same volume name do.
///
/// What only the backend can know stays its to check: free and contiguous
/// space, the reserve, whole-disk rules, foreign objects in its way, and
/// the state of the disks and tools.
#[async_trait]
pub trait Backend: Send + Sync + std::fmt::Debug {
    /// The group's configuration.
    fn config(&self) -> &GroupConfig;

    /// Brings the group up: takes the disks assigned to it (creating the
    /// VG, claiming blank disks), re-establishes device nodes of existing
    /// volumes. Called at start, on every rescan and after a configuration
    /// change, with the disks discovery assigned to this group.
    async fn rescan(&self, disks: &[Disk]) -> Result<()>;

    /// Creates a volume of exactly `req.size_bytes` (a whole-disk RAW
    /// volume: at least that). The size is already rounded to the
    /// allocation unit, and no volume of this name exists in any group.
    /// Not enough space is `ResourceExhausted`; a failure leaves nothing
    /// behind.
    async fn create(&self, req: &CreateRequest) -> Result<Volume>;

    /// [`create`](Self::create), called with the group's lock held as
    /// `lock`. A backend may [`release`](GroupLock::release) it once the
    /// rest of the create no longer touches what the lock guards (the
    /// allocation is made and recorded, what is left concerns only the new
    /// volume), so the group's next change need not wait for it; it must
    /// [`reacquire`](GroupLock::reacquire) it before changing the group
    /// again (a rollback). The default keeps it for the whole create.
    async fn create_releasing(&self, req: &CreateRequest, lock: &GroupLock) -> Result<Volume> {
        let _ = lock;
        self.create(req).await
    }

    /// The volume of that name owned by us in this group, if any.
    async fn get(&self, name: &str) -> Result<Option<Volume>>;

    /// Every volume owned by us in this group (foreign ones are ignored).
    async fn list(&self) -> Result<Vec<Volume>>;

    /// Grows the existing volume `name` of this group to exactly
    /// `size_bytes`, which is already rounded to the allocation unit and
    /// larger than the volume's current size. Returns the grown volume.
    async fn resize(&self, name: &str, size_bytes: u64) -> Result<Volume>;

    /// Removes the volume; `VolumeNotFound` if we own none of that name.
    async fn delete(&self, name: &str) -> Result<()>;

    /// Takes over, in place, the volume `req.name` another program made
    /// in this group: adds what makes it ours without touching its data,
    /// and returns it. `disk` is the disk a RAW volume is on (the group
    /// may not have taken it yet: only foreign partitions were on it). A
    /// volume of that name we own already is returned as it is.
    /// `VolumeNotFound` when there is none; `FailedPrecondition` when it
    /// is smaller than `req.size_bytes` or cannot be served. The
    /// steps are ordered so a failed adoption leaves the volume either
    /// untouched or adoptable by a retry.
    async fn adopt(&self, _req: &AdoptRequest, _disk: Option<&Disk>) -> Result<Volume> {
        Err(super::error::Error::Unsupported {
            group: self.config().name.clone(),
            policy: self.config().policy.as_str(),
            operation: "adopting volumes",
        })
    }

    /// Current capacity.
    async fn capacity(&self) -> Result<GroupCapacity>;

    /// Rounds a requested size up to the allocation unit; `None` if the
    /// result would overflow. The engine applies it to every size before
    /// `create` and `resize`, so it must use the group's real unit.
    fn round_size(&self, size_bytes: u64) -> Option<u64>;
}

/// The engine's lock of one group (held by every change of it), as a
/// create holds it: released early by a backend that can, and taken again
/// for a rollback. Dropping it releases it.
#[derive(Debug)]
pub struct GroupLock {
    mutex: Arc<Mutex<()>>,
    guard: std::sync::Mutex<Option<OwnedMutexGuard<()>>>,
}

impl GroupLock {
    /// Waits for the group's lock `mutex`.
    pub async fn acquire(mutex: Arc<Mutex<()>>) -> GroupLock {
        let guard = mutex.clone().lock_owned().await;
        GroupLock {
            mutex,
            guard: std::sync::Mutex::new(Some(guard)),
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<OwnedMutexGuard<()>>> {
        self.guard.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets the group's other changes run.
    pub fn release(&self) {
        self.slot().take();
    }

    /// Holds the lock again (at once if it was never released).
    pub async fn reacquire(&self) {
        if self.slot().is_some() {
            return;
        }
        let guard = self.mutex.clone().lock_owned().await;
        *self.slot() = Some(guard);
    }
}
