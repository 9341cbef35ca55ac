//! CSI as the sidecars and kubelet see it: a server on a unix socket of
//! its own (the Controller over any provisioner, or whatever a test
//! serves), and the request pieces and calls the controller tests share.
//!
//! ```ignore
//! let mut served = ServedController::start(provisioner, "carina-csi-sock-").await?;
//! let v = make(&mut served.csi, create("pvc-1", 10 * MIB, "xfs")).await?;
//! assert_eq!(node_of(&v), "node-a");
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::{Context, Result};
use carina_controlplane::serve::{bind_unix, serve_controller};
use carina_csi::{Provisioner, TOPOLOGY_KEY, context};
use carina_proto::csi;
use carina_proto::csi::controller_client::ControllerClient;
use carina_proto::csi::volume_capability::access_mode::Mode;
use carina_proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tonic::transport::Channel;

use crate::grpc::unix_channel;

/// A client of the CSI Controller service.
pub type Csi = ControllerClient<Channel>;

/// What a server passed to [`ServedCsi::start`] waits for to stop.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A CSI server on `csi.sock` in a temporary directory of its own, and a
/// channel to it. Dropping it stops the server, then removes the
/// directory.
#[derive(Debug)]
pub struct ServedCsi {
    pub channel: Channel,
    stop: Option<oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

impl ServedCsi {
    /// Binds the socket in a new directory named with `prefix`, spawns
    /// `serve(listener, shutdown)` and connects to it.
    pub async fn start<F, Fut>(prefix: &str, serve: F) -> Result<ServedCsi>
    where
        F: FnOnce(UnixListener, Shutdown) -> Fut,
        Fut: Future + Send + 'static,
        Fut::Output: Send + 'static,
    {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
        let sock = dir.path().join("csi.sock");
        let listener = bind_unix(&format!("unix://{}", sock.display()))?;
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(serve(
            listener,
            Box::pin(async {
                let _ = stopped.await;
            }),
        ));
        let channel = unix_channel(sock).await?;
        Ok(ServedCsi {
            channel,
            stop: Some(stop),
            _dir: dir,
        })
    }
}

impl Drop for ServedCsi {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// CSI Identity and Controller over a provisioner, as [`ServedCsi`], and a
/// Controller client.
#[derive(Debug)]
pub struct ServedController {
    pub csi: Csi,
    pub server: ServedCsi,
}

impl ServedController {
    /// Serves `provisioner` on a socket in a new directory named with
    /// `prefix`.
    pub async fn start(provisioner: impl Provisioner, prefix: &str) -> Result<ServedController> {
        let provisioner = Arc::new(provisioner);
        let server = ServedCsi::start(prefix, |listener, shutdown| {
            serve_controller(listener, provisioner, shutdown)
        })
        .await?;
        Ok(ServedController {
            csi: ControllerClient::new(server.channel.clone()),
            server,
        })
    }
}

/// A single-node-writer mount of `fs_type` (empty: the driver's default).
pub fn mount_cap(fs_type: &str) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            ..Default::default()
        })),
    }
}

/// `CreateVolume` of at least `required` bytes (no limit) for a
/// [`mount_cap`] of `fs_type`, with no parameters or topology.
pub fn create(name: &str, required: u64, fs_type: &str) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required as i64,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap(fs_type)],
        ..Default::default()
    }
}

/// The topology segment of `node`.
pub fn on(node: &str) -> csi::Topology {
    csi::Topology {
        segments: HashMap::from([(TOPOLOGY_KEY.to_string(), node.to_string())]),
    }
}

/// `CreateVolume`, failing with the request's name when the call fails or
/// the answer has no volume.
pub async fn make(csi: &mut Csi, req: csi::CreateVolumeRequest) -> Result<csi::Volume> {
    let name = req.name.clone();
    csi.create_volume(req)
        .await
        .with_context(|| format!("CreateVolume {name}"))?
        .into_inner()
        .volume
        .with_context(|| format!("CreateVolume {name}: no volume"))
}

/// `CreateVolume` that must fail: its status (panics, naming the volume,
/// if it succeeds).
pub async fn make_err(csi: &mut Csi, req: csi::CreateVolumeRequest) -> tonic::Status {
    let name = req.name.clone();
    match csi.create_volume(req).await {
        Ok(v) => panic!("CreateVolume {name} succeeded: {:?}", v.into_inner()),
        Err(s) => s,
    }
}

/// `req` with the parameters `pairs` added.
pub fn with_params(
    mut req: csi::CreateVolumeRequest,
    pairs: &[(&str, &str)],
) -> csi::CreateVolumeRequest {
    req.parameters
        .extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    req
}

/// `DeleteVolume` of `volume_id`, failing with the id when the call fails.
pub async fn delete(csi: &mut Csi, volume_id: &str) -> Result<()> {
    csi.delete_volume(csi::DeleteVolumeRequest {
        volume_id: volume_id.to_string(),
        ..Default::default()
    })
    .await
    .with_context(|| format!("DeleteVolume {volume_id}"))?;
    Ok(())
}

/// The node a volume was made on, as its volume context names it (empty
/// when it does not).
pub fn node_of(v: &csi::Volume) -> &str {
    v.volume_context
        .get(context::NODE)
        .map(String::as_str)
        .unwrap_or_default()
}
