//! Directory copies (HOST volumes): the target directory's content is
//! replaced by a copy of the source's — directories, regular files,
//! symbolic links, FIFOs, sockets and device nodes, with their modes,
//! owners and access and modification times. Hard links become separate
//! files. Files are copied in chunks, so a stop is seen within one chunk.
//!
//! The source belongs to a pod that may change it during the copy, and the
//! node copies as root: both trees are walked through directory
//! descriptors ([`carina_sys::fdtree`]), never by path, and no link is ever
//! followed. Each entry is pinned before it is looked at and what was
//! pinned is what is copied, so a directory swapped for a link to
//! somewhere else (the node's files, another volume) is copied as that
//! link, or as the directory, never as what the link points to. A link is
//! copied as a link, with its text as it is. Entries that vanish during
//! the copy are left out.
//!
//! A HOST source is not frozen (its directory is on the node's own
//! filesystem), so a copy of a volume in use is not point-in-time: each
//! file is copied as the copy reaches it, and at most as long as it was
//! when it was pinned. Bytes appended during the copy are left out, so a
//! file that a pod keeps growing cannot make the copy chase it without
//! end or fill the target past what the source held.
//!
//! Special files are made again in the target (`mknod`) with their owner,
//! mode and times set through a descriptor pinned on the new node: a
//! device node gives a pod of the clone nothing the runtime's device rules
//! do not, and its source's pod made it. Trees are walked at most
//! [`MAX_DEPTH`] directories deep (two descriptors per level are open).

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use carina_sys::fdtree::{self, Dir, Entry};

use super::Stop;
use super::block::{CHUNK, CopyError, io};

/// How many directories deep a tree is walked; a deeper one fails the
/// copy.
pub const MAX_DEPTH: usize = 256;

/// Mode of a directory or file being filled (until it takes its
/// source's): only the node reaches into it meanwhile.
const FILLING_MODE: u32 = 0o700;

/// The bytes of regular files under `dir` (what a copy of it moves).
pub fn file_bytes(dir: &Path) -> Result<u64, CopyError> {
    let root = Dir::open(dir).map_err(io("open", dir))?;
    bytes_under(&root, dir, MAX_DEPTH)
}

fn bytes_under(dir: &Dir, path: &Path, depth: usize) -> Result<u64, CopyError> {
    let mut total = 0u64;
    for name in dir.names().map_err(io("list", path))? {
        let at = path.join(&name);
        let Some(meta) = dir.stat(&name).map_err(io("stat", &at))? else {
            continue;
        };
        match meta.kind {
            fdtree::Kind::File => total = total.saturating_add(meta.size),
            fdtree::Kind::Dir => {
                if depth == 0 {
                    return Err(io("walk", &at)(fdtree::too_deep()));
                }
                // Replaced since the stat: the copy will see what it is.
                let Ok(sub) = dir.open_dir(&name) else {
                    continue;
                };
                total = total.saturating_add(bytes_under(&sub, &at, depth - 1)?);
            }
            _ => {}
        }
    }
    Ok(total)
}

/// Removes everything inside `dir`, keeping `dir`.
pub fn empty_dir(dir: &Path) -> Result<(), CopyError> {
    Dir::open(dir)
        .and_then(|d| d.remove_contents(MAX_DEPTH))
        .map_err(io("empty", dir))
}

/// Copies the content of `source` into the (empty) directory `target`,
/// calling `progress` with the file bytes copied so far. The target
/// directory takes the source's owner, mode and times.
pub fn copy_tree(
    source: &Path,
    target: &Path,
    stop: &Stop,
    progress: &mut dyn FnMut(u64),
) -> Result<(), CopyError> {
    let from = Dir::open(source).map_err(io("open", source))?;
    let to = Dir::open(target).map_err(io("open", target))?;
    let mut walk = Walk {
        stop,
        copied: 0,
        progress,
    };
    walk.children(&from, source, &to, target, MAX_DEPTH)?;
    let meta = from.meta().map_err(io("stat", source))?;
    to.set_meta(&meta)
        .map_err(io("set the owner, mode and times of", target))?;
    to.sync().map_err(io("sync", target))
}

