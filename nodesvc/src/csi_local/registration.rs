//! kubelet plugin registration: carina-node tells kubelet about its CSI
//! socket itself, over kubelet's plugin-registration API
//! (`pluginregistration.Registration`), so the node pod needs no registrar
//! sidecar.
//!
//! kubelet watches its registration directory (`<kubelet dir>/plugins_registry`)
//! for unix sockets. [`PluginRegistration::bind`] creates
//! `<dir>/carina.storage.io-reg.sock`, replacing a stale socket a crashed
//! run left behind; [`PluginRegistration::serve`] answers kubelet's
//! `GetInfo` with the driver name and the CSI socket's path on the host,
//! and records the verdict kubelet sends back with
//! `NotifyRegistrationStatus` (a failure is logged; kubelet retries with a
//! new `GetInfo`, and the node keeps serving meanwhile). When shutdown
//! starts the socket is removed before anything else, so kubelet
//! deregisters the plugin; it is removed only while it is still the one
//! this process made (a newer carina-node may have replaced it).
//!
//! kubelet dials the CSI endpoint right after `GetInfo`, so bind the
//! registration socket only once the CSI socket is bound:
//!
//! ```ignore
//! let csi = carina_node::csi_local::serve::bind("unix:///var/lib/kubelet/plugins/carina.storage.io/csi.sock")?;
//! // ... spawn the CSI server on `csi` ...
//! let endpoint = advertised_endpoint(Some(csi_endpoint), None)?;
//! let registration = PluginRegistration::new("/var/lib/kubelet/plugins_registry", endpoint)?;
//! let socket = registration.bind()?;
//! registration.serve(socket, metrics, shutdown).await?;
//! ```

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use carina_csi::DRIVER_NAME;
use carina_csi::socket::{SocketError, socket_path};
use carina_proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use carina_proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use carina_proto::trace::ServerTraceLayer;
use carina_sys::IoError;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

use crate::server::metrics::Metrics;

/// `PluginInfo.type` of a CSI driver.
pub const PLUGIN_TYPE: &str = "CSIPlugin";

/// The CSI versions the node advertises (kubelet needs a 1.x).
pub const SUPPORTED_VERSIONS: [&str; 1] = ["1.0.0"];

/// How long calls still running when shutdown starts may take. kubelet's
/// calls are short and it closes its connection after each registration;
/// this only bounds a client that does not.
const DRAIN: Duration = Duration::from_secs(2);

