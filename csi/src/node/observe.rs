//! What the kernel says about a volume and the paths it is used at:
//! stat and mountinfo, read fresh on every call (never remembered), boiled
//! down to [`AtPath`] for the planner. The only IO here is reading.

use std::fs::Metadata;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use carina_sys::mount::{self, MountEntry};

use crate::error::CsiError;
use crate::types::{LocalKind, LocalVolume};

/// What kind of file a path names (symlinks followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FileKind {
    Directory,
    BlockDevice,
    Other,
}

impl FileKind {
    pub(super) fn of(meta: &Metadata) -> Self {
        if meta.is_dir() {
            FileKind::Directory
        } else if meta.file_type().is_block_device() {
            FileKind::BlockDevice
        } else {
            FileKind::Other
        }
    }
}

/// What is at a path, seen from one volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AtPath {
    Missing,
    /// Exists and is not a mount point.
    Unmounted(FileKind),
    /// A mount point showing this volume.
    Ours(MountEntry, FileKind),
    /// A mount point showing something else.
    Foreign(MountEntry),
}

pub(super) async fn stat(path: &Path) -> Result<Option<Metadata>, CsiError> {
    match tokio::fs::metadata(path).await {
        Ok(m) => Ok(Some(m)),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(CsiError::Internal(format!("stat {}: {e}", path.display()))),
    }
}

/// The volume's device or directory, which must exist and be of its kind.
pub(super) async fn source(vol: &LocalVolume) -> Result<Metadata, CsiError> {
    let (path, what) = match &vol.kind {
        LocalKind::Block { device } => (device, "block device"),
        LocalKind::Directory { path } => (path, "directory"),
    };
    let meta = stat(path).await?.ok_or_else(|| {
        CsiError::FailedPrecondition(format!(
            "{what} {} of volume {:?} does not exist",
            path.display(),
            vol.volume_id
        ))
    })?;
    let right_kind = match vol.kind {
        LocalKind::Block { .. } => meta.file_type().is_block_device(),
        LocalKind::Directory { .. } => meta.is_dir(),
    };
    if !right_kind {
        return Err(CsiError::FailedPrecondition(format!(
            "{} of volume {:?} is not a {what}",
            path.display(),
            vol.volume_id
        )));
    }
    Ok(meta)
}

/// Whether `at` (the metadata of a mount point) shows the volume whose
/// device or directory has metadata `src`: a filesystem on the device, the
/// device node itself, or the directory.
pub(super) fn shows(kind: &LocalKind, src: &Metadata, at: &Metadata) -> bool {
    match kind {
        LocalKind::Block { .. } if at.file_type().is_block_device() => at.rdev() == src.rdev(),
        LocalKind::Block { .. } => at.dev() == src.rdev(),
        LocalKind::Directory { .. } => at.dev() == src.dev() && at.ino() == src.ino(),
    }
}

/// What is at `path`, from mountinfo and stat.
pub(super) async fn inspect(
    path: &Path,
    kind: &LocalKind,
    src: &Metadata,
) -> Result<AtPath, CsiError> {
    let Some(meta) = stat(path).await? else {
        return Ok(AtPath::Missing);
    };
    match mount::mount_at(path).await? {
        None => Ok(AtPath::Unmounted(FileKind::of(&meta))),
        Some(m) if shows(kind, src, &meta) => Ok(AtPath::Ours(m, FileKind::of(&meta))),
        Some(m) => Ok(AtPath::Foreign(m)),
    }
}

pub(super) async fn canonical_or_self(path: &Path) -> Result<PathBuf, CsiError> {
    Ok(mount::canonical(path)
        .await?
        .unwrap_or_else(|| path.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn file_kinds_and_missing_paths() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f");
        std::fs::write(&file, b"").expect("write");
        let kind = |p: &Path| {
            std::fs::metadata(p)
                .map(|m| FileKind::of(&m))
                .expect("stat")
        };
        assert_eq!(kind(dir.path()), FileKind::Directory);
        assert_eq!(kind(&file), FileKind::Other);
        assert!(stat(&dir.path().join("none")).await.expect("ok").is_none());
        // A path through a file is not there either (ENOTDIR).
        assert!(stat(&file.join("below")).await.expect("ok").is_none());
    }

    #[tokio::test]
    async fn a_directory_volume_shows_only_itself() {
        let dir = tempfile::tempdir().expect("tempdir");
        let other = tempfile::tempdir().expect("tempdir");
        let kind = LocalKind::Directory {
            path: dir.path().to_path_buf(),
        };
        let src = std::fs::metadata(dir.path()).expect("stat");
        let same = std::fs::metadata(dir.path()).expect("stat");
        let elsewhere = std::fs::metadata(other.path()).expect("stat");
        assert!(shows(&kind, &src, &same));
        assert!(!shows(&kind, &src, &elsewhere));
        let missing = inspect(&dir.path().join("none"), &kind, &src)
            .await
            .expect("inspected");
        assert_eq!(missing, AtPath::Missing);
    }
}
