//! Mounts as the kernel sees them, and the mount primitives: mount,
//! bind-mount (with per-mount options), unmount.
//!
//! Mount state is never remembered: every question ("is this path a mount
//! point?", "what is mounted there?") reads `/proc/self/mountinfo` again,
//! parsed by the pure [`parse_mountinfo`]. Mounting and unmounting run
//! `mount` and `umount` through the shared [`Cmd`] runner (argv only, a
//! timeout, errors naming the command and its stderr). What a mount means
//! for a volume (staged, published, someone else's) is the caller's to
//! decide.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use crate::IoError;
use crate::command::{Cmd, CommandError};

/// Where the kernel lists this process's mounts.
pub const MOUNTINFO: &str = "/proc/self/mountinfo";

/// How many mounts stacked on one path [`unmount_all`] removes at most.
const MAX_STACKED: usize = 16;

/// Errors of reading mount state and of mounting.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("{MOUNTINFO} line {line}: {reason}")]
    Parse { line: usize, reason: String },
    /// Mounts still stacked on a path after [`MAX_STACKED`] unmounts.
    #[error("{} is still a mount point after {MAX_STACKED} unmounts", path.display())]
    StillMounted { path: PathBuf },
}

/// One line of `/proc/self/mountinfo`, with paths unescaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub id: u32,
    pub parent: u32,
    /// Device numbers of the mounted filesystem (`st_dev` of its files).
    pub major: u32,
    pub minor: u32,
    /// The directory of the filesystem that is mounted here (`/` unless
    /// this is a bind mount of a subdirectory or file).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`/`ro`, `nosuid`, ...).
    pub options: Vec<String>,
    pub fs_type: String,
    /// The mount source (`/dev/loop3`, `tmpfs`, ...).
    pub source: PathBuf,
    /// Filesystem-wide options.
    pub super_options: Vec<String>,
}

impl MountEntry {
    /// Whether this mount is read-only (per mount, as a bind remount sets).
    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
}

/// Undoes the kernel's octal escapes (`\040` space, `\011` tab, `\012`
/// newline, `\134` backslash) in one mountinfo field.
pub fn unescape(field: &str) -> OsString {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && let Some(b) = octal(&bytes[i + 1..i + 4])
        {
            out.push(b);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    OsString::from_vec(out)
}

fn octal(digits: &[u8]) -> Option<u8> {
    let mut v: u32 = 0;
    for &d in digits {
        if !(b'0'..=b'7').contains(&d) {
            return None;
        }
        v = v * 8 + u32::from(d - b'0');
    }
    u8::try_from(v).ok()
}

/// Parses the text of `/proc/<pid>/mountinfo` (see proc(5)).
pub fn parse_mountinfo(text: &str) -> Result<Vec<MountEntry>, MountError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            parse_line(l).map_err(|reason| MountError::Parse {
                line: n + 1,
                reason,
            })
        })
        .collect()
}

fn parse_line(line: &str) -> Result<MountEntry, String> {
    let fields: Vec<&str> = line.split(' ').collect();
    // Six fixed fields, optional fields, "-", then three more.
    let sep = fields
        .iter()
        .skip(6)
        .position(|f| *f == "-")
        .map(|p| p + 6)
        .ok_or("no \" - \" separator")?;
    if fields.len() < sep + 3 {
        return Err("fewer than three fields after the separator".into());
    }
    let num = |i: usize, what: &str| {
        fields[i]
            .parse::<u32>()
            .map_err(|e| format!("{what} {:?}: {e}", fields[i]))
    };
    let (major, minor) = fields[2]
        .split_once(':')
        .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        .ok_or_else(|| format!("device {:?} is not major:minor", fields[2]))?;
    let list = |s: &str| s.split(',').map(str::to_string).collect::<Vec<_>>();
    Ok(MountEntry {
        id: num(0, "mount id")?,
        parent: num(1, "parent id")?,
        major,
        minor,
        root: unescape(fields[3]).into(),
        mount_point: unescape(fields[4]).into(),
        options: list(fields[5]),
        fs_type: unescape(fields[sep + 1]).to_string_lossy().into_owned(),
        source: unescape(fields[sep + 2]).into(),
        super_options: list(fields[sep + 3..].join(" ").as_str()),
    })
}

/// A snapshot of the mount table.
#[derive(Debug, Clone, Default)]
pub struct MountTable {
    entries: Vec<MountEntry>,
}

impl MountTable {
    /// Reads the kernel's current table.
    pub async fn read() -> Result<MountTable, MountError> {
        let text = tokio::fs::read_to_string(MOUNTINFO)
            .await
            .map_err(IoError::map("read", MOUNTINFO))?;
        Ok(MountTable {
            entries: parse_mountinfo(&text)?,
        })
    }

    pub fn from_entries(entries: Vec<MountEntry>) -> Self {
        MountTable { entries }
    }

    pub fn entries(&self) -> &[MountEntry] {
        &self.entries
    }