/// Errors of configuring, binding and serving the registration socket.
/// The messages name carina-node's flags.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error(
        "--plugin-registration-dir {}: {reason} (it is kubelet's directory, \
         <kubelet dir>/plugins_registry, mounted into the pod at the same path; \
         carina-node never creates it)",
        dir.display()
    )]
    Dir { dir: PathBuf, reason: String },
    #[error(
        "--plugin-registration-dir needs --csi-endpoint: kubelet is told which CSI socket to dial"
    )]
    NoCsiEndpoint,
    #[error("--plugin-registration-endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("registration socket {}: {reason}", path.display())]
    Socket { path: PathBuf, reason: String },
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("plugin registration gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The registration socket's path in `dir`: `<dir>/<driver>-reg.sock`.
pub fn registration_socket(dir: &Path, driver: &str) -> PathBuf {
    dir.join(format!("{driver}-reg.sock"))
}

/// The CSI socket kubelet is told to dial, a plain absolute path (kubelet
/// dials it as given, no `unix://`): `endpoint` (the
/// `--plugin-registration-endpoint`, for a pod that mounts the socket's
/// directory elsewhere than the host has it) if set, else the path of
/// `csi_endpoint`. Registration without a CSI endpoint is an error.
pub fn advertised_endpoint(
    csi_endpoint: Option<&str>,
    endpoint: Option<&str>,
) -> Result<PathBuf, RegistrationError> {
    let csi_endpoint = csi_endpoint.ok_or(RegistrationError::NoCsiEndpoint)?;
    let Some(endpoint) = endpoint else {
        // Already checked when the CSI socket was bound; named here anyway.
        return socket_path(csi_endpoint).map_err(|e| RegistrationError::Endpoint {
            endpoint: csi_endpoint.to_string(),
            reason: format!("the default, --csi-endpoint: {e}"),
        });
    };
    socket_path(endpoint).map_err(|e| RegistrationError::Endpoint {
        endpoint: endpoint.to_string(),
        reason: match e {
            SocketError::Endpoint { reason, .. } => reason,
            other => other.to_string(),
        },
    })
}

/// Registration of the CSI driver in one kubelet registration directory.
#[derive(Debug, Clone)]
pub struct PluginRegistration {
    dir: PathBuf,
    endpoint: PathBuf,
}

impl PluginRegistration {
    /// Registration in `dir` advertising the CSI socket `endpoint` (its
    /// path as kubelet sees it, see [`advertised_endpoint`]). `dir` must be
    /// an existing directory: it is kubelet's, never created here.
    pub fn new(
        dir: impl Into<PathBuf>,
        endpoint: impl Into<PathBuf>,
    ) -> Result<PluginRegistration, RegistrationError> {
        let registration = PluginRegistration {
            dir: dir.into(),
            endpoint: endpoint.into(),
        };
        if !registration.endpoint.is_absolute() {
            return Err(RegistrationError::Endpoint {
                endpoint: registration.endpoint.display().to_string(),
                reason: "the socket path must be absolute".into(),
            });
        }
        check_dir(&registration.dir)?;
        Ok(registration)
    }

    /// `<dir>/carina.storage.io-reg.sock`.
    pub fn socket(&self) -> PathBuf {
        registration_socket(&self.dir, DRIVER_NAME)
    }

    /// What `GetInfo` answers.
    pub fn info(&self) -> PluginInfo {
        PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: DRIVER_NAME.to_string(),
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }
    }

    /// Creates the registration socket. A socket already at its path (a
    /// crashed run's) is replaced; kubelet sees a new socket and registers
    /// again. Any other kind of file there is refused and kept. Call it
    /// inside the runtime.
    pub fn bind(&self) -> Result<RegistrationSocket, RegistrationError> {
        check_dir(&self.dir)?;
        let path = self.socket();
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_socket() => {
                tracing::info!(carina.registration.socket = %path.display(), "replacing a stale registration socket");
                std::fs::remove_file(&path).map_err(IoError::map("remove stale socket", &path))?;
            }
            Ok(_) => {
                return Err(RegistrationError::Socket {
                    path,
                    reason: "exists and is not a socket; not touching it".into(),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(IoError::new("inspect", path, e).into()),
        }
        let listener = UnixListener::bind(&path).map_err(IoError::map("bind", &path))?;
        let meta = std::fs::symlink_metadata(&path).map_err(IoError::map("inspect", &path))?;
        Ok(RegistrationSocket {
            listener,
            identity: FileIdentity::of(&meta),
            path,
        })
    }

    /// Serves the registration API on `socket` until `shutdown` completes:
    /// then removes the socket (if still ours), gives running calls a
    /// moment and returns. `metrics` gets kubelet's latest verdict
    /// (`carina_node_plugin_registered`, 0 until kubelet says it
    /// registered the plugin).
    pub async fn serve(
        self,
        socket: RegistrationSocket,
        metrics: Arc<Metrics>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), RegistrationError> {
        let RegistrationSocket {
            listener,
            path,
            identity,
        } = socket;
        metrics.set_plugin_registered(false);
        let info = self.info();
        tracing::info!(
            carina.registration.socket = %path.display(),
            carina.plugin.name = %info.name,
            carina.plugin.endpoint = %info.endpoint,
            "serving kubelet plugin registration"
        );
        let service = RegistrationService { info, metrics };
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let socket_path = path.clone();
        let signal = async move {
            shutdown.await;
            // Before anything else: without the socket kubelet deregisters
            // the plugin instead of sending it more volumes.
            remove_if_ours(&socket_path, identity);
            tracing::info!(carina.registration.socket = %socket_path.display(), "registration socket removed");
            let _ = stop_tx.send(true);
        };
        let serve = Server::builder()
            .layer(ServerTraceLayer)
            .add_service(RegistrationServer::new(service))
            .serve_with_incoming_shutdown(carina_proto::uds::incoming(listener), signal);
        let drained = async move {
            let _ = stop_rx.wait_for(|s| *s).await;
            tokio::time::sleep(DRAIN).await;
        };
        let result = tokio::select! {
            result = serve => result.map_err(RegistrationError::from),
            _ = drained => Ok(()),
        };
        // Also when the server failed before shutdown.
        remove_if_ours(&path, identity);
        result
    }
}

/// Fails unless `dir` is an existing directory.
fn check_dir(dir: &Path) -> Result<(), RegistrationError> {
    let bad = |reason: &str| RegistrationError::Dir {
        dir: dir.to_path_buf(),
        reason: reason.to_string(),
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(bad("not a directory")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(bad("does not exist")),
        Err(e) => Err(bad(&e.to_string())),
    }
}

/// The bound registration socket, from [`PluginRegistration::bind`].
#[derive(Debug)]
pub struct RegistrationSocket {
    listener: UnixListener,
    path: PathBuf,
    identity: FileIdentity,
}

impl RegistrationSocket {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Which file a path named when the socket was bound: device and inode,
/// and the change time, since a filesystem may give a freed inode number
/// to the next file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileIdentity {
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
}

impl FileIdentity {
    fn of(meta: &std::fs::Metadata) -> FileIdentity {
        FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// Removes the socket at `path` if it is still the file `identity` names;
/// one that replaced it belongs to another process and stays.
fn remove_if_ours(path: &Path, identity: FileIdentity) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if FileIdentity::of(&m) == identity => {
            if let Err(e) = std::fs::remove_file(path) {
                tracing::warn!(carina.registration.socket = %path.display(), error = %e, "cannot remove the registration socket");
            }
        }
        Ok(_) => {
            tracing::info!(carina.registration.socket = %path.display(), "registration socket replaced by another process; leaving it");
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(carina.registration.socket = %path.display(), error = %e, "cannot inspect the registration socket");
        }
    }
}

/// The `Registration` service kubelet calls.
#[derive(Debug, Clone)]
struct RegistrationService {
    info: PluginInfo,
    metrics: Arc<Metrics>,
}

#[async_trait]
impl Registration for RegistrationService {
    #[tracing::instrument(
        name = "Registration/GetInfo",
        skip_all,
        fields(carina.plugin.name = %self.info.name, carina.plugin.endpoint = %self.info.endpoint)
    )]
    async fn get_info(
        &self,
        _request: Request<InfoRequest>,
    ) -> Result<Response<PluginInfo>, Status> {
        tracing::info!("kubelet asked for the plugin's registration info");
        Ok(Response::new(self.info.clone()))
    }

    #[tracing::instrument(
        name = "Registration/NotifyRegistrationStatus",
        skip_all,
        fields(carina.plugin.name = %self.info.name, plugin.registered = request.get_ref().plugin_registered)
    )]
    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        self.metrics.set_plugin_registered(status.plugin_registered);
        if status.plugin_registered {
            tracing::info!(carina.plugin.endpoint = %self.info.endpoint, "kubelet registered the CSI plugin");
        } else {
            let error = if status.error.is_empty() {
                "(kubelet gave no reason)"
            } else {
                status.error.as_str()
            };
            tracing::error!(
                error,
                carina.plugin.endpoint = %self.info.endpoint,
                "kubelet failed to register the CSI plugin; it retries with a new GetInfo, the node keeps serving"
            );
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_name_and_info() {
        assert_eq!(
            registration_socket(Path::new("/var/lib/kubelet/plugins_registry"), DRIVER_NAME),
            Path::new("/var/lib/kubelet/plugins_registry/carina.storage.io-reg.sock")
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = PluginRegistration::new(dir.path(), "/var/lib/kubelet/plugins/c/csi.sock")
            .expect("valid");
        assert_eq!(reg.socket(), dir.path().join("carina.storage.io-reg.sock"));
        assert_eq!(
            reg.info(),
            PluginInfo {
                r#type: "CSIPlugin".into(),
                name: "carina.storage.io".into(),
                endpoint: "/var/lib/kubelet/plugins/c/csi.sock".into(),
                supported_versions: vec!["1.0.0".into()],
            }
        );
    }

    #[test]
    fn advertised_endpoint_defaults_to_the_csi_socket_path() {
        let path = |csi: Option<&str>, adv: Option<&str>| advertised_endpoint(csi, adv);
        assert_eq!(
            path(Some("unix:///var/lib/kubelet/plugins/c/csi.sock"), None).expect("default"),
            Path::new("/var/lib/kubelet/plugins/c/csi.sock")
        );
        assert_eq!(
            path(Some("/csi/csi.sock"), Some("unix:///host/c/csi.sock")).expect("given"),
            Path::new("/host/c/csi.sock")
        );
        assert_eq!(
            path(Some("/csi/csi.sock"), Some("/host/c/csi.sock")).expect("plain path"),
            Path::new("/host/c/csi.sock")
        );
        let err = path(None, Some("/host/c/csi.sock")).expect_err("no CSI");
        assert!(err.to_string().contains("--csi-endpoint"), "{err}");
        let err = path(Some("/csi/csi.sock"), Some("csi.sock")).expect_err("relative");
        let text = err.to_string();
        assert!(
            text.starts_with("--plugin-registration-endpoint \"csi.sock\": ")
                && text.contains("absolute"),
            "{text}"
        );
        let err = path(Some("/csi/csi.sock"), Some("tcp://1.2.3.4:5")).expect_err("tcp");
        assert!(err.to_string().contains("unix socket"), "{err}");
    }

    #[test]
    fn the_directory_must_exist() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("plugins_registry");
        let err = PluginRegistration::new(&missing, "/c/csi.sock").expect_err("missing");
        let text = err.to_string();
        assert!(
            text.starts_with(&format!(
                "--plugin-registration-dir {}: does not exist",
                missing.display()
            )),
            "{text}"
        );
        assert!(!missing.exists(), "never created");
        let file = dir.path().join("file");
        std::fs::write(&file, "").expect("write");
        let err = PluginRegistration::new(&file, "/c/csi.sock").expect_err("a file");
        assert!(err.to_string().contains("not a directory"), "{err}");
        let err = PluginRegistration::new(dir.path(), "csi.sock").expect_err("relative");
        assert!(err.to_string().contains("absolute"), "{err}");
    }

    #[tokio::test]
    async fn stale_socket_replaced_other_files_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = PluginRegistration::new(dir.path(), "/c/csi.sock").expect("valid");
        let first = reg.bind().expect("first bind");
        drop(first);
        assert!(reg.socket().exists(), "a dropped listener leaves its file");
        let second = reg.bind().expect("stale socket replaced");
        assert_eq!(second.path(), reg.socket());
        drop(second);

        std::fs::remove_file(reg.socket()).expect("remove");
        std::fs::write(reg.socket(), "keep").expect("write");
        let err = reg.bind().expect_err("a regular file");
        assert!(err.to_string().contains("not a socket"), "{err}");
        assert_eq!(std::fs::read_to_string(reg.socket()).expect("kept"), "keep");
    }

    #[tokio::test]
    async fn only_our_own_socket_is_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = PluginRegistration::new(dir.path(), "/c/csi.sock").expect("valid");
        let ours = reg.bind().expect("bind");
        remove_if_ours(ours.path(), ours.identity);
        assert!(!reg.socket().exists(), "ours: removed");

        let old = reg.bind().expect("bind");
        // A newer process replaces the socket before the old one stops.
        let newer = reg.bind().expect("replace");
        remove_if_ours(old.path(), old.identity);
        assert!(reg.socket().exists(), "the newer socket stays");
        remove_if_ours(newer.path(), newer.identity);
        assert!(!reg.socket().exists());
    }
}
