//! Talking to the issuer: CSRs to send it, a client that verifies it as
//! a node does, one `IssueCertificate` call, and `carina-controller`
//! serving it ([`start_controller`], [`controller_argv`]).

use std::path::Path;

use anyhow::{Context, Result};
use carina_proto::identity::node_identity_client::NodeIdentityClient;
use carina_proto::tls::{client_config_without_cert, connect_with_config};
use rcgen::{CertificateParams, KeyPair, SanType};
use tonic::transport::Channel;

use super::NodePods;
use crate::cluster::Service;
use crate::kube::KubeCluster;
use crate::unique;

/// A CSR for `node` after `change` edits its parameters (by default:
/// DNS SAN `node` only), PEM.
pub fn csr(node: &str, change: impl FnOnce(&mut CertificateParams)) -> Result<String> {
    let mut params = CertificateParams::default();
    params.subject_alt_names = vec![SanType::DnsName(node.to_string().try_into()?)];
    change(&mut params);
    Ok(params.serialize_request(&KeyPair::generate()?)?.pem()?)
}

/// A client of the issuer at `https://localhost:<port>`, verifying it
/// against `ca_pem` and offering no certificate, as a node does.
pub async fn issuer_client(port: u16, ca_pem: &[u8]) -> Result<NodeIdentityClient<Channel>> {
    let config = client_config_without_cert(ca_pem)?;
    let channel = connect_with_config(&format!("https://localhost:{port}"), "localhost", config)
        .await
        .context("connect to the issuer")?;
    Ok(NodeIdentityClient::new(channel))
}

/// `carina-controller --mode kube` serving the issuer on `127.0.0.1:<port>`
/// (certificate names include `localhost`), CA in `namespace`, its own
/// client certificate from the CA, certificates valid `ttl`, a short
/// Lease for tests.
pub fn controller_argv(
    kubeconfig: &Path,
    csi_socket: &Path,
    namespace: &str,
    port: u16,
    ttl: &str,
) -> Vec<String> {
    [
        "--mode=kube".to_string(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--csi-endpoint={}", csi_socket.display()),
        format!("--namespace={namespace}"),
        format!("--leader-election-namespace={namespace}"),
        "--identity=controller-0".to_string(),
        format!("--identity-listen=127.0.0.1:{port}"),
        "--identity-server-names=localhost".to_string(),
        format!("--identity-cert-ttl={ttl}"),
        "--lease-duration-secs=4".to_string(),
        "--renew-deadline-secs=3".to_string(),
        "--retry-period-secs=1".to_string(),
        "--node-call-timeout-secs=10".to_string(),
        "--shutdown-grace-secs=5".to_string(),
    ]
    .into()
}

/// `carina-controller` serving the issuer on `port` for the node pods of
/// `pods` ([`controller_argv`]), certificates valid `ttl`, with `extra`
/// flags; its socket in `dir`, its log in the cluster's log directory.
pub async fn start_controller(
    cluster: &KubeCluster,
    pods: &NodePods,
    dir: &Path,
    port: u16,
    ttl: &str,
    extra: &[&str],
) -> Result<Service> {
    let socket = dir.join(format!("{}.sock", unique("controller")));
    let mut argv = controller_argv(
        cluster.kubeconfig_path(),
        &socket,
        &pods.namespace,
        port,
        ttl,
    );
    argv.extend(extra.iter().map(|a| a.to_string()));
    let log = cluster
        .log_dir()
        .join(format!("{}.log", unique("carina-controller")));
    Service::start(
        "carina-controller",
        "carina-controller",
        argv,
        &socket,
        &log,
    )
    .await
}

/// One `IssueCertificate` call; the refusal it got, if any.
pub async fn ask(
    port: u16,
    ca: &str,
    node: &str,
    csr_pem: String,
    token: &str,
) -> Result<std::result::Result<(), tonic::Status>> {
    let mut issuer = issuer_client(port, ca.as_bytes()).await?;
    let answer = issuer
        .issue_certificate(carina_proto::identity::IssueCertificateRequest {
            node_name: node.to_string(),
            csr_pem,
            token: token.to_string(),
        })
        .await;
    Ok(answer.map(|_| ()))
}
