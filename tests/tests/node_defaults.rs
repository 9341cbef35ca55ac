//! A fresh install of the chart with its default values takes no disk, on
//! a real kubelet node. Before the install the node has spare disks that
//! a permissive pattern (the chart's old `^loop[0-9]+$`) would take: two
//! blank loop disks and a loop disk holding an LVM physical volume of no
//! volume group (an orphan PV). The node is labelled for the chart's RAW
//! group too, so both default groups apply to it.
//!
//! With the default `config` the node's NodeStorageResource shows both
//! groups with no disks and the `NoDisks` condition, the host shows no
//! new signature, physical volume or partition on any spare disk, and a
//! claim of the chart's LVM class stays unprovisioned: its pod is not
//! scheduled for want of storage (the published capacity is 0). Then the
//! user names the disks as docs/install.md says (`helm upgrade` with a
//! values file whose `config.diskSelector[].re` names them): the condition
//! clears, the named blank disks are taken, the orphan PV named without
//! `adoptOrphanPVs` is still left alone, and the waiting claim is
//! provisioned and used by its pod.
//!
//! Runs a LocalCluster with Carina's images; needs root and `tests/tools/
//! build.sh etcd kube kubelet containerd crictl cni helm test-images`.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use carina_api::NodeStorageResource;
use carina_tests::cluster::await_object;
use carina_tests::local::LocalCluster;
use carina_tests::local::carina::{
    NAMESPACE, create_secrets, environment_values, explained, helm_release, local_options,
    logical_volumes, partitions,
};
use carina_tests::local::workload::{Use, Workload, busybox_image, claim, phase, pod};
use carina_tests::manifests::Chart;
use carina_tests::{LoopDisk, VgGuard, have_root, lvm};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::api::{Api, ListParams};

/// The chart's default LVM group and its StorageClass.
const LVM_GROUP: &str = "carina-vg-ssd";
const LVM_CLASS: &str = "csi-carina-lvm";
/// The chart's default RAW group and the node label it applies to.
const RAW_GROUP: &str = "carina-raw-hdd";
const RAW_LABEL: &str = "carina.storage.io/raw-disks";

/// How long the node may take to report a new configuration.
const REPORT_TIMEOUT: Duration = Duration::from_secs(120);

const MIB: u64 = 1 << 20;

/// The spare disks, made before the install.
struct Spare {
    /// Blank, for the LVM group once named: above the default 10 GiB
    /// reserve with room for a claim (sparse).
    lvm: LoopDisk,
    /// Blank, for the RAW group once named.
    raw: LoopDisk,
    /// An LVM physical volume of no volume group.
    orphan: LoopDisk,
}

impl Spare {
    fn new() -> Result<Spare> {
        let spare = Spare {
            lvm: LoopDisk::new(12 * 1024 * MIB)?,
            raw: LoopDisk::new(256 * MIB)?,
            orphan: LoopDisk::new(64 * MIB)?,
        };
        let orphan = spare.orphan.dev();
        lvm(&[&orphan], &["pvcreate", "-y", &orphan])?;
        Ok(spare)
    }

    fn devices(&self) -> Vec<String> {
        [&self.lvm, &self.raw, &self.orphan]
            .iter()
            .map(|d| d.dev())
            .collect()
    }
}

/// What `blkid -p` finds on `dev` (`KEY=value` lines); empty when nothing.
fn signatures(dev: &str) -> Result<String> {
    let out = Command::new("blkid")
        .args(["-p", "-o", "export", dev])
        .output()
        .context("run blkid")?;
    match out.status.code() {
        Some(0) => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        // Nothing found.
        Some(2) => Ok(String::new()),
        _ => bail!(
            "blkid -p {dev}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
}

/// The physical volumes among `devices`, each with its volume group
/// (empty for an orphan), as the host's lvm sees them.
fn physical_volumes(devices: &[&str]) -> Result<Vec<(String, String)>> {
    let out = lvm(
        devices,
        &[
            "pvs",
            "--noheadings",
            "--separator",
            ",",
            "-o",
            "pv_name,vg_name",
        ],
    )?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let (pv, vg) = l.trim().split_once(',')?;
            Some((pv.to_string(), vg.to_string()))
        })
        .collect())
}

