//! A development certificate authority (rcgen): one CA, server certificates
//! that name a node, and client certificates that carry a role.
//!
//! This is what `carinactl certs` writes and what the tests use. It is not a
//! PKI: keys are ECDSA P-256, kept in memory and handed out as PEM, and
//! nothing is revoked. Production clusters use cert-manager (or any CA) with
//! the same SAN layout:
//!
//! - server: DNS SAN = node name (plus whatever extra names and addresses
//!   the caller asks for), extended key usage `serverAuth`;
//! - client: URI SAN `spiffe://<trust-domain>/carina/<role>`, extended key
//!   usage `clientAuth`.

use std::net::IpAddr;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::tls::spiffe_id;

/// Errors from making certificates.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen refused the parameters or could not sign.
    #[error("{what}: {source}")]
    Rcgen {
        what: String,
        #[source]
        source: rcgen::Error,
    },
}

fn rcgen_err(what: impl Into<String>) -> impl FnOnce(rcgen::Error) -> CertError {
    let what = what.into();
    move |source| CertError::Rcgen { what, source }
}

/// When a certificate is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

impl Validity {
    /// Valid from an hour ago (to tolerate clock skew) for `days` days.
    pub fn days(days: u32) -> Validity {
        let now = OffsetDateTime::now_utc();
        Validity {
            not_before: now - Duration::hours(1),
            not_after: now + Duration::days(i64::from(days)),
        }
    }

    /// Expired yesterday: for tests of expiry handling.
    pub fn expired() -> Validity {
        let now = OffsetDateTime::now_utc();
        Validity {
            not_before: now - Duration::days(2),
            not_after: now - Duration::days(1),
        }
    }

    fn apply(&self, params: &mut CertificateParams) {
        params.not_before = self.not_before;
        params.not_after = self.not_after;
    }
}

/// A certificate and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct CertifiedKey {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for CertifiedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertifiedKey")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// A development CA that issues node (server) and role (client)
/// certificates.
pub struct DevCa {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for DevCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCa")
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .finish_non_exhaustive()
    }
}

impl DevCa {
    /// A new self-signed CA whose subject common name is `cn`.
    pub fn new(cn: &str, validity: Validity) -> Result<DevCa, CertError> {
        let key = KeyPair::generate().map_err(rcgen_err("generate CA key"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity.apply(&mut params);
        let cert = params
            .self_signed(&key)
            .map_err(rcgen_err("self-sign CA certificate"))?;
        let key_pem = key.serialize_pem();
        Ok(DevCa {
            cert_pem: cert.pem(),
            key_pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// A CA loaded from its certificate and key (as written by
    /// [`DevCa::cert_pem`] and [`DevCa::key_pem`]).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<DevCa, CertError> {
        let key = KeyPair::from_pem(key_pem).map_err(rcgen_err("parse CA key"))?;
        let issuer =
            Issuer::from_ca_cert_pem(cert_pem, key).map_err(rcgen_err("parse CA certificate"))?;
        Ok(DevCa {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            issuer,
        })
    }

    /// The CA certificate (the trust anchor servers and clients load).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A server certificate for node `node_name`: DNS SAN `node_name` plus
    /// `extra_dns` and `ips` (pass `localhost` / `127.0.0.1` to reach it
    /// locally by those names too).
    pub fn issue_server(
        &self,
        node_name: &str,
        extra_dns: &[String],
        ips: &[IpAddr],
        validity: Validity,
    ) -> Result<CertifiedKey, CertError> {
        let mut sans = Vec::with_capacity(1 + extra_dns.len() + ips.len());
        for dns in std::iter::once(node_name).chain(extra_dns.iter().map(String::as_str)) {
            let ia5 = dns
                .to_string()
                .try_into()
                .map_err(rcgen_err(format!("DNS name {dns:?}")))?;
            sans.push(SanType::DnsName(ia5));
        }
        sans.extend(ips.iter().copied().map(SanType::IpAddress));
        let mut params = CertificateParams::default();
        params.distinguished_name = name(node_name);
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(params, validity, node_name)
    }

    /// A client certificate for `role` in `trust_domain`: URI SAN
    /// `spiffe://<trust_domain>/carina/<role>`.
    pub fn issue_client(
        &self,
        trust_domain: &str,
        role: &str,
        validity: Validity,
    ) -> Result<CertifiedKey, CertError> {
        let uri = spiffe_id(trust_domain, role);
        let ia5 = uri
            .clone()
            .try_into()
            .map_err(rcgen_err(format!("URI {uri:?}")))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(role);
        params.subject_alt_names = vec![SanType::URI(ia5)];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(params, validity, role)
    }

    fn issue(
        &self,
        mut params: CertificateParams,
        validity: Validity,
        subject: &str,
    ) -> Result<CertifiedKey, CertError> {
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        validity.apply(&mut params);
        let key = KeyPair::generate().map_err(rcgen_err(format!("generate key for {subject}")))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(rcgen_err(format!("sign certificate for {subject}")))?;
        Ok(CertifiedKey {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{Role, role_from_cert};
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).expect("one PEM certificate")
    }

    #[test]
    fn client_certificate_carries_the_role() {
        let ca = DevCa::new("test CA", Validity::days(1)).expect("CA");
        let client = ca
            .issue_client("example.org", "reader", Validity::days(1))
            .expect("client");
        let role = role_from_cert(&der(&client.cert_pem), "example.org").expect("role");
        assert_eq!(role, Role::Reader);
    }

    #[test]
    fn server_certificate_names_the_node() {
        let ca = DevCa::new("test CA", Validity::days(1)).expect("CA");
        let server = ca
            .issue_server(
                "node-a",
                &["localhost".to_string()],
                &[IpAddr::from([127, 0, 0, 1])],
                Validity::days(1),
            )
            .expect("server");
        let cert = der(&server.cert_pem);
        let (_, x509) = x509_parser::parse_x509_certificate(&cert).expect("parses");
        let sans = x509
            .subject_alternative_name()
            .expect("valid extension")
            .expect("has SANs");
        let names: Vec<String> = sans
            .value
            .general_names
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(
            names,
            vec![
                "DNSName(node-a)",
                "DNSName(localhost)",
                "IPAddress(7f:00:00:01)"
            ]
        );
    }

    #[test]
    fn reloaded_ca_signs_certificates_the_original_verifies() {
        let ca = DevCa::new("test CA", Validity::days(1)).expect("CA");
        let again = DevCa::from_pem(ca.cert_pem(), ca.key_pem()).expect("reload");
        let client = again
            .issue_client("carina.storage.io", "controller", Validity::days(1))
            .expect("client");
        let cert = der(&client.cert_pem);
        let (_, x509) = x509_parser::parse_x509_certificate(&cert).expect("parses");
        let ca_der = der(ca.cert_pem());
        let (_, ca_x509) = x509_parser::parse_x509_certificate(&ca_der).expect("parses");
        assert_eq!(x509.issuer(), ca_x509.subject());
        x509.verify_signature(Some(ca_x509.public_key()))
            .expect("signed by the CA key");
    }

    #[test]
    fn expired_is_in_the_past() {
        let v = Validity::expired();
        assert!(v.not_after < OffsetDateTime::now_utc());
        assert!(v.not_before < v.not_after);
    }
}
