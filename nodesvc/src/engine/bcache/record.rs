//! The node's record of its bcache devices: one JSON file per device in
//! `<state dir>/bcache/`, written before anything is formatted (so a
//! create that died half-way is found and finished, or undone, by the
//! next call) and replaced atomically, in the engine's record store
//! ([`crate::engine::records`]), pretty-printed for an operator. With the
//! superblocks it is what a restarted node re-assembles its devices from;
//! it is never a reason to format again.
//!
//! **An unreadable record** fails the start, naming the file: a device
//! the node cannot account for is neither re-assembled nor given up, and
//! its volumes are never formatted again by guess.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::CacheMode;
use crate::engine::error::{Error, Result};
use crate::engine::records::{Cause, Lookup, RecordStore, StoreError};

/// How far a device got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Volumes and superblocks may be half made; the next create of this
    /// name finishes the job, a delete undoes it.
    Creating,
    /// Assembled once; re-assembled at every start.
    Ready,
    /// A delete began; the next delete finishes it.
    Deleting,
}

/// The volumes a device made for itself (and deletes with itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnedVolumes {
    pub backing_group: String,
    pub size_bytes: u64,
    pub cache_group: String,
    pub cache_ratio_percent: u32,
}

/// One device's record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub name: String,
    pub backing_volume: String,
    pub cache_volume: String,
    pub cache_mode: CacheMode,
    /// Chosen before formatting and given to `make-bcache`, so a
    /// superblock of ours is told apart from anyone else's.
    pub cset_uuid: String,
    /// The backing device's superblock UUID, once formatted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing_uuid: Option<String>,
    /// Set when the device made its volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned: Option<OwnedVolumes>,
    pub phase: Phase,
}

/// The records in one directory. Every method blocks.
#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
    store: Arc<RecordStore<Record>>,
}

impl Records {
    /// Records kept under `state_dir/bcache`.
    pub fn new(state_dir: &Path) -> Records {
        let dir = state_dir.join("bcache");
        Records {
            store: Arc::new(RecordStore::new(Some(dir.clone())).pretty()),
            dir,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every record, sorted by name. A record that cannot be read is an
    /// error naming it (a record is never silently dropped).
    pub fn load(&self) -> Result<Vec<Record>> {
        let mut out = Vec::new();
        for (_, lookup) in self.store.all().map_err(store)? {
            match lookup {
                Lookup::Found(record) => out.push(record),
                Lookup::Absent => {}
                Lookup::Unreadable(u) => {
                    return Err(match u.cause {
                        Cause::Io(e) => Error::io("read", u.path, e),
                        Cause::Parse(e) => Error::parse(u.path.display().to_string(), e),
                    });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Writes `record` atomically.
    pub fn put(&self, record: &Record) -> Result<()> {
        self.store.put(&record.name, record).map_err(store)
    }

    /// Removes the record of `name`, synced; absent is fine.
    pub fn remove(&self, name: &str) -> Result<()> {
        self.store.remove(name).map_err(store)
    }
}

fn store(e: StoreError) -> Error {
    match e {
        StoreError::Name { reason, .. } => Error::invalid("name", reason),
        StoreError::Io {
            action,
            path,
            source,
        } => Error::io(action, path, source),
        StoreError::Encode { path, source } => Error::parse(path.display().to_string(), source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(name: &str) -> Record {
        Record {
            name: name.into(),
            backing_volume: format!("{name}-b"),
            cache_volume: format!("{name}-c"),
            cache_mode: CacheMode::Writeback,
            cset_uuid: "3f1c1b9e-1d2e-4a11-9c1d-2a1b3c4d5e6f".into(),
            backing_uuid: None,
            owned: Some(OwnedVolumes {
                backing_group: "hdd".into(),
                size_bytes: 1 << 30,
                cache_group: "ssd".into(),
                cache_ratio_percent: 10,
            }),
            phase: Phase::Creating,
        }
    }

    #[test]
    fn put_load_remove() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = Records::new(dir.path());
        assert_eq!(records.load().expect("empty"), Vec::new());
        let mut a = record("a");
        records.put(&record("b")).expect("put");
        records.put(&a).expect("put");
        a.phase = Phase::Ready;
        a.backing_uuid = Some("fe041ed5-9818-48fc-aa0e-0071d44369dc".into());
        records.put(&a).expect("replace");
        let all = records.load().expect("load");
        assert_eq!(all, vec![a, record("b")]);
        records.remove("b").expect("remove");
        records.remove("b").expect("again");
        assert_eq!(records.load().expect("load").len(), 1);
        let text = std::fs::read_to_string(dir.path().join("bcache/a.json")).expect("file");
        assert!(text.contains("\"cacheMode\": \"writeback\""), "{text}");
        assert!(text.contains("\"phase\": \"ready\""), "{text}");
    }

    #[test]
    fn a_damaged_record_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = Records::new(dir.path());
        std::fs::create_dir_all(records.dir()).expect("mkdir");
        std::fs::write(records.dir().join("x.json"), "{").expect("write");
        let err = records.load().expect_err("damaged").to_string();
        assert!(err.contains("x.json"), "{err}");
    }

    #[test]
    fn a_link_at_a_temporary_name_is_not_written_through() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = Records::new(dir.path());
        std::fs::create_dir_all(records.dir()).expect("mkdir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "mine").expect("write");
        // The fixed temporary name an earlier version wrote through.
        std::os::unix::fs::symlink(&victim, records.dir().join(".a.json.tmp")).expect("symlink");
        records.put(&record("a")).expect("put");
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "mine");
        assert_eq!(records.load().expect("load"), vec![record("a")]);
    }
}
