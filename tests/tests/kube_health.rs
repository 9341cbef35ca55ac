//! Volume condition through the Kubernetes control plane: a real
//! kube-apiserver and etcd, one `carina-node` process with an LVM group on
//! one loop disk, a RAW group on another and a HOST group, and
//! `carina-controller --mode kube` as a process, driven through its CSI
//! socket.
//!
//! It proves that `ListVolumes` and `ControllerGetVolume` report each
//! volume's condition as the node sees it now, naming what is wrong:
//! - a RAW volume whose disk's loop device is gone when the node restarts;
//! - a HOST volume whose directory was removed (while the node runs: a
//!   node start makes a missing directory again, empty, and warns);
//! - an LVM volume whose disk's backing file was deleted (the loop device
//!   still answers, but its data goes with the last close);
//!
//! that an LVM volume whose own loop device is detached from under it is
//! attached again by the node and stays sound, and that the node keeps
//! serving: a new volume in the sound group is
//! made and reported normal, and the volumes are deleted without leftovers.
//! The node's own `GetLV` carries the same conditions.
//!
//! Needs root and loop devices, etcd and kube-apiserver from
//! `tests/tools/build.sh etcd kube`, and `cargo build --workspace --bins`.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result};
use carina_api::LogicVolume;
use carina_csi::params::DISK_GROUP;
use carina_proto::csi;
use carina_tests::cluster::{KubeControllerArgs, NodeArgs, Pki, await_capacity, register_node};
use carina_tests::csi::{Csi, create, delete, make, on};
use carina_tests::grpc::get_lv;
use carina_tests::kube::{KubeCluster, gone};
use carina_tests::{LoopDisk, VgGuard, have_root, unique};
use kube::api::{Api, ListParams};

const NODE: &str = "node-h";
const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(60);

/// `CreateVolume` of 64 MiB in `group` on the test's node.
fn request(name: &str, group: &str) -> csi::CreateVolumeRequest {
    let mut req = create(name, 64 * MIB, "");
    req.parameters = HashMap::from([(DISK_GROUP.to_string(), group.to_string())]);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![on(NODE)],
        preferred: vec![on(NODE)],
    });
    req
}

/// The condition `ControllerGetVolume` reports for `volume_id`.
async fn condition(csi: &mut Csi, volume_id: &str) -> Result<csi::VolumeCondition> {
    let r = csi
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: volume_id.to_string(),
        })
        .await
        .with_context(|| format!("ControllerGetVolume {volume_id}"))?
        .into_inner();
    assert_eq!(
        r.volume.as_ref().map(|v| v.volume_id.as_str()),
        Some(volume_id)
    );
    r.status
        .and_then(|s| s.volume_condition)
        .context("no volume_condition")
}

/// Every listed volume's condition, by id.
async fn listed(csi: &mut Csi) -> Result<HashMap<String, csi::VolumeCondition>> {
    let r = csi
        .list_volumes(csi::ListVolumesRequest::default())
        .await?
        .into_inner();
    r.entries
        .into_iter()
        .map(|e| {
            let id = e.volume.context("entry without volume")?.volume_id;
            let c = e
                .status
                .and_then(|s| s.volume_condition)
                .with_context(|| format!("{id}: no volume_condition"))?;
            Ok((id, c))
        })
        .collect()
}

fn normal() -> csi::VolumeCondition {
    csi::VolumeCondition {
        abnormal: false,
        message: String::new(),
    }
}

