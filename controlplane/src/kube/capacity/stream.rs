//! One node's `WatchCapacity` stream: opened, followed into the node's
//! record, and reopened with backoff for ever; every (re)connection is
//! announced so the config push resends the node its configuration.

use std::sync::Arc;

use carina_proto::code_name;
use carina_proto::nodestorage as pb;

use super::record::Record;
use super::{Shared, Target};

/// Streams one node's capacity into its record, reconnecting for ever.
pub(super) async fn watch_node(shared: Arc<Shared>, node: String, target: Target) {
    let mut record = Record::new(shared.clone(), node.clone(), target.uid);
    let endpoint = match target.endpoint {
        Ok(e) => e,
        Err(e) => {
            tracing::warn!(k8s.node.name = %node, error = %e, "no capacity watch");
            record.mark_stale("NoEndpoint", &e.to_string()).await;
            return;
        }
    };
    let mut attempt = 0u32;
    loop {
        let opened = shared
            .clients
            .call(&endpoint, "WatchCapacity", |mut c| async move {
                c.watch_capacity(pb::WatchCapacityRequest {}).await
            })
            .await;
        match opened {
            Ok(mut stream) => {
                let mut reported = false;
                let ended = loop {
                    match stream.message().await {
                        Ok(Some(update)) => {
                            if !reported {
                                reported = true;
                                attempt = 0;
                                tracing::info!(k8s.node.name = %node, carina.node.endpoint = %endpoint.endpoint, "capacity stream open");
                                let _ = shared.connected.send(node.clone());
                            }
                            record.publish(&endpoint, update).await;
                        }
                        Ok(None) => break ("UNAVAILABLE", "the node ended the stream".to_string()),
                        Err(status) => {
                            break (
                                code_name(status.code()),
                                format!("node {node}: WatchCapacity: {}", status.message()),
                            );
                        }
                    }
                };
                tracing::info!(k8s.node.name = %node, reason = %ended.1, "capacity stream ended; reconnecting");
                if !reported {
                    record.mark_stale(ended.0, &ended.1).await;
                }
            }
            Err(e) => {
                tracing::debug!(k8s.node.name = %node, error = %e, "capacity stream not open");
                record.mark_stale(code_name(e.code()), &e.to_string()).await;
            }
        }
        tokio::time::sleep(shared.backoff.delay(attempt)).await;
        attempt = attempt.saturating_add(1);
    }
}
