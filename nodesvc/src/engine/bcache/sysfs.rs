//! Every word the engine says to the kernel's bcache driver, and every
//! answer it reads, goes through [`Kernel`]: files under a configurable
//! sysfs root (`/sys` on a node; a temporary folder in tests), laid out as
//! the kernel's bcache documentation describes them:
//!
//! - `fs/bcache/register`: a device path written here is registered
//!   (backing devices and cache devices alike);
//! - `fs/bcache/<cset-uuid>/`: a registered cache set; writing `1` to
//!   `unregister` detaches its backing devices (flushing dirty data) and
//!   closes it;
//! - `dev/block/<major>:<minor>/bcache/`: a registered device. For a
//!   backing device: `attach` (a cache-set UUID), `detach`, `stop`,
//!   `cache_mode` (`writethrough [writeback] writearound none`), `state`
//!   (`no cache`, `clean`, `dirty`, `inconsistent`), `running`,
//!   `dirty_data` (human units), `stats_total/cache_hit_ratio` (percent),
//!   `dev` (a link to the bcache device's directory, holding `dev` =
//!   `major:minor`) and `cache` (a link to the cache set).
//!
//! Writes are one `write(2)` each, as `echo` does; the kernel acts on some
//! of them later (a device appears, a flush completes), so every change
//! is followed by [`Kernel::wait_until`] reading the attribute back until
//! it shows the change or the deadline passes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::CacheMode;
use crate::engine::error::{Error, Result};

/// A block device's numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevNum {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for DevNum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// The bcache block device (`/dev/bcacheN`) of a running backing device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BcacheDev {
    /// `bcacheN`
    pub name: String,
    pub dev: DevNum,
}

/// What the kernel shows of one registered backing device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackingStatus {
    /// `no cache`, `clean`, `dirty` or `inconsistent`.
    pub state: String,
    pub cache_mode: Option<CacheMode>,
    /// `dirty_data`, in bytes (the kernel prints it rounded).
    pub dirty_bytes: u64,
    /// `stats_total/cache_hit_ratio`, percent.
    pub hit_ratio_percent: u32,
    /// The bcache device is up (`running` = 1).
    pub running: bool,
    /// The UUID of the cache set it is attached to.
    pub cache_set: Option<String>,
    /// The bcache device, once the kernel made it.
    pub device: Option<BcacheDev>,
}

/// The state a detached backing device shows.
pub const NO_CACHE: &str = "no cache";

/// The kernel's bcache driver as files under `root`.
#[derive(Debug, Clone)]
pub struct Kernel {
    root: PathBuf,
    poll: Duration,
}

impl Kernel {
    /// The driver seen under the sysfs root `root`; waits read back every
    /// `poll`.
    pub fn new(root: impl Into<PathBuf>, poll: Duration) -> Kernel {
        Kernel {
            root: root.into(),
            poll,
        }
    }

    /// The sysfs root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `fs/bcache`: present exactly when the driver is loaded.
    pub fn fs_dir(&self) -> PathBuf {
        self.root.join("fs/bcache")
    }

    /// Whether the driver is loaded.
    pub async fn loaded(&self) -> bool {
        tokio::fs::metadata(self.fs_dir())
            .await
            .is_ok_and(|m| m.is_dir())
    }

    /// The `bcache` directory of a registered device `dev`.
    pub fn device_dir(&self, dev: DevNum) -> PathBuf {
        self.root.join(format!("dev/block/{dev}/bcache"))
    }

    /// The directory of the registered cache set `uuid`.
    pub fn cache_set_dir(&self, uuid: &str) -> PathBuf {
        self.fs_dir().join(uuid)
    }

    /// Whether `dev` (backing or cache) is registered.
    pub async fn registered(&self, dev: DevNum) -> bool {
        exists(&self.device_dir(dev)).await
    }

    /// Whether the cache set `uuid` is registered.
    pub async fn cache_set_registered(&self, uuid: &str) -> bool {
        exists(&self.cache_set_dir(uuid)).await
    }

