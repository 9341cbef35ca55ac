//! Validation of CreateVolume and CreateSnapshot requests into the domain's
//! [`VolumeRequest`] and [`SnapshotRequest`]: every refusal names the field.

use carina_proto::csi;

use crate::TOPOLOGY_KEY;
use crate::capability::{self, Access};
use crate::error::CsiError;
use crate::names::{is_node_name, local_name};
use crate::params::Parameters;
use crate::sizes;
use crate::snapshot_id::local_snapshot_name;
use crate::types::{Accessibility, ContentSource, SnapshotRequest, Topology, VolumeRequest};

/// Validates a CreateVolume request into a [`VolumeRequest`]. Nothing is
/// created for a request that fails here.
pub fn volume_request(req: &csi::CreateVolumeRequest) -> Result<VolumeRequest, CsiError> {
    if req.name.is_empty() {
        return Err(CsiError::invalid("name", "is required"));
    }
    let access = capability::check_all("volume_capabilities", &req.volume_capabilities)?;
    let capacity = match &req.capacity_range {
        Some(r) => sizes::range(r.required_bytes, r.limit_bytes)?,
        None => Default::default(),
    };
    let mut parameters = Parameters::parse(&req.parameters)?;
    for old in &parameters.deprecated {
        let new = crate::params::ALIASES
            .iter()
            .find(|(o, _)| o == old)
            .map_or("", |(_, n)| n);
        tracing::warn!(
            carina.volume.name = %req.name,
            parameter = %old,
            replacement = %new,
            "deprecated StorageClass parameter; use {new}"
        );
    }
    let source = match req.volume_content_source.as_ref().map(|s| &s.r#type) {
        None => None,
        Some(Some(csi::volume_content_source::Type::Snapshot(s))) => {
            if s.snapshot_id.is_empty() {
                return Err(CsiError::invalid(
                    "volume_content_source.snapshot.snapshot_id",
                    "is required",
                ));
            }
            Some(ContentSource::Snapshot(s.snapshot_id.clone()))
        }
        Some(Some(csi::volume_content_source::Type::Volume(v))) => {
            if v.volume_id.is_empty() {
                return Err(CsiError::invalid(
                    "volume_content_source.volume.volume_id",
                    "is required",
                ));
            }
            Some(ContentSource::Volume(v.volume_id.clone()))
        }
        Some(None) => {
            return Err(CsiError::invalid(
                "volume_content_source",
                "names neither a snapshot nor a volume",
            ));
        }
    };
    if !req.mutable_parameters.is_empty() {
        return Err(CsiError::invalid(
            "mutable_parameters",
            "volume modification is not supported",
        ));
    }
    if let Access::Mount {
        fs_type: Some(from_cap),
    } = access
    {
        match parameters.fs_type {
            Some(from_param) if from_param != from_cap => {
                return Err(CsiError::invalid(
                    "volume_capabilities.mount.fs_type",
                    format!(
                        "{} conflicts with parameters[{:?}] {}",
                        from_cap.as_str(),
                        crate::params::FS_TYPE,
                        from_param.as_str()
                    ),
                ));
            }
            _ => parameters.fs_type = Some(from_cap),
        }
    }
    // Checked for the filesystem the volume gets, which the capability
    // names when external-provisioner took fstype out of the parameters.
    parameters.mkfs_options()?;
    let accessibility = match &req.accessibility_requirements {
        Some(a) => Accessibility {
            requisite: topologies("accessibility_requirements.requisite", &a.requisite)?,
            preferred: topologies("accessibility_requirements.preferred", &a.preferred)?,
        },
        None => Accessibility::default(),
    };
    Ok(VolumeRequest {
        name: req.name.clone(),
        local_name: local_name(&req.name),
        capacity,
        parameters,
        accessibility,
        block: access == Access::Block,
        source,
    })
}

/// Validates a CreateSnapshot request. Nothing is created for a request
/// that fails here.
pub fn snapshot_request(req: &csi::CreateSnapshotRequest) -> Result<SnapshotRequest, CsiError> {
    if req.name.is_empty() {
        return Err(CsiError::invalid("name", "is required"));
    }
    if req.source_volume_id.is_empty() {
        return Err(CsiError::invalid("source_volume_id", "is required"));
    }
    Ok(SnapshotRequest {
        name: req.name.clone(),
        local_name: local_snapshot_name(&req.name),
        source_volume_id: req.source_volume_id.clone(),
    })
}

/// The topologies `list` (the field `field`) names. A node named in one
/// must be a node name: a CO only sends back what the nodes reported, and
/// a volume pinned to a name no node can have would wait for it forever.
fn topologies(field: &str, list: &[csi::Topology]) -> Result<Vec<Topology>, CsiError> {
    list.iter()
        .enumerate()
        .map(|(i, t)| match t.segments.get(TOPOLOGY_KEY) {
            Some(node) if !is_node_name(node) => Err(CsiError::invalid(
                format!("{field}[{i}].segments[{TOPOLOGY_KEY:?}]"),
                format!("{node:?} is not a node name (a DNS subdomain)"),
            )),
            _ => Ok(topology(t)),
        })
        .collect()
}

pub(super) fn topology(t: &csi::Topology) -> Topology {
    t.segments
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}
