//! The issuing endpoint: `carina.identity.v1.NodeIdentity` over TLS.
//!
//! [`IdentityService`] validates the request at the edge (`node_name` a
//! DNS name, `csr_pem` a request for that name only, a token present),
//! then asks its [`TokenChecker`] whether the token's pod runs on that
//! node, then charges the node's and the pod's rate limit ([`RateLimit`]),
//! then signs. Each issuance is logged at info (node, pod,
//! not_after); each refusal at warn with its code and reason, and answered
//! with the status of `error.rs`.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use carina_proto::identity::node_identity_server::{NodeIdentity, NodeIdentityServer};
use carina_proto::identity::{IssueCertificateRequest, IssueCertificateResponse};
use carina_proto::tls::{HANDSHAKE_TIMEOUT, ReloadingServerConfig, tls_incoming};
use carina_proto::trace::ServerTraceLayer;
use time::OffsetDateTime;
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::ca::ClusterCa;
use super::csr::check_csr;
use super::error::Refusal;
use super::limit::{RateLimit, RateSettings};
use super::review::{PodIdentity, TokenChecker};

/// `NodeIdentity` over a CA and a token checker.
#[derive(Debug)]
pub struct IdentityService<C> {
    ca: Arc<ClusterCa>,
    checker: C,
    ttl: Duration,
    limit: RateLimit,
}

impl<C: TokenChecker> IdentityService<C> {
    /// Signs certificates valid for `ttl` with `ca` for callers `checker`
    /// accepts, at most as often as `rate` allows per node and per pod.
    pub fn new(ca: Arc<ClusterCa>, checker: C, ttl: Duration, rate: RateSettings) -> Self {
        IdentityService {
            ca,
            checker,
            ttl,
            limit: RateLimit::new(rate),
        }
    }

    /// Charges one certificate to the node and to the pod.
    fn charge(&self, node: &str, pod: &PodIdentity) -> Result<(), Refusal> {
        let (node_key, pod_key) = (format!("node/{node}"), format!("pod/{}", pod.uid));
        self.limit
            .try_take(&[&node_key, &pod_key], Instant::now())
            .map_err(|(which, retry_after)| Refusal::RateLimited {
                what: if which == 0 { "node" } else { "pod" },
                key: if which == 0 {
                    node.to_string()
                } else {
                    pod.to_string()
                },
                retry_after,
            })
    }

    pub fn into_server(self) -> NodeIdentityServer<Self> {
        NodeIdentityServer::new(self)
    }

    async fn issue(
        &self,
        req: &IssueCertificateRequest,
    ) -> Result<(IssueCertificateResponse, PodIdentity, OffsetDateTime), Refusal> {
        check_node_name(&req.node_name)?;
        if req.csr_pem.trim().is_empty() {
            return Err(Refusal::InvalidField {
                field: "csr_pem",
                reason: "empty".into(),
            });
        }
        let csr = check_csr(&req.csr_pem, &req.node_name)?;
        if req.token.trim().is_empty() {
            return Err(Refusal::NoToken);
        }
        let pod = self.checker.check(req.token.trim(), &req.node_name).await?;
        self.charge(&req.node_name, &pod)?;
        let issued = self
            .ca
            .sign_node(&req.node_name, &csr.public_key, self.ttl)?;
        let not_after = issued.not_after;
        let response = IssueCertificateResponse {
            certificate_chain_pem: issued.chain_pem,
            ca_pem: self.ca.bundle_pem().to_string(),
            not_after: Some(prost_types::Timestamp {
                seconds: not_after.unix_timestamp(),
                nanos: i32::try_from(not_after.nanosecond()).unwrap_or(0),
            }),
        };
        Ok((response, pod, not_after))
    }
}

