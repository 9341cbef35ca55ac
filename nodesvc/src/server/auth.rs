//! Authorization by certificate role, as a tower layer in front of every
//! gRPC service of the node.
//!
//! The TLS handshake has already proven that the client holds a
//! certificate signed by the CA. This layer reads the role from that
//! certificate's URI SAN `spiffe://<trust-domain>/carina/<role>` and
//! decides per method:
//!
//! - `controller`: everything;
//! - `reader`: `GetLV`, `ListLVs`, `Capacity`, `WatchCapacity`,
//!   `ListDisks`, `GetBcache`, `ListPodIOLimits`;
//! - any authenticated client, whatever its role: gRPC health and
//!   reflection;
//! - anything else: `PERMISSION_DENIED`, naming the role and the method.
//!
//! The caller's role goes into the request extensions as [`Caller`].

use std::future::{Ready, ready};
use std::sync::Arc;
use std::task::{Context, Poll};

use carina_proto::tls::{Role, role_from_cert};
use futures::future::Either;
use tonic::Status;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tower::{Layer, Service};

use super::metrics::Metrics;

const NODE_STORAGE_PREFIX: &str = "/carina.nodestorage.v1.NodeStorage/";

/// NodeStorage methods a `reader` may call.
const READ_METHODS: &[&str] = &[
    "GetLV",
    "ListLVs",
    "Capacity",
    "WatchCapacity",
    "ListDisks",
    "GetBcache",
    "ListPodIOLimits",
];

/// Services every authenticated client may call.
const OPEN_SERVICES: &[&str] = &[
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
];

/// Who is calling, as the auth layer established it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// `None` when the certificate names no role (it may still call the
    /// open services).
    pub role: Option<Role>,
}

/// The label a request path gets in logs and metrics: the bare method for
/// NodeStorage (`CreateLV`), `service/method` for the rest.
pub fn method_label(path: &str) -> &str {
    path.strip_prefix(NODE_STORAGE_PREFIX)
        .unwrap_or_else(|| path.trim_start_matches('/'))
}

/// Whether `role` may call the method at `path` (`/package.Service/Method`).
pub fn allowed(role: Option<&Role>, path: &str) -> bool {
    if OPEN_SERVICES.iter().any(|s| path.starts_with(s)) {
        return true;
    }
    match role {
        Some(Role::Controller) => true,
        Some(Role::Reader) => path
            .strip_prefix(NODE_STORAGE_PREFIX)
            .is_some_and(|m| READ_METHODS.contains(&m)),
        Some(Role::Other(_)) | None => false,
    }
}

/// The decision for one request: the caller, or the status to answer with.
fn authorize<B>(req: &http::Request<B>, trust_domain: &str) -> Result<Caller, Status> {
    let path = req.uri().path();
    let certs = req
        .extensions()
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|info| info.peer_certs());
    let Some(leaf) = certs.as_ref().and_then(|c| c.first()) else {
        // The TLS config requires a client certificate, so this only
        // happens if the service is mounted without mutual TLS.
        return Err(Status::unauthenticated("no client certificate"));
    };
    let role = role_from_cert(leaf, trust_domain);
    let allowed = allowed(role.as_ref().ok(), path);
    match (role, allowed) {
        (Ok(role), true) => Ok(Caller { role: Some(role) }),
        (Err(_), true) => Ok(Caller { role: None }),
        (Ok(role), false) => Err(Status::permission_denied(format!(
            "role {:?} may not call {}",
            role.as_str(),
            method_label(path)
        ))),
        (Err(e), false) => Err(Status::permission_denied(format!(
            "{e}; no role may call {}",
            method_label(path)
        ))),
    }
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    trust_domain: Arc<str>,
    metrics: Arc<Metrics>,
}

impl AuthLayer {
    pub fn new(trust_domain: &str, metrics: Arc<Metrics>) -> Self {
        AuthLayer {
            trust_domain: trust_domain.into(),
            metrics,
        }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Auth {
            inner,
            layer: self.clone(),
        }
    }
}

/// See [`AuthLayer`].
#[derive(Debug, Clone)]
pub struct Auth<S> {
    inner: S,
    layer: AuthLayer,
}

impl<S, B, R> Service<http::Request<B>> for Auth<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    R: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<Ready<Result<Self::Response, Self::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        match authorize(&req, &self.layer.trust_domain) {
            Ok(caller) => {
                req.extensions_mut().insert(caller);
                Either::Right(self.inner.call(req))
            }
            Err(status) => {
                let method = method_label(req.uri().path());
                tracing::info!(rpc.method = %method, code = ?status.code(), message = %status.message(), "call refused");
                self.layer.metrics.observe(method, status.code());
                Either::Left(ready(Ok(status.into_http())))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_table() {
        let ns = |m: &str| format!("{NODE_STORAGE_PREFIX}{m}");
        let controller = Some(Role::Controller);
        let reader = Some(Role::Reader);
        let other = Some(Role::Other("admin".into()));
        for m in [
            "CreateLV",
            "DeleteLV",
            "ResizeLV",
            "ApplyConfig",
            "CreateBcache",
            "DeleteBcache",
            "SetCacheMode",
        ] {
            assert!(allowed(controller.as_ref(), &ns(m)), "{m}");
            assert!(!allowed(reader.as_ref(), &ns(m)), "{m}");
            assert!(!allowed(other.as_ref(), &ns(m)), "{m}");
            assert!(!allowed(None, &ns(m)), "{m}");
        }
        for m in READ_METHODS {
            assert!(allowed(controller.as_ref(), &ns(m)), "{m}");
            assert!(allowed(reader.as_ref(), &ns(m)), "{m}");
            assert!(!allowed(other.as_ref(), &ns(m)), "{m}");
        }
        for p in [
            "/grpc.health.v1.Health/Check",
            "/grpc.health.v1.Health/Watch",
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        ] {
            assert!(allowed(other.as_ref(), p), "{p}");
            assert!(allowed(None, p), "{p}");
        }
        assert!(!allowed(
            reader.as_ref(),
            "/carina.nodestorage.v1.NodeStorage"
        ));
        assert!(!allowed(reader.as_ref(), "/other.Service/GetLV"));
    }

    #[test]
    fn labels() {
        assert_eq!(
            method_label(&format!("{NODE_STORAGE_PREFIX}CreateLV")),
            "CreateLV"
        );
        assert_eq!(
            method_label("/grpc.health.v1.Health/Check"),
            "grpc.health.v1.Health/Check"
        );
    }

    #[test]
    fn without_tls_info_is_unauthenticated() {
        let req = http::Request::builder()
            .uri(format!("{NODE_STORAGE_PREFIX}GetLV"))
            .body(())
            .expect("valid");
        let status = authorize(&req, "carina.storage.io").expect_err("refused");
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
    }
}
