//! One NodeStorage client per node, over mutual TLS with the node's name
//! as the server name the certificate must carry, and with the caller's
//! trace propagated. A client is connected on first use and kept (a tonic
//! channel reconnects by itself); a node that cannot be reached now is
//! `UNAVAILABLE`, tried again on the next call. Every call is bounded by a
//! timeout (`DEADLINE_EXCEEDED`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use carina_csi::CsiError;
use carina_proto::nodestorage::node_storage_client::NodeStorageClient;
use carina_proto::tls::{ClientTls, connect};
use carina_proto::trace::{TracedChannel, traced};
use tonic::Status;

use super::nodes::NodeSpec;

/// A NodeStorage client as the pool hands it out (cheap to clone).
pub type Client = NodeStorageClient<TracedChannel>;

/// Default bound of one NodeStorage call.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Clients keyed by node name.
#[derive(Debug)]
pub struct NodeClients {
    tls: ClientTls,
    call_timeout: Duration,
    clients: Mutex<HashMap<String, Client>>,
}

impl NodeClients {
    /// Clients presenting `tls`'s certificate (its `server_name` is
    /// replaced by each node's name).
    pub fn new(tls: ClientTls) -> Self {
        NodeClients {
            tls,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            clients: Mutex::new(HashMap::new()),
        }
    }

    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    fn cached(&self, node: &str) -> Option<Client> {
        // Map reads and inserts cannot leave it half-changed.
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(node)
            .cloned()
    }

    /// The client of `node`, connecting if there is none yet.
    pub async fn client(&self, node: &NodeSpec) -> Result<Client, CsiError> {
        if let Some(c) = self.cached(&node.name) {
            return Ok(c);
        }
        let tls = self.tls.for_server(node.name.clone());
        let channel = tokio::time::timeout(self.call_timeout, connect(&node.endpoint, &tls))
            .await
            .map_err(|_| {
                CsiError::Unavailable(format!(
                    "node {} ({}): connecting timed out after {:?}",
                    node.name, node.endpoint, self.call_timeout
                ))
            })?
            .map_err(|e| {
                CsiError::Unavailable(format!("node {} ({}): {e}", node.name, node.endpoint))
            })?;
        let client = NodeStorageClient::new(traced(channel));
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(node.name.clone())
            .or_insert_with(|| client.clone());
        Ok(client)
    }

    /// Runs one call against `node`. A status the node answers is kept as
    /// it is ([`CsiError::Node`], with `what` and the node named).
    pub async fn call<T, F, Fut>(&self, node: &NodeSpec, what: &str, f: F) -> Result<T, CsiError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let client = self.client(node).await?;
        match tokio::time::timeout(self.call_timeout, f(client)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(CsiError::node(
                format!("node {}: {what}", node.name),
                status,
            )),
            Err(_) => Err(CsiError::DeadlineExceeded(format!(
                "node {}: {what} did not answer within {:?}",
                node.name, self.call_timeout
            ))),
        }
    }
}
