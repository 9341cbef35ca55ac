//! What the published ConfigMap holds: the trust anchors of the CA in use
//! (`ca.crt`) and the cross-certificates that let the nodes move to them
//! ([`ENDORSEMENTS_KEY`]).
//!
//! The nodes take a new anchor only when a CA they trust endorses it
//! (`carina_proto::anchors`). The controller endorses when the CA Secret
//! is replaced while it runs: it still holds the old key in memory, so it
//! signs a cross-certificate for each new anchor and publishes old and
//! new anchors together; the nodes then trust both, and the controllers
//! restarted on the new CA keep the endorsements published (they are read
//! back from the ConfigMap, never made without the old key), so a node
//! that was down meanwhile still moves to the new anchors on its return.
//!
//! Endorsements are public (anyone may read them; only the holder of a
//! trusted key can make one), so they live in the ConfigMap; the
//! controller keeps only those that vouch for an anchor it publishes.

use carina_proto::anchors::{self, certificates, public_key};
use x509_parser::pem::Pem;

use super::ca::{CaError, ClusterCa};

pub use carina_proto::anchors::ENDORSEMENTS_KEY;

/// The content of the published ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publication {
    /// `ca.crt`: the anchors.
    pub bundle_pem: String,
    /// [`ENDORSEMENTS_KEY`]: the cross-certificates.
    pub endorsements_pem: String,
    /// Subjects of the anchors endorsed just now.
    pub endorsed: Vec<String>,
}

/// `der` as a PEM `CERTIFICATE` block.
fn pem(der: &[u8]) -> String {
    use base64::Engine as _;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in text.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// What to publish for the CA in use `ca`, given the endorsements
/// published now (`current`, unchecked text from the ConfigMap) and, when
/// the Secret holds another CA, that `successor`: its anchors are added
/// and endorsed by `ca` (an endorsement `ca` made earlier is reused).
pub fn publication(
    ca: &ClusterCa,
    current: &str,
    successor: Option<&ClusterCa>,
) -> Result<Publication, CaError> {
    let invalid = |e: anchors::AnchorError| CaError::Invalid {
        what: "bundle",
        reason: e.to_string(),
    };
    let ours = certificates(ca.bundle_pem(), "ca.crt").map_err(invalid)?;
    let mut anchors = ours.clone();
    let mut bundle_pem = ca.bundle_pem().to_string();
    let mut keys: Vec<Vec<u8>> = ours.iter().filter_map(|d| public_key(d)).collect();
    let mut new_anchors = Vec::new();
    if let Some(next) = successor {
        for der in certificates(next.bundle_pem(), "ca.crt").map_err(invalid)? {
            let Some(key) = public_key(&der) else {
                continue;
            };
            if !keys.contains(&key) {
                keys.push(key);
                bundle_pem.push_str(&pem(&der));
                anchors.push(der.clone());
                new_anchors.push(der);
            }
        }
    }
    // What is published and still vouches for one of our anchors; text
    // that does not parse is dropped (anyone who can write the ConfigMap
    // can put it there).
    let mut kept: Vec<Vec<u8>> = Vec::new();
    for block in Pem::iter_from_buffer(current.as_bytes()).flatten() {
        if block.label == "CERTIFICATE"
            && public_key(&block.contents).is_some_and(|k| keys.contains(&k))
            && !kept.contains(&block.contents)
        {
            kept.push(block.contents);
        }
    }
    let signer = ca.signing_cert_der();
    let mut endorsed = Vec::new();
    for der in &new_anchors {
        let Some(key) = public_key(der) else {
            continue;
        };
        if kept.iter().any(|e| anchors::endorses(e, &key, &signer)) {
            continue;
        }
        let cross = ca.endorse(der)?;
        kept.extend(certificates(&cross, "endorsement").map_err(invalid)?);
        endorsed.push(
            x509_parser::parse_x509_certificate(der)
                .map(|(_, c)| c.subject().to_string())
                .unwrap_or_default(),
        );
    }
    // A signing certificate that is not itself an anchor (an intermediate
    // under the published root): its chain goes along, so the nodes can
    // follow from the root to the endorsing key.
    if !new_anchors.is_empty() || !kept.is_empty() {
        for der in certificates(ca.cert_pem(), "tls.crt").map_err(invalid)? {
            if !ours.contains(&der) && !kept.contains(&der) {
                kept.push(der);
            }
        }
    }
    Ok(Publication {
        bundle_pem,
        endorsements_pem: kept.iter().map(|d| pem(d)).collect(),
        endorsed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ders(pem: &str) -> Vec<Vec<u8>> {
        certificates(pem, "test").expect("parses")
    }

    #[test]
    fn a_replaced_ca_is_endorsed_once_and_the_endorsement_outlives_the_old_key() {
        let old = ClusterCa::generate("old").expect("CA");
        let new = ClusterCa::generate("new").expect("CA");
        // Nothing to endorse: the anchors alone.
        let alone = publication(&old, "", None).expect("publication");
        assert_eq!(alone.bundle_pem, old.bundle_pem());
        assert_eq!(alone.endorsements_pem, "");

        // The Secret now holds `new`: both anchors, `new` endorsed by `old`.
        let moving = publication(&old, "", Some(&new)).expect("publication");
        assert_eq!(moving.endorsed, ["CN=new"]);
        assert_eq!(ders(&moving.bundle_pem).len(), 2);
        let endorsements = ders(&moving.endorsements_pem);
        assert_eq!(endorsements.len(), 1);
        let trusted = ders(old.bundle_pem());
        let added = anchors::check_replacement(&trusted, &ders(&moving.bundle_pem), &endorsements)
            .expect("a node trusting old takes both");
        assert_eq!(added, ["CN=new"]);
        // The next round (or the other replica) reuses it.
        let again = publication(&old, &moving.endorsements_pem, Some(&new)).expect("again");
        assert!(again.endorsed.is_empty());
        assert_eq!(again.endorsements_pem, moving.endorsements_pem);

        // Restarted on `new`: only its anchor, the endorsement kept, junk
        // and endorsements of strangers dropped.
        let stranger = ClusterCa::generate("stranger").expect("CA");
        let junk = format!(
            "{}{}not pem\n",
            moving.endorsements_pem,
            old.endorse(&ders(stranger.bundle_pem())[0]).expect("cross")
        );
        let after = publication(&new, &junk, None).expect("after");
        assert_eq!(after.bundle_pem, new.bundle_pem());
        assert_eq!(after.endorsements_pem, moving.endorsements_pem);
        assert!(
            anchors::check_replacement(
                &trusted,
                &ders(&after.bundle_pem),
                &ders(&after.endorsements_pem)
            )
            .is_ok(),
            "a node that missed the move follows"
        );
        // Without the old key nobody can make one: a bundle naming a
        // stranger is refused by a node trusting old.
        assert!(anchors::check_replacement(&trusted, &ders(stranger.bundle_pem()), &[]).is_err());
    }
}
