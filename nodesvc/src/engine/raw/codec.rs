//! The GPT partition name codec: how a volume name becomes the name and
//! unique GUID of its partition, and how a partition entry is recognised
//! as ours ([`owner_of`]). Pure functions, no I/O.

use sha2::{Digest, Sha256};

use super::record::Slot;
use crate::engine::disks::PARTITION_PREFIX;
use crate::engine::gpt;
use crate::engine::names;

/// Keeps our GUIDs apart from any other name-based UUIDs.
const GUID_DOMAIN: &[u8] = b"carina.storage.io/raw-partition\0";

/// The GPT name of `volume`'s partition: `carina.io/` and as much of the
/// name as fits in 36 UTF-16 units.
pub fn partition_name(volume: &str) -> String {
    let mut out = String::from(PARTITION_PREFIX);
    let mut units = PARTITION_PREFIX.encode_utf16().count();
    for c in volume.chars() {
        if units + c.len_utf16() > gpt::NAME_UNITS {
            break;
        }
        units += c.len_utf16();
        out.push(c);
    }
    out
}

/// True if the whole name fits in the partition name.
pub fn name_fits(volume: &str) -> bool {
    partition_name(volume).len() == PARTITION_PREFIX.len() + volume.len()
}

/// The unique partition GUID of `volume`'s partition: the first 128 bits
/// of SHA-256 over a fixed domain string and the full name, marked as a
/// version 8 (custom) UUID, in upper case.
pub fn volume_guid(volume: &str) -> String {
    let digest = Sha256::new()
        .chain_update(GUID_DOMAIN)
        .chain_update(volume.as_bytes())
        .finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02X}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The owner of a partition entry, if it is ours: the slot's volume when
/// the slot verifies, else the name after the prefix when that verifies.
/// `exclusive` is `None` when no slot said.
pub(super) fn owner_of(
    entry: &gpt::Partition,
    slot: Option<&Slot>,
) -> Option<(String, Option<bool>)> {
    let rest = entry.name.strip_prefix(PARTITION_PREFIX)?;
    let verifies = |v: &str| {
        partition_name(v) == entry.name && volume_guid(v).eq_ignore_ascii_case(&entry.uuid)
    };
    if let Some(s) = slot
        && verifies(&s.volume)
    {
        return Some((s.volume.clone(), Some(s.exclusive)));
    }
    if names::check_volume_name(rest).is_ok() && verifies(rest) {
        return Some((rest.to_string(), None));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::raw::fixtures::{entry, ours};

    #[test]
    fn partition_names_keep_what_fits() {
        assert_eq!(partition_name("pvc-1"), "carina.io/pvc-1");
        assert!(name_fits("pvc-1"));
        let exact = "a".repeat(26);
        assert_eq!(partition_name(&exact).encode_utf16().count(), 36);
        assert!(name_fits(&exact));
        let long = "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        assert_eq!(partition_name(long), "carina.io/pvc-0a1b2c3d-4e5f-6789-abc");
        assert!(!name_fits(long));
        // UTF-16 units, not bytes, are counted.
        assert_eq!(
            partition_name(&"é".repeat(30)).encode_utf16().count(),
            gpt::NAME_UNITS
        );
    }

    #[test]
    fn guids_are_deterministic_version_8_uuids() {
        let g = volume_guid("pvc-1");
        assert_eq!(g, volume_guid("pvc-1"));
        assert_ne!(g, volume_guid("pvc-2"));
        assert_eq!(g.len(), 36);
        let groups: Vec<usize> = g.split('-').map(str::len).collect();
        assert_eq!(groups, vec![8, 4, 4, 4, 12]);
        assert!(
            g.chars()
                .all(|c| c == '-' || c.is_ascii_digit() || c.is_ascii_uppercase())
        );
        assert_eq!(&g[14..15], "8", "version nibble: {g}");
        assert!("89AB".contains(&g[19..20]), "variant: {g}");
        // Two names that truncate alike still get different GUIDs.
        let a = format!("{}-a", "x".repeat(40));
        let b = format!("{}-b", "x".repeat(40));
        assert_eq!(partition_name(&a), partition_name(&b));
        assert_ne!(volume_guid(&a), volume_guid(&b));
    }

    #[test]
    fn ownership_needs_prefix_and_matching_guid() {
        let long = "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        let slot = Slot {
            volume: long.into(),
            exclusive: false,
        };
        // short name: verified from the entry alone
        assert_eq!(
            owner_of(&ours(1, 2048, 2048, "pvc-1"), None),
            Some(("pvc-1".into(), None))
        );
        // long name: only with a slot that verifies
        assert_eq!(owner_of(&ours(1, 2048, 2048, long), None), None);
        assert_eq!(
            owner_of(&ours(1, 2048, 2048, long), Some(&slot)),
            Some((long.into(), Some(false)))
        );
        // a slot naming another volume does not verify
        let other = Slot {
            volume: "pvc-2".into(),
            exclusive: true,
        };
        assert_eq!(
            owner_of(&ours(1, 2048, 2048, "pvc-1"), Some(&other)),
            Some(("pvc-1".into(), None))
        );
        // our prefix with a foreign GUID, and no prefix at all
        let fake = entry(
            1,
            2048,
            2048,
            "carina.io/pvc-1",
            "9D6517F8-604B-4301-9D9D-FD2F348DA90A",
        );
        assert_eq!(owner_of(&fake, None), None);
        let foreign = entry(1, 2048, 2048, "pvc-1", &volume_guid("pvc-1"));
        assert_eq!(owner_of(&foreign, None), None);
        // GUID case does not matter
        let mut lower = ours(1, 2048, 2048, "pvc-1");
        lower.uuid = lower.uuid.to_ascii_lowercase();
        assert!(owner_of(&lower, None).is_some());
    }
}
