//! Carrying out the steps for mount access: formatting a blank device and
//! mounting it at the staging path, bind-mounting a directory volume there,
//! and bind-mounting the staged filesystem onto a publish target. What to
//! do was decided by [`super::plan`]; a failed step removes the directory
//! it created.

use std::path::Path;

use carina_sys::format::{self, FsType};
use carina_sys::mount::{self, MountEntry, MountTable};

use crate::error::CsiError;
use crate::types::LocalVolume;

use super::plan::{other_publications, single_writer};
use super::target::{TargetKind, bind_onto, create_dir, undo_create_on_error};

/// Formats `device` if blank (with `fs`, ext4 if none) and mounts it at
/// `staging` with `flags`.
pub(super) async fn stage_device(
    device: &Path,
    staging: &Path,
    fs: Option<FsType>,
    flags: &[String],
    create: bool,
) -> Result<(), CsiError> {
    let created = create && create_dir(staging).await?;
    let result = async {
        let fs = format::ensure_filesystem(device, fs).await?;
        let grow = !fs.formatted && smaller_than_device(fs.fs, device).await?;
        if grow && fs.fs == FsType::Ext4 {
            format::grow_unmounted_ext4(device).await?;
        }
        mount::mount(device, staging, fs.fs.as_str(), flags).await?;
        if grow && fs.fs == FsType::Xfs {
            format::grow_filesystem(fs.fs, device, staging).await?;
        }
        if grow {
            tracing::info!(device = %device.display(), fs = fs.fs.as_str(), "filesystem grown to fill its volume (it was copied from a smaller one)");
        }
        Ok::<_, CsiError>(())
    }
    .await;
    undo_create_on_error(result, staging, created).await
}

/// Whether the `fs` filesystem on `device` leaves at least 1 MiB of it
/// unused: a volume filled from a smaller snapshot or volume (a clone
/// may be larger than its source), whose filesystem is grown to fill it.
async fn smaller_than_device(fs: FsType, device: &Path) -> Result<bool, CsiError> {
    let fs_bytes = format::filesystem_bytes(fs, device).await?;
    let device_bytes = format::device_size(device).await?;
    Ok(fs_bytes.saturating_add(1 << 20) <= device_bytes)
}

/// Bind-mounts the directory volume `dir` at `staging` with `flags`.
pub(super) async fn stage_directory(
    dir: &Path,
    staging: &Path,
    flags: &[String],
    create: bool,
) -> Result<(), CsiError> {
    bind_onto(dir, staging, TargetKind::Dir, flags, create).await
}

/// Bind-mounts the filesystem `staged` at `staging` onto the directory
/// `target`; a single writer is refused first if it shows elsewhere.
pub(super) async fn publish(
    vol: &LocalVolume,
    staged: &MountEntry,
    staging: &Path,
    target: &Path,
    options: &[String],
    create: bool,
    exclusive: bool,
) -> Result<(), CsiError> {
    if exclusive {
        let table = MountTable::read().await?;
        let others = other_publications(
            &table,
            (staged.major, staged.minor, &staged.root),
            &[&staged.mount_point, target],
        );
        single_writer(vol, &others)?;
    }
    bind_onto(staging, target, TargetKind::Dir, options, create).await
}
