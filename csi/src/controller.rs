//! The CSI Controller service over a [`Provisioner`].
//!
//! This module owns what the CSI spec asks of a controller and nothing about
//! where volumes live: request validation (errors name the field path),
//! the capability table, the per-volume in-flight lock, `ListVolumes`
//! pagination, and the conversions between the CSI wire and the domain
//! types. Every RPC this driver does not offer answers `UNIMPLEMENTED`.
//!
//! - Access: Carina volumes are local to one node, so only the single-node
//!   access modes are accepted (`SINGLE_NODE_WRITER`,
//!   `SINGLE_NODE_READER_ONLY`, `SINGLE_NODE_SINGLE_WRITER`,
//!   `SINGLE_NODE_MULTI_WRITER`), as block or as a mount with file system
//!   `ext4`, `xfs` or the default.
//! - In flight: a second CreateVolume, DeleteVolume or ControllerExpandVolume
//!   for a volume that already has one running answers `ABORTED` (the CO
//!   retries). The key is the node-local volume name, so a create by name
//!   and a delete by id of the same volume exclude each other too.
//! - Condition: `ListVolumes` and `ControllerGetVolume` report each
//!   volume's condition as its node sees it now (the provisioner asks);
//!   a node that cannot be asked, or no longer has the volume, makes the
//!   volume abnormal with a message naming the node.
//! - Pagination: volumes are listed in id order; a `next_token` names the
//!   last id returned, so a page boundary survives the deletion of that
//!   volume and volumes created meanwhile that sort later are seen. A token
//!   this service did not issue is `ABORTED`, as the spec asks.

use std::collections::HashMap;
use std::sync::Arc;

use carina_proto::csi;
use carina_proto::csi::controller_server::{Controller, ControllerServer};
use carina_proto::csi::controller_service_capability::rpc::Type as Capability;
use carina_sys::busy::{BusyNames, Held, busy_message};
use tonic::{Code, Request, Response, Status};

use crate::capability::{self, Access};
use crate::error::CsiError;
use crate::names::{is_node_name, local_name};
use crate::params::Parameters;
use crate::sizes;
use crate::snapshot_id::{self, local_snapshot_name};
use crate::types::{
    Accessibility, CapacityInfo, ContentSource, ProvisionedSnapshot, ProvisionedVolume,
    Provisioner, SnapshotRequest, Topology, VolumeHealth, VolumeRequest,
};
use crate::volume_id::VolumeId;
use crate::{TOPOLOGY_KEY, context};

/// What the controller advertises. `SINGLE_NODE_MULTI_WRITER` is the spec's
/// switch for the `SINGLE_NODE_SINGLE_WRITER` and `SINGLE_NODE_MULTI_WRITER`
/// access modes; `VOLUME_CONDITION` says `ListVolumes` and
/// `ControllerGetVolume` (`GET_VOLUME`) report each volume's condition.
pub const CAPABILITIES: [Capability; 7] = [
    Capability::CreateDeleteVolume,
    Capability::ExpandVolume,
    Capability::GetCapacity,
    Capability::ListVolumes,
    Capability::SingleNodeMultiWriter,
    Capability::VolumeCondition,
    Capability::GetVolume,
];

/// Prefix of the `ListVolumes` tokens this service issues.
const TOKEN_PREFIX: &str = "after.";

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

/// The capabilities a provisioner that makes copies adds to
/// [`CAPABILITIES`].
pub const COPY_CAPABILITIES: [Capability; 4] = [
    Capability::CreateDeleteSnapshot,
    Capability::ListSnapshots,
    Capability::GetSnapshot,
    Capability::CloneVolume,
];

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

/// The wire form of a snapshot.
pub fn wire_snapshot(s: &ProvisionedSnapshot) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: wire_bytes(s.size_bytes),
        snapshot_id: s.snapshot_id.clone(),
        source_volume_id: s.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: s.created_unix_nanos.div_euclid(1_000_000_000),
            nanos: s.created_unix_nanos.rem_euclid(1_000_000_000) as i32,
        }),
        ready_to_use: s.ready,
        group_snapshot_id: String::new(),
    }
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

