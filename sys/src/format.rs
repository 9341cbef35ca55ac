//! Filesystems on block volumes: what a device already holds
//! (`blkid -p`, probing the device itself, no cache and no udev), making a
//! filesystem on a **blank** device only, and growing a mounted one.
//!
//! A device that carries any signature (a filesystem of another type, a
//! partition table, an LVM label, ...) is never formatted: that would
//! destroy data someone may still want. It is [`FormatError::Occupied`],
//! naming what was found and what was asked for; `mkfs` is private to
//! [`ensure_filesystem`], which probes the device first.

use std::io::{Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::IoError;
use crate::command::{Cmd, CommandError};
use crate::mkfs::MkfsOptions;

/// The smallest device `mkfs.xfs` accepts (xfsprogs 5.19 and later).
pub const XFS_MIN_BYTES: u64 = 300 << 20;

/// mkfs and grow may touch much of a large device.
const LONG_TIMEOUT: Duration = Duration::from_secs(600);

/// `blkid` exits with 2 when it finds nothing on the device.
const BLKID_NOTHING_FOUND: i32 = 2;

/// A filesystem the node can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsType {
    Ext4,
    /// ext3, made by `mkfs.ext3` and grown like ext4 (the kernel's ext4
    /// driver serves it).
    Ext3,
    Xfs,
}

/// The names of the filesystems the node makes, for messages.
pub const FS_NAMES: &str = "ext4, ext3 or xfs";

impl FsType {
    /// The filesystem of that name (`ext4`, `ext3`, `xfs`, as mount and
    /// blkid spell them), if it is one the node can make.
    pub fn from_name(name: &str) -> Option<FsType> {
        match name {
            "ext4" => Some(FsType::Ext4),
            "ext3" => Some(FsType::Ext3),
            "xfs" => Some(FsType::Xfs),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FsType::Ext4 => "ext4",
            FsType::Ext3 => "ext3",
            FsType::Xfs => "xfs",
        }
    }

    /// The program that makes it.
    pub fn mkfs(self) -> &'static str {
        match self {
            FsType::Ext4 => "mkfs.ext4",
            FsType::Ext3 => "mkfs.ext3",
            FsType::Xfs => "mkfs.xfs",
        }
    }

    /// ext3 or ext4: e2fsprogs check, grow and measure it.
    pub fn is_ext(self) -> bool {
        matches!(self, FsType::Ext4 | FsType::Ext3)
    }
}

/// Errors of probing, formatting and growing.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(transparent)]
    Command(#[from] CommandError),
    /// The device holds something other than the filesystem asked for.
    #[error("{} holds {found}, not {wanted}; it is left as it is (Carina formats blank devices only)", device.display())]
    Occupied {
        device: PathBuf,
        found: String,
        wanted: String,
    },
    #[error("{} is {size_bytes} bytes; {fs} needs at least {min_bytes}", device.display())]
    TooSmall {
        device: PathBuf,
        fs: &'static str,
        size_bytes: u64,
        min_bytes: u64,
    },
    #[error(transparent)]
    Io(#[from] IoError),
    /// A tool's report could not be read.
    #[error("cannot read the {what} of {}: {output:?}", device.display())]
    Unreadable {
        device: PathBuf,
        what: &'static str,
        output: String,
    },
}

/// What `blkid -p` found on a device that is not blank.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Signature {
    /// `TYPE`: a filesystem or other content (`ext4`, `LVM2_member`, `swap`).
    pub fs_type: Option<String>,
    /// `PTTYPE`: a partition table (`gpt`, `dos`).
    pub pt_type: Option<String>,
}

impl Signature {
    /// The filesystem to mount, if the signature is exactly one we support.
    pub fn filesystem(&self) -> Option<FsType> {
        if self.pt_type.is_some() {
            return None;
        }
        FsType::from_name(self.fs_type.as_deref()?)
    }

