//! The disks of an LVM group over time, on real loop devices: a disk that
//! grew is `pvresize`d at the next rescan (the group and what the engine
//! publishes grow); a disk the selector no longer matches leaves the
//! volume group when it holds no extents (and is no longer a physical
//! volume), and stays, with why in the disk report, when it holds
//! extents that loop activation cannot move.

use carina_node::engine::{Config, CreateRequest, Engine, EngineOptions};
use carina_tests::{LoopDisk, VgGuard, have_root, run, unique};

const MIB: u64 = 1 << 20;
const EXTENT: u64 = 4 * MIB;

fn config(group: &str, disks: &[&LoopDisk]) -> Config {
    let re: Vec<String> = disks.iter().map(|d| d.pattern()).collect();
    let json = serde_json::json!({
        "diskSelector": [{
            "name": group, "re": re, "policy": "LVM",
            "reserveBytes": 0, "minDiskBytes": MIB,
        }],
        "diskScanInterval": "0",
    });
    Config::from_json(&json.to_string()).expect("config")
}

async fn engine(config: Config) -> Engine {
    // Loop activation, as on a kernel without device-mapper.
    let options = EngineOptions {
        device_mapper: Some(false),
        ..Default::default()
    };
    Engine::start(config, options).await.expect("engine starts")
}

async fn total_and_disks(engine: &Engine, group: &str) -> (u64, Vec<String>) {
    let c = engine
        .capacity(Some(group))
        .await
        .expect("capacity")
        .remove(0);
    (c.total_bytes, c.disks)
}

