//! `LogicVolume` (`carina.storage.io/v1`): one volume on one node, written by
//! the Kubernetes provisioner and fulfilled by the bridge.
//!
//! The spec and the first seven status fields keep the Go original's names
//! and JSON types, so existing objects and tooling read the same; the
//! standard `conditions` and `observedGeneration` are additions.
//!
//! **Whose an object is** ([`LogicVolume::owner`]), the one rule every
//! reader takes a volume's node-local name from: an object of this
//! project names its volume after itself; one Go Carina made
//! (`status.volumeID` is Go's id of the object, `volume-<name>`,
//! `host-<name>` or `thin-<name>`, or Go's
//! [`crate::GO_VOLUME_TYPE_ANNOTATION`] is on it) is Go's until
//! [`crate::ADOPTED_ANNOTATION`] says it was taken over, and then its
//! volume's name is that annotation's value, which must be the object's
//! Go id (so a wrong annotation can point at no other volume).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ADOPTED_ANNOTATION, GO_VOLUME_TYPE_ANNOTATION};

/// What the provisioner asks for: a volume of `size` in `deviceGroup` on
/// `nodeName`. Cluster-scoped; the object's name is the volume's name.
// Each `printcolumn(...)` repeats `type_`/`priority`; clippy takes the
// repeats for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "carina.storage.io",
    version = "v1",
    kind = "LogicVolume",
    plural = "logicvolumes",
    shortname = "lv",
    status = "LogicVolumeStatus",
    derive = "PartialEq",
    doc = "A volume carved from a device group on one node",
    printcolumn(name = "Size", type_ = "string", json_path = ".spec.size"),
    printcolumn(name = "Group", type_ = "string", json_path = ".spec.deviceGroup"),
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Status", type_ = "string", json_path = ".status.status"),
    printcolumn(
        name = "Namespace",
        type_ = "string",
        json_path = ".spec.nameSpace",
        priority = 1
    ),
    printcolumn(name = "PVC", type_ = "string", json_path = ".spec.pvc", priority = 1),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct LogicVolumeSpec {
    /// The node that holds the volume.
    pub node_name: String,
    /// Requested size (Carina writes whole GiB, e.g. `10Gi`).
    #[schemars(schema_with = "crate::schema::quantity_schema")]
    pub size: Quantity,
    /// The device group (disk selector name) to allocate from.
    pub device_group: String,
    /// Name of the PersistentVolumeClaim the volume was made for; empty
    /// when made outside a claim.
    #[serde(default)]
    pub pvc: String,
    /// Namespace of that claim (Carina's spelling `nameSpace`).
    #[serde(default)]
    pub name_space: String,
    /// bcache tiering: the volume of `size` in `deviceGroup` is the backing
    /// volume of a bcache device, cached by a volume in `cache.deviceGroup`.
    /// Absent for a plain volume. Fixed once the volume is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<LogicVolumeCache>,
    /// The volume is filled with a copy of another volume on the same node
    /// (a clone, or a snapshot when `source.snapshot`). Absent for an
    /// empty volume. Fixed once the volume is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<LogicVolumeSource>,
}

/// What a copied `LogicVolume` is filled from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogicVolumeSource {
    /// The name of the source volume on the same node (a `LogicVolume`
    /// name).
    pub volume: String,
    /// The volume is a read-only snapshot of the source.
    #[serde(default)]
    pub snapshot: bool,
}

/// The cache of a tiered `LogicVolume` (Carina's StorageClass parameters
/// `cache-disk-group-name`, `cache-disk-ratio`, `cache-policy`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::kubernetes_integers)]
pub struct LogicVolumeCache {
    /// The device group of the cache volume.
    pub device_group: String,
    /// The cache volume's size, in percent of `spec.size` (1 to 100).
    #[schemars(range(min = 1, max = 100))]
    pub ratio: u32,
    /// The bcache cache mode: `writethrough` (the default), `writeback`,
    /// `writearound` or `none`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub policy: String,
}

impl LogicVolumeSpec {
    /// The name of the backing volume of a tiered volume `name` on its
    /// node; `+` is in no volume name CSI derives, so no other volume has it.
    pub fn backing_volume(name: &str) -> String {
        format!("{name}+data")
    }

    /// The name of the cache volume of a tiered volume `name`.
    pub fn cache_volume(name: &str) -> String {
        format!("{name}+cache")
    }
}

