//! RAW device groups: whole disks carved into GPT partitions, one partition
//! per volume.
//!
//! # Which partitions are ours
//!
//! Volume `v` is the partition whose GPT name is `carina.io/` followed by
//! as much of `v` as fits in GPT's 36 UTF-16 units (26 characters of a
//! volume name), and whose unique partition GUID is [`volume_guid`]`(v)`:
//! a name-based UUID (version 8) cut from the SHA-256 of the full name.
//! Both must hold. Every other partition — no prefix, or the prefix with a
//! GUID that is not the hash of the name — is foreign: never listed,
//! resized or deleted, and its sectors are never allocated. A partition
//! another program made becomes ours only when adopted ([`adopt`]): its
//! entry is given our name and GUID in place.
//!
//! # Full names of long volumes
//!
//! A truncated GPT name does not give the volume name back, and the GUID is
//! a hash, so each disk also carries a *name record*: [`SLOTS`] slots of
//! [`SLOT_BYTES`] bytes, one per partition entry number, in the 16 KiB just
//! below the first MiB ([`RECORD_OFFSET`]). These sectors lie in GPT's
//! usable range but 1 MiB alignment never allocates them; the record is
//! only used when no partition covers them. Slot N holds a magic, flags
//! (whole-disk) and the full volume name of entry N. A slot counts only if
//! it verifies against its entry — the name truncates to the entry's name
//! and hashes to the entry's GUID — so a stale or damaged slot is ignored,
//! never trusted. A name that fits needs no slot; a long name is placed
//! only on a disk whose record can be written.
//!
//! # Space
//!
//! Partitions start and end on 1 MiB boundaries and a volume is exactly
//! its partition. Free space is the aligned gaps between all partitions
//! (foreign ones included) inside the usable range; a disk without a table
//! counts with the area of the GPT its first volume gives it (the GPT
//! default of 128 entries, as `sgdisk -o` makes it). A create must fit in one
//! gap (best fit: the smallest gap that holds it, disk order breaking
//! ties) and leave the group's reserve free; a grow must leave it free too.
//! A disk gets its GPT with its first volume and loses it when its last
//! partition is deleted (its first and last [`WIPE_BYTES`] are zeroed:
//! protective MBR, both GPT headers and entry arrays), so it is blank
//! again and discovery keeps assigning it to the group.
//!
//! # Whole-disk volumes
//!
//! An exclusive volume (Carina's `exclusively-raw-disk`) takes a disk with
//! no partition at all and gets one partition spanning its whole aligned
//! usable area, so it is at least the requested size. The record's flag
//! says so; without a slot it is inferred (the only partition on the disk,
//! ours, spanning the usable area). The reserve does not apply to them:
//! they take whole disks, not the shared free space the reserve keeps. A
//! disk that holds one is used by nothing else.
//!
//! # The kernel's view
//!
//! Tables are written by `sfdisk` told to leave the kernel alone; without
//! udev the kernel learns table changes only through `partx`, so every
//! change is followed by one, for the entry that changed; device nodes
//! are found through `/sys/block/<disk>/*/partition` and waited for
//! briefly. The first and last [`WIPE_BYTES`] of a new partition are made
//! to read as zeros before it is handed out, so no old filesystem reaches
//! its user. A delete first has the kernel forget the partition, which it
//! refuses while anyone has it open, so nothing is deleted under a user.
//! A disk read is in-process for an intact GPT, so a create or delete
//! runs the same two programs as doing it by hand (`sfdisk`, `partx`);
//! the group holds its disks open between rescans, so those reads (and
//! sfdisk's) come from the page cache.

mod adopt;
mod codec;
mod create;
#[cfg(test)]
mod fixtures;
mod kernel;
mod placement;
mod record;
mod view;

use std::sync::Mutex as StdMutex;

use async_trait::async_trait;

