//! Checking a node's certificate signing request before anything is
//! signed: [`check_csr`] accepts a PEM CSR only when its self-signature
//! verifies, its key is of a type we sign ([`ACCEPTED_KEYS`]), and it asks
//! for nothing but a server certificate naming the node: exactly one DNS
//! SAN equal to the node name, no other SAN, not a CA, no key usage but
//! digitalSignature, no extended key usage but serverAuth, no other
//! extension or attribute. Only the public key is taken from the request;
//! the certificate's contents are decided by the issuer (`ca.rs`).

use std::fmt;
use std::net::IpAddr;

use rcgen::SubjectPublicKeyInfo;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;
use x509_parser::x509::AlgorithmIdentifier;

/// The key types a CSR may carry.
pub const ACCEPTED_KEYS: &str = "ECDSA P-256, ECDSA P-384 or Ed25519";

/// Why a CSR is refused. Every message starts with the field, `csr_pem`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsrError {
    #[error("csr_pem: not a PEM certificate request: {0}")]
    Pem(String),
    #[error("csr_pem: cannot parse the certificate request: {0}")]
    Parse(String),
    #[error("csr_pem: the request's signature does not verify with its own key")]
    Signature,
    #[error("csr_pem: {found} keys are not accepted (use {ACCEPTED_KEYS})")]
    KeyType { found: String },
    /// Something beyond the node's DNS SAN was asked for.
    #[error("csr_pem: asks for {what}; only the DNS SAN {node:?} may be asked for")]
    Forbidden { what: String, node: String },
    #[error("csr_pem: names no DNS SAN; it must name the node {node:?}")]
    NoName { node: String },
    #[error("csr_pem: asks for the DNS SAN {found:?}, not the node name {node:?}")]
    OtherName { found: String, node: String },
}

/// A checked CSR: the public key to certify.
#[derive(Debug)]
pub struct CheckedCsr {
    pub public_key: SubjectPublicKeyInfo,
}

/// Checks `pem` as a request for a server certificate of `node_name`
/// (which the caller has validated as a DNS name).
pub fn check_csr(pem: &str, node_name: &str) -> Result<CheckedCsr, CsrError> {
    let (rest, block) = x509_parser::pem::parse_x509_pem(pem.trim_start().as_bytes())
        .map_err(|e| CsrError::Pem(e.to_string()))?;
    if block.label != "CERTIFICATE REQUEST" && block.label != "NEW CERTIFICATE REQUEST" {
        return Err(CsrError::Pem(format!(
            "the PEM block is {:?}, not CERTIFICATE REQUEST",
            block.label
        )));
    }
    if !rest.iter().all(u8::is_ascii_whitespace) {
        return Err(CsrError::Pem("more than one PEM block".into()));
    }
    let (rest, csr) = X509CertificationRequest::from_der(&block.contents)
        .map_err(|e| CsrError::Parse(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CsrError::Parse("trailing bytes after the request".into()));
    }
    csr.verify_signature().map_err(|_| CsrError::Signature)?;

    let info = &csr.certification_request_info;
    let public_key = accepted_key(info.subject_pki.raw, &info.subject_pki.algorithm)?;
    let forbidden = |what: String| CsrError::Forbidden {
        what,
        node: node_name.to_string(),
    };

    let mut names = Vec::new();
    for attr in info.iter_attributes() {
        let request = match attr.parsed_attribute() {
            ParsedCriAttribute::ExtensionRequest(request) => request,
            ParsedCriAttribute::ChallengePassword(_) => {
                return Err(forbidden("a challengePassword attribute".into()));
            }
            ParsedCriAttribute::UnsupportedAttribute => {
                return Err(forbidden(format!("the attribute {}", attr.oid)));
            }
        };
        for ext in &request.extensions {
            match ext.parsed_extension() {
                ParsedExtension::SubjectAlternativeName(san) => {
                    for name in &san.general_names {
                        match name {
                            GeneralName::DNSName(dns) => names.push(dns.to_string()),
                            GeneralName::IPAddress(bytes) => {
                                return Err(forbidden(format!(
                                    "the IP address SAN {}",
                                    ip_text(bytes)
                                )));
                            }
                            GeneralName::URI(uri) => {
                                return Err(forbidden(format!("the URI SAN {uri:?}")));
                            }
                            GeneralName::RFC822Name(mail) => {
                                return Err(forbidden(format!("the email SAN {mail:?}")));
                            }
                            other => return Err(forbidden(format!("the SAN {other}"))),
                        }
                    }
                }
                ParsedExtension::BasicConstraints(bc) if bc.ca => {
                    return Err(forbidden(
                        "a CA certificate (basicConstraints CA:TRUE)".into(),
                    ));
                }
                ParsedExtension::BasicConstraints(_) => {}
                ParsedExtension::KeyUsage(usage) if usage.flags & !1 != 0 => {
                    return Err(forbidden(format!("the key usage {usage}")));
                }
                ParsedExtension::KeyUsage(_) => {}
                ParsedExtension::ExtendedKeyUsage(eku) => {
                    let extra = eku.any
                        || eku.client_auth
                        || eku.code_signing
                        || eku.email_protection
                        || eku.time_stamping
                        || eku.ocsp_signing
                        || !eku.other.is_empty();
                    if extra {
                        return Err(forbidden(
                            "an extended key usage other than serverAuth".into(),
                        ));
                    }
                }
                _ => return Err(forbidden(format!("the extension {}", ext.oid))),
            }
        }
    }
    match names.as_slice() {
        [] => Err(CsrError::NoName {
            node: node_name.to_string(),
        }),
        [one] if one == node_name => Ok(CheckedCsr { public_key }),
        [one] => Err(CsrError::OtherName {
            found: one.clone(),
            node: node_name.to_string(),
        }),
        more => {
            let extra: Vec<&String> = more.iter().filter(|n| *n != node_name).collect();
            Err(forbidden(format!("more than one DNS SAN ({extra:?})")))
        }
    }
}

