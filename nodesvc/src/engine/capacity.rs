//! What the engine reports of its groups: capacity on request, the
//! capacity snapshots sent to subscribers after every change, and the
//! disks of the last scan.

use tokio::sync::watch;
use tracing::instrument;

use super::volume::ChangeReason;
use super::{CapacitySnapshot, DiskStatus, Engine, GroupCapacity, Result};

impl Engine {
    /// Capacity of every group (or of one).
    #[instrument(skip(self), err)]
    pub async fn capacity(&self, group: Option<&str>) -> Result<Vec<GroupCapacity>> {
        let slots = self.slots(group).await?;
        let mut out = Vec::with_capacity(slots.len());
        for slot in slots {
            out.push(self.with_no_disks(slot.backend.capacity().await?));
        }
        Ok(out)
    }

    /// A receiver that sees the latest capacity at once and every update.
    pub fn subscribe(&self) -> watch::Receiver<CapacitySnapshot> {
        self.inner.capacity.subscribe()
    }

    /// Every disk discovery saw at the last rescan, with the group that took
    /// it or the reason none did.
    pub fn disks(&self) -> Vec<DiskStatus> {
        self.inner
            .disks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `c` with why its group has no disk, if it took none at the last scan.
    fn with_no_disks(&self, mut c: GroupCapacity) -> GroupCapacity {
        let empty = self.inner.empty.lock().unwrap_or_else(|p| p.into_inner());
        c.no_disks = empty.get(&c.group).map(ToString::to_string);
        c
    }

    pub(super) async fn notify(&self, reason: ChangeReason) {
        let _one_at_a_time = self.inner.notifying.lock().await;
        let slots = self.all_slots().await;
        let mut groups = Vec::with_capacity(slots.len());
        for slot in slots {
            match slot.backend.capacity().await {
                Ok(c) => groups.push(self.with_no_disks(c)),
                Err(e) => {
                    tracing::warn!(carina.group = %slot.backend.config().name, error = %e, "capacity unavailable")
                }
            }
        }
        self.inner.capacity.send_modify(|snap| {
            snap.generation += 1;
            snap.reason = reason;
            snap.groups = groups;
        });
    }
}
