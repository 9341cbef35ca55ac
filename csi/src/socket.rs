//! The unix socket CSI is served on (kubelet's plugin socket, the
//! sidecars' `--csi-address`): endpoint parsing and binding, shared by the
//! node and the controller.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;

use carina_sys::IoError;
use tokio::net::UnixListener;

/// Errors of parsing a CSI endpoint and binding its socket.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("CSI endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error(transparent)]
    Io(#[from] IoError),
}

/// The socket path of a CSI endpoint: `unix:///path`, `unix:/path` or a
/// plain absolute path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, SocketError> {
    let bad = |reason: String| SocketError::Endpoint {
        endpoint: endpoint.to_string(),
        reason,
    };
    let path = match endpoint.split_once("://") {
        Some(("unix", rest)) => rest,
        Some((scheme, _)) => {
            return Err(bad(format!(
                "scheme {scheme:?}: CSI is served on a unix socket (unix:///path)"
            )));
        }
        None => endpoint.strip_prefix("unix:").unwrap_or(endpoint),
    };
    if !path.starts_with('/') {
        return Err(bad("the socket path must be absolute".into()));
    }
    Ok(PathBuf::from(path))
}

/// Binds the socket of `endpoint`: a stale socket file from an earlier run
/// is removed first (any other kind of file is refused, never removed), and
/// a missing parent directory is created. Call it inside the runtime.
pub fn bind(endpoint: &str) -> Result<UnixListener, SocketError> {
    let path = socket_path(endpoint)?;
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(&path).map_err(IoError::map("remove stale socket", &path))?;
        }
        Ok(_) => {
            return Err(SocketError::Endpoint {
                endpoint: endpoint.to_string(),
                reason: format!("{} exists and is not a socket", path.display()),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(IoError::new("inspect", path, e).into()),
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(IoError::map("create directory", parent))?;
    }
    Ok(UnixListener::bind(&path).map_err(IoError::map("bind", &path))?)
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
        let endpoint = format!("unix://{}", sock.display());
        drop(bind(&endpoint).expect("first bind creates the directory"));
        assert!(sock.exists(), "the socket file outlives its listener");
        drop(bind(&endpoint).expect("stale socket replaced"));
        let file = dir.path().join("file");
        std::fs::write(&file, "keep").expect("write");
        assert!(bind(&file.display().to_string()).is_err());
        assert_eq!(std::fs::read_to_string(&file).expect("kept"), "keep");
    }
}
