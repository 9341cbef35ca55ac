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

pub mod record;
pub mod sysfs;
pub mod tools;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::{Instrument, instrument};

use self::record::{OwnedVolumes, Phase, Record, Records};
use self::sysfs::{BackingStatus, DevNum, Kernel, NO_CACHE};
use self::tools::Role;
use super::config::Policy;
use super::error::{Error, Result};
use super::volume::{CreateRequest, Volume};
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
/// place cache volumes by).
pub fn cache_size(size: u64, ratio_percent: u32) -> u64 {
    carina_csi::params::cache_bytes(size, ratio_percent)
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

/// Where a bcache superblock lives: 4 KiB at byte 4096 of the device.
const SB_OFFSET: u64 = 4096;
const SB_BYTES: usize = 4096;

/// Zeroes the bcache superblock of `dev` (opened exclusively, so a device
/// the kernel still holds is refused with `EBUSY`).
async fn wipe_superblock(dev: &Path) -> Result<()> {
    let path = dev.to_path_buf();
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let f = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_EXCL)
            .open(&path)?;
        f.write_all_at(&[0u8; SB_BYTES], SB_OFFSET)?;
        f.sync_all()
    })
    .await
    .map_err(|e| Error::task("wiping a bcache superblock", e))?
    .map_err(|e| Error::io("wipe the bcache superblock of", dev, e))
}

impl Engine {
    fn bcache(&self) -> &Bcache {
        &self.inner.bcache
    }

    /// Creates (or finds again) the bcache device `req.name`. The second
    /// value is `false` when it already existed with these arguments.
    ///
    /// Errors: `InvalidArgument` naming the field; `FailedPrecondition`
    /// without the kernel driver or a state directory, for a volume in
    /// use or holding someone else's superblock; `BcacheConflict` for the
    /// name with other arguments; the volume errors of the create.
    #[instrument(skip(self), err(level = "info"), fields(carina.bcache.name = %req.name, carina.bcache.backing = %req.backing_volume, carina.bcache.cache = %req.cache_volume))]
    pub async fn ensure_bcache(&self, req: BcacheRequest) -> Result<(BcacheDevice, bool)> {
        check_field("name", &req.name)?;
        check_field("backing_volume", &req.backing_volume)?;
        check_field("cache_volume", &req.cache_volume)?;
        if req.backing_volume == req.cache_volume {
            return Err(Error::invalid(
                "cache_volume",
                "must differ from backing_volume",
            ));
        }
        if let Some(o) = &req.create {
            if o.backing_group.is_empty() {
                return Err(Error::invalid("backing_device_group", "must not be empty"));
            }
            if o.cache_group.is_empty() {
                return Err(Error::invalid("cache_device_group", "must not be empty"));
            }
            names::check_size("size_bytes", o.size_bytes)?;
            if !(1..=100).contains(&o.cache_ratio_percent) {
                return Err(Error::invalid(
                    "cache_ratio_percent",
                    format!(
                        "{} is not a percentage from 1 to 100",
                        o.cache_ratio_percent
                    ),
                ));
            }
        }
        let _guard = self.inner.locks.try_lock(&lock_key(&req.name))?;
        let bcache = self.bcache();
        bcache.records("create", &req.name)?;
        bcache.require_kernel("create", &req.name).await?;

        let mut record = match bcache.get(&req.name) {
            Some(rec) => {
                let same = rec.backing_volume == req.backing_volume
                    && rec.cache_volume == req.cache_volume
                    && rec.owned == req.create
                    && rec.cache_mode == req.cache_mode;
                if !same {
                    return Err(Error::BcacheConflict {
                        name: req.name.clone(),
                        reason: format!(
                            "it exists with backing volume {:?}, cache volume {:?}, cache mode {}{}",
                            rec.backing_volume,
                            rec.cache_volume,
                            rec.cache_mode,
                            match &rec.owned {
                                Some(o) => format!(
                                    ", made in groups {:?}/{:?} with {} bytes and a {}% cache",
                                    o.backing_group,
                                    o.cache_group,
                                    o.size_bytes,
                                    o.cache_ratio_percent
                                ),
                                None => String::new(),
                            }
                        ),
                    });
                }
                match rec.phase {
                    Phase::Ready => {
                        let (b, c) = self.volumes_of(&rec).await?;
                        self.assemble(&rec, &b, &c).await?;
                        return Ok((self.describe(rec).await, false));
                    }
                    Phase::Deleting => {
                        return Err(Error::FailedPrecondition {
                            operation: "create",
                            name: req.name.clone(),
                            reason: "a delete of this bcache device began; finish it with DeleteBcache first".into(),
                        });
                    }
                    Phase::Creating => rec,
                }
            }
            None => self.new_record(&req).await?,
        };

        match self.build(&mut record).await {
            Ok(()) => Ok((self.describe(record).await, true)),
            Err(e) => {
                tracing::warn!(error = %e, "bcache create failed; undoing it");
                if let Err(undo) = self.teardown(&record).await {
                    tracing::error!(error = %undo, "undoing the failed bcache create did not finish; DeleteBcache retries it");
                }
                Err(e)
            }
        }
    }

