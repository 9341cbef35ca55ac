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
//! **Files.** This one holds [`KubeProvisioner`], its config and the
//! [`Provisioner`] impl that ties the steps together (the API calls of a
//! create, delete, expand, get, list and capacity); `cache` keeps the
//! watched records, the reservations of creates in flight, and waits for a
//! create's outcome; `placement` chooses where a new volume goes from the
//! published capacity records (`records` reads those); `object` builds the
//! new `LogicVolume`; `outcome` holds the pure decisions on what an
//! object's status means; `watch` waits for one object on a watch of its
//! own; `error` maps codes and API errors to CSI answers; `legacy` reads
//! volume ids of either kind, Go Carina's too, into objects.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use carina_csi::{
    CapacityInfo, CapacityRange, CsiError, ProvisionedSnapshot, ProvisionedVolume, Provisioner,
    SnapshotRequest, Topology, VolumeHealth, VolumeRequest, sizes,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use tracing::Instrument;

use carina_api::{LogicVolume, NodeStorageResource, TRACEPARENT_ANNOTATION};
use carina_csi::strategy::Strategy;

use crate::kube::endpoints::node_endpoint;
use crate::nodes::health;
use crate::nodes::pool::NodeClients;

mod cache;
mod copies;
mod error;
#[cfg(test)]
mod fixtures;
mod legacy;
mod notice;
mod object;
mod outcome;
mod placement;
mod records;
mod watch;

