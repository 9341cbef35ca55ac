//! Snapshots' names and ids. A snapshot is a volume on its source's node
//! (a complete, read-only copy), named `csi-s` plus 32 hex digits of the
//! SHA-256 of its CSI name: never a name [`crate::names::local_name`]
//! gives a volume (a hashed volume name has only hex digits after
//! `csi-`), so a snapshot id cannot be taken for a volume id nor the
//! other way round. The id is `<snapshot>@<node>`, like a volume id.

use crate::error::CsiError;
pub use crate::names::{is_snapshot_name, local_snapshot_name};
use crate::volume_id::VolumeId;

/// Parses a snapshot id: empty is `InvalidArgument` naming `field`, and
/// an id no snapshot of ours can have is `NotFound`.
pub fn parse(field: &str, id: &str) -> Result<VolumeId, CsiError> {
    if id.is_empty() {
        return Err(CsiError::invalid(field, "must not be empty"));
    }
    let not_found = || {
        CsiError::NotFound(format!(
            "snapshot {id:?} does not exist (ids look like csi-s<32 hex digits>@<node>)"
        ))
    };
    match id.rsplit_once('@') {
        Some((name, node)) if is_snapshot_name(name) && !node.is_empty() => {
            Ok(VolumeId::new(name, node))
        }
        _ => Err(not_found()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{is_local_name, local_name};

    proptest::proptest! {
        /// A snapshot id of any text is refused or names a snapshot and
        /// node it encodes back to.
        #[test]
        fn snapshot_ids_of_any_text(
            id in proptest::prelude::prop_oneof![
                carina_sys::testkit::noisy_text(),
                carina_sys::testkit::mutated_text("csi-s0123456789abcdef0123456789abcdef@node-a"),
            ],
            csi_name in ".{0,40}",
            node in "[^@]{0,20}",
        ) {
            match parse("snapshot_id", &id) {
                Ok(v) => {
                    proptest::prop_assert!(is_snapshot_name(&v.volume) && !v.node.is_empty());
                    proptest::prop_assert_eq!(v.encode(), id);
                }
                Err(e) => proptest::prop_assert!(matches!(e, CsiError::NotFound(_)) || id.is_empty(), "{:?}", e),
            }
            let made = format!("{}@{node}", local_snapshot_name(&csi_name));
            proptest::prop_assert_eq!(parse("snapshot_id", &made).is_ok(), !node.is_empty());
        }

        /// No CSI name gives a snapshot the name a volume can have.
        #[test]
        fn snapshot_and_volume_names_never_meet(a in ".{0,200}", b in ".{0,200}") {
            let snap = local_snapshot_name(&a);
            proptest::prop_assert!(is_snapshot_name(&snap));
            proptest::prop_assert!(!is_local_name(&snap));
            proptest::prop_assert!(!is_snapshot_name(&local_name(&b)));
            proptest::prop_assert_eq!(snap, local_snapshot_name(&a));
        }
    }

    #[test]
    fn ids_parse_and_refuse() {
        let id = format!("{}@node-a", local_snapshot_name("snap-1"));
        let parsed = parse("snapshot_id", &id).expect("works");
        assert_eq!(parsed.node, "node-a");
        assert_eq!(parsed.encode(), id);
        assert_eq!(
            parse("snapshot_id", "").expect_err("refused").code(),
            tonic::Code::InvalidArgument
        );
        for bad in [
            "pvc-1@node-a",
            "csi-s12@node-a",
            "x",
            &format!("{}@", local_snapshot_name("a")),
        ] {
            assert_eq!(
                parse("snapshot_id", bad).expect_err("refused").code(),
                tonic::Code::NotFound,
                "{bad}"
            );
        }
    }
}