    /// The record of a new device, checked against the volumes and written.
    async fn new_record(&self, req: &BcacheRequest) -> Result<Record> {
        let bcache = self.bcache();
        for (field, volume) in [
            ("backing_volume", &req.backing_volume),
            ("cache_volume", &req.cache_volume),
        ] {
            if let Some(user) = bcache.user_of(volume) {
                return Err(Error::FailedPrecondition {
                    operation: "create",
                    name: req.name.clone(),
                    reason: format!("{field} {volume:?} is part of bcache device {user:?}"),
                });
            }
            let existing = self.find(volume).await?;
            match (&req.create, existing) {
                (Some(_), Some(v)) => {
                    return Err(Error::BcacheConflict {
                        name: req.name.clone(),
                        reason: format!(
                            "{field} {volume:?} already exists (in group {:?}); name an existing volume without backing_device_group to use it",
                            v.group
                        ),
                    });
                }
                (None, None) => {
                    return Err(Error::VolumeNotFound {
                        name: volume.clone(),
                    });
                }
                (None, Some(v)) => {
                    device_of(&v, field)?;
                }
                (Some(_), None) => {}
            }
        }
        if let Some(o) = &req.create {
            for (field, group) in [
                ("backing_device_group", &o.backing_group),
                ("cache_device_group", &o.cache_group),
            ] {
                let slot = self.slot(group).await.map_err(|_| {
                    Error::invalid(
                        field,
                        format!("device group {group:?} is not configured on this node"),
                    )
                })?;
                let policy = slot.backend.config().policy;
                if policy == Policy::Host {
                    return Err(Error::Unsupported {
                        group: group.clone(),
                        policy: policy.as_str(),
                        operation: "bcache volumes (no block device)",
                    });
                }
            }
        }
        let record = Record {
            name: req.name.clone(),
            backing_volume: req.backing_volume.clone(),
            cache_volume: req.cache_volume.clone(),
            cache_mode: req.cache_mode,
            cset_uuid: tools::new_uuid()?,
            backing_uuid: None,
            owned: req.create.clone(),
            phase: Phase::Creating,
        };
        self.bcache().put(&record).await?;
        Ok(record)
    }

