//! What every reconcile shares ([`Context`]) and its API calls: publishing
//! an Event on the object, writing the whole status by server-side apply
//! (field manager [`FIELD_MANAGER`]), and finding the node's endpoint.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use carina_api::{LogicVolume, LogicVolumeStatus, NODE_ENDPOINT_ANNOTATION};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::{Api, Resource, ResourceExt};
use tracing::Instrument;

use super::decide::Op;
use super::error::Error;
use crate::kube::endpoints::{EndpointError, NodeEndpoint, Nodes, annotated_endpoint};
use crate::kube::retry::Backoff;
use crate::kube::status::truncate;
use crate::nodes::pool::NodeClients;

/// Field manager of the bridge's status writes.
pub const FIELD_MANAGER: &str = "carina-bridge";

/// Longest Event note the API accepts (1 kB).
const MAX_NOTE: usize = 1024;

/// What every reconcile shares.
pub(super) struct Context {
    pub(super) lvs: Api<LogicVolume>,
    pub(super) nodes: Nodes,
    pub(super) clients: Arc<NodeClients>,
    pub(super) recorder: Recorder,
    pub(super) retry: Backoff,
    pub(super) slow_retry: Duration,
    /// Consecutive soon-retried failures per object, for the backoff.
    pub(super) failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    pub(super) fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        // A counter map cannot be left half-changed.
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) async fn event(
        &self,
        lv: &LogicVolume,
        type_: EventType,
        reason: &str,
        action: Op,
        note: &str,
    ) {
        self.note(lv, type_, reason, action.rpc_for(lv), note).await
    }

    /// An Event on `lv` whose action is `action`.
    pub(super) async fn note(
        &self,
        lv: &LogicVolume,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let event = KubeEvent {
            type_,
            reason: reason.to_string(),
            note: Some(truncate(note, MAX_NOTE)),
            action: action.to_string(),
            secondary: None,
        };
        let published = self
            .recorder
            .publish(&event, &lv.object_ref(&()))
            .instrument(tracing::info_span!(
                "bridge.event",
                carina.event.reason = reason
            ))
            .await;
        if let Err(e) = published {
            tracing::warn!(carina.volume.name = %lv.name_any(), error = %e, "publishing an Event failed");
        }
    }

    pub(super) async fn write_status(
        &self,
        name: &str,
        status: &LogicVolumeStatus,
    ) -> Result<(), Error> {
        let patch = serde_json::json!({
            "apiVersion": LogicVolume::api_version(&()),
            "kind": LogicVolume::kind(&()),
            "status": status,
        });
        match self
            .lvs
            .patch_status(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .instrument(tracing::info_span!("bridge.write_status"))
            .await
        {
            Ok(_) => Ok(()),
            // Deleted meanwhile: nobody is left to read it.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(source) => Err(Error::Status {
                name: name.to_string(),
                source,
            }),
        }
    }

    /// The node of `lv` and where to reach it.
    pub(super) async fn endpoint(&self, lv: &LogicVolume) -> Result<NodeEndpoint, EndpointError> {
        let node = &lv.spec.node_name;
        if let Some(value) = lv.annotations().get(NODE_ENDPOINT_ANNOTATION) {
            return Ok(NodeEndpoint {
                endpoint: annotated_endpoint(node, value)?,
                node: node.clone(),
            });
        }
        self.nodes.resolve_fresh(node).await
    }
}
