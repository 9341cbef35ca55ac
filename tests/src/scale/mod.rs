//! A scale simulation on one machine: many `carina-node` processes, one
//! kube-apiserver (with etcd), `carina-controller --mode kube` and the
//! `carina-scheduler` extender as processes, and a churn of volumes
//! through the Kubernetes path as external-provisioner drives it.
//!
//! ```ignore
//! let mut cluster = ScaleCluster::start(Shape::ci()).await?;
//! let run = cluster.run().await?; // creates, checks, deletes, checks
//! cluster.stop().await;
//! ```
//!
//! **The nodes** ([`Shape`]): each has its own certificate from one
//! development CA (DNS name = its node name), its own ports and a `Node`
//! object pointing at its NodeStorage endpoint. Most serve one HOST group
//! on a tmpfs of its own ([`HOST_ROOT_BYTES`], so every node has its own
//! capacity and nothing touches the disk); a few serve one LVM group on a
//! sparse loop disk ([`LVM_DISK_BYTES`]). No node rescans periodically:
//! capacity changes reach the records through each node's change stream.
//!
//! **The churn** ([`churn`]): half the volumes are pinned as for
//! `WaitForFirstConsumer` — their claim is placed by the extender's
//! `/filter` and `/prioritize`, one pod at a time as kube-scheduler does,
//! the claim gets `volume.kubernetes.io/selected-node`, and `CreateVolume`
//! names that node — and half are `Immediate` (no topology: the
//! controller places them). At most [`PROVISIONER_WORKERS`] CSI calls run
//! at once, external-provisioner's default `--worker-threads`. Then every
//! claim is deleted and every volume deleted the same way.
//!
//! **The checks** ([`checks`]), after each phase: each volume on a node of
//! its kind whose capacity held it, the `LogicVolume`s, the nodes' own
//! lists and the capacity records agree; after the deletes nothing is
//! left (no `LogicVolume`, no LV, no directory) and every record is back
//! to its first figures.
//!
//! Everything is released by guards, also on panic: processes stop, then
//! volume groups, loop disks and tmpfs mounts go, then the directory.
//! Logs go to the cluster's log directory (`$CARINA_TEST_LOG_DIR/kube-*`
//! when set).

pub mod checks;
pub mod churn;
pub mod extender;
pub mod observe;
pub mod run;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use carina_api::NodeStorageResource;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tonic::transport::Channel;

use crate::cluster::{
    KubeControllerArgs, NodeArgs, Pki, Service, await_capacity, await_object, free_port,
    register_node,
};
use crate::kube::KubeCluster;
use crate::{LoopDisk, MountGuard, VgGuard, disk_group_config, unique};
use extender::ExtenderProcess;

/// external-provisioner's default `--worker-threads`: how many
/// `CreateVolume`/`DeleteVolume` calls it runs at once.
pub const PROVISIONER_WORKERS: usize = 100;

/// The HOST group every HOST node serves (and its StorageClass).
pub const HOST_GROUP: &str = "scale-host";

/// Size of each HOST node's tmpfs.
pub const HOST_ROOT_BYTES: u64 = 1 << 30;

/// Size of each LVM node's sparse loop disk.
pub const LVM_DISK_BYTES: u64 = 256 << 20;

/// Bound of each wait for the control plane to settle.
pub const WAIT: Duration = Duration::from_secs(120);

/// Nodes started at once.
const START_PARALLEL: usize = 8;

/// How big the simulation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub nodes: usize,
    /// How many of the nodes serve an LVM group (the others HOST).
    pub lvm_nodes: usize,
    pub volumes: usize,
    /// CSI calls at once.
    pub concurrency: usize,
}

impl Shape {
    /// The size `make test` runs: 10 nodes (2 LVM), 100 volumes.
    pub fn ci() -> Shape {
        Shape {
            nodes: 10,
            lvm_nodes: 2,
            volumes: 100,
            concurrency: PROVISIONER_WORKERS,
        }
    }

    /// The size `make bench-scale` runs: 100 nodes (10 LVM), 1,000
    /// volumes.
    pub fn full() -> Shape {
        Shape {
            nodes: 100,
            lvm_nodes: 10,
            volumes: 1_000,
            concurrency: PROVISIONER_WORKERS,
        }
    }
}

/// What a node's one group stands on. Fields drop in order: the volume
/// group before its disk.
#[derive(Debug)]
pub enum Storage {
    Host { root: PathBuf, _mount: MountGuard },
    Lvm { vg: VgGuard, disk: LoopDisk },
}

/// One `carina-node` process and its storage (dropped in that order).
#[derive(Debug)]
pub struct ScaleNode {
    service: Service,
    pub args: NodeArgs,
    pub storage: Storage,
}

