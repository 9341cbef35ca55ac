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
//! **Renewed in memory.** A certificate issued by the control plane is
//! never a file: [`ReloadingServerConfig::updatable`] hands its owner a
//! [`ServerConfigUpdater`] to swap the server config, and a client offers
//! a [`LiveClientCert`] that is replaced in place
//! ([`ClientTls::client_config_live`]).
//!
//! **Roles.** A client's role is the last segment of its certificate's URI
//! SAN `spiffe://<trust-domain>/carina/<role>` ([`role_from_cert`]).
//!
//! This file holds what both sides share: the errors, the crypto provider
//! and PEM loading. The server lives in `server.rs`, the client in
//! `client.rs`, the renewed client certificate in `live.rs`, roles in
//! `roles.rs`; everything public is re-exported
//! here, so callers name `carina_proto::tls::X`.

mod client;
mod live;
mod roles;
mod server;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use client::{ClientTls, client_config_without_cert, connect, connect_with_config};
pub use live::LiveClientCert;
pub use roles::{DEFAULT_TRUST_DOMAIN, Role, RoleError, role_from_cert, role_from_uri, spiffe_id};
pub use server::{
    HANDSHAKE_TIMEOUT, RELOAD_INTERVAL, ReloadingServerConfig, ServerConfigUpdater, ServerTlsFiles,
    ServerTlsStream, server_config, server_config_without_client_auth, tls_incoming,
};

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

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devcerts::{DevCa, Validity};

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
}
