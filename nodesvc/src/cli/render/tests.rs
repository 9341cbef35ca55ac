//! Rendering checked on sample messages: tables, exact JSON sizes,
//! unknown enum values.

use super::*;
use carina_proto::nodestorage::{
    CapacityResponse, Disk, GroupCapacity, LogicVolume, VolumeCondition,
};
use serde::Serialize;
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
