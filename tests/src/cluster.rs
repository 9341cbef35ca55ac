//! Carina's own binaries as processes, set up the way a cluster runs them:
//! one development CA for every node and controller ([`Pki`]),
//! `carina-node` ([`NodeArgs`]) and `carina-controller` in either mode
//! ([`KubeControllerArgs`], [`direct_controller_args`]), each a
//! restartable [`Service`] that is ready once its unix socket accepts
//! connections; and the Kubernetes side of a node: a `Node` object that
//! points at the node's NodeStorage endpoint ([`register_node`]) and the
//! wait for its capacity record ([`await_capacity`]), or for tests without
//! node processes a Ready status ([`ready_node_status`]) and a capacity
//! record written directly ([`publish_node_storage`]).
//!
//! ```ignore
//! let pki = Pki::write(&dir.join("pki"))?;
//! let args = NodeArgs::new("node-a", &pki, &config_json, &dir.join("node-a"), &log)?;
//! let node = Service::start("carina-node", "node-a", args.argv(), &args.csi_socket, &args.log).await?;
//! register_node(&client, "node-a", &args.endpoint()).await?;
//! await_capacity(&client, "node-a", Duration::from_secs(60)).await?;
//! ```
//!
//! A [`Service`] stops (SIGTERM, then SIGKILL) when dropped. Its log
//! level is `CARINA_TEST_RUST_LOG` (a `RUST_LOG` filter; default `info`).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use carina_api::{
    NODE_ENDPOINT_ANNOTATION, NodeStorageResource, NodeStorageResourceSpec,
    NodeStorageResourceStatus,
};
use carina_controlplane::kube::capacity::READY;
use carina_csi::{DRIVER_NAME, TOPOLOGY_KEY};
use carina_proto::devcerts::{CertifiedKey, DevCa, Validity};
use carina_proto::tls::{ClientTls, DEFAULT_TRUST_DOMAIN, connect};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeStatus};
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use serde::de::DeserializeOwned;
use tonic::transport::Channel;

use crate::grpc::{self, unix_channel};
use crate::kube::KubeCluster;
use crate::local::carina::tool_path;
use crate::process::{ChildGuard, tail, workspace_binary};
use crate::{LoopDisk, VgGuard, disk_group_config, unique};

/// How long a process may take to open its socket.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a stopped process may take to exit before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(20);

/// A certificate and its key, as files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertFiles {
    fn write(dir: &Path, name: &str, issued: &CertifiedKey) -> Result<CertFiles> {
        let files = CertFiles {
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}-key.pem")),
        };
        std::fs::write(&files.cert, &issued.cert_pem)?;
        std::fs::write(&files.key, &issued.key_pem)?;
        Ok(files)
    }
}

/// One development CA for a test's nodes and controllers, and the
/// controllers' client certificate (role `controller`), as files.
#[derive(Debug)]
pub struct Pki {
    ca: DevCa,
    dir: PathBuf,
    /// The CA certificate every party trusts.
    pub ca_pem: PathBuf,
    /// The client certificate of role `controller`.
    pub controller: CertFiles,
}

