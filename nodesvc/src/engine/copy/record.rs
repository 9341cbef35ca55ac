//! What the node knows about each volume that was filled by a copy: its
//! source, whether it is a snapshot, and whether the copy completed.
//!
//! One JSON file per target volume under the records directory, in the
//! engine's record store ([`crate::engine::records`]), so a record is
//! whole or absent. The record decides what a repeated copy does
//! (nothing, when complete) and that a snapshot stays read-only, so a
//! record that cannot be written fails the copy. Without a directory
//! (tests, a node without a state directory) the records live in memory.
//!
//! **An unreadable record** (there, but damaged or cut short) is not an
//! absence: guessing "no copy" would let a snapshot be overwritten or
//! grown, guessing "complete" would hand out a half-copied volume. So
//! where the record decides something ([`CopyRecords::get`]: a repeated
//! copy, a copy from the volume, the snapshot check before a resize) it
//! is an error naming the file, until someone repairs or removes it.
//! Where it only informs ([`CopyRecords::origin`], the copy origin shown
//! with a volume; [`CopyRecords::all`], the freezes thawed at start) it is
//! passed over, the second with a warning.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::engine::error::{Error, Result};
use crate::engine::records::{Cause, Lookup, RecordStore, StoreError, Unreadable};

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
pub struct CopyRecords(RecordStore<CopyRecord>);

impl CopyRecords {
    pub fn new(dir: Option<PathBuf>) -> CopyRecords {
        CopyRecords(RecordStore::new(dir))
    }

    /// `volume`'s record, for a decision: an unreadable record is an
    /// error naming it ([`unreadable`]).
    pub fn get(&self, volume: &str) -> Result<Option<CopyRecord>> {
        match self.0.get(volume).map_err(store)? {
            Lookup::Absent => Ok(None),
            Lookup::Found(record) => Ok(Some(record)),
            Lookup::Unreadable(u) => Err(unreadable(u)),
        }
    }

    /// `volume`'s record, to show where it came from: an unreadable one
    /// (or a failed read) shows nothing; what it decides goes through
    /// [`get`](Self::get).
    pub fn origin(&self, volume: &str) -> Option<CopyRecord> {
        match self.0.get(volume) {
            Ok(Lookup::Found(record)) => Some(record),
            Ok(Lookup::Absent | Lookup::Unreadable(_)) | Err(_) => None,
        }
    }

    /// Replaces `volume`'s record.
    pub fn put(&self, volume: &str, record: &CopyRecord) -> Result<()> {
        self.0.put(volume, record).map_err(store)
    }

    /// Every readable record, by volume; unreadable ones (and a records
    /// directory that cannot be listed) are logged and passed over.
    pub fn all(&self) -> Vec<(String, CopyRecord)> {
        let all = match self.0.all() {
            Ok(all) => all,
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the copy records");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for (volume, lookup) in all {
            match lookup {
                Lookup::Found(record) => out.push((volume, record)),
                Lookup::Absent => {}
                Lookup::Unreadable(u) => {
                    tracing::warn!(error = %unreadable(u), "unreadable copy record")
                }
            }
        }
        out
    }

    /// Forgets `volume`'s record (the volume is gone).
    pub fn remove(&self, volume: &str) {
        if let Err(e) = self.0.remove(volume) {
            tracing::warn!(
                error = %e,
                "could not remove the copy record of a deleted volume; a new volume of that name would inherit it"
            );
        }
    }
}

/// What an unreadable copy record means where it decides something: an
/// error naming the file, never "no copy" (see the module header).
fn unreadable(u: Unreadable) -> Error {
    match u.cause {
        Cause::Io(source) => Error::io("read the copy record", u.path, source),
        Cause::Parse(e) => Error::parse(format!("copy record {}", u.path.display()), e),
    }
}

fn store(e: StoreError) -> Error {
    match e {
        StoreError::Name { reason, .. } => Error::invalid("name", reason),
        StoreError::Io {
            action: "write",
            path,
            source,
        } => Error::io("write the copy record", path, source),
        StoreError::Io {
            action,
            path,
            source,
        } => Error::io(action, path, source),
        StoreError::Encode { path, source } => {
            Error::parse(format!("copy record {} to write", path.display()), source)
        }
    }
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