use super::backend::Backend;
use super::config::{GroupConfig, Policy};
use super::devnum;
use super::disks::Disk;
use super::error::{Error, Result};
use super::gpt;
use super::names;
use super::volume::{AdoptRequest, CreateRequest, GroupCapacity, QuotaMode, Volume};
use kernel::{NODE_WAIT, forget, kernel_size, present_node, sync_kernel, wait_node};
use placement::{choose_exclusive, choose_shared};
use record::write_slot;
use view::{DiskView, Owner, Part, inspect};

pub use codec::{name_fits, partition_name, volume_guid};
pub use record::{RECORD_OFFSET, SLOT_BYTES, SLOTS, Slot, decode_slot, encode_slot};

/// Allocation unit and alignment of partitions, in bytes.
pub const UNIT_BYTES: u64 = gpt::ALIGN_BYTES;

pub use crate::engine::wipe::WIPE_BYTES;
use crate::engine::wipe::zero_ends;

/// A RAW device group.
#[derive(Debug)]
pub struct RawGroup {
    config: GroupConfig,
    /// The disks discovery assigned at the last rescan, by name.
    disks: StdMutex<Vec<Disk>>,
    /// Those disks held open (read-only) until the next rescan: closing a
    /// block device's last descriptor drops its page cache, and then every
    /// look at a table (each create, delete, capacity report) would read
    /// the device again.
    held: StdMutex<Vec<std::fs::File>>,
    /// Held by every look at the tables and every change of them. Reads
    /// (list, get, capacity) run beside the engine's serialised changes,
    /// and one that read a table mid-change would see it half-written, or
    /// give the kernel back a partition a delete had just taken away.
    /// Taken after the engine's group lock.
    tables: tokio::sync::Mutex<()>,
}

impl RawGroup {
    pub fn new(config: GroupConfig) -> Self {
        RawGroup {
            config,
            disks: StdMutex::new(Vec::new()),
            held: StdMutex::new(Vec::new()),
            tables: tokio::sync::Mutex::new(()),
        }
    }

