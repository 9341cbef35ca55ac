//! `carinactl migrate apply`: takes over every Go volume the plan marks
//! `take-over`. For each, in order: the volume's node adopts it
//! (`AdoptLV`, reached as the bridge reaches nodes: the Node object's
//! endpoint annotation, else its InternalIP and the node port, over mTLS
//! with the control-plane identity), then the `LogicVolume` gets the
//! adopted-volume annotation and the finalizer (Go's finalizer has the
//! same name as ours, so one Go wrote is kept as it is).
//!
//! Refused while a Go program runs. Idempotent and resumable: `AdoptLV` of
//! an adopted volume returns it, so a run interrupted between the node
//! call and the annotation finishes on the next run; a volume already
//! annotated is skipped and says so. One volume's failure does not stop
//! the others; it is reported, and the run fails at its end.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use serde_json::json;

use carina_api::{LOGICVOLUME_FINALIZER, LogicVolume};
use carina_csi::CsiError;
use carina_proto::nodestorage as pb;

use super::{ADOPTED_ANNOTATION, Cluster, MigrateError, Plan, VolumeAction, VolumeEntry, plan};
use crate::kube::endpoints::node_endpoint;
use crate::nodes::pool::NodeClients;

/// What `apply` did to one volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApplyOutcome {
    /// The node adopted it and the object is annotated now.
    Adopted,
    /// Taken over by an earlier run: nothing done.
    AlreadyAdopted,
    /// Not a volume to take over (ours, refused, orphan, failed).
    Skipped,
    /// The node call or the annotation failed; a re-run tries again.
    Error,
}

/// One volume's line of the apply report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApplyEntry {
    pub name: String,
    pub outcome: ApplyOutcome,
    pub node: String,
    pub volume_id: Option<String>,
    pub detail: String,
}

/// What `apply` did, volume by volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ApplyReport {
    pub volumes: Vec<ApplyEntry>,
    /// How many volumes failed (a re-run tries them again).
    pub errors: usize,
}

/// Why `apply` did not run, or what stopped it.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Read(#[from] MigrateError),
    /// A Go program runs: it would delete what is taken over.
    #[error(
        "Go Carina still runs ({0}): remove it first (carinactl migrate plan lists what blocks)"
    )]
    Blocked(String),
}

/// How `apply` reaches nodes.
#[derive(Debug)]
pub struct NodeAccess {
    pub clients: NodeClients,
    /// The NodeStorage port of a Node without the endpoint annotation.
    pub port: u16,
}

/// Takes over every `take-over` volume of the cluster's plan.
#[tracing::instrument(skip_all, err)]
pub async fn apply(client: &Client, nodes: &NodeAccess) -> Result<ApplyReport, ApplyError> {
    let cluster = Cluster::read(client).await?;
    let plan: Plan = plan(&cluster);
    if plan.blocking {
        let names: Vec<String> = plan
            .blockers
            .iter()
            .map(|b| format!("{} {}/{}", b.kind, b.namespace, b.name))
            .collect();
        return Err(ApplyError::Blocked(names.join(", ")));
    }
    let mut volumes = Vec::new();
    for entry in &plan.volumes {
        let (outcome, detail) = match entry.action {
            VolumeAction::TakeOver => match take_over(client, nodes, entry).await {
                Ok(local) => (
                    ApplyOutcome::Adopted,
                    format!("adopted on node {} as {local}", entry.node),
                ),
                Err(e) => (ApplyOutcome::Error, e),
            },
            VolumeAction::Adopted => (ApplyOutcome::AlreadyAdopted, entry.reason.clone()),
            _ => (ApplyOutcome::Skipped, entry.reason.clone()),
        };
        volumes.push(ApplyEntry {
            name: entry.name.clone(),
            outcome,
            node: entry.node.clone(),
            volume_id: entry.volume_id.clone(),
            detail,
        });
    }
    let errors = volumes
        .iter()
        .filter(|v| v.outcome == ApplyOutcome::Error)
        .count();
    Ok(ApplyReport { volumes, errors })
}

/// The wire policy of Go's manage type.
fn go_policy(name: Option<&str>) -> pb::Policy {
    match name {
        Some("lvm") => pb::Policy::Lvm,
        Some("raw") => pb::Policy::Raw,
        Some("host") => pb::Policy::Host,
        _ => pb::Policy::Unspecified,
    }
}

/// Adopts one volume on its node, then annotates its object; the
/// node-local name, or why not (one line).
#[tracing::instrument(skip(client, nodes, entry), err, fields(volume.name = %entry.name, node.name = %entry.node))]
async fn take_over(
    client: &Client,
    nodes: &NodeAccess,
    entry: &VolumeEntry,
) -> Result<String, String> {
    let id = entry.volume_id.clone().unwrap_or_default();
    let node: Node = Api::<Node>::all(client.clone())
        .get(&entry.node)
        .await
        .map_err(|e| format!("read Node {}: {e}", entry.node))?;
    let address = node_endpoint(&node, nodes.port).map_err(|e| e.to_string())?;
    let request = pb::AdoptLvRequest {
        name: id.clone(),
        device_group: entry.group.clone(),
        policy: go_policy(entry.policy.as_deref()) as i32,
        size_bytes: entry.size_bytes.unwrap_or_default(),
    };
    let adopted = nodes
        .clients
        .call(&address, "AdoptLV", |mut c| async move {
            c.adopt_lv(request).await
        })
        .await
        .map_err(|e: CsiError| e.to_string())?;
    let local = adopted
        .volume
        .map(|v| v.name)
        .filter(|n| !n.is_empty())
        .unwrap_or(id);
    annotate(client, &entry.name, &local).await?;
    Ok(local)
}

/// Writes the adopted-volume annotation, and the finalizer if Go's was
/// removed, with the object's resourceVersion as a precondition (a
/// concurrent change fails the patch; a re-run reads it again).
async fn annotate(client: &Client, name: &str, local: &str) -> Result<(), String> {
    let api: Api<LogicVolume> = Api::all(client.clone());
    let lv = api
        .get(name)
        .await
        .map_err(|e| format!("read LogicVolume {name}: {e}"))?;
    let mut finalizers = lv.finalizers().to_vec();
    if !finalizers.iter().any(|f| f == LOGICVOLUME_FINALIZER) {
        finalizers.push(LOGICVOLUME_FINALIZER.to_string());
    }
    let patch = json!({"metadata": {
        "resourceVersion": lv.resource_version(),
        "annotations": {ADOPTED_ANNOTATION: local},
        "finalizers": finalizers,
    }});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| format!("annotate LogicVolume {name}: {e}"))?;
    Ok(())
}