use cache::{Cache, Records, Reservation};
use error::api_error;
pub use error::status_error;
use notice::Notices;
pub use object::{PVC_NAME_PARAMETER, PVC_NAMESPACE_PARAMETER};
use object::{new_object, traceparent};
use outcome::CreateOutcome::{Failed, Gone, Made};
use outcome::{
    ExpandOutcome, create_outcome, current_bytes, expand_outcome, fs_type, incompatible, is_gone,
    provisioned,
};
pub use placement::FALLBACK_UNIT;
use placement::{Target, listed, place, policy_of, settled};
use records::{node_spec, nsr_node};
use watch::{Timeout, watch_until};

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
    lvs: Api<LogicVolume>,
    nsrs: Api<NodeStorageResource>,
    nodes: Api<Node>,
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
            lvs: Api::all(client.clone()),
            nsrs: Api::all(client.clone()),
            nodes: Api::all(client.clone()),
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

    /// Waits for the outcome of the create of `lv` (already checked
    /// against `req`), and removes the object when it failed for good.
    async fn outcome(
        &self,
        lv: LogicVolume,
        req: &VolumeRequest,
        policy: Option<String>,
    ) -> Result<ProvisionedVolume, CsiError> {
        let name = lv.name_any();
        let made = self.await_made(lv).await?;
        let volume = provisioned(&made, fs_type(req), policy.as_deref());
        if !sizes::satisfies(&req.capacity, volume.capacity_bytes) {
            // A whole disk larger than limit_bytes.
            self.discard(&made).await;
            return Err(CsiError::OutOfRange(format!(
                "volume {:?} on node {} is {} bytes, above limit_bytes {}",
                name, volume.node, volume.capacity_bytes, req.capacity.limit_bytes
            )));
        }
        Ok(volume)
    }

    /// Waits until the bridge made `lv` (returned as made), or its create
    /// failed (the object removed when it failed for good).
    async fn await_made(&self, lv: LogicVolume) -> Result<LogicVolume, CsiError> {
        let name = lv.name_any();
        let uid = lv.uid();
        let judged = match create_outcome(Some(&lv), uid.as_deref()) {
            Some(o) => o,
            None => {
                tracing::debug!(carina.volume.name = %name, "waiting for the bridge");
                self.cache
                    .wait_for(&name, uid.as_deref(), self.config.wait_timeout, |obj| {
                        create_outcome(obj, uid.as_deref())
                    })
                    .instrument(tracing::info_span!("kube.await_outcome"))
                    .await
                    .map_err(|last| {
                        let t = Timeout {
                            last: last.map(|lv| (*lv).clone()),
                            watch_error: self.cache.watch_error(),
                        };
                        CsiError::DeadlineExceeded(format!(
                            "LogicVolume {name:?} on node {}: not made within {:?} ({}); it stays, and a retry finds it",
                            lv.spec.node_name,
                            self.config.wait_timeout,
                            t.describe()
                        ))
                    })?
            }
        };
        match judged {
            Made(made) => Ok(made),
            Failed {
                lv: failed,
                error,
                given_up,
            } => {
                if given_up {
                    self.discard(&failed).await;
                }
                Err(error)
            }
            Gone => Err(CsiError::Aborted(format!(
                "LogicVolume {name:?} was deleted while CreateVolume waited for it"
            ))),
        }
    }

    /// Deletes the object `lv` (that exact one) and waits until the bridge
    /// deleted its volume and released it.
    async fn delete_object(&self, lv: LogicVolume) -> Result<(), CsiError> {
        let name = lv.name_any();
        if lv.metadata.deletion_timestamp.is_none() {
            // The bridge's DeleteLV continues the trace the object names:
            // name this delete's, as an expand does. Bookkeeping: a failure
            // is logged and the delete goes on.
            if let Some(tp) = traceparent() {
                let patch = serde_json::json!({
                    "metadata": {"uid": lv.uid(), "annotations": { TRACEPARENT_ANNOTATION: tp }},
                });
                match self
                    .lvs
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
                    // The uid precondition failed: a newer object took the name.
                    Err(kube::Error::Api(s)) if s.is_conflict() => return Ok(()),
                    Err(e) => {
                        tracing::info!(error = %e, "could not name the delete's trace on the LogicVolume")
                    }
                }
            }
            match self.lvs.delete(&name, &exactly(&lv)).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
                // The uid precondition failed: a newer object took the name.
                Err(kube::Error::Api(s)) if s.is_conflict() => return Ok(()),
                Err(e) => return Err(api_error("delete LogicVolume", e)),
            }
        }
        self.wait_gone(&name, lv.uid()).await
    }

    /// Deletes `lv` (that exact object), so a retry can start over; a
    /// failure is only logged (the retry finds the object and says why).
    async fn discard(&self, lv: &LogicVolume) {
        let name = lv.name_any();
        match self.lvs.delete(&name, &exactly(lv)).await {
            Ok(_) => {
                tracing::info!(carina.volume.name = %name, "removed the LogicVolume of a failed create")
            }
            Err(e) => {
                tracing::warn!(carina.volume.name = %name, error = %e, "removing the LogicVolume of a failed create failed")
            }
        }
    }

    /// Waits until the object `name` with `uid` is gone (a newer object of
    /// the same name counts as gone).
    async fn wait_gone(&self, name: &str, uid: Option<String>) -> Result<(), CsiError> {
        watch_until(&self.lvs, name, self.config.wait_timeout, |obj| {
            is_gone(obj, uid.as_deref()).then_some(())
        })
        .await
        .map_err(|t| {
            let node = t.last.as_ref().map(|lv| lv.spec.node_name.as_str()).unwrap_or("?");
            CsiError::DeadlineExceeded(format!(
                "LogicVolume {name:?} on node {node}: not deleted within {:?} ({}); the node has not confirmed the deletion",
                self.config.wait_timeout,
                t.describe()
            ))
        })
    }

    /// Sets `spec.size` of the object `name` (that very one, `uid`) back
    /// to `previous` after an expand to `asked` bytes failed for good, so
    /// the refused expand leaves the object as it was (the bridge then
    /// records the volume ready again). Left alone when the object moved
    /// on meanwhile (another expand); a failure is only logged.
    async fn take_back_size(&self, name: &str, uid: Option<&str>, asked: u64, previous: &Quantity) {
        let current = match self.lvs.get_opt(name).await {
            Ok(Some(lv)) if lv.uid().as_deref() == uid => lv,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(carina.volume.name = %name, error = %e, "reading the LogicVolume of a failed expand failed");
                return;
            }
        };
        if current.spec.size.0 != asked.to_string() {
            return;
        }
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": current.resource_version()},
            "spec": {"size": previous},
        });
        match self
            .lvs
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(carina.volume.name = %name, size = %previous.0, "set the size of a failed expand back")
            }
            Err(e) => {
                tracing::warn!(carina.volume.name = %name, error = %e, "setting the size of a failed expand back failed")
            }
        }
    }
}

