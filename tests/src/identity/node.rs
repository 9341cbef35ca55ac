//! One `carina-node` asking the issuer for its certificate: its files,
//! ports and arguments ([`IssuedNode`]), and the certificate it serves
//! ([`served_cert`], [`wait_served`]).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::cluster::Service;
use crate::kube::KubeCluster;
use crate::unique;

/// Files and ports of one `carina-node` asking the issuer for its
/// certificate.
#[derive(Debug, Clone)]
pub struct IssuedNode {
    pub name: String,
    pub port: u16,
    pub metrics_port: u16,
    pub csi_socket: PathBuf,
    pub token_file: PathBuf,
    /// `ca.crt` of the mounted CA ConfigMap; its `ca-endorsements.crt`
    /// beside it.
    pub ca_file: PathBuf,
    /// `--state-dir` (where the trusted CA bundle is pinned).
    pub state_dir: PathBuf,
}

impl IssuedNode {
    /// Node `name` with its files in `dir` and free ports.
    pub fn new(name: &str, dir: &Path) -> Result<IssuedNode> {
        std::fs::create_dir_all(dir.join("ca"))?;
        Ok(IssuedNode {
            name: name.to_string(),
            port: crate::cluster::free_port()?,
            metrics_port: crate::cluster::free_port()?,
            csi_socket: dir.join("csi.sock"),
            token_file: dir.join("token"),
            ca_file: dir.join("ca").join("ca.crt"),
            state_dir: dir.join("state"),
        })
    }

    /// Writes the CA ConfigMap's files as kubelet mounts them: `ca.crt`
    /// and `ca-endorsements.crt` (empty when absent), replaced at once.
    pub fn write_ca(&self, ca_pem: &str, endorsements_pem: &str) -> Result<()> {
        let dir = self
            .ca_file
            .parent()
            .context("the CA file has no directory")?;
        std::fs::create_dir_all(dir)?;
        for (name, text) in [
            ("ca.crt", ca_pem),
            (carina_proto::anchors::ENDORSEMENTS_KEY, endorsements_pem),
        ] {
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, text)?;
            std::fs::rename(&tmp, dir.join(name))?;
        }
        Ok(())
    }

    /// `127.0.0.1:<port>`, NodeStorage.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Starts `carina-node` as this node asking the issuer on
    /// `issuer_port` ([`IssuedNode::argv`]), its log a new file in the
    /// cluster's log directory, and waits for its CSI socket.
    pub async fn start(&self, cluster: &KubeCluster, issuer_port: u16) -> Result<Service> {
        let log = cluster
            .log_dir()
            .join(format!("{}.log", unique("carina-node")));
        Service::start(
            "carina-node",
            &self.name,
            self.argv(issuer_port),
            &self.csi_socket,
            &log,
        )
        .await
    }

    /// Its arguments, asking the issuer at `https://localhost:<issuer_port>`.
    pub fn argv(&self, issuer_port: u16) -> Vec<String> {
        [
            format!("--node-name={}", self.name),
            format!("--listen={}", self.endpoint()),
            format!("--metrics-listen=127.0.0.1:{}", self.metrics_port),
            format!("--csi-endpoint={}", self.csi_socket.display()),
            format!("--identity-issuer=https://localhost:{issuer_port}"),
            format!("--identity-token-file={}", self.token_file.display()),
            format!("--tls-ca={}", self.ca_file.display()),
            format!("--state-dir={}", self.state_dir.display()),
            "--lvm-shell=false".to_string(),
            "--shutdown-grace-secs=5".to_string(),
        ]
        .into()
    }
}

/// How long [`wait_served`] waits.
pub const SERVED_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// The certificate a new TLS connection to `endpoint` is served (DER).
pub async fn served_cert(endpoint: &str, tls: &carina_proto::tls::ClientTls) -> Result<Vec<u8>> {
    let connector = tokio_rustls::TlsConnector::from(tls.client_config()?);
    let tcp = tokio::net::TcpStream::connect(endpoint).await?;
    let name = rustls::pki_types::ServerName::try_from(tls.server_name.clone())?;
    let stream = connector.connect(name, tcp).await?;
    let certs = stream
        .get_ref()
        .1
        .peer_certificates()
        .context("no certificate")?;
    Ok(certs.first().context("empty chain")?.to_vec())
}

/// Waits until `endpoint` serves a certificate that `accept`s, the node
/// process alive all along.
pub async fn wait_served(
    node: &mut crate::cluster::Service,
    endpoint: &str,
    tls: &carina_proto::tls::ClientTls,
    what: &str,
    accept: impl Fn(&[u8]) -> bool,
) -> Result<Vec<u8>> {
    let deadline = Instant::now() + SERVED_WITHIN;
    loop {
        node.check_running()?;
        let last = match served_cert(endpoint, tls).await {
            Ok(der) if accept(&der) => return Ok(der),
            Ok(_) => "the same certificate".to_string(),
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() > deadline {
            bail!(
                "{what}: not within {SERVED_WITHIN:?} ({last}); node log:\n{}",
                crate::process::tail(node.log(), 40)
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
