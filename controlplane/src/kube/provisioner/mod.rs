//! `KubeProvisioner`: the CSI controller's back end in `--mode kube`. It
//! makes nothing on a node itself: a volume is a `LogicVolume` object; the bridge
//! carries it out on its node and writes the outcome into `status`, and the
//! provisioner waits for that object's outcome until it is there or a
//! deadline passes. Nothing here sleeps and polls, and nothing serialises
//! creates: concurrent calls for different volumes run concurrently.
//!
//! **Cache.** The provisioner watches all `LogicVolume`s and
//! `NodeStorageResource`s from its start (`cache`). A create reads
//! placement's records from there instead of listing them, and waits for
//! its object's outcome on that watch instead of starting one; the API
//! server is asked only where the cache may be behind: an object the cache
//! holds under the name is read afresh, and a placement the cache cannot
//! make (no node, no room, a pinned node it does not know) is made again
//! from listed records. Delete and expand wait on a watch of their one
//! object (a field selector on its name).
//!
//! **Placement.** With accessibility requirements from a
//! `WaitForFirstConsumer` claim the volume goes to the node of the first
//! `preferred` topology (`topology.carina.storage.io/node`; the node the
//! scheduler picked), or, without `preferred`, to one of the `requisite`
//! nodes. Without requirements (`Immediate` binding) every node with a
//! published `NodeStorageResource` is a candidate. Candidates are ranked by
//! the direct control plane's rules ([`crate::nodes::placement::rank`]:
//! group by `carina.storage.io/disk-group-name` or the node's first
//! suitable group with room, `binpack`/`spreadout`) over the exact byte
//! figures of `NodeStorageResource.status.groups`, less the volumes already
//! asked for but not yet made, including the creates of this process in
//! flight: a create reserves its room in the same step as it chooses, so
//! concurrent creates never take the same room twice. The size is the
//! request rounded to the
//! group's allocation unit. A pinned node whose capacity is not published
//! yet still gets the volume when the request names its group; the size is
//! then rounded to 1 MiB ([`FALLBACK_UNIT`]) and the node rounds further
//! and checks the room itself.
//!
//! **Idempotency.** The object's name is the volume's local name
//! ([`carina_csi::names::local_name`] of the CSI name, the one rule every
//! control plane and the node share). An existing object that fits the request (size within the range,
//! the requested group, exclusivity, an accessible node) is returned once
//! made, or waited for while in progress; one that does not fit is
//! `ALREADY_EXISTS`. A create that failed for good (any code but
//! `UNAVAILABLE`, `DEADLINE_EXCEEDED`, `ABORTED`, `CANCELLED`, which the
//! bridge retries soon: the one rule [`carina_api::state::Retry`]) deletes
//! its object, so a
//! retry (e.g. after rescheduling to another node) places the volume anew;
//! a retry that finds such an object on its way out waits until it is gone.
//!
//! **Go Carina's volumes** (their PersistentVolumes keep Go's ids) are
//! served once taken over and refused with `FAILED_PRECONDITION` until
//! then (`legacy`); `ListVolumes` lists only the taken over ones.
//!
//! **Condition.** `ListVolumes` and `ControllerGetVolume` ask the
//! volumes' nodes what they see now (read-only `ListLVs`, over the node
//! access given by [`KubeProvisioner::with_node_access`]; the Node's
//! endpoint is read from the API as the bridge reads it). Without node
//! access every volume is reported abnormal, saying so.
//!
//! **Codes from the bridge** (`status.code`): `RESOURCE_EXHAUSTED`,
//! `INVALID_ARGUMENT`, `ALREADY_EXISTS`, `OUT_OF_RANGE` pass as they are;
//! `UNAVAILABLE`, `DEADLINE_EXCEEDED` and `CANCELLED` become `UNAVAILABLE`,
//! `ABORTED` stays `ABORTED` (the answers the bridge retries soon; the
//! object stays, holding its room, and the bridge retries); anything else
//! is `INTERNAL` with the bridge's message. No
//! outcome within the deadline is `DEADLINE_EXCEEDED`; the object stays and
//! a retry finds it.
//!
//! **Delete** removes the object and waits until it is gone (the bridge
//! removes [`carina_api::LOGICVOLUME_FINALIZER`] once the node deleted the volume).
//! **Expand** patches `spec.size` and waits until `status.currentSize`
//! covers the request; a tiered volume (`spec.cache`) cannot grow
//! (`FAILED_PRECONDITION`); an expand that failed for good (the codes a
//! create deletes its object for) sets `spec.size` back, so the refusal
//! leaves the object as it was. A failure code counts only when it is news: the
//! status describes the new `metadata.generation` (`observedGeneration`),
//! or, for a bridge that does not record it, the status changed since the
//! patch.
//!
//! **Context** of a volume: `carina.storage.io/node`, `/disk-group-name`,
//! `/major` and `/minor` (block volumes), `/policy` (when the node's
//! `NodeStorageResource` names the group's policy), `/path` (when the
//! status carries `path`, as the bridge writes it, or the object the
//! [`carina_api::PATH_ANNOTATION`]), and `csi.storage.k8s.io/fstype` from the request.
//!
//! **Files**, in the order a create runs through them: this one holds
//! [`KubeProvisioner`], its config and the [`Provisioner`] impl, one
//! delegation per verb. `create` is CreateVolume top to bottom (look up
//! an existing object, take it if it fits or wait until it is gone, place
//! and reserve, create or take the object a concurrent create made, await
//! the outcome, check the size); `reads` is every read of the API server
//! (an object, the lists, placement's records, a node's published group);
//! `cache` keeps the watched records and the reservations of creates in
//! flight and waits for a create's outcome; `placement` chooses where a
//! new volume goes from the records, a pure decision (`records` reads
//! the published records); `object` builds the new `LogicVolume`;
//! `outcome` holds the pure decisions on what an object's status means;
//! `watch` waits for one object on a watch of its own. `delete`, `expand`
//! and `read` are the other verbs; `copies` snapshots and clones; `legacy`
//! reads volume ids of either kind, Go Carina's too, into objects;
//! `notice` the Event on a claim with parameters without effect; `error`
//! maps codes and API errors to CSI answers.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use carina_csi::{
    CapacityInfo, CapacityRange, CsiError, ProvisionedSnapshot, ProvisionedVolume, Provisioner,
    SnapshotRequest, Topology, VolumeHealth, VolumeRequest,
};
use kube::Client;
use kube::api::Api;

