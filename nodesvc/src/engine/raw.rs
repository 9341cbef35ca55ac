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
//! resized or deleted, and its sectors are never allocated.
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
//! counts with the area `sgdisk -o` would give it. A create must fit in one
//! gap (best fit: the smallest gap that holds it, disk order breaking
//! ties) and leave the group's reserve free; a grow must leave it free too.
//! A disk gets its GPT with its first volume and loses it (`wipefs`) when
//! its last partition is deleted, so it is blank again and discovery keeps
//! assigning it to the group.
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
//! Without udev the kernel learns table changes only through `partx`, so
//! every change is followed by one; device nodes are found through
//! `/sys/block/<disk>/*/partition` and waited for briefly. A new partition
//! is wiped (`wipefs -a`) before it is handed out, and so is a partition
//! before it is deleted, which also refuses one that is still mounted.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use tracing::instrument;

use super::backend::Backend;
use super::config::{GroupConfig, Policy};
use super::devnum;
use super::disks::{self, Disk, PARTITION_PREFIX};
use super::error::{Error, Result};
use super::gpt::{self, Extent};
use super::names;
use super::volume::{CreateRequest, GroupCapacity, QuotaMode, Volume};

/// Allocation unit and alignment of partitions, in bytes.
pub const UNIT_BYTES: u64 = gpt::ALIGN_BYTES;
/// Partition entries we use: the size of the tables `sgdisk -o` makes.
pub const SLOTS: u32 = gpt::TABLE_ENTRIES as u32;
/// Bytes of one name-record slot.
pub const SLOT_BYTES: usize = 128;
/// Byte offset of the name record on a disk: the last 16 KiB below 1 MiB.
pub const RECORD_OFFSET: u64 = UNIT_BYTES - SLOTS as u64 * SLOT_BYTES as u64;
const RECORD_BYTES: usize = SLOTS as usize * SLOT_BYTES;
const SLOT_MAGIC: &[u8; 8] = b"carinaV1";
const SLOT_HEADER: usize = 10;
const FLAG_EXCLUSIVE: u8 = 1;
/// Keeps our GUIDs apart from any other name-based UUIDs.
const GUID_DOMAIN: &[u8] = b"carina.storage.io/raw-partition\0";
/// How long to wait for a partition's device node after `partx`.
const NODE_WAIT: Duration = Duration::from_secs(5);

/// The GPT name of `volume`'s partition: `carina.io/` and as much of the
/// name as fits in 36 UTF-16 units.
pub fn partition_name(volume: &str) -> String {
    let mut out = String::from(PARTITION_PREFIX);
    let mut units = PARTITION_PREFIX.encode_utf16().count();
    for c in volume.chars() {
        if units + c.len_utf16() > gpt::NAME_UNITS {
            break;
        }
        units += c.len_utf16();
        out.push(c);
    }
    out
}

/// True if the whole name fits in the partition name.
pub fn name_fits(volume: &str) -> bool {
    partition_name(volume).len() == PARTITION_PREFIX.len() + volume.len()
}

/// The unique partition GUID of `volume`'s partition: the first 128 bits
/// of SHA-256 over a fixed domain string and the full name, marked as a
/// version 8 (custom) UUID, in upper case.
pub fn volume_guid(volume: &str) -> String {
    let digest = Sha256::new()
        .chain_update(GUID_DOMAIN)
        .chain_update(volume.as_bytes())
        .finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02X}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// One name-record slot: who entry N belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub volume: String,
    pub exclusive: bool,
}

/// Slot layout: magic (8 bytes), flags (1), name length (1), name, zeros.
/// `None` if the name is too long for a slot.
pub fn encode_slot(slot: &Slot) -> Option<[u8; SLOT_BYTES]> {
    let name = slot.volume.as_bytes();
    if name.len() > SLOT_BYTES - SLOT_HEADER {
        return None;
    }
    let mut out = [0u8; SLOT_BYTES];
    out[..8].copy_from_slice(SLOT_MAGIC);
    out[8] = if slot.exclusive { FLAG_EXCLUSIVE } else { 0 };
    out[9] = name.len() as u8; // bounded by SLOT_BYTES above
    out[SLOT_HEADER..SLOT_HEADER + name.len()].copy_from_slice(name);
    Some(out)
}

/// Reads one slot; `None` for an empty or malformed one.
pub fn decode_slot(bytes: &[u8]) -> Option<Slot> {
    if bytes.len() < SLOT_BYTES || &bytes[..8] != SLOT_MAGIC {
        return None;
    }
    let len = usize::from(bytes[9]);
    let name = bytes.get(SLOT_HEADER..SLOT_HEADER + len)?;
    let volume = std::str::from_utf8(name).ok()?;
    names::check_volume_name(volume).ok()?;
    Some(Slot {
        volume: volume.to_string(),
        exclusive: bytes[8] & FLAG_EXCLUSIVE != 0,
    })
}

