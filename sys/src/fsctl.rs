//! Filesystem calls std has no wrapper for: freezing and thawing a
//! mounted filesystem (the FIFREEZE and FITHAW ioctls, what `fsfreeze`
//! does; the `unsafe` call site is allowed on its own) and making a
//! special file (`mknod`, through rustix).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

/// `_IOWR('X', 119, int)` and `_IOWR('X', 120, int)` from linux/fs.h.
const FIFREEZE: libc::c_ulong = 0xC004_5877;
const FITHAW: libc::c_ulong = 0xC004_5878;

fn fs_ioctl(mount_point: &Path, request: libc::c_ulong) -> std::io::Result<()> {
    let dir = File::open(mount_point)?;
    let mut arg: libc::c_int = 0;
    // SAFETY: a valid descriptor held for the call; both requests take a
    // pointer to an int, which outlives it.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::ioctl(dir.as_raw_fd(), request as _, &mut arg) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Freezes the filesystem mounted at `mount_point`: it writes out
/// everything and blocks new writes until [`thaw`]. Blocks until then.
pub fn freeze(mount_point: &Path) -> std::io::Result<()> {
    fs_ioctl(mount_point, FIFREEZE)
}

/// Thaws the filesystem mounted at `mount_point`. EINVAL when it is not
/// frozen.
pub fn thaw(mount_point: &Path) -> std::io::Result<()> {
    fs_ioctl(mount_point, FITHAW)
}

/// Makes the special file `path` (a FIFO, socket or device node) with
/// `mode` (type and permission bits) and device number `rdev`.
pub fn mknod(path: &Path, mode: u32, rdev: u64) -> std::io::Result<()> {
    use rustix::fs::{CWD, FileType, Mode, mknodat};
    mknodat(
        CWD,
        path,
        FileType::from_raw_mode(mode),
        Mode::from_raw_mode(mode),
        rdev,
    )
    .map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_made_and_an_unfrozen_filesystem_thaws_with_einval() {
        let dir = tempfile::tempdir().expect("works");
        let fifo = dir.path().join("fifo");
        mknod(&fifo, libc::S_IFIFO | 0o600, 0).expect("works");
        let kind = std::fs::symlink_metadata(&fifo).expect("works").file_type();
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(&kind));
        assert!(mknod(&fifo, libc::S_IFIFO | 0o600, 0).is_err());
        if let Err(e) = thaw(dir.path()) {
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        }
    }
}
