//! Carina installed into a [`LocalCluster`] the way users install it: the
//! images of `make images` imported into the node's containerd, the Helm
//! chart installed by a real `helm`, the node plugin as a DaemonSet pod,
//! the controller (with external-provisioner and external-resizer) as a
//! Deployment. Its storage is loop devices the harness makes.
//!
//! ```ignore
//! let mut cluster = LocalCluster::start(local_options()?).await?;
//! let carina = Carina::install(&mut cluster, &Layout::standard()).await?;
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use carina_api::NodeStorageResource;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, ObjectMeta, PostParams};

use super::LocalCluster;
pub use super::images::{carina_images, e2e_images, local_options, test_images, tool_path};
use crate::cluster::{Pki, await_object};
use crate::manifests::{Chart, RELEASE};
use crate::process::ChildGuard;
use crate::snapshots::{install_snapshot_crds, snapshot_controller};
use crate::{LoopDisk, VgGuard};

/// The CSI driver's name.
pub const DRIVER: &str = "carina.storage.io";

/// The schedulerName of the chart's second scheduler (with
/// [`Layout::extender`]).
pub const SCHEDULER_NAME: &str = "carina-scheduler";

/// The namespace Carina is installed into.
pub const NAMESPACE: &str = "carina-system";

/// How long the chart's pods may take to become ready.
const INSTALL_TIMEOUT: &str = "300s";

/// How long the node plugin may take to register and publish its groups.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(120);

/// One device group of the node's configuration.
#[derive(Debug, Clone)]
pub struct Group {
    /// Carina's group name (the volume group's, for LVM).
    pub name: String,
    /// `LVM`, `RAW` or `HOST`.
    pub policy: String,
    /// Loop disks of these sizes (LVM, RAW); none for HOST.
    pub disks: Vec<u64>,
}

/// The node's device groups and the StorageClasses over them.
#[derive(Debug, Clone)]
pub struct Layout {
    pub groups: Vec<Group>,
    /// `storageClasses` of the chart's values.
    pub storage_classes: serde_json::Value,
    /// Whether the chart runs its second scheduler, `carina-scheduler`
    /// (kube-scheduler with the Carina extender).
    pub extender: bool,
    /// Whether `config.json` holds only the keys Carina documents
    /// (`name`, `re`, `policy`, `nodeLabel`; `diskScanInterval` "300"), so
    /// Carina's defaults apply, 10 GiB kept free in each group among
    /// them. Otherwise each group keeps nothing free (`reserveBytes: 0`)
    /// and disks are not rescanned.
    pub carina_keys_only: bool,
    /// Whether external-provisioner publishes CSIStorageCapacity (the
    /// chart's default), so kube-scheduler itself keeps pods off a node
    /// without room. Off where a test is about the extender's own answer:
    /// kube-scheduler's check would run first once the capacity is
    /// published, and whether it is yet depends on timing.
    pub capacity_tracking: bool,
    /// Whether the cluster has VolumeSnapshots: the
    /// `snapshot.storage.k8s.io` CRDs and the cluster-wide
    /// snapshot-controller (both outside the chart, as an administrator
    /// installs them), and the chart's csi-snapshotter sidecar.
    pub snapshots: bool,
}

const MIB: u64 = 1 << 20;