impl Pki {
    /// Makes the CA and the controller certificate in `dir`.
    pub fn write(dir: &Path) -> Result<Pki> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let ca = DevCa::new("carina test cluster CA", Validity::days(1))?;
        let ca_pem = dir.join("ca.pem");
        std::fs::write(&ca_pem, ca.cert_pem())?;
        let client = ca.issue_client(DEFAULT_TRUST_DOMAIN, "controller", Validity::days(1))?;
        let controller = CertFiles::write(dir, "controller", &client)?;
        Ok(Pki {
            ca,
            dir: dir.to_path_buf(),
            ca_pem,
            controller,
        })
    }

    /// A server certificate for node `name` (DNS SANs `name` and
    /// `localhost`, IP SAN 127.0.0.1).
    pub fn node(&self, name: &str) -> Result<CertFiles> {
        self.nodes(&[name])
    }

    /// One server certificate for every node of `names` (DNS SANs: the
    /// names and `localhost`, IP SAN 127.0.0.1), as one Secret would hold
    /// for a DaemonSet; named after the first.
    pub fn nodes(&self, names: &[&str]) -> Result<CertFiles> {
        let (first, others) = names.split_first().context("no node name")?;
        let mut sans: Vec<String> = others.iter().map(|n| n.to_string()).collect();
        sans.push("localhost".to_string());
        let server = self.ca.issue_server(
            first,
            &sans,
            &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            Validity::days(1),
        )?;
        CertFiles::write(&self.dir, first, &server)
    }

    /// The controller's credentials for node `name`.
    pub fn client_tls(&self, name: &str) -> Result<ClientTls> {
        Ok(ClientTls::from_files(
            &self.ca_pem,
            &self.controller.cert,
            &self.controller.key,
            name,
        )?)
    }

    /// A NodeStorage client of role `controller` for node `name` at
    /// `endpoint`.
    pub async fn node_client(&self, name: &str, endpoint: &str) -> Result<grpc::Client> {
        let channel = connect(endpoint, &self.client_tls(name)?)
            .await
            .with_context(|| format!("connect to node {name} at {endpoint}"))?;
        Ok(grpc::Client::new(channel))
    }
}

pub use crate::ports::free_port;

/// Arguments of one `carina-node` process: its name, certificate,
/// `config.json`, NodeStorage and metrics ports, CSI socket and state
/// directory. The same arguments start it again after a stop.
#[derive(Debug, Clone)]
pub struct NodeArgs {
    pub name: String,
    pub config: PathBuf,
    pub port: u16,
    pub metrics_port: u16,
    pub csi_socket: PathBuf,
    pub log: PathBuf,
    pub certs: CertFiles,
    pub ca: PathBuf,
    /// `--state-dir`, in the node's own directory.
    pub state_dir: PathBuf,
    /// Extra environment (e.g. `OTEL_*`).
    pub env: Vec<(String, String)>,
    /// The workspace binary: `carina-node`, or `carina-node-crashpoints`
    /// ([`NodeArgs::with_crashpoints`]).
    pub binary: String,
}

impl NodeArgs {
    /// A node `name` configured by `config_json`, its files in `dir` (made
    /// if missing), its output in `log` (replaced), its ports free.
    pub fn new(
        name: &str,
        pki: &Pki,
        config_json: &str,
        dir: &Path,
        log: &Path,
    ) -> Result<NodeArgs> {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let config = dir.join("config.json");
        std::fs::write(&config, config_json)?;
        let _ = std::fs::remove_file(log);
        Ok(NodeArgs {
            name: name.to_string(),
            config,
            port: free_port()?,
            metrics_port: free_port()?,
            csi_socket: dir.join("csi.sock"),
            log: log.to_path_buf(),
            certs: pki.node(name)?,
            ca: pki.ca_pem.clone(),
            state_dir: dir.join("state"),
            env: Vec::new(),
            binary: "carina-node".to_string(),
        })
    }

    /// The same node run as `carina-node-crashpoints`, the build that
    /// honours `CARINA_TEST_KILL_AT` (built here on first use:
    /// [`crate::process::crashpoints_node_binary`]).
    pub fn with_crashpoints(mut self) -> Result<NodeArgs> {
        crate::process::crashpoints_node_binary()?;
        self.binary = crate::process::CRASHPOINTS_NODE.to_string();
        Ok(self)
    }

