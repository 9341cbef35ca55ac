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
