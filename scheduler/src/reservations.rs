//! Volumes in flight: space a node's `NodeStorageResource` does not show
//! as used yet, but that is promised. The filter takes them off the
//! node's room before placing a pod's volumes, so a burst of pods does
//! not over-commit a node (the Go original's issue #7).
//!
//! A **`LogicVolume`** is in flight on `spec.nodeName` when
//! - it has no `status.volumeID` yet (asked for, not made) and still holds
//!   room ([`LogicVolume::is_pending`], the rule the provisioner's
//!   placement reads too: not being deleted, and no outcome yet or one
//!   the bridge retries soon, `UNAVAILABLE`, `DEADLINE_EXCEEDED`,
//!   `ABORTED`, `CANCELLED`): its `spec.size`;
//! - the node's record does not count it yet: its size. The bridge writes
//!   the node's capacity version of the change (`status.nodeIncarnation`,
//!   `status.capacityGeneration`) and the record carries the version it
//!   shows (`nodeIncarnation`, `nodeGeneration`): of one incarnation, a
//!   record generation at least the volume's counts it. Without both (an
//!   object written before the versions, or a record of another start of
//!   the node) times decide: it was made at or after the record's
//!   `status.syncTime`. "Made" is the `Ready=True` condition's transition
//!   time, else the object's creation; both have whole seconds, so a
//!   volume made in the second of the sync counts as in flight (twice is
//!   safe, missing it is not) until the next report;
//! - its `spec.size` exceeds `status.currentSize` (a resize under way):
//!   the difference.
//!
//! A tiered `LogicVolume` (`spec.cache`) in flight has its cache volume in
//! flight too, in `spec.cache.deviceGroup`: `ratio` percent of its size.
//!
//! A Carina **claim** (class provisioner `carina.storage.io`), unbound and
//! not being deleted, with no `LogicVolume` yet (none names it in
//! `spec.pvc`/`spec.nameSpace`, and none is named `pvc-<claim uid>`, the
//! volume name external-provisioner asks for), is in flight on
//! - the node of its `volume.kubernetes.io/selected-node` annotation,
//!   which kube-scheduler writes right after choosing the node (its
//!   VolumeBinding PreBind), before the provisioner has done anything;
//! - else the `spec.nodeName` of a pod that uses it: a pod bound to a node
//!   without the scheduler (or before the annotation is visible).
//!
//! A bound claim without a `LogicVolume` is taken as reflected: its
//! volume exists and the node counts it. What is still missing — the few
//! milliseconds between kube-scheduler choosing a node and the annotation
//! reaching the cache — is closed by [`crate::settle`].

use std::collections::{HashMap, HashSet};

use carina_api::logicvolume::LogicVolumeStatus;
use carina_api::nodestorageresource::NodeStorageResourceStatus;
use carina_api::policy::BcachePart;
use carina_api::quantity::quantity_bytes;
use carina_api::{EXCLUSIVE_ANNOTATION, LogicVolume};
use carina_csi::CapacityRange;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use crate::objects::Objects;
use crate::request::{self, ClaimKey, ClaimKind, Volume, sort_for_placement};

/// The condition the bridge sets when the volume is made.
const READY: &str = "Ready";

/// The in-flight volumes of every node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reservations {
    by_node: HashMap<String, Vec<Volume>>,
}

impl Reservations {
    /// The volumes in flight on `node`, in placement order.
    pub fn on(&self, node: &str) -> &[Volume] {
        self.by_node.get(node).map_or(&[], Vec::as_slice)
    }

    /// Number of volumes in flight, over all nodes.
    pub fn len(&self) -> usize {
        self.by_node.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_node.values().all(Vec::is_empty)
    }

