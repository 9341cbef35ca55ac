//! CreateVolume on the direct control plane, its steps top to bottom in
//! the order they run: a tiered or copied volume goes its own way
//! (`bcache`, `copies`); otherwise ask every node for the volume's local
//! name and return a volume that fits ([`DirectProvisioner::existing`]);
//! rank the places over the capacities of the nodes that answer
//! ([`DirectProvisioner::ranked`]); `CreateLV` on the best, the next on
//! `RESOURCE_EXHAUSTED`; check the size made against the range, removing
//! an oversized new volume ([`DirectProvisioner::undo`]).

use carina_csi::{CapacityRange, CsiError, ProvisionedVolume, VolumeRequest, sizes};
use carina_proto::nodestorage as pb;
use futures::future::join_all;
use tonic::Code;

use super::{DirectProvisioner, provisioned, unavailable_or};
use crate::nodes::placement::{self, NodeCapacity};
use crate::nodes::spec::NodeSpec;
use crate::nodes::volume::{Existing, fs_type, unfit};

impl DirectProvisioner {
    /// CreateVolume: the steps in the order they run.
    pub(super) async fn create(&self, req: &VolumeRequest) -> Result<ProvisionedVolume, CsiError> {
        if let Some(b) = &req.parameters.bcache {
            return self.create_tiered(req, b).await;
        }
        if let Some(source) = &req.source {
            return self.create_from(req, source).await;
        }
        if let Some(found) = self.existing(req).await? {
            tracing::info!(carina.volume.id = %found.volume_id, "volume exists already");
            return Ok(found);
        }
        let ranked = self.ranked(req).await?;
        let mut exhausted = Vec::new();
        for p in ranked {
            let Some(node) = self.nodes.get(&p.node) else {
                continue;
            };
            let create = pb::CreateLvRequest {
                name: req.local_name.clone(),
                device_group: p.group.clone(),
                size_bytes: p.size_bytes,
                exclusive: req.parameters.exclusive,
            };
            tracing::info!(k8s.node.name = %p.node, carina.group = %p.group, carina.volume.size_bytes = p.size_bytes, strategy = %self.strategy, "placing volume");
            let what = format!("CreateLV {} in group {:?}", req.local_name, p.group);
            match self
                .clients
                .call(
                    node,
                    &what,
                    |mut c| async move { c.create_lv(create).await },
                )
                .await
            {
                Ok(r) => {
                    let lv = r.volume.ok_or_else(|| {
                        CsiError::Internal(format!("node {}: CreateLV answered no volume", p.node))
                    })?;
                    if !sizes::satisfies(&req.capacity, lv.size_bytes) {
                        // A whole disk larger than limit_bytes.
                        return Err(self.undo(node, &lv, r.created, &req.capacity).await);
                    }
                    return Ok(provisioned(node, &lv, fs_type(req)));
                }
                // Someone took the space since Capacity: try the next.
                Err(e) if e.code() == Code::ResourceExhausted => exhausted.push(e.to_string()),
                Err(e) => return Err(e),
            }
        }
        Err(CsiError::ResourceExhausted(exhausted.join("; ")))
    }

    /// The existing volume named like the request, checked against it.
    async fn existing(&self, req: &VolumeRequest) -> Result<Option<ProvisionedVolume>, CsiError> {
        if let Some((node, d)) = self.find_tiered(&req.local_name).await? {
            return Err(CsiError::AlreadyExists(format!(
                "volume {:?} exists on node {} as a bcache device cached by group {:?}, and the request asks for no cache",
                req.name, node.name, d.cache_device_group
            )));
        }
        let lookups = join_all(
            self.nodes
                .nodes
                .iter()
                .map(|n| self.get_lv(n, &req.local_name)),
        )
        .await;
        for (node, found) in self.nodes.nodes.iter().zip(lookups) {
            let found = found.map_err(|e| {
                unavailable_or(e, |m| {
                    format!(
                        "cannot tell whether volume {:?} already exists: {m}",
                        req.local_name
                    )
                })
            })?;
            let Some(lv) = found else { continue };
            if let Some(why) = incompatible(req, node, &lv) {
                return Err(CsiError::AlreadyExists(format!(
                    "volume {:?} exists on node {} ({} bytes in group {:?}) but {why}",
                    req.name, node.name, lv.size_bytes, lv.device_group
                )));
            }
            return Ok(Some(provisioned(node, &lv, fs_type(req))));
        }
        Ok(None)
    }

    /// The places for a new volume, best first, over the capacities of
    /// the nodes that answer.
    pub(super) async fn ranked(
        &self,
        req: &VolumeRequest,
    ) -> Result<Vec<placement::Placement>, CsiError> {
        let capacities = join_all(self.nodes.nodes.iter().map(|n| self.capacity_of(n))).await;
        let mut views = Vec::with_capacity(capacities.len());
        for (node, groups) in self.nodes.nodes.iter().zip(capacities) {
            match groups {
                Ok(groups) => views.push(NodeCapacity { node, groups }),
                // It answered a lookup a moment ago; it cannot take the
                // volume now, but the others may.
                Err(e) => {
                    tracing::warn!(k8s.node.name = %node.name, error = %e, "no capacity from node; not placing there")
                }
            }
        }
        placement::rank(req, &views, self.strategy)
    }

    /// Removes a volume just created that turned out larger than the
    /// range allows (a whole disk), and says why.
    async fn undo(
        &self,
        node: &NodeSpec,
        lv: &pb::LogicVolume,
        created: bool,
        range: &CapacityRange,
    ) -> CsiError {
        let why = format!(
            "volume {:?} on node {} would be {} bytes, above limit_bytes {}",
            lv.name, node.name, lv.size_bytes, range.limit_bytes
        );
        if created {
            let req = pb::DeleteLvRequest {
                name: lv.name.clone(),
            };
            let what = format!("DeleteLV {}", lv.name);
            if let Err(e) = self
                .clients
                .call(node, &what, |mut c| async move { c.delete_lv(req).await })
                .await
            {
                tracing::warn!(error = %e, "removing the oversized volume failed");
            }
        }
        CsiError::OutOfRange(why)
    }
}

/// Why an existing volume does not satisfy `req`, if it does not (the
/// shared rule, [`unfit`], with this plane's policy check; a plain volume
/// has no tiering to differ).
fn incompatible(req: &VolumeRequest, node: &NodeSpec, lv: &pb::LogicVolume) -> Option<String> {
    let unsuited = (!placement::policy_suits(req, lv.policy())).then(|| {
        format!(
            "a {} volume cannot serve this access",
            crate::policy::name(lv.policy())
        )
    });
    let existing = Existing {
        bytes: Some(lv.size_bytes),
        group: &lv.device_group,
        exclusive: lv.exclusive,
        node,
    };
    unfit(req, &existing, None, unsuited)
}
