//! A stand-in for the kernel's bcache driver, for machines without it: a
//! sysfs layout in a temporary folder (the files and links the kernel's
//! bcache documentation describes) and a thread that answers writes to it
//! the way the driver does.
//!
//! What it proves: the engine's sysfs module writes the right values to
//! the right files in the right order (register, attach, cache_mode,
//! detach, stop, unregister), waits for the answers, parses what the
//! driver shows (state, cache_mode, dirty_data, hit ratio, the bcache
//! device's numbers), and re-assembles after a "reboot". Superblocks are
//! real: the stand-in reads them with the real `bcache-super-show` from
//! the devices the engine registers (formatted by the real
//! `make-bcache`). What it does not prove: that a real kernel accepts
//! those devices, makes `/dev/bcacheN`, moves data, or refuses a write
//! with an error code (the stand-in cannot fail a `write(2)`; it ignores
//! a refused write, so the engine sees a timeout instead of `EINVAL`).
//! With `CARINA_TEST_BCACHE_KERNEL=1`, fixtures made by
//! [`BcacheFixture::new`] run the same flow against `/sys` on a machine
//! that has the driver; [`BcacheFixture::with_stand_in`] keeps the
//! stand-in.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::run;

/// How long the stand-in takes to flush dirty data on a detach.
const FLUSH_TIME: Duration = Duration::from_millis(40);
const POLL: Duration = Duration::from_millis(2);
const MODES: [&str; 4] = ["writethrough", "writeback", "writearound", "none"];

/// The stand-in; dropping it stops its thread and removes the folder.
#[derive(Debug)]
pub struct KernelStandIn {
    dir: tempfile::TempDir,
    emu: Arc<Mutex<Emu>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What survives a reboot: what the driver would have written to a
/// backing device's superblock.
#[derive(Debug, Clone, Default)]
struct OnDisk {
    mode: Option<String>,
    attached_to: Option<String>,
    dirty: u64,
}

#[derive(Debug)]
struct Backing {
    dev_uuid: String,
    sb_set: String,
    bcache: Option<String>,
    attached: Option<String>,
    mode: String,
    dirty: u64,
    /// A detach waiting for its flush to end.
    detaching: Option<Instant>,
}

#[derive(Debug)]
struct Emu {
    root: PathBuf,
    next_minor: u32,
    backings: BTreeMap<String, Backing>,
    /// cache-set UUID → the cache device's `major:minor`.
    sets: BTreeMap<String, String>,
    disk: HashMap<String, OnDisk>,
    events: Vec<String>,
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

/// Replaces a value file in one step, so a reader never sees it empty.
fn put(path: &Path, value: &str) {
    let tmp = path.with_extension("standin-tmp");
    std::fs::write(&tmp, format!("{value}\n")).expect("write attribute");
    std::fs::rename(&tmp, path).expect("replace attribute");
}

/// The text written to a trigger file since it was last emptied.
fn take(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let text = text.trim().to_string();
    if text.is_empty() {
        return None;
    }
    std::fs::write(path, "").ok()?;
    Some(text)
}

fn human(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes}");
    }
    let units = ['k', 'M', 'G', 'T'];
    let mut v = bytes as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1}{}", units[u])
}

