//! bcache tiering: a bcache device made of a backing volume (the slow
//! group's LVM volume or RAW partition) and a cache volume (the fast
//! group's), assembled once and kept.
//!
//! - **Create** chooses a cache-set UUID, writes the device's
//!   [`record`] (phase `creating`), makes the volumes if asked to (the
//!   cache sized as a percentage of the backing volume), formats with
//!   `make-bcache` only a device that holds no bcache superblock, and
//!   assembles: registers the cache and the backing device, attaches,
//!   sets the cache mode. A failure undoes all of it (the device is
//!   stopped, our superblocks wiped, the volumes it made deleted, the
//!   record removed), so a retry starts clean; a create that died
//!   half-way is finished by the next create of that name.
//! - **Start** re-assembles every `ready` record from the superblocks it
//!   finds (checked against the record's UUIDs): it registers and
//!   attaches, and never formats.
//! - **Delete** switches a writeback device to writethrough, detaches
//!   (the kernel flushes dirty data first), stops the backing device,
//!   unregisters the cache set, wipes both superblocks and deletes the
//!   volumes the device made. Each step looks first, so a retry of a
//!   delete that failed half-way finishes it.
//!
//! All kernel interaction is [`sysfs::Kernel`]; the programs are in
//! [`tools`]. Operations on one device name are serialised by the
//! engine's busy lock (a second concurrent one is `Busy`).
//!
//! This file holds the types and the engine's bcache state; each verb has
//! a file of its own: `create`, `assemble` (the kernel side of create,
//! start and mode changes), `status` (get and list), `mode`, `delete`
//! and `recover` (start).

mod assemble;
mod create;
mod delete;
mod mode;
pub mod record;
mod recover;
mod status;
pub mod sysfs;
pub mod tools;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use self::record::{OwnedVolumes, Phase, Record, Records};
use self::sysfs::{BackingStatus, DevNum, Kernel};
use super::error::{Error, Result};
use super::volume::Volume;
use super::{Engine, names};

/// bcache cache modes, as the kernel names them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    #[default]
    Writethrough,
    Writeback,
    Writearound,
    None,
}

impl CacheMode {
    pub const ALL: [CacheMode; 4] = [
        CacheMode::Writethrough,
        CacheMode::Writeback,
        CacheMode::Writearound,
        CacheMode::None,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CacheMode::Writethrough => "writethrough",
            CacheMode::Writeback => "writeback",
            CacheMode::Writearound => "writearound",
            CacheMode::None => "none",
        }
    }

    /// The mode of a kernel (or Carina StorageClass) name.
    pub fn from_kernel(name: &str) -> Option<CacheMode> {
        CacheMode::ALL.into_iter().find(|m| m.as_str() == name)
    }
}

impl std::fmt::Display for CacheMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the bcache side of the engine looks and how long it waits.
#[derive(Debug, Clone)]
pub struct BcacheOptions {
    /// The sysfs root (`/sys`).
    pub sysfs_root: PathBuf,
    /// Where bcache device nodes are (`/dev`).
    pub dev_root: PathBuf,
    /// The node's state directory; records live in `<it>/bcache`. Without
    /// one, bcache operations are refused (`FAILED_PRECONDITION`).
    pub state_dir: Option<PathBuf>,
    /// How long a register, attach or mode change may take to show.
    pub settle_timeout: Duration,
    /// How long a detach may take to flush dirty data.
    pub flush_timeout: Duration,
    /// How often a wait reads sysfs again.
    pub poll: Duration,
}

impl Default for BcacheOptions {
    fn default() -> Self {
        BcacheOptions {
            sysfs_root: PathBuf::from("/sys"),
            dev_root: PathBuf::from("/dev"),
            state_dir: None,
            settle_timeout: Duration::from_secs(10),
            flush_timeout: Duration::from_secs(600),
            poll: Duration::from_millis(20),
        }
    }
}

/// What a caller asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BcacheRequest {
    pub name: String,
    pub backing_volume: String,
    pub cache_volume: String,
    pub cache_mode: CacheMode,
    /// Make both volumes (and delete them with the device); without it
    /// both must exist and stay when the device is deleted.
    pub create: Option<OwnedVolumes>,
}

/// A bcache device as the node knows it: its record, and what the kernel
/// shows of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BcacheDevice {
    pub name: String,
    pub backing_volume: String,
    pub cache_volume: String,
    /// The mode asked for (the kernel's is in `kernel`).
    pub cache_mode: CacheMode,
    pub cset_uuid: String,
    pub backing_uuid: Option<String>,
    pub owned: Option<OwnedVolumes>,
    pub phase: Phase,
    /// `None` while the backing device is not registered.
    pub kernel: Option<BackingStatus>,
    /// `/dev/bcacheN` once the kernel made it.
    pub device_path: Option<PathBuf>,
    /// Why the device is not (fully) up, when that is known.
    pub problem: Option<String>,
}

impl BcacheDevice {
    /// The kernel's state, or what stands for it: `unregistered`, or the
    /// record's phase while it is not `ready`.
    pub fn state(&self) -> String {
        match (&self.kernel, self.phase) {
            (_, Phase::Creating) => "creating".into(),
            (_, Phase::Deleting) => "deleting".into(),
            (Some(k), Phase::Ready) => k.state.clone(),
            (None, Phase::Ready) => "unregistered".into(),
        }
    }
}

