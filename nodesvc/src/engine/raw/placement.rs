//! Where a new volume goes: pure decisions over the views of the group's
//! disks, best fit for shared volumes, the smallest empty disk for
//! whole-disk ones.

use super::view::DiskView;
use crate::engine::gpt::Extent;
use crate::engine::volume::GroupCapacity;

/// Where a shared volume of `size` bytes goes: the smallest free extent
/// that holds it (earlier disks and extents win ties), provided the group
/// keeps `reserve` bytes free. `Err` carries the largest size that could
/// have been placed.
pub(super) fn choose_shared(
    views: &[DiskView],
    size: u64,
    reserve: u64,
    needs_record: bool,
) -> std::result::Result<(usize, Extent), u64> {
    let free: u64 = views.iter().map(DiskView::free_bytes).sum();
    let allocatable = GroupCapacity::allocatable(free, reserve);
    let mut best: Option<(u64, usize, Extent)> = None;
    let mut largest = 0;
    for (i, v) in views.iter().enumerate() {
        if v.free_number().is_none() || (needs_record && !v.record_usable()) {
            continue;
        }
        for e in v.free() {
            let bytes = v.bytes(e.len);
            largest = largest.max(bytes);
            if bytes >= size && best.is_none_or(|(b, ..)| bytes < b) {
                best = Some((bytes, i, e));
            }
        }
    }
    match best {
        Some((_, i, e)) if size <= allocatable => Ok((
            i,
            Extent {
                start: e.start,
                len: size / views[i].sector,
            },
        )),
        _ => Err(largest.min(allocatable)),
    }
}

/// Where a whole-disk volume of at least `size` bytes goes: the smallest
/// disk without any partition whose aligned area holds it. `Err` carries
/// the largest such area.
pub(super) fn choose_exclusive(
    views: &[DiskView],
    size: u64,
    needs_record: bool,
) -> std::result::Result<(usize, Extent), u64> {
    let mut best: Option<(u64, usize, Extent)> = None;
    let mut largest = 0;
    for (i, v) in views.iter().enumerate() {
        if !v.parts.is_empty() || (needs_record && !v.record_usable()) {
            continue;
        }
        let Some(area) = v.area() else { continue };
        let bytes = v.bytes(area.len);
        largest = largest.max(bytes);
        if bytes >= size && best.is_none_or(|(b, ..)| bytes < b) {
            best = Some((bytes, i, area));
        }
    }
    best.map(|(_, i, e)| (i, e)).ok_or(largest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::gpt;
    use crate::engine::raw::fixtures::{MIB, blank_view, entry, gpt_view, ours};
    use crate::engine::raw::record::SLOTS;

    #[test]
    fn shared_placement_is_best_fit_and_keeps_the_reserve() {
        // loop1: 62 MiB free; loop2: gaps of 1 MiB and 42 MiB (see testdata shape)
        let views = vec![
            blank_view("loop1", 64 * MIB),
            gpt_view(
                "loop2",
                vec![
                    ours(1, 2048, 16384, "a"),
                    ours(2, 18432, 2048, "b"),
                    ours(3, 22528, 20480, "c"),
                ],
                &[],
            ),
        ];
        let free: u64 = views.iter().map(DiskView::free_bytes).sum();
        assert_eq!(free, 62 * MIB + MIB + 42 * MIB);
        // 1 MiB goes into the 1 MiB gap of loop2
        assert_eq!(
            choose_shared(&views, MIB, 0, false),
            Ok((
                1,
                Extent {
                    start: 20480,
                    len: 2048
                }
            ))
        );
        // 40 MiB goes into the 42 MiB gap, not the blank disk
        assert_eq!(
            choose_shared(&views, 40 * MIB, 0, false),
            Ok((
                1,
                Extent {
                    start: 43008,
                    len: 40 * 2048
                }
            ))
        );
        // 50 MiB only fits on the blank disk
        assert_eq!(
            choose_shared(&views, 50 * MIB, 0, false),
            Ok((
                0,
                Extent {
                    start: 2048,
                    len: 50 * 2048
                }
            ))
        );
        // larger than any extent: exhausted, reports the largest extent
        assert_eq!(choose_shared(&views, 63 * MIB, 0, false), Err(62 * MIB));
        // fits an extent but not free - reserve
        let reserve = free - 10 * MIB;
        assert_eq!(
            choose_shared(&views, 11 * MIB, reserve, false),
            Err(10 * MIB)
        );
        assert!(choose_shared(&views, 10 * MIB, reserve, false).is_ok());
        // a reserve above free never underflows
        assert_eq!(choose_shared(&views, MIB, u64::MAX, false), Err(0));
    }

    #[test]
    fn shared_placement_avoids_whole_disk_volumes_and_full_tables() {
        let whole = gpt_view("loop1", vec![ours(1, 2048, 126976, "w")], &[]);
        assert_eq!(whole.free_bytes(), 0);
        let full: Vec<gpt::Partition> = (1..=SLOTS)
            .map(|n| {
                entry(
                    n,
                    10_000 + u64::from(n),
                    1,
                    "x",
                    "9D6517F8-604B-4301-9D9D-FD2F348DA90A",
                )
            })
            .collect();
        let full = gpt_view("loop2", full, &[]);
        assert_eq!(full.free_number(), None);
        let views = vec![whole, full];
        assert!(choose_shared(&views, MIB, 0, false).is_err());
    }

    #[test]
    fn long_names_need_a_usable_record() {
        let covered = gpt_view(
            "loop4",
            vec![entry(
                1,
                34,
                2000,
                "bios",
                "9D6517F8-604B-4301-9D9D-FD2F348DA90A",
            )],
            &[],
        );
        let views = vec![covered];
        assert!(choose_shared(&views, MIB, 0, false).is_ok());
        assert!(choose_shared(&views, MIB, 0, true).is_err());
    }

    #[test]
    fn exclusive_placement_takes_the_smallest_empty_disk() {
        let views = vec![
            blank_view("loop1", 128 * MIB),
            gpt_view("loop2", vec![ours(1, 2048, 2048, "a")], &[]),
            blank_view("loop3", 64 * MIB),
        ];
        assert_eq!(
            choose_exclusive(&views, MIB, false),
            Ok((
                2,
                Extent {
                    start: 2048,
                    len: 62 * 2048
                }
            ))
        );
        assert_eq!(
            choose_exclusive(&views, 100 * MIB, false).map(|c| c.0),
            Ok(0)
        );
        assert_eq!(choose_exclusive(&views, 127 * MIB, false), Err(126 * MIB));
    }
}
