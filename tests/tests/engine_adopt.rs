//! Engine tests of adopting volumes Go Carina made: each test makes the
//! volumes by hand exactly as Go Carina did (an untagged LV
//! `volume-<pv>`, a directory `host-<pv>` mode 0777 with no marker), puts
//! data in them, adopts one and checks that its data is intact, that it
//! is then a volume like any other (get, list, resize, delete, capacity),
//! that adoption is idempotent, that refusals change nothing, and that a
//! volume not named is never touched.

use std::path::{Path, PathBuf};

use carina_node::engine::{AdoptRequest, Engine, Error, Policy};
use carina_tests::engine::{EngineFixture, capacity, engine_for};
use carina_tests::gocarina::{go_host_dir, go_lvcreate, lv_device, put_data, read_data};
use carina_tests::{LoopDisk, MountGuard, have_root, lvm, run, unique};

const MIB: u64 = 1 << 20;

fn tags(devs: &[&str], vg: &str, lv: &str) -> String {
    lvm(
        devs,
        &[
            "lvs",
            "--noheadings",
            "-o",
            "lv_tags",
            &format!("{vg}/{lv}"),
        ],
    )
    .expect("lvs")
    .trim()
    .to_string()
}

fn req(name: &str, group: &str, policy: Policy, size: u64) -> AdoptRequest {
    AdoptRequest {
        name: name.into(),
        group: group.into(),
        policy,
        disk: None,
        partition_label: None,
        size_bytes: size,
    }
}

async fn refused(engine: &Engine, r: AdoptRequest) -> Error {
    engine
        .adopt_volume(r.clone())
        .await
        .expect_err(&format!("adopting {r:?} must fail"))
}