/// Deletes that very object: a newer one of the same name is left alone
/// (the API answers a conflict).
fn exactly(lv: &LogicVolume) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: lv.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

#[async_trait]
impl Provisioner for KubeProvisioner {
    #[tracing::instrument(name = "kube.create_volume", skip_all, err(level = "info"), fields(carina.volume.name = %req.name))]
    async fn create_volume(&self, req: &VolumeRequest) -> Result<ProvisionedVolume, CsiError> {
        self.notices.parameters_ignored(req).await;
        if let Some(source) = &req.source {
            return self.create_from(req, source).await;
        }
        let name = req.local_name.clone();
        // The cache misses only objects made a moment ago, which the create
        // below runs into; an object it holds may be gone or changed, so
        // that one is read afresh.
        let existing = if self.cache.is_ready() && self.cache.lv(&name).is_none() {
            None
        } else {
            self.lvs
                .get_opt(&name)
                .instrument(tracing::info_span!("kube.lookup"))
                .await
                .map_err(|e| api_error("get LogicVolume", e))?
        };
        if let Some(lv) = existing {
            if lv.metadata.deletion_timestamp.is_none() {
                return self.adopt(lv, req).await;
            }
            tracing::info!(carina.volume.name = %name, "an earlier LogicVolume is being deleted; waiting until it is gone");
            self.wait_gone(&name, lv.uid()).await?;
        }
        let (target, reservation) = self
            .place(&name, req)
            .instrument(tracing::info_span!("kube.place"))
            .await?;
        tracing::info!(
            carina.volume.name = %name,
            k8s.node.name = %target.node,
            carina.group = %target.group,
            carina.volume.size_bytes = target.size_bytes,
            strategy = %self.config.strategy,
            "creating LogicVolume"
        );
        let object = new_object(&name, req, &target);
        let created = self
            .lvs
            .create(&PostParams::default(), &object)
            .instrument(tracing::info_span!("kube.create_object"))
            .await;
        match created {
            Ok(created) => {
                reservation.created(&created);
                self.outcome(created, req, target.policy).await
            }
            // A concurrent create (another replica, a retry) was first.
            Err(kube::Error::Api(s)) if s.is_already_exists() => {
                drop(reservation);
                let lv = self
                    .lvs
                    .get_opt(&name)
                    .await
                    .map_err(|e| api_error("get LogicVolume", e))?
                    .ok_or_else(|| {
                        CsiError::Aborted(format!(
                            "LogicVolume {name:?} was created and deleted concurrently; retry"
                        ))
                    })?;
                if lv.metadata.deletion_timestamp.is_some() {
                    return Err(CsiError::Aborted(format!(
                        "an earlier LogicVolume {name:?} is being deleted; retry once it is gone"
                    )));
                }
                self.adopt(lv, req).await
            }
            Err(e) => Err(api_error("create LogicVolume", e)),
        }
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
        let Some(lv) = self.find(volume_id).await? else {
            tracing::info!("no such LogicVolume: nothing to delete");
            return Ok(());
        };
        self.delete_object(lv).await
    }

