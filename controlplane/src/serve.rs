//! Serving the controller's CSI services (Identity and Controller) on a
//! unix socket, as the CSI sidecars and csi-sanity expect them.
//!
//! ```ignore
//! let listener = bind_unix("unix:///csi/csi.sock")?;
//! serve_controller(listener, Arc::new(provisioner), shutdown).await?;
//! ```

use std::future::Future;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use carina_csi::Provisioner;
use carina_csi::controller::ControllerService;
use carina_csi::identity::IdentityService;
use carina_proto::csi::identity_server::IdentityServer;
use carina_proto::trace::ServerTraceLayer;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

/// Errors binding the CSI socket.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("CSI endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The socket path of a CSI endpoint: `unix:///path`, `unix:/path` or a
/// plain path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, SocketError> {
    let path = match endpoint.split_once("://") {
        Some(("unix", rest)) => rest,
        Some((scheme, _)) => {
            return Err(SocketError::Endpoint {
                endpoint: endpoint.to_string(),
                reason: format!("scheme {scheme:?}: CSI is served on a unix socket (unix:///path)"),
            });
        }
        None => endpoint.strip_prefix("unix:").unwrap_or(endpoint),
    };
    if path.is_empty() {
        return Err(SocketError::Endpoint {
            endpoint: endpoint.to_string(),
            reason: "no socket path".into(),
        });
    }
    Ok(PathBuf::from(path))
}

/// Binds the CSI socket of `endpoint`, replacing a stale socket file left
/// by an earlier run (any other kind of file is refused, not removed) and
/// creating the parent directory.
pub fn bind_unix(endpoint: &str) -> Result<UnixListener, SocketError> {
    let path = socket_path(endpoint)?;
    let io_err = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| SocketError::Io { what, path, source }
    };
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(&path).map_err(io_err("remove stale socket", &path))?;
        }
        Ok(_) => {
            return Err(SocketError::Endpoint {
                endpoint: endpoint.to_string(),
                reason: format!("{} exists and is not a socket", path.display()),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("inspect", &path)(e)),
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io_err("create directory", parent))?;
    }
    UnixListener::bind(&path).map_err(io_err("bind", &path))
}

/// Serves CSI Identity (always ready) and Controller over `provisioner`
/// on `listener` until `shutdown` completes; in-flight calls finish first.
pub async fn serve_controller<P: Provisioner>(
    listener: UnixListener,
    provisioner: Arc<P>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    Server::builder()
        .layer(ServerTraceLayer)
        .add_service(IdentityServer::new(IdentityService::always_ready()))
        .add_service(ControllerService::new(provisioner).into_server())
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").expect("ok"),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("unix:/csi/csi.sock").expect("ok"),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("/csi/csi.sock").expect("ok"),
            PathBuf::from("/csi/csi.sock")
        );
        assert!(socket_path("tcp://1.2.3.4:5").is_err());
        assert!(socket_path("unix://").is_err());
    }

    #[tokio::test]
    async fn stale_sockets_are_replaced_other_files_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("sub/csi.sock");
        let endpoint = format!("unix://{}", sock.display());
        drop(bind_unix(&endpoint).expect("first bind"));
        bind_unix(&endpoint).expect("stale socket replaced");
        let file = dir.path().join("file");
        std::fs::write(&file, "keep").expect("write");
        assert!(bind_unix(&file.display().to_string()).is_err());
        assert_eq!(std::fs::read_to_string(&file).expect("kept"), "keep");
    }
}
