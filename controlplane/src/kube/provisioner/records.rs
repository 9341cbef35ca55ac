//! Reading the published `NodeStorageResource` records: which node a record
//! describes, whether the capacity publisher marked it stale, a node's
//! group by name ([`group_of`]) and every published group with its node
//! ([`groups`]), a node and its groups in the form
//! [`crate::nodes::placement`] reads, and policy names both ways. Pure
//! functions; no API calls here.

use carina_api::{DeviceGroupCapacity, NodeStorageResource};
use carina_csi::{TOPOLOGY_KEY, Topology};
use carina_proto::nodestorage as pb;
use kube::ResourceExt;

use crate::nodes::spec::NodeSpec;

/// True if the capacity publisher marked the record stale (its node is
/// unreachable).
pub(super) fn is_stale(nsr: &NodeStorageResource) -> bool {
    nsr.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == crate::kube::capacity::STALE && c.status == "True")
    })
}

/// The node a `NodeStorageResource` describes.
pub(super) fn nsr_node(nsr: &NodeStorageResource) -> String {
    if nsr.spec.node_name.is_empty() {
        nsr.name_any()
    } else {
        nsr.spec.node_name.clone()
    }
}

/// The group `group` of the node `nsr` describes, if it published it.
pub(super) fn group_of<'a>(
    nsr: &'a NodeStorageResource,
    group: &str,
) -> Option<&'a DeviceGroupCapacity> {
    nsr.status
        .as_ref()
        .and_then(|s| s.groups.iter().find(|g| g.name == group))
}

/// Every published group among `nsrs`, with the node that published it.
pub(super) fn groups<'a>(
    nsrs: impl IntoIterator<Item = &'a NodeStorageResource>,
) -> impl Iterator<Item = (String, &'a DeviceGroupCapacity)> {
    nsrs.into_iter().flat_map(|nsr| {
        let node = nsr_node(nsr);
        nsr.status
            .iter()
            .flat_map(|s| s.groups.iter())
            .map(move |g| (node.clone(), g))
    })
}

/// A node as placement sees it. Placement reads only the name and the
/// topology; the endpoint is the bridge's business and stays empty.
pub(super) fn node_spec(name: &str) -> NodeSpec {
    NodeSpec {
        name: name.to_string(),
        endpoint: String::new(),
        topology: Topology::from([(TOPOLOGY_KEY.to_string(), name.to_string())]),
    }
}

/// A published group in the form placement reads.
pub(super) fn group_capacity(g: &DeviceGroupCapacity) -> pb::GroupCapacity {
    pb::GroupCapacity {
        device_group: g.name.clone(),
        policy: crate::policy::from_name(&g.policy) as i32,
        total_bytes: g.total_bytes,
        free_bytes: g.free_bytes,
        reserve_bytes: g.reserve_bytes,
        allocatable_bytes: g.allocatable_bytes,
        largest_allocatable_bytes: g.largest_allocatable_bytes,
        allocation_unit_bytes: g.allocation_unit_bytes,
        volume_count: g.volume_count,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_records_are_recognised() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let condition = |type_: &str, status: &str| Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "Test".into(),
            message: String::new(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        };
        let mut nsr = NodeStorageResource::new("n", Default::default());
        assert!(!is_stale(&nsr), "no status: not stale");
        nsr.status = Some(carina_api::NodeStorageResourceStatus {
            conditions: vec![condition("Ready", "True"), condition("Stale", "False")],
            ..Default::default()
        });
        assert!(!is_stale(&nsr));
        nsr.status = Some(carina_api::NodeStorageResourceStatus {
            conditions: vec![condition("Stale", "True")],
            ..Default::default()
        });
        assert!(is_stale(&nsr));
    }
}
