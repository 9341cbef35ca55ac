//! The primary GPT read straight from the disk: the protective MBR, the
//! header at LBA 1 and its entry array, the header and the array checked
//! against their CRC32s. For a disk whose primary GPT is intact this gives
//! what `sfdisk -J` reports, without starting a program on every look at
//! a disk; anything else (no table, another label, a damaged primary
//! table that sfdisk would repair from the backup) is `None` and left to
//! `sfdisk`. [`parse_header`] and [`parse_entries`] are pure; [`read`]
//! does the (blocking) I/O.

use std::os::unix::fs::FileExt;
use std::path::Path;

use super::{Partition, Table};

const SIGNATURE: &[u8; 8] = b"EFI PART";
/// Bytes of the header fields we read (the header of GPT revision 1.0).
const HEADER_BYTES: usize = 92;
/// Type of the MBR record that protects a GPT.
const PROTECTIVE_TYPE: u8 = 0xEE;
/// Bytes of one entry's name: 36 UTF-16 code units.
const NAME_BYTES: usize = 72;
/// Larger entry arrays are left to sfdisk (the default is 16 KiB).
const MAX_ARRAY_BYTES: u64 = 1 << 20;

/// What the header says about the entry array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub first_lba: u64,
    /// Inclusive.
    pub last_lba: u64,
    pub entries_lba: u64,
    pub entries: u32,
    pub entry_bytes: u32,
    entries_crc: u32,
}

