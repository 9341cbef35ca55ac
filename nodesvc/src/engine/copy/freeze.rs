//! Filesystem freezes ([`carina_sys::fsctl::freeze`], what `fsfreeze -f` does):
//! a frozen filesystem has flushed everything and blocks new writes, so
//! its block device can be copied consistently while it stays mounted.
//!
//! A freeze belongs to the filesystem, not to the process: one that is
//! never thawed blocks every writer until someone thaws it. So the
//! [`Freeze`] guard thaws on drop (an error, a cancel, a timeout and a
//! panic all drop it), and the mount point is written in the copy record
//! before the freeze, so a node that died mid-copy thaws it on its next
//! start ([`thaw`]).

use std::path::{Path, PathBuf};

use carina_sys::mount::{MountEntry, parse_mountinfo};

/// Where the filesystem on device `major:minor` is mounted read-write,
/// if it is (its first such mount: a freeze covers every mount of it).
pub fn writable_mount(mountinfo: &str, major: u32, minor: u32) -> Option<PathBuf> {
    let entries: Vec<MountEntry> = parse_mountinfo(mountinfo).ok()?;
    entries
        .into_iter()
        .find(|m| m.major == major && m.minor == minor && !m.options.iter().any(|o| o == "ro"))
        .map(|m| m.mount_point)
}

/// Whether device `major:minor` is mounted anywhere.
pub fn is_mounted(mountinfo: &str, major: u32, minor: u32) -> bool {
    parse_mountinfo(mountinfo)
        .map(|entries| entries.iter().any(|m| m.major == major && m.minor == minor))
        .unwrap_or(false)
}

/// A frozen filesystem, thawed when dropped.
#[derive(Debug)]
pub struct Freeze {
    mount_point: PathBuf,
}

impl Freeze {
    /// Freezes the filesystem mounted at `mount_point` (blocks until its
    /// dirty data is written).
    pub fn new(mount_point: &Path) -> std::io::Result<Freeze> {
        carina_sys::fsctl::freeze(mount_point)?;
        tracing::info!(mount_point = %mount_point.display(), "filesystem frozen for a copy");
        Ok(Freeze {
            mount_point: mount_point.to_path_buf(),
        })
    }
}

impl Drop for Freeze {
    fn drop(&mut self) {
        thaw(&self.mount_point);
    }
}

/// Thaws the filesystem at `mount_point`; one that is not frozen (or no
/// longer mounted) is left as it is.
pub fn thaw(mount_point: &Path) {
    match carina_sys::fsctl::thaw(mount_point) {
        Ok(()) => {
            tracing::info!(mount_point = %mount_point.display(), "filesystem thawed")
        }
        // EINVAL: not frozen. ENOENT: not there any more.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) => {}
        Err(e) => tracing::error!(
            mount_point = %mount_point.display(),
            error = %e,
            "could not thaw a filesystem frozen for a copy; its writers stay blocked until `fsfreeze -u` is run"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 7:3 / /mnt/ro ro,relatime shared:2 - ext4 /dev/loop3 ro
41 22 7:4 / /var/lib/kubelet/staging rw,relatime shared:3 - xfs /dev/loop4 rw
42 22 7:4 / /var/lib/kubelet/pods/x/mount rw,relatime shared:3 - xfs /dev/loop4 rw
";

    #[test]
    fn the_first_writable_mount_of_the_device_is_frozen() {
        assert_eq!(
            writable_mount(MOUNTINFO, 7, 4),
            Some(PathBuf::from("/var/lib/kubelet/staging"))
        );
        // Read-only: nothing changes under the copy, nothing to freeze.
        assert_eq!(writable_mount(MOUNTINFO, 7, 3), None);
        assert_eq!(writable_mount(MOUNTINFO, 7, 9), None);
        assert!(is_mounted(MOUNTINFO, 7, 3));
        assert!(!is_mounted(MOUNTINFO, 7, 9));
    }

    #[test]
    fn thawing_what_is_not_frozen_is_harmless() {
        let dir = tempfile::tempdir().expect("works");
        thaw(dir.path());
        thaw(&dir.path().join("gone"));
    }
}
