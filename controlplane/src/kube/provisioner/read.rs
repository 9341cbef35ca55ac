//! The reading verbs in `--mode kube`: ControllerGetVolume and
//! ListVolumes from the `LogicVolume` objects (each volume's policy from
//! its node's published group), the volumes' condition as their nodes see
//! it now, the published group names, and GetCapacity summed over the
//! published groups ([`crate::nodes::volume::capacity`]). Nothing here
//! writes.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use carina_csi::{CapacityInfo, CsiError, ProvisionedVolume, Topology, VolumeHealth};

use super::KubeProvisioner;
use super::outcome::provisioned;
use super::records::{groups, node_spec};
use super::{copies, legacy};
use crate::nodes::{health, volume};

impl KubeProvisioner {
    /// ControllerGetVolume: the volume once made, else `None`.
    pub(super) async fn get(&self, volume_id: &str) -> Result<Option<ProvisionedVolume>, CsiError> {
        let Some(lv) = self.find(volume_id).await? else {
            return Ok(None);
        };
        if lv
            .status
            .as_ref()
            .and_then(|s| s.volume_id.as_ref())
            .is_none()
        {
            return Ok(None);
        }
        let policy = self
            .reads
            .policy(&lv.spec.node_name, &lv.spec.device_group)
            .await?;
        Ok(Some(provisioned(&lv, None, policy.as_deref())))
    }

    /// ListVolumes: every made volume this plane serves (not snapshots,
    /// not Go Carina's until taken over), by volume id.
    pub(super) async fn list(&self) -> Result<Vec<ProvisionedVolume>, CsiError> {
        let lvs = self.reads.lvs().await?;
        let nsrs = self.reads.nsrs().await?;
        let policies: HashMap<(String, String), String> = groups(&nsrs)
            .map(|(node, g)| ((node, g.name.clone()), g.policy.clone()))
            .collect();
        let mut all: Vec<ProvisionedVolume> = lvs
            .iter()
            .filter(|lv| {
                lv.status
                    .as_ref()
                    .and_then(|s| s.volume_id.as_ref())
                    .is_some()
                    && copies::snapshot_of(lv).is_none()
                    && legacy::serves(lv)
            })
            .map(|lv| {
                let key = (lv.spec.node_name.clone(), lv.spec.device_group.clone());
                provisioned(lv, None, policies.get(&key).map(String::as_str))
            })
            .collect();
        all.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
        Ok(all)
    }

    /// The condition of `volumes` as their nodes see it now; every one
    /// abnormal, saying so, without node access.
    pub(super) async fn health(&self, volumes: &[ProvisionedVolume]) -> Vec<VolumeHealth> {
        let Some(access) = &self.node_access else {
            return volumes
                .iter()
                .map(|v| {
                    VolumeHealth::abnormal(format!(
                        "this controller has no access to node {} to ask",
                        v.node
                    ))
                })
                .collect();
        };
        let (reads, port) = (&self.reads, access.port);
        health::volume_health(&access.clients, volumes, |name| async move {
            reads.endpoint(&name, port).await
        })
        .await
    }

    /// The group names of the published `NodeStorageResource`s, from the
    /// cache once it is ready.
    pub(super) async fn group_set(&self) -> Result<BTreeSet<String>, CsiError> {
        let records = if self.cache.is_ready() {
            self.cache.records()
        } else {
            self.reads.listed().await?
        };
        Ok(groups(records.nsrs.iter().map(Arc::as_ref))
            .map(|(_, g)| g.name.clone())
            .collect())
    }

    /// GetCapacity: the published groups of the nodes in `topology`
    /// (all without one), of `group` (any without one), summed.
    pub(super) async fn room(
        &self,
        topology: Option<&Topology>,
        group: Option<&str>,
    ) -> Result<CapacityInfo, CsiError> {
        let nsrs = self.reads.nsrs().await?;
        let wanted = groups(&nsrs).filter(|(node, g)| {
            topology.is_none_or(|t| node_spec(node).matches(t)) && group.is_none_or(|w| g.name == w)
        });
        Ok(volume::capacity(wanted.map(|(_, g)| {
            (g.allocatable_bytes, g.largest_allocatable_bytes)
        })))
    }
}
