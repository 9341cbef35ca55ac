//! Engine tests for RAW groups on real loop devices: GPT partitions written
//! and read back by sfdisk, announced to the kernel by partx.
//!
//! Every test has its own disks and a group whose patterns match exactly
//! those disks, so tests running in parallel never see each other's disks.

use std::path::Path;

use carina_node::engine::gpt::{self, Partition};
use carina_node::engine::raw::partition_name;
use carina_node::engine::{Error, Policy, Volume};
use carina_tests::engine::{EngineFixture, Lister, assert_not_found, names};
use carina_tests::{LoopDisk, MountGuard, blockdev_size, run};

const MIB: u64 = 1 << 20;

async fn raw_fixture(test: &str, sizes: &[u64], reserve: u64) -> Option<EngineFixture> {
    EngineFixture::new(test, "RAW", sizes, reserve).await
}

/// The disk's partition entries as sfdisk reads them, or none when it has
/// no table; the engine's own reading of the disk must agree.
fn entries(disk: &LoopDisk) -> Option<Vec<Partition>> {
    let out = std::process::Command::new("sfdisk")
        .args(["-J", &disk.dev()])
        .output()
        .expect("sfdisk runs");
    let direct = gpt::ondisk::read(&disk.path, 512).expect("the disk reads");
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(gpt::is_no_table(&stderr), "sfdisk failed: {stderr}");
        assert_eq!(direct, None, "a GPT sfdisk does not see");
        return None;
    }
    let table = gpt::parse_sfdisk(&String::from_utf8_lossy(&out.stdout)).expect("parses");
    assert_eq!(table.label, "gpt");
    assert_eq!(direct.as_ref(), Some(&table), "read in-process");
    Some(table.partitions)
}

/// No two partitions of the disk share a sector.
fn assert_no_overlap(parts: &[Partition]) {
    for (i, a) in parts.iter().enumerate() {
        for b in &parts[i + 1..] {
            assert!(
                a.end() <= b.start || b.end() <= a.start,
                "partitions overlap: {a:?} {b:?}"
            );
        }
    }
}

fn check_device(v: &Volume) {
    let dev = v.device_path.as_deref().expect("device path");
    assert_eq!(blockdev_size(dev), v.size_bytes, "{v:?}");
    let sys = run("stat", &["-L", "-c", "%t:%T", &dev.to_string_lossy()]).expect("stat");
    let (maj, min) = sys.trim().split_once(':').expect("t:T");
    assert_eq!(
        (
            u32::from_str_radix(maj, 16).expect("hex"),
            u32::from_str_radix(min, 16).expect("hex")
        ),
        (v.major, v.minor),
        "{v:?}"
    );
}

/// What identifies a volume across kernel re-reads of the table. Device
/// numbers are left out: partitions of loop (and NVMe) disks get dynamic
/// minors, and the kernel hands out new ones whenever partx re-adds a
/// partition; [`check_device`] checks them against the node instead.
fn key(
    v: &Volume,
) -> (
    String,
    String,
    u64,
    Option<std::path::PathBuf>,
    bool,
    Option<String>,
) {
    (
        v.name.clone(),
        v.group.clone(),
        v.size_bytes,
        v.device_path.clone(),
        v.exclusive,
        v.disk.clone(),
    )
}

fn assert_same(got: &Volume, want: &Volume) {
    assert_eq!(key(got), key(want));
    check_device(got);
}

fn assert_same_list(got: &[Volume], want: &[Volume]) {
    assert_eq!(got.len(), want.len(), "{got:?}");
    for (g, w) in got.iter().zip(want) {
        assert_same(g, w);
    }
}