    /// Everything in flight, read from `objects`.
    pub fn build(objects: &(impl Objects + ?Sized)) -> Reservations {
        let claims = objects.claims();
        // The claim each external-provisioner volume name stands for.
        let mut claim_of_volume: HashMap<String, ClaimKey> = HashMap::new();
        for c in &claims {
            let key = ClaimKey::of(c);
            if let Some(uid) = &c.metadata.uid {
                claim_of_volume.insert(format!("pvc-{uid}"), key.clone());
            }
            if let Some(v) = c.spec.as_ref().and_then(|s| s.volume_name.clone()) {
                claim_of_volume.insert(v, key);
            }
        }

        let mut out = Reservations::default();
        let mut claims_with_lv: HashSet<ClaimKey> = HashSet::new();
        for lv in objects.logic_volumes() {
            let name = lv.name_any();
            let claim = (!lv.spec.pvc.is_empty())
                .then(|| ClaimKey::new(lv.spec.name_space.clone(), lv.spec.pvc.clone()))
                .or_else(|| claim_of_volume.get(&name).cloned());
            if let Some(c) = &claim {
                claims_with_lv.insert(c.clone());
            }
            claims_with_lv.extend(claim_of_volume.get(&name).cloned());
            let record = objects
                .node_storage(&lv.spec.node_name)
                .and_then(|n| n.status.clone())
                .unwrap_or_default();
            if let Some(bytes) = in_flight_bytes(&lv, &record) {
                // A tiered volume's cache volume is in flight with it (a
                // tiered volume never grows, so `bytes` is its whole size).
                if let Some(cache) = &lv.spec.cache {
                    out.add(
                        &lv.spec.node_name,
                        Volume {
                            claim: claim.clone(),
                            group: Some(cache.device_group.clone()),
                            range: CapacityRange {
                                required_bytes: carina_csi::params::cache_bytes(bytes, cache.ratio),
                                limit_bytes: 0,
                            },
                            exclusive: false,
                            block: false,
                            bcache: Some(BcachePart::Cache),
                        },
                    );
                }
                out.add(
                    &lv.spec.node_name,
                    Volume {
                        claim,
                        group: Some(lv.spec.device_group.clone()),
                        range: CapacityRange {
                            required_bytes: bytes,
                            limit_bytes: 0,
                        },
                        exclusive: lv
                            .annotations()
                            .get(EXCLUSIVE_ANNOTATION)
                            .is_some_and(|v| v == "true"),
                        block: false,
                        bcache: lv.spec.cache.as_ref().map(|_| BcachePart::Backing),
                    },
                );
            }
        }

        // Pods already on a node, by the claims they use.
        let mut node_of_claim: HashMap<ClaimKey, String> = HashMap::new();
        for pod in objects.pods() {
            let Some(spec) = pod.spec.as_ref() else {
                continue;
            };
            let Some(node) = spec.node_name.as_ref().filter(|n| !n.is_empty()) else {
                continue;
            };
            let namespace = pod.namespace().unwrap_or_default();
            for v in spec.volumes.iter().flatten() {
                let claim = if let Some(c) = &v.persistent_volume_claim {
                    c.claim_name.clone()
                } else if v.ephemeral.is_some() {
                    format!("{}-{}", pod.name_any(), v.name)
                } else {
                    continue;
                };
                node_of_claim.insert(ClaimKey::new(namespace.clone(), claim), node.clone());
            }
        }

        for pvc in &claims {
            let key = ClaimKey::of(pvc);
            if pvc.metadata.deletion_timestamp.is_some() || claims_with_lv.contains(&key) {
                continue;
            }
            let node = request::selected_node(pvc)
                .map(str::to_string)
                .or_else(|| node_of_claim.get(&key).cloned());
            let Some(node) = node else { continue };
            let Ok(ClaimKind::Unbound(class)) = request::claim_kind(pvc, objects) else {
                continue;
            };
            // A claim no node could serve is not in flight anywhere.
            if let Ok(volumes) = request::claim_volumes(pvc, &class) {
                for v in volumes {
                    out.add(&node, v);
                }
            }
        }
        for volumes in out.by_node.values_mut() {
            sort_for_placement(volumes);
        }
        out
    }

    fn add(&mut self, node: &str, v: Volume) {
        match self.by_node.get_mut(node) {
            Some(list) => list.push(v),
            None => {
                self.by_node.insert(node.to_string(), vec![v]);
            }
        }
    }
}

/// The bytes of `lv` its node's record does not show yet, if any.
fn in_flight_bytes(lv: &LogicVolume, record: &NodeStorageResourceStatus) -> Option<u64> {
    let spec_bytes = quantity_bytes(&lv.spec.size).ok()?;
    let status = lv.status.as_ref();
    if !lv.is_made() {
        return (lv.is_pending() && spec_bytes > 0).then_some(spec_bytes);
    }
    let current = status
        .and_then(|s| s.current_size.as_ref())
        .and_then(|q| quantity_bytes(q).ok())
        .unwrap_or(spec_bytes);
    let unreflected = match status.and_then(|s| reflected_by_generation(s, record)) {
        Some(reflected) => !reflected,
        None => {
            let made_at = status
                .and_then(ready_since)
                .or(lv.metadata.creation_timestamp.as_ref());
            match (made_at, record.sync_time.as_ref()) {
                (Some(made), Some(synced)) => made.0 >= synced.0,
                _ => true,
            }
        }
    };
    let bytes = if unreflected {
        current.max(spec_bytes)
    } else {
        spec_bytes.saturating_sub(current)
    };
    (bytes > 0).then_some(bytes)
}

