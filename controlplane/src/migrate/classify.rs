//! The plan from the listed objects: pure functions, no IO.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, PersistentVolume, Pod, PodSpec};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;

use carina_api::LogicVolume;
use carina_api::logicvolume::STATUS_FAILED;
use carina_api::quantity::quantity_bytes;
use carina_csi::legacy::{LegacyId, LegacyKind, VolumeHandle};
use carina_csi::params::Parameters;

use super::leftovers::leftovers;
use super::{
    ADOPTED_ANNOTATION, Blocker, ClassEntry, Cluster, DRIVER, GO_MANAGE_TYPE_ANNOTATION,
    GO_PROGRAMS, HandleKind, Plan, PvEntry, VolumeAction, VolumeEntry,
};

/// Classifies everything in `cluster`; entries are sorted by name (and
/// namespace) so two runs over the same objects print the same.
pub fn plan(cluster: &Cluster) -> Plan {
    let blockers = blockers(cluster);
    let pvs: HashMap<&str, &PersistentVolume> = cluster
        .persistent_volumes
        .iter()
        .filter(|pv| csi_driver(pv) == Some(DRIVER))
        .map(|pv| (pv.metadata.name.as_deref().unwrap_or_default(), pv))
        .collect();
    let mut volumes: Vec<VolumeEntry> = cluster
        .logic_volumes
        .iter()
        .map(|lv| volume(lv, pvs.get(lv.name_any().as_str()).copied()))
        .collect();
    volumes.sort_by(|a, b| a.name.cmp(&b.name));
    let lv_names: Vec<String> = cluster.logic_volumes.iter().map(|l| l.name_any()).collect();
    let mut persistent_volumes: Vec<PvEntry> = pvs
        .values()
        .map(|pv| persistent_volume(pv, lv_names.contains(&pv.name_any())))
        .collect();
    persistent_volumes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut storage_classes: Vec<ClassEntry> = cluster
        .storage_classes
        .iter()
        .filter(|c| c.provisioner == DRIVER)
        .map(storage_class)
        .collect();
    storage_classes.sort_by(|a, b| a.name.cmp(&b.name));
    Plan {
        blocking: !blockers.is_empty(),
        blockers,
        volumes,
        persistent_volumes,
        storage_classes,
        leftovers: leftovers(cluster),
    }
}

/// The Go program a container runs: the base name of its command's first
/// word, when that is one of [`GO_PROGRAMS`].
pub fn go_program(container: &Container) -> Option<&'static str> {
    let first = container.command.as_ref()?.first()?;
    let base = first.rsplit('/').next().unwrap_or(first);
    GO_PROGRAMS.iter().copied().find(|p| *p == base)
}

/// Workloads that run a Go program, and Pods running one that are not
/// finished. A workload counts while it exists, whatever its replicas: a
/// Deployment scaled to zero starts Go again when scaled up, and the chart
/// refuses to install beside it.
fn blockers(cluster: &Cluster) -> Vec<Blocker> {
    let mut out = Vec::new();
    let mut workload = |kind: &str, meta: &kube::api::ObjectMeta, spec: Option<&PodSpec>, what| {
        for c in spec.map(|s| s.containers.as_slice()).unwrap_or_default() {
            if let Some(program) = go_program(c) {
                out.push(Blocker {
                    kind: kind.to_string(),
                    namespace: meta.namespace.clone().unwrap_or_default(),
                    name: meta.name.clone().unwrap_or_default(),
                    container: c.name.clone(),
                    program: program.to_string(),
                    reason: format!("{what}; delete it before migrate apply"),
                });
            }
        }
    };
    for d in &cluster.deployments {
        let replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let spec = d.spec.as_ref().and_then(|s| s.template.spec.as_ref());
        let what = format!("Deployment of Go Carina exists (replicas {replicas})");
        workload("Deployment", &d.metadata, spec, what);
    }
    for d in &cluster.daemon_sets {
        let spec = d.spec.as_ref().and_then(|s| s.template.spec.as_ref());
        let what = "DaemonSet of Go Carina exists (runs on every node it selects)".to_string();
        workload("DaemonSet", &d.metadata, spec, what);
    }
    for s in &cluster.stateful_sets {
        let spec = s.spec.as_ref().and_then(|s| s.template.spec.as_ref());
        let what = "StatefulSet running Go Carina exists".to_string();
        workload("StatefulSet", &s.metadata, spec, what);
    }
    for p in cluster.pods.iter().filter(|p| pod_alive(p)) {
        let phase = p
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".to_string());
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| "no node yet".to_string());
        let what = format!("Pod of Go Carina is {phase} (node {node})");
        workload("Pod", &p.metadata, p.spec.as_ref(), what);
    }
    out.sort_by(|a, b| {
        (&a.namespace, &a.name, &a.kind, &a.container).cmp(&(
            &b.namespace,
            &b.name,
            &b.kind,
            &b.container,
        ))
    });
    out
}

