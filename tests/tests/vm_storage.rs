//! The production disk path on a real kernel (the `vm` tier): one boot of
//! the guest (`carina_tests::vm`) runs `guest_storage` of this executable,
//! which serves the node's engine, NodeStorage and CSI Node services over
//! the guest's real drivers and prints a pass line per check:
//!
//! - LVM with `activation: auto` picks device-mapper; create, expand and
//!   delete through NodeStorage; `/dev/<vg>/<lv>` is a device-mapper node
//!   that appears and disappears; a restarted node finds its volumes, and
//!   re-activates a volume group deactivated under it (as after a reboot).
//! - Online growth through CSI NodeExpandVolume of mounted ext4 and xfs on
//!   device-mapper volumes.
//! - RAW partitions on a virtio disk: the kernel sees each new partition;
//!   a mounted one is refused for delete.
//!
//! On the host, `real_kernel_storage` boots the guest and fails on
//! anything but the guest's explicit pass lines.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use carina_node::csi_local::serve::CsiNodeServer;
use carina_node::engine::bcache::BcacheOptions;
use carina_node::engine::{Config, CreateRequest, Engine, EngineOptions, Error};
use carina_proto::csi;
use carina_proto::csi::node_client::NodeClient;
use carina_proto::csi::volume_capability::access_mode::Mode;
use carina_proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use carina_proto::nodestorage as pb;
use carina_tests::csi::ServedCsi;
use carina_tests::grpc::{TestNode, create_lv, get_lv};
use carina_tests::vm::{Vm, in_guest, is_device_mapper, pass};
use carina_tests::{MountGuard, have_root, run, stat_fs};
use tonic::transport::Channel;

const MIB: u64 = 1 << 20;
const NODE: &str = "vm-node";
/// The LVM group (and volume group) on `/dev/vda`.
const VG: &str = "vmvg";
/// The RAW group on `/dev/vdb`.
const RAW: &str = "vmraw";
/// The LVM group for bcache caches on `/dev/vdc`.
const SSD: &str = "vmssd";
/// The node's state directory in the guest (bcache records).
const STATE: &str = "/var/lib/carina";

/// Every check the guest must pass, in the order it runs them.
const CHECKS: &[&str] = &[
    "lvm-device-mapper",
    "lvm-create",
    "lvm-expand",
    "lvm-restart",
    "lvm-reactivate",
    "lvm-delete",
    "csi-expand-ext4",
    "csi-expand-xfs",
    "raw-partitions",
    "raw-busy-delete",
    "bcache-create",
    "bcache-mode",
    "bcache-stage",
    "bcache-restart",
    "bcache-delete",
    "iolimits-cgroup-v2",
];

#[test]
fn real_kernel_storage() {
    if !have_root("real_kernel_storage") {
        return;
    }
    let console = Vm::new("storage")
        .and_then(|vm| vm.disk(2048 * MIB))
        .and_then(|vm| vm.disk(1024 * MIB))
        .and_then(|vm| vm.disk(1024 * MIB))
        .and_then(|vm| vm.guest_test("guest_storage"))
        .map(|vm| vm.timeout(Duration::from_secs(600)))
        .and_then(Vm::boot)
        .expect("the guest boots and powers off");
    console.assert_passed(CHECKS);
}

fn config() -> Config {
    Config::from_json(&format!(
        r#"{{"diskSelector":[
            {{"name":"{VG}","re":["^vda$"],"policy":"LVM","activation":"auto","reserveBytes":0,"minDiskBytes":1048576}},
            {{"name":"{RAW}","re":["^vdb$"],"policy":"RAW","reserveBytes":0,"minDiskBytes":1048576}},
            {{"name":"{SSD}","re":["^vdc$"],"policy":"LVM","reserveBytes":0,"minDiskBytes":1048576}}
        ],"diskScanInterval":"0"}}"#
    ))
    .expect("config")
}

