//! Carina's CRDs on a real kube-apiserver: they install and become
//! Established, objects round-trip through the status subresource without
//! losing a field to pruning, the JSON on the wire uses Carina's field
//! names, and the server renders the printer columns.
//!
//! Needs etcd and kube-apiserver from `tests/tools/build.sh etcd kube`.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use carina_api::{
    DeviceGroupCapacity, Disk, LOGICVOLUME_FINALIZER, LogicVolume, LogicVolumeSpec,
    LogicVolumeStatus, NodeStorageResource, NodeStorageResourceSpec, NodeStorageResourceStatus,
    PvInfo, TRACEPARENT_ANNOTATION, VgGroup, capacity_key,
};
use carina_tests::kube::KubeCluster;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::{Value, json};

const MANAGER: &str = "carina-tests";

#[tokio::test]
async fn carina_crds_on_a_real_apiserver() -> Result<()> {
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    // Installing again (as an upgrade would) is a no-op apply.
    cluster.install_crds().await?;
    let client = cluster.client();

    crds_are_cluster_scoped_with_short_names(&client).await?;
    logic_volume_round_trip(&client).await?;
    carina_shaped_logic_volume_is_accepted(&client).await?;
    node_storage_resource_round_trip(&client).await?;
    Ok(())
}

async fn crds_are_cluster_scoped_with_short_names(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (name, short, columns) in [
        (
            "logicvolumes.carina.storage.io",
            "lv",
            &["Size", "Group", "Node", "Status", "Age"][..],
        ),
        (
            "nodestorageresources.carina.storage.io",
            "nsr",
            &["Node", "Synced", "Age"][..],
        ),
    ] {
        let crd = crds.get(name).await?;
        assert_eq!(crd.spec.scope, "Cluster", "{name}");
        let accepted = crd
            .status
            .and_then(|s| s.accepted_names)
            .context("accepted")?;
        assert_eq!(
            accepted.short_names,
            Some(vec![short.to_string()]),
            "{name}"
        );
        let served: Vec<String> = crd.spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.clone())
            .collect();
        for c in columns {
            assert!(
                served.contains(&c.to_string()),
                "{name}: {c} not in {served:?}"
            );
        }
    }
    Ok(())
}

fn ready(generation: i64, reason: &str) -> Condition {
    Condition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: reason.into(),
        message: String::new(),
        observed_generation: Some(generation),
        last_transition_time: Time(Timestamp::from_second(1_767_225_600).expect("valid time")),
    }
}

/// The whole object as the apiserver stores it, untyped.
async fn raw<K: Resource<DynamicType = ()>>(client: &Client, name: &str) -> Result<Value> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::erase::<K>(&()));
    Ok(serde_json::to_value(api.get(name).await?)?)
}

/// A status patch by server-side apply through the status subresource.
fn status_patch<K: Resource<DynamicType = ()>>(status: &impl serde::Serialize) -> Result<Value> {
    Ok(json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": serde_json::to_value(status)?,
    }))
}

