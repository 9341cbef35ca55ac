//! `NodeGetVolumeStats` and `NodeExpandVolume` on a published volume: its
//! usage (statvfs, or the device size for block access) with a volume
//! condition, and growing its filesystem to the device. Whether to grow is
//! decided by the pure [`plan_grow`].

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use carina_proto::csi;
use carina_sys::format::{self, FsType};
use carina_sys::mount;
use carina_sys::statvfs;

use crate::error::CsiError;
use crate::types::{LocalKind, LocalVolume};

use super::observe::{AtPath, FileKind, inspect, shows, source, stat};
use super::validate::{Access, Capability};

/// The usage and condition of `vol` at `volume_path`.
pub(super) async fn volume_stats(
    vol: &LocalVolume,
    volume_path: &str,
) -> Result<csi::NodeGetVolumeStatsResponse, CsiError> {
    let path = PathBuf::from(volume_path);
    if !path.is_absolute() {
        return Err(not_at(vol, volume_path));
    }
    let meta = stat(&path).await?.ok_or_else(|| not_at(vol, volume_path))?;
    let source_path = match &vol.kind {
        LocalKind::Block { device } => device,
        LocalKind::Directory { path } => path,
    };
    if mount::mount_at(&path).await?.is_none() {
        return Ok(abnormal(format!(
            "{} is no longer a mount point",
            path.display()
        )));
    }
    let Some(src) = stat(source_path).await? else {
        return Ok(abnormal(format!(
            "{} of volume {:?} is gone",
            source_path.display(),
            vol.volume_id
        )));
    };
    if !shows(&vol.kind, &src, &meta) {
        return Err(not_at(vol, volume_path));
    }
    let usage = if meta.file_type().is_block_device() {
        let size = format::device_size(&path).await?;
        vec![usage(csi::volume_usage::Unit::Bytes, size, 0, 0)]
    } else {
        filesystem_usage(&path).await?
    };
    Ok(csi::NodeGetVolumeStatsResponse {
        usage,
        volume_condition: Some(csi::VolumeCondition {
            abnormal: false,
            message: String::new(),
        }),
    })
}

/// What expanding a published volume takes, once its device is grown.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Grow {
    /// Nothing: block access, where the device node is the volume.
    Nothing,
    /// Grow the filesystem mounted at the volume path.
    Filesystem(FsType),
}

/// Decides the expansion of `vol` published at `path` as `entry` (a file
/// of `kind`), whose device now has `size` bytes.
pub(super) fn plan_grow(
    vol: &LocalVolume,
    path: &Path,
    entry: &mount::MountEntry,
    kind: FileKind,
    cap: Option<&Capability>,
    size: u64,
    required_bytes: u64,
) -> Result<Grow, CsiError> {
    if required_bytes > size {
        return Err(CsiError::OutOfRange(format!(
            "volume {:?} is {size} bytes, {required_bytes} required; grow it with ControllerExpandVolume first",
            vol.volume_id
        )));
    }
    // Block access: the device node is the volume; nothing to grow.
    if cap.is_some_and(|c| c.access == Access::Block) || kind == FileKind::BlockDevice {
        return Ok(Grow::Nothing);
    }
    match FsType::from_name(&entry.fs_type) {
        Some(fs) => Ok(Grow::Filesystem(fs)),
        None => Err(CsiError::FailedPrecondition(format!(
            "{} holds {}, which Carina cannot grow",
            path.display(),
            entry.fs_type
        ))),
    }
}

/// Grows the filesystem of `vol` published at `volume_path` to its device.
pub(super) async fn expand(
    vol: &LocalVolume,
    volume_path: &str,
    cap: Option<Capability>,
    required_bytes: u64,
) -> Result<csi::NodeExpandVolumeResponse, CsiError> {
    let path = PathBuf::from(volume_path);
    if !path.is_absolute() {
        return Err(not_at(vol, volume_path));
    }
    let src = source(vol).await?;
    let (entry, kind) = match inspect(&path, &vol.kind, &src).await? {
        AtPath::Ours(m, kind) => (m, kind),
        AtPath::Missing | AtPath::Foreign(_) => return Err(not_at(vol, volume_path)),
        AtPath::Unmounted(_) => {
            return Err(CsiError::FailedPrecondition(format!(
                "{} is not a mount point; expansion needs the published volume",
                path.display()
            )));
        }
    };
    let device = match &vol.kind {
        LocalKind::Directory { .. } => {
            return Ok(expanded(vol.size_bytes));
        }
        LocalKind::Block { device } => device,
    };
    let size = format::device_size(device).await?;
    match plan_grow(vol, &path, &entry, kind, cap.as_ref(), size, required_bytes)? {
        Grow::Nothing => {}
        Grow::Filesystem(fs) => format::grow_filesystem(fs, device, &path).await?,
    }
    Ok(expanded(size))
}

