//! Deciding which group may take each disk (pure): the first group whose
//! pattern matches, if the disk is usable for that group's policy.

use std::collections::BTreeMap;

use super::{Disk, DiskStatus};
use crate::engine::config::{Config, GroupConfig, Policy};

/// Decides which group may take each disk. Pure: the caller has probed the
/// disks and filled `lvm_vg` for LVM physical volumes, and says which RAW
/// disks already hold a partition of ours.
///
/// A disk goes to the first group (in configuration order) one of whose
/// patterns matches its path (`/dev/sdb`) or kernel name (`sdb`), and only
/// if it is usable for that policy: writable, not mounted or stacked on,
/// large enough, not a loop device backed by another block device (our own
/// LV exposures), and either blank or already ours (a PV of this group's
/// VG, a GPT disk with our partitions). An LVM physical volume of no
/// volume group (an orphan) is taken only by a group with
/// `adoptOrphanPVs`. Disks that match no group are reported with no group
/// and no reason, and are never touched.
pub fn assign(
    config: &Config,
    disks: &[Disk],
    raw_disks_with_our_partitions: &[String],
) -> Vec<DiskStatus> {
    let mut out = Vec::with_capacity(disks.len());
    for disk in disks {
        let Some(group) = first_match(config, disk) else {
            out.push(DiskStatus {
                disk: disk.clone(),
                group: None,
                reason: String::new(),
            });
            continue;
        };
        let reason = unusable_reason(disk, group, raw_disks_with_our_partitions);
        out.push(DiskStatus {
            disk: disk.clone(),
            group: reason.is_none().then(|| group.name.clone()),
            reason: reason.unwrap_or_default(),
        });
    }
    out
}

/// The group that has the first claim on `disk`: the first LVM or RAW
/// group, in configuration order, with a pattern that matches it.
pub(super) fn first_match<'c>(config: &'c Config, disk: &Disk) -> Option<&'c GroupConfig> {
    config.groups.iter().find(|g| {
        g.policy != Policy::Host
            && g.matches(&disk.path, &disk.name)
            && g.takes_kind(disk.rotational)
    })
}

/// Whether any LVM or RAW group's pattern matches `disk`.
pub fn selected(config: &Config, disk: &Disk) -> bool {
    first_match(config, disk).is_some()
}

/// [`DiskStatus::reason`] of an orphan PV an LVM group did not take.
pub const ORPHAN_PV: &str =
    "LVM physical volume of no volume group (set adoptOrphanPVs on the selector to take it)";

fn unusable_reason(disk: &Disk, group: &GroupConfig, ours: &[String]) -> Option<String> {
    let (policy, min_bytes) = (group.policy, group.min_disk_bytes);
    let group_name = group.name.as_str();
    if disk.read_only {
        return Some("read-only".into());
    }
    if !disk.mountpoints.is_empty() {
        return Some(format!("in use ({})", disk.mountpoints.join(", ")));
    }
    if disk.kind == "loop" {
        match &disk.backing_file {
            None => return Some("loop device without a backing file".into()),
            Some(f) if f.starts_with("/dev/") => {
                return Some(format!("loop device over block device {f}"));
            }
            Some(_) => {}
        }
    }
    // A disk that is already ours keeps its group while our volumes on it
    // are mounted or activated; any other disk with users is off limits.
    let already_ours = match policy {
        Policy::Lvm => disk.lvm_vg.as_deref() == Some(group_name),
        Policy::Raw => ours.iter().any(|d| d == &disk.name),
        Policy::Host => false,
    };
    if !already_ours && !disk.children_in_use.is_empty() {
        return Some(format!("in use ({})", disk.children_in_use.join(", ")));
    }
    if disk.size_bytes < min_bytes {
        return Some(format!(
            "too small ({} bytes, at least {min_bytes})",
            disk.size_bytes
        ));
    }
    if already_ours {
        return None;
    }
    match policy {
        Policy::Lvm => match (&disk.lvm_vg, &disk.fstype) {
            (Some(vg), _) if vg.is_empty() && group.adopt_orphan_pvs => None,
            (Some(vg), _) if vg.is_empty() => Some(ORPHAN_PV.into()),
            (Some(vg), _) => Some(format!("physical volume of another volume group {vg:?}")),
            (None, Some(fs)) => Some(format!("carries {fs}")),
            (None, None) if disk.pttype.is_some() || !disk.partitions.is_empty() => {
                Some("carries a partition table".into())
            }
            (None, None) => None,
        },
        Policy::Raw => {
            if let Some(fs) = &disk.fstype {
                Some(format!("carries {fs}"))
            } else if disk.pttype.is_some() || !disk.partitions.is_empty() {
                Some("carries partitions that are not ours".into())
            } else {
                None
            }
        }
        Policy::Host => Some("HOST groups take no disks".into()),
    }
}

/// Groups the assigned disks by group name.
pub fn by_group(statuses: &[DiskStatus]) -> BTreeMap<String, Vec<Disk>> {
    let mut map: BTreeMap<String, Vec<Disk>> = BTreeMap::new();
    for s in statuses {
        if let Some(g) = &s.group {
            map.entry(g.clone()).or_default().push(s.disk.clone());
        }
    }
    map
}
