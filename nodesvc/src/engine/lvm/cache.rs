//! The group's cached picture of its VG ([`VgSnapshot`]), kept exact by
//! our own changes so a create or delete needs no `pvs` first, and the
//! rule that lets reads refresh it beside those changes.
//!
//! Changes of a group are serialised by the engine; reads (list, get,
//! capacity) are not. A refresh therefore keeps what it read only if no
//! change began or ended while it read: a report taken just before an
//! lvcreate would hide the new LV, and one taken just after it would be
//! applied a second time by the change's own update.

use std::sync::Mutex;

use super::report::VgSnapshot;

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct VgCache {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    snapshot: Option<VgSnapshot>,
    /// The VG's extent size as last read. Unlike the snapshot it survives
    /// invalidation (a VG's extent size does not change), so sizes are
    /// always rounded to the real unit.
    extent_size: Option<u64>,
    /// Bumped whenever a change starts or ends.
    generation: u64,
    /// Between the start of a change's command and its end.
    changing: bool,
}

impl VgCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The picture, if one is cached.
    pub(super) fn get(&self) -> Option<VgSnapshot> {
        self.lock().snapshot.clone()
    }

    /// The extent size last read, if any.
    pub(super) fn extent_size(&self) -> Option<u64> {
        self.lock().extent_size
    }

    /// Marks the start of a read; give the mark to [`Self::store`].
    pub(super) fn read_mark(&self) -> u64 {
        self.lock().generation
    }

    /// Keeps `snap`, read since `mark`, unless a change began or ended
    /// meanwhile (its extent size is kept either way).
    pub(super) fn store(&self, mark: u64, snap: &VgSnapshot) {
        let mut state = self.lock();
        if snap.extent_size > 0 {
            state.extent_size = Some(snap.extent_size);
        }
        if !state.changing && state.generation == mark {
            state.snapshot = Some(snap.clone());
        }
    }

    /// A change of the VG is starting.
    pub(super) fn begin_change(&self) {
        let mut state = self.lock();
        state.changing = true;
        state.generation += 1;
    }

    /// Ends a change that succeeded by applying it to the picture.
    pub(super) fn update<F: FnOnce(&mut VgSnapshot)>(&self, f: F) {
        let mut state = self.lock();
        if let Some(s) = state.snapshot.as_mut() {
            f(s);
        }
        state.changing = false;
        state.generation += 1;
    }

    /// Drops the picture (also ends a change).
    pub(super) fn invalidate(&self) {
        let mut state = self.lock();
        state.snapshot = None;
        state.changing = false;
        state.generation += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(free: u64) -> VgSnapshot {
        VgSnapshot {
            extent_size: 4 << 20,
            free,
            ..VgSnapshot::default()
        }
    }

    #[test]
    fn a_read_that_overlaps_a_change_is_not_kept() {
        let cache = VgCache::default();
        // Read before the change started, stored after it ended.
        let mark = cache.read_mark();
        cache.begin_change();
        cache.invalidate();
        cache.store(mark, &snap(1));
        assert!(cache.get().is_none());
        // Read while the change runs.
        cache.begin_change();
        let mark = cache.read_mark();
        cache.store(mark, &snap(2));
        assert!(cache.get().is_none());
        cache.update(|_| ());
        // A read with no change around it is kept, and so is the extent
        // size of any read.
        let mark = cache.read_mark();
        cache.store(mark, &snap(3));
        assert_eq!(cache.get().map(|s| s.free), Some(3));
        assert_eq!(cache.extent_size(), Some(4 << 20));
    }
}
