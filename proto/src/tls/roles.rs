//! Roles: what a client certificate allows, read from the last segment of
//! its URI SAN `spiffe://<trust-domain>/carina/<role>`.

use std::fmt;

/// The trust domain of client SPIFFE IDs unless configured otherwise.
pub const DEFAULT_TRUST_DOMAIN: &str = "carina.storage.io";

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
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    use std::sync::LazyLock;

    use carina_sys::testkit::{mutated_bytes, mutated_text, noisy_text};
    use proptest::prelude::*;

    /// The DER of a real client certificate naming the reader role.
    static READER_DER: LazyLock<Vec<u8>> = LazyLock::new(|| {
        let ca = DevCa::new("ca", Validity::days(1)).expect("CA");
        let client = ca
            .issue_client(DEFAULT_TRUST_DOMAIN, "reader", Validity::days(1))
            .expect("client");
        CertificateDer::from_pem_slice(client.cert_pem.as_bytes())
            .expect("PEM")
            .to_vec()
    });

    proptest! {
        /// A role read from any URI is one the URI names in the trust
        /// domain with the allowed characters, and its SPIFFE ID reads
        /// back as the same role.
        #[test]
        fn roles_from_any_uri(
            uri in prop_oneof![
                noisy_text(),
                mutated_text("spiffe://carina.storage.io/carina/controller"),
                "spiffe://(carina.storage.io|CARINA.STORAGE.IO|other)/(carina|x)/[a-zA-Z0-9._/?#-]{0,12}",
            ],
        ) {
            if let Some(role) = role_from_uri(&uri, DEFAULT_TRUST_DOMAIN) {
                let name = role.as_str();
                prop_assert!(!name.is_empty());
                prop_assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)), "{:?}", name);
                prop_assert!(uri.ends_with(&format!("/carina/{name}")), "{:?}", uri);
                prop_assert_eq!(role_from_uri(&spiffe_id(DEFAULT_TRUST_DOMAIN, name), DEFAULT_TRUST_DOMAIN), Some(role.clone()));
                prop_assert_eq!(Role::from_name(name), role);
            }
        }

        /// Every role name of the allowed characters is carried by its
        /// SPIFFE ID.
        #[test]
        fn spiffe_ids_carry_their_role(name in "[a-zA-Z0-9._-]{1,30}") {
            prop_assert_eq!(
                role_from_uri(&spiffe_id(DEFAULT_TRUST_DOMAIN, &name), DEFAULT_TRUST_DOMAIN),
                Some(Role::from_name(&name))
            );
        }

        /// A damaged certificate gives a role error or, if it still
        /// parses, the one role it names; never a panic.
        #[test]
        fn roles_from_damaged_certificates(der in mutated_bytes(&READER_DER)) {
            if let Ok(role) = role_from_cert(&der, DEFAULT_TRUST_DOMAIN) {
                // A change may hit the role's own bytes: it is still a
                // role a URI can name.
                prop_assert!(role_from_uri(&spiffe_id(DEFAULT_TRUST_DOMAIN, role.as_str()), DEFAULT_TRUST_DOMAIN).is_some());
            }
        }
    }

    #[test]
    fn the_sample_certificate_names_the_reader() {
        assert_eq!(
            role_from_cert(&READER_DER, DEFAULT_TRUST_DOMAIN),
            Ok(Role::Reader)
        );
    }

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
}
