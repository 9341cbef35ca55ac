//! The one rule from a CSI volume name (any string up to 128 bytes) to the
//! volume's name everywhere else: the node-local volume (LVM LV, partition,
//! directory), the `LogicVolume` object in Kubernetes, the in-flight key of
//! the controller and the volume id in direct mode.
//!
//! A name is kept as it is when it is plainly safe for all of them: at most
//! 63 bytes of lower-case letters, digits, `-` and `.` (a DNS-1123
//! subdomain, which LVM, GPT names and directories also accept), starting
//! and ending with a letter or digit, no `..`, and none of the prefixes LVM
//! reserves (`snapshot`, `pvmove`) or ours (`csi-`). Any other name becomes
//! `csi-` plus 32 hex digits of its SHA-256, so the same CSI name always
//! maps to the same volume (idempotency) and different names to different
//! volumes.
//!
//! Node names, which volume ids and topology segments carry, are
//! Kubernetes node names: DNS subdomains ([`is_node_name`]).

use sha2::{Digest, Sha256};

/// Longest CSI name kept as it is.
const MAX_KEPT: usize = 63;
/// Prefix of hashed names.
const HASHED_PREFIX: &str = "csi-";
/// Hex digits of the hash in a hashed name.
const HASH_HEX: usize = 32;

/// The volume name for a CSI volume name.
pub fn local_name(csi_name: &str) -> String {
    if is_plain(csi_name) {
        return csi_name.to_string();
    }
    hashed(HASHED_PREFIX, csi_name)
}

/// `prefix` and the first [`HASH_HEX`] hex digits of the SHA-256 of
/// `csi_name`.
pub(crate) fn hashed(prefix: &str, csi_name: &str) -> String {
    let digest = Sha256::digest(csi_name.as_bytes());
    let hex: String = digest
        .iter()
        .take(HASH_HEX / 2)
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{prefix}{hex}")
}

/// What a snapshot's node-local name starts with ([`local_snapshot_name`]).
const SNAPSHOT_PREFIX: &str = "csi-s";

/// The node-local volume name of the snapshot named `csi_name`.
pub fn local_snapshot_name(csi_name: &str) -> String {
    hashed(SNAPSHOT_PREFIX, csi_name)
}

/// Whether `name` is a name [`local_snapshot_name`] can return.
pub fn is_snapshot_name(name: &str) -> bool {
    name.strip_prefix(SNAPSHOT_PREFIX).is_some_and(is_hash)
}

/// Whether `rest` is [`HASH_HEX`] lower-case hex digits.
pub(crate) fn is_hash(rest: &str) -> bool {
    rest.len() == HASH_HEX
        && rest
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Whether `name` is a name [`local_name`] can return: anything else
/// cannot name a volume we made, so a lookup can answer "not found"
/// without asking anyone.
pub fn is_local_name(name: &str) -> bool {
    let hashed = name.strip_prefix(HASHED_PREFIX).is_some_and(is_hash);
    hashed || is_plain(name)
}

/// Whether `name` can be a Kubernetes node name: a DNS subdomain (RFC
/// 1123: at most 253 bytes, dot-separated labels of at most 63 lower-case
/// letters, digits and inner hyphens).
pub fn is_node_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && label.starts_with(|c: char| c.is_ascii_alphanumeric())
                && label.ends_with(|c: char| c.is_ascii_alphanumeric())
        })
}

fn is_plain(name: &str) -> bool {
    let bytes = name.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    name.len() <= MAX_KEPT
        && alnum(first)
        && alnum(last)
        && bytes.iter().all(|b| alnum(b) || matches!(b, b'-' | b'.'))
        && !name.contains("..")
        && !name.starts_with("snapshot")
        && !name.starts_with("pvmove")
        && !name.starts_with(HASHED_PREFIX)
}

#[cfg(test)]
mod tests {

    proptest::proptest! {
        /// Every CSI name maps to a name `is_local_name` accepts, the same
        /// every time.
        #[test]
        fn any_csi_name_has_one_local_name(name in ".{0,300}") {
            let local = super::local_name(&name);
            proptest::prop_assert!(super::is_local_name(&local), "{:?} -> {:?}", name, local);
            proptest::prop_assert_eq!(super::local_name(&name), local);
        }
    }
    use super::*;

    #[test]
    fn plain_names_are_kept() {
        for plain in ["pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789", "data.1", "a"] {
            assert_eq!(local_name(plain), plain);
            assert!(is_local_name(plain));
        }
    }

    #[test]
    fn others_are_hashed_stably() {
        for odd in [
            "a b",
            "_x",
            "sanity name with spaces",
            "sanity-controller-create-4D9A8C1E-29F1BAA6",
            "Upper",
            "a_b",
            "a+b",
            "-x",
            "x-",
            "a..b",
            "snapshot-1",
            "pvmove0",
            "csi-abc",
            "",
            &"x".repeat(64),
            "vol/1",
            "ü",
        ] {
            let n = local_name(odd);
            assert!(n.starts_with("csi-") && n.len() == 36, "{odd:?} -> {n}");
            assert!(
                n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{n}"
            );
            assert_eq!(n, local_name(odd), "stable");
            assert!(is_local_name(&n));
            assert!(!is_local_name(odd), "{odd:?} is no volume name");
        }
        assert_ne!(local_name("a b"), local_name("a  b"));
        assert_ne!(local_name("Upper"), local_name("upper"));
        assert!(!is_local_name("csi-0123456789ABCDEF0123456789abcdef"));
    }

    #[test]
    fn node_names_are_dns_subdomains() {
        for good in ["node-a", "a", "n1.example.com", &"a".repeat(63)] {
            assert!(is_node_name(good), "{good:?}");
        }
        let long = format!("{}.a", vec!["a".repeat(63); 4].join("."));
        for bad in [
            "",
            "Node-A",
            "-a",
            "a-",
            "a..b",
            ".a",
            "a.",
            "a_b",
            "a b",
            "a@b",
            "a\n",
            "ü",
            "../",
            &"a".repeat(64),
            &long,
        ] {
            assert!(!is_node_name(bad), "{bad:?}");
        }
    }
}
