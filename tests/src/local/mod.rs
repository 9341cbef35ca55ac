//! A real one-node Kubernetes cluster for tests: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler from [`KubeCluster`], plus a
//! node: containerd with its CRI plugins, runc, the CNI bridge, kube-proxy
//! and a kubelet. Pods really run, volumes are really staged and published
//! by the kubelet, Services route.
//!
//! ```ignore
//! let cluster = LocalCluster::start(LocalOptions::default()).await?;
//! cluster.import_images(&[archive])?;
//! let pods: Api<Pod> = Api::namespaced(cluster.client(), "default");
//! ```
//!
//! One cluster at a time runs on a host: it takes a host-wide lock for its
//! life (a kubelet owns fixed host paths), so tests that start one wait for
//! each other, across test processes too. [`LocalCluster::add_node`] adds
//! a second node in namespaces of its own (see [`second`]).
//!
//! Everything lives in one temporary folder: the kubelet's root (bind
//! mounted onto itself and made shared, so a node plugin's Bidirectional
//! mounts reach the kubelet), containerd's root and state, the CNI
//! configuration and IP allocations, certificates, logs. The kubelet's pods
//! go under a cgroup parent of their own. Dropping the cluster stops the
//! kubelet, removes every pod sandbox through the CRI (containers, network
//! namespaces, IP leases), stops containerd and any shim left, removes
//! kube-proxy's rules and the bridge, unmounts everything under the folder,
//! removes the cgroups, and stops the control plane: nothing is left on the
//! host, also after a panic.
//!
//! One file per job besides this one (the cluster and its teardown):
//! `node` starts a node's processes (containerd, kubelet, kube-proxy) and
//! waits for it, `config` writes their configuration, `host` changes the
//! host (mounts, cgroups, links), `second` is the second node, `carina`
//! installs Carina on the cluster and `workload` runs pods that use it.

pub mod carina;
mod config;
pub mod gocarina;
pub mod host;
mod images;
mod node;
pub mod second;
pub mod workload;

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::Api;

pub use node::node_is_ready;
use node::{
    NodeFiles, remove_all_pods, spawn_kubelet, spawn_proxy, start_containerd, wait_node_ready,
};

use crate::cluster::await_object;
use crate::containerd::Containerd;
use crate::kube::{ApiServerMode, Component, KubeCluster};
use crate::process::{ChildGuard, upstream_tool};
use crate::{run, unique};

/// The Kubernetes version of the node's programs.
const KUBELET_TOOL: &str = "kubelet-v1.36.3";

/// The pod network (one node: one range).
pub const POD_CIDR: &str = "10.88.0.0/16";

/// containerd 2.4's sandbox image; the archive that provides it must be
/// among [`LocalOptions::images`].
pub const SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.10.2";

/// The containerd namespace the CRI plugins use.
pub const CRI_NAMESPACE: &str = "k8s.io";

/// How long the node may take to become Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Where the host-wide lock lives.
const LOCK_FILE: &str = "/run/lock/carina-local-cluster.lock";

/// `kubelet`, `kubectl` or `kube-proxy` from `tests/tools/build.sh kubelet`
/// (or `CARINA_KUBELET`, ...).
pub fn node_binary(name: &str) -> Result<PathBuf> {
    let env = format!("CARINA_{}", name.to_uppercase().replace('-', "_"));
    upstream_tool(&env, KUBELET_TOOL, name)
}

/// What to start the cluster with.
#[derive(Debug, Default, Clone)]
pub struct LocalOptions {
    /// OCI archives imported into the node's containerd before the kubelet
    /// starts; one of them must provide [`SANDBOX_IMAGE`].
    pub images: Vec<PathBuf>,
    /// kube-scheduler's extenders (see [`KubeCluster::start_scheduler`]).
    pub extenders: Vec<serde_json::Value>,
}

/// A running one-node cluster.
pub struct LocalCluster {
    node_name: String,
    host_ip: Ipv4Addr,
    kubelet_root: PathBuf,
    cgroup: String,
    bridge: String,
    kubelet: Option<ChildGuard>,
    proxy: Option<ChildGuard>,
    containerd: Option<Containerd>,
    second: Option<second::SecondNode>,
    scheduler: Option<Component>,
    controller_manager: Option<Component>,
    kube: Option<KubeCluster>,
    dir: Option<tempfile::TempDir>,
    log_dir: PathBuf,
    /// Host resources (loop disks, volume-group guards) released once the
    /// node is gone, last one first.
    release_after: Vec<Box<dyn std::any::Any + Send>>,
    _lock: File,
}

