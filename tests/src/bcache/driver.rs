//! What the driver does with each write: register a cache or backing
//! device from its superblock, attach, change the cache mode, detach after
//! a flush, stop, unregister a cache set; and what of it survives a reboot.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::files::{MODES, devnum_of, human, mode_line, put, superblock, take};

/// How long the stand-in takes to flush dirty data on a detach.
const FLUSH_TIME: Duration = Duration::from_millis(40);

/// What survives a reboot: what the driver would have written to a
/// backing device's superblock.
#[derive(Debug, Clone, Default)]
pub(super) struct OnDisk {
    pub(super) mode: Option<String>,
    pub(super) attached_to: Option<String>,
    pub(super) dirty: u64,
}

#[derive(Debug)]
pub(super) struct Backing {
    pub(super) dev_uuid: String,
    pub(super) sb_set: String,
    pub(super) bcache: Option<String>,
    pub(super) attached: Option<String>,
    pub(super) mode: String,
    pub(super) dirty: u64,
    /// A detach waiting for its flush to end.
    pub(super) detaching: Option<Instant>,
}

#[derive(Debug)]
pub(super) struct Emu {
    pub(super) root: PathBuf,
    pub(super) next_minor: u32,
    pub(super) backings: BTreeMap<String, Backing>,
    /// cache-set UUID → the cache device's `major:minor`.
    pub(super) sets: BTreeMap<String, String>,
    pub(super) disk: HashMap<String, OnDisk>,
    pub(super) events: Vec<String>,
}

impl Emu {
    fn dev_dir(&self, dev: &str) -> PathBuf {
        self.root.join(format!("dev/block/{dev}/bcache"))
    }

    pub(super) fn step(&mut self) {
        let fs = self.root.join("fs/bcache");
        for f in ["register", "register_quiet"] {
            if let Some(text) = take(&fs.join(f)) {
                for line in text.lines() {
                    self.register(line.trim());
                }
            }
        }
        let devs: Vec<String> = self.backings.keys().cloned().collect();
        for dev in devs {
            self.backing_step(&dev);
        }
        let sets: Vec<String> = self.sets.keys().cloned().collect();
        for uuid in sets {
            let dir = fs.join(&uuid);
            if take(&dir.join("unregister")).is_some() || take(&dir.join("stop")).is_some() {
                self.unregister(&uuid);
            }
        }
    }

    fn register(&mut self, path: &str) {
        let Some(dev) = devnum_of(path) else {
            self.events
                .push(format!("register {path} refused: no such device"));
            return;
        };
        if self.dev_dir(&dev).exists() {
            self.events.push(format!("register {path} refused: busy"));
            return;
        }
        let Some((backing, dev_uuid, set, mode)) = superblock(path) else {
            self.events
                .push(format!("register {path} refused: not a bcache device"));
            return;
        };
        // The kernel's write(2) to `register` returns with the device set
        // up (and auto-attached): a reader never sees half of it. The
        // stand-in builds each directory aside and renames it into place.
        let final_dir = self.dev_dir(&dev);
        let dir = final_dir.with_file_name(".bcache-staging");
        std::fs::create_dir_all(dir.join("stats_total")).expect("device dir");
        if !backing {
            let set_final = self.root.join("fs/bcache").join(&set);
            let set_dir = self.root.join("fs/bcache").join(format!(".staging-{set}"));
            std::fs::create_dir_all(&set_dir).expect("set dir");
            for f in ["unregister", "stop"] {
                std::fs::write(set_dir.join(f), "").expect("set attr");
            }
            std::os::unix::fs::symlink(&final_dir, set_dir.join("cache0")).expect("cache0");
            std::os::unix::fs::symlink(&set_final, dir.join("set")).expect("set link");
            std::fs::rename(&dir, &final_dir).expect("cache device dir in place");
            self.sets.insert(set.clone(), dev);
            self.events.push(format!("register cache {set}"));
            let waiting: Vec<String> = self
                .backings
                .iter()
                .filter(|(_, b)| b.attached.is_none() && b.sb_set == set)
                .map(|(d, _)| d.clone())
                .collect();
            for d in waiting {
                let bdir = self.dev_dir(&d);
                self.attach(&d, &set, &bdir, &set_dir);
            }
            std::fs::rename(&set_dir, &set_final).expect("set dir in place");
            return;
        }
        let on_disk = self.disk.get(&dev_uuid).cloned().unwrap_or_default();
        let mode = on_disk.mode.clone().unwrap_or(mode);
        for f in ["attach", "detach", "stop", "label", "clear_stats"] {
            std::fs::write(dir.join(f), "").expect("attr");
        }
        put(&dir.join("cache_mode"), &mode_line(&mode));
        put(&dir.join("state"), "no cache");
        put(&dir.join("running"), "0");
        put(&dir.join("dirty_data"), &human(on_disk.dirty));
        for f in ["cache_hit_ratio", "cache_hits", "cache_misses"] {
            put(&dir.join("stats_total").join(f), "0");
        }
        self.backings.insert(
            dev.clone(),
            Backing {
                dev_uuid,
                sb_set: set.clone(),
                bcache: None,
                attached: None,
                mode,
                dirty: on_disk.dirty,
                detaching: None,
            },
        );
        self.events.push(format!("register backing {dev}"));
        // A device that was never attached runs at once; one whose
        // superblock says it was waits for its cache (dirty data must not
        // be bypassed).
        if on_disk.attached_to.is_none() {
            self.run(&dev, &dir);
        }
        if self.sets.contains_key(&set) {
            let set_dir = self.root.join("fs/bcache").join(&set);
            self.attach(&dev, &set, &dir, &set_dir);
        }
        std::fs::rename(&dir, &final_dir).expect("backing device dir in place");
    }

