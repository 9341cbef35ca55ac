//! `KubeProvisioner`: the CSI controller's back end in `--mode kube`. It
//! never talks to a node. A volume is a `LogicVolume` object; the bridge
//! carries it out on its node and writes the outcome into `status`, and the
//! provisioner **watches that one object** (a field selector on its name)
//! until the outcome is there or a deadline passes. Nothing here sleeps and
//! polls, and nothing serialises creates: concurrent calls for different
//! volumes run concurrently.
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
//! asked for but not yet made. The size is the request rounded to the
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
//! bridge retries) deletes its object, so a
//! retry (e.g. after rescheduling to another node) places the volume anew;
//! a retry that finds such an object on its way out waits until it is gone.
//!
//! **Codes from the bridge** (`status.code`): `RESOURCE_EXHAUSTED`,
//! `INVALID_ARGUMENT`, `ALREADY_EXISTS`, `OUT_OF_RANGE` pass as they are;
//! `UNAVAILABLE` and `DEADLINE_EXCEEDED` become `UNAVAILABLE`, `ABORTED`
//! stays `ABORTED` (all three retryable; the object stays and the bridge
//! retries); anything else is `INTERNAL` with the bridge's message. No
//! outcome within the deadline is `DEADLINE_EXCEEDED`; the object stays and
//! a retry finds it.
//!
//! **Delete** removes the object and waits until it is gone (the bridge
//! removes [`LOGICVOLUME_FINALIZER`] once the node deleted the volume).
//! **Expand** patches `spec.size` and waits until `status.currentSize`
//! covers the request. A failure code counts only when it is news: the
//! status describes the new `metadata.generation` (`observedGeneration`),
//! or, for a bridge that does not record it, the status changed since the
//! patch.
//!
//! **Context** of a volume: `carina.storage.io/node`, `/disk-group-name`,
//! `/major` and `/minor` (block volumes), `/policy` (when the node's
//! `NodeStorageResource` names the group's policy), `/path` (when the
//! status carries `path`, as the bridge writes it, or the object the
//! [`PATH_ANNOTATION`]), and `csi.storage.k8s.io/fstype` from the request.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use carina_csi::names;
use carina_csi::volume_id::VolumeId;
use carina_csi::{
    CapacityInfo, CapacityRange, CsiError, ProvisionedVolume, Provisioner, TOPOLOGY_KEY, Topology,
    VolumeRequest, sizes,
};
use carina_proto::nodestorage as pb;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions,
};
use kube::{Client, ResourceExt};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::nodes::placement::{self, NodeCapacity};
use crate::nodes::spec::NodeSpec;
use carina_api::{
    EXCLUSIVE_ANNOTATION, LOGICVOLUME_FINALIZER, LogicVolume, LogicVolumeSpec, NodeStorageResource,
    TRACEPARENT_ANNOTATION,
};
use carina_csi::strategy::Strategy;

mod error;
mod outcome;
mod records;
mod watch;

pub use error::status_error;
use error::{api_error, retryable};
use outcome::CreateOutcome::{Failed, Gone, Made};
use outcome::{
    ExpandOutcome, bytes, create_outcome, current_bytes, expand_outcome, failure, fs_type,
    incompatible, is_gone, provisioned,
};
use records::{group_capacity, is_stale, node_spec, nsr_node, policy_name};
use watch::watch_until;

/// How long a create, delete or expand waits for the bridge by default.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(60);

/// The unit sizes are rounded to when the node's allocation unit is not
/// published (the node rounds further to its own unit).
pub const FALLBACK_UNIT: u64 = 1 << 20;

/// `csi.storage.k8s.io/pvc/name`, which external-provisioner adds with
/// `--extra-create-metadata`.
pub const PVC_NAME_PARAMETER: &str = "csi.storage.k8s.io/pvc/name";
/// `csi.storage.k8s.io/pvc/namespace`, likewise.
pub const PVC_NAMESPACE_PARAMETER: &str = "csi.storage.k8s.io/pvc/namespace";

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
    config: KubeProvisionerConfig,
}

