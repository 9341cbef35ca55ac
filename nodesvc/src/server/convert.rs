//! Conversions between the engine's domain types and the NodeStorage wire
//! types, and validation of request fields at the edge (errors name the
//! proto field).

use std::path::Path;

use carina_proto::nodestorage as pb;

use crate::engine::bcache::record::OwnedVolumes;
use crate::engine::bcache::{BcacheDevice, BcacheRequest, CacheMode};
use crate::engine::copy::record::CopyRecord;
use crate::engine::copy::{CopyRequest, Progress};
use crate::engine::health::Condition;
use crate::engine::iolimits::{Limits, PodLimit};
use crate::engine::{
    CapacitySnapshot, ChangeReason, CreateRequest, DiskStatus, Error, GroupCapacity, Policy,
    QuotaMode, Volume, names,
};

fn path_string(p: Option<&Path>) -> String {
    p.map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

pub fn policy(p: Policy) -> pb::Policy {
    match p {
        Policy::Lvm => pb::Policy::Lvm,
        Policy::Raw => pb::Policy::Raw,
        Policy::Host => pb::Policy::Host,
    }
}

pub fn quota(q: QuotaMode) -> pb::QuotaMode {
    match q {
        QuotaMode::NotApplicable => pb::QuotaMode::NotApplicable,
        QuotaMode::ProjectQuota => pb::QuotaMode::ProjectQuota,
        QuotaMode::AccountingOnly => pb::QuotaMode::AccountingOnly,
    }
}

pub fn reason(r: ChangeReason) -> pb::ChangeReason {
    match r {
        ChangeReason::Start => pb::ChangeReason::Start,
        ChangeReason::Create => pb::ChangeReason::Create,
        ChangeReason::Resize => pb::ChangeReason::Resize,
        ChangeReason::Delete => pb::ChangeReason::Delete,
        ChangeReason::Rescan => pb::ChangeReason::Rescan,
        ChangeReason::Config => pb::ChangeReason::Config,
    }
}

/// The wire form of `v`, with its `condition` as the node sees it now.
pub fn volume(v: &Volume, condition: &Condition, origin: Option<&CopyRecord>) -> pb::LogicVolume {
    pb::LogicVolume {
        name: v.name.clone(),
        device_group: v.group.clone(),
        policy: policy(v.policy).into(),
        size_bytes: v.size_bytes,
        device_path: path_string(v.device_path.as_deref()),
        host_path: path_string(v.host_path.as_deref()),
        major: v.major,
        minor: v.minor,
        exclusive: v.exclusive,
        disk: v.disk.clone().unwrap_or_default(),
        condition: Some(pb::VolumeCondition {
            abnormal: condition.abnormal,
            message: condition.message.clone(),
        }),
        origin: origin.map(|r| pb::CopyOrigin {
            source: r.source.clone(),
            snapshot: r.snapshot,
            complete: r.complete,
            completed_unix_nanos: r.completed_unix_nanos,
            source_size_bytes: r.source_size_bytes,
        }),
    }
}

/// A validated `CopyLVRequest` (the names; the rest is the engine's).
pub fn copy_request(req: pb::CopyLvRequest) -> Result<CopyRequest, Error> {
    names::check_volume_name_field("source", &req.source)?;
    names::check_volume_name_field("target", &req.target)?;
    Ok(CopyRequest {
        source: req.source,
        target: req.target,
        snapshot: req.snapshot,
    })
}

/// A running copy's progress message.
pub fn copy_progress(p: &Progress) -> pb::CopyLvProgress {
    pb::CopyLvProgress {
        copied_bytes: p.copied_bytes,
        total_bytes: p.total_bytes,
        done: false,
        target: None,
        frozen: p.frozen,
    }
}

pub fn group_capacity(c: &GroupCapacity) -> pb::GroupCapacity {
    pb::GroupCapacity {
        device_group: c.group.clone(),
        policy: policy(c.policy).into(),
        total_bytes: c.total_bytes,
        free_bytes: c.free_bytes,
        reserve_bytes: c.reserve_bytes,
        allocatable_bytes: c.allocatable_bytes,
        largest_allocatable_bytes: c.largest_allocatable_bytes,
        allocation_unit_bytes: c.allocation_unit,
        volume_count: c.volume_count,
        quota: quota(c.quota).into(),
        disks: c.disks.clone(),
        no_disks: c.no_disks.clone().unwrap_or_default(),
    }
}

/// A capacity message for `node_name`; `reason` overrides the snapshot's
/// (CURRENT for on-request answers and the first message of a watch).
pub fn capacity(
    node_name: &str,
    snapshot: &CapacitySnapshot,
    reason_override: Option<pb::ChangeReason>,
) -> pb::CapacityResponse {
    pb::CapacityResponse {
        node_name: node_name.to_string(),
        groups: snapshot.groups.iter().map(group_capacity).collect(),
        generation: snapshot.generation,
        reason: reason_override
            .unwrap_or_else(|| reason(snapshot.reason))
            .into(),
        incarnation: snapshot.incarnation.clone(),
    }
}

pub fn disk(s: &DiskStatus) -> pb::Disk {
    let d = &s.disk;
    pb::Disk {
        name: d.name.clone(),
        path: d.path.to_string_lossy().into_owned(),
        size_bytes: d.size_bytes,
        read_only: d.read_only,
        kind: d.kind.clone(),
        fstype: d.fstype.clone().unwrap_or_default(),
        pttype: d.pttype.clone().unwrap_or_default(),
        // Users of its partitions and holders count as its mount points on the wire.
        mountpoints: d
            .mountpoints
            .iter()
            .chain(&d.children_in_use)
            .cloned()
            .collect(),
        partitions: d.partitions.clone(),
        device_group: s.group.clone().unwrap_or_default(),
        reason: s.reason.clone(),
        major: d.major,
        minor: d.minor,
    }
}

/// `name`: the engine's volume-name rules.
pub fn volume_name(name: &str) -> Result<(), Error> {
    names::check_volume_name(name)
}

/// `size_bytes`: greater than zero, at most 2^63-1.
pub fn size(field: &str, size_bytes: u64) -> Result<(), Error> {
    if size_bytes == 0 {
        return Err(invalid(field, "must be greater than zero"));
    }
    if size_bytes > names::MAX_SIZE_BYTES {
        return Err(invalid(
            field,
            format!("{size_bytes} is more than the largest size, 2^63-1"),
        ));
    }
    Ok(())
}

/// A validated `CreateLVRequest`.
pub fn create_request(req: pb::CreateLvRequest) -> Result<CreateRequest, Error> {
    volume_name(&req.name)?;
    if req.device_group.is_empty() {
        return Err(invalid("device_group", "must not be empty"));
    }
    size("size_bytes", req.size_bytes)?;
    Ok(CreateRequest {
        name: req.name,
        group: req.device_group,
        size_bytes: req.size_bytes,
        exclusive: req.exclusive,
    })
}

fn invalid(field: &str, reason: impl Into<String>) -> Error {
    Error::InvalidArgument {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// The page token that continues a listing after volume `last` (hex, so
/// clients treat it as opaque).
pub fn page_token(last: &str) -> String {
    last.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The volume name a page token continues after.
pub fn parse_page_token(token: &str) -> Result<String, Error> {
    let bad = || invalid("page_token", "not a token from a previous ListLVs response");
    if !token.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|i| {
            token
                .get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(bad)?;
    let name = String::from_utf8(bytes).map_err(|_| bad())?;
    names::check_volume_name(&name).map_err(|_| bad())?;
    Ok(name)
}

/// A wire cache mode; `UNSPECIFIED` is `default`, an unknown number is
/// `INVALID_ARGUMENT` naming `field`.
pub fn cache_mode(field: &str, value: i32, default: Option<CacheMode>) -> Result<CacheMode, Error> {
    match pb::CacheMode::try_from(value) {
        Ok(pb::CacheMode::Unspecified) => default.ok_or_else(|| invalid(field, "must be set")),
        Ok(pb::CacheMode::Writethrough) => Ok(CacheMode::Writethrough),
        Ok(pb::CacheMode::Writeback) => Ok(CacheMode::Writeback),
        Ok(pb::CacheMode::Writearound) => Ok(CacheMode::Writearound),
        Ok(pb::CacheMode::None) => Ok(CacheMode::None),
        Err(_) => Err(invalid(field, format!("{value} is not a cache mode"))),
    }
}

pub fn wire_cache_mode(m: CacheMode) -> pb::CacheMode {
    match m {
        CacheMode::Writethrough => pb::CacheMode::Writethrough,
        CacheMode::Writeback => pb::CacheMode::Writeback,
        CacheMode::Writearound => pb::CacheMode::Writearound,
        CacheMode::None => pb::CacheMode::None,
    }
}

/// A `CreateBcache` request, validated: the volumes are made when
/// `backing_device_group` is set (then `cache_device_group`, `size_bytes`
/// and `cache_ratio_percent` are required); otherwise those fields must
/// be empty.
pub fn bcache_request(r: pb::CreateBcacheRequest) -> Result<BcacheRequest, Error> {
    volume_name(&r.name).map_err(|e| rename(e, "name"))?;
    volume_name(&r.backing_volume).map_err(|e| rename(e, "backing_volume"))?;
    volume_name(&r.cache_volume).map_err(|e| rename(e, "cache_volume"))?;
    let mode = cache_mode("cache_mode", r.cache_mode, Some(CacheMode::Writethrough))?;
    let create = if r.backing_device_group.is_empty() {
        for (field, set) in [
            ("cache_device_group", !r.cache_device_group.is_empty()),
            ("size_bytes", r.size_bytes != 0),
            ("cache_ratio_percent", r.cache_ratio_percent != 0),
        ] {
            if set {
                return Err(invalid(
                    field,
                    "only with backing_device_group (when CreateBcache makes the volumes)",
                ));
            }
        }
        None
    } else {
        if r.cache_device_group.is_empty() {
            return Err(invalid(
                "cache_device_group",
                "required with backing_device_group",
            ));
        }
        size("size_bytes", r.size_bytes)?;
        if !(1..=100).contains(&r.cache_ratio_percent) {
            return Err(invalid(
                "cache_ratio_percent",
                format!(
                    "{} is not a percentage from 1 to 100",
                    r.cache_ratio_percent
                ),
            ));
        }
        Some(OwnedVolumes {
            backing_group: r.backing_device_group,
            size_bytes: r.size_bytes,
            cache_group: r.cache_device_group,
            cache_ratio_percent: r.cache_ratio_percent,
        })
    };
    Ok(BcacheRequest {
        name: r.name,
        backing_volume: r.backing_volume,
        cache_volume: r.cache_volume,
        cache_mode: mode,
        create,
    })
}

/// An `InvalidArgument` about the name, said of `field`.
pub fn rename(e: Error, field: &str) -> Error {
    match e {
        Error::InvalidArgument { reason, .. } => invalid(field, reason),
        other => other,
    }
}

/// `limits` of a `SetPodIOLimits` request: absent is all zero (remove);
/// IOPS beyond 32 bits are refused (the kernel's v1 limit).
pub fn io_limits(l: Option<pb::IoLimits>) -> Result<Limits, Error> {
    let l = l.unwrap_or_default();
    for (field, v) in [
        ("limits.read_iops", l.read_iops),
        ("limits.write_iops", l.write_iops),
    ] {
        if v > u64::from(u32::MAX) {
            return Err(invalid(field, format!("{v} is more than {}", u32::MAX)));
        }
    }
    Ok(Limits {
        read_bps: l.read_bps,
        write_bps: l.write_bps,
        read_iops: l.read_iops,
        write_iops: l.write_iops,
    })
}

pub fn pod_limit(p: &PodLimit) -> pb::PodIoLimit {
    pb::PodIoLimit {
        pod_uid: p.pod_uid.clone(),
        volume: p.volume.clone(),
        limits: Some(pb::IoLimits {
            read_bps: p.limits.read_bps,
            write_bps: p.limits.write_bps,
            read_iops: p.limits.read_iops,
            write_iops: p.limits.write_iops,
        }),
        major: p.major,
        minor: p.minor,
        cgroup: path_string(Some(&p.cgroup)),
        cgroup_version: p.cgroup_version,
        cgroups: p.cgroups,
        cgroups_expected: p.cgroups_expected,
    }
}

pub fn bcache(d: &BcacheDevice) -> pb::BcacheDevice {
    let k = d.kernel.as_ref();
    let dev = k.and_then(|k| k.device.as_ref());
    let owned = d.owned.as_ref();
    pb::BcacheDevice {
        name: d.name.clone(),
        backing_volume: d.backing_volume.clone(),
        cache_volume: d.cache_volume.clone(),
        cache_mode: wire_cache_mode(d.cache_mode).into(),
        device_path: path_string(d.device_path.as_deref()),
        major: dev.map_or(0, |d| d.dev.major),
        minor: dev.map_or(0, |d| d.dev.minor),
        state: d.state(),
        dirty_bytes: k.map_or(0, |k| k.dirty_bytes),
        cache_hit_ratio_percent: k.map_or(0, |k| k.hit_ratio_percent),
        running: k.is_some_and(|k| k.running),
        cache_set_uuid: d.cset_uuid.clone(),
        backing_uuid: d.backing_uuid.clone().unwrap_or_default(),
        kernel_cache_mode: k
            .and_then(|k| k.cache_mode)
            .map_or(pb::CacheMode::Unspecified, wire_cache_mode)
            .into(),
        backing_device_group: owned.map(|o| o.backing_group.clone()).unwrap_or_default(),
        cache_device_group: owned.map(|o| o.cache_group.clone()).unwrap_or_default(),
        size_bytes: owned.map_or(0, |o| o.size_bytes),
        cache_ratio_percent: owned.map_or(0, |o| o.cache_ratio_percent),
        problem: d.problem.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn page_tokens_round_trip_and_reject_garbage() {
        let t = page_token("pvc-1.a_b+c");
        assert_eq!(parse_page_token(&t).expect("valid"), "pvc-1.a_b+c");
        for bad in ["xyz", "0", "2d61", "zz", "c3"] {
            let e = parse_page_token(bad).expect_err(bad);
            assert!(e.to_string().starts_with("page_token:"), "{e}");
        }
    }

    #[test]
    fn create_request_names_the_field() {
        let ok = pb::CreateLvRequest {
            name: "v1".into(),
            device_group: "g".into(),
            size_bytes: 1 << 20,
            exclusive: false,
        };
        assert!(create_request(ok.clone()).is_ok());
        let cases = [
            (
                pb::CreateLvRequest {
                    name: String::new(),
                    ..ok.clone()
                },
                "name:",
            ),
            (
                pb::CreateLvRequest {
                    device_group: String::new(),
                    ..ok.clone()
                },
                "device_group:",
            ),
            (
                pb::CreateLvRequest {
                    size_bytes: 0,
                    ..ok.clone()
                },
                "size_bytes:",
            ),
            (
                pb::CreateLvRequest {
                    size_bytes: u64::MAX,
                    ..ok.clone()
                },
                "size_bytes:",
            ),
        ];
        for (req, want) in cases {
            let e = create_request(req).expect_err(want);
            assert!(e.to_string().starts_with(want), "{e}");
        }
    }

    #[test]
    fn volume_fields() {
        let v = Volume {
            name: "v".into(),
            group: "g".into(),
            policy: Policy::Host,
            size_bytes: 4096,
            device_path: None,
            host_path: Some(PathBuf::from("/srv/g/v")),
            major: 0,
            minor: 0,
            exclusive: false,
            disk: None,
        };
        let p = volume(&v, &Condition::default(), None);
        assert_eq!(p.policy, pb::Policy::Host as i32);
        assert_eq!(p.origin, None);
        let record = CopyRecord {
            source: "s".into(),
            snapshot: true,
            blocks_copied: true,
            complete: true,
            completed_unix_nanos: 5,
            source_size_bytes: 4096,
            frozen_at: None,
        };
        let origin = volume(&v, &Condition::default(), Some(&record)).origin;
        assert_eq!(
            origin,
            Some(pb::CopyOrigin {
                source: "s".into(),
                snapshot: true,
                complete: true,
                completed_unix_nanos: 5,
                source_size_bytes: 4096,
            })
        );
        assert_eq!(
            p.condition,
            Some(pb::VolumeCondition {
                abnormal: false,
                message: String::new()
            })
        );
        assert_eq!(p.host_path, "/srv/g/v");
        assert_eq!(p.device_path, "");
        assert_eq!(p.device_group, "g");
    }
}