    /// Makes the volumes (if the device owns them), formats what holds no
    /// superblock of ours, assembles, and marks the record ready.
    async fn build(&self, record: &mut Record) -> Result<()> {
        let (backing, cache) = match &record.owned {
            Some(o) => {
                let (b, _) = self
                    .ensure_volume(CreateRequest {
                        name: record.backing_volume.clone(),
                        group: o.backing_group.clone(),
                        size_bytes: o.size_bytes,
                        exclusive: false,
                    })
                    .await?;
                let (c, _) = self
                    .ensure_volume(CreateRequest {
                        name: record.cache_volume.clone(),
                        group: o.cache_group.clone(),
                        size_bytes: cache_size(o.size_bytes, o.cache_ratio_percent),
                        exclusive: false,
                    })
                    .await?;
                (b, c)
            }
            None => self.volumes_of(record).await?,
        };
        let b_dev = device_of(&backing, "backing_volume")?.to_path_buf();
        let c_dev = device_of(&cache, "cache_volume")?.to_path_buf();
        let b_sb = self
            .our_superblock(record, "backing_volume", &backing, Role::Backing)
            .await?;
        let c_sb = self
            .our_superblock(record, "cache_volume", &cache, Role::Cache)
            .await?;
        if b_sb.is_none() || c_sb.is_none() {
            for (field, v, dev, missing) in [
                ("backing_volume", &backing, &b_dev, b_sb.is_none()),
                ("cache_volume", &cache, &c_dev, c_sb.is_none()),
            ] {
                if missing {
                    self.check_blank(record, field, v, dev).await?;
                }
            }
            tools::make_bcache(
                &record.cset_uuid,
                b_sb.is_none().then_some(b_dev.as_path()),
                c_sb.is_none()
                    .then_some((c_dev.as_path(), cache.size_bytes)),
                record.cache_mode,
            )
            .await?;
        }
        let b_sb = self
            .our_superblock(record, "backing_volume", &backing, Role::Backing)
            .await?
            .ok_or_else(|| {
                Error::parse(
                    format!("bcache-super-show {}", b_dev.display()),
                    "make-bcache left no superblock",
                )
            })?;
        record.backing_uuid = Some(b_sb.dev_uuid);
        self.bcache().put(record).await?;
        self.assemble(record, &backing, &cache).await?;
        record.phase = Phase::Ready;
        self.bcache().put(record).await?;
        Ok(())
    }

    /// The superblock on `v` if it is ours (our cache set, the right role,
    /// the recorded backing UUID); `None` if it has none. Someone else's
    /// is `FailedPrecondition`: it is never formatted over.
    async fn our_superblock(
        &self,
        record: &Record,
        field: &'static str,
        v: &Volume,
        role: Role,
    ) -> Result<Option<tools::Superblock>> {
        let dev = device_of(v, field)?;
        let Some(sb) = tools::super_show(dev).await? else {
            return Ok(None);
        };
        let uuid_ok = role == Role::Cache
            || record
                .backing_uuid
                .as_ref()
                .is_none_or(|u| *u == sb.dev_uuid);
        if sb.cset_uuid == record.cset_uuid && sb.role == role && uuid_ok {
            return Ok(Some(sb));
        }
        Err(Error::FailedPrecondition {
            operation: "create",
            name: record.name.clone(),
            reason: format!(
                "{field} {:?} ({}) holds a bcache {:?} superblock of cache set {} (device {}), not this device's; it is left as it is",
                v.name,
                dev.display(),
                sb.role,
                sb.cset_uuid,
                sb.dev_uuid
            ),
        })
    }

    /// Refuses to format a device that is in use or holds other data.
    async fn check_blank(
        &self,
        record: &Record,
        field: &str,
        v: &Volume,
        dev: &Path,
    ) -> Result<()> {
        let path = dev.to_path_buf();
        let busy = tokio::task::spawn_blocking(move || carina_sys::blockdev::in_use(&path))
            .await
            .map_err(|e| Error::task("checking a device", e))?
            .map_err(|e| Error::io("open", dev, e))?;
        if busy {
            return Err(Error::FailedPrecondition {
                operation: "create",
                name: record.name.clone(),
                reason: format!(
                    "{field} {:?} ({}) is in use (mounted or held open)",
                    v.name,
                    dev.display()
                ),
            });
        }
        let found = carina_sys::format::probe(dev).await.map_err(|e| match e {
            carina_sys::format::FormatError::Command(c) => Error::Command(c),
            other => Error::parse(format!("blkid {}", dev.display()), other),
        })?;
        if let Some(sig) = found {
            return Err(Error::FailedPrecondition {
                operation: "create",
                name: record.name.clone(),
                reason: format!(
                    "{field} {:?} ({}) holds {}; bcache formats blank volumes only",
                    v.name,
                    dev.display(),
                    sig.describe()
                ),
            });
        }
        Ok(())
    }

    /// Both volumes of a device; a missing one is `VolumeNotFound`.
    async fn volumes_of(&self, record: &Record) -> Result<(Volume, Volume)> {
        Ok((
            self.existing(&record.backing_volume).await?,
            self.existing(&record.cache_volume).await?,
        ))
    }