impl ScaleNode {
    pub fn name(&self) -> &str {
        &self.args.name
    }

    pub fn is_lvm(&self) -> bool {
        matches!(self.storage, Storage::Lvm { .. })
    }

    pub fn pid(&self) -> Option<u32> {
        self.service.pid()
    }
}

/// The running simulation. Fields drop in order: the controller, the
/// extender, the nodes (each before its storage), the API server, the
/// directory that held the mounts and the files.
#[derive(Debug)]
pub struct ScaleCluster {
    controller: Service,
    extender: ExtenderProcess,
    nodes: Vec<ScaleNode>,
    pki: Pki,
    pub shape: Shape,
    /// The LVM group (and volume group) name of this run.
    pub lvm_group: String,
    kube: KubeCluster,
    dir: tempfile::TempDir,
}

impl ScaleCluster {
    /// Starts everything and waits until every node's capacity record is
    /// `Ready`.
    pub async fn start(shape: Shape) -> Result<ScaleCluster> {
        if shape.lvm_nodes > shape.nodes || shape.nodes == 0 || shape.concurrency == 0 {
            bail!("impossible shape {shape:?}");
        }
        let dir = tempfile::Builder::new().prefix("carina-scale-").tempdir()?;
        let kube = KubeCluster::start().await?;
        kube.install_crds().await?;
        let pki = Pki::write(&dir.path().join("pki"))?;
        let lvm_group = unique("scale-lvm");

        // Storage and arguments first; a failure drops what was made.
        let mut prepared: Vec<(NodeArgs, Storage)> = Vec::with_capacity(shape.nodes);
        let mut ports = HashSet::new();
        for i in 0..shape.nodes {
            let name = format!("scale-{i:03}");
            let home = dir.path().join("nodes").join(&name);
            let (config, storage) = if i < shape.lvm_nodes {
                let disk = LoopDisk::new(LVM_DISK_BYTES)?;
                let vg = VgGuard::new(&lvm_group, &[&disk]);
                let config = disk_group_config(&lvm_group, "LVM", &[&disk], 0);
                (config, Storage::Lvm { vg, disk })
            } else {
                let root = dir.path().join("roots").join(&name);
                let mount = MountGuard::mount(
                    "tmpfs",
                    &root,
                    Some("tmpfs"),
                    Some(&format!("size={HOST_ROOT_BYTES},mode=0755")),
                )?;
                let config = serde_json::json!({
                    "diskSelector": [{
                        "name": HOST_GROUP,
                        "policy": "HOST",
                        "root": root,
                        "reserveBytes": 0,
                    }],
                    "diskScanInterval": "0",
                })
                .to_string();
                (
                    config,
                    Storage::Host {
                        root,
                        _mount: mount,
                    },
                )
            };
            let log = kube.log_dir().join(format!("{name}.log"));
            let mut args = NodeArgs::new(&name, &pki, &config, &home, &log)?;
            // A port picked as free may be picked again: keep them distinct.
            while !ports.insert(args.port) {
                args.port = free_port()?;
            }
            while !ports.insert(args.metrics_port) {
                args.metrics_port = free_port()?;
            }
            prepared.push((args, storage));
        }

        let mut services = start_nodes(prepared.iter().map(|(a, _)| a.clone()).collect()).await?;
        let client = kube.client();
        for (args, _) in &prepared {
            register_node(&client, &args.name, &args.endpoint()).await?;
        }
        let mut nodes = Vec::with_capacity(prepared.len());
        for ((args, storage), service) in prepared.into_iter().zip(services.drain(..)) {
            nodes.push(ScaleNode {
                service,
                args,
                storage,
            });
        }

        let mut controller_args = KubeControllerArgs::new(
            "scale-controller",
            "carina-controller",
            kube.kubeconfig_path(),
            &pki,
            dir.path(),
            &kube.log_dir().join("carina-controller.log"),
        );
        // The product's defaults: a loaded machine may be slow.
        controller_args.create_timeout_secs = 60;
        controller_args.node_call_timeout_secs = 60;
        let controller = controller_args.start().await?;

        for node in &nodes {
            await_capacity(&client, node.name(), WAIT).await?;
            let group = if node.is_lvm() {
                &lvm_group
            } else {
                HOST_GROUP
            };
            await_usable(&client, node.name(), group).await?;
        }
        // Started once every record is complete, so its first listing
        // already holds them.
        storage_classes(&client, &lvm_group).await?;
        let extender = ExtenderProcess::start(
            kube.kubeconfig_path(),
            &kube.log_dir().join("carina-scheduler.log"),
        )
        .await?;
        Ok(ScaleCluster {
            controller,
            extender,
            nodes,
            pki,
            shape,
            lvm_group,
            kube,
            dir,
        })
    }

    pub fn client(&self) -> kube::Client {
        self.kube.client()
    }

