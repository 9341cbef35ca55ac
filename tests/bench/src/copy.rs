//! Copy benchmarks: [`Engine::copy_volume`] of a volume filled with
//! non-zero data into a fresh volume of the same size, against the raw
//! command that moves the same bytes between the same places, in the same
//! rounds: a bare `dd` with direct IO and a final fsync between the same
//! two block devices (LVM, RAW), `cp -a` of the same tree then `sync` of
//! every file and directory it made (HOST, whose copy syncs each one).
//!
//! Each round creates a new target (a complete copy record would make a
//! repeat return at once), runs the engine's copy and the floor onto it,
//! the first of the two alternating from round to round (so neither side
//! always meets the target's first writes, into the sparse disk file), and
//! deletes it. The warm-up round is not recorded; it checks the engine's
//! copy byte for byte. The engines keep their copy records in a
//! directory, as a node with a state directory does.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use carina_node::engine::copy::{CopyRequest, Progress, Stop};
use carina_node::engine::{Config, CreateRequest, Engine, EngineOptions, Volume};
use carina_sys::command::Cmd;
use carina_tests::grpc::host_config;
use carina_tests::{LoopDisk, VgGuard, disk_group_config, unique};
use tokio::sync::watch;

use crate::report::{Entry, rate};

const GROUP: &str = "Engine: volume copy (256 MiB of non-zero data into a fresh target of the same size; LVM and RAW block by block with direct IO, HOST as 8 directories of 32 files of 1 MiB, each file synced; MiB/s, higher is better: p99 is the rate of the slowest copy, a ratio above 1 beats the floor)";
const SIZE: u64 = 256 << 20;
const DISK: u64 = 1 << 30;
/// Each round moves 512 MiB (the copy and its floor) through the disk
/// behind the loop file: enough rounds for a steady median.
const ROUNDS: usize = 20;
const WARMUP: usize = 1;
const CHUNK: usize = 4 << 20;
const DD: &str = "dd bs=4M iflag=direct oflag=direct conv=fsync";
const CP: &str = "cp -a, then sync of each file and directory";
/// The HOST source tree: directories of files of `FILE` bytes.
const DIRS: usize = 8;
const FILES: usize = 32;
const FILE: usize = 1 << 20;

/// An engine over one group. Fields drop in order: the engine, its
/// records, the VG (and the loop devices stacked on it), the disk or the
/// HOST root.
struct Node {
    engine: Engine,
    group: String,
    _records: tempfile::TempDir,
    _vg: Option<VgGuard>,
    _disk: Option<LoopDisk>,
    _root: Option<tempfile::TempDir>,
}

impl Node {
    async fn start(
        config: &str,
        device_mapper: Option<bool>,
    ) -> Result<(Engine, tempfile::TempDir)> {
        let records = tempfile::Builder::new()
            .prefix("carina-bench-copies-")
            .tempdir()?;
        let engine = Engine::start(
            Config::from_json(config)?,
            EngineOptions {
                device_mapper,
                copy_dir: Some(records.path().to_path_buf()),
                ..Default::default()
            },
        )
        .await?;
        Ok((engine, records))
    }

    /// An LVM or RAW group on a loop disk of its own.
    async fn block(policy: &str) -> Result<Node> {
        let disk = LoopDisk::new(DISK)?;
        let group = unique(&format!("bench-copy-{}", policy.to_lowercase()));
        let vg = (policy == "LVM").then(|| VgGuard::new(&group, &[&disk]));
        let device_mapper = (policy != "LVM").then_some(false);
        let (engine, records) = Self::start(
            &disk_group_config(&group, policy, &[&disk], 0),
            device_mapper,
        )
        .await?;
        Ok(Node {
            engine,
            group,
            _records: records,
            _vg: vg,
            _disk: Some(disk),
            _root: None,
        })
    }

    /// A HOST group at a temp dir of its own.
    async fn host() -> Result<Node> {
        let root = tempfile::Builder::new()
            .prefix("carina-bench-host-")
            .tempdir()?;
        let group = unique("bench-copy-host");
        let (engine, records) = Self::start(&host_config(&group, root.path(), 0), None).await?;
        Ok(Node {
            engine,
            group,
            _records: records,
            _vg: None,
            _disk: None,
            _root: Some(root),
        })
    }