#[tonic::async_trait]
impl<C: TokenChecker> NodeIdentity for IdentityService<C> {
    async fn issue_certificate(
        &self,
        request: Request<IssueCertificateRequest>,
    ) -> Result<Response<IssueCertificateResponse>, Status> {
        let peer = request
            .remote_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let req = request.into_inner();
        let span = tracing::info_span!(
            "NodeIdentity::IssueCertificate",
            k8s.node.name = %req.node_name,
            network.peer.address = %peer,
        );
        async move {
            match self.issue(&req).await {
                Ok((response, pod, not_after)) => {
                    tracing::info!(
                        k8s.node.name = %req.node_name,
                        pod = %pod,
                        %not_after,
                        "issued a node certificate"
                    );
                    Ok(Response::new(response))
                }
                Err(refusal) => {
                    tracing::warn!(
                        k8s.node.name = %req.node_name,
                        code = carina_proto::code_name(refusal.code()),
                        reason = %refusal,
                        "refused a node certificate"
                    );
                    Err(refusal.into())
                }
            }
        }
        .instrument(span)
        .await
    }
}

/// `node_name` must be a Kubernetes node name: a DNS subdomain (RFC 1123:
/// at most 253 characters, dot-separated labels of lower-case letters,
/// digits and inner hyphens, each at most 63).
pub fn check_node_name(name: &str) -> Result<(), Refusal> {
    let bad = |reason: String| Refusal::InvalidField {
        field: "node_name",
        reason,
    };
    if name.is_empty() {
        return Err(bad("empty".into()));
    }
    if name.len() > 253 {
        return Err(bad(format!("{} characters, at most 253", name.len())));
    }
    if !carina_csi::names::is_node_name(name) {
        return Err(bad(format!(
            "{name:?} is not a DNS subdomain (lower-case letters, digits, '-' and '.')"
        )));
    }
    Ok(())
}

