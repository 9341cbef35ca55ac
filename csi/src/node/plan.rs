//! Deciding what a stage or publish call has to do: pure functions from
//! the volume, the validated request and what is at the paths now
//! ([`AtPath`]) to a step ([`StageStep`], [`PublishStep`]) or the refusal.
//! No IO here; [`super::filesystem`] and [`super::block`] carry the steps
//! out. Answering from the current state is what makes every call
//! idempotent: the same request again plans [`StageStep::Done`] /
//! [`PublishStep::Done`], an incompatible one `ALREADY_EXISTS`.

use std::path::{Path, PathBuf};

use carina_proto::csi::volume_capability::access_mode::Mode;
use carina_sys::format::FsType;
use carina_sys::mount::{MountEntry, MountTable};

use crate::error::CsiError;
use crate::types::{LocalKind, LocalVolume};

use super::observe::{AtPath, FileKind};
use super::validate::{Access, Capability};

/// What staging a volume takes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum StageStep<'a> {
    /// Nothing: staged as asked already (block access: the staging
    /// directory is there, and nothing is mounted on it).
    Done,
    /// Block access: create the missing staging directory; nothing is
    /// mounted there.
    MakeDir,
    /// Format the device if blank and mount it at the staging path.
    MountDevice {
        device: &'a Path,
        fs: Option<FsType>,
        flags: &'a [String],
        /// The staging directory is missing and is created first.
        create_dir: bool,
    },
    /// Bind-mount the volume's directory at the staging path.
    BindDirectory {
        dir: &'a Path,
        flags: &'a [String],
        create_dir: bool,
    },
}

/// What publishing a volume takes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum PublishStep<'a> {
    /// Nothing: published as asked already.
    Done,
    /// Bind-mount the staged filesystem onto the target directory.
    BindStaging {
        staged: &'a MountEntry,
        create_dir: bool,
        /// SINGLE_NODE_SINGLE_WRITER: refuse if published elsewhere.
        single_writer: bool,
    },
    /// Bind-mount the device node onto the target file.
    BindDevice {
        device: &'a Path,
        create_file: bool,
        single_writer: bool,
    },
}

/// Plans `NodeStageVolume` of `vol` at `staging`, where `at` is.
pub(super) fn plan_stage<'a>(
    vol: &'a LocalVolume,
    cap: &'a Capability,
    requested_fs: Option<FsType>,
    staging: &Path,
    at: &AtPath,
) -> Result<StageStep<'a>, CsiError> {
    if let AtPath::Unmounted(kind) = at
        && *kind != FileKind::Directory
    {
        return Err(CsiError::invalid(
            "staging_target_path",
            format!("{} is not a directory", staging.display()),
        ));
    }
    match (&vol.kind, &cap.access) {
        (LocalKind::Directory { path }, Access::Block) => Err(no_block_access(vol, path)),
        (LocalKind::Block { .. }, Access::Block) => match at {
            AtPath::Ours(m, _) | AtPath::Foreign(m) => Err(CsiError::AlreadyExists(format!(
                "{} already has {} ({}) mounted; block access stages no filesystem",
                staging.display(),
                m.source.display(),
                m.fs_type
            ))),
            AtPath::Missing => Ok(StageStep::MakeDir),
            AtPath::Unmounted(_) => Ok(StageStep::Done),
        },
        (LocalKind::Block { device }, Access::Mount { flags, .. }) => match at {
            AtPath::Ours(m, _) => {
                let same_fs = requested_fs.is_none_or(|fs| fs.as_str() == m.fs_type);
                if same_fs && m.read_only() == flags.iter().any(|f| f == "ro") {
                    return Ok(StageStep::Done);
                }
                Err(CsiError::AlreadyExists(format!(
                    "volume {:?} is staged at {} as {}{}, incompatible with this request",
                    vol.volume_id,
                    staging.display(),
                    m.fs_type,
                    if m.read_only() { " (read-only)" } else { "" }
                )))
            }
            AtPath::Foreign(m) => Err(occupied(staging, m)),
            at => Ok(StageStep::MountDevice {
                device,
                fs: requested_fs,
                flags,
                create_dir: matches!(at, AtPath::Missing),
            }),
        },
        (LocalKind::Directory { path }, Access::Mount { flags, .. }) => match at {
            AtPath::Ours(m, _) if m.read_only() == flags.iter().any(|f| f == "ro") => {
                Ok(StageStep::Done)
            }
            AtPath::Ours(..) => Err(CsiError::AlreadyExists(format!(
                "volume {:?} is staged at {} with other mount flags",
                vol.volume_id,
                staging.display()
            ))),
            AtPath::Foreign(m) => Err(occupied(staging, m)),
            at => Ok(StageStep::BindDirectory {
                dir: path,
                flags,
                create_dir: matches!(at, AtPath::Missing),
            }),
        },
    }
}

