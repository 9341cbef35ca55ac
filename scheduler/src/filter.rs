//! `/filter`: which nodes can take a pod's Carina volumes.
//!
//! A node passes when
//! 1. the pod's bound claims do not pin it elsewhere, and
//! 2. every new volume fits the node's room ([`crate::room`]) after the
//!    volumes in flight there ([`crate::reservations`]) have been taken
//!    off — except the pod's own claims, which are the request itself.
//!
//! A node without a `NodeStorageResource` (no capacity published yet)
//! cannot take new volumes. Each failing node gets its own reason.

use std::collections::BTreeMap;

use carina_api::NodeStorageResourceStatus;

use crate::request::{PodRequest, Volume};
use crate::room::NodeRoom;
use crate::score::Basis;

/// What one node can do for the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It passes; the basis is what prioritize scores it on.
    Fits(Basis),
    /// It cannot take the pod, for this reason.
    Fails(String),
}

/// Evaluates one node: `status` is its published record (if any),
/// `in_flight` the volumes in flight on it.
pub fn evaluate(
    req: &PodRequest,
    node: &str,
    status: Option<&NodeStorageResourceStatus>,
    in_flight: &[Volume],
) -> Verdict {
    if let Some(pin) = &req.pin
        && pin.node != node
    {
        return Verdict::Fails(format!(
            "claim {} is bound to a volume on node {}",
            pin.claim, pin.node
        ));
    }
    if req.volumes.is_empty() {
        return Verdict::Fits(Basis::Pinned);
    }
    let Some(status) = status else {
        return Verdict::Fails(
            "the node has published no Carina storage (no NodeStorageResource)".to_string(),
        );
    };
    let mut room = NodeRoom::from_status(status);
    for v in in_flight {
        let own = v.claim.as_ref().is_some_and(|c| req.claims.contains(c));
        if !own {
            room.reserve(v);
        }
    }
    let mut used: Vec<usize> = Vec::with_capacity(req.volumes.len());
    for v in &req.volumes {
        match room.place(v) {
            Ok(i) => {
                if !used.contains(&i) {
                    used.push(i);
                }
            }
            Err(short) => return Verdict::Fails(short.0),
        }
    }
    if req.pin.is_some() {
        return Verdict::Fits(Basis::Pinned);
    }
    let free = used
        .iter()
        .map(|i| room.groups[*i].allocatable)
        .fold(0u64, u64::saturating_add);
    Verdict::Fits(Basis::Free(free))
}

/// The verdicts over a list of candidates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Nodes that pass, in the order asked, with their score basis.
    pub passed: Vec<(String, Basis)>,
    /// Nodes that fail, with why.
    pub failed: BTreeMap<String, String>,
}

