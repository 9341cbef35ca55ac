//! A node's room for new volumes, per device group, from its
//! `NodeStorageResource`, and placing volumes into it.
//!
//! **Figures.** The exact byte figures of `status.groups[]` are used:
//! `allocatableBytes` (free less the reserve), `largestAllocatableBytes`
//! (the largest single volume that fits now), `allocationUnitBytes`. A
//! record written by Carina's Go publisher has only the `allocatable` map
//! (`carina.storage.io/<group>`, whole GiB): each key is a volume group
//! there (the Go publisher keys a RAW disk `<group>/<disk>`, which is left
//! out), so it becomes an LVM group whose largest volume is its
//! allocatable.
//!
//! **LVM and HOST.** A volume of size `s` (its range rounded to the unit,
//! [`carina_csi::sizes::allocation`]) fits when `s ≤ largest` and
//! `s ≤ allocatable`. Afterwards `allocatable -= s`; `largest` becomes the
//! new allocatable when it was the whole allocatable (device-mapper LVM,
//! HOST), else `largest - s` (contiguous allocation: the volume may have
//! gone into the largest extent; the second largest is unknown, so this
//! is the safe figure).
//!
//! **RAW.** With the node's disk list (`status.disks[]` of the group), the
//! group is modelled as one bin per disk: a disk's area is its size
//! rounded down to 1 MiB less 2 MiB (GPT headers at 1 MiB alignment), the
//! used bytes (`total - free`) are assumed to fill the smallest disks
//! first (the node places best-fit, so small disks fill first), and no
//! bin is larger than the group's largest free extent when the node
//! reports one below its allocatable. A whole-disk volume
//! (`exclusively-raw-disk`) takes the smallest untouched disk whose area
//! holds it, ignoring the reserve as the node does; a shared volume takes
//! the first bin (smallest free first) that holds it, and the group's
//! allocatable must hold it too. Volumes go in first-fit-decreasing
//! order ([`crate::request::sort_for_placement`]). **Without** a disk
//! list the group is one extent of `largest` bytes: a shared volume
//! behaves as in LVM, and a whole-disk volume fits when `largest` holds
//! it and then leaves no known extent (`largest = 0`). Which disks hold
//! foreign partitions is not published; such disks count as the model
//! says, and the node has the last word.
//!
//! **Groups.** A volume naming a group must go there; one that does not
//! goes into the first group, in the node's order, whose policy suits it
//! and that holds it. Which policy suits a volume is the one rule the
//! provisioner's placement reads too ([`carina_api::policy::suits`]):
//! whole disk: RAW; block access or a part of a bcache device: LVM or
//! RAW; otherwise any; a policy Carina does not know holds nothing.

use carina_api::policy::{self, Needs, Unsuitable};
use carina_api::quantity::quantity_bytes;
use carina_api::{CAPACITY_KEY_PREFIX, NodeStorageResourceStatus};
use carina_csi::sizes;

use crate::request::Volume;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Why a group of `policy` cannot hold `v`, if it cannot: the one policy
/// rule, over what the volume needs.
fn unsuitable(policy: &str, v: &Volume) -> Option<Unsuitable> {
    let needs = Needs {
        whole_disk: v.exclusive,
        block: v.block,
        bcache: v.bcache,
    };
    policy::suits(policy, needs).err()
}

/// One disk of a RAW group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskRoom {
    /// Its aligned usable area.
    pub area: u64,
    /// Free bytes in one extent (the model's assumption).
    pub free: u64,
    /// Nothing on it: a whole-disk volume may take it.
    pub untouched: bool,
}

/// A device group's room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRoom<'a> {
    pub name: &'a str,
    /// Its policy's name ([`carina_api::policy`]).
    pub policy: &'a str,
    /// Free bytes less the reserve.
    pub allocatable: u64,
    /// The largest single shared volume that fits.
    pub largest: u64,
    /// Free bytes, the reserve included (RAW whole disks ignore the
    /// reserve).
    pub free: u64,
    pub reserve: u64,
    /// Sizes are rounded up to this.
    pub unit: u64,
    /// RAW with a disk list: the disks, smallest free first.
    pub disks: Vec<DiskRoom>,
    /// Bytes taken off by volumes in flight.
    pub in_flight: u64,
}

/// Why a volume does not fit a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall(pub String);

