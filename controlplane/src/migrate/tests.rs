//! The plan over Go-shaped objects written as data: what Go Carina
//! v0.14.0 writes (LogicVolumes, PVs, its chart's workloads and leftovers)
//! beside objects of this project.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, Pod, Service};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use serde_json::json;

use carina_api::LogicVolume;

use super::*;

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("valid object")
}

/// A LogicVolume as Go Carina writes it.
fn go_lv(name: &str, manage: &str, group: &str, id: &str, status: &str) -> LogicVolume {
    from(json!({
        "apiVersion": "carina.storage.io/v1", "kind": "LogicVolume",
        "metadata": {"name": name, "finalizers": ["carina.storage.io/logicvolume"],
            "annotations": {"carina.io/volume-manage-type": manage}},
        "spec": {"nodeName": "node-a", "size": "2Gi", "deviceGroup": group,
            "pvc": "data", "nameSpace": "app"},
        "status": {"volumeID": id, "status": status, "currentSize": "3Gi", "code": 0,
            "message": if status == "Failed" { "no space" } else { "" }}
    }))
}

fn pv(name: &str, handle: &str) -> PersistentVolume {
    from(json!({
        "metadata": {"name": name},
        "spec": {"csi": {"driver": "carina.storage.io", "volumeHandle": handle},
            "claimRef": {"namespace": "app", "name": format!("claim-{name}")},
            "storageClassName": "csi-carina-sc"}
    }))
}

fn go_deployment(name: &str, command: &str, replicas: i32) -> Deployment {
    from(json!({
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
                {"name": "csi-provisioner", "image": "csi-provisioner:v3.4.1"},
                {"name": "csi-carina-controller", "command": [command],
                 "image": "registry.cn-hangzhou.aliyuncs.com/carina/carina:v0.14.0"}]}}}
    }))
}

fn entry<'a>(plan: &'a Plan, name: &str) -> &'a VolumeEntry {
    plan.volumes
        .iter()
        .find(|v| v.name == name)
        .expect("listed")
}

