//! A second node on the same host, beside [`LocalCluster`]'s first: its
//! own kubelet, containerd, kube-proxy, pod bridge and cgroup parent, in a
//! network namespace and a mount namespace of its own.
//!
//! - **Network:** a veth pair joins the node's namespace to the host. The
//!   node's address is [`NODE_IP`]; its pods get [`POD_CIDR`], routed by
//!   the host through the node. It reaches the apiserver at the host's
//!   address, and its host-network pods (the node plugin) listen on their
//!   own address, so two node plugins use the same port.
//! - **Mounts:** a copy of the host's, receiving the host's mounts
//!   (a slave) but never sending its own back. Over the paths a kubelet
//!   and containerd use whatever their configured roots (`/run/containerd`
//!   and `/var/lib/kubelet/device-plugins`) it mounts empty tmpfs, and it
//!   mounts its own kubelet root over the first node's path, so one chart
//!   (one `kubeletDir`) serves both nodes. A test can mount more over
//!   host paths with [`SecondNode::run`], e.g. a HOST group's directory.
//!
//! Both nodes see the host's `/dev`. A group on disks belongs to one node
//! through its `nodeLabel` (a label only that Node has); one group name on
//! disks of both nodes would be two volume groups of one name on one host,
//! which LVM does not tell apart. A HOST group of one name on both nodes
//! works when each node mounts its own directory there.
//!
//! Dropping the node stops its processes, removes its pod sandboxes
//! through the CRI, kills whatever is left in its mount namespace, and
//! removes both namespaces (with them its mounts, links, routes and
//! firewall rules), its cgroup parent and its folder.

use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::host;
use super::node::{
    NodeFiles, remove_all_pods, spawn_kubelet, spawn_proxy, start_containerd, wait_node_ready,
    which,
};
use crate::containerd::Containerd;
use crate::kube::KubeCluster;
use crate::process::ChildGuard;
use crate::{run, unique};

/// The second node's address, on its side of the veth pair.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 254, 0, 2);

/// The host's address on its side of the veth pair.
const HOST_SIDE_IP: Ipv4Addr = Ipv4Addr::new(10, 254, 0, 1);

/// The veth pair's network.
const LINK_NET: &str = "10.254.0.0/24";

/// The second node's pod network.
pub const POD_CIDR: &str = "10.89.0.0/16";

/// How a process is started in the node's namespaces: `nsenter` with the
/// mount namespace's file and the network namespace's.
#[derive(Debug, Clone)]
pub struct Enter {
    nsenter: PathBuf,
    mount: PathBuf,
    net: PathBuf,
}

impl Enter {
    /// `program args...` as a command line that runs it in the node's
    /// namespaces (nsenter execs it: the pid is the program's).
    pub fn wrap(&self, program: &Path, args: &[String]) -> (PathBuf, Vec<String>) {
        let mut all = vec![
            format!("--mount={}", self.mount.display()),
            format!("--net={}", self.net.display()),
            "--".to_string(),
            program.to_string_lossy().into_owned(),
        ];
        all.extend_from_slice(args);
        (self.nsenter.clone(), all)
    }
}

/// A running second node.
pub struct SecondNode {
    name: String,
    netns: String,
    host_link: String,
    bridge: String,
    cgroup: String,
    kubelet_root: PathBuf,
    enter: Option<Enter>,
    kubelet: Option<ChildGuard>,
    proxy: Option<ChildGuard>,
    containerd: Option<Containerd>,
    /// The folder holding the mount namespace's file (a private mount).
    ns_dir: Option<PathBuf>,
    dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for SecondNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecondNode")
            .field("name", &self.name)
            .field("netns", &self.netns)
            .finish_non_exhaustive()
    }
}

