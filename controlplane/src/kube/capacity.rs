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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use carina_proto::code_name;
use carina_proto::nodestorage as pb;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::endpoints::{EndpointError, NodeEndpoint, Nodes, node_endpoint, stopped};
use super::retry::Backoff;
use super::status::{condition, now, truncate};
use crate::nodes::pool::NodeClients;
use carina_api::{
    DeviceGroupCapacity, Disk, NodeStorageResource, NodeStorageResourceStatus, VgGroup,
    capacity_key,
};

/// Field manager of the capacity publisher's writes.
pub const FIELD_MANAGER: &str = "carina-capacity";

/// Condition: the record reflects a live stream from the node.
pub const READY: &str = "Ready";

/// Condition: the node cannot be reached; the figures are the last known.
pub const STALE: &str = "Stale";
/// Condition type: a device group took no disk (its selector matched none
/// the node could use).
pub const NO_DISKS: &str = "NoDisks";
/// The API server's limit on a condition's message.
const CONDITION_MESSAGE_MAX: usize = 32 * 1024;

const GIB: u64 = 1 << 30;

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

/// Streams one node's capacity into its record, reconnecting for ever.
async fn watch_node(shared: Arc<Shared>, node: String, target: Target) {
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

/// A node's `NodeStorageResource` as this publisher last wrote it.
struct Record {
    shared: Arc<Shared>,
    node: String,
    node_uid: Option<String>,
    /// The object exists (created or seen by this watch).
    exists: bool,
    generation: Option<i64>,
    status: Option<NodeStorageResourceStatus>,
    disks: Option<Vec<pb::Disk>>,
    /// The stale mark last written, to write each one once.
    stale: Option<(String, String)>,
}

impl Record {
    fn new(shared: Arc<Shared>, node: String, node_uid: Option<String>) -> Self {
        Record {
            shared,
            node,
            node_uid,
            exists: false,
            generation: None,
            status: None,
            disks: None,
            stale: None,
        }
    }

    fn params() -> PatchParams {
        PatchParams::apply(FIELD_MANAGER).force()
    }

    /// Creates the object if missing (spec and the Node as owner).
    async fn ensure(&mut self) -> Result<(), kube::Error> {
        let mut metadata = serde_json::json!({ "name": self.node });
        if let Some(uid) = &self.node_uid {
            metadata["ownerReferences"] = serde_json::json!([{
                "apiVersion": Node::api_version(&()),
                "kind": Node::kind(&()),
                "name": self.node,
                "uid": uid,
            }]);
        }
        let object = serde_json::json!({
            "apiVersion": NodeStorageResource::api_version(&()),
            "kind": NodeStorageResource::kind(&()),
            "metadata": metadata,
            "spec": { "nodeName": self.node },
        });
        let nsr = self
            .shared
            .api
            .patch(&self.node, &Self::params(), &Patch::Apply(&object))
            .await?;
        self.exists = true;
        self.generation = nsr.metadata.generation;
        if self.status.is_none() {
            self.status = nsr.status;
        }
        Ok(())
    }

    async fn apply_status(
        &mut self,
        status: &NodeStorageResourceStatus,
    ) -> Result<(), kube::Error> {
        let patch = serde_json::json!({
            "apiVersion": NodeStorageResource::api_version(&()),
            "kind": NodeStorageResource::kind(&()),
            "status": status,
        });
        match self
            .shared
            .api
            .patch_status(&self.node, &Self::params(), &Patch::Apply(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                if matches!(&e, kube::Error::Api(s) if s.code == 404) {
                    self.exists = false;
                }
                Err(e)
            }
        }
    }

    /// Writes one report of the node.
    async fn publish(&mut self, endpoint: &NodeEndpoint, update: pb::CapacityResponse) {
        let rescanned = !matches!(
            update.reason(),
            pb::ChangeReason::Create | pb::ChangeReason::Resize | pb::ChangeReason::Delete
        );
        if rescanned || self.disks.is_none() {
            match self
                .shared
                .clients
                .call(endpoint, "ListDisks", |mut c| async move {
                    c.list_disks(pb::ListDisksRequest {}).await
                })
                .await
            {
                Ok(r) => self.disks = Some(r.disks),
                Err(e) => {
                    tracing::warn!(k8s.node.name = %self.node, error = %e, "ListDisks failed; keeping the last disk list")
                }
            }
        }
        if !self.exists
            && let Err(e) = self.ensure().await
        {
            tracing::warn!(k8s.node.name = %self.node, error = %e, "creating the NodeStorageResource failed");
            return;
        }
        let previous = self
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let status = report_status(
            &update,
            self.disks.as_deref().unwrap_or_default(),
            &previous,
            self.generation,
        );
        match self.apply_status(&status).await {
            Ok(()) => {
                tracing::debug!(k8s.node.name = %self.node, generation = update.generation, "capacity published");
                self.status = Some(status);
                self.stale = None;
            }
            Err(e) => {
                tracing::warn!(k8s.node.name = %self.node, error = %e, "writing the NodeStorageResource status failed")
            }
        }
    }

    /// Marks the record stale, keeping its figures. A node without a
    /// record keeps having none.
    async fn mark_stale(&mut self, reason: &str, message: &str) {
        let mark = (reason.to_string(), message.to_string());
        if self.stale.as_ref() == Some(&mark) {
            return;
        }
        let base = match &self.status {
            Some(s) => s.clone(),
            None => match self.shared.api.get_opt(&self.node).await {
                Ok(Some(nsr)) => {
                    self.exists = true;
                    self.generation = nsr.metadata.generation;
                    nsr.status.unwrap_or_default()
                }
                Ok(None) => {
                    self.stale = Some(mark);
                    return;
                }
                Err(e) => {
                    tracing::warn!(k8s.node.name = %self.node, error = %e, "reading the NodeStorageResource failed");
                    return;
                }
            },
        };
        let status = stale_status(base, reason, message, self.generation);
        match self.apply_status(&status).await {
            Ok(()) => {
                tracing::warn!(k8s.node.name = %self.node, reason, message, "node unreachable: capacity marked stale");
                self.status = Some(status);
                self.stale = Some(mark);
            }
            Err(kube::Error::Api(s)) if s.code == 404 => self.stale = Some(mark),
            Err(e) => {
                tracing::warn!(k8s.node.name = %self.node, error = %e, "marking the NodeStorageResource stale failed")
            }
        }
    }
}

fn quota_name(q: pb::QuotaMode) -> Option<String> {
    match q {
        pb::QuotaMode::ProjectQuota => Some("project".into()),
        pb::QuotaMode::AccountingOnly => Some("none".into()),
        pb::QuotaMode::NotApplicable | pb::QuotaMode::Unspecified => None,
    }
}

fn gib(bytes: u64) -> Quantity {
    Quantity((bytes / GIB).to_string())
}

/// The status a report of the node makes (pure).
fn report_status(
    update: &pb::CapacityResponse,
    disks: &[pb::Disk],
    previous: &[Condition],
    generation: Option<i64>,
) -> NodeStorageResourceStatus {
    let mut capacity = BTreeMap::new();
    let mut allocatable = BTreeMap::new();
    let mut groups = Vec::with_capacity(update.groups.len());
    let mut vg_groups = Vec::new();
    let mut raw_groups = HashSet::new();
    for g in &update.groups {
        capacity.insert(capacity_key(&g.device_group), gib(g.total_bytes));
        allocatable.insert(capacity_key(&g.device_group), gib(g.allocatable_bytes));
        groups.push(DeviceGroupCapacity {
            name: g.device_group.clone(),
            policy: crate::policy::name(g.policy()).to_string(),
            total_bytes: g.total_bytes,
            free_bytes: g.free_bytes,
            reserve_bytes: g.reserve_bytes,
            allocatable_bytes: g.allocatable_bytes,
            largest_allocatable_bytes: g.largest_allocatable_bytes,
            allocation_unit_bytes: g.allocation_unit_bytes,
            volume_count: g.volume_count,
            quota: quota_name(g.quota()),
            disks: g.disks.clone(),
            no_disks: (!g.no_disks.is_empty()).then(|| g.no_disks.clone()),
        });
        match g.policy() {
            pb::Policy::Lvm => vg_groups.push(VgGroup {
                vg_name: g.device_group.clone(),
                pv_count: g.disks.len() as u64,
                lv_count: u64::from(g.volume_count),
                vg_attr: String::new(),
                vg_size: g.total_bytes,
                vg_free: g.free_bytes,
                pvs: Vec::new(),
            }),
            pb::Policy::Raw => {
                raw_groups.insert(g.device_group.as_str());
            }
            _ => {}
        }
    }
    let disks = disks
        .iter()
        .filter(|d| raw_groups.contains(d.device_group.as_str()))
        .map(|d| Disk {
            name: d.name.clone(),
            path: d.path.clone(),
            size: d.size_bytes,
            sector_size: None,
            read_only: d.read_only,
            device_group: d.device_group.clone(),
        })
        .collect();
    let message = format!(
        "node generation {}, {} device groups",
        update.generation,
        update.groups.len()
    );
    NodeStorageResourceStatus {
        sync_time: Some(now()),
        capacity,
        allocatable,
        groups,
        node_generation: Some(update.generation),
        node_incarnation: Some(update.incarnation.clone()).filter(|i| !i.is_empty()),
        vg_groups,
        disks,
        conditions: vec![
            condition(previous, READY, true, "Reporting", &message, generation),
            condition(previous, STALE, false, "Reporting", &message, generation),
            no_disks_condition(update, previous, generation),
        ],
        observed_generation: generation,
    }
}

/// `NoDisks`: True while an LVM or RAW group took no disk at the node's
/// last scan, with the node's explanation of each (pure).
fn no_disks_condition(
    update: &pb::CapacityResponse,
    previous: &[Condition],
    generation: Option<i64>,
) -> Condition {
    let empty: Vec<&str> = update
        .groups
        .iter()
        .filter(|g| !g.no_disks.is_empty())
        .map(|g| g.no_disks.as_str())
        .collect();
    if empty.is_empty() {
        let message = "every LVM and RAW group has disks";
        return condition(
            previous,
            NO_DISKS,
            false,
            "GroupsHaveDisks",
            message,
            generation,
        );
    }
    let message = truncate(&empty.join("; "), CONDITION_MESSAGE_MAX);
    condition(
        previous,
        NO_DISKS,
        true,
        "SelectorMatchedNothing",
        &message,
        generation,
    )
}

/// `base` with the conditions of an unreachable node (pure).
fn stale_status(
    mut base: NodeStorageResourceStatus,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> NodeStorageResourceStatus {
    let previous = std::mem::take(&mut base.conditions);
    let mut conditions: Vec<Condition> = previous
        .iter()
        .filter(|c| c.type_ != READY && c.type_ != STALE)
        .cloned()
        .collect();
    conditions.push(condition(
        &previous, READY, false, reason, message, generation,
    ));
    conditions.push(condition(
        &previous, STALE, true, reason, message, generation,
    ));
    NodeStorageResourceStatus {
        conditions,
        observed_generation: generation.or(base.observed_generation),
        ..base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, policy: pb::Policy, total: u64, allocatable: u64) -> pb::GroupCapacity {
        pb::GroupCapacity {
            device_group: name.into(),
            policy: policy as i32,
            total_bytes: total,
            free_bytes: allocatable + GIB,
            reserve_bytes: GIB,
            allocatable_bytes: allocatable,
            largest_allocatable_bytes: allocatable,
            allocation_unit_bytes: 4 << 20,
            volume_count: 2,
            quota: pb::QuotaMode::NotApplicable as i32,
            disks: vec!["/dev/loop3".into()],
            no_disks: String::new(),
        }
    }

    fn cond<'a>(s: &'a NodeStorageResourceStatus, type_: &str) -> &'a Condition {
        s.conditions
            .iter()
            .find(|c| c.type_ == type_)
            .expect("condition")
    }

    #[test]
    fn a_report_in_carina_shape_and_exact_bytes() {
        let update = pb::CapacityResponse {
            node_name: "n".into(),
            groups: vec![
                group("ssd", pb::Policy::Lvm, 100 * GIB + 5, 90 * GIB + (GIB - 1)),
                group("raw", pb::Policy::Raw, 8 * GIB, 8 * GIB),
            ],
            generation: 42,
            reason: pb::ChangeReason::Create as i32,
            incarnation: "i-1".into(),
        };
        let disks = [
            pb::Disk {
                name: "sdb".into(),
                path: "/dev/sdb".into(),
                size_bytes: 8 * GIB,
                device_group: "raw".into(),
                ..pb::Disk::default()
            },
            pb::Disk {
                name: "sdc".into(),
                path: "/dev/sdc".into(),
                size_bytes: GIB,
                ..pb::Disk::default()
            },
        ];
        let s = report_status(&update, &disks, &[], Some(1));
        assert_eq!(s.capacity["carina.storage.io/ssd"].0, "100");
        assert_eq!(s.allocatable["carina.storage.io/ssd"].0, "90");
        assert_eq!(s.allocatable["carina.storage.io/raw"].0, "8");
        assert_eq!(s.groups[0].allocatable_bytes, 90 * GIB + (GIB - 1));
        assert_eq!(s.groups[0].policy, "LVM");
        assert_eq!(s.node_generation, Some(42));
        assert_eq!(s.node_incarnation.as_deref(), Some("i-1"));
        assert_eq!(s.vg_groups.len(), 1);
        assert_eq!(
            (s.vg_groups[0].vg_name.as_str(), s.vg_groups[0].lv_count),
            ("ssd", 2)
        );
        assert_eq!(s.disks.len(), 1);
        assert_eq!(
            (s.disks[0].name.as_str(), s.disks[0].device_group.as_str()),
            ("sdb", "raw")
        );
        assert_eq!(cond(&s, READY).status, "True");
        assert_eq!(cond(&s, STALE).status, "False");
        assert!(s.sync_time.is_some());
    }

    #[test]
    fn stale_keeps_the_figures() {
        let update = pb::CapacityResponse {
            groups: vec![group("ssd", pb::Policy::Lvm, 10 * GIB, 5 * GIB)],
            generation: 7,
            ..pb::CapacityResponse::default()
        };
        let live = report_status(&update, &[], &[], Some(1));
        let stale = stale_status(live.clone(), "UNAVAILABLE", "connection refused", Some(1));
        assert_eq!(stale.groups, live.groups);
        assert_eq!(stale.capacity, live.capacity);
        assert_eq!(stale.sync_time, live.sync_time);
        let (ready, marked) = (cond(&stale, READY), cond(&stale, STALE));
        assert_eq!(
            (ready.status.as_str(), marked.status.as_str()),
            ("False", "True")
        );
        assert_eq!(marked.reason, "UNAVAILABLE");
        assert_eq!(marked.message, "connection refused");
        // NoDisks is the node's last word and stays.
        assert_eq!(stale.conditions.len(), 3);
        assert_eq!(cond(&stale, NO_DISKS).status, "False");
    }

    #[test]
    fn a_group_without_disks_sets_no_disks() {
        let mut empty = group("typo", pb::Policy::Lvm, 0, 0);
        empty.disks.clear();
        empty.no_disks = "group \"typo\" took no disk: patterns [^/dev/sdx$]".into();
        let update = pb::CapacityResponse {
            groups: vec![group("ssd", pb::Policy::Lvm, 10 * GIB, 5 * GIB), empty],
            generation: 3,
            ..pb::CapacityResponse::default()
        };
        let s = report_status(&update, &[], &[], Some(1));
        let c = cond(&s, NO_DISKS);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "SelectorMatchedNothing")
        );
        assert!(c.message.contains("^/dev/sdx$"), "{}", c.message);
        assert_eq!(s.groups[0].no_disks, None);
        assert!(
            s.groups[1]
                .no_disks
                .as_deref()
                .is_some_and(|m| m.contains("typo"))
        );
        // Disks found again: False.
        let update = pb::CapacityResponse {
            groups: vec![group("ssd", pb::Policy::Lvm, 10 * GIB, 5 * GIB)],
            ..pb::CapacityResponse::default()
        };
        let s = report_status(&update, &[], &s.conditions, Some(2));
        assert_eq!(cond(&s, NO_DISKS).status, "False");
    }
}
