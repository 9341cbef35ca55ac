//! Starting one node's processes, for the first node and the second
//! alike: containerd with its CRI plugins and CNI configuration, the
//! kubelet with its certificates and kubeconfig, kube-proxy, each in the
//! host's namespaces or entered into a node's own; waiting for the Node
//! to be Ready; removing its pods through the CRI on the way down.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;

use super::config::{KubeletConfig, cni_config, kubelet_config};
use super::{CRI_NAMESPACE, READY_TIMEOUT, SANDBOX_IMAGE, host, node_binary, second};
use crate::cluster::{await_object, free_port};
use crate::containerd::{Containerd, Cri};
use crate::kube::KubeCluster;
use crate::process::{ChildGuard, tail, upstream_tool};
use crate::run;

/// The CNI plugins' tool directory.
const CNI_TOOL: &str = "cni-v1.10.0";

/// crictl's tool directory.
const CRICTL_TOOL: &str = "crictl-v1.37.0";

/// Removes every pod sandbox `containerd` has (stopping its containers
/// and releasing its network) through the CRI, as the kubelet would.
pub(super) fn remove_all_pods(containerd: &Containerd) {
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
pub(super) fn start_containerd(
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
pub(super) struct NodeFiles<'a> {
    pub(super) name: &'a str,
    pub(super) ip: Ipv4Addr,
    pub(super) root: &'a Path,
    pub(super) cgroup: &'a str,
    /// The node's folder: certificates, configuration, pod logs.
    pub(super) dir: &'a Path,
    pub(super) kubelet_log: &'a Path,
    pub(super) enter: Option<&'a second::Enter>,
}

/// Writes the kubelet's certificates, kubeconfig and configuration under
/// the node's folder and starts it.
pub(super) fn spawn_kubelet(
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
pub(super) fn spawn_proxy(
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
pub(super) fn spawn_in(
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
pub(super) async fn wait_node_ready(
    client: Client,
    name: &str,
    kubelet: &mut ChildGuard,
) -> Result<()> {
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

/// Whether the Node's `Ready` condition is `True`.
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The path of `program` on PATH (or in /usr/sbin, /sbin).
pub(super) fn which(program: &str) -> Result<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .with_context(|| format!("{program} not found (make deps installs it)"))
}
