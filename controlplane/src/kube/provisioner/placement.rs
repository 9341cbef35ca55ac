//! Placement from the published capacity records: where a new volume goes
//! (node, group, size, and the group's policy when known), ranked by
//! [`crate::nodes::placement::rank`] over the `NodeStorageResource` figures
//! less the volumes asked for but not yet made; a pinned node that has not
//! published yet; whether the provisioner's cache may answer alone
//! ([`settled`]). A pure decision over the records read (from the cache
//! or, through `reads`, the API server): no API calls here.

use std::sync::Arc;

use carina_api::{LogicVolume, NodeStorageResource};
use carina_csi::strategy::Strategy;
use carina_csi::{CsiError, TOPOLOGY_KEY, VolumeRequest, sizes};
use carina_proto::nodestorage as pb;

use super::cache::Records;
use super::outcome::bytes;
use super::records::{group_capacity, is_stale, node_spec, nsr_node};
use crate::nodes::placement::{self, NodeCapacity};
use crate::nodes::spec::NodeSpec;

/// The unit sizes are rounded to when the node's allocation unit is not
/// published (the node rounds further to its own unit).
pub const FALLBACK_UNIT: u64 = 1 << 20;

/// Where a new volume goes among `records`: node, group, size, and the
/// group's policy when known.
pub(super) fn place(
    records: &Records,
    strategy: Strategy,
    req: &VolumeRequest,
) -> Result<Target, CsiError> {
    let pinned = pinned_node(req);
    let nsrs = records.nsrs.iter().map(Arc::as_ref);
    let lvs = records.lvs.iter().map(Arc::as_ref);
    // A node the capacity publisher cannot reach (Stale) is no choice
    // for a new volume; a volume pinned to it (its pod is there) still
    // goes there, and the bridge retries until the node is back.
    let nodes = if pinned.is_some() {
        capacities(nsrs, lvs, |_| true)
    } else {
        capacities(nsrs, lvs, |nsr| !is_stale(nsr))
    };
    choose(req, pinned, &nodes, strategy)
}

/// Whether `target`, chosen among `records` from a cache, stands without
/// asking the API server: it is on a node whose capacity the records
/// hold. A refusal does not stand either, nor a pinned node the records do
/// not know (the cache may lag its first publication); the caller asks
/// the API server then.
pub(super) fn settled(target: &Target, records: &Records) -> bool {
    records.nsrs.iter().any(|nsr| {
        nsr_node(nsr) == target.node && nsr.status.as_ref().is_some_and(|s| !s.groups.is_empty())
    })
}

/// The capacity of every node in `nsrs` that published its groups and that
/// `keep` accepts, sorted by node name, with the pending volumes among
/// `lvs` subtracted.
fn capacities<'a>(
    nsrs: impl IntoIterator<Item = &'a NodeStorageResource>,
    lvs: impl IntoIterator<Item = &'a LogicVolume>,
    keep: impl Fn(&NodeStorageResource) -> bool,
) -> Vec<(NodeSpec, Vec<pb::GroupCapacity>)> {
    let mut nodes: Vec<(NodeSpec, Vec<pb::GroupCapacity>)> = nsrs
        .into_iter()
        .filter(|nsr| keep(nsr))
        .filter_map(|nsr| {
            let groups = &nsr.status.as_ref()?.groups;
            (!groups.is_empty()).then(|| {
                (
                    node_spec(&nsr_node(nsr)),
                    groups.iter().map(group_capacity).collect(),
                )
            })
        })
        .collect();
    nodes.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    subtract_pending(&mut nodes, lvs);
    nodes
}

