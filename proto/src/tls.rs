//! Mutual TLS for NodeStorage: server configuration with hot reload, the
//! client connector, and the caller's role from its certificate.
//!
//! Both sides speak TLS 1.3 only, with the `ring` provider (the one crypto
//! provider of the workspace, see [`crypto_provider`]) and ALPN `h2`.
//!
//! **Server.** [`server_config`] builds a rustls `ServerConfig` from PEM:
//! the node's certificate chain and key, and the CA that must have signed
//! every client certificate (`WebPkiClientVerifier`; a client without a
//! certificate is refused during the handshake). [`ReloadingServerConfig`]
//! holds the current config in a `tokio::sync::watch` channel and polls the
//! three files once a second ([`RELOAD_INTERVAL`]): when the modification
//! time or length of any of them changes, it rebuilds the config. New
//! connections use the newest config; established ones keep theirs. A
//! rebuild that fails (a half-written file, a key that does not match) is
//! logged and the previous config stays in force; the next change is tried
//! again. Polling rather than inotify is deliberate: it sees Kubernetes'
//! symlink swaps of mounted Secrets, editors' rename-on-save and plain
//! rewrites alike, and costs three `stat` calls a second.
//!
//! [`tls_incoming`] turns a `TcpListener` into the stream of established
//! TLS connections tonic serves; handshakes run concurrently, each bounded
//! by a timeout, so a slow client cannot stall accepting.
//!
//! **Client.** [`ClientTls`] holds the CA, the client certificate and key
//! and the name the server must prove (the node name); [`connect`] opens a
//! tonic `Channel` through it.
//!
//! **Roles.** A client's role is the last segment of its certificate's URI
//! SAN `spiffe://<trust-domain>/carina/<role>` ([`role_from_cert`]).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::Stream;
use hyper_util::rt::TokioIo;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tonic::transport::{Channel, Endpoint, Uri};

/// The trust domain of client SPIFFE IDs unless configured otherwise.
pub const DEFAULT_TRUST_DOMAIN: &str = "carina.storage.io";

/// How often [`ReloadingServerConfig`] looks at its files.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// How long a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The ALPN protocol of gRPC.
const ALPN_H2: &[u8] = b"h2";

/// Errors from loading TLS material or connecting.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// PEM text holds no usable certificate or key.
    #[error("{what}: {reason}")]
    Pem { what: &'static str, reason: String },
    /// rustls rejected the material (a key that does not match the
    /// certificate, an unsupported key type, ...).
    #[error("{what}: {source}")]
    Rustls {
        what: &'static str,
        #[source]
        source: rustls::Error,
    },
    /// The certificate verifier could not be built from the CA.
    #[error("{what}: {source}")]
    Verifier {
        what: &'static str,
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
    /// The expected server name is neither a DNS name nor an IP address.
    #[error("invalid server name {name:?}: {reason}")]
    ServerName { name: String, reason: String },
    /// The endpoint is not `host:port` or `https://host:port`.
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    /// The connection could not be established (TCP, TLS or HTTP/2).
    #[error("connect to {endpoint}: {source}")]
    Connect {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// The crypto provider every TLS config of the workspace is built with.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(pem: &[u8], what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what,
            reason: "no PEM certificate found".into(),
        });
    }
    Ok(certs)
}

fn key(pem: &[u8], what: &'static str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsError::Pem {
        what,
        reason: e.to_string(),
    })
}

fn roots(ca_pem: &[u8]) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certs(ca_pem, "CA certificate")? {
        roots.add(cert).map_err(|source| TlsError::Rustls {
            what: "CA certificate",
            source,
        })?;
    }
    Ok(Arc::new(roots))
}

/// A server config that requires a client certificate signed by `ca_pem`.
pub fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    ca_pem: &[u8],
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = crypto_provider();
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca_pem)?, provider.clone())
        .build()
        .map_err(|source| TlsError::Verifier {
            what: "client certificate verifier",
            source,
        })?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|source| TlsError::Rustls {
            what: "TLS versions",
            source,
        })?
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            certs(cert_pem, "server certificate")?,
            key(key_pem, "server key")?,
        )
        .map_err(|source| TlsError::Rustls {
            what: "server certificate and key",
            source,
        })?;
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

