//! Carina's pod IO-limit annotations on a real node: the controller sees
//! the pod's annotations, finds its Carina volume and sends the limits to
//! the node, which writes them into the pod's cgroups (cgroup v1 blkio
//! here). The pod itself measures: it waits until its own container's
//! cgroup carries the rule, times a `dd` with direct IO to its block
//! volume, and writes the timings to an emptyDir the test reads on the
//! host. Then the test changes the annotation (bandwidth to IOPS) and
//! removes it, and the pod times dd again each time.
//!
//! Also: a malformed annotation gets a Warning Event naming it, and a
//! deleted pod leaves no cgroup (and so no rule) behind.
//!
//! Needs root and the tools of the other `node_*` tests.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use carina_api::{WRITE_BPS_ANNOTATION, WRITE_IOPS_ANNOTATION};
use carina_tests::have_root;
use carina_tests::local::LocalCluster;
use carina_tests::local::carina::{Carina, Layout, explained, local_options};
use carina_tests::local::workload::{Use, Workload, busybox_image, claim, pod};
use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Event, Pod, Volume, VolumeMount};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};

const MIB: f64 = 1048576.0;

/// What the pod runs: each step waits for its rule in the container's
/// own cgroup (v1 shows a container its cgroup at /sys/fs/cgroup/blkio),
/// then times dd with busybox's `time`.
const SCRIPT: &str = r#"
cg=/sys/fs/cgroup/blkio
bps=$cg/blkio.throttle.write_bps_device
iops=$cg/blkio.throttle.write_iops_device
big() { time dd if=/dev/zero of=/dev/xvda bs=256k count=24 oflag=direct; }
small() { time dd if=/dev/zero of=/dev/xvda bs=4k count=300 oflag=direct; }
until grep -q . $bps; do sleep 0.1; done
cat $bps > /out/bps-rule
big 2> /out/bps.tmp && mv /out/bps.tmp /out/bps
until grep -q . $iops && ! grep -q . $bps; do sleep 0.1; done
cat $iops > /out/iops-rule
small 2> /out/iops.tmp && mv /out/iops.tmp /out/iops
until ! grep -q . $iops; do sleep 0.1; done
big 2> /out/free-bps && small 2> /out/free-iops
echo -n done > /dev/termination-log
"#;

/// 6 MiB at 2 MiB/s, then 300 writes at 100/s: 3 s each.
const BPS: u64 = 2 * 1048576;
const IOPS: u64 = 100;

/// Seconds from the `real 0m 3.01s` line of busybox `time` (a tab after
/// `real`).
fn real_seconds(text: &str) -> Result<f64> {
    let line = text
        .lines()
        .find(|l| l.starts_with("real"))
        .with_context(|| format!("no `real` line in {text:?}"))?;
    let t = line.trim_start_matches("real").trim();
    let (m, s) = t.split_once('m').context("no minutes")?;
    let s = s.trim().trim_end_matches('s');
    Ok(m.trim().parse::<f64>()? * 60.0 + s.parse::<f64>()?)
}

