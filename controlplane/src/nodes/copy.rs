//! Copies on a node (clones and snapshots): one `CopyLV` call, its
//! progress stream read to the end. The call's time limit bounds the wait
//! for each message, not the copy (a large copy takes what it takes, and
//! the node reports progress twice a second); the copy is cancelled on
//! the node when this future is dropped, since the stream goes with it.

use carina_csi::CsiError;
use carina_proto::nodestorage as pb;

use super::pool::{NodeAddress, NodeClients};

/// Fills volume `target` on `node` with a copy of `source` (a snapshot
/// when `snapshot`), and returns the filled target.
pub async fn copy(
    clients: &NodeClients,
    node: &impl NodeAddress,
    source: &str,
    target: &str,
    snapshot: bool,
) -> Result<pb::LogicVolume, CsiError> {
    let what = format!("CopyLV {source} into {target}");
    let req = pb::CopyLvRequest {
        source: source.to_string(),
        target: target.to_string(),
        snapshot,
    };
    let mut stream = clients
        .call(node, &what, |mut c| async move { c.copy_lv(req).await })
        .await?;
    let name = node.node_name();
    let silence = clients.timeout();
    let mut last = pb::CopyLvProgress::default();
    loop {
        let next = tokio::time::timeout(silence, stream.message())
            .await
            .map_err(|_| {
                CsiError::DeadlineExceeded(format!(
                    "node {name}: {what} reported nothing for {silence:?} ({} of {} bytes copied)",
                    last.copied_bytes, last.total_bytes
                ))
            })?
            .map_err(|status| CsiError::node(format!("node {name}: {what}"), status))?;
        let Some(progress) = next else {
            return Err(CsiError::Unavailable(format!(
                "node {name}: {what} ended without completing ({} of {} bytes copied)",
                last.copied_bytes, last.total_bytes
            )));
        };
        if progress.done {
            return progress.target.ok_or_else(|| {
                CsiError::Internal(format!("node {name}: {what} completed without the target"))
            });
        }
        tracing::debug!(
            copied_bytes = progress.copied_bytes,
            total_bytes = progress.total_bytes,
            frozen = progress.frozen,
            "copy progress"
        );
        last = progress;
    }
}
