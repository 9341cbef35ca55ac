//! `carinactl migrate plan` against a real kube-apiserver holding what a
//! Go Carina v0.14.0 install leaves: Go-shaped LogicVolumes (LVM, RAW,
//! HOST, a thin one, an orphan without a PersistentVolume, a failed one)
//! beside one of ours, their PersistentVolumes, StorageClasses of the
//! provisioner, Go's controller Deployment and node DaemonSet, and its
//! leftovers (webhook Service, ConfigMap, CSIDriver, pod webhook).
//!
//! The binary runs as a process with the kubeconfig, in both output
//! formats. While Go's Deployment and DaemonSet exist it exits 4 and names
//! them (there is no kubelet here, so they have no pods: a Go workload
//! blocks while it exists, whatever it runs now, as the chart refuses to
//! install beside it); once they are deleted it exits 0. Every object's
//! resourceVersion is the same after the plans as before: the plan
//! changed nothing.
//!
//! Needs etcd and kube-apiserver from `tests/tools/build.sh etcd kube`,
//! and `cargo build --workspace --bins` for `carinactl`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use carina_api::LogicVolume;
use carina_tests::kube::KubeCluster;
use carina_tests::process::workspace_binary;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, Service};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const NS: &str = "kube-system";
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// A LogicVolume as Go Carina writes it, status included.
fn go_lv(name: &str, manage: &str, group: &str, id: &str, status: &str) -> (Value, Value) {
    let object = json!({
        "apiVersion": "carina.storage.io/v1", "kind": "LogicVolume",
        "metadata": {"name": name, "finalizers": ["carina.storage.io/logicvolume"],
            "annotations": {"carina.io/volume-manage-type": manage}},
        "spec": {"nodeName": "node-a", "size": "2Gi", "deviceGroup": group,
            "pvc": format!("claim-{name}"), "nameSpace": "app"}
    });
    let mut st = json!({"status": status, "currentSize": "2Gi", "code": 0, "message": ""});
    if !id.is_empty() {
        st["volumeID"] = json!(id);
    }
    if status == "Failed" {
        st["message"] = json!("not enough space in carina-vg-ssd");
    }
    (object, json!({"status": st}))
}

fn pv(name: &str, handle: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "csi-carina-sc",
            "claimRef": {"namespace": "app", "name": format!("claim-{name}")},
            "csi": {"driver": "carina.storage.io", "volumeHandle": handle}}
    })
}

fn go_workload(kind: &str, name: &str, program: &str) -> Value {
    let mut spec = json!({
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
            {"name": name, "image": "registry.cn-hangzhou.aliyuncs.com/carina/carina:v0.14.0",
             "command": [program], "args": ["--csi-address=/csi/csi-carina.sock"]}]}}
    });
    if kind == "Deployment" {
        spec["replicas"] = json!(1);
    }
    json!({"apiVersion": "apps/v1", "kind": kind,
        "metadata": {"name": name, "namespace": NS}, "spec": spec})
}

async fn create<K>(api: &Api<K>, object: Value) -> Result<K>
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned + serde::Serialize,
{
    let typed: K = serde_json::from_value(object).context("object of the test")?;
    api.create(&PostParams::default(), &typed)
        .await
        .with_context(|| format!("create {}", typed.name_any()))
}

