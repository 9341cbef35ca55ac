//! The node of the engine's copy tests ([`Engine::copy_volume`]) and the
//! copies it runs: an engine over an LVM or RAW group on its own loop disk
//! and/or a HOST group on its own small file system, its copy records in a
//! directory of its own, and copies whose progress is watched.
//!
//! Every node has its own loop disks, volume group, file systems, mount
//! points and copy-record directory, all released by guards on drop (also
//! when the test fails), so the tests run in parallel with each other and
//! with the other engine tests. [`data`] writes and checksums what is
//! copied; [`frozen`] guards the tests against a filesystem left frozen.

pub mod data;
pub mod frozen;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use carina_node::engine::copy::record::CopyRecord;
use carina_node::engine::copy::{Copied, CopyRequest, Progress, Stop};
use carina_node::engine::{Config, CreateRequest, Engine, EngineOptions, Error, Volume};
use tokio::sync::watch;

use crate::engine::create;
use crate::{LoopDisk, MountGuard, VgGuard, have_root, run, unique};

pub const MIB: u64 = 1 << 20;
/// How long anything that may hang on a frozen filesystem is given before
/// the test thaws it and fails.
pub const HANG: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// The node: an engine over an LVM or RAW group on its own loop disk and/or a
// HOST group on its own small file system, keeping its copy records in a
// directory of its own.
// ---------------------------------------------------------------------------

/// A file system on a loop disk, mounted at a temp dir. Fields drop in
/// order: unmount, remove the mount point, detach the disk.
#[derive(Debug)]
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
#[derive(Debug)]
pub struct Mounted {
    _guard: MountGuard,
    pub dir: tempfile::TempDir,
}

impl Mounted {
    pub fn new(dev: &Path, options: Option<&str>) -> Mounted {
        let dir = mount_dir("carina-copy-mnt-");
        let guard = MountGuard::mount(&dev.to_string_lossy(), dir.path(), Some("ext4"), options)
            .unwrap_or_else(|e| panic!("mount {}: {e:#}", dev.display()));
        Mounted { _guard: guard, dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

pub fn mount_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("tempdir")
}

pub fn mkfs_ext4(dev: &Path) {
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
#[derive(Debug)]
pub struct Node {
    pub engine: Engine,
    /// The block group's name.
    pub block: Option<String>,
    /// The HOST group's name.
    pub host: Option<String>,
    pub records: tempfile::TempDir,
    _vg: Option<VgGuard>,
    _fs: Option<LoopFs>,
    _disks: Vec<LoopDisk>,
}

impl Node {
    /// `None` (the test skips) without root outside CI.
    pub async fn new(
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
    pub async fn block(&self, name: &str, size: u64) -> Volume {
        let group = self.block.clone().expect("a block group");
        self.create(group, name, size).await
    }

    /// A volume of the HOST group.
    pub async fn host(&self, name: &str, size: u64) -> Volume {
        let group = self.host.clone().expect("a HOST group");
        self.create(group, name, size).await
    }

    pub async fn create(&self, group: String, name: &str, size: u64) -> Volume {
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
    pub fn record_files(&self) -> Vec<String> {
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
pub struct Seen {
    /// Updates the watcher woke up for.
    pub updates: usize,
    pub max_copied: u64,
    /// Some update said the source was frozen.
    pub frozen: bool,
    /// The target's record when the first frozen update was seen.
    pub record_while_frozen: Option<CopyRecord>,
    /// The channel's value once the copy returned.
    pub last: Progress,
}

/// One copy's outcome.
#[derive(Debug)]
pub struct Run {
    pub result: Result<Copied, Error>,
    pub seen: Seen,
}

impl Run {
    pub fn copied(self) -> (Copied, Seen) {
        match self.result {
            Ok(c) => (c, self.seen),
            Err(e) => panic!("the copy failed: {e}"),
        }
    }

    pub fn refused(self) -> (Error, Seen) {
        match self.result {
            Ok(c) => panic!("the copy should fail, it made {c:?}"),
            Err(e) => (e, self.seen),
        }
    }
}

/// Copies `source` into `target`, watching the progress in a task;
/// `stop_after` sets the stop once that many bytes were copied.
pub async fn copy_watched(
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

pub async fn copy(engine: &Engine, source: &str, target: &str, snapshot: bool) -> Run {
    copy_watched(engine, source, target, snapshot, None).await
}
