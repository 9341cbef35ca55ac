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

pub mod carina;
pub mod host;
pub mod second;
pub mod workload;

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::Client;
use kube::api::Api;

use crate::cluster::{await_object, free_port};
use crate::containerd::{Containerd, Cri};
use crate::kube::{ApiServerMode, Component, KubeCluster};
use crate::process::{ChildGuard, tail, upstream_tool};
use crate::{run, unique};

/// The Kubernetes version of the node's programs.
const KUBELET_TOOL: &str = "kubelet-v1.36.3";

/// The CNI plugins' tool directory.
const CNI_TOOL: &str = "cni-v1.10.0";

/// crictl's tool directory.
const CRICTL_TOOL: &str = "crictl-v1.37.0";

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

/// Removes every pod sandbox `containerd` has (stopping its containers
/// and releasing its network) through the CRI, as the kubelet would.
fn remove_all_pods(containerd: &Containerd) {
    let Ok(crictl) = upstream_tool("CARINA_CRICTL", CRICTL_TOOL, "crictl") else {
        return;
    };
    let endpoint = format!(
        "--runtime-endpoint=unix://{}",
        containerd.socket().display()
    );
    let _ = run(
        &crictl.to_string_lossy(),
        &[&endpoint, "--timeout=30s", "rmp", "--all", "--force"],
    );
}

/// The node's containerd with its CRI plugins: the pods on bridge
/// `bridge` with addresses from `cidr` (configuration and leases under
/// `dir`), `images` imported; in the node's own namespaces with `enter`.
fn start_containerd(
    dir: &Path,
    bridge: &str,
    cidr: &str,
    images: &[PathBuf],
    enter: Option<&second::Enter>,
) -> Result<Containerd> {
    let cni_conf = dir.join("cni/net.d");
    std::fs::create_dir_all(&cni_conf)?;
    std::fs::write(
        cni_conf.join("10-carina-test.conflist"),
        cni_config(bridge, cidr, &dir.join("cni/ipam")),
    )?;
    let cni_bin = upstream_tool("CARINA_CNI_BIN", CNI_TOOL, "bridge")?
        .parent()
        .context("CNI plugin without a directory")?
        .to_path_buf();
    let cri = Cri {
        sandbox_image: SANDBOX_IMAGE.to_string(),
        runc: which("runc")?,
        cni_bin_dir: cni_bin,
        cni_conf_dir: cni_conf,
    };
    let mut containerd = Containerd::start_in(Some(&cri), enter)?;
    for archive in images {
        let path = archive.to_str().context("UTF-8 archive path")?;
        containerd
            .ctr(CRI_NAMESPACE, &["images", "import", path])
            .with_context(|| format!("import {}", archive.display()))?;
    }
    Ok(containerd)
}

/// Where a node's kubelet keeps its files, and how its processes are
/// started (in the host's namespaces, or entered into a node's own).
struct NodeFiles<'a> {
    name: &'a str,
    ip: Ipv4Addr,
    root: &'a Path,
    cgroup: &'a str,
    /// The node's folder: certificates, configuration, pod logs.
    dir: &'a Path,
    kubelet_log: &'a Path,
    enter: Option<&'a second::Enter>,
}

/// Writes the kubelet's certificates, kubeconfig and configuration under
/// the node's folder and starts it.
fn spawn_kubelet(
    kube: &KubeCluster,
    node: &NodeFiles<'_>,
    containerd_socket: &Path,
) -> Result<ChildGuard> {
    let pki = node.dir.join("pki");
    let user = format!("system:node:{}", node.name);
    let (cert, key) = kube.write_client_cert(&pki, "kubelet-client", &user, "system:nodes")?;
    let kubeconfig = node.dir.join("kubelet.kubeconfig");
    match node.enter {
        // Its own network: the apiserver is at the host's address.
        Some(_) => {
            kube.write_kubeconfig_via(&kubeconfig, host::default_route_ip()?, &cert, &key)?
        }
        None => kube.write_kubeconfig(&kubeconfig, &cert, &key)?,
    }
    let (serving_cert, serving_key) = kube.write_serving_cert(
        &pki,
        "kubelet-serving",
        node.name,
        &[IpAddr::V4(node.ip), IpAddr::V4(Ipv4Addr::LOCALHOST)],
    )?;
    let config = node.dir.join("kubelet.yaml");
    let text = kubelet_config(&KubeletConfig {
        cgroup_root: node.cgroup,
        runtime_socket: containerd_socket,
        pod_logs: &node.dir.join("pod-logs"),
        client_ca: kube.ca_cert(),
        serving_cert: &serving_cert,
        serving_key: &serving_key,
        address: node.ip,
        port: free_port()?,
        healthz_port: free_port()?,
    });
    std::fs::write(&config, text)?;
    let args = vec![
        format!("--config={}", config.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--root-dir={}", node.root.display()),
        format!("--hostname-override={}", node.name),
        format!("--node-ip={}", node.ip),
        "--v=2".to_string(),
    ];
    spawn_in(
        node.enter,
        "kubelet",
        &node_binary("kubelet")?,
        &args,
        &[],
        node.kubelet_log,
    )
}

/// kube-proxy in iptables mode for node `name`, whose pods are in `cidr`,
/// with the admin's `kubeconfig`.
fn spawn_proxy(
    name: &str,
    cidr: &str,
    kubeconfig: &Path,
    log: &Path,
    enter: Option<&second::Enter>,
) -> Result<ChildGuard> {
    let args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--hostname-override={name}"),
        "--proxy-mode=iptables".to_string(),
        format!("--cluster-cidr={cidr}"),
        // Replies from a pod to a pod behind a Service on the same
        // bridge would skip the host's connection tracking without it
        // (no br_netfilter here).
        "--masquerade-all".to_string(),
        // No CAP_SYS_RESOURCE: keep its score, leave conntrack sizing.
        "--oom-score-adj=0".to_string(),
        "--conntrack-max-per-core=0".to_string(),
        format!("--healthz-bind-address=127.0.0.1:{}", free_port()?),
        format!("--metrics-bind-address=127.0.0.1:{}", free_port()?),
    ];
    spawn_in(
        enter,
        "kube-proxy",
        &node_binary("kube-proxy")?,
        &args,
        &[],
        log,
    )
}

