//! A node never deletes a volume that is still in use on it. After a
//! network partition the control plane may give a volume up and recreate
//! its claim elsewhere while the old pod still runs on the cut-off node;
//! when that node is back, DeleteLV must not pull the storage from under
//! the pod. Here a volume is in use as CSI leaves it: a HOST directory
//! bind-mounted into a pod, an LVM volume's device node bound as a
//! published raw block volume. DeleteLV is refused with
//! FAILED_PRECONDITION naming the mount, the volume and its data stay;
//! once the mount is gone (the operator stops the pod), the same delete
//! goes through.

use std::path::Path;

use carina_node::engine::{CreateRequest, Engine, Error};
use carina_tests::engine::{EngineFixture, engine_for};
use carina_tests::grpc::host_config;
use carina_tests::{MountGuard, have_root, run, unique};

const MIB: u64 = 1 << 20;

/// Deletes `name` while `mount` uses it (refused, the volume kept), then
/// after dropping the mount (deleted).
async fn refused_until_unmounted(engine: &Engine, name: &str, mount: MountGuard) {
    let target = mount.target.display().to_string();
    match engine.delete_volume(name).await {
        Err(e @ Error::FailedPrecondition { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&target), "names the mount {target}: {text}");
            assert!(text.contains("still mounted"), "{text}");
        }
        other => panic!("DeleteLV of a mounted volume: {other:?}"),
    }
    assert!(
        engine.get_volume(name).await.is_ok(),
        "the refused volume is still there"
    );
    drop(mount);
    engine
        .delete_volume(name)
        .await
        .expect("the delete goes through once unmounted");
    assert!(engine.get_volume(name).await.is_err(), "deleted");
}

#[tokio::test]
async fn a_bound_host_directory_is_not_deleted() {
    if !have_root("a_bound_host_directory_is_not_deleted") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).expect("root");
    let group = unique("inuse-host");
    let engine = engine_for(&host_config(&group, &root, 0), Some(false)).await;
    let name = unique("inuse-h");
    let vol = engine
        .create_volume(CreateRequest {
            name: name.clone(),
            group: group.clone(),
            size_bytes: 8 * MIB,
            exclusive: false,
        })
        .await
        .expect("create");
    let data = vol
        .host_path
        .clone()
        .expect("a HOST volume has a directory");
    std::fs::write(data.join("pod-data"), b"still used").expect("write");
    let pod = dir.path().join("pod-mount");
    let mount = MountGuard::mount(&data.display().to_string(), &pod, None, Some("bind"))
        .expect("bind mount");
    refused_until_unmounted(&engine, &name, mount).await;
}

#[tokio::test]
async fn a_published_block_device_is_not_deleted() {
    let Some(fx) = EngineFixture::new(
        "a_published_block_device_is_not_deleted",
        "LVM",
        &[128 * MIB],
        0,
    )
    .await
    else {
        return;
    };
    let name = unique("inuse-b");
    let vol = fx.create(fx.req(&name, 16 * MIB)).await;
    let device = vol.device_path.clone().expect("a block device");
    // NodePublishVolume of a raw block volume: the device node bound onto
    // a file in the pod's directory, nothing mounted from the device.
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("block");
    std::fs::write(&target, b"").expect("target file");
    run(
        "mount",
        &[
            "--bind",
            &device.display().to_string(),
            &target.display().to_string(),
        ],
    )
    .expect("bind the device node");
    let mount = MountGuard {
        target: target.clone(),
    };
    assert!(Path::new(&target).exists());
    refused_until_unmounted(&fx.engine, &name, mount).await;
}

/// A RAW partition that something opens without mounting it: the kernel
/// refuses to forget a partition while it is open. Open for a moment (a
/// scanner such as blkid), the delete waits it out and goes through once
/// it is closed; open for good, the delete is refused, naming the
/// partition, and the volume stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_partition_open_for_a_moment_is_deleted_once_closed() {
    let Some(fx) = EngineFixture::new(
        "a_raw_partition_open_for_a_moment_is_deleted_once_closed",
        "RAW",
        &[128 * MIB],
        0,
    )
    .await
    else {
        return;
    };
    // Two partitions on the disk, so the table outlives each delete.
    let _neighbour = fx.create(fx.req(&unique("neighbour"), 16 * MIB)).await;
    let name = unique("opened");
    let vol = fx.create(fx.req(&name, 16 * MIB)).await;
    let device = vol.device_path.clone().expect("a block device");

    // Open for good: refused, the volume kept.
    let held = std::fs::File::open(&device).expect("open the partition");
    match fx.engine.delete_volume(&name).await {
        Err(e @ Error::FailedPrecondition { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&device.display().to_string()), "{text}");
            assert!(text.contains("the kernel keeps it"), "{text}");
        }
        other => panic!("DeleteLV of a partition held open: {other:?}"),
    }
    assert!(fx.engine.get_volume(&name).await.is_ok(), "still there");

    // Open for a moment after the delete starts: it waits, then deletes.
    let (opened_tx, opened_rx) = std::sync::mpsc::channel();
    let closer = std::thread::spawn(move || {
        opened_rx.recv().expect("the delete started");
        std::thread::sleep(std::time::Duration::from_millis(300));
        let closed = std::time::Instant::now();
        drop(held);
        closed
    });
    let started = std::time::Instant::now();
    opened_tx.send(()).expect("the closer waits");
    fx.engine
        .delete_volume(&name)
        .await
        .expect("deleted once the partition is closed");
    let returned = std::time::Instant::now();
    let closed = closer.join().expect("the closer");
    assert!(
        started < closed && closed <= returned,
        "the delete ran while the partition was open and ended after it was closed"
    );
    assert!(fx.engine.get_volume(&name).await.is_err(), "deleted");
}
