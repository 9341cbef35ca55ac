//! Engine tests for LVM groups on real loop devices (loop activation when
//! the kernel has no device-mapper).

use carina_node::engine::lvm::OWNER_TAG;
use carina_node::engine::{Error, Policy, Volume};
use carina_tests::engine::{EngineFixture, Lister, assert_not_found, engine_over};
use carina_tests::{MountGuard, blockdev_size, lvm, run};

const MIB: u64 = 1 << 20;

async fn lvm_fixture(test: &str, sizes: &[u64], reserve: u64) -> Option<EngineFixture> {
    EngineFixture::new(test, "LVM", sizes, reserve).await
}

/// An LV made behind the engine's back (`lvcreate` as the engine runs it,
/// not activated), with `tags`, `size` given as lvcreate's `-L`.
fn lvcreate_aside(f: &EngineFixture, name: &str, size: &str, tags: &[&str]) {
    let dev = f.disks[0].dev();
    let mut args = vec!["lvcreate", "-q", "-an", "-Zn", "-Wn", "--driverloaded", "n"];
    for t in tags {
        args.extend(["--addtag", t]);
    }
    args.extend(["-L", size, "-n", name, &f.group]);
    lvm(&[&dev], &args).expect("lvcreate aside");
}

/// The volume's block device, as an argument for mkfs and mount.
fn dev_arg(v: &Volume) -> String {
    v.device_path
        .as_deref()
        .expect("a block device")
        .to_string_lossy()
        .into_owned()
}

#[tokio::test]
async fn lifecycle_create_get_list_grow_delete() {
    let Some(f) = lvm_fixture("lifecycle", &[256 * MIB], 0).await else {
        return;
    };
    let cap0 = f.capacity().await;
    assert_eq!(cap0.policy, Policy::Lvm);
    assert_eq!(cap0.volume_count, 0);
    assert!(cap0.total_bytes > 200 * MIB, "{cap0:?}");

    // 10 MiB rounds up to the 4 MiB extent size: 12 MiB.
    let v = f.create(f.req("vol-a", 10 * MIB)).await;
    assert_eq!(v.size_bytes, 12 * MIB);
    assert_eq!(v.policy, Policy::Lvm);
    let dev = v.device_path.clone().expect("block device");
    assert_eq!(
        blockdev_size(&dev),
        12 * MIB,
        "device exposes exactly the LV"
    );
    assert!(v.major > 0);

    let got = f.engine.get_volume("vol-a").await.expect("get");
    assert_eq!(got, v);
    let b = f.create(f.req("vol-b", 4 * MIB)).await;
    assert_eq!(f.names().await, ["vol-a", "vol-b"]);

    let cap1 = f.capacity().await;
    assert_eq!(cap1.volume_count, 2);
    assert_eq!(cap1.free_bytes, cap0.free_bytes - 16 * MIB);

    // vol-b sits right after vol-a (best fit from the start), so vol-a
    // cannot grow in place; vol-b can.
    let err = f.resize_refused("vol-a", 20 * MIB).await;
    assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");
    let grown = f
        .engine
        .resize_volume("vol-b", 40 * MIB)
        .await
        .expect("grow");
    assert_eq!(grown.size_bytes, 40 * MIB);
    assert_eq!(
        blockdev_size(grown.device_path.as_deref().expect("dev")),
        40 * MIB
    );
    let err = f.resize_refused("vol-b", 8 * MIB).await;
    assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");
    assert_eq!(
        f.engine
            .resize_volume("vol-b", 40 * MIB)
            .await
            .expect("same size")
            .size_bytes,
        40 * MIB
    );

    f.engine.delete_volume("vol-a").await.expect("delete a");
    f.engine.delete_volume("vol-b").await.expect("delete b");
    assert_not_found(&f.engine, "vol-a").await;
    assert_not_found(&f.engine, "vol-b").await;
    assert!(!dev.exists() || blockdev_size(&dev) != 12 * MIB || b.device_path != Some(dev.clone()));
    let cap2 = f.capacity().await;
    assert_eq!(cap2.free_bytes, cap0.free_bytes);
    assert_eq!(cap2.volume_count, 0);

    // Each command and each operation was timed (the process's
    // histograms, which other tests of this file add to).
    let text = carina_node::latency::latency().encode();
    for family in [
        r#"carina_node_command_duration_seconds_count{command="lvm.lvcreate",result="ok"}"#,
        r#"carina_node_command_duration_seconds_count{command="lvm.lvremove",result="ok"}"#,
        r#"carina_node_engine_operation_duration_seconds_count{operation="resize",policy="LVM",result="ok"}"#,
        r#"carina_node_engine_operation_duration_seconds_count{operation="resize",policy="LVM",result="error"}"#,
    ] {
        assert!(text.contains(family), "{family} in {text}");
    }
}

