//! Pod migration off a dead node with the real upstream control plane:
//! etcd, kube-apiserver, kube-controller-manager with its node-lifecycle
//! controller on (it marks a Node whose Lease stops being renewed not
//! Ready and taints it), kube-scheduler, external-provisioner calling
//! `carina-controller --mode kube` (migration grace 3 s), and two
//! `carina-node` processes on LVM loop disks. The controller runs as the
//! chart's ServiceAccount with the chart's ClusterRole, so the rights it
//! is given are the rights it needs. The Nodes have no kubelet:
//! this test renews their Leases in `kube-node-lease` as kubelets would.
//!
//! Three StatefulSets with a Carina claim each start on `node-a` (the
//! other node is cordoned until then): `moving` opts in with
//! `carina.storage.io/allow-pod-migration-if-node-notready: "true"` and
//! its StorageClass allows it (the same key as a class annotation),
//! `staying` does not opt in, `closed` opts in but its StorageClass does
//! not allow it. A Deployment `deployed` opts in with a claim of the
//! allowing class. Two plain pods share one claim of the allowing class:
//! `shared-mover` opts in, `shared-reader` does not. Then `node-a` dies
//! (its carina-node is killed and its Lease is no longer renewed). It
//! proves:
//! - nothing happens while the node is Ready;
//! - the opted-in pod is deleted with its claim once the node has been
//!   NotReady past the grace period; its StatefulSet makes both again and
//!   the new pod runs on `node-b` with a new volume there;
//! - the Deployment's claim, which nothing else would make again, is
//!   made again by the controller (same spec, the old claim's UID in
//!   `carina.storage.io/recreated-from`, a `VolumeClaimRecreated` Event),
//!   and the Deployment's new pod runs on `node-b` with it bound to a new
//!   volume there;
//! - Warning Events on the pod and on the claim say the data on `node-a`
//!   is given up;
//! - a pod's word is not enough: `closed` (its class does not allow it)
//!   and `shared-mover` (another pod uses its claim) are refused with a
//!   `PodMigrationRefused` Event saying why, and neither they nor their
//!   claims are touched;
//! - the pod without the annotation and its claim are untouched, and the
//!   moved pod is not moved again.
//!
//! Needs root and loop devices, `tests/tools/build.sh etcd kube helm
//! csi-provisioner`, and `cargo build --workspace --bins`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use carina_csi::params::POD_MIGRATION;
use carina_tests::cluster::{
    KubeControllerArgs, LvmNode, Pki, add_topology, as_chart_service_account, await_capacity,
    csi_provisioner,
};
use carina_tests::kube::KubeCluster;
use carina_tests::manifests::{Chart, objects};
use carina_tests::migration::{
    Heartbeats, deployment, new_bound_claim, new_pod_on_a_node, node_of, plain_pod,
    pod_of_app_on_a_node, stateful_set, uid, volume_of,
};
use carina_tests::workload::{WAIT, add_class, add_namespace, claim, event_with};
use carina_tests::{have_root, unique};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use serde_json::json;

const A: &str = "node-a";
const B: &str = "node-b";
const GIB: u64 = 1 << 30;
const CLASS: &str = "carina-migration";
/// A class of the same group that does not allow pod migration.
const CLOSED_CLASS: &str = "carina-no-migration";
/// The controller's `--pod-migration-grace-secs`.
const GRACE_SECS: u64 = 3;

/// [`as_chart_service_account`] with the chart rendered into `kube-system`.
async fn chart_service_account(cluster: &KubeCluster, dir: &Path) -> Result<PathBuf> {
    let objs = objects(&Chart::new()?.template("kube-system", None)?)?;
    as_chart_service_account(cluster, &objs, dir).await
}

