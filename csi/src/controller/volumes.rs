//! The volume RPCs: CreateVolume, DeleteVolume, ControllerExpandVolume,
//! ValidateVolumeCapabilities, ListVolumes, ControllerGetVolume and
//! GetCapacity (with the capacity arithmetic of tiered volumes).

use std::collections::HashMap;

use carina_proto::csi;
use tonic::Code;

use super::paging::Paging;
use super::request::{topology, volume_request};
use super::wire::{wire_bytes, wire_condition, wire_volume};
use super::{ControllerService, claim_key};
use crate::capability::{self, Access};
use crate::context;
use crate::error::CsiError;
use crate::legacy::VolumeHandle;
use crate::params::Parameters;
use crate::sizes;
use crate::types::{CapacityInfo, ProvisionedVolume, Provisioner, VolumeHealth};

/// What tiered volumes can have of `backing` (the backend group's
/// capacity) and `cache` (the cache group's), with a cache of
/// `ratio_percent` of each backing volume: the smaller of the two
/// figures, less the bcache data offset.
pub fn tiered_capacity(
    backing: CapacityInfo,
    cache: CapacityInfo,
    ratio_percent: u8,
) -> CapacityInfo {
    let ratio = u128::from(ratio_percent.max(1));
    let backed_by_cache =
        |bytes: u64| u64::try_from(u128::from(bytes) * 100 / ratio).unwrap_or(u64::MAX);
    let usable = |bytes: u64| bytes.saturating_sub(crate::params::BCACHE_DATA_OFFSET);
    CapacityInfo {
        available_bytes: usable(
            backing
                .available_bytes
                .min(backed_by_cache(cache.available_bytes)),
        ),
        maximum_volume_size: usable(
            backing
                .maximum_volume_size
                .min(backed_by_cache(cache.maximum_volume_size)),
        ),
    }
}

impl<P: Provisioner> ControllerService<P> {
    /// Reads Go Carina's `ssd`/`hdd` group shorthand in `parameters`
    /// against the groups the nodes publish; asks for them only when a
    /// shorthand is used.
    async fn resolve_shorthand(&self, parameters: &mut Parameters) -> Result<(), CsiError> {
        if !parameters.uses_shorthand() {
            return Ok(());
        }
        let names = self.provisioner.group_names().await?;
        for (written, group) in parameters.resolve_groups(|g| names.contains(g)) {
            tracing::debug!(carina.group = %group, parameter = %written, "group shorthand read as Go Carina read it");
        }
        Ok(())
    }

    #[tracing::instrument(name = "Controller/CreateVolume", skip_all, err(level = "info"), fields(carina.volume.name = %req.name))]
    pub(super) async fn create(
        &self,
        req: csi::CreateVolumeRequest,
    ) -> Result<csi::CreateVolumeResponse, CsiError> {
        let mut request = volume_request(&req)?;
        self.resolve_shorthand(&mut request.parameters).await?;
        crate::params::compat::report(&request.parameters, &req.name);
        if request.source.is_some() && !self.provisioner.copies() {
            return Err(CsiError::invalid(
                "volume_content_source",
                "this control plane does not create volumes from snapshots or other volumes",
            ));
        }
        let _claim = self.claim(&request.local_name)?;
        let volume = self.provisioner.create_volume(&request).await?;
        tracing::info!(carina.volume.id = %volume.volume_id, carina.volume.size_bytes = volume.capacity_bytes, "volume ready");
        let mut wire = wire_volume(&volume);
        // Filled from it: the answer says so.
        wire.content_source = req.volume_content_source;
        // The node formats the volume at its first stage, with the
        // class's options, checked above for the class's filesystem.
        if let Some(text) = &request.parameters.mkfs_options
            && !request.block
            && !text.trim().is_empty()
        {
            wire.volume_context
                .insert(context::MKFS_OPTIONS.to_string(), text.trim().to_string());
        }
        Ok(csi::CreateVolumeResponse { volume: Some(wire) })
    }

