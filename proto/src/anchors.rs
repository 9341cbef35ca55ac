//! Which CA bundle may replace the one a node trusts.
//!
//! In issued identity mode the nodes read their trust anchors from a
//! ConfigMap, which more people can write than the CA's Secret. So a node
//! does not take a new bundle because it appeared: every CA in it must
//! either carry a public key the node trusts already, or be *endorsed*: a
//! cross-certificate (same public key, a CA, signed by a key the node
//! trusts) vouches for it. Only the holder of a trusted CA's key can make
//! one; the controller makes them when the CA in its Secret is replaced
//! while it still holds the old key. Endorsements chain: a CA endorsed by
//! an endorsed CA counts too.
//!
//! Keys, not certificates, are compared: a CA re-issued with the same key
//! (a renewed validity) is the same anchor. Validity dates of anchors and
//! endorsements are not checked here; what a bundle may contain is a
//! question of who holds which key.
//!
//! The published ConfigMap keeps the anchors under `ca.crt` (what TLS
//! trusts) and the endorsements under [`ENDORSEMENTS_KEY`], so a reader of
//! `ca.crt` never mistakes a cross-certificate for an anchor.

use x509_parser::certificate::X509Certificate;
use x509_parser::pem::Pem;
use x509_parser::prelude::FromDer;

/// The ConfigMap key (and the file next to `ca.crt`) of the
/// cross-certificates that endorse new CAs.
pub const ENDORSEMENTS_KEY: &str = "ca-endorsements.crt";

/// Why a bundle could not be read or may not replace the trusted one.
#[derive(Debug, thiserror::Error)]
pub enum AnchorError {
    #[error("{what}: {reason}")]
    Parse { what: &'static str, reason: String },
    #[error("{what}: no PEM certificate")]
    Empty { what: &'static str },
    #[error(
        "the CA {subject:?} is not trusted yet and no trusted CA endorses it (a cross-certificate in {ENDORSEMENTS_KEY} signed by a trusted CA's key); a bundle written without the CA's key"
    )]
    NotEndorsed { subject: String },
}

/// The DER certificates of the `CERTIFICATE` blocks of `pem`, each parsed
/// once to make sure it is one; `what` names the input in errors.
pub fn certificates(pem: &str, what: &'static str) -> Result<Vec<Vec<u8>>, AnchorError> {
    let mut out = Vec::new();
    for block in Pem::iter_from_buffer(pem.as_bytes()) {
        let block = block.map_err(|e| AnchorError::Parse {
            what,
            reason: e.to_string(),
        })?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        X509Certificate::from_der(&block.contents).map_err(|e| AnchorError::Parse {
            what,
            reason: e.to_string(),
        })?;
        out.push(block.contents);
    }
    Ok(out)
}

fn parse(der: &[u8]) -> Option<X509Certificate<'_>> {
    X509Certificate::from_der(der).ok().map(|(_, c)| c)
}

/// The DER SubjectPublicKeyInfo of a certificate.
pub fn public_key(der: &[u8]) -> Option<Vec<u8>> {
    parse(der).map(|c| c.tbs_certificate.subject_pki.raw.to_vec())
}

/// The subject of a certificate, for messages.
pub fn subject(der: &[u8]) -> String {
    parse(der).map_or_else(
        || "(unparsable)".to_string(),
        |c| c.tbs_certificate.subject.to_string(),
    )
}

fn is_ca(cert: &X509Certificate<'_>) -> bool {
    cert.basic_constraints()
        .ok()
        .flatten()
        .is_some_and(|bc| bc.value.ca)
}

/// Whether `endorsement` is a CA certificate for `key` (a
/// SubjectPublicKeyInfo, DER) signed by the key of `signer`.
pub fn endorses(endorsement: &[u8], key: &[u8], signer: &[u8]) -> bool {
    let (Some(cross), Some(signer)) = (parse(endorsement), parse(signer)) else {
        return false;
    };
    is_ca(&cross)
        && cross.tbs_certificate.subject_pki.raw == key
        && cross.verify_signature(Some(signer.public_key())).is_ok()
}

