//! Volume ids Go Carina wrote, which PersistentVolumes keep for their
//! whole life (`volumeHandle` is immutable).
//!
//! Go Carina named a volume after its `LogicVolume` object (the
//! PersistentVolume's name) and wrote the id `volume-<name>` for LVM and
//! RAW volumes, `host-<name>` for HOST volumes and, up to v0.10,
//! `thin-<name>` for volumes in a thin pool. None holds `@`, so none is
//! also an id of ours ([`crate::volume_id`]).
//!
//! A Go volume this project took over keeps its Go id as its node-local
//! name: the LV stays `volume-<name>`, the HOST directory `host-<name>`,
//! and a RAW partition is relabelled `volume-<name>`. [`VolumeHandle`]
//! reads either kind of id; the node a Go id names is not in the id and
//! comes from the caller (the node itself, or the `LogicVolume`).

use crate::error::CsiError;
use crate::volume_id::VolumeId;

/// What a Go Carina volume id says about its volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegacyKind {
    /// `volume-<name>`: an LVM logical volume or a RAW partition (the id
    /// does not say which; the `LogicVolume`'s group or the node does).
    Block,
    /// `host-<name>`: a directory under a HOST group's root.
    Host,
    /// `thin-<name>`: a volume in an LVM thin pool (Go Carina up to
    /// v0.10), which this project does not serve.
    Thin,
}

impl LegacyKind {
    /// The prefix Go Carina put before the object name.
    pub fn prefix(self) -> &'static str {
        match self {
            LegacyKind::Block => "volume-",
            LegacyKind::Host => "host-",
            LegacyKind::Thin => "thin-",
        }
    }
}

/// A Go Carina volume id, e.g. `volume-pvc-0b6f…`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyId {
    pub kind: LegacyKind,
    /// The `LogicVolume` object's name (the PersistentVolume's name).
    pub object: String,
}

impl LegacyId {
    /// Reads `id` as a Go Carina id: one of the three prefixes before a
    /// Kubernetes object name (a DNS-1123 subdomain). `None` for anything
    /// else, including every id of ours.
    pub fn parse(id: &str) -> Option<LegacyId> {
        [LegacyKind::Block, LegacyKind::Host, LegacyKind::Thin]
            .into_iter()
            .find_map(|kind| {
                let object = id.strip_prefix(kind.prefix())?;
                is_object_name(object).then(|| LegacyId {
                    kind,
                    object: object.to_string(),
                })
            })
    }

    /// The id as Go wrote it; also the volume's name on its node once
    /// taken over.
    pub fn encode(&self) -> String {
        format!("{}{}", self.kind.prefix(), self.object)
    }

    /// The name Go Carina gave a RAW partition of this volume:
    /// `carina.io/` and the part of the object name after its last `-`.
    pub fn go_partition_name(&self) -> String {
        let tail = self.object.rsplit('-').next().unwrap_or(&self.object);
        format!("carina.io/{tail}")
    }

    /// `FAILED_PRECONDITION` for a thin volume, which nothing here serves.
    pub fn refuse_thin(&self) -> Result<(), CsiError> {
        if self.kind == LegacyKind::Thin {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {:?} is in a Go Carina thin pool (Go Carina v0.10 or older); \
                 thin volumes are not taken over: copy the data to a new claim",
                self.encode()
            )));
        }
        Ok(())
    }
}

impl std::fmt::Display for LegacyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.encode())
    }
}

/// A volume id of either kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeHandle {
    /// `<volume>@<node>`, made by this project.
    Ours(VolumeId),
    /// An id Go Carina made.
    Go(LegacyId),
}

impl VolumeHandle {
    /// Reads an id: ours first, then Go's. Errors as
    /// [`VolumeId::parse`]: empty is `INVALID_ARGUMENT`, anything else
    /// that is neither is `NOT_FOUND`.
    pub fn parse(id: &str) -> Result<VolumeHandle, CsiError> {
        match VolumeId::parse(id) {
            Ok(ours) => Ok(VolumeHandle::Ours(ours)),
            Err(e) => LegacyId::parse(id).map(VolumeHandle::Go).ok_or(e),
        }
    }