impl std::fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCluster")
            .field("node_name", &self.node_name)
            .field("host_ip", &self.host_ip)
            .field("kubelet_root", &self.kubelet_root)
            .finish_non_exhaustive()
    }
}

impl LocalCluster {
    /// Starts the control plane and the node and waits until the Node is
    /// Ready and the `default` ServiceAccount exists (pods can be made).
    /// Waits first for any other local cluster on this host to go.
    pub async fn start(options: LocalOptions) -> Result<LocalCluster> {
        let lock = host_lock().await?;
        let host_ip = host::default_route_ip()?;
        let kube = KubeCluster::start_with(ApiServerMode::WithKubelet { host_ip }).await?;
        let log_dir = kube.log_dir().to_path_buf();
        let dir = tempfile::Builder::new().prefix("carina-node-").tempdir()?;
        let id = unique("n").replace('-', "");
        let node_name = format!("carina-{id}");
        // Interface names are at most 15 bytes.
        let bridge = format!("cbr{}", &id[id.len().saturating_sub(10)..]);
        let mut cluster = LocalCluster {
            node_name,
            host_ip,
            kubelet_root: dir.path().join("kubelet"),
            cgroup: format!("carina-{id}"),
            bridge,
            kubelet: None,
            proxy: None,
            containerd: None,
            second: None,
            scheduler: None,
            controller_manager: None,
            kube: Some(kube),
            dir: Some(dir),
            log_dir,
            release_after: Vec::new(),
            _lock: lock,
        };
        // From here on, Drop undoes whatever was done.
        cluster.start_node(&options).await?;
        Ok(cluster)
    }

    async fn start_node(&mut self, options: &LocalOptions) -> Result<()> {
        let kube = self.kube.as_ref().context("no control plane")?;
        self.controller_manager = Some(kube.start_controller_manager(&[]).await?);
        self.scheduler = Some(kube.start_scheduler(&options.extenders).await?);

        let dir = self.dir().to_path_buf();
        host::make_shared(&self.kubelet_root)?;

        // The pod network: one bridge, addresses from POD_CIDR.
        let containerd = start_containerd(&dir, &self.bridge, POD_CIDR, &options.images, None)?;
        let containerd_socket = containerd.socket().to_path_buf();
        self.containerd = Some(containerd);

        self.start_kubelet(&containerd_socket)?;
        self.start_proxy()?;
        self.wait_ready().await
    }

    fn start_kubelet(&mut self, containerd_socket: &Path) -> Result<()> {
        let kube = self.kube.as_ref().context("no control plane")?;
        host::create_cgroup(&self.cgroup)?;
        let node = NodeFiles {
            name: &self.node_name,
            ip: self.host_ip,
            root: &self.kubelet_root,
            cgroup: &self.cgroup,
            dir: self.dir.as_ref().context("no folder")?.path(),
            kubelet_log: &self.log_dir.join("kubelet.log"),
            enter: None,
        };
        self.kubelet = Some(spawn_kubelet(kube, &node, containerd_socket)?);
        Ok(())
    }

    /// kube-proxy in iptables mode: Services (the `kubernetes` one that
    /// pods reach the apiserver through, and Carina's) route.
    fn start_proxy(&mut self) -> Result<()> {
        let kube = self.kube.as_ref().context("no control plane")?;
        let log = self.log_dir.join("kube-proxy.log");
        self.proxy = Some(spawn_proxy(
            &self.node_name,
            POD_CIDR,
            kube.kubeconfig_path(),
            &log,
            None,
        )?);
        Ok(())
    }

