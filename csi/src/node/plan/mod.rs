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
mod tests;
