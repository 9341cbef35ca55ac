//! The one per-volume busy lock of the workspace: a second operation on a
//! name that is busy is refused at once instead of queueing behind the
//! first (on the wire `ABORTED`, so the caller retries with backoff). The
//! CSI controller and node services and the node's engine all use it; each
//! turns a refusal into its own error. It lives here, below both, so the
//! engine takes it without depending on the CSI crate.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

/// The names with an operation in progress. Clones share the set.
#[derive(Debug, Clone, Default)]
pub struct BusyNames(Arc<Mutex<HashSet<String>>>);

/// Held while the operation on its name runs; releases the name on drop
/// (also when the call is cancelled).
#[derive(Debug)]
pub struct Held {
    set: Arc<Mutex<HashSet<String>>>,
    name: String,
}

impl BusyNames {
    /// Takes `name`, or `None` while another holder has it.
    pub fn try_hold(&self, name: &str) -> Option<Held> {
        // Insert and remove are single calls: a panic elsewhere while the
        // lock was held cannot leave the set half-changed, so a poisoned
        // lock is safe to use.
        let mut set = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        set.insert(name.to_string()).then(|| Held {
            set: self.0.clone(),
            name: name.to_string(),
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.name);
    }
}

/// The message of a refusal, the same wherever it is reported.
pub fn busy_message(name: &str) -> String {
    format!("an operation on volume {name:?} is already in progress")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_hold_is_refused_until_release() {
        let names = BusyNames::default();
        let a = names.try_hold("a").expect("free");
        assert!(names.try_hold("a").is_none());
        let _b = names.clone().try_hold("b").expect("other names are free");
        drop(a);
        names.try_hold("a").expect("released on drop");
    }
}
