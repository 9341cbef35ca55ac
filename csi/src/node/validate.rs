//! Validation at the edge of the Node service: required fields, absolute
//! paths, numbers that must not be negative, and the node's view of a
//! `volume_capability` (access type, mount flags, mode, requested
//! filesystem). Pure functions; a bad field becomes `INVALID_ARGUMENT`
//! naming it.

use std::collections::HashMap;
use std::path::PathBuf;

use carina_proto::csi;
use carina_proto::csi::volume_capability::access_mode::Mode;
use carina_sys::format::FsType;
use carina_sys::mkfs::MkfsOptions;

use crate::context;
use crate::error::CsiError;
use crate::params::{parse_fs_type, parse_mkfs_options};

/// How a workload uses the volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Access {
    Block,
    Mount {
        fs_type: Option<FsType>,
        flags: Vec<String>,
    },
}

/// A validated `volume_capability`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Capability {
    pub(super) access: Access,
    pub(super) mode: Mode,
}

pub(super) fn required(field: &str, value: &str) -> Result<(), CsiError> {
    if value.is_empty() {
        return Err(CsiError::invalid(field, "must be set"));
    }
    Ok(())
}

pub(super) fn non_negative(field: &str, value: i64) -> Result<(), CsiError> {
    if value < 0 {
        return Err(CsiError::invalid(field, format!("{value} is negative")));
    }
    Ok(())
}

/// A path field that must be set and absolute.
pub(super) fn absolute(field: &str, value: &str) -> Result<PathBuf, CsiError> {
    required(field, value)?;
    if value.contains('\0') {
        return Err(CsiError::invalid(field, "must not contain NUL"));
    }
    let path = PathBuf::from(value);
    if !path.is_absolute() {
        return Err(CsiError::invalid(
            field,
            format!("{value:?} is not an absolute path"),
        ));
    }
    Ok(path)
}

/// `staging_target_path` of a publish request, which this node needs
/// because it has `STAGE_UNSTAGE_VOLUME` (the refusal says so).
pub(super) fn publish_staging(value: &str) -> Result<PathBuf, CsiError> {
    absolute("staging_target_path", value).map_err(|e| match e {
        CsiError::InvalidArgument { field, reason } => CsiError::InvalidArgument {
            field,
            reason: format!("{reason} (the node has STAGE_UNSTAGE_VOLUME)"),
        },
        e => e,
    })
}

/// Validates a volume capability with the one rule the controller uses too
/// ([`crate::capability::check`]), into the node's view of it.
pub(super) fn capability(
    field: &str,
    cap: Option<&csi::VolumeCapability>,
) -> Result<Capability, CsiError> {
    let cap = cap.ok_or_else(|| CsiError::invalid(field, "is required"))?;
    let checked = crate::capability::check(field, cap)?;
    let access = match checked.access {
        crate::capability::Access::Block => Access::Block,
        // One option per flag (`noatime,ro` is two), so a flag is
        // compared as the kernel lists it.
        crate::capability::Access::Mount { fs_type } => Access::Mount {
            fs_type,
            flags: checked
                .mount_flags
                .iter()
                .flat_map(|f| f.split(','))
                .map(str::to_string)
                .collect(),
        },
    };
    Ok(Capability {
        access,
        mode: checked.mode,
    })
}

/// The filesystem asked for: the capability's, else the volume context's
/// (the StorageClass parameter), else none (ext4 when formatting).
pub(super) fn requested_fs(
    cap: &Capability,
    volume_context: &HashMap<String, String>,
) -> Result<Option<FsType>, CsiError> {
    match &cap.access {
        Access::Block => Ok(None),
        Access::Mount {
            fs_type: Some(fs), ..
        } => Ok(Some(*fs)),
        Access::Mount { fs_type: None, .. } => match volume_context.get(context::FS_TYPE) {
            Some(v) if !v.is_empty() => Ok(Some(parse_fs_type(
                &format!("volume_context[{:?}]", context::FS_TYPE),
                v,
            )?)),
            _ => Ok(None),
        },
    }
}

/// The class's mkfs options from the volume context, checked for the
/// filesystem a blank device would get (`requested`, ext4 when none).
pub(super) fn mkfs_options(
    requested: Option<FsType>,
    volume_context: &HashMap<String, String>,
) -> Result<MkfsOptions, CsiError> {
    let Some(text) = volume_context.get(context::MKFS_OPTIONS) else {
        return Ok(MkfsOptions::default());
    };
    parse_mkfs_options(
        &format!("volume_context[{:?}]", context::MKFS_OPTIONS),
        requested,
        text,
    )
}

