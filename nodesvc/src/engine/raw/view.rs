//! The picture of one disk of the group: its table (or the one its first
//! volume would give it), which entries are ours, its free aligned extents and
//! whether its name record is usable. [`view_of`] is pure; [`inspect`]
//! reads the disk and builds one.

use std::path::Path;

use super::UNIT_BYTES;
use super::codec::owner_of;
use super::kernel::sysfs_u64;
use super::record::{RECORD_OFFSET, SLOTS, Slot, read_record, read_slots};
use crate::engine::disks::{self, Disk, PARTITION_PREFIX};
use crate::engine::error::{Error, Result};
use crate::engine::gpt::{self, Extent};

/// A volume found in a partition entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Owner {
    pub(super) volume: String,
    pub(super) exclusive: bool,
}

#[derive(Debug, Clone)]
pub(super) struct Part {
    pub(super) entry: gpt::Partition,
    pub(super) owner: Option<Owner>,
}

/// One disk of the group as its table shows it now.
#[derive(Debug, Clone)]
pub(super) struct DiskView {
    pub(super) disk: Disk,
    /// Logical sector size in bytes.
    pub(super) sector: u64,
    /// No partition table yet: the bounds are those of the GPT a create
    /// writes ([`gpt::new_table_bounds`]).
    pub(super) blank: bool,
    /// A table that is not GPT: the disk is not used.
    pub(super) other_label: Option<String>,
    pub(super) first_lba: u64,
    /// Inclusive.
    pub(super) last_lba: u64,
    pub(super) parts: Vec<Part>,
}

impl DiskView {
    pub(super) fn align(&self) -> u64 {
        (UNIT_BYTES / self.sector).max(1)
    }

    pub(super) fn bytes(&self, sectors: u64) -> u64 {
        sectors.saturating_mul(self.sector)
    }

    pub(super) fn path(&self) -> String {
        self.disk.path.to_string_lossy().into_owned()
    }

    /// The aligned usable area, `None` for a disk we cannot use.
    pub(super) fn area(&self) -> Option<Extent> {
        if self.other_label.is_some() {
            return None;
        }
        gpt::aligned_area(self.first_lba, self.last_lba, self.align())
    }

    pub(super) fn holds_exclusive(&self) -> bool {
        self.parts
            .iter()
            .any(|p| p.owner.as_ref().is_some_and(|o| o.exclusive))
    }

    /// Aligned free extents a shared volume may use.
    pub(super) fn free(&self) -> Vec<Extent> {
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

    pub(super) fn free_bytes(&self) -> u64 {
        self.free().iter().map(|e| self.bytes(e.len)).sum()
    }

    /// Entry numbers in use.
    pub(super) fn numbers(&self) -> Vec<u32> {
        self.parts.iter().map(|p| p.entry.number).collect()
    }

    pub(super) fn free_number(&self) -> Option<u32> {
        (1..=SLOTS).find(|n| self.parts.iter().all(|p| p.entry.number != *n))
    }

    /// Whether the name record lies in unused sectors of this disk's
    /// usable range.
    pub(super) fn record_usable(&self) -> bool {
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

    pub(super) fn owned(&self) -> impl Iterator<Item = (&Part, &Owner)> {
        self.parts
            .iter()
            .filter_map(|p| p.owner.as_ref().map(|o| (p, o)))
    }

    pub(super) fn find(&self, volume: &str) -> Option<(&Part, &Owner)> {
        self.owned().find(|(_, o)| o.volume == volume)
    }
}

/// Builds a view from a table (or its absence) and the name record.
pub(super) fn view_of(
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

/// Reads one disk: an intact GPT in-process (and, in the same open, the
/// name record when an entry carries our prefix); otherwise `blkid -p`
/// says whether anything is on it and, if it shows a partition table,
/// `sfdisk -J` reads that. A blank view's disk carries what blkid found (a
/// filesystem, a label sfdisk does not read), so a create can refuse it.
pub(super) async fn inspect(disk: &Disk) -> Result<DiskView> {
    let sector = sysfs_u64(&disk.name, "queue/logical_block_size");
    let mut disk = disk.clone();
    if let Some(sectors) = sysfs_u64(&disk.name, "size") {
        disk.size_bytes = sectors * 512;
    }
    let direct = match sector {
        Some(sector) => {
            let path = disk.path.clone();
            tokio::task::spawn_blocking(move || read_direct(&path, sector))
                .await
                .map_err(|e| Error::task("reading a partition table", e))?
                .map_err(|e| Error::io("read the partition table of", &disk.path, e))?
        }
        None => None,
    };
    let (table, slots) = match direct {
        Some(Direct { table, slots }) => (Some(table), slots),
        None => {
            disks::probe(&mut disk).await?;
            let table = match disk.pttype {
                Some(_) => gpt::read_table(&disk.path).await?,
                None => None,
            };
            (table, None)
        }
    };
    let view = view_of(&disk, table.clone(), sector, &[])?;
    let ours = view
        .parts
        .iter()
        .any(|p| p.entry.name.starts_with(PARTITION_PREFIX));
    if !ours || !view.record_usable() {
        return Ok(view);
    }
    let slots = match slots {
        Some(slots) => slots,
        None => read_record(&disk.path).await?,
    };
    view_of(&disk, table, sector, &slots)
}

/// What one open of a disk with an intact GPT gives: the table and, if
/// one of its entries carries our prefix, the name record.
struct Direct {
    table: gpt::Table,
    slots: Option<Vec<Option<Slot>>>,
}

/// [`Direct`] for the disk at `path`, `None` without an intact GPT.
/// Blocking.
fn read_direct(path: &Path, sector: u64) -> std::io::Result<Option<Direct>> {
    let file = std::fs::File::open(path)?;
    let Some(table) = gpt::ondisk::read_from(&file, sector)? else {
        return Ok(None);
    };
    let ours = table
        .partitions
        .iter()
        .any(|p| p.name.starts_with(PARTITION_PREFIX));
    let slots = if ours { Some(read_slots(&file)?) } else { None };
    Ok(Some(Direct { table, slots }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::raw::fixtures::{MIB, blank_view, disk, entry, gpt_view, ours};

    #[test]
    fn real_table_has_no_partitions_of_ours() {
        // testdata GUIDs were made up when captured: prefix alone is not enough.
        let t = gpt::parse_sfdisk(include_str!("../testdata/sfdisk.json")).expect("parses");
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

        let dos = gpt::parse_sfdisk(include_str!("../testdata/sfdisk-dos.json")).expect("parses");
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
}
