//! Unit tests of the room module: figures read from a NodeStorageResource,
//! the policy and size checks, and placement into the groups.

use super::*;
use crate::request::ClaimKey;
use carina_api::{DeviceGroupCapacity, Disk};
use carina_csi::CapacityRange;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use proptest::prelude::*;

/// Figures a node may publish: small, around a unit, or anything.
fn figure() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..64,
        (1u64..64).prop_map(|g| g * GIB),
        any::<u64>(),
        Just(u64::MAX)
    ]
}

fn any_group() -> impl Strategy<Value = DeviceGroupCapacity> {
    (
        prop_oneof![Just("raw".to_string()), Just("ssd".to_string()), ".{0,6}"],
        prop_oneof![
            Just("LVM".to_string()),
            Just("RAW".to_string()),
            Just("HOST".to_string()),
            ".{0,6}"
        ],
        [figure(), figure(), figure(), figure(), figure(), figure()],
    )
        .prop_map(
            |(name, policy, [total, free, reserve, allocatable, largest, unit])| {
                DeviceGroupCapacity {
                    name,
                    policy,
                    total_bytes: total,
                    free_bytes: free,
                    reserve_bytes: reserve,
                    allocatable_bytes: allocatable,
                    largest_allocatable_bytes: largest,
                    allocation_unit_bytes: unit,
                    ..DeviceGroupCapacity::default()
                }
            },
        )
}

fn any_volume() -> impl Strategy<Value = Volume> {
    (
        proptest::option::of(prop_oneof![
            Just("raw".to_string()),
            Just("ssd".to_string()),
            ".{0,6}"
        ]),
        figure(),
        figure(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(group, required, limit, exclusive, block)| Volume {
            claim: Some(ClaimKey::new("ns", "c")),
            group,
            range: CapacityRange {
                required_bytes: required,
                limit_bytes: limit,
            },
            exclusive,
            block,
            bcache: None,
        })
}

proptest! {
    /// A status of any figures (as a node or anyone with write access
    /// to the object may publish), and volumes of any size, are
    /// placed or refused without a panic; room only shrinks, and a
    /// shared volume placed fitted what was allocatable.
    #[test]
    fn any_published_status_places_or_refuses(
        groups in prop::collection::vec(any_group(), 0..4),
        disks in prop::collection::vec(
            (figure(), prop_oneof![Just("raw".to_string()), ".{0,3}"], any::<bool>()),
            0..5,
        ),
        allocatable in prop::collection::btree_map(
            prop_oneof![Just("carina.storage.io/ssd".to_string()), ".{0,24}"],
            prop_oneof![carina_sys::testkit::noisy_text(), "[0-9]{1,22}(Gi|Ki|E|m)?"],
            0..3,
        ),
        volumes in prop::collection::vec((any_volume(), any::<bool>()), 1..5),
    ) {
        let disks = disks
            .into_iter()
            .map(|(size, device_group, read_only)| Disk { size, device_group, read_only, ..Disk::default() })
            .collect();
        let mut s = status(groups, disks);
        s.allocatable = allocatable.into_iter().map(|(k, v)| (k, Quantity(v))).collect();
        let mut room = NodeRoom::from_status(&s);
        for (v, in_flight) in volumes {
            let before = room.clone();
            if in_flight {
                room.reserve(&v);
            } else if let Ok(i) = room.place(&v) {
                prop_assert!(i < room.groups.len());
                if let Some(name) = &v.group {
                    let named = resolve_group(name, |n| before.groups.iter().any(|g| g.name == n));
                    prop_assert_eq!(&room.groups[i].name, &named);
                }
                if !v.exclusive {
                    prop_assert!(before.groups[i].allocatable >= v.range.required_bytes);
                }
            }
            for (b, a) in before.groups.iter().zip(&room.groups) {
                prop_assert!(a.allocatable <= b.allocatable && a.free <= b.free, "{:?} -> {:?}", b, a);
                prop_assert!(a.in_flight >= b.in_flight);
                prop_assert!(a.largest <= a.allocatable.max(b.largest));
            }
        }
    }
}

/// Found by `any_published_status_places_or_refuses`: disks whose
/// sizes add past 2^64 made the model's total overflow (a panic in
/// a debug build, a wrapped total in release).
#[test]
fn raw_disks_past_u64_in_total_are_modelled() {
    let huge = Disk {
        size: u64::MAX,
        ..raw_disk("huge", 0)
    };
    let s = status(
        vec![group("raw", "RAW", 0, 0)],
        vec![huge, raw_disk("b", 1)],
    );
    let mut room = NodeRoom::from_status(&s);
    assert_eq!(room.groups[0].disks.len(), 2);
    assert!(room.place(&vol(None, 1)).is_err(), "nothing is allocatable");
}

fn vol(group: Option<&str>, bytes: u64) -> Volume {
    Volume {
        claim: Some(ClaimKey::new("ns", "c")),
        group: group.map(str::to_string),
        range: CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        },
        exclusive: false,
        block: false,
        bcache: None,
    }
}

