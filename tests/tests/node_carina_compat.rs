//! What a Go Carina user brings, unchanged, on a real node: a
//! `config.json` with only the keys Carina documents (so Carina's defaults
//! apply, 10 GiB kept free in each group among them) and StorageClasses
//! written the way Carina's documentation writes them, applied as YAML
//! text: the current key `disk-group-name` with the pod-migration opt-in
//! beside it, the older key `disk-type`, an `Immediate` class, an empty
//! `mountOptions`. A pod writes through claims of both classes, a second
//! pod reads the data back, and deleting the claims leaves nothing.
//!
//! Needs what node_volumes.rs needs.

use anyhow::{Context, Result, ensure};
use carina_tests::have_root;
use carina_tests::local::LocalCluster;
use carina_tests::local::carina::{Carina, Group, Layout, explained, local_options, partitions};
use carina_tests::local::workload::{Use, Workload, busybox_image, claim, pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};

const MIB: u64 = 1 << 20;

/// Carina's documented LVM class: xfs, the group by its current key, and
/// the pod-migration opt-in Carina's documentation puts beside it.
const LVM_CLASS: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: csi-carina-sc
provisioner: carina.storage.io
parameters:
  csi.storage.k8s.io/fstype: xfs
  carina.storage.io/disk-group-name: carina-vg-ssd
  carina.storage.io/allow-pod-migration-if-node-notready: "true"
reclaimPolicy: Delete
allowVolumeExpansion: true
volumeBindingMode: WaitForFirstConsumer
mountOptions:
"#;

/// A RAW class with the older key `disk-type`, bound at once.
const RAW_CLASS: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: csi-carina-raw
provisioner: carina.storage.io
parameters:
  csi.storage.k8s.io/fstype: ext4
  carina.storage.io/disk-type: carina-raw-ssd
reclaimPolicy: Delete
allowVolumeExpansion: true
volumeBindingMode: Immediate
mountOptions:
"#;

/// An LVM and a RAW group, each on a 12 GiB sparse disk (Carina keeps
/// 10 GiB of a group free); no StorageClass from the chart.
fn carina_layout() -> Layout {
    let group = |name: &str, policy: &str, size: u64| Group {
        name: name.to_string(),
        policy: policy.to_string(),
        disks: vec![size],
    };
    Layout {
        groups: vec![
            group("carina-vg-ssd", "LVM", 12 * 1024 * MIB),
            group("carina-raw-ssd", "RAW", 12 * 1024 * MIB),
        ],
        storage_classes: serde_json::json!([]),
        extender: false,
        carina_keys_only: true,
        capacity_tracking: true,
        snapshots: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn carina_documented_config_and_storage_classes() -> Result<()> {
    if !have_root("carina_documented_config_and_storage_classes") {
        return Ok(());
    }
    let mut cluster = LocalCluster::start(local_options()?).await?;
    let carina = Carina::install(&mut cluster, &carina_layout()).await?;
    let result = documented_classes_round_trip(&cluster, &carina).await;
    explained(&cluster, result)
}

async fn documented_classes_round_trip(cluster: &LocalCluster, carina: &Carina) -> Result<()> {
    let classes: Api<StorageClass> = Api::all(cluster.client());
    for text in [LVM_CLASS, RAW_CLASS] {
        let class: StorageClass = serde_yaml::from_str(text).context("StorageClass YAML")?;
        classes.create(&PostParams::default(), &class).await?;
    }
    let work = Workload::new(cluster.client(), "default");
    let image = busybox_image()?;

    // 1 GiB fits beside the 10 GiB Carina keeps free in a 12 GiB group;
    // the RAW claim is provisioned before any pod asks for it.
    work.create_claim(&claim("db", "csi-carina-sc", "1Gi", false))
        .await?;
    work.create_claim(&claim("log", "csi-carina-raw", "256Mi", false))
        .await?;
    work.bound("log").await?;

    let token = carina_tests::unique("token");
    let uses = [Use::mount("db", "/db"), Use::mount("log", "/log")];
    work.create_pod(&pod(
        "writer",
        &image,
        &format!(
            "echo -n '{token}' > /db/f && echo -n '{token}' > /log/f && sync && \
             echo -n written > /dev/termination-log"
        ),
        &uses,
    ))
    .await?;
    let written = work.succeeded("writer").await?;
    ensure!(written == "written", "writer: {written:?}");
    work.delete_pod("writer").await?;
    work.create_pod(&pod(
        "reader",
        &image,
        "cat /db/f /log/f > /dev/termination-log",
        &uses,
    ))
    .await?;
    let read = work.succeeded("reader").await?;
    ensure!(
        read == format!("{token}{token}"),
        "read back {read:?}, wrote {token:?} twice"
    );
    work.delete_pod("reader").await?;

    // The volumes are where the classes said, and go with their claims.
    let raw_disk = carina
        .disks_of("carina-raw-ssd")
        .first()
        .map(|d| d.to_string())
        .context("no disk for carina-raw-ssd")?;
    let lvs = carina.logical_volumes("carina-vg-ssd")?;
    ensure!(lvs.len() == 1, "LVs in carina-vg-ssd: {lvs:?}");
    let parts = partitions(&raw_disk);
    ensure!(parts.len() == 1, "partitions of {raw_disk}: {parts:?}");
    work.delete_claim("db").await?;
    work.delete_claim("log").await?;
    let lvs = carina.logical_volumes("carina-vg-ssd")?;
    ensure!(lvs.is_empty(), "LVs left in carina-vg-ssd: {lvs:?}");
    let parts = partitions(&raw_disk);
    ensure!(parts.is_empty(), "partitions left on {raw_disk}: {parts:?}");
    Ok(())
}