/// Whether the record counts the volume at its current size, told by the
/// node's capacity generations; `None` when they cannot tell (an object
/// without them, or a record of another start of the node).
fn reflected_by_generation(
    status: &LogicVolumeStatus,
    record: &NodeStorageResourceStatus,
) -> Option<bool> {
    let (lv_incarnation, lv_generation) = (
        status.node_incarnation.as_ref()?,
        status.capacity_generation?,
    );
    let (incarnation, generation) = (record.node_incarnation.as_ref()?, record.node_generation?);
    (incarnation == lv_incarnation).then_some(generation >= lv_generation)
}

fn ready_since(status: &LogicVolumeStatus) -> Option<&Time> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == READY && c.status == "True")
        .map(|c| &c.last_transition_time)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    const GIB: u64 = 1 << 30;

    fn bytes(vs: &[Volume]) -> Vec<u64> {
        vs.iter().map(|v| v.range.required_bytes).collect()
    }

    #[test]
    fn logic_volumes_until_the_record_shows_them() {
        let objects = objects();
        objects.insert_node_storage(nsr_synced("n1", vec![lvm_group("ssd", 100 * GIB)], 1000));
        // Not made yet.
        objects.insert_logic_volume(lv("a", "n1", "ssd", "1Gi"));
        // Failed for good / retried.
        let mut failed = lv("b", "n1", "ssd", "2Gi");
        failed.status = Some(LogicVolumeStatus {
            code: Some(8),
            ..LogicVolumeStatus::default()
        });
        objects.insert_logic_volume(failed);
        let mut retried = lv("c", "n1", "ssd", "3Gi");
        retried.status = Some(LogicVolumeStatus {
            code: Some(14),
            ..LogicVolumeStatus::default()
        });
        objects.insert_logic_volume(retried);
        // Made before the sync: reflected; made at/after: not.
        objects.insert_logic_volume(made_lv("d", "n1", "4Gi", 999));
        objects.insert_logic_volume(made_lv("e", "n1", "5Gi", 1000));
        // Growing from 4 to 6 GiB, made long ago.
        let mut growing = made_lv("f", "n1", "6Gi", 10);
        if let Some(s) = growing.status.as_mut() {
            s.current_size = Some(quantity_of("4Gi"));
        }
        objects.insert_logic_volume(growing);
        let r = Reservations::build(&objects);
        assert_eq!(bytes(r.on("n1")), [5 * GIB, 3 * GIB, 2 * GIB, GIB]);
        assert!(r.on("n2").is_empty());
    }

    /// Every answer the bridge tries again soon leaves a volume in
    /// flight, `CANCELLED` too (the extender's own list of codes lacked
    /// it); answers it gives up on, or tries only slowly (the provisioner
    /// deletes such a create's object), do not.
    #[test]
    fn a_volume_the_bridge_still_retries_stays_in_flight() {
        let cases = [
            ("unavailable", 14, true),
            ("deadline", 4, true),
            ("aborted", 10, true),
            ("cancelled", 1, true),
            ("exhausted", 8, false),
            ("invalid", 3, false),
            ("internal", 13, false),
            ("precondition", 9, false),
        ];
        for (name, code, in_flight) in cases {
            let objects = objects();
            objects.insert_node_storage(nsr_synced("n1", vec![lvm_group("ssd", 100 * GIB)], 1000));
            let mut v = lv(name, "n1", "ssd", "3Gi");
            v.status = Some(LogicVolumeStatus {
                code: Some(code),
                ..LogicVolumeStatus::default()
            });
            objects.insert_logic_volume(v);
            let want: &[u64] = if in_flight { &[3 * GIB] } else { &[] };
            assert_eq!(
                bytes(Reservations::build(&objects).on("n1")),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn tiered_logic_volumes_reserve_their_cache_too() {
        let objects = objects();
        objects.insert_node_storage(nsr_synced(
            "n1",
            vec![lvm_group("hdd", 100 * GIB), lvm_group("ssd", 10 * GIB)],
            1000,
        ));
        let mut tiered = lv("t", "n1", "hdd", "8Gi");
        tiered.spec.cache = Some(carina_api::LogicVolumeCache {
            device_group: "ssd".into(),
            ratio: 25,
            policy: "writeback".into(),
        });
        objects.insert_logic_volume(tiered);
        let r = Reservations::build(&objects);
        let groups: Vec<_> = r
            .on("n1")
            .iter()
            .map(|v| (v.group.as_deref(), v.range.required_bytes))
            .collect();
        assert_eq!(groups.len(), 2, "{groups:?}");
        assert!(groups.contains(&(Some("hdd"), 8 * GIB)), "{groups:?}");
        assert!(groups.contains(&(Some("ssd"), 2 * GIB)), "{groups:?}");
    }

    /// A volume made in the second of the record's sync: the times cannot
    /// tell, the capacity versions can.
    #[test]
    fn capacity_versions_decide_where_times_cannot() {
        let objects = objects();
        let mut record = nsr_synced("n1", vec![lvm_group("ssd", 100 * GIB)], 1000);
        if let Some(s) = record.status.as_mut() {
            s.node_incarnation = Some("i-2".into());
            s.node_generation = Some(7);
        }
        objects.insert_node_storage(record);
        let versioned = |name: &str, size: &str, incarnation: &str, generation: u64| {
            let mut v = made_lv(name, "n1", size, 1000);
            if let Some(s) = v.status.as_mut() {
                s.node_incarnation = Some(incarnation.into());
                s.capacity_generation = Some(generation);
            }
            v
        };
        // Counted by the record: generation 7 shows changes up to 7.
        objects.insert_logic_volume(versioned("a", "1Gi", "i-2", 6));
        objects.insert_logic_volume(versioned("b", "2Gi", "i-2", 7));
        // Not yet.
        objects.insert_logic_volume(versioned("c", "4Gi", "i-2", 8));
        // Of another start of the node, and without versions: the times
        // (made in the second of the sync) count them.
        objects.insert_logic_volume(versioned("d", "8Gi", "i-1", 3));
        objects.insert_logic_volume(made_lv("e", "n1", "16Gi", 1000));
        let r = Reservations::build(&objects);
        assert_eq!(bytes(r.on("n1")), [16 * GIB, 8 * GIB, 4 * GIB]);
    }

    #[test]
    fn claims_with_a_node_and_no_logic_volume() {
        let objects = ssd_and_other_classes();
        // Annotated by the scheduler.
        objects.insert_claim(selected(claim("ns", "a", Some("ssd"), "1Gi"), "n1"));
        // Used by a pod bound to n2.
        objects.insert_claim(claim("ns", "b", Some("ssd"), "2Gi"));
        objects.insert_pod(bound_pod("ns", "p", "n2", &["b"]));
        // No node yet.
        objects.insert_claim(claim("ns", "c", Some("ssd"), "4Gi"));
        // Not Carina's.
        objects.insert_claim(selected(claim("ns", "d", Some("other"), "8Gi"), "n1"));
        // Annotated, with its LogicVolume already there (named after the
        // claim uid): counted once, as the LogicVolume.
        let mut e = selected(claim("ns", "e", Some("ssd"), "16Gi"), "n1");
        e.metadata.uid = Some("uid-e".into());
        objects.insert_claim(e);
        objects.insert_logic_volume(lv("pvc-uid-e", "n1", "ssd", "16Gi"));
        let r = Reservations::build(&objects);
        assert_eq!(bytes(r.on("n1")), [16 * GIB, GIB]);
        assert_eq!(
            r.on("n1")[0].claim,
            Some(ClaimKey::new("ns", "e")),
            "the LogicVolume is traced back to its claim"
        );
        assert_eq!(bytes(r.on("n2")), [2 * GIB]);
        assert_eq!(r.len(), 3);
    }

    fn made_lv(name: &str, node: &str, size: &str, made_at: i64) -> LogicVolume {
        let mut v = lv(name, node, "ssd", size);
        v.status = Some(LogicVolumeStatus {
            volume_id: Some(format!("volume-{name}")),
            code: Some(0),
            current_size: Some(quantity_of(size)),
            conditions: vec![Condition {
                type_: READY.into(),
                status: "True".into(),
                last_transition_time: time(made_at),
                message: String::new(),
                reason: "Provisioned".into(),
                observed_generation: None,
            }],
            ..LogicVolumeStatus::default()
        });
        v
    }
}