    fn disks(&self) -> Vec<Disk> {
        self.disks.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    async fn views(&self) -> Result<Vec<DiskView>> {
        let mut out = Vec::new();
        for disk in self.disks() {
            out.push(inspect(&disk).await?);
        }
        Ok(out)
    }

    fn exhausted(&self, requested_bytes: u64, allocatable_bytes: u64) -> Error {
        Error::ResourceExhausted {
            group: self.config.name.clone(),
            requested_bytes,
            allocatable_bytes,
        }
    }

    /// The volume in `part`, making sure the kernel has its device node.
    async fn volume(&self, view: &DiskView, part: &Part, owner: &Owner) -> Result<Volume> {
        let number = part.entry.number;
        let node = match present_node(&view.disk.name, number) {
            Some(node) => node,
            None => {
                gpt::partx_update(&view.disk.path, Some(number))
                    .run()
                    .await?;
                wait_node(&view.disk.name, number)
                    .await
                    .ok_or_else(|| no_node("open", &owner.volume, view, number))?
            }
        };
        let (major, minor) = devnum::of_path(&node)?;
        Ok(Volume {
            name: owner.volume.clone(),
            group: self.config.name.clone(),
            policy: Policy::Raw,
            size_bytes: view.bytes(part.entry.size),
            device_path: Some(node),
            host_path: None,
            major,
            minor,
            exclusive: owner.exclusive,
            disk: Some(view.path()),
        })
    }

    /// After `sfdisk_replace` grew entry `entry.number`: the kernel must
    /// see the new size.
    async fn finish_grow(
        &self,
        view: &DiskView,
        entry: &gpt::NewPartition,
        volume: &str,
    ) -> Result<()> {
        sync_kernel(&view.disk, Some(entry.number), &view.numbers()).await?;
        let want = view.bytes(entry.end - entry.start);
        match kernel_size(&view.disk.name, entry.number) {
            Some(got) if got == want => Ok(()),
            got => Err(Error::FailedPrecondition {
                operation: "resize",
                name: volume.to_string(),
                reason: format!(
                    "the kernel sees {} bytes for partition {} of {} after partx, not {want}",
                    got.map_or_else(|| "no".to_string(), |g| g.to_string()),
                    entry.number,
                    view.path()
                ),
            }),
        }
    }
}

fn no_node(operation: &'static str, volume: &str, view: &DiskView, number: u32) -> Error {
    Error::FailedPrecondition {
        operation,
        name: volume.to_string(),
        reason: format!(
            "the kernel shows no device for partition {number} of {} within {NODE_WAIT:?}",
            view.path()
        ),
    }
}

/// Removes the table of a disk whose partitions are all gone (from the
/// table and the kernel), so it is blank again: its ends, where the
/// protective MBR, both GPT headers and entry arrays and any other
/// signature a probe of the whole disk looks at lie, are zeroed. (`wipefs
/// -a` would do as much, then sleep a quarter second before asking the
/// kernel to re-read a table it needs no news of.)
async fn blank_again(view: &DiskView) -> Result<()> {
    zero_ends(&view.disk.path, view.disk.size_bytes)
        .await
        .map(drop)
}

/// Removes entry `number` from the table of `view`'s disk: when it is the
/// disk's `only` entry the table goes with it ([`blank_again`]), else
/// sfdisk deletes the one entry.
async fn remove_entry(view: &DiskView, number: u32, only: bool) -> Result<()> {
    if only {
        return blank_again(view).await;
    }
    gpt::sfdisk_delete(&view.disk.path, number)
        .run()
        .await
        .map(drop)
        .map_err(Error::from)
}

/// Kernel names of the disks among `disks` (GPT disks, usually) that hold
/// at least one partition of ours. A disk that cannot be read is logged
/// and left out.
pub async fn disks_with_our_partitions(disks: &[Disk]) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for disk in disks {
        match inspect(disk).await {
            Ok(view) if view.owned().next().is_some() => out.push(disk.name.clone()),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(disk = %disk.path.display(), error = %e, "cannot read the partition table")
            }
        }
    }
    Ok(out)
}

/// The disk, partition and ownership of our volume `name`, or
/// `VolumeNotFound`.
fn find_volume<'v>(
    views: &'v [DiskView],
    name: &str,
) -> Result<(&'v DiskView, &'v Part, &'v Owner)> {
    views
        .iter()
        .find_map(|v| v.find(name).map(|(p, o)| (v, p, o)))
        .ok_or_else(|| Error::VolumeNotFound {
            name: name.to_string(),
        })
}

#[async_trait]
impl Backend for RawGroup {
    fn config(&self) -> &GroupConfig {
        &self.config
    }

    async fn rescan(&self, disks: &[Disk]) -> Result<()> {
        let _tables = self.tables.lock().await;
        let mut disks = disks.to_vec();
        disks.sort_by(|a, b| a.name.cmp(&b.name));
        *self.disks.lock().unwrap_or_else(|p| p.into_inner()) = disks.clone();
        let mut held = Vec::with_capacity(disks.len());
        for disk in &disks {
            match tokio::fs::File::open(&disk.path).await {
                Ok(f) => held.push(f.into_std().await),
                Err(e) => {
                    tracing::warn!(disk = %disk.path.display(), error = %e, "cannot hold the disk open")
                }
            }
        }
        // The old descriptors close only now, so a disk the group keeps
        // keeps its cache.
        *self.held.lock().unwrap_or_else(|p| p.into_inner()) = held;
        // After a restart the kernel may not know the partitions yet.
        for disk in &disks {
            let view = inspect(disk).await?;
            if view.other_label.is_none() && !view.parts.is_empty() {
                sync_kernel(disk, None, &view.numbers()).await?;
                // A grow the node did not finish (killed between the table
                // write and partx) leaves the kernel with the old end.
                for (part, owner) in view.owned() {
                    let n = part.entry.number;
                    let want = view.bytes(part.entry.size);
                    if let Some(got) = kernel_size(&disk.name, n)
                        && got != want
                    {
                        tracing::info!(carina.volume.name = %owner.volume, disk = %disk.path.display(), partition = n, kernel_bytes = got, table_bytes = want, "the kernel has another size for the partition than its table; updating it");
                        gpt::partx_update(&disk.path, Some(n)).run().await?;
                    }
                }
            }
        }
        Ok(())
    }