/// The choice among `nodes` for `req`, `pinned` to a node or not.
fn choose(
    req: &VolumeRequest,
    pinned: Option<String>,
    nodes: &[(NodeSpec, Vec<pb::GroupCapacity>)],
    strategy: Strategy,
) -> Result<Target, CsiError> {
    let pinned_published = pinned
        .as_deref()
        .is_some_and(|p| nodes.iter().any(|(n, _)| n.name == p));
    if let Some(node) = pinned.filter(|_| !pinned_published) {
        return unpublished_target(req, node);
    }
    if nodes.is_empty() {
        return Err(CsiError::Unavailable(
            "no node has published its capacity (NodeStorageResource) yet".into(),
        ));
    }
    let views: Vec<NodeCapacity<'_>> = nodes
        .iter()
        .map(|(node, groups)| NodeCapacity {
            node,
            groups: groups.clone(),
        })
        .collect();
    let ranking = ranking_request(req);
    let best = placement::rank(&ranking, &views, strategy)?
        .into_iter()
        .next()
        .ok_or_else(|| CsiError::ResourceExhausted("no node has room".into()))?;
    let policy = nodes
        .iter()
        .find(|(n, _)| n.name == best.node)
        .and_then(|(_, groups)| groups.iter().find(|g| g.device_group == best.group))
        .map(|g| crate::policy::name(g.policy()).to_string());
    Ok(Target {
        node: best.node,
        group: best.group,
        size_bytes: best.size_bytes,
        policy,
    })
}

/// Where a new volume goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
    pub(super) node: String,
    pub(super) group: String,
    pub(super) size_bytes: u64,
    pub(super) policy: Option<String>,
}

/// Takes the volumes asked for but not made yet that still hold room
/// ([`LogicVolume::is_pending`], the rule the scheduler extender reads
/// too: no outcome yet, or one the bridge retries soon) off their group's
/// room, and the cache volume of a tiered one off its cache group's: the
/// published capacity cannot show them yet.
pub(super) fn subtract_pending<'a>(
    nodes: &mut [(NodeSpec, Vec<pb::GroupCapacity>)],
    lvs: impl IntoIterator<Item = &'a LogicVolume>,
) {
    for lv in lvs.into_iter().filter(|lv| lv.is_pending()) {
        let Some(size) = bytes(&lv.spec.size) else {
            continue;
        };
        take(nodes, &lv.spec.node_name, &lv.spec.device_group, size);
        if let Some(cache) = &lv.spec.cache {
            let cache_size = carina_csi::params::cache_bytes(size, cache.ratio);
            take(nodes, &lv.spec.node_name, &cache.device_group, cache_size);
        }
    }
}

/// Takes `size` bytes off `group` of `node` among `nodes`.
fn take(nodes: &mut [(NodeSpec, Vec<pb::GroupCapacity>)], node: &str, group: &str, size: u64) {
    let found = nodes
        .iter_mut()
        .filter(|(n, _)| n.name == node)
        .flat_map(|(_, groups)| groups.iter_mut())
        .find(|g| g.device_group == group);
    if let Some(g) = found {
        g.allocatable_bytes = g.allocatable_bytes.saturating_sub(size);
        g.largest_allocatable_bytes = g.largest_allocatable_bytes.min(g.allocatable_bytes);
    }
}

/// The node a `WaitForFirstConsumer` request is pinned to: that of the
/// first preferred topology, else that of the only requisite one.
pub(super) fn pinned_node(req: &VolumeRequest) -> Option<String> {
    let first = match (
        req.accessibility.preferred.first(),
        req.accessibility.requisite.as_slice(),
    ) {
        (Some(p), _) => p,
        (None, [only]) => only,
        _ => return None,
    };
    first.get(TOPOLOGY_KEY).cloned()
}

/// The request placement ranks: a pinned request may only go to its node.
pub(super) fn ranking_request(req: &VolumeRequest) -> VolumeRequest {
    let mut r = req.clone();
    if let Some(first) = req.accessibility.preferred.first() {
        r.accessibility.requisite = vec![first.clone()];
        r.accessibility.preferred.clear();
    }
    r
}