/// An IP address SAN as people write it (hex if it is neither v4 nor v6).
fn ip_text(bytes: &[u8]) -> String {
    match bytes.len() {
        4 => {
            <[u8; 4]>::try_from(bytes).map_or_else(|_| hex(bytes), |b| IpAddr::from(b).to_string())
        }
        16 => {
            <[u8; 16]>::try_from(bytes).map_or_else(|_| hex(bytes), |b| IpAddr::from(b).to_string())
        }
        _ => hex(bytes),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The request's key when it is one of [`ACCEPTED_KEYS`].
fn accepted_key(
    spki_der: &[u8],
    algorithm: &AlgorithmIdentifier<'_>,
) -> Result<SubjectPublicKeyInfo, CsrError> {
    let refused = || CsrError::KeyType {
        found: KeyName(algorithm).to_string(),
    };
    let key = SubjectPublicKeyInfo::from_der(spki_der).map_err(|_| refused())?;
    let alg = rcgen::PublicKeyData::algorithm(&key);
    let accepted = [
        &rcgen::PKCS_ECDSA_P256_SHA256,
        &rcgen::PKCS_ECDSA_P384_SHA384,
        &rcgen::PKCS_ED25519,
    ];
    if accepted.contains(&alg) {
        Ok(key)
    } else {
        Err(refused())
    }
}

/// A key type's name for messages.
struct KeyName<'a, 'b>(&'a AlgorithmIdentifier<'b>);

impl fmt::Display for KeyName<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let oid = self.0.algorithm.to_id_string();
        match oid.as_str() {
            "1.2.840.113549.1.1.1" | "1.2.840.113549.1.1.10" => f.write_str("RSA"),
            "1.3.101.113" => f.write_str("Ed448"),
            "1.2.840.10045.2.1" => {
                let curve = self
                    .0
                    .parameters
                    .as_ref()
                    .and_then(|p| p.as_oid().ok())
                    .map(|o| o.to_id_string());
                match curve.as_deref() {
                    Some("1.3.132.0.35") => f.write_str("ECDSA P-521"),
                    Some(other) => write!(f, "ECDSA (curve {other})"),
                    None => f.write_str("ECDSA (no curve)"),
                }
            }
            other => write!(f, "algorithm {other}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose, SanType,
    };

    use super::*;

    const NODE: &str = "node-a";

    fn dns(name: &str) -> SanType {
        SanType::DnsName(name.to_string().try_into().expect("ia5"))
    }

    /// A CSR for `NODE` after `change` edits its parameters.
    fn csr_with(key: &KeyPair, change: impl FnOnce(&mut CertificateParams)) -> String {
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![dns(NODE)];
        change(&mut params);
        params
            .serialize_request(key)
            .expect("CSR")
            .pem()
            .expect("PEM")
    }

    fn csr(change: impl FnOnce(&mut CertificateParams)) -> String {
        csr_with(&KeyPair::generate().expect("key"), change)
    }

    fn refused(pem: &str) -> String {
        check_csr(pem, NODE).expect_err("refused").to_string()
    }

    #[test]
    fn accepts_the_node_name_with_each_key_type() {
        for alg in [
            &rcgen::PKCS_ECDSA_P256_SHA256,
            &rcgen::PKCS_ECDSA_P384_SHA384,
            &rcgen::PKCS_ED25519,
        ] {
            let key = KeyPair::generate_for(alg).expect("key");
            let pem = csr_with(&key, |p| {
                p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
                p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
                p.is_ca = IsCa::ExplicitNoCa;
            });
            let checked = check_csr(&pem, NODE).expect("accepted");
            assert_eq!(
                rcgen::PublicKeyData::der_bytes(&checked.public_key),
                rcgen::PublicKeyData::der_bytes(&key)
            );
        }
    }

    #[test]
    fn refuses_anything_but_the_node_name() {
        let extra = refused(&csr(|p| p.subject_alt_names.push(dns("node-b"))));
        assert!(
            extra.contains("more than one DNS SAN") && extra.contains("node-b"),
            "{extra}"
        );
        let ip = refused(&csr(|p| {
            p.subject_alt_names
                .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)))
        }));
        assert!(ip.contains("the IP address SAN 127.0.0.1;"), "{ip}");
        let uri = refused(&csr(|p| {
            p.subject_alt_names.push(SanType::URI(
                "spiffe://carina.storage.io/carina/controller"
                    .to_string()
                    .try_into()
                    .expect("ia5"),
            ))
        }));
        assert!(uri.contains("URI SAN"), "{uri}");
        let mail = refused(&csr(|p| {
            p.subject_alt_names.push(SanType::Rfc822Name(
                "a@b.c".to_string().try_into().expect("ia5"),
            ))
        }));
        assert!(mail.contains("email SAN"), "{mail}");
        let other = refused(&csr(|p| p.subject_alt_names = vec![dns("node-b")]));
        assert!(other.contains("\"node-b\", not the node name"), "{other}");
        let none = refused(&csr(|p| p.subject_alt_names.clear()));
        assert!(none.contains("names no DNS SAN"), "{none}");
    }

    #[test]
    fn refuses_ca_and_extra_usages() {
        let ca = refused(&csr(|p| {
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained)
        }));
        assert!(ca.contains("CA:TRUE"), "{ca}");
        let usage = refused(&csr(|p| {
            p.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyCertSign,
            ]
        }));
        assert!(usage.contains("key usage"), "{usage}");
        let eku = refused(&csr(|p| {
            p.extended_key_usages = vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        }));
        assert!(eku.contains("extended key usage"), "{eku}");
    }

    #[test]
    fn refuses_broken_requests() {
        let pem = csr(|_| {});
        // Flip one bit near the end of the base64 text: inside the
        // signature value, so the request still parses.
        let mut lines: Vec<String> = pem.lines().map(str::to_string).collect();
        let body = lines.len() - 2;
        let mut chars: Vec<char> = lines[body].chars().collect();
        let data_end = chars.iter().rposition(|c| *c != '=').expect("data");
        let at = data_end - 1;
        chars[at] = if chars[at] == 'A' { 'B' } else { 'A' };
        lines[body] = chars.into_iter().collect();
        let tampered = lines.join("\n");
        let sig = check_csr(&tampered, NODE).expect_err("tampered");
        assert!(
            matches!(sig, CsrError::Signature | CsrError::Parse(_)),
            "{sig}"
        );
        assert!(refused("not a CSR").starts_with("csr_pem: not a PEM"));
        let ca = rcgen::CertificateParams::default()
            .self_signed(&KeyPair::generate().expect("key"))
            .expect("cert");
        assert!(refused(&ca.pem()).contains("not CERTIFICATE REQUEST"));
        let two = format!("{pem}{pem}");
        assert!(refused(&two).contains("more than one PEM block"));
    }
}