/// Where a server's PEM files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// The node's certificate (chain), DNS SAN = node name.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The CA that signs client certificates.
    pub ca: PathBuf,
}

impl ServerTlsFiles {
    /// Reads the three files and builds a config.
    pub fn load(&self) -> Result<Arc<ServerConfig>, TlsError> {
        server_config(&read(&self.cert)?, &read(&self.key)?, &read(&self.ca)?)
    }

    /// Modification time and length of each file; a change of either means
    /// "reload". A file that cannot be stat'ed counts as its own state.
    fn fingerprint(&self) -> [Option<(SystemTime, u64)>; 3] {
        [&self.cert, &self.key, &self.ca].map(|p| {
            std::fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())))
        })
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The server config in force, replaced when its files change.
///
/// Cheap to clone; clones see the same updates. The poller stops when the
/// last clone is dropped.
#[derive(Debug, Clone)]
pub struct ReloadingServerConfig {
    rx: watch::Receiver<Arc<ServerConfig>>,
}

impl ReloadingServerConfig {
    /// Loads `files` (an error here is fatal: there is nothing to serve
    /// with) and starts polling them every `interval` on the current tokio
    /// runtime.
    pub fn watch(files: ServerTlsFiles, interval: Duration) -> Result<Self, TlsError> {
        let mut seen = files.fingerprint();
        let (tx, rx) = watch::channel(files.load()?);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = tick.tick() => {}
                }
                let now = files.fingerprint();
                if now == seen {
                    continue;
                }
                seen = now;
                match files.load() {
                    Ok(config) => {
                        tracing::info!(
                            tls.cert = %files.cert.display(),
                            tls.ca = %files.ca.display(),
                            "TLS certificate, key or CA changed: new connections use the new ones"
                        );
                        tx.send_replace(config);
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        "TLS files changed but cannot be loaded; keeping the previous ones"
                    ),
                }
            }
        });
        Ok(ReloadingServerConfig { rx })
    }

    /// A config that never changes.
    pub fn fixed(config: Arc<ServerConfig>) -> Self {
        let (_tx, rx) = watch::channel(config);
        ReloadingServerConfig { rx }
    }

    /// The config new connections get.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.rx.borrow().clone()
    }

    /// Waits until a new config is in force. Returns at once if one arrived
    /// since the last call; never returns for a [`fixed`](Self::fixed)
    /// config.
    pub async fn changed(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// A server-side TLS connection over TCP, as tonic serves it (its
/// `Connected` impl exposes the peer certificates to handlers).
pub type ServerTlsStream = tokio_rustls::server::TlsStream<TcpStream>;

/// Accepts connections on `listener` and completes their handshakes with
/// the config in force at accept time. Failed handshakes are logged and
/// dropped; the stream ends (and the listener closes) when the consumer
/// drops it.
pub fn tls_incoming(
    listener: TcpListener,
    tls: ReloadingServerConfig,
    handshake_timeout: Duration,
) -> impl Stream<Item = Result<ServerTlsStream, io::Error>> + Send + 'static {
    let (tx, rx) = mpsc::channel::<Result<ServerTlsStream, io::Error>>(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of
                    // spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let acceptor = TlsAcceptor::from(tls.current());
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => log_handshake_failure(peer, &e),
                    Err(_) => tracing::info!(
                        net.peer = %peer,
                        timeout = ?handshake_timeout,
                        "TLS handshake timed out"
                    ),
                }
            });
        }
    });
    tokio_stream_from(rx)
}

fn log_handshake_failure(peer: SocketAddr, e: &io::Error) {
    tracing::info!(net.peer = %peer, error = %e, "TLS handshake refused");
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: mpsc::Receiver<T>,
) -> impl Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// What a client needs to reach one node: the CA that signed the node's
/// certificate, its own certificate and key, and the node name the server
/// certificate must carry.
#[derive(Clone)]
pub struct ClientTls {
    pub ca_pem: Vec<u8>,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    /// The DNS name (or IP address) the server certificate must carry:
    /// the node name.
    pub server_name: String,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Reads the CA, certificate and key from files.
    pub fn from_files(
        ca: &Path,
        cert: &Path,
        key: &Path,
        server_name: impl Into<String>,
    ) -> Result<ClientTls, TlsError> {
        Ok(ClientTls {
            ca_pem: read(ca)?,
            cert_pem: read(cert)?,
            key_pem: read(key)?,
            server_name: server_name.into(),
        })
    }