use carina_api::LogicVolume;
use carina_csi::strategy::Strategy;

use crate::nodes::pool::NodeClients;

mod cache;
mod copies;
mod create;
mod delete;
mod error;
mod expand;
#[cfg(test)]
mod fixtures;
mod legacy;
mod notice;
mod object;
mod outcome;
mod placement;
mod read;
mod reads;
mod records;
mod watch;

use cache::Cache;
pub use error::status_error;
use notice::Notices;
pub use object::{PVC_NAME_PARAMETER, PVC_NAMESPACE_PARAMETER};
pub use placement::FALLBACK_UNIT;
use reads::Reads;

/// How long a create, delete or expand waits for the bridge by default.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings of a [`KubeProvisioner`].
#[derive(Debug, Clone)]
pub struct KubeProvisionerConfig {
    /// How `Immediate` volumes (and `requisite`-only requests) are spread.
    pub strategy: Strategy,
    /// How long one create, delete or expand waits for the bridge.
    pub wait_timeout: Duration,
}

impl Default for KubeProvisionerConfig {
    fn default() -> Self {
        KubeProvisionerConfig {
            strategy: Strategy::default(),
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
        }
    }
}

/// Volumes as `LogicVolume` objects, made by the bridge.
#[derive(Clone)]
pub struct KubeProvisioner {
    /// Every read of the API server.
    reads: Reads,
    /// The writes of `LogicVolume`s, and the watches of one.
    lvs: Api<LogicVolume>,
    cache: Arc<Cache>,
    config: KubeProvisionerConfig,
    node_access: Option<NodeAccess>,
    notices: Notices,
}

/// How the provisioner reaches nodes to read volume conditions.
#[derive(Clone)]
struct NodeAccess {
    clients: Arc<NodeClients>,
    /// The NodeStorage port used with a Node's `InternalIP`.
    port: u16,
}

