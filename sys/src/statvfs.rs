//! Usage numbers of a mounted filesystem (`statvfs(3)`): blocks and inodes,
//! total and free.

use std::path::Path;

/// The numbers of `statvfs` that usage and capacity need; block counts are
/// in units of `f_frsize` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatVfs {
    /// Fragment size: the unit of the block counts.
    pub f_frsize: u64,
    /// Size of the filesystem in blocks.
    pub f_blocks: u64,
    /// Free blocks, including those only root may use.
    pub f_bfree: u64,
    /// Free blocks for everyone.
    pub f_bavail: u64,
    /// Inodes.
    pub f_files: u64,
    /// Free inodes.
    pub f_ffree: u64,
}

/// `statvfs` of the filesystem holding `path`. Blocking: a slow or hung
/// filesystem blocks the caller, so async code runs it on a blocking thread.
pub fn statvfs(path: &Path) -> std::io::Result<StatVfs> {
    let st = rustix::fs::statvfs(path)?;
    Ok(StatVfs {
        f_frsize: st.f_frsize,
        f_blocks: st.f_blocks,
        f_bfree: st.f_bfree,
        f_bavail: st.f_bavail,
        f_files: st.f_files,
        f_ffree: st.f_ffree,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_root_filesystem() {
        let st = statvfs(Path::new("/")).expect("statvfs /");
        assert!(st.f_frsize > 0);
        assert!(
            st.f_blocks >= st.f_bfree && st.f_bfree >= st.f_bavail,
            "{st:?}"
        );
        let err = statvfs(Path::new("/no/such/carina/path")).expect_err("missing path");
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    }
}
