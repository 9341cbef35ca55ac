//! Test fixtures shared by the provisioner's unit tests: a request, a
//! topology segment on a node, and a `LogicVolume` with a uid.

use carina_api::{LogicVolume, LogicVolumeSpec};
use carina_csi::params::Parameters;
use carina_csi::{Accessibility, CapacityRange, TOPOLOGY_KEY, Topology, VolumeRequest};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

pub(super) const MIB: u64 = 1 << 20;

/// A filesystem request for `pvc-1` of at least `required` bytes.
pub(super) fn request(required: u64) -> VolumeRequest {
    VolumeRequest {
        name: "pvc-1".into(),
        local_name: "pvc-1".into(),
        capacity: CapacityRange {
            required_bytes: required,
            limit_bytes: 0,
        },
        parameters: Parameters::default(),
        accessibility: Accessibility::default(),
        block: false,
        source: None,
    }
}

/// The topology segment of `node`.
pub(super) fn on(node: &str) -> Topology {
    Topology::from([(TOPOLOGY_KEY.to_string(), node.to_string())])
}

/// The object `pvc-1` (uid `u1`) of `size` bytes in `group` on `node`.
pub(super) fn lv(node: &str, group: &str, size: u64) -> LogicVolume {
    let mut lv = LogicVolume::new(
        "pvc-1",
        LogicVolumeSpec {
            source: None,
            node_name: node.into(),
            size: Quantity(size.to_string()),
            device_group: group.into(),
            pvc: String::new(),
            name_space: String::new(),
            cache: None,
        },
    );
    lv.metadata.uid = Some("u1".into());
    lv
}