#[tokio::test]
async fn an_lvm_volume_go_made_is_adopted_in_place() {
    const TEST: &str = "an_lvm_volume_go_made_is_adopted_in_place";
    let Some(f) = EngineFixture::new(TEST, "LVM", &[256 * MIB], 0).await else {
        return;
    };
    let devs: Vec<String> = f.disks.iter().map(LoopDisk::dev).collect();
    let devs: Vec<&str> = devs.iter().map(String::as_str).collect();
    let vg = f.group.as_str();
    // The bystander first, so the adopted LV has free extents after it
    // (loop activation grows an LV only into the extents that follow).
    let other = format!("volume-{}", unique("pvc"));
    let name = format!("volume-{}", unique("pvc"));
    go_lvcreate(&devs, vg, &other, 16 * MIB);
    go_lvcreate(&devs, vg, &name, 32 * MIB);
    for (lv, content) in [(&other, "bystander"), (&name, "kept in place")] {
        let (dev, window) = lv_device(&devs, vg, lv);
        put_data(&dev, content);
        drop(window);
    }
    // The node starts over the VG Go Carina left.
    let engine = f.restart().await;
    let before = capacity(&engine, vg).await;
    assert_eq!(before.volume_count, 0, "Go's LVs are not ours yet");
    assert!(matches!(
        engine.get_volume(&name).await,
        Err(Error::VolumeNotFound { .. })
    ));

    // Refusals change nothing: wrong group, wrong kind, larger than the
    // LV, no such LV.
    let e = refused(&engine, req(&name, "no-such-group", Policy::Lvm, 32 * MIB)).await;
    assert!(matches!(e, Error::FailedPrecondition { .. }), "{e}");
    assert!(e.to_string().contains("no-such-group"), "{e}");
    let e = refused(&engine, req(&name, vg, Policy::Raw, 32 * MIB)).await;
    assert!(matches!(e, Error::FailedPrecondition { .. }), "{e}");
    let e = refused(&engine, req(&name, vg, Policy::Lvm, 33 * MIB)).await;
    assert!(matches!(e, Error::FailedPrecondition { .. }), "{e}");
    assert!(e.to_string().contains("less than"), "{e}");
    let e = refused(
        &engine,
        req(&format!("volume-{}", unique("pvc")), vg, Policy::Lvm, MIB),
    )
    .await;
    assert!(matches!(e, Error::VolumeNotFound { .. }), "{e}");
    assert_eq!(
        tags(&devs, vg, &name),
        "",
        "a refused adoption tagged the LV"
    );

    // Adopted: ours, its data intact.
    let v = engine
        .adopt_volume(req(&name, vg, Policy::Lvm, 32 * MIB))
        .await
        .expect("adopt");
    assert_eq!(
        (v.name.as_str(), v.group.as_str(), v.size_bytes),
        (name.as_str(), vg, 32 * MIB)
    );
    assert_eq!(tags(&devs, vg, &name), "carina.storage.io/owner=carina");
    let dev = v.device_path.clone().expect("a device");
    assert_eq!(read_data(&dev), "kept in place");
    // Idempotent, also with the smaller size a claim may record.
    let again = engine
        .adopt_volume(req(&name, vg, Policy::Lvm, 30 * MIB))
        .await
        .expect("adopt again");
    assert_eq!(again, v);
    // In another group, or larger, it is refused now as before.
    let e = refused(&engine, req(&name, vg, Policy::Lvm, 64 * MIB)).await;
    assert!(matches!(e, Error::FailedPrecondition { .. }), "{e}");

    // A volume like any other.
    assert_eq!(engine.get_volume(&name).await.expect("get"), v);
    let listed: Vec<String> = engine
        .list_volumes(Some(vg))
        .await
        .expect("list")
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(listed, vec![name.clone()], "only the adopted LV is ours");
    let adopted = capacity(&engine, vg).await;
    assert_eq!(adopted.volume_count, 1);
    let grown = engine.resize_volume(&name, 64 * MIB).await.expect("resize");
    assert_eq!(grown.size_bytes, 64 * MIB);
    assert_eq!(
        read_data(&grown.device_path.clone().expect("device")),
        "kept in place"
    );
    assert_eq!(
        capacity(&engine, vg).await.free_bytes,
        adopted.free_bytes - 32 * MIB
    );
    engine.delete_volume(&name).await.expect("delete");
    let after = capacity(&engine, vg).await;
    assert_eq!(after.volume_count, 0);
    assert_eq!(
        after.free_bytes,
        before.free_bytes + 32 * MIB,
        "the LV's space came back"
    );

    // The LV not named is as Go left it.
    assert_eq!(tags(&devs, vg, &other), "");
    let (dev, window) = lv_device(&devs, vg, &other);
    assert_eq!(read_data(Path::new(&dev)), "bystander");
    drop(window);
}

/// A HOST group on its own small file system.
struct HostFs {
    engine: Engine,
    group: String,
    root: PathBuf,
    _mount: MountGuard,
    _dir: tempfile::TempDir,
    _disk: LoopDisk,
}

async fn host_fs(test: &str) -> Option<HostFs> {
    if !have_root(test) {
        return None;
    }
    let disk = LoopDisk::new(64 * MIB).expect("loop disk");
    run("mkfs.ext4", &["-q", "-F", &disk.dev()]).expect("mkfs.ext4");
    let dir = tempfile::tempdir().expect("tempdir");
    let mount = MountGuard::mount(&disk.dev(), dir.path(), Some("ext4"), None).expect("mount");
    let root = dir.path().join("carina-hostpath");
    let group = unique("host");
    let config = serde_json::json!({
        "diskSelector": [{"name": group, "policy": "HOST", "root": root, "reserveBytes": 0}],
        "diskScanInterval": "0",
    })
    .to_string();
    let engine = engine_for(&config, Some(false)).await;
    Some(HostFs {
        engine,
        group,
        root,
        _mount: mount,
        _dir: dir,
        _disk: disk,
    })
}