/// The node's engine as carina-node starts it: device-mapper detected,
/// bcache records in the state directory.
async fn start_engine() -> Engine {
    let options = EngineOptions {
        bcache: BcacheOptions {
            state_dir: Some(STATE.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Engine::start(config(), options)
        .await
        .expect("engine starts")
}

fn size_of(dev: &Path) -> u64 {
    carina_tests::blockdev_size(dev)
}

/// Writes `data` at the start of `dev`, synced.
fn write_dev(dev: &Path, data: &[u8]) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(dev)
        .expect("open for writing");
    f.write_all(data).expect("write");
    f.sync_all().expect("sync");
}

fn read_dev(dev: &Path, len: usize) -> Vec<u8> {
    use std::io::Read;
    let mut buf = vec![0u8; len];
    std::fs::File::open(dev)
        .expect("open")
        .read_exact(&mut buf)
        .expect("read");
    buf
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs inside the vm tier's guest, which real_kernel_storage boots"]
async fn guest_storage() {
    assert!(in_guest(), "guest_storage runs only inside the guest");
    lvm_through_nodestorage().await;
    online_expansion().await;
    raw_partitions().await;
    bcache_through_nodestorage_and_csi().await;
    io_limits_on_cgroup_v2().await;
}

async fn lvm_through_nodestorage() {
    let t = Instant::now();
    let engine = start_engine().await;
    assert!(
        engine.device_mapper(),
        "activation auto on a kernel with device-mapper"
    );
    pass("lvm-device-mapper", t);

    let t = Instant::now();
    let node = TestNode::start(engine, NODE).await.expect("serve");
    let mut client = node.client("controller").await.expect("client");
    let lv = client
        .create_lv(create_lv("vol-a", VG, 64 * MIB))
        .await
        .expect("CreateLV")
        .into_inner()
        .volume
        .expect("a volume");
    let dev = PathBuf::from(&lv.device_path);
    assert_eq!(dev, Path::new("/dev").join(VG).join("vol-a"), "{lv:?}");
    assert!(
        is_device_mapper(&dev),
        "{} is a device-mapper device",
        dev.display()
    );
    assert_eq!(size_of(&dev), 64 * MIB);
    write_dev(&dev, b"written before the restart");
    println!(
        "vm: {} -> {}",
        dev.display(),
        std::fs::canonicalize(&dev).expect("link").display()
    );
    pass("lvm-create", t);

    let t = Instant::now();
    let grown = client
        .resize_lv(pb::ResizeLvRequest {
            name: "vol-a".into(),
            size_bytes: 128 * MIB,
        })
        .await
        .expect("ResizeLV")
        .into_inner()
        .volume
        .expect("a volume");
    assert_eq!(grown.size_bytes, 128 * MIB);
    assert_eq!(size_of(&dev), 128 * MIB, "the kernel sees the new size");
    pass("lvm-expand", t);

    // A restart: a new engine over the same disks finds the volume.
    let t = Instant::now();
    node.stop().await.expect("stop");
    let engine = start_engine().await;
    let v = engine
        .get_volume("vol-a")
        .await
        .expect("found after restart");
    assert_eq!(v.size_bytes, 128 * MIB);
    assert!(is_device_mapper(&dev));
    drop(engine);
    pass("lvm-restart", t);

    // A volume group deactivated under the node (as after a reboot):
    // the next start activates it.
    let t = Instant::now();
    run("lvm", &["vgchange", "-an", VG]).expect("vgchange -an");
    assert!(!dev.exists(), "{} gone after vgchange -an", dev.display());
    let engine = start_engine().await;
    let v = engine.get_volume("vol-a").await.expect("found");
    assert_eq!(v.device_path.as_deref(), Some(dev.as_path()));
    assert!(
        is_device_mapper(&dev),
        "{} back after the start",
        dev.display()
    );
    assert_eq!(
        read_dev(&dev, 26),
        b"written before the restart",
        "the data survived"
    );
    pass("lvm-reactivate", t);

    let t = Instant::now();
    let node = TestNode::start(engine, NODE).await.expect("serve");
    let mut client = node.client("controller").await.expect("client");
    client
        .delete_lv(pb::DeleteLvRequest {
            name: "vol-a".into(),
        })
        .await
        .expect("DeleteLV");
    assert!(!dev.exists(), "{} gone after the delete", dev.display());
    assert!(
        get_lv(&mut client, "vol-a").await.expect("GetLV").is_none(),
        "no such volume any more"
    );
    let lvs = run("lvm", &["lvs", "--noheadings", "-o", "lv_name", VG]).expect("lvs");
    assert!(!lvs.contains("vol-a"), "{lvs}");
    node.stop().await.expect("stop");
    pass("lvm-delete", t);
}

fn mount_cap(fs: &str) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

async fn online_expansion() {
    let engine = start_engine().await;
    let server = CsiNodeServer::new(engine.clone(), NODE)
        .max_volumes(100)
        .grace_period(Duration::from_secs(5));
    let served = ServedCsi::start("carina-csi-sock-", |listener, shutdown| {
        server.serve(listener, shutdown)
    })
    .await
    .expect("serve the CSI node");
    let mut node = NodeClient::new(served.channel.clone());
    // xfs needs 300 MiB at least.
    grow(&engine, &mut node, "grow-ext4", "ext4", 64 * MIB, 256 * MIB).await;
    grow(&engine, &mut node, "grow-xfs", "xfs", 320 * MIB, 640 * MIB).await;
}

/// Stages and publishes a new `fs` volume of `from` bytes, writes a file,
/// grows the LV to `to` and has NodeExpandVolume grow the mounted file
/// system; then unpublishes, unstages and deletes it.
async fn grow(
    engine: &Engine,
    node: &mut NodeClient<Channel>,
    name: &str,
    fs: &str,
    from: u64,
    to: u64,
) {
    let t = Instant::now();
    let v = engine
        .create_volume(CreateRequest {
            name: name.into(),
            group: VG.into(),
            size_bytes: from,
            exclusive: false,
        })
        .await
        .expect("create");
    let dev = v.device_path.clone().expect("device");
    assert!(is_device_mapper(&dev));
    let id = format!("{name}@{NODE}");
    let work = tempfile::tempdir().expect("work dir");
    let staging = work.path().join("staging");
    let target = work.path().join("target");
    let cap = mount_cap(fs);
    node.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.to_string_lossy().into_owned(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    })
    .await
    .expect("stage");
    node.node_publish_volume(csi::NodePublishVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.to_string_lossy().into_owned(),
        target_path: target.to_string_lossy().into_owned(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    })
    .await
    .expect("publish");
    let fstype = run(
        "findmnt",
        &["-n", "-o", "FSTYPE,SOURCE", &target.to_string_lossy()],
    )
    .expect("findmnt");
    println!("vm: {name} mounted: {}", fstype.trim());
    assert!(fstype.starts_with(fs), "{fstype}");
    std::fs::write(target.join("kept"), b"grown under me").expect("write");
    let before: Vec<u64> = stat_fs(&target, "%S %b");
    engine.resize_volume(name, to).await.expect("grow the LV");
    let resp = node
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: id.clone(),
            volume_path: target.to_string_lossy().into_owned(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: to as i64,
                limit_bytes: 0,
            }),
            staging_target_path: staging.to_string_lossy().into_owned(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        })
        .await
        .expect("NodeExpandVolume online")
        .into_inner();
    assert!(resp.capacity_bytes >= to as i64, "{resp:?}");
    let after: Vec<u64> = stat_fs(&target, "%S %b");
    let (b, a) = (before[0] * before[1], after[0] * after[1]);
    println!("vm: {name} {fs} grew online from {b} to {a} bytes");
    assert!(a > b + (to - from) / 2, "{b} -> {a}");
    assert_eq!(
        std::fs::read(target.join("kept")).expect("read"),
        b"grown under me"
    );
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: id.clone(),
        target_path: target.to_string_lossy().into_owned(),
    })
    .await
    .expect("unpublish");
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.to_string_lossy().into_owned(),
    })
    .await
    .expect("unstage");
    engine.delete_volume(name).await.expect("delete");
    assert!(!dev.exists());
    pass(&format!("csi-expand-{fs}"), t);
}