/// Plans `NodePublishVolume` of `vol` at `target`, where `at` is.
/// `staged` is what is at the staging path, looked at for mount access
/// only (block access publishes the device node, not the staging path).
pub(super) fn plan_publish<'a>(
    vol: &'a LocalVolume,
    cap: &Capability,
    read_only: bool,
    target: &Path,
    staging: &Path,
    at: &AtPath,
    staged: Option<&'a AtPath>,
) -> Result<PublishStep<'a>, CsiError> {
    let single_writer = cap.mode == Mode::SingleNodeSingleWriter;
    match (&vol.kind, &cap.access) {
        (LocalKind::Directory { path }, Access::Block) => Err(no_block_access(vol, path)),
        (_, Access::Mount { .. }) => {
            let Some(AtPath::Ours(staged, _)) = staged else {
                return Err(CsiError::FailedPrecondition(format!(
                    "volume {:?} is not staged at {}",
                    vol.volume_id,
                    staging.display()
                )));
            };
            match at {
                AtPath::Ours(m, _) if m.read_only() == read_only => return Ok(PublishStep::Done),
                AtPath::Ours(m, _) | AtPath::Foreign(m) => {
                    return Err(incompatible(target, m, read_only));
                }
                AtPath::Unmounted(kind) if *kind != FileKind::Directory => {
                    return Err(CsiError::FailedPrecondition(format!(
                        "target_path {} exists and is not a directory",
                        target.display()
                    )));
                }
                _ => {}
            }
            Ok(PublishStep::BindStaging {
                staged,
                create_dir: matches!(at, AtPath::Missing),
                single_writer,
            })
        }
        (LocalKind::Block { device }, Access::Block) => {
            match at {
                AtPath::Ours(m, _) if m.read_only() == read_only => return Ok(PublishStep::Done),
                AtPath::Ours(m, _) | AtPath::Foreign(m) => {
                    return Err(incompatible(target, m, read_only));
                }
                AtPath::Unmounted(FileKind::Directory) => {
                    return Err(CsiError::FailedPrecondition(format!(
                        "target_path {} is a directory; block access needs a file",
                        target.display()
                    )));
                }
                _ => {}
            }
            Ok(PublishStep::BindDevice {
                device,
                create_file: matches!(at, AtPath::Missing),
                single_writer,
            })
        }
    }
}

/// The mount options of a publication.
pub(super) fn publish_options(read_only: bool) -> Vec<String> {
    if read_only {
        vec!["ro".into()]
    } else {
        Vec::new()
    }
}

/// Mount points other than `except` that show the same thing.
pub(super) fn other_publications(
    table: &MountTable,
    (major, minor, root): (u32, u32, &Path),
    except: &[&Path],
) -> Vec<PathBuf> {
    table
        .mounts_of(major, minor, root)
        .into_iter()
        .filter(|p| !except.contains(p))
        .map(Path::to_path_buf)
        .collect()
}

/// Refuses a SINGLE_NODE_SINGLE_WRITER publication when `others` show the
/// volume already.
pub(super) fn single_writer(vol: &LocalVolume, others: &[PathBuf]) -> Result<(), CsiError> {
    match others.first() {
        None => Ok(()),
        Some(other) => Err(CsiError::FailedPrecondition(format!(
            "volume {:?} is SINGLE_NODE_SINGLE_WRITER and already published at {}",
            vol.volume_id,
            other.display()
        ))),
    }
}

