//! The kube tier's pod-migration rig: Leases renewed as kubelets would
//! (stopped per node to kill it), the workloads that opt in or not (plain
//! pods, StatefulSets, Deployments of pause pods tolerating an unreachable
//! node), and waits by watch for the pods, claims and Events a migration
//! makes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use carina_csi::params::POD_MIGRATION;
use futures::TryStreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::await_condition;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::workload::WAIT;

/// Renews the Lease of each node in `kube-node-lease` every second while
/// its flag is up, as its kubelet would; stops on drop.
#[derive(Debug)]
pub struct Heartbeats {
    alive: BTreeMap<String, Arc<AtomicBool>>,
    task: JoinHandle<()>,
}

impl Heartbeats {
    pub fn start(client: Client, nodes: &[&str]) -> Heartbeats {
        let alive: BTreeMap<String, Arc<AtomicBool>> = nodes
            .iter()
            .map(|n| (n.to_string(), Arc::new(AtomicBool::new(true))))
            .collect();
        let flags = alive.clone();
        let task = tokio::spawn(async move {
            let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
            loop {
                for (node, up) in &flags {
                    if !up.load(Ordering::Relaxed) {
                        continue;
                    }
                    let lease = json!({
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": node},
                        "spec": {
                            "holderIdentity": node,
                            "leaseDurationSeconds": 40,
                            "renewTime": MicroTime(Timestamp::now()),
                        },
                    });
                    if let Err(e) = leases
                        .patch(
                            node,
                            &PatchParams::apply("carina-tests-kubelet").force(),
                            &Patch::Apply(lease),
                        )
                        .await
                    {
                        eprintln!("renewing the Lease of {node}: {e}");
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        Heartbeats { alive, task }
    }

    pub fn stop(&self, node: &str) {
        if let Some(up) = self.alive.get(node) {
            up.store(false, Ordering::Relaxed);
        }
    }
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The opt-in annotations of a pod.
pub fn opt_in(migrate: bool) -> serde_json::Value {
    if migrate {
        json!({POD_MIGRATION: "true"})
    } else {
        json!({})
    }
}

/// Tolerating an unreachable node for an hour, so only Carina moves a pod.
pub fn tolerations() -> serde_json::Value {
    let toleration = |key: &str| json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 3600});
    json!([
        toleration("node.kubernetes.io/unreachable"),
        toleration("node.kubernetes.io/not-ready"),
    ])
}

/// The spec of a pause pod tolerating an unreachable node, its volume
/// `data` at `/data`: the claim `claim`, or (`None`) a StatefulSet's claim
/// template of that name.
fn pause_spec(claim: Option<&str>) -> serde_json::Value {
    let mut spec = json!({
        "containers": [{
            "name": "app",
            "image": "registry.k8s.io/pause:3.10",
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        }],
        "tolerations": tolerations(),
    });
    if let Some(claim) = claim {
        spec["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
    }
    spec
}

/// A plain pause pod `name` mounting the claim `claim`; `migrate` adds the
/// opt-in.
pub fn plain_pod(ns: &str, name: &str, migrate: bool, claim: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "annotations": opt_in(migrate)},
        "spec": pause_spec(Some(claim)),
    }))?)
}

/// A StatefulSet `name` of one pause pod with a 64 MiB claim `data` of
/// `class`; `migrate` adds the opt-in.
pub fn stateful_set(ns: &str, name: &str, migrate: bool, class: &str) -> Result<StatefulSet> {
    let annotations = opt_in(migrate);
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations},
                "spec": pause_spec(None),
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": class,
                    "resources": {"requests": {"storage": "64Mi"}},
                },
            }],
        },
    }))?)
}

/// A Deployment `name` of one pause pod mounting the claim `claim`, with
/// the opt-in.
pub fn deployment(ns: &str, name: &str, claim: &str) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": opt_in(true)},
                "spec": pause_spec(Some(claim)),
            },
        },
    }))?)
}

/// Waits, by watch, until a pod labelled `app=<app>` other than `old_uid`
/// is bound to a node and not being deleted; returns it.
pub async fn pod_of_app_on_a_node(pods: &Api<Pod>, app: &str, old_uid: &str) -> Result<Pod> {
    let config = watcher::Config::default().labels(&format!("app={app}"));
    let stream = watcher(pods.clone(), config).applied_objects();
    let mut stream = std::pin::pin!(stream);
    tokio::time::timeout(WAIT, async {
        while let Some(p) = stream.try_next().await? {
            if uid(&p) != old_uid
                && p.metadata.deletion_timestamp.is_none()
                && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
            {
                return Ok(p);
            }
        }
        bail!("pod stream ended")
    })
    .await
    .with_context(|| format!("no new pod of app {app} on a node within {WAIT:?}"))?
}

/// Waits, by watch, until claim `name` is one other than `old_uid` and
/// bound; returns it.
pub async fn new_bound_claim(
    claims: &Api<PersistentVolumeClaim>,
    name: &str,
    old_uid: &str,
) -> Result<PersistentVolumeClaim> {
    let old = old_uid.to_string();
    tokio::time::timeout(
        WAIT,
        await_condition(
            claims.clone(),
            name,
            move |c: Option<&PersistentVolumeClaim>| {
                c.is_some_and(|c| {
                    uid(c) != old
                        && c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                })
            },
        ),
    )
    .await
    .with_context(|| format!("claim {name} not made again and bound within {WAIT:?}"))??
    .context("claim gone")
}

/// The volume a claim is bound to.
pub fn volume_of(c: &PersistentVolumeClaim) -> Result<String> {
    c.spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .with_context(|| format!("claim {} is not bound", c.name_any()))
}

pub fn uid(o: &impl ResourceExt) -> String {
    o.uid().unwrap_or_default()
}

/// Waits, by watch, until pod `name` is a new one (not `old_uid`) bound
/// to a node; returns it.
pub async fn new_pod_on_a_node(pods: &Api<Pod>, name: &str, old_uid: &str) -> Result<Pod> {
    let old = old_uid.to_string();
    let pod = tokio::time::timeout(
        WAIT,
        await_condition(pods.clone(), name, move |p: Option<&Pod>| {
            p.is_some_and(|p| {
                uid(p) != old && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
            })
        }),
    )
    .await
    .with_context(|| format!("pod {name} not made again on a node within {WAIT:?}"))??;
    pod.context("pod gone")
}

pub fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}
