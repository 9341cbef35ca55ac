//! Volume ids: `<volume>@<node>`. The id names the node, so deleting or
//! expanding a volume needs no stored state. Node names (DNS subdomains)
//! and volume names (see [`crate::names`]) never contain `@`.

use crate::error::CsiError;

/// A decoded volume id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeId {
    /// The node-local volume name (the LV, partition or directory name).
    pub volume: String,
    pub node: String,
}

impl VolumeId {
    pub fn new(volume: impl Into<String>, node: impl Into<String>) -> Self {
        VolumeId {
            volume: volume.into(),
            node: node.into(),
        }
    }

    pub fn encode(&self) -> String {
        format!("{}@{}", self.volume, self.node)
    }

    /// Parses an id. A malformed id is `NotFound` (no such volume can exist),
    /// an empty one `InvalidArgument`.
    pub fn parse(id: &str) -> Result<VolumeId, CsiError> {
        if id.is_empty() {
            return Err(CsiError::invalid("volume_id", "must not be empty"));
        }
        match id.rsplit_once('@') {
            // A snapshot's id has the same shape; it names no volume.
            Some((volume, node))
                if !volume.is_empty()
                    && !node.is_empty()
                    && !volume.contains('@')
                    && !crate::names::is_snapshot_name(volume) =>
            {
                Ok(VolumeId::new(volume, node))
            }
            _ => Err(CsiError::NotFound(format!(
                "volume {id:?} does not exist (ids look like <volume>@<node>)"
            ))),
        }
    }
}

impl std::fmt::Display for VolumeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.encode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use carina_sys::testkit::{mutated_text, noisy_text};
    use proptest::prelude::*;

    proptest! {
        /// An id of any text is refused or names the volume and node it
        /// encodes back to; a snapshot's id is never a volume's.
        #[test]
        fn volume_ids_of_any_text(
            id in prop_oneof![noisy_text(), mutated_text("pvc-1234@node-a.example.com"), "[a-z@-]{0,8}"],
        ) {
            match VolumeId::parse(&id) {
                Ok(v) => {
                    prop_assert_eq!(v.encode(), id);
                    prop_assert!(!v.volume.is_empty() && !v.node.is_empty() && !v.volume.contains('@'));
                    prop_assert!(!crate::names::is_snapshot_name(&v.volume));
                }
                Err(CsiError::InvalidArgument { .. }) => prop_assert!(id.is_empty()),
                Err(CsiError::NotFound(_)) => prop_assert!(!id.is_empty()),
                Err(e) => prop_assert!(false, "{:?}", e),
            }
        }

        /// Every id the driver makes reads back (neither volume nor node
        /// names hold `@`).
        #[test]
        fn made_ids_round_trip(csi_name in ".{0,80}", node in "[^@]{1,40}") {
            let id = VolumeId::new(crate::names::local_name(&csi_name), node);
            prop_assert_eq!(VolumeId::parse(&id.encode()).ok(), Some(id));
        }
    }

    #[test]
    fn round_trip() {
        let id = VolumeId::new("pvc-1234", "node-a.example.com");
        assert_eq!(id.encode(), "pvc-1234@node-a.example.com");
        assert_eq!(VolumeId::parse(&id.encode()).expect("parses"), id);
    }

    #[test]
    fn malformed_ids() {
        assert!(matches!(
            VolumeId::parse(""),
            Err(CsiError::InvalidArgument { .. })
        ));
        for bad in ["no-node", "@node", "vol@", "a@b@c"] {
            assert!(
                matches!(VolumeId::parse(bad), Err(CsiError::NotFound(_))),
                "{bad}"
            );
        }
    }
}