/// A pinned node that has not published its capacity: it takes the volume
/// when the request names the group; the node checks the room.
pub(super) fn unpublished_target(req: &VolumeRequest, node: String) -> Result<Target, CsiError> {
    if let Some(b) = &req.parameters.bcache {
        return Ok(Target {
            node,
            group: b.backend_group.clone(),
            size_bytes: sizes::allocation(&sizes::bcache_backing(&req.capacity), FALLBACK_UNIT)?,
            policy: None,
        });
    }
    let Some(group) = req.parameters.group.clone() else {
        return Err(CsiError::Unavailable(format!(
            "node {node} has not published its capacity (NodeStorageResource) yet, \
             and without parameters[{:?}] its group cannot be chosen",
            carina_csi::params::DISK_GROUP
        )));
    };
    Ok(Target {
        node,
        group,
        size_bytes: sizes::allocation(&req.capacity, FALLBACK_UNIT)?,
        policy: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::provisioner::fixtures::{MIB, lv, on, request};
    use carina_api::LogicVolumeStatus;
    use tonic::Code;

    #[test]
    fn pinning() {
        let mut r = request(MIB);
        assert_eq!(pinned_node(&r), None);
        r.accessibility.requisite = vec![on("a"), on("b")];
        assert_eq!(pinned_node(&r), None, "several requisite nodes: ranked");
        r.accessibility.preferred = vec![on("b"), on("a")];
        assert_eq!(pinned_node(&r).as_deref(), Some("b"));
        let ranked = ranking_request(&r);
        assert_eq!(ranked.accessibility.requisite, vec![on("b")]);
        assert!(ranked.accessibility.preferred.is_empty());
        r.accessibility.preferred.clear();
        r.accessibility.requisite = vec![on("c")];
        assert_eq!(pinned_node(&r).as_deref(), Some("c"));
        // Unpublished: only with a named group, rounded to 1 MiB.
        let e = unpublished_target(&request(MIB + 1), "c".into()).expect_err("no group");
        assert_eq!(e.code(), Code::Unavailable);
        let mut named = request(MIB + 1);
        named.parameters.group = Some("ssd".into());
        let t = unpublished_target(&named, "c".into()).expect("target");
        assert_eq!(
            (t.node.as_str(), t.group.as_str(), t.size_bytes),
            ("c", "ssd", 2 * MIB)
        );
    }

    #[test]
    fn pending_volumes_take_room() {
        let group = |name: &str, free: u64| pb::GroupCapacity {
            device_group: name.into(),
            policy: pb::Policy::Lvm as i32,
            allocatable_bytes: free,
            largest_allocatable_bytes: free,
            allocation_unit_bytes: 4 * MIB,
            ..Default::default()
        };
        let mut nodes = vec![
            (
                node_spec("a"),
                vec![group("ssd", 100 * MIB), group("hdd", 100 * MIB)],
            ),
            (node_spec("b"), vec![group("ssd", 100 * MIB)]),
        ];
        let pending = lv("a", "ssd", 40 * MIB);
        let mut made = lv("a", "ssd", 30 * MIB);
        made.status = Some(LogicVolumeStatus {
            volume_id: Some("x".into()),
            ..LogicVolumeStatus::default()
        });
        let mut failed = lv("b", "ssd", 30 * MIB);
        failed.status = Some(LogicVolumeStatus {
            code: Some(Code::ResourceExhausted as i32),
            ..LogicVolumeStatus::default()
        });
        subtract_pending(&mut nodes, &[pending.clone(), pending, made, failed]);
        assert_eq!(nodes[0].1[0].allocatable_bytes, 20 * MIB);
        assert_eq!(nodes[0].1[0].largest_allocatable_bytes, 20 * MIB);
        assert_eq!(nodes[0].1[1].allocatable_bytes, 100 * MIB);
        assert_eq!(nodes[1].1[0].allocatable_bytes, 100 * MIB);

        // A tiered volume takes its backing volume off its group and its
        // cache volume off the cache group.
        let mut tiered = lv("a", "hdd", 40 * MIB);
        tiered.spec.cache = Some(carina_api::LogicVolumeCache {
            device_group: "ssd".into(),
            ratio: 25,
            policy: String::new(),
        });
        nodes[0].1[0].allocatable_bytes = 100 * MIB;
        subtract_pending(&mut nodes, &[tiered]);
        assert_eq!(nodes[0].1[1].allocatable_bytes, 60 * MIB);
        // 25% of 40 MiB is less than the smallest cache, 64 MiB.
        assert_eq!(nodes[0].1[0].allocatable_bytes, 36 * MIB);
    }

    /// A volume the bridge still retries holds its room, whatever the
    /// retried code (the placement used to count only volumes without an
    /// answer, so a second volume went to a node the first one fills).
    #[test]
    fn a_volume_the_bridge_still_retries_holds_room() {
        let mut nsr = NodeStorageResource::new("a", Default::default());
        nsr.status = Some(carina_api::NodeStorageResourceStatus {
            groups: vec![carina_api::DeviceGroupCapacity {
                name: "ssd".into(),
                policy: "LVM".into(),
                allocatable_bytes: 100 * MIB,
                largest_allocatable_bytes: 100 * MIB,
                allocation_unit_bytes: 4 * MIB,
                ..Default::default()
            }],
            ..Default::default()
        });
        let mut named = request(60 * MIB);
        named.parameters.group = Some("ssd".into());
        let cases = [
            (Code::Unavailable, false),
            (Code::DeadlineExceeded, false),
            (Code::Aborted, false),
            (Code::Cancelled, false),
            (Code::ResourceExhausted, true),
            (Code::Internal, true),
        ];
        for (code, room_left) in cases {
            let mut held = lv("a", "ssd", 60 * MIB);
            held.status = Some(LogicVolumeStatus {
                code: Some(code as i32),
                ..LogicVolumeStatus::default()
            });
            let records = Records {
                nsrs: vec![Arc::new(nsr.clone())],
                lvs: vec![Arc::new(held)],
            };
            match place(&records, Strategy::default(), &named) {
                Ok(t) => assert!(
                    room_left,
                    "{code:?}: placed on {} over the held room",
                    t.node
                ),
                Err(e) => {
                    assert!(!room_left, "{code:?}: {e}");
                    assert_eq!(e.code(), Code::ResourceExhausted, "{code:?}: {e}");
                }
            }
        }
    }

    #[test]
    fn only_a_placement_on_a_published_node_is_settled() {
        let mut published = NodeStorageResource::new("a", Default::default());
        published.status = Some(carina_api::NodeStorageResourceStatus {
            groups: vec![carina_api::DeviceGroupCapacity {
                name: "ssd".into(),
                policy: "LVM".into(),
                allocatable_bytes: 100 * MIB,
                largest_allocatable_bytes: 100 * MIB,
                allocation_unit_bytes: 4 * MIB,
                ..Default::default()
            }],
            ..Default::default()
        });
        let empty = NodeStorageResource::new("b", Default::default());
        let records = Records {
            nsrs: vec![Arc::new(published), Arc::new(empty)],
            lvs: Vec::new(),
        };
        let mut named = request(MIB);
        named.parameters.group = Some("ssd".into());
        let placed = place(&records, Strategy::default(), &named).expect("placed");
        assert_eq!(placed.node, "a");
        assert!(settled(&placed, &records));
        // Pinned to nodes the records know without groups, or not at all.
        for node in ["b", "c"] {
            named.accessibility.preferred = vec![on(node)];
            let placed = place(&records, Strategy::default(), &named).expect("placed");
            assert_eq!(placed.node, node);
            assert!(!settled(&placed, &records), "{node}");
        }
    }

    #[test]
    fn choice_without_published_capacity() {
        let strategy = Strategy::default();
        let e = choose(&request(MIB), None, &[], strategy).expect_err("no nodes");
        assert_eq!(e.code(), Code::Unavailable);
        let mut named = request(MIB);
        named.parameters.group = Some("ssd".into());
        let t = choose(&named, Some("c".into()), &[], strategy).expect("pinned");
        assert_eq!((t.node.as_str(), t.group.as_str()), ("c", "ssd"));
    }
}
