//! Writing one node's `NodeStorageResource`: created on the first report
//! (server-side apply, owned by the Node), its status applied on every
//! report, and marked stale when the node cannot be reached.

use std::sync::Arc;

use carina_proto::nodestorage as pb;
use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::api::{Patch, PatchParams};

use super::report::{report_status, stale_status};
use super::{FIELD_MANAGER, Shared};
use crate::kube::endpoints::NodeEndpoint;
use carina_api::{NodeStorageResource, NodeStorageResourceStatus};

/// A node's `NodeStorageResource` as this publisher last wrote it.
pub(super) struct Record {
    shared: Arc<Shared>,
    node: String,
    node_uid: Option<String>,
    /// The object exists (created or seen by this watch).
    exists: bool,
    generation: Option<i64>,
    status: Option<NodeStorageResourceStatus>,
    disks: Option<Vec<pb::Disk>>,
    /// The stale mark last written, to write each one once.
    stale: Option<(String, String)>,
}

impl Record {
    pub(super) fn new(shared: Arc<Shared>, node: String, node_uid: Option<String>) -> Self {
        Record {
            shared,
            node,
            node_uid,
            exists: false,
            generation: None,
            status: None,
            disks: None,
            stale: None,
        }
    }

    fn params() -> PatchParams {
        PatchParams::apply(FIELD_MANAGER).force()
    }

    /// Creates the object if missing (spec and the Node as owner).
    async fn ensure(&mut self) -> Result<(), kube::Error> {
        let mut metadata = serde_json::json!({ "name": self.node });
        if let Some(uid) = &self.node_uid {
            metadata["ownerReferences"] = serde_json::json!([{
                "apiVersion": Node::api_version(&()),
                "kind": Node::kind(&()),
                "name": self.node,
                "uid": uid,
            }]);
        }
        let object = serde_json::json!({
            "apiVersion": NodeStorageResource::api_version(&()),
            "kind": NodeStorageResource::kind(&()),
            "metadata": metadata,
            "spec": { "nodeName": self.node },
        });
        let nsr = self
            .shared
            .api
            .patch(&self.node, &Self::params(), &Patch::Apply(&object))
            .await?;
        self.exists = true;
        self.generation = nsr.metadata.generation;
        if self.status.is_none() {
            self.status = nsr.status;
        }
        Ok(())
    }

    async fn apply_status(
        &mut self,
        status: &NodeStorageResourceStatus,
    ) -> Result<(), kube::Error> {
        let patch = serde_json::json!({
            "apiVersion": NodeStorageResource::api_version(&()),
            "kind": NodeStorageResource::kind(&()),
            "status": status,
        });
        match self
            .shared
            .api
            .patch_status(&self.node, &Self::params(), &Patch::Apply(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                if matches!(&e, kube::Error::Api(s) if s.code == 404) {
                    self.exists = false;
                }
                Err(e)
            }
        }
    }

    /// Writes one report of the node.
    pub(super) async fn publish(&mut self, endpoint: &NodeEndpoint, update: pb::CapacityResponse) {
        let rescanned = !matches!(
            update.reason(),
            pb::ChangeReason::Create | pb::ChangeReason::Resize | pb::ChangeReason::Delete
        );
        if rescanned || self.disks.is_none() {
            match self
                .shared
                .clients
                .call(endpoint, "ListDisks", |mut c| async move {
                    c.list_disks(pb::ListDisksRequest {}).await
                })
                .await
            {
                Ok(r) => self.disks = Some(r.disks),
                Err(e) => {
                    tracing::warn!(k8s.node.name = %self.node, error = %e, "ListDisks failed; keeping the last disk list")
                }
            }
        }
        if !self.exists
            && let Err(e) = self.ensure().await
        {
            tracing::warn!(k8s.node.name = %self.node, error = %e, "creating the NodeStorageResource failed");
            return;
        }
        let previous = self
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let status = report_status(
            &update,
            self.disks.as_deref().unwrap_or_default(),
            &previous,
            self.generation,
        );
        match self.apply_status(&status).await {
            Ok(()) => {
                tracing::debug!(k8s.node.name = %self.node, generation = update.generation, "capacity published");
                self.status = Some(status);
                self.stale = None;
            }
            Err(e) => {
                tracing::warn!(k8s.node.name = %self.node, error = %e, "writing the NodeStorageResource status failed")
            }
        }
    }

    /// Marks the record stale, keeping its figures. A node without a
    /// record keeps having none.
    pub(super) async fn mark_stale(&mut self, reason: &str, message: &str) {
        let mark = (reason.to_string(), message.to_string());
        if self.stale.as_ref() == Some(&mark) {
            return;
        }
        let base = match &self.status {
            Some(s) => s.clone(),
            None => match self.shared.api.get_opt(&self.node).await {
                Ok(Some(nsr)) => {
                    self.exists = true;
                    self.generation = nsr.metadata.generation;
                    nsr.status.unwrap_or_default()
                }
                Ok(None) => {
                    self.stale = Some(mark);
                    return;
                }
                Err(e) => {
                    tracing::warn!(k8s.node.name = %self.node, error = %e, "reading the NodeStorageResource failed");
                    return;
                }
            },
        };
        let status = stale_status(base, reason, message, self.generation);
        match self.apply_status(&status).await {
            Ok(()) => {
                tracing::warn!(k8s.node.name = %self.node, reason, message, "node unreachable: capacity marked stale");
                self.status = Some(status);
                self.stale = Some(mark);
            }
            Err(kube::Error::Api(s)) if s.code == 404 => self.stale = Some(mark),
            Err(e) => {
                tracing::warn!(k8s.node.name = %self.node, error = %e, "marking the NodeStorageResource stale failed")
            }
        }
    }
}
