//! The JSON views of NodeStorage messages: exact byte counts, enum names
//! without their type prefix.

use serde::Serialize;

use carina_proto::nodestorage::{
    BcacheDevice, CapacityResponse, Disk, GroupCapacity, LogicVolume, PodIoLimit,
};

use super::{cache_mode_name, policy_name, quota_name, reason_name};

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
