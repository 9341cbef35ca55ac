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