#[tokio::test]
async fn create_get_list_grow_delete() {
    let Some(f) = raw_fixture("create_get_list_grow_delete", &[64 * MIB], 0).await else {
        return;
    };
    let total = f.allocatable().await;
    assert_eq!(
        total,
        62 * MIB,
        "64 MiB disk, 1 MiB aligned, GPT at both ends"
    );

    let a = f.create(f.req("a", 8 * MIB - 5)).await;
    assert_eq!(a.size_bytes, 8 * MIB, "rounded up to the 1 MiB unit");
    assert_eq!((a.policy, a.exclusive), (Policy::Raw, false));
    assert_eq!(a.disk.as_deref(), Some(f.disks[0].dev().as_str()));
    check_device(&a);
    let parts = entries(&f.disks[0]).expect("a GPT now");
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0].name, "carina.io/a");
    assert_eq!(parts[0].start * 512 % MIB, 0, "aligned start");
    assert_eq!(parts[0].size * 512, 8 * MIB);

    assert_same(&f.engine.get_volume("a").await.expect("get"), &a);
    let again = f.create(f.req("a", 8 * MIB)).await;
    assert_same(&again, &a);
    let err = f.refused(f.req("a", 9 * MIB)).await;
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err}");
    assert_eq!(
        entries(&f.disks[0]).expect("gpt").len(),
        1,
        "no second partition"
    );

    let b = f.create(f.req("b", 4 * MIB)).await;
    check_device(&b);
    assert_eq!(f.names().await, vec!["a", "b"]);
    assert_eq!(f.allocatable().await, total - 12 * MIB);

    // a is followed by b: no room to grow in place
    let err = f.resize_refused("a", 16 * MIB).await;
    assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");
    assert!(err.to_string().contains("free"), "{err}");
    assert_eq!(
        f.engine.get_volume("a").await.expect("get").size_bytes,
        8 * MIB
    );

    // b has free space after it
    let b2 = f.engine.resize_volume("b", 10 * MIB).await.expect("grow b");
    assert_eq!(b2.size_bytes, 10 * MIB);
    assert_eq!(b2.device_path, b.device_path);
    check_device(&b2);
    assert_eq!(f.allocatable().await, total - 18 * MIB);
    let err = f.resize_refused("b", 2 * MIB).await;
    assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");

    f.engine.delete_volume("a").await.expect("delete a");
    assert_not_found(&f.engine, "a").await;
    assert_eq!(f.names().await, vec!["b"]);
    check_device(&f.engine.get_volume("b").await.expect("b survives"));

    f.engine.delete_volume("b").await.expect("delete b");
    assert!(f.names().await.is_empty());
    assert_eq!(entries(&f.disks[0]), None, "the empty disk is blank again");
    assert_eq!(f.allocatable().await, total);
    // and still usable after a rescan
    f.engine.rescan().await.expect("rescan");
    let c = f.create(f.req("c", MIB)).await;
    check_device(&c);
    f.engine.delete_volume("c").await.expect("delete c");
}

#[tokio::test]
async fn exhaustion_and_reserve() {
    let Some(f) = raw_fixture("exhaustion_and_reserve", &[64 * MIB], 20 * MIB).await else {
        return;
    };
    let cap = f.capacity().await;
    assert_eq!(
        (
            cap.total_bytes,
            cap.free_bytes,
            cap.reserve_bytes,
            cap.allocatable_bytes
        ),
        (62 * MIB, 62 * MIB, 20 * MIB, 42 * MIB)
    );
    assert_eq!(cap.largest_allocatable_bytes, 42 * MIB);
    assert_eq!(cap.allocation_unit, MIB);
    assert_eq!(cap.disks, vec![f.disks[0].dev()]);

    // fits the free space, not the free space minus the reserve
    let err = f.refused(f.req("big", 43 * MIB)).await;
    assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");
    let err = f.refused(f.req("huge", 1 << 40)).await;
    assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");
    assert_eq!(
        entries(&f.disks[0]),
        None,
        "a refused create leaves nothing"
    );

    let v = f.create(f.req("fits", 42 * MIB)).await;
    check_device(&v);
    let cap = f.capacity().await;
    assert_eq!(
        (cap.free_bytes, cap.allocatable_bytes, cap.volume_count),
        (20 * MIB, 0, 1)
    );
    // the reserve is kept
    let err = f.refused(f.req("one-more", MIB)).await;
    assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");
    let err = f.resize_refused("fits", 43 * MIB).await;
    assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");
    f.engine.delete_volume("fits").await.expect("delete");
}

