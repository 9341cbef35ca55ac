//! Extent arithmetic on a [`VgSnapshot`] for contiguous allocation: free
//! runs, best fit, the free extents after an LV, the byte offset of an LV
//! on its PV (where a loop device exposes it), and keeping the snapshot
//! exact after our own `lvcreate`/`lvremove`. Pure functions.

use std::path::{Path, PathBuf};

use crate::engine::error::{Error, Result};

use super::report::{Lv, Pv, Segment, VgSnapshot};

impl VgSnapshot {
    /// Free segments, smallest first (best fit picks the first that fits).
    fn free_segments(&self) -> Vec<&Segment> {
        let mut free: Vec<&Segment> = self.segments.iter().filter(|s| s.lv.is_none()).collect();
        free.sort_by_key(|s| (s.len, s.pv.clone(), s.start));
        free
    }

    /// The smallest free run of at least `extents`: (pv, first extent).
    pub fn best_fit(&self, extents: u64) -> Option<(PathBuf, u64)> {
        self.free_segments()
            .into_iter()
            .find(|s| s.len >= extents)
            .map(|s| (s.pv.clone(), s.start))
    }

    /// The longest free run, in extents.
    pub fn largest_free_extents(&self) -> u64 {
        self.segments
            .iter()
            .filter(|s| s.lv.is_none())
            .map(|s| s.len)
            .max()
            .unwrap_or(0)
    }

    /// Free extents right after the (single-segment) LV on its PV.
    pub fn free_after(&self, lv: &Lv) -> u64 {
        let Some((pv, start, len)) = lv.segments.last() else {
            return 0;
        };
        let end = start + len;
        self.segments
            .iter()
            .find(|s| s.lv.is_none() && &s.pv == pv && s.start == end)
            .map(|s| s.len)
            .unwrap_or(0)
    }

    fn pv(&self, path: &Path) -> Option<&Pv> {
        self.pvs.iter().find(|p| p.path == path)
    }

    /// Byte offset of an LV's first extent on its PV (loop exposure).
    pub fn byte_offset(&self, lv: &Lv) -> Option<(PathBuf, u64)> {
        let (pv, start, _) = lv.segments.first()?;
        let pe_start = self.pv(pv)?.pe_start;
        Some((pv.clone(), pe_start + start * self.extent_size))
    }

    /// Where a loop device exposes `lv`: its PV and the byte offset of its
    /// first extent. Loop exposure needs the LV in one contiguous segment.
    pub(super) fn loop_window(&self, lv: &Lv) -> Result<(PathBuf, u64)> {
        if lv.segments.len() != 1 {
            return Err(Error::FailedPrecondition {
                operation: "loop activation",
                name: lv.name.clone(),
                reason: format!(
                    "LV has {} segments; loop exposure needs one contiguous segment",
                    lv.segments.len()
                ),
            });
        }
        self.byte_offset(lv).ok_or_else(|| {
            Error::parse(
                format!("segments of LV {}", lv.name),
                "no PV for its first segment",
            )
        })
    }

    /// Records an allocation we just made (keeps the cache exact without
    /// asking LVM again).
    pub(super) fn allocate(
        &mut self,
        name: &str,
        pv: &Path,
        start: u64,
        extents: u64,
        tags: Vec<String>,
    ) {
        if let Some(i) = self.segments.iter().position(|s| {
            s.lv.is_none() && s.pv == pv && s.start <= start && start + extents <= s.start + s.len
        }) {
            let free = self.segments.remove(i);
            let mut parts = Vec::new();
            if start > free.start {
                parts.push(Segment {
                    pv: pv.to_path_buf(),
                    start: free.start,
                    len: start - free.start,
                    lv: None,
                });
            }
            parts.push(Segment {
                pv: pv.to_path_buf(),
                start,
                len: extents,
                lv: Some(name.to_string()),
            });
            let end = free.start + free.len;
            if start + extents < end {
                parts.push(Segment {
                    pv: pv.to_path_buf(),
                    start: start + extents,
                    len: end - start - extents,
                    lv: None,
                });
            }
            for (k, p) in parts.into_iter().enumerate() {
                self.segments.insert(i + k, p);
            }
        }
        let lv = self.lvs.entry(name.to_string()).or_insert_with(|| Lv {
            name: name.to_string(),
            size: 0,
            tags,
            segments: Vec::new(),
        });
        lv.segments.push((pv.to_path_buf(), start, extents));
        lv.size += extents * self.extent_size;
        self.free = self.free.saturating_sub(extents * self.extent_size);
    }

