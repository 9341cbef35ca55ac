//! The scheduler extender's answer time: `/filter` followed by
//! `/prioritize`, through the HTTP handler (JSON in, JSON out) on an
//! in-memory cache, at 100, 1,000 and 5,000 nodes — for a pod with two
//! Carina claims (two device groups) and for a pod without Carina claims.
//!
//! The synthetic cluster: every node publishes two LVM groups of
//! different sizes; a tenth of the nodes have a `LogicVolume` in flight
//! and another tenth a claim whose node was chosen but has no
//! `LogicVolume` yet, so reservations are part of every answer. "Warm"
//! rows answer from reservations computed once (a quiet cluster); the
//! "after a change" row changes the cache before each request, so the
//! reservations are computed again each time (a busy cluster). There is
//! no raw command underneath, so no floor.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use carina_api::{LogicVolume, NodeStorageResource};
use carina_csi::strategy::Strategy;
use carina_scheduler::objects::MemoryObjects;
use carina_scheduler::{Extender, server};
use http::Method;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::{Value, json};

use crate::report::{Entry, timed};

const GROUP: &str = "Scheduler extender: /filter + /prioritize in-process (HTTP handler, JSON)";
const GIB: u64 = 1 << 30;
const NODES: [usize; 3] = [100, 1_000, 5_000];

pub async fn latency(iterations: usize) -> Result<Vec<Entry>> {
    // The calls are short: take more samples than the slow benchmarks.
    let samples = iterations.max(100) * 10;
    let mut entries = Vec::new();
    for n in NODES {
        let objects = Arc::new(cluster(n)?);
        let extender = Extender::new(objects.clone(), Strategy::Binpack, Duration::from_secs(2));
        let names: Vec<String> = (0..n).map(node_name).collect();
        let two = args("with-claims", &["data", "logs"], &names);
        let none = args("without-claims", &[], &names);

        check(&extender, &two, n).await?;
        let t = measure(&extender, &two, samples, None).await;
        entries.push(timed(
            GROUP,
            &format!("pod with two Carina claims, {n} nodes"),
            "",
            &t,
            None,
        ));
        let t = measure(&extender, &none, samples, None).await;
        entries.push(timed(
            GROUP,
            &format!("pod without Carina claims, {n} nodes"),
            "",
            &t,
            None,
        ));
        if n == 5_000 {
            let t = measure(&extender, &two, samples / 10, Some(&objects)).await;
            entries.push(timed(
                GROUP,
                &format!("pod with two Carina claims, {n} nodes, after a change"),
                "",
                &t,
                None,
            ));
        }
    }
    Ok(entries)
}

/// Times `/filter` + `/prioritize` for `body`, `count` times after a
/// warm-up; with `churn`, a pod is added before each request.
async fn measure(
    extender: &Extender<MemoryObjects>,
    body: &[u8],
    count: usize,
    churn: Option<&MemoryObjects>,
) -> Vec<Duration> {
    for _ in 0..count.min(20) {
        round_trip(extender, body).await;
    }
    let mut samples = Vec::with_capacity(count);
    for i in 0..count {
        if let Some(objects) = churn {
            objects.insert_pod(churn_pod(i));
        }
        let start = Instant::now();
        round_trip(extender, body).await;
        samples.push(start.elapsed());
    }
    samples
}

async fn round_trip(extender: &Extender<MemoryObjects>, body: &[u8]) {
    let f = server::respond(extender, &Method::POST, "/filter", body).await;
    let p = server::respond(extender, &Method::POST, "/prioritize", body).await;
    std::hint::black_box((f, p));
}

/// The answers are what the benchmark claims: every node passes (the
/// synthetic nodes all have room), and nodes get scores.
async fn check(extender: &Extender<MemoryObjects>, body: &[u8], n: usize) -> Result<()> {
    let filter: Value = serde_json::from_slice(&extender.filter(body).await?)?;
    let passed = filter["NodeNames"].as_array().map_or(0, Vec::len);
    if passed != n || filter["Error"] != "" {
        bail!(
            "synthetic cluster of {n}: {passed} nodes pass, error {:?}",
            filter["Error"]
        );
    }
    let scores: Value = serde_json::from_slice(&extender.prioritize(body).await?)?;
    if scores.as_array().map_or(0, Vec::len) != n {
        bail!("synthetic cluster of {n}: not every node scored");
    }
    Ok(())
}

fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

fn args(pod: &str, claims: &[&str], nodes: &[String]) -> Vec<u8> {
    let volumes: Vec<Value> = claims
        .iter()
        .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
        .collect();
    json!({
        "Pod": {
            "metadata": {"name": pod, "namespace": "bench", "uid": format!("uid-{pod}"),
                         "labels": {"app": "bench"}},
            "spec": {
                "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"requests": {"cpu": "100m"}}}],
                "volumes": volumes,
            },
        },
        "Nodes": null,
        "NodeNames": nodes,
    })
    .to_string()
    .into_bytes()
}

fn cluster(n: usize) -> Result<MemoryObjects> {
    let objects = MemoryObjects::new();
    for (name, group) in [("bench-ssd", "ssd"), ("bench-hdd", "hdd")] {
        objects.insert_class(serde_json::from_value::<StorageClass>(json!({
            "metadata": {"name": name},
            "provisioner": "carina.storage.io",
            "parameters": {"carina.storage.io/disk-group-name": group},
            "volumeBindingMode": "WaitForFirstConsumer",
        }))?);
    }
    objects.insert_claim(claim("data", "bench-ssd", "10Gi", None)?);
    objects.insert_claim(claim("logs", "bench-hdd", "20Gi", None)?);
    for i in 0..n {
        let node = node_name(i);
        let ssd = (100 + (i % 50) as u64) * GIB;
        let hdd = (1000 + (i % 300) as u64) * GIB;
        objects.insert_node_storage(serde_json::from_value::<NodeStorageResource>(json!({
            "apiVersion": "carina.storage.io/v1beta1",
            "kind": "NodeStorageResource",
            "metadata": {"name": node},
            "spec": {"nodeName": node},
            "status": {
                "syncTime": "2026-01-01T00:00:00Z",
                "allocatable": {"carina.storage.io/ssd": (ssd / GIB).to_string(),
                                "carina.storage.io/hdd": (hdd / GIB).to_string()},
                "groups": [group("ssd", ssd), group("hdd", hdd)],
            },
        }))?);
        if i % 10 == 3 {
            objects.insert_logic_volume(serde_json::from_value::<LogicVolume>(json!({
                "apiVersion": "carina.storage.io/v1",
                "kind": "LogicVolume",
                "metadata": {"name": format!("pvc-inflight-{i}")},
                "spec": {"nodeName": node, "size": "8Gi", "deviceGroup": "ssd"},
            }))?);
        }
        if i % 10 == 7 {
            objects.insert_claim(claim(
                &format!("chosen-{i}"),
                "bench-hdd",
                "50Gi",
                Some(&node),
            )?);
        }
    }
    Ok(objects)
}

fn group(name: &str, bytes: u64) -> Value {
    json!({
        "name": name, "policy": "LVM",
        "totalBytes": bytes + 10 * GIB, "freeBytes": bytes, "reserveBytes": 0,
        "allocatableBytes": bytes, "largestAllocatableBytes": bytes,
        "allocationUnitBytes": 4 << 20, "volumeCount": 3,
    })
}

fn claim(name: &str, class: &str, size: &str, node: Option<&str>) -> Result<PersistentVolumeClaim> {
    let annotations = match node {
        Some(n) => json!({"volume.kubernetes.io/selected-node": n}),
        None => json!({}),
    };
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "bench", "uid": format!("uid-{name}"),
                     "resourceVersion": "1", "annotations": annotations},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "resources": {"requests": {"storage": size}},
        },
    }))?)
}

/// A pod elsewhere in the cluster, to change the cache.
fn churn_pod(i: usize) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some(format!("churn-{i}"));
    pod.metadata.namespace = Some("other".into());
    pod
}
