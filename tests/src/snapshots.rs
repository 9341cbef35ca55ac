//! The Kubernetes control plane of the snapshot tests: the
//! `snapshot.storage.k8s.io/v1` CRDs and `snapshot-controller` of
//! external-snapshotter (`tests/tools/build.sh csi-snapshotter`), and
//! beside `carina-controller --mode kube` the sidecars the Helm chart runs
//! with it (external-provisioner, `csi-snapshotter` with the chart's own
//! arguments), all as the chart's controller ServiceAccount; and the waits
//! and fields of the objects the tests look at.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use carina_csi::DRIVER_NAME;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::chart::container;
use crate::cluster::{
    KubeControllerArgs, Pki, Service, add_topology, as_chart_service_account, await_capacity,
    await_object, csi_provisioner,
};
use crate::kube::{Component, KubeCluster};
use crate::local::carina::tool_path;
use crate::manifests::{Chart, find, objects};
use crate::process::ChildGuard;
use crate::unique;

pub const MIB: u64 = 1 << 20;
/// Bound of every wait for the control plane.
pub const WAIT: Duration = Duration::from_secs(90);
pub const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";

/// The VolumeSnapshot CRDs the `csi-snapshotter` tool copied from
/// external-snapshotter's client module, applied by server-side apply and
/// waited for until Established.
pub async fn install_snapshot_crds(client: &Client) -> Result<()> {
    let dir = tool_path("csi-snapshotter")?.join("../crds");
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for kind in [
        "volumesnapshotclasses",
        "volumesnapshotcontents",
        "volumesnapshots",
    ] {
        let file = dir.join(format!("{SNAPSHOT_GROUP}_{kind}.yaml"));
        let text = std::fs::read_to_string(&file).with_context(|| {
            format!(
                "read {} (run tests/tools/build.sh csi-snapshotter)",
                file.display()
            )
        })?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_json::Value::deserialize(doc)?;
            if value.is_null() {
                continue;
            }
            let crd: CustomResourceDefinition =
                serde_json::from_value(value).with_context(|| file.display().to_string())?;
            let name = crd.name_any();
            api.patch(
                &name,
                &PatchParams::apply("carina-tests").force(),
                &Patch::Apply(&crd),
            )
            .await
            .with_context(|| format!("apply CRD {name}"))?;
            names.push(name);
        }
    }
    ensure!(names.len() == 3, "expected three CRDs, got {names:?}");
    for name in names {
        let established = await_condition(api.clone(), &name, conditions::is_crd_established());
        tokio::time::timeout(WAIT, established)
            .await
            .with_context(|| format!("CRD {name} not Established within {WAIT:?}"))??;
    }
    Ok(())
}

/// A cluster with Carina's CRDs and the VolumeSnapshot CRDs
/// ([`install_snapshot_crds`]), and a work directory named from `prefix`.
pub async fn snapshot_cluster(prefix: &str) -> Result<(KubeCluster, tempfile::TempDir)> {
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    install_snapshot_crds(&cluster.client()).await?;
    let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
    Ok((cluster, dir))
}

/// The controller Deployment's container `name` as the chart renders it
/// with its default values.
pub fn chart_container(objs: &[Value], name: &str) -> Result<Value> {
    let controller = find(objs, "Deployment", "carina-controller")?;
    Ok(container(controller, name)
        .context("the chart's controller")?
        .clone())
}

/// A program of the `csi-snapshotter` tool as a process, its log in the
/// cluster's log directory; stopped on drop.
pub fn snapshot_tool(
    cluster: &KubeCluster,
    program: &str,
    args: Vec<String>,
) -> Result<ChildGuard> {
    ChildGuard::spawn(
        program,
        &tool_path("csi-snapshotter")?.join(program),
        &args,
        &[],
        &cluster.log_dir().join(format!("{}.log", unique(program))),
    )
}

/// The cluster-wide snapshot-controller, as an administrator installs it:
/// with the cluster administrator's rights, group snapshots off.
pub fn snapshot_controller(cluster: &KubeCluster) -> Result<ChildGuard> {
    snapshot_tool(
        cluster,
        "snapshot-controller",
        vec![
            format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
            "--feature-gates=CSIVolumeGroupSnapshot=false".to_string(),
            "--v=4".to_string(),
        ],
    )
}

/// The Kubernetes control plane of snapshots around one node: the
/// controller and its sidecars (external-provisioner, csi-snapshotter with
/// the chart's arguments) with the chart's rights, the cluster-wide
/// snapshot-controller and kube-controller-manager. Stopped on drop.
#[derive(Debug)]
pub struct SnapshotPlane {
    provisioner: ChildGuard,
    snapshotter: ChildGuard,
    snapshot_controller: ChildGuard,
    _controllers: Component,
    _controller: Service,
}

