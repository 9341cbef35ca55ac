//! Holding a volume group's own lvm lock from a test: the `flock` lvm
//! takes on `<locking_dir>/V_<vg>` before it reads (shared) or changes
//! (exclusive) the VG. A test holds it to make lvm commands wait, as a
//! hung or slow lvm would, and asks whether a process waits on it.

use std::fs::File;
use std::path::PathBuf;

use crate::run;

/// The VG's lvm lock, held until dropped.
#[derive(Debug)]
pub struct VgLock {
    _file: File,
}

impl VgLock {
    /// Held exclusively: every lvm command on the VG waits.
    pub fn exclusive(vg: &str) -> VgLock {
        let file = lock_file(vg);
        file.lock().expect("lock the VG");
        VgLock { _file: file }
    }

    /// Held shared: lvm reads the VG, a change of it (lvcreate, lvextend,
    /// lvremove) waits.
    pub fn shared(vg: &str) -> VgLock {
        let file = lock_file(vg);
        file.lock_shared().expect("lock the VG shared");
        VgLock { _file: file }
    }
}

fn lock_file(vg: &str) -> File {
    let out = run(
        "lvm",
        &["config", "--typeconfig", "full", "global/locking_dir"],
    )
    .expect("lvm config");
    let dir = out
        .trim()
        .strip_prefix("locking_dir=")
        .expect("locking_dir=...")
        .trim_matches('"');
    std::fs::create_dir_all(dir).expect("the lock dir");
    let path = PathBuf::from(dir).join(format!("V_{vg}"));
    File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// Whether `pid` waits for a file lock (a `->` row of /proc/locks).
pub fn blocked_on_a_lock(pid: u32) -> bool {
    let locks = std::fs::read_to_string("/proc/locks").expect("/proc/locks");
    locks.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.get(1) == Some(&"->") && f.get(5) == Some(&pid.to_string().as_str())
    })
}

/// Whether a process started by `ancestor` (its child, grandchild ...)
/// waits for a file lock: e.g. a node's `lvm` waiting on a held VG lock,
/// which shows that the node is in the middle of the command.
pub fn a_descendant_waits(ancestor: u32) -> bool {
    let locks = std::fs::read_to_string("/proc/locks").expect("/proc/locks");
    locks
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.get(1) != Some(&"->") {
                return None;
            }
            f.get(5)?.parse::<u32>().ok()
        })
        .any(|pid| descends_from(pid, ancestor))
}

/// Whether `ancestor` is `pid`'s parent, grandparent, ... (from /proc).
fn descends_from(mut pid: u32, ancestor: u32) -> bool {
    for _ in 0..64 {
        let Some(parent) = parent_of(pid) else {
            return false;
        };
        if parent == ancestor {
            return true;
        }
        if parent <= 1 {
            return false;
        }
        pid = parent;
    }
    false
}

/// The parent pid of `pid` (field 4 of /proc/<pid>/stat), if it runs.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_descends_from_its_parent_not_from_a_child() {
        let me = std::process::id();
        let parent = parent_of(me).expect("a parent");
        assert!(descends_from(me, parent));
        assert!(!descends_from(parent, me));
        assert!(!a_descendant_waits(me), "nothing of this test waits");
    }
}