impl Layout {
    /// Carina's documented groups: `carina-vg-ssd` (LVM, 2 GiB),
    /// `carina-vg-hdd` (LVM, 1 GiB), `carina-raw-hdd` (RAW, 1 GiB) and
    /// `carina-host` (HOST); StorageClasses `csi-carina-lvm` (xfs),
    /// `csi-carina-lvm-ext4`, `csi-carina-hdd`, `csi-carina-raw` and
    /// `csi-carina-host`, all WaitForFirstConsumer and expandable.
    pub fn standard() -> Layout {
        let group = |name: &str, policy: &str, disks: &[u64]| Group {
            name: name.to_string(),
            policy: policy.to_string(),
            disks: disks.to_vec(),
        };
        let class = |name: &str, group: &str, fs: Option<&str>| {
            let mut parameters = serde_json::json!({
                "carina.storage.io/disk-group-name": group,
            });
            if let Some(fs) = fs {
                parameters["csi.storage.k8s.io/fstype"] = fs.into();
            }
            serde_json::json!({"name": name, "parameters": parameters})
        };
        Layout {
            groups: vec![
                group("carina-vg-ssd", "LVM", &[2048 * MIB]),
                group("carina-vg-hdd", "LVM", &[1024 * MIB]),
                group("carina-raw-hdd", "RAW", &[1024 * MIB]),
                group("carina-host", "HOST", &[]),
            ],
            storage_classes: serde_json::json!([
                class("csi-carina-lvm", "carina-vg-ssd", Some("xfs")),
                class("csi-carina-lvm-ext4", "carina-vg-ssd", Some("ext4")),
                class("csi-carina-hdd", "carina-vg-hdd", Some("ext4")),
                class("csi-carina-raw", "carina-raw-hdd", Some("ext4")),
                class("csi-carina-host", "carina-host", None),
            ]),
            extender: false,
            carina_keys_only: false,
            capacity_tracking: true,
            snapshots: false,
        }
    }
}

impl Layout {
    /// One LVM group `carina-vg-ssd` of 8 GiB for the Kubernetes storage
    /// e2e suite, which brings its own StorageClasses.
    pub fn e2e() -> Layout {
        Layout {
            groups: vec![Group {
                name: "carina-vg-ssd".to_string(),
                policy: "LVM".to_string(),
                disks: vec![8192 * MIB],
            }],
            storage_classes: serde_json::json!([]),
            extender: false,
            carina_keys_only: false,
            capacity_tracking: true,
            snapshots: true,
        }
    }
}

/// Carina installed in a cluster. The disks it was given are handed to the
/// cluster, which releases them after its node is gone.
#[derive(Debug)]
pub struct Carina {
    /// The HOST groups' directories, by group name.
    pub host_dirs: Vec<(String, PathBuf)>,
    /// The loop disks of each LVM and RAW group, by group name.
    pub disks: Vec<(String, String)>,
    chart: Chart,
    values: serde_json::Value,
    /// The cluster-wide snapshot-controller, with [`Layout::snapshots`].
    snapshot_controller: Option<ChildGuard>,
}

/// The storage of a node's groups: the chart's `config` (its disk
/// selectors) and what they select.
#[derive(Debug)]
pub struct Storage {
    /// `config` of the chart's values (`config.json`).
    pub config: serde_json::Value,
    /// The HOST groups' directories, by group name.
    pub host_dirs: Vec<(String, PathBuf)>,
    /// The loop disks of each LVM and RAW group, by group name.
    pub disks: Vec<(String, String)>,
}

