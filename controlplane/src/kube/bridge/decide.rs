//! The bridge's pure reconcile decisions: which node operation an object
//! asks for ([`plan`]), whether its last failure was terminal for this
//! generation ([`failed_for_good`]), and the whole status each outcome
//! writes ([`failed_status`], [`made_status`], [`settled_status`]). No API
//! or node calls here; `steps` carries the decisions out.

use carina_api::logicvolume::{STATUS_FAILED, STATUS_SUCCESS};
use carina_api::quantity::{bytes_quantity, quantity_bytes};
use carina_api::{LogicVolume, LogicVolumeCache, LogicVolumeStatus, Owner};
use carina_csi::volume_id::VolumeId;
use carina_proto::code_name;
use carina_proto::nodestorage as pb;
use kube::ResourceExt;
use tonic::Code;

use super::error::{Error, Retry};
use crate::kube::status::{condition, with_condition};

/// The condition type the bridge maintains.
pub const READY: &str = "Ready";

/// The node operations of the bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Create,
    Resize,
    Delete,
    /// Finding a Go Carina volume taken over on its node.
    Confirm,
}

impl Op {
    /// The node RPC of `op` for `lv`: a tiered volume is one bcache device.
    pub(super) fn rpc_for(self, lv: &LogicVolume) -> &'static str {
        match (self, lv.spec.cache.is_some()) {
            (Op::Create, false) => "CreateLV",
            (Op::Create, true) => "CreateBcache",
            (Op::Resize, _) => "ResizeLV",
            (Op::Delete, false) => "DeleteLV",
            (Op::Delete, true) => "DeleteBcache",
            (Op::Confirm, _) => "GetLV",
        }
    }

    pub(super) fn failed_reason(self) -> &'static str {
        match self {
            Op::Create => "CreateFailed",
            Op::Resize => "ResizeFailed",
            Op::Delete => "DeleteFailed",
            Op::Confirm => "TakeOverFailed",
        }
    }
}

/// What an object (holding the finalizer) asks of its node.
#[derive(Debug)]
pub(super) enum Plan {
    /// Its last attempt failed for good; nothing until the spec changes.
    Wait,
    /// Its spec is unusable for `op`.
    Invalid { op: Op, error: Error },
    /// The volume is as large as asked: only the status to settle.
    Settled,
    /// `op` on the node, for `wanted` bytes.
    Call { op: Op, wanted: u64 },
}

/// What `lv` asks of its node: `CreateLV` (`CreateBcache` for a tiered
/// volume) while `status.volumeID` is unset, else `ResizeLV` when
/// `spec.size` exceeds `status.currentSize`; a tiered volume cannot grow.
pub(super) fn plan(lv: &LogicVolume) -> Plan {
    if failed_for_good(lv) {
        return Plan::Wait;
    }
    let previous = lv.status.clone().unwrap_or_default();
    let op = if previous.volume_id.is_none() {
        Op::Create
    } else {
        Op::Resize
    };
    if lv.spec.node_name.is_empty() {
        let error = Error::Spec {
            field: "spec.nodeName",
            reason: "empty".into(),
        };
        return Plan::Invalid { op, error };
    }
    let wanted = match quantity_bytes(&lv.spec.size) {
        Ok(b) => b,
        Err(e) => {
            let error = Error::Spec {
                field: "spec.size",
                reason: e.to_string(),
            };
            return Plan::Invalid { op, error };
        }
    };
    if let Some(error) = lv.spec.cache.as_ref().and_then(cache_error) {
        return Plan::Invalid { op, error };
    }
    if op == Op::Resize {
        let current = previous
            .current_size
            .as_ref()
            .and_then(|q| quantity_bytes(q).ok());
        if current.is_some_and(|c| c >= wanted) {
            return Plan::Settled;
        }
        if lv.spec.cache.is_some() {
            let error = Error::Spec {
                field: "spec.size",
                reason: format!(
                    "a bcache volume cannot grow (it is {} bytes, {wanted} asked); set the size back",
                    current.map_or_else(|| "of unknown size".to_string(), |c| c.to_string())
                ),
            };
            return Plan::Invalid { op, error };
        }
    }
    Plan::Call { op, wanted }
}

