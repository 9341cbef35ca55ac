//! Node identity on a real cluster, without kubelets: the objects a node
//! pod stands for (a namespace, ServiceAccounts, the node DaemonSet, Pods
//! whose `spec.nodeName` is set directly and whose controller reference
//! names that DaemonSet, as its controller would have made them), real
//! TokenRequest tokens bound to those Pods, a
//! client of the issuer, CSRs to send it, `carina-controller` serving the
//! issuer ([`start_controller`], [`controller_argv`]), the arguments of
//! `carina-node` asking it, and the constants the identity tests share.
//!
//! **An expired token.** TokenRequest refuses lifetimes under ten minutes,
//! and a test cannot wait that long. [`expired_copy`] takes a real token,
//! moves its `iat`/`nbf`/`exp` claims into the past and signs it again
//! with the cluster's own service-account key (the file the apiserver was
//! started with): the apiserver then sees a token it issued in every
//! respect but its expiry.

use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use carina_proto::identity::node_identity_client::NodeIdentityClient;
use carina_proto::tls::{client_config_without_cert, connect_with_config};
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    Container, Namespace, Pod, PodSpec, PodTemplateSpec, ServiceAccount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::api::{Api, ObjectMeta, PostParams};
use rcgen::{CertificateParams, KeyPair, SanType, SigningKey};
use tonic::transport::Channel;

use crate::cluster::Service;
use crate::kube::KubeCluster;
use crate::unique;

/// The audience the issuer expects by default.
pub const AUDIENCE: &str = "carina.storage.io/node-identity";

/// The node ServiceAccount's name by default.
pub const NODE_SA: &str = "carina-node";

/// The node DaemonSet's name by default.
pub const NODE_DS: &str = "carina-node";

/// The CA Secret and ConfigMap of the issuer (the defaults).
pub const CA: &str = "carina-ca";

/// The node the identity tests issue for.
pub const NODE: &str = "node-a";

/// Bound of every wait of the identity tests for a process or the control
/// plane.
pub const WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// A namespace of node pods, their ServiceAccounts and DaemonSet.
#[derive(Clone)]
pub struct NodePods {
    client: kube::Client,
    pub namespace: String,
    /// The uid of the DaemonSet [`NODE_DS`].
    pub daemonset_uid: String,
}

impl std::fmt::Debug for NodePods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePods")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// A cluster with the CRDs, a namespace (named from `prefix`) holding the
/// node ServiceAccount and DaemonSet, and a scratch directory: what every
/// issuer test starts from.
pub async fn cluster_with_node_pods(
    prefix: &str,
) -> Result<(KubeCluster, NodePods, tempfile::TempDir)> {
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let pods = NodePods::create(&cluster.client(), &unique(prefix)).await?;
    Ok((cluster, pods, tempfile::tempdir()?))
}