fn not_at(vol: &LocalVolume, volume_path: &str) -> CsiError {
    CsiError::NotFound(format!(
        "volume {:?} is not at {:?}",
        vol.volume_id, volume_path
    ))
}

fn abnormal(message: String) -> csi::NodeGetVolumeStatsResponse {
    csi::NodeGetVolumeStatsResponse {
        usage: Vec::new(),
        volume_condition: Some(csi::VolumeCondition {
            abnormal: true,
            message,
        }),
    }
}

fn expanded(size: u64) -> csi::NodeExpandVolumeResponse {
    csi::NodeExpandVolumeResponse {
        capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
    }
}

fn usage(unit: csi::volume_usage::Unit, total: u64, available: u64, used: u64) -> csi::VolumeUsage {
    let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    csi::VolumeUsage {
        available: i(available),
        total: i(total),
        used: i(used),
        unit: unit as i32,
    }
}

/// Bytes and inodes of the filesystem at `path` (statvfs).
async fn filesystem_usage(path: &Path) -> Result<Vec<csi::VolumeUsage>, CsiError> {
    let p = path.to_path_buf();
    let st = tokio::task::spawn_blocking(move || statvfs::statvfs(&p))
        .await
        .map_err(|e| CsiError::Internal(format!("statvfs {}: {e}", path.display())))?
        .map_err(|e| CsiError::Internal(format!("statvfs {}: {e}", path.display())))?;
    let frsize = st.f_frsize;
    let bytes = |blocks: u64| blocks.saturating_mul(frsize);
    Ok(vec![
        usage(
            csi::volume_usage::Unit::Bytes,
            bytes(st.f_blocks),
            bytes(st.f_bavail),
            bytes(st.f_blocks.saturating_sub(st.f_bfree)),
        ),
        usage(
            csi::volume_usage::Unit::Inodes,
            st.f_files,
            st.f_ffree,
            st.f_files.saturating_sub(st.f_ffree),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use carina_proto::csi::volume_capability::access_mode::Mode;

    fn vol() -> LocalVolume {
        LocalVolume {
            volume_id: "v1@node-a".into(),
            kind: LocalKind::Block {
                device: "/dev/carina/v1".into(),
            },
            size_bytes: 1 << 30,
        }
    }

    fn entry(fs_type: &str) -> mount::MountEntry {
        mount::MountEntry {
            id: 30,
            parent: 1,
            major: 253,
            minor: 4,
            root: "/".into(),
            mount_point: "/pods/p/v1".into(),
            options: vec!["rw".into()],
            fs_type: fs_type.into(),
            source: "/dev/dm-4".into(),
            super_options: Vec::new(),
        }
    }

    #[test]
    fn growing_needs_the_device_grown_first_and_a_known_filesystem() {
        let path = Path::new("/pods/p/v1");
        let grow = |fs: &str, kind, cap: Option<&Capability>, size, required| {
            plan_grow(&vol(), path, &entry(fs), kind, cap, size, required)
        };
        assert_eq!(
            grow("xfs", FileKind::Directory, None, 2 << 30, 2 << 30).expect("planned"),
            Grow::Filesystem(FsType::Xfs)
        );
        let err = grow("ext4", FileKind::Directory, None, 1 << 30, 2 << 30).expect_err("small");
        assert!(
            matches!(&err, CsiError::OutOfRange(m) if m.contains("ControllerExpandVolume")),
            "{err:?}"
        );
        let err = grow("tmpfs", FileKind::Directory, None, 1 << 30, 0).expect_err("unknown fs");
        assert!(matches!(err, CsiError::FailedPrecondition(_)), "{err:?}");
        // Block access: the device node is the volume.
        assert_eq!(
            grow("devtmpfs", FileKind::BlockDevice, None, 1 << 30, 0).expect("planned"),
            Grow::Nothing
        );
        let block = Capability {
            access: Access::Block,
            mode: Mode::SingleNodeWriter,
        };
        assert_eq!(
            grow("ext4", FileKind::Directory, Some(&block), 1 << 30, 0).expect("planned"),
            Grow::Nothing
        );
    }

    #[test]
    fn sizes_beyond_i64_are_clamped() {
        assert_eq!(expanded(u64::MAX).capacity_bytes, i64::MAX);
        let u = usage(csi::volume_usage::Unit::Inodes, u64::MAX, 3, 2);
        assert_eq!((u.total, u.available, u.used), (i64::MAX, 3, 2));
        assert_eq!(u.unit, csi::volume_usage::Unit::Inodes as i32);
    }

    #[tokio::test]
    async fn stats_of_a_path_that_is_not_the_volume_are_not_found() {
        for path in ["relative", "/carina-test/no/such/path"] {
            let err = volume_stats(&vol(), path).await.expect_err("not there");
            assert!(matches!(err, CsiError::NotFound(_)), "{path}: {err:?}");
        }
    }
}
