//! NodeStorage messages as people read them (tables, human sizes) and as
//! scripts read them (JSON with exact byte counts).
//!
//! JSON field names follow the proto3 JSON mapping (lowerCamelCase), but
//! 64-bit sizes are JSON numbers rather than strings, and enums drop their
//! type prefix (`"LVM"`, not `"POLICY_LVM"`).

use serde::Serialize;

use carina_proto::nodestorage::{
    BcacheDevice, CacheMode, CapacityResponse, ChangeReason, Disk, GroupCapacity, LogicVolume,
    PodIoLimit, Policy, QuotaMode,
};

use super::size::format_size;
use super::table::{Table, left, right};

/// An enum value's proto name without its type prefix, or `UNKNOWN(n)` for
/// a value newer than this client.
fn enum_name<E>(value: i32, prefix: &str, name: impl Fn(E) -> &'static str) -> String
where
    E: TryFrom<i32>,
{
    match E::try_from(value) {
        Ok(e) => {
            let full = name(e);
            full.strip_prefix(prefix).unwrap_or(full).to_string()
        }
        Err(_) => format!("UNKNOWN({value})"),
    }
}

pub fn policy_name(value: i32) -> String {
    enum_name(value, "POLICY_", |p: Policy| p.as_str_name())
}

pub fn quota_name(value: i32) -> String {
    enum_name(value, "QUOTA_MODE_", |q: QuotaMode| q.as_str_name())
}

pub fn reason_name(value: i32) -> String {
    enum_name(value, "CHANGE_REASON_", |r: ChangeReason| r.as_str_name())
}

pub fn cache_mode_name(value: i32) -> String {
    enum_name(value, "CACHE_MODE_", |m: CacheMode| m.as_str_name())
}

/// `major:minor`, or empty when the thing has no device.
fn devnum(major: u32, minor: u32) -> String {
    if major == 0 && minor == 0 {
        String::new()
    } else {
        format!("{major}:{minor}")
    }
}

/// The quota column, short.
fn quota_short(value: i32) -> String {
    match QuotaMode::try_from(value) {
        Ok(QuotaMode::NotApplicable) => "n/a".to_string(),
        Ok(QuotaMode::ProjectQuota) => "project".to_string(),
        Ok(QuotaMode::AccountingOnly) => "accounting".to_string(),
        Ok(QuotaMode::Unspecified) => String::new(),
        Err(_) => quota_name(value),
    }
}

// ---- JSON ------------------------------------------------------------------
//
// Views that borrow the messages and serialize in field order (proto
// order), so `-o json` reads like the proto.

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeView<'a> {
    name: &'a str,
    device_group: &'a str,
    policy: String,
    size_bytes: u64,
    device_path: &'a str,
    host_path: &'a str,
    major: u32,
    minor: u32,
    exclusive: bool,
    disk: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    condition: Option<ConditionView<'a>>,
}

#[derive(Debug, Serialize)]
pub struct ConditionView<'a> {
    abnormal: bool,
    message: &'a str,
}

pub fn volume_json(v: &LogicVolume) -> VolumeView<'_> {
    VolumeView {
        name: &v.name,
        device_group: &v.device_group,
        policy: policy_name(v.policy),
        size_bytes: v.size_bytes,
        device_path: &v.device_path,
        host_path: &v.host_path,
        major: v.major,
        minor: v.minor,
        exclusive: v.exclusive,
        disk: &v.disk,
        condition: v.condition.as_ref().map(|c| ConditionView {
            abnormal: c.abnormal,
            message: &c.message,
        }),
    }
}