#[tokio::test]
async fn foreign_partitions_are_never_touched() {
    let Some(f) = raw_fixture("foreign_partitions_are_never_touched", &[64 * MIB], 0).await else {
        return;
    };
    let disk = f.disks[0].dev();
    f.create(f.req("mine", 4 * MIB)).await;
    // Someone else adds partitions: one plain, one that borrows our prefix.
    run(
        "sgdisk",
        &["-n", "0:0:+8M", "-c", "0:scratch", "-t", "0:8300", &disk],
    )
    .expect("foreign partition");
    run(
        "sgdisk",
        &[
            "-n",
            "0:0:+4M",
            "-c",
            "0:carina.io/fake",
            "-t",
            "0:8300",
            &disk,
        ],
    )
    .expect("impostor partition");
    run("partx", &["-u", &disk]).expect("partx");
    let foreign: Vec<Partition> = entries(&f.disks[0])
        .expect("gpt")
        .into_iter()
        .filter(|p| p.name != "carina.io/mine")
        .collect();
    assert_eq!(foreign.len(), 2);

    f.engine.rescan().await.expect("rescan");
    assert_eq!(f.names().await, vec!["mine"]);
    for name in ["scratch", "fake"] {
        assert_not_found(&f.engine, name).await;
    }
    let fake = f.create(f.req("fake", 4 * MIB)).await;
    check_device(&fake);
    assert_eq!(f.names().await, vec!["fake", "mine"]);
    assert_eq!(f.allocatable().await, 62 * MIB - 20 * MIB);

    // Fill the disk: nothing may land on the foreign sectors.
    let mut n = 0;
    loop {
        let free = f.allocatable().await;
        if free == 0 {
            break;
        }
        let largest = f.capacity().await.largest_allocatable_bytes;
        f.create(f.req(&format!("fill{n}"), largest.min(7 * MIB)))
            .await;
        n += 1;
        let parts = entries(&f.disks[0]).expect("gpt");
        assert_no_overlap(&parts);
        for p in &foreign {
            assert!(parts.contains(p), "foreign partition changed: {p:?}");
        }
    }
    assert!(n > 3);
    let err = f.refused(f.req("none-left", MIB)).await;
    assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");

    // A restarted engine still sees only ours.
    let again = f.restart().await;
    let names = names(&again, &f.group).await;
    assert_eq!(names, f.names().await);
    assert!(!names.contains(&"scratch".to_string()));
    drop(again);

    for name in f.names().await {
        f.engine.delete_volume(&name).await.expect("delete");
    }
    let parts = entries(&f.disks[0]).expect("the table stays: foreign partitions remain");
    assert_eq!(parts, foreign);
}

