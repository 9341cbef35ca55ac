//! The capacity publisher: one `WatchCapacity` stream per Node, written
//! into the `NodeStorageResource` named after the node.
//!
//! On a node's first report the record is created (server-side apply,
//! field manager [`FIELD_MANAGER`], owned by the Node so it goes when the
//! Node goes); every report then applies its status: `syncTime`,
//! `capacity`/`allocatable` per group in whole GiB under
//! `carina.storage.io/<group>` (Carina's shape), the exact byte figures in
//! `groups`, `nodeGeneration`, the disks of RAW groups and the volume
//! groups of LVM groups (from `ListDisks`, refreshed when the node
//! rescans or changes configuration), and the conditions `Ready=True`,
//! `Stale=False`.
//!
//! When the stream breaks, the publisher reconnects with backoff. A node
//! that cannot be reached is marked `Ready=False`, `Stale=True` with the
//! error's code name as reason (`NoEndpoint` when the Node has no
//! address); the last figures stay and the record is never deleted. A
//! node never reached gets no record.
//!
//! Every (re)connection is announced on a channel, so the config push
//! sends the node its configuration again.
//!
//! The parts: `stream` keeps one node's `WatchCapacity` stream open,
//! `record` writes the node's `NodeStorageResource`, and `report`
//! turns a report or an outage into its status (pure).

mod record;
mod report;
mod stream;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use kube::{Api, Client, ResourceExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::endpoints::{EndpointError, NodeEndpoint, Nodes, node_endpoint, stopped};
use super::retry::Backoff;
use crate::nodes::pool::NodeClients;
use carina_api::NodeStorageResource;
use stream::watch_node;

/// Field manager of the capacity publisher's writes.
pub const FIELD_MANAGER: &str = "carina-capacity";

/// Condition: the record reflects a live stream from the node.
pub const READY: &str = "Ready";

/// Condition: the node cannot be reached; the figures are the last known.
pub const STALE: &str = "Stale";
/// Condition type: a device group took no disk (its selector matched none
/// the node could use).
pub const NO_DISKS: &str = "NoDisks";

/// What a node's watch is started from; a change restarts it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    endpoint: Result<NodeEndpoint, EndpointError>,
    uid: Option<String>,
}

/// A task that is aborted when dropped.
#[derive(Debug)]
struct Watched {
    target: Target,
    task: JoinHandle<()>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What every node's watch shares.
#[derive(Debug)]
struct Shared {
    api: Api<NodeStorageResource>,
    clients: Arc<NodeClients>,
    connected: mpsc::UnboundedSender<String>,
    backoff: Backoff,
}

/// One `WatchCapacity` stream per Node.
#[derive(Debug)]
pub(crate) struct Publisher {
    shared: Arc<Shared>,
    nodes: Nodes,
}

impl Publisher {
    /// A publisher announcing every node (re)connection on `connected`.
    pub(crate) fn new(
        client: Client,
        nodes: Nodes,
        clients: Arc<NodeClients>,
        connected: mpsc::UnboundedSender<String>,
        backoff: Backoff,
    ) -> Self {
        Publisher {
            shared: Arc::new(Shared {
                api: Api::all(client),
                clients,
                connected,
                backoff,
            }),
            nodes,
        }
    }

    /// Follows the Nodes until `stop` turns true.
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut changes = self.nodes.changes();
        tokio::select! {
            _ = stopped(&mut stop) => return,
            _ = self.nodes.ready() => {}
        }
        let mut watched: HashMap<String, Watched> = HashMap::new();
        loop {
            self.sync(&mut watched);
            tokio::select! {
                _ = stopped(&mut stop) => break,
                changed = changes.changed() => if changed.is_err() { break },
            }
        }
        // Dropping `watched` aborts every stream.
    }

    /// Starts a watch for every new Node or changed endpoint, and ends
    /// those of Nodes that are gone.
    fn sync(&self, watched: &mut HashMap<String, Watched>) {
        let mut present = HashSet::new();
        for node in self.nodes.all() {
            let name = node.name_any();
            let target = Target {
                endpoint: node_endpoint(&node, self.nodes.port()),
                uid: node.uid(),
            };
            present.insert(name.clone());
            if watched.get(&name).is_some_and(|w| w.target == target) {
                continue;
            }
            let task = tokio::spawn(watch_node(
                self.shared.clone(),
                name.clone(),
                target.clone(),
            ));
            // Replacing the entry aborts the previous watch.
            watched.insert(name, Watched { target, task });
        }
        watched.retain(|name, _| {
            let keep = present.contains(name);
            if !keep {
                tracing::info!(k8s.node.name = %name, "Node gone: capacity watch ended");
                self.shared.clients.forget(name);
            }
            keep
        });
    }
}
