//! Carina on two real nodes of one host: the first node in the host's
//! namespaces, the second in a network and mount namespace of its own
//! (`carina_tests::local::second`), each with its kubelet, containerd and
//! kube-proxy. The chart's DaemonSet runs a node plugin on both; each
//! serves NodeStorage on its own address and reports its own capacity.
//!
//! One HOST group, `carina-host`, is a 256 MiB tmpfs on the first node and
//! a 2 GiB one on the second. A 1 GiB claim fits only the second: the
//! chart's scheduler (kube-scheduler with the Carina extender) places the
//! pod there, the volume is made there, the data lives there and nowhere
//! else, and deleting the claim removes it there.
//!
//! Needs root and the tools of the other `node_*` tests.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use carina_api::NodeStorageResource;
use carina_tests::have_root;
use carina_tests::local::LocalCluster;
use carina_tests::local::carina::{
    Carina, Group, Layout, SCHEDULER_NAME, explained, local_options,
};
use carina_tests::local::workload::{Use, Workload, busybox_image, claim, pod};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

const GROUP: &str = "carina-host";
const CLASS: &str = "csi-carina-host";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_fits_one_node_is_placed_and_made_there() -> Result<()> {
    if !have_root("a_claim_that_fits_one_node_is_placed_and_made_there") {
        return Ok(());
    }
    let options = local_options()?;
    let mut cluster = LocalCluster::start(options.clone()).await?;
    let second = cluster.add_node(&options.images).await?;

    // The group's directory, one size on each node.
    let dir = cluster.dir().join("host").join(GROUP);
    std::fs::create_dir_all(&dir)?;
    let d = dir.to_str().context("UTF-8 path")?;
    carina_tests::run("mount", &["-t", "tmpfs", "-o", "size=256m", "tmpfs", d])?;
    cluster
        .second_node()
        .context("no second node")?
        .run("mount", &["-t", "tmpfs", "-o", "size=2g", "tmpfs", d])?;

    let layout = Layout {
        groups: vec![Group {
            name: GROUP.to_string(),
            policy: "HOST".to_string(),
            disks: vec![],
        }],
        storage_classes: serde_json::json!([{
            "name": CLASS,
            "parameters": {"carina.storage.io/disk-group-name": GROUP},
        }]),
        extender: true,
        carina_keys_only: false,
        capacity_tracking: true,
        snapshots: false,
    };
    let _carina = Carina::install(&mut cluster, &layout).await?;
    let result = place_write_read_delete(&cluster, &second, &dir).await;
    explained(&cluster, result)
}

async fn place_write_read_delete(cluster: &LocalCluster, second: &str, dir: &Path) -> Result<()> {
    let node2 = cluster.second_node().context("no second node")?;
    // Each node reports its own directory's size.
    let resources: Api<NodeStorageResource> = Api::all(cluster.client());
    let mut totals = Vec::new();
    for node in cluster.node_names() {
        let r = resources.get(&node).await?;
        let group = r
            .status
            .as_ref()
            .and_then(|s| s.groups.iter().find(|g| g.name == GROUP))
            .with_context(|| format!("{node} does not show {GROUP}"))?;
        totals.push((node, group.total_bytes));
    }
    ensure!(
        totals[0].1 <= 256 << 20 && totals[1].1 >= 1 << 30,
        "each node should report its own directory: {totals:?}"
    );

    let work = Workload::new(cluster.client(), "default");
    let image = busybox_image()?;
    let token = carina_tests::unique("token");
    let with_extender = |mut p: Pod| {
        if let Some(spec) = p.spec.as_mut() {
            spec.scheduler_name = Some(SCHEDULER_NAME.to_string());
        }
        p
    };
    let uses = [Use::mount("data", "/data")];
    work.create_claim(&claim("data", CLASS, "1Gi", false))
        .await?;
    work.create_pod(&with_extender(pod(
        "writer",
        &image,
        &format!("echo -n '{token}' > /data/f && sync && echo -n written > /dev/termination-log"),
        &uses,
    )))
    .await?;
    let written = work.succeeded("writer").await?;
    ensure!(written == "written", "writer: {written:?}");
    let placed = work
        .pods
        .get("writer")
        .await?
        .spec
        .and_then(|s| s.node_name)
        .unwrap_or_default();
    ensure!(
        placed == second,
        "the pod went to {placed:?}, not {second:?}"
    );

    // The data is in the second node's directory, not in the first's.
    let d = dir.to_str().context("UTF-8 path")?;
    let found = node2.run("grep", &["-rl", "--", &token, d])?;
    ensure!(
        !found.trim().is_empty(),
        "the token is not under {d} on {second}"
    );
    ensure!(
        carina_tests::run("grep", &["-rl", "--", &token, d]).is_err(),
        "the token is under {d} on the first node too"
    );
    work.delete_pod("writer").await?;

    // The volume's node affinity brings the reader to the same node.
    work.create_pod(&pod(
        "reader",
        &image,
        "cat /data/f > /dev/termination-log",
        &uses,
    ))
    .await?;
    let read_back = work.succeeded("reader").await?;
    ensure!(
        read_back == token,
        "read back {read_back:?}, wrote {token:?}"
    );
    work.delete_pod("reader").await?;

    work.delete_claim("data").await?;
    let left = node2
        .run("grep", &["-rl", "--", &token, d])
        .unwrap_or_default();
    ensure!(left.trim().is_empty(), "left on {second}: {left}");
    Ok(())
}
