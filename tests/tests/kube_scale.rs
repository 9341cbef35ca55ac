//! The scale simulation at the size `make test` runs (see
//! `carina_tests::scale`): 10 `carina-node` processes (2 on LVM loop
//! disks, 8 on HOST tmpfs roots), kube-apiserver with etcd,
//! `carina-controller --mode kube` and the `carina-scheduler` extender as
//! processes; 100 volumes created through the controller's CSI socket at
//! external-provisioner's concurrency, half placed by the extender and
//! pinned, half `Immediate`; then all deleted.
//!
//! It proves correctness only, never timing: every volume on a node of
//! its kind whose capacity held it, the `LogicVolume`s, the nodes' lists
//! and the capacity records agree; afterwards no `LogicVolume`, LV or
//! directory is left and every record is back to its first figures.
//! `make bench-scale` runs the same simulation at full size and reports
//! its figures.
//!
//! Needs root, loop devices and tmpfs, etcd and kube-apiserver from
//! `tests/tools/build.sh etcd kube`, and `cargo build --workspace --bins`.

use anyhow::Result;
use carina_tests::have_root;
use carina_tests::scale::{ScaleCluster, Shape};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_volumes_on_ten_nodes_come_and_go_cleanly() -> Result<()> {
    if !have_root("kube_scale") {
        return Ok(());
    }
    let shape = Shape::ci();
    let mut cluster = ScaleCluster::start(shape).await?;
    let run = cluster.run().await?;
    assert_eq!(run.create.created.len(), shape.volumes);
    assert_eq!(run.delete.deleted.len(), shape.volumes);
    assert_eq!(run.create.scheduled.len(), shape.volumes / 2);
    // Every change showed in its node's capacity record.
    assert_eq!(run.create_freshness.len(), shape.volumes);
    assert_eq!(run.delete_freshness.len(), shape.volumes);
    cluster.stop().await;
    Ok(())
}
