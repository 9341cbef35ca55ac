//! Per-volume operation locks: a second operation on a name that is busy
//! fails at once with [`Error::Busy`] (ABORTED on the wire) instead of
//! queueing behind the first.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use super::error::{Error, Result};

/// The set of volume names with an operation in progress.
#[derive(Debug, Default, Clone)]
pub struct VolumeLocks {
    busy: Arc<Mutex<HashSet<String>>>,
}

/// Held while an operation on one volume runs; releases on drop.
#[derive(Debug)]
pub struct VolumeGuard {
    busy: Arc<Mutex<HashSet<String>>>,
    name: String,
}

impl VolumeLocks {
    /// Takes the lock for `name`, or `Busy` if it is held.
    pub fn try_lock(&self, name: &str) -> Result<VolumeGuard> {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        if !busy.insert(name.to_string()) {
            return Err(Error::Busy {
                name: name.to_string(),
            });
        }
        Ok(VolumeGuard {
            busy: self.busy.clone(),
            name: name.to_string(),
        })
    }
}

impl Drop for VolumeGuard {
    fn drop(&mut self) {
        let mut busy = self.busy.lock().unwrap_or_else(|p| p.into_inner());
        busy.remove(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_busy_until_release() {
        let locks = VolumeLocks::default();
        let g = locks.try_lock("a").expect("free");
        assert!(matches!(locks.try_lock("a"), Err(Error::Busy { .. })));
        let _b = locks.try_lock("b").expect("other names are free");
        drop(g);
        locks.try_lock("a").expect("released on drop");
    }
}
