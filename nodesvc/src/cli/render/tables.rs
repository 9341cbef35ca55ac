//! The tables of NodeStorage messages, with human sizes.

use carina_proto::nodestorage::{
    BcacheDevice, CapacityResponse, Disk, GroupCapacity, LogicVolume, PodIoLimit,
};

use super::{cache_mode_name, devnum, policy_name, quota_short, reason_name};
use crate::cli::size::format_size;
use crate::cli::table::{Table, left, right};

/// `ok`, the problem the node names, or `-` where the answer carries no
/// condition (an older node).
fn condition_cell(v: &LogicVolume) -> String {
    match &v.condition {
        Some(c) if c.abnormal => format!("abnormal: {}", c.message),
        Some(_) => "ok".to_string(),
        None => "-".to_string(),
    }
}

pub fn volumes_table<'a>(volumes: impl IntoIterator<Item = &'a LogicVolume>) -> Table {
    let mut t = Table::new(&[
        left("NAME"),
        left("GROUP"),
        left("POLICY"),
        right("SIZE"),
        left("DEVICE/PATH"),
        left("MAJ:MIN"),
        left("DISK"),
        left("CONDITION"),
    ]);
    for v in volumes {
        let mut policy = policy_name(v.policy);
        if v.exclusive {
            policy.push_str(" (whole disk)");
        }
        let location = if v.device_path.is_empty() {
            &v.host_path
        } else {
            &v.device_path
        };
        t.row([
            v.name.clone(),
            v.device_group.clone(),
            policy,
            format_size(v.size_bytes),
            location.clone(),
            devnum(v.major, v.minor),
            v.disk.clone(),
            condition_cell(v),
        ]);
    }
    t
}

pub fn capacity_table(groups: &[GroupCapacity]) -> Table {
    let mut t = Table::new(&[
        left("GROUP"),
        left("POLICY"),
        right("TOTAL"),
        right("FREE"),
        right("RESERVE"),
        right("ALLOCATABLE"),
        right("LARGEST"),
        right("UNIT"),
        right("VOLUMES"),
        left("QUOTA"),
        left("DISKS"),
    ]);
    for g in groups {
        t.row([
            g.device_group.clone(),
            policy_name(g.policy),
            format_size(g.total_bytes),
            format_size(g.free_bytes),
            format_size(g.reserve_bytes),
            format_size(g.allocatable_bytes),
            format_size(g.largest_allocatable_bytes),
            format_size(g.allocation_unit_bytes),
            g.volume_count.to_string(),
            quota_short(g.quota),
            g.disks.join(","),
        ]);
    }
    t
}

/// The line above a capacity table: whose, which generation, and why.
pub fn capacity_heading(c: &CapacityResponse) -> String {
    format!(
        "node {}  generation {}  reason {}",
        if c.node_name.is_empty() {
            "-"
        } else {
            &c.node_name
        },
        c.generation,
        reason_name(c.reason)
    )
}

pub fn disks_table(disks: &[Disk]) -> Table {
    let mut t = Table::new(&[
        left("NAME"),
        left("PATH"),
        right("SIZE"),
        left("KIND"),
        left("FSTYPE"),
        left("PTTYPE"),
        left("RO"),
        left("MAJ:MIN"),
        left("GROUP"),
        left("REASON"),
    ]);
    for d in disks {
        t.row([
            d.name.clone(),
            d.path.clone(),
            format_size(d.size_bytes),
            d.kind.clone(),
            d.fstype.clone(),
            d.pttype.clone(),
            if d.read_only { "yes" } else { "" }.to_string(),
            devnum(d.major, d.minor),
            d.device_group.clone(),
            d.reason.clone(),
        ]);
    }
    t
}

/// A limit of 0 is none: shown as `-`.
fn limit(n: u64, bytes: bool) -> String {
    match n {
        0 => "-".to_string(),
        n if bytes => format!("{}/s", format_size(n)),
        n => n.to_string(),
    }
}

pub fn pod_limits_table(limits: &[PodIoLimit]) -> Table {
    let mut t = Table::new(&[
        left("POD UID"),
        left("VOLUME"),
        left("MAJ:MIN"),
        right("READ BPS"),
        right("WRITE BPS"),
        right("READ IOPS"),
        right("WRITE IOPS"),
        left("CGROUPS"),
    ]);
    for p in limits {
        let l = p.limits.unwrap_or_default();
        t.row([
            p.pod_uid.clone(),
            p.volume.clone(),
            devnum(p.major, p.minor),
            limit(l.read_bps, true),
            limit(l.write_bps, true),
            limit(l.read_iops, false),
            limit(l.write_iops, false),
            format!(
                "{}/{} (v{})",
                p.cgroups, p.cgroups_expected, p.cgroup_version
            ),
        ]);
    }
    t
}

pub fn bcache_table(b: &BcacheDevice) -> Table {
    let mut t = Table::new(&[
        left("NAME"),
        left("BACKING"),
        left("CACHE"),
        left("MODE"),
        left("STATE"),
        right("DIRTY"),
        right("HIT%"),
        left("DEVICE"),
        left("MAJ:MIN"),
    ]);
    t.row([
        b.name.clone(),
        b.backing_volume.clone(),
        b.cache_volume.clone(),
        cache_mode_name(b.cache_mode),
        b.state.clone(),
        crate::cli::size::format_size(b.dirty_bytes),
        b.cache_hit_ratio_percent.to_string(),
        b.device_path.clone(),
        devnum(b.major, b.minor),
    ]);
    t
}
