//! A StorageClass's filesystem choices on a real node: the filesystem
//! type, `carina.storage.io/mkfs-options` and `mountOptions`, installed by
//! the chart and used by the kubelet's stage and publish.
//!
//! - ext4 made with `-b 1024 -I 512 -L opts-ext4`, mounted with
//!   `noatime,commit=30`: the superblock on the node shows the block and
//!   inode sizes and the label (`tune2fs -l`, `blkid`), and the pod's own
//!   mountinfo shows `noatime` on its bind mount and `commit=30` on the
//!   filesystem.
//! - xfs made with `-i size=1024 -L optsxfs`, mounted with
//!   `noatime,logbsize=64k`: `xfs_db` shows the inode size, the pod's
//!   mountinfo both options.
//! - ext3 with `nodiratime`: the pod sees an ext3 filesystem.
//! - A class whose mkfs options read a host path (`-d /etc`), and one whose
//!   mount options would bind-mount (`bind`): the claim is refused at
//!   provisioning with the field and the option named in the claim's
//!   Events, and no volume is made for it.
//!
//! Runs its own LocalCluster with Carina installed by the Helm chart (see
//! node_volumes.rs for what that needs).

use anyhow::{Context, Result, ensure};
use carina_tests::local::LocalCluster;
use carina_tests::local::carina::{Carina, Layout, explained, local_options};
use carina_tests::local::workload::{Use, Workload, busybox_image, claim, pod};
use carina_tests::workload::event_with;
use carina_tests::{have_root, run};
use serde_json::json;

const GROUP: &str = "carina-vg-ssd";
const MKFS: &str = "carina.storage.io/mkfs-options";
const FSTYPE: &str = "csi.storage.k8s.io/fstype";