/// Evaluates every candidate; `status_of` and `in_flight_on` look a node
/// up.
pub fn decide<'n, S>(
    req: &PodRequest,
    candidates: impl IntoIterator<Item = &'n str>,
    status_of: impl Fn(&str) -> Option<S>,
    in_flight_on: impl Fn(&str) -> &'n [Volume],
) -> Decision
where
    S: std::ops::Deref<Target = NodeStorageResourceStatus>,
{
    let mut decision = Decision::default();
    for node in candidates {
        let status = if req.volumes.is_empty() {
            None
        } else {
            status_of(node)
        };
        match evaluate(req, node, status.as_deref(), in_flight_on(node)) {
            Verdict::Fits(basis) => decision.passed.push((node.to_string(), basis)),
            Verdict::Fails(reason) => {
                decision.failed.insert(node.to_string(), reason);
            }
        }
    }
    decision
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{ClaimKey, Pin, sort_for_placement};
    use crate::testing::*;
    use carina_api::{DeviceGroupCapacity, Disk};
    use carina_csi::CapacityRange;

    const GIB: u64 = 1 << 30;

    fn vol(claim: &str, group: Option<&str>, gib: u64) -> Volume {
        Volume {
            claim: Some(ClaimKey::new("ns", claim)),
            group: group.map(str::to_string),
            range: CapacityRange {
                required_bytes: gib * GIB,
                limit_bytes: 0,
            },
            exclusive: false,
            block: false,
            bcache: None,
        }
    }

    fn whole(claim: &str, gib: u64) -> Volume {
        Volume {
            exclusive: true,
            ..vol(claim, Some("raw"), gib)
        }
    }

    fn request(mut volumes: Vec<Volume>, pin: Option<&str>) -> PodRequest {
        sort_for_placement(&mut volumes);
        let mut claims: Vec<ClaimKey> = volumes.iter().filter_map(|v| v.claim.clone()).collect();
        claims.push(ClaimKey::new("ns", "bound"));
        PodRequest {
            volumes,
            pin: pin.map(|n| Pin {
                node: n.into(),
                claim: ClaimKey::new("ns", "bound"),
            }),
            claims,
            awaiting_node: Vec::new(),
        }
    }

    fn status(groups: Vec<DeviceGroupCapacity>) -> NodeStorageResourceStatus {
        NodeStorageResourceStatus {
            groups,
            ..NodeStorageResourceStatus::default()
        }
    }

    fn raw_status(disks_gib: &[u64]) -> NodeStorageResourceStatus {
        let area = |g: u64| g * GIB - (2 << 20);
        let total: u64 = disks_gib.iter().map(|g| area(*g)).sum();
        let mut g = lvm_group("raw", total);
        g.policy = "RAW".into();
        g.allocation_unit_bytes = 1 << 20;
        NodeStorageResourceStatus {
            groups: vec![g],
            disks: disks_gib
                .iter()
                .enumerate()
                .map(|(i, g)| Disk {
                    name: format!("d{i}"),
                    size: g * GIB,
                    device_group: "raw".into(),
                    ..Disk::default()
                })
                .collect(),
            ..NodeStorageResourceStatus::default()
        }
    }

    /// The table: (case, request, node status, in flight, expected).
    #[test]
    fn filter_cases() {
        let ssd100 = status(vec![lvm_group("ssd", 100 * GIB)]);
        let two = status(vec![lvm_group("ssd", 10 * GIB), lvm_group("hdd", 50 * GIB)]);
        let zero = status(vec![lvm_group("ssd", 0)]);
        let raw = raw_status(&[10, 20]);
        let fits = |free: u64| Ok(Basis::Free(free));
        type Case<'a> = (
            &'a str,
            PodRequest,
            Option<&'a NodeStorageResourceStatus>,
            Vec<Volume>,
            Result<Basis, &'a str>,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                "fits",
                request(vec![vol("a", Some("ssd"), 10)], None),
                Some(&ssd100),
                vec![],
                fits(90 * GIB),
            ),
            (
                "does not fit",
                request(vec![vol("a", Some("ssd"), 101)], None),
                Some(&ssd100),
                vec![],
                Err("has 100.0 GiB allocatable, claim ns/a needs 101.0 GiB"),
            ),
            (
                "exactly fits",
                request(vec![vol("a", Some("ssd"), 100)], None),
                Some(&ssd100),
                vec![],
                fits(0),
            ),
            (
                "in flight takes room",
                request(vec![vol("a", Some("ssd"), 60)], None),
                Some(&ssd100),
                vec![vol("other", Some("ssd"), 50)],
                Err("has 50.0 GiB allocatable after 50.0 GiB in flight"),
            ),
            (
                "own claim in flight is the request itself",
                request(vec![vol("a", Some("ssd"), 60)], None),
                Some(&ssd100),
                vec![vol("a", Some("ssd"), 60)],
                fits(40 * GIB),
            ),
            (
                "pinned here",
                request(vec![], Some("node")),
                None,
                vec![],
                Ok(Basis::Pinned),
            ),
            (
                "pinned here with a new volume that fits",
                request(vec![vol("a", Some("ssd"), 1)], Some("node")),
                Some(&ssd100),
                vec![],
                Ok(Basis::Pinned),
            ),
            (
                "pinned elsewhere",
                request(vec![vol("a", Some("ssd"), 1)], Some("other-node")),
                Some(&ssd100),
                vec![],
                Err("claim ns/bound is bound to a volume on node other-node"),
            ),
            (
                "several groups fit",
                request(
                    vec![vol("a", Some("ssd"), 10), vol("b", Some("hdd"), 20)],
                    None,
                ),
                Some(&two),
                vec![],
                fits(30 * GIB),
            ),
            (
                "several groups, one short",
                request(
                    vec![vol("a", Some("ssd"), 11), vol("b", Some("hdd"), 20)],
                    None,
                ),
                Some(&two),
                vec![],
                Err("device group \"ssd\" has 10.0 GiB allocatable, claim ns/a needs 11.0 GiB"),
            ),
            (
                "two volumes in one group add up",
                request(
                    vec![vol("a", Some("hdd"), 30), vol("b", Some("hdd"), 30)],
                    None,
                ),
                Some(&two),
                vec![],
                Err("has 20.0 GiB allocatable, claim ns/b needs 30.0 GiB"),
            ),
            (
                "zero allocatable",
                request(vec![vol("a", Some("ssd"), 1)], None),
                Some(&zero),
                vec![],
                Err("has 0 B allocatable"),
            ),
            (
                "no record",
                request(vec![vol("a", Some("ssd"), 1)], None),
                None,
                vec![],
                Err("no NodeStorageResource"),
            ),
            (
                "RAW exclusive takes the smallest disk that holds it",
                request(vec![whole("a", 10), whole("b", 5)], None),
                Some(&raw),
                vec![],
                fits(0),
            ),
            (
                "RAW exclusive: no second disk",
                request(vec![whole("a", 15), whole("b", 15)], None),
                Some(&raw),
                vec![],
                Err("no untouched disk of 15.0 GiB for claim ns/b"),
            ),
            (
                "RAW exclusive in flight holds its disk",
                request(vec![whole("a", 15)], None),
                Some(&raw),
                vec![whole("other", 12)],
                Err("no untouched disk"),
            ),
            (
                "RAW shared beside exclusive",
                request(vec![whole("a", 15), vol("b", Some("raw"), 9)], None),
                Some(&raw),
                vec![],
                fits(10 * GIB - (2 << 20) - 9 * GIB),
            ),
        ];
        for (name, req, status, in_flight, want) in cases {
            let got = evaluate(&req, "node", status, &in_flight);
            match (want, got) {
                (Ok(b), Verdict::Fits(g)) => assert_eq!(b, g, "{name}"),
                (Err(part), Verdict::Fails(reason)) => {
                    assert!(reason.contains(part), "{name}: {reason:?} lacks {part:?}")
                }
                (want, got) => panic!("{name}: want {want:?}, got {got:?}"),
            }
        }
    }

    /// Groups the provisioner's placement refuses fail the node, for the
    /// reason the one policy rule gives: the backing or the cache group
    /// of a bcache class that is HOST (directories, not block devices),
    /// and a group whose policy no one knows. The filter passed all three
    /// before, sending the pod to a node its volume cannot be made on.
    #[test]
    fn groups_the_policy_rule_refuses_fail_the_node() {
        use crate::request::{Collected, collect};
        use carina_csi::DRIVER_NAME;
        use carina_csi::params::{BACKEND_GROUP, CACHE_GROUP, CACHE_RATIO};

        let objects = objects();
        let tiered = |backing: &'static str, cache: &'static str| {
            [
                (BACKEND_GROUP, backing),
                (CACHE_GROUP, cache),
                (CACHE_RATIO, "10"),
            ]
        };
        objects.insert_class(class("host-backing", DRIVER_NAME, &tiered("dirs", "ssd")));
        objects.insert_class(class("host-cache", DRIVER_NAME, &tiered("ssd", "dirs")));
        objects.insert_class(group_class("zfs", "zfs"));
        let policy = |name: &str, policy: &str| {
            let mut g = lvm_group(name, 100 * GIB);
            g.policy = policy.into();
            g
        };
        let node = status(vec![
            policy("dirs", "HOST"),
            policy("ssd", "LVM"),
            policy("zfs", "ZFS"),
        ]);
        let cases = [
            (
                "host-backing",
                "device group \"dirs\" is HOST: a bcache backing volume needs an LVM or RAW group",
            ),
            (
                "host-cache",
                "device group \"dirs\" is HOST: a bcache cache volume needs an LVM or RAW group",
            ),
            (
                "zfs",
                "policy \"ZFS\" is not one Carina knows (LVM, RAW or HOST)",
            ),
        ];
        for (class_name, why) in cases {
            objects.insert_claim(claim("ns", class_name, Some(class_name), "1Gi"));
            let Collected::Request(req) = collect(&pod("ns", "p", &[class_name]), &objects) else {
                panic!("{class_name}: not a Carina request");
            };
            match evaluate(&req, "node", Some(&node), &[]) {
                Verdict::Fails(reason) => {
                    assert!(
                        reason.contains(why),
                        "{class_name}: {reason:?} lacks {why:?}"
                    )
                }
                other => panic!("{class_name}: the node passed: {other:?}"),
            }
        }
        // The same class over LVM groups passes.
        objects.insert_class(class("lvm", DRIVER_NAME, &tiered("ssd", "ssd")));
        objects.insert_claim(claim("ns", "lvm", Some("lvm"), "1Gi"));
        let Collected::Request(req) = collect(&pod("ns", "p", &["lvm"]), &objects) else {
            panic!("not a Carina request");
        };
        assert!(matches!(
            evaluate(&req, "node", Some(&node), &[]),
            Verdict::Fits(_)
        ));
    }

    #[test]
    fn decide_splits_passing_and_failing_nodes() {
        let big = status(vec![lvm_group("ssd", 100 * GIB)]);
        let small = status(vec![lvm_group("ssd", 5 * GIB)]);
        let req = request(vec![vol("a", Some("ssd"), 10)], None);
        let flight = [vol("x", Some("ssd"), 95)];
        let d = decide(
            &req,
            ["big", "small", "busy", "bare"],
            |n| match n {
                "big" | "busy" => Some(&big),
                "small" => Some(&small),
                _ => None,
            },
            |n| if n == "busy" { &flight[..] } else { &[] },
        );
        assert_eq!(d.passed, [("big".to_string(), Basis::Free(90 * GIB))]);
        let failed: Vec<_> = d.failed.keys().map(String::as_str).collect();
        assert_eq!(failed, ["bare", "busy", "small"]);
    }
}
