//! Whether a block device is in use, as the kernel tells it: an `O_EXCL`
//! open of a block device fails with `EBUSY` while it is mounted or held
//! open exclusively (by device-mapper, a filesystem, another `O_EXCL`
//! opener).

use std::path::Path;

/// `true` if `dev` is mounted or held open exclusively; `false` if it is
/// free or does not exist. Blocking (one `open`).
pub fn in_use(dev: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(dev)
    {
        Ok(_) => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_device_is_not_in_use() {
        assert!(!in_use(Path::new("/dev/no-such-carina-device")).expect("missing is free"));
    }
}