    /// The same credentials for another node.
    pub fn for_server(&self, server_name: impl Into<String>) -> ClientTls {
        ClientTls {
            server_name: server_name.into(),
            ..self.clone()
        }
    }

    /// TLS 1.3, the server verified against the CA, our certificate offered.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let mut config = client_builder(&self.ca_pem)?
            .with_client_auth_cert(
                certs(&self.cert_pem, "client certificate")?,
                key(&self.key_pem, "client key")?,
            )
            .map_err(|source| TlsError::Rustls {
                what: "client certificate and key",
                source,
            })?;
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(Arc::new(config))
    }
}

/// A client config that verifies the server against `ca_pem` but offers no
/// certificate of its own (the server refuses it; for tests and probes).
pub fn client_config_without_cert(ca_pem: &[u8]) -> Result<Arc<ClientConfig>, TlsError> {
    let mut config = client_builder(ca_pem)?.with_no_client_auth();
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

fn client_builder(
    ca_pem: &[u8],
) -> Result<rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert>, TlsError> {
    let provider = crypto_provider();
    let verifier = WebPkiServerVerifier::builder_with_provider(roots(ca_pem)?, provider.clone())
        .build()
        .map_err(|source| TlsError::Verifier {
            what: "server certificate verifier",
            source,
        })?;
    Ok(ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|source| TlsError::Rustls {
            what: "TLS versions",
            source,
        })?
        .dangerous()
        // Not dangerous: this is the standard WebPKI verifier, only with
        // our CA as the sole root instead of the system's.
        .with_custom_certificate_verifier(verifier))
}

/// Opens a channel to `endpoint` (`host:port` or `https://host:port`) over
/// mutual TLS. The connection is made now, so an unreachable node or a
/// server certificate that does not name `tls.server_name` fails here.
/// (A server that refuses *our* certificate does so after the TLS 1.3
/// handshake completes; that shows as `UNAVAILABLE` on the first call.)
///
/// Wrap the channel with [`crate::trace::traced`] to propagate the caller's
/// trace.
pub async fn connect(endpoint: &str, tls: &ClientTls) -> Result<Channel, TlsError> {
    connect_with_config(endpoint, &tls.server_name, tls.client_config()?).await
}

/// [`connect`] with a ready-made rustls config.
pub async fn connect_with_config(
    endpoint: &str,
    server_name: &str,
    config: Arc<ClientConfig>,
) -> Result<Channel, TlsError> {
    let (endpoint, uri) = parse_endpoint(endpoint)?;
    let server_name =
        ServerName::try_from(server_name.to_string()).map_err(|e| TlsError::ServerName {
            name: server_name.to_string(),
            reason: e.to_string(),
        })?;
    let connector = TlsConnector::from(config);
    let connect = tower::service_fn(move |uri: Uri| {
        let connector = connector.clone();
        let server_name = server_name.clone();
        async move {
            let host = uri.host().unwrap_or_default();
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = uri.port_u16().unwrap_or(443);
            let tcp = TcpStream::connect((host, port)).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(server_name, tcp).await?;
            Ok::<_, io::Error>(TokioIo::new(tls))
        }
    });
    Endpoint::from(uri)
        .connect_timeout(Duration::from_secs(10))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true)
        .connect_with_connector(connect)
        .await
        .map_err(|source| TlsError::Connect { endpoint, source })
}

/// `host:port` or `https://host:port` → the endpoint for messages and the
/// URI tonic dials. The scheme tonic sees is `http`: TLS is done by our
/// connector, not by tonic.
fn parse_endpoint(endpoint: &str) -> Result<(String, Uri), TlsError> {
    let bad = |reason: &str| TlsError::Endpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let rest = match endpoint.split_once("://") {
        Some(("https", rest)) => rest,
        Some((scheme, _)) => {
            return Err(bad(&format!(
                "scheme {scheme:?}: NodeStorage is served over TLS only (use https:// or host:port)"
            )));
        }
        None => endpoint,
    };
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains('/') {
        return Err(bad("expected host:port"));
    }
    let uri: Uri = format!("http://{rest}")
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad(&e.to_string()))?;
    if uri.port_u16().is_none() {
        return Err(bad("missing port"));
    }
    Ok((endpoint.to_string(), uri))
}