    /// `127.0.0.1:<port>`, NodeStorage.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn argv(&self) -> Vec<String> {
        let p = |p: &Path| p.display().to_string();
        vec![
            "--config".into(),
            p(&self.config),
            "--node-name".into(),
            self.name.clone(),
            "--listen".into(),
            self.endpoint(),
            "--metrics-listen".into(),
            format!("127.0.0.1:{}", self.metrics_port),
            "--tls-cert".into(),
            p(&self.certs.cert),
            "--tls-key".into(),
            p(&self.certs.key),
            "--tls-ca".into(),
            p(&self.ca),
            "--csi-endpoint".into(),
            p(&self.csi_socket),
            "--state-dir".into(),
            p(&self.state_dir),
            "--shutdown-grace-secs".into(),
            "5".into(),
        ]
    }

    /// Starts the node and waits for its CSI socket.
    pub async fn start(&self) -> Result<Service> {
        Service::start_with_env(
            &self.binary,
            &self.name,
            self.argv(),
            &self.env,
            &self.csi_socket,
            &self.log,
        )
        .await
    }
}

/// Arguments of one `carina-controller --mode kube` replica, with
/// timings short enough for tests: a 4 s lease renewed every second,
/// 30 s to wait for the bridge, 10 s per node call.
#[derive(Debug, Clone)]
pub struct KubeControllerArgs {
    pub identity: String,
    pub lease_name: String,
    pub kubeconfig: PathBuf,
    pub csi_socket: PathBuf,
    pub log: PathBuf,
    pub ca: PathBuf,
    pub cert: CertFiles,
    pub lease_duration_secs: u64,
    pub renew_deadline_secs: u64,
    pub retry_period_secs: u64,
    pub create_timeout_secs: u64,
    pub node_call_timeout_secs: u64,
    /// Extra environment (e.g. `OTEL_*`).
    pub env: Vec<(String, String)>,
    /// Extra arguments, after the others.
    pub extra: Vec<String>,
}

impl KubeControllerArgs {
    /// Replica `identity` on Lease `kube-system/<lease_name>`, its socket
    /// `<identity>.sock` in `dir`, its output appended to `log`.
    pub fn new(
        identity: &str,
        lease_name: &str,
        kubeconfig: &Path,
        pki: &Pki,
        dir: &Path,
        log: &Path,
    ) -> KubeControllerArgs {
        KubeControllerArgs {
            identity: identity.to_string(),
            lease_name: lease_name.to_string(),
            kubeconfig: kubeconfig.to_path_buf(),
            csi_socket: dir.join(format!("{identity}.sock")),
            log: log.to_path_buf(),
            ca: pki.ca_pem.clone(),
            cert: pki.controller.clone(),
            lease_duration_secs: 4,
            renew_deadline_secs: 3,
            retry_period_secs: 1,
            create_timeout_secs: 30,
            node_call_timeout_secs: 10,
            env: Vec::new(),
            extra: Vec::new(),
        }
    }

    pub fn argv(&self) -> Vec<String> {
        let p = |p: &Path| p.display().to_string();
        vec![
            "--mode".into(),
            "kube".into(),
            "--kubeconfig".into(),
            p(&self.kubeconfig),
            "--csi-endpoint".into(),
            p(&self.csi_socket),
            "--tls-ca".into(),
            p(&self.ca),
            "--tls-cert".into(),
            p(&self.cert.cert),
            "--tls-key".into(),
            p(&self.cert.key),
            "--identity".into(),
            self.identity.clone(),
            "--lease-name".into(),
            self.lease_name.clone(),
            "--lease-duration-secs".into(),
            self.lease_duration_secs.to_string(),
            "--renew-deadline-secs".into(),
            self.renew_deadline_secs.to_string(),
            "--retry-period-secs".into(),
            self.retry_period_secs.to_string(),
            "--create-timeout-secs".into(),
            self.create_timeout_secs.to_string(),
            "--node-call-timeout-secs".into(),
            self.node_call_timeout_secs.to_string(),
            "--shutdown-grace-secs".into(),
            "5".into(),
        ]
        .into_iter()
        .chain(self.extra.iter().cloned())
        .collect()
    }

    /// Starts the replica and waits for its CSI socket.
    pub async fn start(&self) -> Result<Service> {
        Service::start_with_env(
            "carina-controller",
            &self.identity,
            self.argv(),
            &self.env,
            &self.csi_socket,
            &self.log,
        )
        .await
    }
}

