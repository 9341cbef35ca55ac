//! What a pod asks of Carina: its claims whose volumes Carina makes.
//!
//! A claim is Carina's when it is bound to a volume of the CSI driver
//! `carina.storage.io`, or, unbound, when its StorageClass's provisioner
//! is `carina.storage.io`.
//!
//! - An **unbound** claim asks for a new volume: its size range
//!   (`resources.requests.storage` .. `resources.limits.storage`), its
//!   device group (the class parameter `carina.storage.io/disk-group-name`;
//!   none: the node picks its first suitable group), whole-disk
//!   (`carina.storage.io/exclusively-raw-disk`) and block access
//!   (`volumeMode: Block`). A bcache class (`backend-disk-group-name`,
//!   `cache-disk-group-name`, `cache-disk-ratio`) asks for the volume in
//!   the backend group and `ratio`% of it in the cache group.
//! - A **bound** claim pins the pod to its volume's node: the PV's volume
//!   attribute `carina.storage.io/node`, else a node-affinity term that
//!   names one node (`topology.carina.storage.io/node` or
//!   `kubernetes.io/hostname`). Claims pinned to two different nodes make
//!   the pod unschedulable.
//!
//! Class parameters are validated with the CSI driver's own rules
//! ([`carina_csi::params::Parameters`]), so the extender refuses exactly
//! what provisioning would refuse.

use std::collections::HashMap;
use std::fmt;

use carina_api::policy::BcachePart;
use carina_api::quantity::quantity_bytes;
use carina_csi::params::Parameters;
use carina_csi::{CapacityRange, DRIVER_NAME, TOPOLOGY_KEY, context, sizes};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::extender::Pod;
use crate::objects::Objects;

/// Annotation kube-scheduler puts on a `WaitForFirstConsumer` claim when
/// it picks the node.
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";

/// The pre-`storageClassName` way of naming a claim's class.
const BETA_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

/// The well-known hostname label, also used in node affinity.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// `namespace/name` of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimKey {
    pub namespace: String,
    pub name: String,
}

impl ClaimKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ClaimKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    pub fn of(pvc: &PersistentVolumeClaim) -> Self {
        ClaimKey::new(
            pvc.metadata.namespace.clone().unwrap_or_default(),
            pvc.metadata.name.clone().unwrap_or_default(),
        )
    }
}

impl fmt::Display for ClaimKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One volume to place on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    /// The claim it is for (`None` for a `LogicVolume` made outside one).
    pub claim: Option<ClaimKey>,
    /// The device group; `None`: the node's first suitable group.
    pub group: Option<String>,
    pub range: CapacityRange,
    /// A whole RAW disk.
    pub exclusive: bool,
    /// Raw block access (no HOST group).
    pub block: bool,
    /// A part of a bcache device (no HOST group either).
    pub bcache: Option<BcachePart>,
}

impl Volume {
    /// The size that orders volumes (largest placed first): the required
    /// size, or what an empty range gets.
    pub fn nominal_bytes(&self) -> u64 {
        sizes::allocation(&self.range, 1).unwrap_or(self.range.required_bytes)
    }

    /// Who asks, for reasons: `claim ns/name` or `a volume`.
    pub fn who(&self) -> String {
        match &self.claim {
            Some(c) => format!("claim {c}"),
            None => "a volume".to_string(),
        }
    }
}

/// Placement order: volumes naming a group before those that let the
/// node choose, whole disks first, then largest first (first-fit
/// decreasing); the claim breaks ties so the order is stable.
pub fn sort_for_placement(volumes: &mut [Volume]) {
    volumes.sort_by(|a, b| {
        (
            a.group.is_none(),
            !a.exclusive,
            std::cmp::Reverse(a.nominal_bytes()),
            &a.claim,
        )
            .cmp(&(
                b.group.is_none(),
                !b.exclusive,
                std::cmp::Reverse(b.nominal_bytes()),
                &b.claim,
            ))
    });
}

/// The node a bound claim's volume lives on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub node: String,
    pub claim: ClaimKey,
}

/// A pod's Carina claims.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodRequest {
    /// New volumes, in placement order ([`sort_for_placement`]).
    pub volumes: Vec<Volume>,
    /// The node the bound claims pin the pod to.
    pub pin: Option<Pin>,
    /// Every Carina claim of the pod (its own reservations are not
    /// counted against it).
    pub claims: Vec<ClaimKey>,
    /// Unbound claims with no node picked yet, with their
    /// `resourceVersion`: when the pod passes, kube-scheduler will write
    /// the chosen node on them.
    pub awaiting_node: Vec<(ClaimKey, Option<String>)>,
}

