//! Serving the controller's CSI services (Identity and Controller) on a
//! unix socket, as the CSI sidecars and csi-sanity expect them.
//!
//! ```ignore
//! let listener = bind_unix("unix:///csi/csi.sock")?;
//! serve_controller(listener, Arc::new(provisioner), shutdown).await?;
//! ```

use std::future::Future;
use std::sync::Arc;

use carina_csi::Provisioner;
use carina_csi::controller::ControllerService;
use carina_csi::identity::IdentityService;
use carina_proto::csi::identity_server::IdentityServer;
use carina_proto::trace::ServerTraceLayer;
use tokio::net::UnixListener;
use tonic::transport::Server;

pub use carina_csi::socket::{SocketError, bind as bind_unix, socket_path};

/// Serves CSI Identity (always ready) and Controller over `provisioner`
/// on `listener` until `shutdown` completes; in-flight calls finish first.
pub async fn serve_controller<P: Provisioner>(
    listener: UnixListener,
    provisioner: Arc<P>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    Server::builder()
        .layer(ServerTraceLayer)
        .layer(crate::metrics::metrics().grpc().layer())
        .add_service(IdentityServer::new(IdentityService::always_ready()))
        .add_service(ControllerService::new(provisioner).into_server())
        .serve_with_incoming_shutdown(carina_proto::uds::incoming(listener), shutdown)
        .await
}