    async fn create(&self, req: &CreateRequest) -> Result<Volume> {
        let _tables = self.tables.lock().await;
        // Rounded to UNIT_BYTES, and a name no volume has: the engine's checks.
        let size = req.size_bytes;
        let views = self.views().await?;
        let needs_record = !name_fits(&req.name);
        let choice = if req.exclusive {
            choose_exclusive(&views, size, needs_record)
        } else {
            choose_shared(&views, size, self.config.reserve_bytes, needs_record)
        };
        let (i, extent) = choice.map_err(|allocatable| self.exhausted(size, allocatable))?;
        self.make(&views[i], extent, &req.name, req.exclusive).await
    }

    async fn get(&self, name: &str) -> Result<Option<Volume>> {
        let _tables = self.tables.lock().await;
        for view in self.views().await? {
            if let Some((part, owner)) = view.find(name) {
                return self.volume(&view, part, owner).await.map(Some);
            }
        }
        Ok(None)
    }

    async fn list(&self) -> Result<Vec<Volume>> {
        let _tables = self.tables.lock().await;
        let mut out = Vec::new();
        for view in self.views().await? {
            for (part, owner) in view.owned() {
                out.push(self.volume(&view, part, owner).await?);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn resize(&self, name: &str, size: u64) -> Result<Volume> {
        let _tables = self.tables.lock().await;
        // Rounded to UNIT_BYTES and larger than the volume: the engine's checks.
        let views = self.views().await?;
        let (view, part, owner) = find_volume(&views, name)?;
        let current = view.bytes(part.entry.size);
        let refuse = |reason: String| Error::FailedPrecondition {
            operation: "resize",
            name: name.to_string(),
            reason,
        };
        debug_assert!(size > current, "the engine answers no-ops and shrinks");
        if owner.exclusive {
            return Err(refuse(format!(
                "it is a whole-disk volume and already has all of {} ({current} bytes)",
                view.path()
            )));
        }
        let start = part.entry.start;
        let end = start + size / view.sector;
        let limit = view
            .parts
            .iter()
            .filter(|p| p.entry.start > start)
            .map(|p| p.entry.start)
            .min()
            .unwrap_or(view.last_lba.saturating_add(1));
        if end > limit {
            return Err(refuse(format!(
                "only {} bytes right after it on {} are free, {} more are needed",
                view.bytes(limit.saturating_sub(part.entry.end())),
                view.path(),
                size - current
            )));
        }
        let free: u64 = views.iter().map(DiskView::free_bytes).sum();
        let allocatable = GroupCapacity::allocatable(free, self.config.reserve_bytes);
        if size - current > allocatable {
            return Err(self.exhausted(size - current, allocatable));
        }
        let grown = gpt::NewPartition {
            number: part.entry.number,
            start,
            end,
            name: part.entry.name.clone(),
            guid: part.entry.uuid.clone(),
            type_guid: part.entry.type_id.clone(),
        };
        gpt::sfdisk_replace(&view.disk.path, &grown).run().await?;
        // The table has the new end, the kernel the old one.
        carina_sys::crashpoint::reach("raw.resize.replaced", name);
        if let Err(e) = self.finish_grow(view, &grown, name).await {
            let old = gpt::NewPartition {
                end: part.entry.end(),
                ..grown
            };
            match gpt::sfdisk_replace(&view.disk.path, &old).run().await {
                Ok(_) => {
                    let _ = sync_kernel(&view.disk, Some(old.number), &view.numbers()).await;
                }
                Err(undo) => {
                    tracing::error!(carina.volume.name = %name, error = %undo, "undo: restoring the old partition end failed")
                }
            }
            return Err(e);
        }
        let after = inspect(&view.disk).await?;
        let (part, owner) = after.find(name).ok_or_else(|| Error::VolumeNotFound {
            name: name.to_string(),
        })?;
        self.volume(&after, part, owner).await
    }

    async fn delete(&self, name: &str) -> Result<()> {
        let _tables = self.tables.lock().await;
        let views = self.views().await?;
        let (view, part, _) = find_volume(&views, name)?;
        let number = part.entry.number;
        let path = &view.disk.path;
        let busy = |node: &std::path::Path, why: String| Error::FailedPrecondition {
            operation: "delete",
            name: name.to_string(),
            reason: format!("{} is in use ({why})", node.display()),
        };
        // The kernel forgets the partition first; it refuses while anyone
        // has it open, so the entry goes only once nobody uses it.
        if let Some(node) = present_node(&view.disk.name, number)
            && let Some(why) = forget(path, &node, number).await?
        {
            return Err(busy(&node, why));
        }
        // The kernel has forgotten the partition, the table still has it.
        carina_sys::crashpoint::reach("raw.delete.forgotten", name);
        // The disk's only entry goes with its table, so it is blank again
        // for discovery.
        let last = view.parts.len() == 1;
        if let Err(e) = remove_entry(view, number, last).await {
            // Still in the table: the kernel gets it back.
            let _ = sync_kernel(&view.disk, Some(number), &view.numbers()).await;
            return Err(e);
        }
        if view.record_usable()
            && let Err(e) = write_slot(path, number, None).await
        {
            tracing::warn!(disk = %path.display(), error = %e, "clearing the name slot failed");
        }
        if !last {
            let others: Vec<u32> = view
                .numbers()
                .into_iter()
                .filter(|n| *n != number)
                .collect();
            sync_kernel(&view.disk, None, &others).await?;
        }
        Ok(())
    }

    async fn adopt(&self, req: &AdoptRequest, disk: Option<&Disk>) -> Result<Volume> {
        let disk =
            disk.ok_or_else(|| Error::invalid("device_group", "a RAW adoption names the disk"))?;
        self.adopt_partition(req, disk).await
    }

    async fn capacity(&self) -> Result<GroupCapacity> {
        let _tables = self.tables.lock().await;
        let views = self.views().await?;
        let total_bytes = views
            .iter()
            .filter_map(|v| v.area().map(|a| v.bytes(a.len)))
            .sum();
        let free_bytes: u64 = views.iter().map(DiskView::free_bytes).sum();
        let largest = views
            .iter()
            .flat_map(|v| v.free().into_iter().map(|e| v.bytes(e.len)))
            .max()
            .unwrap_or(0);
        let allocatable_bytes = GroupCapacity::allocatable(free_bytes, self.config.reserve_bytes);
        Ok(GroupCapacity {
            group: self.config.name.clone(),
            policy: Policy::Raw,
            total_bytes,
            free_bytes,
            reserve_bytes: self.config.reserve_bytes,
            allocatable_bytes,
            largest_allocatable_bytes: largest.min(allocatable_bytes),
            allocation_unit: UNIT_BYTES,
            volume_count: views.iter().map(|v| v.owned().count() as u32).sum(),
            quota: QuotaMode::NotApplicable,
            disks: views.iter().map(DiskView::path).collect(),
            no_disks: None,
        })
    }

    fn round_size(&self, size_bytes: u64) -> Option<u64> {
        names::round_up(size_bytes, UNIT_BYTES)
    }
}