/// Checks that `candidate` may replace `trusted` (both anchor lists, DER):
/// each CA of `candidate` has a trusted key or is endorsed, through
/// `endorsements`, by one. Returns the subjects of the CAs it newly
/// trusts (empty when it only drops or re-issues anchors).
pub fn check_replacement(
    trusted: &[Vec<u8>],
    candidate: &[Vec<u8>],
    endorsements: &[Vec<u8>],
) -> Result<Vec<String>, AnchorError> {
    if candidate.is_empty() {
        return Err(AnchorError::Empty { what: "ca.crt" });
    }
    // Certificates whose keys are trusted, growing by endorsements until
    // none adds one.
    let mut signers: Vec<Vec<u8>> = trusted.to_vec();
    let mut keys: Vec<Vec<u8>> = trusted.iter().filter_map(|d| public_key(d)).collect();
    loop {
        let mut grew = false;
        for cross in endorsements {
            let Some(key) = public_key(cross) else {
                continue;
            };
            if keys.contains(&key) {
                continue;
            }
            if signers.iter().any(|s| endorses(cross, &key, s)) {
                keys.push(key);
                signers.push(cross.clone());
                grew = true;
            }
        }
        if !grew {
            break;
        }
    }
    let old_keys: Vec<Vec<u8>> = trusted.iter().filter_map(|d| public_key(d)).collect();
    let mut added = Vec::new();
    for ca in candidate {
        let key = public_key(ca).ok_or_else(|| AnchorError::Parse {
            what: "ca.crt",
            reason: "unparsable certificate".into(),
        })?;
        if !keys.contains(&key) {
            return Err(AnchorError::NotEndorsed {
                subject: subject(ca),
            });
        }
        if !old_keys.contains(&key) {
            added.push(subject(ca));
        }
    }
    Ok(added)
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, IsCa, KeyPair};

    use super::*;
    use crate::testkit::TestCa;

    /// `new`'s key certified by `by`.
    fn cross(new: &TestCa, by: &TestCa) -> Vec<u8> {
        new.certified_by(by).der().to_vec()
    }

    #[test]
    fn only_endorsed_or_known_keys_are_taken() {
        let (a, b, c, evil) = (
            TestCa::new("A"),
            TestCa::new("B"),
            TestCa::new("C"),
            TestCa::new("evil"),
        );
        let trusted = vec![a.der.clone()];
        // Unchanged, and the same key re-issued.
        assert_eq!(
            check_replacement(&trusted, &trusted, &[]).expect("same"),
            Vec::<String>::new()
        );
        let mut renewed = a.params.clone();
        renewed.not_after = rcgen::date_time_ymd(2040, 1, 1);
        let renewed = renewed.self_signed(&a.key).expect("renewed").der().to_vec();
        assert!(check_replacement(&trusted, &[renewed], &[]).is_ok());
        // A stranger, alone, beside the old one, or "endorsed" by itself.
        for bundle in [
            vec![evil.der.clone()],
            vec![a.der.clone(), evil.der.clone()],
        ] {
            let err =
                check_replacement(&trusted, &bundle, &[cross(&evil, &evil)]).expect_err("refused");
            assert!(err.to_string().contains("evil"), "{err}");
        }
        // An endorsement of the stranger by another stranger.
        assert!(
            check_replacement(
                &trusted,
                std::slice::from_ref(&evil.der),
                &[cross(&evil, &b)]
            )
            .is_err()
        );
        // B endorsed by A; C by B (a chain); the old one may go.
        let added = check_replacement(
            &trusted,
            &[b.der.clone(), c.der.clone()],
            &[cross(&c, &b), cross(&b, &a)],
        )
        .expect("endorsed");
        assert_eq!(added, ["CN=B", "CN=C"]);
        // A leaf-like (not CA) cross-certificate endorses nothing.
        let mut leaf = b.params.clone();
        leaf.is_ca = IsCa::ExplicitNoCa;
        let not_ca = b.certified_with(&leaf, &a).der().to_vec();
        assert!(check_replacement(&trusted, std::slice::from_ref(&b.der), &[not_ca]).is_err());
        assert!(matches!(
            check_replacement(&trusted, &[], &[]),
            Err(AnchorError::Empty { .. })
        ));
    }

    #[test]
    fn bundles_parse_by_block() {
        let key = KeyPair::generate().expect("key");
        let a = CertificateParams::default().self_signed(&key).expect("a");
        let b = CertificateParams::default().self_signed(&key).expect("b");
        let pem = format!("{}{}{}", a.pem(), key.serialize_pem(), b.pem());
        let ders = certificates(&pem, "x").expect("two");
        assert_eq!(ders, [a.der().to_vec(), b.der().to_vec()]);
        assert!(certificates("", "x").expect("none").is_empty());
        let bad = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let err = certificates(bad, "ca.crt").expect_err("not a certificate");
        assert!(err.to_string().starts_with("ca.crt:"), "{err}");
    }
}
