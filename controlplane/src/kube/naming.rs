//! Names in the Kubernetes control plane: a `LogicVolume`'s object name is
//! also the node-local volume name, so it must satisfy both Kubernetes
//! (a DNS-1123 subdomain) and the node (LVM, partition and directory
//! names). CSI names that do not fit both are hashed, deterministically,
//! so the same CSI name always finds the same object.

use sha2::{Digest, Sha256};

/// Longest name kept as it is.
const MAX_KEPT: usize = 63;

/// The `LogicVolume` object name (= node-local volume name) for a CSI
/// volume name.
pub fn object_name(csi_name: &str) -> String {
    if is_plain(csi_name) {
        return csi_name.to_string();
    }
    let digest = Sha256::digest(csi_name.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

fn is_plain(name: &str) -> bool {
    let bytes = name.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    name.len() <= MAX_KEPT
        && (first.is_ascii_lowercase() || first.is_ascii_digit())
        && (last.is_ascii_lowercase() || last.is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-' || *b == b'.')
        && !name.contains("..")
        && !name.starts_with("snapshot")
        && !name.starts_with("pvmove")
        && !name.starts_with("csi-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_pv_names_are_kept() {
        let pv = "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        assert_eq!(object_name(pv), pv);
    }

    #[test]
    fn others_hash_to_valid_stable_names() {
        for odd in [
            "sanity-controller-create-4D9A8C1E-29F1BAA6",
            "Upper",
            "a_b",
            "-x",
            "x-",
            "a..b",
            "snapshot-1",
            "csi-abc",
            "",
            &"x".repeat(64),
        ] {
            let n = object_name(odd);
            assert!(n.starts_with("csi-") && n.len() == 36, "{odd:?} -> {n}");
            assert!(
                n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            );
            assert_eq!(n, object_name(odd));
        }
    }
}
