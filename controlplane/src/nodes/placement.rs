//! Where a new volume goes: pure functions over the nodes' capacities, so
//! the rules are tested without a node.
//!
//! 1. **Group.** With `carina.storage.io/disk-group-name` the volume goes
//!    into that group. Without it, each node offers the first group in its
//!    own order (its configuration's) whose policy suits the request and
//!    that has room. Policies that suit, by the one rule the scheduler
//!    extender reads too ([`carina_api::policy::suits`]):
//!    `exclusively-raw-disk` → RAW only; block access or a part of a
//!    bcache device → LVM or RAW; a mount → LVM, RAW or HOST; a policy
//!    Carina does not know → none.
//! 2. **Room.** The size is the request's capacity range rounded to the
//!    group's allocation unit ([`carina_csi::sizes::allocation`]); a group
//!    fits when its `largest_allocatable_bytes` holds that size.
//! 3. **Accessibility.** Only nodes matching one of the `requisite`
//!    topologies (all nodes when there are none). The `preferred`
//!    topologies come first, in their order; within each, and for the
//!    remaining nodes, the strategy orders.
//! 4. **Tiering.** A bcache class (`backend-disk-group-name`) places its
//!    backing volume like a named group (LVM or RAW only), sized for the
//!    capacity range plus the bcache data offset
//!    ([`carina_csi::sizes::bcache_backing`]), and a node fits only if its
//!    `cache-disk-group-name` group (LVM or RAW) also has room for the
//!    cache volume, `cache-disk-ratio` percent of the backing volume.
//! 5. **Strategy.** `binpack`: the fitting node with the least allocatable
//!    bytes in the chosen group first; `spreadout`: the most first. Ties
//!    keep the node list's order.

use carina_api::policy::{self, BcachePart, Needs, Unsuitable};
use carina_csi::params::{BACKEND_GROUP, BcacheParams, CACHE_GROUP, DISK_GROUP, EXCLUSIVE};
use carina_csi::strategy::Strategy;
use carina_csi::{CsiError, VolumeRequest, sizes};
use carina_proto::nodestorage::{GroupCapacity, Policy};

use super::spec::NodeSpec;

/// One node and the capacity of its groups, in the node's order.
#[derive(Debug, Clone)]
pub struct NodeCapacity<'a> {
    pub node: &'a NodeSpec,
    pub groups: Vec<GroupCapacity>,
}

/// A place for the volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node: String,
    pub group: String,
    /// The size to create, rounded to the group's unit.
    pub size_bytes: u64,
    /// The group's allocatable bytes before the volume (the strategy's key).
    pub allocatable_bytes: u64,
}

/// What the volume `req` asks for needs of its group (for a tiered
/// volume, its backing volume's group).
fn needs(req: &VolumeRequest) -> Needs {
    Needs {
        whole_disk: req.parameters.exclusive,
        block: req.block,
        bcache: req.parameters.bcache.as_ref().map(|_| BcachePart::Backing),
    }
}

/// Why a group of `policy` cannot hold the volume `req` asks for (for a
/// tiered volume, its backing volume), by the one policy rule
/// ([`carina_api::policy::suits`], which the scheduler extender reads
/// too).
fn unsuitable(req: &VolumeRequest, policy: Policy) -> Option<Unsuitable> {
    policy::suits(crate::policy::name(policy), needs(req)).err()
}

/// Whether a group of `policy` can hold the volume `req` asks for (for
/// a tiered volume, its backing volume).
pub fn policy_suits(req: &VolumeRequest, policy: Policy) -> bool {
    unsuitable(req, policy).is_none()
}

/// Why a group of `policy` cannot hold a bcache cache volume, if it
/// cannot.
fn cache_unsuitable(policy: Policy) -> Option<Unsuitable> {
    let cache = Needs {
        bcache: Some(BcachePart::Cache),
        ..Needs::default()
    };
    policy::suits(crate::policy::name(policy), cache).err()
}

