//! ReadWriteOncePod claims on a real node: one pod at a time uses the
//! volume, whichever way a second pod comes.
//!
//! For an LVM and a HOST claim of access mode `ReadWriteOncePod`, while a
//! first pod uses the volume:
//! - a second pod sent through the scheduler stays Pending with
//!   kube-scheduler's `FailedScheduling` reason;
//! - a pod that names the node itself (no scheduler) reaches the kubelet,
//!   which refuses to mount the volume for it, and the pod stays Pending
//!   with the kubelet's `FailedMount` reason; its container never starts.
//!   (The kubelet does not ask the node plugin; the plugin's own refusal
//!   of a second `SINGLE_NODE_SINGLE_WRITER` publication is tested in
//!   `csi_node.rs` and `csi_adopt.rs`.)
//!
//! Once the first pod is gone, the second pod is scheduled and reads what
//! the first wrote.
//!
//! Each test runs its own LocalCluster with Carina installed by the Helm
//! chart (see node_volumes.rs for what that needs).

use anyhow::{Context, Result, ensure};
use carina_tests::local::LocalCluster;
use carina_tests::local::carina::{Carina, Layout, explained, local_options};
use carina_tests::local::workload::{Use, Workload, busybox_image, claim, phase, pod};
use carina_tests::workload::{event_with, failed_scheduling};
use carina_tests::{have_root, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_once_pod_claim_serves_one_pod_at_a_time() -> Result<()> {
    if !have_root("a_read_write_once_pod_claim_serves_one_pod_at_a_time") {
        return Ok(());
    }
    let mut cluster = LocalCluster::start(local_options()?).await?;
    let _carina = Carina::install(&mut cluster, &Layout::standard()).await?;
    let result = async {
        one_pod_at_a_time(&cluster, "csi-carina-lvm-ext4", "lvm").await?;
        one_pod_at_a_time(&cluster, "csi-carina-host", "host").await
    }
    .await;
    explained(&cluster, result)
}

/// The checks of the module for one claim of `class`; every object's name
/// ends in `-{tag}`.
async fn one_pod_at_a_time(cluster: &LocalCluster, class: &str, tag: &str) -> Result<()> {
    let client = cluster.client();
    let work = Workload::new(client.clone(), "default");
    let image = busybox_image()?;
    let name = |what: &str| format!("{what}-{tag}");
    let (only, first, second, direct) =
        (name("only"), name("first"), name("second"), name("direct"));

    let mut exclusive = claim(&only, class, "256Mi", false);
    exclusive.spec.as_mut().context("claim spec")?.access_modes =
        Some(vec!["ReadWriteOncePod".to_string()]);
    work.create_claim(&exclusive).await?;
    let uses = [Use::mount(&only, "/data")];

    let token = unique("token");
    work.create_pod(&pod(
        &first,
        &image,
        &format!("echo -n '{token}' > /data/f && sync && while true; do sleep 1; done"),
        &uses,
    ))
    .await?;
    work.running(&first).await?;

    // Through the scheduler: kept off the claim.
    work.create_pod(&pod(
        &second,
        &image,
        "cat /data/f > /dev/termination-log",
        &uses,
    ))
    .await?;
    let reason = failed_scheduling(&client, "default", &second, "ReadWriteOncePod").await?;
    println!("{class}: the scheduler keeps {second} off: {reason}");

    // Past the scheduler: the kubelet does not mount the volume for it.
    let mut past = pod(&direct, &image, "echo ran > /data/direct", &uses);
    past.spec.as_mut().context("pod spec")?.node_name = Some(cluster.node_name().to_string());
    work.create_pod(&past).await?;
    let refused = event_with(
        &client,
        "default",
        &direct,
        "FailedMount",
        "ReadWriteOncePod access mode and is already in use",
    )
    .await?;
    println!(
        "{class}: the kubelet reports for {direct}: {}",
        refused.message.unwrap_or_default()
    );
    for waiting in [&second, &direct] {
        let p = work.pods.get(waiting).await?;
        ensure!(
            phase(Some(&p)) == Some("Pending"),
            "{waiting} is not Pending: {:?}",
            p.status
        );
    }
    let p = work.pods.get(&direct).await?;
    let started = p
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default()
        .iter()
        .any(|c| c.state.as_ref().is_some_and(|s| s.waiting.is_none()));
    ensure!(!started, "{direct}'s container started beside {first}");
    work.delete_pod(&direct).await?;

    // The first pod goes: the second is scheduled and reads its data.
    work.delete_pod(&first).await?;
    let read = work.succeeded(&second).await?;
    ensure!(
        read == token,
        "{second} read {read:?}, {first} wrote {token:?}"
    );
    work.delete_pod(&second).await?;
    work.delete_claim(&only).await?;
    Ok(())
}