/// `ok`, the problem the node names, or `-` where the answer carries no
/// condition (an older node).
fn condition_cell(v: &LogicVolume) -> String {
    match &v.condition {
        Some(c) if c.abnormal => format!("abnormal: {}", c.message),
        Some(_) => "ok".to_string(),
        None => "-".to_string(),
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupView<'a> {
    device_group: &'a str,
    policy: String,
    total_bytes: u64,
    free_bytes: u64,
    reserve_bytes: u64,
    allocatable_bytes: u64,
    largest_allocatable_bytes: u64,
    allocation_unit_bytes: u64,
    volume_count: u32,
    quota: String,
    disks: &'a [String],
}

pub fn group_json(g: &GroupCapacity) -> GroupView<'_> {
    GroupView {
        device_group: &g.device_group,
        policy: policy_name(g.policy),
        total_bytes: g.total_bytes,
        free_bytes: g.free_bytes,
        reserve_bytes: g.reserve_bytes,
        allocatable_bytes: g.allocatable_bytes,
        largest_allocatable_bytes: g.largest_allocatable_bytes,
        allocation_unit_bytes: g.allocation_unit_bytes,
        volume_count: g.volume_count,
        quota: quota_name(g.quota),
        disks: &g.disks,
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityView<'a> {
    node_name: &'a str,
    generation: u64,
    reason: String,
    groups: Vec<GroupView<'a>>,
}

pub fn capacity_json(c: &CapacityResponse) -> CapacityView<'_> {
    CapacityView {
        node_name: &c.node_name,
        generation: c.generation,
        reason: reason_name(c.reason),
        groups: c.groups.iter().map(group_json).collect(),
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskView<'a> {
    name: &'a str,
    path: &'a str,
    size_bytes: u64,
    read_only: bool,
    kind: &'a str,
    fstype: &'a str,
    pttype: &'a str,
    mountpoints: &'a [String],
    partitions: &'a [String],
    device_group: &'a str,
    reason: &'a str,
    major: u32,
    minor: u32,
}

pub fn disk_json(d: &Disk) -> DiskView<'_> {
    DiskView {
        name: &d.name,
        path: &d.path,
        size_bytes: d.size_bytes,
        read_only: d.read_only,
        kind: &d.kind,
        fstype: &d.fstype,
        pttype: &d.pttype,
        mountpoints: &d.mountpoints,
        partitions: &d.partitions,
        device_group: &d.device_group,
        reason: &d.reason,
        major: d.major,
        minor: d.minor,
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BcacheView<'a> {
    name: &'a str,
    backing_volume: &'a str,
    cache_volume: &'a str,
    cache_mode: String,
    kernel_cache_mode: String,
    state: &'a str,
    running: bool,
    dirty_bytes: u64,
    cache_hit_ratio_percent: u32,
    device_path: &'a str,
    major: u32,
    minor: u32,
    cache_set_uuid: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    problem: &'a str,
}

pub fn bcache_json(b: &BcacheDevice) -> BcacheView<'_> {
    BcacheView {
        name: &b.name,
        backing_volume: &b.backing_volume,
        cache_volume: &b.cache_volume,
        cache_mode: cache_mode_name(b.cache_mode),
        kernel_cache_mode: cache_mode_name(b.kernel_cache_mode),
        state: &b.state,
        running: b.running,
        dirty_bytes: b.dirty_bytes,
        cache_hit_ratio_percent: b.cache_hit_ratio_percent,
        device_path: &b.device_path,
        major: b.major,
        minor: b.minor,
        cache_set_uuid: &b.cache_set_uuid,
        problem: &b.problem,
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodLimitView<'a> {
    pod_uid: &'a str,
    volume: &'a str,
    read_bps: u64,
    write_bps: u64,
    read_iops: u64,
    write_iops: u64,
    major: u32,
    minor: u32,
    cgroup: &'a str,
    cgroup_version: u32,
    cgroups: u32,
    cgroups_expected: u32,
}

pub fn pod_limit_json(p: &PodIoLimit) -> PodLimitView<'_> {
    let l = p.limits.unwrap_or_default();
    PodLimitView {
        pod_uid: &p.pod_uid,
        volume: &p.volume,
        read_bps: l.read_bps,
        write_bps: l.write_bps,
        read_iops: l.read_iops,
        write_iops: l.write_iops,
        major: p.major,
        minor: p.minor,
        cgroup: &p.cgroup,
        cgroup_version: p.cgroup_version,
        cgroups: p.cgroups,
        cgroups_expected: p.cgroups_expected,
    }
}

