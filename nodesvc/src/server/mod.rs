//! The node's gRPC server: `NodeStorage` over mutual TLS, with gRPC health
//! and reflection, authorization by certificate role, W3C trace-context
//! propagation, and request metrics.
//!
//! - [`service`]: the `NodeStorage` implementation over the engine;
//! - [`convert`]: domain ↔ wire types and edge validation;
//! - [`status`]: the one engine-error → status-code table;
//! - [`auth`]: the role check, as a tower layer;
//! - [`metrics`]: counters and gauges, and the `/metrics` endpoint;
//! - [`compat_metrics`]: the families Go Carina exported (group capacity,
//!   per-volume IO counters), under its names;
//! - [`slow_gauge`]: a `/metrics` figure read beside the page, with its age.
//!
//! Layers, outermost first: trace context (the request span continues the
//! caller's trace), then authorization, then the services.

pub mod auth;
pub mod compat_metrics;
pub mod convert;
pub mod metrics;
pub mod service;
pub mod slow_gauge;
pub mod status;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use carina_proto::nodestorage::node_storage_server::NodeStorageServer;
use carina_proto::tls::{
    DEFAULT_TRUST_DOMAIN, HANDSHAKE_TIMEOUT, ReloadingServerConfig, tls_incoming,
};
use carina_proto::trace::ServerTraceLayer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::Server;

use self::auth::AuthLayer;
use self::metrics::Metrics;
use self::service::NodeStorageService;
use crate::engine::Engine;

/// How long in-flight calls may run on after shutdown starts.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(20);

/// Errors that stop the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Builder and runner of the node's gRPC server.
#[derive(Debug)]
pub struct NodeServer {
    engine: Engine,
    node_name: String,
    trust_domain: String,
    grace_period: Duration,
    metrics: Arc<Metrics>,
}

impl NodeServer {
    /// A server for `engine` on the node `node_name` (the DNS name its
    /// certificate carries).
    pub fn new(engine: Engine, node_name: impl Into<String>) -> Self {
        NodeServer {
            engine,
            node_name: node_name.into(),
            trust_domain: DEFAULT_TRUST_DOMAIN.to_string(),
            grace_period: DEFAULT_GRACE_PERIOD,
            metrics: Arc::new(Metrics::default()),
        }
    }

    /// The trust domain of client SPIFFE IDs (default `carina.storage.io`).
    pub fn trust_domain(mut self, trust_domain: impl Into<String>) -> Self {
        self.trust_domain = trust_domain.into();
        self
    }

    /// How long in-flight calls may run on after shutdown starts.
    pub fn grace_period(mut self, grace_period: Duration) -> Self {
        self.grace_period = grace_period;
        self
    }

    /// The counters this server updates (serve them with
    /// [`metrics::serve`]).
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Serves on `listener` with the TLS config in force at each accept,
    /// until `shutdown` completes. Then: no new connections, health turns
    /// NOT_SERVING, capacity watches end, and in-flight calls get the grace
    /// period to finish before the remaining connections are dropped.
    pub async fn serve(
        self,
        listener: TcpListener,
        tls: ReloadingServerConfig,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let service = NodeStorageService::new(
            self.engine.clone(),
            &self.node_name,
            self.metrics.clone(),
            stop_rx.clone(),
        );
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_serving::<NodeStorageServer<NodeStorageService>>()
            .await;
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(carina_proto::NODESTORAGE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let reflection_v1 = reflection().build_v1()?;
        let reflection_v1alpha = reflection().build_v1alpha()?;

        let local = listener.local_addr().ok();
        let incoming = tls_incoming(listener, tls, HANDSHAKE_TIMEOUT);
        let router = Server::builder()
            .layer(ServerTraceLayer)
            .layer(crate::latency::latency().grpc().layer())
            .layer(AuthLayer::new(&self.trust_domain, self.metrics.clone()))
            .add_service(NodeStorageServer::new(service))
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha);

        let grace = self.grace_period;
        let signal = async move {
            shutdown.await;
            tracing::info!(grace_period = ?grace, "shutting down: no new connections, in-flight calls may finish");
            health
                .set_not_serving::<NodeStorageServer<NodeStorageService>>()
                .await;
            let _ = stop_tx.send(true);
        };
        tracing::info!(listen = ?local, k8s.node.name = %self.node_name, trust_domain = %self.trust_domain, "NodeStorage serving over mutual TLS");
        let serve = router.serve_with_incoming_shutdown(incoming, signal);
        let mut stopping = stop_rx;
        let deadline = async move {
            let _ = stopping.wait_for(|s| *s).await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            result = serve => result?,
            _ = deadline => {
                tracing::warn!(grace_period = ?grace, "grace period over: dropping the calls still running");
            }
        }
        tracing::info!("NodeStorage stopped");
        Ok(())
    }
}