    async fn create(&self, name: &str, size: u64) -> Result<Volume> {
        self.engine
            .create_volume(CreateRequest {
                name: name.into(),
                group: self.group.clone(),
                size_bytes: size,
                exclusive: false,
            })
            .await
            .with_context(|| format!("engine create {name}"))
    }

    /// The engine's copy of `source` into `target`, timed.
    async fn copy(&self, source: &str, target: &str) -> Result<Duration> {
        let (progress, _) = watch::channel(Progress::default());
        let t0 = Instant::now();
        let copied = self
            .engine
            .copy_volume(
                CopyRequest {
                    source: source.into(),
                    target: target.into(),
                    snapshot: false,
                },
                Arc::new(progress),
                Stop::default(),
            )
            .await
            .with_context(|| format!("engine copy {source} → {target}"))?;
        let took = t0.elapsed();
        ensure!(copied.copied, "the copy into {target} copied nothing");
        Ok(took)
    }
}

/// Non-zero bytes that differ from chunk to chunk and block to block.
fn pattern(chunk: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| 1 + ((i as u64 * 131 + chunk * 7 + i as u64 / 4096) % 255) as u8)
        .collect()
}

/// Writes `len` bytes of [`pattern`] onto the device at `dev`, synced.
async fn fill_device(dev: PathBuf, len: u64) -> Result<()> {
    tokio::task::spawn_blocking(move || -> Result<()> {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&dev)
            .with_context(|| format!("open {}", dev.display()))?;
        let mut offset = 0;
        while offset < len {
            let n = (len - offset).min(CHUNK as u64) as usize;
            f.write_all_at(&pattern(offset / CHUNK as u64, n), offset)
                .with_context(|| format!("write {}", dev.display()))?;
            offset += n as u64;
        }
        f.sync_all()?;
        Ok(())
    })
    .await?
}

/// Fills `dir` with the HOST source tree; returns the paths it made,
/// relative to `dir`, directories first.
async fn fill_tree(dir: PathBuf) -> Result<Vec<PathBuf>> {
    tokio::task::spawn_blocking(move || -> Result<Vec<PathBuf>> {
        let mut made = Vec::new();
        for d in 0..DIRS {
            let sub = PathBuf::from(format!("d{d}"));
            std::fs::create_dir(dir.join(&sub))?;
            made.push(sub);
        }
        for d in 0..DIRS {
            for f in 0..FILES {
                let file = PathBuf::from(format!("d{d}/f{f}"));
                std::fs::write(dir.join(&file), pattern((d * FILES + f) as u64, FILE))?;
                made.push(file);
            }
        }
        Ok(made)
    })
    .await?
}

/// The floor of a block copy: the bare `dd`, timed.
async fn dd(source: &Path, target: &Path) -> Result<Duration> {
    let mut if_ = std::ffi::OsString::from("if=");
    if_.push(source);
    let mut of = std::ffi::OsString::from("of=");
    of.push(target);
    let cmd = Cmd::new("dd").arg(if_).arg(of).args([
        "bs=4M",
        "iflag=direct",
        "oflag=direct",
        "conv=fsync",
    ]);
    let t0 = Instant::now();
    cmd.run().await.context("dd")?;
    Ok(t0.elapsed())
}

/// Fails unless the first `len` bytes at `a` and `b` are the same.
async fn same_bytes(a: &Path, b: &Path, len: u64) -> Result<()> {
    Cmd::new("cmp")
        .args(["-n".to_string(), len.to_string()])
        .arg(a)
        .arg(b)
        .run()
        .await
        .context("the engine's copy differs from its source")?;
    Ok(())
}

/// Which side runs first in round `i`.
fn engine_first(i: usize) -> bool {
    i.is_multiple_of(2)
}

