//! A HOST copy against a source whose pod swaps a directory for a link to
//! somewhere else while the copy runs (the node copies as root and must
//! never copy what such a link points to).
//!
//! The source volume holds a directory `d` and, beside it, `d.swap`: a link
//! to a secret directory outside every volume whose files have the names of
//! `d`'s but SECRET in them. A thread exchanges the two names back to back
//! (`renameat2(RENAME_EXCHANGE)`, so `d` is always there, a directory one
//! moment and a link the next) while copies of the source run one after
//! another, each into a new volume. No clone may hold a byte of the secret
//! or an entry only the secret has; the test proves the race by counting
//! the exchanges that fell inside copies, and fails if too few did or if
//! the copies never saw `d` both ways.
//!
//! Everything lives on an ext4 of its own on a loop disk, with the copy
//! records in a directory of the test's own; all released on drop.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use carina_node::engine::copy::{CopyRequest, Progress, Stop};
use carina_node::engine::{Config, CreateRequest, Engine, EngineOptions};
use carina_tests::copy::mkfs_ext4;
use carina_tests::engine::create;
use carina_tests::{LoopDisk, MountGuard, have_root, unique};
use tokio::sync::watch;

const MIB: u64 = 1 << 20;
/// Copies raced against the swapper.
const COPIES: usize = 120;
/// Files directly in `d` and in `d/sub`, with the bytes of each.
const FILES: usize = 6;
const SUB_FILES: usize = 3;
const FILE_BYTES: usize = 48 * 1024;
const SECRET: &[u8] = b"SECRET";

/// An ext4 on a loop disk, mounted; unmounted, then detached, on drop.
struct Fs {
    _mount: MountGuard,
    dir: tempfile::TempDir,
    _disk: LoopDisk,
}

fn ext4(size: u64) -> Fs {
    let disk = LoopDisk::new(size).expect("loop disk");
    mkfs_ext4(&disk.path);
    let dir = tempfile::Builder::new()
        .prefix("carina-copy-race-")
        .tempdir()
        .expect("tempdir");
    let mount = MountGuard::mount(&disk.dev(), dir.path(), Some("ext4"), None).expect("mount");
    Fs {
        _mount: mount,
        dir,
        _disk: disk,
    }
}

/// `len` bytes of `fill`.
fn content(fill: &[u8], len: usize) -> Vec<u8> {
    fill.iter().copied().cycle().take(len).collect()
}

/// Writes the same tree under `root` with `fill` as every file's content:
/// `f0..`, `sub/g0..`; the secret also has `only-in-secret`.
fn fill_tree(root: &Path, fill: &[u8], secret: bool) {
    std::fs::create_dir_all(root.join("sub")).expect("mkdir");
    for i in 0..FILES {
        std::fs::write(root.join(format!("f{i}")), content(fill, FILE_BYTES)).expect("write");
    }
    for i in 0..SUB_FILES {
        std::fs::write(root.join(format!("sub/g{i}")), content(fill, FILE_BYTES)).expect("write");
    }
    if secret {
        std::fs::write(root.join("only-in-secret"), fill).expect("write");
    }
}

/// Checks a clone: no file holds the secret, no entry is the secret's
/// own, every link is the one to the secret. Says whether `d` was copied
/// as a directory (else as the link).
fn check_clone(clone: &Path, secret: &Path) -> Option<bool> {
    fn walk(dir: &Path, secret: &Path) {
        for entry in std::fs::read_dir(dir).expect("list") {
            let path = entry.expect("entry").path();
            let meta = std::fs::symlink_metadata(&path).expect("stat");
            assert_ne!(
                path.file_name().and_then(|n| n.to_str()),
                Some("only-in-secret"),
                "{} came from the secret",
                path.display()
            );
            if meta.is_dir() {
                walk(&path, secret);
            } else if meta.is_file() {
                let data = std::fs::read(&path).expect("read");
                assert!(
                    !data.windows(SECRET.len()).any(|w| w == SECRET),
                    "{} holds the secret",
                    path.display()
                );
            } else if meta.file_type().is_symlink() {
                // A link is copied as its text: the one to the secret.
                assert_eq!(std::fs::read_link(&path).expect("readlink"), secret);
            }
        }
    }
    walk(clone, secret);
    std::fs::symlink_metadata(clone.join("d"))
        .ok()
        .map(|m| m.is_dir())
}