#[tokio::test]
async fn exclusive_whole_disk_volumes() {
    let Some(f) = raw_fixture("exclusive_whole_disk_volumes", &[64 * MIB, 96 * MIB], 0).await
    else {
        return;
    };
    let shared = f.create(f.req("s", 4 * MIB)).await;
    assert_eq!(
        shared.disk.as_deref(),
        Some(f.disks[0].dev().as_str()),
        "best fit"
    );

    let x = f.create(f.exclusive("x", 10 * MIB)).await;
    assert!(x.exclusive);
    assert_eq!(
        x.disk.as_deref(),
        Some(f.disks[1].dev().as_str()),
        "the empty disk"
    );
    assert_eq!(x.size_bytes, 94 * MIB, "the whole aligned usable area");
    check_device(&x);
    let again = f.create(f.exclusive("x", 10 * MIB)).await;
    assert_same(&again, &x);

    // Shared volumes never land on the exclusive disk.
    let t = f.create(f.req("t", MIB)).await;
    assert_eq!(t.disk.as_deref(), Some(f.disks[0].dev().as_str()));
    // Only the exclusive disk had room.
    let err = f.refused(f.req("u", 60 * MIB)).await;
    assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");
    // No empty disk is left for another whole-disk volume.
    let err = f.refused(f.exclusive("y", MIB)).await;
    assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");
    let err = f.resize_refused("x", 200 * MIB).await;
    assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");
    assert_eq!(
        f.engine.resize_volume("x", 20 * MIB).await.expect("within"),
        x
    );

    // After a restart it is still whole-disk.
    let again = f.restart().await;
    assert_same(&again.get_volume("x").await.expect("found"), &x);
    drop(again);

    f.engine.delete_volume("x").await.expect("delete x");
    assert_eq!(entries(&f.disks[1]), None, "blank again");
    f.engine.delete_volume("s").await.expect("delete s");
    f.engine.delete_volume("t").await.expect("delete t");

    // Requested size larger than any disk.
    let err = f.refused(f.exclusive("z", 100 * MIB)).await;
    assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");
}

#[tokio::test]
async fn exclusive_volumes_ignore_the_reserve() {
    let Some(f) = raw_fixture("exclusive_volumes_ignore_the_reserve", &[64 * MIB], 1 << 30).await
    else {
        return;
    };
    // The reserve exceeds the disk.
    let err = f.refused(f.req("shared", MIB)).await;
    assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");
    let x = f.create(f.exclusive("whole", MIB)).await;
    assert_eq!((x.exclusive, x.size_bytes), (true, 62 * MIB));
    f.engine.delete_volume("whole").await.expect("delete");
}

#[tokio::test]
async fn long_names_and_restart() {
    let Some(f) = raw_fixture("long_names_and_restart", &[64 * MIB, 64 * MIB], 0).await else {
        return;
    };
    let long_a = format!("pvc-{}-a", "0123456789abcdef".repeat(4));
    let long_b = format!("pvc-{}-b", "0123456789abcdef".repeat(4));
    assert!(long_a.len() > 60);
    let a = f.create(f.req(&long_a, 3 * MIB)).await;
    let b = f.create(f.req(&long_b, 5 * MIB)).await;
    let short = f.create(f.req("short", 2 * MIB)).await;
    let whole = f.create(f.exclusive("whole", MIB)).await;
    assert_ne!(a.device_path, b.device_path);
    // Both long names truncate to the same GPT name; GUIDs tell them apart.
    let disk = if a.disk.as_deref() == Some(f.disks[0].dev().as_str()) {
        &f.disks[0]
    } else {
        &f.disks[1]
    };
    let parts = entries(disk).expect("gpt");
    let longs: Vec<&Partition> = parts
        .iter()
        .filter(|p| p.name == partition_name(&long_a))
        .collect();
    assert_eq!(longs.len(), 2, "{parts:?}");
    assert_eq!(longs[0].name, longs[1].name);
    assert_eq!(longs[0].name.encode_utf16().count(), 36);
    assert_ne!(longs[0].uuid, longs[1].uuid);

    let mut want = vec![a.clone(), b.clone(), short.clone(), whole.clone()];
    want.sort_by(|x, y| x.name.cmp(&y.name));
    assert_same_list(
        &f.engine.list_volumes(Some(&f.group)).await.expect("list"),
        &want,
    );

    // The kernel forgets every partition (as after a reboot without udev);
    // a new engine finds the volumes and brings their devices back.
    for d in &f.disks {
        for p in entries(d).unwrap_or_default() {
            run("partx", &["-d", "--nr", &p.number.to_string(), &d.dev()]).expect("partx -d");
        }
    }
    assert!(!a.device_path.as_deref().expect("path").exists());
    let again = f.restart().await;
    assert_same_list(
        &again.list_volumes(Some(&f.group)).await.expect("list"),
        &want,
    );
    assert_same(&again.get_volume(&long_b).await.expect("get"), &b);
    let repeat = again
        .create_volume(f.req(&long_a, 3 * MIB))
        .await
        .expect("idempotent after restart");
    assert_same(&repeat, &a);
    again.delete_volume(&long_a).await.expect("delete long a");
    assert_not_found(&again, &long_a).await;
    assert_same(&again.get_volume(&long_b).await.expect("b stays"), &b);
    for name in [&long_b, "short", "whole"] {
        again.delete_volume(name).await.expect("delete");
    }
    for d in &f.disks {
        assert_eq!(entries(d), None);
    }
}

