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
use carina_csi::params::compat::resolve_group;
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

    /// The index of the group a class's group name `name` names on this
    /// node, Go Carina's `ssd`/`hdd` shorthand read as Go Carina read it.
    fn named(&self, name: &str) -> Option<usize> {
        let name = resolve_group(name, |n| self.groups.iter().any(|g| g.name == n));
        self.groups.iter().position(|g| g.name == name)
    }

    /// Places `v`: returns the index of the group it went into.
    ///
    /// # Errors
    /// Why it fits nowhere on this node.
    pub fn place(&mut self, v: &Volume) -> Result<usize, Shortfall> {
        match &v.group {
            Some(name) => {
                let Some(i) = self.named(name) else {
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
            Some(name) => self.named(name),
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
mod tests;