impl<'a> GroupRoom<'a> {
    /// Takes `size` bytes (already rounded) for `v`.
    fn take(&mut self, size: u64, v: &Volume) -> Result<(), Shortfall> {
        if v.exclusive {
            return self.take_disk(size, v);
        }
        if size > self.allocatable {
            return Err(self.short(size, v, "allocatable"));
        }
        if self.disks.is_empty() {
            if size > self.largest {
                return Err(Shortfall(format!(
                    "device group {:?}: {} needs {} in one piece, the largest that fits is {}",
                    self.name,
                    v.who(),
                    human(size),
                    human(self.largest)
                )));
            }
            self.largest = if self.largest >= self.allocatable {
                self.allocatable - size
            } else {
                self.largest - size
            };
        } else {
            let Some(disk) = self.disks.iter_mut().find(|d| d.free >= size) else {
                let largest = self.disks.iter().map(|d| d.free).max().unwrap_or(0);
                return Err(Shortfall(format!(
                    "device group {:?}: {} needs {} on one disk, the largest free extent is {}",
                    self.name,
                    v.who(),
                    human(size),
                    human(largest)
                )));
            };
            disk.free -= size;
            disk.untouched = false;
            self.sort_disks();
            self.largest = self.disk_largest();
        }
        self.allocatable -= size;
        self.free = self.free.saturating_sub(size);
        Ok(())
    }

    /// Takes a whole untouched disk of at least `size` bytes.
    fn take_disk(&mut self, size: u64, v: &Volume) -> Result<(), Shortfall> {
        if self.disks.is_empty() {
            if size > self.largest {
                return Err(Shortfall(format!(
                    "device group {:?}: {} needs a whole disk of {}, the largest free extent is {}",
                    self.name,
                    v.who(),
                    human(size),
                    human(self.largest)
                )));
            }
            self.largest = 0;
            self.free = self.free.saturating_sub(size);
            self.allocatable = self.allocatable.saturating_sub(size);
            return Ok(());
        }
        let disk = self
            .disks
            .iter_mut()
            .filter(|d| d.untouched && d.area >= size)
            .min_by_key(|d| d.area);
        let Some(disk) = disk else {
            return Err(Shortfall(format!(
                "device group {:?} has no untouched disk of {} for {} (exclusively-raw-disk)",
                self.name,
                human(size),
                v.who()
            )));
        };
        let area = disk.area;
        disk.free = 0;
        disk.untouched = false;
        self.sort_disks();
        self.free = self.free.saturating_sub(area);
        self.allocatable = self.allocatable.min(self.free.saturating_sub(self.reserve));
        self.largest = self.disk_largest();
        Ok(())
    }

    fn disk_largest(&self) -> u64 {
        self.disks
            .iter()
            .map(|d| d.free)
            .max()
            .unwrap_or(0)
            .min(self.allocatable)
    }

    fn sort_disks(&mut self) {
        self.disks.sort_by_key(|d| (d.free, d.area));
    }

    fn short(&self, size: u64, v: &Volume, what: &str) -> Shortfall {
        let flight = if self.in_flight > 0 {
            format!(" after {} in flight", human(self.in_flight))
        } else {
            String::new()
        };
        Shortfall(format!(
            "device group {:?} has {} {what}{flight}, {} needs {}",
            self.name,
            human(self.allocatable),
            v.who(),
            human(size)
        ))
    }

    /// The size `v` takes in this group: its range rounded to the unit.
    fn size_of(&self, v: &Volume) -> Result<u64, Shortfall> {
        sizes::allocation(&v.range, self.unit)
            .map_err(|e| Shortfall(format!("device group {:?}: {}: {e}", self.name, v.who())))
    }
}

/// A node's room, group by group in the node's order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeRoom<'a> {
    pub groups: Vec<GroupRoom<'a>>,
}

