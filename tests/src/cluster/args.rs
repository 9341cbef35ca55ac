//! The command lines of Carina's own processes: `carina-node`
//! ([`NodeArgs`]) and `carina-controller` in kube mode
//! ([`KubeControllerArgs`]) or direct mode ([`direct_controller_args`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::{CertFiles, Pki, Service};
use crate::ports::free_port;

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
