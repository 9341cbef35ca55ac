//! The journal of changes in progress: before the engine changes a volume
//! (create, delete, resize) it records what it is about to do, synced, and
//! it removes the record, synced, before it answers. A record that is
//! still there when the node starts belongs to a change the node did not
//! finish (it was killed, or lost power), and the engine settles it
//! (`Engine::settle`) before it serves:
//!
//! - a **create** is rolled back: whatever the backend made of the volume
//!   (an LV not yet wiped, a partition, a marker without its directory) is
//!   removed, since nobody was ever given it; a retry creates it afresh;
//! - a **delete** is finished: a volume half removed (a directory emptied
//!   part way) is not left for anyone to use;
//! - a **resize** is left at whichever size the backend reached (either is
//!   a whole volume, and the devices are sized from it at start); a retry
//!   finishes it.
//!
//! The same settling runs before the next change of that volume when a
//! record outlives its change at run time (its removal failed).
//!
//! One JSON file per volume, `<dir>/<volume>.json`, written through a
//! synced temporary file. A record that cannot be written refuses the
//! change before anything is touched (`Error::Journal`, UNAVAILABLE):
//! a change the node could not repair after a crash is not started.
//! Without a directory (engines in tests) the journal is kept in memory,
//! which settles failed removals but no crash.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::engine::error::{Error, Result};
use crate::engine::synced;

/// A change of one volume that has started and not yet answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Intent {
    pub operation: Operation,
    /// The group the volume is (being made) in.
    pub group: String,
    /// The size asked for (create, resize); 0 for a delete.
    pub size_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Operation {
    Create,
    Delete,
    Resize,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "create",
            Operation::Delete => "delete",
            Operation::Resize => "resize",
        }
    }
}

/// The records of changes in progress, by volume name.
#[derive(Debug)]
pub enum Intents {
    Dir(PathBuf),
    Memory(Mutex<HashMap<String, Intent>>),
}

impl Intents {
    pub fn new(dir: Option<PathBuf>) -> Intents {
        match dir {
            Some(dir) => Intents::Dir(dir),
            None => Intents::Memory(Mutex::new(HashMap::new())),
        }
    }

    fn file(dir: &Path, volume: &str) -> PathBuf {
        // Volume names are checked names: no `/`, no leading `.`.
        dir.join(format!("{volume}.json"))
    }

    /// Records `intent` for `volume`, synced, replacing an older one.
    pub fn begin(&self, volume: &str, intent: &Intent) -> Result<()> {
        match self {
            Intents::Memory(map) => {
                lock(map).insert(volume.to_string(), intent.clone());
                Ok(())
            }
            Intents::Dir(dir) => {
                let file = Self::file(dir, volume);
                let text = serde_json::to_vec(intent)
                    .map_err(|e| Error::parse("a journal record to write", e))?;
                synced::write(dir, &file, &text).map_err(|e| journal("write", file, e))
            }
        }
    }

    /// Removes `volume`'s record, synced: after this the change is over
    /// for a node that restarts.
    pub fn end(&self, volume: &str) -> Result<()> {
        match self {
            Intents::Memory(map) => {
                lock(map).remove(volume);
                Ok(())
            }
            Intents::Dir(dir) => {
                let file = Self::file(dir, volume);
                synced::remove(dir, &file).map_err(|e| journal("remove", file, e))
            }
        }
    }

    /// `volume`'s record, if a change of it has not ended. A record that
    /// cannot be read is an error: settling it by guess could remove a
    /// volume someone was given.
    pub fn get(&self, volume: &str) -> Result<Option<Intent>> {
        match self {
            Intents::Memory(map) => Ok(lock(map).get(volume).cloned()),
            Intents::Dir(dir) => {
                let file = Self::file(dir, volume);
                let text = match std::fs::read(&file) {
                    Ok(text) => text,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(journal("read", file, e)),
                };
                serde_json::from_slice(&text)
                    .map(Some)
                    .map_err(|e| Error::parse(format!("journal record {}", file.display()), e))
            }
        }
    }

    /// The volumes with a record, sorted (a missing directory has none).
    pub fn pending(&self) -> Result<Vec<String>> {
        let mut out: Vec<String> = match self {
            Intents::Memory(map) => lock(map).keys().cloned().collect(),
            Intents::Dir(dir) => {
                let entries = match std::fs::read_dir(dir) {
                    Ok(entries) => entries,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                    Err(e) => return Err(journal("list", dir.clone(), e)),
                };
                let mut names = Vec::new();
                for entry in entries {
                    let entry = entry.map_err(|e| journal("list", dir.clone(), e))?;
                    let file = entry.file_name();
                    let file = file.to_string_lossy();
                    if let Some(volume) = file.strip_suffix(".json") {
                        names.push(volume.to_string());
                    } else if file.ends_with(synced::TEMP_SUFFIX) {
                        // A record whose write was cut short: its change
                        // never started.
                        let _ = std::fs::remove_file(entry.path());
                    }
                }
                names
            }
        };
        out.sort();
        Ok(out)
    }
}

fn journal(action: &'static str, path: PathBuf, source: std::io::Error) -> Error {
    Error::Journal {
        action,
        path,
        source,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(operation: Operation) -> Intent {
        Intent {
            operation,
            group: "g".into(),
            size_bytes: 4 << 20,
        }
    }

    #[test]
    fn records_begin_and_end_on_disk_and_in_memory() {
        let dir = tempfile::tempdir().expect("works");
        for intents in [
            Intents::new(Some(dir.path().join("intents"))),
            Intents::new(None),
        ] {
            assert_eq!(intents.pending().expect("works"), Vec::<String>::new());
            intents
                .begin("b", &intent(Operation::Create))
                .expect("works");
            intents
                .begin("a", &intent(Operation::Delete))
                .expect("works");
            intents
                .begin("a", &intent(Operation::Resize))
                .expect("works");
            assert_eq!(intents.pending().expect("works"), vec!["a", "b"]);
            assert_eq!(
                intents.get("a").expect("works"),
                Some(intent(Operation::Resize))
            );
            intents.end("a").expect("works");
            intents.end("a").expect("a second end is a no-op");
            assert_eq!(intents.get("a").expect("works"), None);
            assert_eq!(intents.pending().expect("works"), vec!["b"]);
        }
    }

    #[test]
    fn an_unwritable_directory_refuses_the_change_naming_the_file() {
        let dir = tempfile::tempdir().expect("works");
        // A file where the directory should be: nothing can be made in it.
        let blocked = dir.path().join("intents");
        std::fs::write(&blocked, "").expect("works");
        let intents = Intents::new(Some(blocked));
        let err = intents
            .begin("v", &intent(Operation::Create))
            .expect_err("refused");
        assert!(matches!(err, Error::Journal { .. }), "{err:?}");
        assert!(err.to_string().contains("intents/v.json"), "{err}");
    }

    #[test]
    fn an_unreadable_record_is_an_error_and_a_cut_write_is_dropped() {
        let dir = tempfile::tempdir().expect("works");
        std::fs::write(dir.path().join("v.json"), "{not json").expect("works");
        let tmp = dir.path().join(format!("w.json{}", synced::TEMP_SUFFIX));
        std::fs::write(&tmp, "{").expect("works");
        let intents = Intents::new(Some(dir.path().to_path_buf()));
        assert_eq!(intents.pending().expect("works"), vec!["v"]);
        assert!(!tmp.exists(), "a cut write is removed");
        let err = intents.get("v").expect_err("refused");
        assert!(err.to_string().contains("v.json"), "{err}");
    }
}
