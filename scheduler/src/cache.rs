//! The informer cache: one kube-runtime reflector per kind the extender
//! reads — PersistentVolumeClaims, PersistentVolumes, StorageClasses,
//! `NodeStorageResource`s, `LogicVolume`s, and Pods (not finished, cut
//! down to their volumes and node when they arrive). Requests are
//! answered from the stores alone; the API server is only watched.
//!
//! Every event bumps a change counter ([`Objects::changes`]), which
//! invalidates the computed reservations and wakes waits in
//! [`crate::settle`]. The cache is synced once every kind has been listed;
//! `/readyz` says so. Reflectors restart with backoff after watch errors
//! and keep serving the last state meanwhile.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use carina_api::{LogicVolume, NodeStorageResource};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    EphemeralVolumeSource, PersistentVolume, PersistentVolumeClaim, Pod, PodSpec, Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::objects::Objects;

/// Number of kinds watched.
const KINDS: usize = 6;

/// Pods that hold nothing any more are not watched.
const LIVE_PODS: &str = "status.phase!=Succeeded,status.phase!=Failed";

/// Reflector stores over the cluster, kept current by background tasks
/// that stop when the cache is dropped.
#[derive(Debug)]
pub struct Cache {
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
    nodes: Store<NodeStorageResource>,
    lvs: Store<LogicVolume>,
    pods: Store<Pod>,
    changes: watch::Sender<u64>,
    synced: Arc<AtomicUsize>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Cache {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Cache {
    /// Starts watching with `client`. Must be called within a tokio
    /// runtime; returns at once (see [`Cache::wait_synced`]).
    pub fn start(client: Client) -> Cache {
        let (changes, _) = watch::channel(0);
        let synced = Arc::new(AtomicUsize::new(0));
        let mut r = Reflectors {
            client,
            changes: &changes,
            synced: &synced,
            tasks: Vec::new(),
        };
        let all = watcher::Config::default();
        let claims = r.start(all.clone(), clear_managed_fields);
        let volumes = r.start(all.clone(), clear_managed_fields);
        let classes = r.start(all.clone(), clear_managed_fields);
        let nodes = r.start(all.clone(), clear_managed_fields);
        let lvs = r.start(all.clone(), clear_managed_fields);
        let pods = r.start(all.fields(LIVE_PODS), slim_pod);
        let tasks = r.tasks;
        Cache {
            claims,
            volumes,
            classes,
            nodes,
            lvs,
            pods,
            changes,
            synced,
            tasks,
        }
    }

    /// Waits until every kind has been listed once.
    pub async fn wait_synced(&self) {
        let mut changes = self.changes.subscribe();
        while !self.synced() {
            if changes.changed().await.is_err() {
                return;
            }
        }
    }
}

/// Starts reflectors that share one client, one change counter and one
/// sync count, collecting their tasks.
struct Reflectors<'a> {
    client: Client,
    changes: &'a watch::Sender<u64>,
    synced: &'a Arc<AtomicUsize>,
    tasks: Vec<JoinHandle<()>>,
}

impl Reflectors<'_> {
    fn start<K>(&mut self, config: watcher::Config, modify: fn(&mut K)) -> Store<K>
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
    {
        let (store, tasks) = reflect(
            Api::all(self.client.clone()),
            config,
            modify,
            self.changes,
            self.synced,
        );
        self.tasks.extend(tasks);
        store
    }
}

/// A reflector over `api` into a new store, counting changes and the
/// first complete listing.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    modify: fn(&mut K),
    changes: &watch::Sender<u64>,
    synced: &Arc<AtomicUsize>,
) -> (Store<K>, [JoinHandle<()>; 2])
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let (reader, writer) = reflector::store();
    let stream = watcher(api, config)
        .default_backoff()
        .modify(modify)
        .reflect(writer);
    let on_change = changes.clone();
    let watch_kind = kind.clone();
    let watching = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => on_change.send_modify(|g| *g = g.wrapping_add(1)),
                Err(e) => tracing::warn!(kind = %watch_kind, error = %e, "watch failed; retrying"),
            }
        }
    });
    let ready = reader.clone();
    let on_synced = changes.clone();
    let synced = synced.clone();
    let listed = tokio::spawn(async move {
        if ready.wait_until_ready().await.is_ok() {
            synced.fetch_add(1, Ordering::SeqCst);
            tracing::info!(%kind, objects = ready.len(), "cache listed");
            on_synced.send_modify(|g| *g = g.wrapping_add(1));
        }
    });
    (reader, [watching, listed])
}

fn clear_managed_fields<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// A pod cut down to what the extender reads: identity, node, and the
/// volumes that are claims.
fn slim_pod(pod: &mut Pod) {
    let meta = pod.meta_mut();
    meta.managed_fields = None;
    meta.annotations = None;
    meta.labels = None;
    meta.owner_references = None;
    let spec = pod.spec.take().unwrap_or_default();
    let volumes: Vec<Volume> = spec
        .volumes
        .unwrap_or_default()
        .into_iter()
        .filter(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some())
        .map(|v| Volume {
            ephemeral: v.ephemeral.map(|_| EphemeralVolumeSource::default()),
            name: v.name,
            persistent_volume_claim: v.persistent_volume_claim,
            ..Volume::default()
        })
        .collect();
    pod.spec = Some(PodSpec {
        node_name: spec.node_name,
        volumes: (!volumes.is_empty()).then_some(volumes),
        ..PodSpec::default()
    });
    pod.status = None;
}

impl Objects for Cache {
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.claims.get(&ObjectRef::new(name).within(namespace))
    }

    fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.volumes.get(&ObjectRef::new(name))
    }

    fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.classes.get(&ObjectRef::new(name))
    }

    fn node_storage(&self, node: &str) -> Option<Arc<NodeStorageResource>> {
        self.nodes.get(&ObjectRef::new(node))
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get(&ObjectRef::new(name).within(namespace))
    }

    fn logic_volumes(&self) -> Vec<Arc<LogicVolume>> {
        self.lvs.state()
    }

    fn claims(&self) -> Vec<Arc<PersistentVolumeClaim>> {
        self.claims.state()
    }

    fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.state()
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst) >= KINDS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PersistentVolumeClaimVolumeSource, PodStatus};

    #[test]
    fn pods_keep_only_claims_and_node() {
        let mut pod = Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("p".into()),
                uid: Some("u".into()),
                labels: Some([("a".to_string(), "b".to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("n1".into()),
                containers: vec![Container {
                    name: "c".into(),
                    ..Container::default()
                }],
                volumes: Some(vec![
                    Volume {
                        name: "data".into(),
                        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                            claim_name: "data".into(),
                            read_only: None,
                        }),
                        ..Volume::default()
                    },
                    Volume {
                        name: "tmp".into(),
                        empty_dir: Some(Default::default()),
                        ..Volume::default()
                    },
                ]),
                ..PodSpec::default()
            }),
            status: Some(PodStatus::default()),
        };
        slim_pod(&mut pod);
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert!(spec.containers.is_empty());
        let volumes = spec.volumes.as_ref().expect("volumes");
        assert_eq!(volumes.len(), 1);
        assert_eq!(volumes[0].name, "data");
        assert_eq!(pod.metadata.uid.as_deref(), Some("u"));
        assert!(pod.metadata.labels.is_none() && pod.status.is_none());
    }
}