async fn raw_partitions() {
    let t = Instant::now();
    let engine = start_engine().await;
    let mut devs = Vec::new();
    for name in ["part-a", "part-b"] {
        let v = engine
            .create_volume(CreateRequest {
                name: name.into(),
                group: RAW.into(),
                size_bytes: 64 * MIB,
                exclusive: false,
            })
            .await
            .expect("create a partition");
        let dev = v.device_path.clone().expect("device");
        let kname = dev
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert!(
            kname.starts_with("vdb")
                && Path::new("/sys/class/block")
                    .join(&kname)
                    .join("partition")
                    .exists(),
            "the kernel sees {} as a partition of vdb",
            dev.display()
        );
        assert_eq!(size_of(&dev), 64 * MIB);
        println!("vm: {name} is {}", dev.display());
        devs.push((name, dev));
    }
    pass("raw-partitions", t);

    let t = Instant::now();
    let (name, dev) = &devs[0];
    run("mkfs.ext4", &["-q", &dev.to_string_lossy()]).expect("mkfs");
    let mnt = tempfile::tempdir().expect("mount point");
    let mounted = MountGuard::mount(&dev.to_string_lossy(), mnt.path(), None, None).expect("mount");
    match engine.delete_volume(name).await {
        Err(Error::FailedPrecondition { reason, .. }) => println!("vm: delete refused: {reason}"),
        other => panic!("deleting a mounted partition: {other:?}"),
    }
    assert!(dev.exists(), "the mounted partition stays");
    drop(mounted);
    for (name, dev) in &devs {
        engine.delete_volume(name).await.expect("delete");
        assert!(!dev.exists(), "{} gone", dev.display());
    }
    pass("raw-busy-delete", t);
}

