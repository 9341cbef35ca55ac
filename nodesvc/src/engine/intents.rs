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
//! One JSON file per volume, `<dir>/<volume>.json`, in the engine's
//! record store ([`super::records`]). A record that cannot be written
//! refuses the change before anything is touched (`Error::Journal`,
//! UNAVAILABLE): a change the node could not repair after a crash is not
//! started. Without a directory (engines in tests) the journal is kept in
//! memory, which settles failed removals but no crash.
//!
//! **An unreadable record** (there, but damaged or cut short) still names
//! a change that did not finish, and what it was is unknown: settling it
//! by guess could remove a volume someone was given. So it is listed as
//! pending like any other, and reading it is an error
//! ([`unreadable`]): the volume is not settled, and every later change of
//! it is refused, until someone repairs or removes the record.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::engine::error::{Error, Result};
use crate::engine::records::{Cause, Lookup, RecordStore, StoreError, Unreadable};

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
pub struct Intents(RecordStore<Intent>);

impl Intents {
    pub fn new(dir: Option<PathBuf>) -> Intents {
        Intents(RecordStore::new(dir))
    }

    /// Records `intent` for `volume`, synced, replacing an older one.
    pub fn begin(&self, volume: &str, intent: &Intent) -> Result<()> {
        self.0.put(volume, intent).map_err(journal)
    }

    /// Removes `volume`'s record, synced: after this the change is over
    /// for a node that restarts.
    pub fn end(&self, volume: &str) -> Result<()> {
        self.0.remove(volume).map_err(journal)
    }

    /// `volume`'s record, if a change of it has not ended. A record that
    /// cannot be read is an error ([`unreadable`]).
    pub fn get(&self, volume: &str) -> Result<Option<Intent>> {
        match self.0.get(volume).map_err(journal)? {
            Lookup::Absent => Ok(None),
            Lookup::Found(intent) => Ok(Some(intent)),
            Lookup::Unreadable(u) => Err(unreadable(u)),
        }
    }

    /// The volumes with a record, readable or not, sorted (a missing
    /// directory has none). Writes a crash cut short are dropped: their
    /// changes never started.
    pub fn pending(&self) -> Result<Vec<String>> {
        self.0.names().map_err(journal)
    }
}

/// What an unreadable journal record means: an interrupted change of
/// unknown kind. It is an error, never an absence: the volume stays
/// unsettled and its changes are refused until the record is repaired.
fn unreadable(u: Unreadable) -> Error {
    match u.cause {
        Cause::Io(source) => Error::Journal {
            action: "read",
            path: u.path,
            source,
        },
        Cause::Parse(e) => Error::parse(format!("journal record {}", u.path.display()), e),
    }
}

fn journal(e: StoreError) -> Error {
    match e {
        StoreError::Name { reason, .. } => Error::invalid("name", reason),
        StoreError::Io {
            action,
            path,
            source,
        } => Error::Journal {
            action,
            path,
            source,
        },
        StoreError::Encode { path, source } => Error::parse(
            format!("journal record {} to write", path.display()),
            source,
        ),
    }
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
        let tmp = dir.path().join(".w.json.1-2-3.tmp");
        std::fs::write(&tmp, "{").expect("works");
        let intents = Intents::new(Some(dir.path().to_path_buf()));
        assert_eq!(intents.pending().expect("works"), vec!["v"]);
        assert!(!tmp.exists(), "a cut write is removed");
        let err = intents.get("v").expect_err("refused");
        assert!(err.to_string().contains("v.json"), "{err}");
    }

    #[test]
    fn a_link_at_a_temporary_name_is_not_written_through() {
        let dir = tempfile::tempdir().expect("works");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "mine").expect("works");
        let journal = dir.path().join("intents");
        std::fs::create_dir(&journal).expect("works");
        // The fixed temporary name an earlier version wrote through.
        std::os::unix::fs::symlink(&victim, journal.join("v.json.tmp~")).expect("works");
        let intents = Intents::new(Some(journal));
        intents
            .begin("v", &intent(Operation::Create))
            .expect("works");
        assert_eq!(std::fs::read_to_string(&victim).expect("works"), "mine");
        assert_eq!(
            intents.get("v").expect("works"),
            Some(intent(Operation::Create))
        );
    }
}