fn no_block_access(vol: &LocalVolume, path: &Path) -> CsiError {
    CsiError::FailedPrecondition(format!(
        "volume {:?} is the directory {}; block access is not possible",
        vol.volume_id,
        path.display()
    ))
}

fn occupied(path: &Path, m: &MountEntry) -> CsiError {
    CsiError::AlreadyExists(format!(
        "{} already has {} ({}) mounted, not this volume",
        path.display(),
        m.source.display(),
        m.fs_type
    ))
}

fn incompatible(target: &Path, m: &MountEntry, read_only: bool) -> CsiError {
    CsiError::AlreadyExists(format!(
        "{} already has {}{} mounted, incompatible with this request (readonly={read_only})",
        target.display(),
        m.source.display(),
        if m.read_only() { " (read-only)" } else { "" },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_vol() -> LocalVolume {
        LocalVolume {
            volume_id: "v1@node-a".into(),
            kind: LocalKind::Block {
                device: "/dev/carina/v1".into(),
            },
            size_bytes: 1 << 30,
        }
    }

    fn dir_vol() -> LocalVolume {
        LocalVolume {
            volume_id: "d1@node-a".into(),
            kind: LocalKind::Directory {
                path: "/data/d1".into(),
            },
            size_bytes: 1 << 30,
        }
    }

    fn mount_cap(mode: Mode, flags: &[&str]) -> Capability {
        Capability {
            access: Access::Mount {
                fs_type: None,
                flags: flags.iter().map(|f| f.to_string()).collect(),
            },
            mode,
        }
    }

    fn block_cap(mode: Mode) -> Capability {
        Capability {
            access: Access::Block,
            mode,
        }
    }

    fn entry(source: &str, mount_point: &str, fs_type: &str, ro: bool) -> MountEntry {
        MountEntry {
            id: 30,
            parent: 1,
            major: 253,
            minor: 4,
            root: "/".into(),
            mount_point: mount_point.into(),
            options: vec![if ro { "ro" } else { "rw" }.into()],
            fs_type: fs_type.into(),
            source: source.into(),
            super_options: Vec::new(),
        }
    }

    const STAGING: &str = "/var/lib/kubelet/staging/v1";
    const TARGET: &str = "/var/lib/kubelet/pods/p/v1";

    fn stage(
        vol: &LocalVolume,
        cap: &Capability,
        fs: Option<FsType>,
        at: &AtPath,
    ) -> Result<String, CsiError> {
        plan_stage(vol, cap, fs, Path::new(STAGING), at).map(|s| format!("{s:?}"))
    }

    fn code(r: Result<impl std::fmt::Debug, CsiError>) -> String {
        match r {
            Ok(s) => format!("ok {s:?}"),
            Err(CsiError::AlreadyExists(_)) => "ALREADY_EXISTS".into(),
            Err(CsiError::FailedPrecondition(_)) => "FAILED_PRECONDITION".into(),
            Err(CsiError::InvalidArgument { field, .. }) => format!("INVALID_ARGUMENT {field}"),
            Err(e) => format!("{e:?}"),
        }
    }

    #[test]
    fn staging_a_filesystem_mounts_once_and_then_agrees_or_refuses() {
        let vol = block_vol();
        let rw = mount_cap(Mode::SingleNodeWriter, &[]);
        let ours =
            |fs: &str, ro| AtPath::Ours(entry("/dev/dm-4", STAGING, fs, ro), FileKind::Directory);
        assert_eq!(
            plan_stage(
                &vol,
                &rw,
                Some(FsType::Xfs),
                Path::new(STAGING),
                &AtPath::Missing
            )
            .expect("planned"),
            StageStep::MountDevice {
                device: Path::new("/dev/carina/v1"),
                fs: Some(FsType::Xfs),
                flags: &[],
                create_dir: true,
            }
        );
        assert_eq!(
            plan_stage(
                &vol,
                &rw,
                None,
                Path::new(STAGING),
                &AtPath::Unmounted(FileKind::Directory)
            )
            .expect("planned"),
            StageStep::MountDevice {
                device: Path::new("/dev/carina/v1"),
                fs: None,
                flags: &[],
                create_dir: false,
            }
        );
        // Again with the same arguments (or no fs asked for): nothing to do.
        assert_eq!(
            stage(&vol, &rw, Some(FsType::Ext4), &ours("ext4", false)).expect("ok"),
            "Done"
        );
        assert_eq!(
            stage(&vol, &rw, None, &ours("xfs", false)).expect("ok"),
            "Done"
        );
        // Another filesystem, or other read-only-ness: incompatible.
        assert_eq!(
            code(stage(&vol, &rw, Some(FsType::Xfs), &ours("ext4", false))),
            "ALREADY_EXISTS"
        );
        assert_eq!(
            code(stage(&vol, &rw, None, &ours("ext4", true))),
            "ALREADY_EXISTS"
        );
        let ro = mount_cap(Mode::SingleNodeWriter, &["ro"]);
        assert_eq!(
            stage(&vol, &ro, None, &ours("ext4", true)).expect("ok"),
            "Done"
        );
        // Something else mounted there, or a file in the way.
        let foreign = AtPath::Foreign(entry("tmpfs", STAGING, "tmpfs", false));
        assert_eq!(code(stage(&vol, &rw, None, &foreign)), "ALREADY_EXISTS");
        assert_eq!(
            code(stage(&vol, &rw, None, &AtPath::Unmounted(FileKind::Other))),
            "INVALID_ARGUMENT staging_target_path"
        );
    }

    #[test]
    fn staging_for_block_access_mounts_nothing() {
        let vol = block_vol();
        let cap = block_cap(Mode::SingleNodeWriter);
        assert_eq!(
            stage(&vol, &cap, None, &AtPath::Missing).expect("ok"),
            "MakeDir"
        );
        assert_eq!(
            stage(&vol, &cap, None, &AtPath::Unmounted(FileKind::Directory)).expect("ok"),
            "Done"
        );
        let mounted = AtPath::Ours(
            entry("/dev/dm-4", STAGING, "ext4", false),
            FileKind::Directory,
        );
        assert_eq!(code(stage(&vol, &cap, None, &mounted)), "ALREADY_EXISTS");
        // A directory volume has no device to give.
        assert_eq!(
            code(stage(&dir_vol(), &cap, None, &AtPath::Missing)),
            "FAILED_PRECONDITION"
        );
    }

    #[test]
    fn staging_a_directory_volume_binds_it() {
        let vol = dir_vol();
        let rw = mount_cap(Mode::SingleNodeWriter, &[]);
        assert_eq!(
            plan_stage(&vol, &rw, None, Path::new(STAGING), &AtPath::Missing).expect("planned"),
            StageStep::BindDirectory {
                dir: Path::new("/data/d1"),
                flags: &[],
                create_dir: true,
            }
        );
        let ours = |ro| AtPath::Ours(entry("/dev/sda1", STAGING, "ext4", ro), FileKind::Directory);
        assert_eq!(stage(&vol, &rw, None, &ours(false)).expect("ok"), "Done");
        assert_eq!(code(stage(&vol, &rw, None, &ours(true))), "ALREADY_EXISTS");
        let foreign = AtPath::Foreign(entry("tmpfs", STAGING, "tmpfs", false));
        assert_eq!(code(stage(&vol, &rw, None, &foreign)), "ALREADY_EXISTS");
    }

    #[test]
    fn publishing_a_filesystem_needs_it_staged() {
        let vol = block_vol();
        let staged = AtPath::Ours(
            entry("/dev/dm-4", STAGING, "ext4", false),
            FileKind::Directory,
        );
        let publish = |cap: &Capability, read_only, at: &AtPath, staged: Option<&AtPath>| {
            code(plan_publish(
                &vol,
                cap,
                read_only,
                Path::new(TARGET),
                Path::new(STAGING),
                at,
                staged,
            ))
        };
        let rw = mount_cap(Mode::SingleNodeWriter, &[]);
        assert_eq!(
            publish(&rw, false, &AtPath::Missing, Some(&AtPath::Missing)),
            "FAILED_PRECONDITION"
        );
        let step = plan_publish(
            &vol,
            &mount_cap(Mode::SingleNodeSingleWriter, &[]),
            false,
            Path::new(TARGET),
            Path::new(STAGING),
            &AtPath::Missing,
            Some(&staged),
        )
        .expect("planned");
        let AtPath::Ours(staged_entry, _) = &staged else {
            unreachable!("built as Ours above")
        };
        assert_eq!(
            step,
            PublishStep::BindStaging {
                staged: staged_entry,
                create_dir: true,
                single_writer: true,
            }
        );
        let published =
            |ro| AtPath::Ours(entry("/dev/dm-4", TARGET, "ext4", ro), FileKind::Directory);
        assert_eq!(
            publish(&rw, false, &published(false), Some(&staged)),
            "ok Done"
        );
        assert_eq!(
            publish(&rw, true, &published(true), Some(&staged)),
            "ok Done"
        );
        assert_eq!(
            publish(&rw, true, &published(false), Some(&staged)),
            "ALREADY_EXISTS"
        );
        let foreign = AtPath::Foreign(entry("tmpfs", TARGET, "tmpfs", false));
        assert_eq!(
            publish(&rw, false, &foreign, Some(&staged)),
            "ALREADY_EXISTS"
        );
        assert_eq!(
            publish(
                &rw,
                false,
                &AtPath::Unmounted(FileKind::Other),
                Some(&staged)
            ),
            "FAILED_PRECONDITION"
        );
    }

    #[test]
    fn publishing_for_block_access_binds_the_device_onto_a_file() {
        let vol = block_vol();
        let cap = block_cap(Mode::SingleNodeWriter);
        let publish = |vol: &LocalVolume, read_only, at: &AtPath| {
            code(plan_publish(
                vol,
                &cap,
                read_only,
                Path::new(TARGET),
                Path::new(STAGING),
                at,
                None,
            ))
        };
        assert_eq!(
            plan_publish(
                &vol,
                &cap,
                false,
                Path::new(TARGET),
                Path::new(STAGING),
                &AtPath::Missing,
                None
            )
            .expect("planned"),
            PublishStep::BindDevice {
                device: Path::new("/dev/carina/v1"),
                create_file: true,
                single_writer: false,
            }
        );
        assert!(
            publish(&vol, false, &AtPath::Unmounted(FileKind::Other))
                .contains("create_file: false")
        );
        assert_eq!(
            publish(&vol, false, &AtPath::Unmounted(FileKind::Directory)),
            "FAILED_PRECONDITION"
        );
        let published = |ro| {
            AtPath::Ours(
                entry("devtmpfs", TARGET, "devtmpfs", ro),
                FileKind::BlockDevice,
            )
        };
        assert_eq!(publish(&vol, true, &published(true)), "ok Done");
        assert_eq!(publish(&vol, false, &published(true)), "ALREADY_EXISTS");
        assert_eq!(
            publish(&dir_vol(), false, &AtPath::Missing),
            "FAILED_PRECONDITION"
        );
    }

    #[test]
    fn a_single_writer_is_refused_when_published_elsewhere() {
        let table = MountTable::from_entries(vec![
            entry("/dev/dm-4", STAGING, "ext4", false),
            entry("/dev/dm-4", TARGET, "ext4", false),
            entry("/dev/dm-4", "/var/lib/kubelet/pods/q/v1", "ext4", false),
            MountEntry {
                minor: 5,
                ..entry("/dev/dm-5", "/elsewhere", "ext4", false)
            },
        ]);
        let others = other_publications(
            &table,
            (253, 4, Path::new("/")),
            &[Path::new(STAGING), Path::new(TARGET)],
        );
        assert_eq!(others, [PathBuf::from("/var/lib/kubelet/pods/q/v1")]);
        let err = single_writer(&block_vol(), &others).expect_err("refused");
        assert!(
            matches!(&err, CsiError::FailedPrecondition(m) if m.contains("/var/lib/kubelet/pods/q/v1")),
            "{err:?}"
        );
        single_writer(&block_vol(), &[]).expect("alone");
        assert_eq!(publish_options(true), ["ro"]);
        assert!(publish_options(false).is_empty());
    }
}