#[tokio::test]
async fn idempotent_and_conflicting_repeats() {
    let Some(f) = lvm_fixture("repeats", &[128 * MIB], 0).await else {
        return;
    };
    let a = f.create(f.req("same", 8 * MIB)).await;
    assert_eq!(f.create(f.req("same", 8 * MIB)).await, a, "a repeat");
    // 7 MiB rounds to the same 8 MiB: still the same request.
    assert_eq!(
        f.create(f.req("same", 7 * MIB)).await,
        a,
        "a rounded repeat"
    );
    let err = f.refused(f.req("same", 16 * MIB)).await;
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err}");
    assert_eq!(f.engine.list_volumes(None).await.expect("list").len(), 1);
}

#[tokio::test]
async fn exhaustion_and_reserve() {
    // ~124 MiB of extents, 40 MiB reserve: 84 MiB allocatable.
    let Some(f) = lvm_fixture("reserve", &[128 * MIB], 40 * MIB).await else {
        return;
    };
    let cap = f.capacity().await;
    assert_eq!(cap.reserve_bytes, 40 * MIB);
    assert_eq!(cap.allocatable_bytes, cap.free_bytes - 40 * MIB);
    let fits_free_not_reserve = cap.free_bytes - 20 * MIB;
    for (name, size) in [("big", fits_free_not_reserve), ("huge", 10 << 30)] {
        let err = f.refused(f.req(name, size)).await;
        assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");
    }
    let ok = f.create(f.req("exact", cap.allocatable_bytes)).await;
    assert_eq!(ok.size_bytes, cap.allocatable_bytes);
    let after = f.capacity().await;
    assert_eq!(after.allocatable_bytes, 0);
    assert_eq!(after.free_bytes, 40 * MIB, "the reserve stays free");
    let err = f.refused(f.req("one-more", MIB)).await;
    assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");
    assert_eq!(
        f.engine.list_volumes(None).await.expect("list").len(),
        1,
        "failures created nothing"
    );
}

#[tokio::test]
async fn a_grown_disk_gives_its_room_at_the_next_rescan() {
    // 15 extents of 4 MiB on a 64 MiB disk.
    let Some(f) = lvm_fixture("grown", &[64 * MIB], 0).await else {
        return;
    };
    let kept = f.create(f.req("kept", 32 * MIB)).await;
    let before = f.capacity().await;
    assert_eq!(before.total_bytes, 60 * MIB);
    let refused = f.refused(f.req("big", 128 * MIB)).await;
    assert!(
        matches!(refused, Error::ResourceExhausted { .. }),
        "{refused}"
    );

    // The disk grows under the node, as a cloud disk or a RAID does.
    let disk = &f.disks[0];
    std::fs::File::options()
        .write(true)
        .open(disk.file())
        .and_then(|file| file.set_len(256 * MIB))
        .expect("grow the disk's file");
    run("losetup", &["-c", &disk.dev()]).expect("re-read the capacity");
    assert_eq!(blockdev_size(&disk.path), 256 * MIB);

    f.engine.rescan().await.expect("rescan");
    let after = f.capacity().await;
    assert_eq!(after.total_bytes, 252 * MIB, "pvresize: 63 extents");
    assert_eq!(after.free_bytes, before.free_bytes + 192 * MIB);
    let pv_size = lvm(
        &[&disk.dev()],
        &[
            "pvs",
            "--noheadings",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            "pv_size",
        ],
    )
    .expect("pvs");
    assert_eq!(pv_size.trim(), (252 * MIB).to_string());
    // The room is usable, the volume on it untouched, and a rescan with
    // nothing grown changes nothing.
    f.create(f.req("big", 128 * MIB)).await;
    assert_eq!(f.engine.get_volume("kept").await.expect("kept"), kept);
    f.engine.rescan().await.expect("rescan");
    assert_eq!(f.capacity().await.total_bytes, 252 * MIB);
}

#[tokio::test]
async fn foreign_lvs_are_never_listed_or_deleted() {
    let Some(f) = lvm_fixture("foreign", &[128 * MIB], 0).await else {
        return;
    };
    f.create(f.req("ours", 8 * MIB)).await;
    lvcreate_aside(&f, "theirs", "8m", &[]);
    let dev = f.disks[0].dev();
    f.engine.rescan().await.expect("rescan");
    assert_eq!(f.names().await, ["ours"]);
    assert_not_found(&f.engine, "theirs").await;
    let err = f.refused(f.req("theirs", 8 * MIB)).await;
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err}");
    let lvs = lvm(&[&dev], &["lvs", "--noheadings", "-o", "lv_name", &f.group]).expect("lvs");
    assert!(lvs.contains("theirs"), "foreign LV still there: {lvs}");
    assert_eq!(f.capacity().await.volume_count, 1);
}