/// The owner of a partition entry, if it is ours: the slot's volume when
/// the slot verifies, else the name after the prefix when that verifies.
/// `exclusive` is `None` when no slot said.
fn owner_of(entry: &gpt::Partition, slot: Option<&Slot>) -> Option<(String, Option<bool>)> {
    let rest = entry.name.strip_prefix(PARTITION_PREFIX)?;
    let verifies = |v: &str| {
        partition_name(v) == entry.name && volume_guid(v).eq_ignore_ascii_case(&entry.uuid)
    };
    if let Some(s) = slot
        && verifies(&s.volume)
    {
        return Some((s.volume.clone(), Some(s.exclusive)));
    }
    if names::check_volume_name(rest).is_ok() && verifies(rest) {
        return Some((rest.to_string(), None));
    }
    None
}

/// A volume found in a partition entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Owner {
    volume: String,
    exclusive: bool,
}

#[derive(Debug, Clone)]
struct Part {
    entry: gpt::Partition,
    owner: Option<Owner>,
}

/// One disk of the group as its table shows it now.
#[derive(Debug, Clone)]
struct DiskView {
    disk: Disk,
    /// Logical sector size in bytes.
    sector: u64,
    /// No partition table yet: the bounds are those `sgdisk -o` would make.
    blank: bool,
    /// A table that is not GPT: the disk is not used.
    other_label: Option<String>,
    first_lba: u64,
    /// Inclusive.
    last_lba: u64,
    parts: Vec<Part>,
}

impl DiskView {
    fn align(&self) -> u64 {
        (UNIT_BYTES / self.sector).max(1)
    }

    fn bytes(&self, sectors: u64) -> u64 {
        sectors.saturating_mul(self.sector)
    }

    fn path(&self) -> String {
        self.disk.path.to_string_lossy().into_owned()
    }

    /// The aligned usable area, `None` for a disk we cannot use.
    fn area(&self) -> Option<Extent> {
        if self.other_label.is_some() {
            return None;
        }
        gpt::aligned_area(self.first_lba, self.last_lba, self.align())
    }

    fn holds_exclusive(&self) -> bool {
        self.parts
            .iter()
            .any(|p| p.owner.as_ref().is_some_and(|o| o.exclusive))
    }

    /// Aligned free extents a shared volume may use.
    fn free(&self) -> Vec<Extent> {
        if self.other_label.is_some() || self.holds_exclusive() {
            return Vec::new();
        }
        let used: Vec<Extent> = self
            .parts
            .iter()
            .map(|p| Extent {
                start: p.entry.start,
                len: p.entry.size,
            })
            .collect();
        gpt::free_extents(self.first_lba, self.last_lba, &used, self.align())
    }

    fn free_bytes(&self) -> u64 {
        self.free().iter().map(|e| self.bytes(e.len)).sum()
    }

    /// Entry numbers in use.
    fn numbers(&self) -> Vec<u32> {
        self.parts.iter().map(|p| p.entry.number).collect()
    }

    fn free_number(&self) -> Option<u32> {
        (1..=SLOTS).find(|n| self.parts.iter().all(|p| p.entry.number != *n))
    }

    /// Whether the name record lies in unused sectors of this disk's
    /// usable range.
    fn record_usable(&self) -> bool {
        if self.other_label.is_some() {
            return false;
        }
        let start = RECORD_OFFSET / self.sector;
        let end = UNIT_BYTES / self.sector;
        self.first_lba <= start
            && self.last_lba.saturating_add(1) >= end
            && self
                .parts
                .iter()
                .all(|p| p.entry.end() <= start || p.entry.start >= end)
    }

    fn owned(&self) -> impl Iterator<Item = (&Part, &Owner)> {
        self.parts
            .iter()
            .filter_map(|p| p.owner.as_ref().map(|o| (p, o)))
    }

    fn find(&self, volume: &str) -> Option<(&Part, &Owner)> {
        self.owned().find(|(_, o)| o.volume == volume)
    }
}

/// Builds a view from a table (or its absence) and the name record.
fn view_of(
    disk: &Disk,
    table: Option<gpt::Table>,
    sysfs_sector: Option<u64>,
    slots: &[Option<Slot>],
) -> Result<DiskView> {
    let bad =
        |what: &str| Error::parse("sfdisk output", format!("{}: {what}", disk.path.display()));
    let mut view = match table {
        None => {
            let sector = sysfs_sector.unwrap_or(512);
            // A disk too small for a GPT gets an empty range: nothing fits.
            let (first_lba, last_lba) =
                gpt::new_table_bounds(disk.size_bytes / sector, sector).unwrap_or((1, 0));
            DiskView {
                disk: disk.clone(),
                sector,
                blank: true,
                other_label: None,
                first_lba,
                last_lba,
                parts: Vec::new(),
            }
        }
        Some(t) => {
            let gpt = t.label == "gpt";
            let parts = t
                .partitions
                .into_iter()
                .map(|entry| Part { entry, owner: None })
                .collect();
            DiskView {
                disk: disk.clone(),
                sector: t.sector_size.or(sysfs_sector).unwrap_or(512),
                blank: false,
                other_label: (!gpt).then_some(t.label),
                first_lba: if gpt {
                    t.first_lba.ok_or_else(|| bad("GPT without firstlba"))?
                } else {
                    1
                },
                last_lba: if gpt {
                    t.last_lba.ok_or_else(|| bad("GPT without lastlba"))?
                } else {
                    0
                },
                parts,
            }
        }
    };
    if view.other_label.is_some() {
        return Ok(view);
    }
    let area = view.area();
    let only = view.parts.len() == 1;
    for part in &mut view.parts {
        let slot = slots
            .get(part.entry.number as usize - 1)
            .and_then(Option::as_ref);
        if let Some((volume, flag)) = owner_of(&part.entry, slot) {
            let spans = area
                == Some(Extent {
                    start: part.entry.start,
                    len: part.entry.size,
                });
            part.owner = Some(Owner {
                volume,
                exclusive: flag.unwrap_or(only && spans),
            });
        }
    }
    Ok(view)
}