/// What collecting a pod's claims found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Collected {
    /// No Carina claim: every node passes, none is preferred.
    NotCarina,
    Request(PodRequest),
    /// No node can take the pod, for this reason.
    Unschedulable(String),
    /// An object the answer depends on is not in the cache (yet); the
    /// scheduler should ask again.
    Unknown(String),
}

/// The claims of `pod` that Carina serves, read from `objects`.
pub fn collect(pod: &Pod, objects: &(impl Objects + ?Sized)) -> Collected {
    let namespace = pod.metadata.namespace.as_str();
    let mut request = PodRequest::default();
    let mut seen: Vec<String> = Vec::new();
    for claim_name in pod.claim_names() {
        if seen.iter().any(|s| *s == claim_name) {
            continue;
        }
        seen.push(claim_name.to_string());
        let key = ClaimKey::new(namespace, claim_name.as_ref());
        let Some(pvc) = objects.claim(namespace, &claim_name) else {
            return Collected::Unknown(format!("claim {key} is not in the extender's cache yet"));
        };
        match claim_kind(&pvc, objects) {
            Ok(ClaimKind::Other) => {}
            Ok(ClaimKind::Bound(pv)) => {
                request.claims.push(key.clone());
                let Some(node) = volume_node(&pv) else {
                    continue;
                };
                match &request.pin {
                    Some(pin) if pin.node != node => {
                        return Collected::Unschedulable(format!(
                            "claims {} and {key} are bound to volumes on different nodes ({} and {node})",
                            pin.claim, pin.node
                        ));
                    }
                    Some(_) => {}
                    None => request.pin = Some(Pin { node, claim: key }),
                }
            }
            Ok(ClaimKind::Unbound(class)) => {
                match claim_volumes(&pvc, &class) {
                    Ok(vs) => request.volumes.extend(vs),
                    Err(reason) => return Collected::Unschedulable(reason),
                }
                if selected_node(&pvc).is_none() {
                    request
                        .awaiting_node
                        .push((key.clone(), pvc.metadata.resource_version.clone()));
                }
                request.claims.push(key);
            }
            Err(unknown) => return Collected::Unknown(unknown),
        }
    }
    if request.claims.is_empty() {
        return Collected::NotCarina;
    }
    sort_for_placement(&mut request.volumes);
    Collected::Request(request)
}

/// How a claim relates to Carina.
#[derive(Debug, Clone)]
pub enum ClaimKind {
    /// Not Carina's.
    Other,
    /// Bound to a Carina volume.
    Bound(std::sync::Arc<PersistentVolume>),
    /// Unbound, of a Carina class.
    Unbound(std::sync::Arc<StorageClass>),
}

/// Classifies `pvc`; `Err` names an object missing from the cache.
pub fn claim_kind(
    pvc: &PersistentVolumeClaim,
    objects: &(impl Objects + ?Sized),
) -> Result<ClaimKind, String> {
    let key = ClaimKey::of(pvc);
    let spec = pvc.spec.as_ref();
    if let Some(pv_name) = spec
        .and_then(|s| s.volume_name.as_deref())
        .filter(|n| !n.is_empty())
    {
        let Some(pv) = objects.volume(pv_name) else {
            return Err(format!(
                "volume {pv_name} of claim {key} is not in the extender's cache yet"
            ));
        };
        let ours = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .is_some_and(|c| c.driver == DRIVER_NAME);
        return Ok(if ours {
            ClaimKind::Bound(pv)
        } else {
            ClaimKind::Other
        });
    }
    let Some(class_name) = class_name(pvc) else {
        return Ok(ClaimKind::Other);
    };
    let Some(class) = objects.storage_class(class_name) else {
        return Err(format!(
            "StorageClass {class_name} of claim {key} is not in the extender's cache yet"
        ));
    };
    Ok(if class.provisioner == DRIVER_NAME {
        ClaimKind::Unbound(class)
    } else {
        ClaimKind::Other
    })
}

/// The claim's StorageClass name, from `spec.storageClassName` or the
/// beta annotation; an empty name means no class.
pub fn class_name(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .or_else(|| {
            pvc.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(BETA_CLASS_ANNOTATION))
                .map(String::as_str)
        })
        .filter(|n| !n.is_empty())
}

/// The node kube-scheduler picked for the claim, if any.
pub fn selected_node(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(SELECTED_NODE_ANNOTATION))
        .map(String::as_str)
        .filter(|n| !n.is_empty())
}