impl Storage {
    /// New loop disks for `layout`'s LVM and RAW groups and a directory
    /// under the cluster's for each HOST group, handed to the cluster,
    /// which releases them after its node is gone.
    pub fn make(cluster: &mut LocalCluster, layout: &Layout) -> Result<Storage> {
        let mut selectors = Vec::new();
        let mut host_dirs = Vec::new();
        let mut disks = Vec::new();
        for group in &layout.groups {
            if group.policy == "HOST" {
                let dir = cluster.dir().join("host").join(&group.name);
                std::fs::create_dir_all(&dir)?;
                let mut selector = serde_json::json!({
                    "name": group.name, "re": [dir], "policy": "HOST",
                    "nodeLabel": "kubernetes.io/hostname",
                });
                if !layout.carina_keys_only {
                    selector["reserveBytes"] = 0.into();
                }
                selectors.push(selector);
                host_dirs.push((group.name.clone(), dir));
                continue;
            }
            let mut made = Vec::new();
            for &size in &group.disks {
                made.push(LoopDisk::new(size)?);
            }
            let patterns: Vec<String> = made.iter().map(LoopDisk::pattern).collect();
            let mut selector = serde_json::json!({
                "name": group.name, "re": patterns, "policy": group.policy,
                "nodeLabel": "kubernetes.io/hostname",
            });
            if !layout.carina_keys_only {
                // The default keeps 10 GiB free; these disks are small.
                selector["reserveBytes"] = 0.into();
            }
            selectors.push(selector);
            disks.extend(made.iter().map(|d| (group.name.clone(), d.dev())));
            let guard = (group.policy == "LVM")
                .then(|| VgGuard::new(&group.name, &made.iter().collect::<Vec<_>>()));
            // Released after the node: the disks last, the group first.
            cluster.release_after_node(Box::new(made));
            if let Some(guard) = guard {
                cluster.release_after_node(Box::new(guard));
            }
        }
        let config = serde_json::json!({
            "diskSelector": selectors,
            "diskScanInterval": if layout.carina_keys_only { "300" } else { "0" },
            "schedulerStrategy": "spreadout",
        });
        Ok(Storage {
            config,
            host_dirs,
            disks,
        })
    }
}

impl Carina {
    /// Makes the groups' disks, the TLS Secrets (identity mode `manual`),
    /// imports the images and installs the chart; waits until the node
    /// plugin is registered with the kubelet and has published its groups.
    /// The cluster must have been started with [`local_options`] (the
    /// images).
    pub async fn install(cluster: &mut LocalCluster, layout: &Layout) -> Result<Carina> {
        let storage = Storage::make(cluster, layout)?;
        Carina::install_on(cluster, layout, storage).await
    }

    /// [`Carina::install`] over storage that already exists (e.g. disks
    /// another driver used), described by `storage`; `layout` gives the
    /// groups to wait for and the rest of the values.
    pub async fn install_on(
        cluster: &mut LocalCluster,
        layout: &Layout,
        storage: Storage,
    ) -> Result<Carina> {
        create_secrets(cluster).await?;
        let snapshot_controller = if layout.snapshots {
            Some(start_snapshot_controller(cluster).await?)
        } else {
            None
        };
        let values = values(cluster, layout, storage.config)?;
        let chart = Chart::new()?;
        helm_release(cluster, &chart, "install", &values)?;
        let carina = Carina {
            host_dirs: storage.host_dirs,
            disks: storage.disks,
            chart,
            values,
            snapshot_controller,
        };
        carina.wait_registered(cluster, layout).await?;
        Ok(carina)
    }

    /// Fails if a program this install started beside the chart (the
    /// snapshot-controller of [`Layout::snapshots`]) has exited.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(controller) = &mut self.snapshot_controller {
            controller
                .check_running()
                .context("snapshot-controller kept running")?;
        }
        Ok(())
    }

    /// Waits until every node's kubelet lists the driver on its CSINode
    /// and each NodeStorageResource shows every group.
    async fn wait_registered(&self, cluster: &LocalCluster, layout: &Layout) -> Result<()> {
        let client = cluster.client();
        let csinodes: Api<CSINode> = Api::all(client.clone());
        let resources: Api<NodeStorageResource> = Api::all(client);
        let names: Vec<String> = layout.groups.iter().map(|g| g.name.clone()).collect();
        for node in cluster.node_names() {
            let registered = await_object(
                &csinodes,
                &node,
                "listing the carina driver",
                REGISTER_TIMEOUT,
                |n: Option<&CSINode>| {
                    n.is_some_and(|n| n.spec.drivers.iter().any(|d| d.name == DRIVER))
                },
            )
            .await;
            if let Err(e) = registered {
                bail!("{e:#}\n{}", describe(cluster));
            }
            let published = await_object(
                &resources,
                &node,
                "showing every group",
                REGISTER_TIMEOUT,
                |r: Option<&NodeStorageResource>| {
                    r.and_then(|r| r.status.as_ref()).is_some_and(|s| {
                        names.iter().all(|n| s.groups.iter().any(|g| &g.name == n))
                    })
                },
            )
            .await;
            if let Err(e) = published {
                bail!("{e:#}\n{}", describe(cluster));
            }
        }
        Ok(())
    }

    /// The loop disks of group `group`.
    pub fn disks_of(&self, group: &str) -> Vec<&str> {
        self.disks
            .iter()
            .filter(|(g, _)| g == group)
            .map(|(_, d)| d.as_str())
            .collect()
    }

    /// The LVs of LVM group `group`, as the host's lvm sees them.
    pub fn logical_volumes(&self, group: &str) -> Result<Vec<String>> {
        logical_volumes(group, &self.disks_of(group))
    }

    /// The values the chart was installed with.
    pub fn values(&self) -> &serde_json::Value {
        &self.values
    }

    /// The chart (its `helm`), e.g. for `helm upgrade`.
    pub fn chart(&self) -> &Chart {
        &self.chart
    }
}

