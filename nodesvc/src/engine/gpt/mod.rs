//! GPT partition tables: reading them (an intact primary GPT straight from
//! the disk, [`ondisk`]; any table through `sfdisk -J`), the command
//! lines that change them (`sfdisk` scripts write, `partx` tells the
//! kernel) and the pure arithmetic of their layout (aligned free extents,
//! the usable area of a disk that has no table yet).
//!
//! Positions and lengths are in logical sectors of the disk unless a name
//! says bytes; ranges are half-open (`start..end`).

use std::path::Path;

use carina_sys::command::{Cmd, CommandError};
use serde::Deserialize;

use super::error::{Error, Result};

pub mod ondisk;

/// Type GUID of every partition we create: "Linux filesystem data"
/// (sgdisk type code 8300).
pub const LINUX_DATA_TYPE: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";

/// Partition starts and sizes are multiples of this many bytes.
pub const ALIGN_BYTES: u64 = 1 << 20;

/// Longest partition name GPT can hold, in UTF-16 code units.
pub const NAME_UNITS: usize = 36;

/// Entries in the GPTs we write (the GPT default, also what `sgdisk -o`
/// makes).
pub const TABLE_ENTRIES: u64 = 128;

/// Bytes of one partition entry.
const ENTRY_BYTES: u64 = 128;

/// A partition table as `sfdisk -J` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// `gpt`, `dos`, ...
    pub label: String,
    /// Logical sector size, when this sfdisk reports it.
    pub sector_size: Option<u64>,
    /// First and last usable sector (GPT only; `last_lba` is inclusive).
    pub first_lba: Option<u64>,
    pub last_lba: Option<u64>,
    /// Used entries, in table order.
    pub partitions: Vec<Partition>,
}

/// One used partition entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// Entry number, from 1.
    pub number: u32,
    pub start: u64,
    /// Length in sectors.
    pub size: u64,
    /// Partition type: a GUID (GPT) or a hex code (dos), as printed.
    pub type_id: String,
    /// Unique partition GUID in upper case (GPT only, else empty).
    pub uuid: String,
    /// Partition name (GPT only, else empty).
    pub name: String,
}

impl Partition {
    /// First sector after the partition.
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.size)
    }
}

#[derive(Debug, Deserialize)]
struct SfdiskReport {
    partitiontable: SfdiskTable,
}

#[derive(Debug, Deserialize)]
struct SfdiskTable {
    label: String,
    firstlba: Option<u64>,
    lastlba: Option<u64>,
    sectorsize: Option<u64>,
    #[serde(default)]
    partitions: Vec<SfdiskPartition>,
}

#[derive(Debug, Deserialize)]
struct SfdiskPartition {
    node: String,
    start: u64,
    size: u64,
    #[serde(rename = "type", default)]
    type_id: String,
    #[serde(default)]
    uuid: String,
    #[serde(default)]
    name: String,
}

/// Parses `sfdisk -J <disk>`. The entry number is the trailing number of
/// each `node` (sfdisk names nodes `<disk>[p]<number>`).
pub fn parse_sfdisk(json: &str) -> Result<Table> {
    let report: SfdiskReport =
        serde_json::from_str(json).map_err(|e| Error::parse("sfdisk output", e))?;
    let t = report.partitiontable;
    let mut partitions = Vec::with_capacity(t.partitions.len());
    for p in t.partitions {
        let digits = p.node.len() - p.node.bytes().rev().take_while(u8::is_ascii_digit).count();
        let number: u32 = p.node[digits..].parse().map_err(|_| {
            Error::parse(
                "sfdisk output",
                format!("partition node {:?} does not end in its number", p.node),
            )
        })?;
        partitions.push(Partition {
            number,
            start: p.start,
            size: p.size,
            type_id: p.type_id,
            uuid: p.uuid.to_ascii_uppercase(),
            name: p.name,
        });
    }
    Ok(Table {
        label: t.label,
        sector_size: t.sectorsize,
        first_lba: t.firstlba,
        last_lba: t.lastlba,
        partitions,
    })
}

/// A run of sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Extent {
    pub start: u64,
    pub len: u64,
}

