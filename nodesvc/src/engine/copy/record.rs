//! What the node knows about each volume that was filled by a copy: its
//! source, whether it is a snapshot, and whether the copy completed.
//!
//! One JSON file per target volume under the records directory, written
//! through a temporary file and synced, so a record is whole or absent.
//! The record decides what a repeated copy does (nothing, when complete)
//! and that a snapshot stays read-only, so a record that cannot be
//! written fails the copy. Without a directory (tests, a node without a
//! state directory) the records live in memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::engine::error::{Error, Result};
use crate::engine::synced;

/// The copy that filled one volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyRecord {
    /// The source volume's name.
    pub source: String,
    /// The target is a read-only snapshot of the source.
    pub snapshot: bool,
    /// Every block of a block copy is on the target and synced; what is
    /// left is giving its filesystem a UUID of its own. A node stopped
    /// here finishes that on the repeated copy instead of copying again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub blocks_copied: bool,
    /// The copy finished and was synced (and a block copy's filesystem
    /// has its own UUID).
    pub complete: bool,
    /// When it finished, nanoseconds since the Unix epoch (0 until then).
    pub completed_unix_nanos: i64,
    /// The source's size at the copy.
    pub source_size_bytes: u64,
    /// Where the source's filesystem is frozen while the copy runs: a
    /// node that stops mid-copy thaws it when it starts again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frozen_at: Option<PathBuf>,
}

/// The records of every copied volume.
#[derive(Debug)]
pub enum CopyRecords {
    Dir(PathBuf),
    Memory(Mutex<HashMap<String, CopyRecord>>),
}

impl CopyRecords {
    pub fn new(dir: Option<PathBuf>) -> CopyRecords {
        match dir {
            Some(dir) => CopyRecords::Dir(dir),
            None => CopyRecords::Memory(Mutex::new(HashMap::new())),
        }
    }

    fn file(dir: &Path, volume: &str) -> PathBuf {
        // Volume names are checked names: no `/`, no leading `.`.
        dir.join(format!("{volume}.json"))
    }

    /// `volume`'s record. An unreadable record is an error: guessing
    /// would let a snapshot be overwritten.
    pub fn get(&self, volume: &str) -> Result<Option<CopyRecord>> {
        match self {
            CopyRecords::Memory(map) => Ok(lock(map).get(volume).cloned()),
            CopyRecords::Dir(dir) => {
                let file = Self::file(dir, volume);
                let text = match std::fs::read_to_string(&file) {
                    Ok(text) => text,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(Error::io("read the copy record", file, e)),
                };
                serde_json::from_str(&text)
                    .map(Some)
                    .map_err(|e| Error::parse(format!("copy record {}", file.display()), e))
            }
        }
    }

    /// Replaces `volume`'s record.
    pub fn put(&self, volume: &str, record: &CopyRecord) -> Result<()> {
        match self {
            CopyRecords::Memory(map) => {
                lock(map).insert(volume.to_string(), record.clone());
                Ok(())
            }
            CopyRecords::Dir(dir) => {
                let file = Self::file(dir, volume);
                let text = serde_json::to_string(record)
                    .map_err(|e| Error::parse("a copy record to write", e))?;
                synced::write(dir, &file, text.as_bytes())
                    .map_err(|e| Error::io("write the copy record", file, e))
            }
        }
    }

    /// Every readable record, by volume (unreadable ones are logged).
    pub fn all(&self) -> Vec<(String, CopyRecord)> {
        match self {
            CopyRecords::Memory(map) => lock(map)
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            CopyRecords::Dir(dir) => {
                let Ok(entries) = std::fs::read_dir(dir) else {
                    return Vec::new();
                };
                let mut out = Vec::new();
                for entry in entries.flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let Some(volume) = name.strip_suffix(".json") else {
                        continue;
                    };
                    match self.get(volume) {
                        Ok(Some(record)) => out.push((volume.to_string(), record)),
                        Ok(None) => {}
                        Err(e) => tracing::warn!(error = %e, "unreadable copy record"),
                    }
                }
                out
            }
        }
    }

    /// Forgets `volume`'s record (the volume is gone).
    pub fn remove(&self, volume: &str) {
        match self {
            CopyRecords::Memory(map) => {
                lock(map).remove(volume);
            }
            CopyRecords::Dir(dir) => {
                let file = Self::file(dir, volume);
                match std::fs::remove_file(&file) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => tracing::warn!(
                        path = %file.display(),
                        error = %e,
                        "could not remove the copy record of a deleted volume; a new volume of that name would inherit it"
                    ),
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(complete: bool) -> CopyRecord {
        CopyRecord {
            source: "src".into(),
            snapshot: true,
            blocks_copied: complete,
            complete,
            completed_unix_nanos: if complete { 7 } else { 0 },
            source_size_bytes: 4096,
            frozen_at: None,
        }
    }

    #[test]
    fn records_round_trip_on_disk_and_in_memory() {
        let dir = tempfile::tempdir().expect("works");
        for records in [
            CopyRecords::new(Some(dir.path().join("copies"))),
            CopyRecords::new(None),
        ] {
            assert_eq!(records.get("t").expect("works"), None);
            records.put("t", &record(false)).expect("works");
            records.put("t", &record(true)).expect("works");
            assert_eq!(records.get("t").expect("works"), Some(record(true)));
            assert_eq!(records.all(), vec![("t".to_string(), record(true))]);
            records.remove("t");
            records.remove("t");
            assert_eq!(records.get("t").expect("works"), None);
        }
    }

    #[test]
    fn an_unreadable_record_is_an_error_not_an_absence() {
        let dir = tempfile::tempdir().expect("works");
        std::fs::write(dir.path().join("t.json"), "{not json").expect("works");
        let records = CopyRecords::new(Some(dir.path().to_path_buf()));
        let err = records.get("t").expect_err("refused");
        assert!(err.to_string().contains("t.json"), "{err}");
    }

    #[test]
    fn a_record_written_before_blocks_copied_existed_reads_as_not_copied() {
        let old = r#"{"source":"src","snapshot":false,"complete":false,"completedUnixNanos":0,"sourceSizeBytes":4096}"#;
        let record: CopyRecord = serde_json::from_str(old).expect("reads");
        assert!(!record.blocks_copied);
        assert_eq!(
            serde_json::to_string(&record).expect("writes"),
            old,
            "unset, the field is not written"
        );
    }
}