    /// For messages: `ext4`, `a gpt partition table`.
    pub fn describe(&self) -> String {
        match (&self.fs_type, &self.pt_type) {
            (Some(t), None) => t.clone(),
            (Some(t), Some(p)) => format!("{t} and a {p} partition table"),
            (None, Some(p)) => format!("a {p} partition table"),
            (None, None) => "nothing".to_string(),
        }
    }
}

/// Parses `blkid -p -o export` (`KEY=value` lines). `None` when it names
/// no content: a blank partition still gets `PART_ENTRY_*` lines (its entry
/// in the parent's table) and exit status 0.
pub fn parse_blkid_export(text: &str) -> Option<Signature> {
    let mut sig = Signature::default();
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("TYPE=") {
            sig.fs_type = Some(v.to_string());
        } else if let Some(v) = line.strip_prefix("PTTYPE=") {
            sig.pt_type = Some(v.to_string());
        }
    }
    (sig.fs_type.is_some() || sig.pt_type.is_some()).then_some(sig)
}

/// What the device holds: `None` if it is blank.
pub async fn probe(device: &Path) -> Result<Option<Signature>, FormatError> {
    match Cmd::new("blkid")
        .args(["-p", "-o", "export"])
        .arg(device)
        .run()
        .await
    {
        Ok(out) => Ok(parse_blkid_export(&out.stdout)),
        Err(e) if e.exit_code() == Some(BLKID_NOTHING_FOUND) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A filesystem ready to mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prepared {
    pub fs: FsType,
    /// This call made it (the device was blank).
    pub formatted: bool,
}

/// Makes sure `device` holds a filesystem to mount. A blank device is
/// formatted with `requested` (ext4 when nothing was requested), with
/// `options` added to mkfs (checked for that filesystem by the caller,
/// [`MkfsOptions::parse`]). An existing ext4, ext3 or xfs is kept when it
/// is what was requested, or when nothing was. Anything else is
/// [`FormatError::Occupied`].
pub async fn ensure_filesystem(
    device: &Path,
    requested: Option<FsType>,
    options: &MkfsOptions,
) -> Result<Prepared, FormatError> {
    match probe(device).await? {
        None => {
            let fs = requested.unwrap_or(FsType::Ext4);
            make_filesystem(device, fs, options).await?;
            Ok(Prepared {
                fs,
                formatted: true,
            })
        }
        Some(sig) => match (sig.filesystem(), requested) {
            (Some(found), Some(wanted)) if found == wanted => Ok(Prepared {
                fs: found,
                formatted: false,
            }),
            (Some(found), None) => Ok(Prepared {
                fs: found,
                formatted: false,
            }),
            (_, wanted) => Err(FormatError::Occupied {
                device: device.to_path_buf(),
                found: sig.describe(),
                wanted: wanted.map_or(FS_NAMES, FsType::as_str).to_string(),
            }),
        },
    }
}

/// Runs mkfs on `device`, the class's `options` after the node's own (so
/// a class's `-m` wins over the default). Private: only
/// [`ensure_filesystem`], after probing the device blank, may call it.
async fn make_filesystem(
    device: &Path,
    fs: FsType,
    options: &MkfsOptions,
) -> Result<(), FormatError> {
    let cmd = match fs {
        // -m0: no blocks reserved for root; a volume belongs to its pod.
        FsType::Ext4 | FsType::Ext3 => Cmd::new(fs.mkfs()).args(["-F", "-m0"]),
        FsType::Xfs => {
            let size_bytes = device_size(device).await?;
            if size_bytes < XFS_MIN_BYTES {
                return Err(FormatError::TooSmall {
                    device: device.to_path_buf(),
                    fs: "xfs",
                    size_bytes,
                    min_bytes: XFS_MIN_BYTES,
                });
            }
            Cmd::new(fs.mkfs()).arg("-f")
        }
    };
    cmd.args(options.args())
        .arg(device)
        .timeout(LONG_TIMEOUT)
        .run()
        .await?;
    tracing::info!(device = %device.display(), fs = fs.as_str(), options = ?options.args(), "made a filesystem on a blank device");
    Ok(())
}

/// Grows the filesystem mounted at `mount_point` (from `device`) to fill
/// the device: `resize2fs <device>` for ext4, `xfs_growfs <mount point>`
/// for xfs. Both work online.
pub async fn grow_filesystem(
    fs: FsType,
    device: &Path,
    mount_point: &Path,
) -> Result<(), FormatError> {
    let cmd = match fs {
        FsType::Ext4 | FsType::Ext3 => Cmd::new("resize2fs").arg(device),
        FsType::Xfs => Cmd::new("xfs_growfs").arg(mount_point),
    };
    cmd.timeout(LONG_TIMEOUT).run().await?;
    Ok(())
}

/// The bytes the `fs` filesystem on `device` spans, by its own
/// superblock (read-only; mounted or not).
pub async fn filesystem_bytes(fs: FsType, device: &Path) -> Result<u64, FormatError> {
    let (out, count_key, size_key) = match fs {
        FsType::Ext4 | FsType::Ext3 => (
            Cmd::new("dumpe2fs").arg("-h").arg(device).run().await?,
            "Block count:",
            "Block size:",
        ),
        FsType::Xfs => (
            Cmd::new("xfs_db")
                .args(["-r", "-c", "sb 0", "-c", "p dblocks blocksize"])
                .arg(device)
                .run()
                .await?,
            "dblocks =",
            "blocksize =",
        ),
    };
    parse_fs_bytes(&out.stdout, count_key, size_key).ok_or_else(|| FormatError::Unreadable {
        device: device.to_path_buf(),
        what: "filesystem size",
        output: out.stdout.chars().take(400).collect(),
    })
}

/// `<count_key> N` times `<size_key> M` from a tool's report.
fn parse_fs_bytes(text: &str, count_key: &str, size_key: &str) -> Option<u64> {
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    field(count_key)?.checked_mul(field(size_key)?)
}

/// Grows an unmounted ext4 (or ext3) filesystem on `device` to fill it, checking
/// it first (`resize2fs` asks for a fresh `e2fsck -f` before an offline
/// resize). xfs grows only mounted: [`grow_filesystem`].
pub async fn grow_unmounted_ext4(device: &Path) -> Result<(), FormatError> {
    Cmd::new("e2fsck")
        .args(["-f", "-p"])
        .arg(device)
        .timeout(LONG_TIMEOUT)
        .run()
        .await?;
    Cmd::new("resize2fs")
        .arg(device)
        .timeout(LONG_TIMEOUT)
        .run()
        .await?;
    Ok(())
}

/// The size of a block device (or file) in bytes.
pub async fn device_size(device: &Path) -> Result<u64, FormatError> {
    let path = device.to_path_buf();
    tokio::task::spawn_blocking(move || {
        std::fs::File::open(&path).and_then(|mut f| f.seek(SeekFrom::End(0)))
    })
    .await
    .unwrap_or_else(|join| Err(std::io::Error::other(join)))
    .map_err(|e| IoError::new("measure", device, e).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{mutated_text, noisy_text};
    use proptest::prelude::*;

    const DUMPE2FS: &str = "Filesystem volume name:   <none>\nBlock count:              409600\nBlock size:               1024\n";

    proptest! {
        /// A tool's report of any text gives no size or the product of the
        /// two numbers it shows; sizes past u64 are refused.
        #[test]
        fn filesystem_sizes_from_any_report(
            text in prop_oneof![noisy_text(), mutated_text(DUMPE2FS), mutated_text("dblocks = 102400\nblocksize = 4096\n")],
            count in any::<u64>(),
            size in prop_oneof![any::<u64>(), 0u64..65536],
        ) {
            for (c, s) in [("Block count:", "Block size:"), ("dblocks =", "blocksize =")] {
                if let Some(bytes) = parse_fs_bytes(&text, c, s) {
                    let shown = |key: &str| text.lines().find_map(|l| l.trim().strip_prefix(key).map(|v| v.trim().to_string()));
                    let (n, m) = (shown(c).expect("a count"), shown(s).expect("a size"));
                    prop_assert_eq!(Some(bytes), n.parse::<u64>().ok().zip(m.parse::<u64>().ok()).and_then(|(n, m)| n.checked_mul(m)));
                }
            }
            let report = format!("dblocks = {count}\nblocksize = {size}\n");
            prop_assert_eq!(parse_fs_bytes(&report, "dblocks =", "blocksize ="), count.checked_mul(size));
        }

        /// A file system name is one the node can make only when it prints
        /// back as itself.
        #[test]
        fn filesystem_names_of_any_text(name in prop_oneof![noisy_text(), "(ext4|xfs|EXT4|ext3) ?"]) {
            if let Some(fs) = FsType::from_name(&name) {
                prop_assert_eq!(fs.as_str(), name);
            }
        }
    }

    #[test]
    fn filesystem_sizes_are_read_from_the_tools_reports() {
        let ext4 = "Filesystem volume name:   <none>\nBlock count:              409600\nReserved block count:     0\nBlock size:               1024\n";
        assert_eq!(
            parse_fs_bytes(ext4, "Block count:", "Block size:"),
            Some(400 << 20)
        );
        let xfs = "dblocks = 102400\nblocksize = 4096\n";
        assert_eq!(
            parse_fs_bytes(xfs, "dblocks =", "blocksize ="),
            Some(400 << 20)
        );
        assert_eq!(
            parse_fs_bytes("dblocks = x\n", "dblocks =", "blocksize ="),
            None
        );
        assert_eq!(parse_fs_bytes("", "Block count:", "Block size:"), None);
    }

    #[test]
    fn parses_blkid_export() {
        let ext4 = "DEVNAME=/dev/loop3\nUUID=4a1e\nBLOCK_SIZE=4096\nTYPE=ext4\nUSAGE=filesystem\n";
        let sig = parse_blkid_export(ext4).expect("a signature");
        assert_eq!(sig.filesystem(), Some(FsType::Ext4));
        assert_eq!(sig.describe(), "ext4");

        let gpt = "DEVNAME=/dev/loop4\nPTUUID=77e0\nPTTYPE=gpt\n";
        let sig = parse_blkid_export(gpt).expect("a signature");
        assert_eq!(sig.filesystem(), None);
        assert_eq!(sig.describe(), "a gpt partition table");

        let lvm = "DEVNAME=/dev/loop5\nUUID=x\nVERSION=LVM2 001\nTYPE=LVM2_member\nUSAGE=raid\n";
        let sig = parse_blkid_export(lvm).expect("a signature");
        assert_eq!(sig.filesystem(), None);
        assert_eq!(sig.describe(), "LVM2_member");

        // A blank GPT partition (captured from a RAW volume): exit 0, only
        // its own table entry.
        let blank_partition = "DEVNAME=/dev/loop0p1\nPART_ENTRY_SCHEME=gpt\nPART_ENTRY_NAME=carina.io/x\n\
            PART_ENTRY_UUID=60d46e21-e251-4486-9dc4-38c27227d8bd\n\
            PART_ENTRY_TYPE=0fc63daf-8483-4772-8e79-3d69d8477de4\nPART_ENTRY_NUMBER=1\n\
            PART_ENTRY_OFFSET=2048\nPART_ENTRY_SIZE=65536\nPART_ENTRY_DISK=7:0\n";
        assert_eq!(parse_blkid_export(blank_partition), None);
        // The same partition once formatted.
        let formatted = format!("{blank_partition}TYPE=xfs\nUSAGE=filesystem\n");
        assert_eq!(
            parse_blkid_export(&formatted).and_then(|s| s.filesystem()),
            Some(FsType::Xfs)
        );
    }

    /// Probing, formatting and refusing on a real file (mkfs and blkid work
    /// on regular files as on devices).
    #[tokio::test]
    async fn formats_blank_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let img = dir.path().join("disk.img");
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(64 << 20))
            .expect("image");
        if Cmd::new("mkfs.ext4").arg("-V").run().await.is_err() {
            eprintln!("SKIP formats_blank_only: mkfs.ext4 is not installed");
            return;
        }
        assert_eq!(probe(&img).await.expect("probe"), None);
        let p = ensure_filesystem(&img, None, &MkfsOptions::default())
            .await
            .expect("format");
        assert_eq!(
            p,
            Prepared {
                fs: FsType::Ext4,
                formatted: true
            }
        );
        // Again: kept, not reformatted.
        let p = ensure_filesystem(&img, Some(FsType::Ext4), &MkfsOptions::default())
            .await
            .expect("kept");
        assert!(!p.formatted);
        // Another type asked for: refused, data intact.
        let err = ensure_filesystem(&img, Some(FsType::Xfs), &MkfsOptions::default())
            .await
            .expect_err("refused");
        assert!(matches!(err, FormatError::Occupied { .. }), "{err}");
        assert_eq!(
            probe(&img)
                .await
                .expect("probe")
                .and_then(|s| s.filesystem()),
            Some(FsType::Ext4)
        );
        // xfs on a 64 MiB device is refused before mkfs runs.
        let small = dir.path().join("small.img");
        std::fs::File::create(&small)
            .and_then(|f| f.set_len(64 << 20))
            .expect("image");
        let err = ensure_filesystem(&small, Some(FsType::Xfs), &MkfsOptions::default())
            .await
            .expect_err("too small");
        assert!(matches!(err, FormatError::TooSmall { .. }), "{err}");
        assert_eq!(device_size(&small).await.expect("size"), 64 << 20);
    }

    /// A class's mkfs options reach mkfs: an ext3 made with a 1 KiB block
    /// and a label shows both in its superblock, and is kept as ext3.
    #[tokio::test]
    async fn formats_ext3_with_class_options() {
        let dir = tempfile::tempdir().expect("tempdir");
        let img = dir.path().join("disk.img");
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(64 << 20))
            .expect("image");
        if Cmd::new("mkfs.ext3").arg("-V").run().await.is_err() {
            eprintln!("SKIP formats_ext3_with_class_options: mkfs.ext3 is not installed");
            return;
        }
        let options =
            MkfsOptions::parse(FsType::Ext3, "-b 1024 -L class-label -m 2").expect("options");
        let p = ensure_filesystem(&img, Some(FsType::Ext3), &options)
            .await
            .expect("format");
        assert_eq!(
            p,
            Prepared {
                fs: FsType::Ext3,
                formatted: true
            }
        );
        let sb = Cmd::new("dumpe2fs")
            .arg("-h")
            .arg(&img)
            .run()
            .await
            .expect("dumpe2fs")
            .stdout;
        let line = |key: &str| {
            sb.lines()
                .find_map(|l| l.strip_prefix(key))
                .map(str::trim)
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(line("Block size:"), "1024");
        assert_eq!(line("Filesystem volume name:"), "class-label");
        // -m 2 came after the node's -m0, so the class's figure holds.
        let blocks: u64 = line("Block count:").parse().expect("blocks");
        let reserved: u64 = line("Reserved block count:").parse().expect("reserved");
        assert_eq!(reserved, blocks * 2 / 100);
        assert!(
            !line("Filesystem features:").contains("extent"),
            "ext3 has no extents"
        );
        assert_eq!(
            probe(&img)
                .await
                .expect("probe")
                .and_then(|s| s.filesystem()),
            Some(FsType::Ext3)
        );
        let again = ensure_filesystem(&img, None, &MkfsOptions::default())
            .await
            .expect("kept");
        assert_eq!(again.fs, FsType::Ext3);
        assert_eq!(
            filesystem_bytes(FsType::Ext3, &img).await.expect("bytes"),
            64 << 20
        );
    }
}