    pub fn nodes(&self) -> &[ScaleNode] {
        &self.nodes
    }

    pub fn node(&self, name: &str) -> Option<&ScaleNode> {
        self.nodes.iter().find(|n| n.name() == name)
    }

    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name().to_string()).collect()
    }

    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    pub fn extender(&self) -> &ExtenderProcess {
        &self.extender
    }

    pub fn controller_pid(&self) -> Option<u32> {
        self.controller.pid()
    }

    /// The controller's CSI socket.
    pub async fn csi_channel(&self) -> Result<Channel> {
        self.controller.channel().await
    }

    /// Where the processes' logs are.
    pub fn log_dir(&self) -> PathBuf {
        self.kube.log_dir().to_path_buf()
    }

    /// A private directory of the run (removed at the end).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The StorageClass of the group of a node kind.
    pub fn class(&self, lvm: bool) -> &'static str {
        if lvm { LVM_CLASS } else { HOST_CLASS }
    }

    /// The group of a node kind.
    pub fn group(&self, lvm: bool) -> &str {
        if lvm { &self.lvm_group } else { HOST_GROUP }
    }

    /// Fails if the controller, the extender or a node has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.controller.check_running()?;
        self.extender.check_running()?;
        for n in &mut self.nodes {
            n.service.check_running()?;
        }
        self.kube.check_running()
    }

    /// Stops the controller and the extender, then every node at once
    /// (SIGTERM, then SIGKILL after the grace), then drops the rest.
    pub async fn stop(self) {
        let ScaleCluster {
            mut controller,
            extender,
            nodes,
            pki,
            kube,
            dir,
            ..
        } = self;
        controller.stop().await;
        drop(extender);
        let mut stopping = JoinSet::new();
        let mut storages = Vec::new();
        for node in nodes {
            let ScaleNode {
                mut service,
                args,
                storage,
            } = node;
            stopping.spawn(async move { service.stop().await });
            storages.push((args, storage));
        }
        while stopping.join_next().await.is_some() {}
        drop(storages);
        drop(pki);
        drop(kube);
        drop(dir);
    }
}

/// Waits until the record of `node` shows `group` with disks and room:
/// a record may be `Ready` while a group still waits for its disk.
async fn await_usable(client: &kube::Client, node: &str, group: &str) -> Result<()> {
    let api: Api<NodeStorageResource> = Api::all(client.clone());
    await_object(
        &api,
        node,
        &format!("showing room in {group}"),
        WAIT,
        |nsr| {
            nsr.and_then(|n| n.status.as_ref()).is_some_and(|s| {
                s.groups
                    .iter()
                    .any(|g| g.name == group && g.no_disks.is_none() && g.allocatable_bytes > 0)
            })
        },
    )
    .await?;
    Ok(())
}

/// StorageClass names.
pub const HOST_CLASS: &str = "scale-host";
pub const LVM_CLASS: &str = "scale-lvm";

/// One `WaitForFirstConsumer` class per group.
async fn storage_classes(client: &kube::Client, lvm_group: &str) -> Result<()> {
    let api: Api<StorageClass> = Api::all(client.clone());
    for (name, group) in [(HOST_CLASS, HOST_GROUP), (LVM_CLASS, lvm_group)] {
        let class = StorageClass {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            provisioner: carina_csi::DRIVER_NAME.to_string(),
            parameters: Some(BTreeMap::from([(
                "carina.storage.io/disk-group-name".to_string(),
                group.to_string(),
            )])),
            volume_binding_mode: Some("WaitForFirstConsumer".to_string()),
            ..StorageClass::default()
        };
        api.create(&PostParams::default(), &class)
            .await
            .with_context(|| format!("create StorageClass {name}"))?;
    }
    Ok(())
}

/// Starts the nodes, [`START_PARALLEL`] at a time; their services in the
/// order of `args`. On a failure the ones started are stopped.
async fn start_nodes(args: Vec<NodeArgs>) -> Result<Vec<Service>> {
    let permits = Arc::new(Semaphore::new(START_PARALLEL));
    let mut starting = JoinSet::new();
    for (i, a) in args.into_iter().enumerate() {
        let permits = permits.clone();
        starting.spawn(async move {
            let _permit = permits.acquire_owned().await;
            (i, a.start().await)
        });
    }
    let mut started: Vec<Option<Service>> = Vec::new();
    while let Some(done) = starting.join_next().await {
        let (i, service) = done.context("a node start task failed")?;
        let service = service?;
        if started.len() <= i {
            started.resize_with(i + 1, || None);
        }
        started[i] = Some(service);
    }
    started
        .into_iter()
        .enumerate()
        .map(|(i, s)| s.with_context(|| format!("node {i} did not start")))
        .collect()
}
