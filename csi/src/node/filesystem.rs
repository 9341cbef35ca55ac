//! Carrying out the steps for mount access: formatting a blank device and
//! mounting it at the staging path, bind-mounting a directory volume there,
//! and bind-mounting the staged filesystem onto a publish target. What to
//! do was decided by [`super::plan`]; a failed step removes the directory
//! it created.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use carina_sys::format::{self, FsType};
use carina_sys::mkfs::MkfsOptions;
use carina_sys::mount::{self, MountEntry, MountTable};

use crate::error::CsiError;
use crate::types::LocalVolume;

use super::plan::{other_publications, single_writer};
use super::target::{TargetKind, bind_onto, create_dir, undo_create_on_error};

/// Formats `device` if blank (with `fs`, ext4 if none, and the class's
/// mkfs options) and mounts it at `staging` with `flags`.
pub(super) async fn stage_device(
    device: &Path,
    staging: &Path,
    (fs, mkfs): (Option<FsType>, &MkfsOptions),
    flags: &[String],
    create: bool,
) -> Result<(), CsiError> {
    let created = create && create_dir(staging).await?;
    let result = async {
        let fs = while_busy(device, || format::ensure_filesystem(device, fs, mkfs)).await?;
        let grow = !fs.formatted && smaller_than_device(fs.fs, device).await?;
        if grow && fs.fs.is_ext() {
            format::grow_unmounted_ext4(device).await?;
        }
        while_busy(device, || mount::mount(device, staging, fs.fs.as_str(), flags)).await?;
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

/// How often, and how far apart, a step that found its device busy is
/// tried again: [`while_busy`].
const BUSY_ATTEMPTS: u32 = 20;
const BUSY_PAUSE: Duration = Duration::from_millis(100);

/// What `mkfs` and `mount` say when another holder has the device open
/// exclusively (EBUSY).
const BUSY_MESSAGES: [&str; 3] = [
    "apparently in use by the system",
    "Device or resource busy",
    "mount point busy",
];

/// Runs `step` (a format or a mount of `device`), again while it fails
/// because the device is busy, at most [`BUSY_ATTEMPTS`] times. A
/// partition table write elsewhere on the same disk (another volume of a
/// RAW disk being created or deleted) holds the whole disk exclusively
/// for some milliseconds, and the kernel then refuses exclusive opens of
/// its partitions; the step works once the write is done. A device that
/// stays busy (really in use) gives the step's own error.
async fn while_busy<T, E, F, Fut>(device: &Path, mut step: F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut attempt = 1;
    loop {
        match step().await {
            Err(e) if attempt < BUSY_ATTEMPTS && is_busy(&e) => {
                tracing::debug!(device = %device.display(), attempt, error = %e, "the device is busy; trying again");
                attempt += 1;
                tokio::time::sleep(BUSY_PAUSE).await;
            }
            other => return other,
        }
    }
}

fn is_busy(e: &impl std::fmt::Display) -> bool {
    let text = e.to_string();
    BUSY_MESSAGES.iter().any(|m| text.contains(m))
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

#[cfg(test)]
mod busy_tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn a_busy_device_is_tried_again_and_other_errors_are_not() {
        let calls = AtomicU32::new(0);
        let dev = Path::new("/dev/loop9p1");
        // Busy twice, then done.
        let done = while_busy(dev, || async {
            match calls.fetch_add(1, Ordering::Relaxed) {
                0 => Err("mke2fs: /dev/loop9p1 is apparently in use by the system".to_string()),
                1 => Err("mount: /s: /dev/loop9p1 already mounted or mount point busy".to_string()),
                _ => Ok(7),
            }
        })
        .await;
        assert_eq!(done, Ok(7));
        assert_eq!(calls.load(Ordering::Relaxed), 3);
        // Another error is returned at once.
        calls.store(0, Ordering::Relaxed);
        let failed: Result<(), String> = while_busy(dev, || async {
            calls.fetch_add(1, Ordering::Relaxed);
            Err("mkfs.xfs: bad size".to_string())
        })
        .await;
        assert_eq!(failed, Err("mkfs.xfs: bad size".to_string()));
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        // A device that stays busy gives its error after the last attempt.
        calls.store(0, Ordering::Relaxed);
        let busy: Result<(), String> = while_busy(dev, || async {
            calls.fetch_add(1, Ordering::Relaxed);
            Err("Device or resource busy".to_string())
        })
        .await;
        assert!(busy.is_err());
        assert_eq!(calls.load(Ordering::Relaxed), BUSY_ATTEMPTS);
    }
}
