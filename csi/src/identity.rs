//! The CSI Identity service: who the plugin is (`carina.storage.io` and
//! this crate's version), what the plugin as a whole can do, and whether it
//! is ready.
//!
//! Both the node and the controller serve it with the same answers (the
//! capabilities describe the plugin, not the process); only the readiness
//! probe differs, so the service is generic over a [`Readiness`].

use async_trait::async_trait;
use carina_proto::csi;
use carina_proto::csi::plugin_capability::{self, service, volume_expansion};
use tonic::{Request, Response, Status};

use crate::DRIVER_NAME;

/// The version reported as `vendor_version`.
pub const VENDOR_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Whether the process is ready to serve requests (answered by `Probe`).
#[async_trait]
pub trait Readiness: Send + Sync + 'static {
    /// `false` while still starting; `Probe` then answers `ready: false`
    /// (not an error), as the spec asks.
    async fn ready(&self) -> bool;
}

/// Always ready: for processes that serve only once they are.
#[derive(Debug, Clone, Copy, Default)]
pub struct AlwaysReady;

#[async_trait]
impl Readiness for AlwaysReady {
    async fn ready(&self) -> bool {
        true
    }
}

/// Ready once the watched flag is `true` (set it when start-up is done).
#[async_trait]
impl Readiness for tokio::sync::watch::Receiver<bool> {
    async fn ready(&self) -> bool {
        *self.borrow()
    }
}

/// The Identity service; serve it with
/// `carina_proto::csi::identity_server::IdentityServer::new(IdentityService::new(..))`.
#[derive(Debug, Clone, Default)]
pub struct IdentityService<R = AlwaysReady> {
    readiness: R,
}

impl IdentityService<AlwaysReady> {
    /// An Identity service that is always ready.
    pub fn always_ready() -> Self {
        IdentityService {
            readiness: AlwaysReady,
        }
    }
}

impl<R: Readiness> IdentityService<R> {
    pub fn new(readiness: R) -> Self {
        IdentityService { readiness }
    }
}

/// The plugin's capabilities: a controller service, topology (every volume
/// lives on one node), and online expansion.
pub fn plugin_capabilities() -> Vec<csi::PluginCapability> {
    let svc = |t: service::Type| csi::PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service { r#type: t as i32 },
        )),
    };
    vec![
        svc(service::Type::ControllerService),
        svc(service::Type::VolumeAccessibilityConstraints),
        csi::PluginCapability {
            r#type: Some(plugin_capability::Type::VolumeExpansion(
                plugin_capability::VolumeExpansion {
                    r#type: volume_expansion::Type::Online as i32,
                },
            )),
        },
    ]
}

#[async_trait]
impl<R: Readiness> csi::identity_server::Identity for IdentityService<R> {
    #[tracing::instrument(name = "Identity/GetPluginInfo", skip_all)]
    async fn get_plugin_info(
        &self,
        _request: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: DRIVER_NAME.to_string(),
            vendor_version: VENDOR_VERSION.to_string(),
            manifest: Default::default(),
        }))
    }

    #[tracing::instrument(name = "Identity/GetPluginCapabilities", skip_all)]
    async fn get_plugin_capabilities(
        &self,
        _request: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: plugin_capabilities(),
        }))
    }

    #[tracing::instrument(name = "Identity/Probe", skip_all)]
    async fn probe(
        &self,
        _request: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        Ok(Response::new(csi::ProbeResponse {
            ready: Some(self.readiness.ready().await),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi::identity_server::Identity;

    #[tokio::test]
    async fn info_capabilities_and_probe() {
        let id = IdentityService::always_ready();
        let info = id
            .get_plugin_info(Request::new(csi::GetPluginInfoRequest {}))
            .await
            .expect("info")
            .into_inner();
        assert_eq!(info.name, "carina.storage.io");
        assert_eq!(info.vendor_version, VENDOR_VERSION);

        let caps = id
            .get_plugin_capabilities(Request::new(csi::GetPluginCapabilitiesRequest {}))
            .await
            .expect("caps")
            .into_inner()
            .capabilities;
        let services: Vec<i32> = caps
            .iter()
            .filter_map(|c| match c.r#type {
                Some(plugin_capability::Type::Service(s)) => Some(s.r#type),
                _ => None,
            })
            .collect();
        assert_eq!(
            services,
            [
                service::Type::ControllerService as i32,
                service::Type::VolumeAccessibilityConstraints as i32
            ]
        );
        assert!(caps.iter().any(|c| matches!(
            c.r#type,
            Some(plugin_capability::Type::VolumeExpansion(e)) if e.r#type == volume_expansion::Type::Online as i32
        )));

        let probe = id
            .probe(Request::new(csi::ProbeRequest {}))
            .await
            .expect("probe")
            .into_inner();
        assert_eq!(probe.ready, Some(true));
    }

    #[tokio::test]
    async fn probe_follows_the_readiness_flag() {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let id = IdentityService::new(rx);
        let ready = || async {
            id.probe(Request::new(csi::ProbeRequest {}))
                .await
                .expect("probe is never an error")
                .into_inner()
                .ready
        };
        assert_eq!(ready().await, Some(false));
        tx.send(true).expect("receiver alive");
        assert_eq!(ready().await, Some(true));
    }
}