fn group(name: &str, policy: &str, allocatable: u64, largest: u64) -> DeviceGroupCapacity {
    DeviceGroupCapacity {
        name: name.into(),
        policy: policy.into(),
        total_bytes: allocatable * 2,
        free_bytes: allocatable,
        reserve_bytes: 0,
        allocatable_bytes: allocatable,
        largest_allocatable_bytes: largest,
        allocation_unit_bytes: 4 * MIB,
        ..DeviceGroupCapacity::default()
    }
}

fn status(groups: Vec<DeviceGroupCapacity>, disks: Vec<Disk>) -> NodeStorageResourceStatus {
    NodeStorageResourceStatus {
        groups,
        disks,
        ..NodeStorageResourceStatus::default()
    }
}

/// A disk of `gib` GiB in the RAW group "raw".
fn raw_disk(name: &str, gib: u64) -> Disk {
    Disk {
        name: name.into(),
        size: gib * GIB,
        device_group: "raw".into(),
        ..Disk::default()
    }
}

/// What a RAW disk of `gib` GiB can hold: 1 MiB at each end goes to
/// the GPT and alignment.
fn raw_area(gib: u64) -> u64 {
    gib * GIB - 2 * MIB
}

/// Go Carina's `ssd`/`hdd` shorthand names `carina-vg-ssd`/`carina-vg-hdd`,
/// unless the node has a group of the written name.
#[test]
fn group_shorthand_reads_as_go_carina_read_it() {
    let go = status(
        vec![
            group("carina-vg-hdd", "LVM", 12 * MIB, 12 * MIB),
            group("carina-vg-ssd", "LVM", 12 * MIB, 12 * MIB),
        ],
        vec![],
    );
    let mut room = NodeRoom::from_status(&go);
    assert_eq!(room.place(&vol(Some("ssd"), 4 * MIB)), Ok(1));
    assert_eq!(room.place(&vol(Some("HDD"), 4 * MIB)), Ok(0));
    let both = status(
        vec![
            group("carina-vg-ssd", "LVM", 12 * MIB, 12 * MIB),
            group("ssd", "LVM", 12 * MIB, 12 * MIB),
        ],
        vec![],
    );
    let mut room = NodeRoom::from_status(&both);
    assert_eq!(room.place(&vol(Some("ssd"), 4 * MIB)), Ok(1));
    room.reserve(&vol(Some("ssd"), 4 * MIB));
    assert_eq!(room.groups[1].in_flight, 4 * MIB);
}

#[test]
fn lvm_rounds_to_the_unit_and_fits_exactly() {
    let s = status(vec![group("ssd", "LVM", 12 * MIB, 12 * MIB)], vec![]);
    let mut room = NodeRoom::from_status(&s);
    assert_eq!(room.place(&vol(Some("ssd"), 5 * MIB)), Ok(0));
    assert_eq!(room.groups[0].allocatable, 4 * MIB);
    assert_eq!(room.groups[0].largest, 4 * MIB);
    assert_eq!(room.place(&vol(Some("ssd"), 4 * MIB)), Ok(0));
    let err = room.place(&vol(Some("ssd"), 1)).expect_err("full");
    assert!(err.0.contains("has 0 B allocatable"), "{err:?}");
}

#[test]
fn contiguous_largest_shrinks_safely() {
    let s = status(vec![group("ssd", "LVM", 100 * MIB, 40 * MIB)], vec![]);
    let mut room = NodeRoom::from_status(&s);
    let err = room
        .place(&vol(Some("ssd"), 41 * MIB))
        .expect_err("no extent");
    assert!(err.0.contains("in one piece"), "{err:?}");
    room.place(&vol(Some("ssd"), 20 * MIB)).expect("fits");
    assert_eq!(room.groups[0].largest, 20 * MIB);
    assert_eq!(room.groups[0].allocatable, 80 * MIB);
}

#[test]
fn groupless_volumes_take_the_first_suitable_group_with_room() {
    let s = status(
        vec![
            group("host", "HOST", 8 * MIB, 8 * MIB),
            group("ssd", "LVM", 100 * MIB, 100 * MIB),
        ],
        vec![],
    );
    let mut room = NodeRoom::from_status(&s);
    assert_eq!(room.place(&vol(None, 8 * MIB)), Ok(0));
    assert_eq!(room.place(&vol(None, 8 * MIB)), Ok(1));
    let mut block = vol(None, 4 * MIB);
    block.block = true;
    let mut room = NodeRoom::from_status(&s);
    assert_eq!(room.place(&block), Ok(1));
    let err = room.place(&vol(Some("nvme"), 1)).expect_err("no group");
    assert!(err.0.contains("no device group \"nvme\""));
}