#[tokio::test]
async fn a_host_volume_go_made_is_adopted_in_place() {
    const TEST: &str = "a_host_volume_go_made_is_adopted_in_place";
    let Some(h) = host_fs(TEST).await else {
        return;
    };
    let g = h.group.as_str();
    let name = format!("host-{}", unique("pvc"));
    let other = format!("host-{}", unique("pvc"));
    let dir = go_host_dir(&h.root, &name, "kept in place");
    let other_dir = go_host_dir(&h.root, &other, "bystander");
    let before = capacity(&h.engine, g).await;
    assert_eq!(before.volume_count, 0);

    let e = refused(
        &h.engine,
        req(&name, "no-such-group", Policy::Host, 8 * MIB),
    )
    .await;
    assert!(matches!(e, Error::FailedPrecondition { .. }), "{e}");
    let e = refused(&h.engine, req(&name, g, Policy::Lvm, 8 * MIB)).await;
    assert!(matches!(e, Error::FailedPrecondition { .. }), "{e}");
    let e = refused(
        &h.engine,
        req(&format!("host-{}", unique("pvc")), g, Policy::Host, 8 * MIB),
    )
    .await;
    assert!(matches!(e, Error::VolumeNotFound { .. }), "{e}");
    let e = refused(&h.engine, req(&name, g, Policy::Host, 0)).await;
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(!h.root.join(".carina").join(format!("{name}.json")).exists());

    let v = h
        .engine
        .adopt_volume(req(&name, g, Policy::Host, 8 * MIB))
        .await
        .expect("adopt");
    assert_eq!(v.host_path.as_deref(), Some(dir.as_path()));
    assert_eq!(v.size_bytes, 8 * MIB);
    assert_eq!(
        std::fs::read_to_string(dir.join("data.txt")).expect("read"),
        "kept in place"
    );
    assert_eq!(
        h.engine
            .adopt_volume(req(&name, g, Policy::Host, 8 * MIB))
            .await
            .expect("adopt again"),
        v
    );
    assert_eq!(h.engine.get_volume(&name).await.expect("get"), v);
    let adopted = capacity(&h.engine, g).await;
    assert_eq!(adopted.volume_count, 1);
    assert!(
        adopted.free_bytes < before.free_bytes,
        "the adopted size is accounted"
    );
    let grown = h
        .engine
        .resize_volume(&name, 12 * MIB)
        .await
        .expect("resize");
    assert_eq!(grown.size_bytes, 12 * MIB);
    h.engine.delete_volume(&name).await.expect("delete");
    assert!(!dir.exists());
    let after = capacity(&h.engine, g).await;
    assert_eq!(after.volume_count, 0);

    // The directory not named is as Go left it: no marker, data there.
    assert!(
        !h.root
            .join(".carina")
            .join(format!("{other}.json"))
            .exists()
    );
    assert_eq!(
        std::fs::read_to_string(other_dir.join("data.txt")).expect("read"),
        "bystander"
    );
    assert!(matches!(
        h.engine.get_volume(&other).await,
        Err(Error::VolumeNotFound { .. })
    ));
}

/// `sgdisk -i N` of `dev`: (partition name, unique GUID).
fn gpt_entry(dev: &str, number: u32) -> (String, String) {
    let out = run("sgdisk", &["-i", &number.to_string(), dev]).expect("sgdisk -i");
    let field = |key: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().trim_matches('\'').to_string())
            .unwrap_or_default()
    };
    (field("Partition name:"), field("Partition unique GUID:"))
}