/// `capacity_range.required_bytes` of an expand request (0 without a
/// range); neither bound may be negative.
pub(super) fn required_bytes(range: Option<&csi::CapacityRange>) -> Result<u64, CsiError> {
    match range {
        Some(r) => {
            non_negative("capacity_range.required_bytes", r.required_bytes)?;
            non_negative("capacity_range.limit_bytes", r.limit_bytes)?;
            Ok(r.required_bytes.unsigned_abs())
        }
        None => Ok(0),
    }
}

/// Whether a publication is read-only: asked so, or by the access mode.
pub(super) fn publish_read_only(readonly: bool, cap: &Capability) -> bool {
    readonly || cap.mode == Mode::SingleNodeReaderOnly
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capability::testing::{block, cap, mount};
    use carina_sys::testkit::noisy_text;
    use proptest::prelude::*;

    proptest! {
        /// A path field of any text is refused with INVALID_ARGUMENT
        /// naming it, or is that text as an absolute path.
        #[test]
        fn path_fields_of_any_text(value in prop_oneof![noisy_text(), "/?[a-z/.\u{0}]{0,12}"]) {
            match publish_staging(&value) {
                Ok(path) => {
                    prop_assert!(path.is_absolute() && !value.contains('\0'));
                    prop_assert_eq!(path.to_str(), Some(value.as_str()));
                }
                Err(CsiError::InvalidArgument { field, reason }) => {
                    prop_assert_eq!(field, "staging_target_path");
                    prop_assert!(reason.contains("STAGE_UNSTAGE_VOLUME"));
                }
                Err(e) => prop_assert!(false, "{:?}", e),
            }
        }
    }

    #[test]
    fn requested_fs_prefers_the_capability() {
        let ctx = HashMap::from([(context::FS_TYPE.to_string(), "xfs".to_string())]);
        let c = capability("c", Some(&cap(Mode::SingleNodeWriter, mount("ext4")))).expect("ok");
        assert_eq!(requested_fs(&c, &ctx).expect("ok"), Some(FsType::Ext4));
        let c = capability("c", Some(&cap(Mode::SingleNodeWriter, mount("")))).expect("ok");
        assert_eq!(requested_fs(&c, &ctx).expect("ok"), Some(FsType::Xfs));
        assert_eq!(requested_fs(&c, &HashMap::new()).expect("ok"), None);
    }

    #[test]
    fn paths_must_be_set_absolute_and_without_nul() {
        assert_eq!(absolute("p", "/a/b").expect("ok"), PathBuf::from("/a/b"));
        for bad in ["", "a/b", "/a\0b"] {
            let err = absolute("p", bad).expect_err("refused");
            assert!(
                matches!(&err, CsiError::InvalidArgument { field, .. } if field == "p"),
                "{bad:?}: {err:?}"
            );
        }
        let err = publish_staging("").expect_err("refused");
        assert!(
            matches!(&err, CsiError::InvalidArgument { field, reason }
                if field == "staging_target_path" && reason.contains("STAGE_UNSTAGE_VOLUME")),
            "{err:?}"
        );
    }

    #[test]
    fn capacity_bounds_must_not_be_negative() {
        assert_eq!(required_bytes(None).expect("ok"), 0);
        let range = |required_bytes, limit_bytes| csi::CapacityRange {
            required_bytes,
            limit_bytes,
        };
        assert_eq!(required_bytes(Some(&range(5, 0))).expect("ok"), 5);
        for (r, field) in [
            (range(-1, 0), "capacity_range.required_bytes"),
            (range(1, -1), "capacity_range.limit_bytes"),
        ] {
            let err = required_bytes(Some(&r)).expect_err("refused");
            assert!(
                matches!(&err, CsiError::InvalidArgument { field: f, .. } if f == field),
                "{err:?}"
            );
        }
    }

    #[test]
    fn reader_only_mode_publishes_read_only() {
        let c = capability("c", Some(&cap(Mode::SingleNodeReaderOnly, block()))).expect("ok");
        assert!(publish_read_only(false, &c));
        let c = capability("c", Some(&cap(Mode::SingleNodeWriter, block()))).expect("ok");
        assert!(!publish_read_only(false, &c));
        assert!(publish_read_only(true, &c));
    }
}