#[tokio::test]
async fn a_new_engine_finds_existing_volumes() {
    let Some(f) = lvm_fixture("restart", &[128 * MIB, 64 * MIB], 0).await else {
        return;
    };
    let a = f.create(f.req("keep-a", 8 * MIB)).await;
    let b = f.create(f.req("keep-b", 100 * MIB)).await;
    let EngineFixture {
        engine,
        group,
        vg: _vg,
        disks,
        ..
    } = f;
    drop(engine);
    // Simulate a reboot: the loop exposures are gone.
    for d in &disks {
        for stacked in carina_tests::loops_backed_by(&d.dev()) {
            run("losetup", &["-d", &stacked]).expect("detach");
        }
    }
    let engine = engine_over(&group, "LVM", &disks, 0).await;
    let vols = engine.list_volumes(None).await.expect("list");
    assert_eq!(vols.len(), 2);
    for (old, new) in [(&a, &vols[0]), (&b, &vols[1])] {
        assert_eq!(old.name, new.name);
        assert_eq!(old.size_bytes, new.size_bytes);
        assert_eq!(
            blockdev_size(new.device_path.as_deref().expect("dev")),
            old.size_bytes
        );
    }
    let cap = engine.capacity(None).await.expect("capacity").remove(0);
    assert_eq!(cap.disks.len(), 2);
    assert_eq!(cap.volume_count, 2);
    drop(engine);
}

async fn data_path(fstype: &str, mkfs: &[&str]) {
    let Some(f) = lvm_fixture(&format!("data-{fstype}"), &[400 * MIB], 0).await else {
        return;
    };
    let dev = dev_arg(&f.create(f.req("data", 320 * MIB)).await);
    let mut args: Vec<&str> = mkfs[1..].to_vec();
    args.push(&dev);
    run(mkfs[0], &args).expect("mkfs");
    let mnt = tempfile::tempdir().expect("tempdir");
    {
        let _m = MountGuard::mount(&dev, mnt.path(), Some(fstype), None).expect("mount");
        std::fs::write(mnt.path().join("hello.txt"), b"carina data path").expect("write");
    }
    // Unmounted; the volume survives a rescan, then mount again and read.
    f.engine.rescan().await.expect("rescan");
    let dev2 = dev_arg(&f.engine.get_volume("data").await.expect("get"));
    {
        let _m = MountGuard::mount(&dev2, mnt.path(), Some(fstype), None).expect("remount");
        let text = std::fs::read(mnt.path().join("hello.txt")).expect("read back");
        assert_eq!(text, b"carina data path");
        // In use: delete must refuse rather than pull the device away.
        let err = f.engine.delete_volume("data").await.expect_err("mounted");
        assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");
    }
    f.engine
        .delete_volume("data")
        .await
        .expect("delete after unmount");
}

#[tokio::test]
async fn data_path_ext4() {
    data_path("ext4", &["mkfs.ext4", "-q", "-F"]).await;
}

#[tokio::test]
async fn data_path_xfs() {
    data_path("xfs", &["mkfs.xfs", "-q", "-f"]).await;
}

/// Grows a mounted volume and the filesystem on it. XFS, because ext4's
/// online resize needs CAP_SYS_RESOURCE, which containers often drop.
#[tokio::test]
async fn online_grow_of_a_mounted_volume() {
    let Some(f) = lvm_fixture("online-grow", &[768 * MIB], 0).await else {
        return;
    };
    let v = f.create(f.req("grow", 320 * MIB)).await;
    let dev = dev_arg(&v);
    run("mkfs.xfs", &["-q", "-f", &dev]).expect("mkfs");
    let mnt = tempfile::tempdir().expect("tempdir");
    let _m = MountGuard::mount(&dev, mnt.path(), Some("xfs"), None).expect("mount");
    let grown = f
        .engine
        .resize_volume("grow", 640 * MIB)
        .await
        .expect("grow while mounted");
    assert_eq!(
        grown.device_path.as_deref(),
        v.device_path.as_deref(),
        "same device, resized in place"
    );
    assert_eq!(
        blockdev_size(grown.device_path.as_deref().expect("dev")),
        640 * MIB
    );
    let mnt_s = mnt.path().to_string_lossy().into_owned();
    run("xfs_growfs", &[&mnt_s]).expect("online xfs_growfs");
    let df = run("df", &["-B1", "--output=size", &mnt_s]).expect("df");
    let size: u64 = df
        .lines()
        .nth(1)
        .expect("size line")
        .trim()
        .parse()
        .expect("number");
    assert!(
        size > 500 * MIB,
        "filesystem grew past the old 320 MiB: {size}"
    );
}