/// Why the cache of a tiered volume is unusable, if it is.
fn cache_error(cache: &LogicVolumeCache) -> Option<Error> {
    let spec = |field, reason: String| Some(Error::Spec { field, reason });
    if cache.device_group.is_empty() {
        return spec("spec.cache.deviceGroup", "empty".into());
    }
    if !(1..=100).contains(&cache.ratio) {
        return spec(
            "spec.cache.ratio",
            format!("{} is not a percentage from 1 to 100", cache.ratio),
        );
    }
    if cache_mode(&cache.policy).is_none() {
        return spec(
            "spec.cache.policy",
            format!(
                "{:?} is not writethrough, writeback, writearound or none",
                cache.policy
            ),
        );
    }
    None
}

/// The bcache mode of a cache policy (shared with the direct plane).
pub(super) use crate::nodes::bcache::cache_mode;

/// What the status records of a bcache device: the device (its path and
/// numbers) with the size of its backing volume.
pub(super) fn bcache_volume(lv: &LogicVolume, device: &pb::BcacheDevice) -> pb::LogicVolume {
    pb::LogicVolume {
        name: device.name.clone(),
        device_group: lv.spec.device_group.clone(),
        size_bytes: device.size_bytes,
        device_path: device.device_path.clone(),
        major: device.major,
        minor: device.minor,
        ..Default::default()
    }
}

/// True when the last attempt at this generation ended with a terminal
/// code: the provisioner has it, and only a new spec is worth a retry.
pub(super) fn failed_for_good(lv: &LogicVolume) -> bool {
    let Some(status) = &lv.status else {
        return false;
    };
    status.status.as_deref() == Some(STATUS_FAILED)
        && status.observed_generation.is_some()
        && status.observed_generation == lv.metadata.generation
        && status
            .code
            .is_some_and(|c| Retry::of_status(c) == Retry::Never)
}

/// The status after a failure with `code` and `message`: the volume fields
/// of the previous status stay.
pub(super) fn failed_status(lv: &LogicVolume, code: Code, message: &str) -> LogicVolumeStatus {
    let previous = lv.status.clone().unwrap_or_default();
    LogicVolumeStatus {
        code: Some(code as i32),
        message: Some(message.to_string()),
        status: Some(STATUS_FAILED.to_string()),
        conditions: with_condition(
            &previous.conditions,
            condition(
                &previous.conditions,
                READY,
                false,
                code_name(code),
                message,
                lv.metadata.generation,
            ),
        ),
        observed_generation: lv.metadata.generation,
        ..previous
    }
}

/// The status after the node made or resized `volume`; `message` says so,
/// `capacity` is the node's first report that counts it.
pub(super) fn made_status(
    lv: &LogicVolume,
    volume: &pb::LogicVolume,
    capacity: Option<&pb::CapacityVersion>,
    message: &str,
) -> LogicVolumeStatus {
    let previous = lv.status.clone().unwrap_or_default();
    let block = !volume.device_path.is_empty();
    LogicVolumeStatus {
        volume_id: Some(status_volume_id(lv)),
        code: Some(0),
        message: Some(message.to_string()),
        current_size: Some(bytes_quantity(volume.size_bytes)),
        status: Some(STATUS_SUCCESS.to_string()),
        device_major: block.then_some(volume.major),
        device_minor: block.then_some(volume.minor),
        conditions: with_condition(
            &previous.conditions,
            condition(
                &previous.conditions,
                READY,
                true,
                "Provisioned",
                message,
                lv.metadata.generation,
            ),
        ),
        observed_generation: lv.metadata.generation,
        // One status write carries everything: a second request right
        // after it would wait on a delayed ACK.
        path: Some(if block {
            volume.device_path.clone()
        } else {
            volume.host_path.clone()
        })
        .filter(|p| !p.is_empty()),
        node_incarnation: capacity
            .map(|c| c.incarnation.clone())
            .filter(|i| !i.is_empty()),
        capacity_generation: capacity.map(|c| c.generation),
    }
}

/// The id `status.volumeID` records: `<object>@<node>`, or the Go id a
/// Go Carina volume taken over keeps (its PersistentVolume's handle).
fn status_volume_id(lv: &LogicVolume) -> String {
    match lv.owner() {
        Ok(Owner::TakenOver { local }) => local,
        _ => VolumeId::new(lv.name_any(), lv.spec.node_name.clone()).encode(),
    }
}

