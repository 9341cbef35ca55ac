//! Why a `LogicVolume` reconcile failed ([`Error`]), the gRPC code each
//! failure writes to `status.code`, and how soon each is worth trying again
//! ([`Retry`]: the class of a node's answer is the one rule of
//! [`carina_api::state`], which the provisioner and the scheduler read
//! too; the kinds of failure that are not a node's answer are classed
//! here). Pure; no API calls here.

pub(super) use carina_api::state::Retry;
use carina_csi::CsiError;
use carina_proto::tls::TlsError;
use kube::runtime::finalizer;
use tonic::Code;

use crate::kube::endpoints::EndpointError;

/// Why a `LogicVolume` (or [`crate::kube::bridge_side::run`]) failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field of the object is unusable.
    #[error("{field}: {reason}")]
    Spec { field: &'static str, reason: String },
    /// The node's endpoint cannot be told.
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
    /// The node answered with an error or could not be reached.
    #[error(transparent)]
    Node(CsiError),
    /// Writing the object's status failed.
    #[error("write the status of LogicVolume {name}: {source}")]
    Status {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Adding or removing the finalizer failed, or the step inside did.
    #[error(transparent)]
    Finalizer(Box<finalizer::Error<Error>>),
    /// The client TLS material does not make a client configuration.
    #[error("TLS client configuration: {0}")]
    Tls(#[from] TlsError),
}

impl Error {
    /// The gRPC code written to `status.code` for this error; `None` for
    /// errors of the Kubernetes API, which are not the node's answer.
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Spec { .. } => Some(Code::InvalidArgument),
            Error::Endpoint(_) => Some(Code::Unavailable),
            Error::Node(e) => Some(e.code()),
            Error::Finalizer(e) => match &**e {
                finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e.code(),
                _ => None,
            },
            Error::Status { .. } | Error::Tls(_) => None,
        }
    }

    pub(super) fn retry(&self) -> Retry {
        match self {
            Error::Endpoint(EndpointError::Api { .. }) => Retry::Soon,
            Error::Endpoint(_) => Retry::Later,
            Error::Finalizer(e) => match &**e {
                finalizer::Error::ApplyFailed(e) => e.retry(),
                // A volume still in use is most often a pod's volume the
                // kubelet is unstaging right now (a claim deleted with its
                // pod): worth trying again soon, not every slow retry.
                finalizer::Error::CleanupFailed(e)
                    if e.code() == Some(Code::FailedPrecondition) =>
                {
                    Retry::Soon
                }
                finalizer::Error::CleanupFailed(e) => e.retry(),
                finalizer::Error::AddFinalizer(_) | finalizer::Error::RemoveFinalizer(_) => {
                    Retry::Soon
                }
                _ => Retry::Later,
            },
            Error::Status { .. } => Retry::Soon,
            _ => self.code().map_or(Retry::Soon, Retry::of),
        }
    }

    pub(super) fn is_cleanup(&self) -> bool {
        matches!(self, Error::Finalizer(e) if matches!(**e, finalizer::Error::CleanupFailed(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_classes() {
        // A node's answer is classed by the shared rule.
        for code in [Code::Cancelled, Code::ResourceExhausted, Code::Internal] {
            let e = Error::Node(CsiError::node("CreateLV", tonic::Status::new(code, "x")));
            assert_eq!(e.retry(), Retry::of(code), "{code:?}");
        }
        let cleanup = Error::Finalizer(Box::new(finalizer::Error::CleanupFailed(Error::Node(
            CsiError::ResourceExhausted("x".into()),
        ))));
        assert!(cleanup.is_cleanup());
        assert_eq!(cleanup.code(), Some(Code::ResourceExhausted));
        // A delete refused because the volume is still in use is retried
        // soon; the same code on a create is not.
        let in_use = |f: fn(Error) -> finalizer::Error<Error>| {
            Error::Finalizer(Box::new(f(Error::Node(CsiError::FailedPrecondition(
                "in use".into(),
            )))))
        };
        assert_eq!(in_use(finalizer::Error::CleanupFailed).retry(), Retry::Soon);
        assert_eq!(in_use(finalizer::Error::ApplyFailed).retry(), Retry::Later);
    }
}
