//! Engine tests for copies of volumes ([`Engine::copy_volume`]) on real
//! loop devices: block copies between LVM and RAW volumes, file-tree
//! copies between HOST volumes, the freeze of a mounted source (and that
//! the copy of a filesystem being written to is consistent), cancellation,
//! the freeze timeout, the records that make repeats no-ops and snapshots
//! read-only, and the refusals.
//!
//! Every test has its own loop disks, volume group, file systems, mount
//! points and copy-record directory, all released by guards on drop (also
//! when the test fails), so the tests run in parallel with each other and
//! with the other engine tests. Data is checked by SHA-256 (`sha256sum`).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use carina_node::engine::copy::record::CopyRecord;
use carina_node::engine::copy::{Copied, CopyRequest, Progress, Stop};
use carina_node::engine::{Config, CreateRequest, Engine, EngineOptions, Error, Volume};
use carina_tests::engine::{create, resize_refused};
use carina_tests::{LoopDisk, MountGuard, VgGuard, blockdev_size, have_root, run, unique};
use tokio::sync::watch;

const MIB: u64 = 1 << 20;
/// How long anything that may hang on a frozen filesystem is given before
/// the test thaws it and fails.
const HANG: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// The node: an engine over an LVM or RAW group on its own loop disk and/or a
// HOST group on its own small file system, keeping its copy records in a
// directory of its own.
// ---------------------------------------------------------------------------

/// A file system on a loop disk, mounted at a temp dir. Fields drop in
/// order: unmount, remove the mount point, detach the disk.
struct LoopFs {
    _mount: MountGuard,
    dir: tempfile::TempDir,
    _disk: LoopDisk,
}

impl LoopFs {
    fn ext4(size: u64) -> LoopFs {
        let disk = LoopDisk::new(size).expect("loop disk");
        mkfs_ext4(&disk.path);
        let dir = mount_dir("carina-copy-hostfs-");
        let mount = MountGuard::mount(&disk.dev(), dir.path(), Some("ext4"), None).expect("mount");
        LoopFs {
            _mount: mount,
            dir,
            _disk: disk,
        }
    }
}

/// A block device mounted at a temp dir of its own; unmounted, then the
/// directory removed, on drop.
struct Mounted {
    _guard: MountGuard,
    dir: tempfile::TempDir,
}