/// The status that records this generation as done with nothing to do on
/// the node (after a failed resize whose size was taken back, or a change
/// of other spec fields); `None` when the status says so already.
pub(super) fn settled_status(lv: &LogicVolume) -> Option<LogicVolumeStatus> {
    let previous = lv.status.clone().unwrap_or_default();
    if previous.status.as_deref() == Some(STATUS_SUCCESS)
        && previous.observed_generation == lv.metadata.generation
    {
        return None;
    }
    let message = "volume ready".to_string();
    Some(LogicVolumeStatus {
        code: Some(0),
        message: Some(message.clone()),
        status: Some(STATUS_SUCCESS.to_string()),
        conditions: with_condition(
            &previous.conditions,
            condition(
                &previous.conditions,
                READY,
                true,
                "Provisioned",
                &message,
                lv.metadata.generation,
            ),
        ),
        observed_generation: lv.metadata.generation,
        ..previous
    })
}

/// Whether a `DeleteLV` error means there is nothing to delete: no such
/// volume, or a name no volume can have.
pub(super) fn nothing_to_delete(code: Code) -> bool {
    matches!(code, Code::NotFound | Code::InvalidArgument)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn object(size: &str) -> LogicVolume {
        let mut lv = LogicVolume::new(
            "v",
            carina_api::LogicVolumeSpec {
                source: None,
                node_name: "n".into(),
                size: Quantity(size.into()),
                device_group: "g".into(),
                pvc: String::new(),
                name_space: String::new(),
                cache: None,
            },
        );
        lv.metadata.generation = Some(3);
        lv
    }

    #[test]
    fn terminal_failures_wait_for_a_new_generation() {
        let mut lv = LogicVolume::new(
            "v",
            carina_api::LogicVolumeSpec {
                source: None,
                node_name: "n".into(),
                size: Quantity("1Gi".into()),
                device_group: "g".into(),
                pvc: String::new(),
                name_space: String::new(),
                cache: None,
            },
        );
        lv.metadata.generation = Some(3);
        lv.status = Some(LogicVolumeStatus {
            code: Some(Code::ResourceExhausted as i32),
            status: Some(STATUS_FAILED.into()),
            observed_generation: Some(3),
            ..LogicVolumeStatus::default()
        });
        assert!(failed_for_good(&lv));
        lv.metadata.generation = Some(4);
        assert!(!failed_for_good(&lv));
        lv.metadata.generation = Some(3);
        if let Some(s) = lv.status.as_mut() {
            s.code = Some(Code::Unavailable as i32);
        }
        assert!(!failed_for_good(&lv));
    }

    #[test]
    fn plans() {
        let mut lv = object("1Gi");
        assert!(matches!(
            plan(&lv),
            Plan::Call { op: Op::Create, wanted } if wanted == 1 << 30
        ));
        lv.status = Some(LogicVolumeStatus {
            volume_id: Some("v@n".into()),
            current_size: Some(Quantity("1Gi".into())),
            ..LogicVolumeStatus::default()
        });
        assert!(matches!(plan(&lv), Plan::Settled));
        lv.spec.size = Quantity("2Gi".into());
        assert!(matches!(
            plan(&lv),
            Plan::Call { op: Op::Resize, wanted } if wanted == 2 << 30
        ));
        lv.spec.size = Quantity("lots".into());
        match plan(&lv) {
            Plan::Invalid { op, error } => {
                assert_eq!(op, Op::Resize);
                assert!(error.to_string().starts_with("spec.size: "), "{error}");
            }
            other => panic!("{other:?}"),
        }
        let mut nowhere = object("1Gi");
        nowhere.spec.node_name.clear();
        match plan(&nowhere) {
            Plan::Invalid { op, error } => {
                assert_eq!(op, Op::Create);
                assert_eq!(error.code(), Some(Code::InvalidArgument));
            }
            other => panic!("{other:?}"),
        }
        nowhere.status = Some(LogicVolumeStatus {
            code: Some(Code::InvalidArgument as i32),
            status: Some(STATUS_FAILED.into()),
            observed_generation: Some(3),
            ..LogicVolumeStatus::default()
        });
        assert!(matches!(plan(&nowhere), Plan::Wait));
    }

    #[test]
    fn tiered_volumes_are_made_once_and_never_grow() {
        let mut lv = object("1Gi");
        lv.spec.cache = Some(LogicVolumeCache {
            device_group: "ssd".into(),
            ratio: 10,
            policy: String::new(),
        });
        assert_eq!(Op::Create.rpc_for(&lv), "CreateBcache");
        assert_eq!(Op::Delete.rpc_for(&lv), "DeleteBcache");
        assert!(matches!(plan(&lv), Plan::Call { op: Op::Create, .. }));
        let device = pb::BcacheDevice {
            name: "v".into(),
            device_path: "/dev/bcache3".into(),
            major: 252,
            minor: 384,
            size_bytes: 1 << 30,
            ..Default::default()
        };
        let made = made_status(&lv, &bcache_volume(&lv, &device), None, "made");
        assert_eq!(made.path.as_deref(), Some("/dev/bcache3"));
        assert_eq!(
            (made.device_major, made.device_minor),
            (Some(252), Some(384))
        );
        let current = made
            .current_size
            .as_ref()
            .map(|q| quantity_bytes(q).expect("bytes"));
        assert_eq!(current, Some(1 << 30));
        lv.status = Some(made);
        assert!(matches!(plan(&lv), Plan::Settled));
        lv.spec.size = Quantity("2Gi".into());
        match plan(&lv) {
            Plan::Invalid { op, error } => {
                assert_eq!(op, Op::Resize);
                assert!(error.to_string().contains("cannot grow"), "{error}");
                assert_eq!(error.code(), Some(Code::InvalidArgument));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unusable_caches_name_their_field() {
        let cases = [
            ("", 10, "", "spec.cache.deviceGroup: "),
            ("ssd", 0, "", "spec.cache.ratio: "),
            ("ssd", 101, "", "spec.cache.ratio: "),
            ("ssd", 10, "fast", "spec.cache.policy: "),
        ];
        for (group, ratio, policy, field) in cases {
            let mut lv = object("1Gi");
            lv.spec.cache = Some(LogicVolumeCache {
                device_group: group.into(),
                ratio,
                policy: policy.into(),
            });
            match plan(&lv) {
                Plan::Invalid { error, .. } => {
                    assert!(error.to_string().starts_with(field), "{error}")
                }
                other => panic!("{group:?} {ratio} {policy:?}: {other:?}"),
            }
        }
        for (policy, mode) in [
            ("", pb::CacheMode::Writethrough),
            ("writeback", pb::CacheMode::Writeback),
            ("writearound", pb::CacheMode::Writearound),
            ("none", pb::CacheMode::None),
        ] {
            assert_eq!(cache_mode(policy), Some(mode));
        }
    }

    #[test]
    fn statuses_written() {
        let mut lv = object("1Gi");
        let volume = pb::LogicVolume {
            size_bytes: 1 << 30,
            device_group: "g".into(),
            device_path: "/dev/carina/v".into(),
            major: 253,
            minor: 7,
            ..Default::default()
        };
        let version = pb::CapacityVersion {
            incarnation: "i-1".into(),
            generation: 9,
        };
        let made = made_status(&lv, &volume, Some(&version), "made");
        assert_eq!(made.node_incarnation.as_deref(), Some("i-1"));
        assert_eq!(made.capacity_generation, Some(9));
        assert_eq!(made.volume_id.as_deref(), Some("v@n"));
        assert_eq!(made.code, Some(0));
        assert_eq!(made.status.as_deref(), Some(STATUS_SUCCESS));
        assert_eq!((made.device_major, made.device_minor), (Some(253), Some(7)));
        assert_eq!(made.path.as_deref(), Some("/dev/carina/v"));
        assert_eq!(made.observed_generation, Some(3));
        assert_eq!(made.conditions[0].type_, READY);
        assert_eq!(made.conditions[0].status, "True");
        lv.status = Some(made);
        let failed = failed_status(&lv, Code::ResourceExhausted, "full");
        assert_eq!(failed.code, Some(Code::ResourceExhausted as i32));
        assert_eq!(failed.message.as_deref(), Some("full"));
        assert_eq!(failed.status.as_deref(), Some(STATUS_FAILED));
        assert_eq!(failed.conditions[0].status, "False");
        assert_eq!(
            failed.volume_id.as_deref(),
            Some("v@n"),
            "a failure keeps the volume fields"
        );
        assert!(
            settled_status(&lv).is_none(),
            "success of this generation is recorded"
        );
        lv.metadata.generation = Some(4);
        let settled = settled_status(&lv).expect("a new generation to record");
        assert_eq!(settled.observed_generation, Some(4));
        assert_eq!(settled.message.as_deref(), Some("volume ready"));
        assert!(nothing_to_delete(Code::NotFound));
        assert!(!nothing_to_delete(Code::Unavailable));
    }
}