    /// The visible mount at `path` (the last of those stacked there), if
    /// `path` is a mount point. `path` must be canonical (see [`canonical`]).
    pub fn at(&self, path: &Path) -> Option<&MountEntry> {
        self.entries.iter().rev().find(|e| e.mount_point == path)
    }

    /// Where the file or directory at canonical `path` lives: the mount
    /// holding it (the longest mount point above it) and `path` as seen
    /// from that filesystem's root, i.e. the `(major, minor, root)` any
    /// bind mount of it would be listed with.
    pub fn locate(&self, path: &Path) -> Option<(u32, u32, PathBuf)> {
        let entry = self
            .entries
            .iter()
            .filter(|e| path.starts_with(&e.mount_point))
            // The last of equals: the top of mounts stacked on one point.
            .max_by_key(|e| e.mount_point.components().count())?;
        let rel = path.strip_prefix(&entry.mount_point).ok()?;
        Some((entry.major, entry.minor, entry.root.join(rel)))
    }

    /// Mount points that show the filesystem `(major, minor)` from `root`.
    pub fn mounts_of(&self, major: u32, minor: u32, root: &Path) -> Vec<&Path> {
        self.entries
            .iter()
            .filter(|e| e.major == major && e.minor == minor && e.root == root)
            .map(|e| e.mount_point.as_path())
            .collect()
    }
}