fn mode_line(mode: &str) -> String {
    MODES
        .iter()
        .map(|m| {
            if *m == mode {
                format!("[{m}]")
            } else {
                m.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The superblock fields the stand-in needs, read its own way from the
/// real `bcache-super-show` (not with the engine's parser).
fn superblock(path: &str) -> Option<(bool, String, String, String)> {
    let out = run("bcache-super-show", &[path]).ok()?;
    let field = |k: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(k))
            .map(|l| l[k.len()..].trim().to_string())
    };
    let backing = field("sb.version")?.contains("backing");
    let mode = field("dev.data.cache_mode")
        .and_then(|m| {
            MODES
                .iter()
                .find(|x| m.contains(&format!("[{x}]")))
                .copied()
        })
        .unwrap_or("writethrough");
    Some((
        backing,
        field("dev.uuid")?,
        field("cset.uuid")?,
        mode.to_string(),
    ))
}

fn devnum_of(path: &str) -> Option<String> {
    let rdev = std::fs::metadata(path).ok()?.rdev();
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    Some(format!("{major}:{minor}"))
}

impl Emu {
    fn dev_dir(&self, dev: &str) -> PathBuf {
        self.root.join(format!("dev/block/{dev}/bcache"))
    }

    fn step(&mut self) {
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

/// An engine over two groups on their own loop disks — `hdd` (backing
/// volumes) and `ssd` (cache volumes), each LVM or RAW — with a state
/// directory and the bcache driver of [`KernelStandIn`], or the real one
/// under `/sys` when `CARINA_TEST_BCACHE_KERNEL=1`.
///
/// Fields drop in order: the engine, the stand-in, the state directory,
/// the volume groups, the disks.
#[derive(Debug)]
pub struct BcacheFixture {
    pub engine: carina_node::engine::Engine,
    /// `None`: the real driver under `/sys`.
    pub kernel: Option<KernelStandIn>,
    pub state: tempfile::TempDir,
    pub hdd: String,
    pub ssd: String,
    config: String,
    pub options: carina_node::engine::bcache::BcacheOptions,
    _vgs: Vec<crate::VgGuard>,
    pub disks: Vec<crate::LoopDisk>,
}

/// Whether the opt-in run against the real driver was asked for.
pub fn real_kernel() -> bool {
    std::env::var("CARINA_TEST_BCACHE_KERNEL").is_ok_and(|v| v == "1")
}

impl BcacheFixture {
    /// The fixture with an `hdd` group of `backing_policy` on a disk of
    /// `hdd_bytes` and an `ssd` group of `cache_policy` on one of
    /// `ssd_bytes`; `None` (skip) without root outside CI.
    pub async fn new(
        test: &str,
        backing_policy: &str,
        hdd_bytes: u64,
        cache_policy: &str,
        ssd_bytes: u64,
    ) -> Option<BcacheFixture> {
        let stand_in = !real_kernel();
        Self::build(
            test,
            backing_policy,
            hdd_bytes,
            cache_policy,
            ssd_bytes,
            stand_in,
        )
        .await
    }

    /// [`BcacheFixture::new`] with the stand-in whatever
    /// `CARINA_TEST_BCACHE_KERNEL` says: for a test whose subject is the
    /// control plane's side, which the stand-in proves as well anywhere.
    pub async fn with_stand_in(
        test: &str,
        backing_policy: &str,
        hdd_bytes: u64,
        cache_policy: &str,
        ssd_bytes: u64,
    ) -> Option<BcacheFixture> {
        Self::build(
            test,
            backing_policy,
            hdd_bytes,
            cache_policy,
            ssd_bytes,
            true,
        )
        .await
    }

    async fn build(
        test: &str,
        backing_policy: &str,
        hdd_bytes: u64,
        cache_policy: &str,
        ssd_bytes: u64,
        stand_in: bool,
    ) -> Option<BcacheFixture> {
        if !crate::have_root(test) {
            return None;
        }
        let hdd_disk = crate::LoopDisk::new(hdd_bytes).expect("loop disk");
        let ssd_disk = crate::LoopDisk::new(ssd_bytes).expect("loop disk");
        let hdd = crate::unique("hdd");
        let ssd = crate::unique("ssd");
        let mut vgs = Vec::new();
        if backing_policy == "LVM" {
            vgs.push(crate::VgGuard::new(&hdd, &[&hdd_disk]));
        }
        if cache_policy == "LVM" {
            vgs.push(crate::VgGuard::new(&ssd, &[&ssd_disk]));
        }
        let selector = |name: &str, policy: &str, disk: &crate::LoopDisk| {
            format!(
                r#"{{"name":"{name}","re":["{}"],"policy":"{policy}","reserveBytes":0,"minDiskBytes":1048576}}"#,
                disk.pattern()
            )
        };
        let config = format!(
            r#"{{"diskSelector":[{},{}],"diskScanInterval":"0"}}"#,
            selector(&hdd, backing_policy, &hdd_disk),
            selector(&ssd, cache_policy, &ssd_disk)
        );
        let kernel = stand_in.then(KernelStandIn::new);
        let state = tempfile::Builder::new()
            .prefix("carina-state-")
            .tempdir()
            .expect("state dir");
        let options = carina_node::engine::bcache::BcacheOptions {
            sysfs_root: kernel
                .as_ref()
                .map_or_else(|| PathBuf::from("/sys"), |k| k.root().to_path_buf()),
            state_dir: Some(state.path().to_path_buf()),
            settle_timeout: Duration::from_secs(5),
            flush_timeout: Duration::from_secs(30),
            poll: Duration::from_millis(5),
            ..Default::default()
        };
        let engine = start(&config, options.clone()).await;
        Some(BcacheFixture {
            engine,
            kernel,
            state,
            hdd,
            ssd,
            config,
            options,
            _vgs: vgs,
            disks: vec![hdd_disk, ssd_disk],
        })
    }

    /// A second engine over the same disks, records and driver, as after
    /// a restart of the node.
    pub async fn restart(&self) -> carina_node::engine::Engine {
        start(&self.config, self.options.clone()).await
    }

    /// An engine with these options over the same disks.
    pub async fn restart_with(
        &self,
        options: carina_node::engine::bcache::BcacheOptions,
    ) -> carina_node::engine::Engine {
        start(&self.config, options).await
    }

    /// The stand-in (the test is about its events); panics on a real
    /// kernel run.
    pub fn standin(&self) -> &KernelStandIn {
        self.kernel.as_ref().expect("the kernel stand-in")
    }

    /// A request that makes both volumes: `size` bytes in `hdd`, `ratio`
    /// percent of it in `ssd`.
    pub fn request(
        &self,
        name: &str,
        size: u64,
        ratio: u32,
        mode: carina_node::engine::bcache::CacheMode,
    ) -> carina_node::engine::bcache::BcacheRequest {
        carina_node::engine::bcache::BcacheRequest {
            name: name.into(),
            backing_volume: format!("{name}-data"),
            cache_volume: format!("{name}-cache"),
            cache_mode: mode,
            create: Some(carina_node::engine::bcache::record::OwnedVolumes {
                backing_group: self.hdd.clone(),
                size_bytes: size,
                cache_group: self.ssd.clone(),
                cache_ratio_percent: ratio,
            }),
        }
    }
}

async fn start(
    config: &str,
    bcache: carina_node::engine::bcache::BcacheOptions,
) -> carina_node::engine::Engine {
    carina_node::engine::Engine::start(
        carina_node::engine::Config::from_json(config).expect("config"),
        carina_node::engine::EngineOptions {
            bcache,
            ..Default::default()
        },
    )
    .await
    .expect("engine starts")
}

/// What `bcache-super-show` says of `dev`: (role, dev.uuid, cset.uuid),
/// or `None` when it finds no superblock.
pub fn superblock_of(dev: &Path) -> Option<(String, String, String)> {
    let out = std::process::Command::new("bcache-super-show")
        .arg(dev)
        .output()
        .expect("bcache-super-show runs");
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |k: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(k))
            .map(|l| l[k.len()..].trim().to_string())
            .expect("field")
    };
    Some((field("sb.version"), field("dev.uuid"), field("cset.uuid")))
}