/// Writes `text` to `file` under a fresh mount of `dev`, unmounts, mounts
/// again and reads it back.
fn round_trip(dev: &Path, fstype: &str, dir: &Path, text: &str) {
    let dev = dev.to_string_lossy();
    let file = dir.join("hello.txt");
    {
        let _m = MountGuard::mount(&dev, dir, Some(fstype), None).expect("mount");
        std::fs::write(&file, text).expect("write");
        run("sync", &[]).expect("sync");
    }
    assert!(!file.exists(), "unmounted");
    let _m = MountGuard::mount(&dev, dir, Some(fstype), None).expect("remount");
    assert_eq!(std::fs::read_to_string(&file).expect("read"), text);
}

#[tokio::test]
async fn data_path_ext4_and_xfs() {
    let Some(f) = raw_fixture("data_path_ext4_and_xfs", &[512 * MIB], 0).await else {
        return;
    };
    let x = f.create(f.req("xfs", 320 * MIB)).await;
    let e = f.create(f.req("ext4", 64 * MIB)).await;
    let xdev = x.device_path.clone().expect("path");
    let edev = e.device_path.clone().expect("path");
    run("mkfs.xfs", &["-q", "-f", &xdev.to_string_lossy()]).expect("mkfs.xfs");
    run("mkfs.ext4", &["-q", "-F", &edev.to_string_lossy()]).expect("mkfs.ext4");
    let dir = tempfile::tempdir().expect("tempdir");
    let xdir = dir.path().join("x");
    let edir = dir.path().join("e");
    round_trip(&xdev, "xfs", &xdir, "on xfs");
    round_trip(&edev, "ext4", &edir, "on ext4");

    // Grow while mounted: the kernel sees the new size at once.
    let mounted =
        MountGuard::mount(&edev.to_string_lossy(), &edir, Some("ext4"), None).expect("mount");
    let grown = f
        .engine
        .resize_volume("ext4", 96 * MIB)
        .await
        .expect("grow mounted");
    assert_eq!(blockdev_size(&edev), 96 * MIB);
    assert_eq!(grown.device_path.as_deref(), Some(edev.as_path()));
    assert_eq!(
        std::fs::read_to_string(edir.join("hello.txt")).expect("still readable"),
        "on ext4"
    );
    // A mounted volume is not deleted.
    let err = f.engine.delete_volume("ext4").await.expect_err("in use");
    assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");
    assert!(edev.exists());
    drop(mounted);

    // The next volume at the same offset starts blank.
    f.engine.delete_volume("ext4").await.expect("delete");
    let again = f.create(f.req("next", 64 * MIB)).await;
    assert_eq!(fs_type(again.device_path.as_deref().expect("path")), None);
    f.engine.delete_volume("next").await.expect("delete");
    f.engine.delete_volume("xfs").await.expect("delete");
}

/// The filesystem blkid finds on `dev`, if any.
fn fs_type(dev: &Path) -> Option<String> {
    let out = std::process::Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE", &dev.to_string_lossy()])
        .output()
        .expect("blkid runs");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!text.is_empty()).then_some(text)
}