/// `path` with symlinks resolved, as mountinfo spells mount points; `None`
/// if it does not exist.
pub async fn canonical(path: &Path) -> Result<Option<PathBuf>, MountError> {
    match tokio::fs::canonicalize(path).await {
        Ok(p) => Ok(Some(p)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(IoError::new("resolve", path, e).into()),
    }
}

/// What is mounted at `path` now, if anything. Works for directories and
/// for files bind-mounted onto files.
pub async fn mount_at(path: &Path) -> Result<Option<MountEntry>, MountError> {
    let Some(path) = canonical(path).await? else {
        return Ok(None);
    };
    Ok(MountTable::read().await?.at(&path).cloned())
}

/// Whether `path` is a mount point now (`false` if it does not exist).
pub async fn is_mount_point(path: &Path) -> Result<bool, MountError> {
    Ok(mount_at(path).await?.is_some())
}

/// `mount -t <fs_type> [-o <options>] <source> <target>`.
pub async fn mount(
    source: &Path,
    target: &Path,
    fs_type: &str,
    options: &[String],
) -> Result<(), MountError> {
    let mut cmd = Cmd::new("mount").args(["-t", fs_type]);
    if !options.is_empty() {
        cmd = cmd.args(["-o".to_string(), options.join(",")]);
    }
    cmd.arg(source).arg(target).run().await?;
    Ok(())
}

/// Bind-mounts `source` (a directory, or a file or device node) onto
/// `target`. Per-mount `options` (`ro`, `noexec`, ...) take a second step,
/// `remount,bind,<options>`; if that fails the bind mount is undone, so the
/// caller never gets a mount without the options it asked for (a writable
/// one it wanted read-only). Filesystem options among `options`
/// (`discard`, `data=...`) are the filesystem's, set when it was mounted;
/// a bind mount does not carry them ([`crate::mount_options::per_mount`]).
pub async fn bind_mount(
    source: &Path,
    target: &Path,
    options: &[String],
) -> Result<(), MountError> {
    let options = crate::mount_options::per_mount(options);
    Cmd::new("mount")
        .arg("--bind")
        .arg(source)
        .arg(target)
        .run()
        .await?;
    if !options.is_empty() {
        let remount = Cmd::new("mount")
            .args([
                "-o".to_string(),
                format!("remount,bind,{}", options.join(",")),
            ])
            .arg(target)
            .run()
            .await;
        if let Err(e) = remount {
            if let Err(undo) = unmount(target).await {
                tracing::error!(target = %target.display(), error = %undo, "cannot undo a bind mount whose remount with options failed");
            }
            return Err(e.into());
        }
    }
    Ok(())
}

/// `umount <target>`.
pub async fn unmount(target: &Path) -> Result<(), MountError> {
    Cmd::new("umount").arg(target).run().await?;
    Ok(())
}

/// Unmounts everything stacked on `target` until it is not a mount point;
/// a path that does not exist or is not mounted is left as it is.
pub async fn unmount_all(target: &Path) -> Result<(), MountError> {
    for _ in 0..MAX_STACKED {
        if !is_mount_point(target).await? {
            return Ok(());
        }
        unmount(target).await?;
    }
    if is_mount_point(target).await? {
        return Err(MountError::StillMounted {
            path: target.to_path_buf(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw
25 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
97 25 7:3 / /var/lib/kubelet/plugins/kubernetes.io/csi/carina.storage.io/abc/globalmount rw,relatime shared:50 - xfs /dev/loop3 rw,attr2,inode64,logbufs=8,noquota
98 25 7:3 / /var/lib/kubelet/pods/p\\0401/volumes/kubernetes.io~csi/pvc\\040x/mount ro,relatime shared:50 - xfs /dev/loop3 rw,attr2
99 25 0:5 /loop3 /var/lib/kubelet/plugins/kubernetes.io~csi/volumeDevices/publish/pvc-b/pod rw,nosuid master:2 - devtmpfs udev rw,size=8116164k,mode=755
100 25 259:2 /srv/carina/host-a/pvc-c /stage/with\\011tab\\134slash rw,relatime - ext4 /dev/nvme0n1p2 rw
";

    #[test]
    fn parses_fields_and_optional_fields() {
        let e = parse_mountinfo(SAMPLE).expect("parses");
        assert_eq!(e.len(), 6);
        assert_eq!(e[1].mount_point, Path::new("/"));
        assert_eq!(e[1].fs_type, "ext4");
        assert_eq!(e[1].source, Path::new("/dev/nvme0n1p2"));
        assert_eq!((e[2].major, e[2].minor), (7, 3));
        assert_eq!(e[2].id, 97);
        assert_eq!(e[2].parent, 25);
        assert_eq!(e[2].fs_type, "xfs");
        assert!(!e[2].read_only());
        assert!(e[2].super_options.contains(&"inode64".to_string()));
        // No optional fields at all on the last line.
        assert_eq!(e[5].fs_type, "ext4");
        assert_eq!(e[5].root, Path::new("/srv/carina/host-a/pvc-c"));
    }

    #[test]
    fn unescapes_spaces_tabs_and_backslashes() {
        let e = parse_mountinfo(SAMPLE).expect("parses");
        assert_eq!(
            e[3].mount_point,
            Path::new("/var/lib/kubelet/pods/p 1/volumes/kubernetes.io~csi/pvc x/mount")
        );
        assert!(e[3].read_only());
        assert_eq!(e[5].mount_point, Path::new("/stage/with\ttab\\slash"));
        // A file bind-mounted from devtmpfs keeps the device name as root.
        assert_eq!(e[4].root, Path::new("/loop3"));
        assert_eq!(unescape(r"a\040b\"), OsString::from("a b\\"));
        assert_eq!(unescape(r"\09x"), OsString::from(r"\09x"));
        assert_eq!(unescape(r"\777"), OsString::from(r"\777"));
    }

    #[test]
    fn table_finds_the_top_mount() {
        let mut entries = parse_mountinfo(SAMPLE).expect("parses");
        let mut stacked = entries[2].clone();
        stacked.id = 120;
        stacked.fs_type = "tmpfs".into();
        entries.push(stacked);
        let table = MountTable::from_entries(entries);
        let top = table
            .at(Path::new(
                "/var/lib/kubelet/plugins/kubernetes.io/csi/carina.storage.io/abc/globalmount",
            ))
            .expect("mounted");
        assert_eq!(top.fs_type, "tmpfs");
        assert!(table.at(Path::new("/var/lib")).is_none());
    }

    #[test]
    fn locate_and_mounts_of_find_bind_mounts() {
        let table = MountTable::from_entries(parse_mountinfo(SAMPLE).expect("parses"));
        // A directory of the root filesystem and its bind mount elsewhere.
        let (maj, min, root) = table
            .locate(Path::new("/srv/carina/host-a/pvc-c"))
            .expect("on /");
        assert_eq!((maj, min), (259, 2));
        assert_eq!(root, Path::new("/srv/carina/host-a/pvc-c"));
        assert_eq!(
            table.mounts_of(maj, min, &root),
            [Path::new("/stage/with\ttab\\slash")]
        );
        // Both mounts of the xfs on loop3, found from the first one.
        let staged = Path::new(
            "/var/lib/kubelet/plugins/kubernetes.io/csi/carina.storage.io/abc/globalmount",
        );
        let (maj, min, root) = table.locate(staged).expect("mounted");
        assert_eq!(root, Path::new("/"));
        assert_eq!(table.mounts_of(maj, min, &root).len(), 2);
    }

    #[test]
    fn malformed_lines_name_the_line() {
        let err = parse_mountinfo("22 1 0:21 / /proc rw shared:5 - proc proc rw\n1 2 3\n")
            .expect_err("malformed");
        assert!(err.to_string().contains("line 2"), "{err}");
        let err = parse_mountinfo("22 1 x / /proc rw - proc proc rw").expect_err("bad dev");
        assert!(err.to_string().contains("major:minor"), "{err}");
    }

    #[tokio::test]
    async fn reads_this_process_mounts() {
        let table = MountTable::read().await.expect("mountinfo");
        assert!(table.at(Path::new("/")).is_some());
        assert!(is_mount_point(Path::new("/")).await.expect("root"));
        assert!(
            !is_mount_point(Path::new("/no/such/carina/path"))
                .await
                .expect("missing path")
        );
    }
}
