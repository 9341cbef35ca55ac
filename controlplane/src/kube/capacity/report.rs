//! The status a node's report, or its outage, makes (pure): Carina's
//! whole-GiB figures, the exact bytes per group, the disks of RAW groups,
//! the volume groups of LVM groups and the conditions.

use std::collections::{BTreeMap, HashSet};

use carina_proto::nodestorage as pb;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::{NO_DISKS, READY, STALE};
use crate::kube::status::{condition, now, truncate};
use carina_api::{DeviceGroupCapacity, Disk, NodeStorageResourceStatus, VgGroup, capacity_key};

/// The API server's limit on a condition's message.
const CONDITION_MESSAGE_MAX: usize = 32 * 1024;

const GIB: u64 = 1 << 30;

fn quota_name(q: pb::QuotaMode) -> Option<String> {
    match q {
        pb::QuotaMode::ProjectQuota => Some("project".into()),
        pb::QuotaMode::AccountingOnly => Some("none".into()),
        pb::QuotaMode::NotApplicable | pb::QuotaMode::Unspecified => None,
    }
}

fn gib(bytes: u64) -> Quantity {
    Quantity((bytes / GIB).to_string())
}

/// The status a report of the node makes (pure).
pub(super) fn report_status(
    update: &pb::CapacityResponse,
    disks: &[pb::Disk],
    previous: &[Condition],
    generation: Option<i64>,
) -> NodeStorageResourceStatus {
    let mut capacity = BTreeMap::new();
    let mut allocatable = BTreeMap::new();
    let mut groups = Vec::with_capacity(update.groups.len());
    let mut vg_groups = Vec::new();
    let mut raw_groups = HashSet::new();
    for g in &update.groups {
        capacity.insert(capacity_key(&g.device_group), gib(g.total_bytes));
        allocatable.insert(capacity_key(&g.device_group), gib(g.allocatable_bytes));
        groups.push(DeviceGroupCapacity {
            name: g.device_group.clone(),
            policy: crate::policy::name(g.policy()).to_string(),
            total_bytes: g.total_bytes,
            free_bytes: g.free_bytes,
            reserve_bytes: g.reserve_bytes,
            allocatable_bytes: g.allocatable_bytes,
            largest_allocatable_bytes: g.largest_allocatable_bytes,
            allocation_unit_bytes: g.allocation_unit_bytes,
            volume_count: g.volume_count,
            quota: quota_name(g.quota()),
            disks: g.disks.clone(),
            no_disks: (!g.no_disks.is_empty()).then(|| g.no_disks.clone()),
        });
        match g.policy() {
            pb::Policy::Lvm => vg_groups.push(VgGroup {
                vg_name: g.device_group.clone(),
                pv_count: g.disks.len() as u64,
                lv_count: u64::from(g.volume_count),
                vg_attr: String::new(),
                vg_size: g.total_bytes,
                vg_free: g.free_bytes,
                pvs: Vec::new(),
            }),
            pb::Policy::Raw => {
                raw_groups.insert(g.device_group.as_str());
            }
            _ => {}
        }
    }
    let disks = disks
        .iter()
        .filter(|d| raw_groups.contains(d.device_group.as_str()))
        .map(|d| Disk {
            name: d.name.clone(),
            path: d.path.clone(),
            size: d.size_bytes,
            sector_size: None,
            read_only: d.read_only,
            device_group: d.device_group.clone(),
        })
        .collect();
    let message = format!(
        "node generation {}, {} device groups",
        update.generation,
        update.groups.len()
    );
    NodeStorageResourceStatus {
        sync_time: Some(now()),
        capacity,
        allocatable,
        groups,
        node_generation: Some(update.generation),
        node_incarnation: Some(update.incarnation.clone()).filter(|i| !i.is_empty()),
        vg_groups,
        disks,
        conditions: vec![
            condition(previous, READY, true, "Reporting", &message, generation),
            condition(previous, STALE, false, "Reporting", &message, generation),
            no_disks_condition(update, previous, generation),
        ],
        observed_generation: generation,
    }
}

/// `NoDisks`: True while an LVM or RAW group took no disk at the node's
/// last scan, with the node's explanation of each (pure).
fn no_disks_condition(
    update: &pb::CapacityResponse,
    previous: &[Condition],
    generation: Option<i64>,
) -> Condition {
    let empty: Vec<&str> = update
        .groups
        .iter()
        .filter(|g| !g.no_disks.is_empty())
        .map(|g| g.no_disks.as_str())
        .collect();
    if empty.is_empty() {
        let message = "every LVM and RAW group has disks";
        return condition(
            previous,
            NO_DISKS,
            false,
            "GroupsHaveDisks",
            message,
            generation,
        );
    }
    let message = truncate(&empty.join("; "), CONDITION_MESSAGE_MAX);
    condition(
        previous,
        NO_DISKS,
        true,
        "SelectorMatchedNothing",
        &message,
        generation,
    )
}

