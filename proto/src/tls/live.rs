//! A client certificate that is renewed in place: [`LiveClientCert`]
//! answers rustls' question "which certificate do I offer?" at each
//! handshake with the newest one it holds, so a connection made after a
//! renewal offers the new certificate while established connections keep
//! theirs. The control plane's own certificate, issued from the cluster CA
//! and renewed before it expires, is offered this way.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use rustls::SignatureScheme;
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;

use super::{TlsError, certs, crypto_provider, key};

/// The client certificate in force; cheap to clone, clones share it.
#[derive(Clone)]
pub struct LiveClientCert {
    current: Arc<RwLock<Arc<CertifiedKey>>>,
}

impl fmt::Debug for LiveClientCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveClientCert").finish_non_exhaustive()
    }
}

/// A certificate chain and its key, checked to match.
fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<CertifiedKey>, TlsError> {
    let certified = CertifiedKey::from_der(
        certs(cert_pem, "client certificate")?,
        key(key_pem, "client key")?,
        &crypto_provider(),
    )
    .map_err(|source| TlsError::Rustls {
        what: "client certificate and key",
        source,
    })?;
    Ok(Arc::new(certified))
}

impl LiveClientCert {
    /// Starts with `cert_pem` (the chain, leaf first) and `key_pem`.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Self, TlsError> {
        Ok(LiveClientCert {
            current: Arc::new(RwLock::new(certified_key(cert_pem, key_pem)?)),
        })
    }

    /// Offers `cert_pem`/`key_pem` from the next handshake on. On error
    /// the certificate in force stays.
    pub fn replace(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), TlsError> {
        let next = certified_key(cert_pem, key_pem)?;
        // A poisoned lock still holds a whole Arc: replacing it is sound.
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = next;
        Ok(())
    }

    /// The certificate chain in force (leaf first), DER.
    pub fn chain(&self) -> Vec<Vec<u8>> {
        self.get().cert.iter().map(|c| c.to_vec()).collect()
    }

    fn get(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl ResolvesClientCert for LiveClientCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devcerts::{DevCa, Validity};
    use carina_sys::testkit::{mutated_text, noisy_text};
    use proptest::prelude::*;
    use std::sync::LazyLock;

    /// A client certificate and key as files hold them.
    static PEMS: LazyLock<(String, String)> = LazyLock::new(|| {
        let ca = DevCa::new("ca", Validity::days(1)).expect("CA");
        let c = ca
            .issue_client("carina.storage.io", "reader", Validity::days(1))
            .expect("client");
        (c.cert_pem, c.key_pem)
    });

    proptest! {
        /// Damaged certificate or key files are refused, never a panic,
        /// and a refused replacement leaves the certificate in force.
        #[test]
        fn damaged_pem_files_are_refused(
            cert in prop_oneof![noisy_text(), mutated_text(&PEMS.0), Just(PEMS.0.clone())],
            key in prop_oneof![noisy_text(), mutated_text(&PEMS.1), Just(PEMS.1.clone())],
        ) {
            let live = LiveClientCert::from_pem(PEMS.0.as_bytes(), PEMS.1.as_bytes()).expect("the sample loads");
            let before = live.chain();
            if live.replace(cert.as_bytes(), key.as_bytes()).is_err() {
                prop_assert_eq!(live.chain(), before);
            } else {
                prop_assert!(!live.chain().is_empty());
            }
            let _ = LiveClientCert::from_pem(cert.as_bytes(), key.as_bytes());
        }
    }

    #[test]
    fn replace_swaps_the_certificate_and_refuses_mismatches() {
        let ca = DevCa::new("ca", Validity::days(1)).expect("CA");
        let first = ca
            .issue_client("carina.storage.io", "controller", Validity::days(1))
            .expect("client");
        let second = ca
            .issue_client("carina.storage.io", "controller", Validity::days(1))
            .expect("client");
        let live = LiveClientCert::from_pem(first.cert_pem.as_bytes(), first.key_pem.as_bytes())
            .expect("loads");
        let before = live.chain();
        let err = live
            .replace(second.cert_pem.as_bytes(), first.key_pem.as_bytes())
            .expect_err("a key that does not match");
        assert!(
            err.to_string().contains("client certificate and key"),
            "{err}"
        );
        assert_eq!(live.chain(), before, "the old one stays after an error");
        live.replace(second.cert_pem.as_bytes(), second.key_pem.as_bytes())
            .expect("replaces");
        assert_ne!(live.chain(), before);
        assert!(live.resolve(&[], &[]).is_some());
    }
}