    #[tracing::instrument(name = "Controller/DeleteVolume", skip_all, err(level = "info"), fields(carina.volume.id = %req.volume_id))]
    pub(super) async fn delete(
        &self,
        req: csi::DeleteVolumeRequest,
    ) -> Result<csi::DeleteVolumeResponse, CsiError> {
        // An empty id is INVALID_ARGUMENT; no volume can have a malformed
        // one, so deleting it is done. A Go Carina id goes to the
        // provisioner, which says whether it serves that volume.
        let id = match VolumeHandle::parse(&req.volume_id) {
            Ok(id) => id,
            Err(CsiError::NotFound(_)) => return Ok(csi::DeleteVolumeResponse {}),
            Err(e) => return Err(e),
        };
        let _claim = self.claim(&claim_key(&id))?;
        match self.provisioner.delete_volume(&req.volume_id).await {
            Err(e) if e.code() != Code::NotFound => Err(e),
            _ => Ok(csi::DeleteVolumeResponse {}),
        }
    }

    #[tracing::instrument(name = "Controller/ControllerExpandVolume", skip_all, err(level = "info"), fields(carina.volume.id = %req.volume_id))]
    pub(super) async fn expand(
        &self,
        req: csi::ControllerExpandVolumeRequest,
    ) -> Result<csi::ControllerExpandVolumeResponse, CsiError> {
        if req.volume_id.is_empty() {
            return Err(CsiError::invalid("volume_id", "is required"));
        }
        let range = req
            .capacity_range
            .as_ref()
            .ok_or_else(|| CsiError::invalid("capacity_range", "is required"))?;
        let range = sizes::range(range.required_bytes, range.limit_bytes)?;
        if range.required_bytes == 0 {
            return Err(CsiError::invalid(
                "capacity_range.required_bytes",
                "must be greater than zero for an expansion",
            ));
        }
        let access = req
            .volume_capability
            .as_ref()
            .map(|c| capability::check("volume_capability", c).map(|c| c.access))
            .transpose()?;
        let id = VolumeHandle::parse(&req.volume_id)?;
        let _claim = self.claim(&claim_key(&id))?;
        let size = self
            .provisioner
            .expand_volume(&req.volume_id, &range)
            .await?;
        Ok(csi::ControllerExpandVolumeResponse {
            capacity_bytes: wire_bytes(size),
            // Without a capability the volume may be a file system; the
            // node's expansion is a no-op where there is nothing to grow.
            node_expansion_required: access != Some(Access::Block),
        })
    }

