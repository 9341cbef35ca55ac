//! The per-disk name record: [`SLOTS`] slots of [`SLOT_BYTES`] bytes at
//! [`RECORD_OFFSET`], slot N holding the full volume name (and the
//! whole-disk flag) of partition entry N. Encoding and decoding are pure;
//! [`read_record`] and [`write_slot`] do the disk I/O.

use std::os::unix::fs::FileExt;
use std::path::Path;

use super::UNIT_BYTES;
use crate::engine::error::{Error, Result};
use crate::engine::gpt;
use crate::engine::names;

/// Partition entries we use: the size of the tables we write.
pub const SLOTS: u32 = gpt::TABLE_ENTRIES as u32;
/// Bytes of one name-record slot.
pub const SLOT_BYTES: usize = 128;
/// Byte offset of the name record on a disk: the last 16 KiB below 1 MiB.
pub const RECORD_OFFSET: u64 = UNIT_BYTES - SLOTS as u64 * SLOT_BYTES as u64;
const RECORD_BYTES: usize = SLOTS as usize * SLOT_BYTES;
const SLOT_MAGIC: &[u8; 8] = b"carinaV1";
const SLOT_HEADER: usize = 10;
const FLAG_EXCLUSIVE: u8 = 1;

/// One name-record slot: who entry N belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub volume: String,
    pub exclusive: bool,
}

/// Slot layout: magic (8 bytes), flags (1), name length (1), name, zeros.
/// `None` if the name is too long for a slot.
pub fn encode_slot(slot: &Slot) -> Option<[u8; SLOT_BYTES]> {
    let name = slot.volume.as_bytes();
    if name.len() > SLOT_BYTES - SLOT_HEADER {
        return None;
    }
    let mut out = [0u8; SLOT_BYTES];
    out[..8].copy_from_slice(SLOT_MAGIC);
    out[8] = if slot.exclusive { FLAG_EXCLUSIVE } else { 0 };
    out[9] = name.len() as u8; // bounded by SLOT_BYTES above
    out[SLOT_HEADER..SLOT_HEADER + name.len()].copy_from_slice(name);
    Some(out)
}

/// Reads one slot; `None` for an empty or malformed one.
pub fn decode_slot(bytes: &[u8]) -> Option<Slot> {
    if bytes.len() < SLOT_BYTES || &bytes[..8] != SLOT_MAGIC {
        return None;
    }
    let len = usize::from(bytes[9]);
    let name = bytes.get(SLOT_HEADER..SLOT_HEADER + len)?;
    let volume = std::str::from_utf8(name).ok()?;
    names::check_volume_name(volume).ok()?;
    Some(Slot {
        volume: volume.to_string(),
        exclusive: bytes[8] & FLAG_EXCLUSIVE != 0,
    })
}

pub(super) async fn read_record(path: &Path) -> Result<Vec<Option<Slot>>> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(&path).map_err(|e| Error::io("open", &path, e))?;
        read_slots(&file).map_err(|e| Error::io("read the name record of", &path, e))
    })
    .await
    .map_err(|e| Error::task("reading a name record", e))?
}

/// The record's slots, from a disk already open. Blocking.
pub(super) fn read_slots(file: &std::fs::File) -> std::io::Result<Vec<Option<Slot>>> {
    let mut buf = vec![0u8; RECORD_BYTES];
    file.read_exact_at(&mut buf, RECORD_OFFSET)?;
    Ok(buf.chunks(SLOT_BYTES).map(decode_slot).collect())
}

/// Writes slot `number` (or clears it), without a flush of its own: a
/// create writes the slot before the table, and the table write (`sfdisk`
/// fsyncs the disk) makes both durable; a clear lost in a crash leaves a
/// slot whose entry is gone, which never verifies, and the next create of
/// that entry writes its slot anew.
pub(super) async fn write_slot(path: &Path, number: u32, slot: Option<&Slot>) -> Result<()> {
    let bytes = match slot {
        Some(s) => encode_slot(s).ok_or_else(|| {
            Error::invalid(
                "name",
                format!("{:?} is too long for a name record", s.volume),
            )
        })?,
        None => [0u8; SLOT_BYTES],
    };
    let offset = RECORD_OFFSET + u64::from(number.saturating_sub(1)) * SLOT_BYTES as u64;
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| Error::io("open", &path, e))?;
        file.write_all_at(&bytes, offset)
            .map_err(|e| Error::io("write the name record of", &path, e))
    })
    .await
    .map_err(|e| Error::task("writing a name record", e))?
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// A slot read from any bytes is one that encodes back to them.
        #[test]
        fn slots_decode_only_what_encodes_back(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..(2 * SLOT_BYTES)),
        ) {
            if let Some(slot) = decode_slot(&bytes) {
                let again = encode_slot(&slot).expect("a decoded slot encodes");
                proptest::prop_assert_eq!(decode_slot(&again), Some(slot));
            }
        }
    }

    #[test]
    fn slots_round_trip_and_reject_garbage() {
        let slot = Slot {
            volume: "v".repeat(names::MAX_VOLUME_NAME),
            exclusive: true,
        };
        let bytes = encode_slot(&slot).expect("fits");
        assert_eq!(decode_slot(&bytes), Some(slot));
        let short = Slot {
            volume: "pvc-1".into(),
            exclusive: false,
        };
        assert_eq!(
            decode_slot(&encode_slot(&short).expect("fits")),
            Some(short)
        );
        assert_eq!(decode_slot(&[0u8; SLOT_BYTES]), None);
        let mut bad = encode_slot(&Slot {
            volume: "ok".into(),
            exclusive: false,
        })
        .expect("fits");
        bad[SLOT_HEADER] = b'/';
        assert_eq!(decode_slot(&bad), None, "invalid volume name");
        bad[9] = 200;
        assert_eq!(decode_slot(&bad), None, "length past the slot");
        assert!(
            encode_slot(&Slot {
                volume: "x".repeat(SLOT_BYTES),
                exclusive: false
            })
            .is_none()
        );
        // The record fits below the first aligned MiB.
        assert_eq!(RECORD_OFFSET + RECORD_BYTES as u64, UNIT_BYTES);
    }
}
