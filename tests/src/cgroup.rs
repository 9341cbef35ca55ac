//! A pod's cgroup as a kubelet with the cgroupfs driver lays it out, made
//! by the test in the real cgroup v1 `blkio` hierarchy:
//! `<blkio>/<unique root>/kubepods/burstable/pod<uid>/<container>`, and
//! `dd` runs in one of its containers to measure what the kernel lets
//! through. [`PodCgroup`] kills what runs in it and removes every
//! directory it made when dropped, also when the test fails.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::unique;

/// The v1 blkio hierarchy of this machine.
pub const BLKIO: &str = "/sys/fs/cgroup/blkio";

/// A fake pod's cgroup with container cgroups below it.
#[derive(Debug)]
pub struct PodCgroup {
    /// The unique folder under the hierarchy holding everything.
    root: PathBuf,
    pub uid: String,
    pub pod: PathBuf,
}

impl PodCgroup {
    /// A pod cgroup with one container cgroup, `ctr-0`.
    pub fn new() -> PodCgroup {
        let root = Path::new(BLKIO).join(unique("carina-test-cg"));
        let n = root
            .file_name()
            .and_then(|n| n.to_str())
            .map(|n| {
                n.bytes()
                    .fold(0u64, |h, b| h.wrapping_mul(131).wrapping_add(b.into()))
            })
            .unwrap_or(0);
        let uid = format!("c0ffee00-0000-4000-8000-{:012x}", n & 0xffff_ffff_ffff);
        let pod = root.join(format!("kubepods/burstable/pod{uid}"));
        std::fs::create_dir_all(&pod).expect("create the pod cgroup");
        let c = PodCgroup { root, uid, pod };
        c.add_container("ctr-0");
        c
    }

    /// A container cgroup below the pod (as the kubelet makes one per
    /// container).
    pub fn add_container(&self, name: &str) -> PathBuf {
        let dir = self.pod.join(name);
        std::fs::create_dir_all(&dir).expect("create a container cgroup");
        dir
    }

    pub fn container(&self, name: &str) -> PathBuf {
        self.pod.join(name)
    }

    /// Runs `dd args...` inside the container cgroup `name` and returns
    /// the seconds dd itself reports for the copy.
    pub fn dd(&self, name: &str, args: &[&str]) -> f64 {
        let procs = self.container(name).join("cgroup.procs");
        let script = format!(
            "echo $$ > {} && exec dd {} status=none",
            procs.display(),
            args.join(" ")
        );
        let start = std::time::Instant::now();
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .expect("run dd");
        assert!(
            out.status.success(),
            "dd {args:?} in {}: {}{}",
            procs.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        start.elapsed().as_secs_f64()
    }

    /// Removes the pod's cgroup (what the kubelet does when a pod is
    /// deleted).
    pub fn remove_pod(&self) {
        remove_tree(&self.pod);
    }
}

impl Default for PodCgroup {
    fn default() -> Self {
        Self::new()
    }
}

/// Kills every process in the cgroups under `dir` and removes them,
/// deepest first.
fn remove_tree(dir: &Path) {
    if !dir.exists() {
        return;
    }
    let mut dirs = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < dirs.len() {
        if let Ok(entries) = std::fs::read_dir(&dirs[i]) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(e.path());
                }
            }
        }
        i += 1;
    }
    for d in dirs.iter().rev() {
        for _ in 0..50 {
            let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace() {
                let _ = std::process::Command::new("kill")
                    .args(["-9", pid])
                    .status();
            }
            if std::fs::remove_dir(d).is_ok() || !d.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        remove_tree(&self.root);
    }
}
