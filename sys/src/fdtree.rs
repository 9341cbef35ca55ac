//! Directory trees read and written through directory descriptors, never
//! through a symbolic link: for trees that someone else (a pod) may change
//! while the node walks them.
//!
//! A [`Dir`] is an open directory; every call names an entry of it, one
//! component, never a path. Nothing here follows a link:
//!
//! - a directory is opened with `O_DIRECTORY | O_NOFOLLOW`, so a link in
//!   its place fails (`ENOTDIR` or `ELOOP`) instead of being entered;
//! - [`Dir::entry`] pins the entry first (`O_PATH | O_NOFOLLOW`), learns
//!   what it is from that descriptor, and opens *that* inode: a directory
//!   through `openat(pinned, ".")`, a regular file through
//!   `/proc/self/fd/<pinned>`, a link by `readlinkat(pinned, "")`. Whatever
//!   replaces the name after the pin is not what is read;
//! - new files are created with `O_CREAT | O_EXCL | O_NOFOLLOW`, new
//!   directories by `mkdirat` and then opened `O_NOFOLLOW`;
//! - owners, modes and times are set on a descriptor (`fchown`, `fchmod`,
//!   `futimens`); of a link itself by `AT_SYMLINK_NOFOLLOW`; of a special
//!   file through a pinned `O_PATH` descriptor (`AT_EMPTY_PATH`, or its
//!   `/proc/self/fd` entry, which names exactly that inode).
//!
//! The directory [`Dir::open`] starts from is resolved as an ordinary path
//! except for its last component, which must not be a link: the path is
//! the node's own (a configured root and a name it chose).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use rustix::fs::{
    AtFlags, CWD, FileType, Gid, Mode, OFlags, Stat, Timespec, Timestamps, Uid, chmod, chownat,
    fchmod, fchown, fstat, fsync, futimens, mkdirat, mknodat, openat, readlinkat, renameat, statat,
    symlinkat, unlinkat, utimensat,
};

/// Flags of every directory opened here.
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// What a copy keeps of an entry, and what identifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub kind: Kind,
    /// Permission bits, with setuid, setgid and sticky (`0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The device number of a device node.
    pub rdev: u64,
    pub size: u64,
    /// The file system holding it.
    pub dev: u64,
    pub ino: u64,
    /// Seconds and nanoseconds since the Unix epoch.
    pub accessed: (i64, i64),
    pub modified: (i64, i64),
}

impl Meta {
    fn of(st: &Stat) -> Meta {
        let raw_mode = st.st_mode;
        let kind = match FileType::from_raw_mode(raw_mode) {
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink,
            FileType::Fifo => Kind::Fifo,
            FileType::Socket => Kind::Socket,
            FileType::CharacterDevice => Kind::CharDevice,
            FileType::BlockDevice => Kind::BlockDevice,
            // Regular files, and whatever a kernel may add one day (it is
            // read, never executed or entered).
            _ => Kind::File,
        };
        Meta {
            kind,
            mode: raw_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: st.st_rdev,
            size: u64::try_from(st.st_size).unwrap_or(0),
            dev: st.st_dev,
            ino: st.st_ino,
            accessed: (st.st_atime, st.st_atime_nsec as i64),
            modified: (st.st_mtime, st.st_mtime_nsec as i64),
        }
    }

    fn file_type(&self) -> FileType {
        match self.kind {
            Kind::Dir => FileType::Directory,
            Kind::File => FileType::RegularFile,
            Kind::Symlink => FileType::Symlink,
            Kind::Fifo => FileType::Fifo,
            Kind::Socket => FileType::Socket,
            Kind::CharDevice => FileType::CharacterDevice,
            Kind::BlockDevice => FileType::BlockDevice,
        }
    }

    fn times(&self) -> Timestamps {
        let at = |(tv_sec, tv_nsec): (i64, i64)| Timespec { tv_sec, tv_nsec };
        Timestamps {
            last_access: at(self.accessed),
            last_modification: at(self.modified),
        }
    }

    fn owner(&self) -> (Option<Uid>, Option<Gid>) {
        (Some(Uid::from_raw(self.uid)), Some(Gid::from_raw(self.gid)))
    }
}

