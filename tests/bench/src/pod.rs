//! From a PersistentVolumeClaim to a running Pod on a real node: a
//! LocalCluster (kubelet, containerd, runc) with Carina installed by its
//! Helm chart. Each of 20 pods (one at a time) gets a new claim of a
//! WaitForFirstConsumer class; the time from creating both to the Pod
//! being Running is split at two points seen from the host:
//!
//! - provisioning: created → the claim is Bound (kube-scheduler picks the
//!   node, external-provisioner calls CreateVolume, the controller writes
//!   the LogicVolume, the bridge calls the node, `lvcreate`); floor: a bare
//!   `lvcreate` of the same size;
//! - pod binding: Bound → the Pod is bound to the node (kube-scheduler's
//!   VolumeBinding PreBind checks the claims once a second before it
//!   binds the pod); no floor of ours;
//! - stage + publish: bound to the node → the volume is mounted in the
//!   pod's folder under the kubelet's root (the kubelet sees the pod, then
//!   NodeStage and NodePublish: mkfs, mount, bind mount); floor: a bare
//!   `mkfs.ext4` + `mount` of a device of the same size;
//! - container start: mounted → the Pod is Running (runc starts the
//!   container); no floor of ours.
//!
//! Samples are taken by watch (claim, pod) and by reading mountinfo every
//! 10 ms (the mount), so each split is late by at most that.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use carina_sys::command::Cmd;
use carina_tests::cluster::await_object;
use carina_tests::local::LocalCluster;
use carina_tests::local::carina::{Carina, Layout, local_options};
use carina_tests::local::host::mounts_under;
use carina_tests::local::workload::{Use, Workload, busybox_image, claim, pod};
use k8s_openapi::api::core::v1::Pod;

use crate::pool::LvmPool;
use crate::report::{Entry, timed};

const GROUP: &str =
    "Real node: PVC created → Pod Running (kube-scheduler, external-provisioner, kubelet, runc)";
/// Pods measured, one at a time, after the warm-up ones.
const PODS: usize = 20;
const WARMUP: usize = 2;
const SIZE: &str = "64Mi";
const CLASS: &str = "csi-carina-lvm-ext4";
const WAIT: Duration = Duration::from_secs(180);

pub async fn pvc_to_running() -> Result<Vec<Entry>> {
    let mut cluster = LocalCluster::start(local_options()?).await?;
    let _carina = Carina::install(&mut cluster, &Layout::standard()).await?;
    let work = Workload::new(cluster.client(), "default");
    let image = busybox_image()?;
    let floor_pool = LvmPool::new("bench-pod-floor", 1 << 30).await?;
    // The engine formats and mounts an LV through a loop device of its
    // size when there is no device-mapper; the floor formats one too.
    let floor_disk = carina_tests::LoopDisk::new(64 << 20)?;
    let mount_dir = tempfile::tempdir()?;

    let (mut total, mut provision, mut binding, mut publish, mut start) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut bare_create, mut bare_mount) = (vec![], vec![]);
    for i in 0..PODS + WARMUP {
        let (name, claim_name) = (format!("bench-{i}"), format!("bench-data-{i}"));
        let t0 = Instant::now();
        work.create_claim(&claim(&claim_name, CLASS, SIZE, false))
            .await?;
        let script = "while true; do sleep 1; done";
        work.create_pod(&pod(
            &name,
            &image,
            script,
            &[Use::mount(&claim_name, "/data")],
        ))
        .await?;
        work.bound(&claim_name).await?;
        let bound = t0.elapsed();
        await_object(
            &work.pods,
            &name,
            "bound to a node",
            WAIT,
            |p: Option<&Pod>| {
                p.and_then(|p| p.spec.as_ref())
                    .is_some_and(|s| s.node_name.is_some())
            },
        )
        .await?;
        let scheduled = t0.elapsed();
        let pv = work
            .volume_of(&claim_name)
            .await?
            .metadata
            .name
            .context("PV without a name")?;
        let mounted = wait_for_mount(cluster.kubelet_root(), &pv, t0).await?;
        work.running(&name).await?;
        let running = t0.elapsed();

        let lv = format!("floor-{i}");
        let t = Instant::now();
        floor_pool.bare_lvcreate(&lv, "64m").run().await?;
        let c = t.elapsed();
        let m = bare_mkfs_mount(&floor_disk.dev(), mount_dir.path()).await?;
        floor_pool.bare_lvremove(&lv).run().await?;

        work.delete_pod(&name).await?;
        work.delete_claim(&claim_name).await?;
        if i >= WARMUP {
            total.push(running);
            provision.push(bound);
            binding.push(scheduled - bound);
            publish.push(mounted - scheduled);
            start.push(running - mounted);
            bare_create.push(c);
            bare_mount.push(m);
        }
    }
    let floor_total: Vec<Duration> = bare_create
        .iter()
        .zip(&bare_mount)
        .map(|(c, m)| *c + *m)
        .collect();
    Ok(vec![
        timed(
            GROUP,
            "pod.pvc_to_running",
            "lvcreate + mkfs.ext4 + mount",
            &total,
            Some(&floor_total),
        ),
        timed(
            GROUP,
            "pod.provisioning",
            "lvcreate",
            &provision,
            Some(&bare_create),
        ),
        timed(GROUP, "pod.pod_binding", "-", &binding, None),
        timed(
            GROUP,
            "pod.stage_publish",
            "mkfs.ext4 + mount",
            &publish,
            Some(&bare_mount),
        ),
        timed(GROUP, "pod.container_start", "-", &start, None),
    ])
}

/// Waits until a mount of volume `pv` appears under the kubelet's pod
/// folders; the time since `t0` when it was first seen.
async fn wait_for_mount(kubelet_root: &Path, pv: &str, t0: Instant) -> Result<Duration> {
    let pods = kubelet_root.join("pods");
    let deadline = Instant::now() + WAIT;
    loop {
        let published = mounts_under(&pods)
            .into_iter()
            .any(|m| m.ends_with("mount") && m.to_string_lossy().contains(&format!("/{pv}/")));
        if published {
            return Ok(t0.elapsed());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{pv} not mounted within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A bare `mkfs.ext4` and `mount` of `device` at `dir`, unmounted
/// afterwards (untimed); the time of the two commands.
async fn bare_mkfs_mount(device: &str, dir: &Path) -> Result<Duration> {
    let dir_s = dir.to_string_lossy().into_owned();
    let t = Instant::now();
    Cmd::new("mkfs.ext4")
        .args(["-q", "-F", device])
        .run()
        .await?;
    Cmd::new("mount").args([device, &dir_s]).run().await?;
    let took = t.elapsed();
    Cmd::new("umount").arg(&dir_s).run().await?;
    Ok(took)
}
