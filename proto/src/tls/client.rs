//! The client side: [`ClientTls`] (the CA, our certificate and key, the
//! node name the server must prove), the rustls `ClientConfig` built from
//! it, and [`connect`], which opens a tonic `Channel` over mutual TLS.

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tonic::transport::{Channel, Endpoint, Uri};

use super::{ALPN_H2, LiveClientCert, TlsError, certs, crypto_provider, key, read, roots};

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

    /// [`client_config`](Self::client_config), but offering at each
    /// handshake the certificate `live` holds then (renewed in place);
    /// `cert_pem` and `key_pem` are not used.
    pub fn client_config_live(&self, live: &LiveClientCert) -> Result<Arc<ClientConfig>, TlsError> {
        let mut config =
            client_builder(&self.ca_pem)?.with_client_cert_resolver(Arc::new(live.clone()));
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

#[cfg(test)]
mod tests {
    use super::*;
    use carina_sys::testkit::{mutated_text, noisy_text};
    use proptest::prelude::*;

    proptest! {
        /// An endpoint of any text is refused or dialled as `http://`
        /// with a port, its authority taken unchanged from the input.
        #[test]
        fn endpoints_of_any_text(
            endpoint in prop_oneof![
                noisy_text(),
                mutated_text("https://node-a.example:7443/"),
                mutated_text("[::1]:7443"),
            ],
        ) {
            if let Ok((text, uri)) = parse_endpoint(&endpoint) {
                prop_assert_eq!(text, endpoint.clone());
                prop_assert_eq!(uri.scheme_str(), Some("http"));
                prop_assert!(uri.port_u16().is_some());
                let authority = uri.authority().expect("an authority").as_str();
                prop_assert!(endpoint.contains(authority), "{:?} {:?}", endpoint, authority);
            }
        }
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
}
