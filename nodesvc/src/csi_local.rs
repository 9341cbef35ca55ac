//! The node's CSI side: [`EngineVolumes`] tells the CSI Node service which
//! local device or directory a volume id is (a bcache device of that name
//! first, then a volume), by asking the engine; an id Go Carina wrote
//! names the volume taken over under that id,
//! [`serve`] runs CSI Identity and Node on the kubelet plugin socket, and
//! [`registration`] registers that socket with kubelet.

pub mod registration;
pub mod serve;

use async_trait::async_trait;
use carina_csi::legacy::VolumeHandle;
use carina_csi::{CsiError, LocalKind, LocalVolume, LocalVolumes};
use tonic::Status;

use carina_csi::params::BCACHE_DATA_OFFSET;

use crate::engine::bcache::BcacheDevice;
use crate::engine::{Engine, Error, Policy, Volume};

/// [`LocalVolumes`] over the node's engine. A volume id of ours names its
/// node (`<volume>@<node>`); an id of another node, a malformed id and a
/// volume the engine does not have are all "not here". A Go Carina id
/// (`volume-<pv>`, `host-<pv>`) names no node: it is the node-local name
/// of a volume taken over here; one the engine does not have is a Go
/// volume not taken over yet (`FAILED_PRECONDITION`, never "not here":
/// kubelet gives up on a volume that is not found), and a thin one is
/// refused.
#[derive(Debug, Clone)]
pub struct EngineVolumes {
    engine: Engine,
    node: String,
    max_volumes: u64,
}

impl EngineVolumes {
    pub fn new(engine: Engine, node_name: impl Into<String>) -> Self {
        EngineVolumes {
            engine,
            node: node_name.into(),
            max_volumes: 0,
        }
    }

    /// The most volumes NodeGetInfo says this node publishes (0: no limit).
    pub fn with_max_volumes(mut self, max_volumes: u64) -> Self {
        self.max_volumes = max_volumes;
        self
    }
}

impl EngineVolumes {
    /// The block device of a bcache device: `UNAVAILABLE` while the kernel
    /// runs none for it. Its size is the backing volume's less the data
    /// offset.
    async fn bcache_volume(
        &self,
        volume_id: &str,
        device: BcacheDevice,
    ) -> Result<LocalVolume, CsiError> {
        let Some(path) = device.device_path.clone() else {
            let why = device
                .problem
                .clone()
                .unwrap_or_else(|| format!("its state is {}", device.state()));
            return Err(CsiError::Unavailable(format!(
                "volume {volume_id:?} is bcache device {:?}, which is not running: {why}",
                device.name
            )));
        };
        let backing = self
            .engine
            .get_volume(&device.backing_volume)
            .await
            .map_err(|e| CsiError::node(format!("volume {volume_id:?}"), Status::from(e)))?;
        Ok(LocalVolume {
            volume_id: volume_id.to_string(),
            kind: LocalKind::Block { device: path },
            size_bytes: backing.size_bytes.saturating_sub(BCACHE_DATA_OFFSET),
        })
    }
}

#[async_trait]
impl LocalVolumes for EngineVolumes {
    fn node_id(&self) -> &str {
        &self.node
    }

    fn max_volumes(&self) -> u64 {
        self.max_volumes
    }

    async fn creation_trace(&self, volume_id: &str) -> Option<String> {
        let (name, _) = self.local_name(volume_id).ok()??;
        self.engine.creation_trace(&name)
    }

