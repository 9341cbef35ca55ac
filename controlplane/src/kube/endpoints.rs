//! Where each node's `NodeStorage` service is, and the clients that reach
//! it.
//!
//! A node's endpoint is the Node's annotation
//! [`NODE_ENDPOINT_ANNOTATION`] (`host:port`) when set, otherwise its
//! first `InternalIP` with the configured NodeStorage port. The server
//! name the node's certificate must carry is always the node name.
//!
//! [`Nodes`] is the one watch on Node objects the bridge, the capacity
//! publisher and the config push share: a reflector store plus a
//! notification on every change. The clients are the pool the direct
//! control plane uses too ([`crate::nodes::pool::NodeClients`]), keyed by
//! node name; a node whose endpoint changes gets a new client on its next
//! call.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;

use crate::nodes::pool::NodeAddress;
use carina_api::NODE_ENDPOINT_ANNOTATION;

/// The NodeStorage port `carina-node` listens on by default.
pub const DEFAULT_NODE_PORT: u16 = 7443;

/// Why a node's endpoint cannot be told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// There is no Node object of that name.
    #[error("node {node}: no such Node")]
    NoNode { node: String },
    /// The endpoint annotation is not `host:port`.
    #[error("node {node}: annotation {NODE_ENDPOINT_ANNOTATION}={value:?} is not host:port")]
    BadAnnotation { node: String, value: String },
    /// Neither the annotation nor an `InternalIP` is there.
    #[error(
        "node {node}: no {NODE_ENDPOINT_ANNOTATION} annotation and no InternalIP in status.addresses"
    )]
    NoAddress { node: String },
    /// The Node list could not be read.
    #[error("node {node}: reading the Node failed: {reason}")]
    Api { node: String, reason: String },
}

/// Completes once `stop` turns true (or its sender is gone). Holds no
/// borrow of the value, so it can sit in a `select!` whose other arms
/// await.
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// A node and the address of its NodeStorage service.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeEndpoint {
    /// The node name, which its server certificate carries.
    pub node: String,
    /// `host:port` (or `https://host:port`).
    pub endpoint: String,
}

impl NodeAddress for NodeEndpoint {
    fn node_name(&self) -> &str {
        &self.node
    }

    fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

/// `value` if it looks like `host:port` or `https://host:port` (the
/// connector checks the rest when it dials).
pub fn annotated_endpoint(node: &str, value: &str) -> Result<String, EndpointError> {
    let value = value.trim();
    let bad = || EndpointError::BadAnnotation {
        node: node.to_string(),
        value: value.to_string(),
    };
    let rest = value.strip_prefix("https://").unwrap_or(value);
    let rest = rest.trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || host.contains('/') || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad());
    }
    Ok(value.to_string())
}

