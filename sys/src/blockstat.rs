//! A block device's IO counters as the kernel keeps them: the `stat` file
//! of `/sys/dev/block/<major>:<minor>`, found by device number (no name
//! to resolve, no command run). The fields are those of the kernel's
//! block statistics: reads and writes completed and merged, 512-byte
//! sectors moved, milliseconds spent, IOs in flight and milliseconds with
//! IO in flight; newer kernels append discard and flush counters, which
//! are read when present.

use std::path::PathBuf;

use crate::IoError;

/// The unit of the kernel's sector counters, whatever the device's own
/// block size.
pub const SECTOR_BYTES: u64 = 512;

/// One device's counters, as read from its `stat` file. Times are
/// milliseconds, sectors are [`SECTOR_BYTES`] each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockStat {
    pub reads_completed: u64,
    pub reads_merged: u64,
    pub sectors_read: u64,
    pub read_ms: u64,
    pub writes_completed: u64,
    pub writes_merged: u64,
    pub sectors_written: u64,
    pub write_ms: u64,
    /// IOs started and not yet completed (a gauge, not a counter).
    pub in_flight: u64,
    /// Milliseconds during which at least one IO was in flight.
    pub io_ms: u64,
    /// Milliseconds IOs spent, weighted by how many were in flight.
    pub weighted_io_ms: u64,
}

impl BlockStat {
    /// Bytes read: sectors read × 512.
    pub fn read_bytes(&self) -> u64 {
        self.sectors_read.saturating_mul(SECTOR_BYTES)
    }

    /// Bytes written: sectors written × 512.
    pub fn written_bytes(&self) -> u64 {
        self.sectors_written.saturating_mul(SECTOR_BYTES)
    }
}

/// Why a `stat` file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatError {
    /// The file is not there or cannot be read (the device is gone).
    #[error(transparent)]
    Io(#[from] IoError),
    /// The file does not read as the kernel writes it.
    #[error("{}: {reason}", path.display())]
    Parse { path: PathBuf, reason: String },
}

/// The fields every kernel since 2.6 writes; later ones are optional.
const REQUIRED_FIELDS: usize = 11;

/// Parses the text of a `stat` file: at least eleven unsigned decimal
/// fields separated by spaces. Errors say which field is wrong.
pub fn parse(text: &str) -> Result<BlockStat, String> {
    let fields: Vec<u64> = text
        .split_ascii_whitespace()
        .enumerate()
        .map(|(i, f)| {
            f.parse::<u64>()
                .map_err(|e| format!("field {} ({f:?}): {e}", i + 1))
        })
        .collect::<Result<_, _>>()?;
    if fields.len() < REQUIRED_FIELDS {
        return Err(format!(
            "{} fields, at least {REQUIRED_FIELDS} expected",
            fields.len()
        ));
    }
    Ok(BlockStat {
        reads_completed: fields[0],
        reads_merged: fields[1],
        sectors_read: fields[2],
        read_ms: fields[3],
        writes_completed: fields[4],
        writes_merged: fields[5],
        sectors_written: fields[6],
        write_ms: fields[7],
        in_flight: fields[8],
        io_ms: fields[9],
        weighted_io_ms: fields[10],
    })
}

/// The `stat` file of the block device `major:minor`.
pub fn stat_path(major: u32, minor: u32) -> PathBuf {
    PathBuf::from(format!("/sys/dev/block/{major}:{minor}/stat"))
}

/// The counters of the block device `major:minor` now. Blocking (one
/// read of a small sysfs file).
pub fn read(major: u32, minor: u32) -> Result<BlockStat, StatError> {
    let path = stat_path(major, minor);
    let text = std::fs::read_to_string(&path).map_err(IoError::map("read", &path))?;
    parse(&text).map_err(|reason| StatError::Parse { path, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_current_kernels_line() {
        // Seventeen fields (discard and flush counters), as 5.5+ writes.
        let s = parse(
            "  503911     1255 506909393   913245   710337 49653225 751196288  5007010        3   733908  6141437     2295        0 400656570     8241   104884   212941\n",
        )
        .expect("parses");
        assert_eq!(s.reads_completed, 503_911);
        assert_eq!(s.reads_merged, 1255);
        assert_eq!(s.sectors_read, 506_909_393);
        assert_eq!(s.read_bytes(), 506_909_393 * 512);
        assert_eq!(s.read_ms, 913_245);
        assert_eq!(s.writes_completed, 710_337);
        assert_eq!(s.writes_merged, 49_653_225);
        assert_eq!(s.written_bytes(), 751_196_288 * 512);
        assert_eq!(s.write_ms, 5_007_010);
        assert_eq!(s.in_flight, 3);
        assert_eq!(s.io_ms, 733_908);
        assert_eq!(s.weighted_io_ms, 6_141_437);
    }

    #[test]
    fn parses_an_old_kernels_eleven_fields() {
        let s = parse("1 2 3 4 5 6 7 8 9 10 11").expect("parses");
        assert_eq!((s.reads_completed, s.weighted_io_ms), (1, 11));
    }

    #[test]
    fn refuses_short_or_garbled_text() {
        let e = parse("1 2 3").expect_err("short");
        assert!(e.contains("3 fields"), "{e}");
        let e = parse("1 2 3 4 5 x 7 8 9 10 11").expect_err("garbled");
        assert!(e.contains("field 6"), "{e}");
        let e = parse("1 2 3 4 5 -6 7 8 9 10 11").expect_err("negative");
        assert!(e.contains("field 6"), "{e}");
        assert!(parse("").is_err());
    }

    #[test]
    fn a_missing_device_is_an_io_error_naming_the_file() {
        // Major 0 is the unnamed devices' and has no block device node.
        let e = read(0, 4_000_000).expect_err("no such device");
        assert!(matches!(e, StatError::Io(_)), "{e:?}");
        assert!(
            e.to_string().contains("/sys/dev/block/0:4000000/stat"),
            "{e}"
        );
    }

    #[test]
    fn reads_a_real_device() {
        // A Linux machine has block devices registered (loop, ram, its
        // disks); read the first listed, so the real file's shape is
        // checked, not only captured text.
        let first = std::fs::read_dir("/sys/dev/block")
            .expect("/sys/dev/block")
            .flatten()
            .next()
            .expect("a block device");
        let name = first.file_name().to_string_lossy().into_owned();
        let (major, minor) = name.split_once(':').expect("major:minor");
        let s = read(major.parse().expect("major"), minor.parse().expect("minor"));
        assert!(s.is_ok(), "{name}: {s:?}");
    }
}