    /// Waits, by watch, for the Node to be Ready and for the `default`
    /// ServiceAccount (made by kube-controller-manager) that pods need.
    async fn wait_ready(&mut self) -> Result<()> {
        let client = self.client();
        let kubelet = self.kubelet.as_mut().context("no kubelet")?;
        wait_node_ready(client.clone(), &self.node_name, kubelet).await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client, "default");
        await_object(
            &accounts,
            "default",
            "created",
            READY_TIMEOUT,
            |a: Option<&ServiceAccount>| a.is_some(),
        )
        .await?;
        Ok(())
    }

    /// An admin client.
    pub fn client(&self) -> Client {
        self.kube().client()
    }

    /// The control plane.
    pub fn kube(&self) -> &KubeCluster {
        self.kube
            .as_ref()
            .expect("the control plane runs until drop")
    }

    /// The Node's name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Starts a second node (see [`second`]) with `images` imported and
    /// waits until it is Ready; its name.
    pub async fn add_node(&mut self, images: &[PathBuf]) -> Result<String> {
        if self.second.is_some() {
            bail!("this cluster has a second node already");
        }
        let kube = self.kube.as_ref().context("no control plane")?;
        let node =
            second::SecondNode::start(kube, &self.kubelet_root, images, &self.log_dir).await?;
        let name = node.name().to_string();
        self.second = Some(node);
        Ok(name)
    }

    /// The second node, if [`add_node`](Self::add_node) started one.
    pub fn second_node(&self) -> Option<&second::SecondNode> {
        self.second.as_ref()
    }

    /// Every Node's name, the first node's first.
    pub fn node_names(&self) -> Vec<String> {
        let mut names = vec![self.node_name.clone()];
        names.extend(self.second.as_ref().map(|n| n.name().to_string()));
        names
    }

    /// The Node's InternalIP (the host's address on its default route).
    pub fn host_ip(&self) -> Ipv4Addr {
        self.host_ip
    }

    /// The kubelet's root directory (a shared mount).
    pub fn kubelet_root(&self) -> &Path {
        &self.kubelet_root
    }

    /// The cluster's folder.
    pub fn dir(&self) -> &Path {
        self.dir
            .as_ref()
            .expect("the folder lives until drop")
            .path()
    }

    /// Where the processes' logs are.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    /// Keeps `resource` (a loop disk, a volume-group guard) until the node
    /// is torn down and its mounts are gone; resources are dropped last
    /// one first.
    pub fn release_after_node(&mut self, resource: Box<dyn std::any::Any + Send>) {
        self.release_after.push(resource);
    }

    /// Imports OCI archives into the node's containerd (the CRI namespace),
    /// as a pull would.
    pub fn import_images(&mut self, archives: &[PathBuf]) -> Result<()> {
        let containerd = self
            .containerd
            .as_mut()
            .context("containerd is not running")?;
        for archive in archives {
            let path = archive.to_str().context("UTF-8 archive path")?;
            containerd
                .ctr(CRI_NAMESPACE, &["images", "import", path])
                .with_context(|| format!("import {}", archive.display()))?;
        }
        Ok(())
    }

    /// Runs `kubectl <args>` as the admin; its stdout, or an error with
    /// its stderr.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let kubectl = node_binary("kubectl")?;
        let kubeconfig = format!("--kubeconfig={}", self.kube().kubeconfig_path().display());
        let mut all = vec![kubeconfig.as_str()];
        all.extend_from_slice(args);
        run(&kubectl.to_string_lossy(), &all)
    }

    /// Fails, with the log's tail, if a node process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        for child in [self.kubelet.as_mut(), self.proxy.as_mut()]
            .into_iter()
            .flatten()
        {
            child.check_running()?;
        }
        if let Some(second) = self.second.as_mut() {
            second.check_running()?;
        }
        if let Some(kube) = self.kube.as_mut() {
            kube.check_running()?;
        }
        Ok(())
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.second.take();
        // Nothing restarts pods once the kubelet is gone.
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop(Duration::from_secs(10));
        }
        if let Some(containerd) = self.containerd.as_ref() {
            remove_all_pods(containerd);
        }
        // Stops the daemon, kills its shims, unmounts its snapshots.
        self.containerd.take();
        if let Some(mut proxy) = self.proxy.take() {
            proxy.stop(Duration::from_secs(5));
            if let Ok(program) = node_binary("kube-proxy") {
                let _ = run(&program.to_string_lossy(), &["--cleanup"]);
            }
        }
        host::delete_link(&self.bridge);
        // The containers' logs outlive the cluster beside the processes'.
        let pod_logs = self.dir().join("pod-logs");
        if pod_logs.exists() && !self.log_dir.starts_with(self.dir()) {
            let _ = run(
                "cp",
                &[
                    "-a",
                    &pod_logs.to_string_lossy(),
                    &self.log_dir.to_string_lossy(),
                ],
            );
        }
        host::unmount_under(self.dir());
        if let Err(e) = host::remove_cgroup(&self.cgroup) {
            eprintln!("local cluster: {e:#}");
        }
        while let Some(resource) = self.release_after.pop() {
            drop(resource);
        }
        self.scheduler.take();
        self.controller_manager.take();
        self.kube.take();
        self.dir.take();
    }
}

/// Takes the host-wide lock, waiting (off the runtime's threads) while
/// another local cluster holds it.
async fn host_lock() -> Result<File> {
    tokio::task::spawn_blocking(|| {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_FILE)
            .with_context(|| format!("open {LOCK_FILE}"))?;
        file.lock().with_context(|| format!("lock {LOCK_FILE}"))?;
        Ok(file)
    })
    .await?
}