/// Starts `program` in the host's namespaces or, with `enter`, in a
/// node's own.
fn spawn_in(
    enter: Option<&second::Enter>,
    name: &str,
    program: &Path,
    args: &[String],
    env: &[(&str, &str)],
    log: &Path,
) -> Result<ChildGuard> {
    match enter {
        None => ChildGuard::spawn(name, program, args, env, log),
        Some(enter) => {
            let (program, args) = enter.wrap(program, args);
            ChildGuard::spawn(name, &program, &args, env, log)
        }
    }
}

/// Waits, by watch, for Node `name` to be Ready; on a timeout the error
/// has the kubelet's log.
async fn wait_node_ready(client: Client, name: &str, kubelet: &mut ChildGuard) -> Result<()> {
    let nodes: Api<Node> = Api::all(client);
    let ready = await_object(&nodes, name, "Ready", READY_TIMEOUT, |n| {
        n.is_some_and(node_is_ready)
    })
    .await;
    if let Err(e) = ready {
        let _ = kubelet.check_running();
        bail!("{e:#}\nkubelet log:\n{}", tail(&kubelet.log, 40));
    }
    Ok(())
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

/// Whether the Node's `Ready` condition is `True`.
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The path of `program` on PATH (or in /usr/sbin, /sbin).
fn which(program: &str) -> Result<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .with_context(|| format!("{program} not found (make deps installs it)"))
}

/// The CNI configuration: a bridge that is the pods' gateway, addresses
/// from `cidr` recorded under `ipam_dir`, no masquerading (the
/// host's firewall is not touched beyond kube-proxy's rules).
fn cni_config(bridge: &str, cidr: &str, ipam_dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "carina-test",
        "plugins": [{
            "type": "bridge",
            "bridge": bridge,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "dataDir": ipam_dir,
                "ranges": [[{"subnet": cidr}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }],
    })
    .to_string()
}

/// The kubelet's settings that vary per cluster.
struct KubeletConfig<'a> {
    cgroup_root: &'a str,
    runtime_socket: &'a Path,
    pod_logs: &'a Path,
    client_ca: &'a Path,
    serving_cert: &'a Path,
    serving_key: &'a Path,
    address: Ipv4Addr,
    port: u16,
    healthz_port: u16,
}

/// The KubeletConfiguration (JSON is YAML).
fn kubelet_config(c: &KubeletConfig<'_>) -> String {
    serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        // Hosts with the cgroup v1 hierarchy are refused by default since
        // 1.35; this one has it.
        "failCgroupV1": false,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": format!("/{}", c.cgroup_root),
        "cgroupsPerQOS": true,
        "enforceNodeAllocatable": ["pods"],
        "containerRuntimeEndpoint": format!("unix://{}", c.runtime_socket.display()),
        "podLogsDir": c.pod_logs,
        "staticPodPath": "",
        "failSwapOn": false,
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": false},
            "x509": {"clientCAFile": c.client_ca},
        },
        // Only the apiserver (with the cluster CA's client certificate)
        // reaches it.
        "authorization": {"mode": "AlwaysAllow"},
        "tlsCertFile": c.serving_cert,
        "tlsPrivateKeyFile": c.serving_key,
        "address": c.address.to_string(),
        "port": c.port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": c.healthz_port,
        "clusterDomain": "cluster.local",
        "resolvConf": "/etc/resolv.conf",
        // A test machine's disk and memory are whatever they are; evict
        // only at the very end.
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": false,
        // No CAP_SYS_RESOURCE: the kubelet cannot lower its own score.
        "oomScoreAdj": 0,
        // Volume stats for kubelet_volume_stats_* sooner than every minute.
        "volumeStatsAggPeriod": "10s",
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cni_config_names_the_bridge_and_range() {
        let v: serde_json::Value =
            serde_json::from_str(&cni_config("cbr1", POD_CIDR, Path::new("/x"))).expect("json");
        assert_eq!(v["plugins"][0]["bridge"], "cbr1");
        assert_eq!(v["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], POD_CIDR);
    }
}
