//! The cluster CA in memory, and what it signs: node server certificates
//! (from a checked CSR's public key), the controller's own client
//! certificate and the issuer's server certificate.
//!
//! The CA comes from a `kubernetes.io/tls` Secret (see `store.rs`): `tls.crt`
//! holds the signing certificate first, then any certificates above it
//! (an intermediate's chain), `tls.key` its key, and `ca.crt`, when
//! present (cert-manager writes it), the trust anchors. Without `ca.crt`
//! the anchors are `tls.crt`. Every certificate issued here is returned
//! with `tls.crt` appended, so a verifier that trusts only the root can
//! build the path through an intermediate.
//!
//! Issued certificates are ECDSA-signed by the CA key, valid from five
//! minutes ago (clock skew between nodes) until `ttl` from now, with a
//! serial number unique per issuance.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use x509_parser::pem::Pem;
use x509_parser::prelude::{FromDer, X509Certificate};

use carina_proto::tls::spiffe_id;

/// How long a CA made on first start is valid.
pub const GENERATED_CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// How far back an issued certificate's validity starts.
const BACKDATE: Duration = Duration::from_secs(300);

/// Why the CA could not be loaded or could not sign.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// The Secret's certificate or key is unusable.
    #[error("CA {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    /// rcgen could not build or sign a certificate.
    #[error("{what}: {source}")]
    Rcgen {
        what: String,
        #[source]
        source: rcgen::Error,
    },
}

fn rcgen_err(what: impl Into<String>) -> impl FnOnce(rcgen::Error) -> CaError {
    let what = what.into();
    move |source| CaError::Rcgen { what, source }
}

fn invalid(what: &'static str, reason: impl Into<String>) -> CaError {
    CaError::Invalid {
        what,
        reason: reason.into(),
    }
}

/// A certificate issued here, PEM, and when it expires.
#[derive(Clone)]
pub struct Issued {
    /// The certificate, then the CA's `tls.crt`.
    pub chain_pem: String,
    /// Its private key, when the CA made the key (empty for a CSR).
    pub key_pem: String,
    pub not_after: OffsetDateTime,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// The CA that signs node and controller certificates.
pub struct ClusterCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    key_pem: String,
    bundle_pem: String,
    serials: AtomicU64,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa").finish_non_exhaustive()
    }
}

