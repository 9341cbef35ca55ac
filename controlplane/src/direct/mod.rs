//! The direct control plane: a [`Provisioner`] over a static node list,
//! talking to each node's NodeStorage service over mutual TLS. No
//! Kubernetes and no stored state: the volume id `<volume>@<node>` names
//! the node, and the nodes' own volume lists are the truth.
//!
//! The node list ([`crate::nodes::spec::NodeList`]), the placement rules
//! ([`crate::nodes::placement`]) and the client pool
//! ([`crate::nodes::pool`]) are shared with the Kubernetes control plane.
//!
//! **Idempotency.** CreateVolume first asks every node for the volume's
//! local name (`GetBcache`, then `GetLV`; a bcache device of the name is
//! `ALREADY_EXISTS` for a class without a cache). Found and compatible
//! (size within the range, the requested group, exclusivity, access,
//! accessible node): it is returned.
//! Found and incompatible: `ALREADY_EXISTS`. A node that cannot be asked
//! makes the call `UNAVAILABLE` (retryable) rather than risk a second copy
//! on another node.
//!
//! **Codes from the nodes.** `ALREADY_EXISTS`, `RESOURCE_EXHAUSTED` (the
//! next candidate is tried first), `UNAVAILABLE`, `DEADLINE_EXCEEDED` and
//! the rest pass through with the node named in the message; a node that
//! cannot be reached is `UNAVAILABLE`. DeleteVolume treats `NOT_FOUND`, an
//! unknown node and an impossible volume name as already deleted.
//!
//! **Context.** `volume_context` carries `carina.storage.io/path` (the
//! device, or the directory of a HOST volume), `/node`, `/major`, `/minor`
//! (block volumes), `/disk-group-name`, `/policy`, and
//! `csi.storage.k8s.io/fstype` when CreateVolume was given one (the node
//! does not store it, so listed volumes lack it).
//!
//! **Go Carina's ids** (`volume-<pv>`, `host-<pv>`) are `NOT_FOUND`
//! with a message saying such volumes are taken over through the
//! Kubernetes control plane; DeleteVolume of one is done, as of any
//! volume this plane cannot have.
//!
//! **Tiered volumes.** A bcache class (the same StorageClass parameters
//! the Kubernetes plane takes) is one `CreateBcache` on the chosen node,
//! which makes the backing volume, the cache volume and the device, and
//! undoes them when it fails; `DeleteVolume` is `DeleteBcache`, which
//! deletes the three; growth is `FAILED_PRECONDITION`. The volume id is
//! `<volume>@<node>` like any other.
//!
//! **Files**, in the order a create runs through them: this one holds
//! the provisioner, its lookups of one node, the view of a node's volume
//! and the [`Provisioner`] impl (delete, expand, get, list, health and
//! capacity in place: one node call each); `create` is CreateVolume top
//! to bottom (existing volume, ranking, `CreateLV`, size check); `bcache`
//! the tiered volumes; `copies` the snapshots and clones; `legacy` the
//! answer to Go Carina's ids. The rules the Kubernetes plane applies too
//! (an existing volume fitting a create, the context's file system,
//! capacity summed) are [`crate::nodes::volume`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;
use carina_csi::params::FsType;
use carina_csi::snapshot_id::is_snapshot_name;
use carina_csi::strategy::Strategy;
use carina_csi::volume_id::VolumeId;
use carina_csi::{
    CapacityInfo, CapacityRange, CsiError, ProvisionedSnapshot, ProvisionedVolume, Provisioner,
    SnapshotRequest, Topology, VolumeHealth, VolumeRequest, context, sizes,
};
use carina_proto::nodestorage as pb;
use carina_proto::tls::ClientTls;
use futures::future::join_all;
use tonic::Code;

use crate::nodes::pool::NodeClients;
use crate::nodes::spec::{NodeList, NodeSpec};
use crate::nodes::{health, volume};