/// An entry of a [`Dir`], opened as what it was when it was pinned.
#[derive(Debug)]
pub enum Entry {
    Dir(Dir, Meta),
    /// A regular file, open for reading.
    File(File, Meta),
    /// A symbolic link and its target, as text (never resolved).
    Symlink(OsString, Meta),
    /// A FIFO, socket or device node (not opened: opening a device or a
    /// FIFO can block or act on the device).
    Special(Meta),
}

/// An open directory; see the module header.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

impl AsFd for Dir {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn not_found(e: &rustix::io::Errno) -> bool {
    *e == rustix::io::Errno::NOENT
}

/// The `/proc/self/fd` entry of `fd`: opening or changing it acts on the
/// inode `fd` holds, whatever its name is now.
fn proc_path(fd: BorrowedFd<'_>) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

/// Sets the owner, then the mode (a change of owner clears setuid and
/// setgid), then the access and modification times of the open `fd`.
pub fn set_meta(fd: impl AsFd, meta: &Meta) -> io::Result<()> {
    let fd = fd.as_fd();
    let (uid, gid) = meta.owner();
    fchown(fd, uid, gid)?;
    fchmod(fd, Mode::from_raw_mode(meta.mode))?;
    futimens(fd, &meta.times())?;
    Ok(())
}

impl Dir {
    /// Opens the directory at `path`; a link as its last component is
    /// not followed (`ELOOP` or `ENOTDIR`), nor is anything but a
    /// directory opened (`ENOTDIR`).
    pub fn open(path: &Path) -> io::Result<Dir> {
        Ok(Dir {
            fd: openat(CWD, path, DIR_FLAGS, Mode::empty())?,
        })
    }

    /// What this directory is.
    pub fn meta(&self) -> io::Result<Meta> {
        Ok(Meta::of(&fstat(&self.fd)?))
    }

    /// The names of its entries, without `.` and `..`.
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&self.fd)? {
            let name = entry?.file_name().to_bytes().to_vec();
            if name != b"." && name != b".." {
                names.push(OsString::from_vec(name));
            }
        }
        Ok(names)
    }

    /// What `name` is, without following it; `None` if there is no such
    /// entry.
    pub fn stat(&self, name: &OsStr) -> io::Result<Option<Meta>> {
        match statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(Meta::of(&st))),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Pins `name` and opens what it is at that moment (see the module
    /// header); `None` if there is no such entry.
    pub fn entry(&self, name: &OsStr) -> io::Result<Option<Entry>> {
        let pinned = match openat(
            &self.fd,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(e) if not_found(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let meta = Meta::of(&fstat(&pinned)?);
        let entry = match meta.kind {
            Kind::Dir => Entry::Dir(
                Dir {
                    fd: openat(&pinned, ".", DIR_FLAGS, Mode::empty())?,
                },
                meta,
            ),
            Kind::File => {
                let file = openat(
                    CWD,
                    proc_path(pinned.as_fd()),
                    OFlags::RDONLY | OFlags::NOCTTY | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                let opened = Meta::of(&fstat(&file)?);
                if (opened.dev, opened.ino) != (meta.dev, meta.ino) {
                    return Err(io::Error::other(
                        "the reopened file is not the pinned one (is /proc mounted?)",
                    ));
                }
                Entry::File(File::from(file), meta)
            }
            Kind::Symlink => Entry::Symlink(
                OsString::from_vec(readlinkat(&pinned, "", Vec::new())?.into_bytes()),
                meta,
            ),
            _ => Entry::Special(meta),
        };
        Ok(Some(entry))
    }

    /// Opens the directory `name`; a link there is not followed (`ELOOP`
    /// or `ENOTDIR`), nor is anything but a directory opened.
    pub fn open_dir(&self, name: &OsStr) -> io::Result<Dir> {
        Ok(Dir {
            fd: openat(&self.fd, name, DIR_FLAGS, Mode::empty())?,
        })
    }

    /// Makes the directory `name` with `mode` (less the umask) and opens
    /// it.
    pub fn create_dir(&self, name: &OsStr, mode: u32) -> io::Result<Dir> {
        mkdirat(&self.fd, name, Mode::from_raw_mode(mode))?;
        self.open_dir(name)
    }

    /// Creates the regular file `name` for writing with `mode` (less the
    /// umask); `EEXIST` if anything, a link included, is there already.
    pub fn create_file(&self, name: &OsStr, mode: u32) -> io::Result<File> {
        let fd = openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )?;
        Ok(File::from(fd))
    }

    /// Opens the regular file `name` for reading; `None` if there is none.
    /// A link there is `ELOOP`; a FIFO or device is refused (`EINVAL`)
    /// without blocking on it.
    pub fn open_file(&self, name: &OsStr) -> io::Result<Option<File>> {
        let fd = match openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(e) if not_found(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if Meta::of(&fstat(&fd)?).kind != Kind::File {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        Ok(Some(File::from(fd)))
    }

    /// Makes the link `name` to `target` (the text, never resolved) with
    /// the owner and times of `meta`, set on the link itself.
    pub fn symlink(&self, target: &OsStr, name: &OsStr, meta: &Meta) -> io::Result<()> {
        symlinkat(target, &self.fd, name)?;
        let (uid, gid) = meta.owner();
        chownat(&self.fd, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)?;
        utimensat(&self.fd, name, &meta.times(), AtFlags::SYMLINK_NOFOLLOW)?;
        Ok(())
    }

    /// Makes the FIFO, socket or device node `name` as `meta` says, with
    /// its owner, mode and times. They are set through a descriptor pinned
    /// on the new node (it is checked to be the node made), so a link put
    /// in its place in the meantime is not followed.
    pub fn make_node(&self, name: &OsStr, meta: &Meta) -> io::Result<()> {
        if matches!(meta.kind, Kind::Dir | Kind::File | Kind::Symlink) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a special file",
            ));
        }
        mknodat(
            &self.fd,
            name,
            meta.file_type(),
            Mode::from_raw_mode(meta.mode & 0o777),
            meta.rdev,
        )?;
        let pinned = openat(
            &self.fd,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let made = Meta::of(&fstat(&pinned)?);
        if made.kind != meta.kind || made.rdev != meta.rdev {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the node made was replaced before its owner and mode were set",
            ));
        }
        let (uid, gid) = meta.owner();
        chownat(&pinned, "", uid, gid, AtFlags::EMPTY_PATH)?;
        let path = proc_path(pinned.as_fd());
        chmod(&path, Mode::from_raw_mode(meta.mode))?;
        utimensat(CWD, &path, &meta.times(), AtFlags::empty())?;
        Ok(())
    }

    /// Renames `from` to `to` in this directory (replacing `to`, a link
    /// there itself, not what it points to).
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        Ok(renameat(&self.fd, from, &self.fd, to)?)
    }

