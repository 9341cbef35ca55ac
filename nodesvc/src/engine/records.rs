//! The one per-volume record store: small JSON records the engine keeps
//! across restarts, one file `<dir>/<volume>.json` per volume (the
//! journal of changes in progress, [`super::intents`]; the records of
//! copied volumes, [`super::copy::record`]; the bcache devices,
//! [`super::bcache::record`]).
//!
//! Files are replaced atomically by [`carina_sys::atomic_file`] (mode
//! `0600`), so a record is whole or absent after a crash; a removal is
//! synced. Names are checked volume names (no `/`, no `..`, no leading
//! dot), so a record never lands outside its directory and never looks
//! like a temporary file; files that are not records are left alone, and
//! temporary files a crash left behind are removed when the records are
//! listed. Without a directory (engines in tests) the records live in
//! memory.
//!
//! A record that is there but cannot be read (cut short, damaged, not
//! readable) is never reported as absent: [`get`](RecordStore::get)
//! answers [`Lookup::Unreadable`], and each user says what that means for
//! it (a journal record refuses the volume's changes, a copy record
//! refuses the copy, a bcache record fails the start).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::{self, Read};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use carina_sys::atomic_file;
use carina_sys::fdtree::Dir;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::names;

/// Mode of every record file: only the daemon reads them.
const RECORD_MODE: u32 = 0o600;
const EXTENSION: &str = ".json";

/// What the store holds for one name.
#[derive(Debug)]
pub enum Lookup<T> {
    /// No record.
    Absent,
    Found(T),
    /// A record is there and cannot be read; the user decides what that
    /// means (see the module header).
    Unreadable(Unreadable),
}

/// A record that exists and cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("record {} cannot be read: {cause}", path.display())]
pub struct Unreadable {
    pub path: PathBuf,
    #[source]
    pub cause: Cause,
}