/// What the bridge observed. Every field is optional on the wire, as in
/// the Go original (`omitempty`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::schema::kubernetes_integers)]
pub struct LogicVolumeStatus {
    /// The node-side volume id; set once the volume exists.
    #[serde(rename = "volumeID", default, skip_serializing_if = "Option::is_none")]
    pub volume_id: Option<String>,
    /// gRPC status code of the last node operation (0 or absent: OK).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// Error text of the last failed node operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Size of the volume as created or last resized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::schema::quantity_schema")]
    pub current_size: Option<Quantity>,
    /// `Success` or `Failed`, as Carina writes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Device major number on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_major: Option<u32>,
    /// Device minor number on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_minor: Option<u32>,
    /// Standard conditions, keyed by `type`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "crate::schema::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Where the volume is on its node: the device of a block volume, the
    /// directory of a HOST volume (the PV's `carina.storage.io/path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The node's capacity report that first counts this volume at its
    /// current size: a `NodeStorageResource` whose `nodeIncarnation` is
    /// this one and whose `nodeGeneration` is at least `capacityGeneration`
    /// shows it (the scheduler stops counting it as in flight then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_incarnation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_generation: Option<u64>,
}

/// `status.status` after a successful node operation.
pub const STATUS_SUCCESS: &str = "Success";
/// `status.status` after a failed node operation.
pub const STATUS_FAILED: &str = "Failed";

/// What Go Carina put before the object's name in its volume ids: LVM
/// and RAW volumes, HOST volumes, thin-pool volumes (up to Go v0.10). The
/// same as `carina_csi::legacy::LegacyKind::prefix`; a control-plane test
/// checks that they agree.
pub const GO_ID_PREFIXES: [&str; 3] = ["volume-", "host-", "thin-"];

/// The Go id prefixes a taken-over volume can keep as its node-local name
/// (thin volumes are never taken over).
const ADOPTABLE_PREFIXES: [&str; 2] = ["volume-", "host-"];

/// Whose a `LogicVolume` is, and so what its volume is called on its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// Made by this project: the volume is named after the object.
    Ours { local: String },
    /// Made by Go Carina and taken over: the volume keeps its Go id, its
    /// node-local name.
    TakenOver { local: String },
    /// Made by Go Carina and not taken over: nothing of this project
    /// creates, resizes, deletes or vouches for its volume. `go_id` is
    /// the id Go recorded in `status.volumeID`, if it recorded one.
    Go { go_id: Option<String> },
}

impl Owner {
    /// The volume's node-local name; `None` for a Go volume not taken
    /// over, which this project does not serve.
    pub fn local_name(&self) -> Option<&str> {
        match self {
            Owner::Ours { local } | Owner::TakenOver { local } => Some(local),
            Owner::Go { .. } => None,
        }
    }
}

/// Why the owner of a `LogicVolume` cannot be told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnerError {
    /// The adoption annotation names something other than the object's
    /// own Go id.
    #[error(
        "annotation {annotation} of LogicVolume {object:?} is {value:?}, which is not a Go Carina id of this object (volume-{object} or host-{object})",
        annotation = ADOPTED_ANNOTATION
    )]
    BadAdoption { object: String, value: String },
}