/// `helm install` or `helm upgrade` (`verb`) of the release into
/// [`NAMESPACE`] with `values`, waiting until its pods are ready; a
/// refusal comes with [`describe`] of the cluster.
pub fn helm_release(
    cluster: &LocalCluster,
    chart: &Chart,
    verb: &str,
    values: &serde_json::Value,
) -> Result<()> {
    let kubeconfig = cluster
        .kube()
        .kubeconfig_path()
        .to_string_lossy()
        .into_owned();
    let dir = chart.dir().to_string_lossy().into_owned();
    let out = chart.run(
        &[
            verb,
            RELEASE,
            &dir,
            "--namespace",
            NAMESPACE,
            "--kubeconfig",
            &kubeconfig,
            "--wait",
            "--timeout",
            INSTALL_TIMEOUT,
        ],
        Some(&values.to_string()),
    )?;
    if !out.success {
        bail!(
            "helm {verb} failed: {}{}\n{}",
            out.stderr,
            out.stdout,
            describe(cluster)
        );
    }
    Ok(())
}

/// `result`, or its error with [`describe`] of the cluster appended: what
/// a failed scenario needs to be understood.
pub fn explained<T>(cluster: &LocalCluster, result: Result<T>) -> Result<T> {
    result.map_err(|e| anyhow::anyhow!("{e:#}\n{}", describe(cluster)))
}

/// Pod states, events and the carina pods' logs: what a failed install
/// needs to be understood.
pub fn describe(cluster: &LocalCluster) -> String {
    let mut out = String::new();
    for args in [
        &["get", "pods", "-A", "-o", "wide"][..],
        &["get", "events", "-A", "--sort-by=.lastTimestamp"][..],
        &[
            "logs",
            "-n",
            NAMESPACE,
            "-l",
            "app.kubernetes.io/name=carina-node",
            "--all-containers",
            "--tail=40",
        ][..],
        &[
            "logs",
            "-n",
            NAMESPACE,
            "-l",
            "app.kubernetes.io/name=carina-controller",
            "--all-containers",
            "--tail=40",
        ][..],
    ] {
        out.push_str(&format!("$ kubectl {}\n", args.join(" ")));
        match cluster.kubectl(args) {
            Ok(text) => out.push_str(&text),
            Err(e) => out.push_str(&format!("{e:#}\n")),
        }
    }
    out
}

/// The values every install on this node needs, whatever its disks: none
/// of them selects, names or sizes a disk (`config` and `storageClasses`
/// keep the chart's defaults). Pass them to `helm install` along with
/// [`create_secrets`] made first.
pub fn environment_values(cluster: &LocalCluster) -> Result<serde_json::Value> {
    Ok(serde_json::json!({
        // The test kubelet's root is in the cluster's folder.
        "kubeletDir": cluster.kubelet_root(),
        // The node has no cluster DNS, so a node pod cannot resolve the
        // issuer's Service name: certificates come from the Secrets of
        // `create_secrets` instead.
        "identity": {"mode": "manual"},
        "controller": {
            // VolumeSnapshots need the CRDs and snapshot-controller, which
            // are cluster-wide and outside the chart ([`Layout::snapshots`]).
            "snapshotter": {"enabled": false},
        },
        "node": {
            // The node pod is on the host's network: a port no other
            // program of the machine uses.
            "port": crate::cluster::free_port()?,
            // The node's records stay in the cluster's folder.
            "stateDir": cluster.dir().join("carina-state"),
        },
        // The node's /metrics is on the host's address: a port no other
        // program of the machine uses.
        "metrics": {"nodePort": crate::cluster::free_port()?},
    }))
}

