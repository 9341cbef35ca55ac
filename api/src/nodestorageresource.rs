//! `NodeStorageResource` (`carina.storage.io/v1beta1`): one per node (named
//! after it), its status written by the capacity publisher from the node's
//! `WatchCapacity` stream and read by the scheduler extender.
//!
//! `capacity`, `allocatable`, `vgGroups` and `disks` keep the Go original's
//! names and meaning, so Carina's tooling reads them; `groups` carries the
//! exact byte figures the node reports, which the scheduler uses.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The node this record describes.
// Each `printcolumn(...)` repeats `type_`/`priority`; clippy takes the
// repeats for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "carina.storage.io",
    version = "v1beta1",
    kind = "NodeStorageResource",
    plural = "nodestorageresources",
    shortname = "nsr",
    status = "NodeStorageResourceStatus",
    derive = "PartialEq",
    doc = "Local storage capacity of one node, per device group",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Synced", type_ = "date", json_path = ".status.syncTime"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeStorageResourceSpec {
    /// The node's name (also the object's name).
    #[serde(default)]
    pub node_name: String,
}

/// The node's storage as last reported.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::kubernetes_integers)]
pub struct NodeStorageResourceStatus {
    /// When the node's report was last written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_time: Option<Time>,
    /// Total size per group, keyed `carina.storage.io/<group>` (RAW groups
    /// also per disk, `carina.storage.io/<group>/<disk>`), in whole GiB as
    /// Carina writes them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::quantity_map_schema")]
    pub capacity: BTreeMap<String, Quantity>,
    /// What can still be allocated, keyed and counted like `capacity`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "crate::schema::quantity_map_schema")]
    pub allocatable: BTreeMap<String, Quantity>,
    /// Exact figures per device group, in bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<DeviceGroupCapacity>,
    /// The node's capacity generation this status reflects; it grows with
    /// every change on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_generation: Option<u64>,
    /// The node's incarnation (chosen at each start of the node) that
    /// `nodeGeneration` counts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_incarnation: Option<String>,
    /// LVM volume groups of the LVM device groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vg_groups: Vec<VgGroup>,
    /// Disks taken by RAW device groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<Disk>,
    /// Standard conditions (e.g. whether the node is reachable), keyed by
    /// `type`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One device group's capacity, in bytes, as the node reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceGroupCapacity {
    /// The group's name (its disk selector's `name`).
    pub name: String,
    /// `LVM`, `RAW` or `HOST`.
    pub policy: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// Kept free, never allocated.
    pub reserve_bytes: u64,
    /// `freeBytes - reserveBytes`, never below zero.
    pub allocatable_bytes: u64,
    /// The largest single volume that can be created now.
    pub largest_allocatable_bytes: u64,
    /// Sizes are rounded up to a multiple of this.
    #[serde(default)]
    pub allocation_unit_bytes: u64,
    /// Volumes in the group.
    #[serde(default)]
    pub volume_count: u32,
    /// For HOST groups, how sizes are enforced (e.g. `project` or `none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<String>,
    /// Disks backing the group (HOST: its root directory).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<String>,
    /// Set while an LVM or RAW group has no disk: its selector, patterns
    /// and every disk the node saw with why it was not taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_disks: Option<String>,
}

/// An LVM volume group, in Carina's shape (sizes in bytes).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VgGroup {
    #[serde(default)]
    pub vg_name: String,
    #[serde(default)]
    pub pv_count: u64,
    #[serde(default)]
    pub lv_count: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vg_attr: String,
    #[serde(default)]
    pub vg_size: u64,
    #[serde(default)]
    pub vg_free: u64,
    /// The volume group's physical volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pvs: Vec<PvInfo>,
}

/// An LVM physical volume, in Carina's shape (sizes in bytes).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PvInfo {
    #[serde(default)]
    pub pv_name: String,
    #[serde(default)]
    pub vg_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pv_fmt: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pv_attr: String,
    #[serde(default)]
    pub pv_size: u64,
    #[serde(default)]
    pub pv_free: u64,
}

/// A disk of a RAW device group: Carina's `name`, `path`, `size` (bytes),
/// `sectorSize` and `read-only`, plus the group that took it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    /// Kernel name (`sdb`).
    #[serde(default)]
    pub name: String,
    /// Device path (`/dev/sdb`).
    #[serde(default)]
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Logical sector size in bytes, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sector_size: Option<u32>,
    #[serde(default, rename = "read-only", skip_serializing_if = "is_false")]
    pub read_only: bool,
    /// The device group that took the disk.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub device_group: String,
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wire_names_match_carina() {
        let mut nsr = NodeStorageResource::new(
            "node-a",
            NodeStorageResourceSpec {
                node_name: "node-a".into(),
            },
        );
        nsr.status = Some(NodeStorageResourceStatus {
            capacity: [("carina.storage.io/ssd".to_string(), Quantity("100".into()))].into(),
            allocatable: [("carina.storage.io/ssd".to_string(), Quantity("90".into()))].into(),
            vg_groups: vec![VgGroup {
                vg_name: "ssd".into(),
                pv_count: 1,
                vg_size: 1 << 30,
                pvs: vec![PvInfo {
                    pv_name: "/dev/loop3".into(),
                    vg_name: "ssd".into(),
                    ..PvInfo::default()
                }],
                ..VgGroup::default()
            }],
            disks: vec![Disk {
                name: "sdb".into(),
                size: 1 << 30,
                read_only: true,
                ..Disk::default()
            }],
            ..NodeStorageResourceStatus::default()
        });
        let v = serde_json::to_value(&nsr).expect("serializes");
        assert_eq!(v["apiVersion"], "carina.storage.io/v1beta1");
        assert_eq!(v["spec"], json!({"nodeName": "node-a"}));
        let s = &v["status"];
        assert_eq!(s["capacity"]["carina.storage.io/ssd"], "100");
        assert_eq!(s["allocatable"]["carina.storage.io/ssd"], "90");
        assert_eq!(s["vgGroups"][0]["vgName"], "ssd");
        assert_eq!(s["vgGroups"][0]["pvCount"], 1);
        assert_eq!(s["vgGroups"][0]["pvs"][0]["pvName"], "/dev/loop3");
        assert_eq!(s["disks"][0]["read-only"], true);
        assert_eq!(s["disks"][0]["size"], 1 << 30);
    }
}
