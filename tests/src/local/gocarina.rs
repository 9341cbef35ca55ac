//! Go Carina v0.14.0, the project this one succeeds, running on a
//! [`LocalCluster`]'s node as a Go Carina cluster runs before it is taken
//! over: built from its source by `tests/tools/build.sh go-carina`, its
//! CRDs and CSIDriver as its chart makes them, its controller (with
//! external-provisioner) and its node as host processes with the
//! cluster's admin kubeconfig, the node's CSI socket registered with the
//! kubelet. A test dependency only.
//!
//! Go Carina reads its `config.json` from a fixed place,
//! [`GO_CONFIG_DIR`], and writes its log and device nodes to others;
//! [`GoCarina::start`] refuses if any of them exists and removes them
//! when Go Carina is removed (one local cluster runs on a host at a
//! time).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use carina_node::csi_local::registration::PluginRegistration;
use carina_node::server::metrics::Metrics;
use carina_proto::devcerts::{DevCa, Validity};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::LocalCluster;
use super::carina::{DRIVER, tool_path};
use crate::cluster::{await_object, csi_provisioner, free_port};
use crate::process::{ChildGuard, wait_for_path};

/// Where Go Carina's programs read `config.json` (fixed in its code).
pub const GO_CONFIG_DIR: &str = "/etc/carina";

/// The namespace Go's controller runs in (its leader election).
pub const GO_NAMESPACE: &str = "kube-system";

/// Bound of a Go program's start and of the kubelet's (de)registration.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a Go program may take to stop on SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// Go Carina running on the cluster's node; stopped on drop.
pub struct GoCarina {
    node: Option<ChildGuard>,
    controller: Option<ChildGuard>,
    provisioner: Option<ChildGuard>,
    registration: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
    node_socket: PathBuf,
    host_dirs: Option<HostDirs>,
}

impl std::fmt::Debug for GoCarina {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GoCarina")
            .field("node_socket", &self.node_socket)
            .finish_non_exhaustive()
    }
}

/// The host paths Go Carina's programs use at fixed places: its
/// configuration, its log file, its device nodes, and `/host` (its node
/// reads the host's `/proc` as `/host/proc`, where its pod mounts it).
const GO_HOST_DIRS: [&str; 4] = [GO_CONFIG_DIR, "/var/log/carina", "/dev/carina", "/host"];

/// `config.json` in [`GO_CONFIG_DIR`]; on drop, each of
/// [`GO_HOST_DIRS`] is removed (none existed before).
#[derive(Debug)]
struct HostDirs;

impl HostDirs {
    fn write(config: &Value) -> Result<HostDirs> {
        for dir in GO_HOST_DIRS {
            ensure!(
                !Path::new(dir).exists(),
                "{dir} exists: Go Carina uses it, and this test will not touch another \
                 install's files"
            );
        }
        std::fs::create_dir_all(GO_CONFIG_DIR)
            .with_context(|| format!("create {GO_CONFIG_DIR}"))?;
        let guard = HostDirs;
        std::fs::create_dir("/host").context("create /host")?;
        std::os::unix::fs::symlink("/proc", "/host/proc").context("link /host/proc")?;
        std::fs::write(
            Path::new(GO_CONFIG_DIR).join("config.json"),
            serde_json::to_vec_pretty(config)?,
        )?;
        Ok(guard)
    }
}

impl Drop for HostDirs {
    fn drop(&mut self) {
        for dir in GO_HOST_DIRS {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The directory of the go-carina tool's build (`bin/`, `crds/`).
fn go_carina_dir() -> Result<PathBuf> {
    let bin = tool_path("go-carina")?;
    let dir = bin.parent().context("go-carina's bin/ has no parent")?;
    ensure!(
        bin.join("carina-node").exists(),
        "{} has no carina-node: run tests/tools/build.sh go-carina",
        bin.display()
    );
    Ok(dir.to_path_buf())
}

/// A StorageClass as Go Carina's chart renders one item of
/// `storage.StorageClass[]` (`disktype` names the class and the group).
pub fn go_storage_class(disktype: &str, fstype: &str) -> Result<StorageClass> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": disktype},
        "provisioner": DRIVER,
        "parameters": {
            "csi.storage.k8s.io/fstype": fstype,
            "carina.storage.io/disk-group-name": disktype,
        },
        "reclaimPolicy": "Delete",
        "allowVolumeExpansion": true,
        "volumeBindingMode": "WaitForFirstConsumer",
    }))?)
}