    #[tracing::instrument(name = "kube.expand_volume", skip_all, err(level = "info"), fields(carina.volume.id = %volume_id, carina.volume.size_bytes = range.required_bytes))]
    async fn expand_volume(&self, volume_id: &str, range: &CapacityRange) -> Result<u64, CsiError> {
        let not_found = || CsiError::NotFound(format!("volume {volume_id:?} does not exist"));
        let lv = self.find(volume_id).await?.ok_or_else(not_found)?;
        let name = lv.name_any();
        let made = lv
            .status
            .as_ref()
            .and_then(|s| s.volume_id.as_ref())
            .is_some();
        if !made || lv.metadata.deletion_timestamp.is_some() {
            return Err(not_found());
        }
        let current = current_bytes(&lv).unwrap_or(0);
        if let Some(cache) = &lv.spec.cache
            && current < range.required_bytes
        {
            return Err(crate::nodes::bcache::cannot_grow(
                volume_id,
                &cache.device_group,
                current,
            ));
        }
        if current >= range.required_bytes {
            return Ok(current);
        }
        let unit = self
            .nsrs
            .get_opt(&lv.spec.node_name)
            .await
            .map_err(|e| api_error("get NodeStorageResource", e))?
            .and_then(|n| n.status)
            .and_then(|s| {
                s.groups
                    .into_iter()
                    .find(|g| g.name == lv.spec.device_group)
            })
            .map_or(FALLBACK_UNIT, |g| g.allocation_unit_bytes);
        let size = sizes::allocation(range, unit)?;
        let mut patch = serde_json::json!({
            "metadata": {"resourceVersion": lv.resource_version()},
            "spec": {"size": size.to_string()},
        });
        if let Some(tp) = traceparent() {
            patch["metadata"]["annotations"] = serde_json::json!({ TRACEPARENT_ANNOTATION: tp });
        }
        let patched = self
            .lvs
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| api_error("patch LogicVolume size", e))?;
        let generation = patched.metadata.generation.unwrap_or(0);
        let before = patched.status.clone().unwrap_or_default();
        let uid = lv.uid();
        let judge = |obj: Option<&LogicVolume>| {
            expand_outcome(
                obj,
                uid.as_deref(),
                range.required_bytes,
                generation,
                &before,
            )
        };
        let outcome = match judge(Some(&patched)) {
            Some(outcome) => outcome,
            None => watch_until(&self.lvs, &name, self.config.wait_timeout, judge)
                .await
                .map_err(|t| {
                    CsiError::DeadlineExceeded(format!(
                        "LogicVolume {name:?} not grown to {size} bytes within {:?} ({})",
                        self.config.wait_timeout,
                        t.describe()
                    ))
                })?,
        };
        match outcome {
            ExpandOutcome::Grown(size) => Ok(size),
            ExpandOutcome::Failed { error, given_up } => {
                if given_up {
                    self.take_back_size(&name, uid.as_deref(), size, &lv.spec.size)
                        .await;
                }
                Err(error)
            }
            ExpandOutcome::Gone => Err(not_found()),
        }
    }

    #[tracing::instrument(name = "kube.get_volume", skip_all, err(level = "info"), fields(carina.volume.id = %volume_id))]
    async fn get_volume(&self, volume_id: &str) -> Result<Option<ProvisionedVolume>, CsiError> {
        let Some(lv) = self.find(volume_id).await? else {
            return Ok(None);
        };
        if lv
            .status
            .as_ref()
            .and_then(|s| s.volume_id.as_ref())
            .is_none()
        {
            return Ok(None);
        }
        let policy = policy_of(&self.nsrs, &lv.spec.node_name, &lv.spec.device_group).await?;
        Ok(Some(provisioned(&lv, None, policy.as_deref())))
    }

    #[tracing::instrument(name = "kube.list_volumes", skip_all, err(level = "info"))]
    async fn list_volumes(&self) -> Result<Vec<ProvisionedVolume>, CsiError> {
        let lvs = self
            .lvs
            .list(&ListParams::default())
            .await
            .map_err(|e| api_error("list LogicVolumes", e))?;
        let nsrs = self
            .nsrs
            .list(&ListParams::default())
            .await
            .map_err(|e| api_error("list NodeStorageResources", e))?;
        let policies: HashMap<(String, String), String> = nsrs
            .items
            .iter()
            .flat_map(|nsr| {
                let node = nsr_node(nsr);
                nsr.status
                    .iter()
                    .flat_map(|s| s.groups.iter())
                    .map(move |g| ((node.clone(), g.name.clone()), g.policy.clone()))
            })
            .collect();
        let mut all: Vec<ProvisionedVolume> = lvs
            .items
            .iter()
            .filter(|lv| {
                lv.status
                    .as_ref()
                    .and_then(|s| s.volume_id.as_ref())
                    .is_some()
                    && copies::snapshot_of(lv).is_none()
                    && legacy::serves(lv)
            })
            .map(|lv| {
                let key = (lv.spec.node_name.clone(), lv.spec.device_group.clone());
                provisioned(lv, None, policies.get(&key).map(String::as_str))
            })
            .collect();
        all.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
        Ok(all)
    }

    #[tracing::instrument(name = "kube.volume_health", skip_all, fields(volumes = volumes.len()))]
    async fn volume_health(&self, volumes: &[ProvisionedVolume]) -> Vec<VolumeHealth> {
        let Some(access) = &self.node_access else {
            return volumes
                .iter()
                .map(|v| {
                    VolumeHealth::abnormal(format!(
                        "this controller has no access to node {} to ask",
                        v.node
                    ))
                })
                .collect();
        };
        let (nodes, port) = (&self.nodes, access.port);
        health::volume_health(&access.clients, volumes, |name| async move {
            match nodes.get_opt(&name).await {
                Ok(Some(node)) => node_endpoint(&node, port).map_err(|e| e.to_string()),
                Ok(None) => Err("no such Node".to_string()),
                Err(e) => Err(format!("reading the Node failed: {e}")),
            }
        })
        .await
    }

    /// The group names of the published `NodeStorageResource`s, from the
    /// cache once it is ready.
    #[tracing::instrument(name = "kube.group_names", skip_all, err(level = "info"))]
    async fn group_names(&self) -> Result<BTreeSet<String>, CsiError> {
        let records = if self.cache.is_ready() {
            self.cache.records()
        } else {
            listed(&self.nsrs, &self.lvs).await?
        };
        Ok(records
            .nsrs
            .iter()
            .flat_map(|nsr| nsr.status.iter().flat_map(|s| s.groups.iter()))
            .map(|g| g.name.clone())
            .collect())
    }

    #[tracing::instrument(name = "kube.capacity", skip_all, err(level = "info"), fields(carina.group = group.unwrap_or_default()))]
    async fn capacity(
        &self,
        topology: Option<&Topology>,
        group: Option<&str>,
    ) -> Result<CapacityInfo, CsiError> {
        let nsrs = self
            .nsrs
            .list(&ListParams::default())
            .await
            .map_err(|e| api_error("list NodeStorageResources", e))?;
        let mut info = CapacityInfo::default();
        for nsr in &nsrs.items {
            if !topology.is_none_or(|t| node_spec(&nsr_node(nsr)).matches(t)) {
                continue;
            }
            let groups = nsr.status.iter().flat_map(|s| s.groups.iter());
            for g in groups.filter(|g| group.is_none_or(|w| g.name == w)) {
                info.available_bytes = info.available_bytes.saturating_add(g.allocatable_bytes);
                info.maximum_volume_size =
                    info.maximum_volume_size.max(g.largest_allocatable_bytes);
            }
        }
        Ok(info)
    }
}