    /// Registers whatever is not registered, attaches, sets the mode and
    /// waits for the bcache device. Formats nothing.
    async fn assemble(&self, record: &Record, backing: &Volume, cache: &Volume) -> Result<()> {
        let k = &self.bcache().kernel;
        let settle = self.bcache().options.settle_timeout;
        let cset = record.cset_uuid.as_str();
        if !k.cache_set_registered(cset).await {
            k.register(device_of(cache, "cache_volume")?).await?;
            k.wait_until(&format!("cache set {cset} to register"), settle, || async {
                Ok(k.cache_set_registered(cset).await)
            })
            .await?;
        }
        let dev = devnum(backing);
        self.register_backing(backing).await?;
        let status = self.backing_status(dev).await?;
        match status.cache_set.as_deref() {
            Some(s) if s == cset => {}
            Some(other) => {
                return Err(Error::FailedPrecondition {
                    operation: "assemble",
                    name: record.name.clone(),
                    reason: format!(
                        "its backing device is attached to cache set {other}, not {cset}"
                    ),
                });
            }
            None => {
                k.attach(dev, cset).await?;
                k.wait_until(
                    &format!("backing device {dev} to attach to {cset}"),
                    settle,
                    || async {
                        Ok(self.backing_status(dev).await?.cache_set.as_deref() == Some(cset))
                    },
                )
                .await?;
            }
        }
        self.apply_mode(dev, record.cache_mode).await?;
        k.wait_until(
            &format!("bcache device of {dev} to run"),
            settle,
            || async {
                let s = self.backing_status(dev).await?;
                Ok(s.running && s.device.is_some())
            },
        )
        .await
    }

    /// Registers the backing volume's device unless it is, and waits for it.
    async fn register_backing(&self, backing: &Volume) -> Result<()> {
        let k = &self.bcache().kernel;
        let dev = devnum(backing);
        if k.registered(dev).await {
            return Ok(());
        }
        k.register(device_of(backing, "backing_volume")?).await?;
        k.wait_until(
            &format!("backing device {dev} to register"),
            self.bcache().options.settle_timeout,
            || async { Ok(k.registered(dev).await) },
        )
        .await
    }

    async fn backing_status(&self, dev: DevNum) -> Result<BackingStatus> {
        self.bcache()
            .kernel
            .backing(dev)
            .await?
            .ok_or_else(|| Error::FailedPrecondition {
                operation: "bcache",
                name: dev.to_string(),
                reason: "the backing device is not registered with the kernel".into(),
            })
    }

    async fn apply_mode(&self, dev: DevNum, mode: CacheMode) -> Result<()> {
        let k = &self.bcache().kernel;
        if self.backing_status(dev).await?.cache_mode == Some(mode) {
            return Ok(());
        }
        k.set_cache_mode(dev, mode).await?;
        k.wait_until(
            &format!("cache mode {mode} on {dev}"),
            self.bcache().options.settle_timeout,
            || async { Ok(self.backing_status(dev).await?.cache_mode == Some(mode)) },
        )
        .await
    }

    /// The device as the record and the kernel show it now.
    async fn describe(&self, record: Record) -> BcacheDevice {
        let mut problem = None;
        let mut kernel = None;
        if !self.bcache().kernel.loaded().await {
            problem = Some(format!(
                "the kernel has no bcache driver ({} is missing)",
                self.bcache().kernel.fs_dir().display()
            ));
        } else {
            match self.find(&record.backing_volume).await {
                Ok(Some(b)) => match self.bcache().kernel.backing(devnum(&b)).await {
                    Ok(k) => kernel = k,
                    Err(e) => problem = Some(e.to_string()),
                },
                Ok(None) => {
                    problem = Some(format!(
                        "backing volume {:?} not found",
                        record.backing_volume
                    ))
                }
                Err(e) => problem = Some(e.to_string()),
            }
            if problem.is_none() && !matches!(self.find(&record.cache_volume).await, Ok(Some(_))) {
                problem = Some(format!("cache volume {:?} not found", record.cache_volume));
            }
        }
        let device_path = kernel
            .as_ref()
            .and_then(|k| k.device.as_ref())
            .map(|d| self.bcache().options.dev_root.join(&d.name));
        BcacheDevice {
            name: record.name,
            backing_volume: record.backing_volume,
            cache_volume: record.cache_volume,
            cache_mode: record.cache_mode,
            cset_uuid: record.cset_uuid,
            backing_uuid: record.backing_uuid,
            owned: record.owned,
            phase: record.phase,
            kernel,
            device_path,
            problem,
        }
    }