/// The host's view of the spare disks with the default values: the two
/// blank ones still blank (no signature, no partition), the orphan still
/// an orphan, no volume group on any.
fn spare_disks_untouched(spare: &Spare) -> Result<()> {
    for disk in [&spare.lvm, &spare.raw] {
        let dev = disk.dev();
        let found = signatures(&dev)?;
        ensure!(found.is_empty(), "{dev} is no longer blank: {found}");
        let parts = partitions(&dev);
        ensure!(parts.is_empty(), "partitions on {dev}: {parts:?}");
    }
    let devices = spare.devices();
    let devices: Vec<&str> = devices.iter().map(String::as_str).collect();
    let pvs = physical_volumes(&devices)?;
    ensure!(
        pvs == [(spare.orphan.dev(), String::new())],
        "physical volumes on the spare disks: {pvs:?}"
    );
    Ok(())
}

/// The node's NodeStorageResource once `done` holds for its status.
async fn report(
    cluster: &LocalCluster,
    what: &str,
    done: impl Fn(&carina_api::NodeStorageResourceStatus) -> bool,
) -> Result<carina_api::NodeStorageResourceStatus> {
    let api: Api<NodeStorageResource> = Api::all(cluster.client());
    let nsr = await_object(
        &api,
        cluster.node_name(),
        what,
        REPORT_TIMEOUT,
        |r: Option<&NodeStorageResource>| r.and_then(|r| r.status.as_ref()).is_some_and(&done),
    )
    .await?
    .context("NodeStorageResource gone")?;
    nsr.status.context("no status")
}

/// The `NoDisks` condition's status, reason and message.
fn no_disks(status: &carina_api::NodeStorageResourceStatus) -> Option<(&str, &str, &str)> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == "NoDisks")
        .map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()))
}

fn group<'a>(
    status: &'a carina_api::NodeStorageResourceStatus,
    name: &str,
) -> Option<&'a carina_api::DeviceGroupCapacity> {
    status.groups.iter().find(|g| g.name == name)
}