/// Serves `service`, and the `extra` routes beside it, on `listener` over
/// `tls` until `shutdown`.
pub async fn serve<C: TokenChecker>(
    listener: TcpListener,
    tls: ReloadingServerConfig,
    service: IdentityService<C>,
    extra: Option<axum::Router>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let incoming = tls_incoming(listener, tls, HANDSHAKE_TIMEOUT);
    let mut routes = tonic::service::Routes::new(service.into_server()).into_axum_router();
    if let Some(extra) = extra {
        routes = routes.merge(extra);
    }
    Server::builder()
        .layer(ServerTraceLayer)
        .add_routes(routes.into())
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;
    use rcgen::{CertificateParams, KeyPair, SanType};
    use tonic::Code;

    use super::*;

    /// Accepts the token "good" for node-a only.
    struct FixedChecker;

    #[async_trait]
    impl TokenChecker for FixedChecker {
        async fn check(&self, token: &str, node: &str) -> Result<PodIdentity, Refusal> {
            match (token, node) {
                ("good", "node-a") => Ok(PodIdentity {
                    namespace: "kube-system".into(),
                    name: "carina-node-x".into(),
                    uid: "uid-x".into(),
                }),
                ("other-pod", "node-a") => Ok(PodIdentity {
                    namespace: "kube-system".into(),
                    name: "carina-node-y".into(),
                    uid: "uid-y".into(),
                }),
                ("other-pod", "node-b") => Ok(PodIdentity {
                    namespace: "kube-system".into(),
                    name: "carina-node-y".into(),
                    uid: "uid-y".into(),
                }),
                ("good", other) => Err(Refusal::WrongNode {
                    pod: "kube-system/carina-node-x".into(),
                    pod_node: "node-a".into(),
                    node: other.into(),
                }),
                _ => Err(Refusal::TokenRejected {
                    reason: "token has expired".into(),
                }),
            }
        }
    }

    fn csr_for(name: &str) -> String {
        let mut params = CertificateParams::default();
        params.subject_alt_names =
            vec![SanType::DnsName(name.to_string().try_into().expect("ia5"))];
        params
            .serialize_request(&KeyPair::generate().expect("key"))
            .expect("CSR")
            .pem()
            .expect("PEM")
    }

    fn request(node: &str, csr_pem: String, token: &str) -> Request<IssueCertificateRequest> {
        Request::new(IssueCertificateRequest {
            node_name: node.into(),
            csr_pem,
            token: token.into(),
        })
    }

    fn service() -> IdentityService<FixedChecker> {
        let ca = Arc::new(ClusterCa::generate("ca").expect("CA"));
        IdentityService::new(
            ca,
            FixedChecker,
            Duration::from_secs(600),
            RateSettings::for_ttl(Duration::from_secs(600)),
        )
    }

    #[tokio::test]
    async fn too_many_certificates_for_a_node_or_a_pod_are_refused() {
        let ca = Arc::new(ClusterCa::generate("ca").expect("CA"));
        let rate = RateSettings {
            burst: 2,
            interval: Duration::from_secs(3600),
        };
        let svc = IdentityService::new(ca, FixedChecker, Duration::from_secs(600), rate);
        for _ in 0..2 {
            svc.issue_certificate(request("node-a", csr_for("node-a"), "good"))
                .await
                .expect("within the burst");
        }
        let status = svc
            .issue_certificate(request("node-a", csr_for("node-a"), "good"))
            .await
            .expect_err("over the limit");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains("node \"node-a\""), "{status:?}");
        // Another pod on the same node: the node's allowance is spent.
        let status = svc
            .issue_certificate(request("node-a", csr_for("node-a"), "other-pod"))
            .await
            .expect_err("the node is over the limit");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        // Refusals before the token check charge nothing: node-b is fresh,
        // and the pod was not charged by the refused call above.
        for _ in 0..2 {
            let refused = svc
                .issue_certificate(request("node-b", csr_for("node-b"), "bad"))
                .await
                .expect_err("bad token");
            assert_eq!(refused.code(), Code::Unauthenticated);
        }
        for _ in 0..2 {
            svc.issue_certificate(request("node-b", csr_for("node-b"), "other-pod"))
                .await
                .expect("the pod's and node-b's allowance");
        }
        let status = svc
            .issue_certificate(request("node-b", csr_for("node-b"), "other-pod"))
            .await
            .expect_err("over the limit");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    }

    #[tokio::test]
    async fn issues_for_the_right_node_and_refuses_the_rest() {
        let svc = service();
        let ok = svc
            .issue_certificate(request("node-a", csr_for("node-a"), "good"))
            .await
            .expect("issued")
            .into_inner();
        assert_eq!(
            ok.certificate_chain_pem
                .matches("BEGIN CERTIFICATE")
                .count(),
            2
        );
        assert!(
            ok.not_after.expect("not_after").seconds > OffsetDateTime::now_utc().unix_timestamp()
        );

        let cases = [
            (
                request("", csr_for("node-a"), "good"),
                Code::InvalidArgument,
                "node_name: empty",
            ),
            (
                request("Node_A", csr_for("node-a"), "good"),
                Code::InvalidArgument,
                "node_name:",
            ),
            (
                request("node-a", String::new(), "good"),
                Code::InvalidArgument,
                "csr_pem: empty",
            ),
            (
                request("node-a", csr_for("node-b"), "good"),
                Code::InvalidArgument,
                "csr_pem:",
            ),
            (
                request("node-a", csr_for("node-a"), ""),
                Code::Unauthenticated,
                "token: empty",
            ),
            (
                request("node-a", csr_for("node-a"), "old"),
                Code::Unauthenticated,
                "expired",
            ),
            (
                request("node-b", csr_for("node-b"), "good"),
                Code::PermissionDenied,
                "runs on node",
            ),
        ];
        for (req, code, text) in cases {
            let status = svc.issue_certificate(req).await.expect_err("refused");
            assert_eq!(status.code(), code, "{status:?}");
            assert!(status.message().contains(text), "{status:?}");
        }
    }

    #[test]
    fn node_names() {
        for ok in ["node-a", "a", "ip-10-0-0-1.ec2.internal", "x1"] {
            assert!(check_node_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "a..b", "A", "a_b", &"a".repeat(254)] {
            assert!(check_node_name(bad).is_err(), "{bad}");
        }
    }
}
