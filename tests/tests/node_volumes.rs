//! Carina on a real node, each volume type from claim to pod and back:
//! a WaitForFirstConsumer claim is provisioned for the pod the scheduler
//! placed, the kubelet stages and publishes it, the pod writes; a second
//! pod reads the data back; deleting the claim deletes the volume and
//! leaves nothing on the node. The chart's capacity tracking publishes
//! `CSIStorageCapacity` objects owned by the controller Deployment.
//!
//! Runs a LocalCluster (etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, containerd, runc, kube-proxy, kubelet) with Carina
//! installed by its Helm chart from the images of `make images`. Needs
//! root and `tests/tools/build.sh etcd kube kubelet containerd crictl cni
//! helm test-images`.

use std::time::Duration;

use anyhow::{Result, ensure};
use carina_tests::have_root;
use carina_tests::local::LocalCluster;
use carina_tests::local::carina::{
    Carina, Layout, NAMESPACE, explained, local_options, partitions,
};
use carina_tests::local::workload::{Use, Workload, busybox_image, claim, pod};
use futures::TryStreamExt;
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};

/// Writes a token through one pod and reads it back through another, then
/// deletes the claim; returns the cluster for the caller's checks of what
/// is left.
async fn round_trip(class: &str, size: &str, block: bool) -> Result<(LocalCluster, Carina)> {
    let mut cluster = LocalCluster::start(local_options()?).await?;
    let carina = Carina::install(&mut cluster, &Layout::standard()).await?;
    let result = write_read_delete(&cluster, class, size, block).await;
    explained(&cluster, result)?;
    Ok((cluster, carina))
}

async fn write_read_delete(
    cluster: &LocalCluster,
    class: &str,
    size: &str,
    block: bool,
) -> Result<()> {
    let work = Workload::new(cluster.client(), "default");
    let image = busybox_image()?;
    let token = carina_tests::unique("token");

    work.create_claim(&claim("data", class, size, block))
        .await?;
    let (write, read, uses) = if block {
        (
            format!(
                "printf '{token}' | dd of=/dev/xvda conv=fsync && echo -n written > /dev/termination-log"
            ),
            format!(
                "dd if=/dev/xvda bs={} count=1 2>/dev/null > /dev/termination-log",
                token.len()
            ),
            vec![Use::device("data", "/dev/xvda")],
        )
    } else {
        (
            format!(
                "echo -n '{token}' > /data/f && sync && echo -n written > /dev/termination-log"
            ),
            "cat /data/f > /dev/termination-log".to_string(),
            vec![Use::mount("data", "/data")],
        )
    };
    work.create_pod(&pod("writer", &image, &write, &uses))
        .await?;
    let written = work.succeeded("writer").await?;
    ensure!(written == "written", "writer: {written:?}");
    work.delete_pod("writer").await?;

    work.create_pod(&pod("reader", &image, &read, &uses))
        .await?;
    let read_back = work.succeeded("reader").await?;
    ensure!(
        read_back == token,
        "read back {read_back:?}, wrote {token:?}"
    );
    work.delete_pod("reader").await?;

    work.delete_claim("data").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_ext4_round_trip() -> Result<()> {
    if !have_root("lvm_ext4_round_trip") {
        return Ok(());
    }
    let (cluster, carina) = round_trip("csi-carina-lvm-ext4", "256Mi", false).await?;
    let left = carina.logical_volumes("carina-vg-ssd")?;
    ensure!(
        left.is_empty(),
        "LVs left after the claim was deleted: {left:?}"
    );
    published_capacity_is_owned_by_the_controller(&cluster, "csi-carina-lvm-ext4").await
}

/// The chart's external-provisioner publishes the class's capacity on the
/// node, owned (pod, ReplicaSet, then) by the controller Deployment, so
/// the objects go with the release.
async fn published_capacity_is_owned_by_the_controller(
    cluster: &LocalCluster,
    class: &str,
) -> Result<()> {
    let api: Api<CSIStorageCapacity> = Api::namespaced(cluster.client(), NAMESPACE);
    let wanted = |c: &CSIStorageCapacity| {
        c.storage_class_name == class
            && c.owner_references()
                .iter()
                .any(|o| o.kind == "Deployment" && o.name == "carina-controller")
            && c.capacity.is_some()
    };
    let stream = watcher(api.clone(), watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let found = tokio::time::timeout(Duration::from_secs(120), async {
        while stream.try_next().await?.is_some() {
            if api
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .any(wanted)
            {
                return Ok::<_, anyhow::Error>(());
            }
        }
        anyhow::bail!("the watch of CSIStorageCapacity ended")
    })
    .await;
    match found {
        Ok(r) => r,
        Err(_) => {
            let all = api.list(&ListParams::default()).await?.items;
            anyhow::bail!(
                "no CSIStorageCapacity of {class} owned by Deployment carina-controller; have {:?}",
                all.iter()
                    .map(|c| (c.storage_class_name.clone(), c.owner_references().to_vec()))
                    .collect::<Vec<_>>()
            )
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_xfs_round_trip() -> Result<()> {
    if !have_root("lvm_xfs_round_trip") {
        return Ok(());
    }
    let (_cluster, carina) = round_trip("csi-carina-lvm", "512Mi", false).await?;
    let left = carina.logical_volumes("carina-vg-ssd")?;
    ensure!(
        left.is_empty(),
        "LVs left after the claim was deleted: {left:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_block_round_trip() -> Result<()> {
    if !have_root("lvm_block_round_trip") {
        return Ok(());
    }
    let (_cluster, carina) = round_trip("csi-carina-hdd", "64Mi", true).await?;
    let left = carina.logical_volumes("carina-vg-hdd")?;
    ensure!(
        left.is_empty(),
        "LVs left after the claim was deleted: {left:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_partition_round_trip() -> Result<()> {
    if !have_root("raw_partition_round_trip") {
        return Ok(());
    }
    let (_cluster, carina) = round_trip("csi-carina-raw", "256Mi", false).await?;
    for (group, dev) in &carina.disks {
        if group == "carina-raw-hdd" {
            let left = partitions(dev);
            ensure!(left.is_empty(), "partitions left on {dev}: {left:?}");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_directory_round_trip() -> Result<()> {
    if !have_root("host_directory_round_trip") {
        return Ok(());
    }
    let (_cluster, carina) = round_trip("csi-carina-host", "64Mi", false).await?;
    // The group keeps its marker folder; no volume's folder or marker may
    // be left.
    for (_, dir) in &carina.host_dirs {
        let markers = dir.join(carina_node::engine::host::MARKER_DIR);
        let left: Vec<_> = std::fs::read_dir(dir)?
            .chain(std::fs::read_dir(&markers)?)
            .flatten()
            .map(|e| e.path())
            .filter(|p| p != &markers)
            .collect();
        ensure!(left.is_empty(), "left in {}: {left:?}", dir.display());
    }
    Ok(())
}
