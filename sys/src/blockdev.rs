//! Whether a block device is in use, as the kernel tells it: an `O_EXCL`
//! open of a block device fails with `EBUSY` while it is mounted or held
//! open exclusively (by device-mapper, a filesystem, another `O_EXCL`
//! opener); and making the ends of a new device read as zeros.

use std::os::unix::fs::{FileExt, OpenOptionsExt};
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

/// Makes the first and last `bytes` of the device `dev` (of `size`
/// bytes) read as zeros, so no old signature there reaches a new user.
/// Each end is read first and written (zeros, then a flush) only if
/// something there is not zero: a fresh area costs two reads and no
/// write. The device is opened exclusively, so this fails with `EBUSY`
/// rather than write under a mounted filesystem. Returns whether it wrote.
/// Blocking.
pub fn zero_ends(dev: &Path, size: u64, bytes: u64) -> std::io::Result<bool> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_EXCL)
        .open(dev)?;
    let n = bytes.min(size);
    let mut buf = vec![0u8; usize::try_from(n).map_err(std::io::Error::other)?];
    let mut wrote = false;
    let ends = if size > n { vec![0, size - n] } else { vec![0] };
    for offset in ends {
        file.read_exact_at(&mut buf, offset)?;
        if buf.iter().any(|b| *b != 0) {
            buf.fill(0);
            file.write_all_at(&buf, offset)?;
            wrote = true;
        }
    }
    if wrote {
        file.sync_all()?;
    }
    Ok(wrote)
}

/// Whether the first and last `bytes` of the range `offset..offset + len`
/// of the device `dev` read as zeros, read around the page cache
/// (`O_DIRECT`): what the device holds, which a new partition over that
/// range will show, not what a cache of the whole device remembers (the
/// caches of a disk and of its partitions are not kept coherent).
/// `offset`, `len` and `bytes` must be multiples of the logical sector
/// size. An error says nothing about the range. Blocking.
pub fn range_ends_are_zero(dev: &Path, offset: u64, len: u64, bytes: u64) -> std::io::Result<bool> {
    /// Direct I/O wants its buffer aligned to the logical sector size.
    const ALIGN: usize = 4096;
    let n = usize::try_from(bytes.min(len)).map_err(std::io::Error::other)?;
    let mut raw = vec![0u8; n + ALIGN];
    let start = raw.as_ptr().align_offset(ALIGN);
    let buf = raw
        .get_mut(start..start.saturating_add(n))
        .ok_or_else(|| std::io::Error::other("no aligned buffer"))?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)?;
    let tail = offset + len.saturating_sub(n as u64);
    for at in [offset, tail] {
        file.read_exact_at(buf, at)?;
        if buf.iter().any(|b| *b != 0) {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_ends_writes_only_what_is_not_zero() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("dev");
        let mut data = vec![0u8; 64 << 10];
        data[10] = 1;
        data[32 << 10] = 2;
        data[(64 << 10) - 1] = 3;
        std::fs::write(&path, &data).expect("write");
        let size = data.len() as u64;
        assert!(zero_ends(&path, size, 4096).expect("zero"));
        let after = std::fs::read(&path).expect("read");
        assert!(after[..4096].iter().all(|b| *b == 0));
        assert!(after[(60 << 10)..].iter().all(|b| *b == 0));
        assert_eq!(after[32 << 10], 2, "the middle is left alone");
        assert!(
            !zero_ends(&path, size, 4096).expect("zero"),
            "nothing left to write"
        );
        // Ends longer than the device: the whole device, once.
        assert!(zero_ends(&path, size, 1 << 20).expect("zero"));
        assert!(std::fs::read(&path).expect("read").iter().all(|b| *b == 0));
    }

    #[test]
    fn range_ends_are_read_as_the_device_holds_them() {
        // tmpfs before Linux 6.6 refuses O_DIRECT, and the temporary
        // directory may be one; the source tree is on a disk.
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).expect("tempdir");
        let path = dir.path().join("dev");
        let mut data = vec![0u8; 64 << 10];
        data[20 << 10] = 1;
        std::fs::write(&path, &data).expect("write");
        // 16..48 KiB: the first 4 KiB, 16..20, and the last, 44..48, are zero
        assert!(range_ends_are_zero(&path, 16 << 10, 32 << 10, 4096).expect("read"));
        // 8 KiB ends of the same range reach the 1 at 20 KiB
        assert!(!range_ends_are_zero(&path, 16 << 10, 32 << 10, 8192).expect("read"));
        // so does the tail of 0..24 KiB
        assert!(!range_ends_are_zero(&path, 0, 24 << 10, 4096).expect("read"));
    }

    #[test]
    fn a_missing_device_is_not_in_use() {
        assert!(!in_use(Path::new("/dev/no-such-carina-device")).expect("missing is free"));
    }
}