#[tokio::test]
async fn list_and_get_report_what_the_node_sees() -> Result<()> {
    if !have_root("list_and_get_report_what_the_node_sees") {
        return Ok(());
    }
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();
    let dir = tempfile::Builder::new()
        .prefix("carina-health-")
        .tempdir()?;
    let pki = Pki::write(&dir.path().join("pki"))?;
    let (lvm_group, raw_group, host_group) = (unique("hl"), unique("hr"), unique("hh"));
    let lvm_disk = LoopDisk::new(256 * MIB)?;
    let _vg = VgGuard::new(&lvm_group, &[&lvm_disk]);
    let mut raw_disk = LoopDisk::new(256 * MIB)?;
    let host_root = dir.path().join("host-root");
    let config = format!(
        r#"{{"diskSelector":[
            {{"name":"{lvm_group}","re":["{}"],"policy":"LVM","reserveBytes":0,"minDiskBytes":1048576}},
            {{"name":"{raw_group}","re":["{}"],"policy":"RAW","reserveBytes":0,"minDiskBytes":1048576}},
            {{"name":"{host_group}","policy":"HOST","root":"{}","reserveBytes":0}}
        ],"diskScanInterval":"0"}}"#,
        lvm_disk.pattern(),
        raw_disk.pattern(),
        host_root.display()
    );
    let args = NodeArgs::new(
        NODE,
        &pki,
        &config,
        &dir.path().join(NODE),
        &cluster.log_dir().join(format!("{NODE}.log")),
    )?;
    let mut node = args.start().await?;
    register_node(&client, NODE, &args.endpoint()).await?;
    let mut controller = KubeControllerArgs::new(
        "carina-controller",
        &unique("carina-controller"),
        cluster.kubeconfig_path(),
        &pki,
        dir.path(),
        &cluster.log_dir().join("carina-controller.log"),
    )
    .start()
    .await?;
    await_capacity(&client, NODE, WAIT).await?;
    let mut csi = Csi::new(controller.channel().await?);

    let lvm = make(&mut csi, request("health-lvm", &lvm_group)).await?;
    let raw = make(&mut csi, request("health-raw", &raw_group)).await?;
    let host = make(&mut csi, request("health-host", &host_group)).await?;
    let ids = [&lvm, &raw, &host].map(|v| v.volume_id.clone());
    let all = listed(&mut csi).await?;
    for id in &ids {
        assert_eq!(all.get(id), Some(&normal()), "{id} is sound: {all:?}");
        assert_eq!(condition(&mut csi, id).await?, normal(), "{id}");
    }

    // RAW: the disk's loop device is gone when the node comes back (the
    // running node holds its disks open, so the kernel would only detach
    // it once the node lets go).
    node.stop().await;
    raw_disk.detach()?;
    node.restart().await?;
    await_capacity(&client, NODE, WAIT).await?;
    let mut storage = pki.node_client(NODE, &args.endpoint()).await?;
    assert_eq!(get_lv(&mut storage, "health-raw").await?, None);
    let c = condition(&mut csi, &raw.volume_id).await?;
    assert!(c.abnormal, "{c:?}");
    assert_eq!(
        c.message,
        format!("node {NODE} no longer has volume \"health-raw\"")
    );

    // HOST: the directory goes.
    let host_lv = get_lv(&mut storage, "health-host")
        .await?
        .context("the node has the HOST volume")?;
    assert_eq!(host_lv.condition.as_ref().map(|c| c.abnormal), Some(false));
    std::fs::remove_dir_all(&host_lv.host_path)?;
    let c = condition(&mut csi, &host.volume_id).await?;
    assert!(c.abnormal, "{c:?}");
    assert!(
        c.message.contains(NODE)
            && c.message
                .contains(&format!("directory {} is gone", host_lv.host_path)),
        "{}",
        c.message
    );

    // LVM: the volume's own loop device (activation without
    // device-mapper) is detached from under it; the node attaches it again
    // when asked, and the volume is sound.
    let lvm_lv = get_lv(&mut storage, "health-lvm")
        .await?
        .context("the node has the LVM volume")?;
    carina_tests::run("losetup", &["-d", &lvm_lv.device_path])?;
    assert_eq!(condition(&mut csi, &lvm.volume_id).await?, normal());
    let again = get_lv(&mut storage, "health-lvm")
        .await?
        .context("the node still has the LVM volume")?;
    assert!(
        std::path::Path::new(&again.device_path).exists(),
        "{again:?}"
    );
    assert_eq!(again.size_bytes, lvm_lv.size_bytes);

    // LVM: the disk's backing file is deleted under the loop device.
    std::fs::remove_file(lvm_disk.file())?;
    let c = condition(&mut csi, &lvm.volume_id).await?;
    assert!(c.abnormal, "{c:?}");
    assert!(
        c.message.contains(&format!(
            "physical volume {} is a loop device whose backing file",
            lvm_disk.dev()
        )) && c.message.contains("was deleted"),
        "{}",
        c.message
    );
    let node_view = get_lv(&mut storage, "health-lvm")
        .await?
        .context("the node still lists the LVM volume")?
        .condition
        .context("GetLV carries the condition")?;
    assert!(node_view.abnormal, "{node_view:?}");

    // ListVolumes says the same, volume by volume.
    let all = listed(&mut csi).await?;
    for id in &ids {
        let c = all.get(id).with_context(|| format!("{id} listed"))?;
        assert!(c.abnormal, "{id}: {c:?}");
        assert_eq!(c, &condition(&mut csi, id).await?, "{id}");
    }

    // The node keeps serving its groups: a new HOST volume is made, sound.
    let fresh = make(&mut csi, request("health-fresh", &host_group)).await?;
    assert_eq!(condition(&mut csi, &fresh.volume_id).await?, normal());

    // A volume the node no longer has is still deleted cleanly.
    for id in ids.iter().chain([&fresh.volume_id]) {
        delete(&mut csi, id).await?;
    }
    let lvs: Api<LogicVolume> = Api::all(client.clone());
    for name in ["health-lvm", "health-raw", "health-host", "health-fresh"] {
        gone(&lvs, name, WAIT).await?;
    }
    assert!(lvs.list(&ListParams::default()).await?.items.is_empty());
    assert_eq!(listed(&mut csi).await?.len(), 0);
    node.check_running()?;
    controller.check_running()?;
    Ok(())
}