impl Extent {
    /// First sector after the extent.
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// The aligned part of the usable sectors `first_lba..=last_lba`: starts
/// and ends on multiples of `align` sectors. `None` if nothing is left.
pub fn aligned_area(first_lba: u64, last_lba: u64, align: u64) -> Option<Extent> {
    aligned(first_lba, last_lba.checked_add(1)?, align)
}

/// The aligned free extents of `first_lba..=last_lba` once the sectors of
/// `used` (any partitions, ours or not) are taken out, in disk order.
/// Overlapping or out-of-range `used` entries are handled; nothing that is
/// used is ever part of an extent.
pub fn free_extents(first_lba: u64, last_lba: u64, used: &[Extent], align: u64) -> Vec<Extent> {
    let Some(limit) = last_lba.checked_add(1) else {
        return Vec::new();
    };
    let mut used: Vec<Extent> = used.to_vec();
    used.sort();
    let mut out = Vec::new();
    let mut cursor = first_lba;
    for u in used {
        if u.start > cursor {
            out.extend(aligned(cursor, u.start.min(limit), align));
        }
        cursor = cursor.max(u.end());
        if cursor >= limit {
            return out;
        }
    }
    out.extend(aligned(cursor, limit, align));
    out
}

/// `start..end` shrunk to multiples of `align`.
fn aligned(start: u64, end: u64, align: u64) -> Option<Extent> {
    let align = align.max(1);
    let s = start.div_ceil(align).checked_mul(align)?;
    let e = end / align * align;
    (e > s).then(|| Extent {
        start: s,
        len: e - s,
    })
}

/// The usable sectors (`first_lba`, `last_lba` inclusive) of a new GPT of
/// [`TABLE_ENTRIES`] entries (what `sgdisk -o` gives, and what we give
/// `sfdisk`) a disk of `total_sectors`: a protective MBR, a header and the
/// entry array at each end. `None` if the disk is too small.
pub fn new_table_bounds(total_sectors: u64, sector_size: u64) -> Option<(u64, u64)> {
    let array = (TABLE_ENTRIES * ENTRY_BYTES).div_ceil(sector_size.max(1));
    let first = 2 + array;
    let last = total_sectors.checked_sub(2 + array)?;
    (last >= first).then_some((first, last))
}

/// Reads a disk's partition table with `sfdisk -J`; `None` when it has
/// none.
pub async fn read_table(disk: &Path) -> Result<Option<Table>> {
    match sfdisk_json(disk).run().await {
        Ok(out) => parse_sfdisk(&out.stdout).map(Some),
        Err(e @ CommandError::Failed { .. }) if is_no_table(e.stderr()) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// True if sfdisk's stderr says the disk carries no partition table.
pub fn is_no_table(stderr: &str) -> bool {
    stderr.contains("does not contain a recognized partition table")
}

/// `sfdisk -J <disk>`: the table as JSON.
pub fn sfdisk_json(disk: &Path) -> Cmd {
    Cmd::new("sfdisk").arg("-J").arg(disk)
}

/// A partition entry to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPartition {
    pub number: u32,
    pub start: u64,
    /// First sector after the partition.
    pub end: u64,
    /// Partition name; a volume name's characters and `/` only (it is
    /// written between double quotes).
    pub name: String,
    pub guid: String,
    pub type_guid: String,
}

impl NewPartition {
    /// The partition's fields as one sfdisk script line.
    fn fields(&self) -> String {
        debug_assert!(
            !self.name.contains(['"', '\n', '\\']),
            "partition names are built from checked volume names"
        );
        format!(
            "start={}, size={}, type={}, uuid={}, name=\"{}\"",
            self.start,
            self.end.saturating_sub(self.start),
            self.type_guid,
            self.guid,
            self.name
        )
    }
}

/// The head of every `sfdisk` command that writes: quiet, and neither
/// re-reading the table nor telling the kernel (`partx` does that, for the
/// one entry that changed: a re-read makes kernels without a GPT parser
/// drop every partition not in use), nor wiping anything we did not ask
/// for. It writes nothing when any step of its script fails, and unlike
/// `sgdisk` it does not `sync` the whole machine and sleep a second after
/// each write.
pub fn sfdisk_write() -> Cmd {
    Cmd::new("sfdisk").args([
        "--quiet",
        "--no-reread",
        "--no-tell-kernel",
        "--wipe",
        "never",
        "--wipe-partitions",
        "never",
    ])
}

/// The usable sectors of a new GPT (`first_lba`, `last_lba` inclusive), as
/// [`new_table_bounds`] gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewTable {
    pub first_lba: u64,
    pub last_lba: u64,
}

/// `sfdisk --append <disk>` with the entry on stdin: adds entry
/// `part.number`, or, with `new_table`, writes a new GPT of
/// [`TABLE_ENTRIES`] entries holding only it. The script names the entry
/// as `<disk>p<N>`, from which sfdisk takes its number.
pub fn sfdisk_add(disk: &Path, new_table: Option<NewTable>, part: &NewPartition) -> Cmd {
    let mut script = String::new();
    let mut cmd = sfdisk_write();
    match new_table {
        Some(t) => script.push_str(&format!(
            "label: gpt\nfirst-lba: {}\nlast-lba: {}\ntable-length: {TABLE_ENTRIES}\n",
            t.first_lba, t.last_lba
        )),
        None => cmd = cmd.arg("--append"),
    }
    script.push_str(&format!(
        "{}p{} : {}\n",
        disk.display(),
        part.number,
        part.fields()
    ));
    cmd.arg(disk).stdin(script)
}

/// `sfdisk -N N <disk>` with the entry on stdin: rewrites entry N in one
/// table write (used to move its end; the data is not touched).
pub fn sfdisk_replace(disk: &Path, part: &NewPartition) -> Cmd {
    sfdisk_write()
        .args(["-N".to_string(), part.number.to_string()])
        .arg(disk)
        .stdin(format!("{}\n", part.fields()))
}

/// `sfdisk --delete <disk> N`: removes entry N.
pub fn sfdisk_delete(disk: &Path, number: u32) -> Cmd {
    sfdisk_write()
        .arg("--delete")
        .arg(disk)
        .arg(number.to_string())
}

/// `partx -u [--nr N] <disk>`: makes the kernel's partitions match the
/// table (adds, resizes, removes), for entry N or all of them. Fails on a
/// table without entries.
pub fn partx_update(disk: &Path, number: Option<u32>) -> Cmd {
    let mut cmd = Cmd::new("partx").arg("-u");
    if let Some(n) = number {
        cmd = cmd.args(["--nr".to_string(), n.to_string()]);
    }
    cmd.arg(disk)
}

/// `partx -d --nr N <disk>`: the kernel forgets partition N.
pub fn partx_delete(disk: &Path, number: u32) -> Cmd {
    Cmd::new("partx")
        .args(["-d".to_string(), "--nr".to_string(), number.to_string()])
        .arg(disk)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPT: &str = include_str!("../testdata/sfdisk.json");
    const GPT_EMPTY: &str = include_str!("../testdata/sfdisk-empty.json");
    const GPT_4K: &str = include_str!("../testdata/sfdisk-4k.json");
    const DOS: &str = include_str!("../testdata/sfdisk-dos.json");

    fn ext(start: u64, len: u64) -> Extent {
        Extent { start, len }
    }

    #[test]
    fn parses_real_gpt() {
        let t = parse_sfdisk(GPT).expect("parses");
        assert_eq!(t.label, "gpt");
        assert_eq!(
            (t.first_lba, t.last_lba, t.sector_size),
            (Some(34), Some(131038), Some(512))
        );
        let nums: Vec<u32> = t.partitions.iter().map(|p| p.number).collect();
        assert_eq!(nums, vec![1, 2, 3]);
        let p = &t.partitions[0];
        assert_eq!((p.start, p.size, p.end()), (2048, 16384, 18432));
        assert_eq!(p.name, "carina.io/pvc-0a1b2c3d-4e5f-6789-abc");
        assert_eq!(p.uuid, "5B1D7A1E-36C2-8F4A-9B0E-2C6D1F3A4B5C");
        assert_eq!(p.type_id, LINUX_DATA_TYPE);
        assert_eq!(t.partitions[1].name, "scratch");
    }

    #[test]
    fn parses_empty_4k_and_dos_tables() {
        let t = parse_sfdisk(GPT_EMPTY).expect("parses");
        assert!(t.partitions.is_empty());
        assert_eq!(t.last_lba, Some(131038));

        let t = parse_sfdisk(GPT_4K).expect("parses");
        assert_eq!(t.sector_size, Some(4096));
        assert_eq!((t.first_lba, t.last_lba), (Some(6), Some(16378)));
        assert_eq!(t.partitions[0].number, 1);

        let t = parse_sfdisk(DOS).expect("parses");
        assert_eq!(t.label, "dos");
        assert_eq!(t.first_lba, None);
        assert_eq!(t.partitions[0].type_id, "83");
        assert_eq!(t.partitions[0].uuid, "");
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse_sfdisk("{}").is_err());
        assert!(parse_sfdisk("not json").is_err());
        let bad = r#"{"partitiontable":{"label":"gpt","partitions":[{"node":"/dev/x","start":1,"size":1}]}}"#;
        assert!(parse_sfdisk(bad).is_err());
        assert!(is_no_table(
            "sfdisk: /dev/loop2: does not contain a recognized partition table"
        ));
    }