/// What a client certificate allows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Role {
    /// May call every RPC.
    Controller,
    /// May call the read RPCs only.
    Reader,
    /// A role this version does not know: may call nothing.
    Other(String),
}

impl Role {
    /// The role named by a SPIFFE path segment.
    pub fn from_name(name: &str) -> Role {
        match name {
            "controller" => Role::Controller,
            "reader" => Role::Reader,
            other => Role::Other(other.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Role::Controller => "controller",
            Role::Reader => "reader",
            Role::Other(name) => name,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `spiffe://<trust_domain>/carina/<role>`.
pub fn spiffe_id(trust_domain: &str, role: &str) -> String {
    format!("spiffe://{trust_domain}/carina/{role}")
}

/// Why no role could be read from a certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoleError {
    #[error("cannot parse the client certificate: {0}")]
    Parse(String),
    #[error(
        "the client certificate has no URI SAN spiffe://{trust_domain}/carina/<role> (URIs found: {found:?})"
    )]
    NoRole {
        trust_domain: String,
        found: Vec<String>,
    },
    #[error("the client certificate names more than one role: {found:?}")]
    Ambiguous { found: Vec<String> },
}

/// The role a SPIFFE ID grants in `trust_domain`, or `None` when the URI
/// is not `spiffe://<trust_domain>/carina/<role>` (another scheme, trust
/// domain or path, an empty role, a query or fragment).
pub fn role_from_uri(uri: &str, trust_domain: &str) -> Option<Role> {
    let rest = uri.strip_prefix("spiffe://")?;
    let (domain, path) = rest.split_once('/')?;
    if !domain.eq_ignore_ascii_case(trust_domain) {
        return None;
    }
    let role = path.strip_prefix("carina/")?;
    let valid = !role.is_empty()
        && role
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    valid.then(|| Role::from_name(role))
}

/// The role of a DER client certificate in `trust_domain`. Exactly one
/// distinct role must be named.
pub fn role_from_cert(cert_der: &[u8], trust_domain: &str) -> Result<Role, RoleError> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der)
        .map_err(|e| RoleError::Parse(e.to_string()))?;
    let sans = cert
        .subject_alternative_name()
        .map_err(|e| RoleError::Parse(e.to_string()))?;
    let uris: Vec<&str> = sans
        .iter()
        .flat_map(|ext| ext.value.general_names.iter())
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some(*u),
            _ => None,
        })
        .collect();
    let mut roles: Vec<Role> = uris
        .iter()
        .filter_map(|u| role_from_uri(u, trust_domain))
        .collect();
    roles.dedup();
    match roles.len() {
        1 => Ok(roles.remove(0)),
        0 => Err(RoleError::NoRole {
            trust_domain: trust_domain.to_string(),
            found: uris.iter().map(|u| u.to_string()).collect(),
        }),
        _ => Err(RoleError::Ambiguous {
            found: roles.iter().map(|r| r.to_string()).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devcerts::{DevCa, Validity};

    #[test]
    fn roles_from_uris() {
        let td = "carina.storage.io";
        let cases = [
            (
                "spiffe://carina.storage.io/carina/controller",
                Some(Role::Controller),
            ),
            (
                "spiffe://carina.storage.io/carina/reader",
                Some(Role::Reader),
            ),
            (
                "spiffe://carina.storage.io/carina/admin",
                Some(Role::Other("admin".into())),
            ),
            (
                "spiffe://CARINA.storage.io/carina/reader",
                Some(Role::Reader),
            ),
            ("spiffe://other.example/carina/controller", None),
            ("spiffe://carina.storage.io/other/controller", None),
            ("spiffe://carina.storage.io/carina/", None),
            ("spiffe://carina.storage.io/carina/reader/x", None),
            ("spiffe://carina.storage.io/carina/reader?x=1", None),
            ("https://carina.storage.io/carina/controller", None),
            ("spiffe://carina.storage.io", None),
        ];
        for (uri, want) in cases {
            assert_eq!(role_from_uri(uri, td), want, "{uri}");
        }
    }

    #[test]
    fn role_errors_say_what_was_found() {
        let ca = DevCa::new("ca", Validity::days(1)).expect("CA");
        let other_td = ca
            .issue_client("other.example", "controller", Validity::days(1))
            .expect("client");
        let der = CertificateDer::from_pem_slice(other_td.cert_pem.as_bytes()).expect("PEM");
        let err = role_from_cert(&der, DEFAULT_TRUST_DOMAIN).expect_err("foreign trust domain");
        assert!(
            err.to_string()
                .contains("spiffe://other.example/carina/controller"),
            "{err}"
        );
        let server = ca
            .issue_server("node-a", &[], &[], Validity::days(1))
            .expect("server");
        let der = CertificateDer::from_pem_slice(server.cert_pem.as_bytes()).expect("PEM");
        assert!(matches!(
            role_from_cert(&der, DEFAULT_TRUST_DOMAIN),
            Err(RoleError::NoRole { .. })
        ));
        assert!(matches!(
            role_from_cert(b"not a certificate", DEFAULT_TRUST_DOMAIN),
            Err(RoleError::Parse(_))
        ));
    }

    #[test]
    fn endpoints() {
        let ok = |e: &str| parse_endpoint(e).expect(e).1.to_string();
        assert_eq!(ok("127.0.0.1:7443"), "http://127.0.0.1:7443/");
        assert_eq!(ok("https://node-a:7443"), "http://node-a:7443/");
        assert_eq!(ok("https://[::1]:7443/"), "http://[::1]:7443/");
        for bad in ["http://a:1", "a", "https://a", "https://a:1/path", ""] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn configs_build_from_dev_certificates() {
        let ca = DevCa::new("ca", Validity::days(1)).expect("CA");
        let server = ca
            .issue_server("node-a", &[], &[], Validity::days(1))
            .expect("server");
        let config = server_config(
            server.cert_pem.as_bytes(),
            server.key_pem.as_bytes(),
            ca.cert_pem().as_bytes(),
        )
        .expect("server config");
        assert_eq!(config.alpn_protocols, vec![b"h2".to_vec()]);
        let mismatched = server_config(
            server.cert_pem.as_bytes(),
            ca.key_pem().as_bytes(),
            ca.cert_pem().as_bytes(),
        );
        assert!(mismatched.is_err(), "a key that does not match is refused");
        let client = ca
            .issue_client(DEFAULT_TRUST_DOMAIN, "reader", Validity::days(1))
            .expect("client");
        let tls = ClientTls {
            ca_pem: ca.cert_pem().as_bytes().to_vec(),
            cert_pem: client.cert_pem.into_bytes(),
            key_pem: client.key_pem.into_bytes(),
            server_name: "node-a".into(),
        };
        tls.client_config().expect("client config");
        let empty = server_config(b"", b"", b"").expect_err("nothing to load");
        assert!(empty.to_string().contains("no PEM certificate"), "{empty}");
    }

    #[tokio::test]
    async fn reload_follows_the_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = DevCa::new("ca", Validity::days(1)).expect("CA");
        let write = |name: &str| {
            let c = ca
                .issue_server(name, &[], &[], Validity::days(1))
                .expect("server");
            std::fs::write(dir.path().join("tls.crt"), &c.cert_pem).expect("write");
            std::fs::write(dir.path().join("tls.key"), &c.key_pem).expect("write");
        };
        write("node-a");
        std::fs::write(dir.path().join("ca.crt"), ca.cert_pem()).expect("write");
        let files = ServerTlsFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            ca: dir.path().join("ca.crt"),
        };
        let mut reloading =
            ReloadingServerConfig::watch(files, Duration::from_millis(20)).expect("loads");
        let before = reloading.current();
        // A broken key keeps the old config in force.
        std::fs::write(dir.path().join("tls.key"), "garbage").expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(Arc::ptr_eq(&before, &reloading.current()));
        write("node-b");
        tokio::time::timeout(Duration::from_secs(10), reloading.changed())
            .await
            .expect("reloaded");
        assert!(!Arc::ptr_eq(&before, &reloading.current()));
    }
}