    #[tracing::instrument(name = "Controller/ValidateVolumeCapabilities", skip_all, err(level = "info"), fields(carina.volume.id = %req.volume_id))]
    pub(super) async fn validate(
        &self,
        req: csi::ValidateVolumeCapabilitiesRequest,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse, CsiError> {
        if req.volume_id.is_empty() {
            return Err(CsiError::invalid("volume_id", "is required"));
        }
        if req.volume_capabilities.is_empty() {
            return Err(CsiError::invalid(
                "volume_capabilities",
                "at least one capability is required",
            ));
        }
        let volume = self.existing(&req.volume_id).await?;
        Ok(match unsupported(&req, &volume) {
            Some(message) => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            },
            None => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: HashMap::new(),
                }),
                message: String::new(),
            },
        })
    }

    #[tracing::instrument(name = "Controller/ListVolumes", skip_all, err(level = "info"), fields(max_entries = req.max_entries))]
    pub(super) async fn list(
        &self,
        req: csi::ListVolumesRequest,
    ) -> Result<csi::ListVolumesResponse, CsiError> {
        let paging = Paging::of(req.max_entries, &req.starting_token)?;
        let volumes = self.provisioner.list_volumes().await?;
        let (volumes, next_token) = paging.page(volumes, |v| &v.volume_id);
        let health = self.provisioner.volume_health(&volumes).await;
        Ok(csi::ListVolumesResponse {
            entries: volumes
                .iter()
                .zip(health)
                .map(|(v, h)| csi::list_volumes_response::Entry {
                    volume: Some(wire_volume(v)),
                    status: Some(csi::list_volumes_response::VolumeStatus {
                        published_node_ids: Vec::new(),
                        volume_condition: Some(wire_condition(h)),
                    }),
                })
                .collect(),
            next_token,
        })
    }

    #[tracing::instrument(name = "Controller/ControllerGetVolume", skip_all, err(level = "info"), fields(carina.volume.id = %req.volume_id))]
    pub(super) async fn get(
        &self,
        req: csi::ControllerGetVolumeRequest,
    ) -> Result<csi::ControllerGetVolumeResponse, CsiError> {
        if req.volume_id.is_empty() {
            return Err(CsiError::invalid("volume_id", "is required"));
        }
        let volume = self.existing(&req.volume_id).await?;
        let health = self
            .provisioner
            .volume_health(std::slice::from_ref(&volume))
            .await
            .pop()
            .unwrap_or_else(|| VolumeHealth::abnormal("the provisioner gave no condition"));
        if health.abnormal {
            tracing::warn!(carina.volume.id = %volume.volume_id, carina.node.name = %volume.node, condition = %health.message, "volume abnormal");
        }
        Ok(csi::ControllerGetVolumeResponse {
            volume: Some(wire_volume(&volume)),
            status: Some(csi::controller_get_volume_response::VolumeStatus {
                published_node_ids: Vec::new(),
                volume_condition: Some(wire_condition(health)),
            }),
        })
    }

    #[tracing::instrument(name = "Controller/GetCapacity", skip_all, err(level = "info"))]
    pub(super) async fn capacity(
        &self,
        req: csi::GetCapacityRequest,
    ) -> Result<csi::GetCapacityResponse, CsiError> {
        let mut parameters = Parameters::parse(&req.parameters)?;
        self.resolve_shorthand(&mut parameters).await?;
        let possible = req
            .volume_capabilities
            .iter()
            .enumerate()
            .all(|(i, c)| capability::check(&format!("volume_capabilities[{i}]"), c).is_ok());
        if !possible {
            // No volume with these capabilities or parameters can be made.
            return Ok(csi::GetCapacityResponse {
                available_capacity: 0,
                maximum_volume_size: Some(0),
                minimum_volume_size: None,
            });
        }
        let topology = req
            .accessible_topology
            .as_ref()
            .filter(|t| !t.segments.is_empty())
            .map(topology);
        let info = match &parameters.bcache {
            Some(b) => {
                let backing = self
                    .provisioner
                    .capacity(topology.as_ref(), Some(&b.backend_group))
                    .await?;
                let cache = self
                    .provisioner
                    .capacity(topology.as_ref(), Some(&b.cache_group))
                    .await?;
                tiered_capacity(backing, cache, b.cache_ratio)
            }
            None => {
                self.provisioner
                    .capacity(topology.as_ref(), parameters.group.as_deref())
                    .await?
            }
        };
        Ok(csi::GetCapacityResponse {
            available_capacity: wire_bytes(info.available_bytes),
            maximum_volume_size: Some(wire_bytes(info.maximum_volume_size)),
            minimum_volume_size: None,
        })
    }
}

/// Why `volume` cannot be used as `req` asks, or `None` if it can.
fn unsupported(
    req: &csi::ValidateVolumeCapabilitiesRequest,
    volume: &ProvisionedVolume,
) -> Option<String> {
    let access = match capability::check_all("volume_capabilities", &req.volume_capabilities) {
        Ok(a) => a,
        Err(e) => return Some(e.to_string()),
    };
    if access == Access::Block
        && volume.context.get(context::POLICY).map(String::as_str) == Some("HOST")
    {
        return Some("volume_capabilities: a HOST volume is a directory and cannot be used as a block device".into());
    }
    if let Err(e) = Parameters::parse(&req.parameters) {
        return Some(e.to_string());
    }
    if !req.mutable_parameters.is_empty() {
        return Some("mutable_parameters: volume modification is not supported".into());
    }
    let mismatch = req
        .volume_context
        .iter()
        .find(|(k, v)| volume.context.get(*k).is_some_and(|ours| ours != *v));
    if let Some((k, v)) = mismatch {
        return Some(format!(
            "volume_context[{k:?}]: {v:?} does not match the volume's {:?}",
            volume
                .context
                .get(k)
                .map(String::as_str)
                .unwrap_or_default()
        ));
    }
    None
}
