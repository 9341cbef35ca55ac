//! Workloads for a scheduling test against a real kube-apiserver: a
//! namespace, a WaitForFirstConsumer StorageClass of Carina, claims and
//! pods that use them (a pause container; no kubelet needs to run them),
//! and waits, by watch, for where kube-scheduler put a pod or why it did not.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use carina_csi::DRIVER_NAME;
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{Container, Event, Namespace, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

/// How long a pod may take to be scheduled, or to be refused.
pub const WAIT: Duration = Duration::from_secs(90);

/// A StorageClass `name` of Carina's driver with `WaitForFirstConsumer`
/// binding, its volumes in device group `group`.
pub async fn add_class(client: &Client, name: &str, group: &str) -> Result<()> {
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        provisioner: DRIVER_NAME.into(),
        parameters: Some(BTreeMap::from([(
            "carina.storage.io/disk-group-name".to_string(),
            group.to_string(),
        )])),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        ..StorageClass::default()
    };
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await?;
    Ok(())
}

pub async fn add_namespace(client: &Client, name: &str) -> Result<()> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(())
}

pub fn claim(namespace: &str, name: &str, class: &str, size: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "resources": {"requests": {"storage": size}},
        },
    }))
    .expect("a valid claim")
}

pub fn pod(namespace: &str, name: &str, claims: &[&str]) -> Pod {
    let volumes: Vec<Value> = claims
        .iter()
        .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
        .collect();
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "labels": {"test": "carina"}},
        "spec": {"volumes": volumes},
    }))
    .expect("a valid pod");
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers = vec![Container {
            name: "app".into(),
            image: Some("registry.k8s.io/pause:3.10".into()),
            ..Container::default()
        }];
    }
    pod
}

/// A claim and a pod using it.
pub async fn pod_with_claim(
    client: &Client,
    ns: &str,
    name: &str,
    class: &str,
    size: &str,
) -> Result<()> {
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &claim(ns, name, class, size))
        .await?;
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod(ns, name, &[name]))
        .await?;
    Ok(())
}

/// Waits (by watch) until the pod has a node; returns it.
pub async fn scheduled_node(client: &Client, ns: &str, name: &str) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = tokio::time::timeout(
        WAIT,
        await_condition(pods, name, |p: Option<&Pod>| node_of(p).is_some()),
    )
    .await
    .with_context(|| format!("pod {ns}/{name} not scheduled within {WAIT:?}"))??
    .context("pod deleted")?;
    node_of(Some(&pod)).context("no node")
}

pub fn node_of(p: Option<&Pod>) -> Option<String> {
    p.and_then(|p| p.spec.as_ref())
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
}

pub fn unschedulable(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "PodScheduled" && c.status == "False")
        })
}

/// The first FailedScheduling event of the pod whose message contains
/// `part`, by watch.
pub async fn failed_scheduling(
    client: &Client,
    ns: &str,
    name: &str,
    part: &str,
) -> Result<String> {
    let e = event_with(client, ns, name, "FailedScheduling", part).await?;
    Ok(e.message.unwrap_or_default())
}

/// The Events of the object `name` (reason `reason`), by watch, until
/// one whose message contains `part`.
pub async fn event_with(
    client: &Client,
    ns: &str,
    name: &str,
    reason: &str,
    part: &str,
) -> Result<Event> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let config =
        watcher::Config::default().fields(&format!("involvedObject.name={name},reason={reason}"));
    let stream = watcher(events, config).applied_objects();
    let mut stream = std::pin::pin!(stream);
    tokio::time::timeout(WAIT, async {
        while let Some(e) = stream.try_next().await? {
            if e.message.as_deref().unwrap_or_default().contains(part) {
                return Ok(e);
            }
        }
        bail!("event stream ended")
    })
    .await
    .with_context(|| format!("no {reason} Event on {ns}/{name} with {part:?}"))?
}
