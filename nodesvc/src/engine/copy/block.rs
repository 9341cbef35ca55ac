//! Block copies: `len` bytes from one block device to another, in large
//! chunks, with direct IO where the devices take it (the source is read
//! from the disk, not from a page cache that may predate a frozen
//! filesystem's last flush, and the copy does not evict the node's
//! cache), then synced.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use super::Stop;

/// Bytes read and written per step.
pub const CHUNK: usize = 4 << 20;
/// Alignment direct IO needs of buffers, offsets and lengths.
const ALIGN: usize = 4096;

/// Why a copy stopped without completing.
#[derive(Debug)]
pub enum CopyError {
    Stopped,
    Io {
        action: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// The error of `action` on `path`, for `map_err`.
pub(super) fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> CopyError {
    let path = path.to_path_buf();
    move |source| CopyError::Io {
        action,
        path,
        source,
    }
}

/// Opens `path` with direct IO when `direct` and the device takes it,
/// else buffered. Returns whether it is direct.
fn open(path: &Path, write: bool, direct: bool) -> std::io::Result<(File, bool)> {
    let mut options = OpenOptions::new();
    options.read(!write).write(write);
    if direct {
        let mut direct_options = options.clone();
        direct_options.custom_flags(libc::O_DIRECT);
        match direct_options.open(path) {
            Ok(f) => return Ok((f, true)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    options.open(path).map(|f| (f, false))
}

/// A buffer of `CHUNK` bytes aligned for direct IO.
struct Aligned {
    storage: Vec<u8>,
    start: usize,
}

impl Aligned {
    fn new() -> Aligned {
        let storage = vec![0u8; CHUNK + ALIGN];
        let start = storage.as_ptr().align_offset(ALIGN);
        Aligned { storage, start }
    }

    fn slice(&mut self, len: usize) -> &mut [u8] {
        &mut self.storage[self.start..self.start + len]
    }
}

/// Copies the first `len` bytes of `source` onto `target`, calling
/// `progress` with the bytes copied after each chunk and checking `stop`
/// before each. The target is synced before it returns.
pub fn copy_device(
    source: &Path,
    target: &Path,
    len: u64,
    stop: &Stop,
    mut progress: impl FnMut(u64),
) -> Result<(), CopyError> {
    // Direct IO needs every request aligned; a length that is not (never
    // for volumes, which are whole extents or sectors) goes buffered.
    let direct = len.is_multiple_of(ALIGN as u64);
    let (src, _) = open(source, false, direct).map_err(io("open the source", source))?;
    let (dst, _) = open(target, true, direct).map_err(io("open the target", target))?;
    let mut buf = Aligned::new();
    let mut offset = 0u64;
    while offset < len {
        if stop.is_set() {
            return Err(CopyError::Stopped);
        }
        let n = (len - offset).min(CHUNK as u64) as usize;
        let chunk = buf.slice(n);
        src.read_exact_at(chunk, offset)
            .map_err(io("read the source", source))?;
        dst.write_all_at(chunk, offset)
            .map_err(io("write the target", target))?;
        offset += n as u64;
        progress(offset);
    }
    dst.sync_all().map_err(io("sync the target", target))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    #[test]
    fn copies_exactly_len_bytes_and_reports_progress() {
        let dir = tempfile::tempdir().expect("works");
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        let data = pattern(CHUNK * 2 + 8192);
        std::fs::write(&src, &data).expect("works");
        std::fs::write(&dst, vec![0xffu8; data.len() + 4096]).expect("works");
        let mut seen = Vec::new();
        copy_device(&src, &dst, data.len() as u64, &Stop::default(), |n| {
            seen.push(n)
        })
        .expect("works");
        let out = std::fs::read(&dst).expect("works");
        assert_eq!(&out[..data.len()], &data[..]);
        // Beyond the source's length the target is left as it was.
        assert!(out[data.len()..].iter().all(|b| *b == 0xff));
        assert_eq!(
            seen,
            vec![CHUNK as u64, 2 * CHUNK as u64, data.len() as u64]
        );
    }

    #[test]
    fn a_stop_ends_the_copy_between_chunks() {
        let dir = tempfile::tempdir().expect("works");
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        std::fs::write(&src, pattern(CHUNK * 3)).expect("works");
        std::fs::write(&dst, vec![0u8; CHUNK * 3]).expect("works");
        let stop = Stop::default();
        let mut chunks = 0;
        let result = copy_device(&src, &dst, (CHUNK * 3) as u64, &stop, |_| {
            chunks += 1;
            stop.set();
        });
        assert!(matches!(result, Err(CopyError::Stopped)));
        assert_eq!(chunks, 1);
    }

    #[test]
    fn a_short_source_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("works");
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        std::fs::write(&src, pattern(4096)).expect("works");
        std::fs::write(&dst, vec![0u8; 8192]).expect("works");
        match copy_device(&src, &dst, 8192, &Stop::default(), |_| {}) {
            Err(CopyError::Io { action, path, .. }) => {
                assert_eq!(action, "read the source");
                assert_eq!(path, src);
            }
            other => panic!("{other:?}"),
        }
    }
}
