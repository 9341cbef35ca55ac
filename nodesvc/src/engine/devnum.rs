//! Device numbers of block devices, read with `stat` (no unsafe code).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::error::{Error, Result};

/// Splits a Linux `dev_t` into (major, minor) the way glibc encodes it.
pub fn split(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// (major, minor) of the block device at `path`.
pub fn of_path(path: &Path) -> Result<(u32, u32)> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io("stat", path, e))?;
    Ok(split(meta.rdev()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_glibc() {
        assert_eq!(split(0x0700), (7, 0));
        assert_eq!(split(0x0703), (7, 3));
        // 259:12 (a partition's extended dev_t)
        assert_eq!(split((259 << 8) | 12), (259, 12));
        // minor above 255 spills into the high bits
        assert_eq!(
            split((7 << 8) | (300 & 0xff) | ((300 & !0xff) << 12)),
            (7, 300)
        );
    }
}