/// `ip:port`, bracketing IPv6 addresses.
pub fn join_host_port(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

/// The endpoint of `node`: its annotation, else its first `InternalIP`
/// with `port`.
pub fn node_endpoint(node: &Node, port: u16) -> Result<NodeEndpoint, EndpointError> {
    let name = node.name_any();
    if let Some(value) = node.annotations().get(NODE_ENDPOINT_ANNOTATION) {
        return Ok(NodeEndpoint {
            endpoint: annotated_endpoint(&name, value)?,
            node: name,
        });
    }
    let ip = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP")
        .find_map(|a| a.address.parse::<IpAddr>().ok())
        .ok_or_else(|| EndpointError::NoAddress { node: name.clone() })?;
    Ok(NodeEndpoint {
        endpoint: join_host_port(ip, port),
        node: name,
    })
}

/// The cluster's Nodes as the control plane sees them: one watch, a
/// store, and a counter that moves on every change. Cheap to clone.
#[derive(Clone)]
pub struct Nodes {
    store: Store<Node>,
    changes: watch::Receiver<u64>,
    api: Api<Node>,
    port: u16,
}

impl std::fmt::Debug for Nodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nodes")
            .field("known", &self.store.len())
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Nodes {
    /// A view of the Nodes matching `label_selector` (all when `None`),
    /// and the future that keeps it current until `stop` turns true. The
    /// watch restarts with backoff after errors.
    pub fn watch(
        client: Client,
        label_selector: Option<&str>,
        port: u16,
        mut stop: watch::Receiver<bool>,
    ) -> (Nodes, impl Future<Output = ()> + Send + 'static) {
        let api: Api<Node> = Api::all(client);
        let mut config = watcher::Config::default();
        if let Some(selector) = label_selector.filter(|s| !s.is_empty()) {
            config = config.labels(selector);
        }
        let (store, writer) = reflector::store();
        let (tx, changes) = watch::channel(0u64);
        let events = watcher(api.clone(), config)
            .default_backoff()
            .modify(|node: &mut Node| {
                // What the control plane never reads, and what makes a
                // Node large.
                node.managed_fields_mut().clear();
                if let Some(status) = node.status.as_mut() {
                    status.images = None;
                    status.volumes_attached = None;
                    status.volumes_in_use = None;
                }
            })
            .reflect(writer);
        let drive = async move {
            let mut events = std::pin::pin!(events);
            loop {
                let event = tokio::select! {
                    _ = stopped(&mut stop) => return,
                    event = events.next() => event,
                };
                match event {
                    Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)))
                    | Some(Ok(watcher::Event::InitDone)) => tx.send_modify(|n| *n += 1),
                    Some(Ok(_)) => {}
                    Some(Err(e)) => tracing::warn!(error = %e, "watching Nodes failed; retrying"),
                    None => return,
                }
            }
        };
        (
            Nodes {
                store,
                changes,
                api,
                port,
            },
            drive,
        )
    }

    /// The NodeStorage port used with a Node's `InternalIP`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A receiver whose value changes whenever a Node does.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// Waits until the first list of Nodes is in the store.
    pub async fn ready(&self) {
        // Fails only if the watch was dropped, i.e. on shutdown.
        let _ = self.store.wait_until_ready().await;
    }

    /// The Node `name`, as last seen.
    pub fn get(&self, name: &str) -> Option<Arc<Node>> {
        self.store.get(&ObjectRef::new(name))
    }

    /// Every Node, as last seen.
    pub fn all(&self) -> Vec<Arc<Node>> {
        self.store.state()
    }

    /// The endpoint of `name`, asking the API server when the store does
    /// not know the Node (yet, or because the selector leaves it out).
    pub async fn resolve_fresh(&self, name: &str) -> Result<NodeEndpoint, EndpointError> {
        if let Some(node) = self.get(name) {
            return node_endpoint(&node, self.port);
        }
        match self.api.get_opt(name).await {
            Ok(Some(node)) => node_endpoint(&node, self.port),
            Ok(None) => Err(EndpointError::NoNode {
                node: name.to_string(),
            }),
            Err(e) => Err(EndpointError::Api {
                node: name.to_string(),
                reason: e.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress as Address, NodeStatus};
    use kube::api::ObjectMeta;

    fn node(annotation: Option<&str>, addresses: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("node-a".into()),
                annotations: annotation
                    .map(|a| [(NODE_ENDPOINT_ANNOTATION.to_string(), a.to_string())].into()),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                addresses: Some(
                    addresses
                        .iter()
                        .map(|(t, a)| Address {
                            type_: t.to_string(),
                            address: a.to_string(),
                        })
                        .collect(),
                ),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    fn endpoint(n: &Node) -> Result<String, EndpointError> {
        node_endpoint(n, 7443).map(|e| {
            assert_eq!(e.node, "node-a");
            e.endpoint
        })
    }

    #[test]
    fn annotation_wins_over_the_internal_ip() {
        let n = node(Some("127.0.0.1:4000"), &[("InternalIP", "10.0.0.1")]);
        assert_eq!(endpoint(&n).as_deref(), Ok("127.0.0.1:4000"));
        let n = node(Some("https://storage.node-a:9"), &[]);
        assert_eq!(endpoint(&n).as_deref(), Ok("https://storage.node-a:9"));
    }

    #[test]
    fn first_parsable_internal_ip_with_the_port() {
        let n = node(
            None,
            &[
                ("Hostname", "node-a"),
                ("ExternalIP", "203.0.113.7"),
                ("InternalIP", "10.0.0.1"),
                ("InternalIP", "fd00::1"),
            ],
        );
        assert_eq!(endpoint(&n).as_deref(), Ok("10.0.0.1:7443"));
        let n = node(None, &[("InternalIP", "fd00::1")]);
        assert_eq!(endpoint(&n).as_deref(), Ok("[fd00::1]:7443"));
    }

    #[test]
    fn no_address_or_a_bad_annotation_is_an_error() {
        let n = node(None, &[("Hostname", "node-a")]);
        assert!(matches!(endpoint(&n), Err(EndpointError::NoAddress { .. })));
        for bad in [
            "",
            "10.0.0.1",
            "10.0.0.1:",
            ":7443",
            "h:0",
            "h:99999",
            "a/b:1",
        ] {
            let n = node(Some(bad), &[("InternalIP", "10.0.0.1")]);
            assert!(
                matches!(endpoint(&n), Err(EndpointError::BadAnnotation { .. })),
                "{bad:?}"
            );
        }
    }
}