    async fn find(&self, volume_id: &str) -> Result<Option<LocalVolume>, CsiError> {
        let Some((name, go)) = self.local_name(volume_id)? else {
            return Ok(None);
        };
        // A tiered volume is the bcache device of its name (its backing
        // and cache volumes have names of their own).
        if self.engine.has_bcache(&name) {
            match self.engine.get_bcache(&name).await {
                Ok(device) => return self.bcache_volume(volume_id, device).await.map(Some),
                // Deleted since: the name is no bcache device now.
                Err(Error::BcacheNotFound { .. } | Error::InvalidArgument { .. }) => {}
                Err(e) => {
                    return Err(CsiError::node(
                        format!("volume {volume_id:?}"),
                        Status::from(e),
                    ));
                }
            }
        }
        match self.engine.get_volume(&name).await {
            Ok(v) => local_volume(volume_id, v).map(Some),
            // A Go volume not taken over (yet).
            Err(Error::VolumeNotFound { .. } | Error::InvalidArgument { .. }) if go => {
                Err(not_taken_over(volume_id))
            }
            // A name the engine would refuse cannot be one of its volumes.
            Err(Error::VolumeNotFound { .. } | Error::InvalidArgument { .. }) => Ok(None),
            // The engine's own status table decides the code.
            Err(e) => Err(CsiError::node(
                format!("volume {volume_id:?}"),
                Status::from(e),
            )),
        }
    }
}

impl EngineVolumes {
    /// The engine's name of the volume `volume_id` names: ours on this
    /// node (`None` for another node's, or an id of neither kind), or a
    /// Go Carina id itself (then with `true`); a thin Go id is
    /// `FAILED_PRECONDITION`.
    fn local_name(&self, volume_id: &str) -> Result<Option<(String, bool)>, CsiError> {
        let handle = match VolumeHandle::parse(volume_id) {
            Ok(handle) => handle,
            Err(CsiError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        match &handle {
            VolumeHandle::Ours(id) if id.node != self.node => Ok(None),
            VolumeHandle::Ours(_) => Ok(Some((handle.local_name(), false))),
            VolumeHandle::Go(id) => {
                id.refuse_thin()?;
                Ok(Some((handle.local_name(), true)))
            }
        }
    }
}

/// The answer for a Go Carina id whose volume this node has not taken over.
fn not_taken_over(volume_id: &str) -> CsiError {
    CsiError::FailedPrecondition(format!(
        "volume {volume_id:?} is a Go Carina volume this node has not taken over; \
         `carinactl migrate apply` takes it over in place, and then it is served"
    ))
}

/// What an engine volume is to the CSI node service: LVM and RAW volumes
/// are block devices, HOST volumes directories.
pub fn local_volume(volume_id: &str, v: Volume) -> Result<LocalVolume, CsiError> {
    let missing = |what: &str| {
        CsiError::Internal(format!(
            "volume {:?} ({} group {:?}) has no {what}",
            v.name, v.policy, v.group
        ))
    };
    let kind = match v.policy {
        Policy::Lvm | Policy::Raw => LocalKind::Block {
            device: v.device_path.clone().ok_or_else(|| missing("device"))?,
        },
        Policy::Host => LocalKind::Directory {
            path: v.host_path.clone().ok_or_else(|| missing("directory"))?,
        },
    };
    Ok(LocalVolume {
        volume_id: volume_id.to_string(),
        kind,
        size_bytes: v.size_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(policy: Policy) -> Volume {
        Volume {
            name: "pvc-1".into(),
            group: "g".into(),
            policy,
            size_bytes: 1 << 30,
            device_path: None,
            host_path: None,
            major: 0,
            minor: 0,
            exclusive: false,
            disk: None,
        }
    }

    #[test]
    fn kinds_by_policy() {
        let mut v = volume(Policy::Lvm);
        v.device_path = Some("/dev/loop7".into());
        let l = local_volume("pvc-1@n", v).expect("block");
        assert_eq!(
            l.kind,
            LocalKind::Block {
                device: "/dev/loop7".into()
            }
        );
        assert_eq!(l.size_bytes, 1 << 30);
        assert_eq!(l.volume_id, "pvc-1@n");

        let mut v = volume(Policy::Host);
        v.host_path = Some("/srv/carina/pvc-1".into());
        assert_eq!(
            local_volume("pvc-1@n", v).expect("dir").kind,
            LocalKind::Directory {
                path: "/srv/carina/pvc-1".into()
            }
        );

        let err = local_volume("pvc-1@n", volume(Policy::Raw)).expect_err("no device");
        assert_eq!(err.code(), tonic::Code::Internal);
    }
}