    /// Registers the device at `path` (one with a bcache superblock).
    pub async fn register(&self, path: &Path) -> Result<()> {
        let value = path.to_string_lossy().into_owned();
        self.write(self.fs_dir().join("register"), value).await
    }

    /// Attaches the registered backing device `dev` to the cache set `uuid`.
    pub async fn attach(&self, dev: DevNum, uuid: &str) -> Result<()> {
        self.write(self.device_dir(dev).join("attach"), uuid.to_string())
            .await
    }

    /// Detaches `dev` from its cache set; the kernel flushes dirty data first.
    pub async fn detach(&self, dev: DevNum) -> Result<()> {
        self.write(self.device_dir(dev).join("detach"), "1".into())
            .await
    }

    /// Stops the backing device `dev` (its bcache device goes away).
    pub async fn stop(&self, dev: DevNum) -> Result<()> {
        self.write(self.device_dir(dev).join("stop"), "1".into())
            .await
    }

    /// Sets the cache mode of the backing device `dev`.
    pub async fn set_cache_mode(&self, dev: DevNum, mode: CacheMode) -> Result<()> {
        self.write(
            self.device_dir(dev).join("cache_mode"),
            mode.as_str().to_string(),
        )
        .await
    }

    /// Unregisters the cache set `uuid` (detaching, flushing, closing).
    pub async fn unregister_cache_set(&self, uuid: &str) -> Result<()> {
        self.write(self.cache_set_dir(uuid).join("unregister"), "1".into())
            .await
    }

    /// What the kernel shows of the backing device `dev`; `None` if it is
    /// not registered.
    pub async fn backing(&self, dev: DevNum) -> Result<Option<BackingStatus>> {
        let dir = self.device_dir(dev);
        if !exists(&dir).await {
            return Ok(None);
        }
        let state = read_attr(&dir.join("state")).await?.unwrap_or_default();
        let cache_mode = read_attr(&dir.join("cache_mode"))
            .await?
            .and_then(|m| parse_cache_mode(&m));
        let dirty_bytes = read_attr(&dir.join("dirty_data"))
            .await?
            .and_then(|d| parse_human_bytes(&d))
            .unwrap_or(0);
        let hit_ratio_percent = read_attr(&dir.join("stats_total/cache_hit_ratio"))
            .await?
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let running = read_attr(&dir.join("running")).await?.as_deref() == Some("1");
        let cache_set = link_name(&dir.join("cache")).await;
        let device = match link_name(&dir.join("dev")).await {
            Some(name) => read_attr(&dir.join("dev/dev"))
                .await?
                .and_then(|d| parse_devnum(&d))
                .map(|dev| BcacheDev { name, dev }),
            None => None,
        };
        Ok(Some(BackingStatus {
            state,
            cache_mode,
            dirty_bytes,
            hit_ratio_percent,
            running,
            cache_set,
            device,
        }))
    }