#[test]
fn raw_disks_first_fit_and_whole_disks() {
    let mut g = group(
        "raw",
        "RAW",
        raw_area(10) + raw_area(20) + raw_area(30),
        raw_area(30),
    );
    g.total_bytes = g.free_bytes;
    g.allocation_unit_bytes = MIB;
    let s = status(
        vec![g],
        vec![raw_disk("a", 20), raw_disk("b", 10), raw_disk("c", 30)],
    );
    let mut room = NodeRoom::from_status(&s);
    assert_eq!(room.groups[0].disks.len(), 3);
    let mut whole = vol(Some("raw"), 15 * GIB);
    whole.exclusive = true;
    // Whole: the smallest untouched disk that holds it (20 GiB).
    room.place(&whole).expect("a 20 GiB disk");
    // Shared: 12 GiB fits only the 30 GiB disk now.
    room.place(&vol(Some("raw"), 12 * GIB))
        .expect("on the 30 GiB disk");
    // Another whole disk of 15 GiB: the 30 GiB disk is touched, the
    // 10 GiB one too small.
    let err = room.place(&whole).expect_err("no disk left");
    assert!(err.0.contains("no untouched disk"), "{err:?}");
    // Shared 9 GiB: first fit, the 10 GiB disk.
    room.place(&vol(Some("raw"), 9 * GIB))
        .expect("on the 10 GiB disk");
    // 18.5 GiB: the group has the bytes, no disk has the extent.
    let err = room
        .place(&vol(Some("raw"), 18 * GIB + GIB / 2))
        .expect_err("fragmented");
    assert!(err.0.contains("on one disk"), "{err:?}");
}

#[test]
fn raw_used_space_fills_small_disks_first() {
    let mut g = group(
        "raw",
        "RAW",
        raw_area(20) + raw_area(10) - 4 * GIB,
        raw_area(20),
    );
    g.total_bytes = raw_area(10) + raw_area(20);
    let s = status(vec![g], vec![raw_disk("a", 10), raw_disk("b", 20)]);
    let room = NodeRoom::from_status(&s);
    let disks = &room.groups[0].disks;
    assert_eq!(disks[0].free, raw_area(10) - 4 * GIB);
    assert!(!disks[0].untouched);
    assert!(disks[1].untouched);
}

#[test]
fn raw_without_disks_is_one_extent() {
    let s = status(vec![group("raw", "RAW", 100 * MIB, 60 * MIB)], vec![]);
    let mut room = NodeRoom::from_status(&s);
    let mut whole = vol(Some("raw"), 50 * MIB);
    whole.exclusive = true;
    room.place(&whole).expect("the largest extent");
    assert_eq!(room.groups[0].largest, 0);
    assert!(room.place(&whole).is_err());
}

#[test]
fn policies_refuse_what_they_cannot_hold() {
    let s = status(
        vec![
            group("ssd", "LVM", GIB, GIB),
            group("dir", "HOST", GIB, GIB),
        ],
        vec![],
    );
    let mut room = NodeRoom::from_status(&s);
    let mut whole = vol(Some("ssd"), MIB);
    whole.exclusive = true;
    let err = room.place(&whole).expect_err("LVM");
    assert!(err.0.contains("is LVM"), "{err:?}");
    let mut block = vol(Some("dir"), MIB);
    block.block = true;
    let err = room.place(&block).expect_err("HOST");
    assert!(err.0.contains("is HOST"), "{err:?}");
}

#[test]
fn carina_go_records_read_the_allocatable_map() {
    let s = NodeStorageResourceStatus {
        allocatable: [
            ("carina.storage.io/ssd".to_string(), Quantity("9".into())),
            (
                "carina.storage.io/raw/sdb".to_string(),
                Quantity("5".into()),
            ),
        ]
        .into(),
        ..NodeStorageResourceStatus::default()
    };
    let room = NodeRoom::from_status(&s);
    assert_eq!(room.groups.len(), 1);
    assert_eq!(room.groups[0].name, "ssd");
    assert_eq!(room.groups[0].allocatable, 9 * GIB);
}

#[test]
fn reservations_never_underflow() {
    let s = status(vec![group("ssd", "LVM", 10 * MIB, 10 * MIB)], vec![]);
    let mut room = NodeRoom::from_status(&s);
    room.reserve(&vol(Some("ssd"), 8 * MIB));
    room.reserve(&vol(Some("ssd"), 8 * MIB));
    let g = &room.groups[0];
    assert_eq!((g.allocatable, g.largest, g.in_flight), (0, 0, 16 * MIB));
    room.reserve(&vol(Some("unknown"), MIB));
    let err = room.place(&vol(Some("ssd"), 1)).expect_err("full");
    assert!(err.0.contains("after 16.0 MiB in flight"), "{err:?}");
}

#[test]
fn human_sizes() {
    assert_eq!(human(0), "0 B");
    assert_eq!(human(1023), "1023 B");
    assert_eq!(human(10 << 30), "10.0 GiB");
    assert_eq!(human(3 << 19), "1.5 MiB");
}