/// The kernel's cache mode of `/dev/bcacheN` (the bracketed one).
fn kernel_mode(dev: &Path) -> String {
    let name = dev
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let modes = std::fs::read_to_string(format!("/sys/block/{name}/bcache/cache_mode"))
        .expect("cache_mode");
    modes
        .split_whitespace()
        .find_map(|m| m.strip_prefix('[').and_then(|m| m.strip_suffix(']')))
        .expect("a selected mode")
        .to_string()
}

/// Waits (bounded) until `path` is gone.
async fn gone(path: &Path) {
    for _ in 0..200 {
        if !path.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} is still there", path.display());
}

/// Stages `id` (ext4) at `staging`; returns the mounted source.
async fn stage(node: &mut NodeClient<Channel>, id: &str, staging: &Path) -> String {
    node.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into_owned(),
        volume_capability: Some(mount_cap("ext4")),
        ..Default::default()
    })
    .await
    .expect("stage");
    run(
        "findmnt",
        &["-n", "-o", "SOURCE", &staging.to_string_lossy()],
    )
    .expect("findmnt")
    .trim()
    .to_string()
}

async fn unstage(node: &mut NodeClient<Channel>, id: &str, staging: &Path) {
    node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: staging.to_string_lossy().into_owned(),
    })
    .await
    .expect("unstage");
}

async fn serve_csi(engine: &Engine) -> (NodeClient<Channel>, ServedCsi) {
    let server = CsiNodeServer::new(engine.clone(), NODE)
        .max_volumes(100)
        .grace_period(Duration::from_secs(5));
    let served = ServedCsi::start("carina-csi-sock-", |listener, shutdown| {
        server.serve(listener, shutdown)
    })
    .await
    .expect("serve the CSI node");
    (NodeClient::new(served.channel.clone()), served)
}