/// The request field to blame for `why`; `group_key` is the parameter
/// naming the group.
fn field_of(why: &Unsuitable, group_key: &str) -> String {
    match why {
        Unsuitable::UnknownPolicy(_) => format!("parameters[{group_key:?}]"),
        Unsuitable::WholeDisk => format!("parameters[{EXCLUSIVE:?}]"),
        Unsuitable::BcacheBacking => format!("parameters[{BACKEND_GROUP:?}]"),
        Unsuitable::BcacheCache => format!("parameters[{CACHE_GROUP:?}]"),
        Unsuitable::Block => "volume_capabilities".to_string(),
    }
}

/// The places the volume can go, best first. Errors: `INVALID_ARGUMENT`
/// when no node has a suitable group at all (an unknown group name, a
/// policy that cannot serve the request); `OUT_OF_RANGE` when no suitable
/// group's unit fits the capacity range; `RESOURCE_EXHAUSTED` when no
/// accessible node has room.
pub fn rank(
    req: &VolumeRequest,
    nodes: &[NodeCapacity<'_>],
    strategy: Strategy,
) -> Result<Vec<Placement>, CsiError> {
    let bcache = req.parameters.bcache.as_ref();
    let (wanted, group_key) = match bcache {
        Some(b) => (Some(b.backend_group.as_str()), BACKEND_GROUP),
        None => (req.parameters.group.as_deref(), DISK_GROUP),
    };
    let named = |g: &GroupCapacity| wanted.is_none_or(|w| g.device_group == w);
    let suits = |g: &GroupCapacity| named(g) && unsuitable(req, g.policy()).is_none();
    let all_groups = || nodes.iter().flat_map(|n| n.groups.iter());
    if let Some(w) = wanted
        && !all_groups().any(named)
    {
        return Err(CsiError::invalid(
            format!("parameters[{group_key:?}]"),
            format!("no node has a device group {w:?}"),
        ));
    }
    if let Some(b) = bcache {
        check_cache_group(b, all_groups())?;
    }
    let range = match bcache {
        Some(_) => sizes::bcache_backing(&req.capacity),
        None => req.capacity,
    };
    if !all_groups().any(suits) {
        // The first group that could have taken it says why not (every
        // group does: none suits).
        let (field, why) = match all_groups()
            .filter(|g| named(g))
            .find_map(|g| unsuitable(req, g.policy()))
        {
            Some(why) => (field_of(&why, group_key), why.to_string()),
            None => (
                format!("parameters[{group_key:?}]"),
                "no node has any device group".to_string(),
            ),
        };
        let which = match wanted {
            Some(w) => format!("group {w:?} does not suit: {why}"),
            None => format!("no node has a suitable group: {why}"),
        };
        return Err(CsiError::invalid(field, which));
    }

    let accessible = |n: &NodeSpec| {
        req.accessibility.requisite.is_empty()
            || req.accessibility.requisite.iter().any(|t| n.matches(t))
    };
    let mut out_of_range: Option<CsiError> = None;
    let mut any_size = false;
    let mut fitting: Vec<(usize, Placement)> = Vec::new();
    for (i, n) in nodes.iter().enumerate().filter(|(_, n)| accessible(n.node)) {
        for g in n.groups.iter().filter(|g| suits(g)) {
            let size = match sizes::allocation(&range, g.allocation_unit_bytes) {
                Ok(s) => s,
                Err(e) => {
                    out_of_range.get_or_insert(e);
                    continue;
                }
            };
            any_size = true;
            let cache_fits = bcache.is_none_or(|b| cache_fits(b, g, size, &n.groups));
            if g.largest_allocatable_bytes >= size && cache_fits {
                fitting.push((
                    i,
                    Placement {
                        node: n.node.name.clone(),
                        group: g.device_group.clone(),
                        size_bytes: size,
                        allocatable_bytes: g.allocatable_bytes,
                    },
                ));
                break;
            }
        }
    }
    if fitting.is_empty() {
        if let (false, Some(e)) = (any_size, out_of_range) {
            return Err(e);
        }
        let group = match bcache {
            Some(b) => format!(
                "group {:?} with a {}% cache in group {:?}",
                b.backend_group, b.cache_ratio, b.cache_group
            ),
            None => wanted.map_or_else(
                || "any suitable group".to_string(),
                |w| format!("group {w:?}"),
            ),
        };
        let scope = if req.accessibility.requisite.is_empty() {
            "no node"
        } else {
            "no node in the accessible topology"
        };
        return Err(CsiError::ResourceExhausted(format!(
            "{scope} has room for {} bytes in {group}",
            req.capacity.required_bytes.max(1)
        )));
    }

    let order = |v: &mut Vec<(usize, Placement)>| match strategy {
        // Stable sorts: ties keep the node list's order.
        Strategy::Binpack => v.sort_by_key(|(i, p)| (p.allocatable_bytes, *i)),
        Strategy::Spreadout => v.sort_by_key(|(i, p)| (std::cmp::Reverse(p.allocatable_bytes), *i)),
    };
    let mut ranked = Vec::with_capacity(fitting.len());
    for t in &req.accessibility.preferred {
        let (mut these, rest): (Vec<_>, Vec<_>) = fitting
            .into_iter()
            .partition(|(i, _)| nodes[*i].node.matches(t));
        order(&mut these);
        ranked.extend(these);
        fitting = rest;
    }
    order(&mut fitting);
    ranked.extend(fitting);
    Ok(ranked.into_iter().map(|(_, p)| p).collect())
}

/// `INVALID_ARGUMENT` naming the cache group parameter when no node has
/// the class's cache group, or it cannot hold a cache volume.
fn check_cache_group<'a>(
    b: &BcacheParams,
    groups: impl Iterator<Item = &'a GroupCapacity> + Clone,
) -> Result<(), CsiError> {
    let field = || format!("parameters[{CACHE_GROUP:?}]");
    let named = |g: &&GroupCapacity| g.device_group == b.cache_group;
    if !groups.clone().any(|g| named(&g)) {
        return Err(CsiError::invalid(
            field(),
            format!("no node has a device group {:?}", b.cache_group),
        ));
    }
    // When none suits, the first says why.
    let mut reasons = groups
        .filter(|g| named(g))
        .map(|g| cache_unsuitable(g.policy()));
    if let Some(why) = reasons.next().flatten()
        && reasons.all(|r| r.is_some())
    {
        return Err(CsiError::invalid(
            field(),
            format!("group {:?} does not suit: {why}", b.cache_group),
        ));
    }
    Ok(())
}