impl KubeProvisioner {
    /// Where the new volume `name` goes, and the room reserved for it
    /// until the create ends. The cache answers when it can ([`settled`]);
    /// otherwise the API server's records decide.
    async fn place(
        &self,
        name: &str,
        req: &VolumeRequest,
    ) -> Result<(Target, Reservation<'_>), CsiError> {
        let strategy = self.config.strategy;
        let choice = |records: &Records| {
            let target = place(records, strategy, req)?;
            let pending = new_object(name, req, &target);
            Ok::<_, CsiError>((target, pending))
        };
        if self.cache.is_ready() {
            let cached = self.cache.reserve(
                || self.cache.records(),
                |records| {
                    let placed = choice(records).ok();
                    placed
                        .filter(|(target, _)| settled(target, records))
                        .ok_or(())
                },
            );
            if let Ok(placed) = cached {
                return Ok(placed);
            }
        }
        let records = listed(&self.nsrs, &self.lvs).await?;
        self.cache.reserve(|| records, choice)
    }

    /// An object that already holds the name: returned (or waited for) if
    /// it fits `req`, `ALREADY_EXISTS` if it does not.
    async fn adopt(
        &self,
        lv: LogicVolume,
        req: &VolumeRequest,
    ) -> Result<ProvisionedVolume, CsiError> {
        legacy::refuse_go_object(&lv)?;
        let policy = policy_of(&self.nsrs, &lv.spec.node_name, &lv.spec.device_group).await?;
        if let Some(why) = incompatible(req, &lv, policy.as_deref()) {
            return Err(CsiError::AlreadyExists(format!(
                "volume {:?} exists as LogicVolume {:?} on node {} ({} in group {:?}) but {why}",
                req.name,
                lv.name_any(),
                lv.spec.node_name,
                lv.spec.size.0,
                lv.spec.device_group
            )));
        }
        tracing::info!(carina.volume.name = %lv.name_any(), k8s.node.name = %lv.spec.node_name, "LogicVolume exists already");
        self.outcome(lv, req, policy).await
    }
}