    /// Removes the file, link or special file `name`; `false` if there was
    /// none.
    pub fn remove_file(&self, name: &OsStr) -> io::Result<bool> {
        match unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(e) if not_found(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes everything inside this directory, keeping it, at most
    /// `depth` levels of directories deep. Links are removed, not
    /// followed; a directory on another file system (a mount) is refused
    /// rather than emptied.
    pub fn remove_contents(&self, depth: usize) -> io::Result<()> {
        let dev = self.meta()?.dev;
        for name in self.names()? {
            match unlinkat(&self.fd, &name, AtFlags::empty()) {
                Ok(()) => continue,
                Err(e) if not_found(&e) => continue,
                Err(e) if e == rustix::io::Errno::ISDIR => {}
                Err(e) => return Err(e.into()),
            }
            if depth == 0 {
                return Err(too_deep());
            }
            let sub = self.open_dir(&name)?;
            if sub.meta()?.dev != dev {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!(
                        "{} is a mount point; it is not emptied",
                        Path::new(&name).display()
                    ),
                ));
            }
            sub.remove_contents(depth - 1)?;
            unlinkat(&self.fd, &name, AtFlags::REMOVEDIR)?;
        }
        Ok(())
    }

    /// Sets owner, mode and times of this directory (see [`set_meta`]).
    pub fn set_meta(&self, meta: &Meta) -> io::Result<()> {
        set_meta(&self.fd, meta)
    }

    /// Sets the permission bits of this directory.
    pub fn set_mode(&self, mode: u32) -> io::Result<()> {
        Ok(fchmod(&self.fd, Mode::from_raw_mode(mode))?)
    }

    /// Flushes the directory's entries to disk.
    pub fn sync(&self) -> io::Result<()> {
        Ok(fsync(&self.fd)?)
    }
}

/// The error of a tree deeper than a walk allows.
pub fn too_deep() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        "the directory tree is nested too deeply",
    )
}

