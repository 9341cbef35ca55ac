//! The server side: the rustls `ServerConfig` that requires a client
//! certificate signed by our CA (`WebPkiClientVerifier`), its hot reload
//! when the PEM files change ([`ReloadingServerConfig`]), and the stream
//! of accepted TLS connections tonic serves ([`tls_incoming`]).

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::Stream;
use rustls::server::{WantsServerCert, WebPkiClientVerifier};
use rustls::{ConfigBuilder, ServerConfig, WantsVerifier};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;

use super::{ALPN_H2, TlsError, certs, crypto_provider, key, read, roots};

/// How often [`ReloadingServerConfig`] looks at its files.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// How long a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
    let builder = tls13(provider)?.with_client_cert_verifier(verifier);
    with_cert(builder, cert_pem, key_pem)
}

/// A server config that asks for no client certificate (the node-identity
/// issuer: its callers have none yet and authenticate with a token).
pub fn server_config_without_client_auth(
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<ServerConfig>, TlsError> {
    let builder = tls13(crypto_provider())?.with_no_client_auth();
    with_cert(builder, cert_pem, key_pem)
}

/// A server config builder for TLS 1.3 only.
fn tls13(
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<ConfigBuilder<ServerConfig, WantsVerifier>, TlsError> {
    ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|source| TlsError::Rustls {
            what: "TLS versions",
            source,
        })
}

/// The config `builder` makes with the server's certificate and key,
/// speaking HTTP/2.
fn with_cert(
    builder: ConfigBuilder<ServerConfig, WantsServerCert>,
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = builder
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
                            carina.tls.ca = %files.ca.display(),
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

    /// A config its owner replaces through the returned
    /// [`ServerConfigUpdater`] (a certificate renewed in memory rather than
    /// read from files).
    pub fn updatable(initial: Arc<ServerConfig>) -> (ServerConfigUpdater, Self) {
        let (tx, rx) = watch::channel(initial);
        (ServerConfigUpdater { tx }, ReloadingServerConfig { rx })
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

/// Replaces the config of a [`ReloadingServerConfig::updatable`].
#[derive(Debug)]
pub struct ServerConfigUpdater {
    tx: watch::Sender<Arc<ServerConfig>>,
}

impl ServerConfigUpdater {
    /// New connections use `config` from now on.
    pub fn replace(&self, config: Arc<ServerConfig>) {
        self.tx.send_replace(config);
    }

    /// Completes when every [`ReloadingServerConfig`] clone is gone (no
    /// server uses the config any more).
    pub async fn closed(&self) {
        self.tx.closed().await;
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
                        network.peer.address = %peer,
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
    tracing::info!(network.peer.address = %peer, error = %e, "TLS handshake refused");
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: mpsc::Receiver<T>,
) -> impl Stream<Item = T> + Send + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devcerts::{DevCa, Validity};

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