    #[test]
    fn new_table_bounds_match_sgdisk() {
        // Both measured on loop devices of 64 MiB (see testdata).
        assert_eq!(new_table_bounds(131072, 512), Some((34, 131038)));
        assert_eq!(new_table_bounds(16384, 4096), Some((6, 16378)));
        assert_eq!(new_table_bounds(40, 512), None);
    }

    #[test]
    fn aligned_area_of_a_disk() {
        // 64 MiB disk: 1 MiB .. 63 MiB usable when aligned to 1 MiB.
        assert_eq!(aligned_area(34, 131038, 2048), Some(ext(2048, 126976)));
        assert_eq!(aligned_area(6, 16378, 256), Some(ext(256, 15872)));
        assert_eq!(aligned_area(34, 2000, 2048), None);
        assert_eq!(aligned_area(0, u64::MAX, 2048).map(|e| e.start), None);
    }

    #[test]
    fn free_extents_skip_every_partition() {
        let align = 2048;
        // nothing used
        assert_eq!(
            free_extents(34, 131038, &[], align),
            vec![ext(2048, 126976)]
        );
        // the testdata table: 2048+16384, 18432+2048, 22528+20480
        let t = parse_sfdisk(GPT).expect("parses");
        let used: Vec<Extent> = t.partitions.iter().map(|p| ext(p.start, p.size)).collect();
        assert_eq!(
            free_extents(34, 131038, &used, align),
            vec![ext(20480, 2048), ext(43008, 129024 - 43008)]
        );
        // an unaligned foreign partition eats into both neighbours' units
        let used = [ext(5000, 10)];
        assert_eq!(
            free_extents(34, 131038, &used, align),
            vec![ext(2048, 2048), ext(6144, 129024 - 6144)]
        );
        // gaps smaller than a unit vanish; overlapping and unsorted entries
        let used = [ext(4096, 4000), ext(2048, 2048), ext(3000, 9000)];
        assert_eq!(
            free_extents(34, 131038, &used, align),
            vec![ext(12288, 129024 - 12288)]
        );
        // a partition beyond the end clamps; a full disk has nothing free
        let used = [ext(2048, 200_000)];
        assert!(free_extents(34, 131038, &used, align).is_empty());
        let used = [ext(0, 1 << 40)];
        assert!(free_extents(34, 131038, &used, align).is_empty());
    }