/// Arguments of `carina-controller --mode direct` over the node list in
/// `nodes_yaml`, with the controller certificate of `pki`.
pub fn direct_controller_args(nodes_yaml: &Path, pki: &Pki, csi_socket: &Path) -> Vec<String> {
    let p = |p: &Path| p.display().to_string();
    vec![
        "--mode".into(),
        "direct".into(),
        "--nodes".into(),
        p(nodes_yaml),
        "--csi-endpoint".into(),
        p(csi_socket),
        "--tls-ca".into(),
        p(&pki.ca_pem),
        "--tls-cert".into(),
        p(&pki.controller.cert),
        "--tls-key".into(),
        p(&pki.controller.key),
    ]
}

/// A binary of this workspace run as a service that is ready once its
/// unix socket accepts connections; it can be stopped, killed, paused and
/// started again with the same arguments (and the same log, appended).
#[derive(Debug)]
pub struct Service {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    socket: PathBuf,
    log: PathBuf,
    child: Option<ChildGuard>,
}

impl Service {
    /// Starts workspace binary `binary` as `name` and waits (at most
    /// [`START_TIMEOUT`]) until `socket` accepts a connection.
    pub async fn start(
        binary: &str,
        name: &str,
        args: Vec<String>,
        socket: &Path,
        log: &Path,
    ) -> Result<Service> {
        Self::start_with_env(binary, name, args, &[], socket, log).await
    }

    /// [`Service::start`] with `env` added to the process's environment.
    pub async fn start_with_env(
        binary: &str,
        name: &str,
        args: Vec<String>,
        env: &[(String, String)],
        socket: &Path,
        log: &Path,
    ) -> Result<Service> {
        let mut service = Service {
            name: name.to_string(),
            program: workspace_binary(binary)?,
            args,
            env: env.to_vec(),
            socket: socket.to_path_buf(),
            log: log.to_path_buf(),
            child: None,
        };
        service.restart().await?;
        Ok(service)
    }

    /// Starts the process again (it must not be running) and waits for
    /// its socket; a stale socket left by a crash does not count.
    pub async fn restart(&mut self) -> Result<()> {
        if self.child.is_some() {
            bail!("{} is still running", self.name);
        }
        let filter = std::env::var("CARINA_TEST_RUST_LOG").unwrap_or_else(|_| "info".into());
        let mut env: Vec<(&str, &str)> = vec![("RUST_LOG", &filter)];
        env.extend(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let mut child = ChildGuard::spawn(&self.name, &self.program, &self.args, &env, &self.log)?;
        // Waiting for a process to start: there is nothing to watch.
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Err(e) = child.check_running() {
                child.kill();
                return Err(e);
            }
            if tokio::net::UnixStream::connect(&self.socket).await.is_ok() {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not accept connections on {} within {START_TIMEOUT:?}; log:\n{}",
                    self.name,
                    self.socket.display(),
                    tail(&self.log, 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.child = Some(child);
        Ok(())
    }

    /// SIGTERM, then waits up to [`STOP_GRACE`] for the exit (SIGKILL
    /// after that).
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if child.signal("TERM").is_ok() {
            let deadline = Instant::now() + STOP_GRACE;
            while child.check_running().is_ok() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // Reaps it; SIGKILL only if it is still running.
        child.kill();
    }

    /// SIGKILL: a crash, no shutdown code runs.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to the running process.
    pub fn signal(&self, signal: &str) -> Result<()> {
        match &self.child {
            Some(child) => child.signal(signal),
            None => bail!("{} is not running", self.name),
        }
    }

    /// Fails (with the log's tail) if the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.as_mut() {
            Some(child) => child.check_running(),
            None => bail!("{} is stopped", self.name),
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(ChildGuard::pid)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// A gRPC channel over the service's unix socket.
    pub async fn channel(&self) -> Result<Channel> {
        unix_channel(self.socket.clone())
            .await
            .with_context(|| format!("connect to {} at {}", self.name, self.socket.display()))
    }
}

/// Registers Node `name` as a kubelet would, without one: label
/// `kubernetes.io/hostname`, the annotation [`NODE_ENDPOINT_ANNOTATION`]
/// = `endpoint` (where the control plane reaches its NodeStorage), and a
/// status with an InternalIP of 127.0.0.1, allocatable resources and
/// `Ready=True`.
pub async fn register_node(client: &kube::Client, name: &str, endpoint: &str) -> Result<Node> {
    let api: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/hostname".to_string(),
                name.to_string(),
            )])),
            annotations: Some(BTreeMap::from([(
                NODE_ENDPOINT_ANNOTATION.to_string(),
                endpoint.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    api.create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("create Node {name}"))?;
    let status = NodeStatus {
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: "127.0.0.1".into(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: name.into(),
            },
        ]),
        ..ready_node_status("4", "8Gi")
    };
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({ "status": status })),
    )
    .await
    .with_context(|| format!("write the status of Node {name}"))
}

