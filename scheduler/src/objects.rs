//! What the extender reads about the cluster, behind one trait: the
//! informer cache ([`crate::cache::Cache`]) in production, a plain
//! in-memory set ([`MemoryObjects`]) in unit tests and the benchmark.
//! Every lookup is local; nothing here calls the API server.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use carina_api::{LogicVolume, NodeStorageResource};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use tokio::sync::watch;

/// The cluster objects the extender decides from.
pub trait Objects: Send + Sync {
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>>;
    fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>>;
    fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>>;
    /// The `NodeStorageResource` of `node` (it is named after the node).
    fn node_storage(&self, node: &str) -> Option<Arc<NodeStorageResource>>;
    fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>>;
    fn logic_volumes(&self) -> Vec<Arc<LogicVolume>>;
    fn claims(&self) -> Vec<Arc<PersistentVolumeClaim>>;
    fn pods(&self) -> Vec<Arc<Pod>>;
    /// A counter that grows with every change to any object; its receiver
    /// wakes on each change.
    fn changes(&self) -> watch::Receiver<u64>;
    /// Whether every kind has been listed once (the answers are complete).
    fn synced(&self) -> bool;
}

/// Objects held in memory, for tests and benchmarks. Every insert counts
/// as a change.
#[derive(Debug)]
pub struct MemoryObjects {
    inner: RwLock<Maps>,
    changes: watch::Sender<u64>,
}

#[derive(Debug, Default)]
struct Maps {
    claims: HashMap<(String, String), Arc<PersistentVolumeClaim>>,
    volumes: HashMap<String, Arc<PersistentVolume>>,
    classes: HashMap<String, Arc<StorageClass>>,
    nodes: HashMap<String, Arc<NodeStorageResource>>,
    pods: HashMap<(String, String), Arc<Pod>>,
    lvs: HashMap<String, Arc<LogicVolume>>,
}

impl Default for MemoryObjects {
    fn default() -> Self {
        MemoryObjects {
            inner: RwLock::default(),
            changes: watch::channel(0).0,
        }
    }
}

fn ns_key(namespace: Option<String>, name: String) -> (String, String) {
    (namespace.unwrap_or_default(), name)
}

impl MemoryObjects {
    pub fn new() -> Self {
        MemoryObjects::default()
    }

    fn write(&self, f: impl FnOnce(&mut Maps)) {
        // A poisoned lock only means a test panicked while inserting; the
        // maps are still whole.
        f(&mut self.inner.write().unwrap_or_else(|p| p.into_inner()));
        self.changes.send_modify(|g| *g += 1);
    }

    fn read<T>(&self, f: impl FnOnce(&Maps) -> T) -> T {
        f(&self.inner.read().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn insert_claim(&self, c: PersistentVolumeClaim) {
        self.write(|m| {
            m.claims
                .insert(ns_key(c.namespace(), c.name_any()), Arc::new(c));
        });
    }

    pub fn insert_volume(&self, v: PersistentVolume) {
        self.write(|m| {
            m.volumes.insert(v.name_any(), Arc::new(v));
        });
    }

    pub fn insert_class(&self, c: StorageClass) {
        self.write(|m| {
            m.classes.insert(c.name_any(), Arc::new(c));
        });
    }

    pub fn insert_node_storage(&self, n: NodeStorageResource) {
        self.write(|m| {
            m.nodes.insert(n.name_any(), Arc::new(n));
        });
    }

    pub fn insert_pod(&self, p: Pod) {
        self.write(|m| {
            m.pods
                .insert(ns_key(p.namespace(), p.name_any()), Arc::new(p));
        });
    }

    pub fn remove_pod(&self, namespace: &str, name: &str) {
        self.write(|m| {
            m.pods.remove(&(namespace.to_string(), name.to_string()));
        });
    }

    pub fn insert_logic_volume(&self, lv: LogicVolume) {
        self.write(|m| {
            m.lvs.insert(lv.name_any(), Arc::new(lv));
        });
    }
}

impl Objects for MemoryObjects {
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.read(|m| {
            m.claims
                .get(&(namespace.to_string(), name.to_string()))
                .cloned()
        })
    }

    fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.read(|m| m.volumes.get(name).cloned())
    }

    fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.read(|m| m.classes.get(name).cloned())
    }

    fn node_storage(&self, node: &str) -> Option<Arc<NodeStorageResource>> {
        self.read(|m| m.nodes.get(node).cloned())
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.read(|m| {
            m.pods
                .get(&(namespace.to_string(), name.to_string()))
                .cloned()
        })
    }

    fn logic_volumes(&self) -> Vec<Arc<LogicVolume>> {
        self.read(|m| m.lvs.values().cloned().collect())
    }

    fn claims(&self) -> Vec<Arc<PersistentVolumeClaim>> {
        self.read(|m| m.claims.values().cloned().collect())
    }

    fn pods(&self) -> Vec<Arc<Pod>> {
        self.read(|m| m.pods.values().cloned().collect())
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn synced(&self) -> bool {
        true
    }
}
