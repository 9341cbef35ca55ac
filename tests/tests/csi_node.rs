//! CSI Node service against a real engine on loop devices, called through a
//! real tonic client over the node's unix socket: format and mount, bind
//! mounts into "pods", read-only publishes, online expansion, stats against
//! `stat -f`, raw block publishes, HOST directories, and malformed requests
//! that must change nothing.
//!
//! Every mount a test makes lives under its own work directory; a guard
//! unmounts everything under it on drop, also when the test panics.

use std::collections::HashMap;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use carina_node::engine::CreateRequest;
use carina_proto::csi;
use carina_proto::csi::volume_capability::access_mode::Mode;
use carina_tests::csi_node::{
    CsiNode, NODE, WorkDir, blkid_type, block_cap, lvm, mount_cap, publish_req, stage_req, statfs,
    stats_req, usage_of,
};
use carina_tests::grpc::{host_engine, start_engine};
use carina_tests::{LoopDisk, have_root, run, unique};
use tonic::Code;

const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restage_keeps_data_and_calls_are_idempotent() {
    let Some(lvm) = lvm("restage_keeps_data_and_calls_are_idempotent", 256 * MIB).await else {
        return;
    };
    let mut csi = CsiNode::start(lvm.engine.clone()).await;
    let work = WorkDir::new();
    let (id, device) = lvm.volume(64 * MIB).await;
    let staging = work.path("staging");
    let pod = work.path("pod");
    std::fs::create_dir(&pod).expect("pod dir");
    let target = pod.join("mount");
    let cap = mount_cap(Mode::SingleNodeWriter, "");

    let info = csi
        .identity
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .expect("plugin info")
        .into_inner();
    assert_eq!(info.name, "carina.storage.io");

    // The CO did not create the staging dir: the node does. Twice is OK.
    for _ in 0..2 {
        csi.stage(&id, &staging, cap.clone()).await.expect("stage");
    }
    assert_eq!(blkid_type(&device).as_deref(), Some("ext4"), "default fs");
    for _ in 0..2 {
        csi.publish(&id, &staging, &target, cap.clone(), false)
            .await
            .expect("publish");
    }
    // Same target, other readonly flag: incompatible.
    let err = csi
        .publish(&id, &staging, &target, cap.clone(), true)
        .await
        .expect_err("incompatible");
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    // Staged again as another fs type: incompatible.
    let err = csi
        .stage(&id, &staging, mount_cap(Mode::SingleNodeWriter, "xfs"))
        .await
        .expect_err("incompatible");
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");

    std::fs::write(target.join("data.txt"), b"survives restaging").expect("write");

    // Stats of the published volume match the kernel's statfs.
    let stats = csi
        .node
        .node_get_volume_stats(stats_req(&id, &target))
        .await
        .expect("stats")
        .into_inner();
    let (bytes, inodes) = statfs(&target);
    assert_eq!(usage_of(&stats, csi::volume_usage::Unit::Bytes), bytes);
    assert_eq!(usage_of(&stats, csi::volume_usage::Unit::Inodes), inodes);
    assert!(!stats.volume_condition.as_ref().expect("condition").abnormal);
    assert!(
        bytes.0 > 50 * MIB as i64 && bytes.0 <= 64 * MIB as i64,
        "{bytes:?}"
    );

    for _ in 0..2 {
        csi.unpublish(&id, &target).await.expect("unpublish");
    }
    assert!(!target.exists(), "the node removes the target it created");
    for _ in 0..2 {
        csi.unstage(&id, &staging).await.expect("unstage");
    }
    assert!(work.mounts().is_empty(), "{:?}", work.mounts());
    assert!(staging.is_dir(), "the staging dir is the CO's; it stays");

    // The unmounted staging path: the volume is not there any more.
    let stats = csi
        .node
        .node_get_volume_stats(stats_req(&id, &staging))
        .await
        .expect("stats of an unmounted path")
        .into_inner();
    assert!(stats.volume_condition.as_ref().expect("condition").abnormal);

    // The ext4 is never reformatted as xfs.
    let err = csi
        .stage(&id, &staging, mount_cap(Mode::SingleNodeWriter, "xfs"))
        .await
        .expect_err("occupied");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("ext4") && err.message().contains("xfs"),
        "{}",
        err.message()
    );
    assert!(work.mounts().is_empty());

    // Back again, with the type named this time: the data is still there.
    csi.stage(&id, &staging, mount_cap(Mode::SingleNodeWriter, "ext4"))
        .await
        .expect("restage");
    csi.publish(&id, &staging, &target, cap.clone(), false)
        .await
        .expect("republish");
    assert_eq!(
        std::fs::read(target.join("data.txt")).expect("read back"),
        b"survives restaging"
    );
    csi.unpublish_and_unstage(&id, &staging, &[&target]).await;
    assert!(work.mounts().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_publish_refuses_writes() {
    let Some(lvm) = lvm("read_only_publish_refuses_writes", 256 * MIB).await else {
        return;
    };
    let mut csi = CsiNode::start(lvm.engine.clone()).await;
    let work = WorkDir::new();
    let (id, _) = lvm.volume(32 * MIB).await;
    let staging = work.path("staging");
    let cap = mount_cap(Mode::SingleNodeWriter, "ext4");
    csi.stage(&id, &staging, cap.clone()).await.expect("stage");
    let rw = work.path("rw");
    csi.publish(&id, &staging, &rw, cap.clone(), false)
        .await
        .expect("publish rw");
    std::fs::write(rw.join("seen"), b"by both").expect("write rw");

    // A single-writer mode may not join a volume published elsewhere.
    let lone = work.path("lone");
    let err = csi
        .publish(
            &id,
            &staging,
            &lone,
            mount_cap(Mode::SingleNodeSingleWriter, "ext4"),
            false,
        )
        .await
        .expect_err("already published at rw");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("rw"), "{}", err.message());
    assert!(!lone.exists());

    // readonly=true, and the read-only access mode: both refuse writes.
    let ro = work.path("ro");
    csi.publish(&id, &staging, &ro, cap.clone(), true)
        .await
        .expect("publish ro");
    let ro_mode = work.path("ro-mode");
    csi.publish(
        &id,
        &staging,
        &ro_mode,
        mount_cap(Mode::SingleNodeReaderOnly, "ext4"),
        false,
    )
    .await
    .expect("publish read-only mode");
    for path in [&ro, &ro_mode] {
        assert_eq!(std::fs::read(path.join("seen")).expect("read"), b"by both");
        let err = std::fs::write(path.join("new"), b"x").expect_err("read-only");
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::ReadOnlyFilesystem,
            "{path:?}: {err}"
        );
    }
    std::fs::write(rw.join("still"), b"writable").expect("the rw publish stays writable");

    for t in [&rw, &ro, &ro_mode] {
        csi.unpublish(&id, t).await.expect("unpublish");
    }
    csi.unstage(&id, &staging).await.expect("unstage");
    assert!(work.mounts().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_expansion_grows_xfs() {
    let Some(lvm) = lvm("online_expansion_grows_xfs", 1024 * MIB).await else {
        return;
    };
    let mut csi = CsiNode::start(lvm.engine.clone()).await;
    let work = WorkDir::new();
    let (id, device) = lvm.volume(320 * MIB).await;
    let staging = work.path("staging");
    let target = work.path("target");
    let cap = mount_cap(Mode::SingleNodeWriter, "xfs");
    csi.stage(&id, &staging, cap.clone())
        .await
        .expect("stage xfs");
    assert_eq!(blkid_type(&device).as_deref(), Some("xfs"));
    csi.publish(&id, &staging, &target, cap.clone(), false)
        .await
        .expect("publish");
    std::fs::write(target.join("before"), b"grown under me").expect("write");
    let (before, _) = statfs(&target);

    // Asking for more than the device has: the controller grows it first.
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
    let err = csi
        .node
        .node_expand_volume(expand(640 * MIB))
        .await
        .expect_err("device not grown yet");
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");

    let name = id.split('@').next().expect("name");
    lvm.engine
        .resize_volume(name, 640 * MIB)
        .await
        .expect("engine grows the LV");
    let resp = csi
        .node
        .node_expand_volume(expand(640 * MIB))
        .await
        .expect("expand online")
        .into_inner();
    assert!(resp.capacity_bytes >= 640 * MIB as i64, "{resp:?}");
    let (after, _) = statfs(&target);
    assert!(
        after.0 > before.0 + 250 * MIB as i64,
        "statfs total {} -> {}",
        before.0,
        after.0
    );
    // Stats see the grown filesystem; the data is intact.
    let stats = csi
        .node
        .node_get_volume_stats(stats_req(&id, &target))
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(usage_of(&stats, csi::volume_usage::Unit::Bytes).0, after.0);
    assert_eq!(
        std::fs::read(target.join("before")).expect("read"),
        b"grown under me"
    );
    // Again: nothing left to grow, still OK.
    csi.node
        .node_expand_volume(expand(640 * MIB))
        .await
        .expect("expand again");

    csi.unpublish_and_unstage(&id, &staging, &[&target]).await;
    assert!(work.mounts().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_access_publishes_the_device_node() {
    let Some(lvm) = lvm("block_access_publishes_the_device_node", 256 * MIB).await else {
        return;
    };
    let mut csi = CsiNode::start(lvm.engine.clone()).await;
    let work = WorkDir::new();
    let (id, device) = lvm.volume(48 * MIB).await;
    let staging = work.path("staging");
    let pod = work.path("pod");
    std::fs::create_dir(&pod).expect("pod dir");
    let target = pod.join("dev");

    csi.stage(&id, &staging, block_cap())
        .await
        .expect("stage block");
    assert!(
        work.mounts().is_empty(),
        "block access mounts nothing at staging"
    );
    for _ in 0..2 {
        csi.publish(&id, &staging, &target, block_cap(), false)
            .await
            .expect("publish block");
    }
    let meta = std::fs::metadata(&target).expect("target");
    assert!(meta.file_type().is_block_device(), "{meta:?}");
    assert_eq!(
        meta.rdev(),
        std::fs::metadata(&device).expect("device").rdev()
    );
    let size: u64 = run("blockdev", &["--getsize64", &target.to_string_lossy()])
        .expect("blockdev")
        .trim()
        .parse()
        .expect("size");
    assert_eq!(size, 48 * MIB);
    assert_eq!(blkid_type(&device), None, "block access never formats");

    let stats = csi
        .node
        .node_get_volume_stats(stats_req(&id, &target))
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(
        usage_of(&stats, csi::volume_usage::Unit::Bytes).0,
        48 * MIB as i64
    );

    // Expansion of a block volume has nothing to grow.
    let resp = csi
        .node
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: id.clone(),
            volume_path: target.to_string_lossy().into_owned(),
            volume_capability: Some(block_cap()),
            ..Default::default()
        })
        .await
        .expect("expand block")
        .into_inner();
    assert_eq!(resp.capacity_bytes, 48 * MIB as i64);

    csi.unpublish(&id, &target).await.expect("unpublish");
    assert!(!target.exists(), "the device file is removed");
    csi.unstage(&id, &staging).await.expect("unstage");
    assert!(work.mounts().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_directory_volume_is_bind_mounted() {
    if !have_root("host_directory_volume_is_bind_mounted") {
        return;
    }
    let group = unique("host");
    let (engine, _dirs) = host_engine(&group, None).await.expect("engine");
    let mut csi = CsiNode::start(engine.clone()).await;
    let work = WorkDir::new();
    let name = unique("pvc");
    let v = engine
        .create_volume(CreateRequest {
            name: name.clone(),
            group: group.clone(),
            size_bytes: 16 * MIB,
            exclusive: false,
        })
        .await
        .expect("create");
    let dir = v.host_path.expect("directory");
    let id = format!("{name}@{NODE}");
    let staging = work.path("staging");
    let target = work.path("target");
    // An fs type is meaningless for a directory and is not applied.
    let cap = mount_cap(Mode::SingleNodeWriter, "ext4");

    // Block access of a directory is impossible.
    let err = csi
        .stage(&id, &staging, block_cap())
        .await
        .expect_err("directory as block");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(!staging.exists());

    for _ in 0..2 {
        csi.stage_and_publish(&id, &staging, &target, cap.clone())
            .await;
    }
    std::fs::write(target.join("hello"), b"host").expect("write");
    assert_eq!(
        std::fs::read(dir.join("hello")).expect("in the volume dir"),
        b"host"
    );
    let stats = csi
        .node
        .node_get_volume_stats(stats_req(&id, &target))
        .await
        .expect("stats")
        .into_inner();
    assert!(!stats.volume_condition.as_ref().expect("condition").abnormal);
    assert!(usage_of(&stats, csi::volume_usage::Unit::Bytes).0 > 0);

    csi.unpublish_and_unstage(&id, &staging, &[&target]).await;
    assert!(work.mounts().is_empty());
    assert_eq!(
        std::fs::read(dir.join("hello")).expect("data stays"),
        b"host"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_the_spec_code_and_change_nothing() {
    let Some(lvm) = lvm(
        "malformed_requests_get_the_spec_code_and_change_nothing",
        256 * MIB,
    )
    .await
    else {
        return;
    };
    let mut csi = CsiNode::start(lvm.engine.clone()).await;
    let work = WorkDir::new();
    let (id, device) = lvm.volume(32 * MIB).await;
    let other_node = id.replace(&format!("@{NODE}"), "@node-b");
    let staging = work.path("staging");
    std::fs::create_dir(&staging).expect("staging dir");
    let file = work.path("a-file");
    std::fs::write(&file, b"not a directory").expect("file");
    let target = work.path("target");
    let ok = mount_cap(Mode::SingleNodeWriter, "ext4");

    let stage_cases: Vec<(&str, csi::NodeStageVolumeRequest, Code)> = vec![
        (
            "missing volume id",
            stage_req("", &staging, ok.clone()),
            Code::InvalidArgument,
        ),
        (
            "missing staging path",
            csi::NodeStageVolumeRequest {
                staging_target_path: String::new(),
                ..stage_req(&id, &staging, ok.clone())
            },
            Code::InvalidArgument,
        ),
        (
            "missing capability",
            csi::NodeStageVolumeRequest {
                volume_capability: None,
                ..stage_req(&id, &staging, ok.clone())
            },
            Code::InvalidArgument,
        ),
        (
            "multi-node access mode",
            stage_req(&id, &staging, mount_cap(Mode::MultiNodeMultiWriter, "ext4")),
            Code::InvalidArgument,
        ),
        (
            "unknown fs type",
            stage_req(&id, &staging, mount_cap(Mode::SingleNodeWriter, "ntfs")),
            Code::InvalidArgument,
        ),
        (
            "unknown fs type in the volume context",
            csi::NodeStageVolumeRequest {
                volume_context: HashMap::from([(
                    "csi.storage.k8s.io/fstype".to_string(),
                    "vfat".to_string(),
                )]),
                ..stage_req(&id, &staging, mount_cap(Mode::SingleNodeWriter, ""))
            },
            Code::InvalidArgument,
        ),
        (
            "staging path that is a file",
            stage_req(&id, &file, ok.clone()),
            Code::InvalidArgument,
        ),
        (
            "relative staging path",
            csi::NodeStageVolumeRequest {
                staging_target_path: "staging".into(),
                ..stage_req(&id, &staging, ok.clone())
            },
            Code::InvalidArgument,
        ),
        (
            "volume of another node",
            stage_req(&other_node, &staging, ok.clone()),
            Code::NotFound,
        ),
        (
            "malformed volume id",
            stage_req("no-node-in-it", &staging, ok.clone()),
            Code::NotFound,
        ),
    ];
    for (what, req, code) in stage_cases {
        let err = csi.node.node_stage_volume(req).await.expect_err(what);
        assert_eq!(err.code(), code, "{what}: {err:?}");
        assert!(work.mounts().is_empty(), "{what}: {:?}", work.mounts());
        assert_eq!(
            blkid_type(&device),
            None,
            "{what}: the device was formatted"
        );
    }

    let publish_cases: Vec<(&str, csi::NodePublishVolumeRequest, Code)> = vec![
        (
            "missing volume id",
            publish_req("", &staging, &target, ok.clone(), false),
            Code::InvalidArgument,
        ),
        (
            "missing target path",
            csi::NodePublishVolumeRequest {
                target_path: String::new(),
                ..publish_req(&id, &staging, &target, ok.clone(), false)
            },
            Code::InvalidArgument,
        ),
        (
            "relative target path",
            csi::NodePublishVolumeRequest {
                target_path: "pods/x/mount".into(),
                ..publish_req(&id, &staging, &target, ok.clone(), false)
            },
            Code::InvalidArgument,
        ),
        (
            "missing capability",
            csi::NodePublishVolumeRequest {
                volume_capability: None,
                ..publish_req(&id, &staging, &target, ok.clone(), false)
            },
            Code::InvalidArgument,
        ),
        (
            "multi-node access mode",
            publish_req(
                &id,
                &staging,
                &target,
                mount_cap(Mode::MultiNodeReaderOnly, "ext4"),
                false,
            ),
            Code::InvalidArgument,
        ),
        (
            "volume of another node",
            publish_req(&other_node, &staging, &target, ok.clone(), false),
            Code::NotFound,
        ),
        (
            "not staged",
            publish_req(&id, &staging, &target, ok.clone(), false),
            Code::FailedPrecondition,
        ),
        (
            "target parent missing",
            publish_req(
                &id,
                &staging,
                &work.path("no/such/target"),
                block_cap(),
                false,
            ),
            Code::FailedPrecondition,
        ),
    ];
    for (what, req, code) in publish_cases {
        let err = csi.node.node_publish_volume(req).await.expect_err(what);
        assert_eq!(err.code(), code, "{what}: {err:?}");
        assert!(work.mounts().is_empty(), "{what}: {:?}", work.mounts());
        assert!(!target.exists(), "{what}: the target was created");
    }

    let other_cases: Vec<(&str, Result<(), tonic::Status>, Code)> = vec![
        (
            "unpublish without target",
            csi.unpublish(&id, Path::new("")).await.map(drop),
            Code::InvalidArgument,
        ),
        (
            "unstage without volume id",
            csi.unstage("", &staging).await.map(drop),
            Code::InvalidArgument,
        ),
        (
            "stats of another node's volume",
            csi.node
                .node_get_volume_stats(stats_req(&other_node, &staging))
                .await
                .map(drop),
            Code::NotFound,
        ),
        (
            "stats of a path the volume is not at",
            csi.node
                .node_get_volume_stats(stats_req(&id, &work.path("nowhere")))
                .await
                .map(drop),
            Code::NotFound,
        ),
        (
            "expand without volume path",
            csi.node
                .node_expand_volume(csi::NodeExpandVolumeRequest {
                    volume_id: id.clone(),
                    ..Default::default()
                })
                .await
                .map(drop),
            Code::InvalidArgument,
        ),
    ];
    for (what, result, code) in other_cases {
        let err = result.expect_err(what);
        assert_eq!(err.code(), code, "{what}: {err:?}");
    }
    assert!(work.mounts().is_empty());
    assert!(staging.is_dir() && std::fs::read_dir(&staging).expect("ls").next().is_none());
    assert_eq!(std::fs::read(&file).expect("file"), b"not a directory");
    assert_eq!(blkid_type(&device), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_partition_is_formatted_when_blank() {
    if !have_root("raw_partition_is_formatted_when_blank") {
        return;
    }
    let disk = LoopDisk::new(128 * MIB).expect("loop disk");
    let group = unique("raw");
    let engine = start_engine(&carina_tests::disk_group_config(&group, "RAW", &[&disk], 0))
        .await
        .expect("engine");
    let mut csi = CsiNode::start(engine.clone()).await;
    let work = WorkDir::new();
    let name = unique("pvc");
    let v = engine
        .create_volume(CreateRequest {
            name: name.clone(),
            group,
            size_bytes: 32 * MIB,
            exclusive: false,
        })
        .await
        .expect("create");
    let device = v.device_path.expect("partition");
    // A blank GPT partition still shows its table entry to blkid -p.
    assert_eq!(blkid_type(&device), None);
    let id = format!("{name}@{NODE}");
    let staging = work.path("staging");
    let target = work.path("target");
    let cap = mount_cap(Mode::SingleNodeWriter, "");
    csi.stage(&id, &staging, cap.clone())
        .await
        .expect("stage a blank partition");
    assert_eq!(blkid_type(&device).as_deref(), Some("ext4"));
    csi.publish(&id, &staging, &target, cap, false)
        .await
        .expect("publish");
    std::fs::write(target.join("f"), b"raw").expect("write");
    csi.unpublish_and_unstage(&id, &staging, &[&target]).await;
    assert!(work.mounts().is_empty());
}

/// A volume filled from a smaller snapshot or volume holds a filesystem
/// smaller than itself: staging grows it to fill the volume (ext4 before
/// mounting, as an offline resize; xfs once mounted), keeping its files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filesystem_smaller_than_its_volume_is_grown_at_stage() {
    let Some(lvm) = lvm(
        "a_filesystem_smaller_than_its_volume_is_grown_at_stage",
        2048 * MIB,
    )
    .await
    else {
        return;
    };
    let mut csi = CsiNode::start(lvm.engine.clone()).await;
    let work = WorkDir::new();
    for (fs, mkfs) in [
        ("xfs", vec!["mkfs.xfs", "-q", "-f", "-d", "size=320m"]),
        ("ext4", vec!["mkfs.ext4", "-q", "-F", "-m0"]),
    ] {
        let (id, device) = lvm.volume(640 * MIB).await;
        let dev = device.to_string_lossy().into_owned();
        let mut args: Vec<&str> = mkfs[1..].to_vec();
        args.push(&dev);
        if fs == "ext4" {
            args.push("320M");
        }
        run(mkfs[0], &args).expect("mkfs on part of the device");
        // A file in the small filesystem, as a copy would bring it.
        let seed = work.path(&format!("seed-{fs}"));
        std::fs::create_dir_all(&seed).expect("seed dir");
        run("mount", &[&dev, &seed.to_string_lossy()]).expect("mount seed");
        std::fs::write(seed.join("kept"), b"from the source").expect("write");
        run("umount", &[&seed.to_string_lossy()]).expect("umount seed");

        let staging = work.path(&format!("staging-{fs}"));
        let cap = mount_cap(Mode::SingleNodeWriter, fs);
        csi.stage(&id, &staging, cap.clone()).await.expect("stage");
        let (total, _) = statfs(&staging);
        assert!(
            total.0 > 560 * MIB as i64,
            "{fs}: the staged filesystem spans {} bytes of a 640 MiB volume",
            total.0
        );
        assert_eq!(
            std::fs::read(staging.join("kept")).expect("read"),
            b"from the source",
            "{fs}"
        );
        // Staging again finds nothing to grow.
        csi.stage(&id, &staging, cap).await.expect("stage again");
        csi.unstage(&id, &staging).await.expect("unstage");
    }
    assert!(work.mounts().is_empty());
}