impl std::fmt::Debug for KubeProvisioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeProvisioner")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl KubeProvisioner {
    /// A provisioner writing `LogicVolume`s through `client`. Starts its
    /// watches of `LogicVolume`s and `NodeStorageResource`s on the current
    /// Tokio runtime (so it must be called within one); they stop when the
    /// last clone is dropped.
    pub fn new(client: Client, config: KubeProvisionerConfig) -> Self {
        KubeProvisioner {
            reads: Reads::new(client.clone()),
            lvs: Api::all(client.clone()),
            notices: Notices::new(client.clone()),
            cache: Arc::new(Cache::start(client)),
            config,
            node_access: None,
        }
    }

    /// Reads volume conditions from the nodes through `clients` (a
    /// certificate of role `controller` or `reader`), a Node's endpoint
    /// being its annotation or its `InternalIP` and `port`.
    pub fn with_node_access(mut self, clients: NodeClients, port: u16) -> Self {
        self.node_access = Some(NodeAccess {
            clients: Arc::new(clients),
            port,
        });
        self
    }

    pub fn config(&self) -> &KubeProvisionerConfig {
        &self.config
    }
}

#[async_trait]
impl Provisioner for KubeProvisioner {
    #[tracing::instrument(name = "kube.create_volume", skip_all, err(level = "info"), fields(carina.volume.name = %req.name))]
    async fn create_volume(&self, req: &VolumeRequest) -> Result<ProvisionedVolume, CsiError> {
        self.create(req).await
    }

    fn copies(&self) -> bool {
        true
    }

    #[tracing::instrument(name = "kube.create_snapshot", skip_all, err(level = "info"), fields(carina.snapshot.name = %req.local_name, carina.volume.id = %req.source_volume_id))]
    async fn create_snapshot(
        &self,
        req: &SnapshotRequest,
    ) -> Result<ProvisionedSnapshot, CsiError> {
        self.snapshot(req).await
    }

    #[tracing::instrument(name = "kube.delete_snapshot", skip_all, err(level = "info"), fields(carina.snapshot.id = %snapshot_id))]
    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), CsiError> {
        self.remove_snapshot(snapshot_id).await
    }

    #[tracing::instrument(name = "kube.list_snapshots", skip_all, err(level = "info"))]
    async fn list_snapshots(&self) -> Result<Vec<ProvisionedSnapshot>, CsiError> {
        self.snapshots().await
    }

    #[tracing::instrument(name = "kube.delete_volume", skip_all, err(level = "info"), fields(carina.volume.id = %volume_id))]
    async fn delete_volume(&self, volume_id: &str) -> Result<(), CsiError> {
        self.delete(volume_id).await
    }

    #[tracing::instrument(name = "kube.expand_volume", skip_all, err(level = "info"), fields(carina.volume.id = %volume_id, carina.volume.size_bytes = range.required_bytes))]
    async fn expand_volume(&self, volume_id: &str, range: &CapacityRange) -> Result<u64, CsiError> {
        self.expand(volume_id, range).await
    }

    #[tracing::instrument(name = "kube.get_volume", skip_all, err(level = "info"), fields(carina.volume.id = %volume_id))]
    async fn get_volume(&self, volume_id: &str) -> Result<Option<ProvisionedVolume>, CsiError> {
        self.get(volume_id).await
    }

    #[tracing::instrument(name = "kube.list_volumes", skip_all, err(level = "info"))]
    async fn list_volumes(&self) -> Result<Vec<ProvisionedVolume>, CsiError> {
        self.list().await
    }

    #[tracing::instrument(name = "kube.volume_health", skip_all, fields(volumes = volumes.len()))]
    async fn volume_health(&self, volumes: &[ProvisionedVolume]) -> Vec<VolumeHealth> {
        self.health(volumes).await
    }

    /// The group names of the published `NodeStorageResource`s, from the
    /// cache once it is ready.
    #[tracing::instrument(name = "kube.group_names", skip_all, err(level = "info"))]
    async fn group_names(&self) -> Result<BTreeSet<String>, CsiError> {
        self.group_set().await
    }

    #[tracing::instrument(name = "kube.capacity", skip_all, err(level = "info"), fields(carina.group = group.unwrap_or_default()))]
    async fn capacity(
        &self,
        topology: Option<&Topology>,
        group: Option<&str>,
    ) -> Result<CapacityInfo, CsiError> {
        self.room(topology, group).await
    }
}
