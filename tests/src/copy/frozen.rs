//! Frozen file systems in the copy tests: nothing may hang for ever on
//! one. A wait, a write or a writer that does not finish within [`HANG`]
//! thaws the filesystem and fails the test.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::HANG;
use crate::run;

/// Thaws `mount_point` (what a hung test does before it fails).
pub fn thaw(mount_point: &Path) {
    let _ = run("fsfreeze", &["-u", &mount_point.to_string_lossy()]);
}

/// Waits until `cond` holds ([`crate::wait_until`]), for at most
/// [`HANG`]; on time out thaws `mount_point` and fails with `what`.
async fn wait_or_thaw(mount_point: &Path, what: &str, cond: impl FnMut() -> bool) {
    if let Err(e) = crate::wait_until(what, HANG, cond).await {
        thaw(mount_point);
        panic!("{e:#}");
    }
}

/// Asserts that the filesystem at `mount_point` takes a write and an
/// fsync (it is not left frozen). The write runs in a thread of its own,
/// so a frozen filesystem fails the test after [`HANG`] instead of
/// hanging it.
pub async fn assert_writable(mount_point: &Path, name: &str) {
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
#[derive(Debug)]
pub struct Writer {
    stop: Arc<AtomicBool>,
    /// Records written and synced.
    written: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    mount_point: PathBuf,
}

pub const RECORD: usize = 4096;

/// Record `i`: its number at both ends, a byte derived from it between.
pub fn record(i: u64) -> Vec<u8> {
    let mut r = vec![(i % 251) as u8; RECORD];
    r[..8].copy_from_slice(&i.to_le_bytes());
    r[RECORD - 8..].copy_from_slice(&(!i).to_le_bytes());
    r
}

/// How many whole, consecutive records from 0 `data` holds; any other
/// content fails.
pub fn check_records(data: &[u8], what: &str) -> u64 {
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
    pub fn start(mount_point: &Path, name: &str) -> Writer {
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

    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// Waits until `n` records were written and synced.
    pub async fn wait_for(&self, n: u64, what: &str) {
        let written = self.written.clone();
        wait_or_thaw(&self.mount_point, what, || {
            written.load(Ordering::Acquire) >= n
        })
        .await;
    }

    /// Stops the writer; how many records it wrote.
    pub async fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().expect("running");
        wait_or_thaw(&self.mount_point, "the writer stops", || {
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