async fn bcache_through_nodestorage_and_csi() {
    const NAME: &str = "tier";
    let t = Instant::now();
    let engine = start_engine().await;
    let node = TestNode::start(engine.clone(), NODE).await.expect("serve");
    let mut client = node.client("controller").await.expect("client");
    // 50 % of 256 MiB: a 128 MiB cache, below the 256 MiB that
    // make-bcache's default bucket needs for the kernel to take it.
    let created = client
        .create_bcache(pb::CreateBcacheRequest {
            name: NAME.into(),
            backing_volume: "tier-backing".into(),
            cache_volume: "tier-cache".into(),
            cache_mode: pb::CacheMode::Writeback as i32,
            backing_device_group: VG.into(),
            size_bytes: 256 * MIB,
            cache_device_group: SSD.into(),
            cache_ratio_percent: 50,
        })
        .await
        .expect("CreateBcache")
        .into_inner();
    assert!(created.created);
    let d = created.device.expect("a device");
    let dev = PathBuf::from(&d.device_path);
    println!(
        "vm: bcache {NAME} is {} ({}, {:?})",
        dev.display(),
        d.state,
        d
    );
    assert!(
        dev.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("bcache")),
        "{d:?}"
    );
    assert!(
        std::fs::metadata(&dev)
            .expect("node")
            .file_type()
            .is_block_device()
    );
    assert!(d.running, "{d:?}");
    assert_eq!(
        d.kernel_cache_mode,
        pb::CacheMode::Writeback as i32,
        "{d:?}"
    );
    assert_eq!(kernel_mode(&dev), "writeback");
    let cset = PathBuf::from("/sys/fs/bcache").join(&d.cache_set_uuid);
    assert!(
        cset.is_dir(),
        "the cache set is registered: {}",
        cset.display()
    );
    pass("bcache-create", t);

    let t = Instant::now();
    let changed = client
        .set_cache_mode(pb::SetCacheModeRequest {
            name: NAME.into(),
            cache_mode: pb::CacheMode::Writethrough as i32,
        })
        .await
        .expect("SetCacheMode")
        .into_inner()
        .device
        .expect("a device");
    assert_eq!(
        changed.kernel_cache_mode,
        pb::CacheMode::Writethrough as i32
    );
    assert_eq!(kernel_mode(&dev), "writethrough");
    pass("bcache-mode", t);

    let t = Instant::now();
    let (mut csi_node, served) = serve_csi(&engine).await;
    let id = format!("{NAME}@{NODE}");
    let work = tempfile::tempdir().expect("work dir");
    let staging = work.path().join("staging");
    let source = stage(&mut csi_node, &id, &staging).await;
    println!("vm: {id} staged from {source}");
    assert_eq!(Path::new(&source), dev, "CSI stages the bcache device");
    std::fs::write(staging.join("kept"), b"through the cache").expect("write");
    unstage(&mut csi_node, &id, &staging).await;
    pass("bcache-stage", t);

    // As after a reboot: the kernel forgets the bcache device and its
    // cache set, the volume groups go inactive; the next start brings
    // all of it back.
    let t = Instant::now();
    drop(served);
    node.stop().await.expect("stop");
    drop(engine);
    let name = dev
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    std::fs::write(format!("/sys/block/{name}/bcache/stop"), "1").expect("stop the device");
    std::fs::write(cset.join("stop"), "1").expect("stop the cache set");
    gone(&dev).await;
    gone(&cset).await;
    for vg in [VG, SSD] {
        run("lvm", &["vgchange", "-an", vg]).expect("vgchange -an");
    }
    let engine = start_engine().await;
    let again = engine.get_bcache(NAME).await.expect("recorded");
    let dev = again.device_path.clone().expect("re-registered");
    assert!(cset.is_dir(), "the cache set is registered again");
    let (mut csi_node, served) = serve_csi(&engine).await;
    let source = stage(&mut csi_node, &id, &staging).await;
    assert_eq!(Path::new(&source), dev);
    assert_eq!(
        std::fs::read(staging.join("kept")).expect("read"),
        b"through the cache",
        "the data survived"
    );
    unstage(&mut csi_node, &id, &staging).await;
    drop(served);
    pass("bcache-restart", t);

    let t = Instant::now();
    let node = TestNode::start(engine.clone(), NODE).await.expect("serve");
    let mut client = node.client("controller").await.expect("client");
    client
        .delete_bcache(pb::DeleteBcacheRequest { name: NAME.into() })
        .await
        .expect("DeleteBcache");
    gone(&dev).await;
    gone(&cset).await;
    for v in ["tier-backing", "tier-cache"] {
        assert!(
            get_lv(&mut client, v).await.expect("GetLV").is_none(),
            "{v} deleted with the device"
        );
    }
    node.stop().await.expect("stop");
    pass("bcache-delete", t);
}

