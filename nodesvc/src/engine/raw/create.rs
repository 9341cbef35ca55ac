//! Creating a volume's partition: the name slot, the table entry, the
//! kernel's device node and zeroed ends, each undone if a later step fails.

use carina_sys::blockdev;

use super::kernel::{sync_kernel, wait_node};
use super::record::write_slot;
use super::view::DiskView;
use super::{RawGroup, Slot, WIPE_BYTES, no_node, partition_name, remove_entry, volume_guid};
use crate::engine::config::Policy;
use crate::engine::devnum;
use crate::engine::error::{Error, Result};
use crate::engine::gpt::{self, Extent};
use crate::engine::volume::Volume;
use crate::engine::wipe::zero_ends;

impl RawGroup {
    /// Writes the partition for `volume` at `extent` of `view`, and undoes
    /// it if any later step fails.
    pub(super) async fn make(
        &self,
        view: &DiskView,
        extent: Extent,
        volume: &str,
        exclusive: bool,
    ) -> Result<Volume> {
        let number = view
            .free_number()
            .ok_or_else(|| self.exhausted(view.bytes(extent.len), 0))?;
        if view.blank {
            // Discovery saw it blank; `inspect` probed it again just now,
            // under the group's lock.
            if let Some(what) = view.disk.fstype.as_ref().or(view.disk.pttype.as_ref()) {
                return Err(Error::FailedPrecondition {
                    operation: "create",
                    name: volume.to_string(),
                    reason: format!("disk {} is no longer blank: it carries {what}", view.path()),
                });
            }
        }
        let entry = gpt::NewPartition {
            number,
            start: extent.start,
            end: extent.end(),
            name: partition_name(volume),
            guid: volume_guid(volume),
            type_guid: gpt::LINUX_DATA_TYPE.to_string(),
        };
        let path = &view.disk.path;
        // The slot goes first: without its entry it never verifies, and the
        // table write below flushes both.
        if view.record_usable() {
            let slot = Slot {
                volume: volume.to_string(),
                exclusive,
            };
            write_slot(path, number, Some(&slot)).await?;
        }
        // Whether the new partition's ends already read as zeros is read
        // from the disk while sfdisk runs: for a fresh area the wipe after
        // partx then costs nothing.
        let zeroed = {
            let disk = path.clone();
            let (offset, len) = (view.bytes(entry.start), view.bytes(entry.end - entry.start));
            tokio::task::spawn_blocking(move || {
                blockdev::range_ends_are_zero(&disk, offset, len, WIPE_BYTES)
            })
        };
        // A blank view's bounds are those of the new table.
        let new_table = view.blank.then_some(gpt::NewTable {
            first_lba: view.first_lba,
            last_lba: view.last_lba,
        });
        // sfdisk writes nothing when any step of its script fails.
        if let Err(e) = gpt::sfdisk_add(path, new_table, &entry).run().await {
            if view.record_usable() {
                let _ = write_slot(path, number, None).await;
            }
            return Err(e.into());
        }
        // The partition is in the table, not yet known to the kernel nor
        // wiped.
        carina_sys::crashpoint::reach("raw.create.partitioned", volume);
        // An error or a failed task only means the wipe reads for itself.
        let zeroed = matches!(zeroed.await, Ok(Ok(true)));
        match self
            .finish_create(view, &entry, volume, exclusive, zeroed)
            .await
        {
            Ok(v) => Ok(v),
            Err(e) => {
                undo_create(view, number).await;
                Err(e)
            }
        }
    }

    async fn finish_create(
        &self,
        view: &DiskView,
        entry: &gpt::NewPartition,
        volume: &str,
        exclusive: bool,
        zeroed: bool,
    ) -> Result<Volume> {
        sync_kernel(&view.disk, Some(entry.number), &view.numbers()).await?;
        let node = wait_node(&view.disk.name, entry.number)
            .await
            .ok_or_else(|| no_node("create", volume, view, entry.number))?;
        // An old filesystem at this offset must not reach the new user.
        let size_bytes = view.bytes(entry.end - entry.start);
        if !zeroed {
            zero_ends(&node, size_bytes).await?;
        }
        let (major, minor) = devnum::of_path(&node)?;
        Ok(Volume {
            name: volume.to_string(),
            group: self.config.name.clone(),
            policy: Policy::Raw,
            size_bytes,
            device_path: Some(node),
            host_path: None,
            major,
            minor,
            exclusive,
            disk: Some(view.path()),
        })
    }
}

/// Best-effort removal of a partition `make` wrote: slot, entry (or the
/// whole new table), kernel partition.
async fn undo_create(view: &DiskView, number: u32) {
    let path = &view.disk.path;
    if view.record_usable()
        && let Err(e) = write_slot(path, number, None).await
    {
        tracing::error!(disk = %path.display(), error = %e, "undo: clearing the name slot failed");
    }
    let _ = gpt::partx_delete(path, number).run().await;
    if let Err(e) = remove_entry(view, number, view.blank).await {
        tracing::error!(disk = %path.display(), partition = number, error = %e, "undo: removing the partition failed");
        return;
    }
    let _ = sync_kernel(&view.disk, None, &view.numbers()).await;
}
