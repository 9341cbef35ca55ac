//! One NodeStorage client per node, over mutual TLS with the node's name
//! as the server name the certificate must carry, and with the caller's
//! trace propagated. A client is connected on first use and kept (a tonic
//! channel reconnects by itself); a node that cannot be reached now is
//! `UNAVAILABLE`, tried again on the next call. Every call is bounded by a
//! timeout (`DEADLINE_EXCEEDED`).
//!
//! The pool serves any control plane: a node is anything with a name and
//! an endpoint ([`NodeAddress`]): the direct plane's [`NodeSpec`], the
//! Kubernetes plane's resolved Node endpoints. When a node's endpoint
//! changes, its client is replaced on the next call.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use carina_csi::CsiError;
use carina_proto::nodestorage::node_storage_client::NodeStorageClient;
use carina_proto::nodestorage::{ListLVsRequest, LogicVolume};
use carina_proto::tls::{ClientTls, LiveClientCert, TlsError, connect_with_config};
use carina_proto::trace::{TracedChannel, traced};
use tonic::Status;

use super::spec::NodeSpec;

/// A NodeStorage client as the pool hands it out (cheap to clone).
pub type Client = NodeStorageClient<TracedChannel>;

/// Default bound of one NodeStorage call.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// What the pool needs to reach a node.
pub trait NodeAddress {
    /// The node name: the DNS name its server certificate must carry.
    fn node_name(&self) -> &str;
    /// `host:port` or `https://host:port` of its NodeStorage service.
    fn endpoint(&self) -> &str;
}

impl NodeAddress for NodeSpec {
    fn node_name(&self) -> &str {
        &self.name
    }

    fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

/// A client and the endpoint it was connected to.
#[derive(Debug, Clone)]
struct Cached {
    endpoint: String,
    client: Client,
}

/// Clients keyed by node name.
#[derive(Debug)]
pub struct NodeClients {
    tls: ClientTls,
    live_cert: Option<LiveClientCert>,
    call_timeout: Duration,
    clients: Mutex<HashMap<String, Cached>>,
}

impl NodeClients {
    /// Clients presenting `tls`'s certificate (its `server_name` is
    /// replaced by each node's name).
    pub fn new(tls: ClientTls) -> Self {
        NodeClients {
            tls,
            live_cert: None,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// Offer the certificate `live` holds at each handshake instead of
    /// `tls`'s (a certificate renewed in place); `tls` still gives the CA.
    pub fn live_cert(mut self, live: Option<LiveClientCert>) -> Self {
        self.live_cert = live;
        self
    }

    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// The time limit of each call.
    pub fn timeout(&self) -> Duration {
        self.call_timeout
    }

    /// The client kept for `node` if it was connected to `endpoint`.
    fn cached(&self, node: &str, endpoint: &str) -> Option<Client> {
        // Map reads and inserts cannot leave it half-changed.
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(node)
            .filter(|c| c.endpoint == endpoint)
            .map(|c| c.client.clone())
    }

    /// Drops the client of `node` (a node that left); the next call
    /// connects anew.
    pub fn forget(&self, node: &str) {
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(node);
    }

    /// The client of `node`, connecting if there is none yet for its
    /// current endpoint.
    pub async fn client(&self, node: &impl NodeAddress) -> Result<Client, CsiError> {
        let (name, endpoint) = (node.node_name(), node.endpoint());
        if let Some(c) = self.cached(name, endpoint) {
            return Ok(c);
        }
        let config = match &self.live_cert {
            Some(live) => self.tls.client_config_live(live),
            None => self.tls.client_config(),
        }
        .map_err(|e: TlsError| CsiError::Unavailable(format!("node {name}: client TLS: {e}")))?;
        let connect = connect_with_config(endpoint, name, config);
        let channel = tokio::time::timeout(self.call_timeout, connect)
            .await
            .map_err(|_| {
                CsiError::Unavailable(format!(
                    "node {name} ({endpoint}): connecting timed out after {:?}",
                    self.call_timeout
                ))
            })?
            .map_err(|e| CsiError::Unavailable(format!("node {name} ({endpoint}): {e}")))?;
        let client = NodeStorageClient::new(traced(channel));
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        let kept = clients
            .entry(name.to_string())
            .and_modify(|c| {
                // Another call connected first to the same endpoint: share
                // its client. An older endpoint's client is replaced.
                if c.endpoint != endpoint {
                    *c = Cached {
                        endpoint: endpoint.to_string(),
                        client: client.clone(),
                    };
                }
            })
            .or_insert_with(|| Cached {
                endpoint: endpoint.to_string(),
                client: client.clone(),
            });
        Ok(kept.client.clone())
    }

    /// Runs one call against `node`. A status the node answers is kept as
    /// it is ([`CsiError::Node`], with `what` and the node named); a node
    /// that cannot be reached is `UNAVAILABLE`, also naming `what`.
    pub async fn call<T, F, Fut>(
        &self,
        node: &impl NodeAddress,
        what: &str,
        f: F,
    ) -> Result<T, CsiError>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let name = node.node_name();
        let client = self.client(node).await.map_err(|e| match e {
            CsiError::Unavailable(m) => CsiError::Unavailable(format!("{what}: {m}")),
            other => other,
        })?;
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(self.call_timeout, f(client)).await;
        let code = match &answer {
            Ok(Ok(_)) => tonic::Code::Ok,
            Ok(Err(status)) => status.code(),
            Err(_) => tonic::Code::DeadlineExceeded,
        };
        crate::metrics::metrics().node_call(what, code, started.elapsed());
        match answer {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(CsiError::node(format!("node {name}: {what}"), status)),
            Err(_) => Err(CsiError::DeadlineExceeded(format!(
                "node {name}: {what} did not answer within {:?}",
                self.call_timeout
            ))),
        }
    }

    /// Every volume `node` owns, all pages of `ListLVs` (each volume with
    /// its condition).
    pub async fn list_all(&self, node: &impl NodeAddress) -> Result<Vec<LogicVolume>, CsiError> {
        let mut all = Vec::new();
        let mut page_token = String::new();
        loop {
            let req = ListLVsRequest {
                device_group: String::new(),
                page_size: 0,
                page_token,
            };
            let page = self
                .call(
                    node,
                    "ListLVs",
                    |mut c| async move { c.list_l_vs(req).await },
                )
                .await?;
            all.extend(page.volumes);
            if page.next_page_token.is_empty() {
                return Ok(all);
            }
            page_token = page.next_page_token;
        }
    }
}
