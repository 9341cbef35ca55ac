//! Directory copies (HOST volumes): the target directory's content is
//! replaced by a copy of the source's — directories, regular files,
//! symbolic links, FIFOs and device nodes, with their modes, owners and
//! modification times. Hard links become separate files. Files are
//! copied in chunks, so a stop is seen within one chunk.

use std::fs::{File, Metadata};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::Stop;
use super::block::{CHUNK, CopyError, io};

/// The bytes of regular files under `dir` (what a copy of it moves).
pub fn file_bytes(dir: &Path) -> Result<u64, CopyError> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).map_err(io("list", dir))? {
        let entry = entry.map_err(io("list", dir))?;
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).map_err(io("stat", &path))?;
        if meta.is_dir() {
            total += file_bytes(&path)?;
        } else if meta.is_file() {
            total += meta.len();
        }
    }
    Ok(total)
}

/// Removes everything inside `dir`, keeping `dir`.
pub fn empty_dir(dir: &Path) -> Result<(), CopyError> {
    for entry in std::fs::read_dir(dir).map_err(io("list", dir))? {
        let entry = entry.map_err(io("list", dir))?;
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).map_err(io("stat", &path))?;
        if meta.is_dir() {
            std::fs::remove_dir_all(&path).map_err(io("remove", &path))?;
        } else {
            std::fs::remove_file(&path).map_err(io("remove", &path))?;
        }
    }
    Ok(())
}

/// Copies the content of `source` into the (empty) directory `target`,
/// calling `progress` with the file bytes copied so far.
pub fn copy_tree(
    source: &Path,
    target: &Path,
    stop: &Stop,
    progress: &mut dyn FnMut(u64),
) -> Result<(), CopyError> {
    let mut copied = 0;
    copy_children(source, target, stop, &mut copied, progress)?;
    // The target directory takes the source's mode and owner too.
    let meta = std::fs::symlink_metadata(source).map_err(io("stat", source))?;
    set_owner_and_mode(target, &meta)?;
    sync(target)
}

fn copy_children(
    source: &Path,
    target: &Path,
    stop: &Stop,
    copied: &mut u64,
    progress: &mut dyn FnMut(u64),
) -> Result<(), CopyError> {
    for entry in std::fs::read_dir(source).map_err(io("list", source))? {
        if stop.is_set() {
            return Err(CopyError::Stopped);
        }
        let entry = entry.map_err(io("list", source))?;
        let from = entry.path();
        let to = target.join(entry.file_name());
        let meta = std::fs::symlink_metadata(&from).map_err(io("stat", &from))?;
        let kind = meta.file_type();
        if kind.is_dir() {
            std::fs::create_dir(&to).map_err(io("create", &to))?;
            copy_children(&from, &to, stop, copied, progress)?;
            set_owner_and_mode(&to, &meta)?;
            sync(&to)?;
        } else if kind.is_file() {
            copy_file(&from, &to, stop, copied, progress)?;
            set_owner_and_mode(&to, &meta)?;
            set_mtime(&to, &meta)?;
        } else if kind.is_symlink() {
            let link = std::fs::read_link(&from).map_err(io("read the link", &from))?;
            std::os::unix::fs::symlink(&link, &to).map_err(io("create the link", &to))?;
            std::os::unix::fs::lchown(&to, Some(meta.uid()), Some(meta.gid()))
                .map_err(io("change the owner of", &to))?;
        } else {
            // FIFOs, sockets and device nodes: the same node again.
            make_node(&to, &meta)?;
            set_owner_and_mode(&to, &meta)?;
        }
    }
    Ok(())
}

fn copy_file(
    from: &Path,
    to: &Path,
    stop: &Stop,
    copied: &mut u64,
    progress: &mut dyn FnMut(u64),
) -> Result<(), CopyError> {
    let mut src = File::open(from).map_err(io("open", from))?;
    let mut dst = File::create_new(to).map_err(io("create", to))?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        if stop.is_set() {
            return Err(CopyError::Stopped);
        }
        let n = src.read(&mut buf).map_err(io("read", from))?;
        if n == 0 {
            break;
        }
        dst.write_all(&buf[..n]).map_err(io("write", to))?;
        *copied += n as u64;
        progress(*copied);
    }
    dst.sync_all().map_err(io("sync", to))
}

fn set_owner_and_mode(path: &Path, meta: &Metadata) -> Result<(), CopyError> {
    std::os::unix::fs::chown(path, Some(meta.uid()), Some(meta.gid()))
        .map_err(io("change the owner of", path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(meta.mode() & 0o7777))
        .map_err(io("change the mode of", path))
}

fn set_mtime(path: &Path, meta: &Metadata) -> Result<(), CopyError> {
    let modified = meta.modified().map_err(io("stat", path))?;
    let accessed = meta.accessed().unwrap_or(modified);
    let times = std::fs::FileTimes::new()
        .set_modified(modified)
        .set_accessed(accessed);
    File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_times(times))
        .map_err(io("set the times of", path))
}

fn make_node(path: &Path, meta: &Metadata) -> Result<(), CopyError> {
    carina_sys::fsctl::mknod(path, meta.mode(), meta.rdev()).map_err(io("create the node", path))
}

/// Syncs the directory `dir` (the files were synced one by one; this
/// makes its entries durable too).
fn sync(dir: &Path) -> Result<(), CopyError> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(io("sync", dir))
}

#[cfg(test)]
mod tests {
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