#[tokio::test]
async fn a_raw_volume_go_made_is_adopted_in_place() {
    const TEST: &str = "a_raw_volume_go_made_is_adopted_in_place";
    let Some(f) = EngineFixture::new(TEST, "RAW", &[128 * MIB], 0).await else {
        return;
    };
    let disk = &f.disks[0];
    let dev = disk.dev();
    let g = f.group.as_str();
    // As Go Carina did: a GPT, one partition per volume named
    // carina.io/<the name's last segment>, a random unique GUID.
    let other = format!("volume-{}", unique("pvc"));
    let name = format!("volume-{}", unique("pvc"));
    let label = |n: &str| format!("carina.io/{}", n.rsplit('-').next().expect("segment"));
    run("sgdisk", &["-o", &dev]).expect("sgdisk -o");
    run(
        "sgdisk",
        &[
            "-n",
            "1:0:+16M",
            "-c",
            &format!("1:{}", label(&other)),
            &dev,
        ],
    )
    .expect("p1");
    run(
        "sgdisk",
        &["-n", "2:0:+24M", "-c", &format!("2:{}", label(&name)), &dev],
    )
    .expect("p2");
    run("partx", &["-u", &dev]).expect("partx");
    put_data(&format!("{dev}p1"), "bystander");
    put_data(&format!("{dev}p2"), "kept in place");
    let other_entry = gpt_entry(&dev, 1);
    let go_entry = gpt_entry(&dev, 2);
    // The node starts over the disk Go Carina left: not taken, since it
    // holds only partitions that are not ours.
    let engine = f.restart().await;
    assert!(capacity(&engine, g).await.disks.is_empty());
    let raw = |n: &str, size: u64| AdoptRequest {
        disk: Some(disk.name.clone()),
        partition_label: Some(label(n)),
        ..req(n, g, Policy::Raw, size)
    };

    let e = refused(&engine, raw(&name, 25 * MIB)).await;
    assert!(matches!(e, Error::FailedPrecondition { .. }), "{e}");
    let e = refused(
        &engine,
        AdoptRequest {
            disk: Some("no-such-disk".into()),
            ..raw(&name, MIB)
        },
    )
    .await;
    assert!(matches!(e, Error::VolumeNotFound { .. }), "{e}");
    let e = refused(&engine, raw(&format!("volume-{}", unique("pvc")), MIB)).await;
    assert!(matches!(e, Error::VolumeNotFound { .. }), "{e}");
    let e = refused(
        &engine,
        AdoptRequest {
            group: "no-such-group".into(),
            ..raw(&name, MIB)
        },
    )
    .await;
    assert!(matches!(e, Error::FailedPrecondition { .. }), "{e}");
    assert_eq!(
        gpt_entry(&dev, 2),
        go_entry,
        "a refused adoption changed the entry"
    );

    let v = engine
        .adopt_volume(raw(&name, 24 * MIB))
        .await
        .expect("adopt");
    assert_eq!((v.name.as_str(), v.size_bytes), (name.as_str(), 24 * MIB));
    let (label_now, guid_now) = gpt_entry(&dev, 2);
    assert_eq!(label_now, carina_node::engine::raw::partition_name(&name));
    assert_eq!(guid_now, carina_node::engine::raw::volume_guid(&name));
    assert_eq!(
        read_data(&v.device_path.clone().expect("device")),
        "kept in place"
    );
    assert_eq!(
        engine
            .adopt_volume(raw(&name, 24 * MIB))
            .await
            .expect("again"),
        v
    );
    assert_eq!(engine.get_volume(&name).await.expect("get"), v);
    let adopted = capacity(&engine, g).await;
    assert_eq!(adopted.volume_count, 1);
    assert_eq!(adopted.disks, vec![dev.clone()], "the group took the disk");
    let grown = engine.resize_volume(&name, 32 * MIB).await.expect("resize");
    assert_eq!(grown.size_bytes, 32 * MIB);
    assert_eq!(
        read_data(&grown.device_path.clone().expect("device")),
        "kept in place"
    );
    assert_eq!(
        capacity(&engine, g).await.free_bytes,
        adopted.free_bytes - 8 * MIB
    );
    engine.delete_volume(&name).await.expect("delete");
    assert!(matches!(
        engine.get_volume(&name).await,
        Err(Error::VolumeNotFound { .. })
    ));
    assert_eq!(
        capacity(&engine, g).await.free_bytes,
        adopted.free_bytes + 24 * MIB
    );

    // The partition not named is as Go left it.
    assert_eq!(gpt_entry(&dev, 1), other_entry);
    assert_eq!(read_data(Path::new(&format!("{dev}p1"))), "bystander");
}
