//! Go Carina's `LogicVolume`s in the bridge ([`carina_api::LogicVolume::owner`]).
//!
//! **Not taken over** (Go's id in `status.volumeID`, or Go's annotation,
//! and no adopted-volume annotation): the bridge creates, resizes and
//! deletes nothing on the node for it, never marks it ready and neither
//! adds nor removes its finalizer (Go Carina's finalizer has our
//! finalizer's name). It writes only the condition [`ADOPTED`] `False`,
//! reason [`GO_CARINA_VOLUME`], naming `carinactl migrate apply`; the rest
//! of the status stays as Go wrote it. A deleted one stays until it is
//! taken over (then its volume is deleted as any other) or its finalizer
//! is removed by hand (the volume is left on its disk); a Warning Event
//! says so. An adopted-volume annotation that is not the object's Go id
//! is treated the same, with reason [`BAD_ADOPTION`].
//!
//! **Taken over**: its node-local name is the annotation's value. Before
//! anything else the bridge asks the node for that volume (`GetLV`; it is
//! never created) and records what the node reports, in our status form
//! (volume id kept as the Go id), with [`ADOPTED`] `True`; from then on it
//! is reconciled like ours under that name (resize, delete).

use carina_api::{LogicVolume, LogicVolumeStatus, Owner};
use carina_proto::nodestorage as pb;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::Instrument;

use super::context::Context;
use super::decide::{Op, made_status};
use super::error::Error;
use super::steps::fail;
use crate::kube::status::{condition, with_condition};

/// The condition type saying whether a Go Carina volume is taken over.
pub const ADOPTED: &str = "Adopted";
/// Reason of [`ADOPTED`] `False`: Go Carina's, not taken over.
pub const GO_CARINA_VOLUME: &str = "GoCarinaVolume";
/// Reason of [`ADOPTED`] `False`: the adopted-volume annotation is wrong.
pub const BAD_ADOPTION: &str = "BadAdoption";
/// Reason of [`ADOPTED`] `True`.
const TAKEN_OVER: &str = "TakenOver";

/// How the bridge treats an object, by whose it is.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// Go Carina's, not taken over (or wrongly annotated): no node call,
    /// no finalizer change; only the condition.
    LeaveAlone {
        reason: &'static str,
        message: String,
    },
    /// Taken over and not yet found on its node: `GetLV` of `local`.
    Confirm { local: String },
    /// Ours, or taken over and found: the finalizer and the node calls,
    /// on the volume `local`.
    Reconcile { local: String },
}

/// How the bridge treats `lv`. A taken-over object being deleted goes
/// straight to its delete.
pub(super) fn route(lv: &LogicVolume) -> Route {
    match lv.owner() {
        Ok(Owner::Go { .. }) => Route::LeaveAlone {
            reason: GO_CARINA_VOLUME,
            message: go_message(lv),
        },
        Err(e) => Route::LeaveAlone {
            reason: BAD_ADOPTION,
            message: e.to_string(),
        },
        Ok(Owner::TakenOver { local })
            if !confirmed(lv) && lv.metadata.deletion_timestamp.is_none() =>
        {
            Route::Confirm { local }
        }
        Ok(Owner::TakenOver { local } | Owner::Ours { local }) => Route::Reconcile { local },
    }
}

/// Why a Go Carina volume not taken over is left alone.
pub(super) fn go_message(lv: &LogicVolume) -> String {
    format!(
        "a Go Carina volume on node {} not taken over yet: nothing is created, resized, deleted \
         or marked ready for it until `carinactl migrate apply` takes it over",
        lv.spec.node_name
    )
}

/// The status recording that `lv` is left alone for `reason`; `None`
/// when it says so already.
pub(super) fn left_alone_status(
    lv: &LogicVolume,
    reason: &str,
    message: &str,
) -> Option<LogicVolumeStatus> {
    let previous = lv.status.clone().unwrap_or_default();
    let said = previous.conditions.iter().any(|c| {
        c.type_ == ADOPTED && c.status == "False" && c.reason == reason && c.message == message
    });
    if said {
        return None;
    }
    let adopted = condition(
        &previous.conditions,
        ADOPTED,
        false,
        reason,
        message,
        lv.metadata.generation,
    );
    Some(LogicVolumeStatus {
        conditions: with_condition(&previous.conditions, adopted),
        ..previous
    })
}