impl NodePods {
    /// Creates `namespace`, the ServiceAccount [`NODE_SA`] and the
    /// DaemonSet [`NODE_DS`] in it (no controller runs it).
    pub async fn create(client: &kube::Client, namespace: &str) -> Result<NodePods> {
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(namespace.to_string()),
                        ..ObjectMeta::default()
                    },
                    ..Namespace::default()
                },
            )
            .await
            .with_context(|| format!("create namespace {namespace}"))?;
        let mut pods = NodePods {
            client: client.clone(),
            namespace: namespace.to_string(),
            daemonset_uid: String::new(),
        };
        pods.service_account(NODE_SA).await?;
        pods.daemonset_uid = pods
            .daemonset(NODE_DS)
            .await?
            .metadata
            .uid
            .context("a DaemonSet without uid")?;
        Ok(pods)
    }

    /// Creates DaemonSet `name` of node pods (ServiceAccount [`NODE_SA`]).
    pub async fn daemonset(&self, name: &str) -> Result<DaemonSet> {
        let labels = std::collections::BTreeMap::from([("app".to_string(), name.to_string())]);
        let ds = DaemonSet {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(DaemonSetSpec {
                selector: LabelSelector {
                    match_labels: Some(labels.clone()),
                    ..LabelSelector::default()
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(PodSpec {
                        service_account_name: Some(NODE_SA.into()),
                        containers: vec![Container {
                            name: "carina-node".into(),
                            image: Some("carina-node:test".into()),
                            ..Container::default()
                        }],
                        ..PodSpec::default()
                    }),
                },
                ..DaemonSetSpec::default()
            }),
            ..DaemonSet::default()
        };
        Api::<DaemonSet>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &ds)
            .await
            .with_context(|| format!("create DaemonSet {name}"))
    }

    /// The controller reference the DaemonSet [`NODE_DS`] puts on its pods.
    pub fn node_daemonset_owner(&self) -> OwnerReference {
        owner("apps/v1", "DaemonSet", NODE_DS, &self.daemonset_uid)
    }

    /// Creates ServiceAccount `name` (no RBAC binding).
    pub async fn service_account(&self, name: &str) -> Result<()> {
        Api::<ServiceAccount>::namespaced(self.client.clone(), &self.namespace)
            .create(
                &PostParams::default(),
                &ServiceAccount {
                    metadata: ObjectMeta {
                        name: Some(name.to_string()),
                        ..ObjectMeta::default()
                    },
                    ..ServiceAccount::default()
                },
            )
            .await
            .with_context(|| format!("create ServiceAccount {name}"))?;
        Ok(())
    }

    /// Creates Pod `name` of ServiceAccount `sa` already bound to `node`
    /// (as the scheduler would have; no kubelet runs it), controlled by the
    /// DaemonSet [`NODE_DS`].
    pub async fn pod(&self, name: &str, sa: &str, node: &str) -> Result<Pod> {
        self.pod_owned(name, sa, node, vec![self.node_daemonset_owner()])
            .await
    }

    /// [`NodePods::pod`] with the owner references `owners`.
    pub async fn pod_owned(
        &self,
        name: &str,
        sa: &str,
        node: &str,
        owners: Vec<OwnerReference>,
    ) -> Result<Pod> {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                owner_references: Some(owners),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                service_account_name: Some(sa.to_string()),
                node_name: Some(node.to_string()),
                containers: vec![Container {
                    name: "carina-node".into(),
                    image: Some("carina-node:test".into()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &pod)
            .await
            .with_context(|| format!("create Pod {name}"))
    }

    /// Deletes Pod `name` at once (grace period 0).
    pub async fn delete_pod(&self, name: &str) -> Result<()> {
        let params = kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..kube::api::DeleteParams::default()
        };
        Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .delete(name, &params)
            .await
            .with_context(|| format!("delete Pod {name}"))?;
        Ok(())
    }

    /// A TokenRequest token of ServiceAccount `sa` for `audiences` (empty:
    /// the apiserver's own), valid ten minutes, bound to `pod` if given.
    pub async fn token(&self, sa: &str, audiences: &[&str], pod: Option<&Pod>) -> Result<String> {
        let bound = pod.map(|p| BoundObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: p.metadata.name.clone(),
            uid: p.metadata.uid.clone(),
        });
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
                expiration_seconds: Some(600),
                bound_object_ref: bound,
            }),
            ..TokenRequest::default()
        };
        let answer = Api::<ServiceAccount>::namespaced(self.client.clone(), &self.namespace)
            .create_token_request(sa, &PostParams::default(), &request)
            .await
            .with_context(|| format!("TokenRequest for {sa}"))?;
        answer
            .status
            .and_then(|s| s.token)
            .filter(|t| !t.is_empty())
            .context("TokenRequest answered no token")
    }
}

/// A controller owner reference (`controller: true`).
pub fn owner(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        ..OwnerReference::default()
    }
}

/// `token` with its lifetime moved ten minutes into the past, signed
/// again with the service-account key `sa_key` (PEM, ECDSA P-256: ES256).
pub fn expired_copy(token: &str, sa_key: &Path) -> Result<String> {
    let [header, payload, _signature] = token.split('.').collect::<Vec<_>>()[..] else {
        bail!("not a JWT: {token}");
    };
    let head: serde_json::Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header)?)?;
    if head["alg"] != "ES256" {
        bail!("expected an ES256 token, got {head}");
    }
    let mut claims: serde_json::Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload)?)?;
    let now = i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs())?;
    claims["iat"] = (now - 1200).into();
    claims["nbf"] = (now - 1200).into();
    claims["exp"] = (now - 600).into();
    let signed = format!(
        "{header}.{}",
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims)?)
    );
    let key = KeyPair::from_pem(&std::fs::read_to_string(sa_key)?)?;
    let der = key.sign(signed.as_bytes())?;
    let raw = ecdsa_der_to_raw(&der, 32)?;
    Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(raw)))
}

