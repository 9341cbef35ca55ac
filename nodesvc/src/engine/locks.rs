//! Per-volume operation locks: the workspace's one busy lock
//! ([`carina_sys::busy`]), a refusal being [`Error::Busy`] (ABORTED on the
//! wire) instead of queueing behind the first operation.

use carina_sys::busy::{BusyNames, Held};

use super::error::{Error, Result};

/// The set of volume names with an operation in progress.
#[derive(Debug, Default, Clone)]
pub struct VolumeLocks(BusyNames);

impl VolumeLocks {
    /// Takes the lock for `name`, or `Busy` if it is held; released when
    /// the guard drops.
    pub fn try_lock(&self, name: &str) -> Result<Held> {
        self.0.try_hold(name).ok_or_else(|| Error::Busy {
            name: name.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_name_is_error_busy() {
        let locks = VolumeLocks::default();
        let g = locks.try_lock("a").expect("free");
        assert!(matches!(locks.try_lock("a"), Err(Error::Busy { .. })));
        drop(g);
        locks.try_lock("a").expect("released on drop");
    }
}