impl std::fmt::Debug for KubeProvisioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeProvisioner")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl KubeProvisioner {
    /// A provisioner writing `LogicVolume`s through `client`.
    pub fn new(client: Client, config: KubeProvisionerConfig) -> Self {
        KubeProvisioner {
            lvs: Api::all(client.clone()),
            nsrs: Api::all(client),
            config,
        }
    }

    pub fn config(&self) -> &KubeProvisionerConfig {
        &self.config
    }

    /// The capacity of every node that published its groups, with the
    /// volumes asked for but not yet made subtracted.
    async fn node_capacities(&self) -> Result<Vec<(NodeSpec, Vec<pb::GroupCapacity>)>, CsiError> {
        self.node_capacities_where(|_| true).await
    }

    /// [`Self::node_capacities`] of the records `keep` accepts.
    async fn node_capacities_where(
        &self,
        keep: impl Fn(&NodeStorageResource) -> bool,
    ) -> Result<Vec<(NodeSpec, Vec<pb::GroupCapacity>)>, CsiError> {
        let nsrs = self
            .nsrs
            .list(&ListParams::default())
            .await
            .map_err(|e| api_error("list NodeStorageResources", e))?;
        let lvs = self
            .lvs
            .list(&ListParams::default())
            .await
            .map_err(|e| api_error("list LogicVolumes", e))?;
        let mut nodes: Vec<(NodeSpec, Vec<pb::GroupCapacity>)> = nsrs
            .items
            .iter()
            .filter(|nsr| keep(nsr))
            .filter_map(|nsr| {
                let groups = &nsr.status.as_ref()?.groups;
                (!groups.is_empty()).then(|| {
                    (
                        node_spec(&nsr_node(nsr)),
                        groups.iter().map(group_capacity).collect(),
                    )
                })
            })
            .collect();
        nodes.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        subtract_pending(&mut nodes, &lvs.items);
        Ok(nodes)
    }

    /// The policy of `group` on `node`, if the node published it.
    async fn policy_of(&self, node: &str, group: &str) -> Result<Option<String>, CsiError> {
        let nsr = self
            .nsrs
            .get_opt(node)
            .await
            .map_err(|e| api_error("get NodeStorageResource", e))?;
        Ok(nsr
            .as_ref()
            .and_then(|n| n.status.as_ref())
            .and_then(|s| s.groups.iter().find(|g| g.name == group))
            .map(|g| g.policy.clone()))
    }

    /// Where a new volume goes: node, group, size, and the group's policy
    /// when known.
    async fn place(&self, req: &VolumeRequest) -> Result<Target, CsiError> {
        let pinned = pinned_node(req);
        // A node the capacity publisher cannot reach (Stale) is no choice
        // for a new volume; a volume pinned to it (its pod is there) still
        // goes there, and the bridge retries until the node is back.
        let nodes = if pinned.is_some() {
            self.node_capacities().await?
        } else {
            self.node_capacities_where(|nsr| !is_stale(nsr)).await?
        };
        let pinned_published = pinned
            .as_deref()
            .is_some_and(|p| nodes.iter().any(|(n, _)| n.name == p));
        if let Some(node) = pinned.filter(|_| !pinned_published) {
            return unpublished_target(req, node);
        }
        if nodes.is_empty() {
            return Err(CsiError::Unavailable(
                "no node has published its capacity (NodeStorageResource) yet".into(),
            ));
        }
        let views: Vec<NodeCapacity<'_>> = nodes
            .iter()
            .map(|(node, groups)| NodeCapacity {
                node,
                groups: groups.clone(),
            })
            .collect();
        let ranking = ranking_request(req);
        let best = placement::rank(&ranking, &views, self.config.strategy)?
            .into_iter()
            .next()
            .ok_or_else(|| CsiError::ResourceExhausted("no node has room".into()))?;
        let policy = nodes
            .iter()
            .find(|(n, _)| n.name == best.node)
            .and_then(|(_, groups)| groups.iter().find(|g| g.device_group == best.group))
            .map(|g| policy_name(g.policy()).to_string());
        Ok(Target {
            node: best.node,
            group: best.group,
            size_bytes: best.size_bytes,
            policy,
        })
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
        let uid = lv.uid();
        let judged = match create_outcome(Some(&lv), uid.as_deref()) {
            Some(o) => o,
            None => {
                tracing::debug!(volume.name = %name, "waiting for the bridge");
                watch_until(&self.lvs, &name, self.config.wait_timeout, |obj| {
                    create_outcome(obj, uid.as_deref())
                })
                    .await
                    .map_err(|t| {
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
            Made(made) => {
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
            Failed { lv: failed, error } => {
                if !retryable(error.code()) {
                    self.discard(&failed).await;
                }
                Err(error)
            }
            Gone => Err(CsiError::Aborted(format!(
                "LogicVolume {name:?} was deleted while CreateVolume waited for it"
            ))),
        }
    }

    /// Deletes `lv` (that exact object), so a retry can start over; a
    /// failure is only logged (the retry finds the object and says why).
    async fn discard(&self, lv: &LogicVolume) {
        let name = lv.name_any();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: lv.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.lvs.delete(&name, &params).await {
            Ok(_) => {
                tracing::info!(volume.name = %name, "removed the LogicVolume of a failed create")
            }
            Err(e) => {
                tracing::warn!(volume.name = %name, error = %e, "removing the LogicVolume of a failed create failed")
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

    /// The object for a volume id: `None` when no such volume can exist.
    async fn find(&self, volume_id: &str) -> Result<Option<LogicVolume>, CsiError> {
        let id = match VolumeId::parse(volume_id) {
            Ok(id) => id,
            Err(CsiError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        if !names::is_local_name(&id.volume) {
            return Ok(None);
        }
        let lv = self
            .lvs
            .get_opt(&id.volume)
            .await
            .map_err(|e| api_error("get LogicVolume", e))?;
        Ok(lv.filter(|lv| lv.spec.node_name == id.node))
    }
}

/// Where a new volume goes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    node: String,
    group: String,
    size_bytes: u64,
    policy: Option<String>,
}

/// Takes the volumes asked for but not made yet (no `volumeID`, no
/// failure, not being deleted) off their group's room: the published
/// capacity cannot show them yet.
fn subtract_pending(nodes: &mut [(NodeSpec, Vec<pb::GroupCapacity>)], lvs: &[LogicVolume]) {
    for lv in lvs {
        let status = lv.status.as_ref();
        let pending = lv.metadata.deletion_timestamp.is_none()
            && status.and_then(|s| s.volume_id.as_ref()).is_none()
            && status.and_then(failure).is_none();
        if !pending {
            continue;
        }
        let Some(size) = bytes(&lv.spec.size) else {
            continue;
        };
        let group = nodes
            .iter_mut()
            .filter(|(n, _)| n.name == lv.spec.node_name)
            .flat_map(|(_, groups)| groups.iter_mut())
            .find(|g| g.device_group == lv.spec.device_group);
        if let Some(g) = group {
            g.allocatable_bytes = g.allocatable_bytes.saturating_sub(size);
            g.largest_allocatable_bytes = g.largest_allocatable_bytes.min(g.allocatable_bytes);
        }
    }
}

/// The node a `WaitForFirstConsumer` request is pinned to: that of the
/// first preferred topology, else that of the only requisite one.
fn pinned_node(req: &VolumeRequest) -> Option<String> {
    let first = match (
        req.accessibility.preferred.first(),
        req.accessibility.requisite.as_slice(),
    ) {
        (Some(p), _) => p,
        (None, [only]) => only,
        _ => return None,
    };
    first.get(TOPOLOGY_KEY).cloned()
}

/// The request placement ranks: a pinned request may only go to its node.
fn ranking_request(req: &VolumeRequest) -> VolumeRequest {
    let mut r = req.clone();
    if let Some(first) = req.accessibility.preferred.first() {
        r.accessibility.requisite = vec![first.clone()];
        r.accessibility.preferred.clear();
    }
    r
}

/// A pinned node that has not published its capacity: it takes the volume
/// when the request names the group; the node checks the room.
fn unpublished_target(req: &VolumeRequest, node: String) -> Result<Target, CsiError> {
    let Some(group) = req.parameters.group.clone() else {
        return Err(CsiError::Unavailable(format!(
            "node {node} has not published its capacity (NodeStorageResource) yet, \
             and without parameters[{:?}] its group cannot be chosen",
            carina_csi::params::DISK_GROUP
        )));
    };
    Ok(Target {
        node,
        group,
        size_bytes: sizes::allocation(&req.capacity, FALLBACK_UNIT)?,
        policy: None,
    })
}

/// The current span's W3C `traceparent`, if it belongs to a trace.
fn traceparent() -> Option<String> {
    let mut headers = http::HeaderMap::new();
    carina_proto::trace::inject(&tracing::Span::current().context(), &mut headers);
    headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The object for a new volume.
fn new_object(name: &str, req: &VolumeRequest, target: &Target) -> LogicVolume {
    let mut annotations = BTreeMap::new();
    if let Some(tp) = traceparent() {
        annotations.insert(TRACEPARENT_ANNOTATION.to_string(), tp);
    }
    if req.parameters.exclusive {
        annotations.insert(EXCLUSIVE_ANNOTATION.to_string(), "true".to_string());
    }
    let other = &req.parameters.other;
    let mut lv = LogicVolume::new(
        name,
        LogicVolumeSpec {
            node_name: target.node.clone(),
            size: Quantity(target.size_bytes.to_string()),
            device_group: target.group.clone(),
            pvc: other.get(PVC_NAME_PARAMETER).cloned().unwrap_or_default(),
            name_space: other
                .get(PVC_NAMESPACE_PARAMETER)
                .cloned()
                .unwrap_or_default(),
        },
    );
    lv.metadata = ObjectMeta {
        name: Some(name.to_string()),
        finalizers: Some(vec![LOGICVOLUME_FINALIZER.to_string()]),
        annotations: (!annotations.is_empty()).then_some(annotations),
        ..ObjectMeta::default()
    };
    lv
}

#[async_trait]
impl Provisioner for KubeProvisioner {
    #[tracing::instrument(name = "kube.create_volume", skip_all, err(level = "info"), fields(volume.name = %req.name))]
    async fn create_volume(&self, req: &VolumeRequest) -> Result<ProvisionedVolume, CsiError> {
        let name = req.local_name.clone();
        let existing = self
            .lvs
            .get_opt(&name)
            .await
            .map_err(|e| api_error("get LogicVolume", e))?;
        if let Some(lv) = existing {
            if lv.metadata.deletion_timestamp.is_none() {
                return self.adopt(lv, req).await;
            }
            tracing::info!(volume.name = %name, "an earlier LogicVolume is being deleted; waiting until it is gone");
            self.wait_gone(&name, lv.uid()).await?;
        }
        let target = self.place(req).await?;
        tracing::info!(
            volume.name = %name,
            node.name = %target.node,
            volume.group = %target.group,
            volume.size = target.size_bytes,
            strategy = %self.config.strategy,
            "creating LogicVolume"
        );
        let object = new_object(&name, req, &target);
        match self.lvs.create(&PostParams::default(), &object).await {
            Ok(created) => self.outcome(created, req, target.policy).await,
            // A concurrent create (another replica, a retry) was first.
            Err(kube::Error::Api(s)) if s.is_already_exists() => {
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
                self.adopt(lv, req).await
            }
            Err(e) => Err(api_error("create LogicVolume", e)),
        }
    }

    #[tracing::instrument(name = "kube.delete_volume", skip_all, err(level = "info"), fields(volume.id = %volume_id))]
    async fn delete_volume(&self, volume_id: &str) -> Result<(), CsiError> {
        let Some(lv) = self.find(volume_id).await? else {
            tracing::info!("no such LogicVolume: nothing to delete");
            return Ok(());
        };
        let name = lv.name_any();
        if lv.metadata.deletion_timestamp.is_none() {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: lv.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match self.lvs.delete(&name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
                // The uid precondition failed: a newer object took the name.
                Err(kube::Error::Api(s)) if s.is_conflict() => return Ok(()),
                Err(e) => return Err(api_error("delete LogicVolume", e)),
            }
        }
        self.wait_gone(&name, lv.uid()).await
    }

    #[tracing::instrument(name = "kube.expand_volume", skip_all, err(level = "info"), fields(volume.id = %volume_id, volume.size = range.required_bytes))]
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
        let judge = |obj: Option<&LogicVolume>| -> Option<Result<u64, CsiError>> {
            let outcome = expand_outcome(
                obj,
                uid.as_deref(),
                range.required_bytes,
                generation,
                &before,
            )?;
            Some(match outcome {
                ExpandOutcome::Grown(size) => Ok(size),
                ExpandOutcome::Failed(error) => Err(error),
                ExpandOutcome::Gone => Err(not_found()),
            })
        };
        if let Some(done) = judge(Some(&patched)) {
            return done;
        }
        watch_until(&self.lvs, &name, self.config.wait_timeout, judge)
            .await
            .map_err(|t| {
                CsiError::DeadlineExceeded(format!(
                    "LogicVolume {name:?} not grown to {size} bytes within {:?} ({})",
                    self.config.wait_timeout,
                    t.describe()
                ))
            })?
    }

    #[tracing::instrument(name = "kube.get_volume", skip_all, err(level = "info"), fields(volume.id = %volume_id))]
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
        let policy = self
            .policy_of(&lv.spec.node_name, &lv.spec.device_group)
            .await?;
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
            })
            .map(|lv| {
                let key = (lv.spec.node_name.clone(), lv.spec.device_group.clone());
                provisioned(lv, None, policies.get(&key).map(String::as_str))
            })
            .collect();
        all.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
        Ok(all)
    }

    #[tracing::instrument(name = "kube.capacity", skip_all, err(level = "info"), fields(volume.group = group.unwrap_or_default()))]
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
    /// An object that already holds the name: returned (or waited for) if
    /// it fits `req`, `ALREADY_EXISTS` if it does not.
    async fn adopt(
        &self,
        lv: LogicVolume,
        req: &VolumeRequest,
    ) -> Result<ProvisionedVolume, CsiError> {
        let policy = self
            .policy_of(&lv.spec.node_name, &lv.spec.device_group)
            .await?;
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
        tracing::info!(volume.name = %lv.name_any(), node.name = %lv.spec.node_name, "LogicVolume exists already");
        self.outcome(lv, req, policy).await
    }
}

#[cfg(test)]
mod fixtures;

#[cfg(test)]
mod tests {
    use super::fixtures::{MIB, lv, on, request};
    use super::*;
    use carina_api::LogicVolumeStatus;
    use tonic::Code;

    #[test]
    fn pinning() {
        let mut r = request(MIB);
        assert_eq!(pinned_node(&r), None);
        r.accessibility.requisite = vec![on("a"), on("b")];
        assert_eq!(pinned_node(&r), None, "several requisite nodes: ranked");
        r.accessibility.preferred = vec![on("b"), on("a")];
        assert_eq!(pinned_node(&r).as_deref(), Some("b"));
        let ranked = ranking_request(&r);
        assert_eq!(ranked.accessibility.requisite, vec![on("b")]);
        assert!(ranked.accessibility.preferred.is_empty());
        r.accessibility.preferred.clear();
        r.accessibility.requisite = vec![on("c")];
        assert_eq!(pinned_node(&r).as_deref(), Some("c"));
        // Unpublished: only with a named group, rounded to 1 MiB.
        let e = unpublished_target(&request(MIB + 1), "c".into()).expect_err("no group");
        assert_eq!(e.code(), Code::Unavailable);
        let mut named = request(MIB + 1);
        named.parameters.group = Some("ssd".into());
        let t = unpublished_target(&named, "c".into()).expect("target");
        assert_eq!(
            (t.node.as_str(), t.group.as_str(), t.size_bytes),
            ("c", "ssd", 2 * MIB)
        );
    }

    #[test]
    fn pending_volumes_take_room() {
        let group = |name: &str, free: u64| pb::GroupCapacity {
            device_group: name.into(),
            policy: pb::Policy::Lvm as i32,
            allocatable_bytes: free,
            largest_allocatable_bytes: free,
            allocation_unit_bytes: 4 * MIB,
            ..Default::default()
        };
        let mut nodes = vec![
            (
                node_spec("a"),
                vec![group("ssd", 100 * MIB), group("hdd", 100 * MIB)],
            ),
            (node_spec("b"), vec![group("ssd", 100 * MIB)]),
        ];
        let pending = lv("a", "ssd", 40 * MIB);
        let mut made = lv("a", "ssd", 30 * MIB);
        made.status = Some(LogicVolumeStatus {
            volume_id: Some("x".into()),
            ..LogicVolumeStatus::default()
        });
        let mut failed = lv("b", "ssd", 30 * MIB);
        failed.status = Some(LogicVolumeStatus {
            code: Some(Code::ResourceExhausted as i32),
            ..LogicVolumeStatus::default()
        });
        subtract_pending(&mut nodes, &[pending.clone(), pending, made, failed]);
        assert_eq!(nodes[0].1[0].allocatable_bytes, 20 * MIB);
        assert_eq!(nodes[0].1[0].largest_allocatable_bytes, 20 * MIB);
        assert_eq!(nodes[0].1[1].allocatable_bytes, 100 * MIB);
        assert_eq!(nodes[1].1[0].allocatable_bytes, 100 * MIB);
    }

    #[test]
    fn new_objects_carry_claim_finalizer_and_exclusivity() {
        let mut r = request(10 * MIB);
        r.parameters.exclusive = true;
        r.parameters
            .other
            .insert(PVC_NAME_PARAMETER.into(), "data".into());
        r.parameters
            .other
            .insert(PVC_NAMESPACE_PARAMETER.into(), "apps".into());
        let t = Target {
            node: "a".into(),
            group: "raw".into(),
            size_bytes: 12 * MIB,
            policy: Some("RAW".into()),
        };
        let o = new_object("pvc-1", &r, &t);
        assert_eq!(o.spec.size.0, (12 * MIB).to_string());
        assert_eq!(
            (o.spec.pvc.as_str(), o.spec.name_space.as_str()),
            ("data", "apps")
        );
        assert_eq!(o.finalizers(), [LOGICVOLUME_FINALIZER.to_string()]);
        assert_eq!(o.annotations()[EXCLUSIVE_ANNOTATION], "true");
        // No OpenTelemetry layer here: no trace to carry.
        assert!(!o.annotations().contains_key(TRACEPARENT_ANNOTATION));
    }
}