/// The message of the first FailedScheduling event of pod `name`.
async fn failed_scheduling(cluster: &LocalCluster, name: &str) -> Result<String> {
    let events: Api<Event> = Api::namespaced(cluster.client(), "default");
    let deadline = Instant::now() + REPORT_TIMEOUT;
    let fields = format!("involvedObject.name={name},reason=FailedScheduling");
    loop {
        let found = events
            .list(&ListParams::default().fields(&fields))
            .await?
            .into_iter()
            .find_map(|e| e.message);
        if let Some(message) = found {
            return Ok(message);
        }
        ensure!(
            Instant::now() < deadline,
            "no FailedScheduling event of pod {name}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until the chart's external-provisioner has published the LVM
/// class's capacity on this node as `expected`.
async fn published_capacity(cluster: &LocalCluster, expected: &str) -> Result<()> {
    let api: Api<CSIStorageCapacity> = Api::namespaced(cluster.client(), NAMESPACE);
    let deadline = Instant::now() + REPORT_TIMEOUT;
    loop {
        let all = api.list(&ListParams::default()).await?.items;
        let of_class: Vec<_> = all
            .iter()
            .filter(|c| c.storage_class_name == LVM_CLASS)
            .map(|c| c.capacity.as_ref().map(|q| q.0.clone()))
            .collect();
        if of_class.iter().any(|c| c.as_deref() == Some(expected)) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "no CSIStorageCapacity of {LVM_CLASS} with capacity {expected}: {of_class:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_values_take_no_disk_until_the_user_names_them() -> Result<()> {
    if !have_root("default_values_take_no_disk_until_the_user_names_them") {
        return Ok(());
    }
    // Dropped last to first: the cluster (node gone, its mounts undone),
    // then any volume group the node made on the spare disks, then the
    // disks.
    let spare = Spare::new()?;
    let devices = spare.devices();
    let _vg = VgGuard::new(LVM_GROUP, &[&spare.lvm, &spare.raw, &spare.orphan]);
    let cluster = LocalCluster::start(local_options()?).await?;
    println!("spare disks: {devices:?}");
    let result = scenario(&cluster, &spare).await;
    explained(&cluster, result)
}

async fn scenario(cluster: &LocalCluster, spare: &Spare) -> Result<()> {
    // Both default groups apply to this node: the RAW one to labelled
    // nodes only.
    cluster.kubectl(&[
        "label",
        "node",
        cluster.node_name(),
        &format!("{RAW_LABEL}="),
    ])?;
    create_secrets(cluster).await?;
    // Only what this node needs; `config` and `storageClasses` are the
    // chart's defaults.
    let environment = environment_values(cluster)?;
    let chart = Chart::new()?;
    helm_release(cluster, &chart, "install", &environment)?;
    println!("installed with the default config");

    let status = report(cluster, "reporting both groups and NoDisks", |s| {
        group(s, LVM_GROUP).is_some() && group(s, RAW_GROUP).is_some() && no_disks(s).is_some()
    })
    .await?;
    for name in [LVM_GROUP, RAW_GROUP] {
        let g = group(&status, name).context("group")?;
        ensure!(
            g.disks.is_empty() && g.total_bytes == 0,
            "{name} took {:?} ({} bytes)",
            g.disks,
            g.total_bytes
        );
        let why = g.no_disks.as_deref().unwrap_or_default();
        ensure!(why.contains("names no disks"), "{name}: noDisks {why:?}");
    }
    ensure!(status.disks.is_empty(), "RAW disks: {:?}", status.disks);
    let (state, reason, message) = no_disks(&status).context("NoDisks")?;
    ensure!(
        state == "True" && reason == "SelectorMatchedNothing",
        "NoDisks {state} {reason}: {message}"
    );
    println!("NoDisks: {message}");

    // A claim of the chart's LVM class and a pod that uses it: capacity 0
    // is published, so the pod is not scheduled and nothing is made.
    let work = Workload::new(cluster.client(), "default");
    let image = busybox_image()?;
    let token = carina_tests::unique("token");
    work.create_claim(&claim("data", LVM_CLASS, "512Mi", false))
        .await?;
    let write =
        format!("echo -n '{token}' > /data/f && sync && cat /data/f > /dev/termination-log");
    work.create_pod(&pod(
        "writer",
        &image,
        &write,
        &[Use::mount("data", "/data")],
    ))
    .await?;
    published_capacity(cluster, "0").await?;
    let why = failed_scheduling(cluster, "writer").await?;
    ensure!(
        why.contains("did not have enough free storage"),
        "FailedScheduling: {why}"
    );
    println!("pod not scheduled: {why}");
    let writer = work.pods.get("writer").await?;
    ensure!(
        phase(Some(&writer)) == Some("Pending"),
        "writer: {:?}",
        writer.status
    );
    let data = work.claims.get("data").await?;
    let claim_phase = data.status.and_then(|s| s.phase);
    ensure!(
        claim_phase.as_deref() == Some("Pending"),
        "claim: {claim_phase:?}"
    );
    let volumes = work.volumes.list(&ListParams::default()).await?.items;
    ensure!(volumes.is_empty(), "PersistentVolumes: {volumes:?}");
    // The host's word, after the node scanned and answered all of that.
    spare_disks_untouched(spare)?;

    // The user names the disks in a values file and upgrades the release.
    let mut named = environment.clone();
    named["config"] = serde_json::json!({
        "diskSelector": [
            {
                "name": LVM_GROUP,
                "re": [spare.lvm.pattern(), spare.orphan.pattern()],
                "policy": "LVM",
                "nodeLabel": "kubernetes.io/hostname",
            },
            {
                "name": RAW_GROUP,
                "re": [spare.raw.pattern()],
                "policy": "RAW",
                "nodeLabel": RAW_LABEL,
            },
        ],
    });
    let upgraded = Instant::now();
    helm_release(cluster, &chart, "upgrade", &named)?;
    let status = report(cluster, "reporting the named disks", |s| {
        no_disks(s).is_some_and(|(state, _, _)| state == "False")
    })
    .await?;
    println!("NoDisks cleared {:?} after the upgrade", upgraded.elapsed());
    let lvm_disks = &group(&status, LVM_GROUP).context("LVM group")?.disks;
    ensure!(
        lvm_disks == &[spare.lvm.dev()],
        "{LVM_GROUP} took {lvm_disks:?}, named {} and {}",
        spare.lvm.dev(),
        spare.orphan.dev()
    );
    let raw_disks = &group(&status, RAW_GROUP).context("RAW group")?.disks;
    ensure!(
        raw_disks == &[spare.raw.dev()],
        "{RAW_GROUP} took {raw_disks:?}"
    );

    // The waiting claim is provisioned and its pod writes through it.
    let written = work.succeeded("writer").await?;
    ensure!(written == token, "wrote {token:?}, read {written:?}");
    println!(
        "claim provisioned {:?} after the upgrade",
        upgraded.elapsed()
    );
    let devices = spare.devices();
    let devices: Vec<&str> = devices.iter().map(String::as_str).collect();
    let pvs = physical_volumes(&devices)?;
    ensure!(
        pvs.contains(&(spare.lvm.dev(), LVM_GROUP.to_string()))
            && pvs.contains(&(spare.orphan.dev(), String::new())),
        "physical volumes: {pvs:?}"
    );
    ensure!(
        logical_volumes(LVM_GROUP, &devices)?.len() == 1,
        "one LV expected"
    );
    work.delete_pod("writer").await?;
    work.delete_claim("data").await?;
    let left = logical_volumes(LVM_GROUP, &devices)?;
    ensure!(left.is_empty(), "LVs left: {left:?}");
    Ok(())
}