fn topology(t: &csi::Topology) -> Topology {
    t.segments
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn wire_bytes(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The wire form of a volume; its accessible topology is its node.
pub fn wire_volume(v: &ProvisionedVolume) -> csi::Volume {
    csi::Volume {
        capacity_bytes: wire_bytes(v.capacity_bytes),
        volume_id: v.volume_id.clone(),
        volume_context: v
            .context
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        content_source: None,
        accessible_topology: vec![csi::Topology {
            segments: HashMap::from([(TOPOLOGY_KEY.to_string(), v.node.clone())]),
        }],
    }
}

fn wire_condition(h: VolumeHealth) -> csi::VolumeCondition {
    csi::VolumeCondition {
        abnormal: h.abnormal,
        message: h.message,
    }
}

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

/// The `next_token` that continues after `volume_id`.
pub fn encode_token(volume_id: &str) -> String {
    let hex: String = volume_id.bytes().map(|b| format!("{b:02x}")).collect();
    format!("{TOKEN_PREFIX}{hex}")
}

/// The volume id a token continues after; `ABORTED` for a token this
/// service did not issue.
pub fn decode_token(token: &str) -> Result<String, CsiError> {
    let bad = || {
        CsiError::Aborted(format!(
            "starting_token {token:?} was not issued by this plugin; list again without it"
        ))
    };
    let hex = token.strip_prefix(TOKEN_PREFIX).ok_or_else(bad)?;
    if hex.is_empty() || hex.len() % 2 != 0 {
        return Err(bad());
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| {
            hex.get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(bad)?;
    String::from_utf8(bytes).map_err(|_| bad())
}

/// A list request's paging: at most `max` entries, after the id the
/// starting token names.
struct Paging {
    max: usize,
    after: Option<String>,
}

impl Paging {
    /// From `max_entries` (negative is `INVALID_ARGUMENT`, 0 no limit)
    /// and `starting_token` (`ABORTED` when not ours).
    fn of(max_entries: i32, starting_token: &str) -> Result<Paging, CsiError> {
        if max_entries < 0 {
            return Err(CsiError::invalid(
                "max_entries",
                format!("{max_entries} is negative"),
            ));
        }
        let after = match starting_token {
            "" => None,
            token => Some(decode_token(token)?),
        };
        let max = match usize::try_from(max_entries) {
            Ok(0) | Err(_) => usize::MAX,
            Ok(n) => n,
        };
        Ok(Paging { max, after })
    }

    /// The page of `items` (sorted by `id` here) and the token of the
    /// next one (empty on the last).
    fn page<T>(&self, mut items: Vec<T>, id: impl Fn(&T) -> &String) -> (Vec<T>, String) {
        items.sort_by(|a, b| id(a).cmp(id(b)));
        if let Some(after) = &self.after {
            items.retain(|i| id(i).as_str() > after.as_str());
        }
        let next_token = match items.get(self.max.saturating_sub(1)) {
            Some(last) if items.len() > self.max => encode_token(id(last)),
            _ => String::new(),
        };
        items.truncate(self.max);
        (items, next_token)
    }
}

/// The CSI Controller service. Cheap to clone; clones share the in-flight
/// set.
#[derive(Debug)]
pub struct ControllerService<P> {
    provisioner: Arc<P>,
    in_flight: BusyNames,
}

impl<P> Clone for ControllerService<P> {
    fn clone(&self) -> Self {
        ControllerService {
            provisioner: self.provisioner.clone(),
            in_flight: self.in_flight.clone(),
        }
    }
}

impl<P: Provisioner> ControllerService<P> {
    pub fn new(provisioner: Arc<P>) -> Self {
        ControllerService {
            provisioner,
            in_flight: BusyNames::default(),
        }
    }

    /// The tonic service to add to a server.
    pub fn into_server(self) -> ControllerServer<Self> {
        ControllerServer::new(self)
    }

    /// Claims `volume` for one call; `ABORTED` if a call on it is running.
    fn claim(&self, volume: &str) -> Result<Held, CsiError> {
        self.in_flight
            .try_hold(volume)
            .ok_or_else(|| CsiError::Aborted(busy_message(volume)))
    }

    /// The volume `volume_id` names: `NOT_FOUND` when there is none or the
    /// id is not of a form this driver issues.
    async fn existing(&self, volume_id: &str) -> Result<ProvisionedVolume, CsiError> {
        VolumeId::parse(volume_id)?;
        self.provisioner
            .get_volume(volume_id)
            .await?
            .ok_or_else(|| CsiError::NotFound(format!("volume {volume_id:?} does not exist")))
    }

    #[tracing::instrument(name = "Controller/CreateVolume", skip_all, err(level = "info"), fields(carina.volume.name = %req.name))]
    async fn create(
        &self,
        req: csi::CreateVolumeRequest,
    ) -> Result<csi::CreateVolumeResponse, CsiError> {
        let request = volume_request(&req)?;
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
        Ok(csi::CreateVolumeResponse { volume: Some(wire) })
    }

    #[tracing::instrument(name = "Controller/CreateSnapshot", skip_all, err(level = "info"), fields(carina.snapshot.name = %req.name, carina.volume.id = %req.source_volume_id))]
    async fn create_snapshot(
        &self,
        req: csi::CreateSnapshotRequest,
    ) -> Result<csi::CreateSnapshotResponse, CsiError> {
        self.copies_offered("CreateSnapshot")?;
        let request = snapshot_request(&req)?;
        let _claim = self.claim(&request.local_name)?;
        let snapshot = self.provisioner.create_snapshot(&request).await?;
        tracing::info!(carina.snapshot.id = %snapshot.snapshot_id, size_bytes = snapshot.size_bytes, "snapshot ready");
        Ok(csi::CreateSnapshotResponse {
            snapshot: Some(wire_snapshot(&snapshot)),
        })
    }

    #[tracing::instrument(name = "Controller/DeleteSnapshot", skip_all, err(level = "info"), fields(carina.snapshot.id = %req.snapshot_id))]
    async fn delete_snapshot(
        &self,
        req: csi::DeleteSnapshotRequest,
    ) -> Result<csi::DeleteSnapshotResponse, CsiError> {
        self.copies_offered("DeleteSnapshot")?;
        // No snapshot can have a malformed id: deleting it is done.
        let id = match snapshot_id::parse("snapshot_id", &req.snapshot_id) {
            Ok(id) => id,
            Err(CsiError::NotFound(_)) => return Ok(csi::DeleteSnapshotResponse {}),
            Err(e) => return Err(e),
        };
        let _claim = self.claim(&id.volume)?;
        match self.provisioner.delete_snapshot(&req.snapshot_id).await {
            Err(e) if e.code() != Code::NotFound => Err(e),
            _ => Ok(csi::DeleteSnapshotResponse {}),
        }
    }

    #[tracing::instrument(name = "Controller/ListSnapshots", skip_all, err(level = "info"), fields(max_entries = req.max_entries))]
    async fn list_snapshots(
        &self,
        req: csi::ListSnapshotsRequest,
    ) -> Result<csi::ListSnapshotsResponse, CsiError> {
        self.copies_offered("ListSnapshots")?;
        let paging = Paging::of(req.max_entries, &req.starting_token)?;
        let mut snapshots = self.provisioner.list_snapshots().await?;
        snapshots.retain(|s| {
            (req.snapshot_id.is_empty() || s.snapshot_id == req.snapshot_id)
                && (req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id)
        });
        let (snapshots, next_token) = paging.page(snapshots, |s| &s.snapshot_id);
        Ok(csi::ListSnapshotsResponse {
            entries: snapshots
                .iter()
                .map(|s| csi::list_snapshots_response::Entry {
                    snapshot: Some(wire_snapshot(s)),
                })
                .collect(),
            next_token,
        })
    }

    #[tracing::instrument(name = "Controller/GetSnapshot", skip_all, err(level = "info"), fields(carina.snapshot.id = %req.snapshot_id))]
    async fn get_snapshot(
        &self,
        req: csi::GetSnapshotRequest,
    ) -> Result<csi::GetSnapshotResponse, CsiError> {
        self.copies_offered("GetSnapshot")?;
        snapshot_id::parse("snapshot_id", &req.snapshot_id)?;
        let snapshot = self
            .provisioner
            .list_snapshots()
            .await?
            .into_iter()
            .find(|s| s.snapshot_id == req.snapshot_id)
            .ok_or_else(|| {
                CsiError::NotFound(format!("snapshot {:?} does not exist", req.snapshot_id))
            })?;
        Ok(csi::GetSnapshotResponse {
            snapshot: Some(wire_snapshot(&snapshot)),
        })
    }

    /// `UNIMPLEMENTED` for `rpc` when the provisioner makes no copies.
    fn copies_offered(&self, rpc: &str) -> Result<(), CsiError> {
        if self.provisioner.copies() {
            Ok(())
        } else {
            Err(CsiError::Unimplemented(format!(
                "{rpc} is not offered by this control plane"
            )))
        }
    }

    #[tracing::instrument(name = "Controller/DeleteVolume", skip_all, err(level = "info"), fields(carina.volume.id = %req.volume_id))]
    async fn delete(
        &self,
        req: csi::DeleteVolumeRequest,
    ) -> Result<csi::DeleteVolumeResponse, CsiError> {
        // An empty id is INVALID_ARGUMENT; no volume can have a malformed
        // one, so deleting it is done.
        let id = match VolumeId::parse(&req.volume_id) {
            Ok(id) => id,
            Err(CsiError::NotFound(_)) => return Ok(csi::DeleteVolumeResponse {}),
            Err(e) => return Err(e),
        };
        let _claim = self.claim(&id.volume)?;
        match self.provisioner.delete_volume(&req.volume_id).await {
            Err(e) if e.code() != Code::NotFound => Err(e),
            _ => Ok(csi::DeleteVolumeResponse {}),
        }
    }

    #[tracing::instrument(name = "Controller/ControllerExpandVolume", skip_all, err(level = "info"), fields(carina.volume.id = %req.volume_id))]
    async fn expand(
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
        let id = VolumeId::parse(&req.volume_id)?;
        let _claim = self.claim(&id.volume)?;
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
    async fn validate(
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
    async fn list(
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
    async fn get(
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
    async fn capacity(
        &self,
        req: csi::GetCapacityRequest,
    ) -> Result<csi::GetCapacityResponse, CsiError> {
        let parameters = Parameters::parse(&req.parameters)?;
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

fn answer<T>(result: Result<T, CsiError>) -> Result<Response<T>, Status> {
    result.map(Response::new).map_err(Status::from)
}

fn unimplemented<T>(rpc: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!(
        "{rpc} is not offered by the Carina controller"
    )))
}

#[tonic::async_trait]
impl<P: Provisioner> Controller for ControllerService<P> {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        answer(self.create(request.into_inner()).await)
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        answer(self.delete(request.into_inner()).await)
    }

    async fn controller_publish_volume(
        &self,
        _request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        unimplemented("ControllerPublishVolume")
    }

    async fn controller_unpublish_volume(
        &self,
        _request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        unimplemented("ControllerUnpublishVolume")
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        answer(self.validate(request.into_inner()).await)
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        answer(self.list(request.into_inner()).await)
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        answer(self.capacity(request.into_inner()).await)
    }

    #[tracing::instrument(name = "Controller/ControllerGetCapabilities", skip_all)]
    async fn controller_get_capabilities(
        &self,
        _request: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use csi::controller_service_capability::{Rpc, Type};
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: CAPABILITIES
                .iter()
                .chain(if self.provisioner.copies() {
                    COPY_CAPABILITIES.iter()
                } else {
                    [].iter()
                })
                .map(|c| csi::ControllerServiceCapability {
                    r#type: Some(Type::Rpc(Rpc { r#type: *c as i32 })),
                })
                .collect(),
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        answer(ControllerService::create_snapshot(self, request.into_inner()).await)
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        answer(ControllerService::delete_snapshot(self, request.into_inner()).await)
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        answer(ControllerService::list_snapshots(self, request.into_inner()).await)
    }

    async fn get_snapshot(
        &self,
        request: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        answer(ControllerService::get_snapshot(self, request.into_inner()).await)
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        answer(self.expand(request.into_inner()).await)
    }

    async fn controller_get_volume(
        &self,
        request: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        answer(self.get(request.into_inner()).await)
    }

    async fn controller_modify_volume(
        &self,
        _request: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        unimplemented("ControllerModifyVolume")
    }
}

#[cfg(test)]
mod tests {

    proptest::proptest! {
        /// A token we issue reads back as its volume id; any other text is
        /// refused or read, never a panic.
        #[test]
        fn page_tokens_round_trip_and_take_anything(id in ".{1,80}", junk in carina_sys::testkit::noisy_text()) {
            proptest::prop_assert_eq!(super::decode_token(&super::encode_token(&id)).ok(), Some(id));
            let _ = super::decode_token(&junk);
        }
    }
    use std::collections::BTreeMap;
    use std::sync::Mutex as StdMutex;

    use async_trait::async_trait;
    use carina_proto::csi::volume_capability::AccessType;
    use carina_proto::csi::volume_capability::access_mode::Mode;
    use tokio::sync::Notify;

    use crate::capability::testing::{block, cap, mount};
    use crate::params::FsType;

    use super::*;
    use crate::types::{CapacityInfo, CapacityRange};

    const GIB: i64 = 1 << 30;

    /// Volumes in memory on one node `n`; `gate`, when set, holds every
    /// create until notified.
    #[derive(Default)]
    struct Fake {
        volumes: StdMutex<BTreeMap<String, ProvisionedVolume>>,
        gate: Option<Arc<Notify>>,
        entered: Arc<Notify>,
        /// Volume ids whose node calls them abnormal, with the message.
        sick: StdMutex<BTreeMap<String, String>>,
    }

    fn fake_volume(local: &str, size: u64) -> ProvisionedVolume {
        ProvisionedVolume {
            volume_id: VolumeId::new(local, "n").encode(),
            capacity_bytes: size,
            node: "n".into(),
            group: "g".into(),
            context: BTreeMap::from([(context::POLICY.to_string(), "HOST".to_string())]),
        }
    }

    #[async_trait]
    impl Provisioner for Fake {
        async fn create_volume(&self, req: &VolumeRequest) -> Result<ProvisionedVolume, CsiError> {
            self.entered.notify_one();
            if let Some(gate) = &self.gate {
                gate.notified().await;
            }
            let size = sizes::allocation(&req.capacity, 4096)?;
            let v = fake_volume(&req.local_name, size);
            self.volumes
                .lock()
                .expect("not poisoned")
                .insert(v.volume_id.clone(), v.clone());
            Ok(v)
        }

        async fn delete_volume(&self, volume_id: &str) -> Result<(), CsiError> {
            self.volumes.lock().expect("not poisoned").remove(volume_id);
            Ok(())
        }

        async fn expand_volume(
            &self,
            volume_id: &str,
            range: &CapacityRange,
        ) -> Result<u64, CsiError> {
            let mut vols = self.volumes.lock().expect("not poisoned");
            let v = vols
                .get_mut(volume_id)
                .ok_or_else(|| CsiError::NotFound(volume_id.into()))?;
            v.capacity_bytes = v.capacity_bytes.max(range.required_bytes);
            Ok(v.capacity_bytes)
        }

        async fn get_volume(&self, volume_id: &str) -> Result<Option<ProvisionedVolume>, CsiError> {
            Ok(self
                .volumes
                .lock()
                .expect("not poisoned")
                .get(volume_id)
                .cloned())
        }

        async fn list_volumes(&self) -> Result<Vec<ProvisionedVolume>, CsiError> {
            Ok(self
                .volumes
                .lock()
                .expect("not poisoned")
                .values()
                .cloned()
                .collect())
        }

        async fn volume_health(&self, volumes: &[ProvisionedVolume]) -> Vec<VolumeHealth> {
            let sick = self.sick.lock().expect("not poisoned");
            volumes
                .iter()
                .map(|v| match sick.get(&v.volume_id) {
                    Some(m) => VolumeHealth::abnormal(m.clone()),
                    None => VolumeHealth::default(),
                })
                .collect()
        }

        async fn capacity(
            &self,
            _: Option<&Topology>,
            _: Option<&str>,
        ) -> Result<CapacityInfo, CsiError> {
            Ok(CapacityInfo {
                available_bytes: 100,
                maximum_volume_size: 60,
            })
        }
    }

    fn create_req(name: &str) -> csi::CreateVolumeRequest {
        csi::CreateVolumeRequest {
            name: name.into(),
            volume_capabilities: vec![cap(Mode::SingleNodeWriter, mount(""))],
            capacity_range: Some(csi::CapacityRange {
                required_bytes: GIB,
                limit_bytes: 0,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn create_request_validation() {
        let ok = volume_request(&create_req("pvc-1")).expect("valid");
        assert_eq!(ok.local_name, "pvc-1");
        assert!(!ok.block);
        let mut r = create_req("pvc-1");
        r.volume_capabilities = vec![cap(Mode::SingleNodeWriter, mount("xfs"))];
        let v = volume_request(&r).expect("valid");
        assert_eq!(
            v.parameters.fs_type,
            Some(FsType::Xfs),
            "fs type from the capability"
        );
        r.parameters = HashMap::from([(crate::params::FS_TYPE.to_string(), "ext4".to_string())]);
        assert!(matches!(
            volume_request(&r),
            Err(CsiError::InvalidArgument { .. })
        ));

        let mut r = create_req("pvc-1");
        r.volume_content_source = Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: "s".into(),
                },
            )),
        });
        assert_eq!(
            volume_request(&r).expect("valid").source,
            Some(ContentSource::Snapshot("s".into()))
        );
        r.volume_content_source = Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Volume(
                csi::volume_content_source::VolumeSource {
                    volume_id: String::new(),
                },
            )),
        });
        match volume_request(&r) {
            Err(CsiError::InvalidArgument { field, .. }) => {
                assert_eq!(field, "volume_content_source.volume.volume_id")
            }
            other => panic!("{other:?}"),
        }
        r.volume_content_source = Some(csi::VolumeContentSource { r#type: None });
        assert!(matches!(
            volume_request(&r),
            Err(CsiError::InvalidArgument { .. })
        ));

        let mut r = create_req("pvc-1");
        r.parameters = HashMap::from(
            [
                (crate::params::BACKEND_GROUP, "hdd"),
                (crate::params::CACHE_GROUP, "ssd"),
                (crate::params::CACHE_RATIO, "10"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        let v = volume_request(&r).expect("a tiered volume");
        let b = v.parameters.bcache.expect("bcache parameters");
        assert_eq!((b.backend_group.as_str(), b.cache_ratio), ("hdd", 10));

        let mut r = create_req("pvc-1");
        r.accessibility_requirements = Some(csi::TopologyRequirement {
            requisite: vec![csi::Topology {
                segments: HashMap::from([(TOPOLOGY_KEY.to_string(), "n".to_string())]),
            }],
            preferred: vec![],
        });
        let v = volume_request(&r).expect("valid");
        assert_eq!(v.accessibility.requisite[0][TOPOLOGY_KEY], "n");
        // A node no Kubernetes node can be: the volume would wait forever.
        r.accessibility_requirements = Some(csi::TopologyRequirement {
            requisite: vec![],
            preferred: vec![csi::Topology {
                segments: HashMap::from([(TOPOLOGY_KEY.to_string(), "N\n".to_string())]),
            }],
        });
        match volume_request(&r) {
            Err(CsiError::InvalidArgument { field, .. }) => assert_eq!(
                field,
                format!("accessibility_requirements.preferred[0].segments[{TOPOLOGY_KEY:?}]")
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tiered_capacity_is_the_smaller_of_backing_and_cache() {
        let info = |available_bytes, maximum_volume_size| CapacityInfo {
            available_bytes,
            maximum_volume_size,
        };
        let offset = crate::params::BCACHE_DATA_OFFSET;
        let mib = 1u64 << 20;
        // 25%: 100 MiB of cache backs 400 MiB.
        let t = tiered_capacity(info(1000 * mib, 600 * mib), info(100 * mib, 50 * mib), 25);
        assert_eq!(t, info(400 * mib - offset, 200 * mib - offset));
        let t = tiered_capacity(info(100 * mib, 100 * mib), info(1000 * mib, 1000 * mib), 25);
        assert_eq!(t, info(100 * mib - offset, 100 * mib - offset));
        assert_eq!(tiered_capacity(info(0, 0), info(mib, mib), 10), info(0, 0));
    }

    #[test]
    fn tokens() {
        for id in ["a@n", "pvc-1@node-b.example", "ü@n"] {
            assert_eq!(decode_token(&encode_token(id)).expect("round trip"), id);
        }
        for bad in [
            "invalid-token",
            "after.",
            "after.0",
            "after.zz",
            "after.ff",
            "61406e",
        ] {
            assert!(
                matches!(decode_token(bad), Err(CsiError::Aborted(_))),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn second_operation_on_a_busy_volume_is_aborted() {
        let gate = Arc::new(Notify::new());
        let fake = Arc::new(Fake {
            gate: Some(gate.clone()),
            ..Default::default()
        });
        let svc = ControllerService::new(fake.clone());
        let first = tokio::spawn({
            let svc = svc.clone();
            async move { svc.create(create_req("pvc-1")).await }
        });
        fake.entered.notified().await;
        let again = svc.create(create_req("pvc-1")).await.expect_err("busy");
        assert_eq!(again.code(), Code::Aborted);
        let delete = svc
            .delete(csi::DeleteVolumeRequest {
                volume_id: "pvc-1@n".into(),
                ..Default::default()
            })
            .await
            .expect_err("busy");
        assert_eq!(delete.code(), Code::Aborted);
        gate.notify_one();
        first.await.expect("joined").expect("created");
        // Released: the next operation runs.
        svc.delete(csi::DeleteVolumeRequest {
            volume_id: "pvc-1@n".into(),
            ..Default::default()
        })
        .await
        .expect("deleted");
    }

    #[tokio::test]
    async fn without_copies_no_snapshot_capability_and_no_content_source() {
        let svc = ControllerService::new(Arc::new(Fake::default()));
        let caps = Controller::controller_get_capabilities(
            &svc,
            Request::new(csi::ControllerGetCapabilitiesRequest {}),
        )
        .await
        .expect("capabilities")
        .into_inner()
        .capabilities;
        assert_eq!(caps.len(), CAPABILITIES.len());
        let err = svc
            .create_snapshot(csi::CreateSnapshotRequest {
                name: "s".into(),
                source_volume_id: "pvc-1@n".into(),
                ..Default::default()
            })
            .await
            .expect_err("not offered");
        assert_eq!(err.code(), Code::Unimplemented);
        let mut req = create_req("pvc-1");
        req.volume_content_source = Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Volume(
                csi::volume_content_source::VolumeSource {
                    volume_id: "pvc-0@n".into(),
                },
            )),
        });
        let err = svc.create(req).await.expect_err("no clones");
        assert_eq!(err.code(), Code::InvalidArgument);
    }

    #[test]
    fn snapshot_requests_name_their_fields_and_ids_are_apart_from_volumes() {
        let field = |req: csi::CreateSnapshotRequest| match snapshot_request(&req) {
            Err(CsiError::InvalidArgument { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            field(csi::CreateSnapshotRequest {
                source_volume_id: "v@n".into(),
                ..Default::default()
            }),
            "name"
        );
        assert_eq!(
            field(csi::CreateSnapshotRequest {
                name: "s".into(),
                ..Default::default()
            }),
            "source_volume_id"
        );
        let ok = snapshot_request(&csi::CreateSnapshotRequest {
            name: "pvc-1".into(),
            source_volume_id: "pvc-1@n".into(),
            ..Default::default()
        })
        .expect("valid");
        // Even a name a volume could keep is hashed: never a volume's name.
        assert_ne!(ok.local_name, "pvc-1");
        let id = format!("{}@n", ok.local_name);
        assert_eq!(
            VolumeId::parse(&id).expect_err("a snapshot id").code(),
            Code::NotFound
        );
        let wire = wire_snapshot(&ProvisionedSnapshot {
            snapshot_id: id.clone(),
            source_volume_id: "pvc-1@n".into(),
            size_bytes: 4096,
            created_unix_nanos: 1_500_000_000,
            ready: true,
        });
        let t = wire.creation_time.expect("time");
        assert_eq!((t.seconds, t.nanos), (1, 500_000_000));
    }

    #[tokio::test]
    async fn list_pages_survive_deleting_the_last_entry() {
        let fake = Arc::new(Fake::default());
        let svc = ControllerService::new(fake.clone());
        for i in 0..5 {
            svc.create(create_req(&format!("v{i}")))
                .await
                .expect("created");
        }
        let page = |max: i32, token: String| {
            let svc = svc.clone();
            async move {
                svc.list(csi::ListVolumesRequest {
                    max_entries: max,
                    starting_token: token,
                })
                .await
                .expect("listed")
            }
        };
        let ids = |r: &csi::ListVolumesResponse| -> Vec<String> {
            r.entries
                .iter()
                .map(|e| e.volume.as_ref().expect("volume").volume_id.clone())
                .collect()
        };
        let p1 = page(2, String::new()).await;
        assert_eq!(ids(&p1), ["v0@n", "v1@n"]);
        svc.delete(csi::DeleteVolumeRequest {
            volume_id: "v1@n".into(),
            ..Default::default()
        })
        .await
        .expect("deleted");
        let p2 = page(2, p1.next_token.clone()).await;
        assert_eq!(ids(&p2), ["v2@n", "v3@n"]);
        let p3 = page(2, p2.next_token.clone()).await;
        assert_eq!(ids(&p3), ["v4@n"]);
        assert!(p3.next_token.is_empty());
        assert_eq!(ids(&page(0, String::new()).await).len(), 4);
        assert_eq!(ids(&page(4, String::new()).await).len(), 4);
        assert!(
            page(4, String::new()).await.next_token.is_empty(),
            "exactly one page"
        );
    }

    #[tokio::test]
    async fn list_and_get_report_each_volume_condition() {
        let fake = Arc::new(Fake::default());
        let svc = ControllerService::new(fake.clone());
        for name in ["a", "b", "c"] {
            svc.create(create_req(name)).await.expect("created");
        }
        fake.sick
            .lock()
            .expect("not poisoned")
            .insert("b@n".into(), "device /dev/loop9 is gone".into());
        let condition = |e: &csi::list_volumes_response::Entry| {
            e.status
                .as_ref()
                .and_then(|s| s.volume_condition.clone())
                .expect("a condition")
        };
        // A page of two: the condition of each entry, in order.
        let page = svc
            .list(csi::ListVolumesRequest {
                max_entries: 2,
                starting_token: String::new(),
            })
            .await
            .expect("listed");
        let seen: Vec<(bool, String)> = page
            .entries
            .iter()
            .map(|e| {
                let c = condition(e);
                (c.abnormal, c.message)
            })
            .collect();
        assert_eq!(
            seen,
            [
                (false, String::new()),
                (true, "device /dev/loop9 is gone".to_string())
            ]
        );

        let get = |id: &str| {
            let svc = svc.clone();
            let id = id.to_string();
            async move {
                svc.get(csi::ControllerGetVolumeRequest { volume_id: id })
                    .await
            }
        };
        let b = get("b@n").await.expect("found");
        assert_eq!(b.volume.expect("volume").volume_id, "b@n");
        let c = b
            .status
            .and_then(|s| s.volume_condition)
            .expect("a condition");
        assert!(c.abnormal);
        assert_eq!(c.message, "device /dev/loop9 is gone");
        let a = get("a@n").await.expect("found");
        assert_eq!(
            a.status.and_then(|s| s.volume_condition),
            Some(csi::VolumeCondition {
                abnormal: false,
                message: String::new()
            })
        );
        assert_eq!(
            get("").await.expect_err("no id").code(),
            Code::InvalidArgument
        );
        assert_eq!(
            get("zz@n").await.expect_err("unknown").code(),
            Code::NotFound
        );
        assert!(CAPABILITIES.contains(&Capability::VolumeCondition));
        assert!(CAPABILITIES.contains(&Capability::GetVolume));
    }

    #[tokio::test]
    async fn validate_and_expand() {
        let fake = Arc::new(Fake::default());
        let svc = ControllerService::new(fake.clone());
        svc.create(create_req("v")).await.expect("created");
        let validate = |caps: Vec<csi::VolumeCapability>| {
            let svc = svc.clone();
            async move {
                svc.validate(csi::ValidateVolumeCapabilitiesRequest {
                    volume_id: "v@n".into(),
                    volume_capabilities: caps,
                    ..Default::default()
                })
                .await
                .expect("answered")
            }
        };
        let ok = validate(vec![cap(Mode::SingleNodeWriter, mount(""))]).await;
        assert!(
            ok.confirmed
                .is_some_and(|c| c.volume_capabilities.len() == 1)
        );
        let multi = validate(vec![cap(Mode::MultiNodeMultiWriter, mount(""))]).await;
        assert!(multi.confirmed.is_none());
        assert!(
            multi.message.contains("MULTI_NODE_MULTI_WRITER"),
            "{}",
            multi.message
        );
        let host_block = validate(vec![cap(Mode::SingleNodeWriter, block())]).await;
        assert!(
            host_block.confirmed.is_none(),
            "a directory is no block device"
        );

        let expand = |access: AccessType| {
            let svc = svc.clone();
            async move {
                svc.expand(csi::ControllerExpandVolumeRequest {
                    volume_id: "v@n".into(),
                    capacity_range: Some(csi::CapacityRange {
                        required_bytes: 2 * GIB,
                        limit_bytes: 0,
                    }),
                    volume_capability: Some(cap(Mode::SingleNodeWriter, access)),
                    ..Default::default()
                })
                .await
                .expect("expanded")
            }
        };
        let r = expand(mount("")).await;
        assert_eq!(r.capacity_bytes, 2 * GIB);
        assert!(r.node_expansion_required);
        assert!(!expand(block()).await.node_expansion_required);
    }
}