/// Whether the node whose groups are `groups` has room for the cache
/// volume of a backing volume of `size` bytes in `backing`. One group may
/// hold both: then it needs room for the two together.
fn cache_fits(
    b: &BcacheParams,
    backing: &GroupCapacity,
    size: u64,
    groups: &[GroupCapacity],
) -> bool {
    let Some(cache) = groups
        .iter()
        .find(|g| g.device_group == b.cache_group && cache_unsuitable(g.policy()).is_none())
    else {
        return false;
    };
    let wanted = carina_csi::CapacityRange {
        required_bytes: b.cache_bytes(size),
        limit_bytes: 0,
    };
    let Ok(cache_size) = sizes::allocation(&wanted, cache.allocation_unit_bytes) else {
        return false;
    };
    if cache.device_group == backing.device_group {
        return cache.allocatable_bytes >= size.saturating_add(cache_size);
    }
    cache.largest_allocatable_bytes >= cache_size
}

#[cfg(test)]
mod tests {
    use super::*;
    use carina_csi::params::Parameters;
    use carina_csi::{Accessibility, CapacityRange, TOPOLOGY_KEY, Topology};

    const MIB: u64 = 1 << 20;

    fn node(name: &str) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            endpoint: format!("{name}:7443"),
            topology: Topology::from([(TOPOLOGY_KEY.to_string(), name.to_string())]),
        }
    }

    fn group(name: &str, policy: Policy, allocatable: u64) -> GroupCapacity {
        GroupCapacity {
            device_group: name.into(),
            policy: policy as i32,
            allocatable_bytes: allocatable,
            largest_allocatable_bytes: allocatable,
            allocation_unit_bytes: 4 * MIB,
            ..Default::default()
        }
    }

    fn request(required: u64) -> VolumeRequest {
        VolumeRequest {
            name: "v".into(),
            local_name: "v".into(),
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

    fn on(t: &str) -> Topology {
        Topology::from([(TOPOLOGY_KEY.to_string(), t.to_string())])
    }

    fn names(r: &[Placement]) -> Vec<&str> {
        r.iter().map(|p| p.node.as_str()).collect()
    }

    /// Each node with one LVM group "g" of `mib` MiB allocatable.
    fn one_lvm_group_each<const N: usize>(
        specs: &[NodeSpec; N],
        mib: [u64; N],
    ) -> [NodeCapacity<'_>; N] {
        std::array::from_fn(|i| NodeCapacity {
            node: &specs[i],
            groups: vec![group("g", Policy::Lvm, mib[i] * MIB)],
        })
    }

    fn tiered(required: u64, ratio: u8) -> VolumeRequest {
        let mut r = request(required);
        r.parameters.bcache = Some(BcacheParams {
            backend_group: "hdd".into(),
            cache_group: "ssd".into(),
            cache_ratio: ratio,
            cache_policy: "writethrough".into(),
        });
        r
    }

    #[test]
    fn tiered_volumes_need_room_for_backing_and_cache() {
        let specs = [node("a"), node("b"), node("c")];
        let nodes = [
            // Room for the backing volume, not for its cache (64 MiB, the
            // smallest cache).
            NodeCapacity {
                node: &specs[0],
                groups: vec![
                    group("hdd", Policy::Lvm, 500 * MIB),
                    group("ssd", Policy::Lvm, 60 * MIB),
                ],
            },
            NodeCapacity {
                node: &specs[1],
                groups: vec![
                    group("hdd", Policy::Lvm, 200 * MIB),
                    group("ssd", Policy::Raw, 100 * MIB),
                ],
            },
            // No cache group at all.
            NodeCapacity {
                node: &specs[2],
                groups: vec![group("hdd", Policy::Lvm, 900 * MIB)],
            },
        ];
        let ranked = rank(&tiered(100 * MIB, 50), &nodes, Strategy::Spreadout).expect("fits");
        assert_eq!(names(&ranked), ["b"]);
        // 100 MiB usable + the 8 KiB data offset, in 4 MiB units.
        assert_eq!(ranked[0].size_bytes, 104 * MIB);
        assert_eq!(ranked[0].group, "hdd");
        let full = rank(&tiered(100 * MIB, 100), &nodes, Strategy::Spreadout).expect_err("full");
        assert!(
            matches!(full, CsiError::ResourceExhausted(ref m) if m.contains("cache")),
            "{full}"
        );
    }

    #[test]
    fn tiered_volumes_name_the_group_parameter_that_cannot_serve() {
        let specs = [node("a")];
        let with = |groups: Vec<GroupCapacity>| {
            [NodeCapacity {
                node: &specs[0],
                groups,
            }]
        };
        let field_of = |e: CsiError| match e {
            CsiError::InvalidArgument { field, reason } => format!("{field}: {reason}"),
            other => panic!("{other:?}"),
        };
        let nodes = with(vec![group("hdd", Policy::Lvm, 500 * MIB)]);
        let e = rank(&tiered(MIB, 10), &nodes, Strategy::Binpack).expect_err("no cache group");
        assert!(field_of(e).starts_with(&format!("parameters[{CACHE_GROUP:?}]: no node")));
        let nodes = with(vec![
            group("hdd", Policy::Lvm, 500 * MIB),
            group("ssd", Policy::Host, 500 * MIB),
        ]);
        let e = rank(&tiered(MIB, 10), &nodes, Strategy::Binpack).expect_err("HOST cache");
        assert!(field_of(e).contains("needs an LVM or RAW group"));
        let nodes = with(vec![
            group("hdd", Policy::Host, 500 * MIB),
            group("ssd", Policy::Lvm, 500 * MIB),
        ]);
        let e = rank(&tiered(MIB, 10), &nodes, Strategy::Binpack).expect_err("HOST backing");
        assert!(field_of(e).starts_with(&format!("parameters[{BACKEND_GROUP:?}]")));
        // One group may hold both volumes when it has room for the two:
        // 204 MiB of backing and a cache of 102, in 4 MiB units 104.
        let mut both = tiered(200 * MIB, 50);
        if let Some(b) = both.parameters.bcache.as_mut() {
            b.cache_group = "hdd".into();
        }
        let nodes = with(vec![group("hdd", Policy::Lvm, 300 * MIB)]);
        assert!(
            rank(&both, &nodes, Strategy::Binpack).is_err(),
            "204 + 104 MiB > 300"
        );
        let nodes = with(vec![group("hdd", Policy::Lvm, 308 * MIB)]);
        assert_eq!(
            names(&rank(&both, &nodes, Strategy::Binpack).expect("fits")),
            ["a"]
        );
    }

    /// The one policy rule decides, with its reason: a group whose policy
    /// no one knows holds nothing (the old text blamed block access for a
    /// mount), and HOST groups hold no part of a bcache device.
    #[test]
    fn unsuitable_groups_are_refused_for_the_policy_rule_s_reason() {
        let specs = [node("a")];
        let with = |groups: Vec<GroupCapacity>| {
            [NodeCapacity {
                node: &specs[0],
                groups,
            }]
        };
        let reason = |e: CsiError| match e {
            CsiError::InvalidArgument { field, reason } => format!("{field}: {reason}"),
            other => panic!("{other:?}"),
        };
        let unknown = with(vec![group("g", Policy::Unspecified, 500 * MIB)]);
        let e = rank(&request(MIB), &unknown, Strategy::Binpack).expect_err("unknown policy");
        assert_eq!(
            reason(e),
            format!(
                "parameters[{DISK_GROUP:?}]: no node has a suitable group: \
                 policy \"UNSPECIFIED\" is not one Carina knows (LVM, RAW or HOST)"
            )
        );
        let mut named = request(MIB);
        named.parameters.group = Some("g".into());
        let e = rank(&named, &unknown, Strategy::Binpack).expect_err("unknown policy");
        assert!(
            reason(e).ends_with("group \"g\" does not suit: policy \"UNSPECIFIED\" is not one Carina knows (LVM, RAW or HOST)"),
        );
        let host_backing = with(vec![
            group("hdd", Policy::Host, 500 * MIB),
            group("ssd", Policy::Lvm, 500 * MIB),
        ]);
        let e = rank(&tiered(MIB, 10), &host_backing, Strategy::Binpack).expect_err("HOST");
        assert_eq!(
            reason(e),
            format!(
                "parameters[{BACKEND_GROUP:?}]: group \"hdd\" does not suit: \
                 a bcache backing volume needs an LVM or RAW group (a block device)"
            )
        );
    }

    #[test]
    fn strategies() {
        let specs = [node("a"), node("b"), node("c")];
        let nodes = one_lvm_group_each(&specs, [100, 300, 200]);
        let spread = rank(&request(50 * MIB), &nodes, Strategy::Spreadout).expect("fits");
        assert_eq!(names(&spread), ["b", "c", "a"]);
        let pack = rank(&request(50 * MIB), &nodes, Strategy::Binpack).expect("fits");
        assert_eq!(names(&pack), ["a", "c", "b"]);
        // a cannot hold 150 MiB: binpack takes the next fullest that fits.
        let pack = rank(&request(150 * MIB), &nodes, Strategy::Binpack).expect("fits");
        assert_eq!(names(&pack), ["c", "b"]);
        assert_eq!(pack[0].size_bytes, 152 * MIB, "rounded to the 4 MiB unit");
        let none = rank(&request(400 * MIB), &nodes, Strategy::Binpack).expect_err("full");
        assert!(matches!(none, CsiError::ResourceExhausted(_)), "{none}");
    }

    #[test]
    fn accessibility() {
        let specs = [node("a"), node("b"), node("c")];
        let nodes = one_lvm_group_each(&specs, [100, 300, 200]);
        let mut req = request(10 * MIB);
        req.accessibility.requisite = vec![on("a"), on("c")];
        assert_eq!(
            names(&rank(&req, &nodes, Strategy::Spreadout).expect("ok")),
            ["c", "a"]
        );
        req.accessibility.preferred = vec![on("a")];
        assert_eq!(
            names(&rank(&req, &nodes, Strategy::Spreadout).expect("ok")),
            ["a", "c"]
        );
        // A preferred node without room yields to the others.
        req.capacity.required_bytes = 150 * MIB;
        assert_eq!(
            names(&rank(&req, &nodes, Strategy::Spreadout).expect("ok")),
            ["c"]
        );
        req.accessibility.requisite = vec![on("x")];
        let e = rank(&req, &nodes, Strategy::Spreadout).expect_err("nowhere");
        assert!(e.to_string().contains("accessible topology"), "{e}");
    }

    #[test]
    fn groups_and_policies() {
        let (a, b) = (node("a"), node("b"));
        let nodes = [
            NodeCapacity {
                node: &a,
                groups: vec![
                    group("host", Policy::Host, 900 * MIB),
                    group("raw", Policy::Raw, 64 * MIB),
                ],
            },
            NodeCapacity {
                node: &b,
                groups: vec![group("host", Policy::Host, 800 * MIB)],
            },
        ];
        let mount = rank(&request(MIB), &nodes, Strategy::Spreadout).expect("ok");
        assert_eq!(
            (mount[0].node.as_str(), mount[0].group.as_str()),
            ("a", "host")
        );
        let mut block = request(MIB);
        block.block = true;
        let r = rank(&block, &nodes, Strategy::Spreadout).expect("raw fits");
        assert_eq!((names(&r), r[0].group.as_str()), (vec!["a"], "raw"));
        let mut exclusive = request(MIB);
        exclusive.parameters.exclusive = true;
        assert_eq!(
            rank(&exclusive, &nodes, Strategy::Binpack).expect("raw")[0].group,
            "raw"
        );
        exclusive.parameters.group = Some("host".into());
        let e = rank(&exclusive, &nodes, Strategy::Binpack).expect_err("host is no RAW group");
        assert!(e.to_string().contains("exclusively-raw-disk"), "{e}");
        let mut unknown = request(MIB);
        unknown.parameters.group = Some("ssd".into());
        let e = rank(&unknown, &nodes, Strategy::Binpack).expect_err("unknown");
        assert!(matches!(e, CsiError::InvalidArgument { .. }), "{e}");
        // 5..7 MiB holds no multiple of 4 MiB.
        let mut odd = request(5 * MIB);
        odd.capacity.limit_bytes = 7 * MIB;
        let e = rank(&odd, &nodes, Strategy::Binpack).expect_err("no size");
        assert!(matches!(e, CsiError::OutOfRange(_)), "{e}");
    }

    #[test]
    fn strategy_names() {
        assert_eq!("binpack".parse::<Strategy>(), Ok(Strategy::Binpack));
        assert_eq!(Strategy::default().to_string(), "spreadout");
        assert!("random".parse::<Strategy>().is_err());
    }
}
