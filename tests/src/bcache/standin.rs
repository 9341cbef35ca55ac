//! The stand-in's handle: the sysfs folder, the thread that answers
//! writes to it, and what a test asks of the driver (its events, a
//! reboot, dirty data, an administrator's write).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::driver::Emu;
use super::files::{human, put};

const POLL: Duration = Duration::from_millis(2);

/// The stand-in; dropping it stops its thread and removes the folder.
#[derive(Debug)]
pub struct KernelStandIn {
    dir: tempfile::TempDir,
    emu: Arc<Mutex<Emu>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KernelStandIn {
    /// A driver with nothing registered.
    pub fn new() -> KernelStandIn {
        let dir = tempfile::Builder::new()
            .prefix("carina-sysfs-")
            .tempdir()
            .expect("tempdir");
        let root = dir.path().to_path_buf();
        std::fs::create_dir_all(root.join("fs/bcache")).expect("fs/bcache");
        for f in ["register", "register_quiet"] {
            std::fs::write(root.join("fs/bcache").join(f), "").expect("register");
        }
        std::fs::create_dir_all(root.join("dev/block")).expect("dev/block");
        std::fs::create_dir_all(root.join("block")).expect("block");
        let emu = Arc::new(Mutex::new(Emu {
            root,
            next_minor: 0,
            backings: BTreeMap::new(),
            sets: BTreeMap::new(),
            disk: HashMap::new(),
            events: Vec::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let emu = emu.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    emu.lock().unwrap_or_else(|p| p.into_inner()).step();
                    std::thread::sleep(POLL);
                }
            })
        };
        KernelStandIn {
            dir,
            emu,
            stop,
            thread: Some(thread),
        }
    }

    /// The sysfs root to give the engine.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    fn emu(&self) -> std::sync::MutexGuard<'_, Emu> {
        self.emu.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the driver did, in order (`register cache <uuid>`, `attach
    /// <dev> <uuid>`, `cache_mode <dev> writeback`, `detach <dev> flushed
    /// <n>`, `stop <dev>`, `unregister <uuid>`, `reboot`, refusals).
    pub fn events(&self) -> Vec<String> {
        self.emu().events.clone()
    }

    /// Forgets every registration, as a reboot does; what the driver wrote
    /// to the superblocks (mode, attachment, dirty data) stays.
    pub fn reboot(&self) {
        let mut emu = self.emu();
        let root = emu.root.clone();
        for (dev, b) in std::mem::take(&mut emu.backings) {
            let on_disk = emu.disk.entry(b.dev_uuid.clone()).or_default();
            on_disk.dirty = b.dirty;
            let _ = std::fs::remove_dir_all(root.join(format!("dev/block/{dev}")));
            if let Some(name) = b.bcache {
                let _ = std::fs::remove_dir_all(root.join("block").join(name));
            }
        }
        for (uuid, dev) in std::mem::take(&mut emu.sets) {
            let _ = std::fs::remove_dir_all(root.join("fs/bcache").join(uuid));
            let _ = std::fs::remove_dir_all(root.join(format!("dev/block/{dev}")));
        }
        emu.events.push("reboot".into());
    }

    /// Gives the backing device `major:minor` `bytes` of dirty data (as
    /// writes in writeback mode would) and a hit ratio.
    pub fn make_dirty(&self, dev: &str, bytes: u64, hit_ratio: u32) {
        let mut emu = self.emu();
        let root = emu.root.clone();
        let b = emu
            .backings
            .get_mut(dev)
            .expect("registered backing device");
        b.dirty = bytes;
        let dir = root.join(format!("dev/block/{dev}/bcache"));
        put(&dir.join("dirty_data"), &human(bytes));
        put(
            &dir.join("state"),
            if bytes > 0 { "dirty" } else { "clean" },
        );
        put(
            &dir.join("stats_total/cache_hit_ratio"),
            &hit_ratio.to_string(),
        );
    }

    /// Writes `value` to the attribute `rel` of the backing device
    /// `major:minor`, as an administrator would.
    pub fn write(&self, dev: &str, rel: &str, value: &str) {
        let path = self.root().join(format!("dev/block/{dev}/bcache/{rel}"));
        std::fs::write(&path, value).expect("attribute");
    }

    /// Whether `major:minor` is registered.
    pub fn registered(&self, dev: &str) -> bool {
        self.root().join(format!("dev/block/{dev}/bcache")).exists()
    }
}

impl Default for KernelStandIn {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for KernelStandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