async fn logic_volume_round_trip(client: &Client) -> Result<()> {
    let lvs: Api<LogicVolume> = Api::all(client.clone());
    let spec = LogicVolumeSpec {
        source: None,
        node_name: "node-a".into(),
        size: Quantity("10Gi".into()),
        device_group: "carina-vg-ssd".into(),
        pvc: "data".into(),
        name_space: "default".into(),
        cache: None,
    };
    let mut lv = LogicVolume::new("pvc-0001", spec.clone());
    lv.metadata.finalizers = Some(vec![LOGICVOLUME_FINALIZER.into()]);
    lv.metadata.annotations = Some(BTreeMap::from([(
        TRACEPARENT_ANNOTATION.to_string(),
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_string(),
    )]));
    let created = lvs.create(&PostParams::default(), &lv).await?;
    assert_eq!(created.spec, spec);
    assert!(created.status.is_none());

    let status = LogicVolumeStatus {
        volume_id: Some("volume-pvc-0001".into()),
        code: Some(0),
        message: None,
        current_size: Some(Quantity("10Gi".into())),
        status: Some("Success".into()),
        device_major: Some(7),
        device_minor: Some(3),
        conditions: vec![ready(1, "Created")],
        observed_generation: Some(1),
        path: Some("/dev/loop3".into()),
        node_incarnation: Some("7c9e6679-7425-40de-944b-e07fc1f90ae7".into()),
        capacity_generation: Some(u64::from(u32::MAX) + 7),
    };
    lvs.patch_status(
        "pvc-0001",
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(status_patch::<LogicVolume>(&status)?),
    )
    .await?;

    // A status written through the main resource is dropped: the status
    // subresource is on.
    lvs.patch(
        "pvc-0001",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"message": "ignored"}})),
    )
    .await?;

    let got = lvs.get("pvc-0001").await?;
    assert_eq!(got.spec, spec);
    assert_eq!(
        got.status.as_ref(),
        Some(&status),
        "nothing pruned or changed"
    );
    assert_eq!(
        got.metadata.finalizers,
        Some(vec![LOGICVOLUME_FINALIZER.to_string()])
    );

    let v = raw::<LogicVolume>(client, "pvc-0001").await?;
    assert_eq!(v["apiVersion"], "carina.storage.io/v1");
    assert_eq!(
        v["spec"],
        json!({"nodeName": "node-a", "size": "10Gi", "deviceGroup": "carina-vg-ssd",
               "pvc": "data", "nameSpace": "default"})
    );
    let s = &v["status"];
    assert_eq!(s["volumeID"], "volume-pvc-0001");
    assert_eq!(s["code"], 0);
    assert_eq!(s["currentSize"], "10Gi");
    assert_eq!(s["status"], "Success");
    assert_eq!(s["deviceMajor"], 7);
    assert_eq!(s["deviceMinor"], 3);
    assert_eq!(s["observedGeneration"], 1);
    assert_eq!(s["conditions"][0]["type"], "Ready");
    assert!(s.get("message").is_none(), "{s}");

    // `kubectl get lv` as the server renders it.
    let table = table(client, "/apis/carina.storage.io/v1/logicvolumes").await?;
    let row = named_row(&table, "pvc-0001")?;
    assert_eq!(row.get("Size"), Some(&json!("10Gi")));
    assert_eq!(row.get("Group"), Some(&json!("carina-vg-ssd")));
    assert_eq!(row.get("Node"), Some(&json!("node-a")));
    assert_eq!(row.get("Status"), Some(&json!("Success")));
    assert!(row.contains_key("Age"));
    Ok(())
}

/// An object written the way Carina's Go controller writes it (no claim,
/// a plain-number quantity) is accepted and reads back with defaults.
async fn carina_shaped_logic_volume_is_accepted(client: &Client) -> Result<()> {
    let api: Api<DynamicObject> =
        Api::all_with(client.clone(), &ApiResource::erase::<LogicVolume>(&()));
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "carina.storage.io/v1",
        "kind": "LogicVolume",
        "metadata": {"name": "from-carina"},
        "spec": {"nodeName": "node-b", "size": 1073741824, "deviceGroup": "hdd"},
    }))?;
    api.create(&PostParams::default(), &obj).await?;
    let lv = Api::<LogicVolume>::all(client.clone())
        .get("from-carina")
        .await?;
    assert_eq!(lv.spec.size, Quantity("1073741824".into()));
    assert_eq!(lv.spec.pvc, "");
    assert_eq!(lv.spec.name_space, "");

    // A bad quantity is refused by the schema.
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "carina.storage.io/v1",
        "kind": "LogicVolume",
        "metadata": {"name": "bad-size"},
        "spec": {"nodeName": "node-b", "size": "ten gigs", "deviceGroup": "hdd"},
    }))?;
    let err = api
        .create(&PostParams::default(), &bad)
        .await
        .expect_err("a malformed size is rejected");
    assert!(format!("{err}").contains("spec.size"), "{err}");
    Ok(())
}

