//! Why a certificate is refused, and the one mapping from a refusal to its
//! gRPC status:
//!
//! | refusal | code |
//! | --- | --- |
//! | a missing or malformed field, a CSR asking for more than the node's name | `INVALID_ARGUMENT` |
//! | no token, or a token Kubernetes does not accept (expired, another audience, its pod gone) | `UNAUTHENTICATED` |
//! | a valid token that may not have this certificate (another ServiceAccount, no pod, a pod on another node, a pod the node DaemonSet does not control, a terminating or finished pod) | `PERMISSION_DENIED` |
//! | more certificates for one node or one pod than the rate limit allows | `RESOURCE_EXHAUSTED` |
//! | the Kubernetes API could not be asked | `UNAVAILABLE` |
//! | the CA could not sign | `INTERNAL` |

use tonic::{Code, Status};

use super::ca::CaError;
use super::csr::CsrError;

/// A refused `IssueCertificate`, with its reason.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("{field}: {reason}")]
    InvalidField { field: &'static str, reason: String },
    #[error(transparent)]
    Csr(#[from] CsrError),
    #[error("token: empty; send the pod's projected ServiceAccount token")]
    NoToken,
    #[error("token: not accepted by the Kubernetes API: {reason}")]
    TokenRejected { reason: String },
    #[error("token: its audiences {found:?} do not include {expected:?}")]
    WrongAudience {
        found: Vec<String>,
        expected: String,
    },
    #[error("token: belongs to {found:?}; only {expected:?} may ask for node certificates")]
    WrongServiceAccount { found: String, expected: String },
    #[error("token: not bound to a pod (use a projected ServiceAccount token)")]
    NotBoundToPod,
    #[error("token: its pod {pod} no longer exists")]
    PodGone { pod: String },
    #[error("token: its pod {pod} was replaced by another pod of the same name")]
    PodReplaced { pod: String },
    #[error("token: its pod {pod} runs on node {pod_node:?}, not on {node:?}")]
    WrongNode {
        pod: String,
        pod_node: String,
        node: String,
    },
    #[error("token: its pod {pod} is not scheduled to a node, so not to {node:?}")]
    NotScheduled { pod: String, node: String },
    #[error("token: its pod {pod} is not controlled by DaemonSet {daemonset}: {found}")]
    NotDaemonSetPod {
        pod: String,
        daemonset: String,
        found: String,
    },
    #[error("token: its pod {pod} is {state}; only a running node pod gets a certificate")]
    PodNotRunning { pod: String, state: String },
    #[error(
        "rate limit: {what} {key:?} was issued its allowance of certificates; retry in {}s",
        .retry_after.as_secs().max(1)
    )]
    RateLimited {
        what: &'static str,
        key: String,
        retry_after: std::time::Duration,
    },
    #[error("cannot check the token: {what}: {source}")]
    Kubernetes {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot sign: {0}")]
    Sign(#[from] CaError),
}

impl Refusal {
    /// The gRPC code of this refusal (the table above).
    pub fn code(&self) -> Code {
        match self {
            Refusal::InvalidField { .. } | Refusal::Csr(_) => Code::InvalidArgument,
            Refusal::NoToken | Refusal::TokenRejected { .. } | Refusal::WrongAudience { .. } => {
                Code::Unauthenticated
            }
            Refusal::WrongServiceAccount { .. }
            | Refusal::NotBoundToPod
            | Refusal::PodGone { .. }
            | Refusal::PodReplaced { .. }
            | Refusal::WrongNode { .. }
            | Refusal::NotScheduled { .. }
            | Refusal::NotDaemonSetPod { .. }
            | Refusal::PodNotRunning { .. } => Code::PermissionDenied,
            Refusal::RateLimited { .. } => Code::ResourceExhausted,
            Refusal::Kubernetes { .. } => Code::Unavailable,
            Refusal::Sign(_) => Code::Internal,
        }
    }
}

impl From<Refusal> for Status {
    fn from(refusal: Refusal) -> Status {
        Status::new(refusal.code(), refusal.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_table() {
        let status = Status::from(Refusal::WrongNode {
            pod: "kube-system/carina-node-x".into(),
            pod_node: "node-b".into(),
            node: "node-a".into(),
        });
        assert_eq!(status.code(), Code::PermissionDenied);
        assert_eq!(
            status.message(),
            "token: its pod kube-system/carina-node-x runs on node \"node-b\", not on \"node-a\""
        );
        assert_eq!(Refusal::NoToken.code(), Code::Unauthenticated);
        let csr = Refusal::from(CsrError::NoName {
            node: "node-a".into(),
        });
        assert_eq!(csr.code(), Code::InvalidArgument);
        assert!(csr.to_string().starts_with("csr_pem:"));
        let limited = Status::from(Refusal::RateLimited {
            what: "node",
            key: "node-a".into(),
            retry_after: std::time::Duration::from_millis(1500),
        });
        assert_eq!(limited.code(), Code::ResourceExhausted);
        assert!(limited.message().contains("retry in 1s"), "{limited:?}");
    }
}