// ---- tables ----------------------------------------------------------------

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
        super::size::format_size(b.dirty_bytes),
        b.cache_hit_ratio_percent.to_string(),
        b.device_path.clone(),
        devnum(b.major, b.minor),
    ]);
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use carina_proto::nodestorage::VolumeCondition;
    use serde_json::{Value, json};

    fn value(v: impl Serialize) -> Value {
        serde_json::to_value(v).expect("serializes")
    }

    fn lvm_volume() -> LogicVolume {
        LogicVolume {
            name: "data-1".into(),
            device_group: "lvm".into(),
            policy: Policy::Lvm as i32,
            size_bytes: 1 << 30,
            device_path: "/dev/loop5".into(),
            host_path: String::new(),
            major: 7,
            minor: 5,
            exclusive: false,
            disk: "/dev/loop4".into(),
            condition: Some(VolumeCondition {
                abnormal: false,
                message: String::new(),
            }),
            origin: None,
        }
    }

    fn host_volume() -> LogicVolume {
        LogicVolume {
            name: "scratch".into(),
            device_group: "host".into(),
            policy: Policy::Host as i32,
            size_bytes: 256 << 20,
            host_path: "/srv/carina/scratch".into(),
            ..LogicVolume::default()
        }
    }

    #[test]
    fn volume_table() {
        let raw = LogicVolume {
            name: "whole".into(),
            device_group: "raw".into(),
            policy: Policy::Raw as i32,
            size_bytes: 3 << 29,
            device_path: "/dev/sdc".into(),
            major: 8,
            minor: 32,
            exclusive: true,
            disk: "/dev/sdc".into(),
            condition: Some(VolumeCondition {
                abnormal: true,
                message: "disk /dev/sdc is gone".into(),
            }),
            ..LogicVolume::default()
        };
        let out = volumes_table(&[lvm_volume(), host_volume(), raw]).render();
        assert_eq!(
            out,
            "\
NAME     GROUP  POLICY               SIZE  DEVICE/PATH          MAJ:MIN  DISK        CONDITION
data-1   lvm    LVM                 1 GiB  /dev/loop5           7:5      /dev/loop4  ok
scratch  host   HOST              256 MiB  /srv/carina/scratch  -        -           -
whole    raw    RAW (whole disk)  1.5 GiB  /dev/sdc             8:32     /dev/sdc    abnormal: disk /dev/sdc is gone
"
        );
    }

    #[test]
    fn volume_json_has_exact_bytes() {
        let volume = LogicVolume {
            size_bytes: (1 << 30) + 1,
            ..lvm_volume()
        };
        let v = value(volume_json(&volume));
        assert_eq!(v["sizeBytes"], json!(1_073_741_825u64));
        assert_eq!(v["policy"], "LVM");
        assert_eq!(v["deviceGroup"], "lvm");
        let big = LogicVolume {
            size_bytes: u64::MAX,
            ..host_volume()
        };
        assert_eq!(
            value(volume_json(&big))["sizeBytes"].as_u64(),
            Some(u64::MAX)
        );
        // Fields come in proto order, not sorted.
        let text = serde_json::to_string(&volume_json(&volume)).expect("serializes");
        assert!(
            text.starts_with(
                r#"{"name":"data-1","deviceGroup":"lvm","policy":"LVM","sizeBytes":1073741825,"#
            ),
            "{text}"
        );
    }

    #[test]
    fn capacity_rendering() {
        let c = CapacityResponse {
            node_name: "demo-node".into(),
            incarnation: "i".into(),
            generation: 7,
            reason: ChangeReason::Create as i32,
            groups: vec![
                GroupCapacity {
                    device_group: "lvm".into(),
                    policy: Policy::Lvm as i32,
                    total_bytes: 2 << 30,
                    free_bytes: (2 << 30) - (4 << 20),
                    reserve_bytes: 256 << 20,
                    allocatable_bytes: (2 << 30) - (260 << 20),
                    largest_allocatable_bytes: (2 << 30) - (260 << 20),
                    allocation_unit_bytes: 4 << 20,
                    volume_count: 0,
                    quota: QuotaMode::NotApplicable as i32,
                    disks: vec!["/dev/loop4".into()],
                    no_disks: String::new(),
                },
                GroupCapacity {
                    device_group: "host".into(),
                    policy: Policy::Host as i32,
                    quota: QuotaMode::AccountingOnly as i32,
                    volume_count: 2,
                    disks: vec!["/srv/carina".into()],
                    ..GroupCapacity::default()
                },
            ],
        };
        assert_eq!(
            capacity_heading(&c),
            "node demo-node  generation 7  reason CREATE"
        );
        assert_eq!(
            capacity_table(&c.groups).render(),
            "\
GROUP  POLICY  TOTAL     FREE  RESERVE  ALLOCATABLE  LARGEST   UNIT  VOLUMES  QUOTA       DISKS
lvm    LVM     2 GiB  2.0 GiB  256 MiB      1.7 GiB  1.7 GiB  4 MiB        0  n/a         /dev/loop4
host   HOST      0 B      0 B      0 B          0 B      0 B    0 B        2  accounting  /srv/carina
"
        );
        let j = value(capacity_json(&c));
        assert_eq!(j["reason"], "CREATE");
        assert_eq!(j["groups"][0]["freeBytes"], json!((2u64 << 30) - (4 << 20)));
        assert_eq!(j["groups"][1]["quota"], "ACCOUNTING_ONLY");
    }

    #[test]
    fn unknown_enum_values_are_shown_not_hidden() {
        assert_eq!(policy_name(42), "UNKNOWN(42)");
        assert_eq!(reason_name(ChangeReason::Current as i32), "CURRENT");
        assert_eq!(cache_mode_name(CacheMode::Writeback as i32), "WRITEBACK");
        assert_eq!(quota_short(99), "UNKNOWN(99)");
    }

    #[test]
    fn disk_table() {
        let disks = [
            Disk {
                name: "loop4".into(),
                path: "/dev/loop4".into(),
                size_bytes: 2 << 30,
                kind: "loop".into(),
                fstype: "LVM2_member".into(),
                device_group: "lvm".into(),
                major: 7,
                minor: 4,
                ..Disk::default()
            },
            Disk {
                name: "sr0".into(),
                path: "/dev/sr0".into(),
                size_bytes: 1024,
                read_only: true,
                kind: "rom".into(),
                reason: "read-only".into(),
                major: 11,
                ..Disk::default()
            },
        ];
        assert_eq!(
            disks_table(&disks).render(),
            "\
NAME   PATH         SIZE  KIND  FSTYPE       PTTYPE  RO   MAJ:MIN  GROUP  REASON
loop4  /dev/loop4  2 GiB  loop  LVM2_member  -       -    7:4      lvm    -
sr0    /dev/sr0    1 KiB  rom   -            -       yes  11:0     -      read-only
"
        );
    }
}
