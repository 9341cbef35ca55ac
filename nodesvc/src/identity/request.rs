//! One certificate request to the issuer: a new key and a CSR for the
//! node name ([`new_key_and_csr`]), the token read fresh from its file
//! (kubelet rotates it), and the `IssueCertificate` call over TLS that
//! verifies the issuer against the trusted CA bundle
//! ([`request_certificate`]).

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use carina_proto::identity::IssueCertificateRequest;
use carina_proto::identity::node_identity_client::NodeIdentityClient;
use carina_proto::tls::{TlsError, client_config_without_cert, connect_with_config};
use carina_proto::trace::traced;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};

/// How long one call to the issuer may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a request did not bring a certificate.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("read the token {path}: {source}")]
    Token {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the token file {path} is empty")]
    EmptyToken { path: String },
    #[error("no trusted CA yet: {0}")]
    Ca(String),
    #[error("make a key and CSR: {0}")]
    Csr(#[source] rcgen::Error),
    #[error("issuer {issuer}: {reason}")]
    Issuer { issuer: String, reason: String },
    #[error("reach the issuer: {0}")]
    Connect(#[source] TlsError),
    #[error("the issuer did not answer within {CALL_TIMEOUT:?}")]
    Timeout,
    /// The issuer answered with a refusal (or another error status).
    #[error("the issuer refused: {} {}", carina_proto::code_name(.0.code()), .0.message())]
    Refused(tonic::Status),
    #[error("the issuer's answer is unusable: {0}")]
    Answer(String),
}

/// A certificate the issuer signed, with our key.
#[derive(Clone)]
pub struct IssuedCert {
    /// Leaf first, then the CA chain, PEM.
    pub chain_pem: String,
    pub key_pem: String,
    pub not_after: SystemTime,
    /// When it arrived (renewal is timed from here).
    pub received: SystemTime,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl IssuedCert {
    /// Two thirds into the lifetime left when it arrived.
    pub fn renew_at(&self) -> SystemTime {
        let life = self
            .not_after
            .duration_since(self.received)
            .unwrap_or_default();
        self.received + life.mul_f64(2.0 / 3.0)
    }
}

/// A new ECDSA P-256 key and a CSR for `node_name` (its DNS SAN and common
/// name, nothing else): `(csr_pem, key_pem)`.
pub fn new_key_and_csr(node_name: &str) -> Result<(String, String), rcgen::Error> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, node_name);
    params.distinguished_name = dn;
    params.subject_alt_names = vec![SanType::DnsName(node_name.to_string().try_into()?)];
    let csr = params.serialize_request(&key)?.pem()?;
    Ok((csr, key.serialize_pem()))
}

/// The host of `https://host:port` (or `host:port`): the name the issuer's
/// certificate must carry.
pub fn issuer_host(issuer: &str) -> Result<String, RequestError> {
    let bad = |reason: &str| RequestError::Issuer {
        issuer: issuer.to_string(),
        reason: reason.to_string(),
    };
    let rest = match issuer.split_once("://") {
        Some(("https", rest)) => rest,
        Some(_) => return Err(bad("the issuer is served over TLS: use https://host:port")),
        None => issuer,
    };
    let rest = rest.trim_end_matches('/');
    let host = match rest.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map(|(h, _)| h),
        None => rest.rsplit_once(':').map(|(h, _)| h),
    };
    match host {
        Some(h) if !h.is_empty() => Ok(h.to_string()),
        _ => Err(bad("expected https://host:port")),
    }
}

/// Where the issuer is, what the node sends it, and the CA bundle that
/// verifies it.
#[derive(Debug, Clone)]
pub struct IssuerTarget<'a> {
    pub issuer: &'a str,
    pub node_name: &'a str,
    pub token_file: &'a Path,
    pub ca_pem: &'a str,
}

/// Asks the issuer once for a certificate with a new key.
pub async fn request_certificate(target: &IssuerTarget<'_>) -> Result<IssuedCert, RequestError> {
    let token_path = target.token_file.display().to_string();
    let token = tokio::fs::read_to_string(target.token_file)
        .await
        .map_err(|source| RequestError::Token {
            path: token_path.clone(),
            source,
        })?;
    if token.trim().is_empty() {
        return Err(RequestError::EmptyToken { path: token_path });
    }
    let host = issuer_host(target.issuer)?;
    let config =
        client_config_without_cert(target.ca_pem.as_bytes()).map_err(RequestError::Connect)?;
    let (csr_pem, key_pem) = new_key_and_csr(target.node_name).map_err(RequestError::Csr)?;
    let call = async {
        let channel = connect_with_config(target.issuer, &host, config)
            .await
            .map_err(RequestError::Connect)?;
        NodeIdentityClient::new(traced(channel))
            .issue_certificate(IssueCertificateRequest {
                node_name: target.node_name.to_string(),
                csr_pem,
                token: token.trim().to_string(),
            })
            .await
            .map_err(RequestError::Refused)
    };
    let answer = tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .map_err(|_| RequestError::Timeout)??
        .into_inner();
    let not_after = answer
        .not_after
        .and_then(|t| {
            let secs = u64::try_from(t.seconds).ok()?;
            Some(UNIX_EPOCH + Duration::from_secs(secs))
        })
        .ok_or_else(|| RequestError::Answer("no not_after".into()))?;
    if answer.certificate_chain_pem.trim().is_empty() {
        return Err(RequestError::Answer("no certificate".into()));
    }
    Ok(IssuedCert {
        chain_pem: answer.certificate_chain_pem,
        key_pem,
        not_after,
        received: SystemTime::now(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issuer_hosts() {
        let host = |s: &str| issuer_host(s).expect(s);
        assert_eq!(
            host("https://carina-controller.kube-system.svc:7444"),
            "carina-controller.kube-system.svc"
        );
        assert_eq!(host("localhost:7444"), "localhost");
        assert_eq!(host("https://[::1]:7444/"), "::1");
        for bad in ["http://a:1", "https://", ":7444", "a"] {
            assert!(issuer_host(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn renewal_is_two_thirds_into_the_lifetime() {
        let received = UNIX_EPOCH + Duration::from_secs(1000);
        let cert = IssuedCert {
            chain_pem: String::new(),
            key_pem: String::new(),
            not_after: received + Duration::from_secs(90),
            received,
        };
        assert_eq!(cert.renew_at(), received + Duration::from_secs(60));
    }

    #[test]
    fn csr_names_only_the_node() {
        let (csr, key) = new_key_and_csr("node-a").expect("CSR");
        assert!(csr.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
        assert!(key.contains("PRIVATE KEY"));
        let params = rcgen::CertificateSigningRequestParams::from_pem(&csr).expect("parses");
        assert_eq!(params.params.subject_alt_names.len(), 1);
        assert!(
            matches!(&params.params.subject_alt_names[0], SanType::DnsName(n) if n.as_str() == "node-a")
        );
    }
}