/// The chart's values for this cluster.
fn values(
    cluster: &LocalCluster,
    layout: &Layout,
    config: serde_json::Value,
) -> Result<serde_json::Value> {
    let mut values = environment_values(cluster)?;
    let controller = &mut values["controller"];
    controller["replicas"] = 1.into();
    // Pods are scheduled to this node only; no disruption budget matters.
    controller["podDisruptionBudget"] = serde_json::json!({"enabled": false});
    controller["snapshotter"] = serde_json::json!({"enabled": layout.snapshots});
    controller["provisioner"] =
        serde_json::json!({"capacity": {"enabled": layout.capacity_tracking}});
    values["config"] = config;
    values["storageClasses"] = layout.storage_classes.clone();
    values["scheduler"] = serde_json::json!({"enabled": layout.extender, "replicas": 1});
    Ok(values)
}

/// The VolumeSnapshot CRDs and the cluster-wide snapshot-controller of
/// external-snapshotter, as an administrator installs them beside the
/// chart.
async fn start_snapshot_controller(cluster: &LocalCluster) -> Result<ChildGuard> {
    install_snapshot_crds(&cluster.client()).await?;
    snapshot_controller(cluster.kube())
}

/// The namespace and the Secrets of identity mode `manual`: the node's
/// server certificate (DNS SAN: the Node's name) and the controller's
/// client certificate, from one CA.
pub async fn create_secrets(cluster: &LocalCluster) -> Result<()> {
    let client = cluster.client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(NAMESPACE.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces.create(&PostParams::default(), &ns).await?;
    let pki = Pki::write(&cluster.dir().join("carina-pki"))?;
    let names = cluster.node_names();
    let node = pki.nodes(&names.iter().map(String::as_str).collect::<Vec<_>>())?;
    let secrets: Api<Secret> = Api::namespaced(client, NAMESPACE);
    for (name, cert, key) in [
        ("carina-node-tls", &node.cert, &node.key),
        (
            "carina-controller-tls",
            &pki.controller.cert,
            &pki.controller.key,
        ),
    ] {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".to_string()),
            data: Some(
                [
                    ("tls.crt", cert.as_path()),
                    ("tls.key", key.as_path()),
                    ("ca.crt", pki.ca_pem.as_path()),
                ]
                .into_iter()
                .map(|(k, path)| Ok((k.to_string(), ByteString(std::fs::read(path)?))))
                .collect::<Result<_>>()?,
            ),
            ..Default::default()
        };
        secrets.create(&PostParams::default(), &secret).await?;
    }
    Ok(())
}

/// Whether `dir` exists and is empty.
pub fn is_empty_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none())
}

/// The LVs of volume group `vg` (names), as the host's lvm sees them.
pub fn logical_volumes(vg: &str, devices: &[&str]) -> Result<Vec<String>> {
    let out = crate::lvm(devices, &["lvs", "--noheadings", "-o", "lv_name", vg])?;
    Ok(out.split_whitespace().map(str::to_string).collect())
}

/// The partitions of `dev` (from sysfs).
pub fn partitions(dev: &str) -> Vec<String> {
    let name = dev.trim_start_matches("/dev/");
    let Ok(entries) = std::fs::read_dir(Path::new("/sys/class/block").join(name)) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.starts_with(name) && n != name)
        .collect()
}