/// What `blkid -p` finds on `dev` (`None`: nothing).
fn signature(dev: &str) -> Option<String> {
    run("blkid", &["-p", "-o", "value", "-s", "TYPE", dev])
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

#[tokio::test]
async fn a_grown_disk_grows_its_group() {
    if !have_root("a_grown_disk_grows_its_group") {
        return;
    }
    let disk = LoopDisk::new(64 * MIB).expect("loop disk");
    let group = unique("grow");
    let _vg = VgGuard::new(&group, &[&disk]);
    let engine = engine(config(&group, &[&disk])).await;
    let (before, _) = total_and_disks(&engine, &group).await;
    assert_eq!(before, 15 * EXTENT, "64 MiB: 1 MiB of metadata, 15 extents");

    run(
        "truncate",
        &[
            "-s",
            &(128 * MIB).to_string(),
            &disk.file().to_string_lossy(),
        ],
    )
    .expect("grow the backing file");
    run("losetup", &["-c", &disk.dev()]).expect("losetup -c");
    engine.rescan().await.expect("rescan");

    let (after, disks) = total_and_disks(&engine, &group).await;
    assert_eq!(after, 31 * EXTENT, "128 MiB: 31 extents after pvresize");
    assert_eq!(disks, [disk.dev()]);
    let published = engine.subscribe().borrow().clone();
    let g = published
        .groups
        .iter()
        .find(|g| g.group == group)
        .expect("the group is published");
    assert_eq!(g.total_bytes, 31 * EXTENT, "the published capacity grew");

    // The new extents take a volume larger than the disk was.
    let vol = engine
        .create_volume(CreateRequest {
            name: unique("big"),
            group: group.clone(),
            size_bytes: 100 * MIB,
            exclusive: false,
        })
        .await
        .expect("a volume larger than the old disk");
    // Nothing left to gain: the next rescan changes nothing.
    engine.rescan().await.expect("second rescan");
    assert_eq!(total_and_disks(&engine, &group).await.0, 31 * EXTENT);
    engine.delete_volume(&vol.name).await.expect("delete");
}

#[tokio::test]
async fn an_empty_disk_the_selector_drops_leaves_the_group() {
    if !have_root("an_empty_disk_the_selector_drops_leaves_the_group") {
        return;
    }
    let kept = LoopDisk::new(64 * MIB).expect("loop disk");
    let dropped = LoopDisk::new(64 * MIB).expect("loop disk");
    let group = unique("drop");
    let _vg = VgGuard::new(&group, &[&kept, &dropped]);
    let engine = engine(config(&group, &[&kept, &dropped])).await;
    let (total, mut disks) = total_and_disks(&engine, &group).await;
    disks.sort();
    let mut both = vec![kept.dev(), dropped.dev()];
    both.sort();
    assert_eq!((total, disks), (30 * EXTENT, both));
    assert_eq!(signature(&dropped.dev()).as_deref(), Some("LVM2_member"));

    engine
        .apply_config(config(&group, &[&kept]))
        .await
        .expect("apply a selector without the disk");

    assert_eq!(
        total_and_disks(&engine, &group).await,
        (15 * EXTENT, vec![kept.dev()]),
        "the dropped disk left the volume group"
    );
    assert_eq!(
        signature(&dropped.dev()),
        None,
        "the dropped disk is no longer a physical volume"
    );
    // The group still works, and a second rescan is a no-op.
    engine.rescan().await.expect("rescan");
    let vol = engine
        .create_volume(CreateRequest {
            name: unique("after"),
            group: group.clone(),
            size_bytes: 8 * MIB,
            exclusive: false,
        })
        .await
        .expect("create after the disk left");
    assert_eq!(vol.disk.as_deref(), Some(kept.dev().as_str()));
    engine.delete_volume(&vol.name).await.expect("delete");
}

#[tokio::test]
async fn a_dropped_disk_holding_extents_stays_in_loop_activation() {
    if !have_root("a_dropped_disk_holding_extents_stays_in_loop_activation") {
        return;
    }
    let kept = LoopDisk::new(64 * MIB).expect("loop disk");
    let dropped = LoopDisk::new(64 * MIB).expect("loop disk");
    let group = unique("hold");
    let _vg = VgGuard::new(&group, &[&kept, &dropped]);
    // The volume lands on the dropped disk: it is the group's only disk
    // when the volume is made.
    let engine = engine(config(&group, &[&dropped])).await;
    let vol = engine
        .create_volume(CreateRequest {
            name: unique("held"),
            group: group.clone(),
            size_bytes: 20 * MIB,
            exclusive: false,
        })
        .await
        .expect("create");
    let device = vol.device_path.clone().expect("a block device");
    run(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of={}", device.display()),
            "bs=1M",
            "count=4",
            "oflag=direct",
        ],
    )
    .expect("write the volume");
    let written = run("sha256sum", &[&device.to_string_lossy()]).expect("checksum");
    engine
        .apply_config(config(&group, &[&kept, &dropped]))
        .await
        .expect("add the other disk");
    assert_eq!(total_and_disks(&engine, &group).await.0, 30 * EXTENT);

    // The selector drops the disk that holds the volume: the rescan
    // succeeds, the disk stays, and the disk report says why.
    engine
        .apply_config(config(&group, &[&kept]))
        .await
        .expect("apply a selector without the disk");
    let (total, mut disks) = total_and_disks(&engine, &group).await;
    disks.sort();
    let mut both = vec![kept.dev(), dropped.dev()];
    both.sort();
    assert_eq!(
        (total, disks),
        (30 * EXTENT, both),
        "nothing was moved or removed"
    );
    let status = engine
        .disks()
        .into_iter()
        .find(|s| s.disk.path.to_string_lossy() == dropped.dev())
        .expect("the disk is reported");
    assert_eq!(status.group, None);
    for part in [
        "no longer matched by the selector",
        "still a physical volume",
        "5 extents",
        vol.name.as_str(),
        "pvmove",
        "device-mapper",
        "loop activation",
    ] {
        assert!(
            status.reason.contains(part),
            "{part:?} in {:?}",
            status.reason
        );
    }
    assert_eq!(signature(&dropped.dev()).as_deref(), Some("LVM2_member"));

    // The volume is whole and still served from the same extents.
    let again = engine.get_volume(&vol.name).await.expect("get");
    assert_eq!(again.disk.as_deref(), Some(dropped.dev().as_str()));
    let read = run(
        "sha256sum",
        &[&again.device_path.expect("device").to_string_lossy()],
    )
    .expect("checksum");
    assert_eq!(
        read.split_whitespace().next(),
        written.split_whitespace().next(),
        "the data is intact"
    );
    // A second rescan keeps it the same way (no half-done step to finish).
    engine.rescan().await.expect("rescan");
    assert_eq!(total_and_disks(&engine, &group).await.0, 30 * EXTENT);
    engine.delete_volume(&vol.name).await.expect("delete");
}
