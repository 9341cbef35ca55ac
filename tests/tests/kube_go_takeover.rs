//! Go Carina's `LogicVolume`s before and after they are taken over,
//! against a real kube-apiserver, the bridge and one in-process
//! NodeStorage server (a HOST group on a temporary directory), with the
//! CSI controller of the Kubernetes plane on its own socket.
//!
//! It proves: an object as Go Carina wrote it (`status: Success`, its
//! `volumeID` Go's id, Go's annotation and finalizer), with its directory
//! made as Go made it, is left alone by the bridge (nothing made on the
//! node, no Ready, status and finalizer as Go wrote them, the directory
//! untouched) but for the condition `Adopted=False`; DeleteVolume,
//! ControllerExpandVolume and ValidateVolumeCapabilities with its Go id
//! answer FAILED_PRECONDITION naming `carinactl migrate apply`, as does a
//! CreateVolume of its name, and the object stays; a Go id no object has
//! is deleted (done) and not found, a thin one refused. Once the node
//! adopted the directory (`AdoptLV`) and the object carries the
//! adopted-volume annotation, the bridge finds it with GetLV (Adopted and
//! Ready True, the Go id kept), the Go id grows it (Go's data kept) and
//! deletes it: the directory is gone and the node no longer counts it in
//! its group.
//!
//! Needs etcd and kube-apiserver from `tests/tools/build.sh etcd kube`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use carina_api::quantity::quantity_bytes;
use carina_api::{
    ADOPTED_ANNOTATION, GO_VOLUME_TYPE_ANNOTATION, LOGICVOLUME_FINALIZER, LogicVolume,
    LogicVolumeSpec, LogicVolumeStatus, NODE_ENDPOINT_ANNOTATION,
};
use carina_controlplane::kube::bridge::{ADOPTED, GO_CARINA_VOLUME};
use carina_controlplane::kube::provisioner::{KubeProvisioner, KubeProvisionerConfig};
use carina_proto::csi;
use carina_proto::devcerts::{DevCa, Validity};
use carina_proto::nodestorage as pb;
use carina_tests::bridge::Bridge;
use carina_tests::csi::{ServedController, mount_cap};
use carina_tests::gocarina::go_host_dir;
use carina_tests::grpc::{self, TestNode, host_engine, server_cert};
use carina_tests::kube::KubeCluster;
use carina_tests::unique;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use tonic::Code;

const NODE: &str = "node-go";
const GROUP: &str = "g";
const MIB: u64 = 1 << 20;
/// Bound of every wait.
const DEADLINE: Duration = Duration::from_secs(30);

/// The object Go Carina v0.14.0 wrote for a HOST volume `name` on
/// [`NODE`] (its status is written apart, through the subresource).
fn go_object(name: &str, size: &str) -> LogicVolume {
    let mut lv = LogicVolume::new(
        name,
        LogicVolumeSpec {
            source: None,
            node_name: NODE.to_string(),
            size: Quantity(size.to_string()),
            device_group: GROUP.to_string(),
            pvc: "data".to_string(),
            name_space: "default".to_string(),
            cache: None,
        },
    );
    lv.metadata = ObjectMeta {
        name: Some(name.to_string()),
        annotations: Some(BTreeMap::from([(
            GO_VOLUME_TYPE_ANNOTATION.to_string(),
            "host".to_string(),
        )])),
        finalizers: Some(vec![LOGICVOLUME_FINALIZER.to_string()]),
        ..ObjectMeta::default()
    };
    lv
}