/// A Pod that has not finished (`Succeeded` and `Failed` pods run nothing).
fn pod_alive(p: &Pod) -> bool {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed"))
}

fn csi_driver(pv: &PersistentVolume) -> Option<&str> {
    pv.spec.as_ref()?.csi.as_ref().map(|c| c.driver.as_str())
}

fn volume_handle(pv: &PersistentVolume) -> Option<&str> {
    pv.spec
        .as_ref()?
        .csi
        .as_ref()
        .map(|c| c.volume_handle.as_str())
}

fn claim_of(pv: &PersistentVolume) -> Option<String> {
    let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
    Some(format!(
        "{}/{}",
        r.namespace.as_deref().unwrap_or_default(),
        r.name.as_deref().unwrap_or_default()
    ))
}

/// The policy Go's annotation names, else what the id and the group say:
/// `host-` ids are HOST, a `<group>/<disk>` group is RAW, else LVM.
fn go_policy(lv: &LogicVolume, id: Option<&LegacyId>) -> Result<String, String> {
    let annotated = lv.annotations().get(GO_MANAGE_TYPE_ANNOTATION).cloned();
    let inferred = match id.map(|i| i.kind) {
        Some(LegacyKind::Host) => "host",
        _ if lv.spec.device_group.contains('/') => "raw",
        _ => "lvm",
    };
    match annotated {
        None => Ok(inferred.to_string()),
        Some(a) if !matches!(a.as_str(), "lvm" | "raw" | "host") => Err(format!(
            "annotation {GO_MANAGE_TYPE_ANNOTATION}={a:?} is not lvm, raw or host"
        )),
        Some(a) if id.is_some_and(|i| i.kind != LegacyKind::Thin) && a != inferred => Err(format!(
            "annotation {GO_MANAGE_TYPE_ANNOTATION}={a:?} but the id and group say {inferred}"
        )),
        Some(a) => Ok(a),
    }
}

fn volume(lv: &LogicVolume, pv: Option<&PersistentVolume>) -> VolumeEntry {
    let status = lv.status.clone().unwrap_or_default();
    let size = status.current_size.as_ref().unwrap_or(&lv.spec.size);
    let claim = pv.and_then(claim_of).or_else(|| {
        (!lv.spec.pvc.is_empty()).then(|| format!("{}/{}", lv.spec.name_space, lv.spec.pvc))
    });
    let mut entry = VolumeEntry {
        name: lv.name_any(),
        action: VolumeAction::Ours,
        policy: None,
        node: lv.spec.node_name.clone(),
        group: lv.spec.device_group.clone(),
        size_bytes: quantity_bytes(size).ok(),
        volume_id: status.volume_id.clone(),
        persistent_volume: pv.map(|p| p.name_any()),
        claim,
        reason: String::new(),
    };
    let (action, reason) = volume_fate(lv, pv, &mut entry);
    entry.action = action;
    entry.reason = reason;
    entry
}

