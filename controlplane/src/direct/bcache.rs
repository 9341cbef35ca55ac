//! Tiered (bcache) volumes in the direct control plane. A bcache class
//! (the StorageClass parameters `csi::params` parses for both planes) is
//! placed by the shared placement rules (backing volume in the backend
//! group, room for the cache in the cache group on the same node), then
//! made by one `CreateBcache` on that node: the node makes the backing
//! and cache volumes ([`crate::nodes::bcache::create_request`]) and the
//! device, and undoes all of it when any step fails.
//!
//! **Idempotency.** Every node is asked for the name first, as a bcache
//! device (`GetBcache`) and as a volume (`GetLV`). A device tiered as the
//! request asks, of a size in its range, on an accessible node is the
//! answer (a device whose create died half-way is finished by a
//! `CreateBcache` with its own recorded arguments); any other device or
//! volume of that name is `ALREADY_EXISTS`.
//!
//! **Size.** The volume is the bcache device: its backing volume less
//! the data offset ([`carina_csi::params::BCACHE_DATA_OFFSET`]), as the
//! node's CSI side reports it. It cannot grow (`FAILED_PRECONDITION`).
//!
//! **Delete.** `DeleteBcache` (the node detaches, flushing, stops, wipes
//! and deletes the volumes it made); `NOT_FOUND` is success.

use std::collections::{BTreeMap, BTreeSet};

use carina_api::LogicVolumeSpec;
use carina_csi::params::{BCACHE_DATA_OFFSET, BcacheParams};
use carina_csi::volume_id::VolumeId;
use carina_csi::{CapacityRange, CsiError, ProvisionedVolume, VolumeRequest, context, sizes};
use carina_proto::nodestorage as pb;
use futures::future::join_all;
use tonic::Code;

use super::{DirectProvisioner, unavailable_or};
use crate::nodes::bcache::{cache_policy_name, cannot_grow, create_request, tiering_differs};
use crate::nodes::spec::NodeSpec;
use crate::nodes::volume::fs_type;

