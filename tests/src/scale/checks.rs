//! What must hold after each phase of the churn; no timing is judged.
//!
//! After the creates ([`after_creates`]): every volume answered on a node
//! serving its group's kind; exactly one `LogicVolume` per volume, made
//! (`status.volumeID`), on that node, with the finalizer; every node's
//! own list (`ListLVs` over mTLS) is exactly the `LogicVolume`s on it,
//! and their sizes add up to no more than the node's first allocatable
//! figure; every capacity record converges to the node's count and to
//! its first allocatable less those sizes.
//!
//! After the deletes ([`after_deletes`]): no `LogicVolume` (so no
//! finalizer) is left, no node lists a volume, no LV is left in an LVM
//! node's volume group and no directory or marker under a HOST node's
//! root, and every record is back to its first figures.

use std::collections::{BTreeSet, HashMap};

use anyhow::{Context, Result, bail, ensure};
use carina_api::{LOGICVOLUME_FINALIZER, LogicVolume};
use carina_node::engine::host::MARKER_DIR;
use carina_proto::nodestorage as pb;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::churn::{CreatePhase, Planned};
use super::observe::{Figures, NsrRecorder};
use super::{ScaleCluster, ScaleNode, Storage, WAIT};
use crate::lvm;

/// The node's own volumes: name and bytes.
async fn listed(cluster: &ScaleCluster, node: &ScaleNode) -> Result<Vec<(String, u64)>> {
    let mut client = cluster
        .pki()
        .node_client(node.name(), &node.args.endpoint())
        .await?;
    let mut volumes = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_l_vs(pb::ListLVsRequest {
                device_group: cluster.group(node.is_lvm()).to_string(),
                page_size: 0,
                page_token,
            })
            .await
            .with_context(|| format!("ListLVs on {}", node.name()))?
            .into_inner();
        volumes.extend(page.volumes.into_iter().map(|v| (v.name, v.size_bytes)));
        if page.next_page_token.is_empty() {
            return Ok(volumes);
        }
        page_token = page.next_page_token;
    }
}

pub async fn after_creates(
    cluster: &ScaleCluster,
    planned: &[Planned],
    phase: &CreatePhase,
    initial: &HashMap<String, Figures>,
    recorder: &NsrRecorder,
) -> Result<()> {
    ensure!(
        phase.created.len() == planned.len(),
        "{} of {} volumes created",
        phase.created.len(),
        planned.len()
    );
    for (c, p) in phase.created.iter().zip(planned) {
        ensure!(
            c.index == p.index,
            "volume {} answered as {}",
            p.index,
            c.index
        );
        let node = cluster
            .node(&c.node)
            .with_context(|| format!("volume {} on unknown node {:?}", p.csi_name, c.node))?;
        ensure!(
            node.is_lvm() == p.lvm,
            "volume {} (lvm: {}) on node {} (lvm: {})",
            p.csi_name,
            p.lvm,
            c.node,
            node.is_lvm()
        );
    }

    let lvs: Api<LogicVolume> = Api::all(cluster.client());
    let objects = lvs.list(&ListParams::default()).await?.items;
    ensure!(
        objects.len() == phase.created.len(),
        "{} LogicVolumes for {} volumes",
        objects.len(),
        phase.created.len()
    );
    let by_id: HashMap<&str, &LogicVolume> = objects
        .iter()
        .filter_map(|lv| Some((lv.status.as_ref()?.volume_id.as_deref()?, lv)))
        .collect();
    let mut on_node: HashMap<&str, BTreeSet<String>> = HashMap::new();
    for c in &phase.created {
        let lv = by_id
            .get(c.volume_id.as_str())
            .with_context(|| format!("no LogicVolume made with volume id {}", c.volume_id))?;
        ensure!(
            lv.spec.node_name == c.node,
            "LogicVolume {} on {}, CreateVolume answered {}",
            lv.name_any(),
            lv.spec.node_name,
            c.node
        );
        ensure!(
            lv.finalizers().iter().any(|f| f == LOGICVOLUME_FINALIZER),
            "LogicVolume {} has no finalizer: {:?}",
            lv.name_any(),
            lv.finalizers()
        );
        on_node
            .entry(c.node.as_str())
            .or_default()
            .insert(lv.name_any());
    }

    let mut expected: HashMap<String, Figures> = HashMap::new();
    for node in cluster.nodes() {
        let volumes = listed(cluster, node).await?;
        let names: BTreeSet<String> = volumes.iter().map(|(n, _)| n.clone()).collect();
        let wanted = on_node.remove(node.name()).unwrap_or_default();
        ensure!(
            names == wanted,
            "node {} lists {names:?}, its LogicVolumes are {wanted:?}",
            node.name()
        );
        let used: u64 = volumes.iter().map(|(_, b)| b).sum();
        let first = initial
            .get(node.name())
            .with_context(|| format!("no first record of {}", node.name()))?;
        ensure!(
            used <= first.allocatable_bytes,
            "node {} holds {used} bytes of volumes, but had {} allocatable",
            node.name(),
            first.allocatable_bytes
        );
        expected.insert(
            node.name().to_string(),
            Figures {
                volume_count: u32::try_from(volumes.len())?,
                allocatable_bytes: first.allocatable_bytes - used,
            },
        );
    }
    converge(recorder, "showing every volume", &expected).await
}

pub async fn after_deletes(
    cluster: &ScaleCluster,
    initial: &HashMap<String, Figures>,
    recorder: &NsrRecorder,
) -> Result<()> {
    let lvs: Api<LogicVolume> = Api::all(cluster.client());
    let left = lvs.list(&ListParams::default()).await?.items;
    if !left.is_empty() {
        let names: Vec<(String, Vec<String>)> = left
            .iter()
            .map(|lv| (lv.name_any(), lv.finalizers().to_vec()))
            .collect();
        bail!(
            "{} LogicVolumes left (name, finalizers): {names:?}",
            left.len()
        );
    }
    for node in cluster.nodes() {
        let volumes = listed(cluster, node).await?;
        ensure!(
            volumes.is_empty(),
            "node {} still lists {volumes:?}",
            node.name()
        );
        match &node.storage {
            Storage::Lvm { disk, .. } => {
                let out = lvm(
                    &[&disk.dev()],
                    &["lvs", "--noheadings", "-o", "lv_name", &cluster.lvm_group],
                )?;
                ensure!(
                    out.trim().is_empty(),
                    "node {}: LVs left in {}: {out}",
                    node.name(),
                    cluster.lvm_group
                );
            }
            Storage::Host { root, .. } => {
                let mut left = Vec::new();
                for entry in std::fs::read_dir(root)? {
                    let entry = entry?;
                    if entry.file_name() == MARKER_DIR {
                        for marker in std::fs::read_dir(entry.path())? {
                            left.push(marker?.path());
                        }
                    } else {
                        left.push(entry.path());
                    }
                }
                ensure!(left.is_empty(), "node {}: left {left:?}", node.name());
            }
        }
    }
    converge(recorder, "back to their first figures", initial).await
}

/// Waits until every node's record shows `expected`.
async fn converge(
    recorder: &NsrRecorder,
    what: &str,
    expected: &HashMap<String, Figures>,
) -> Result<()> {
    recorder
        .wait_for(what, WAIT, |r| {
            expected.iter().all(|(n, f)| r.latest.get(n) == Some(f))
        })
        .await?;
    Ok(())
}