#[test]
fn go_volumes_are_classified_by_what_is_known_of_them() {
    let ours: LogicVolume = from(json!({
        "metadata": {"name": "pvc-ours"},
        "spec": {"nodeName": "node-b", "size": "1Gi", "deviceGroup": "lvm"},
        "status": {"volumeID": "pvc-ours@node-b", "status": "Success"}
    }));
    let mut adopted = go_lv(
        "pvc-done",
        "lvm",
        "carina-vg-ssd",
        "volume-pvc-done",
        "Success",
    );
    adopted
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(ADOPTED_ANNOTATION.into(), "volume-pvc-done".into());
    let cluster = Cluster {
        logic_volumes: vec![
            ours,
            adopted,
            go_lv(
                "pvc-lvm",
                "lvm",
                "carina-vg-ssd",
                "volume-pvc-lvm",
                "Success",
            ),
            go_lv(
                "pvc-raw-1a2b",
                "raw",
                "carina-raw-ssd/loop7",
                "volume-pvc-raw-1a2b",
                "Success",
            ),
            go_lv(
                "pvc-host",
                "host",
                "carina-host",
                "host-pvc-host",
                "Success",
            ),
            go_lv(
                "pvc-thin",
                "lvm",
                "carina-vg-ssd",
                "thin-pvc-thin",
                "Success",
            ),
            go_lv(
                "pvc-orphan",
                "lvm",
                "carina-vg-ssd",
                "volume-pvc-orphan",
                "Success",
            ),
            go_lv("pvc-failed", "lvm", "carina-vg-ssd", "", "Failed"),
            go_lv(
                "pvc-mixed",
                "raw",
                "carina-vg-ssd",
                "volume-pvc-mixed",
                "Success",
            ),
            go_lv(
                "pvc-moved",
                "lvm",
                "carina-vg-ssd",
                "volume-pvc-moved",
                "Success",
            ),
        ],
        persistent_volumes: vec![
            pv("pvc-ours", "pvc-ours@node-b"),
            pv("pvc-done", "volume-pvc-done"),
            pv("pvc-lvm", "volume-pvc-lvm"),
            pv("pvc-raw-1a2b", "volume-pvc-raw-1a2b"),
            pv("pvc-host", "host-pvc-host"),
            pv("pvc-thin", "thin-pvc-thin"),
            pv("pvc-failed", "volume-pvc-failed"),
            pv("pvc-mixed", "volume-pvc-mixed"),
            pv("pvc-moved", "volume-pvc-other"),
            pv("pvc-lonely", "volume-pvc-lonely"),
        ],
        ..Cluster::default()
    };
    let plan = plan(&cluster);
    assert!(!plan.blocking);
    let lvm = entry(&plan, "pvc-lvm");
    assert_eq!(lvm.action, VolumeAction::TakeOver, "{lvm:?}");
    assert_eq!(lvm.policy.as_deref(), Some("lvm"));
    assert_eq!(lvm.size_bytes, Some(3 << 30), "status.currentSize wins");
    assert_eq!(lvm.claim.as_deref(), Some("app/claim-pvc-lvm"));
    assert_eq!(lvm.node, "node-a");
    let raw = entry(&plan, "pvc-raw-1a2b");
    assert_eq!(
        (raw.action, raw.policy.as_deref()),
        (VolumeAction::TakeOver, Some("raw"))
    );
    assert_eq!(raw.group, "carina-raw-ssd/loop7");
    let host = entry(&plan, "pvc-host");
    assert_eq!(
        (host.action, host.policy.as_deref()),
        (VolumeAction::TakeOver, Some("host"))
    );
    assert_eq!(entry(&plan, "pvc-ours").action, VolumeAction::Ours);
    let done = entry(&plan, "pvc-done");
    assert_eq!(done.action, VolumeAction::Adopted);
    assert!(done.reason.contains("skipped"), "{done:?}");
    let thin = entry(&plan, "pvc-thin");
    assert_eq!(thin.action, VolumeAction::RefusedThin);
    assert!(thin.reason.contains("thin pool"), "{thin:?}");
    let orphan = entry(&plan, "pvc-orphan");
    assert_eq!(orphan.action, VolumeAction::Orphan);
    assert!(orphan.reason.contains("no PersistentVolume"), "{orphan:?}");
    let failed = entry(&plan, "pvc-failed");
    assert_eq!(failed.action, VolumeAction::Failed);
    assert!(failed.reason.contains("no space"), "{failed:?}");
    let mixed = entry(&plan, "pvc-mixed");
    assert_eq!(mixed.action, VolumeAction::Refused);
    assert!(mixed.reason.contains("say lvm"), "{mixed:?}");
    let moved = entry(&plan, "pvc-moved");
    assert_eq!(moved.action, VolumeAction::Refused);
    assert!(moved.reason.contains("volume-pvc-other"), "{moved:?}");

    let handles: Vec<(&str, HandleKind, bool)> = plan
        .persistent_volumes
        .iter()
        .map(|p| (p.name.as_str(), p.handle, p.logic_volume))
        .collect();
    assert!(handles.contains(&("pvc-ours", HandleKind::Ours, true)));
    assert!(handles.contains(&("pvc-thin", HandleKind::GoThin, true)));
    assert!(handles.contains(&("pvc-lonely", HandleKind::Go, false)));
    let names: Vec<&str> = plan.volumes.iter().map(|v| v.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "sorted by name");
}

#[test]
fn go_programs_block_while_they_exist_or_run() {
    let mut ours = go_deployment("carina-controller", "carina-controller", 1);
    if let Some(t) = ours.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        for c in &mut t.containers {
            c.command = None;
        }
    }
    let finished: Pod = from(json!({
        "metadata": {"name": "old-node", "namespace": "kube-system"},
        "spec": {"containers": [{"name": "csi-carina-node", "command": ["carina-node"]}]},
        "status": {"phase": "Succeeded"}
    }));
    let running: Pod = from(json!({
        "metadata": {"name": "csi-carina-node-x1", "namespace": "kube-system"},
        "spec": {"nodeName": "node-a", "containers": [
            {"name": "csi-carina-node", "command": ["/usr/bin/carina-node"]}]},
        "status": {"phase": "Running"}
    }));
    let cluster = Cluster {
        deployments: vec![
            go_deployment("csi-carina-provisioner", "carina-controller", 0),
            ours,
        ],
        pods: vec![finished, running],
        ..Cluster::default()
    };
    let plan = plan(&cluster);
    assert!(plan.blocking);
    let found: Vec<(&str, &str, &str)> = plan
        .blockers
        .iter()
        .map(|b| (b.kind.as_str(), b.name.as_str(), b.program.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            ("Pod", "csi-carina-node-x1", "carina-node"),
            ("Deployment", "csi-carina-provisioner", "carina-controller"),
        ],
        "sorted by namespace and name"
    );
    assert!(
        plan.blockers[0].reason.contains("Running (node node-a)"),
        "{:?}",
        plan.blockers[0]
    );
    assert!(
        plan.blockers[1].reason.contains("replicas 0"),
        "{:?}",
        plan.blockers[1]
    );
}