    /// Reads back with `check` every poll interval until it answers
    /// `true`; past `timeout` that is [`Error::KernelTimeout`] naming
    /// `what` was awaited.
    pub async fn wait_until<F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<bool>>,
    {
        let started = Instant::now();
        loop {
            if check().await? {
                return Ok(());
            }
            if started.elapsed() >= timeout {
                return Err(Error::KernelTimeout {
                    what: what.to_string(),
                    waited: timeout,
                });
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    /// One `write(2)` of `value` to an existing attribute, as `echo` does
    /// (never creating the file: a missing attribute is an error).
    #[tracing::instrument(level = "debug", skip(self), err, fields(carina.sysfs.path = %path.display(), carina.sysfs.value = %value))]
    async fn write(&self, path: PathBuf, value: String) -> Result<()> {
        let p = path.clone();
        let v = value.clone();
        tokio::task::spawn_blocking(move || {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&p)?;
            f.write_all(format!("{v}\n").as_bytes())
        })
        .await
        .map_err(|e| Error::task(format!("writing {}", path.display()), e))?
        .map_err(|source| Error::Sysfs {
            path,
            value,
            source,
        })
    }
}

async fn exists(path: &Path) -> bool {
    tokio::fs::symlink_metadata(path).await.is_ok()
}

/// An attribute's text, trimmed; `None` if it is not there.
async fn read_attr(path: &Path) -> Result<Option<String>> {
    match tokio::fs::read_to_string(path).await {
        Ok(s) => Ok(Some(s.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("read", path, e)),
    }
}

/// The last component of the link `path` points to.
async fn link_name(path: &Path) -> Option<String> {
    let target = tokio::fs::read_link(path).await.ok()?;
    target.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// The selected mode of `cache_mode` (`writethrough [writeback] ...`).
pub fn parse_cache_mode(text: &str) -> Option<CacheMode> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
        .and_then(CacheMode::from_kernel)
}

/// `major:minor`.
pub fn parse_devnum(text: &str) -> Option<DevNum> {
    let (major, minor) = text.trim().split_once(':')?;
    Some(DevNum {
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
    })
}

/// A size as bcache prints it (`512`, `0.0k`, `12.5M`, binary units), in
/// bytes.
pub fn parse_human_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&text[..i], Some(c)),
        _ => (text, None),
    };
    let shift = match unit {
        None => 0,
        Some(u) => 10 * (1 + "kMGTPEZY".find(u)? as u32),
    };
    let (whole, frac) = number.split_once('.').unwrap_or((number, "0"));
    let whole: u64 = whole.parse().ok()?;
    let tenths: u64 = frac.get(..1).unwrap_or("0").parse().ok()?;
    let unit_bytes = 1u64.checked_shl(shift)?;
    whole
        .checked_mul(unit_bytes)?
        .checked_add(tenths.checked_mul(unit_bytes)? / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_mode_is_the_bracketed_word() {
        assert_eq!(
            parse_cache_mode("writethrough [writeback] writearound none"),
            Some(CacheMode::Writeback)
        );
        assert_eq!(
            parse_cache_mode("[writethrough] writeback writearound none"),
            Some(CacheMode::Writethrough)
        );
        assert_eq!(
            parse_cache_mode("writethrough writeback writearound [none]"),
            Some(CacheMode::None)
        );
        assert_eq!(parse_cache_mode("writeback"), None);
    }

    #[test]
    fn human_sizes() {
        assert_eq!(parse_human_bytes("0.0k"), Some(0));
        assert_eq!(parse_human_bytes("512"), Some(512));
        assert_eq!(parse_human_bytes("1.5k"), Some(1536));
        assert_eq!(
            parse_human_bytes("12.5M"),
            Some(12 * (1 << 20) + (1 << 20) / 2)
        );
        assert_eq!(parse_human_bytes("2G"), Some(2 << 30));
        assert_eq!(parse_human_bytes("1.0Q"), None);
        assert_eq!(parse_human_bytes(""), None);
        assert_eq!(parse_human_bytes("99999999999999Y"), None);
    }

    #[test]
    fn devnums() {
        assert_eq!(
            parse_devnum("251:16\n"),
            Some(DevNum {
                major: 251,
                minor: 16
            })
        );
        assert_eq!(parse_devnum("251"), None);
    }

    #[tokio::test]
    async fn writes_never_create_attributes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let k = Kernel::new(dir.path(), Duration::from_millis(1));
        assert!(!k.loaded().await);
        let err = k
            .register(Path::new("/dev/loop9"))
            .await
            .expect_err("no driver");
        assert!(err.to_string().contains("fs/bcache/register"), "{err}");
        std::fs::create_dir_all(k.fs_dir()).expect("mkdir");
        std::fs::write(k.fs_dir().join("register"), "").expect("attr");
        assert!(k.loaded().await);
        k.register(Path::new("/dev/loop9")).await.expect("written");
        assert_eq!(
            std::fs::read_to_string(k.fs_dir().join("register")).expect("read"),
            "/dev/loop9\n"
        );
        let dev = DevNum { major: 7, minor: 9 };
        assert_eq!(k.backing(dev).await.expect("reads"), None);
        let err = k
            .wait_until("never", Duration::from_millis(5), || async { Ok(false) })
            .await
            .expect_err("times out");
        assert!(matches!(err, Error::KernelTimeout { .. }), "{err}");
    }
}