/// Why a record cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    /// Opening or reading it failed (a link or special file in its place
    /// is refused, not followed).
    #[error("{0}")]
    Io(#[source] io::Error),
    /// It is not a whole record (cut short, or damaged).
    #[error("not a whole record: {0}")]
    Parse(#[source] serde_json::Error),
}

/// A store operation that failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The name is not a volume name (it could leave the directory).
    #[error("{name:?} cannot name a record: {reason}")]
    Name { name: String, reason: String },
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot encode the record {}: {source}", path.display())]
    Encode {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// Records of type `T`, by volume name. Every method blocks.
#[derive(Debug)]
pub struct RecordStore<T> {
    place: Place<T>,
    /// Pretty-printed files (for records an operator reads).
    pretty: bool,
    _record: PhantomData<fn() -> T>,
}

#[derive(Debug)]
enum Place<T> {
    Dir(PathBuf),
    Memory(Mutex<BTreeMap<String, T>>),
}

impl<T: Serialize + DeserializeOwned + Clone> RecordStore<T> {
    /// Records in `dir` (made when the first is written), or in memory.
    pub fn new(dir: Option<PathBuf>) -> Self {
        RecordStore {
            place: match dir {
                Some(dir) => Place::Dir(dir),
                None => Place::Memory(Mutex::new(BTreeMap::new())),
            },
            pretty: false,
            _record: PhantomData,
        }
    }

    /// Writes the files pretty-printed.
    pub fn pretty(mut self) -> Self {
        self.pretty = true;
        self
    }

    /// The directory, if the records are kept on disk.
    pub fn dir(&self) -> Option<&Path> {
        match &self.place {
            Place::Dir(dir) => Some(dir),
            Place::Memory(_) => None,
        }
    }

    /// `name`'s record; see [`Lookup`].
    pub fn get(&self, name: &str) -> Result<Lookup<T>, StoreError> {
        check(name)?;
        let dir = match &self.place {
            Place::Memory(map) => {
                return Ok(match lock(map).get(name) {
                    Some(record) => Lookup::Found(record.clone()),
                    None => Lookup::Absent,
                });
            }
            Place::Dir(dir) => dir,
        };
        let Some(open) = open_dir(dir)? else {
            return Ok(Lookup::Absent);
        };
        let file = file_name(name);
        let path = dir.join(&file);
        let mut text = Vec::new();
        let read = open
            .open_file(OsStr::new(&file))
            .and_then(|f| f.map(|mut f| f.read_to_end(&mut text)).transpose());
        Ok(match read {
            Ok(None) => Lookup::Absent,
            Ok(Some(_)) => match serde_json::from_slice(&text) {
                Ok(record) => Lookup::Found(record),
                Err(e) => Lookup::Unreadable(Unreadable {
                    path,
                    cause: Cause::Parse(e),
                }),
            },
            Err(e) => Lookup::Unreadable(Unreadable {
                path,
                cause: Cause::Io(e),
            }),
        })
    }

    /// Replaces `name`'s record, atomically and synced.
    pub fn put(&self, name: &str, record: &T) -> Result<(), StoreError> {
        check(name)?;
        let dir = match &self.place {
            Place::Memory(map) => {
                lock(map).insert(name.to_string(), record.clone());
                return Ok(());
            }
            Place::Dir(dir) => dir,
        };
        let file = file_name(name);
        let path = dir.join(&file);
        let text = if self.pretty {
            serde_json::to_vec_pretty(record)
        } else {
            serde_json::to_vec(record)
        }
        .map_err(|source| StoreError::Encode {
            path: path.clone(),
            source,
        })?;
        atomic_file::write(dir, OsStr::new(&file), &text, RECORD_MODE).map_err(|source| {
            StoreError::Io {
                action: "write",
                path,
                source,
            }
        })
    }

    /// Removes `name`'s record, synced; no record is fine.
    pub fn remove(&self, name: &str) -> Result<(), StoreError> {
        check(name)?;
        let dir = match &self.place {
            Place::Memory(map) => {
                lock(map).remove(name);
                return Ok(());
            }
            Place::Dir(dir) => dir,
        };
        let Some(open) = open_dir(dir)? else {
            return Ok(());
        };
        let file = file_name(name);
        atomic_file::remove_at(&open, OsStr::new(&file))
            .map(|_| ())
            .map_err(|source| StoreError::Io {
                action: "remove",
                path: dir.join(file),
                source,
            })
    }

    /// The names with a record (readable or not), sorted; a missing
    /// directory has none. Removes the temporary files of writes a crash
    /// cut short; skips, with a warning, files named `.json` whose name is
    /// not a volume name.
    pub fn names(&self) -> Result<Vec<String>, StoreError> {
        let dir = match &self.place {
            Place::Memory(map) => return Ok(lock(map).keys().cloned().collect()),
            Place::Dir(dir) => dir,
        };
        let Some(open) = open_dir(dir)? else {
            return Ok(Vec::new());
        };
        let list = |source| StoreError::Io {
            action: "list",
            path: dir.clone(),
            source,
        };
        atomic_file::remove_temps(&open).map_err(list)?;
        let mut out = Vec::new();
        for file in open.names().map_err(list)? {
            let file = file.to_string_lossy();
            let Some(name) = file.strip_suffix(EXTENSION) else {
                continue;
            };
            match names::check_volume_name(name) {
                Ok(()) => out.push(name.to_string()),
                Err(e) => tracing::warn!(
                    path = %dir.join(file.as_ref()).display(),
                    error = %e,
                    "a file among the records names no volume; left alone"
                ),
            }
        }
        out.sort();
        Ok(out)
    }

    /// Every record, by name, sorted, each as [`get`](Self::get) answers
    /// it (one that vanished since the listing is left out).
    pub fn all(&self) -> Result<Vec<(String, Lookup<T>)>, StoreError> {
        let mut out = Vec::new();
        for name in self.names()? {
            match self.get(&name)? {
                Lookup::Absent => {}
                found => out.push((name, found)),
            }
        }
        Ok(out)
    }
}

fn file_name(name: &str) -> String {
    format!("{name}{EXTENSION}")
}

/// Refuses a name that is not a volume name: it could leave the directory
/// (`/`, `..`) or pass for a temporary file (a leading dot).
fn check(name: &str) -> Result<(), StoreError> {
    names::check_volume_name(name).map_err(|e| StoreError::Name {
        name: name.to_string(),
        reason: e.to_string(),
    })
}

/// The directory (the node's own path, [`atomic_file::open_dir`]);
/// `None` if there is none yet.
fn open_dir(dir: &Path) -> Result<Option<Dir>, StoreError> {
    match atomic_file::open_dir(dir) {
        Ok(open) => Ok(Some(open)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StoreError::Io {
            action: "open",
            path: dir.to_path_buf(),
            source,
        }),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
    struct Rec {
        n: u32,
    }

    fn found(lookup: Lookup<Rec>) -> Option<Rec> {
        match lookup {
            Lookup::Found(r) => Some(r),
            Lookup::Absent => None,
            Lookup::Unreadable(u) => panic!("unreadable: {u}"),
        }
    }

    #[test]
    fn get_put_remove_names_on_disk_and_in_memory() {
        let tmp = tempfile::tempdir().expect("works");
        for store in [
            RecordStore::<Rec>::new(Some(tmp.path().join("made/later"))),
            RecordStore::new(None),
        ] {
            assert_eq!(store.names().expect("works"), Vec::<String>::new());
            assert_eq!(found(store.get("a").expect("works")), None);
            store.put("b", &Rec { n: 1 }).expect("works");
            store.put("a", &Rec { n: 2 }).expect("works");
            store.put("a", &Rec { n: 3 }).expect("works");
            assert_eq!(store.names().expect("works"), vec!["a", "b"]);
            assert_eq!(found(store.get("a").expect("works")), Some(Rec { n: 3 }));
            let all: Vec<_> = store
                .all()
                .expect("works")
                .into_iter()
                .map(|(k, v)| (k, found(v)))
                .collect();
            assert_eq!(
                all,
                vec![
                    ("a".into(), Some(Rec { n: 3 })),
                    ("b".into(), Some(Rec { n: 1 }))
                ]
            );
            store.remove("a").expect("works");
            store.remove("a").expect("a second remove is a no-op");
            assert_eq!(found(store.get("a").expect("works")), None);
            assert_eq!(store.names().expect("works"), vec!["b"]);
        }
    }

    #[test]
    fn a_truncated_record_is_unreadable_not_absent() {
        let tmp = tempfile::tempdir().expect("works");
        let store = RecordStore::<Rec>::new(Some(tmp.path().to_path_buf()));
        store.put("v", &Rec { n: 7 }).expect("works");
        let path = tmp.path().join("v.json");
        let whole = std::fs::read(&path).expect("works");
        std::fs::write(&path, &whole[..whole.len() - 1]).expect("works");
        match store.get("v").expect("works") {
            Lookup::Unreadable(Unreadable {
                path: p,
                cause: Cause::Parse(_),
            }) => assert_eq!(p, path),
            other => panic!("{other:?}"),
        }
        std::fs::write(&path, "").expect("works");
        assert!(matches!(
            store.get("v").expect("works"),
            Lookup::Unreadable(_)
        ));
        // Still listed: its name is a record, whatever it holds.
        assert_eq!(store.names().expect("works"), vec!["v"]);
    }

    #[test]
    fn a_link_in_place_of_a_record_is_unreadable_and_not_followed() {
        let tmp = tempfile::tempdir().expect("works");
        let outside = tmp.path().join("outside.json");
        std::fs::write(&outside, r#"{"n":9}"#).expect("works");
        let dir = tmp.path().join("records");
        std::fs::create_dir(&dir).expect("works");
        std::os::unix::fs::symlink(&outside, dir.join("v.json")).expect("works");
        let store = RecordStore::<Rec>::new(Some(dir));
        assert!(
            matches!(
                store.get("v").expect("works"),
                Lookup::Unreadable(Unreadable {
                    cause: Cause::Io(_),
                    ..
                })
            ),
            "a link is not read through"
        );
        store.put("v", &Rec { n: 1 }).expect("works");
        assert_eq!(
            std::fs::read_to_string(&outside).expect("works"),
            r#"{"n":9}"#,
            "nor written through"
        );
    }

    #[test]
    fn leftover_temporary_files_are_removed_and_other_files_left_alone() {
        let tmp = tempfile::tempdir().expect("works");
        let store = RecordStore::<Rec>::new(Some(tmp.path().to_path_buf()));
        store.put("v", &Rec { n: 1 }).expect("works");
        let leftovers = [".w.json.1a-2b-0.tmp", "w.json.tmp~"];
        for name in leftovers {
            std::fs::write(tmp.path().join(name), "{").expect("works");
        }
        std::fs::write(tmp.path().join("README"), "x").expect("works");
        std::fs::write(tmp.path().join("-bad.json"), "{}").expect("works");
        assert_eq!(store.names().expect("works"), vec!["v"]);
        for name in leftovers {
            assert!(!tmp.path().join(name).exists(), "{name} removed");
        }
        assert!(tmp.path().join("README").exists());
        assert!(tmp.path().join("-bad.json").exists());
    }

    #[test]
    fn names_that_could_leave_the_directory_are_refused() {
        let tmp = tempfile::tempdir().expect("works");
        let dir = tmp.path().join("records");
        for store in [
            RecordStore::<Rec>::new(Some(dir.clone())),
            RecordStore::new(None),
        ] {
            for bad in ["", "..", "../x", "a/b", ".hidden", "/abs"] {
                let err = store.put(bad, &Rec { n: 1 }).expect_err(bad);
                assert!(matches!(err, StoreError::Name { .. }), "{bad:?}: {err}");
                assert!(matches!(store.get(bad), Err(StoreError::Name { .. })));
                assert!(matches!(store.remove(bad), Err(StoreError::Name { .. })));
            }
        }
        assert!(!tmp.path().join("x.json").exists());
        assert!(!dir.exists(), "nothing was made");
    }

    #[test]
    fn pretty_records_are_indented() {
        let tmp = tempfile::tempdir().expect("works");
        let store = RecordStore::<Rec>::new(Some(tmp.path().to_path_buf())).pretty();
        store.put("v", &Rec { n: 1 }).expect("works");
        let text = std::fs::read_to_string(tmp.path().join("v.json")).expect("works");
        assert_eq!(text, "{\n  \"n\": 1\n}");
    }
}
