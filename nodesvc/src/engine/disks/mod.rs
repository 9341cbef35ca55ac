//! Disk discovery: `lsblk` JSON for the device tree, `blkid -p` for what a
//! disk carries, `losetup` for what a loop device is backed by, and the pure
//! function [`assign`] that decides which disks each group may take.
//!
//! A disk that matches no selector is never touched.
//!
//! [`discover`] reads the disks and what they carry, [`assign`] decides
//! which group takes each, [`empty`] says why a group took none. This file
//! holds the disk types.

mod assign;
mod discover;
mod empty;
#[cfg(test)]
mod tests;

use std::path::PathBuf;

use serde::Serialize;

pub use assign::{ORPHAN_PV, assign, by_group, selected};
pub use discover::{discover, list_loops, parse_blkid_export, parse_lsblk, parse_maj_min, probe};
pub use empty::{Candidate, EmptyGroup, NO_PATTERN_MATCHES, empty_groups};

/// Prefix of every partition name we create.
pub const PARTITION_PREFIX: &str = "carina.io/";

/// A whole disk as the kernel shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disk {
    /// Kernel name (`sdb`, `loop3`).
    pub name: String,
    pub path: PathBuf,
    pub size_bytes: u64,
    pub read_only: bool,
    /// Spinning disk (lsblk's ROTA).
    pub rotational: bool,
    /// `disk`, `loop`, ...
    pub kind: String,
    pub major: u32,
    pub minor: u32,
    /// Filesystem or other signature found by `blkid` (`ext4`, `LVM2_member`).
    pub fstype: Option<String>,
    /// Partition-table type (`gpt`, `dos`).
    pub pttype: Option<String>,
    /// Mount points of the disk itself.
    pub mountpoints: Vec<String>,
    /// What uses its partitions or is stacked on it: partition mount points
    /// and holders (`holder:<name>`). A disk that is already ours may have
    /// these (our mounted volumes); any other disk may not.
    pub children_in_use: Vec<String>,
    /// Kernel names of its partitions.
    pub partitions: Vec<String>,
    /// Loop devices: the backing file.
    pub backing_file: Option<String>,
    /// LVM physical volume: the VG it belongs to (filled by the LVM layer).
    pub lvm_vg: Option<String>,
}

/// Why a disk was or was not taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskStatus {
    pub disk: Disk,
    /// The group that took it.
    pub group: Option<String>,
    /// Why no group took it (empty when one did, or when none matched).
    pub reason: String,
}

/// A blank, writable loop disk of `size_bytes` with nothing on it, for
/// tests (the engine's own, and elsewhere with the `testkit` feature).
#[cfg(any(test, feature = "testkit"))]
pub fn blank_disk(name: &str, size_bytes: u64) -> Disk {
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