/// Reads one disk: `sfdisk -J`, and the name record when a partition
/// carries our prefix.
async fn inspect(disk: &Disk) -> Result<DiskView> {
    let table = gpt::read_table(&disk.path).await?;
    let sector = sysfs_u64(&disk.name, "queue/logical_block_size");
    let mut disk = disk.clone();
    if let Some(sectors) = sysfs_u64(&disk.name, "size") {
        disk.size_bytes = sectors * 512;
    }
    let probe = view_of(&disk, table.clone(), sector, &[])?;
    let ours = probe
        .parts
        .iter()
        .any(|p| p.entry.name.starts_with(PARTITION_PREFIX));
    if !ours || !probe.record_usable() {
        return Ok(probe);
    }
    let slots = read_record(&disk.path).await?;
    view_of(&disk, table, sector, &slots)
}

fn sysfs_u64(disk: &str, file: &str) -> Option<u64> {
    let path = Path::new("/sys/block").join(disk).join(file);
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

async fn read_record(path: &Path) -> Result<Vec<Option<Slot>>> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(&path).map_err(|e| Error::io("open", &path, e))?;
        let mut buf = vec![0u8; RECORD_BYTES];
        file.read_exact_at(&mut buf, RECORD_OFFSET)
            .map_err(|e| Error::io("read the name record of", &path, e))?;
        Ok(buf.chunks(SLOT_BYTES).map(decode_slot).collect())
    })
    .await
    .map_err(|e| Error::task("reading a name record", e))?
}

/// Writes slot `number` (or clears it) and flushes it to the disk.
async fn write_slot(path: &Path, number: u32, slot: Option<&Slot>) -> Result<()> {
    let bytes = match slot {
        Some(s) => encode_slot(s).ok_or_else(|| {
            Error::invalid(
                "name",
                format!("{:?} is too long for a name record", s.volume),
            )
        })?,
        None => [0u8; SLOT_BYTES],
    };
    let offset = RECORD_OFFSET + u64::from(number.saturating_sub(1)) * SLOT_BYTES as u64;
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| Error::io("open", &path, e))?;
        file.write_all_at(&bytes, offset)
            .and_then(|()| file.sync_all())
            .map_err(|e| Error::io("write the name record of", &path, e))
    })
    .await
    .map_err(|e| Error::task("writing a name record", e))?
}

/// The kernel name of partition `number` of `disk`, from sysfs (never
/// guessed from naming conventions).
fn kernel_partition(disk: &str, number: u32) -> Option<String> {
    let dir = std::fs::read_dir(Path::new("/sys/block").join(disk)).ok()?;
    for entry in dir.flatten() {
        if let Ok(text) = std::fs::read_to_string(entry.path().join("partition"))
            && text.trim().parse::<u32>() == Ok(number)
        {
            return Some(entry.file_name().to_string_lossy().into_owned());
        }
    }
    None
}

/// The device node of partition `number`, if the kernel has it and the
/// node exists.
fn present_node(disk: &str, number: u32) -> Option<PathBuf> {
    let node = Path::new("/dev").join(kernel_partition(disk, number)?);
    node.exists().then_some(node)
}