/// Writes 2 MiB with direct IO to `dev` from a shell in the cgroup `dir`;
/// the seconds it took.
fn timed_write(dir: &Path, dev: &Path) -> f64 {
    let t = Instant::now();
    run(
        "sh",
        &[
            "-c",
            &format!(
                "echo $$ > {}/cgroup.procs && exec dd if=/dev/zero of={} bs=64k count=32 oflag=direct",
                dir.display(),
                dev.display()
            ),
        ],
    )
    .expect("dd in the pod's cgroup");
    t.elapsed().as_secs_f64()
}

/// A pod's cgroup in the guest's cgroup v2 hierarchy (as the kubelet's
/// cgroupfs driver names it) gets `io.max` for a device-mapper volume,
/// and a writer in it is held to the limit.
async fn io_limits_on_cgroup_v2() {
    const UID: &str = "0f7c8a52-9d1e-4c3b-8a6f-2b4d5e6f7a8b";
    let t = Instant::now();
    let root = Path::new("/sys/fs/cgroup");
    std::fs::write(root.join("cgroup.subtree_control"), "+io").expect("enable io");
    let kubepods = root.join("kubepods");
    std::fs::create_dir_all(&kubepods).expect("kubepods");
    std::fs::write(kubepods.join("cgroup.subtree_control"), "+io").expect("enable io below");
    let pod = kubepods.join(format!("pod{UID}"));
    std::fs::create_dir_all(&pod).expect("the pod's cgroup");
    let engine = start_engine().await;
    let v = engine
        .create_volume(CreateRequest {
            name: "throttled".into(),
            group: VG.into(),
            size_bytes: 64 * MIB,
            exclusive: false,
        })
        .await
        .expect("create");
    let dev = v.device_path.clone().expect("device");
    assert!(is_device_mapper(&dev));
    let unlimited = timed_write(&pod, &dev);
    let limits = carina_node::engine::iolimits::Limits {
        write_bps: MIB,
        ..Default::default()
    };
    let set = engine
        .set_pod_io_limits(UID, "throttled", limits)
        .await
        .expect("SetPodIOLimits")
        .expect("limits in force");
    println!("vm: {set:?}");
    let io_max = std::fs::read_to_string(pod.join("io.max")).expect("io.max");
    println!("vm: io.max: {}", io_max.trim());
    assert!(
        io_max.contains(&format!("{}:{} ", v.major, v.minor)) && io_max.contains("wbps=1048576"),
        "{io_max}"
    );
    let limited = timed_write(&pod, &dev);
    println!("vm: 2 MiB direct writes: {unlimited:.2}s unlimited, {limited:.2}s at 1 MiB/s");
    assert!(limited >= 1.5, "held to 1 MiB/s: {limited:.2}s");
    let cleared = engine
        .clear_pod_io_limits(UID, None)
        .await
        .expect("ClearPodIOLimits");
    assert_eq!(cleared, 1);
    let io_max = std::fs::read_to_string(pod.join("io.max")).expect("io.max");
    assert!(!io_max.contains("wbps=1048576"), "{io_max}");
    // The shells that wrote are gone; the cgroups can go.
    std::fs::remove_dir(&pod).expect("rmdir the pod's cgroup");
    engine.delete_volume("throttled").await.expect("delete");
    pass("iolimits-cgroup-v2", t);
}