impl SecondNode {
    /// Starts the node with `kubelet_root` (the first node's path, which
    /// the chart names) as its kubelet root, imports `images` into its
    /// containerd, and waits until the Node is Ready.
    pub(super) async fn start(
        kube: &KubeCluster,
        kubelet_root: &Path,
        images: &[PathBuf],
        log_dir: &Path,
    ) -> Result<SecondNode> {
        let taken = run("ip", &["-4", "route", "show", LINK_NET]).unwrap_or_default();
        if !taken.trim().is_empty() {
            bail!(
                "{LINK_NET} is routed on this host already ({taken}); is another second node up?"
            );
        }
        let id = unique("n").replace('-', "");
        let short = &id[id.len().saturating_sub(8)..];
        let mut node = SecondNode {
            name: format!("carina-{id}"),
            netns: format!("carina-{short}"),
            host_link: format!("cvh{short}"),
            bridge: format!("cbr{short}"),
            cgroup: format!("carina-{id}"),
            kubelet_root: kubelet_root.to_path_buf(),
            enter: None,
            kubelet: None,
            proxy: None,
            containerd: None,
            ns_dir: None,
            dir: Some(tempfile::Builder::new().prefix("carina-node2-").tempdir()?),
        };
        // From here on, Drop undoes whatever was done.
        node.make_network(short)?;
        node.make_mounts()?;
        node.start_processes(kube, images, log_dir)?;
        let client = kube.client();
        let kubelet = node.kubelet.as_mut().context("no kubelet")?;
        wait_node_ready(client, &node.name, kubelet).await?;
        Ok(node)
    }

    /// The network namespace, the veth pair, the addresses and routes.
    fn make_network(&mut self, short: &str) -> Result<()> {
        let ns = self.netns.clone();
        run("ip", &["netns", "add", &ns])?;
        let inner = format!("cvn{short}");
        run(
            "ip",
            &[
                "link",
                "add",
                &self.host_link,
                "type",
                "veth",
                "peer",
                "name",
                &inner,
                "netns",
                &ns,
            ],
        )?;
        let host_side = format!("{HOST_SIDE_IP}/24");
        let node_side = format!("{NODE_IP}/24");
        let gateway = HOST_SIDE_IP.to_string();
        let node_ip = NODE_IP.to_string();
        run("ip", &["addr", "add", &host_side, "dev", &self.host_link])?;
        run("ip", &["link", "set", &self.host_link, "up"])?;
        for args in [
            &["addr", "add", &node_side, "dev", &inner][..],
            &["link", "set", &inner, "up"],
            &["link", "set", "lo", "up"],
            &["route", "add", "default", "via", &gateway],
        ] {
            let mut all = vec!["-n", ns.as_str()];
            all.extend_from_slice(args);
            run("ip", &all)?;
        }
        // Pods on the bridge reach the host through the node.
        run(
            "ip",
            &[
                "netns",
                "exec",
                &ns,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ],
        )?;
        // The first node's pods (the controller) reach this node's pods.
        run("ip", &["route", "add", POD_CIDR, "via", &node_ip])?;
        Ok(())
    }

    /// The mount namespace and what it mounts over the host's paths.
    fn make_mounts(&mut self) -> Result<()> {
        let dir = self.dir().to_path_buf();
        let ns_dir = dir.join("ns");
        std::fs::create_dir_all(&ns_dir)?;
        let d = ns_dir.to_str().context("UTF-8 path")?;
        // A namespace file may only be bound on a private mount.
        run("mount", &["--bind", d, d])?;
        self.ns_dir = Some(ns_dir.clone());
        run("mount", &["--make-private", d])?;
        let file = ns_dir.join("mnt");
        std::fs::write(&file, b"")?;
        let f = file.to_str().context("UTF-8 path")?;
        run(
            "unshare",
            &[&format!("--mount={f}"), "--propagation", "slave", "true"],
        )?;
        self.enter = Some(Enter {
            nsenter: which("nsenter")?,
            mount: file,
            net: PathBuf::from("/run/netns").join(&self.netns),
        });

        // What a kubelet and containerd use whatever their roots.
        for path in ["/run/containerd", "/var/lib/kubelet/device-plugins"] {
            std::fs::create_dir_all(path)?;
            self.run("mount", &["-t", "tmpfs", "tmpfs", path])?;
        }
        // Its kubelet root at the first node's path, shared within the
        // namespace so a node plugin's Bidirectional mounts reach it.
        let own = dir.join("kubelet");
        std::fs::create_dir_all(&own)?;
        let own = own.to_str().context("UTF-8 path")?;
        let root = self
            .kubelet_root
            .to_str()
            .context("UTF-8 path")?
            .to_string();
        // The copy of the first node's mount goes first: with two mounts
        // on one path, containerd may check the wrong one for sharing.
        self.run("umount", &["-l", &root])?;
        self.run("mount", &["--bind", own, &root])?;
        self.run("mount", &["--make-rshared", &root])?;
        Ok(())
    }