    /// Starts the bcache device of `dev`, whose directory is at `dir`.
    fn run(&mut self, dev: &str, dir: &Path) {
        let Some(b) = self.backings.get_mut(dev) else {
            return;
        };
        if b.bcache.is_some() {
            return;
        }
        let minor = self.next_minor;
        self.next_minor += 16;
        let name = format!("bcache{}", minor / 16);
        let block = self.root.join("block").join(&name);
        std::fs::create_dir_all(&block).expect("block dir");
        put(&block.join("dev"), &format!("251:{minor}"));
        std::os::unix::fs::symlink(&block, dir.join("dev")).expect("dev link");
        put(&dir.join("running"), "1");
        b.bcache = Some(name);
    }

    /// Attaches `dev` (its directory at `dir`) to `set` (at `set_dir`).
    fn attach(&mut self, dev: &str, set: &str, dir: &Path, set_dir: &Path) {
        let set_final = self.root.join("fs/bcache").join(set);
        let final_dir = self.dev_dir(dev);
        let Some(b) = self.backings.get_mut(dev) else {
            return;
        };
        if b.attached.is_some() || !set_dir.exists() {
            self.events.push(format!("attach {dev} {set} refused"));
            return;
        }
        std::os::unix::fs::symlink(&set_final, dir.join("cache")).expect("cache link");
        let _ = std::os::unix::fs::symlink(final_dir, set_dir.join("bdev0"));
        b.attached = Some(set.to_string());
        put(
            &dir.join("state"),
            if b.dirty > 0 { "dirty" } else { "clean" },
        );
        let uuid = b.dev_uuid.clone();
        self.disk.entry(uuid).or_default().attached_to = Some(set.to_string());
        self.events.push(format!("attach {dev} {set}"));
        self.run(dev, dir);
    }

    fn backing_step(&mut self, dev: &str) {
        let dir = self.dev_dir(dev);
        if let Some(set) = take(&dir.join("attach")) {
            let set_dir = self.root.join("fs/bcache").join(&set);
            self.attach(dev, &set, &dir, &set_dir);
        }
        // Empty: a write has truncated the file and not yet written.
        if let Ok(text) = std::fs::read_to_string(dir.join("cache_mode"))
            && !text.contains('[')
            && !text.trim().is_empty()
        {
            let word = text.trim();
            let b = self.backings.get_mut(dev).expect("backing");
            if MODES.contains(&word) {
                b.mode = word.to_string();
                let uuid = b.dev_uuid.clone();
                self.disk.entry(uuid).or_default().mode = Some(word.to_string());
                self.events.push(format!("cache_mode {dev} {word}"));
            } else {
                self.events
                    .push(format!("cache_mode {dev} {word:?} refused"));
            }
            let line = mode_line(&self.backings[dev].mode);
            put(&dir.join("cache_mode"), &line);
        }
        if take(&dir.join("detach")).is_some() {
            let b = self.backings.get_mut(dev).expect("backing");
            if b.attached.is_some() {
                b.detaching = Some(Instant::now());
            }
        }
        let flushed = self.backings[dev]
            .detaching
            .is_some_and(|t| self.backings[dev].dirty == 0 || t.elapsed() >= FLUSH_TIME);
        if flushed {
            self.finish_detach(dev);
        }
        if take(&dir.join("stop")).is_some() {
            self.stop(dev);
        }
    }

    fn finish_detach(&mut self, dev: &str) {
        let dir = self.dev_dir(dev);
        let b = self.backings.get_mut(dev).expect("backing");
        let flushed = b.dirty;
        b.dirty = 0;
        b.detaching = None;
        let set = b.attached.take();
        let uuid = b.dev_uuid.clone();
        let _ = std::fs::remove_file(dir.join("cache"));
        if let Some(set) = &set {
            let _ = std::fs::remove_file(self.root.join("fs/bcache").join(set).join("bdev0"));
        }
        put(&dir.join("dirty_data"), "0.0k");
        put(&dir.join("state"), "no cache");
        let d = self.disk.entry(uuid).or_default();
        d.attached_to = None;
        d.dirty = 0;
        self.events.push(format!("detach {dev} flushed {flushed}"));
    }

    fn stop(&mut self, dev: &str) {
        let Some(b) = self.backings.remove(dev) else {
            return;
        };
        let _ = std::fs::remove_dir_all(self.root.join(format!("dev/block/{dev}")));
        if let Some(name) = b.bcache {
            let _ = std::fs::remove_dir_all(self.root.join("block").join(name));
        }
        if let Some(set) = b.attached {
            let _ = std::fs::remove_file(self.root.join("fs/bcache").join(set).join("bdev0"));
        }
        self.disk.entry(b.dev_uuid).or_default().dirty = b.dirty;
        self.events.push(format!("stop {dev}"));
    }

    fn unregister(&mut self, set: &str) {
        let attached: Vec<String> = self
            .backings
            .iter()
            .filter(|(_, b)| b.attached.as_deref() == Some(set))
            .map(|(d, _)| d.clone())
            .collect();
        for d in attached {
            self.finish_detach(&d);
        }
        if let Some(dev) = self.sets.remove(set) {
            let _ = std::fs::remove_dir_all(self.root.join(format!("dev/block/{dev}")));
        }
        let _ = std::fs::remove_dir_all(self.root.join("fs/bcache").join(set));
        self.events.push(format!("unregister {set}"));
    }
}