/// The test's classes beside the standard ones.
fn layout() -> Result<Layout> {
    let mut layout = Layout::standard();
    let class = |name: &str, fs: &str, mkfs: Option<&str>, mount: &[&str]| {
        let mut parameters = json!({"carina.storage.io/disk-group-name": GROUP, FSTYPE: fs});
        if let Some(mkfs) = mkfs {
            parameters[MKFS] = mkfs.into();
        }
        json!({"name": name, "parameters": parameters, "mountOptions": mount})
    };
    let classes = layout
        .storage_classes
        .as_array_mut()
        .context("storageClasses is a list")?;
    classes.extend([
        class(
            "opts-ext4",
            "ext4",
            Some("-b 1024 -I 512 -L opts-ext4"),
            &["noatime", "commit=30"],
        ),
        class(
            "opts-xfs",
            "xfs",
            Some("-i size=1024 -L optsxfs"),
            &["noatime", "logbsize=64k"],
        ),
        class("plain-ext3", "ext3", None, &["nodiratime"]),
        class("bad-mkfs", "ext4", Some("-b 4096 -d /etc"), &[]),
        class("bad-mount", "ext4", None, &["noatime", "bind"]),
    ]);
    Ok(layout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_chooses_its_filesystem_mkfs_and_mount_options() -> Result<()> {
    if !have_root("a_class_chooses_its_filesystem_mkfs_and_mount_options") {
        return Ok(());
    }
    let mut cluster = LocalCluster::start(local_options()?).await?;
    let carina = Carina::install(&mut cluster, &layout()?).await?;
    let result = async {
        let work = Workload::new(cluster.client(), "default");
        let image = busybox_image()?;

        let ext4 = mounted(&work, &image, "opts-ext4", "256Mi").await?;
        ensure!(
            ext4.mount_options.contains(&"noatime".to_string()),
            "the pod's mount has no noatime: {ext4:?}"
        );
        ensure!(
            ext4.fs_type == "ext4" && ext4.super_options.contains(&"commit=30".to_string()),
            "the filesystem is not ext4 with commit=30: {ext4:?}"
        );
        let sb = run("tune2fs", &["-l", &ext4.device])?;
        for (key, want) in [("Block size:", "1024"), ("Inode size:", "512")] {
            let got = field(&sb, key);
            ensure!(got == want, "{key} {got:?}, the class asked for {want}");
        }
        ensure!(label(&ext4.device)? == "opts-ext4", "label of {}", ext4.device);
        println!("ext4: {ext4:?}, block 1024, inode 512, label opts-ext4");

        let xfs = mounted(&work, &image, "opts-xfs", "512Mi").await?;
        ensure!(
            xfs.fs_type == "xfs"
                && xfs.mount_options.contains(&"noatime".to_string())
                && xfs.super_options.contains(&"logbsize=64k".to_string()),
            "the xfs mount lacks the class's options: {xfs:?}"
        );
        let sb = run(
            "xfs_db",
            &["-r", "-c", "sb 0", "-c", "p inodesize", &xfs.device],
        )?;
        ensure!(
            field(&sb, "inodesize =") == "1024",
            "xfs inode size: {sb:?}"
        );
        ensure!(label(&xfs.device)? == "optsxfs", "label of {}", xfs.device);
        println!("xfs: {xfs:?}, inode 1024, label optsxfs");

        let ext3 = mounted(&work, &image, "plain-ext3", "256Mi").await?;
        ensure!(
            ext3.fs_type == "ext3" && ext3.mount_options.contains(&"nodiratime".to_string()),
            "not an ext3 mounted nodiratime: {ext3:?}"
        );
        println!("ext3: {ext3:?}");

        for (class, part) in [
            (
                "bad-mkfs",
                "parameters[\"carina.storage.io/mkfs-options\"]: -d is not an option Carina passes to mkfs.ext4",
            ),
            ("bad-mount", "mount_flags[1]: option \"bind\" is refused"),
        ] {
            refused(&work, &cluster, &carina, &image, class, part).await?;
        }
        Ok(())
    }
    .await;
    explained(&cluster, result)
}

/// What the pod saw of its volume, and the volume's device on the node.
#[derive(Debug)]
struct Seen {
    mount_options: Vec<String>,
    fs_type: String,
    super_options: Vec<String>,
    device: String,
}

/// A claim of `class` used by a pod that writes a file and reports its
/// own mountinfo line for the volume; the claim stays (for its device),
/// the pod is deleted.
async fn mounted(work: &Workload, image: &str, class: &str, size: &str) -> Result<Seen> {
    let name = format!("c-{class}");
    work.create_claim(&claim(&name, class, size, false)).await?;
    let uses = [Use::mount(&name, "/data")];
    work.create_pod(&pod(
        &name,
        image,
        "echo x > /data/f && grep ' /data ' /proc/self/mountinfo > /dev/termination-log",
        &uses,
    ))
    .await?;
    let line = work.succeeded(&name).await?;
    work.delete_pod(&name).await?;
    let (mine, fs) = line
        .trim()
        .split_once(" - ")
        .with_context(|| format!("mountinfo line {line:?}"))?;
    let mount_options = mine
        .split(' ')
        .nth(5)
        .context("per-mount options")?
        .split(',')
        .map(str::to_string)
        .collect();
    let mut fs = fs.split(' ');
    let fs_type = fs.next().unwrap_or_default().to_string();
    let super_options = fs
        .nth(1)
        .unwrap_or_default()
        .split(',')
        .map(str::to_string)
        .collect();
    let pv = work.volume_of(&name).await?;
    let device = pv
        .spec
        .and_then(|s| s.csi)
        .and_then(|c| c.volume_attributes)
        .and_then(|a| a.get("carina.storage.io/path").cloned())
        .context("the PV names no device")?;
    Ok(Seen {
        mount_options,
        fs_type,
        super_options,
        device,
    })
}

/// A claim of `class` with a pod waiting for it is refused at
/// provisioning with `part` in its Events, and no LV carries its name.
async fn refused(
    work: &Workload,
    cluster: &LocalCluster,
    carina: &Carina,
    image: &str,
    class: &str,
    part: &str,
) -> Result<()> {
    let name = format!("c-{class}");
    work.create_claim(&claim(&name, class, "256Mi", false))
        .await?;
    work.create_pod(&pod(&name, image, "true", &[Use::mount(&name, "/data")]))
        .await?;
    let event = event_with(
        &cluster.client(),
        "default",
        &name,
        "ProvisioningFailed",
        part,
    )
    .await?;
    println!("{class}: {}", event.message.unwrap_or_default());
    let uid = work
        .claims
        .get(&name)
        .await?
        .metadata
        .uid
        .context("claim uid")?;
    let lvs = carina.logical_volumes(GROUP)?;
    ensure!(
        !lvs.iter().any(|lv| lv.contains(&uid)),
        "an LV was made for the refused claim {name}: {lvs:?}"
    );
    work.delete_pod(&name).await?;
    work.delete_claim(&name).await?;
    Ok(())
}

/// The value after `key` on its line of a tool's report.
fn field(report: &str, key: &str) -> String {
    report
        .lines()
        .find_map(|l| l.trim().strip_prefix(key))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

/// The filesystem label `blkid` reads from the device itself.
fn label(device: &str) -> Result<String> {
    let out = run("blkid", &["-p", "-o", "export", device])?;
    Ok(out
        .lines()
        .find_map(|l| l.strip_prefix("LABEL="))
        .unwrap_or_default()
        .to_string())
}
