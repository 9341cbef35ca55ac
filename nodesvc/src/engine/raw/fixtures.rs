//! Test fixtures shared by the unit tests of the RAW backend's modules:
//! disks, partition entries and views built without touching a device.

use super::codec::{partition_name, volume_guid};
use super::record::Slot;
use super::view::{DiskView, view_of};
use crate::engine::disks::Disk;
use crate::engine::gpt;

pub(super) const MIB: u64 = 1 << 20;

pub(super) fn disk(name: &str, size_bytes: u64) -> Disk {
    crate::engine::disks::blank_disk(name, size_bytes)
}

pub(super) fn entry(number: u32, start: u64, size: u64, name: &str, uuid: &str) -> gpt::Partition {
    gpt::Partition {
        number,
        start,
        size,
        type_id: gpt::LINUX_DATA_TYPE.into(),
        uuid: uuid.into(),
        name: name.into(),
    }
}

pub(super) fn ours(number: u32, start: u64, size: u64, volume: &str) -> gpt::Partition {
    entry(
        number,
        start,
        size,
        &partition_name(volume),
        &volume_guid(volume),
    )
}

/// A 64 MiB disk (512-byte sectors) with a GPT holding `parts`.
pub(super) fn gpt_view(name: &str, parts: Vec<gpt::Partition>, slots: &[Option<Slot>]) -> DiskView {
    let table = gpt::Table {
        label: "gpt".into(),
        sector_size: Some(512),
        first_lba: Some(34),
        last_lba: Some(131038),
        partitions: parts,
    };
    view_of(&disk(name, 64 * MIB), Some(table), Some(512), slots).expect("view")
}

pub(super) fn blank_view(name: &str, size: u64) -> DiskView {
    view_of(&disk(name, size), None, Some(512), &[]).expect("view")
}