/// Waits (bounded by [`NODE_WAIT`]) for the node of partition `number`.
async fn wait_node(disk: &str, number: u32) -> Option<PathBuf> {
    let deadline = Instant::now() + NODE_WAIT;
    loop {
        if let Some(node) = present_node(disk, number) {
            return Some(node);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Size in bytes the kernel gives partition `number`.
fn kernel_size(disk: &str, number: u32) -> Option<u64> {
    let part = kernel_partition(disk, number)?;
    sysfs_u64(disk, &format!("{part}/size")).map(|s| s * 512)
}

/// Tells the kernel about the table. Entry `number` (just written) must
/// reach it; the other entries in `expected` are re-added only when the
/// kernel lacks them. sgdisk's re-read request makes kernels without a GPT
/// parser drop every partition not in use, and re-adding a partition that
/// is present would only give it a new device number.
async fn sync_kernel(disk: &Disk, number: Option<u32>, expected: &[u32]) -> Result<()> {
    if let Some(n) = number {
        gpt::partx_update(&disk.path, Some(n)).run().await?;
    }
    for &n in expected {
        if Some(n) != number
            && present_node(&disk.name, n).is_none()
            && let Err(e) = gpt::partx_update(&disk.path, Some(n)).run().await
        {
            tracing::warn!(disk = %disk.path.display(), partition = n, error = %e, "partx update failed");
        }
    }
    Ok(())
}

/// Where a shared volume of `size` bytes goes: the smallest free extent
/// that holds it (earlier disks and extents win ties), provided the group
/// keeps `reserve` bytes free. `Err` carries the largest size that could
/// have been placed.
fn choose_shared(
    views: &[DiskView],
    size: u64,
    reserve: u64,
    needs_record: bool,
) -> std::result::Result<(usize, Extent), u64> {
    let free: u64 = views.iter().map(DiskView::free_bytes).sum();
    let allocatable = GroupCapacity::allocatable(free, reserve);
    let mut best: Option<(u64, usize, Extent)> = None;
    let mut largest = 0;
    for (i, v) in views.iter().enumerate() {
        if v.free_number().is_none() || (needs_record && !v.record_usable()) {
            continue;
        }
        for e in v.free() {
            let bytes = v.bytes(e.len);
            largest = largest.max(bytes);
            if bytes >= size && best.is_none_or(|(b, ..)| bytes < b) {
                best = Some((bytes, i, e));
            }
        }
    }
    match best {
        Some((_, i, e)) if size <= allocatable => Ok((
            i,
            Extent {
                start: e.start,
                len: size / views[i].sector,
            },
        )),
        _ => Err(largest.min(allocatable)),
    }
}

/// Where a whole-disk volume of at least `size` bytes goes: the smallest
/// disk without any partition whose aligned area holds it. `Err` carries
/// the largest such area.
fn choose_exclusive(
    views: &[DiskView],
    size: u64,
    needs_record: bool,
) -> std::result::Result<(usize, Extent), u64> {
    let mut best: Option<(u64, usize, Extent)> = None;
    let mut largest = 0;
    for (i, v) in views.iter().enumerate() {
        if !v.parts.is_empty() || (needs_record && !v.record_usable()) {
            continue;
        }
        let Some(area) = v.area() else { continue };
        let bytes = v.bytes(area.len);
        largest = largest.max(bytes);
        if bytes >= size && best.is_none_or(|(b, ..)| bytes < b) {
            best = Some((bytes, i, area));
        }
    }
    best.map(|(_, i, e)| (i, e)).ok_or(largest)
}

/// A RAW device group.
#[derive(Debug)]
pub struct RawGroup {
    config: GroupConfig,
    /// The disks discovery assigned at the last rescan, by name.
    disks: StdMutex<Vec<Disk>>,
}

impl RawGroup {
    pub fn new(config: GroupConfig) -> Self {
        RawGroup {
            config,
            disks: StdMutex::new(Vec::new()),
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

    /// Writes the partition for `volume` at `extent` of `view`, and undoes
    /// it if any later step fails.
    async fn make(
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
            // Discovery saw it blank; make sure nobody wrote to it since.
            let mut probe = view.disk.clone();
            disks::probe(&mut probe).await?;
            if let Some(what) = probe.fstype.or(probe.pttype) {
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
        // sgdisk saves nothing when any of its steps fails.
        gpt::sgdisk_create(&view.disk.path, view.blank, view.align(), &entry)
            .run()
            .await?;
        match self.finish_create(view, &entry, volume, exclusive).await {
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
    ) -> Result<Volume> {
        let slot = Slot {
            volume: volume.to_string(),
            exclusive,
        };
        if view.record_usable() {
            write_slot(&view.disk.path, entry.number, Some(&slot)).await?;
        }
        sync_kernel(&view.disk, Some(entry.number), &view.numbers()).await?;
        let node = wait_node(&view.disk.name, entry.number)
            .await
            .ok_or_else(|| no_node("create", volume, view, entry.number))?;
        // An old filesystem at this offset must not reach the new user.
        gpt::wipefs_all(&node).run().await?;
        let (major, minor) = devnum::of_path(&node)?;
        Ok(Volume {
            name: volume.to_string(),
            group: self.config.name.clone(),
            policy: Policy::Raw,
            size_bytes: view.bytes(entry.end - entry.start),
            device_path: Some(node),
            host_path: None,
            major,
            minor,
            exclusive,
            disk: Some(view.path()),
        })
    }

    /// After `sgdisk_replace` grew entry `entry.number`: the kernel must
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
    let undo = if view.blank {
        gpt::wipefs_all(path)
    } else {
        gpt::sgdisk_delete(path, number)
    };
    if let Err(e) = undo.run().await {
        tracing::error!(disk = %path.display(), partition = number, error = %e, "undo: removing the partition failed");
        return;
    }
    let _ = sync_kernel(&view.disk, None, &view.numbers()).await;
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

#[async_trait]
impl Backend for RawGroup {
    fn config(&self) -> &GroupConfig {
        &self.config
    }

    #[instrument(skip_all, err, fields(device.group = %self.config.name, disks = disks.len()))]
    async fn rescan(&self, disks: &[Disk]) -> Result<()> {
        let mut disks = disks.to_vec();
        disks.sort_by(|a, b| a.name.cmp(&b.name));
        *self.disks.lock().unwrap_or_else(|p| p.into_inner()) = disks.clone();
        // After a restart the kernel may not know the partitions yet.
        for disk in &disks {
            if let Some(t) = gpt::read_table(&disk.path).await?
                && t.label == "gpt"
                && !t.partitions.is_empty()
            {
                let numbers: Vec<u32> = t.partitions.iter().map(|p| p.number).collect();
                sync_kernel(disk, None, &numbers).await?;
            }
        }
        Ok(())
    }

    #[instrument(skip_all, err, fields(device.group = %self.config.name, volume.name = %req.name, volume.size = req.size_bytes, volume.exclusive = req.exclusive))]
    async fn create(&self, req: &CreateRequest) -> Result<Volume> {
        let size = self.round_size(req.size_bytes).ok_or_else(|| {
            Error::invalid(
                "size_bytes",
                format!("{} cannot be rounded", req.size_bytes),
            )
        })?;
        let views = self.views().await?;
        for view in &views {
            if let Some((part, owner)) = view.find(&req.name) {
                let existing = self.volume(view, part, owner).await?;
                let same = existing.exclusive == req.exclusive
                    && (existing.size_bytes == size
                        || (req.exclusive && existing.size_bytes >= size));
                if same {
                    return Ok(existing);
                }
                return Err(Error::AlreadyExists {
                    name: req.name.clone(),
                    group: self.config.name.clone(),
                    existing_bytes: existing.size_bytes,
                    requested_bytes: size,
                });
            }
        }
        let needs_record = !name_fits(&req.name);
        let choice = if req.exclusive {
            choose_exclusive(&views, size, needs_record)
        } else {
            choose_shared(&views, size, self.config.reserve_bytes, needs_record)
        };
        let (i, extent) = choice.map_err(|allocatable| self.exhausted(size, allocatable))?;
        self.make(&views[i], extent, &req.name, req.exclusive).await
    }

    #[instrument(skip(self, name), err, fields(device.group = %self.config.name, volume.name = %name))]
    async fn get(&self, name: &str) -> Result<Option<Volume>> {
        for view in self.views().await? {
            if let Some((part, owner)) = view.find(name) {
                return self.volume(&view, part, owner).await.map(Some);
            }
        }
        Ok(None)
    }

    #[instrument(skip(self), err, fields(device.group = %self.config.name))]
    async fn list(&self) -> Result<Vec<Volume>> {
        let mut out = Vec::new();
        for view in self.views().await? {
            for (part, owner) in view.owned() {
                out.push(self.volume(&view, part, owner).await?);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    #[instrument(skip_all, err, fields(device.group = %self.config.name, volume.name = %name, volume.size = size_bytes))]
    async fn resize(&self, name: &str, size_bytes: u64) -> Result<Volume> {
        let size = self.round_size(size_bytes).ok_or_else(|| {
            Error::invalid("size_bytes", format!("{size_bytes} cannot be rounded"))
        })?;
        let views = self.views().await?;
        let Some((view, part, owner)) = views
            .iter()
            .find_map(|v| v.find(name).map(|(p, o)| (v, p, o)))
        else {
            return Err(Error::VolumeNotFound {
                name: name.to_string(),
            });
        };
        let current = view.bytes(part.entry.size);
        let refuse = |reason: String| Error::FailedPrecondition {
            operation: "resize",
            name: name.to_string(),
            reason,
        };
        if size == current {
            return self.volume(view, part, owner).await;
        }
        if size < current {
            return Err(refuse(format!(
                "shrinking from {current} to {size} bytes is not supported"
            )));
        }
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
        gpt::sgdisk_replace(&view.disk.path, view.align(), &grown)
            .run()
            .await?;
        if let Err(e) = self.finish_grow(view, &grown, name).await {
            let old = gpt::NewPartition {
                end: part.entry.end(),
                ..grown
            };
            match gpt::sgdisk_replace(&view.disk.path, view.align(), &old)
                .run()
                .await
            {
                Ok(_) => {
                    let _ = sync_kernel(&view.disk, Some(old.number), &view.numbers()).await;
                }
                Err(undo) => {
                    tracing::error!(volume.name = %name, error = %undo, "undo: restoring the old partition end failed")
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

    #[instrument(skip(self, name), err, fields(device.group = %self.config.name, volume.name = %name))]
    async fn delete(&self, name: &str) -> Result<()> {
        let views = self.views().await?;
        let Some((view, part, owner)) = views
            .iter()
            .find_map(|v| v.find(name).map(|(p, o)| (v, p, o)))
        else {
            return Err(Error::VolumeNotFound {
                name: name.to_string(),
            });
        };
        let number = part.entry.number;
        let path = &view.disk.path;
        let node = self.volume(view, part, owner).await?.device_path;
        if let Some(node) = &node {
            match gpt::wipefs_all(node).run().await {
                Ok(_) => {}
                Err(e) if gpt::is_busy(e.stderr()) => {
                    return Err(Error::FailedPrecondition {
                        operation: "delete",
                        name: name.to_string(),
                        reason: format!("{} is in use (mounted or open)", node.display()),
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
        gpt::sgdisk_delete(path, number).run().await?;
        // The kernel may have dropped it already when sgdisk asked for a re-read.
        if let Err(e) = gpt::partx_delete(path, number).run().await {
            tracing::warn!(disk = %path.display(), partition = number, error = %e, "partx delete failed");
        }
        if view.record_usable()
            && let Err(e) = write_slot(path, number, None).await
        {
            tracing::warn!(disk = %path.display(), error = %e, "clearing the name slot failed");
        }
        if view.parts.len() == 1 {
            // The disk is empty now: drop its table so it is blank again.
            if let Err(e) = gpt::wipefs_all(path).run().await {
                tracing::warn!(disk = %path.display(), error = %e, "removing the empty partition table failed");
            }
        } else {
            let others: Vec<u32> = view
                .numbers()
                .into_iter()
                .filter(|n| *n != number)
                .collect();
            sync_kernel(&view.disk, None, &others).await?;
        }
        Ok(())
    }

    #[instrument(skip(self), err, fields(device.group = %self.config.name))]
    async fn capacity(&self) -> Result<GroupCapacity> {
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

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn disk(name: &str, size_bytes: u64) -> Disk {
        Disk {
            name: name.into(),
            path: PathBuf::from(format!("/dev/{name}")),
            size_bytes,
            read_only: false,
            rotational: false,
            kind: "loop".into(),
            major: 7,
            minor: 0,
            fstype: None,
            pttype: None,
            mountpoints: vec![],
            children_in_use: vec![],
            partitions: vec![],
            backing_file: None,
            lvm_vg: None,
        }
    }

    fn entry(number: u32, start: u64, size: u64, name: &str, uuid: &str) -> gpt::Partition {
        gpt::Partition {
            number,
            start,
            size,
            type_id: gpt::LINUX_DATA_TYPE.into(),
            uuid: uuid.into(),
            name: name.into(),
        }
    }

    fn ours(number: u32, start: u64, size: u64, volume: &str) -> gpt::Partition {
        entry(
            number,
            start,
            size,
            &partition_name(volume),
            &volume_guid(volume),
        )
    }

    /// A 64 MiB disk (512-byte sectors) with a GPT holding `parts`.
    fn gpt_view(name: &str, parts: Vec<gpt::Partition>, slots: &[Option<Slot>]) -> DiskView {
        let table = gpt::Table {
            label: "gpt".into(),
            sector_size: Some(512),
            first_lba: Some(34),
            last_lba: Some(131038),
            partitions: parts,
        };
        view_of(&disk(name, 64 * MIB), Some(table), Some(512), slots).expect("view")
    }

    fn blank_view(name: &str, size: u64) -> DiskView {
        view_of(&disk(name, size), None, Some(512), &[]).expect("view")
    }

    #[test]
    fn partition_names_keep_what_fits() {
        assert_eq!(partition_name("pvc-1"), "carina.io/pvc-1");
        assert!(name_fits("pvc-1"));
        let exact = "a".repeat(26);
        assert_eq!(partition_name(&exact).encode_utf16().count(), 36);
        assert!(name_fits(&exact));
        let long = "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        assert_eq!(partition_name(long), "carina.io/pvc-0a1b2c3d-4e5f-6789-abc");
        assert!(!name_fits(long));
        // UTF-16 units, not bytes, are counted.
        assert_eq!(
            partition_name(&"é".repeat(30)).encode_utf16().count(),
            gpt::NAME_UNITS
        );
    }

    #[test]
    fn guids_are_deterministic_version_8_uuids() {
        let g = volume_guid("pvc-1");
        assert_eq!(g, volume_guid("pvc-1"));
        assert_ne!(g, volume_guid("pvc-2"));
        assert_eq!(g.len(), 36);
        let groups: Vec<usize> = g.split('-').map(str::len).collect();
        assert_eq!(groups, vec![8, 4, 4, 4, 12]);
        assert!(
            g.chars()
                .all(|c| c == '-' || c.is_ascii_digit() || c.is_ascii_uppercase())
        );
        assert_eq!(&g[14..15], "8", "version nibble: {g}");
        assert!("89AB".contains(&g[19..20]), "variant: {g}");
        // Two names that truncate alike still get different GUIDs.
        let a = format!("{}-a", "x".repeat(40));
        let b = format!("{}-b", "x".repeat(40));
        assert_eq!(partition_name(&a), partition_name(&b));
        assert_ne!(volume_guid(&a), volume_guid(&b));
    }

    #[test]
    fn slots_round_trip_and_reject_garbage() {
        let slot = Slot {
            volume: "v".repeat(names::MAX_VOLUME_NAME),
            exclusive: true,
        };
        let bytes = encode_slot(&slot).expect("fits");
        assert_eq!(decode_slot(&bytes), Some(slot));
        let short = Slot {
            volume: "pvc-1".into(),
            exclusive: false,
        };
        assert_eq!(
            decode_slot(&encode_slot(&short).expect("fits")),
            Some(short)
        );
        assert_eq!(decode_slot(&[0u8; SLOT_BYTES]), None);
        let mut bad = encode_slot(&Slot {
            volume: "ok".into(),
            exclusive: false,
        })
        .expect("fits");
        bad[SLOT_HEADER] = b'/';
        assert_eq!(decode_slot(&bad), None, "invalid volume name");
        bad[9] = 200;
        assert_eq!(decode_slot(&bad), None, "length past the slot");
        assert!(
            encode_slot(&Slot {
                volume: "x".repeat(SLOT_BYTES),
                exclusive: false
            })
            .is_none()
        );
        // The record fits below the first aligned MiB.
        assert_eq!(RECORD_OFFSET + RECORD_BYTES as u64, UNIT_BYTES);
    }

    #[test]
    fn ownership_needs_prefix_and_matching_guid() {
        let long = "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        let slot = Slot {
            volume: long.into(),
            exclusive: false,
        };
        // short name: verified from the entry alone
        assert_eq!(
            owner_of(&ours(1, 2048, 2048, "pvc-1"), None),
            Some(("pvc-1".into(), None))
        );
        // long name: only with a slot that verifies
        assert_eq!(owner_of(&ours(1, 2048, 2048, long), None), None);
        assert_eq!(
            owner_of(&ours(1, 2048, 2048, long), Some(&slot)),
            Some((long.into(), Some(false)))
        );
        // a slot naming another volume does not verify
        let other = Slot {
            volume: "pvc-2".into(),
            exclusive: true,
        };
        assert_eq!(
            owner_of(&ours(1, 2048, 2048, "pvc-1"), Some(&other)),
            Some(("pvc-1".into(), None))
        );
        // our prefix with a foreign GUID, and no prefix at all
        let fake = entry(
            1,
            2048,
            2048,
            "carina.io/pvc-1",
            "9D6517F8-604B-4301-9D9D-FD2F348DA90A",
        );
        assert_eq!(owner_of(&fake, None), None);
        let foreign = entry(1, 2048, 2048, "pvc-1", &volume_guid("pvc-1"));
        assert_eq!(owner_of(&foreign, None), None);
        // GUID case does not matter
        let mut lower = ours(1, 2048, 2048, "pvc-1");
        lower.uuid = lower.uuid.to_ascii_lowercase();
        assert!(owner_of(&lower, None).is_some());
    }

    #[test]
    fn real_table_has_no_partitions_of_ours() {
        // testdata GUIDs were made up when captured: prefix alone is not enough.
        let t = gpt::parse_sfdisk(include_str!("testdata/sfdisk.json")).expect("parses");
        let v = view_of(&disk("loop2", 64 * MIB), Some(t), None, &[]).expect("view");
        assert_eq!(v.owned().count(), 0);
        assert_eq!(v.sector, 512);
        assert_eq!(v.free_bytes(), MIB + (129024 - 43008) * 512);
    }

    #[test]
    fn views_of_blank_dos_and_exclusive_disks() {
        let blank = blank_view("loop1", 64 * MIB);
        assert!(blank.blank);
        assert_eq!(blank.area().map(|a| blank.bytes(a.len)), Some(62 * MIB));
        assert_eq!(blank.free_bytes(), 62 * MIB);
        assert!(blank.record_usable());
        assert_eq!(blank.free_number(), Some(1));

        let tiny = blank_view("loop1", 8192);
        assert_eq!(tiny.area(), None);
        assert_eq!(tiny.free_bytes(), 0);

        let dos = gpt::parse_sfdisk(include_str!("testdata/sfdisk-dos.json")).expect("parses");
        let dos = view_of(&disk("loop2", 64 * MIB), Some(dos), None, &[]).expect("view");
        assert_eq!(dos.other_label.as_deref(), Some("dos"));
        assert_eq!((dos.area(), dos.free_bytes()), (None, 0));

        // one partition of ours spanning the area: inferred whole-disk
        let whole = gpt_view("loop3", vec![ours(1, 2048, 126976, "w")], &[]);
        assert!(whole.holds_exclusive());
        assert!(whole.free().is_empty());
        // the record overrides the inference
        let slots = vec![Some(Slot {
            volume: "w".into(),
            exclusive: false,
        })];
        let shared = gpt_view("loop3", vec![ours(1, 2048, 126976, "w")], &slots);
        assert!(!shared.holds_exclusive());
        // not spanning, or not alone: shared
        let part = gpt_view("loop3", vec![ours(1, 2048, 2048, "w")], &[]);
        assert!(!part.holds_exclusive());
        let foreign = entry(2, 40, 100, "bios", "9D6517F8-604B-4301-9D9D-FD2F348DA90A");
        let two = gpt_view("loop3", vec![ours(1, 2048, 126976, "w"), foreign], &[]);
        assert!(!two.holds_exclusive());
    }

    #[test]
    fn record_is_unusable_under_a_partition() {
        let clear = gpt_view("loop4", vec![ours(1, 2048, 2048, "a")], &[]);
        assert!(clear.record_usable());
        let covered = gpt_view(
            "loop4",
            vec![entry(
                1,
                34,
                2000,
                "bios",
                "9D6517F8-604B-4301-9D9D-FD2F348DA90A",
            )],
            &[],
        );
        assert!(!covered.record_usable());
        let below = gpt_view(
            "loop4",
            vec![entry(
                1,
                34,
                100,
                "bios",
                "9D6517F8-604B-4301-9D9D-FD2F348DA90A",
            )],
            &[],
        );
        assert!(below.record_usable());
    }

    #[test]
    fn shared_placement_is_best_fit_and_keeps_the_reserve() {
        // loop1: 62 MiB free; loop2: gaps of 1 MiB and 42 MiB (see testdata shape)
        let views = vec![
            blank_view("loop1", 64 * MIB),
            gpt_view(
                "loop2",
                vec![
                    ours(1, 2048, 16384, "a"),
                    ours(2, 18432, 2048, "b"),
                    ours(3, 22528, 20480, "c"),
                ],
                &[],
            ),
        ];
        let free: u64 = views.iter().map(DiskView::free_bytes).sum();
        assert_eq!(free, 62 * MIB + MIB + 42 * MIB);
        // 1 MiB goes into the 1 MiB gap of loop2
        assert_eq!(
            choose_shared(&views, MIB, 0, false),
            Ok((
                1,
                Extent {
                    start: 20480,
                    len: 2048
                }
            ))
        );
        // 40 MiB goes into the 42 MiB gap, not the blank disk
        assert_eq!(
            choose_shared(&views, 40 * MIB, 0, false),
            Ok((
                1,
                Extent {
                    start: 43008,
                    len: 40 * 2048
                }
            ))
        );
        // 50 MiB only fits on the blank disk
        assert_eq!(
            choose_shared(&views, 50 * MIB, 0, false),
            Ok((
                0,
                Extent {
                    start: 2048,
                    len: 50 * 2048
                }
            ))
        );
        // larger than any extent: exhausted, reports the largest extent
        assert_eq!(choose_shared(&views, 63 * MIB, 0, false), Err(62 * MIB));
        // fits an extent but not free - reserve
        let reserve = free - 10 * MIB;
        assert_eq!(
            choose_shared(&views, 11 * MIB, reserve, false),
            Err(10 * MIB)
        );
        assert!(choose_shared(&views, 10 * MIB, reserve, false).is_ok());
        // a reserve above free never underflows
        assert_eq!(choose_shared(&views, MIB, u64::MAX, false), Err(0));
    }

    #[test]
    fn shared_placement_avoids_whole_disk_volumes_and_full_tables() {
        let whole = gpt_view("loop1", vec![ours(1, 2048, 126976, "w")], &[]);
        assert_eq!(whole.free_bytes(), 0);
        let full: Vec<gpt::Partition> = (1..=SLOTS)
            .map(|n| {
                entry(
                    n,
                    10_000 + u64::from(n),
                    1,
                    "x",
                    "9D6517F8-604B-4301-9D9D-FD2F348DA90A",
                )
            })
            .collect();
        let full = gpt_view("loop2", full, &[]);
        assert_eq!(full.free_number(), None);
        let views = vec![whole, full];
        assert!(choose_shared(&views, MIB, 0, false).is_err());
    }

    #[test]
    fn long_names_need_a_usable_record() {
        let covered = gpt_view(
            "loop4",
            vec![entry(
                1,
                34,
                2000,
                "bios",
                "9D6517F8-604B-4301-9D9D-FD2F348DA90A",
            )],
            &[],
        );
        let views = vec![covered];
        assert!(choose_shared(&views, MIB, 0, false).is_ok());
        assert!(choose_shared(&views, MIB, 0, true).is_err());
    }

    #[test]
    fn exclusive_placement_takes_the_smallest_empty_disk() {
        let views = vec![
            blank_view("loop1", 128 * MIB),
            gpt_view("loop2", vec![ours(1, 2048, 2048, "a")], &[]),
            blank_view("loop3", 64 * MIB),
        ];
        assert_eq!(
            choose_exclusive(&views, MIB, false),
            Ok((
                2,
                Extent {
                    start: 2048,
                    len: 62 * 2048
                }
            ))
        );
        assert_eq!(
            choose_exclusive(&views, 100 * MIB, false).map(|c| c.0),
            Ok(0)
        );
        assert_eq!(choose_exclusive(&views, 127 * MIB, false), Err(126 * MIB));
    }
}
