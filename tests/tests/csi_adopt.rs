//! The CSI Node service with Go Carina's volume ids: a PersistentVolume
//! keeps the `volumeHandle` Go Carina wrote (`volume-<pv>`, `host-<pv>`),
//! so once the volume is taken over kubelet's calls with that id are
//! served on it (stage, publish, stats, expansion), its data intact, also
//! a publish with no stage before it (Go's node had no stage step); before
//! that each call is FAILED_PRECONDITION naming `carinactl migrate apply`
//! (never NOT_FOUND), and a thin id is refused.

use std::path::Path;

use carina_node::engine::{AdoptRequest, Policy};
use carina_proto::csi;
use carina_proto::csi::volume_capability::access_mode::Mode;
use carina_tests::csi_node::{CsiNode, WorkDir, mount_cap, stage_req, statfs, stats_req, usage_of};
use carina_tests::gocarina::{go_host_dir, go_lv_with_data};
use carina_tests::grpc::{host_engine, start_engine};
use carina_tests::{LoopDisk, VgGuard, disk_group_config, have_root, unique};
use tonic::Code;

const MIB: u64 = 1 << 20;

fn not_taken_over(status: &tonic::Status) {
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("carinactl migrate apply"),
        "{}",
        status.message()
    );
}

/// Publishes the Go volume `id` as the kubelet does while a pod still uses
/// a volume Go's node published: Go's node had no stage step, so no stage
/// call comes (the kubelet's staging directory is there, empty), and none
/// to unstage it will either. The volume is mounted straight onto the
/// target with its data, nothing at the staging path; unpublish leaves
/// nothing mounted. Then the usual stage and publish.
async fn publish_unstaged_then_staged(
    csi: &mut CsiNode,
    work: &WorkDir,
    id: &str,
    (staging, target): (&Path, &Path),
    cap: &csi::VolumeCapability,
) {
    std::fs::create_dir_all(staging).expect("staging directory");
    csi.publish(id, staging, target, cap.clone(), false)
        .await
        .expect("publish without a stage");
    assert_eq!(
        std::fs::read_to_string(target.join("data.txt")).expect("read"),
        "kept in place"
    );
    assert_eq!(work.mounts(), [target], "mounted at the target only");
    csi.unpublish(id, target).await.expect("unpublish");
    assert!(work.mounts().is_empty(), "{:?}", work.mounts());

    csi.stage(id, staging, cap.clone()).await.expect("stage");
    csi.publish(id, staging, target, cap.clone(), false)
        .await
        .expect("publish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_lvm_volume_is_served_by_its_go_id_once_taken_over() {
    const TEST: &str = "a_go_lvm_volume_is_served_by_its_go_id_once_taken_over";
    if !have_root(TEST) {
        return;
    }
    let disk = LoopDisk::new(1024 * MIB).expect("loop disk");
    let vg = unique("vg");
    let guard = VgGuard::new(&vg, &[&disk]);
    let engine = start_engine(&disk_group_config(&vg, "LVM", &[&disk], 0))
        .await
        .expect("engine");
    let dev = disk.dev();
    let id = format!("volume-{}", unique("pvc"));
    // Large enough for an xfs (300 MiB at least), which grows online here.
    go_lv_with_data(&[&dev], &vg, &id, 320 * MIB, "xfs", "kept in place");
    let mut csi = CsiNode::start(engine.clone()).await;
    let work = WorkDir::new();
    let staging = work.path("staging");
    let target = work.path("target");
    let cap = mount_cap(Mode::SingleNodeWriter, "xfs");
    let expand = |required: u64| csi::NodeExpandVolumeRequest {
        volume_id: id.clone(),
        volume_path: target.to_string_lossy().into_owned(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required as i64,
            limit_bytes: 0,
        }),
        staging_target_path: staging.to_string_lossy().into_owned(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };

    // Not taken over yet: every call that reads the id says so.
    not_taken_over(
        &csi.stage(&id, &staging, cap.clone())
            .await
            .expect_err("stage"),
    );
    not_taken_over(
        &csi.publish(&id, &staging, &target, cap.clone(), false)
            .await
            .expect_err("publish"),
    );
    not_taken_over(
        &csi.node
            .node_get_volume_stats(stats_req(&id, &target))
            .await
            .expect_err("stats"),
    );
    not_taken_over(
        &csi.node
            .node_expand_volume(expand(320 * MIB))
            .await
            .expect_err("expand"),
    );
    assert!(work.mounts().is_empty(), "{:?}", work.mounts());
    // A thin id is refused, as a Go id, not as an unknown one.
    let thin = format!("thin-{}", unique("pvc"));
    let err = csi
        .node
        .node_stage_volume(stage_req(&thin, &staging, cap.clone()))
        .await
        .expect_err("thin");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("thin"), "{}", err.message());

    engine
        .adopt_volume(AdoptRequest {
            name: id.clone(),
            group: vg.clone(),
            policy: Policy::Lvm,
            disk: None,
            partition_label: None,
            size_bytes: 320 * MIB,
        })
        .await
        .expect("adopt");

    publish_unstaged_then_staged(&mut csi, &work, &id, (&staging, &target), &cap).await;
    assert_eq!(
        std::fs::read_to_string(target.join("data.txt")).expect("read"),
        "kept in place",
        "staged without being formatted again"
    );
    let stats = csi
        .node
        .node_get_volume_stats(stats_req(&id, &target))
        .await
        .expect("stats")
        .into_inner();
    let (before, _) = statfs(&target);
    assert_eq!(usage_of(&stats, csi::volume_usage::Unit::Bytes), before);
    engine.resize_volume(&id, 640 * MIB).await.expect("grow");
    let resp = csi
        .node
        .node_expand_volume(expand(640 * MIB))
        .await
        .expect("expand")
        .into_inner();
    assert!(resp.capacity_bytes >= 640 * MIB as i64, "{resp:?}");
    let (after, _) = statfs(&target);
    assert!(
        after.0 > before.0 + 250 * MIB as i64,
        "{before:?} -> {after:?}"
    );
    assert_eq!(
        std::fs::read_to_string(target.join("data.txt")).expect("read"),
        "kept in place"
    );
    csi.unpublish_and_unstage(&id, &staging, &[&target]).await;
    assert!(work.mounts().is_empty(), "{:?}", work.mounts());
    drop(csi);
    drop(engine);
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_host_volume_is_served_by_its_go_id_once_taken_over() {
    const TEST: &str = "a_go_host_volume_is_served_by_its_go_id_once_taken_over";
    if !have_root(TEST) {
        return;
    }
    let group = unique("host");
    let (engine, dirs) = host_engine(&group, None).await.expect("engine");
    let id = format!("host-{}", unique("pvc"));
    go_host_dir(&dirs.root, &id, "kept in place");
    let mut csi = CsiNode::start(engine.clone()).await;
    let work = WorkDir::new();
    let staging = work.path("staging");
    let target = work.path("target");
    let cap = mount_cap(Mode::SingleNodeWriter, "");

    not_taken_over(
        &csi.stage(&id, &staging, cap.clone())
            .await
            .expect_err("stage"),
    );
    engine
        .adopt_volume(AdoptRequest {
            name: id.clone(),
            group: group.clone(),
            policy: Policy::Host,
            disk: None,
            partition_label: None,
            size_bytes: 8 * MIB,
        })
        .await
        .expect("adopt");
    publish_unstaged_then_staged(&mut csi, &work, &id, (&staging, &target), &cap).await;
    assert_eq!(
        std::fs::read_to_string(target.join("data.txt")).expect("read"),
        "kept in place"
    );
    // A single writer is refused there too while the volume is published,
    // and the target it mounted goes again.
    let (empty_staging, second) = (work.path("staging-2"), work.path("target-2"));
    std::fs::create_dir_all(&empty_staging).expect("staging directory");
    let err = csi
        .publish(
            &id,
            &empty_staging,
            &second,
            mount_cap(Mode::SingleNodeSingleWriter, ""),
            false,
        )
        .await
        .expect_err("a second writer");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("SINGLE_NODE_SINGLE_WRITER"),
        "{}",
        err.message()
    );
    assert!(!second.exists(), "{} left behind", second.display());
    csi.unpublish_and_unstage(&id, &staging, &[&target]).await;
    assert!(work.mounts().is_empty(), "{:?}", work.mounts());
}