#[tokio::test]
async fn an_opted_in_pod_leaves_a_dead_node_and_others_stay() -> Result<()> {
    if !have_root("an_opted_in_pod_leaves_a_dead_node_and_others_stay") {
        return Ok(());
    }
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();
    let dir = tempfile::Builder::new()
        .prefix("carina-migration-")
        .tempdir()?;
    let pki = Pki::write(&dir.path().join("pki"))?;
    let group = unique("mig");
    let heartbeats = Heartbeats::start(client.clone(), &[A, B]);

    let mut nodes = BTreeMap::new();
    for name in [A, B] {
        let node = LvmNode::start(&cluster, &pki, dir.path(), name, &group, GIB).await?;
        add_topology(&client, name).await?;
        nodes.insert(name, node);
    }
    let kubeconfig = chart_service_account(&cluster, dir.path()).await?;
    let mut controller_args = KubeControllerArgs::new(
        "carina-controller",
        // The chart's Lease name: its Role names no other (the cluster is
        // this test's own).
        "carina-controller",
        &kubeconfig,
        &pki,
        dir.path(),
        &cluster.log_dir().join("carina-controller.log"),
    );
    controller_args.extra = vec![format!("--pod-migration-grace-secs={GRACE_SECS}")];
    let mut controller = controller_args.start().await?;
    for n in [A, B] {
        await_capacity(&client, n, WAIT).await?;
    }
    let mut provisioner = csi_provisioner(&cluster, controller.socket(), &[], &[])?;
    // The node-lifecycle controller on, with short periods: a Node whose
    // Lease is not renewed for 8 s is not Ready.
    let _controllers = cluster
        .start_controller_manager(&[
            "--controllers=*",
            "--node-monitor-period=1s",
            "--node-monitor-grace-period=8s",
        ])
        .await?;
    let _scheduler = cluster.start_scheduler(&[]).await?;

    let ns = unique("migration");
    add_namespace(&client, &ns).await?;
    add_class(&client, CLASS, &group).await?;
    add_class(&client, CLOSED_CLASS, &group).await?;
    // The class allows migration as Carina's StorageClasses do: annotated.
    Api::<StorageClass>::all(client.clone())
        .patch(
            CLASS,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {POD_MIGRATION: "true"}}})),
        )
        .await?;
    let node_api: Api<Node> = Api::all(client.clone());
    let cordon = |on: bool| {
        let node_api = node_api.clone();
        async move {
            node_api
                .patch(
                    B,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"unschedulable": on}})),
                )
                .await
        }
    };
    cordon(true).await?;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    for (name, migrate, class) in [
        ("moving", true, CLASS),
        ("staying", false, CLASS),
        ("closed", true, CLOSED_CLASS),
    ] {
        sets.create(
            &PostParams::default(),
            &stateful_set(&ns, name, migrate, class)?,
        )
        .await?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    claims
        .create(&PostParams::default(), &claim(&ns, "shared", CLASS, "64Mi"))
        .await?;
    claims
        .create(
            &PostParams::default(),
            &claim(&ns, "deployed-data", CLASS, "64Mi"),
        )
        .await?;
    Api::<Deployment>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &deployment(&ns, "deployed", "deployed-data")?,
        )
        .await?;
    for (name, migrate) in [("shared-mover", true), ("shared-reader", false)] {
        pods.create(
            &PostParams::default(),
            &plain_pod(&ns, name, migrate, "shared")?,
        )
        .await?;
    }
    let moving = new_pod_on_a_node(&pods, "moving-0", "").await?;
    let staying = new_pod_on_a_node(&pods, "staying-0", "").await?;
    let closed = new_pod_on_a_node(&pods, "closed-0", "").await?;
    let mover = new_pod_on_a_node(&pods, "shared-mover", "").await?;
    let reader = new_pod_on_a_node(&pods, "shared-reader", "").await?;
    let deployed = pod_of_app_on_a_node(&pods, "deployed", "").await?;
    for p in [&moving, &staying, &closed, &mover, &reader, &deployed] {
        assert_eq!(node_of(p), A, "{}", p.name_any());
    }
    let moving_claim = claims.get("data-moving-0").await?;
    let staying_claim = claims.get("data-staying-0").await?;
    let deployed_claim = new_bound_claim(&claims, "deployed-data", "").await?;
    cordon(false).await?;

    // Nothing moves while node-a is Ready.
    tokio::time::sleep(Duration::from_secs(GRACE_SECS + 2)).await;
    assert_eq!(uid(&pods.get("moving-0").await?), uid(&moving));

    // node-a dies.
    nodes.get_mut(A).context("node-a")?.service.kill();
    heartbeats.stop(A);
    let down = tokio::time::timeout(
        WAIT,
        await_condition(node_api.clone(), A, |n: Option<&Node>| {
            n.and_then(|n| n.status.as_ref())
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status != "True"))
        }),
    )
    .await
    .context("node-a not marked NotReady by the node-lifecycle controller")??;
    assert!(down.is_some());

    // The opted-in pod and its claim are made again on node-b.
    let moved = new_pod_on_a_node(&pods, "moving-0", &uid(&moving)).await?;
    assert_eq!(node_of(&moved), B, "the new pod runs on the live node");
    let new_claim = tokio::time::timeout(
        WAIT,
        await_condition(claims.clone(), "data-moving-0", {
            let old = uid(&moving_claim);
            move |c: Option<&PersistentVolumeClaim>| {
                c.is_some_and(|c| {
                    uid(c) != old
                        && c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                })
            }
        }),
    )
    .await
    .context("the new claim is not bound")??
    .context("claim gone")?;
    let old_volume = moving_claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .context("the first claim was bound")?;
    let new_volume = new_claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .context("bound")?;
    assert_ne!(old_volume, new_volume);
    assert!(
        !new_claim
            .annotations()
            .contains_key(carina_controlplane::kube::migration::RECREATED_FROM),
        "a StatefulSet makes its claims itself"
    );
    let lv: carina_api::LogicVolume = Api::all(client.clone())
        .get(&carina_csi::names::local_name(&new_volume))
        .await?;
    assert_eq!(lv.spec.node_name, B, "the new volume is on node-b");

    // The Events say what was given up.
    let e = event_with(&client, &ns, "moving-0", "PodMigration", &old_volume).await?;
    let message = e.message.unwrap_or_default();
    assert!(
        message.contains(&format!("node {A} has not been Ready since"))
            && message.contains("is given up"),
        "{message}"
    );
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    event_with(
        &client,
        &ns,
        "data-moving-0",
        "VolumeDataGivenUp",
        &old_volume,
    )
    .await?;

    // The Deployment's claim is made again, and its new pod runs on
    // node-b with a new volume there.
    let old_deployed_volume = volume_of(&deployed_claim)?;
    let again = new_bound_claim(&claims, "deployed-data", &uid(&deployed_claim)).await?;
    assert_eq!(
        again
            .annotations()
            .get(carina_controlplane::kube::migration::RECREATED_FROM),
        Some(&uid(&deployed_claim)),
        "the claim made again names the one it replaces"
    );
    assert_eq!(
        again
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref()),
        Some(CLASS)
    );
    let new_deployed_volume = volume_of(&again)?;
    assert_ne!(new_deployed_volume, old_deployed_volume);
    let lv: carina_api::LogicVolume = Api::all(client.clone())
        .get(&carina_csi::names::local_name(&new_deployed_volume))
        .await?;
    assert_eq!(lv.spec.node_name, B, "the new volume is on node-b");
    let redeployed = pod_of_app_on_a_node(&pods, "deployed", &uid(&deployed)).await?;
    assert_eq!(
        node_of(&redeployed),
        B,
        "the Deployment's new pod runs on node-b"
    );
    event_with(
        &client,
        &ns,
        "deployed-data",
        "VolumeClaimRecreated",
        &format!("pod {ns}/{} moved off node {A}", deployed.name_any()),
    )
    .await?;

    // A pod's word is not enough: refused, with the reason, and untouched.
    for (pod, claim, reason) in [
        (
            &closed,
            "data-closed-0",
            format!("StorageClass {CLOSED_CLASS}"),
        ),
        (
            &mover,
            "shared",
            "also used by pod shared-reader".to_string(),
        ),
    ] {
        let name = pod.name_any();
        let e = event_with(&client, &ns, &name, "PodMigrationRefused", &reason).await?;
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        let now = pods.get(&name).await?;
        assert_eq!(uid(&now), uid(pod), "{name} was deleted");
        assert!(now.metadata.deletion_timestamp.is_none(), "{name}");
        let c = claims.get(claim).await?;
        assert!(
            c.metadata.deletion_timestamp.is_none(),
            "claim {claim} of the refused {name} is being deleted"
        );
        let lv: carina_api::LogicVolume = Api::all(client.clone())
            .get(&carina_csi::names::local_name(
                c.spec
                    .as_ref()
                    .and_then(|s| s.volume_name.as_deref())
                    .context("bound")?,
            ))
            .await?;
        assert!(lv.metadata.deletion_timestamp.is_none(), "{name}");
    }
    assert_eq!(uid(&pods.get("shared-reader").await?), uid(&reader));

    // The pod without the opt-in, its claim, and the moved pod stay.
    tokio::time::sleep(Duration::from_secs(GRACE_SECS + 2)).await;
    let still = pods.get("staying-0").await?;
    assert_eq!(
        uid(&still),
        uid(&staying),
        "the unannotated pod is untouched"
    );
    assert_eq!(node_of(&still), A);
    assert!(still.metadata.deletion_timestamp.is_none());
    let claim = claims.get("data-staying-0").await?;
    assert_eq!(uid(&claim), uid(&staying_claim));
    assert!(claim.metadata.deletion_timestamp.is_none());
    assert_eq!(uid(&pods.get("moving-0").await?), uid(&moved), "moved once");

    provisioner.check_running()?;
    controller.check_running()?;
    Ok(())
}