impl<'a> NodeRoom<'a> {
    /// The room a node's published status describes.
    pub fn from_status(status: &'a NodeStorageResourceStatus) -> NodeRoom<'a> {
        if status.groups.is_empty() {
            return Self::from_allocatable(status);
        }
        let groups = status
            .groups
            .iter()
            .map(|g| {
                let policy = g.policy.as_str();
                let mut room = GroupRoom {
                    name: &g.name,
                    policy,
                    allocatable: g.allocatable_bytes,
                    largest: g.largest_allocatable_bytes.min(g.allocatable_bytes),
                    free: g.free_bytes.max(g.allocatable_bytes),
                    reserve: g.reserve_bytes,
                    unit: g.allocation_unit_bytes.max(1),
                    disks: Vec::new(),
                    in_flight: 0,
                };
                if policy == policy::RAW {
                    room.disks = raw_disks(status, g.name.as_str(), g.total_bytes, &room);
                    if !room.disks.is_empty() {
                        room.largest = room.disk_largest();
                    }
                }
                room
            })
            .collect();
        NodeRoom { groups }
    }

    /// Carina's Go shape: whole GiB per `carina.storage.io/<group>`.
    fn from_allocatable(status: &'a NodeStorageResourceStatus) -> NodeRoom<'a> {
        let groups = status
            .allocatable
            .iter()
            .filter_map(|(key, q)| {
                let name = key.strip_prefix(CAPACITY_KEY_PREFIX)?;
                if name.is_empty() || name.contains('/') {
                    return None;
                }
                let bytes = quantity_bytes(q).ok()?.saturating_mul(GIB);
                Some(GroupRoom {
                    name,
                    policy: policy::LVM,
                    allocatable: bytes,
                    largest: bytes,
                    free: bytes,
                    reserve: 0,
                    unit: 1,
                    disks: Vec::new(),
                    in_flight: 0,
                })
            })
            .collect();
        NodeRoom { groups }
    }

    /// Places `v`: returns the index of the group it went into.
    ///
    /// # Errors
    /// Why it fits nowhere on this node.
    pub fn place(&mut self, v: &Volume) -> Result<usize, Shortfall> {
        match &v.group {
            Some(name) => {
                let Some(i) = self.groups.iter().position(|g| g.name == name) else {
                    return Err(Shortfall(format!("the node has no device group {name:?}")));
                };
                let g = &mut self.groups[i];
                if let Some(why) = unsuitable(g.policy, v) {
                    return Err(Shortfall(match why {
                        Unsuitable::UnknownPolicy(_) => format!("device group {name:?}: {why}"),
                        _ => format!("device group {name:?} is {}: {why}", g.policy),
                    }));
                }
                let size = g.size_of(v)?;
                g.take(size, v)?;
                Ok(i)
            }
            None => {
                let mut first: Option<Shortfall> = None;
                for (i, g) in self.groups.iter_mut().enumerate() {
                    if unsuitable(g.policy, v).is_some() {
                        continue;
                    }
                    let taken = g.size_of(v).and_then(|size| g.take(size, v));
                    match taken {
                        Ok(()) => return Ok(i),
                        Err(e) => {
                            first.get_or_insert(e);
                        }
                    }
                }
                Err(first.unwrap_or_else(|| {
                    Shortfall(format!(
                        "the node has no device group that suits {}",
                        v.who()
                    ))
                }))
            }
        }
    }

    /// Takes a volume already in flight off the room. It is not checked:
    /// what does not fit takes what is left.
    pub fn reserve(&mut self, v: &Volume) {
        let i = match &v.group {
            Some(name) => self.groups.iter().position(|g| g.name == name),
            None => self
                .groups
                .iter()
                .position(|g| unsuitable(g.policy, v).is_none()),
        };
        let Some(i) = i else { return };
        if let Ok(placed) = self.place(v) {
            let g = &mut self.groups[placed];
            g.in_flight = g
                .in_flight
                .saturating_add(g.size_of(v).unwrap_or(v.nominal_bytes()));
            return;
        }
        let g = &mut self.groups[i];
        let size = g.size_of(v).unwrap_or(v.nominal_bytes());
        g.in_flight = g.in_flight.saturating_add(size);
        g.allocatable = g.allocatable.saturating_sub(size);
        g.free = g.free.saturating_sub(size);
        g.largest = g.largest.min(g.allocatable);
        if v.exclusive {
            // A whole disk in flight that the model cannot find: take the
            // largest untouched one, the one that came closest.
            if let Some(d) = g
                .disks
                .iter_mut()
                .filter(|d| d.untouched)
                .max_by_key(|d| d.area)
            {
                d.free = 0;
                d.untouched = false;
            }
        } else if let Some(d) = g.disks.iter_mut().max_by_key(|d| d.free) {
            d.free = d.free.saturating_sub(size);
            d.untouched = false;
        }
        g.sort_disks();
        if !g.disks.is_empty() {
            g.largest = g.disk_largest();
        }
    }
}

/// The bins of a RAW group with a published disk list (see the module
/// documentation); empty without one.
fn raw_disks(
    status: &NodeStorageResourceStatus,
    group: &str,
    total: u64,
    room: &GroupRoom<'_>,
) -> Vec<DiskRoom> {
    let mut areas: Vec<u64> = status
        .disks
        .iter()
        .filter(|d| d.device_group == group && !d.read_only)
        .map(|d| (d.size / MIB * MIB).saturating_sub(2 * MIB))
        .filter(|a| *a > 0)
        .collect();
    if areas.is_empty() {
        return Vec::new();
    }
    areas.sort_unstable();
    // Saturating: a status may claim disks of any size (a plain sum
    // overflowed on two disks near 2^64 bytes).
    let model_total = areas.iter().fold(0u64, |t, a| t.saturating_add(*a));
    let total = if total == 0 { model_total } else { total };
    let mut used = total.saturating_sub(room.free);
    // Bins no larger than the largest extent, when the node says it is
    // smaller than what could be allocated.
    let cap = if room.largest < room.allocatable {
        room.largest
    } else {
        u64::MAX
    };
    let mut disks: Vec<DiskRoom> = areas
        .into_iter()
        .map(|area| {
            let on_it = used.min(area);
            used -= on_it;
            let free = (area - on_it).min(cap);
            DiskRoom {
                area,
                free,
                untouched: on_it == 0 && free == area,
            }
        })
        .collect();
    disks.sort_by_key(|d| (d.free, d.area));
    disks
}

/// `bytes` for a reason text: binary units with one decimal, exact bytes
/// below 1 KiB.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
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
                        prop_assert_eq!(room.groups[i].name, name.as_str());
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
}