/// LVM or RAW: the engine's block copy against `dd` between the same
/// devices.
async fn block(policy: &str, name: &str, rounds: usize) -> Result<Entry> {
    let node = Node::block(policy).await?;
    let source = node.create("source", SIZE).await?;
    let device = |v: &Volume| {
        v.device_path
            .clone()
            .with_context(|| format!("{} has no block device", v.name))
    };
    let src = device(&source)?;
    let bytes = source.size_bytes;
    fill_device(src.clone(), bytes).await?;
    let (mut engine, mut floor) = (Vec::new(), Vec::new());
    for i in 0..(rounds + WARMUP) {
        let target = format!("target{i}");
        let volume = node.create(&target, SIZE).await?;
        ensure!(
            volume.size_bytes == bytes,
            "{target} has {} bytes, the source {bytes}",
            volume.size_bytes
        );
        let dst = device(&volume)?;
        let (e, f) = if engine_first(i) {
            let e = node.copy("source", &target).await?;
            if i < WARMUP {
                same_bytes(&src, &dst, bytes).await?;
            }
            (e, dd(&src, &dst).await?)
        } else {
            let f = dd(&src, &dst).await?;
            (node.copy("source", &target).await?, f)
        };
        node.engine
            .delete_volume(&target)
            .await
            .with_context(|| format!("engine delete {target}"))?;
        if i >= WARMUP {
            engine.push(e);
            floor.push(f);
        }
    }
    Ok(rate(GROUP, name, DD, bytes, &engine, &floor))
}

/// HOST: the engine's tree copy against `cp -a` of the same tree and a
/// `sync` of every file and directory it made, into a directory on the
/// same filesystem.
async fn host(rounds: usize) -> Result<Entry> {
    let node = Node::host().await?;
    // Room for the directories beside the file bytes.
    let size = 2 * SIZE;
    let source = node.create("source", size).await?;
    let dir = |v: &Volume| {
        v.host_path
            .clone()
            .with_context(|| format!("{} has no directory", v.name))
    };
    let src = dir(&source)?;
    let made = fill_tree(src.clone()).await?;
    Cmd::new("sync")
        .arg(&src)
        .args(made.iter().map(|p| src.join(p)))
        .run()
        .await
        .context("sync the source tree")?;
    let bytes = (DIRS * FILES * FILE) as u64;
    let floor_root = tempfile::Builder::new()
        .prefix("carina-bench-cp-")
        .tempdir()?;
    let mut src_content = src.clone().into_os_string();
    src_content.push("/.");
    let (mut engine, mut floor) = (Vec::new(), Vec::new());
    for i in 0..(rounds + WARMUP) {
        let target = format!("target{i}");
        let volume = node.create(&target, size).await?;
        let dst = floor_root.path().join(format!("cp{i}"));
        std::fs::create_dir(&dst)?;
        let cp = Cmd::new("cp").arg("-a").arg(&src_content).arg(&dst);
        let sync = Cmd::new("sync")
            .arg(&dst)
            .args(made.iter().map(|p| dst.join(p)));
        let cp_and_sync = || async {
            let t0 = Instant::now();
            cp.run().await.context("cp -a")?;
            sync.run().await.context("sync")?;
            anyhow::Ok(t0.elapsed())
        };
        let (e, f) = if engine_first(i) {
            let e = node.copy("source", &target).await?;
            if i < WARMUP {
                Cmd::new("diff")
                    .arg("-r")
                    .arg(&src)
                    .arg(dir(&volume)?)
                    .run()
                    .await
                    .context("the engine's copy differs from its source")?;
            }
            (e, cp_and_sync().await?)
        } else {
            let f = cp_and_sync().await?;
            (node.copy("source", &target).await?, f)
        };
        node.engine
            .delete_volume(&target)
            .await
            .with_context(|| format!("engine delete {target}"))?;
        std::fs::remove_dir_all(&dst)?;
        if i >= WARMUP {
            engine.push(e);
            floor.push(f);
        }
    }
    Ok(rate(GROUP, "engine.host.copy", CP, bytes, &engine, &floor))
}

/// The copy group: LVM, RAW and HOST, each against its floor.
pub async fn copy_volume(iterations: usize) -> Result<Vec<Entry>> {
    let rounds = ROUNDS.min(iterations);
    Ok(vec![
        block("LVM", "engine.lvm.copy", rounds).await?,
        block("RAW", "engine.raw.copy", rounds).await?,
        host(rounds).await?,
    ])
}