/// The resourceVersion of every object of the test, by kind and name.
async fn versions(client: &Client) -> Result<BTreeMap<String, String>> {
    async fn of<K>(api: Api<K>, kind: &str, out: &mut BTreeMap<String, String>) -> Result<()>
    where
        K: Resource + Clone + std::fmt::Debug + DeserializeOwned,
        K::DynamicType: Default,
    {
        for o in api.list(&Default::default()).await?.items {
            let key = format!(
                "{kind} {}/{}",
                o.namespace().unwrap_or_default(),
                o.name_any()
            );
            out.insert(key, o.resource_version().unwrap_or_default());
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    of::<LogicVolume>(Api::all(client.clone()), "LogicVolume", &mut out).await?;
    of::<PersistentVolume>(Api::all(client.clone()), "PV", &mut out).await?;
    of::<StorageClass>(Api::all(client.clone()), "StorageClass", &mut out).await?;
    of::<Deployment>(Api::namespaced(client.clone(), NS), "Deployment", &mut out).await?;
    of::<DaemonSet>(Api::namespaced(client.clone(), NS), "DaemonSet", &mut out).await?;
    of::<Service>(Api::namespaced(client.clone(), NS), "Service", &mut out).await?;
    of::<ConfigMap>(Api::namespaced(client.clone(), NS), "ConfigMap", &mut out).await?;
    of::<CSIDriver>(Api::all(client.clone()), "CSIDriver", &mut out).await?;
    of::<MutatingWebhookConfiguration>(Api::all(client.clone()), "Webhook", &mut out).await?;
    Ok(out)
}

/// Runs `carinactl migrate plan` with `extra` arguments; (exit status,
/// standard output).
async fn plan(cluster: &KubeCluster, extra: &[&str]) -> Result<(i32, String)> {
    let carinactl = workspace_binary("carinactl")?;
    let mut cmd = tokio::process::Command::new(&carinactl);
    cmd.args(["migrate", "plan", "--kubeconfig"])
        .arg(cluster.kubeconfig_path())
        .args(extra)
        .env_remove("KUBECONFIG")
        .kill_on_drop(true);
    let out = tokio::time::timeout(RUN_TIMEOUT, cmd.output())
        .await
        .context("carinactl migrate plan did not finish")??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code().context("carinactl killed by a signal")?;
    ensure!(
        code == 0 || code == 4,
        "carinactl migrate plan {extra:?} exited {code}: {stderr}"
    );
    Ok((code, String::from_utf8(out.stdout)?))
}

fn volume<'a>(plan: &'a Value, name: &str) -> &'a Value {
    plan["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|e| e["name"] == name))
        .unwrap_or_else(|| panic!("volume {name} in the plan: {plan:#}"))
}

#[tokio::test]
async fn migrate_plan_lists_go_objects_and_changes_nothing() -> Result<()> {
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();

    let lvs: Api<LogicVolume> = Api::all(client.clone());
    let ours = json!({
        "apiVersion": "carina.storage.io/v1", "kind": "LogicVolume",
        "metadata": {"name": "pvc-ours"},
        "spec": {"nodeName": "node-b", "size": "1Gi", "deviceGroup": "lvm"}
    });
    let ours_status = json!({"status": {"volumeID": "pvc-ours@node-b", "status": "Success"}});
    let mut all = vec![("pvc-ours".to_string(), ours, ours_status)];
    for (name, manage, group, id, status) in [
        (
            "pvc-lvm",
            "lvm",
            "carina-vg-ssd",
            "volume-pvc-lvm",
            "Success",
        ),
        (
            "pvc-raw-7f3a",
            "raw",
            "carina-raw-ssd/loop9",
            "volume-pvc-raw-7f3a",
            "Success",
        ),
        (
            "pvc-host",
            "host",
            "carina-host",
            "host-pvc-host",
            "Success",
        ),
        (
            "pvc-thin",
            "lvm",
            "carina-vg-ssd",
            "thin-pvc-thin",
            "Success",
        ),
        (
            "pvc-orphan",
            "lvm",
            "carina-vg-ssd",
            "volume-pvc-orphan",
            "Success",
        ),
        ("pvc-failed", "lvm", "carina-vg-ssd", "", "Failed"),
    ] {
        let (object, status) = go_lv(name, manage, group, id, status);
        all.push((name.to_string(), object, status));
    }
    for (name, object, status) in all {
        create(&lvs, object).await?;
        lvs.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .with_context(|| format!("status of {name}"))?;
    }
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for (name, handle) in [
        ("pvc-ours", "pvc-ours@node-b"),
        ("pvc-lvm", "volume-pvc-lvm"),
        ("pvc-raw-7f3a", "volume-pvc-raw-7f3a"),
        ("pvc-host", "host-pvc-host"),
        ("pvc-thin", "thin-pvc-thin"),
    ] {
        create(&pvs, pv(name, handle)).await?;
    }
    let classes: Api<StorageClass> = Api::all(client.clone());
    create(
        &classes,
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "csi-carina-sc"}, "provisioner": "carina.storage.io",
            "parameters": {"carina.storage.io/disk-group-name": "carina-vg-ssd",
                "csi.storage.k8s.io/fstype": "xfs"}}),
    )
    .await?;
    create(
        &classes,
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "carina-bad-fs"}, "provisioner": "carina.storage.io",
            "parameters": {"carina.storage.io/disk-group-name": "carina-vg-ssd",
                "csi.storage.k8s.io/fstype": "zfs-of-doom"}}),
    )
    .await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NS);
    create(
        &deployments,
        go_workload("Deployment", "csi-carina-provisioner", "carina-controller"),
    )
    .await?;
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), NS);
    create(
        &daemon_sets,
        go_workload("DaemonSet", "csi-carina-node", "carina-node"),
    )
    .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    create(
        &services,
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "carina-controller", "namespace": NS},
            "spec": {"selector": {"app": "csi-carina-provisioner"},
                "ports": [{"name": "webhook", "port": 443, "targetPort": 8443}]}}),
    )
    .await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    create(
        &config_maps,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "carina-csi-config", "namespace": NS,
                "labels": {"class": "carina"}},
            "data": {"config.json": "{\"diskSelector\": [], \"diskScanInterval\": \"300\"}"}}),
    )
    .await?;
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    create(
        &drivers,
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": "carina.storage.io"},
            "spec": {"attachRequired": false, "podInfoOnMount": true}}),
    )
    .await?;
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    create(
        &hooks,
        json!({"apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration", "metadata": {"name": "carina-hook"},
            "webhooks": [{"name": "pod-hook.carina.storage.io",
                "admissionReviewVersions": ["v1beta1"], "sideEffects": "None",
                "failurePolicy": "Ignore",
                "clientConfig": {"service": {"name": "carina-controller", "namespace": NS,
                    "path": "/pod/mutate"}},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""],
                    "apiVersions": ["v1"], "resources": ["pods"]}]}]}),
    )
    .await?;

    let before = versions(&client).await?;
    ensure!(before.len() >= 16, "the test's objects: {before:#?}");

    // The table while Go runs.
    let (code, table) = plan(&cluster, &[]).await?;
    println!("{table}");
    assert_eq!(code, 4, "blocked while Go's workloads exist:\n{table}");
    for line in [
        "BLOCKERS (Go Carina still runs; migrate apply refuses)",
        "DaemonSet   kube-system  csi-carina-node",
        "Deployment  kube-system  csi-carina-provisioner",
        "BLOCKED: 2 Go Carina program(s) still run",
    ] {
        assert!(table.contains(line), "{line:?} in:\n{table}");
    }
    let row = |name: &str| -> Vec<String> {
        table
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("a row for {name} in:\n{table}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    assert_eq!(
        row("pvc-raw-7f3a")[..6],
        [
            "pvc-raw-7f3a",
            "take-over",
            "raw",
            "node-a",
            "carina-raw-ssd/loop9",
            "2"
        ]
    );
    assert_eq!(row("pvc-thin")[1], "refused-thin");
    assert_eq!(row("carina-bad-fs")[1], "refused");
    assert_eq!(row("csi-carina-sc")[1], "accepted");

    // The same in JSON.
    let (code, json_text) = plan(&cluster, &["-o", "json"]).await?;
    assert_eq!(code, 4);
    let plan_json: Value = serde_json::from_str(&json_text).context("plan JSON")?;
    assert_eq!(plan_json["blocking"], true);
    let blockers: Vec<(&str, &str)> = plan_json["blockers"]
        .as_array()
        .context("blockers")?
        .iter()
        .map(|b| {
            (
                b["name"].as_str().unwrap_or_default(),
                b["program"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        blockers,
        [
            ("csi-carina-node", "carina-node"),
            ("csi-carina-provisioner", "carina-controller")
        ]
    );
    for (name, action, policy) in [
        ("pvc-ours", "ours", Value::Null),
        ("pvc-lvm", "take-over", json!("lvm")),
        ("pvc-raw-7f3a", "take-over", json!("raw")),
        ("pvc-host", "take-over", json!("host")),
        ("pvc-thin", "refused-thin", json!("lvm")),
        ("pvc-orphan", "orphan", json!("lvm")),
        ("pvc-failed", "failed", json!("lvm")),
    ] {
        let v = volume(&plan_json, name);
        assert_eq!(v["action"], action, "{v:#}");
        assert_eq!(v["policy"], policy, "{v:#}");
    }
    let lvm = volume(&plan_json, "pvc-lvm");
    assert_eq!(lvm["size_bytes"], 2u64 << 30);
    assert_eq!(lvm["claim"], "app/claim-pvc-lvm");
    assert_eq!(lvm["persistent_volume"], "pvc-lvm");
    let failed = volume(&plan_json, "pvc-failed");
    assert!(
        failed["reason"]
            .as_str()
            .is_some_and(|r| r.contains("not enough space")),
        "{failed:#}"
    );
    let handles: Vec<(&str, &str)> = plan_json["persistent_volumes"]
        .as_array()
        .context("persistent_volumes")?
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or_default(),
                p["handle"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        handles,
        [
            ("pvc-host", "go"),
            ("pvc-lvm", "go"),
            ("pvc-ours", "ours"),
            ("pvc-raw-7f3a", "go"),
            ("pvc-thin", "go-thin")
        ]
    );
    let leftovers: Vec<(&str, &str)> = plan_json["leftovers"]
        .as_array()
        .context("leftovers")?
        .iter()
        .map(|l| {
            (
                l["kind"].as_str().unwrap_or_default(),
                l["name"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        leftovers,
        [
            ("CSIDriver", "carina.storage.io"),
            ("ConfigMap", "carina-csi-config"),
            ("MutatingWebhookConfiguration", "carina-hook"),
            ("Service", "carina-controller"),
        ]
    );

    let after = versions(&client).await?;
    assert_eq!(before, after, "migrate plan changed an object");

    // Go's programs removed: nothing blocks.
    deployments
        .delete("csi-carina-provisioner", &DeleteParams::default())
        .await?;
    daemon_sets
        .delete("csi-carina-node", &DeleteParams::default())
        .await?;
    let (code, json_text) = plan(&cluster, &["-o", "json"]).await?;
    let plan_json: Value = serde_json::from_str(&json_text)?;
    assert_eq!(code, 0, "{plan_json:#}");
    assert_eq!(plan_json["blocking"], false);
    assert_eq!(plan_json["blockers"], json!([]));
    Ok(())
}