/// A Node status as a kubelet reports it: `Ready=True`, and `cpu`,
/// `memory` and 110 pods both as capacity and allocatable.
pub fn ready_node_status(cpu: &str, memory: &str) -> NodeStatus {
    let resources = BTreeMap::from([
        ("cpu".to_string(), Quantity(cpu.into())),
        ("memory".to_string(), Quantity(memory.into())),
        ("pods".to_string(), Quantity("110".into())),
    ]);
    NodeStatus {
        capacity: Some(resources.clone()),
        allocatable: Some(resources),
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: Some("KubeletReady".into()),
            ..NodeCondition::default()
        }]),
        ..NodeStatus::default()
    }
}

/// Creates the `NodeStorageResource` of `node` and writes `status` into
/// it, as the capacity publisher does for a node without one running.
pub async fn publish_node_storage(
    client: &kube::Client,
    node: &str,
    status: NodeStorageResourceStatus,
) -> Result<()> {
    let api: Api<NodeStorageResource> = Api::all(client.clone());
    let nsr = NodeStorageResource::new(
        node,
        NodeStorageResourceSpec {
            node_name: node.into(),
        },
    );
    api.create(&PostParams::default(), &nsr)
        .await
        .with_context(|| format!("create NodeStorageResource {node}"))?;
    api.patch_status(
        node,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": status })),
    )
    .await
    .with_context(|| format!("write the status of NodeStorageResource {node}"))?;
    Ok(())
}

/// Waits, by watch, until the `NodeStorageResource` of `node` is `Ready`
/// with at least one group: the capacity publisher has a live stream from
/// the node, and placement can choose it.
pub async fn await_capacity(
    client: &kube::Client,
    node: &str,
    within: Duration,
) -> Result<NodeStorageResource> {
    let api: Api<NodeStorageResource> = Api::all(client.clone());
    let ready = await_object(&api, node, "Ready with capacity", within, |nsr| {
        nsr.and_then(|n| n.status.as_ref()).is_some_and(|s| {
            !s.groups.is_empty()
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == READY && c.status == "True")
        })
    })
    .await?;
    ready.with_context(|| format!("NodeStorageResource {node} deleted while waiting"))
}

/// Waits, by watch, until the object `name` satisfies `done` (which sees
/// `None` while it does not exist), at most `within`; returns it as
/// seen then. A watch that fails (an API server still initialising a new
/// CRD's storage answers 429) is started again after a short pause; the
/// last error goes into the timeout's message with the object as last
/// seen.
pub async fn await_object<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    within: Duration,
    done: impl Fn(Option<&K>) -> bool,
) -> Result<Option<K>>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut last_error: Option<String> = None;
    loop {
        let watched = tokio::time::timeout_at(deadline, await_condition(api.clone(), name, &done));
        match watched.await {
            Ok(Ok(obj)) => return Ok(obj),
            Ok(Err(e)) => {
                last_error = Some(e.to_string());
                tokio::time::sleep_until(
                    deadline.min(tokio::time::Instant::now() + Duration::from_millis(500)),
                )
                .await;
            }
            Err(_) => {
                let last = api.get_opt(name).await.ok().flatten();
                bail!(
                    "{name}: not {what} within {within:?} (last watch error: {}); last seen: {last:#?}",
                    last_error.as_deref().unwrap_or("none")
                )
            }
        }
    }
}