async fn node_storage_resource_round_trip(client: &Client) -> Result<()> {
    let nsrs: Api<NodeStorageResource> = Api::all(client.clone());
    let spec = NodeStorageResourceSpec {
        node_name: "node-a".into(),
    };
    nsrs.create(
        &PostParams::default(),
        &NodeStorageResource::new("node-a", spec.clone()),
    )
    .await?;

    let gib = 1u64 << 30;
    let status = NodeStorageResourceStatus {
        sync_time: Some(Time(Timestamp::from_second(1_767_225_600)?)),
        capacity: BTreeMap::from([(capacity_key("ssd"), Quantity("100".into()))]),
        allocatable: BTreeMap::from([(capacity_key("ssd"), Quantity("89".into()))]),
        groups: vec![DeviceGroupCapacity {
            name: "ssd".into(),
            policy: "LVM".into(),
            total_bytes: 100 * gib,
            free_bytes: 99 * gib,
            reserve_bytes: 10 * gib,
            allocatable_bytes: 89 * gib,
            largest_allocatable_bytes: 89 * gib,
            allocation_unit_bytes: 4 << 20,
            volume_count: 1,
            quota: None,
            disks: vec!["/dev/loop3".into()],
            no_disks: None,
        }],
        node_generation: Some(42),
        node_incarnation: Some("7c9e6679-7425-40de-944b-e07fc1f90ae7".into()),
        vg_groups: vec![VgGroup {
            vg_name: "ssd".into(),
            pv_count: 1,
            lv_count: 1,
            vg_attr: "wz--n-".into(),
            vg_size: 100 * gib,
            vg_free: 99 * gib,
            pvs: vec![PvInfo {
                pv_name: "/dev/loop3".into(),
                vg_name: "ssd".into(),
                pv_fmt: "lvm2".into(),
                pv_attr: "a--".into(),
                pv_size: 100 * gib,
                pv_free: 99 * gib,
            }],
        }],
        disks: vec![Disk {
            name: "loop4".into(),
            path: "/dev/loop4".into(),
            size: 50 * gib,
            sector_size: Some(512),
            read_only: true,
            device_group: "raw".into(),
        }],
        conditions: vec![ready(1, "Reported")],
        observed_generation: Some(1),
    };
    nsrs.patch_status(
        "node-a",
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(status_patch::<NodeStorageResource>(&status)?),
    )
    .await?;

    let got = nsrs.get("node-a").await?;
    assert_eq!(got.spec, spec);
    assert_eq!(
        got.status.as_ref(),
        Some(&status),
        "nothing pruned or changed"
    );

    let v = raw::<NodeStorageResource>(client, "node-a").await?;
    assert_eq!(v["apiVersion"], "carina.storage.io/v1beta1");
    assert_eq!(v["spec"], json!({"nodeName": "node-a"}));
    let s = &v["status"];
    assert_eq!(s["syncTime"], "2026-01-01T00:00:00Z");
    assert_eq!(s["capacity"]["carina.storage.io/ssd"], "100");
    assert_eq!(s["allocatable"]["carina.storage.io/ssd"], "89");
    let g = &s["groups"][0];
    for (key, want) in [
        ("name", json!("ssd")),
        ("policy", json!("LVM")),
        ("totalBytes", json!(100 * gib)),
        ("freeBytes", json!(99 * gib)),
        ("reserveBytes", json!(10 * gib)),
        ("allocatableBytes", json!(89 * gib)),
        ("largestAllocatableBytes", json!(89 * gib)),
        ("allocationUnitBytes", json!(4 << 20)),
        ("volumeCount", json!(1)),
    ] {
        assert_eq!(g[key], want, "groups[0].{key} in {g}");
    }
    assert_eq!(s["nodeGeneration"], 42);
    let vg = &s["vgGroups"][0];
    for key in ["vgName", "pvCount", "lvCount", "vgAttr", "vgSize", "vgFree"] {
        assert!(vg.get(key).is_some(), "vgGroups[0].{key} missing: {vg}");
    }
    let pv = &vg["pvs"][0];
    for key in ["pvName", "vgName", "pvFmt", "pvAttr", "pvSize", "pvFree"] {
        assert!(pv.get(key).is_some(), "pvs[0].{key} missing: {pv}");
    }
    let disk = &s["disks"][0];
    assert_eq!(disk["read-only"], true);
    assert_eq!(disk["sectorSize"], 512);
    assert_eq!(disk["size"], json!(50 * gib));

    let table = table(
        client,
        "/apis/carina.storage.io/v1beta1/nodestorageresources",
    )
    .await?;
    let row = named_row(&table, "node-a")?;
    assert_eq!(row.get("Node"), Some(&json!("node-a")));
    assert!(row.contains_key("Synced"));
    Ok(())
}

/// A list as a `meta.k8s.io/v1` Table, the form `kubectl get` asks for.
async fn table(client: &Client, path: &str) -> Result<Value> {
    let req = http::Request::get(path)
        .header(
            http::header::ACCEPT,
            "application/json;as=Table;v=v1;g=meta.k8s.io",
        )
        .body(Vec::new())?;
    Ok(client.request::<Value>(req).await?)
}

/// The row of object `name` as column name → cell.
fn named_row(table: &Value, name: &str) -> Result<BTreeMap<String, Value>> {
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .context("columnDefinitions")?
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let rows = table["rows"].as_array().context("rows")?;
    let row = rows
        .iter()
        .find(|r| r["cells"][0] == name)
        .with_context(|| format!("no row for {name} in {table}"))?;
    let cells = row["cells"].as_array().context("cells")?;
    Ok(columns
        .iter()
        .zip(cells)
        .map(|(c, v)| (c.to_string(), v.clone()))
        .collect())
}
