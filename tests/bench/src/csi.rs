//! The full CSI cycle — CreateVolume → NodeStageVolume → NodePublishVolume
//! → NodeUnpublishVolume → NodeUnstageVolume → DeleteVolume — through the
//! direct control plane and the node's CSI service (both over their unix
//! sockets, the node's NodeStorage over mTLS), against the bare commands
//! the cycle runs: lvcreate, (losetup: without device-mapper it is how a
//! block device appears), mkfs.ext4, mount, umount, (losetup -d), lvremove.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result};
use carina_controlplane::direct::DirectProvisioner;
use carina_controlplane::nodes::spec::{NodeList, NodeSpec};
use carina_csi::strategy::Strategy;
use carina_node::csi_local::serve::CsiNodeServer;
use carina_proto::csi;
use carina_proto::csi::node_client::NodeClient;
use carina_tests::csi::{ServedController, ServedCsi, create, delete, make, mount_cap};
use carina_tests::grpc::TestNode;
use carina_tests::run;

use crate::pool::LvmPool;
use crate::report::{Entry, timed};

const GROUP: &str = "CSI: full volume cycle (64 MiB ext4)";
const SIZE: u64 = 64 << 20;

pub async fn full_cycle(iterations: usize) -> Result<Vec<Entry>> {
    let pool = LvmPool::new("bench-csi", 4 << 30).await?;
    let (engine, vg, disk) = (&pool.engine, &pool.vg, &pool.disk);
    let loop_mode = pool.loop_mode();
    let work = tempfile::tempdir()?;
    let node_name = "bench-node";
    let node = TestNode::start(engine.clone(), node_name).await?;

    // Controller (direct control plane) and node CSI servers on sockets.
    let nodes = NodeList::new(vec![NodeSpec {
        name: node_name.into(),
        endpoint: node.endpoint(),
        topology: Default::default(),
    }])?;
    let provisioner =
        DirectProvisioner::new(nodes, node.client_tls("controller")?, Strategy::Spreadout);
    let served_controller = ServedController::start(provisioner, "carina-bench-ctl-").await?;
    let node_server = CsiNodeServer::new(engine.clone(), node_name);
    let served_node = ServedCsi::start("carina-bench-node-", |listener, shutdown| {
        node_server.serve(listener, shutdown)
    })
    .await?;
    let mut controller = served_controller.csi.clone();
    let mut csi_node = NodeClient::new(served_node.channel.clone());
    let capability = mount_cap("ext4");

    let (mut cycle, mut floor) = (Vec::new(), Vec::new());
    for i in 0..(iterations + 3) {
        let record = i >= 3;
        let staging = work.path().join(format!("staging-{i}"));
        let target = work.path().join(format!("target-{i}"));
        std::fs::create_dir_all(&staging)?;

        let t0 = Instant::now();
        let request = csi::CreateVolumeRequest {
            parameters: HashMap::from([(
                "carina.storage.io/disk-group-name".to_string(),
                vg.clone(),
            )]),
            ..create(&format!("cycle-{i}"), SIZE, "ext4")
        };
        let volume = make(&mut controller, request).await?;
        let id = volume.volume_id.clone();
        csi_node
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging.display().to_string(),
                volume_capability: Some(capability.clone()),
                volume_context: volume.volume_context.clone(),
                ..Default::default()
            })
            .await
            .context("NodeStageVolume")?;
        csi_node
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging.display().to_string(),
                target_path: target.display().to_string(),
                volume_capability: Some(capability.clone()),
                volume_context: volume.volume_context.clone(),
                ..Default::default()
            })
            .await
            .context("NodePublishVolume")?;
        csi_node
            .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: target.display().to_string(),
            })
            .await
            .context("NodeUnpublishVolume")?;
        csi_node
            .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging.display().to_string(),
            })
            .await
            .context("NodeUnstageVolume")?;
        delete(&mut controller, &id).await?;
        let c = t0.elapsed();

        // The floor: the same steps as bare commands.
        let name = format!("bare-{i}");
        let mnt = work.path().join(format!("bare-mnt-{i}"));
        std::fs::create_dir_all(&mnt)?;
        let mnt_s = mnt.display().to_string();
        let t0 = Instant::now();
        pool.bare_lvcreate(&name, "64m").run().await?;
        let dev = if loop_mode {
            let seg = pool.bare_lvs(&name, "seg_pe_ranges").run().await?.stdout;
            let first_pe: u64 = seg
                .trim()
                .rsplit(':')
                .next()
                .and_then(|r| r.split('-').next())
                .and_then(|n| n.parse().ok())
                .context("seg_pe_ranges")?;
            let offset = (1 << 20) + first_pe * (4 << 20);
            run(
                "losetup",
                &[
                    "-f",
                    "--show",
                    "--offset",
                    &offset.to_string(),
                    "--sizelimit",
                    &SIZE.to_string(),
                    &disk.dev(),
                ],
            )?
            .trim()
            .to_string()
        } else {
            format!("/dev/{vg}/{name}")
        };
        run("mkfs.ext4", &["-q", "-F", "-m0", &dev])?;
        run("mount", &[&dev, &mnt_s])?;
        run("umount", &[&mnt_s])?;
        if loop_mode {
            run("losetup", &["-d", &dev])?;
        }
        pool.bare_lvremove(&name).run().await?;
        let f = t0.elapsed();
        if record {
            cycle.push(c);
            floor.push(f);
        }
    }
    drop((served_controller, served_node));
    node.stop().await?;
    let floor_name = if loop_mode {
        "lvcreate, losetup, mkfs.ext4, mount, umount, losetup -d, lvremove"
    } else {
        "lvcreate, mkfs.ext4, mount, umount, lvremove"
    };
    Ok(vec![timed(
        GROUP,
        "csi.cycle.create_stage_publish_unpublish_unstage_delete",
        floor_name,
        &cycle,
        Some(&floor),
    )])
}