/// Labels Node `name` with Carina's topology key and gives it the
/// CSINode that kubelet would write once the node plugin registered, so
/// external-provisioner and kube-scheduler see the node's topology.
pub async fn add_topology(client: &kube::Client, name: &str) -> Result<()> {
    Api::<Node>::all(client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {TOPOLOGY_KEY: name}}})),
        )
        .await
        .with_context(|| format!("label Node {name}"))?;
    let csinode: CSINode = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"drivers": [{
            "name": DRIVER_NAME,
            "nodeID": name,
            "topologyKeys": [TOPOLOGY_KEY],
        }]},
    }))?;
    Api::<CSINode>::all(client.clone())
        .create(&PostParams::default(), &csinode)
        .await
        .with_context(|| format!("create CSINode {name}"))?;
    Ok(())
}

/// external-provisioner (`tests/tools/build.sh csi-provisioner`) as a
/// process against `cluster`, calling the CSI controller on `socket`,
/// with `args` and `env` added; its log is `csi-provisioner.log` in the
/// cluster's log directory. Stopped on drop.
pub fn csi_provisioner(
    cluster: &KubeCluster,
    socket: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<ChildGuard> {
    let mut argv = vec![
        format!("--csi-address={}", socket.display()),
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        "--v=4".to_string(),
    ];
    argv.extend(args.iter().map(|a| a.to_string()));
    ChildGuard::spawn(
        "csi-provisioner",
        &tool_path("csi-provisioner")?.join("csi-provisioner"),
        &argv,
        env,
        &cluster
            .log_dir()
            .join(format!("{}.log", unique("csi-provisioner"))),
    )
}

/// A `carina-node` process registered as Node `name`, with one LVM group
/// `group` on a loop disk of its own. Dropped in field order: the process,
/// then the volume group, then the disk.
#[derive(Debug)]
pub struct LvmNode {
    pub args: NodeArgs,
    pub service: Service,
    pub vg: VgGuard,
    pub disk: LoopDisk,
}

impl LvmNode {
    /// Starts node `name` (files under `dir/<name>`, log `<name>.log` in
    /// the cluster's log directory) on a new `disk_bytes` loop disk and
    /// registers its Node with the endpoint annotation.
    pub async fn start(
        cluster: &KubeCluster,
        pki: &Pki,
        dir: &Path,
        name: &str,
        group: &str,
        disk_bytes: u64,
    ) -> Result<LvmNode> {
        let disk = LoopDisk::new(disk_bytes)?;
        let vg = VgGuard::new(group, &[&disk]);
        let config = disk_group_config(group, "LVM", &[&disk], 0);
        let args = NodeArgs::new(
            name,
            pki,
            &config,
            &dir.join(name),
            &cluster.log_dir().join(format!("{name}.log")),
        )?;
        let service = args.start().await?;
        register_node(&cluster.client(), name, &args.endpoint()).await?;
        Ok(LvmNode {
            args,
            service,
            vg,
            disk,
        })
    }
}

/// Creates what the chart makes for the controller to use but not create
/// (it has no right to): the objects of `objs` (the chart rendered) kept
/// on uninstall, the issuer's empty CA Secret and its ConfigMap. One that
/// exists already (a test's own CA) is left as it is. Returns how many of
/// `objs` were such objects.
pub async fn create_chart_ca_objects(
    client: &kube::Client,
    objs: &[serde_json::Value],
) -> Result<usize> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let pp = PostParams::default();
    let mut made = 0;
    for o in objs {
        let kind = o["kind"].as_str().unwrap_or_default();
        let kept = o["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep";
        if !kept || (kind != "Secret" && kind != "ConfigMap") {
            continue;
        }
        let ns = o["metadata"]["namespace"].as_str().unwrap_or("kube-system");
        let what = format!("{kind} {ns}/{}", o["metadata"]["name"]);
        let created = if kind == "Secret" {
            Api::<Secret>::namespaced(client.clone(), ns)
                .create(&pp, &serde_json::from_value(o.clone())?)
                .await
                .map(|_| ())
        } else {
            Api::<ConfigMap>::namespaced(client.clone(), ns)
                .create(&pp, &serde_json::from_value(o.clone())?)
                .await
                .map(|_| ())
        };
        match created {
            Ok(()) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(anyhow::Error::new(e).context(what)),
        }
        made += 1;
    }
    Ok(made)
}

/// A kubeconfig that authenticates as the chart's controller
/// ServiceAccount (a client certificate of its user name and group), after
/// applying every binding of `objs` (the chart rendered into `kube-system`)
/// that names that ServiceAccount, with the ClusterRole or Role it refers
/// to, so what runs with it has the chart's permissions and no more; and
/// after creating the CA objects the chart makes
/// ([`create_chart_ca_objects`]), which those permissions cannot.
pub async fn as_chart_service_account(
    cluster: &KubeCluster,
    objs: &[serde_json::Value],
    dir: &Path,
) -> Result<PathBuf> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let client = cluster.client();
    let pp = PostParams::default();
    let mut applied = 0;
    for b in objs {
        let kind = b["kind"].as_str().unwrap_or_default();
        if kind != "ClusterRoleBinding" && kind != "RoleBinding" {
            continue;
        }
        let names_controller = b["subjects"].as_array().into_iter().flatten().any(|s| {
            s["kind"] == "ServiceAccount"
                && s["name"] == "carina-controller"
                && s["namespace"] == "kube-system"
        });
        if !names_controller {
            continue;
        }
        let ns = b["metadata"]["namespace"].as_str().unwrap_or("kube-system");
        let role_kind = b["roleRef"]["kind"].as_str().unwrap_or_default();
        let role_name = &b["roleRef"]["name"];
        let role = objs
            .iter()
            .find(|o| o["kind"] == role_kind && o["metadata"]["name"] == *role_name)
            .with_context(|| {
                format!(
                    "{kind} {} refers to no rendered role",
                    b["metadata"]["name"]
                )
            })?;
        if kind == "ClusterRoleBinding" {
            Api::<ClusterRole>::all(client.clone())
                .create(&pp, &serde_json::from_value(role.clone())?)
                .await?;
            Api::<ClusterRoleBinding>::all(client.clone())
                .create(&pp, &serde_json::from_value(b.clone())?)
                .await?;
        } else {
            Api::<Role>::namespaced(client.clone(), ns)
                .create(&pp, &serde_json::from_value(role.clone())?)
                .await?;
            Api::<RoleBinding>::namespaced(client.clone(), ns)
                .create(&pp, &serde_json::from_value(b.clone())?)
                .await?;
        }
        applied += 1;
    }
    anyhow::ensure!(applied > 0, "the chart binds nothing to carina-controller");
    create_chart_ca_objects(&client, objs).await?;
    controller_service_account_kubeconfig(cluster, dir)
}

/// A kubeconfig in `dir` that authenticates as the controller's
/// ServiceAccount in `kube-system` (a client certificate of its user name
/// and group); what it may do is whatever is bound to that account.
pub fn controller_service_account_kubeconfig(cluster: &KubeCluster, dir: &Path) -> Result<PathBuf> {
    let (cert, key) = cluster.write_client_cert(
        dir,
        "carina-controller-sa",
        "system:serviceaccount:kube-system:carina-controller",
        "system:serviceaccounts",
    )?;
    let path = dir.join("carina-controller-sa.kubeconfig");
    cluster.write_kubeconfig(&path, &cert, &key)?;
    Ok(path)
}
