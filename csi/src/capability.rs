//! The one validation of a CSI `VolumeCapability`, shared by the
//! Controller (CreateVolume, ValidateVolumeCapabilities, ControllerExpand)
//! and the Node service (NodeStage, NodePublish, NodeExpand): a
//! single-node access mode (a Carina volume lives on one node), block or a
//! mount with a file system the node can make, no `volume_mount_group`
//! (not advertised), no empty mount flag. Every error is
//! `INVALID_ARGUMENT` naming the field path under `field`.

use carina_proto::csi;
use carina_proto::csi::volume_capability::AccessType;
use carina_proto::csi::volume_capability::access_mode::Mode;

use crate::error::CsiError;
use crate::params::{FsType, parse_fs_type};

/// How a volume is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A raw block device.
    Block,
    /// A mounted file system; `None` is the node's default.
    Mount { fs_type: Option<FsType> },
}

/// One validated capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    pub mode: Mode,
    pub access: Access,
    /// Mount flags of a mount capability (empty for block).
    pub mount_flags: Vec<String>,
}

/// Validates one capability; `field` is its path in the request
/// (`volume_capability`, `volume_capabilities[1]`).
pub fn check(field: &str, cap: &csi::VolumeCapability) -> Result<Capability, CsiError> {
    let mode_field = format!("{field}.access_mode");
    let raw = cap
        .access_mode
        .as_ref()
        .ok_or_else(|| CsiError::invalid(&mode_field, "is required"))?
        .mode;
    let mode_field = mode_field + ".mode";
    let mode = Mode::try_from(raw)
        .map_err(|_| CsiError::invalid(&mode_field, format!("unknown access mode {raw}")))?;
    match mode {
        Mode::SingleNodeWriter
        | Mode::SingleNodeReaderOnly
        | Mode::SingleNodeSingleWriter
        | Mode::SingleNodeMultiWriter => {}
        Mode::Unknown => return Err(CsiError::invalid(&mode_field, "is required")),
        Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter => {
            return Err(CsiError::invalid(
                &mode_field,
                format!(
                    "{} is not supported: a Carina volume lives on one node",
                    mode.as_str_name()
                ),
            ));
        }
    }
    let (access, mount_flags) = match &cap.access_type {
        None => {
            return Err(CsiError::invalid(
                format!("{field}.access_type"),
                "block or mount is required",
            ));
        }
        Some(AccessType::Block(_)) => (Access::Block, Vec::new()),
        Some(AccessType::Mount(m)) => {
            if !m.volume_mount_group.is_empty() {
                return Err(CsiError::invalid(
                    format!("{field}.mount.volume_mount_group"),
                    "is not supported (the node has no VOLUME_MOUNT_GROUP capability)",
                ));
            }
            for (i, flag) in m.mount_flags.iter().enumerate() {
                let field = format!("{field}.mount.mount_flags[{i}]");
                if flag.is_empty() {
                    return Err(CsiError::invalid(field, "must not be empty"));
                }
                carina_sys::mount_options::check(flag)
                    .map_err(|why| CsiError::invalid(field, why))?;
            }
            let fs_type = if m.fs_type.is_empty() {
                None
            } else {
                Some(parse_fs_type(
                    &format!("{field}.mount.fs_type"),
                    &m.fs_type,
                )?)
            };
            (Access::Mount { fs_type }, m.mount_flags.clone())
        }
    };
    Ok(Capability {
        mode,
        access,
        mount_flags,
    })
}