    /// The volume's name on its node: ours, or the Go id itself.
    pub fn local_name(&self) -> String {
        match self {
            VolumeHandle::Ours(id) => id.volume.clone(),
            VolumeHandle::Go(id) => id.encode(),
        }
    }
}

/// Whether `name` is a Kubernetes object name (DNS-1123 subdomain): at
/// most 253 bytes of lower-case letters, digits, `-` and `.`, starting and
/// ending with a letter or digit.
fn is_object_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    name.len() <= 253
        && alnum(first)
        && alnum(last)
        && bytes.iter().all(|b| alnum(b) || matches!(b, b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use carina_sys::testkit::noisy_text;
    use proptest::prelude::*;

    const PV: &str = "pvc-0b6f3c2e-5d1a-4c59-9f7e-2a1b3c4d5e6f";

    #[test]
    fn go_ids_read_back() {
        for (kind, prefix) in [
            (LegacyKind::Block, "volume-"),
            (LegacyKind::Host, "host-"),
            (LegacyKind::Thin, "thin-"),
        ] {
            let id = format!("{prefix}{PV}");
            let legacy = LegacyId::parse(&id).expect("a Go id");
            assert_eq!(legacy.kind, kind);
            assert_eq!(legacy.object, PV);
            assert_eq!(legacy.encode(), id);
            let handle = VolumeHandle::parse(&id).expect("parses");
            assert_eq!(handle, VolumeHandle::Go(legacy));
            assert_eq!(handle.local_name(), id);
        }
    }

    #[test]
    fn go_partition_names_are_the_last_segment() {
        let legacy = LegacyId::parse(&format!("volume-{PV}")).expect("a Go id");
        assert_eq!(legacy.go_partition_name(), "carina.io/2a1b3c4d5e6f");
    }

    #[test]
    fn ours_win_and_other_ids_are_not_go_ids() {
        let ours = format!("volume-{PV}@node-a");
        assert_eq!(
            VolumeHandle::parse(&ours).expect("parses"),
            VolumeHandle::Ours(VolumeId::new(format!("volume-{PV}"), "node-a"))
        );
        for not_go in [
            "volume-",
            "host-",
            "volume-Upper",
            "volume--x",
            "pvc-1",
            "vol-x",
        ] {
            assert_eq!(LegacyId::parse(not_go), None, "{not_go}");
            assert!(
                matches!(VolumeHandle::parse(not_go), Err(CsiError::NotFound(_))),
                "{not_go}"
            );
        }
        assert!(matches!(
            VolumeHandle::parse(""),
            Err(CsiError::InvalidArgument { .. })
        ));
    }

    #[test]
    fn thin_volumes_are_refused_with_a_reason() {
        let thin = LegacyId::parse(&format!("thin-{PV}")).expect("a Go id");
        match thin.refuse_thin() {
            Err(CsiError::FailedPrecondition(m)) => assert!(m.contains("thin pool"), "{m}"),
            other => panic!("{other:?}"),
        }
        let block = LegacyId::parse(&format!("volume-{PV}")).expect("a Go id");
        assert!(block.refuse_thin().is_ok());
    }

    proptest! {
        /// Any text is one kind of id, or neither, never both; a Go id
        /// encodes back to itself.
        #[test]
        fn handles_of_any_text(id in prop_oneof![noisy_text(), "(volume|host|thin)-[a-z0-9.@-]{0,12}"]) {
            match VolumeHandle::parse(&id) {
                Ok(VolumeHandle::Go(g)) => {
                    prop_assert_eq!(g.encode(), id.clone());
                    prop_assert!(!id.contains('@'));
                }
                Ok(VolumeHandle::Ours(o)) => prop_assert_eq!(o.encode(), id),
                Err(_) => prop_assert!(LegacyId::parse(&id).is_none()),
            }
        }
    }
}