impl ClusterCa {
    /// A new self-signed CA (ECDSA P-256) named `cn`, valid for
    /// [`GENERATED_CA_VALIDITY`].
    pub fn generate(cn: &str) -> Result<ClusterCa, CaError> {
        let key = KeyPair::generate().map_err(rcgen_err("generate the CA key"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name(cn);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now + GENERATED_CA_VALIDITY;
        let cert = params
            .self_signed(&key)
            .map_err(rcgen_err("self-sign the CA certificate"))?;
        let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
        ClusterCa::from_pem(&cert_pem, &key_pem, None)
    }

    /// The CA of a Secret: `tls_crt` (signing certificate first), `tls_key`,
    /// and the trust anchors `ca_crt` (default: `tls_crt`). The signing
    /// certificate must be a CA, currently valid, and match the key.
    pub fn from_pem(
        tls_crt: &str,
        tls_key: &str,
        ca_crt: Option<&str>,
    ) -> Result<ClusterCa, CaError> {
        let first = Pem::iter_from_buffer(tls_crt.as_bytes())
            .next()
            .ok_or_else(|| invalid("tls.crt", "no PEM certificate"))?
            .map_err(|e| invalid("tls.crt", e.to_string()))?;
        let cert = first
            .parse_x509()
            .map_err(|e| invalid("tls.crt", e.to_string()))?;
        let key = KeyPair::from_pem(tls_key).map_err(|e| invalid("tls.key", e.to_string()))?;
        if cert.tbs_certificate.subject_pki.raw != key.subject_public_key_info().as_slice() {
            return Err(invalid(
                "tls.key",
                "does not match the certificate in tls.crt",
            ));
        }
        let is_ca = cert
            .basic_constraints()
            .map_err(|e| invalid("tls.crt", e.to_string()))?
            .is_some_and(|bc| bc.value.ca);
        if !is_ca {
            return Err(invalid(
                "tls.crt",
                "the first certificate is not a CA (basicConstraints CA:TRUE)",
            ));
        }
        if !cert.validity().is_valid() {
            return Err(invalid(
                "tls.crt",
                format!(
                    "not valid now (valid from {} to {})",
                    cert.validity().not_before,
                    cert.validity().not_after
                ),
            ));
        }
        let bundle_pem = match ca_crt.map(str::trim).filter(|s| !s.is_empty()) {
            Some(anchors) => {
                let mut found = 0;
                for block in Pem::iter_from_buffer(anchors.as_bytes()) {
                    let block = block.map_err(|e| invalid("ca.crt", e.to_string()))?;
                    block
                        .parse_x509()
                        .map_err(|e| invalid("ca.crt", e.to_string()))?;
                    found += 1;
                }
                if found == 0 {
                    return Err(invalid("ca.crt", "no PEM certificate"));
                }
                with_newline(anchors)
            }
            None => with_newline(tls_crt.trim()),
        };
        // Reads the first PEM block: the one checked above.
        let issuer =
            Issuer::from_ca_cert_pem(tls_crt, key).map_err(rcgen_err("read the CA certificate"))?;
        Ok(ClusterCa {
            issuer,
            cert_pem: with_newline(tls_crt.trim()),
            key_pem: tls_key.to_string(),
            bundle_pem,
            serials: AtomicU64::new(0),
        })
    }

    /// `tls.crt`: the signing certificate and its chain.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// `tls.key`.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The trust anchors clients and nodes verify against (the `ca.crt`
    /// of the published ConfigMap).
    pub fn bundle_pem(&self) -> &str {
        &self.bundle_pem
    }

    /// A cross-certificate that endorses the CA certificate `anchor` (DER):
    /// its subject and public key, a CA, signed by this CA, valid as long
    /// as `anchor` is. A node that trusts this CA takes `anchor` as a new
    /// trust anchor on its word (`carina_proto::anchors`).
    pub fn endorse(&self, anchor: &[u8]) -> Result<String, CaError> {
        let (_, cert) = X509Certificate::from_der(anchor)
            .map_err(|e| invalid("the CA to endorse", e.to_string()))?;
        let spki = rcgen::SubjectPublicKeyInfo::from_der(cert.tbs_certificate.subject_pki.raw)
            .map_err(rcgen_err("read the public key of the CA to endorse"))?;
        let mut params = self.leaf(
            "",
            cert.tbs_certificate.subject_pki.raw,
            GENERATED_CA_VALIDITY,
        );
        let mut dn = DistinguishedName::new();
        for attr in cert.subject().iter_attributes() {
            let oid: Vec<u64> = attr
                .attr_type()
                .iter()
                .map(Iterator::collect)
                .unwrap_or_default();
            let value = attr
                .as_str()
                .map_err(|e| invalid("the CA to endorse", format!("subject: {e}")))?;
            dn.push(DnType::from_oid(&oid), value);
        }
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_after = cert.validity().not_after.to_datetime();
        let subject = cert.subject().to_string();
        Ok(params
            .signed_by(&spki, &self.issuer)
            .map_err(rcgen_err(format!("endorse the CA {subject}")))?
            .pem())
    }

    /// The DER of the signing certificate (the first of `tls.crt`).
    pub fn signing_cert_der(&self) -> Vec<u8> {
        Pem::iter_from_buffer(self.cert_pem.as_bytes())
            .next()
            .and_then(Result::ok)
            .map(|p| p.contents)
            .unwrap_or_default()
    }

    /// A server certificate for node `node_name` (its only DNS SAN and
    /// common name, extended key usage serverAuth) over `public_key`,
    /// valid for `ttl`.
    pub fn sign_node(
        &self,
        node_name: &str,
        public_key: &impl PublicKeyData,
        ttl: Duration,
    ) -> Result<Issued, CaError> {
        let mut params = self.leaf(node_name, public_key.der_bytes(), ttl);
        params.subject_alt_names = vec![dns(node_name)?];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let not_after = params.not_after;
        let cert = params
            .signed_by(public_key, &self.issuer)
            .map_err(rcgen_err(format!(
                "sign the certificate of node {node_name}"
            )))?;
        Ok(Issued {
            chain_pem: format!("{}{}", cert.pem(), self.cert_pem),
            key_pem: String::new(),
            not_after,
        })
    }

    /// A client certificate with a new key for `role` in `trust_domain`
    /// (URI SAN `spiffe://<trust_domain>/carina/<role>`, extended key usage
    /// clientAuth), valid for `ttl`.
    pub fn issue_client(
        &self,
        trust_domain: &str,
        role: &str,
        ttl: Duration,
    ) -> Result<Issued, CaError> {
        let uri = spiffe_id(trust_domain, role);
        let san = SanType::URI(
            uri.clone()
                .try_into()
                .map_err(rcgen_err(format!("URI {uri:?}")))?,
        );
        self.issue_with_key(role, vec![san], ExtendedKeyUsagePurpose::ClientAuth, ttl)
    }

    /// A server certificate with a new key for the DNS names `names` (the
    /// first is also the common name), valid for `ttl`.
    pub fn issue_server(&self, names: &[String], ttl: Duration) -> Result<Issued, CaError> {
        let cn = names
            .first()
            .ok_or_else(|| invalid("server certificate", "no DNS name"))?;
        let sans = names
            .iter()
            .map(|n| dns(n))
            .collect::<Result<Vec<_>, _>>()?;
        self.issue_with_key(cn, sans, ExtendedKeyUsagePurpose::ServerAuth, ttl)
    }

    fn issue_with_key(
        &self,
        cn: &str,
        sans: Vec<SanType>,
        usage: ExtendedKeyUsagePurpose,
        ttl: Duration,
    ) -> Result<Issued, CaError> {
        let key = KeyPair::generate().map_err(rcgen_err(format!("generate a key for {cn}")))?;
        let mut params = self.leaf(cn, key.der_bytes(), ttl);
        params.subject_alt_names = sans;
        params.extended_key_usages = vec![usage];
        let not_after = params.not_after;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(rcgen_err(format!("sign the certificate of {cn}")))?;
        Ok(Issued {
            chain_pem: format!("{}{}", cert.pem(), self.cert_pem),
            key_pem: key.serialize_pem(),
            not_after,
        })
    }

    /// What every certificate issued here shares: subject `cn`, not a CA,
    /// key usage digitalSignature, the CA's key identifier, validity, and
    /// a serial number unique to this issuance (a digest of the public key,
    /// the time and a counter; positive, at most 16 bytes).
    fn leaf(&self, cn: &str, public_key_der: &[u8], ttl: Duration) -> CertificateParams {
        let now = OffsetDateTime::now_utc();
        let mut digest = Sha256::new();
        digest.update(public_key_der);
        digest.update(now.unix_timestamp_nanos().to_be_bytes());
        digest.update(self.serials.fetch_add(1, Ordering::Relaxed).to_be_bytes());
        let mut serial = digest.finalize()[..16].to_vec();
        serial[0] &= 0x7f;
        let mut params = CertificateParams::default();
        params.distinguished_name = common_name(cn);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(SerialNumber::from(serial));
        params.not_before = now - BACKDATE;
        params.not_after = now + ttl;
        params
    }
}

fn common_name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

fn dns(name: &str) -> Result<SanType, CaError> {
    Ok(SanType::DnsName(
        name.to_string()
            .try_into()
            .map_err(rcgen_err(format!("DNS name {name:?}")))?,
    ))
}

fn with_newline(pem: &str) -> String {
    format!("{}\n", pem.trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf_of(chain: &str) -> Vec<u8> {
        Pem::iter_from_buffer(chain.as_bytes())
            .next()
            .expect("a block")
            .expect("PEM")
            .contents
    }

    #[test]
    fn generated_ca_round_trips_and_signs_what_it_verifies() {
        let ca = ClusterCa::generate("carina test CA").expect("CA");
        let again = ClusterCa::from_pem(ca.cert_pem(), ca.key_pem(), None).expect("reload");
        assert_eq!(again.bundle_pem(), ca.cert_pem());
        let issued = again
            .issue_server(
                &["carina-controller.ns.svc".to_string()],
                Duration::from_secs(60),
            )
            .expect("server");
        let der = leaf_of(&issued.chain_pem);
        let (_, cert) = X509Certificate::from_der(&der).expect("parses");
        let ca_der = leaf_of(ca.cert_pem());
        let (_, ca_cert) = X509Certificate::from_der(&ca_der).expect("parses");
        cert.verify_signature(Some(ca_cert.public_key()))
            .expect("signed by the CA");
        assert!(!cert.is_ca());
        let left = issued.not_after - OffsetDateTime::now_utc();
        assert!(left <= time::Duration::seconds(60) && left > time::Duration::ZERO);
        assert_eq!(issued.chain_pem.matches("BEGIN CERTIFICATE").count(), 2);
    }

    #[test]
    fn serials_differ_for_the_same_key() {
        let ca = ClusterCa::generate("ca").expect("CA");
        let key = KeyPair::generate().expect("key");
        let serial = |issued: &Issued| {
            let der = leaf_of(&issued.chain_pem);
            let (_, cert) = X509Certificate::from_der(&der).expect("parses");
            cert.raw_serial().to_vec()
        };
        let a = ca
            .sign_node("node-a", &key, Duration::from_secs(60))
            .expect("a");
        let b = ca
            .sign_node("node-a", &key, Duration::from_secs(60))
            .expect("b");
        assert_ne!(serial(&a), serial(&b));
    }

    #[test]
    fn unusable_secrets_are_refused_with_the_field() {
        let ca = ClusterCa::generate("ca").expect("CA");
        let other = ClusterCa::generate("other").expect("CA");
        let err = ClusterCa::from_pem(ca.cert_pem(), other.key_pem(), None).expect_err("mismatch");
        assert!(err.to_string().contains("tls.key"), "{err}");
        let leaf = ca
            .issue_server(&["x".to_string()], Duration::from_secs(60))
            .expect("leaf");
        let err = ClusterCa::from_pem(&leaf.chain_pem, &leaf.key_pem, None).expect_err("not a CA");
        assert!(err.to_string().contains("not a CA"), "{err}");
        let err = ClusterCa::from_pem("", ca.key_pem(), None).expect_err("empty");
        assert!(err.to_string().contains("tls.crt"), "{err}");
        let err = ClusterCa::from_pem(
            ca.cert_pem(),
            ca.key_pem(),
            Some("garbage-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
        )
        .expect_err("bad ca.crt");
        assert!(err.to_string().contains("ca.crt"), "{err}");
    }
}