/// Validates the capabilities of one volume: at least one, each valid,
/// all block or all mount, and no two file systems. Returns how the volume
/// is used.
pub fn check_all(field: &str, caps: &[csi::VolumeCapability]) -> Result<Access, CsiError> {
    let mut access: Option<Access> = None;
    for (i, cap) in caps.iter().enumerate() {
        let this_field = format!("{field}[{i}]");
        let this = check(&this_field, cap)?.access;
        access = Some(match (access, this) {
            (None, a) => a,
            (Some(Access::Block), Access::Block) => Access::Block,
            (Some(Access::Mount { fs_type: a }), Access::Mount { fs_type: b }) => match (a, b) {
                (Some(a), Some(b)) if a != b => {
                    return Err(CsiError::invalid(
                        this_field + ".mount.fs_type",
                        format!(
                            "{} conflicts with {} of an earlier capability",
                            b.as_str(),
                            a.as_str()
                        ),
                    ));
                }
                (a, b) => Access::Mount { fs_type: a.or(b) },
            },
            _ => {
                return Err(CsiError::invalid(
                    this_field + ".access_type",
                    "a volume is either block or mount, not both",
                ));
            }
        });
    }
    access.ok_or_else(|| CsiError::invalid(field, "at least one capability is required"))
}

/// Capabilities for the unit tests of this crate.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    pub(crate) fn cap(mode: Mode, access: AccessType) -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
            access_type: Some(access),
        }
    }

    pub(crate) fn mount(fs: &str) -> AccessType {
        AccessType::Mount(csi::volume_capability::MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })
    }

    pub(crate) fn block() -> AccessType {
        AccessType::Block(csi::volume_capability::BlockVolume {})
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{block, cap, mount};
    use super::*;
    use carina_sys::testkit::noisy_text;
    use proptest::prelude::*;

    fn any_access() -> impl Strategy<Value = Option<AccessType>> {
        let text = || {
            prop_oneof![
                Just(String::new()),
                Just("ext4".to_string()),
                Just("xfs".to_string()),
                noisy_text()
            ]
        };
        prop_oneof![
            Just(None),
            Just(Some(block())),
            (text(), prop::collection::vec(text(), 0..3), text()).prop_map(
                |(fs_type, mount_flags, group)| {
                    Some(AccessType::Mount(csi::volume_capability::MountVolume {
                        fs_type,
                        mount_flags,
                        volume_mount_group: group,
                    }))
                }
            ),
        ]
    }

    fn any_capability() -> impl Strategy<Value = csi::VolumeCapability> {
        (
            proptest::option::of(prop_oneof![-2i32..8, any::<i32>()]),
            any_access(),
        )
            .prop_map(|(mode, access_type)| csi::VolumeCapability {
                access_mode: mode.map(|mode| csi::volume_capability::AccessMode { mode }),
                access_type,
            })
    }

    proptest! {
        /// A capability of any mode and access is refused with
        /// INVALID_ARGUMENT under its field, or taken with the rule the
        /// module states: single-node, block or a known file system, no
        /// mount group, no empty flag.
        #[test]
        fn capabilities_of_any_content(c in any_capability()) {
            match check("volume_capability", &c) {
                Ok(checked) => {
                    prop_assert!(checked.mode.as_str_name().starts_with("SINGLE_NODE"), "{:?}", checked.mode);
                    prop_assert_eq!(checked.mode as i32, c.access_mode.expect("a mode").mode);
                    match (&c.access_type, checked.access) {
                        (Some(AccessType::Block(_)), Access::Block) => prop_assert!(checked.mount_flags.is_empty()),
                        (Some(AccessType::Mount(m)), Access::Mount { fs_type }) => {
                            prop_assert!(m.volume_mount_group.is_empty());
                            prop_assert!(m.mount_flags.iter().all(|f| !f.is_empty()));
                            prop_assert_eq!(&checked.mount_flags, &m.mount_flags);
                            prop_assert_eq!(fs_type.map(FsType::as_str).unwrap_or(""), m.fs_type.as_str());
                        }
                        (want, got) => prop_assert!(false, "{:?} taken as {:?}", want, got),
                    }
                }
                Err(CsiError::InvalidArgument { field, .. }) => {
                    prop_assert!(field.starts_with("volume_capability."), "{}", field);
                }
                Err(e) => prop_assert!(false, "{:?}", e),
            }
        }

        /// A list of capabilities is taken only when each is, and then
        /// holds one kind of access.
        #[test]
        fn capability_lists_of_any_content(caps in prop::collection::vec(any_capability(), 0..4)) {
            match check_all("volume_capabilities", &caps) {
                Ok(access) => {
                    prop_assert!(!caps.is_empty());
                    for (i, c) in caps.iter().enumerate() {
                        let one = check(&format!("volume_capabilities[{i}]"), c);
                        prop_assert!(one.is_ok(), "{:?}", one);
                        let block = matches!(one.expect("checked").access, Access::Block);
                        prop_assert_eq!(block, matches!(access, Access::Block));
                    }
                }
                Err(e) => prop_assert_eq!(e.code(), tonic::Code::InvalidArgument, "{:?}", e),
            }
        }
    }

    #[test]
    fn capabilities_single_node_only() {
        for mode in [
            Mode::SingleNodeWriter,
            Mode::SingleNodeReaderOnly,
            Mode::SingleNodeSingleWriter,
            Mode::SingleNodeMultiWriter,
        ] {
            assert_eq!(
                check("c", &cap(mode, block())).expect("supported").access,
                Access::Block
            );
        }
        for mode in [
            Mode::MultiNodeReaderOnly,
            Mode::MultiNodeSingleWriter,
            Mode::MultiNodeMultiWriter,
            Mode::Unknown,
        ] {
            let e = check("c", &cap(mode, block())).expect_err("unsupported");
            assert!(e.to_string().starts_with("c.access_mode.mode:"), "{e}");
        }
        assert_eq!(
            check("c", &cap(Mode::SingleNodeWriter, mount("xfs")))
                .expect("xfs")
                .access,
            Access::Mount {
                fs_type: Some(FsType::Xfs)
            }
        );
        let e = check("c", &cap(Mode::SingleNodeWriter, mount("btrfs"))).expect_err("btrfs");
        assert!(e.to_string().starts_with("c.mount.fs_type:"), "{e}");
        let mut no_type = cap(Mode::SingleNodeWriter, block());
        no_type.access_type = None;
        assert!(check("c", &no_type).is_err());
        let both = [
            cap(Mode::SingleNodeWriter, block()),
            cap(Mode::SingleNodeWriter, mount("")),
        ];
        assert!(check_all("v", &both).is_err());
        let clash = [
            cap(Mode::SingleNodeWriter, mount("ext4")),
            cap(Mode::SingleNodeWriter, mount("xfs")),
        ];
        assert!(check_all("v", &clash).is_err());
        assert!(check_all("v", &[]).is_err());
    }

    #[test]
    fn mount_details() {
        let mut m = csi::volume_capability::MountVolume {
            fs_type: "ext4".into(),
            mount_flags: vec!["noatime".into()],
            ..Default::default()
        };
        let ok = check(
            "c",
            &cap(Mode::SingleNodeWriter, AccessType::Mount(m.clone())),
        )
        .expect("ok");
        assert_eq!(ok.mount_flags, ["noatime"]);
        m.mount_flags.push(String::new());
        let e = check(
            "c",
            &cap(Mode::SingleNodeWriter, AccessType::Mount(m.clone())),
        )
        .expect_err("empty flag");
        assert!(e.to_string().starts_with("c.mount.mount_flags[1]:"), "{e}");
        m.mount_flags.pop();
        // A flag that would change what is mounted is refused by name.
        m.mount_flags.push("nodev,X-mount.subdir=etc".into());
        let e = check(
            "c",
            &cap(Mode::SingleNodeWriter, AccessType::Mount(m.clone())),
        )
        .expect_err("refused flag");
        assert!(
            e.to_string()
                .starts_with("c.mount.mount_flags[1]: option \"X-mount.subdir\" is refused"),
            "{e}"
        );
        m.mount_flags.pop();
        m.volume_mount_group = "1000".into();
        let e = check("c", &cap(Mode::SingleNodeWriter, AccessType::Mount(m)))
            .expect_err("mount group");
        assert!(
            e.to_string().starts_with("c.mount.volume_mount_group:"),
            "{e}"
        );
        let mut bad = cap(Mode::SingleNodeWriter, block());
        bad.access_mode = Some(csi::volume_capability::AccessMode { mode: 99 });
        let e = check("c", &bad).expect_err("unknown mode");
        assert!(e.to_string().contains("unknown access mode 99"), "{e}");
    }
}
