//! The one place the provisioner maps codes to CSI answers: the numeric gRPC
//! code the bridge writes into `status.code`, and the errors of Kubernetes
//! API calls. Pure functions; no API calls here.

use carina_api::state::Retry;
use carina_csi::CsiError;
use tonic::Code;

/// Maps a numeric gRPC code from the bridge to the CSI answer.
pub fn status_error(code: i32, message: String) -> CsiError {
    match Code::from_i32(code) {
        Code::ResourceExhausted => CsiError::ResourceExhausted(message),
        Code::InvalidArgument => CsiError::invalid("volume", message),
        Code::AlreadyExists => CsiError::AlreadyExists(message),
        Code::Aborted => CsiError::Aborted(message),
        // The other answers the bridge tries again soon: not final.
        c if Retry::of(c) == Retry::Soon => CsiError::Unavailable(message),
        Code::OutOfRange => CsiError::OutOfRange(message),
        other => CsiError::Internal(format!("{}: {message}", code_name(other as i32))),
    }
}

pub(super) fn code_name(code: i32) -> &'static str {
    carina_proto::code_name(Code::from_i32(code))
}

/// Maps a Kubernetes API error; `what` names the call.
pub(super) fn api_error(what: &str, e: kube::Error) -> CsiError {
    match &e {
        kube::Error::Api(s) if s.is_not_found() => CsiError::NotFound(format!("{what}: {e}")),
        kube::Error::Api(s) if s.is_conflict() => CsiError::Aborted(format!("{what}: {e}")),
        kube::Error::Api(s) if s.code == 429 || s.code >= 500 => {
            CsiError::Unavailable(format!("{what}: {e}"))
        }
        kube::Error::Api(_) | kube::Error::SerdeError(_) | kube::Error::BuildRequest(_) => {
            CsiError::Internal(format!("{what}: {e}"))
        }
        // Transport: the apiserver cannot be reached now.
        _ => CsiError::Unavailable(format!("{what}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_codes_map_to_csi_codes() {
        let cases = [
            (Code::ResourceExhausted, Code::ResourceExhausted),
            (Code::InvalidArgument, Code::InvalidArgument),
            (Code::AlreadyExists, Code::AlreadyExists),
            (Code::Unavailable, Code::Unavailable),
            (Code::DeadlineExceeded, Code::Unavailable),
            (Code::Cancelled, Code::Unavailable),
            (Code::Aborted, Code::Aborted),
            (Code::OutOfRange, Code::OutOfRange),
            (Code::Internal, Code::Internal),
            (Code::PermissionDenied, Code::Internal),
            (Code::FailedPrecondition, Code::Internal),
        ];
        for (from, want) in cases {
            let e = status_error(from as i32, "lvcreate said no".into());
            assert_eq!(e.code(), want, "{from:?}");
            assert!(e.to_string().contains("lvcreate said no"), "{e}");
        }
        let e = status_error(13, "boom".into());
        assert!(e.to_string().starts_with("INTERNAL"), "{e}");
    }
}