/// What happens to `lv`; sets the entry's policy for Go volumes.
fn volume_fate(
    lv: &LogicVolume,
    pv: Option<&PersistentVolume>,
    entry: &mut VolumeEntry,
) -> (VolumeAction, String) {
    let status = lv.status.clone().unwrap_or_default();
    let id = status.volume_id.as_deref().and_then(LegacyId::parse);
    if let Some(local) = lv.annotations().get(ADOPTED_ANNOTATION) {
        entry.policy = go_policy(lv, id.as_ref()).ok();
        return (
            VolumeAction::Adopted,
            format!("taken over already (node-local name {local}); skipped"),
        );
    }
    let annotated = lv.annotations().contains_key(GO_MANAGE_TYPE_ANNOTATION);
    if id.is_none() && !annotated {
        let why = match status.volume_id.as_deref().map(VolumeHandle::parse) {
            Some(Ok(_)) | None => "made by this project; nothing to do",
            Some(Err(_)) => "not a Go volume (its id is not Go's); nothing to do",
        };
        return (VolumeAction::Ours, why.to_string());
    }
    match go_policy(lv, id.as_ref()) {
        Ok(p) => entry.policy = Some(p),
        Err(why) => return (VolumeAction::Refused, why),
    }
    if status.status.as_deref() == Some(STATUS_FAILED) {
        let msg = status.message.unwrap_or_default();
        return (
            VolumeAction::Failed,
            format!("Go's creation failed ({msg}): nothing on disk to take over; nothing done"),
        );
    }
    let Some(id) = id else {
        return (
            VolumeAction::Failed,
            "Go never recorded a volume id: nothing on disk to take over; nothing done".into(),
        );
    };
    if let Err(e) = id.refuse_thin() {
        return (VolumeAction::RefusedThin, e.to_string());
    }
    let Some(pv) = pv else {
        return (
            VolumeAction::Orphan,
            "no PersistentVolume of this name: an orphan (Go's controller deletes such \
             objects); nothing done"
                .into(),
        );
    };
    match volume_handle(pv) {
        Some(h) if h == id.encode() => {}
        other => {
            return (
                VolumeAction::Refused,
                format!(
                    "PersistentVolume {} has volumeHandle {:?}, not {:?}",
                    pv.name_any(),
                    other.unwrap_or_default(),
                    id.encode()
                ),
            );
        }
    }
    if entry.size_bytes.is_none() {
        return (
            VolumeAction::Refused,
            format!("size {:?} is not a quantity", entry_size_text(lv)),
        );
    }
    if lv.spec.node_name.is_empty() {
        return (VolumeAction::Refused, "spec.nodeName is empty".into());
    }
    (
        VolumeAction::TakeOver,
        format!(
            "migrate apply adopts {} on node {} (kept as its node-local name)",
            id.encode(),
            lv.spec.node_name
        ),
    )
}

fn entry_size_text(lv: &LogicVolume) -> String {
    lv.status
        .as_ref()
        .and_then(|s| s.current_size.as_ref())
        .unwrap_or(&lv.spec.size)
        .0
        .clone()
}

fn persistent_volume(pv: &PersistentVolume, has_lv: bool) -> PvEntry {
    let handle = volume_handle(pv).unwrap_or_default().to_string();
    let kind = match VolumeHandle::parse(&handle) {
        Ok(VolumeHandle::Ours(_)) => HandleKind::Ours,
        Ok(VolumeHandle::Go(id)) if id.kind == LegacyKind::Thin => HandleKind::GoThin,
        Ok(VolumeHandle::Go(_)) => HandleKind::Go,
        Err(_) => HandleKind::Unknown,
    };
    let reason = match (kind, has_lv) {
        (HandleKind::Ours, _) => "made by this project; nothing to do",
        (HandleKind::Go, true) => "served under its Go id once its LogicVolume is taken over",
        (HandleKind::Go, false) => {
            "no LogicVolume of this name: nothing says which group holds it; not taken over"
        }
        (HandleKind::GoThin, _) => "a Go thin-pool volume: refused, copy its data to a new claim",
        (HandleKind::Unknown, _) => "its volumeHandle is neither ours nor Go's; nothing done",
    };
    PvEntry {
        name: pv.name_any(),
        volume_handle: handle,
        handle: kind,
        claim: claim_of(pv),
        storage_class: pv.spec.as_ref().and_then(|s| s.storage_class_name.clone()),
        logic_volume: has_lv,
        reason: reason.to_string(),
    }
}

fn storage_class(class: &StorageClass) -> ClassEntry {
    let raw: HashMap<String, String> = class
        .parameters
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    match Parameters::parse(&raw) {
        Ok(p) => ClassEntry {
            name: class.name_any(),
            accepted: true,
            reason: "accepted as it is".to_string(),
            deprecated: p.deprecated.iter().map(|d| d.to_string()).collect(),
        },
        Err(e) => ClassEntry {
            name: class.name_any(),
            accepted: false,
            reason: format!(
                "refused: {e}; StorageClasses are immutable: recreate it under a new name"
            ),
            deprecated: Vec::new(),
        },
    }
}