/// Waits for the file `name` the pod writes into its emptyDir.
async fn output(dir: &Path, name: &str) -> Result<String> {
    let path = dir.join(name);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(text) = std::fs::read_to_string(&path) {
            return Ok(text);
        }
        if Instant::now() > deadline {
            bail!("the pod wrote no {} in 120 s", path.display());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn within_10_percent(what: &str, took: f64, expected: f64) -> Result<()> {
    let ratio = took / expected;
    ensure!(
        (0.9..=1.1).contains(&ratio),
        "{what}: dd took {took:.2} s, {expected:.2} s expected at the limit"
    );
    Ok(())
}

async fn annotate(pods: &Api<Pod>, name: &str, annotations: serde_json::Value) -> Result<()> {
    let patch = serde_json::json!({ "metadata": { "annotations": annotations } });
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Events on the pod `name` with `reason`, their notes.
async fn events(client: kube::Client, name: &str, reason: &str) -> Result<Vec<String>> {
    let api: Api<Event> = Api::namespaced(client, "default");
    let list = api
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| e.message.unwrap_or_default())
        .collect())
}

async fn wait_events(client: &kube::Client, name: &str, reason: &str) -> Result<Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let found = events(client.clone(), name, reason).await?;
        if !found.is_empty() {
            return Ok(found);
        }
        if Instant::now() > deadline {
            bail!("no {reason} Event on pod {name} in 60 s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every cgroup directory named after pod `uid` in the blkio hierarchy.
fn pod_cgroups(uid: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, needle: &str, depth: usize, out: &mut Vec<PathBuf>) {
        if depth > 8 {
            return;
        }
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                if e.file_name().to_string_lossy().contains(needle) {
                    out.push(e.path());
                } else {
                    walk(&e.path(), needle, depth + 1, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(Path::new("/sys/fs/cgroup/blkio"), uid, 0, &mut out);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_annotations_throttle_the_pods_volume() -> Result<()> {
    if !have_root("pod_annotations_throttle_the_pods_volume") {
        return Ok(());
    }
    let mut cluster = LocalCluster::start(local_options()?).await?;
    let _carina = Carina::install(&mut cluster, &Layout::standard()).await?;
    let result = throttle(&cluster).await;
    explained(&cluster, result)
}

async fn throttle(cluster: &LocalCluster) -> Result<()> {
    let client = cluster.client();
    let work = Workload::new(client.clone(), "default");
    work.create_claim(&claim("data", "csi-carina-hdd", "64Mi", true))
        .await?;
    let mut p = pod(
        "limited",
        &busybox_image()?,
        SCRIPT,
        &[Use::device("data", "/dev/xvda")],
    );
    p.metadata.annotations = Some([(WRITE_BPS_ANNOTATION.to_string(), BPS.to_string())].into());
    let spec = p.spec.as_mut().context("spec")?;
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: "out".into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    });
    spec.containers[0]
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(VolumeMount {
            name: "out".into(),
            mount_path: "/out".into(),
            ..Default::default()
        });
    work.create_pod(&p).await?;
    let running = work.running("limited").await?;
    let uid = running.uid().context("pod uid")?;
    let out = cluster
        .kubelet_root()
        .join(format!("pods/{uid}/volumes/kubernetes.io~empty-dir/out"));

    // Bandwidth.
    let rule = output(&out, "bps-rule").await?;
    ensure!(
        rule.trim().ends_with(&format!(" {BPS}")),
        "bps rule {rule:?}"
    );
    let bps = real_seconds(&output(&out, "bps").await?)?;
    println!(
        "write_bps {BPS}: dd wrote 6 MiB in {bps:.2} s ({:.2} MiB/s)",
        6.0 / bps
    );
    within_10_percent("write_bps", bps, 6.0 * MIB / BPS as f64)?;
    let set = wait_events(&client, "limited", "IOLimitsSet").await?;
    ensure!(
        set.iter().any(|n| n.contains("write_bps=2097152")),
        "{set:?}"
    );

    // The annotation changes: bandwidth off, IOPS on.
    annotate(
        &work.pods,
        "limited",
        serde_json::json!({ WRITE_BPS_ANNOTATION: null, WRITE_IOPS_ANNOTATION: IOPS.to_string() }),
    )
    .await?;
    let rule = output(&out, "iops-rule").await?;
    ensure!(
        rule.trim().ends_with(&format!(" {IOPS}")),
        "iops rule {rule:?}"
    );
    let iops = real_seconds(&output(&out, "iops").await?)?;
    println!(
        "write_iops {IOPS}: dd made 300 writes in {iops:.2} s ({:.0}/s)",
        300.0 / iops
    );
    within_10_percent("write_iops", iops, 300.0 / IOPS as f64)?;

    // Removed: dd runs free.
    annotate(
        &work.pods,
        "limited",
        serde_json::json!({ WRITE_IOPS_ANNOTATION: null }),
    )
    .await?;
    let done = work.succeeded("limited").await?;
    ensure!(done == "done", "pod: {done:?}");
    let free_bps = real_seconds(&output(&out, "free-bps").await?)?;
    let free_iops = real_seconds(&output(&out, "free-iops").await?)?;
    println!("without limits: 6 MiB in {free_bps:.2} s, 300 writes in {free_iops:.2} s");
    ensure!(free_bps < 1.0, "unthrottled 6 MiB took {free_bps:.2} s");
    ensure!(
        free_iops < 1.0,
        "unthrottled 300 writes took {free_iops:.2} s"
    );

    // A malformed value: refused with a Warning naming the annotation.
    let mut bad = pod("malformed", &busybox_image()?, "sleep 1", &[]);
    bad.metadata.annotations =
        Some([(WRITE_BPS_ANNOTATION.to_string(), "fast".to_string())].into());
    work.create_pod(&bad).await?;
    let refused = wait_events(&client, "malformed", "InvalidIOLimits").await?;
    ensure!(
        refused
            .iter()
            .any(|n| n.contains(WRITE_BPS_ANNOTATION) && n.contains("fast")),
        "{refused:?}"
    );
    work.succeeded("malformed").await?;
    work.delete_pod("malformed").await?;

    // Deleted: no cgroup of the pod, and so no rule, is left.
    work.delete_pod("limited").await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pod_cgroups(&uid).is_empty() {
        ensure!(
            Instant::now() < deadline,
            "cgroups of the deleted pod left: {:?}",
            pod_cgroups(&uid)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    work.delete_claim("data").await?;
    Ok(())
}

#[test]
fn busybox_time_reads() {
    assert_eq!(
        real_seconds("24+0 records in\nreal\t0m 3.01s\nuser\t0m 0.00s\n").expect("parses"),
        3.01
    );
    assert_eq!(real_seconds("real\t1m 2.50s").expect("parses"), 62.5);
    assert!(real_seconds("nothing").is_err());
}