/// Whether the bridge found the taken-over volume of `lv` on its node.
pub(super) fn confirmed(lv: &LogicVolume) -> bool {
    lv.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == ADOPTED && c.status == "True")
    })
}

/// The status after the node reported the taken-over `volume`.
pub(super) fn confirmed_status(
    lv: &LogicVolume,
    volume: &pb::LogicVolume,
    message: &str,
) -> LogicVolumeStatus {
    let made = made_status(lv, volume, None, message);
    let adopted = condition(
        &made.conditions,
        ADOPTED,
        true,
        TAKEN_OVER,
        message,
        lv.metadata.generation,
    );
    LogicVolumeStatus {
        conditions: with_condition(&made.conditions, adopted),
        ..made
    }
}

/// Leaves the Go Carina volume `lv` alone: only the condition, and a
/// Warning Event when that is news or the object is being deleted.
pub(super) async fn leave_alone(
    lv: &LogicVolume,
    ctx: &Context,
    reason: &str,
    message: &str,
) -> Result<Action, Error> {
    let name = lv.name_any();
    let status = left_alone_status(lv, reason, message);
    if let Some(status) = &status {
        ctx.write_status(&name, status).await?;
        tracing::info!(carina.volume.name = %name, reason, "{message}");
    }
    if lv.metadata.deletion_timestamp.is_some() {
        let note = format!(
            "{message}; its deletion waits until it is taken over (its volume is then deleted), \
             or until its finalizer is removed by hand (its volume then stays on the disk)"
        );
        ctx.note(lv, EventType::Warning, reason, "Delete", &note)
            .await;
    } else if status.is_some() {
        ctx.note(lv, EventType::Warning, reason, "Reconcile", message)
            .await;
    }
    Ok(Action::await_change())
}