    /// Records the removal of an LV.
    pub(super) fn release(&mut self, name: &str) {
        if let Some(lv) = self.lvs.remove(name) {
            self.free += lv.size;
        }
        for s in &mut self.segments {
            if s.lv.as_deref() == Some(name) {
                s.lv = None;
            }
        }
        // Merge neighbouring free runs on the same PV.
        self.segments.sort_by_key(|s| (s.pv.clone(), s.start));
        let mut merged: Vec<Segment> = Vec::with_capacity(self.segments.len());
        for s in self.segments.drain(..) {
            match merged.last_mut() {
                Some(prev)
                    if prev.lv.is_none()
                        && s.lv.is_none()
                        && prev.pv == s.pv
                        && prev.start + prev.len == s.start =>
                {
                    prev.len += s.len;
                }
                _ => merged.push(s),
            }
        }
        self.segments = merged;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::lvm::{OWNER_TAG, parse_pvsegs};

    const PVSEGS: &str = include_str!("../testdata/pvs_segments.json");

    #[test]
    fn placement_on_the_real_report() {
        let s = parse_pvsegs(PVSEGS).expect("parses");
        assert_eq!(s.largest_free_extents(), 205);
        // best fit prefers the smaller free run that is large enough
        assert_eq!(s.best_fit(100), Some((PathBuf::from("/dev/loop1"), 0)));
        assert_eq!(s.best_fit(200), Some((PathBuf::from("/dev/loop0"), 50)));
        assert_eq!(s.best_fit(206), None);
        let lv3 = &s.lvs["lv3"];
        assert_eq!(
            s.byte_offset(lv3),
            Some((PathBuf::from("/dev/loop0"), (1 << 20) + 25 * (4 << 20)))
        );
        assert_eq!(s.free_after(lv3), 205);
        assert_eq!(s.free_after(&s.lvs["lv1"]), 0);
    }

    #[test]
    fn loop_window_needs_one_segment() {
        let s = parse_pvsegs(PVSEGS).expect("parses");
        let lv3 = &s.lvs["lv3"];
        assert_eq!(
            s.loop_window(lv3).expect("one segment"),
            s.byte_offset(lv3).expect("offset")
        );
        let mut split = lv3.clone();
        split.segments.push((PathBuf::from("/dev/loop1"), 0, 5));
        assert!(matches!(
            s.loop_window(&split),
            Err(Error::FailedPrecondition {
                operation: "loop activation",
                ..
            })
        ));
        let mut nowhere = lv3.clone();
        nowhere.segments = vec![(PathBuf::from("/dev/none"), 0, 5)];
        assert!(s.loop_window(&nowhere).is_err());
    }

    #[test]
    fn allocate_and_release_keep_the_picture_exact() {
        let mut s = parse_pvsegs(PVSEGS).expect("parses");
        let before = s.clone();
        s.allocate(
            "new",
            Path::new("/dev/loop0"),
            60,
            10,
            vec![OWNER_TAG.into()],
        );
        assert_eq!(s.free, before.free - 10 * (4 << 20));
        assert_eq!(s.lvs["new"].size, 10 * (4 << 20));
        let free0: Vec<_> = s
            .segments
            .iter()
            .filter(|x| x.lv.is_none() && x.pv == Path::new("/dev/loop0"))
            .map(|x| (x.start, x.len))
            .collect();
        assert_eq!(free0, vec![(50, 10), (70, 185)]);
        s.release("new");
        assert_eq!(s.free, before.free);
        assert_eq!(s.largest_free_extents(), 205);
        assert!(!s.lvs.contains_key("new"));
    }
}
