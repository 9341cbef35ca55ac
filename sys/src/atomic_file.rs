//! Whole files replaced atomically: after a crash a file written here is
//! either its old content or its new one, never a part, and a link planted
//! in the directory is never written through.
//!
//! [`write_at`] works relative to an open directory ([`Dir`], opened
//! `O_NOFOLLOW`):
//!
//! 1. a temporary file of a name no one can know ahead (a dot, the final
//!    name, the process id, the time in nanoseconds, a counter, `.tmp`) is
//!    created `O_CREAT | O_EXCL | O_NOFOLLOW`, so a file or link already at
//!    that name is refused (`EEXIST`) rather than followed or reused, and
//!    another name is tried;
//! 2. it gets exactly `mode` (set on its descriptor, not narrowed by the
//!    umask), the bytes, and an fsync;
//! 3. it is renamed over the final name (a link there is replaced, not
//!    followed);
//! 4. the directory is fsynced, so the rename survives a crash.
//!
//! A failure removes the temporary file. One a crash left behind is found
//! by [`is_temp`] and removed by [`remove_temps`]: final names never start
//! with a dot in the stores that use this (they hold checked names).
//! [`write`] does the same for a directory given by path, making it if
//! missing. That path is the node's own (configured, or a directory it
//! chose) and is resolved as an ordinary path, links included
//! ([`open_dir`]); nothing inside the directory is followed.

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::fdtree::{Dir, is_component};

/// How many fresh temporary names are tried before `EEXIST` is given up.
const TEMP_ATTEMPTS: u32 = 8;
/// At most this much of the final name goes into a temporary name, so the
/// temporary name stays within `NAME_MAX` (the unique part makes it one).
const TEMP_STEM_MAX: usize = 128;
/// How every temporary name ends.
const TEMP_SUFFIX: &str = ".tmp";

/// Replaces `name` in `dir` with `bytes`, with permission bits `mode`
/// (see the module header). `name` must be one component
/// ([`InvalidInput`](io::ErrorKind::InvalidInput) otherwise) and not look
/// like a temporary file.
pub fn write_at(dir: &Dir, name: &OsStr, bytes: &[u8], mode: u32) -> io::Result<()> {
    check_name(name)?;
    let (temp, mut file) = create_temp(dir, name)?;
    let written = (|| {
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        dir.rename(&temp, name)
    })();
    if let Err(e) = written {
        if let Err(undo) = dir.remove_file(&temp) {
            tracing::warn!(
                file = %Path::new(&temp).display(),
                error = %undo,
                "could not remove the temporary file of a failed write"
            );
        }
        return Err(e);
    }
    dir.sync()
}

/// [`write_at`] in the directory at `dir` ([`open_dir`]), which is made
/// (with its missing parents) if it does not exist.
pub fn write(dir: &Path, name: &OsStr, bytes: &[u8], mode: u32) -> io::Result<()> {
    check_name(name)?;
    write_at(&open_or_make(dir)?, name, bytes, mode)
}

/// Removes `name` from `dir` and fsyncs `dir`, so the removal survives a
/// crash; `false` (and no sync) if there was none.
pub fn remove_at(dir: &Dir, name: &OsStr) -> io::Result<bool> {
    check_name(name)?;
    let removed = dir.remove_file(name)?;
    if removed {
        dir.sync()?;
    }
    Ok(removed)
}

/// Whether `name` is a temporary file of [`write_at`] (of this version or
/// of the fixed names earlier versions used: `.<name>.tmp`, `<name>.tmp~`).
pub fn is_temp(name: &OsStr) -> bool {
    let bytes = name.as_bytes();
    (bytes.starts_with(b".") && bytes.ends_with(TEMP_SUFFIX.as_bytes()))
        || bytes.ends_with(b".tmp~")
}

/// Removes every temporary file in `dir` (what writes cut short by a
/// crash left); returns how many there were.
pub fn remove_temps(dir: &Dir) -> io::Result<usize> {
    let mut removed = 0;
    for name in dir.names()? {
        if is_temp(&name) && dir.remove_file(&name)? {
            removed += 1;
        }
    }
    if removed > 0 {
        dir.sync()?;
    }
    Ok(removed)
}

/// Opens the directory at `dir`, a path of the node's own, resolved as an
/// ordinary path (a link to a directory is followed, as a configured path
/// through a link would be); `NotFound` if there is none.
pub fn open_dir(dir: &Path) -> io::Result<Dir> {
    Dir::open(&std::fs::canonicalize(dir)?)
}

/// [`open_dir`], making the directory and its parents first if it is
/// missing (a new directory's parent is fsynced, so it survives a crash).
pub fn open_or_make(dir: &Path) -> io::Result<Dir> {
    match open_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)?;
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                open_dir(parent)?.sync()?;
            }
            open_dir(dir)
        }
        other => other,
    }
}

fn check_name(name: &OsStr) -> io::Result<()> {
    if !is_component(name) || is_temp(name) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{:?} is not a plain file name (one component, not a temporary name)",
                Path::new(name)
            ),
        ));
    }
    Ok(())
}

