//! Faults to put under an engine on real loop devices, and what the fault
//! tests start from: an `lvm` shell stopped until dropped ([`Stopped`]), a
//! disk that goes to 0 bytes and comes back ([`Vanished`]), an engine with
//! an LVM and a RAW group holding data ([`TwoGroups`]), and the per-volume
//! data pattern that shows a volume's bytes were kept.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use carina_node::engine::health;
use carina_node::engine::{CreateRequest, Engine, Volume};

use crate::engine::engine_for;
use crate::{LoopDisk, VgGuard, have_root, run, unique, wait_until};

const MIB: u64 = 1 << 20;

/// The longest any wait of the fault tests may take before the test
/// fails.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// How much data each volume gets before the fault.
pub const DATA: usize = MIB as usize;

/// `len` bytes that differ per `seed` (xorshift), so one volume's data
/// is never mistaken for another's.
pub fn pattern(seed: &str, len: usize) -> Vec<u8> {
    let mut x = seed.bytes().fold(0x9e37_79b9_7f4a_7c15_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[0]
        })
        .collect()
}

/// Writes `seed`'s pattern at the start of `dev` and syncs it.
pub fn write_data(dev: &Path, seed: &str) {
    let mut f = File::options()
        .write(true)
        .open(dev)
        .unwrap_or_else(|e| panic!("open {}: {e}", dev.display()));
    f.write_all(&pattern(seed, DATA)).expect("write");
    f.sync_all().expect("sync");
}

/// The block device of `v`.
pub fn device(v: &Volume) -> PathBuf {
    v.device_path.clone().expect("a block device")
}

/// The state letter of `pid` (`R`, `S`, `T`, `Z` …) and its command name,
/// if it runs.
pub fn proc_state(pid: u32) -> Option<(char, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(") ")?;
    let comm = head.split_once('(')?.1.to_string();
    Some((rest.chars().next()?, comm))
}

/// An `lvm` shell stopped (SIGSTOP) until dropped: every command sent to
/// it hangs unread. A shell the runner killed meanwhile is left alone.
#[derive(Debug)]
pub struct Stopped(u32);

impl Stopped {
    pub async fn stop(pid: u32) -> Stopped {
        assert_eq!(proc_state(pid).map(|s| s.1), Some("lvm".to_string()));
        run("kill", &["-STOP", &pid.to_string()]).expect("SIGSTOP the shell");
        let stopped = Stopped(pid);
        wait_until("the shell is stopped", PATIENCE, || {
            proc_state(pid).is_some_and(|s| s.0 == 'T')
        })
        .await
        .expect("the wait");
        stopped
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if proc_state(self.0).is_some_and(|(state, comm)| state == 'T' && comm == "lvm") {
            let _ = run("kill", &["-CONT", &self.0.to_string()]);
        }
    }
}

/// The disk of an LVM group goes to 0 bytes under it (its loop device's
/// file emptied and the capacity re-read, as a detached loop device or a
/// removed medium shows; the device number stays ours, so the disk can
/// come back). Put back, the group works again.
#[derive(Debug)]
pub struct Vanished<'a> {
    disk: &'a LoopDisk,
    saved: PathBuf,
}

impl<'a> Vanished<'a> {
    pub fn vanish(disk: &'a LoopDisk) -> Vanished<'a> {
        let file = disk.file().to_string_lossy().into_owned();
        let saved = disk.file().with_file_name("saved.img");
        let saved_s = saved.to_string_lossy().into_owned();
        run("cp", &["--sparse=always", &file, &saved_s]).expect("save the disk");
        File::options()
            .write(true)
            .open(disk.file())
            .and_then(|f| f.set_len(0))
            .expect("empty the disk's file");
        run("losetup", &["-c", &disk.dev()]).expect("re-read the capacity");
        assert_eq!(crate::blockdev_size(&disk.path), 0, "the disk is gone");
        Vanished { disk, saved }
    }

    /// The disk with its old content again.
    pub fn restore(self) {
        let file = self.disk.file().to_string_lossy().into_owned();
        let saved = self.saved.to_string_lossy().into_owned();
        // Into the same inode, which the loop device holds.
        run("cp", &["--sparse=always", &saved, &file]).expect("restore the disk");
        run("losetup", &["-c", &self.disk.dev()]).expect("re-read the capacity");
        assert!(crate::blockdev_size(&self.disk.path) > 0);
        let _ = std::fs::remove_file(&self.saved);
    }
}

/// The engine configuration of an LVM group on `lvm_disk` and a RAW
/// group on `raw_disk`.
pub fn two_groups(
    lvm_group: &str,
    lvm_disk: &LoopDisk,
    raw_group: &str,
    raw_disk: &LoopDisk,
) -> String {
    let group = |name: &str, policy: &str, disk: &LoopDisk| {
        format!(
            r#"{{"name":"{name}","re":["{}"],"policy":"{policy}","reserveBytes":0,"minDiskBytes":1048576}}"#,
            disk.pattern()
        )
    };
    format!(
        r#"{{"diskSelector":[{},{}],"diskScanInterval":"0"}}"#,
        group(lvm_group, "LVM", lvm_disk),
        group(raw_group, "RAW", raw_disk)
    )
}

/// A shared create of `name`, `size` bytes in `group`.
pub fn req(name: &str, group: &str, size: u64) -> CreateRequest {
    CreateRequest {
        name: name.into(),
        group: group.into(),
        size_bytes: size,
        exclusive: false,
    }
}

/// Two groups of one engine: LVM on one disk, RAW on another, each with
/// a 16 MiB volume (`on-lvm`, `on-raw`) holding data. Fields drop in
/// order: the engine, the VG, then the disks.
#[derive(Debug)]
pub struct TwoGroups {
    pub engine: Engine,
    pub lvm_group: String,
    pub raw_group: String,
    pub lv: Volume,
    pub part: Volume,
    _vg: VgGuard,
    pub lvm_disk: LoopDisk,
    pub raw_disk: LoopDisk,
}

impl TwoGroups {
    pub async fn new(test: &str) -> Option<TwoGroups> {
        if !have_root(test) {
            return None;
        }
        let lvm_disk = LoopDisk::new(128 * MIB).expect("loop disk");
        let raw_disk = LoopDisk::new(128 * MIB).expect("loop disk");
        let lvm_group = unique("lvm");
        let raw_group = unique("raw");
        let vg = VgGuard::new(&lvm_group, &[&lvm_disk]);
        let config = two_groups(&lvm_group, &lvm_disk, &raw_group, &raw_disk);
        let engine = engine_for(&config, None).await;
        let lv = engine
            .create_volume(req("on-lvm", &lvm_group, 16 * MIB))
            .await
            .expect("create on LVM");
        let part = engine
            .create_volume(req("on-raw", &raw_group, 16 * MIB))
            .await
            .expect("create on RAW");
        write_data(&device(&lv), "on-lvm");
        write_data(&device(&part), "on-raw");
        assert_eq!(health::condition(&lv).await, health::Condition::default());
        Some(TwoGroups {
            engine,
            lvm_group,
            raw_group,
            lv,
            part,
            _vg: vg,
            lvm_disk,
            raw_disk,
        })
    }
}
