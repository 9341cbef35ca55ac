//! Builders for the unit tests' objects.

use std::collections::BTreeMap;

use carina_api::{
    DeviceGroupCapacity, LogicVolume, LogicVolumeSpec, NodeStorageResource,
    NodeStorageResourceSpec, NodeStorageResourceStatus,
};
use carina_csi::DRIVER_NAME;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, Pod as KubePod, PodSpec, Volume,
    VolumeNodeAffinity, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::extender::{ClaimSource, Pod, PodMeta, PodSpec as SlimSpec, PodVolume};
use crate::objects::MemoryObjects;
use crate::request::SELECTED_NODE_ANNOTATION;

pub fn objects() -> MemoryObjects {
    MemoryObjects::new()
}

pub fn quantity_of(s: &str) -> Quantity {
    Quantity(s.into())
}

/// A time `secs` seconds after an arbitrary origin.
pub fn time(secs: i64) -> Time {
    Time(
        k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + secs).expect("a valid timestamp"),
    )
}

fn meta(namespace: Option<&str>, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(str::to_string),
        resource_version: Some("1".into()),
        ..ObjectMeta::default()
    }
}

pub fn class(name: &str, provisioner: &str, params: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        metadata: meta(None, name),
        provisioner: provisioner.into(),
        parameters: Some(
            params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        ..StorageClass::default()
    }
}

/// Carina's class `name`, whose volumes go to device group `group`.
pub fn group_class(name: &str, group: &str) -> StorageClass {
    class(
        name,
        DRIVER_NAME,
        &[("carina.storage.io/disk-group-name", group)],
    )
}

/// Objects with two classes: Carina's `ssd` (group `ssd`) and another
/// driver's `other`.
pub fn ssd_and_other_classes() -> MemoryObjects {
    let objects = objects();
    objects.insert_class(group_class("ssd", "ssd"));
    objects.insert_class(class("other", "example.com/csi", &[]));
    objects
}

pub fn claim(
    namespace: &str,
    name: &str,
    class: Option<&str>,
    size: &str,
) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: meta(Some(namespace), name),
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: class.map(str::to_string),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_string(), quantity_of(size))])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

pub fn bound_claim(namespace: &str, name: &str, volume: &str) -> PersistentVolumeClaim {
    let mut c = claim(namespace, name, Some("ssd"), "1Gi");
    if let Some(s) = c.spec.as_mut() {
        s.volume_name = Some(volume.into());
    }
    c
}

pub fn selected(mut c: PersistentVolumeClaim, node: &str) -> PersistentVolumeClaim {
    c.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(SELECTED_NODE_ANNOTATION.into(), node.into());
    c
}

/// A Carina volume naming its node in its attributes, in its node
/// affinity, or both.
pub fn carina_pv(name: &str, attribute: Option<&str>, affinity: Option<&str>) -> PersistentVolume {
    PersistentVolume {
        metadata: meta(None, name),
        spec: Some(PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER_NAME.into(),
                volume_handle: name.into(),
                volume_attributes: attribute.map(|n| {
                    BTreeMap::from([("carina.storage.io/node".to_string(), n.to_string())])
                }),
                ..CSIPersistentVolumeSource::default()
            }),
            node_affinity: affinity.map(|n| VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "topology.carina.storage.io/node".into(),
                            operator: "In".into(),
                            values: Some(vec![n.into()]),
                        }]),
                        ..NodeSelectorTerm::default()
                    }],
                }),
            }),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    }
}

/// The pod as the extender receives it.
pub fn pod(namespace: &str, name: &str, claims: &[&str]) -> Pod {
    Pod {
        metadata: PodMeta {
            name: name.into(),
            namespace: namespace.into(),
            uid: format!("uid-{name}"),
        },
        spec: SlimSpec {
            volumes: claims
                .iter()
                .map(|c| PodVolume {
                    name: format!("v-{c}"),
                    persistent_volume_claim: Some(ClaimSource {
                        claim_name: c.to_string(),
                    }),
                    ephemeral: None,
                })
                .collect(),
            node_name: None,
        },
    }
}

/// A pod object on `node` using `claims`.
pub fn bound_pod(namespace: &str, name: &str, node: &str, claims: &[&str]) -> KubePod {
    KubePod {
        metadata: meta(Some(namespace), name),
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            volumes: Some(
                claims
                    .iter()
                    .map(|c| Volume {
                        name: format!("v-{c}"),
                        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                            claim_name: c.to_string(),
                            read_only: None,
                        }),
                        ..Volume::default()
                    })
                    .collect(),
            ),
            ..PodSpec::default()
        }),
        ..KubePod::default()
    }
}

/// An LVM group with `allocatable` bytes free, no reserve, 4 MiB extents.
pub fn lvm_group(name: &str, allocatable: u64) -> DeviceGroupCapacity {
    DeviceGroupCapacity {
        name: name.into(),
        policy: "LVM".into(),
        total_bytes: allocatable,
        free_bytes: allocatable,
        reserve_bytes: 0,
        allocatable_bytes: allocatable,
        largest_allocatable_bytes: allocatable,
        allocation_unit_bytes: 4 << 20,
        ..DeviceGroupCapacity::default()
    }
}

pub fn nsr_synced(node: &str, groups: Vec<DeviceGroupCapacity>, sync: i64) -> NodeStorageResource {
    let mut n = NodeStorageResource::new(
        node,
        NodeStorageResourceSpec {
            node_name: node.into(),
        },
    );
    n.status = Some(NodeStorageResourceStatus {
        sync_time: Some(time(sync)),
        groups,
        ..NodeStorageResourceStatus::default()
    });
    n
}

pub fn nsr(node: &str, groups: Vec<DeviceGroupCapacity>) -> NodeStorageResource {
    nsr_synced(node, groups, 0)
}

/// A `LogicVolume` not made yet (no status), outside any claim.
pub fn lv(name: &str, node: &str, group: &str, size: &str) -> LogicVolume {
    LogicVolume::new(
        name,
        LogicVolumeSpec {
            source: None,
            node_name: node.into(),
            size: quantity_of(size),
            device_group: group.into(),
            pvc: String::new(),
            name_space: String::new(),
            cache: None,
        },
    )
}