/// Whether `name` is one plain component (no `/`, not `.`, `..` or empty).
pub fn is_component(name: &OsStr) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty() && bytes != b"." && bytes != b".." && !bytes.contains(&b'/')
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    use super::*;

    fn os(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    #[test]
    fn entries_are_opened_as_what_they_are_and_links_are_never_followed() {
        let tmp = tempfile::tempdir().expect("works");
        let root = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(root.join("sub")).expect("works");
        std::fs::create_dir(&outside).expect("works");
        std::fs::write(outside.join("secret"), b"secret").expect("works");
        std::fs::write(root.join("file"), b"data").expect("works");
        std::os::unix::fs::symlink(&outside, root.join("link")).expect("works");
        std::os::unix::fs::symlink(outside.join("secret"), root.join("flink")).expect("works");

        let dir = Dir::open(&root).expect("works");
        let mut names = dir.names().expect("works");
        names.sort();
        assert_eq!(names, ["file", "flink", "link", "sub"]);
        match dir.entry(os("file")).expect("works") {
            Some(Entry::File(mut f, meta)) => {
                let mut text = String::new();
                f.read_to_string(&mut text).expect("works");
                assert_eq!((text.as_str(), meta.size), ("data", 4));
            }
            other => panic!("{other:?}"),
        }
        for link in ["link", "flink"] {
            match dir.entry(os(link)).expect("works") {
                Some(Entry::Symlink(target, meta)) => {
                    assert!(Path::new(&target).starts_with(&outside));
                    assert_eq!(meta.kind, Kind::Symlink);
                }
                other => panic!("{link}: {other:?}"),
            }
            let err = dir.open_dir(os(link)).expect_err("a link is not entered");
            assert!(
                matches!(err.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)),
                "{err}"
            );
            let err = dir.open_file(os(link)).expect_err("nor read");
            assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
        }
        assert!(matches!(dir.entry(os("sub")), Ok(Some(Entry::Dir(..)))));
        assert!(dir.entry(os("gone")).expect("works").is_none());
        let err = Dir::open(&root.join("link")).expect_err("not through a link");
        assert!(
            matches!(err.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)),
            "{err}"
        );

        // Creating over a link fails instead of writing where it points.
        let err = dir.create_file(os("flink"), 0o600).expect_err("exists");
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(
            std::fs::read(outside.join("secret")).expect("works"),
            b"secret"
        );

        // Removal takes links, not what they point at.
        dir.remove_contents(8).expect("works");
        assert!(dir.names().expect("works").is_empty());
        assert!(outside.join("secret").exists());
    }

    #[test]
    fn new_entries_take_their_owner_mode_and_times_without_the_umask() {
        let tmp = tempfile::tempdir().expect("works");
        let dir = Dir::open(tmp.path()).expect("works");
        let meta = |kind, mode| Meta {
            kind,
            mode,
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            rdev: 0,
            size: 0,
            dev: 0,
            ino: 0,
            accessed: (1_000_000, 5),
            modified: (2_000_000, 7),
        };
        let mut f = dir.create_file(os("f"), 0o600).expect("works");
        f.write_all(b"x").expect("works");
        set_meta(&f, &meta(Kind::File, 0o4751)).expect("works");
        dir.make_node(os("fifo"), &meta(Kind::Fifo, 0o666))
            .expect("works");
        dir.symlink(os("f"), os("l"), &meta(Kind::Symlink, 0o777))
            .expect("works");
        let sub = dir.create_dir(os("d"), 0o700).expect("works");
        sub.set_meta(&meta(Kind::Dir, 0o2777)).expect("works");

        let st = |n: &str| std::fs::symlink_metadata(tmp.path().join(n)).expect("works");
        assert_eq!(st("f").mode() & 0o7777, 0o4751);
        assert_eq!((st("f").mtime(), st("f").mtime_nsec()), (2_000_000, 7));
        assert!(st("fifo").file_type().is_fifo());
        assert_eq!(st("fifo").mode() & 0o7777, 0o666);
        assert_eq!(st("fifo").atime(), 1_000_000);
        assert!(st("l").file_type().is_symlink());
        assert_eq!(st("l").mtime(), 2_000_000);
        assert_eq!(st("d").mode() & 0o7777, 0o2777);
    }

    #[test]
    fn components() {
        assert!(is_component(os("a.json")));
        for bad in ["", ".", "..", "a/b", "/"] {
            assert!(!is_component(os(bad)), "{bad:?}");
        }
    }
}