impl DirectProvisioner {
    /// The bcache device `name` on `node`, if it has one.
    pub(super) async fn get_bcache(
        &self,
        node: &NodeSpec,
        name: &str,
    ) -> Result<Option<pb::BcacheDevice>, CsiError> {
        let req = pb::GetBcacheRequest {
            name: name.to_string(),
        };
        match self
            .clients
            .call(node, &format!("GetBcache {name}"), |mut c| async move {
                c.get_bcache(req).await
            })
            .await
        {
            Ok(r) => Ok(r.device),
            Err(e) if e.code() == Code::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The node holding the bcache device `name`, failing when a node
    /// cannot say.
    pub(super) async fn find_tiered(
        &self,
        name: &str,
    ) -> Result<Option<(&NodeSpec, pb::BcacheDevice)>, CsiError> {
        let lookups = join_all(self.nodes.nodes.iter().map(|n| self.get_bcache(n, name))).await;
        for (node, found) in self.nodes.nodes.iter().zip(lookups) {
            let found = found.map_err(|e| {
                unavailable_or(e, |m| {
                    format!("cannot tell whether bcache device {name:?} already exists: {m}")
                })
            })?;
            if let Some(d) = found {
                return Ok(Some((node, d)));
            }
        }
        Ok(None)
    }

    /// The control plane's view of the bcache device `d` on `node`; its
    /// size and policy come from its backing volume.
    pub(super) async fn tiered(
        &self,
        node: &NodeSpec,
        d: &pb::BcacheDevice,
        fs: Option<carina_csi::params::FsType>,
    ) -> Result<ProvisionedVolume, CsiError> {
        let backing = self.get_lv(node, &d.backing_volume).await?;
        Ok(tiered_volume(node, d, backing.as_ref(), fs))
    }

    /// CreateVolume of a bcache class.
    #[tracing::instrument(name = "direct.create_tiered", skip_all, err(level = "info"), fields(carina.volume.name = %req.local_name, carina.group = %b.backend_group, carina.cache.group = %b.cache_group))]
    pub(super) async fn create_tiered(
        &self,
        req: &VolumeRequest,
        b: &BcacheParams,
    ) -> Result<ProvisionedVolume, CsiError> {
        if req.source.is_some() {
            return Err(CsiError::invalid(
                "volume_content_source",
                "a bcache (tiered) volume cannot be filled from a snapshot or a volume",
            ));
        }
        let name = &req.local_name;
        if let Some(found) = self.existing_tiered(req, b).await? {
            tracing::info!(carina.volume.id = %found.volume_id, "bcache volume exists already");
            return Ok(found);
        }
        let mut exhausted = Vec::new();
        for p in self.ranked(req).await? {
            let Some(node) = self.nodes.get(&p.node) else {
                continue;
            };
            let create = create_request(
                name,
                &p.group,
                p.size_bytes,
                &b.cache_group,
                u32::from(b.cache_ratio),
                &b.cache_policy,
            );
            tracing::info!(k8s.node.name = %p.node, carina.group = %p.group, carina.volume.size_bytes = p.size_bytes, strategy = %self.strategy, "placing bcache volume");
            match self.make(node, create).await {
                Ok((d, created)) => {
                    let v = self.tiered(node, &d, fs_type(req)).await?;
                    if !sizes::satisfies(&req.capacity, v.capacity_bytes) {
                        let why = format!(
                            "bcache volume {name:?} on node {} would be {} bytes, above limit_bytes {}",
                            node.name, v.capacity_bytes, req.capacity.limit_bytes
                        );
                        if created && let Err(e) = self.delete_tiered(node, name).await {
                            tracing::warn!(error = %e, "removing the oversized bcache volume failed");
                        }
                        return Err(CsiError::OutOfRange(why));
                    }
                    return Ok(v);
                }
                // Someone took the space since Capacity: try the next.
                Err(e) if e.code() == Code::ResourceExhausted => exhausted.push(e.to_string()),
                Err(e) => return Err(e),
            }
        }
        Err(CsiError::ResourceExhausted(exhausted.join("; ")))
    }

    /// `CreateBcache` on `node`: the running device and whether this call
    /// made it.
    async fn make(
        &self,
        node: &NodeSpec,
        create: pb::CreateBcacheRequest,
    ) -> Result<(pb::BcacheDevice, bool), CsiError> {
        let what = format!(
            "CreateBcache {} in groups {:?}/{:?}",
            create.name, create.backing_device_group, create.cache_device_group
        );
        let r = self
            .clients
            .call(
                node,
                &what,
                |mut c| async move { c.create_bcache(create).await },
            )
            .await?;
        let d = r.device.ok_or_else(|| {
            CsiError::Internal(format!(
                "node {}: CreateBcache answered no device",
                node.name
            ))
        })?;
        if d.device_path.is_empty() {
            return Err(not_running(node, &d));
        }
        Ok((d, r.created))
    }

    /// The existing device or volume named like the request, checked
    /// against it.
    async fn existing_tiered(
        &self,
        req: &VolumeRequest,
        b: &BcacheParams,
    ) -> Result<Option<ProvisionedVolume>, CsiError> {
        let name = &req.local_name;
        let volumes = join_all(self.nodes.nodes.iter().map(|n| self.get_lv(n, name))).await;
        for (node, found) in self.nodes.nodes.iter().zip(volumes) {
            let found = found.map_err(|e| {
                unavailable_or(e, |m| {
                    format!("cannot tell whether volume {name:?} already exists: {m}")
                })
            })?;
            if let Some(lv) = found {
                return Err(CsiError::AlreadyExists(format!(
                    "volume {:?} exists on node {} ({} bytes in group {:?}) without a cache, and the request asks for one in group {:?}",
                    req.name, node.name, lv.size_bytes, lv.device_group, b.cache_group
                )));
            }
        }
        let Some((node, d)) = self.find_tiered(name).await? else {
            return Ok(None);
        };
        let v = self.tiered(node, &d, fs_type(req)).await?;
        let accessible = req.accessibility.requisite.is_empty()
            || req.accessibility.requisite.iter().any(|t| node.matches(t));
        let why = tiering_differs(
            b,
            &d.backing_device_group,
            &d.cache_device_group,
            d.cache_ratio_percent,
            cache_policy_name(d.cache_mode()),
        )
        .or_else(|| sizes::unsatisfied(&req.capacity, Some(v.capacity_bytes)))
        .or_else(|| {
            (!accessible)
                .then(|| "its node is outside the requested accessible topology".to_string())
        });
        if let Some(why) = why {
            return Err(CsiError::AlreadyExists(format!(
                "bcache volume {:?} exists on node {} ({} bytes) but {why}",
                req.name, node.name, v.capacity_bytes
            )));
        }
        if !d.device_path.is_empty() {
            return Ok(Some(v));
        }
        // Not running: a create that died half-way, or a device the node
        // could not assemble. The same arguments finish or re-assemble it.
        tracing::info!(k8s.node.name = %node.name, state = %d.state, "finishing the bcache device");
        let again = create_request(
            name,
            &d.backing_device_group,
            d.size_bytes,
            &d.cache_device_group,
            d.cache_ratio_percent,
            cache_policy_name(d.cache_mode()),
        );
        let (d, _) = self.make(node, again).await?;
        Ok(Some(self.tiered(node, &d, fs_type(req)).await?))
    }

    /// `DeleteBcache` of `name` on `node`; a device already gone is
    /// deleted.
    pub(super) async fn delete_tiered(&self, node: &NodeSpec, name: &str) -> Result<(), CsiError> {
        let req = pb::DeleteBcacheRequest {
            name: name.to_string(),
        };
        match self
            .clients
            .call(node, &format!("DeleteBcache {name}"), |mut c| async move {
                c.delete_bcache(req).await
            })
            .await
        {
            Err(e) if e.code() == Code::NotFound => Ok(()),
            other => other.map(drop),
        }
    }

    /// ControllerExpandVolume of the bcache device `d`: its size when that
    /// is enough, else `FAILED_PRECONDITION`.
    pub(super) async fn expand_tiered(
        &self,
        volume_id: &str,
        node: &NodeSpec,
        d: &pb::BcacheDevice,
        range: &CapacityRange,
    ) -> Result<u64, CsiError> {
        let current = self.tiered(node, d, None).await?.capacity_bytes;
        if current >= range.required_bytes {
            return Ok(current);
        }
        Err(cannot_grow(volume_id, &d.cache_device_group, current))
    }

    /// The bcache volumes among the volumes `lvs` of `node` (a backing
    /// volume `<name>+data` whose device `<name>` exists), and the names of
    /// the volumes they are made of, which are not volumes of their own.
    pub(super) async fn tiered_among(
        &self,
        node: &NodeSpec,
        lvs: &[pb::LogicVolume],
    ) -> Result<(Vec<ProvisionedVolume>, BTreeSet<String>), CsiError> {
        let by_name: BTreeMap<&str, &pb::LogicVolume> =
            lvs.iter().map(|lv| (lv.name.as_str(), lv)).collect();
        let mut tiered = Vec::new();
        let mut members = BTreeSet::new();
        for lv in lvs {
            let Some(name) = lv.name.strip_suffix("+data") else {
                continue;
            };
            if LogicVolumeSpec::backing_volume(name) != lv.name {
                continue;
            }
            let Some(d) = self.get_bcache(node, name).await? else {
                continue;
            };
            if d.backing_volume != lv.name {
                continue;
            }
            tiered.push(tiered_volume(node, &d, Some(lv), None));
            members.insert(d.backing_volume.clone());
            if by_name.contains_key(d.cache_volume.as_str()) {
                members.insert(d.cache_volume.clone());
            }
        }
        Ok((tiered, members))
    }
}

/// `UNAVAILABLE`: the node has the device `d` but runs no bcache device
/// for it.
fn not_running(node: &NodeSpec, d: &pb::BcacheDevice) -> CsiError {
    let why = if d.problem.is_empty() {
        format!("its state is {:?}", d.state)
    } else {
        d.problem.clone()
    };
    CsiError::Unavailable(format!(
        "bcache device {:?} on node {} is not running: {why}",
        d.name, node.name
    ))
}

/// The control plane's view of the bcache device `d` on `node` with its
/// backing volume (when the node still has it): the device's path and
/// numbers, the backing volume's size less the data offset, group and
/// policy.
fn tiered_volume(
    node: &NodeSpec,
    d: &pb::BcacheDevice,
    backing: Option<&pb::LogicVolume>,
    fs: Option<carina_csi::params::FsType>,
) -> ProvisionedVolume {
    let backing_bytes = backing.map_or(d.size_bytes, |lv| lv.size_bytes);
    let group = backing.map_or_else(
        || d.backing_device_group.clone(),
        |lv| lv.device_group.clone(),
    );
    let mut ctx = BTreeMap::new();
    if !d.device_path.is_empty() {
        ctx.insert(context::PATH.to_string(), d.device_path.clone());
        ctx.insert(context::MAJOR.to_string(), d.major.to_string());
        ctx.insert(context::MINOR.to_string(), d.minor.to_string());
    }
    ctx.insert(context::NODE.to_string(), node.name.clone());
    ctx.insert(context::GROUP.to_string(), group.clone());
    if let Some(lv) = backing {
        ctx.insert(
            context::POLICY.to_string(),
            crate::policy::name(lv.policy()).to_string(),
        );
    }
    if let Some(fs) = fs {
        ctx.insert(context::FS_TYPE.to_string(), fs.as_str().to_string());
    }
    ProvisionedVolume {
        volume_id: VolumeId::new(d.name.clone(), node.name.clone()).encode(),
        capacity_bytes: backing_bytes.saturating_sub(BCACHE_DATA_OFFSET),
        node: node.name.clone(),
        group,
        context: ctx,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use carina_csi::Topology;

    #[test]
    fn a_tiered_volume_is_its_device_less_the_data_offset() {
        let node = NodeSpec {
            name: "n".into(),
            endpoint: "n:1".into(),
            topology: Topology::new(),
        };
        let d = pb::BcacheDevice {
            name: "v".into(),
            backing_volume: "v+data".into(),
            cache_volume: "v+cache".into(),
            device_path: "/dev/bcache2".into(),
            major: 251,
            minor: 256,
            backing_device_group: "hdd".into(),
            cache_device_group: "ssd".into(),
            size_bytes: 64 << 20,
            ..Default::default()
        };
        let backing = pb::LogicVolume {
            name: "v+data".into(),
            device_group: "hdd".into(),
            policy: pb::Policy::Lvm as i32,
            size_bytes: 68 << 20,
            ..Default::default()
        };
        let v = tiered_volume(&node, &d, Some(&backing), None);
        assert_eq!(v.volume_id, "v@n");
        assert_eq!(v.capacity_bytes, (68 << 20) - BCACHE_DATA_OFFSET);
        assert_eq!(v.context[context::PATH], "/dev/bcache2");
        assert_eq!(v.context[context::MAJOR], "251");
        assert_eq!(v.context[context::GROUP], "hdd");
        assert_eq!(v.context[context::POLICY], "LVM");
        let unknown = tiered_volume(
            &node,
            &pb::BcacheDevice {
                device_path: String::new(),
                ..d
            },
            None,
            None,
        );
        assert_eq!(unknown.capacity_bytes, (64 << 20) - BCACHE_DATA_OFFSET);
        assert!(!unknown.context.contains_key(context::PATH));
        assert!(!unknown.context.contains_key(context::POLICY));
    }
}