impl GoCarina {
    /// Applies Go's CRDs and CSIDriver, writes `config` as Go's
    /// `config.json`, starts its controller, external-provisioner and
    /// node, and waits until the kubelet lists the driver.
    pub async fn start(cluster: &LocalCluster, config: &Value) -> Result<GoCarina> {
        let go = go_carina_dir()?;
        let client = cluster.client();
        cluster.kubectl(&["apply", "-f", &go.join("crds").to_string_lossy()])?;
        let drivers: Api<CSIDriver> = Api::all(client.clone());
        let driver: CSIDriver = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": DRIVER, "annotations": {"csiDriver": "v0.14.0"}},
            "spec": {"attachRequired": false, "podInfoOnMount": true,
                     "volumeLifecycleModes": ["Persistent"]},
        }))?;
        drivers.create(&PostParams::default(), &driver).await?;

        let mut carina = GoCarina {
            node: None,
            controller: None,
            provisioner: None,
            registration: None,
            node_socket: cluster
                .kubelet_root()
                .join("plugins")
                .join(DRIVER)
                .join("csi.sock"),
            host_dirs: Some(HostDirs::write(config)?),
        };
        let dir = cluster.dir().join("go-carina");
        std::fs::create_dir_all(&dir)?;
        let kubeconfig = cluster
            .kube()
            .kubeconfig_path()
            .to_string_lossy()
            .into_owned();
        let log = |name: &str| cluster.log_dir().join(format!("go-{name}.log"));
        // The tool's udevadm first, as Go's image has one.
        let path = format!(
            "{}:{}",
            go.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );

        // The controller serves its webhooks, unregistered here, over TLS
        // (its chart mounts a Secret with the keys `cert` and `key`).
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs)?;
        let ca = DevCa::new("go carina webhook CA", Validity::days(1))?;
        let cert = ca.issue_server("localhost", &[], &[], Validity::days(1))?;
        std::fs::write(certs.join("cert"), &cert.cert_pem)?;
        std::fs::write(certs.join("key"), &cert.key_pem)?;
        let controller_socket = dir.join("controller.sock");
        let mut controller = ChildGuard::spawn(
            "go carina-controller",
            &go.join("bin/carina-controller"),
            &[
                format!("--csi-address={}", controller_socket.display()),
                format!("--cert-dir={}", certs.display()),
                format!("--webhook-addr=127.0.0.1:{}", free_port()?),
                "--metrics-addr=0".to_string(),
            ],
            &[
                ("KUBECONFIG", &kubeconfig),
                ("NAMESPACE", GO_NAMESPACE),
                ("PATH", &path),
            ],
            &log("controller"),
        )?;
        wait_for_path(&controller_socket, &mut controller, START_TIMEOUT)?;
        carina.controller = Some(controller);
        // As Go's chart runs it beside the controller.
        carina.provisioner = Some(csi_provisioner(
            cluster.kube(),
            &controller_socket,
            &[
                "--feature-gates=Topology=true",
                "--timeout=15s",
                "--extra-create-metadata=true",
                "--strict-topology=true",
            ],
            &[],
        )?);

        std::fs::create_dir_all(carina.node_socket.parent().context("socket's folder")?)?;
        let mut node = ChildGuard::spawn(
            "go carina-node",
            &go.join("bin/carina-node"),
            &[
                format!("--csi-address={}", carina.node_socket.display()),
                "--metrics-addr=0".to_string(),
            ],
            &[
                ("KUBECONFIG", &kubeconfig),
                ("NODE_NAME", cluster.node_name()),
                ("PATH", &path),
            ],
            &log("node"),
        )?;
        wait_for_path(&carina.node_socket, &mut node, START_TIMEOUT)?;
        carina.node = Some(node);

        // Go's chart registers the node with node-driver-registrar; this
        // does the same over the kubelet's registration API.
        let registration = PluginRegistration::new(
            cluster.kubelet_root().join("plugins_registry"),
            &carina.node_socket,
        )?;
        let socket = registration.bind()?;
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.await;
            };
            if let Err(e) = registration
                .serve(socket, Arc::new(Metrics::default()), shutdown)
                .await
            {
                eprintln!("go carina registration: {e}");
            }
        });
        carina.registration = Some((stop, task));
        carina.registered(cluster, true).await?;
        Ok(carina)
    }

    /// Fails if a Go program has exited (with its log's tail).
    pub fn check_running(&mut self) -> Result<()> {
        for child in [&mut self.node, &mut self.controller, &mut self.provisioner]
            .into_iter()
            .flatten()
        {
            child.check_running()?;
        }
        Ok(())
    }

    /// Waits until the kubelet lists the driver on the Node's CSINode
    /// (`listed`) or no longer does.
    async fn registered(&self, cluster: &LocalCluster, listed: bool) -> Result<()> {
        let csinodes: Api<CSINode> = Api::all(cluster.client());
        await_object(
            &csinodes,
            cluster.node_name(),
            if listed {
                "listing Go Carina's driver"
            } else {
                "no longer listing Go Carina's driver"
            },
            START_TIMEOUT,
            |n: Option<&CSINode>| {
                listed == n.is_some_and(|n| n.spec.drivers.iter().any(|d| d.name == DRIVER))
            },
        )
        .await?;
        Ok(())
    }

    /// Removes Go Carina as `docs/migrate-from-go-carina.md` says: its
    /// programs stopped, the node's registration gone from the kubelet,
    /// its CSIDriver deleted, its `config.json` removed. Its CRDs,
    /// LogicVolumes, PersistentVolumes and StorageClasses stay.
    pub async fn remove(mut self, cluster: &LocalCluster) -> Result<()> {
        self.check_running()?;
        self.stop_programs().await;
        self.registered(cluster, false).await?;
        let drivers: Api<CSIDriver> = Api::all(cluster.client());
        drivers.delete(DRIVER, &DeleteParams::default()).await?;
        self.host_dirs.take();
        Ok(())
    }

    async fn stop_programs(&mut self) {
        if let Some(mut node) = self.node.take() {
            node.stop(STOP_GRACE);
        }
        // Go's gRPC runner removes its socket when it stops cleanly; a
        // killed one leaves it.
        let _ = std::fs::remove_file(&self.node_socket);
        if let Some((stop, task)) = self.registration.take() {
            let _ = stop.send(());
            let _ = task.await;
        }
        for child in [self.controller.take(), self.provisioner.take()]
            .into_iter()
            .flatten()
        {
            let mut child = child;
            child.stop(STOP_GRACE);
        }
    }
}

impl Drop for GoCarina {
    fn drop(&mut self) {
        if let Some(mut node) = self.node.take() {
            node.stop(STOP_GRACE);
        }
        if let Some((stop, task)) = self.registration.take() {
            // The task removes its socket once told; it runs on after
            // this drop only while the runtime does.
            let _ = stop.send(());
            drop(task);
        }
        let _ = std::fs::remove_file(&self.node_socket);
    }
}