    #[test]
    fn command_lines() {
        let disk = Path::new("/dev/loop7");
        let part = NewPartition {
            number: 2,
            start: 2048,
            end: 4096,
            name: "carina.io/v".into(),
            guid: "12345678-1234-8234-9234-123456789ABC".into(),
            type_guid: LINUX_DATA_TYPE.into(),
        };
        let new = NewTable {
            first_lba: 34,
            last_lba: 131038,
        };
        let quiet =
            "sfdisk --quiet --no-reread --no-tell-kernel --wipe never --wipe-partitions never";
        let fields = "start=2048, size=2048, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, uuid=12345678-1234-8234-9234-123456789ABC, name=\"carina.io/v\"";
        let script = |c: &Cmd| String::from_utf8_lossy(c.input().expect("a script")).into_owned();
        let add = sfdisk_add(disk, Some(new), &part);
        assert_eq!(add.line(), format!("{quiet} /dev/loop7"));
        assert_eq!(
            script(&add),
            format!(
                "label: gpt\nfirst-lba: 34\nlast-lba: 131038\ntable-length: 128\n/dev/loop7p2 : {fields}\n"
            )
        );
        let append = sfdisk_add(disk, None, &part);
        assert_eq!(append.line(), format!("{quiet} --append /dev/loop7"));
        assert_eq!(script(&append), format!("/dev/loop7p2 : {fields}\n"));
        let replace = sfdisk_replace(disk, &part);
        assert_eq!(replace.line(), format!("{quiet} -N 2 /dev/loop7"));
        assert_eq!(script(&replace), format!("{fields}\n"));
        assert_eq!(
            sfdisk_delete(disk, 3).line(),
            format!("{quiet} --delete /dev/loop7 3")
        );
        assert_eq!(partx_update(disk, None).line(), "partx -u /dev/loop7");
        assert_eq!(
            partx_update(disk, Some(4)).line(),
            "partx -u --nr 4 /dev/loop7"
        );
        assert_eq!(partx_delete(disk, 4).line(), "partx -d --nr 4 /dev/loop7");
        assert_eq!(sfdisk_json(disk).line(), "sfdisk -J /dev/loop7");
    }
}