/// Creates a new temporary file for `name` in `dir`, trying fresh names
/// while one is taken.
fn create_temp(dir: &Dir, name: &OsStr) -> io::Result<(OsString, std::fs::File)> {
    let mut last = None;
    for _ in 0..TEMP_ATTEMPTS {
        let temp = temp_name(name);
        // The mode is set exactly once the file is ours; until then only
        // the owner may open it.
        match dir.create_file(&temp, 0o600) {
            Ok(file) => return Ok((temp, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)))
}

/// `.<name>.<pid>-<nanos>-<counter>.tmp`, all hexadecimal.
fn temp_name(name: &OsStr) -> OsString {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    let stem = &name.as_bytes()[..name.len().min(TEMP_STEM_MAX)];
    let mut temp = OsString::from(".");
    temp.push(OsStr::from_bytes(stem));
    temp.push(format!(
        ".{:x}-{nanos:x}-{seq:x}{TEMP_SUFFIX}",
        std::process::id()
    ));
    temp
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, symlink};

    use super::*;

    fn os(s: &str) -> &OsStr {
        OsStr::new(s)
    }

    #[test]
    fn writes_replaces_and_leaves_no_temporary_file() {
        let tmp = tempfile::tempdir().expect("works");
        let dir = tmp.path().join("made/on/demand");
        write(&dir, os("a.json"), b"one", 0o640).expect("works");
        write(&dir, os("a.json"), b"two", 0o600).expect("works");
        assert_eq!(std::fs::read(dir.join("a.json")).expect("works"), b"two");
        let meta = std::fs::metadata(dir.join("a.json")).expect("works");
        assert_eq!(meta.mode() & 0o7777, 0o600, "exactly the mode asked");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .expect("works")
            .map(|e| e.expect("works").file_name())
            .collect();
        assert_eq!(names, vec![OsString::from("a.json")]);
    }

    #[test]
    fn a_link_at_the_final_name_is_replaced_not_written_through() {
        let tmp = tempfile::tempdir().expect("works");
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "precious").expect("works");
        let dir = tmp.path().join("d");
        std::fs::create_dir(&dir).expect("works");
        symlink(&victim, dir.join("a.json")).expect("works");
        write(&dir, os("a.json"), b"new", 0o600).expect("works");
        assert_eq!(std::fs::read(&victim).expect("works"), b"precious");
        let meta = std::fs::symlink_metadata(dir.join("a.json")).expect("works");
        assert!(meta.is_file(), "the link itself was replaced");
    }

    #[test]
    fn a_configured_directory_reached_through_a_link_is_written_in() {
        let tmp = tempfile::tempdir().expect("works");
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).expect("works");
        symlink(&real, tmp.path().join("link")).expect("works");
        write(&tmp.path().join("link"), os("a.json"), b"x", 0o600).expect("works");
        assert_eq!(std::fs::read(real.join("a.json")).expect("works"), b"x");
        std::fs::write(tmp.path().join("file"), "").expect("works");
        let err = write(&tmp.path().join("file"), os("a"), b"x", 0o600).expect_err("no dir");
        assert_eq!(err.kind(), io::ErrorKind::NotADirectory);
    }

    #[test]
    fn names_that_are_not_one_plain_component_are_refused() {
        let tmp = tempfile::tempdir().expect("works");
        for bad in [
            "",
            ".",
            "..",
            "../a",
            "a/b",
            ".a.json.1-2-3.tmp",
            "a.json.tmp~",
        ] {
            let err = write(tmp.path(), os(bad), b"x", 0o600).expect_err(bad);
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
        assert!(!tmp.path().parent().expect("a parent").join("a").exists());
        let dir = Dir::open(tmp.path()).expect("works");
        remove_at(&dir, os("..")).expect_err("refused");
    }

    #[test]
    fn temporary_names_are_fresh_and_recognised_and_leftovers_are_removed() {
        let a = temp_name(os("v.json"));
        let b = temp_name(os("v.json"));
        assert_ne!(a, b);
        assert!(is_temp(&a) && a.to_string_lossy().starts_with(".v.json."));
        let long = "x".repeat(250);
        assert!(temp_name(os(&long)).len() < 255, "fits NAME_MAX");
        for name in ["v.json", "v", "tmp", "v.json.tmp"] {
            assert!(!is_temp(os(name)), "{name}");
        }

        let tmp = tempfile::tempdir().expect("works");
        // What a crash between create and rename leaves, of this version
        // and of the older fixed names.
        for leftover in [a.to_str().expect("utf-8"), ".v.json.tmp", "w.json.tmp~"] {
            std::fs::write(tmp.path().join(leftover), "{").expect("works");
        }
        std::fs::write(tmp.path().join("v.json"), "{}").expect("works");
        let dir = Dir::open(tmp.path()).expect("works");
        assert_eq!(remove_temps(&dir).expect("works"), 3);
        let names: Vec<_> = dir.names().expect("works");
        assert_eq!(names, vec![OsString::from("v.json")]);
    }

    #[test]
    fn remove_is_synced_and_absent_is_false() {
        let tmp = tempfile::tempdir().expect("works");
        write(tmp.path(), os("a"), b"x", 0o600).expect("works");
        let dir = Dir::open(tmp.path()).expect("works");
        assert!(remove_at(&dir, os("a")).expect("works"));
        assert!(!remove_at(&dir, os("a")).expect("works"));
    }
}