#[tokio::test]
async fn wiped_on_create() {
    let Some(f) = lvm_fixture("wipe", &[128 * MIB], 0).await else {
        return;
    };
    let dev = dev_arg(&f.create(f.req("first", 32 * MIB)).await);
    run("mkfs.ext4", &["-q", "-F", &dev]).expect("mkfs");
    f.engine.delete_volume("first").await.expect("delete");
    // On the same extents.
    let dev2 = dev_arg(&f.create(f.req("second", 32 * MIB)).await);
    let probe = std::process::Command::new("blkid")
        .args(["-p", &dev2])
        .output()
        .expect("blkid");
    assert_eq!(
        probe.status.code(),
        Some(2),
        "no old filesystem shows through: {}",
        String::from_utf8_lossy(&probe.stdout)
    );
}

/// An LV of ours the engine has no record of is what a create leaves
/// whose lvcreate committed but whose answer never came (the shell died
/// or the time limit fired). The retry of that create (same name and
/// size) finishes it, exposed and wiped as a create would have, instead
/// of refusing the name; another size is still a conflict.
#[tokio::test]
async fn a_retry_finishes_a_create_whose_answer_was_lost() {
    let Some(f) = lvm_fixture("lost", &[128 * MIB], 0).await else {
        return;
    };
    // An old filesystem on the extents the leftover will take.
    let old = dev_arg(&f.create(f.req("old", 32 * MIB)).await);
    run("mkfs.ext4", &["-q", "-F", &old]).expect("mkfs");
    f.engine.delete_volume("old").await.expect("delete");
    // The lvcreate of the lost create, as the engine runs it.
    lvcreate_aside(&f, "lost", "32m", &[OWNER_TAG]);

    let err = f.refused(f.req("lost", 16 * MIB)).await;
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err}");
    let lost = f.create(f.req("lost", 32 * MIB)).await;
    assert_eq!(lost.size_bytes, 32 * MIB);
    let probe = std::process::Command::new("blkid")
        .args(["-p", &dev_arg(&lost)])
        .output()
        .expect("blkid");
    assert_eq!(
        probe.status.code(),
        Some(2),
        "the old filesystem does not show through: {}",
        String::from_utf8_lossy(&probe.stdout)
    );
    assert_eq!(f.names().await, ["lost"]);
    assert_eq!(f.create(f.req("lost", 32 * MIB)).await, lost, "a repeat");
}

/// Listing while volumes come and go never leaves a loop device behind:
/// a list that read the VG before a delete must not attach a loop for the
/// volume the delete is removing (it would outlive the LV, over freed
/// extents). Lists run back to back against create/delete cycles; at the
/// end, with every volume deleted, no loop device is left on the PV.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_during_deletes_leave_no_loop_behind() {
    let Some(f) = lvm_fixture("list-race", &[128 * MIB], 0).await else {
        return;
    };
    let lister = Lister::start(f.engine.clone());
    for i in 0..40 {
        let name = format!("v{i}");
        f.create(f.req(&name, 4 * MIB)).await;
        f.engine.delete_volume(&name).await.expect("delete");
    }
    let lists = lister.stop().await;
    assert_eq!(f.names().await, Vec::<String>::new());
    let left = carina_tests::loops_backed_by(&f.disks[0].dev());
    assert!(
        left.is_empty(),
        "loop devices left on the PV after {lists} lists: {left:?}"
    );
}

/// Creates that run at once each get their own extents and their own
/// loop device (the tail of a create, its loop and wipe, runs beside the
/// next create's lvcreate); deleting them all leaves no loop behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_get_their_own_devices() {
    let Some(f) = lvm_fixture("concurrent", &[256 * MIB], 0).await else {
        return;
    };
    let f = std::sync::Arc::new(f);
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let f = f.clone();
            tokio::spawn(async move { f.create(f.req(&format!("c{i}"), 8 * MIB)).await })
        })
        .collect();
    let mut devices = std::collections::BTreeSet::new();
    for t in tasks {
        let v = t.await.expect("create task");
        assert_eq!(v.size_bytes, 8 * MIB);
        assert_eq!(
            blockdev_size(v.device_path.as_deref().expect("a device")),
            8 * MIB,
            "{v:?}"
        );
        assert!(devices.insert(dev_arg(&v)), "{} given twice", dev_arg(&v));
    }
    assert_eq!(f.names().await.len(), 16);
    for i in 0..16 {
        f.engine
            .delete_volume(&format!("c{i}"))
            .await
            .expect("delete");
    }
    let left = carina_tests::loops_backed_by(&f.disks[0].dev());
    assert!(left.is_empty(), "loop devices left on the PV: {left:?}");
}
