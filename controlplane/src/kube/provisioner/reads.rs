//! The provisioner's reads of the API server, in one place: an object by
//! name, the lists of objects and published records, placement's records
//! as the API server has them now ([`Reads::listed`]), a node's group from
//! its `NodeStorageResource` ([`Reads::node_group`], with its policy and
//! allocation unit), and a Node's NodeStorage endpoint. API errors become
//! CSI answers here (`error::api_error`); the writes (create, patch,
//! delete) stay with the verbs that make them.

use std::sync::Arc;

use carina_api::{DeviceGroupCapacity, LogicVolume, NodeStorageResource};
use carina_csi::CsiError;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, ListParams};

use super::cache::Records;
use super::error::api_error;
use super::placement::FALLBACK_UNIT;
use super::records::group_of;
use crate::kube::endpoints::node_endpoint;

/// The read side of the API server.
#[derive(Clone)]
pub(super) struct Reads {
    lvs: Api<LogicVolume>,
    nsrs: Api<NodeStorageResource>,
    nodes: Api<Node>,
}

impl Reads {
    pub(super) fn new(client: Client) -> Self {
        Reads {
            lvs: Api::all(client.clone()),
            nsrs: Api::all(client.clone()),
            nodes: Api::all(client),
        }
    }

    /// The `LogicVolume` `name`, if it exists.
    pub(super) async fn lv(&self, name: &str) -> Result<Option<LogicVolume>, CsiError> {
        self.lvs
            .get_opt(name)
            .await
            .map_err(|e| api_error("get LogicVolume", e))
    }

    /// Every `LogicVolume`.
    pub(super) async fn lvs(&self) -> Result<Vec<LogicVolume>, CsiError> {
        Ok(self
            .lvs
            .list(&ListParams::default())
            .await
            .map_err(|e| api_error("list LogicVolumes", e))?
            .items)
    }

    /// Every published `NodeStorageResource`.
    pub(super) async fn nsrs(&self) -> Result<Vec<NodeStorageResource>, CsiError> {
        Ok(self
            .nsrs
            .list(&ListParams::default())
            .await
            .map_err(|e| api_error("list NodeStorageResources", e))?
            .items)
    }

    /// Placement's records as the API server has them now.
    pub(super) async fn listed(&self) -> Result<Records, CsiError> {
        let nsrs = self.nsrs().await?;
        let lvs = self.lvs().await?;
        Ok(Records {
            nsrs: nsrs.into_iter().map(Arc::new).collect(),
            lvs: lvs.into_iter().map(Arc::new).collect(),
        })
    }

    /// `group` of `node` as the node published it, if it did.
    pub(super) async fn node_group(
        &self,
        node: &str,
        group: &str,
    ) -> Result<Option<DeviceGroupCapacity>, CsiError> {
        let nsr = self
            .nsrs
            .get_opt(node)
            .await
            .map_err(|e| api_error("get NodeStorageResource", e))?;
        Ok(nsr.as_ref().and_then(|n| group_of(n, group)).cloned())
    }

    /// The policy of `group` on `node`, if the node published it.
    pub(super) async fn policy(&self, node: &str, group: &str) -> Result<Option<String>, CsiError> {
        Ok(self.node_group(node, group).await?.map(|g| g.policy))
    }

    /// The allocation unit of `group` on `node` as published, else
    /// [`FALLBACK_UNIT`] (the node rounds further).
    pub(super) async fn unit(&self, node: &str, group: &str) -> Result<u64, CsiError> {
        Ok(self
            .node_group(node, group)
            .await?
            .map_or(FALLBACK_UNIT, |g| g.allocation_unit_bytes))
    }

    /// The NodeStorage endpoint of the Node `name` (its annotation, or its
    /// `InternalIP` and `port`), or why there is none, for a health answer.
    pub(super) async fn endpoint(
        &self,
        name: &str,
        port: u16,
    ) -> Result<crate::kube::endpoints::NodeEndpoint, String> {
        match self.nodes.get_opt(name).await {
            Ok(Some(node)) => node_endpoint(&node, port).map_err(|e| e.to_string()),
            Ok(None) => Err("no such Node".to_string()),
            Err(e) => Err(format!("reading the Node failed: {e}")),
        }
    }
}