/// Exchanges `a` and `b` back to back until stopped, counting.
struct Swapper {
    stop: Arc<AtomicBool>,
    swaps: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Swapper {
    fn start(a: PathBuf, b: PathBuf) -> Swapper {
        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, swaps) = (stop.clone(), swaps.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    rustix::fs::renameat_with(
                        rustix::fs::CWD,
                        &a,
                        rustix::fs::CWD,
                        &b,
                        rustix::fs::RenameFlags::EXCHANGE,
                    )
                    .expect("exchange");
                    swaps.fetch_add(1, Ordering::AcqRel);
                }
            })
        };
        Swapper {
            stop,
            swaps,
            thread: Some(thread),
        }
    }

    fn swaps(&self) -> u64 {
        self.swaps.load(Ordering::Acquire)
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_copies_never_follow_a_directory_swapped_for_a_link() {
    let test = "host_copies_never_follow_a_directory_swapped_for_a_link";
    if !have_root(test) {
        return;
    }
    let fs = ext4(256 * MIB);
    let root = fs.dir.path().join("vols");
    let group = unique("race-host");
    let config = serde_json::json!({
        "diskSelector": [{"name": group, "policy": "HOST", "root": root, "reserveBytes": 0}],
        "diskScanInterval": "0",
    })
    .to_string();
    let records = tempfile::tempdir().expect("tempdir");
    let engine = Engine::start(
        Config::from_json(&config).expect("config"),
        EngineOptions {
            device_mapper: Some(false),
            copy_dir: Some(records.path().join("copies")),
            ..Default::default()
        },
    )
    .await
    .expect("engine starts");
    let req = |name: &str| CreateRequest {
        name: name.to_string(),
        group: group.clone(),
        size_bytes: 4 * MIB,
        exclusive: false,
    };

    // The secret: outside every volume, on the same file system.
    let secret = fs.dir.path().join("secret");
    fill_tree(&secret, SECRET, true);
    let src = create(&engine, req("race-src")).await;
    let src_dir = src.host_path.clone().expect("a directory");
    fill_tree(&src_dir.join("d"), b"public", false);
    std::fs::write(src_dir.join("top"), b"top").expect("write");
    std::os::unix::fs::symlink(&secret, src_dir.join("d.swap")).expect("symlink");

    let swapper = Swapper::start(src_dir.join("d"), src_dir.join("d.swap"));
    let (mut in_flight, mut as_dir, mut as_link, mut failed) = (0, 0, 0, Vec::new());
    for i in 0..COPIES {
        let target = format!("race-t{i}");
        let clone = create(&engine, req(&target)).await;
        let (tx, _rx) = watch::channel(Progress::default());
        let before = swapper.swaps();
        let result = engine
            .copy_volume(
                CopyRequest {
                    source: "race-src".into(),
                    target: target.clone(),
                    snapshot: false,
                },
                Arc::new(tx),
                Stop::default(),
            )
            .await;
        let during = swapper.swaps() - before;
        let clone_dir = clone.host_path.clone().expect("a directory");
        // Whatever a failed copy left is checked too.
        let d_is_dir = check_clone(&clone_dir, &secret);
        match result {
            Ok(copied) => {
                assert!(copied.copied);
                if during > 0 {
                    in_flight += 1;
                }
                match d_is_dir {
                    Some(true) => as_dir += 1,
                    Some(false) => as_link += 1,
                    None => panic!("a complete copy without `d`"),
                }
            }
            Err(e) => failed.push(e.to_string()),
        }
        engine.delete_volume(&target).await.expect("delete");
    }
    let swaps = swapper.swaps();
    drop(swapper);
    eprintln!(
        "{COPIES} copies, {} failed, {swaps} exchanges; {in_flight} copies had exchanges \
         during them; d copied as a directory {as_dir} times, as the link {as_link} times",
        failed.len()
    );
    assert!(failed.is_empty(), "copies failed: {failed:?}");
    assert!(
        in_flight >= COPIES / 2,
        "the race did not happen: only {in_flight} of {COPIES} copies ran while `d` was swapped"
    );
    assert!(
        as_dir > 0 && as_link > 0,
        "the copies saw `d` only one way (dir {as_dir}, link {as_link})"
    );
    // The source still holds its own tree and the link.
    let (d, link) = (src_dir.join("d"), src_dir.join("d.swap"));
    let real = if d.is_symlink() { &link } else { &d };
    assert_eq!(
        std::fs::read(real.join("f0")).expect("read"),
        content(b"public", FILE_BYTES)
    );
    drop(engine);
}