    /// Whether a bcache device of that name is recorded: the cheap,
    /// quiet question the CSI node asks of every volume it is given.
    pub fn has_bcache(&self, name: &str) -> bool {
        self.bcache().get(name).is_some()
    }

    /// One bcache device; `BcacheNotFound` if there is none.
    #[instrument(skip(self), err(level = "info"), fields(carina.bcache.name = %name))]
    pub async fn get_bcache(&self, name: &str) -> Result<BcacheDevice> {
        check_field("name", name)?;
        let record = self
            .bcache()
            .get(name)
            .ok_or_else(|| Error::BcacheNotFound {
                name: name.to_string(),
            })?;
        Ok(self.describe(record).await)
    }

    /// Every bcache device, sorted by name.
    pub async fn list_bcache(&self) -> Vec<BcacheDevice> {
        let records: Vec<Record> = self.bcache().table().values().cloned().collect();
        let mut out = Vec::with_capacity(records.len());
        for r in records {
            out.push(self.describe(r).await);
        }
        out
    }

    /// Changes the cache mode, in the kernel and in the record.
    #[instrument(skip(self), err(level = "info"), fields(carina.bcache.name = %name, carina.bcache.mode = %mode))]
    pub async fn set_cache_mode(&self, name: &str, mode: CacheMode) -> Result<BcacheDevice> {
        check_field("name", name)?;
        let _guard = self.inner.locks.try_lock(&lock_key(name))?;
        let bcache = self.bcache();
        let mut record = bcache.get(name).ok_or_else(|| Error::BcacheNotFound {
            name: name.to_string(),
        })?;
        bcache.require_kernel("set cache mode of", name).await?;
        if record.phase != Phase::Ready {
            return Err(Error::FailedPrecondition {
                operation: "set cache mode of",
                name: name.to_string(),
                reason: format!("the device is {:?}, not ready", record.phase),
            });
        }
        let (b, c) = self.volumes_of(&record).await?;
        self.assemble(&record, &b, &c).await?;
        self.apply_mode(devnum(&b), mode).await?;
        if record.cache_mode != mode {
            record.cache_mode = mode;
            bcache.put(&record).await?;
        }
        Ok(self.describe(record).await)
    }

    /// Detaches (flushing), stops, wipes and deletes; `BcacheNotFound` if
    /// there is no such device.
    #[instrument(skip(self), err(level = "info"), fields(carina.bcache.name = %name))]
    pub async fn delete_bcache(&self, name: &str) -> Result<()> {
        check_field("name", name)?;
        let _guard = self.inner.locks.try_lock(&lock_key(name))?;
        let bcache = self.bcache();
        let mut record = bcache.get(name).ok_or_else(|| Error::BcacheNotFound {
            name: name.to_string(),
        })?;
        if record.phase != Phase::Deleting {
            record.phase = Phase::Deleting;
            bcache.put(&record).await?;
        }
        self.teardown(&record).await
    }

