//! From a CSI volume name (any string up to 128 bytes) to a node-local
//! volume name: kept as it is when it is plainly safe for LVM, partition
//! and directory names, otherwise `csi-` plus a hash of the name, so the
//! same CSI name always maps to the same volume (idempotency).

use sha2::{Digest, Sha256};

/// Longest CSI name kept as it is.
const MAX_KEPT: usize = 63;

/// The node-local volume name for a CSI volume name.
pub fn local_name(csi_name: &str) -> String {
    if is_plain(csi_name) {
        return csi_name.to_string();
    }
    let digest = Sha256::digest(csi_name.as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

fn is_plain(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    name.len() <= MAX_KEPT
        && first.is_ascii_alphanumeric()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '+'))
        && !name.starts_with("snapshot")
        && !name.starts_with("pvmove")
        && !name.starts_with("csi-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_are_kept() {
        assert_eq!(
            local_name("pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789"),
            "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
        );
        assert_eq!(local_name("data.1"), "data.1");
    }

    #[test]
    fn others_are_hashed_stably() {
        for odd in [
            "a b",
            "_x",
            "sanity name with spaces",
            "snapshot-1",
            "csi-abc",
            &"x".repeat(64),
            "vol/1",
            "ü",
        ] {
            let n = local_name(odd);
            assert!(n.starts_with("csi-") && n.len() == 36, "{odd:?} -> {n}");
            assert_eq!(n, local_name(odd), "stable");
        }
        assert_ne!(local_name("a b"), local_name("a  b"));
    }
}