#[test]
fn storage_classes_carry_the_parsers_verdict() {
    let class = |name: &str, params: serde_json::Value| -> StorageClass {
        from(
            json!({"metadata": {"name": name}, "provisioner": "carina.storage.io",
            "parameters": params}),
        )
    };
    let other: StorageClass = from(json!({"metadata": {"name": "nfs"},
        "provisioner": "nfs.csi.k8s.io", "parameters": {"anything": "x"}}));
    let cluster = Cluster {
        storage_classes: vec![
            class(
                "csi-carina-sc",
                json!({"carina.storage.io/disk-group-name": "carina-vg-ssd",
                "csi.storage.k8s.io/fstype": "xfs"}),
            ),
            class(
                "bad-fs",
                json!({"carina.storage.io/disk-group-name": "carina-vg-ssd",
                "csi.storage.k8s.io/fstype": "zfs-of-doom"}),
            ),
            other,
        ],
        ..Cluster::default()
    };
    let plan = plan(&cluster);
    let verdicts: Vec<(&str, bool)> = plan
        .storage_classes
        .iter()
        .map(|c| (c.name.as_str(), c.accepted))
        .collect();
    assert_eq!(verdicts, [("bad-fs", false), ("csi-carina-sc", true)]);
    assert!(
        plan.storage_classes[0].reason.contains("fstype"),
        "the parser's field is named: {:?}",
        plan.storage_classes[0]
    );
}

#[test]
fn leftovers_of_go_are_listed_and_the_charts_own_are_not() {
    let service = |name: &str, app: &str, ours: bool| -> Service {
        let labels = if ours {
            json!({"app.kubernetes.io/part-of": "carina"})
        } else {
            json!({})
        };
        from(
            json!({"metadata": {"name": name, "namespace": "kube-system", "labels": labels},
            "spec": {"selector": {"app": app}}}),
        )
    };
    let config = |name: &str, ours: bool| -> ConfigMap {
        let labels = if ours {
            json!({"app.kubernetes.io/part-of": "carina"})
        } else {
            json!({"class": "carina"})
        };
        from(
            json!({"metadata": {"name": name, "namespace": "kube-system", "labels": labels},
            "data": {"config.json": "{\"diskSelector\": []}"}}),
        )
    };
    let driver: CSIDriver = from(json!({"metadata": {"name": "carina.storage.io"},
        "spec": {"attachRequired": false}}));
    let hook: MutatingWebhookConfiguration = from(json!({
        "metadata": {"name": "carina-hook"},
        "webhooks": [{"name": "pod-hook.carina.storage.io", "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "clientConfig": {"service": {"name": "carina-controller",
                "namespace": "kube-system"}}}]
    }));
    let cluster = Cluster {
        services: vec![
            service("carina-controller", "csi-carina-provisioner", false),
            service("carina-node", "csi-carina-node", false),
            service("carina-controller", "csi-carina-controller", true),
            service("web", "shop", false),
        ],
        config_maps: vec![
            config("carina-csi-config", false),
            config("mine-csi-config", false),
            config("carina-csi-config", true),
        ],
        csi_drivers: vec![driver],
        mutating_webhooks: vec![hook],
        ..Cluster::default()
    };
    let plan = plan(&cluster);
    let found: Vec<(&str, &str)> = plan
        .leftovers
        .iter()
        .map(|l| (l.kind.as_str(), l.name.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            ("CSIDriver", "carina.storage.io"),
            ("ConfigMap", "carina-csi-config"),
            ("ConfigMap", "mine-csi-config"),
            ("MutatingWebhookConfiguration", "carina-hook"),
            ("Service", "carina-controller"),
            ("Service", "carina-node"),
        ]
    );
    assert!(!plan.blocking, "leftovers do not block");
}

#[test]
fn the_json_field_names_are_stable() {
    let cluster = Cluster {
        logic_volumes: vec![go_lv(
            "pvc-a",
            "lvm",
            "carina-vg-ssd",
            "volume-pvc-a",
            "Success",
        )],
        persistent_volumes: vec![pv("pvc-a", "volume-pvc-a")],
        ..Cluster::default()
    };
    let value = serde_json::to_value(plan(&cluster)).expect("serialises");
    let keys: Vec<&String> = value.as_object().expect("object").keys().collect();
    assert_eq!(
        keys,
        [
            "blockers",
            "blocking",
            "leftovers",
            "persistent_volumes",
            "storage_classes",
            "volumes",
        ]
    );
    assert_eq!(
        value["volumes"][0],
        json!({"name": "pvc-a", "action": "take-over", "policy": "lvm", "node": "node-a",
            "group": "carina-vg-ssd", "size_bytes": 3u64 << 30, "volume_id": "volume-pvc-a",
            "persistent_volume": "pvc-a", "claim": "app/claim-pvc-a",
            "reason": value["volumes"][0]["reason"]})
    );
}