    /// Undoes a device as far as it got; every step looks first.
    async fn teardown(&self, record: &Record) -> Result<()> {
        let bcache = self.bcache();
        let k = &bcache.kernel;
        let settle = bcache.options.settle_timeout;
        let backing = self.find(&record.backing_volume).await?;
        let cache = self.find(&record.cache_volume).await?;
        if k.loaded().await {
            if let Some(b) = &backing
                && let Some(status) = k.backing(devnum(b)).await?
            {
                let dev = devnum(b);
                if let Some(d) = &status.device {
                    let node = bcache.options.dev_root.join(&d.name);
                    let n = node.clone();
                    let busy =
                        tokio::task::spawn_blocking(move || carina_sys::blockdev::in_use(&n))
                            .await
                            .map_err(|e| Error::task("checking a device", e))?
                            .map_err(|e| Error::io("open", &node, e))?;
                    if busy {
                        return Err(Error::FailedPrecondition {
                            operation: "delete",
                            name: record.name.clone(),
                            reason: format!("{} is in use (mounted or held open)", node.display()),
                        });
                    }
                }
                if status.cache_set.is_some() {
                    if status.cache_mode == Some(CacheMode::Writeback) {
                        // No new dirty data while the old is flushed.
                        self.apply_mode(dev, CacheMode::Writethrough).await?;
                    }
                    k.detach(dev).await?;
                    k.wait_until(
                        &format!("backing device {dev} to flush and detach"),
                        bcache.options.flush_timeout,
                        || async {
                            Ok(k.backing(dev)
                                .await?
                                .is_none_or(|s| s.cache_set.is_none() && s.state == NO_CACHE))
                        },
                    )
                    .await?;
                }
                k.stop(dev).await?;
                k.wait_until(&format!("backing device {dev} to stop"), settle, || async {
                    Ok(!k.registered(dev).await)
                })
                .await?;
            }
            let cset = record.cset_uuid.as_str();
            if k.cache_set_registered(cset).await {
                k.unregister_cache_set(cset).await?;
                k.wait_until(
                    &format!("cache set {cset} to unregister"),
                    settle,
                    || async { Ok(!k.cache_set_registered(cset).await) },
                )
                .await?;
            }
        }
        for (v, role) in [(&backing, Role::Backing), (&cache, Role::Cache)] {
            let Some(v) = v else { continue };
            let Some(dev) = v.device_path.as_deref() else {
                continue;
            };
            if let Some(sb) = tools::super_show(dev).await?
                && sb.cset_uuid == record.cset_uuid
                && sb.role == role
            {
                wipe_superblock(dev).await?;
            }
        }
        if record.owned.is_some() {
            for v in [&record.backing_volume, &record.cache_volume] {
                match self.delete_volume_unchecked(v).await {
                    Ok(()) | Err(Error::VolumeNotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        bcache.forget(&record.name).await
    }

    /// Re-assembles every ready device after a start: registers, attaches
    /// and sets the mode from the superblocks and the records; formats
    /// nothing. Failures are logged per device and do not stop the node.
    pub(super) async fn recover_bcache(&self) {
        let records: Vec<Record> = self.bcache().table().values().cloned().collect();
        if records.is_empty() {
            return;
        }
        if !self.bcache().kernel.loaded().await {
            tracing::error!(
                devices = records.len(),
                "bcache devices are recorded but the kernel has no bcache driver; they stay down"
            );
            return;
        }
        for record in records {
            if record.phase != Phase::Ready {
                tracing::warn!(carina.bcache.name = %record.name, phase = ?record.phase, "bcache device was left half-way; CreateBcache finishes it, DeleteBcache removes it");
                continue;
            }
            let span = tracing::info_span!("bcache.recover", carina.bcache.name = %record.name);
            if let Err(e) = self.recover_one(&record).instrument(span).await {
                tracing::error!(carina.bcache.name = %record.name, error = %e, "bcache device not re-assembled");
            } else {
                tracing::info!(carina.bcache.name = %record.name, "bcache device re-assembled");
            }
        }
    }

    async fn recover_one(&self, record: &Record) -> Result<()> {
        let backing = self.existing(&record.backing_volume).await?;
        let cache = match self.existing(&record.cache_volume).await {
            Ok(c) => c,
            Err(e) => {
                // Register the backing device alone: the kernel keeps it
                // stopped while its cache is missing (so dirty data is
                // never bypassed) and the record says what is missing.
                self.our_superblock(record, "backing_volume", &backing, Role::Backing)
                    .await?
                    .ok_or_else(|| self.lost_superblock(record, "backing_volume", &backing))?;
                self.register_backing(&backing).await?;
                return Err(e);
            }
        };
        for (field, v, role) in [
            ("backing_volume", &backing, Role::Backing),
            ("cache_volume", &cache, Role::Cache),
        ] {
            self.our_superblock(record, field, v, role)
                .await?
                .ok_or_else(|| self.lost_superblock(record, field, v))?;
        }
        self.assemble(record, &backing, &cache).await
    }

    fn lost_superblock(&self, record: &Record, field: &str, v: &Volume) -> Error {
        Error::FailedPrecondition {
            operation: "re-assemble",
            name: record.name.clone(),
            reason: format!(
                "{field} {:?} holds no bcache superblock any more; it is not formatted again",
                v.name
            ),
        }
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