impl Mounted {
    fn new(dev: &Path, options: Option<&str>) -> Mounted {
        let dir = mount_dir("carina-copy-mnt-");
        let guard = MountGuard::mount(&dev.to_string_lossy(), dir.path(), Some("ext4"), options)
            .unwrap_or_else(|e| panic!("mount {}: {e:#}", dev.display()));
        Mounted { _guard: guard, dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

fn mount_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("tempdir")
}

fn mkfs_ext4(dev: &Path) {
    run(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
            &dev.to_string_lossy(),
        ],
    )
    .expect("mkfs.ext4");
}

/// An engine over a block group (`LVM` or `RAW`, one loop disk) and/or a
/// HOST group (a root on an ext4 of its own), with its copy records in
/// `records`. Fields drop in order: the engine, the record directory, the
/// volume group, the HOST file system, the disks.
struct Node {
    engine: Engine,
    /// The block group's name.
    block: Option<String>,
    /// The HOST group's name.
    host: Option<String>,
    records: tempfile::TempDir,
    _vg: Option<VgGuard>,
    _fs: Option<LoopFs>,
    _disks: Vec<LoopDisk>,
}

impl Node {
    /// `None` (the test skips) without root outside CI.
    async fn new(
        test: &str,
        block: Option<(&'static str, u64)>,
        host_fs: Option<u64>,
        freeze_timeout: Option<Duration>,
    ) -> Option<Node> {
        if !have_root(test) {
            return None;
        }
        let mut selectors = Vec::new();
        let mut disks = Vec::new();
        let mut vg = None;
        let mut block_group = None;
        if let Some((policy, size)) = block {
            let disk = LoopDisk::new(size).expect("loop disk");
            let group = unique(&format!("copy-{}", policy.to_lowercase()));
            selectors.push(serde_json::json!({
                "name": group,
                "re": [disk.pattern()],
                "policy": policy,
                "reserveBytes": 0,
                "minDiskBytes": MIB,
            }));
            if policy == "LVM" {
                vg = Some(VgGuard::new(&group, &[&disk]));
            }
            disks.push(disk);
            block_group = Some(group);
        }
        let mut fs = None;
        let mut host_group = None;
        if let Some(size) = host_fs {
            let made = LoopFs::ext4(size);
            let group = unique("copy-host");
            selectors.push(serde_json::json!({
                "name": group,
                "policy": "HOST",
                "root": made.dir.path().join("vols"),
                "reserveBytes": 0,
            }));
            fs = Some(made);
            host_group = Some(group);
        }
        let config = serde_json::json!({
            "diskSelector": selectors,
            "diskScanInterval": "0",
        })
        .to_string();
        let records = mount_dir("carina-copy-records-");
        let lvm = matches!(block, Some(("LVM", _)));
        let options = EngineOptions {
            // LVM detects device-mapper (loop activation without it); RAW
            // and HOST do not need it.
            device_mapper: (!lvm).then_some(false),
            copy_dir: Some(records.path().join("copies")),
            freeze_timeout,
            ..Default::default()
        };
        let engine = Engine::start(Config::from_json(&config).expect("config"), options)
            .await
            .expect("engine starts");
        Some(Node {
            engine,
            block: block_group,
            host: host_group,
            records,
            _vg: vg,
            _fs: fs,
            _disks: disks,
        })
    }

    /// A volume of the block group.
    async fn block(&self, name: &str, size: u64) -> Volume {
        let group = self.block.clone().expect("a block group");
        self.create(group, name, size).await
    }

    /// A volume of the HOST group.
    async fn host(&self, name: &str, size: u64) -> Volume {
        let group = self.host.clone().expect("a HOST group");
        self.create(group, name, size).await
    }

    async fn create(&self, group: String, name: &str, size: u64) -> Volume {
        let v = create(
            &self.engine,
            CreateRequest {
                name: name.to_string(),
                group,
                size_bytes: size,
                exclusive: false,
            },
        )
        .await;
        assert_eq!(v.size_bytes, size, "{v:?}");
        v
    }

    /// The copy records on disk, by file name.
    fn record_files(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.records.path().join("copies")) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

// ---------------------------------------------------------------------------
// Copies, with their progress watched.
// ---------------------------------------------------------------------------

/// What a copy's progress channel showed.
#[derive(Debug, Default)]
struct Seen {
    /// Updates the watcher woke up for.
    updates: usize,
    max_copied: u64,
    /// Some update said the source was frozen.
    frozen: bool,
    /// The target's record when the first frozen update was seen.
    record_while_frozen: Option<CopyRecord>,
    /// The channel's value once the copy returned.
    last: Progress,
}

/// One copy's outcome.
struct Run {
    result: Result<Copied, Error>,
    seen: Seen,
}

impl Run {
    fn copied(self) -> (Copied, Seen) {
        match self.result {
            Ok(c) => (c, self.seen),
            Err(e) => panic!("the copy failed: {e}"),
        }
    }

    fn refused(self) -> (Error, Seen) {
        match self.result {
            Ok(c) => panic!("the copy should fail, it made {c:?}"),
            Err(e) => (e, self.seen),
        }
    }
}

/// Copies `source` into `target`, watching the progress in a task;
/// `stop_after` sets the stop once that many bytes were copied.
async fn copy_watched(
    engine: &Engine,
    source: &str,
    target: &str,
    snapshot: bool,
    stop_after: Option<u64>,
) -> Run {
    let (tx, mut rx) = watch::channel(Progress::default());
    let tx = Arc::new(tx);
    let stop = Stop::default();
    let watcher = {
        let stop = stop.clone();
        let engine = engine.clone();
        let target = target.to_string();
        tokio::spawn(async move {
            let mut seen = Seen::default();
            while rx.changed().await.is_ok() {
                let p = rx.borrow_and_update().clone();
                seen.updates += 1;
                seen.max_copied = seen.max_copied.max(p.copied_bytes);
                if p.frozen && !seen.frozen {
                    seen.frozen = true;
                    seen.record_while_frozen = engine.copy_record(&target);
                }
                if stop_after.is_some_and(|n| p.copied_bytes >= n) {
                    stop.set();
                }
            }
            seen
        })
    };
    let req = CopyRequest {
        source: source.to_string(),
        target: target.to_string(),
        snapshot,
    };
    let result = engine.copy_volume(req, tx.clone(), stop).await;
    let last = tx.borrow().clone();
    drop(tx);
    // The watcher ends when the last sender is dropped: the copy must not
    // keep one once it returned.
    let mut seen = tokio::time::timeout(HANG, watcher)
        .await
        .expect("the copy released its progress channel")
        .expect("the watcher");
    seen.last = last;
    Run { result, seen }
}

async fn copy(engine: &Engine, source: &str, target: &str, snapshot: bool) -> Run {
    copy_watched(engine, source, target, snapshot, None).await
}

// ---------------------------------------------------------------------------
// Data: pseudo-random bytes, devices, checksums.
// ---------------------------------------------------------------------------

/// `len` bytes of splitmix64 output from `seed`.
fn pseudo_random(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        out.extend_from_slice(&z.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn dev(v: &Volume) -> &Path {
    v.device_path.as_deref().expect("a block device")
}

fn dir(v: &Volume) -> &Path {
    v.host_path.as_deref().expect("a directory")
}

/// Writes `data` at `offset` of the block device `path` and syncs it.
fn write_device(path: &Path, offset: u64, data: &[u8]) {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.write_all_at(data, offset).expect("write the device");
    f.sync_all().expect("sync the device");
}

/// SHA-256 of the first `len` bytes of `path` (fails if it is shorter).
fn sha256_prefix(path: &Path, len: u64) -> String {
    let script = r#"set -o pipefail; head -c "$1" "$2" | sha256sum"#;
    let hash = run(
        "bash",
        &[
            "-c",
            script,
            "hash",
            &len.to_string(),
            &path.to_string_lossy(),
        ],
    )
    .expect("sha256sum");
    let size = blockdev_size(path);
    assert!(
        size >= len,
        "{} has {size} bytes, not {len}",
        path.display()
    );
    hash.split_whitespace().next().expect("a hash").to_string()
}

/// SHA-256 of `data`.
fn sha256_bytes(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(data)
        .expect("feed sha256sum");
    let out = child.wait_with_output().expect("sha256sum");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("a hash")
        .to_string()
}

/// The filesystem UUID on `dev`, probed from the device.
fn fs_uuid(dev: &Path) -> String {
    let uuid = run(
        "blkid",
        &["-p", "-o", "value", "-s", "UUID", &dev.to_string_lossy()],
    )
    .expect("blkid");
    assert!(!uuid.trim().is_empty(), "{} has no UUID", dev.display());
    uuid.trim().to_string()
}

/// Writes `len` pseudo-random bytes to the new file `path` and syncs it.
fn write_file(path: &Path, seed: u64, len: usize) -> String {
    let data = pseudo_random(seed, len);
    let mut f = File::create_new(path).expect("create");
    f.write_all(&data).expect("write");
    f.sync_all().expect("fsync");
    sha256_bytes(&data)
}

// ---------------------------------------------------------------------------
// Frozen file systems: nothing may hang for ever on one.
// ---------------------------------------------------------------------------

/// Thaws `mount_point` (what a hung test does before it fails).
fn thaw(mount_point: &Path) {
    let _ = run("fsfreeze", &["-u", &mount_point.to_string_lossy()]);
}

/// Waits until `cond` holds, for at most [`HANG`]; on time out thaws
/// `mount_point` and fails with `what`.
async fn wait_until(mount_point: &Path, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG;
    while !cond() {
        if Instant::now() > deadline {
            thaw(mount_point);
            panic!("{what}: not after {HANG:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Asserts that the filesystem at `mount_point` takes a write and an
/// fsync (it is not left frozen). The write runs in a thread of its own,
/// so a frozen filesystem fails the test after [`HANG`] instead of
/// hanging it.
async fn assert_writable(mount_point: &Path, name: &str) {
    let file = mount_point.join(name);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let wrote = (|| {
            let mut f = File::create(&file)?;
            f.write_all(b"written after the copy")?;
            f.sync_all()
        })();
        let _ = tx.send(wrote);
    });
    let answer = tokio::task::spawn_blocking(move || rx.recv_timeout(HANG))
        .await
        .expect("the waiter");
    match answer {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("a write to {}: {e}", mount_point.display()),
        Err(_) => {
            thaw(mount_point);
            panic!(
                "{} is still frozen: a write and fsync did not finish in {HANG:?}",
                mount_point.display()
            );
        }
    }
    assert_eq!(
        std::fs::read(mount_point.join(name)).expect("read back"),
        b"written after the copy"
    );
}

/// Appends numbered records of [`RECORD`] bytes to a file, each followed
/// by an fsync, until stopped.
struct Writer {
    stop: Arc<AtomicBool>,
    /// Records written and synced.
    written: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    mount_point: PathBuf,
}

const RECORD: usize = 4096;

/// Record `i`: its number at both ends, a byte derived from it between.
fn record(i: u64) -> Vec<u8> {
    let mut r = vec![(i % 251) as u8; RECORD];
    r[..8].copy_from_slice(&i.to_le_bytes());
    r[RECORD - 8..].copy_from_slice(&(!i).to_le_bytes());
    r
}

/// How many whole, consecutive records from 0 `data` holds; any other
/// content fails.
fn check_records(data: &[u8], what: &str) -> u64 {
    assert_eq!(
        data.len() % RECORD,
        0,
        "{what}: {} bytes, not whole records",
        data.len()
    );
    for (i, chunk) in data.chunks(RECORD).enumerate() {
        assert!(
            chunk == record(i as u64).as_slice(),
            "{what}: record {i} is not what the writer wrote"
        );
    }
    (data.len() / RECORD) as u64
}

impl Writer {
    fn start(mount_point: &Path, name: &str) -> Writer {
        let path = mount_point.join(name);
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, written) = (stop.clone(), written.clone());
            std::thread::spawn(move || {
                let mut f = OpenOptions::new()
                    .create_new(true)
                    .append(true)
                    .open(&path)?;
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    f.write_all(&record(i))?;
                    f.sync_data()?;
                    i += 1;
                    written.store(i, Ordering::Release);
                }
                Ok(())
            })
        };
        Writer {
            stop,
            written,
            thread: Some(thread),
            mount_point: mount_point.to_path_buf(),
        }
    }

    fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// Waits until `n` records were written and synced.
    async fn wait_for(&self, n: u64, what: &str) {
        let written = self.written.clone();
        wait_until(&self.mount_point, what, || {
            written.load(Ordering::Acquire) >= n
        })
        .await;
    }

    /// Stops the writer; how many records it wrote.
    async fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("running");
        wait_until(&self.mount_point, "the writer stops", || {
            thread.is_finished()
        })
        .await;
        thread
            .join()
            .expect("the writer thread")
            .expect("the writer's writes");
        self.written()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // A failed test: stop the writer, and never leave it (or the
        // test) blocked on a frozen filesystem.
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let deadline = Instant::now() + HANG;
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if !thread.is_finished() {
                thaw(&self.mount_point);
            }
            let _ = thread.join();
        }
    }
}

// ---------------------------------------------------------------------------
// 1. Block copies (LVM, RAW): data, records, repeats, conflicts, snapshots.
// ---------------------------------------------------------------------------

async fn block_copies(test: &str, policy: &'static str) {
    let Some(n) = Node::new(test, Some((policy, 320 * MIB)), None, None).await else {
        return;
    };
    let e = &n.engine;
    // `tgt` sits right before `snap`, which is last: `snap` would have the
    // room to grow, and `tgt` has it once `snap` is gone.
    let src = n.block("src", 64 * MIB).await;
    n.block("other", 8 * MIB).await;
    let tgt = n.block("tgt", 96 * MIB).await;
    let snap = n.block("snap", 64 * MIB).await;

    let data = pseudo_random(1, (64 * MIB) as usize);
    write_device(dev(&src), 0, &data);
    let want = sha256_bytes(&data);
    assert_eq!(sha256_prefix(dev(&src), 64 * MIB), want, "the source");
    // The targets hold something else first.
    for v in [&tgt, &snap] {
        write_device(dev(v), 0, &pseudo_random(2, (64 * MIB) as usize));
        assert_ne!(sha256_prefix(dev(v), 64 * MIB), want);
    }
    assert_eq!(e.copy_record("tgt"), None);

    let (copied, seen) = copy(e, "src", "tgt", false).await.copied();
    assert!(copied.copied, "{copied:?}");
    assert_eq!(copied.volume.name, "tgt");
    assert_eq!(
        copied.volume.size_bytes,
        96 * MIB,
        "the target keeps its size"
    );
    assert_eq!(sha256_prefix(dev(&tgt), 64 * MIB), want, "the copy");
    assert_eq!(
        seen.last,
        Progress {
            copied_bytes: 64 * MIB,
            total_bytes: 64 * MIB,
            frozen: false,
        }
    );
    assert!(seen.updates > 0 && seen.max_copied == 64 * MIB, "{seen:?}");
    assert!(!seen.frozen, "nothing is mounted, nothing to freeze");
    let record = e.copy_record("tgt").expect("a record");
    assert_eq!(record, copied.record);
    assert_eq!(record.source, "src");
    assert!(record.complete && !record.snapshot, "{record:?}");
    assert_eq!(record.source_size_bytes, 64 * MIB);
    assert!(record.completed_unix_nanos > 0, "{record:?}");
    assert_eq!(record.frozen_at, None);
    assert_eq!(n.record_files(), ["tgt.json"]);

    // The same copy again does nothing, even though the source changed.
    write_device(dev(&src), 0, &pseudo_random(3, MIB as usize));
    let (again, _) = copy(e, "src", "tgt", false).await.copied();
    assert!(!again.copied, "{again:?}");
    assert_eq!(again.record, record);
    assert_eq!(e.copy_record("tgt").as_ref(), Some(&record));
    assert_eq!(sha256_prefix(dev(&tgt), 64 * MIB), want, "nothing copied");

    // Another source, or a snapshot instead of a copy, conflicts.
    for (source, snapshot) in [("other", false), ("src", true)] {
        let (err, seen) = copy(e, source, "tgt", snapshot).await.refused();
        match &err {
            Error::CopyConflict { target, holds } => {
                assert_eq!(target, "tgt");
                assert!(holds.contains("\"src\""), "{err}");
            }
            other => panic!("{source} into tgt: {other}"),
        }
        assert_eq!(seen.updates, 0, "nothing copied: {seen:?}");
    }
    assert_eq!(e.copy_record("tgt").as_ref(), Some(&record));
    assert_eq!(sha256_prefix(dev(&tgt), 64 * MIB), want, "the conflicts");

    // A snapshot of the (changed) source: read-only, gone with its volume.
    let now = sha256_prefix(dev(&src), 64 * MIB);
    assert_ne!(now, want);
    let (snapped, seen) = copy(e, "src", "snap", true).await.copied();
    assert!(snapped.copied);
    assert_eq!(seen.last.copied_bytes, 64 * MIB);
    assert!(
        snapped.record.snapshot && snapped.record.complete,
        "{snapped:?}"
    );
    assert_eq!(e.copy_record("snap"), Some(snapped.record.clone()));
    assert_eq!(sha256_prefix(dev(&snap), 64 * MIB), now, "the snapshot");
    let err = resize_refused(e, "snap", 80 * MIB).await;
    assert!(
        matches!(&err, Error::FailedPrecondition { operation: "resize", name, reason }
            if name == "snap" && reason.contains("snapshot")),
        "{err}"
    );
    assert_eq!(
        e.resize_volume("snap", 64 * MIB)
            .await
            .expect("its own size")
            .size_bytes,
        64 * MIB
    );
    assert_eq!(n.record_files(), ["snap.json", "tgt.json"]);
    e.delete_volume("snap").await.expect("delete the snapshot");
    assert_eq!(e.copy_record("snap"), None);
    assert_eq!(n.record_files(), ["tgt.json"]);

    // A copy that is no snapshot grows (into the room `snap` left).
    let grown = e.resize_volume("tgt", 128 * MIB).await.expect("grow");
    assert_eq!(grown.size_bytes, 128 * MIB);
    assert_eq!(
        sha256_prefix(dev(&grown), 64 * MIB),
        want,
        "kept by the grow"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_block_copy_repeat_conflict_and_snapshot() {
    block_copies("lvm_block_copy_repeat_conflict_and_snapshot", "LVM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_block_copy_repeat_conflict_and_snapshot() {
    block_copies("raw_block_copy_repeat_conflict_and_snapshot", "RAW").await;
}

// ---------------------------------------------------------------------------
// 2. HOST: a tree replaces the target's stale content.
// ---------------------------------------------------------------------------

/// What a tree holds, by relative path: the kind, the mode, and the
/// content's hash, the link's target, or nothing for a directory.
fn tree(root: &Path) -> BTreeMap<PathBuf, (String, u32, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, (String, u32, String)>) {
        for entry in std::fs::read_dir(dir).expect("list") {
            let path = entry.expect("entry").path();
            let meta = std::fs::symlink_metadata(&path).expect("stat");
            let rel = path
                .strip_prefix(root)
                .expect("under the root")
                .to_path_buf();
            let mode = meta.mode() & 0o7777;
            let kind = meta.file_type();
            let entry = if kind.is_symlink() {
                let link = std::fs::read_link(&path).expect("readlink");
                ("link".into(), 0, link.to_string_lossy().into_owned())
            } else if kind.is_dir() {
                walk(root, &path, out);
                ("dir".into(), mode, String::new())
            } else if kind.is_file() {
                let data = std::fs::read(&path).expect("read");
                let mtime = meta.mtime();
                (
                    "file".into(),
                    mode,
                    format!("{} {mtime}", sha256_bytes(&data)),
                )
            } else {
                ("other".into(), mode, meta.rdev().to_string())
            };
            out.insert(rel, entry);
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    let mode = std::fs::metadata(root).expect("stat the root").mode() & 0o7777;
    out.insert(PathBuf::new(), ("dir".into(), mode, String::new()));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_tree_copy_replaces_stale_content() {
    let test = "host_tree_copy_replaces_stale_content";
    let Some(n) = Node::new(test, None, Some(128 * MIB), None).await else {
        return;
    };
    let e = &n.engine;
    let src = n.host("hsrc", 32 * MIB).await;
    let tgt = n.host("htgt", 32 * MIB).await;
    let (s, t) = (dir(&src), dir(&tgt));

    // Nested directories, a big file (several chunks), small files, an
    // empty one, a link, modes of all kinds.
    std::fs::create_dir_all(s.join("a/b/c")).expect("mkdir");
    std::fs::create_dir(s.join("empty-dir")).expect("mkdir");
    std::fs::create_dir(s.join("sticky")).expect("mkdir");
    let big = 9 * MIB as usize + 123;
    write_file(&s.join("a/b/c/big.bin"), 10, big);
    write_file(&s.join("a/small.txt"), 11, 100);
    write_file(&s.join("a/b/mid.bin"), 12, 70_000);
    write_file(&s.join("top"), 13, 1);
    File::create_new(s.join("a/b/empty")).expect("create");
    std::os::unix::fs::symlink("a/b/c/big.bin", s.join("link")).expect("symlink");
    std::os::unix::fs::symlink("../nowhere", s.join("a/dangling")).expect("symlink");
    for (path, mode) in [
        ("top", 0o640),
        ("a/small.txt", 0o600),
        ("a/b/mid.bin", 0o755),
        ("a/b/empty", 0o4711),
        ("a/b", 0o750),
        ("a/b/c", 0o700),
        ("sticky", 0o1777),
        ("empty-dir", 0o2775),
        ("", 0o711),
    ] {
        std::fs::set_permissions(s.join(path), std::fs::Permissions::from_mode(mode))
            .expect("chmod");
    }
    // Stale content in the target, some of it under names the source
    // uses too.
    std::fs::create_dir_all(t.join("stale-dir/deeper")).expect("mkdir");
    std::fs::write(t.join("stale-dir/deeper/old"), b"old").expect("write");
    std::fs::write(t.join("top"), b"stale top, longer than the new one").expect("write");
    std::fs::create_dir(t.join("link")).expect("mkdir");
    std::fs::write(t.join("a"), b"a file where the source has a directory").expect("write");

    let want = tree(s);
    assert_ne!(tree(t), want);
    let (copied, seen) = copy(e, "hsrc", "htgt", false).await.copied();
    assert!(copied.copied);
    assert_eq!(copied.volume.host_path.as_deref(), Some(t));
    let files = (big + 100 + 70_000 + 1) as u64;
    assert_eq!(
        seen.last,
        Progress {
            copied_bytes: files,
            total_bytes: files,
            frozen: false,
        },
        "progress counts the files' bytes"
    );
    let got = tree(t);
    assert_eq!(got, want, "the target's tree is the source's");
    assert!(!t.join("stale-dir").exists(), "stale content gone");
    assert_eq!(
        std::fs::read_link(t.join("link")).expect("a link"),
        Path::new("a/b/c/big.bin")
    );
    assert_eq!(
        std::fs::read_link(t.join("a/dangling")).expect("a link"),
        Path::new("../nowhere")
    );
    assert_eq!(
        std::fs::metadata(t.join("a/b/c/big.bin"))
            .expect("stat")
            .len(),
        big as u64
    );
    let record = e.copy_record("htgt").expect("a record");
    assert!(record.complete && record.source == "hsrc", "{record:?}");
    assert_eq!(record.source_size_bytes, 32 * MIB);
    // The source is untouched.
    assert_eq!(tree(s), want);

    // A repeat is a no-op: a file added to the target since stays.
    std::fs::write(t.join("added-later"), b"mine").expect("write");
    let (again, _) = copy(e, "hsrc", "htgt", false).await.copied();
    assert!(!again.copied);
    assert!(t.join("added-later").exists());
}

// ---------------------------------------------------------------------------
// 3. A mounted source being written to: the snapshot is consistent.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_snapshot_of_a_written_filesystem_is_consistent() {
    let test = "lvm_snapshot_of_a_written_filesystem_is_consistent";
    let Some(n) = Node::new(test, Some(("LVM", 320 * MIB)), None, None).await else {
        return;
    };
    let e = &n.engine;
    let src = n.block("src", 128 * MIB).await;
    let snap = n.block("snap", 128 * MIB).await;
    mkfs_ext4(dev(&src));
    let source = Mounted::new(dev(&src), None);
    let keep = write_file(&source.path().join("keep.bin"), 20, 5 * MIB as usize);

    let writer = Writer::start(source.path(), "log");
    writer.wait_for(50, "the writer writes").await;
    let before = writer.written();
    let (copied, seen) = copy(e, "src", "snap", true).await.copied();
    let at_return = writer.written();
    assert!(copied.copied && copied.record.snapshot && copied.record.complete);
    assert_eq!(copied.record.frozen_at, None, "{copied:?}");
    assert!(seen.frozen, "the source was frozen: {seen:?}");
    let while_frozen = seen.record_while_frozen.clone().expect("a record then");
    assert!(!while_frozen.complete, "{while_frozen:?}");
    assert_eq!(
        while_frozen.frozen_at.as_deref(),
        Some(source.path()),
        "the record names what is frozen while it is"
    );
    assert_eq!(
        seen.last,
        Progress {
            copied_bytes: 128 * MIB,
            total_bytes: 128 * MIB,
            frozen: false,
        }
    );
    // The source was thawed: the writer goes on.
    writer
        .wait_for(at_return + 50, "the writer goes on after the copy")
        .await;
    let total = writer.finish().await;

    // The snapshot is a clean file system...
    let fsck = run("e2fsck", &["-fn", &dev(&snap).to_string_lossy()]);
    assert!(fsck.is_ok(), "e2fsck of the snapshot: {fsck:?}");
    // ...whose log is a prefix of what the writer wrote: every record
    // synced before the copy began, none written after it returned.
    let snapshot = Mounted::new(dev(&snap), Some("ro,noload"));
    let in_snapshot = check_records(
        &std::fs::read(snapshot.path().join("log")).expect("read the snapshot's log"),
        "the snapshot's log",
    );
    assert!(
        (before..=at_return).contains(&in_snapshot),
        "the snapshot holds {in_snapshot} records; {before} were synced before the copy, {at_return} when it returned"
    );
    let in_source = check_records(
        &std::fs::read(source.path().join("log")).expect("read the source's log"),
        "the source's log",
    );
    assert_eq!(in_source, total);
    assert!(
        in_source >= in_snapshot + 50,
        "{in_source} vs {in_snapshot}"
    );
    assert_eq!(
        sha256_bytes(&std::fs::read(snapshot.path().join("keep.bin")).expect("read")),
        keep
    );
    // Read-only, and cannot grow.
    let err = resize_refused(e, "snap", 160 * MIB).await;
    assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");
}

// ---------------------------------------------------------------------------
// 4. Cancellation.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_cancelled_copy_thaws_and_can_be_repeated() {
    let test = "lvm_cancelled_copy_thaws_and_can_be_repeated";
    let Some(n) = Node::new(test, Some(("LVM", 600 * MIB)), None, None).await else {
        return;
    };
    let e = &n.engine;
    let src = n.block("src", 256 * MIB).await;
    let tgt = n.block("tgt", 256 * MIB).await;
    n.block("small", 8 * MIB).await;
    mkfs_ext4(dev(&src));
    let source = Mounted::new(dev(&src), None);
    let data = write_file(&source.path().join("data.bin"), 30, 32 * MIB as usize);

    let cancelled = copy_watched(e, "src", "tgt", false, Some(1)).await;
    let (err, seen) = cancelled.refused();
    match &err {
        Error::Cancelled { what } => {
            assert!(
                what.contains("\"src\"") && what.contains("\"tgt\""),
                "{err}"
            )
        }
        other => panic!("not a cancel: {other}"),
    }
    // The stop was set on an update that said frozen: the source's
    // filesystem stays frozen until the copy ends.
    assert!(seen.frozen, "the source was frozen: {seen:?}");
    assert!(
        seen.max_copied > 0 && seen.last.copied_bytes < 256 * MIB,
        "stopped part of the way: {seen:?}"
    );
    assert!(!seen.last.frozen, "the last progress says thawed: {seen:?}");
    let record = e.copy_record("tgt").expect("a record");
    assert!(!record.complete && record.source == "src", "{record:?}");
    // Thawed, and recorded so: a later start thaws nothing there.
    assert_eq!(record.frozen_at, None, "{record:?}");
    assert_eq!(n.record_files(), ["tgt.json"]);
    assert_writable(source.path(), "after-cancel").await;

    // An incomplete copy is no source.
    let (err, _) = copy(e, "tgt", "small", false).await.refused();
    assert!(
        matches!(&err, Error::FailedPrecondition { operation: "copy", name, .. } if name == "tgt"),
        "{err}"
    );
    assert_eq!(e.copy_record("small"), None);

    // The repeat starts over and completes: the target holds the
    // source's files, in a filesystem with a UUID of its own.
    drop(source);
    let (copied, seen) = copy(e, "src", "tgt", false).await.copied();
    assert!(copied.copied);
    assert!(!seen.frozen, "unmounted: nothing to freeze");
    assert_eq!(seen.last.copied_bytes, 256 * MIB);
    let record = e.copy_record("tgt").expect("a record");
    assert!(record.complete && record.frozen_at.is_none(), "{record:?}");
    assert_ne!(fs_uuid(dev(&tgt)), fs_uuid(dev(&src)));
    let check = Mounted::new(dev(&tgt), Some("ro"));
    assert!(check.path().join("after-cancel").exists());
    assert_eq!(
        sha256_bytes(&std::fs::read(check.path().join("data.bin")).expect("read")),
        data
    );
}

// ---------------------------------------------------------------------------
// 5. The freeze timeout.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_freeze_timeout_stops_the_copy_and_thaws() {
    let test = "lvm_freeze_timeout_stops_the_copy_and_thaws";
    let limit = Duration::from_millis(1);
    let Some(n) = Node::new(test, Some(("LVM", 600 * MIB)), None, Some(limit)).await else {
        return;
    };
    let e = &n.engine;
    let src = n.block("src", 256 * MIB).await;
    n.block("tgt", 256 * MIB).await;
    mkfs_ext4(dev(&src));
    let source = Mounted::new(dev(&src), None);
    let data = write_file(&source.path().join("data.bin"), 40, 16 * MIB as usize);

    let (err, seen) = copy(e, "src", "tgt", false).await.refused();
    match &err {
        Error::TimedOut { what, waited } => {
            assert_eq!(*waited, limit, "{err}");
            assert!(
                what.contains("\"src\"") && what.contains("\"tgt\""),
                "{err}"
            );
        }
        other => panic!("not a timeout: {other}"),
    }
    assert!(!seen.last.frozen, "{seen:?}");
    assert!(seen.last.copied_bytes < 256 * MIB, "{seen:?}");
    assert_writable(source.path(), "after-timeout").await;
    let record = e.copy_record("tgt").expect("a record");
    assert!(!record.complete && record.frozen_at.is_none(), "{record:?}");
    // A read-only mount is not frozen, so the limit does not apply.
    drop(source);
    let _ro = Mounted::new(dev(&src), Some("ro"));
    let (copied, seen) = copy(e, "src", "tgt", false).await.copied();
    assert!(copied.copied && !seen.frozen, "{seen:?}");
    assert_ne!(fs_uuid(dev(&copied.volume)), fs_uuid(dev(&src)));
    let check = Mounted::new(dev(&copied.volume), Some("ro"));
    assert_eq!(
        sha256_bytes(&std::fs::read(check.path().join("data.bin")).expect("read")),
        data
    );
}

// ---------------------------------------------------------------------------
// 6. Refusals change nothing.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_copies_change_nothing() {
    let test = "refused_copies_change_nothing";
    let Some(n) = Node::new(test, Some(("LVM", 256 * MIB)), Some(64 * MIB), None).await else {
        return;
    };
    let e = &n.engine;
    let src = n.block("src", 16 * MIB).await;
    let small = n.block("small", 8 * MIB).await;
    let dst = n.block("dst", 16 * MIB).await;
    let mounted = n.block("mounted", 16 * MIB).await;
    let hsrc = n.host("hsrc", 4 * MIB).await;
    let hdst = n.host("hdst", 16 * MIB).await;
    write_device(dev(&src), 0, &pseudo_random(50, (16 * MIB) as usize));
    write_device(dev(&small), 0, &pseudo_random(51, (8 * MIB) as usize));
    write_device(dev(&dst), 0, &pseudo_random(52, (16 * MIB) as usize));
    mkfs_ext4(dev(&mounted));
    let mount = Mounted::new(dev(&mounted), None);
    std::fs::write(mount.path().join("theirs"), b"in use").expect("write");
    std::fs::write(dir(&hsrc).join("file"), b"host source").expect("write");
    std::fs::write(dir(&hdst).join("file"), b"host target").expect("write");
    let hashes = |vs: &[&Volume]| -> Vec<String> {
        vs.iter()
            .map(|v| sha256_prefix(dev(v), v.size_bytes))
            .collect()
    };
    let before = hashes(&[&src, &small, &dst]);

    let invalid = |f: &'static str| move |err: &Error| matches!(err, Error::InvalidArgument { field, .. } if field == f);
    let not_found = |v: &'static str| move |err: &Error| matches!(err, Error::VolumeNotFound { name } if name == v);
    let precondition = |v: &'static str| move |err: &Error| matches!(err, Error::FailedPrecondition { operation: "copy", name, .. } if name == v);
    type Check = Box<dyn Fn(&Error) -> bool>;
    let cases: Vec<(&str, &str, Check)> = vec![
        ("src", "src", Box::new(invalid("target"))),
        ("bad/name", "dst", Box::new(invalid("source"))),
        ("src", ".hidden", Box::new(invalid("target"))),
        ("missing", "dst", Box::new(not_found("missing"))),
        ("src", "missing", Box::new(not_found("missing"))),
        ("src", "small", Box::new(precondition("small"))),
        ("src", "mounted", Box::new(precondition("mounted"))),
        ("hsrc", "dst", Box::new(precondition("dst"))),
        ("src", "hdst", Box::new(precondition("hdst"))),
    ];
    for (source, target, check) in &cases {
        for snapshot in [false, true] {
            let (err, seen) = copy(e, source, target, snapshot).await.refused();
            assert!(check(&err), "{source} into {target}: {err:?}");
            assert_eq!(seen.updates, 0, "{source} into {target}: {seen:?}");
            assert_eq!(e.copy_record(target), None, "{source} into {target}");
            assert_eq!(
                n.record_files(),
                Vec::<String>::new(),
                "{source} into {target}"
            );
        }
    }
    assert_eq!(hashes(&[&src, &small, &dst]), before, "no data changed");
    assert_eq!(
        std::fs::read(mount.path().join("theirs")).expect("read"),
        b"in use"
    );
    assert_eq!(
        std::fs::read(dir(&hdst).join("file")).expect("read"),
        b"host target"
    );
    let snap = n.engine.list_volumes(None).await.expect("list");
    assert_eq!(snap.len(), 6, "{snap:?}");

    // The same volumes copy where the copy is possible.
    drop(mount);
    let (copied, _) = copy(e, "src", "mounted", false).await.copied();
    assert!(copied.copied);
    assert_eq!(hashes(&[&mounted]), before[..1].to_vec());
    let (copied, _) = copy(e, "hsrc", "hdst", true).await.copied();
    assert!(copied.copied && copied.record.snapshot);
    assert_eq!(
        std::fs::read(dir(&hdst).join("file")).expect("read"),
        b"host source"
    );
    assert_eq!(n.record_files(), ["hdst.json", "mounted.json"]);
}

// ---------------------------------------------------------------------------
// 7. A node stopped between the copied blocks and the new UUID.
// ---------------------------------------------------------------------------

/// What a node killed at `copy.blocks_copied` leaves (every block of an
/// xfs source frozen while mounted is on the target, the record says so,
/// the UUID is still the source's) is finished by the repeated copy: no
/// block is copied again (the source is not frozen, and what was written
/// to it since is not in the target), the target gets a UUID of its own
/// (its log replayed first) and mounts beside the mounted source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_copy_stopped_before_its_new_uuid_is_finished_by_the_repeat() {
    let test = "lvm_copy_stopped_before_its_new_uuid_is_finished_by_the_repeat";
    let Some(n) = Node::new(test, Some(("LVM", 700 * MIB)), None, None).await else {
        return;
    };
    let e = &n.engine;
    let size = 320 * MIB;
    let src = n.block("src", size).await;
    let tgt = n.block("tgt", size).await;
    run("mkfs.xfs", &["-q", "-f", &dev(&src).to_string_lossy()]).expect("mkfs.xfs");
    let source_dir = mount_dir("carina-copy-xfs-src-");
    let _source = MountGuard::mount(
        &dev(&src).to_string_lossy(),
        source_dir.path(),
        Some("xfs"),
        None,
    )
    .expect("mount the source");
    let before = write_file(&source_dir.path().join("before.bin"), 70, 4 * MIB as usize);

    // The state of the kill: the blocks of the frozen source, a record
    // saying they are all there.
    let at = source_dir.path().to_string_lossy().into_owned();
    run("fsfreeze", &["-f", &at]).expect("freeze");
    let copied = run(
        "dd",
        &[
            &format!("if={}", dev(&src).display()),
            &format!("of={}", dev(&tgt).display()),
            "bs=4M",
            "iflag=direct",
            "oflag=direct,sync",
            "status=none",
        ],
    );
    run("fsfreeze", &["-u", &at]).expect("thaw");
    copied.expect("dd");
    let record = CopyRecord {
        source: "src".into(),
        snapshot: false,
        blocks_copied: true,
        complete: false,
        completed_unix_nanos: 0,
        source_size_bytes: size,
        frozen_at: None,
    };
    let records = n.records.path().join("copies");
    std::fs::create_dir_all(&records).expect("the records directory");
    std::fs::write(
        records.join("tgt.json"),
        serde_json::to_string(&record).expect("json"),
    )
    .expect("write the record");
    assert_eq!(
        fs_uuid(dev(&tgt)),
        fs_uuid(dev(&src)),
        "the UUID is the source's"
    );
    write_file(&source_dir.path().join("after.bin"), 71, MIB as usize);

    let (copied, seen) = copy(e, "src", "tgt", false).await.copied();
    assert!(copied.copied && copied.record.complete, "{copied:?}");
    assert!(!seen.frozen, "nothing copied, so nothing frozen: {seen:?}");
    assert_eq!(seen.last.copied_bytes, size, "{seen:?}");
    assert_ne!(fs_uuid(dev(&tgt)), fs_uuid(dev(&src)));
    let target_dir = mount_dir("carina-copy-xfs-tgt-");
    let _target = MountGuard::mount(
        &dev(&tgt).to_string_lossy(),
        target_dir.path(),
        Some("xfs"),
        None,
    )
    .expect("the copy mounts beside its source");
    assert_eq!(
        sha256_bytes(&std::fs::read(target_dir.path().join("before.bin")).expect("read")),
        before
    );
    assert!(
        !target_dir.path().join("after.bin").exists(),
        "the blocks were not copied again"
    );
    // A repeat now is a no-op.
    let (again, _) = copy(e, "src", "tgt", false).await.copied();
    assert!(!again.copied);
}