/// `base` with the conditions of an unreachable node (pure).
pub(super) fn stale_status(
    mut base: NodeStorageResourceStatus,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> NodeStorageResourceStatus {
    let previous = std::mem::take(&mut base.conditions);
    let mut conditions: Vec<Condition> = previous
        .iter()
        .filter(|c| c.type_ != READY && c.type_ != STALE)
        .cloned()
        .collect();
    conditions.push(condition(
        &previous, READY, false, reason, message, generation,
    ));
    conditions.push(condition(
        &previous, STALE, true, reason, message, generation,
    ));
    NodeStorageResourceStatus {
        conditions,
        observed_generation: generation.or(base.observed_generation),
        ..base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, policy: pb::Policy, total: u64, allocatable: u64) -> pb::GroupCapacity {
        pb::GroupCapacity {
            device_group: name.into(),
            policy: policy as i32,
            total_bytes: total,
            free_bytes: allocatable + GIB,
            reserve_bytes: GIB,
            allocatable_bytes: allocatable,
            largest_allocatable_bytes: allocatable,
            allocation_unit_bytes: 4 << 20,
            volume_count: 2,
            quota: pb::QuotaMode::NotApplicable as i32,
            disks: vec!["/dev/loop3".into()],
            no_disks: String::new(),
        }
    }

    fn cond<'a>(s: &'a NodeStorageResourceStatus, type_: &str) -> &'a Condition {
        s.conditions
            .iter()
            .find(|c| c.type_ == type_)
            .expect("condition")
    }

    #[test]
    fn a_report_in_carina_shape_and_exact_bytes() {
        let update = pb::CapacityResponse {
            node_name: "n".into(),
            groups: vec![
                group("ssd", pb::Policy::Lvm, 100 * GIB + 5, 90 * GIB + (GIB - 1)),
                group("raw", pb::Policy::Raw, 8 * GIB, 8 * GIB),
            ],
            generation: 42,
            reason: pb::ChangeReason::Create as i32,
            incarnation: "i-1".into(),
        };
        let disks = [
            pb::Disk {
                name: "sdb".into(),
                path: "/dev/sdb".into(),
                size_bytes: 8 * GIB,
                device_group: "raw".into(),
                ..pb::Disk::default()
            },
            pb::Disk {
                name: "sdc".into(),
                path: "/dev/sdc".into(),
                size_bytes: GIB,
                ..pb::Disk::default()
            },
        ];
        let s = report_status(&update, &disks, &[], Some(1));
        assert_eq!(s.capacity["carina.storage.io/ssd"].0, "100");
        assert_eq!(s.allocatable["carina.storage.io/ssd"].0, "90");
        assert_eq!(s.allocatable["carina.storage.io/raw"].0, "8");
        assert_eq!(s.groups[0].allocatable_bytes, 90 * GIB + (GIB - 1));
        assert_eq!(s.groups[0].policy, "LVM");
        assert_eq!(s.node_generation, Some(42));
        assert_eq!(s.node_incarnation.as_deref(), Some("i-1"));
        assert_eq!(s.vg_groups.len(), 1);
        assert_eq!(
            (s.vg_groups[0].vg_name.as_str(), s.vg_groups[0].lv_count),
            ("ssd", 2)
        );
        assert_eq!(s.disks.len(), 1);
        assert_eq!(
            (s.disks[0].name.as_str(), s.disks[0].device_group.as_str()),
            ("sdb", "raw")
        );
        assert_eq!(cond(&s, READY).status, "True");
        assert_eq!(cond(&s, STALE).status, "False");
        assert!(s.sync_time.is_some());
    }

    #[test]
    fn stale_keeps_the_figures() {
        let update = pb::CapacityResponse {
            groups: vec![group("ssd", pb::Policy::Lvm, 10 * GIB, 5 * GIB)],
            generation: 7,
            ..pb::CapacityResponse::default()
        };
        let live = report_status(&update, &[], &[], Some(1));
        let stale = stale_status(live.clone(), "UNAVAILABLE", "connection refused", Some(1));
        assert_eq!(stale.groups, live.groups);
        assert_eq!(stale.capacity, live.capacity);
        assert_eq!(stale.sync_time, live.sync_time);
        let (ready, marked) = (cond(&stale, READY), cond(&stale, STALE));
        assert_eq!(
            (ready.status.as_str(), marked.status.as_str()),
            ("False", "True")
        );
        assert_eq!(marked.reason, "UNAVAILABLE");
        assert_eq!(marked.message, "connection refused");
        // NoDisks is the node's last word and stays.
        assert_eq!(stale.conditions.len(), 3);
        assert_eq!(cond(&stale, NO_DISKS).status, "False");
    }

    #[test]
    fn a_group_without_disks_sets_no_disks() {
        let mut empty = group("typo", pb::Policy::Lvm, 0, 0);
        empty.disks.clear();
        empty.no_disks = "group \"typo\" took no disk: patterns [^/dev/sdx$]".into();
        let update = pb::CapacityResponse {
            groups: vec![group("ssd", pb::Policy::Lvm, 10 * GIB, 5 * GIB), empty],
            generation: 3,
            ..pb::CapacityResponse::default()
        };
        let s = report_status(&update, &[], &[], Some(1));
        let c = cond(&s, NO_DISKS);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "SelectorMatchedNothing")
        );
        assert!(c.message.contains("^/dev/sdx$"), "{}", c.message);
        assert_eq!(s.groups[0].no_disks, None);
        assert!(
            s.groups[1]
                .no_disks
                .as_deref()
                .is_some_and(|m| m.contains("typo"))
        );
        // Disks found again: False.
        let update = pb::CapacityResponse {
            groups: vec![group("ssd", pb::Policy::Lvm, 10 * GIB, 5 * GIB)],
            ..pb::CapacityResponse::default()
        };
        let s = report_status(&update, &[], &s.conditions, Some(2));
        assert_eq!(cond(&s, NO_DISKS).status, "False");
    }
}
