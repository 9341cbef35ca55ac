//! CSI Identity and Node on a unix socket (kubelet's plugin socket,
//! `--csi-endpoint`), in the binary and in-process for tests:
//!
//! ```ignore
//! let listener = bind("unix:///csi/csi.sock")?;
//! CsiNodeServer::new(engine, "node-a").serve(listener, shutdown).await?;
//! ```
//!
//! Shutdown works like NodeStorage's: no new connections, in-flight calls
//! get the grace period, then the socket file is removed.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use carina_csi::LocalVolumes;
use carina_csi::identity::IdentityService;
use carina_csi::node::NodeService;
use carina_proto::csi::identity_server::IdentityServer;
use carina_proto::csi::node_server::NodeServer as CsiNodeService;
use carina_proto::trace::ServerTraceLayer;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tonic::transport::Server;

use super::EngineVolumes;
use crate::engine::Engine;
use crate::server::DEFAULT_GRACE_PERIOD;

/// Errors of binding and serving the CSI socket.
#[derive(Debug, thiserror::Error)]
pub enum CsiServeError {
    #[error(transparent)]
    Socket(#[from] carina_csi::socket::SocketError),
    #[error("CSI gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

pub use carina_csi::socket::{bind, socket_path};

/// Builder and runner of the node's CSI server.
#[derive(Debug)]
pub struct CsiNodeServer {
    volumes: EngineVolumes,
    grace_period: Duration,
}

impl CsiNodeServer {
    /// CSI for `engine` on the node `node_name` (the node id and topology
    /// value; volume ids of other nodes are NOT_FOUND here).
    pub fn new(engine: Engine, node_name: impl Into<String>) -> Self {
        CsiNodeServer {
            volumes: EngineVolumes::new(engine, node_name),
            grace_period: DEFAULT_GRACE_PERIOD,
        }
    }

    /// NodeGetInfo's `max_volumes_per_node` (default 0: no limit).
    pub fn max_volumes(mut self, max_volumes: u64) -> Self {
        self.volumes = self.volumes.with_max_volumes(max_volumes);
        self
    }

    /// How long in-flight calls may run on after shutdown starts.
    pub fn grace_period(mut self, grace_period: Duration) -> Self {
        self.grace_period = grace_period;
        self
    }

    /// Serves Identity (always ready: the engine has started) and Node on
    /// `listener` until `shutdown` completes, then gives in-flight calls
    /// the grace period and removes the socket file.
    pub async fn serve(
        self,
        listener: UnixListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), CsiServeError> {
        let socket = listener
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(Path::to_path_buf));
        let node_name = self.volumes.node_id().to_string();
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let grace = self.grace_period;
        let signal = async move {
            shutdown.await;
            tracing::info!(grace_period = ?grace, "CSI: shutting down, in-flight calls may finish");
            let _ = stop_tx.send(true);
        };
        let router = Server::builder()
            .layer(ServerTraceLayer)
            .layer(crate::latency::latency().grpc().layer())
            .add_service(IdentityServer::new(IdentityService::always_ready()))
            .add_service(CsiNodeService::new(NodeService::new(self.volumes)));
        tracing::info!(carina.csi.socket = ?socket, k8s.node.name = %node_name, "CSI Identity and Node serving");
        let serve =
            router.serve_with_incoming_shutdown(carina_proto::uds::incoming(listener), signal);
        let deadline = async move {
            let _ = stop_rx.wait_for(|s| *s).await;
            tokio::time::sleep(grace).await;
        };
        let result = tokio::select! {
            result = serve => result.map_err(CsiServeError::from),
            _ = deadline => {
                tracing::warn!(grace_period = ?grace, "CSI: grace period over, dropping the calls still running");
                Ok(())
            }
        };
        if let Some(path) = socket {
            let _ = std::fs::remove_file(path);
        }
        tracing::info!("CSI server stopped");
        result
    }
}
