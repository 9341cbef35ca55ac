//! `Capacity` and `WatchCapacity`: the node's figures now, and the stream
//! of every update the engine publishes.

use std::pin::Pin;
use std::sync::Arc;

use carina_proto::nodestorage as pb;
use futures::Stream;
use tokio::sync::watch;
use tonic::Status;

use super::NodeStorageService;
use crate::server::convert;

/// The stream of `WatchCapacity`.
pub type CapacityStream = Pin<Box<dyn Stream<Item = Result<pb::CapacityResponse, Status>> + Send>>;

impl NodeStorageService {
    pub(super) async fn capacity_now(&self, group: &str) -> Result<pb::CapacityResponse, Status> {
        let group = (!group.is_empty()).then_some(group);
        // Read first: the figures below then reflect at least every change
        // this generation stands for.
        let (incarnation, generation) = self.engine.capacity_version();
        let groups = self.engine.capacity(group).await?;
        Ok(pb::CapacityResponse {
            node_name: self.node_name.to_string(),
            groups: groups.iter().map(convert::group_capacity).collect(),
            generation,
            reason: pb::ChangeReason::Current.into(),
            incarnation,
        })
    }
}

/// The current snapshot at once (reason CURRENT), then one message per
/// update the engine publishes. Updates that arrive faster than the client
/// reads are coalesced to the newest (the generation shows the gap). Ends
/// when the server stops; dropping it (the client went away) unsubscribes.
pub(super) fn capacity_stream(
    node_name: Arc<str>,
    mut updates: watch::Receiver<crate::engine::CapacitySnapshot>,
    stopping: watch::Receiver<bool>,
) -> CapacityStream {
    let first = convert::capacity(
        &node_name,
        &updates.borrow_and_update(),
        Some(pb::ChangeReason::Current),
    );
    let state = (Some(first), updates, stopping, node_name);
    Box::pin(futures::stream::unfold(
        state,
        |(first, mut updates, mut stopping, node_name)| async move {
            if let Some(first) = first {
                return Some((Ok(first), (None, updates, stopping, node_name)));
            }
            let changed = tokio::select! {
                changed = updates.changed() => changed.is_ok(),
                _ = stopping.wait_for(|s| *s) => false,
            };
            if !changed {
                return None;
            }
            let msg = convert::capacity(&node_name, &updates.borrow_and_update(), None);
            Some((Ok(msg), (None, updates, stopping, node_name)))
        },
    ))
}