/// An ASN.1 `SEQUENCE { r INTEGER, s INTEGER }` ECDSA signature as JWS
/// wants it: `r || s`, each `width` bytes.
fn ecdsa_der_to_raw(der: &[u8], width: usize) -> Result<Vec<u8>> {
    fn integer(input: &[u8]) -> Result<(&[u8], &[u8])> {
        match input {
            [0x02, len, rest @ ..] if rest.len() >= usize::from(*len) => {
                Ok(rest.split_at(usize::from(*len)))
            }
            _ => bail!("not a short DER INTEGER"),
        }
    }
    let body = match der {
        [0x30, len, rest @ ..] if rest.len() == usize::from(*len) => rest,
        _ => bail!("not a short DER SEQUENCE"),
    };
    let (r, rest) = integer(body)?;
    let (s, _) = integer(rest)?;
    let mut out = Vec::with_capacity(2 * width);
    for n in [r, s] {
        let n = &n[n.iter().take_while(|b| **b == 0).count()..];
        if n.len() > width {
            bail!("integer longer than {width} bytes");
        }
        out.extend(std::iter::repeat_n(0, width - n.len()));
        out.extend_from_slice(n);
    }
    Ok(out)
}

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

/// The `ca.crt` and `ca-endorsements.crt` (empty when absent) of the
/// issuer's ConfigMap `name` in `namespace` now.
pub async fn published_files(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<(String, String)> {
    let cm =
        kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), namespace)
            .get(name)
            .await?;
    let data = cm.data.unwrap_or_default();
    Ok((
        data.get("ca.crt").cloned().unwrap_or_default(),
        data.get(carina_proto::anchors::ENDORSEMENTS_KEY)
            .cloned()
            .unwrap_or_default(),
    ))
}

/// Waits (at most `within`) until the issuer's CA certificate is
/// published as `ca.crt` of ConfigMap `name` in `namespace`, and returns it.
pub async fn published_ca(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    within: std::time::Duration,
) -> Result<String> {
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client.clone(), namespace);
    crate::cluster::await_object(&api, name, "published", within, |cm| {
        cm.and_then(|c| c.data.as_ref())
            .is_some_and(|d| d.contains_key("ca.crt"))
    })
    .await?
    .and_then(|cm| cm.data)
    .and_then(|mut d| d.remove("ca.crt"))
    .with_context(|| format!("ConfigMap {namespace}/{name} deleted"))
}

/// The text under `key` of a Secret.
pub fn secret_text(secret: &k8s_openapi::api::core::v1::Secret, key: &str) -> Result<String> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .with_context(|| format!("Secret without {key}"))?;
    Ok(String::from_utf8(bytes.0.clone())?)
}

/// The issuer's CA, from its `kubernetes.io/tls` Secret `name` in
/// `namespace`.
pub async fn issuer_ca(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<carina_proto::devcerts::DevCa> {
    let secret =
        kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), namespace)
            .get(name)
            .await?;
    let (crt, key) = (
        secret_text(&secret, "tls.crt")?,
        secret_text(&secret, "tls.key")?,
    );
    Ok(carina_proto::devcerts::DevCa::from_pem(&crt, &key)?)
}

/// Client credentials of role `controller` signed by `ca`, for node `node`.
pub fn controller_tls(
    ca: &carina_proto::devcerts::DevCa,
    node: &str,
) -> Result<carina_proto::tls::ClientTls> {
    let cert = ca.issue_client(
        carina_proto::tls::DEFAULT_TRUST_DOMAIN,
        "controller",
        carina_proto::devcerts::Validity::days(1),
    )?;
    Ok(carina_proto::tls::ClientTls {
        ca_pem: ca.cert_pem().as_bytes().to_vec(),
        cert_pem: cert.cert_pem.into_bytes(),
        key_pem: cert.key_pem.into_bytes(),
        server_name: node.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_signatures_become_fixed_width() {
        // SEQUENCE { INTEGER 0x00 0x80, INTEGER 0x01 }
        let der = [0x30, 0x07, 0x02, 0x02, 0x00, 0x80, 0x02, 0x01, 0x01];
        let raw = ecdsa_der_to_raw(&der, 4).expect("converts");
        assert_eq!(raw, [0, 0, 0, 0x80, 0, 0, 0, 1]);
        assert!(ecdsa_der_to_raw(&[0x31, 0x00], 4).is_err());
    }
}
