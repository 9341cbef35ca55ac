//! CSI Identity and Node on a unix socket (kubelet's plugin socket,
//! `--csi-endpoint`), in the binary and in-process for tests:
//!
//! ```ignore
//! let listener = bind(&socket_path("unix:///csi/csi.sock")?)?;
//! CsiNodeServer::new(engine, "node-a").serve(listener, shutdown).await?;
//! ```
//!
//! Shutdown works like NodeStorage's: no new connections, in-flight calls
//! get the grace period, then the socket file is removed.

use std::future::Future;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use carina_csi::LocalVolumes;
use carina_csi::identity::IdentityService;
use carina_csi::node::NodeService;
use carina_proto::csi::identity_server::IdentityServer;
use carina_proto::csi::node_server::NodeServer as CsiNodeService;
use carina_proto::trace::ServerTraceLayer;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

use super::EngineVolumes;
use crate::engine::Engine;
use crate::server::DEFAULT_GRACE_PERIOD;

/// Errors of binding and serving the CSI socket.
#[derive(Debug, thiserror::Error)]
pub enum CsiServeError {
    #[error("CSI endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("CSI gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The socket path of a CSI endpoint: `unix:///path`, `unix:/path` or a
/// plain absolute path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, CsiServeError> {
    let bad = |reason: &str| CsiServeError::Endpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let path = match endpoint.split_once("://") {
        Some(("unix", rest)) => rest,
        Some(_) => return Err(bad("only unix sockets are served (unix:///path)")),
        None => endpoint.strip_prefix("unix:").unwrap_or(endpoint),
    };
    if !path.starts_with('/') {
        return Err(bad("the socket path must be absolute"));
    }
    Ok(PathBuf::from(path))
}

/// Binds the socket at `path`: a stale socket file from an earlier run is
/// removed first (anything else there is refused, never removed), and a
/// missing parent directory is created. Call it inside the runtime.
pub fn bind(path: &Path) -> Result<UnixListener, CsiServeError> {
    let io = |action: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| CsiServeError::Io {
            action,
            path,
            source,
        }
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(io("remove stale socket", path))?;
        }
        Ok(_) => {
            return Err(CsiServeError::Endpoint {
                endpoint: path.display().to_string(),
                reason: "exists and is not a socket".into(),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("inspect", path)(e)),
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io("create directory", parent))?;
    }
    UnixListener::bind(path).map_err(io("bind", path))
}

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
            .add_service(IdentityServer::new(IdentityService::always_ready()))
            .add_service(CsiNodeService::new(NodeService::new(self.volumes)));
        tracing::info!(csi.socket = ?socket, node.name = %node_name, "CSI Identity and Node serving");
        let serve = router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), signal);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        for ok in [
            "unix:///csi/csi.sock",
            "unix:/csi/csi.sock",
            "/csi/csi.sock",
        ] {
            assert_eq!(
                socket_path(ok).expect(ok),
                PathBuf::from("/csi/csi.sock"),
                "{ok}"
            );
        }
        for bad in ["tcp://10.0.0.1:9000", "unix://", "csi.sock", ""] {
            assert!(socket_path(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn stale_socket_replaced_other_files_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("plugins/carina/csi.sock");
        drop(bind(&sock).expect("first bind creates the directory"));
        assert!(sock.exists(), "the socket file outlives its listener");
        drop(bind(&sock).expect("stale socket replaced"));
        let file = dir.path().join("file");
        std::fs::write(&file, "keep").expect("write");
        assert!(bind(&file).is_err());
        assert_eq!(std::fs::read_to_string(&file).expect("kept"), "keep");
    }
}
