//! What a `LogicVolume`'s status says, read one way by every reader (the
//! bridge, the provisioner and the scheduler extender):
//!
//! - how the bridge treats a node's answer, the gRPC code it writes into
//!   `status.code` ([`Retry::of`]): tried again soon, tried again slowly,
//!   or not for this generation;
//! - whether the volume is made ([`LogicVolume::is_made`]);
//! - whether it still holds room on its node that the node's capacity
//!   record cannot show yet ([`LogicVolume::is_pending`]).
//!
//! **Holding room.** A volume asked for and not made holds its room while
//! it is still coming: no outcome yet, or an answer the bridge tries again
//! soon (`UNAVAILABLE`, `DEADLINE_EXCEEDED`, `ABORTED`, `CANCELLED`: the
//! node was busy or out of reach, and the next attempt may make it). It
//! holds none once it is being deleted or its create failed otherwise: a
//! terminal answer is final, and the provisioner deletes the object of any
//! create that is not tried again soon, so a retry of the claim is placed
//! anew. Counting a volume twice is safe; missing one that the bridge then
//! makes over-commits its node.

use tonic::Code;

use crate::LogicVolume;

/// How soon the bridge tries a node operation again after an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Transient (the node was busy, out of reach, or slow): with the
    /// per-object backoff. The volume is still coming.
    Soon,
    /// Unlikely to change by itself (`INTERNAL`, `FAILED_PRECONDITION`,
    /// ...): every slow retry; the provisioner gives such a create up.
    Later,
    /// The request itself is wrong or cannot be met (`INVALID_ARGUMENT`,
    /// `ALREADY_EXISTS`, `RESOURCE_EXHAUSTED`, `OUT_OF_RANGE`): not again
    /// for this generation of the object.
    Never,
}

impl Retry {
    /// The class of the answer `code`.
    pub fn of(code: Code) -> Retry {
        match code {
            Code::Unavailable | Code::DeadlineExceeded | Code::Aborted | Code::Cancelled => {
                Retry::Soon
            }
            Code::InvalidArgument
            | Code::AlreadyExists
            | Code::ResourceExhausted
            | Code::OutOfRange => Retry::Never,
            _ => Retry::Later,
        }
    }

    /// The class of a code as `status.code` carries it (a number; one no
    /// gRPC code has is `UNKNOWN`).
    pub fn of_status(code: i32) -> Retry {
        Retry::of(Code::from_i32(code))
    }
}

impl LogicVolume {
    /// The volume exists on its node: `status.volumeID` is set.
    pub fn is_made(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.volume_id.as_deref())
            .is_some_and(|id| !id.is_empty())
    }

    /// Asked for, not made, and still coming (see the module
    /// documentation): its `spec.size` (and a tiered volume's cache) holds
    /// room on `spec.nodeName` that no capacity record shows yet.
    pub fn is_pending(&self) -> bool {
        let code = self.status.as_ref().and_then(|s| s.code).unwrap_or(0);
        !self.is_made()
            && self.metadata.deletion_timestamp.is_none()
            && (code == 0 || Retry::of_status(code) == Retry::Soon)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LogicVolumeSpec, LogicVolumeStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn lv(status: Option<LogicVolumeStatus>) -> LogicVolume {
        let mut lv = LogicVolume::new(
            "v",
            LogicVolumeSpec {
                node_name: "n".into(),
                size: Quantity("1Gi".into()),
                device_group: "g".into(),
                pvc: String::new(),
                name_space: String::new(),
                cache: None,
                source: None,
            },
        );
        lv.status = status;
        lv
    }

    fn answered(code: Code) -> LogicVolume {
        lv(Some(LogicVolumeStatus {
            code: Some(code as i32),
            ..LogicVolumeStatus::default()
        }))
    }

    #[test]
    fn retry_classes() {
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Aborted,
            Code::Cancelled,
        ] {
            assert_eq!(Retry::of(code), Retry::Soon, "{code:?}");
            assert_eq!(Retry::of_status(code as i32), Retry::Soon, "{code:?}");
        }
        for code in [
            Code::InvalidArgument,
            Code::AlreadyExists,
            Code::ResourceExhausted,
            Code::OutOfRange,
        ] {
            assert_eq!(Retry::of(code), Retry::Never, "{code:?}");
        }
        for code in [
            Code::Internal,
            Code::FailedPrecondition,
            Code::PermissionDenied,
            Code::Unknown,
        ] {
            assert_eq!(Retry::of(code), Retry::Later, "{code:?}");
        }
        assert_eq!(Retry::of_status(99), Retry::Later, "not a gRPC code");
    }

    /// The cases the provisioner's placement and the extender's
    /// reservations used to answer differently: every answer the bridge
    /// retries soon (`CANCELLED` too) leaves the volume holding its room.
    #[test]
    fn a_volume_still_being_retried_holds_room() {
        assert!(lv(None).is_pending(), "no status yet");
        assert!(lv(Some(LogicVolumeStatus::default())).is_pending());
        assert!(answered(Code::Ok).is_pending(), "code 0 is no outcome");
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Aborted,
            Code::Cancelled,
        ] {
            assert!(answered(code).is_pending(), "{code:?}");
        }
        for code in [
            Code::ResourceExhausted,
            Code::InvalidArgument,
            Code::Internal,
            Code::FailedPrecondition,
        ] {
            assert!(!answered(code).is_pending(), "{code:?}");
        }
    }

    #[test]
    fn made_or_deleted_volumes_are_not_pending() {
        let made = lv(Some(LogicVolumeStatus {
            volume_id: Some("v@n".into()),
            code: Some(0),
            ..LogicVolumeStatus::default()
        }));
        assert!(made.is_made() && !made.is_pending());
        let empty_id = lv(Some(LogicVolumeStatus {
            volume_id: Some(String::new()),
            ..LogicVolumeStatus::default()
        }));
        assert!(!empty_id.is_made() && empty_id.is_pending());
        let mut deleting = answered(Code::Unavailable);
        deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert!(!deleting.is_pending());
    }
}