/// One copy's state: the stop, the bytes copied, where they are reported.
struct Walk<'a> {
    stop: &'a Stop,
    copied: u64,
    progress: &'a mut dyn FnMut(u64),
}

impl Walk<'_> {
    fn children(
        &mut self,
        from: &Dir,
        source: &Path,
        to: &Dir,
        target: &Path,
        depth: usize,
    ) -> Result<(), CopyError> {
        for name in from.names().map_err(io("list", source))? {
            if self.stop.is_set() {
                return Err(CopyError::Stopped);
            }
            let (src, dst) = (source.join(&name), target.join(&name));
            // Gone since the listing: not part of the copy.
            let Some(entry) = from.entry(&name).map_err(io("open", &src))? else {
                continue;
            };
            match entry {
                Entry::Dir(sub, meta) => {
                    if depth == 0 {
                        return Err(io("walk", &src)(fdtree::too_deep()));
                    }
                    let made = to
                        .create_dir(&name, FILLING_MODE)
                        .map_err(io("create", &dst))?;
                    self.children(&sub, &src, &made, &dst, depth - 1)?;
                    made.set_meta(&meta)
                        .map_err(io("set the owner, mode and times of", &dst))?;
                    made.sync().map_err(io("sync", &dst))?;
                }
                Entry::File(file, meta) => {
                    let out = to
                        .create_file(&name, FILLING_MODE)
                        .map_err(io("create", &dst))?;
                    let out = self.file(file, &src, out, &dst, meta.size)?;
                    fdtree::set_meta(&out, &meta)
                        .map_err(io("set the owner, mode and times of", &dst))?;
                    out.sync_all().map_err(io("sync", &dst))?;
                }
                Entry::Symlink(link, meta) => to
                    .symlink(&link, &name, &meta)
                    .map_err(io("create the link", &dst))?,
                Entry::Special(meta) => to
                    .make_node(&name, &meta)
                    .map_err(io("create the node", &dst))?,
            }
        }
        Ok(())
    }

    /// Copies the first `len` bytes of `src` (its length when pinned), or
    /// fewer when it was cut shorter meanwhile.
    fn file(
        &mut self,
        mut src: File,
        from: &Path,
        mut dst: File,
        to: &Path,
        len: u64,
    ) -> Result<File, CopyError> {
        let mut buf = vec![0u8; CHUNK];
        let mut left = len;
        while left > 0 {
            if self.stop.is_set() {
                return Err(CopyError::Stopped);
            }
            let want = usize::try_from(left).map_or(CHUNK, |l| l.min(CHUNK));
            let n = src.read(&mut buf[..want]).map_err(io("read", from))?;
            if n == 0 {
                break;
            }
            left -= n as u64;
            dst.write_all(&buf[..n]).map_err(io("write", to))?;
            self.copied += n as u64;
            (self.progress)(self.copied);
        }
        Ok(dst)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn a_tree_is_copied_with_links_modes_and_times() {
        let dir = tempfile::tempdir().expect("works");
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        std::fs::create_dir_all(src.join("a/b")).expect("works");
        std::fs::write(src.join("a/b/file"), vec![5u8; CHUNK + 3]).expect("works");
        std::fs::write(src.join("top"), b"top").expect("works");
        std::fs::set_permissions(src.join("top"), std::fs::Permissions::from_mode(0o640))
            .expect("works");
        std::os::unix::fs::symlink("a/b/file", src.join("link")).expect("works");
        std::fs::create_dir(&dst).expect("works");
        std::fs::write(dst.join("stale"), b"old").expect("works");

        assert_eq!(file_bytes(&src).expect("works"), CHUNK as u64 + 6);
        empty_dir(&dst).expect("works");
        let mut last = 0;
        copy_tree(&src, &dst, &Stop::default(), &mut |n| last = n).expect("works");
        assert_eq!(last, CHUNK as u64 + 6);
        assert!(!dst.join("stale").exists());
        assert_eq!(
            std::fs::read(dst.join("a/b/file")).expect("works"),
            vec![5u8; CHUNK + 3]
        );
        assert_eq!(
            std::fs::read_link(dst.join("link")).expect("works"),
            Path::new("a/b/file")
        );
        let top = std::fs::metadata(dst.join("top")).expect("works");
        assert_eq!(top.mode() & 0o777, 0o640);
        assert_eq!(
            top.modified().expect("works"),
            std::fs::metadata(src.join("top"))
                .expect("works")
                .modified()
                .expect("works")
        );
    }

    /// A file its writer appends to while it is copied (here after every
    /// chunk) is copied as long as it was when the copy reached it: the
    /// copy neither chases the writer nor takes the appended bytes.
    #[test]
    fn a_file_growing_during_its_copy_is_copied_as_long_as_it_was() {
        let dir = tempfile::tempdir().expect("works");
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        std::fs::create_dir(&src).expect("works");
        std::fs::create_dir(&dst).expect("works");
        let first: Vec<u8> = (0..3 * CHUNK + 5).map(|i| (i % 251) as u8).collect();
        std::fs::write(src.join("log"), &first).expect("works");
        let mut appender = std::fs::OpenOptions::new()
            .append(true)
            .open(src.join("log"))
            .expect("works");
        let mut appended = 0;
        copy_tree(&src, &dst, &Stop::default(), &mut |_| {
            // Bounded so that a copy that chases the writer still ends.
            if appended < 64 {
                appender.write_all(&[0xee; CHUNK]).expect("works");
                appended += 1;
            }
        })
        .expect("works");
        assert!(appended > 0, "the writer appended during the copy");
        let source_now = std::fs::metadata(src.join("log")).expect("works").len();
        assert!(source_now > first.len() as u64, "the source grew");
        assert!(
            std::fs::read(dst.join("log")).expect("works") == first,
            "the copy holds the file as long as it was when the copy reached it"
        );
    }

    /// Every regular file under `dir` (not through links), with content.
    fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).expect("works") {
            let path = entry.expect("works").path();
            let meta = std::fs::symlink_metadata(&path).expect("works");
            if meta.is_dir() {
                out.extend(files_under(&path));
            } else if meta.is_file() {
                let data = std::fs::read(&path).expect("works");
                out.push((path, data));
            }
        }
        out
    }

    /// A directory `secret` beside `src` whose files have the names of
    /// `src/d`'s and SECRET in them.
    fn secret_beside(root: &Path, names: &[&str]) -> PathBuf {
        let secret = root.join("secret");
        std::fs::create_dir_all(secret.join("sub")).expect("works");
        for name in names {
            std::fs::write(secret.join(name), b"SECRET").expect("works");
        }
        secret
    }

    fn assert_no_secret(dst: &Path) {
        for (path, data) in files_under(dst) {
            assert!(
                !data.windows(6).any(|w| w == b"SECRET"),
                "{} holds the secret",
                path.display()
            );
        }
    }

    #[test]
    fn a_directory_swapped_for_a_link_during_the_copy_is_not_followed() {
        // Deterministic: the swap happens inside the copy, at its first
        // progress report (after the first chunk of the first file of
        // `d`); the files of `d` not yet opened are then reached, by path,
        // only through the link.
        let dir = tempfile::tempdir().expect("works");
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        let names = ["f0", "f1", "f2", "sub/f3"];
        std::fs::create_dir_all(src.join("d/sub")).expect("works");
        for name in names {
            std::fs::write(src.join("d").join(name), vec![b'p'; CHUNK + 1]).expect("works");
        }
        std::fs::create_dir(&dst).expect("works");
        let secret = secret_beside(dir.path(), &names);
        let mut swapped = 0;
        copy_tree(&src, &dst, &Stop::default(), &mut |_| {
            if swapped == 0 {
                std::fs::rename(src.join("d"), dir.path().join("d.real")).expect("works");
                std::os::unix::fs::symlink(&secret, src.join("d")).expect("works");
                swapped += 1;
            }
        })
        .expect("the copy completes");
        assert_eq!(swapped, 1, "the swap happened during the copy");
        assert_no_secret(&dst);
        let copied = files_under(&dst);
        assert_eq!(copied.len(), names.len(), "{copied:?}");
        assert!(
            copied
                .iter()
                .all(|(_, data)| data == &vec![b'p'; CHUNK + 1])
        );
    }

    #[test]
    fn links_are_copied_as_links_and_never_followed() {
        let dir = tempfile::tempdir().expect("works");
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        std::fs::create_dir_all(src.join("a")).expect("works");
        std::fs::create_dir(&dst).expect("works");
        let secret = secret_beside(dir.path(), &["file", "sub/inner"]);
        let links = [
            ("out", secret.clone()),
            ("a/rel", PathBuf::from("../../secret")),
            ("file-out", secret.join("file")),
            ("a/sub-out", secret.join("sub")),
        ];
        for (name, to) in &links {
            std::os::unix::fs::symlink(to, src.join(name)).expect("works");
        }
        carina_sys::fsctl::mknod(&src.join("a/fifo"), libc::S_IFIFO | 0o640, 0).expect("works");
        copy_tree(&src, &dst, &Stop::default(), &mut |_| {}).expect("works");
        for (name, to) in &links {
            let meta = std::fs::symlink_metadata(dst.join(name)).expect("copied");
            assert!(meta.file_type().is_symlink(), "{name} is a link");
            assert_eq!(&std::fs::read_link(dst.join(name)).expect("works"), to);
        }
        let fifo = std::fs::symlink_metadata(dst.join("a/fifo")).expect("works");
        assert!(std::os::unix::fs::FileTypeExt::is_fifo(&fifo.file_type()));
        assert_eq!(fifo.mode() & 0o7777, 0o640);
        assert!(files_under(&dst).is_empty(), "no file came through a link");
        assert_no_secret(&dst);
    }

    #[test]
    fn a_volume_directory_that_is_a_link_is_refused() {
        let dir = tempfile::tempdir().expect("works");
        let secret = secret_beside(dir.path(), &["file"]);
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).expect("works");
        std::fs::write(outside.join("keep"), b"keep").expect("works");
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        std::os::unix::fs::symlink(&secret, &src).expect("works");
        std::os::unix::fs::symlink(&outside, &dst).expect("works");
        let real_dst = dir.path().join("real-dst");
        std::fs::create_dir(&real_dst).expect("works");

        assert!(file_bytes(&src).is_err(), "not counted through the link");
        let err = copy_tree(&src, &real_dst, &Stop::default(), &mut |_| {})
            .expect_err("the source is a link");
        assert!(
            matches!(&err, CopyError::Io { source, .. } if matches!(source.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR))),
            "{err:?}"
        );
        assert!(files_under(&real_dst).is_empty());
        assert!(empty_dir(&dst).is_err(), "the target is a link");
        assert_eq!(std::fs::read(outside.join("keep")).expect("kept"), b"keep");
    }

    #[test]
    fn a_tree_deeper_than_the_limit_is_refused() {
        let dir = tempfile::tempdir().expect("works");
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        let mut deep = src.clone();
        for _ in 0..=MAX_DEPTH {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).expect("works");
        std::fs::create_dir(&dst).expect("works");
        let err = copy_tree(&src, &dst, &Stop::default(), &mut |_| {}).expect_err("too deep");
        assert!(format!("{err:?}").contains("nested too deeply"), "{err:?}");
        assert!(file_bytes(&src).is_err());
        empty_dir(&dst).expect("what was made is removed");
    }

    #[test]
    fn a_stop_ends_the_copy() {
        let dir = tempfile::tempdir().expect("works");
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        std::fs::create_dir_all(&src).expect("works");
        std::fs::create_dir_all(&dst).expect("works");
        std::fs::write(src.join("f"), b"x").expect("works");
        let stop = Stop::default();
        stop.set();
        let result = copy_tree(&src, &dst, &stop, &mut |_| {});
        assert!(matches!(result, Err(CopyError::Stopped)));
    }
}