/// The engine's bcache state: the kernel, the records and their table.
#[derive(Debug)]
pub(super) struct Bcache {
    options: BcacheOptions,
    kernel: Kernel,
    records: Option<Records>,
    table: StdMutex<BTreeMap<String, Record>>,
}

impl Bcache {
    /// Loads the records; a damaged one fails the start (it is never
    /// silently dropped).
    pub(super) fn load(options: BcacheOptions) -> Result<Bcache> {
        let records = options.state_dir.as_deref().map(Records::new);
        let table = match &records {
            Some(r) => r
                .load()?
                .into_iter()
                .map(|rec| (rec.name.clone(), rec))
                .collect(),
            None => BTreeMap::new(),
        };
        Ok(Bcache {
            kernel: Kernel::new(&options.sysfs_root, options.poll),
            options,
            records,
            table: StdMutex::new(table),
        })
    }

    fn table(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Record>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, name: &str) -> Option<Record> {
        self.table().get(name).cloned()
    }

    /// The device that uses volume `volume`, if any.
    pub(super) fn user_of(&self, volume: &str) -> Option<String> {
        self.table()
            .values()
            .find(|r| r.backing_volume == volume || r.cache_volume == volume)
            .map(|r| r.name.clone())
    }

    fn records(&self, operation: &'static str, name: &str) -> Result<&Records> {
        self.records
            .as_ref()
            .ok_or_else(|| Error::FailedPrecondition {
                operation,
                name: name.to_string(),
                reason: "the node has no state directory for bcache records (--state-dir)".into(),
            })
    }

    async fn put(&self, record: &Record) -> Result<()> {
        let records = self.records("record", &record.name)?.clone();
        let r = record.clone();
        tokio::task::spawn_blocking(move || records.put(&r))
            .await
            .map_err(|e| Error::task("writing a bcache record", e))??;
        self.table().insert(record.name.clone(), record.clone());
        Ok(())
    }

    async fn forget(&self, name: &str) -> Result<()> {
        let records = self.records("record", name)?.clone();
        let n = name.to_string();
        tokio::task::spawn_blocking(move || records.remove(&n))
            .await
            .map_err(|e| Error::task("removing a bcache record", e))??;
        self.table().remove(name);
        Ok(())
    }

    async fn require_kernel(&self, operation: &'static str, name: &str) -> Result<()> {
        if self.kernel.loaded().await {
            return Ok(());
        }
        Err(Error::FailedPrecondition {
            operation,
            name: name.to_string(),
            reason: format!(
                "the kernel has no bcache driver ({} is missing; load it with `modprobe bcache`)",
                self.kernel.fs_dir().display()
            ),
        })
    }
}

/// The busy-lock key of a device: volume names cannot hold a `/`.
fn lock_key(name: &str) -> String {
    format!("bcache/{name}")
}

fn check_field(field: &str, value: &str) -> Result<()> {
    names::check_volume_name(value).map_err(|e| match e {
        Error::InvalidArgument { reason, .. } => Error::invalid(field, reason),
        other => other,
    })
}

/// The cache volume's size: `ratio` percent of `size`, rounded up, at
/// least `make-bcache`'s smallest cache (the rule the control planes
/// place cache volumes by, [`carina_sys::bcache::cache_bytes`]).
pub fn cache_size(size: u64, ratio_percent: u32) -> u64 {
    carina_sys::bcache::cache_bytes(size, ratio_percent)
}

fn devnum(v: &Volume) -> DevNum {
    DevNum {
        major: v.major,
        minor: v.minor,
    }
}

fn device_of<'a>(v: &'a Volume, field: &'static str) -> Result<&'a Path> {
    v.device_path.as_deref().ok_or_else(|| Error::Unsupported {
        group: v.group.clone(),
        policy: v.policy.as_str(),
        operation: if field == "backing_volume" {
            "bcache backing volumes (no block device)"
        } else {
            "bcache cache volumes (no block device)"
        },
    })
}

impl Engine {
    fn bcache(&self) -> &Bcache {
        &self.inner.bcache
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_round_up() {
        const MIB: u64 = 1 << 20;
        assert_eq!(cache_size(200 * MIB, 50), 100 * MIB);
        assert_eq!(cache_size(200 * MIB + 1, 50), 100 * MIB + 1, "rounded up");
        // make-bcache's smallest cache device.
        assert_eq!(cache_size(100 * MIB, 50), 64 * MIB);
        assert_eq!(cache_size(1, 1), 64 * MIB);
        assert_eq!(cache_size(u64::MAX, 100), u64::MAX);
    }

    #[test]
    fn modes_round_trip() {
        for m in CacheMode::ALL {
            assert_eq!(CacheMode::from_kernel(m.as_str()), Some(m));
        }
        assert_eq!(CacheMode::from_kernel("fast"), None);
        assert_eq!(
            serde_json::to_string(&CacheMode::Writearound).expect("json"),
            "\"writearound\""
        );
    }
}