impl SnapshotPlane {
    pub async fn start(cluster: &KubeCluster, pki: &Pki, dir: &Path, node: &str) -> Result<Self> {
        let client = cluster.client();
        add_topology(&client, node).await?;
        let chart = objects(&Chart::new()?.template("kube-system", None)?)?;
        let kubeconfig = as_chart_service_account(cluster, &chart, dir).await?;
        let controller = KubeControllerArgs::new(
            "carina-controller",
            // The chart's Lease name: its Role names no other (the cluster is
            // this test's own).
            "carina-controller",
            &kubeconfig,
            pki,
            dir,
            &cluster.log_dir().join("carina-controller.log"),
        )
        .start()
        .await?;
        await_capacity(&client, node, WAIT).await?;
        let as_sa = format!("--kubeconfig={}", kubeconfig.display());
        let provisioner = csi_provisioner(
            cluster,
            controller.socket(),
            &[
                &as_sa,
                "--feature-gates=Topology=true",
                "--extra-create-metadata",
                // Its Lease, as in the chart: only that name may be renewed.
                "--leader-election",
                "--leader-election-namespace=kube-system",
            ],
            &[],
        )?;
        // csi-snapshotter with the chart's arguments, on this socket.
        let mut snapshotter_args: Vec<String> = chart_container(&chart, "csi-snapshotter")?["args"]
            .as_array()
            .context("csi-snapshotter args")?
            .iter()
            .filter_map(|a| a.as_str())
            .map(|a| {
                if a.starts_with("--csi-address=") {
                    format!("--csi-address={}", controller.socket().display())
                } else {
                    a.to_string()
                }
            })
            .collect();
        snapshotter_args.extend([as_sa.clone(), "--v=4".to_string()]);
        let snapshotter = snapshot_tool(cluster, "csi-snapshotter", snapshotter_args)?;
        let snapshot_controller = snapshot_controller(cluster)?;
        let controllers = cluster.start_controller_manager(&[]).await?;
        Ok(SnapshotPlane {
            provisioner,
            snapshotter,
            snapshot_controller,
            _controllers: controllers,
            _controller: controller,
        })
    }

    /// Fails naming the first of the upstream programs that exited.
    pub fn check_running(&mut self) -> Result<()> {
        for (name, process) in [
            ("csi-provisioner", &mut self.provisioner),
            ("csi-snapshotter", &mut self.snapshotter),
            ("snapshot-controller", &mut self.snapshot_controller),
        ] {
            process
                .check_running()
                .with_context(|| format!("{name} kept running"))?;
        }
        Ok(())
    }
}

pub fn snapshot_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(SNAPSHOT_GROUP, "v1", kind), plural)
}

/// Creates VolumeSnapshotClass `name` of Carina's driver, with the
/// deletion policy `Delete`.
pub async fn create_snapshot_class(client: &Client, name: &str) -> Result<()> {
    let class_resource = snapshot_resource("VolumeSnapshotClass", "volumesnapshotclasses");
    Api::<DynamicObject>::all_with(client.clone(), &class_resource)
        .create(
            &PostParams::default(),
            &DynamicObject::new(name, &class_resource).data(json!({
                "driver": DRIVER_NAME,
                "deletionPolicy": "Delete",
            })),
        )
        .await
        .with_context(|| format!("create the VolumeSnapshotClass {name}"))?;
    Ok(())
}

/// The VolumeSnapshots of namespace `ns`.
pub fn volume_snapshots(client: &Client, ns: &str) -> Api<DynamicObject> {
    let resource = snapshot_resource("VolumeSnapshot", "volumesnapshots");
    Api::namespaced_with(client.clone(), ns, &resource)
}

/// Creates VolumeSnapshot `name` of claim `source` in class `class`
/// through `snapshots` (one namespace's, [`volume_snapshots`]) and waits,
/// by watch, at most [`WAIT`], until it is readyToUse; returns it as seen
/// then.
pub async fn take_snapshot(
    snapshots: &Api<DynamicObject>,
    name: &str,
    class: &str,
    source: &str,
) -> Result<DynamicObject> {
    let resource = snapshot_resource("VolumeSnapshot", "volumesnapshots");
    snapshots
        .create(
            &PostParams::default(),
            &DynamicObject::new(name, &resource).data(json!({"spec": {
                "volumeSnapshotClassName": class,
                "source": {"persistentVolumeClaimName": source},
            }})),
        )
        .await
        .with_context(|| format!("create the VolumeSnapshot {name}"))?;
    await_object(snapshots, name, "readyToUse", WAIT, |s| {
        s.is_some_and(|s| field(s, &["status", "readyToUse"]) == &json!(true))
    })
    .await?
    .with_context(|| format!("the VolumeSnapshot {name} was deleted"))
}

/// A claim of `size` in `class` with the volume mode `mode` (`Block` or
/// `Filesystem`), filled from `source` (a `dataSource`) when given.
pub fn claim(
    ns: &str,
    name: &str,
    class: &str,
    mode: &str,
    size: &str,
    source: Option<Value>,
) -> Result<PersistentVolumeClaim> {
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "volumeMode": mode,
        "storageClassName": class,
        "resources": {"requests": {"storage": size}},
    });
    if let Some(source) = source {
        spec["dataSource"] = source;
    }
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))?)
}

/// Waits, by watch, until claim `name` is Bound; returns its PV.
pub async fn bound_volume(client: &Client, ns: &str, name: &str) -> Result<PersistentVolume> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let claim = await_object(&claims, name, "Bound", WAIT, |c| {
        c.and_then(|c| c.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Bound")
    })
    .await?
    .with_context(|| format!("claim {name} deleted while waiting"))?;
    let pv = claim
        .spec
        .and_then(|s| s.volume_name)
        .with_context(|| format!("claim {name} is Bound without a volume"))?;
    Ok(Api::<PersistentVolume>::all(client.clone())
        .get(&pv)
        .await?)
}

/// The pattern's 8-byte word at word index `i`: every word differs, so a
/// block copied to the wrong place shows.
pub fn word(i: u64) -> [u8; 8] {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xC0FF_EE00_CAFE_0001).to_le_bytes()
}

pub fn field<'a>(o: &'a DynamicObject, path: &[&str]) -> &'a Value {
    path.iter().fold(&o.data, |v, k| &v[*k])
}