    fn start_processes(
        &mut self,
        kube: &KubeCluster,
        images: &[PathBuf],
        log_dir: &Path,
    ) -> Result<()> {
        let dir = self.dir().to_path_buf();
        let enter = self.enter.clone().context("no namespaces")?;
        let containerd = start_containerd(&dir, &self.bridge, POD_CIDR, images, Some(&enter))?;
        let socket = containerd.socket().to_path_buf();
        self.containerd = Some(containerd);

        host::create_cgroup(&self.cgroup)?;
        let kubelet_log = log_dir.join(format!("kubelet-{}.log", self.name));
        let files = NodeFiles {
            name: &self.name,
            ip: NODE_IP,
            root: &self.kubelet_root,
            cgroup: &self.cgroup,
            dir: &dir,
            kubelet_log: &kubelet_log,
            enter: Some(&enter),
        };
        self.kubelet = Some(spawn_kubelet(kube, &files, &socket)?);
        let proxy_log = log_dir.join(format!("kube-proxy-{}.log", self.name));
        // The admin's credentials, with the apiserver at the host's address.
        let kubeconfig = dir.join("admin.kubeconfig");
        kube.write_admin_kubeconfig_via(&kubeconfig, host::default_route_ip()?)?;
        self.proxy = Some(spawn_proxy(
            &self.name,
            POD_CIDR,
            &kubeconfig,
            &proxy_log,
            Some(&enter),
        )?);
        Ok(())
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `program args...` in the node's namespaces; its stdout.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String> {
        let enter = self.enter.as_ref().context("no namespaces")?;
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let (nsenter, all) = enter.wrap(Path::new(program), &args);
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        run(&nsenter.to_string_lossy(), &all)
    }

    /// Fails, with the log's tail, if the kubelet or kube-proxy exited.
    pub fn check_running(&mut self) -> Result<()> {
        for child in [self.kubelet.as_mut(), self.proxy.as_mut()]
            .into_iter()
            .flatten()
        {
            child.check_running()?;
        }
        Ok(())
    }

    fn dir(&self) -> &Path {
        self.dir
            .as_ref()
            .expect("the folder lives until drop")
            .path()
    }

    /// SIGKILLs every process whose mount namespace is the node's.
    fn kill_namespace_members(&self) {
        let Some(file) = self.enter.as_ref().map(|e| e.mount.clone()) else {
            return;
        };
        let Ok(inode) = std::fs::metadata(&file).map(|m| m.ino()) else {
            return;
        };
        let wanted = format!("mnt:[{inode}]");
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for pid in entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        {
            let link = std::fs::read_link(format!("/proc/{pid}/ns/mnt"));
            if link.is_ok_and(|l| l.as_os_str() == wanted.as_str()) {
                let _ = run("kill", &["-KILL", &pid.to_string()]);
            }
        }
    }
}

impl Drop for SecondNode {
    fn drop(&mut self) {
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop(Duration::from_secs(10));
        }
        if let Some(containerd) = self.containerd.as_ref() {
            remove_all_pods(containerd);
        }
        self.containerd.take();
        if let Some(mut proxy) = self.proxy.take() {
            proxy.stop(Duration::from_secs(5));
        }
        // Nothing may keep the namespace (and its mounts) alive.
        self.kill_namespace_members();
        if let Some(ns_dir) = self.ns_dir.take() {
            let _ = run("umount", &[&ns_dir.join("mnt").to_string_lossy()]);
            let _ = run("umount", &["-l", &ns_dir.to_string_lossy()]);
        }
        // The namespace takes the veth pair, the bridge and the firewall
        // rules with it; the host's route goes with its link.
        let _ = run("ip", &["netns", "delete", &self.netns]);
        host::delete_link(&self.host_link);
        if let Err(e) = host::remove_cgroup(&self.cgroup) {
            eprintln!("second node: {e:#}");
        }
        self.dir.take();
    }
}