fn condition<'a>(lv: &'a LogicVolume, type_: &str) -> Option<(&'a str, &'a str)> {
    lv.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

async fn wait_for(
    lvs: &Api<LogicVolume>,
    name: &str,
    what: &str,
    done: impl Fn(&LogicVolume) -> bool,
) -> Result<LogicVolume> {
    carina_tests::kube::wait_for(lvs, name, what, DEADLINE, done).await
}

/// The number of volumes the node counts in the group. (A HOST group's
/// free bytes are its file system's, which other programs on the machine
/// change too; the volume count is the node's own account.)
async fn volume_count(node: &TestNode) -> Result<u32> {
    let groups = node
        .client("controller")
        .await?
        .capacity(pb::CapacityRequest::default())
        .await?
        .into_inner()
        .groups;
    let g = groups
        .iter()
        .find(|g| g.device_group == GROUP)
        .context("the group")?;
    Ok(g.volume_count)
}

fn expand(volume_id: &str, bytes: u64) -> csi::ControllerExpandVolumeRequest {
    csi::ControllerExpandVolumeRequest {
        volume_id: volume_id.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        volume_capability: Some(mount_cap("")),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_volumes_are_left_alone_until_taken_over() -> Result<()> {
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();

    let ca = DevCa::new("carina go takeover test CA", Validity::days(1))?;
    let (engine, dirs) = host_engine(GROUP, None).await?;
    let cert = server_cert(&ca, NODE, Validity::days(1))?;
    let same_ca = DevCa::from_pem(ca.cert_pem(), ca.key_pem())?;
    let node = TestNode::start_with(engine, NODE, same_ca, &cert).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let node_object = Node {
        metadata: ObjectMeta {
            name: Some(NODE.to_string()),
            annotations: Some(BTreeMap::from([(
                NODE_ENDPOINT_ANNOTATION.to_string(),
                node.endpoint(),
            )])),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    nodes.create(&PostParams::default(), &node_object).await?;
    let running = Bridge::start(
        client.clone(),
        node.client_tls("controller")?,
        Duration::from_secs(2),
        "kube-go-takeover-test",
    );
    let provisioner = KubeProvisioner::new(
        client.clone(),
        KubeProvisionerConfig {
            wait_timeout: DEADLINE,
            ..KubeProvisionerConfig::default()
        },
    );
    let served = ServedController::start(provisioner, "carina-go-takeover-").await?;
    let mut csi = served.csi.clone();
    let lvs: Api<LogicVolume> = Api::all(client.clone());

    // Go Carina's object, as Go left it.
    let name = format!("pvc-{}", unique("go"));
    let go_id = format!("host-{name}");
    lvs.create(&PostParams::default(), &go_object(&name, "64Mi"))
        .await
        .context("create the Go object")?;
    let go_status = LogicVolumeStatus {
        volume_id: Some(go_id.clone()),
        code: Some(0),
        message: Some(String::new()),
        current_size: Some(Quantity("64Mi".into())),
        status: Some("Success".into()),
        ..LogicVolumeStatus::default()
    };
    lvs.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": go_status })),
    )
    .await
    .context("write Go's status")?;
    // Its directory, as Go Carina made it.
    let dir = go_host_dir(&dirs.root, &go_id, "written by Go Carina");
    let before = volume_count(&node).await?;

    // The bridge leaves it alone but for the condition.
    let alone = wait_for(&lvs, &name, "Adopted=False", |lv| {
        condition(lv, ADOPTED) == Some(("False", GO_CARINA_VOLUME))
    })
    .await?;
    let status = alone.status.clone().context("status")?;
    assert_eq!(condition(&alone, "Ready"), None, "never marked Ready");
    assert_eq!(
        LogicVolumeStatus {
            conditions: Vec::new(),
            ..status
        },
        go_status,
        "Go's status fields untouched"
    );
    assert_eq!(alone.finalizers(), [LOGICVOLUME_FINALIZER.to_string()]);
    let mut nc = node.client("controller").await?;
    for local in [&name, &go_id] {
        assert!(
            grpc::get_lv(&mut nc, local).await?.is_none(),
            "nothing made on the node as {local}"
        );
    }
    assert_eq!(volume_count(&node).await?, before);
    assert_eq!(
        std::fs::read_to_string(dir.join("data.txt"))?,
        "written by Go Carina"
    );

    // With its Go id the controller refuses, and the object stays.
    let refused = [
        csi.delete_volume(csi::DeleteVolumeRequest {
            volume_id: go_id.clone(),
            ..Default::default()
        })
        .await
        .map(drop),
        csi.controller_expand_volume(expand(&go_id, 128 * MIB))
            .await
            .map(drop),
        csi.validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: go_id.clone(),
            volume_capabilities: vec![mount_cap("")],
            ..Default::default()
        })
        .await
        .map(drop),
    ];
    for (rpc, answer) in ["DeleteVolume", "ControllerExpandVolume", "Validate"]
        .iter()
        .zip(refused)
    {
        let status = answer.expect_err(rpc);
        assert_eq!(status.code(), Code::FailedPrecondition, "{rpc}: {status:?}");
        assert!(
            status.message().contains("carinactl migrate apply"),
            "{rpc}: {}",
            status.message()
        );
    }
    // A create named like it (a claim Go Carina had not finished) does
    // not hand out the Go object under an id of ours.
    let status = csi
        .create_volume(carina_tests::csi::create(&name, 64 * MIB, ""))
        .await
        .expect_err("a create onto Go's object");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("carinactl migrate apply"),
        "{}",
        status.message()
    );

    // A Go id no object has: its delete is done (as for ours), the rest
    // NOT_FOUND; a thin id is refused.
    let absent = format!("volume-pvc-{}", unique("absent"));
    csi.delete_volume(csi::DeleteVolumeRequest {
        volume_id: absent.clone(),
        ..Default::default()
    })
    .await
    .context("DeleteVolume of an absent Go volume")?;
    let status = csi
        .controller_expand_volume(expand(&absent, 128 * MIB))
        .await
        .expect_err("no such volume");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let status = csi
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: format!("thin-{name}"),
            ..Default::default()
        })
        .await
        .expect_err("thin");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("thin"), "{}", status.message());

    let kept = lvs.get(&name).await?;
    ensure!(
        kept.metadata.deletion_timestamp.is_none() && kept.spec.size.0 == "64Mi",
        "the refused calls changed the object: {kept:?}"
    );

    // Taken over: the node adopts the directory in place (AdoptLV), then
    // the object says so, as `carinactl migrate apply` does.
    let adopted = nc
        .adopt_lv(pb::AdoptLvRequest {
            name: go_id.clone(),
            device_group: GROUP.to_string(),
            policy: pb::Policy::Host as i32,
            size_bytes: 64 * MIB,
        })
        .await
        .context("AdoptLV")?
        .into_inner()
        .volume
        .context("the adopted volume")?;
    assert_eq!(adopted.name, go_id);
    assert_eq!(volume_count(&node).await?, before + 1);
    lvs.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": {ADOPTED_ANNOTATION: go_id}}})),
    )
    .await?;
    let found = wait_for(&lvs, &name, "Adopted=True", |lv| {
        condition(lv, ADOPTED).is_some_and(|(s, _)| s == "True")
    })
    .await?;
    assert_eq!(condition(&found, "Ready").map(|c| c.0), Some("True"));
    let status = found.status.clone().context("status")?;
    assert_eq!(
        status.volume_id.as_deref(),
        Some(go_id.as_str()),
        "the Go id kept"
    );
    assert_eq!(status.path.as_deref(), Some(dir.to_str().context("utf-8")?));

    // Served with its Go id: get, grow.
    let got = csi
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: go_id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(
        got.volume.map(|v| v.volume_id).as_deref(),
        Some(go_id.as_str())
    );
    let grown = csi
        .controller_expand_volume(expand(&go_id, 128 * MIB))
        .await?
        .into_inner();
    assert!(grown.capacity_bytes >= (128 * MIB) as i64, "{grown:?}");
    let on_node = grpc::get_lv(&mut nc, &go_id)
        .await?
        .context("the volume on the node")?;
    assert!(on_node.size_bytes >= 128 * MIB, "{on_node:?}");
    let current = lvs.get(&name).await?.status.and_then(|s| s.current_size);
    assert!(
        current
            .as_ref()
            .and_then(|q| quantity_bytes(q).ok())
            .is_some_and(|b| b >= 128 * MIB),
        "{current:?}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("data.txt"))?,
        "written by Go Carina"
    );

    // Deleted with its Go id: the volume goes and the room comes back.
    csi.delete_volume(csi::DeleteVolumeRequest {
        volume_id: go_id.clone(),
        ..Default::default()
    })
    .await
    .context("DeleteVolume with the Go id")?;
    carina_tests::kube::gone(&lvs, &name, DEADLINE).await?;
    assert!(grpc::get_lv(&mut nc, &go_id).await?.is_none());
    assert!(!dir.exists(), "{} still there", dir.display());
    assert_eq!(
        volume_count(&node).await?,
        before,
        "the node no longer counts it"
    );

    running.stop().await?;
    node.stop().await?;
    Ok(())
}