/// Finds the taken-over volume `local` of `lv` on its node (`GetLV`) and
/// records it; a volume the node does not have is a failure, retried.
pub(super) async fn confirm(lv: &LogicVolume, ctx: &Context, local: &str) -> Result<Action, Error> {
    let name = lv.name_any();
    let endpoint = match ctx.endpoint(lv).await {
        Ok(e) => e,
        Err(e) => return fail(lv, ctx, Op::Confirm, e.into()).await,
    };
    let req = pb::GetLvRequest {
        name: local.to_string(),
    };
    let what = format!("GetLV {local}");
    let found = ctx
        .clients
        .call(&endpoint, &what, |mut c| async move { c.get_lv(req).await })
        .instrument(tracing::info_span!(
            "bridge.confirm_takeover",
            carina.volume.name = %name,
            k8s.node.name = %lv.spec.node_name,
        ))
        .await;
    let volume = match found {
        Ok(r) => r.volume,
        Err(e) if e.code() == tonic::Code::NotFound => None,
        Err(e) => return fail(lv, ctx, Op::Confirm, Error::Node(e)).await,
    };
    let Some(volume) = volume else {
        let e = carina_csi::CsiError::FailedPrecondition(format!(
            "node {} has no volume {local:?} of this project: the take-over (AdoptLV) has not happened there",
            endpoint.node
        ));
        return fail(lv, ctx, Op::Confirm, Error::Node(e)).await;
    };
    let message = format!(
        "Go Carina volume {local} taken over: {} bytes in device group {} on node {}",
        volume.size_bytes, volume.device_group, endpoint.node
    );
    ctx.write_status(&name, &confirmed_status(lv, &volume, &message))
        .await?;
    tracing::info!(carina.volume.name = %name, k8s.node.name = %endpoint.node, "{message}");
    ctx.note(lv, EventType::Normal, TAKEN_OVER, "GetLV", &message)
        .await;
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use carina_api::logicvolume::STATUS_SUCCESS;
    use carina_api::{ADOPTED_ANNOTATION, LogicVolumeSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use std::collections::BTreeMap;

    /// A Go Carina object as Go wrote it: made, Success, Go's id.
    fn go_object() -> LogicVolume {
        let mut lv = LogicVolume::new(
            "pvc-1",
            LogicVolumeSpec {
                source: None,
                node_name: "n".into(),
                size: Quantity("1Gi".into()),
                device_group: "carina-vg-ssd".into(),
                pvc: "data".into(),
                name_space: "default".into(),
                cache: None,
            },
        );
        lv.metadata.generation = Some(1);
        lv.status = Some(LogicVolumeStatus {
            volume_id: Some("volume-pvc-1".into()),
            status: Some(STATUS_SUCCESS.into()),
            current_size: Some(Quantity("1Gi".into())),
            code: Some(0),
            ..LogicVolumeStatus::default()
        });
        lv
    }

    #[test]
    fn routes_by_owner() {
        let mut lv = go_object();
        // Before, such an object was planned as settled: marked Ready
        // without a node being asked.
        assert!(matches!(
            route(&lv),
            Route::LeaveAlone {
                reason: GO_CARINA_VOLUME,
                ..
            }
        ));
        let annotate = |lv: &mut LogicVolume, value: &str| {
            lv.metadata.annotations = Some(BTreeMap::from([(
                ADOPTED_ANNOTATION.to_string(),
                value.to_string(),
            )]));
        };
        annotate(&mut lv, "volume-pvc-2");
        assert!(matches!(
            route(&lv),
            Route::LeaveAlone {
                reason: BAD_ADOPTION,
                ..
            }
        ));
        annotate(&mut lv, "volume-pvc-1");
        assert_eq!(
            route(&lv),
            Route::Confirm {
                local: "volume-pvc-1".into()
            }
        );
        lv.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        assert_eq!(
            route(&lv),
            Route::Reconcile {
                local: "volume-pvc-1".into()
            },
            "a deleted one is deleted under its Go id"
        );
        lv.metadata.deletion_timestamp = None;
        let volume = pb::LogicVolume {
            name: "volume-pvc-1".into(),
            size_bytes: 1 << 30,
            ..Default::default()
        };
        lv.status = Some(confirmed_status(&lv, &volume, "found"));
        assert_eq!(
            route(&lv),
            Route::Reconcile {
                local: "volume-pvc-1".into()
            }
        );
        let mut ours = go_object();
        ours.status = None;
        assert_eq!(
            route(&ours),
            Route::Reconcile {
                local: "pvc-1".into()
            }
        );
    }

    #[test]
    fn go_volumes_get_only_the_condition() {
        let mut lv = go_object();
        let message = go_message(&lv);
        assert!(message.contains("carinactl migrate apply"), "{message}");
        let status = left_alone_status(&lv, GO_CARINA_VOLUME, &message).expect("news");
        let before = lv.status.clone().expect("status");
        assert_eq!(
            LogicVolumeStatus {
                conditions: Vec::new(),
                ..status.clone()
            },
            before,
            "Go's fields untouched"
        );
        assert_eq!(status.conditions.len(), 1);
        assert_eq!(status.conditions[0].type_, ADOPTED);
        assert_eq!(status.conditions[0].status, "False");
        assert_eq!(status.conditions[0].reason, GO_CARINA_VOLUME);
        lv.status = Some(status);
        assert!(
            left_alone_status(&lv, GO_CARINA_VOLUME, &message).is_none(),
            "said once"
        );
        assert!(!confirmed(&lv));
    }

    #[test]
    fn taken_over_volumes_keep_their_go_id() {
        let mut lv = go_object();
        lv.metadata.annotations = Some(BTreeMap::from([(
            ADOPTED_ANNOTATION.to_string(),
            "volume-pvc-1".to_string(),
        )]));
        let volume = pb::LogicVolume {
            name: "volume-pvc-1".into(),
            size_bytes: 1 << 30,
            device_group: "carina-vg-ssd".into(),
            device_path: "/dev/carina-vg-ssd/volume-pvc-1".into(),
            major: 253,
            minor: 2,
            ..Default::default()
        };
        let status = confirmed_status(&lv, &volume, "taken over");
        assert_eq!(status.volume_id.as_deref(), Some("volume-pvc-1"));
        assert_eq!(status.device_minor, Some(2));
        let types: Vec<_> = status
            .conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(types, [("Ready", "True"), (ADOPTED, "True")]);
        lv.status = Some(status);
        assert!(confirmed(&lv));
        // A later status keeps the Adopted condition.
        let failed = super::super::decide::failed_status(&lv, tonic::Code::Internal, "x");
        assert!(failed.conditions.iter().any(|c| c.type_ == ADOPTED));
    }
}