impl Header {
    /// Bytes of the entry array.
    pub fn array_bytes(&self) -> u64 {
        u64::from(self.entries) * u64::from(self.entry_bytes)
    }
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The header, if `lba0_1` (the first two sectors of a disk with sectors
/// of `sector` bytes) holds a protective (or hybrid) MBR and a primary GPT
/// header whose CRC verifies and whose fields are sane.
pub fn parse_header(lba0_1: &[u8], sector: usize) -> Option<Header> {
    if sector < 512 || lba0_1.len() < 2 * sector {
        return None;
    }
    let mbr = &lba0_1[..512];
    let protective =
        mbr[510..512] == [0x55, 0xAA] && (0..4).any(|i| mbr[446 + 16 * i + 4] == PROTECTIVE_TYPE);
    let h = &lba0_1[sector..2 * sector];
    if !protective || &h[..8] != SIGNATURE {
        return None;
    }
    let size = le_u32(h, 12) as usize;
    if !(HEADER_BYTES..=sector).contains(&size) {
        return None;
    }
    let mut copy = h[..size].to_vec();
    copy[16..20].fill(0);
    if crc32(&copy) != le_u32(h, 16) || le_u64(h, 24) != 1 {
        return None;
    }
    let header = Header {
        first_lba: le_u64(h, 40),
        last_lba: le_u64(h, 48),
        entries_lba: le_u64(h, 72),
        entries: le_u32(h, 80),
        entry_bytes: le_u32(h, 84),
        entries_crc: le_u32(h, 88),
    };
    let sane = header.entry_bytes >= 128
        && header.entry_bytes.is_multiple_of(8)
        && header.array_bytes() <= MAX_ARRAY_BYTES
        && header.entries_lba >= 2
        && header.first_lba <= header.last_lba;
    sane.then_some(header)
}

/// The table of `header`'s entry array `array` (its [`Header::array_bytes`]
/// bytes), if the array's CRC verifies and every used entry is sane.
/// Entries are numbered from 1 in array order, as sfdisk numbers them.
pub fn parse_entries(header: &Header, array: &[u8], sector: u64) -> Option<Table> {
    let len = usize::try_from(header.array_bytes()).ok()?;
    if array.len() < len || crc32(&array[..len]) != header.entries_crc {
        return None;
    }
    let mut partitions = Vec::new();
    for (i, e) in array[..len].chunks(header.entry_bytes as usize).enumerate() {
        if e[..16].iter().all(|b| *b == 0) {
            continue;
        }
        let (first, last) = (le_u64(e, 32), le_u64(e, 40));
        if last < first {
            return None;
        }
        let units: Vec<u16> = e[56..56 + NAME_BYTES]
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .take_while(|u| *u != 0)
            .collect();
        partitions.push(Partition {
            number: u32::try_from(i + 1).ok()?,
            start: first,
            size: last - first + 1,
            type_id: guid(&e[..16]),
            uuid: guid(&e[16..32]),
            name: String::from_utf16(&units).ok()?,
        });
    }
    Some(Table {
        label: "gpt".to_string(),
        sector_size: Some(sector),
        first_lba: Some(header.first_lba),
        last_lba: Some(header.last_lba),
        partitions,
    })
}

/// A GUID as GPT stores it (the first three fields little-endian), in the
/// upper-case text form.
fn guid(b: &[u8]) -> String {
    let hex = |bytes: &mut dyn Iterator<Item = &u8>| -> String {
        bytes.map(|x| format!("{x:02X}")).collect()
    };
    format!(
        "{}-{}-{}-{}-{}",
        hex(&mut b[0..4].iter().rev()),
        hex(&mut b[4..6].iter().rev()),
        hex(&mut b[6..8].iter().rev()),
        hex(&mut b[8..10].iter()),
        hex(&mut b[10..16].iter())
    )
}

/// Reads the primary GPT of `disk` (logical sectors of `sector` bytes).
/// `Ok(None)` when there is no intact one. Blocking: an open, two reads.
pub fn read(disk: &Path, sector: u64) -> std::io::Result<Option<Table>> {
    read_from(&std::fs::File::open(disk)?, sector)
}

/// [`read`] from a disk already open.
pub fn read_from(file: &std::fs::File, sector: u64) -> std::io::Result<Option<Table>> {
    let s = usize::try_from(sector).unwrap_or(0);
    let mut head = vec![0u8; 2 * s];
    file.read_exact_at(&mut head, 0)?;
    let Some(header) = parse_header(&head, s) else {
        return Ok(None);
    };
    // Bounded by MAX_ARRAY_BYTES.
    let mut array = vec![0u8; header.array_bytes() as usize];
    let Some(offset) = header.entries_lba.checked_mul(sector) else {
        return Ok(None);
    };
    file.read_exact_at(&mut array, offset)?;
    Ok(parse_entries(&header, &array, sector))
}

/// CRC-32 (IEEE 802.3, reflected), the checksum GPT uses.
fn crc32(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    !data.iter().fold(!0u32, |c, b| {
        TABLE[((c ^ u32::from(*b)) & 0xFF) as usize] ^ (c >> 8)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::gpt::parse_sfdisk;

    /// The first sectors of 64 MiB loop disks (512- and 4096-byte sectors)
    /// partitioned by sfdisk, and `sfdisk -J` of the same disks: entry 3
    /// lies before entry 2, one name is not ASCII.
    const DISK_512: &[u8] = include_bytes!("../testdata/gpt-512.bin");
    const JSON_512: &str = include_str!("../testdata/gpt-512.json");
    const DISK_4K: &[u8] = include_bytes!("../testdata/gpt-4096.bin");
    const JSON_4K: &str = include_str!("../testdata/gpt-4096.json");

    fn parse(disk: &[u8], sector: usize) -> Option<Table> {
        let header = parse_header(&disk[..2 * sector], sector)?;
        let at = header.entries_lba as usize * sector;
        parse_entries(&header, &disk[at..], sector as u64)
    }

    proptest::proptest! {
        /// Any entry array whose checksum matches, under any header shape
        /// parse_header lets through, parses or is refused without a panic.
        #[test]
        fn entries_of_any_content_with_a_matching_checksum(
            entries in 0u32..64,
            entry_words in 16u32..64,
            array in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..(64 * 512)),
            lbas in proptest::prelude::any::<(u64, u64, u64)>(),
        ) {
            let entry_bytes = entry_words * 8;
            let len = (entries * entry_bytes) as usize;
            let mut array = array;
            array.resize(len, 0);
            let header = Header {
                first_lba: lbas.0,
                last_lba: lbas.1,
                entries_lba: lbas.2,
                entries,
                entry_bytes,
                entries_crc: crc32(&array),
            };
            if let Some(table) = parse_entries(&header, &array, 512) {
                proptest::prop_assert!(table.partitions.len() <= entries as usize);
            }
        }
    }

    #[test]
    fn crc32_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn reads_what_sfdisk_reports() {
        for (disk, json, sector) in [(DISK_512, JSON_512, 512), (DISK_4K, JSON_4K, 4096)] {
            let want = parse_sfdisk(json).expect("sfdisk json");
            assert_eq!(parse(disk, sector), Some(want), "sector {sector}");
        }
        let t = parse(DISK_512, 512).expect("gpt");
        assert_eq!(t.partitions[2].name, "données");
        assert_eq!(t.partitions[2].number, 3);
    }

    #[test]
    fn anything_doubtful_is_left_to_sfdisk() {
        let flip = |at: usize| {
            let mut d = DISK_512.to_vec();
            d[at] ^= 0x01;
            parse(&d, 512)
        };
        assert!(flip(510).is_none(), "no MBR boot signature");
        assert!(flip(446 + 4).is_none(), "no protective MBR record");
        assert!(flip(512).is_none(), "no GPT signature");
        assert!(flip(512 + 40).is_none(), "header CRC");
        assert!(flip(1024 + 20).is_none(), "entry array CRC");
        // The wrong sector size finds no header.
        assert!(parse(DISK_512, 4096).is_none());
        assert!(parse(&[0u8; 1024], 512).is_none(), "blank disk");
        assert!(parse_header(&DISK_512[..100], 512).is_none(), "short read");
    }
}