/// The volumes an unbound claim of `class` asks for. `Err` is a reason no
/// node can serve it (bad class parameters, a malformed size).
pub fn claim_volumes(
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<Vec<Volume>, String> {
    let key = ClaimKey::of(pvc);
    let raw: HashMap<String, String> = class
        .parameters
        .as_ref()
        .map(|p| p.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    let params = Parameters::parse(&raw).map_err(|e| {
        format!(
            "StorageClass {} of claim {key} is invalid: {e}",
            class.metadata.name.as_deref().unwrap_or_default()
        )
    })?;
    let spec = pvc.spec.as_ref();
    let size = |which: &str| -> Result<u64, String> {
        let resources = spec.and_then(|s| s.resources.as_ref());
        let map = match which {
            "requests" => resources.and_then(|r| r.requests.as_ref()),
            _ => resources.and_then(|r| r.limits.as_ref()),
        };
        match map.and_then(|m| m.get("storage")) {
            None => Ok(0),
            Some(q) => quantity_bytes(q).map_err(|_| {
                format!(
                    "claim {key}: resources.{which}.storage {:?} is not a size",
                    q.0
                )
            }),
        }
    };
    let range = CapacityRange {
        required_bytes: size("requests")?,
        limit_bytes: size("limits")?,
    };
    if range.limit_bytes > 0 && range.required_bytes > range.limit_bytes {
        return Err(format!(
            "claim {key}: resources.requests.storage exceeds resources.limits.storage"
        ));
    }
    let block = spec.and_then(|s| s.volume_mode.as_deref()) == Some("Block");
    let volume = |group: Option<String>, range: CapacityRange, bcache| Volume {
        claim: Some(key.clone()),
        group,
        range,
        exclusive: params.exclusive,
        block,
        bcache,
    };
    Ok(match &params.bcache {
        Some(b) => {
            let backing = sizes::bcache_backing(&range);
            let nominal = sizes::allocation(&backing, 1).unwrap_or(backing.required_bytes);
            vec![
                volume(
                    Some(b.backend_group.clone()),
                    backing,
                    Some(BcachePart::Backing),
                ),
                volume(
                    Some(b.cache_group.clone()),
                    CapacityRange {
                        required_bytes: b.cache_bytes(nominal),
                        limit_bytes: 0,
                    },
                    Some(BcachePart::Cache),
                ),
            ]
        }
        None => vec![volume(params.group.clone(), range, None)],
    })
}

/// The node a Carina volume lives on: its `carina.storage.io/node`
/// attribute, else the one node its node affinity requires.
pub fn volume_node(pv: &PersistentVolume) -> Option<String> {
    let spec = pv.spec.as_ref()?;
    if let Some(node) = spec
        .csi
        .as_ref()
        .and_then(|c| c.volume_attributes.as_ref())
        .and_then(|a| a.get(context::NODE))
        .filter(|n| !n.is_empty())
    {
        return Some(node.clone());
    }
    let terms = &spec
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms;
    let mut found: Option<&String> = None;
    for term in terms {
        let named =
            term.match_expressions.iter().flatten().find(|e| {
                (e.key == TOPOLOGY_KEY || e.key == HOSTNAME_LABEL) && e.operator == "In"
            })?;
        match named.values.as_deref() {
            Some([one]) if found.is_none_or(|f| f == one) => found = Some(one),
            _ => return None,
        }
    }
    found.cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    #[test]
    fn pod_without_carina_claims() {
        let objects = objects();
        objects.insert_class(class("other", "example.com/csi", &[]));
        objects.insert_claim(claim("ns", "a", Some("other"), "1Gi"));
        objects.insert_claim(claim("ns", "b", None, "1Gi"));
        assert_eq!(
            collect(&pod("ns", "p", &[]), &objects),
            Collected::NotCarina
        );
        assert_eq!(
            collect(&pod("ns", "p", &["a", "b"]), &objects),
            Collected::NotCarina
        );
    }

    #[test]
    fn unbound_claims_ask_for_volumes_in_placement_order() {
        let objects = objects();
        objects.insert_class(group_class("ssd", "ssd"));
        objects.insert_class(class("any", DRIVER_NAME, &[]));
        objects.insert_class(class(
            "disk",
            DRIVER_NAME,
            &[
                ("carina.storage.io/disk-group-name", "raw"),
                ("carina.storage.io/exclusively-raw-disk", "true"),
            ],
        ));
        objects.insert_claim(claim("ns", "small", Some("ssd"), "1Gi"));
        objects.insert_claim(claim("ns", "big", Some("ssd"), "5Gi"));
        objects.insert_claim(claim("ns", "free", Some("any"), "9Gi"));
        objects.insert_claim(claim("ns", "whole", Some("disk"), "2Gi"));
        let Collected::Request(r) = collect(
            &pod("ns", "p", &["small", "free", "big", "whole", "small"]),
            &objects,
        ) else {
            panic!("a request")
        };
        let order: Vec<_> = r
            .volumes
            .iter()
            .map(|v| v.claim.as_ref().map(|c| c.name.as_str()))
            .collect();
        assert_eq!(
            order,
            [Some("whole"), Some("big"), Some("small"), Some("free")]
        );
        assert_eq!(r.volumes[0].group.as_deref(), Some("raw"));
        assert!(r.volumes[0].exclusive);
        assert_eq!(r.volumes[3].group, None);
        assert_eq!(r.claims.len(), 4);
        assert_eq!(r.awaiting_node.len(), 4);
        assert_eq!(r.pin, None);
    }

    #[test]
    fn bound_claims_pin_and_conflicting_pins_refuse() {
        let objects = objects();
        objects.insert_class(group_class("ssd", "ssd"));
        objects.insert_claim(bound_claim("ns", "a", "pv-a"));
        objects.insert_claim(bound_claim("ns", "b", "pv-b"));
        objects.insert_claim(bound_claim("ns", "c", "pv-c"));
        objects.insert_volume(carina_pv("pv-a", Some("node-1"), None));
        objects.insert_volume(carina_pv("pv-b", None, Some("node-1")));
        objects.insert_volume(carina_pv("pv-c", Some("node-2"), None));
        let Collected::Request(r) = collect(&pod("ns", "p", &["a", "b"]), &objects) else {
            panic!("a request")
        };
        assert_eq!(r.pin.as_ref().map(|p| p.node.as_str()), Some("node-1"));
        assert!(r.volumes.is_empty());
        match collect(&pod("ns", "p", &["a", "c"]), &objects) {
            Collected::Unschedulable(reason) => {
                assert!(reason.contains("ns/a and ns/c"), "{reason}");
                assert!(reason.contains("node-1 and node-2"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn missing_objects_are_unknown_and_bad_classes_unschedulable() {
        let objects = objects();
        assert!(matches!(
            collect(&pod("ns", "p", &["nope"]), &objects),
            Collected::Unknown(_)
        ));
        objects.insert_claim(claim("ns", "a", Some("later"), "1Gi"));
        assert!(matches!(
            collect(&pod("ns", "p", &["a"]), &objects),
            Collected::Unknown(_)
        ));
        objects.insert_class(class(
            "later",
            DRIVER_NAME,
            // A known key with a bad value (an unknown key is accepted, as
            // Go Carina accepted it).
            &[("carina.storage.io/exclusively-raw-disk", "maybe")],
        ));
        match collect(&pod("ns", "p", &["a"]), &objects) {
            Collected::Unschedulable(reason) => {
                assert!(reason.contains("exclusively-raw-disk"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        objects.insert_claim(claim("ns", "a", Some("good"), "lots"));
        objects.insert_class(class("good", DRIVER_NAME, &[]));
        match collect(&pod("ns", "p", &["a"]), &objects) {
            Collected::Unschedulable(reason) => assert!(reason.contains("\"lots\""), "{reason}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bcache_classes_ask_in_both_groups() {
        let objects = objects();
        objects.insert_class(class(
            "tiered",
            DRIVER_NAME,
            &[
                ("carina.storage.io/backend-disk-group-name", "hdd"),
                ("carina.storage.io/cache-disk-group-name", "ssd"),
                ("carina.storage.io/cache-disk-ratio", "50"),
            ],
        ));
        objects.insert_claim(claim("ns", "t", Some("tiered"), "10Gi"));
        let Collected::Request(r) = collect(&pod("ns", "p", &["t"]), &objects) else {
            panic!("a request")
        };
        let groups: Vec<_> = r
            .volumes
            .iter()
            .map(|v| (v.group.as_deref(), v.range.required_bytes))
            .collect();
        // The backing volume holds the bcache data offset too; the cache
        // is its share of that.
        let backing = (10 << 30) + carina_csi::params::BCACHE_DATA_OFFSET;
        assert_eq!(
            groups,
            [(Some("hdd"), backing), (Some("ssd"), backing.div_ceil(2))]
        );
    }
}