impl LogicVolume {
    /// Whose this object is ([the rule](self)).
    pub fn owner(&self) -> Result<Owner, OwnerError> {
        let object = self.name_any();
        let is_go_id = |id: &str, prefixes: &[&str]| {
            prefixes
                .iter()
                .any(|p| id.strip_prefix(p) == Some(object.as_str()))
        };
        if let Some(value) = self.annotations().get(ADOPTED_ANNOTATION) {
            if !is_go_id(value, &ADOPTABLE_PREFIXES) {
                return Err(OwnerError::BadAdoption {
                    object,
                    value: value.clone(),
                });
            }
            return Ok(Owner::TakenOver {
                local: value.clone(),
            });
        }
        let go_id = self
            .status
            .as_ref()
            .and_then(|s| s.volume_id.as_deref())
            .filter(|id| is_go_id(id, &GO_ID_PREFIXES))
            .map(str::to_string);
        if go_id.is_some() || self.annotations().contains_key(GO_VOLUME_TYPE_ANNOTATION) {
            return Ok(Owner::Go { go_id });
        }
        Ok(Owner::Ours { local: object })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn wire_names_match_carina() {
        let mut lv = LogicVolume::new(
            "pvc-1",
            LogicVolumeSpec {
                source: None,
                node_name: "node-a".into(),
                size: Quantity("10Gi".into()),
                device_group: "carina-vg-ssd".into(),
                pvc: "data".into(),
                name_space: "default".into(),
                cache: None,
            },
        );
        lv.status = Some(LogicVolumeStatus {
            volume_id: Some("volume-pvc-1".into()),
            code: Some(0),
            current_size: Some(Quantity("10Gi".into())),
            status: Some(STATUS_SUCCESS.into()),
            device_major: Some(7),
            device_minor: Some(3),
            ..LogicVolumeStatus::default()
        });
        let v = serde_json::to_value(&lv).expect("serializes");
        assert_eq!(v["apiVersion"], "carina.storage.io/v1");
        assert_eq!(v["kind"], "LogicVolume");
        assert_eq!(
            v["spec"],
            json!({"nodeName": "node-a", "size": "10Gi", "deviceGroup": "carina-vg-ssd",
                   "pvc": "data", "nameSpace": "default"})
        );
        assert_eq!(
            v["status"],
            json!({"volumeID": "volume-pvc-1", "code": 0, "currentSize": "10Gi",
                   "status": "Success", "deviceMajor": 7, "deviceMinor": 3})
        );
    }

    fn named(name: &str) -> LogicVolume {
        LogicVolume::new(
            name,
            LogicVolumeSpec {
                source: None,
                node_name: "n".into(),
                size: Quantity("1Gi".into()),
                device_group: "g".into(),
                pvc: String::new(),
                name_space: String::new(),
                cache: None,
            },
        )
    }

    fn with(
        mut lv: LogicVolume,
        annotations: &[(&str, &str)],
        volume_id: Option<&str>,
    ) -> LogicVolume {
        lv.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        lv.status = volume_id.map(|id| LogicVolumeStatus {
            volume_id: Some(id.into()),
            ..LogicVolumeStatus::default()
        });
        lv
    }

    #[test]
    fn owners_and_node_local_names() {
        let ours = with(named("pvc-1"), &[], Some("pvc-1@n"));
        assert_eq!(
            ours.owner(),
            Ok(Owner::Ours {
                local: "pvc-1".into()
            })
        );
        assert_eq!(
            with(named("pvc-1"), &[], None)
                .owner()
                .expect("owner")
                .local_name(),
            Some("pvc-1"),
            "not made yet: ours"
        );
        for id in ["volume-pvc-1", "host-pvc-1", "thin-pvc-1"] {
            let go = with(named("pvc-1"), &[], Some(id));
            assert_eq!(
                go.owner(),
                Ok(Owner::Go {
                    go_id: Some(id.into())
                }),
                "{id}"
            );
            assert_eq!(go.owner().expect("owner").local_name(), None);
        }
        // Go's id of another object is not Go's id of this one.
        assert!(matches!(
            with(named("pvc-1"), &[], Some("volume-pvc-2")).owner(),
            Ok(Owner::Ours { .. })
        ));
        // Go's annotation alone (a create Go never finished) is Go's.
        let failed = with(named("pvc-1"), &[(GO_VOLUME_TYPE_ANNOTATION, "lvm")], None);
        assert_eq!(failed.owner(), Ok(Owner::Go { go_id: None }));
        for local in ["volume-pvc-1", "host-pvc-1"] {
            let taken = with(
                named("pvc-1"),
                &[
                    (ADOPTED_ANNOTATION, local),
                    (GO_VOLUME_TYPE_ANNOTATION, "lvm"),
                ],
                Some(local),
            );
            assert_eq!(taken.owner().expect("owner").local_name(), Some(local));
            assert!(matches!(taken.owner(), Ok(Owner::TakenOver { .. })));
        }
        // The annotation can name only this object's own Go id.
        for bad in [
            "volume-pvc-2",
            "pvc-1",
            "thin-pvc-1",
            "volume-pvc-1/../x",
            "",
        ] {
            let e = with(
                named("pvc-1"),
                &[(ADOPTED_ANNOTATION, bad)],
                Some("volume-pvc-1"),
            )
            .owner()
            .expect_err(bad);
            assert!(e.to_string().contains(ADOPTED_ANNOTATION), "{e}");
        }
    }

    #[test]
    fn reads_a_carina_object_without_status_or_claim() {
        let lv: LogicVolume = serde_json::from_value(json!({
            "apiVersion": "carina.storage.io/v1",
            "kind": "LogicVolume",
            "metadata": {"name": "v"},
            "spec": {"nodeName": "n", "size": "1Gi", "deviceGroup": "g"},
        }))
        .expect("deserializes");
        assert_eq!(lv.spec.pvc, "");
        assert!(lv.status.is_none());
    }
}