mod bcache;
mod copies;
mod create;
mod legacy;

use legacy::refuse_go_id;

/// Volumes on a static list of nodes.
#[derive(Debug)]
pub struct DirectProvisioner {
    nodes: NodeList,
    clients: NodeClients,
    strategy: Strategy,
}

impl DirectProvisioner {
    /// A provisioner over `nodes`, reaching them with `tls` (a client
    /// certificate with role `controller`; its `server_name` is replaced
    /// by each node's name).
    pub fn new(nodes: NodeList, tls: ClientTls, strategy: Strategy) -> Self {
        DirectProvisioner {
            nodes,
            clients: NodeClients::new(tls),
            strategy,
        }
    }

    /// Bounds each NodeStorage call (default [`crate::nodes::pool::DEFAULT_CALL_TIMEOUT`]).
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.clients = self.clients.call_timeout(timeout);
        self
    }

    pub fn nodes(&self) -> &NodeList {
        &self.nodes
    }

    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// The volume `name` on `node`, if it has one.
    async fn get_lv(
        &self,
        node: &NodeSpec,
        name: &str,
    ) -> Result<Option<pb::LogicVolume>, CsiError> {
        let req = pb::GetLvRequest {
            name: name.to_string(),
        };
        match self
            .clients
            .call(node, &format!("GetLV {name}"), |mut c| async move {
                c.get_lv(req).await
            })
            .await
        {
            Ok(r) => Ok(r.volume),
            Err(e) if e.code() == Code::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn capacity_of(&self, node: &NodeSpec) -> Result<Vec<pb::GroupCapacity>, CsiError> {
        let r = self
            .clients
            .call(node, "Capacity", |mut c| async move {
                c.capacity(pb::CapacityRequest::default()).await
            })
            .await?;
        Ok(r.groups)
    }

    /// The node and volume name of an id this provisioner could have made;
    /// `None` when no such volume can exist (malformed id, unknown node,
    /// a name no node accepts).
    fn locate<'a>(&'a self, volume_id: &str) -> Result<Option<(&'a NodeSpec, String)>, CsiError> {
        refuse_go_id(volume_id)?;
        let id = match VolumeId::parse(volume_id) {
            Ok(id) => id,
            Err(CsiError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        if !possible_volume_name(&id.volume) {
            return Ok(None);
        }
        Ok(self.nodes.get(&id.node).map(|n| (n, id.volume)))
    }
}

/// Keeps an `UNAVAILABLE` (or deadline) error's code and rewrites its
/// message; other errors pass unchanged.
fn unavailable_or(e: CsiError, message: impl Fn(&str) -> String) -> CsiError {
    match e.code() {
        Code::Unavailable => CsiError::Unavailable(message(&e.to_string())),
        Code::DeadlineExceeded => CsiError::DeadlineExceeded(message(&e.to_string())),
        _ => e,
    }
}

/// The node's volume-name rule: ASCII letters, digits, `.`, `_`, `-`,
/// `+`; 1 to 100 bytes; not starting with `-` or `.`.
fn possible_volume_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && !name.starts_with(['-', '.'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+'))
}

/// The control plane's view of a node's volume.
fn provisioned(
    node: &NodeSpec,
    lv: &pb::LogicVolume,
    fs_type: Option<FsType>,
) -> ProvisionedVolume {
    let mut ctx = BTreeMap::new();
    let path = if lv.device_path.is_empty() {
        &lv.host_path
    } else {
        &lv.device_path
    };
    ctx.insert(context::PATH.to_string(), path.clone());
    ctx.insert(context::NODE.to_string(), node.name.clone());
    if !lv.device_path.is_empty() {
        ctx.insert(context::MAJOR.to_string(), lv.major.to_string());
        ctx.insert(context::MINOR.to_string(), lv.minor.to_string());
    }
    ctx.insert(context::GROUP.to_string(), lv.device_group.clone());
    ctx.insert(
        context::POLICY.to_string(),
        crate::policy::name(lv.policy()).to_string(),
    );
    if let Some(fs) = fs_type {
        ctx.insert(context::FS_TYPE.to_string(), fs.as_str().to_string());
    }
    ProvisionedVolume {
        volume_id: VolumeId::new(lv.name.clone(), node.name.clone()).encode(),
        capacity_bytes: lv.size_bytes,
        node: node.name.clone(),
        group: lv.device_group.clone(),
        context: ctx,
    }
}

#[async_trait]
impl Provisioner for DirectProvisioner {
    #[tracing::instrument(name = "direct.create_volume", skip_all, err(level = "info"), fields(carina.volume.name = %req.local_name))]
    async fn create_volume(&self, req: &VolumeRequest) -> Result<ProvisionedVolume, CsiError> {
        self.create(req).await
    }

    fn copies(&self) -> bool {
        true
    }

    #[tracing::instrument(name = "direct.create_snapshot", skip_all, err(level = "info"), fields(carina.snapshot.name = %req.local_name, carina.volume.id = %req.source_volume_id))]
    async fn create_snapshot(
        &self,
        req: &SnapshotRequest,
    ) -> Result<ProvisionedSnapshot, CsiError> {
        self.take_snapshot(req).await
    }

    #[tracing::instrument(name = "direct.delete_snapshot", skip_all, err(level = "info"), fields(carina.snapshot.id = %snapshot_id))]
    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), CsiError> {
        self.remove_snapshot(snapshot_id).await
    }

    #[tracing::instrument(name = "direct.list_snapshots", skip_all, err(level = "info"))]
    async fn list_snapshots(&self) -> Result<Vec<ProvisionedSnapshot>, CsiError> {
        self.all_snapshots().await
    }

    #[tracing::instrument(name = "direct.delete_volume", skip_all, err(level = "info"), fields(carina.volume.id = %volume_id))]
    async fn delete_volume(&self, volume_id: &str) -> Result<(), CsiError> {
        let Some((node, name)) = self.locate(volume_id)? else {
            tracing::info!("no such volume can exist: nothing to delete");
            return Ok(());
        };
        if self.get_bcache(node, &name).await?.is_some() {
            return self.delete_tiered(node, &name).await;
        }
        let req = pb::DeleteLvRequest { name: name.clone() };
        match self
            .clients
            .call(node, &format!("DeleteLV {name}"), |mut c| async move {
                c.delete_lv(req).await
            })
            .await
        {
            Err(e) if e.code() == Code::NotFound => Ok(()),
            other => other.map(|_| ()),
        }
    }

    #[tracing::instrument(name = "direct.expand_volume", skip_all, err(level = "info"), fields(carina.volume.id = %volume_id, carina.volume.size_bytes = range.required_bytes))]
    async fn expand_volume(&self, volume_id: &str, range: &CapacityRange) -> Result<u64, CsiError> {
        let not_found = || CsiError::NotFound(format!("volume {volume_id:?} does not exist"));
        let (node, name) = self.locate(volume_id)?.ok_or_else(not_found)?;
        let Some(lv) = self.get_lv(node, &name).await? else {
            let d = self.get_bcache(node, &name).await?.ok_or_else(not_found)?;
            return self.expand_tiered(volume_id, node, &d, range).await;
        };
        if lv.size_bytes >= range.required_bytes {
            return Ok(lv.size_bytes);
        }
        let unit = self
            .capacity_of(node)
            .await?
            .iter()
            .find(|g| g.device_group == lv.device_group)
            .map(|g| g.allocation_unit_bytes)
            .ok_or_else(|| {
                CsiError::FailedPrecondition(format!(
                    "node {} no longer has group {:?} of volume {name:?}",
                    node.name, lv.device_group
                ))
            })?;
        let size = sizes::allocation(range, unit)?;
        let req = pb::ResizeLvRequest {
            name: name.clone(),
            size_bytes: size,
        };
        let r = self
            .clients
            .call(node, &format!("ResizeLV {name}"), |mut c| async move {
                c.resize_lv(req).await
            })
            .await?;
        Ok(r.volume.map_or(size, |v| v.size_bytes))
    }

    #[tracing::instrument(name = "direct.get_volume", skip_all, err(level = "info"), fields(carina.volume.id = %volume_id))]
    async fn get_volume(&self, volume_id: &str) -> Result<Option<ProvisionedVolume>, CsiError> {
        let Some((node, name)) = self.locate(volume_id)? else {
            return Ok(None);
        };
        if let Some(lv) = self.get_lv(node, &name).await? {
            return Ok(Some(provisioned(node, &lv, None)));
        }
        match self.get_bcache(node, &name).await? {
            Some(d) => Ok(Some(self.tiered(node, &d, None).await?)),
            None => Ok(None),
        }
    }

    #[tracing::instrument(name = "direct.list_volumes", skip_all, err(level = "info"))]
    async fn list_volumes(&self) -> Result<Vec<ProvisionedVolume>, CsiError> {
        let lists = join_all(self.nodes.nodes.iter().map(|n| self.clients.list_all(n))).await;
        let mut all = Vec::new();
        for (node, lvs) in self.nodes.nodes.iter().zip(lists) {
            let lvs = lvs?;
            let (tiered, members) = self.tiered_among(node, &lvs).await?;
            all.extend(tiered);
            all.extend(
                lvs.iter()
                    .filter(|lv| !is_snapshot_name(&lv.name) && !members.contains(&lv.name))
                    .map(|lv| provisioned(node, lv, None)),
            );
        }
        all.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
        Ok(all)
    }

    #[tracing::instrument(name = "direct.volume_health", skip_all, fields(volumes = volumes.len()))]
    async fn volume_health(&self, volumes: &[ProvisionedVolume]) -> Vec<VolumeHealth> {
        let nodes = &self.nodes;
        health::volume_health(&self.clients, volumes, |node| async move {
            nodes
                .get(&node)
                .cloned()
                .ok_or_else(|| "is not in the node list".to_string())
        })
        .await
    }

    /// Every group name the nodes answer with; a node that does not
    /// answer is left out unless none answers.
    #[tracing::instrument(name = "direct.group_names", skip_all, err(level = "info"))]
    async fn group_names(&self) -> Result<BTreeSet<String>, CsiError> {
        let answers = join_all(self.nodes.nodes.iter().map(|n| self.capacity_of(n))).await;
        let mut names = BTreeSet::new();
        let mut last_error = None;
        for answer in answers {
            match answer {
                Ok(groups) => names.extend(groups.into_iter().map(|g| g.device_group)),
                Err(e) => last_error = Some(e),
            }
        }
        match last_error {
            Some(e) if names.is_empty() => Err(e),
            _ => Ok(names),
        }
    }

    #[tracing::instrument(name = "direct.capacity", skip_all, err(level = "info"), fields(carina.group = group.unwrap_or_default()))]
    async fn capacity(
        &self,
        topology: Option<&Topology>,
        group: Option<&str>,
    ) -> Result<CapacityInfo, CsiError> {
        let nodes: Vec<&NodeSpec> = self
            .nodes
            .nodes
            .iter()
            .filter(|n| topology.is_none_or(|t| n.matches(t)))
            .collect();
        let answers = join_all(nodes.iter().map(|n| self.capacity_of(n))).await;
        let mut wanted = Vec::new();
        for groups in answers {
            wanted.extend(
                groups?
                    .into_iter()
                    .filter(|g| group.is_none_or(|w| g.device_group == w))
                    .map(|g| (g.allocatable_bytes, g.largest_allocatable_bytes)),
            );
        }
        Ok(volume::capacity(wanted))
    }
}

#[cfg(test)]
mod tests;