#[tokio::test]
async fn new_partitions_start_blank() {
    let Some(f) = raw_fixture("new_partitions_start_blank", &[64 * MIB], 0).await else {
        return;
    };
    // An old filesystem 1 MiB into the disk, where the first partition will
    // start; the disk itself still looks blank.
    let disk = f.disks[0].dev();
    let window = run(
        "losetup",
        &[
            "-f",
            "--show",
            "--offset",
            "1048576",
            "--sizelimit",
            "8388608",
            &disk,
        ],
    )
    .expect("losetup");
    let window = window.trim().to_string();
    let made = run("mkfs.ext4", &["-q", "-F", &window]);
    run("losetup", &["-d", &window]).expect("detach");
    made.expect("mkfs.ext4");
    f.engine.rescan().await.expect("rescan");
    let v = f.create(f.req("w", 8 * MIB)).await;
    let dev = v.device_path.clone().expect("path");
    assert_eq!(v.size_bytes, 8 * MIB);
    assert_eq!(
        fs_type(&dev),
        None,
        "the old ext4 must not reach the new volume"
    );
    f.engine.delete_volume("w").await.expect("delete");
}

#[tokio::test]
async fn an_open_partition_is_not_deleted() {
    let Some(f) = raw_fixture("an_open_partition_is_not_deleted", &[64 * MIB], 0).await else {
        return;
    };
    let v = f
        .engine
        .create_volume(f.req("held", 8 * MIB))
        .await
        .expect("create");
    let other = f
        .engine
        .create_volume(f.req("other", 8 * MIB))
        .await
        .expect("create");
    let dev = v.device_path.clone().expect("path");
    // Open, not mounted: the kernel keeps a partition anyone has open.
    let held = std::fs::File::open(&dev).expect("open");
    let err = f.engine.delete_volume("held").await.expect_err("open");
    assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");
    drop(held);
    // Nothing of it went: entry, device and its neighbour are as they were.
    assert_same(&f.engine.get_volume("held").await.expect("still there"), &v);
    assert_same(&f.engine.get_volume("other").await.expect("other"), &other);
    assert_eq!(f.names().await, vec!["held", "other"]);
    f.engine.delete_volume("held").await.expect("delete");
    assert!(!dev.exists(), "the kernel forgot it");
    assert_same(&f.engine.get_volume("other").await.expect("other"), &other);
    f.engine.delete_volume("other").await.expect("delete");
    assert_eq!(entries(&f.disks[0]), None, "blank again");
}

/// Kernel partitions of the disk `dev` (`/dev/loop3` → `loop3p1`, ...).
fn kernel_partitions(dev: &str) -> Vec<String> {
    let name = Path::new(dev)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Ok(entries) = std::fs::read_dir(format!("/sys/block/{name}")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("{name}p")))
        .collect()
}

/// Listing while volumes come and go never leaves a kernel partition
/// behind: a list that read a disk's table before a delete must not give
/// the kernel back the partition the delete is removing. Lists run back
/// to back against create/delete cycles; at the end, with every volume
/// deleted, the disk has no partition left in the kernel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_during_deletes_leave_no_partition_behind() {
    let Some(f) = raw_fixture("list-race", &[128 * MIB], 0).await else {
        return;
    };
    let lister = Lister::start(f.engine.clone());
    // A second volume stays, so deletes take the one-entry path too.
    f.create(f.req("stays", 4 * MIB)).await;
    for i in 0..40 {
        let name = format!("v{i}");
        f.create(f.req(&name, 4 * MIB)).await;
        f.engine.delete_volume(&name).await.expect("delete");
    }
    f.engine.delete_volume("stays").await.expect("delete");
    let lists = lister.stop().await;
    assert_eq!(f.names().await, Vec::<String>::new());
    let left = kernel_partitions(&f.disks[0].dev());
    assert!(
        left.is_empty(),
        "kernel partitions left after {lists} lists: {left:?}"
    );
}
