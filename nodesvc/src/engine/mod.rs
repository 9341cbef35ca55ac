//! The storage engine: device groups built from the node's disks, and the
//! volumes carved out of them.
//!
//! [`Engine`] is the async API the rest of the workspace calls. It validates
//! names and sizes, keeps one [`backend::Backend`] per configured group
//! (LVM, RAW, HOST), serialises mutations per group so free-space checks
//! cannot race, refuses a second concurrent operation on one volume name,
//! and publishes a [`CapacitySnapshot`] after every change.

pub mod backend;
pub mod bcache;
pub mod config;
pub mod copy;
pub mod devnum;
pub mod disks;
pub mod error;
pub mod gpt;
pub mod health;
pub mod host;
pub mod intents;
pub mod inuse;
pub mod iolimits;
pub mod locks;
pub mod lvm;
pub mod names;
pub mod quota;
pub mod raw;
mod scan;
mod synced;
pub mod trace_links;
pub mod volume;
pub mod wipe;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicBool, Ordering};

use carina_sys::crashpoint;
use tokio::sync::{Mutex, RwLock, watch};
use tracing::{Instrument, instrument};

use self::intents::{Intent, Operation};
use self::scan::build_groups;

pub use backend::{Backend, GroupLock};
pub use config::{Activation, Config, GroupConfig, Policy, SchedulerStrategy};
pub use disks::{Disk, DiskStatus};
pub use error::{Error, Result};
pub use volume::{CapacitySnapshot, ChangeReason, CreateRequest, GroupCapacity, QuotaMode, Volume};

/// Settings of the engine that are not part of `config.json`.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    /// Whether the kernel has device-mapper; `None` detects it.
    pub device_mapper: Option<bool>,
    /// How `lvm` commands run (one persistent shell by default).
    pub lvm: lvm::LvmOptions,
    /// Where the bcache side finds the kernel, its records, and how long
    /// it waits.
    pub bcache: bcache::BcacheOptions,
    /// Where the cgroup hierarchies are mounted (pods' IO limits);
    /// `None` is [`iolimits::DEFAULT_CGROUP_ROOT`].
    pub cgroup_root: Option<std::path::PathBuf>,
    /// Where each volume's creation trace is kept
    /// ([`trace_links::TraceLinks`]); `None` keeps none.
    pub trace_dir: Option<std::path::PathBuf>,
    /// Where the records of copied volumes are kept
    /// ([`copy::record::CopyRecords`]); `None` keeps them in memory.
    pub copy_dir: Option<std::path::PathBuf>,
    /// Where the journal of changes in progress is kept
    /// ([`intents::Intents`]), so a node killed mid-change repairs it at
    /// its next start; `None` keeps it in memory (no repair after a crash).
    pub intent_dir: Option<std::path::PathBuf>,
    /// How long a copy may keep its source's filesystem frozen; `None`
    /// is [`copy::DEFAULT_FREEZE_TIMEOUT`].
    pub freeze_timeout: Option<std::time::Duration>,
}

/// The span of one backend mutation, the same for every policy:
/// `lvm.create`, `raw.resize`, `host.delete`, ... with the group and the
/// policy; the volume is on the engine's span above it, the commands below.
fn backend_span(backend: &dyn Backend, op: &'static str) -> tracing::Span {
    let config = backend.config();
    tracing::info_span!(
        "backend",
        otel.name = %format_args!("{}.{op}", config.policy.as_str().to_ascii_lowercase()),
        carina.group = %config.name,
        carina.policy = %config.policy,
    )
}

/// Runs one backend mutation under its [`backend_span`] and times it in
/// `carina_node_engine_operation_duration_seconds` (by operation, policy
/// and result).
async fn backend_call<T>(
    backend: &dyn Backend,
    op: &'static str,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let started = std::time::Instant::now();
    let result = call.instrument(backend_span(backend, op)).await;
    crate::latency::latency().operation(
        op,
        backend.config().policy.as_str(),
        result.is_ok(),
        started.elapsed(),
    );
    result
}

/// A call that waited while a new configuration changed its group's
/// allocation unit: its rounded size no longer fits the group.
fn changed_unit() -> Error {
    Error::invalid(
        "size_bytes",
        "the device group's allocation unit changed while the call waited; retry",
    )
}

/// What the configuration accepted with a warning (older Carina forms).
fn log_config_warnings(config: &Config) {
    for warning in &config.warnings {
        tracing::warn!("config.json: {warning}");
    }
}

/// True if the kernel offers device-mapper. `/dev/mapper/control` alone
/// proves nothing (packages create the node on kernels without the
/// driver); the driver registers itself in `/proc/misc`.
pub fn detect_device_mapper() -> bool {
    std::fs::read_to_string("/proc/misc")
        .map(|m| m.lines().any(|l| l.trim_end().ends_with(" device-mapper")))
        .unwrap_or(false)
        || std::path::Path::new("/sys/module/dm_mod/initstate").exists()
}

/// The node's storage engine. Cheap to clone; clones share all state.
#[derive(Debug, Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    device_mapper: bool,
    /// Runs every `lvm` command of the node (its LVM groups', discovery's).
    lvm: Arc<lvm::LvmRunner>,
    state: RwLock<State>,
    locks: locks::VolumeLocks,
    capacity: watch::Sender<CapacitySnapshot>,
    /// Held while a snapshot is taken and sent, so a later generation is
    /// never an older reading.
    notifying: Mutex<()>,
    /// Volume name → group, kept current by every mutation and rescan, so
    /// lookups do not ask every backend.
    index: StdMutex<HashMap<String, String>>,
    disks: StdMutex<Vec<DiskStatus>>,
    /// LVM and RAW groups that took no disk at the last scan, by name.
    empty: StdMutex<BTreeMap<String, disks::EmptyGroup>>,
    bcache: bcache::Bcache,
    /// Where pods' cgroups are looked for.
    cgroup_root: std::path::PathBuf,
    trace_links: Option<trace_links::TraceLinks>,
    copies: copy::record::CopyRecords,
    /// The journal of changes in progress, settled at start.
    intents: intents::Intents,
    freeze_timeout: std::time::Duration,
}

#[derive(Debug)]
struct State {
    config: Config,
    groups: BTreeMap<String, GroupSlot>,
}

#[derive(Debug, Clone)]
struct GroupSlot {
    backend: Arc<dyn Backend>,
    /// Held by every mutation of the group (create, resize, delete, rescan).
    mutate: Arc<Mutex<()>>,
    /// Set, under `mutate`, by the configuration apply that replaces this
    /// slot: a mutation that gets the lock afterwards must not change the
    /// group through it (the new slot's rescan would never see the change).
    retired: Arc<AtomicBool>,
}

impl GroupSlot {
    pub(super) fn new(backend: Arc<dyn Backend>) -> GroupSlot {
        GroupSlot {
            backend,
            mutate: Arc::new(Mutex::new(())),
            retired: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether a configuration apply replaced the slot.
    pub(super) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Marks the slot replaced; the caller holds its lock.
    pub(super) fn retire(&self, _locked: &tokio::sync::MutexGuard<'_, ()>) {
        self.retired.store(true, Ordering::Release);
    }
}

impl Engine {
    /// Builds the groups of `config`, takes their disks and re-establishes
    /// existing volumes (VG activation, loop mappings).
    #[instrument(skip_all, err)]
    pub async fn start(config: Config, options: EngineOptions) -> Result<Engine> {
        log_config_warnings(&config);
        crate::latency::observe_commands();
        let device_mapper = options.device_mapper.unwrap_or_else(detect_device_mapper);
        let lvm = Arc::new(lvm::LvmRunner::new(options.lvm));
        let groups = build_groups(&config, device_mapper, &lvm)?;
        let bcache = bcache::Bcache::load(options.bcache)?;
        // Random where the kernel gives randomness, else the start time:
        // it only has to differ between starts.
        let incarnation = bcache::tools::new_uuid().unwrap_or_else(|_| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            format!("{}-{}", now.as_nanos(), std::process::id())
        });
        let (capacity, _) = watch::channel(CapacitySnapshot {
            incarnation,
            generation: 0,
            reason: ChangeReason::Start,
            groups: Vec::new(),
        });
        let engine = Engine {
            inner: Arc::new(Inner {
                device_mapper,
                lvm,
                state: RwLock::new(State { config, groups }),
                locks: locks::VolumeLocks::default(),
                capacity,
                notifying: Mutex::new(()),
                index: StdMutex::new(HashMap::new()),
                disks: StdMutex::new(Vec::new()),
                empty: StdMutex::new(BTreeMap::new()),
                bcache,
                trace_links: options.trace_dir.clone().map(trace_links::TraceLinks::new),
                copies: copy::record::CopyRecords::new(options.copy_dir.clone()),
                intents: intents::Intents::new(options.intent_dir.clone()),
                freeze_timeout: options
                    .freeze_timeout
                    .unwrap_or(copy::DEFAULT_FREEZE_TIMEOUT),
                cgroup_root: options
                    .cgroup_root
                    .unwrap_or_else(|| iolimits::DEFAULT_CGROUP_ROOT.into()),
            }),
        };
        engine.thaw_leftover_freezes();
        engine.rescan_with(ChangeReason::Start).await?;
        engine.settle_interrupted().await;
        engine.recover_bcache().await;
        Ok(engine)
    }

    /// Where the last finished change is in the capacity reports: its
    /// incarnation and the newest generation (which reflects it).
    pub fn capacity_version(&self) -> (String, u64) {
        let snap = self.inner.capacity.borrow();
        (snap.incarnation.clone(), snap.generation)
    }

    /// Whether LVM volumes use device-mapper (otherwise loop exposure).
    pub fn device_mapper(&self) -> bool {
        self.inner.device_mapper
    }

    /// How `lvm` commands run.
    pub fn lvm_options(&self) -> &lvm::LvmOptions {
        self.inner.lvm.options()
    }

    /// The pid of the node's persistent `lvm` shell while one runs
    /// (diagnostics and tests; it changes when a shell is replaced).
    pub fn lvm_shell_pid(&self) -> Option<u32> {
        self.inner.lvm.shell_pid()
    }

    /// The configuration in force.
    pub async fn config(&self) -> Config {
        self.inner.state.read().await.config.clone()
    }

    /// Creates a volume, or returns the existing one when the same name,
    /// group and (rounded) size are requested again.
    pub async fn create_volume(&self, req: CreateRequest) -> Result<Volume> {
        self.ensure_volume(req).await.map(|(v, _)| v)
    }

    /// [`Engine::create_volume`] that also says whether this call created
    /// the volume (`false`: it already existed with these arguments). The
    /// answer is exact: it is decided under the volume's lock.
    #[instrument(skip(self), err(level = "info"), fields(carina.volume.name = %req.name, carina.group = %req.group, carina.volume.size_bytes = req.size_bytes))]
    pub async fn ensure_volume(&self, req: CreateRequest) -> Result<(Volume, bool)> {
        names::check_volume_name(&req.name)?;
        names::check_size("size_bytes", req.size_bytes)?;
        if req.group.is_empty() {
            return Err(Error::invalid("group", "must not be empty"));
        }
        let _guard = self.inner.locks.try_lock(&req.name)?;
        self.settle(&req.name).await?;
        let slot = self.slot(&req.group).await?;
        let backend = &slot.backend;
        if req.exclusive && backend.config().policy != Policy::Raw {
            return Err(Error::Unsupported {
                group: req.group.clone(),
                policy: backend.config().policy.as_str(),
                operation: "exclusive (whole-disk) volumes",
            });
        }
        let rounded = backend.round_size(req.size_bytes).ok_or_else(|| {
            Error::invalid(
                "size_bytes",
                format!(
                    "{} cannot be rounded to the allocation unit",
                    req.size_bytes
                ),
            )
        })?;
        if let Some(existing) = self.find(&req.name).await? {
            let same = existing.group == req.group
                && existing.exclusive == req.exclusive
                && (existing.size_bytes == rounded
                    || (req.exclusive && existing.size_bytes >= rounded));
            if same {
                self.keep_creation_trace(&existing.name);
                return Ok((existing, false));
            }
            return Err(Error::AlreadyExists {
                name: req.name.clone(),
                group: existing.group,
                existing_bytes: existing.size_bytes,
                requested_bytes: rounded,
            });
        }
        let rounded_req = CreateRequest {
            size_bytes: rounded,
            ..req
        };
        let volume = {
            let (slot, lock) = self.lock_current(slot).await?;
            let backend = &slot.backend;
            if backend.round_size(rounded_req.size_bytes) != Some(rounded_req.size_bytes) {
                return Err(changed_unit());
            }
            let name = &rounded_req.name;
            self.inner.intents.begin(
                name,
                &Intent {
                    operation: Operation::Create,
                    group: rounded_req.group.clone(),
                    size_bytes: rounded_req.size_bytes,
                },
            )?;
            crashpoint::reach("create.begun", name);
            let created = backend_call(
                backend.as_ref(),
                "create",
                backend.create_releasing(&rounded_req, &lock),
            )
            .await;
            let volume = match created {
                Ok(volume) => volume,
                Err(e) => {
                    self.end_failed_create(backend.as_ref(), name).await;
                    return Err(e);
                }
            };
            crashpoint::reach("create.made", name);
            if let Err(e) = self.inner.intents.end(name) {
                // Answered, the volume would be rolled back at the next
                // start: it goes now, or then if this fails too.
                tracing::warn!(carina.volume.name = %name, error = %e, "the create cannot be recorded as done; rolling it back");
                // The backend may have handed the group's lock back for
                // its last steps.
                lock.reacquire().await;
                if backend_call(backend.as_ref(), "delete", backend.delete(name))
                    .await
                    .is_ok()
                {
                    let _ = self.inner.intents.end(name);
                }
                return Err(e);
            }
            // Indexed under the group's lock, like a rescan's listing.
            self.index_insert(&volume.name, &volume.group);
            volume
        };
        self.keep_creation_trace(&volume.name);
        self.notify(ChangeReason::Create).await;
        Ok((volume, true))
    }

    /// Keeps the current trace as `name`'s creation trace, unless it has
    /// one (a retried create keeps the first).
    fn keep_creation_trace(&self, name: &str) {
        if let (Some(links), Some(traceparent)) = (
            &self.inner.trace_links,
            carina_proto::trace::current_traceparent(),
        ) {
            links.record(name, &traceparent);
        }
    }

    /// The W3C `traceparent` of the span that created volume `name`, if
    /// the node kept one.
    pub fn creation_trace(&self, name: &str) -> Option<String> {
        names::check_volume_name(name).ok()?;
        self.inner.trace_links.as_ref()?.get(name)
    }

    /// The volume of that name, in whichever group holds it.
    #[instrument(skip(self), err(level = "info"), fields(carina.volume.name = %name))]
    pub async fn get_volume(&self, name: &str) -> Result<Volume> {
        names::check_volume_name(name)?;
        self.existing(name).await
    }

    /// The volume of that name, or `VolumeNotFound`.
    async fn existing(&self, name: &str) -> Result<Volume> {
        self.find(name).await?.ok_or_else(|| Error::VolumeNotFound {
            name: name.to_string(),
        })
    }

    /// Every volume we own, optionally of one group, sorted by name.
    #[instrument(skip(self), err)]
    pub async fn list_volumes(&self, group: Option<&str>) -> Result<Vec<Volume>> {
        let slots = self.slots(group).await?;
        let mut all = Vec::new();
        for slot in slots {
            all.extend(slot.backend.list().await?);
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    /// Grows a volume to at least `size_bytes` (rounded up to the group's
    /// unit). Shrinking is refused, and growing a volume a bcache device
    /// is made of; the current size is a no-op.
    #[instrument(skip(self), err(level = "info"), fields(carina.volume.name = %name, carina.volume.size_bytes = size_bytes))]
    pub async fn resize_volume(&self, name: &str, size_bytes: u64) -> Result<Volume> {
        names::check_volume_name(name)?;
        names::check_size("size_bytes", size_bytes)?;
        let _guard = self.inner.locks.try_lock(name)?;
        self.settle(name).await?;
        let existing = self.existing(name).await?;
        if let Some(device) = self.inner.bcache.user_of(name)
            && size_bytes > existing.size_bytes
        {
            // The kernel sizes a bcache device when it registers the
            // backing device, and a cache sized by ratio would not follow.
            return Err(Error::FailedPrecondition {
                operation: "resize",
                name: name.to_string(),
                reason: format!(
                    "the volume is part of bcache device {device:?}, and bcache devices cannot grow"
                ),
            });
        }
        if size_bytes > existing.size_bytes && self.is_snapshot(name)? {
            return Err(Error::FailedPrecondition {
                operation: "resize",
                name: name.to_string(),
                reason: "the volume is a snapshot, which is read-only".to_string(),
            });
        }
        let slot = self.slot(&existing.group).await?;
        let rounded = slot.backend.round_size(size_bytes).ok_or_else(|| {
            Error::invalid(
                "size_bytes",
                format!("{size_bytes} cannot be rounded to the allocation unit"),
            )
        })?;
        if rounded == existing.size_bytes || (existing.exclusive && rounded <= existing.size_bytes)
        {
            return Ok(existing);
        }
        if rounded < existing.size_bytes {
            return Err(Error::FailedPrecondition {
                operation: "resize",
                name: name.to_string(),
                reason: format!(
                    "shrinking from {} to {rounded} bytes is not supported",
                    existing.size_bytes
                ),
            });
        }
        let volume = {
            let (slot, _lock) = self.lock_current(slot).await?;
            if slot.backend.round_size(rounded) != Some(rounded) {
                return Err(changed_unit());
            }
            self.inner.intents.begin(
                name,
                &Intent {
                    operation: Operation::Resize,
                    group: existing.group.clone(),
                    size_bytes: rounded,
                },
            )?;
            crashpoint::reach("resize.begun", name);
            let resized = backend_call(
                slot.backend.as_ref(),
                "resize",
                slot.backend.resize(name, rounded),
            )
            .await;
            // Either size is a whole volume: the record only has to go.
            self.end_quietly(name);
            resized?
        };
        self.notify(ChangeReason::Resize).await;
        Ok(volume)
    }

    /// Deletes a volume we own; `VolumeNotFound` if there is none, and
    /// `FailedPrecondition` while a bcache device is made of it.
    #[instrument(skip(self), err(level = "info"), fields(carina.volume.name = %name))]
    pub async fn delete_volume(&self, name: &str) -> Result<()> {
        names::check_volume_name(name)?;
        if let Some(device) = self.inner.bcache.user_of(name) {
            return Err(Error::FailedPrecondition {
                operation: "delete",
                name: name.to_string(),
                reason: format!(
                    "the volume is part of bcache device {device:?}; delete that first"
                ),
            });
        }
        self.delete_volume_unchecked(name).await
    }

    /// [`Engine::delete_volume`] without the bcache check (a bcache
    /// delete removes its own volumes).
    async fn delete_volume_unchecked(&self, name: &str) -> Result<()> {
        let _guard = self.inner.locks.try_lock(name)?;
        if self.settle(name).await? == Some(Operation::Delete) {
            // This is the retry of a delete the node was killed in, and
            // settling it finished it.
            self.notify(ChangeReason::Delete).await;
            return Ok(());
        }
        // The index names the group and the backend's delete says whether
        // the volume is there: reading it first would read the group twice.
        let not_found = || Error::VolumeNotFound {
            name: name.to_string(),
        };
        // Gone: its index entry and creation trace go too.
        let forget = || {
            self.index_remove(name);
            if let Some(links) = &self.inner.trace_links {
                links.forget(name);
            }
            self.inner.copies.remove(name);
        };
        let slot = match self.indexed_group(name) {
            Some(group) => self.slot(&group).await.ok(),
            None => None,
        };
        let Some(slot) = slot else {
            forget();
            return Err(not_found());
        };
        let deleted = {
            let (slot, _lock) = self.lock_current(slot).await?;
            self.ensure_not_in_use(slot.backend.as_ref(), name).await?;
            self.inner.intents.begin(
                name,
                &Intent {
                    operation: Operation::Delete,
                    group: slot.backend.config().name.clone(),
                    size_bytes: 0,
                },
            )?;
            crashpoint::reach("delete.begun", name);
            backend_call(slot.backend.as_ref(), "delete", slot.backend.delete(name)).await
        };
        match deleted {
            Ok(()) => self.end_quietly(name),
            Err(e @ Error::VolumeNotFound { .. }) => {
                self.end_quietly(name);
                forget();
                return Err(e);
            }
            // Refused before anything changed: the volume is whole.
            Err(e @ (Error::FailedPrecondition { .. } | Error::InvalidArgument { .. })) => {
                self.end_quietly(name);
                return Err(e);
            }
            // The volume may be half removed: the record stays, and the
            // delete is finished by the next change of the volume or the
            // node's next start.
            Err(e) => return Err(e),
        }
        forget();
        self.notify(ChangeReason::Delete).await;
        Ok(())
    }

    /// Refuses to delete a volume that is mounted on this node (staged,
    /// published, its device node or directory bound): `FailedPrecondition`
    /// naming the mounts, the volume kept whole. The operator's word is the
    /// unmount: once the pod that uses it is gone from this node, the
    /// control plane's next DeleteLV goes through. There is no force: a
    /// delete under a running pod is what this refuses.
    async fn ensure_not_in_use(&self, backend: &dyn Backend, name: &str) -> Result<()> {
        let Some(volume) = backend.get(name).await? else {
            // Not there: the backend's delete answers NOT_FOUND.
            return Ok(());
        };
        let text = tokio::fs::read_to_string(quota::MOUNTINFO)
            .await
            .map_err(|e| Error::io("read", quota::MOUNTINFO, e))?;
        let entries =
            carina_sys::mount::parse_mountinfo(&text).map_err(|e| Error::parse("mountinfo", e))?;
        let table = carina_sys::mount::MountTable::from_entries(entries);
        let host_dir = match &volume.host_path {
            Some(dir) => tokio::fs::canonicalize(dir).await.ok(),
            None => None,
        };
        let mounts = inuse::mounts_of(&table, &volume, host_dir.as_deref());
        if mounts.is_empty() {
            return Ok(());
        }
        let list = mounts
            .iter()
            .map(|m| m.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        tracing::warn!(
            carina.volume.name = %name,
            carina.volume.mounts = %list,
            "delete refused: the volume is still mounted on this node; kept until it is unmounted"
        );
        Err(Error::FailedPrecondition {
            operation: "delete",
            name: name.to_string(),
            reason: format!(
                "still mounted on this node at {list}; it is kept: stop the pod that uses it \
                 here (or unmount it) and delete again"
            ),
        })
    }

    /// Capacity of every group (or of one).
    #[instrument(skip(self), err)]
    pub async fn capacity(&self, group: Option<&str>) -> Result<Vec<GroupCapacity>> {
        let slots = self.slots(group).await?;
        let mut out = Vec::with_capacity(slots.len());
        for slot in slots {
            out.push(self.with_no_disks(slot.backend.capacity().await?));
        }
        Ok(out)
    }

    /// A receiver that sees the latest capacity at once and every update.
    pub fn subscribe(&self) -> watch::Receiver<CapacitySnapshot> {
        self.inner.capacity.subscribe()
    }

    /// Every disk discovery saw at the last rescan, with the group that took
    /// it or the reason none did.
    pub fn disks(&self) -> Vec<DiskStatus> {
        self.inner
            .disks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// One group's slot, or all of them when `group` is `None`.
    async fn slots(&self, group: Option<&str>) -> Result<Vec<GroupSlot>> {
        match group {
            Some(g) => Ok(vec![self.slot(g).await?]),
            None => Ok(self.all_slots().await),
        }
    }

    async fn all_slots(&self) -> Vec<GroupSlot> {
        self.inner
            .state
            .read()
            .await
            .groups
            .values()
            .cloned()
            .collect()
    }

    async fn slot(&self, group: &str) -> Result<GroupSlot> {
        self.inner
            .state
            .read()
            .await
            .groups
            .get(group)
            .cloned()
            .ok_or_else(|| Error::UnknownGroup {
                group: group.to_string(),
            })
    }

    /// The lock of `slot`'s group, taken through the slot in place when it
    /// is taken: a configuration applied while the caller waited replaced
    /// `slot`, and changing the group through the replaced one would change
    /// it behind the back of the new one, whose rescan already ran. The
    /// group may be gone from the new configuration (`UnknownGroup`).
    ///
    /// The check reads the slot's own flag, never the engine's state: an
    /// apply holds the state while it waits for this lock.
    async fn lock_current(&self, mut slot: GroupSlot) -> Result<(GroupSlot, GroupLock)> {
        loop {
            let lock = GroupLock::acquire(slot.mutate.clone()).await;
            if !slot.is_retired() {
                return Ok((slot, lock));
            }
            drop(lock);
            // Waits for the apply to put the new slots in place.
            slot = self.slot(slot.backend.config().name.as_str()).await?;
        }
    }

    /// Ends the record of a create that failed, unless the backend could
    /// not take back what it made (its rollback failed too): then the
    /// record stays, and the volume is removed by the next change of that
    /// name or the node's next start.
    async fn end_failed_create(&self, backend: &dyn Backend, name: &str) {
        match backend.get(name).await {
            Ok(None) => self.end_quietly(name),
            Ok(Some(_)) => {
                tracing::warn!(carina.volume.name = %name, "a failed create left its volume behind; it is removed before the next change of that name")
            }
            Err(e) => {
                tracing::warn!(carina.volume.name = %name, error = %e, "cannot tell what a failed create left; the journal keeps it")
            }
        }
    }

    /// Ends `name`'s journal record where a record left behind is
    /// harmless (settling it changes nothing), so a failure is logged.
    fn end_quietly(&self, name: &str) {
        if let Err(e) = self.inner.intents.end(name) {
            tracing::warn!(carina.volume.name = %name, error = %e, "the journal record of a finished change stays");
        }
    }

    /// Settles what an interrupted change of `name` left (see
    /// [`intents`]): rolls back a create, finishes a delete, keeps a
    /// resize at the size it reached. Returns the operation settled. The
    /// caller holds `name`'s lock. An error leaves the record, so it is
    /// tried again.
    async fn settle(&self, name: &str) -> Result<Option<Operation>> {
        let Some(intent) = self.inner.intents.get(name)? else {
            return Ok(None);
        };
        let slot = match self.slot(&intent.group).await {
            Ok(slot) => Some(slot),
            // The group is no longer configured: nothing of it to settle.
            Err(Error::UnknownGroup { .. }) => None,
            Err(e) => return Err(e),
        };
        if let Some(slot) = slot {
            match intent.operation {
                Operation::Create | Operation::Delete => {
                    let (slot, _lock) = self.lock_current(slot).await?;
                    match backend_call(slot.backend.as_ref(), "delete", slot.backend.delete(name))
                        .await
                    {
                        Ok(()) | Err(Error::VolumeNotFound { .. }) => {}
                        Err(e) => return Err(e),
                    }
                    self.index_remove(name);
                    if let Some(links) = &self.inner.trace_links {
                        links.forget(name);
                    }
                    self.inner.copies.remove(name);
                }
                // Getting it sizes its device from the volume.
                Operation::Resize => {
                    slot.backend.get(name).await?;
                }
            }
        }
        self.inner.intents.end(name)?;
        tracing::info!(
            carina.volume.name = %name,
            carina.group = %intent.group,
            operation = intent.operation.as_str(),
            "settled a change the node did not finish: {}",
            match intent.operation {
                Operation::Create => "the half-made volume was removed",
                Operation::Delete => "the delete was finished",
                Operation::Resize => "the volume keeps the size it reached",
            }
        );
        Ok(Some(intent.operation))
    }

    /// At start: settles every change an earlier run left unfinished. One
    /// that cannot be settled now is logged and tried again before the
    /// next change of its volume.
    async fn settle_interrupted(&self) {
        let pending = match self.inner.intents.pending() {
            Ok(pending) => pending,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the journal of interrupted changes");
                return;
            }
        };
        let mut settled = 0;
        for name in pending {
            if let Err(e) = names::check_volume_name(&name) {
                tracing::warn!(volume = %name, error = %e, "a journal record names no volume; left alone");
                continue;
            }
            let Ok(_guard) = self.inner.locks.try_lock(&name) else {
                continue;
            };
            match self.settle(&name).await {
                Ok(Some(_)) => settled += 1,
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(carina.volume.name = %name, error = %e, "cannot settle an interrupted change yet")
                }
            }
        }
        if settled > 0 {
            self.notify(ChangeReason::Start).await;
        }
    }

    /// Finds a volume by name: the index names the group, the backend says
    /// whether it is really there.
    async fn find(&self, name: &str) -> Result<Option<Volume>> {
        let Some(group) = self.indexed_group(name) else {
            return Ok(None);
        };
        let Ok(slot) = self.slot(&group).await else {
            return Ok(None);
        };
        let found = slot.backend.get(name).await?;
        if found.is_none() {
            self.index_remove(name);
        }
        Ok(found)
    }

    /// The group the index names for a volume.
    fn indexed_group(&self, name: &str) -> Option<String> {
        self.inner
            .index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    fn index_insert(&self, name: &str, group: &str) {
        self.inner
            .index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), group.to_string());
    }

    fn index_remove(&self, name: &str) {
        self.inner
            .index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }

    /// `c` with why its group has no disk, if it took none at the last scan.
    fn with_no_disks(&self, mut c: GroupCapacity) -> GroupCapacity {
        let empty = self.inner.empty.lock().unwrap_or_else(|p| p.into_inner());
        c.no_disks = empty.get(&c.group).map(ToString::to_string);
        c
    }

    async fn notify(&self, reason: ChangeReason) {
        let _one_at_a_time = self.inner.notifying.lock().await;
        let slots = self.all_slots().await;
        let mut groups = Vec::with_capacity(slots.len());
        for slot in slots {
            match slot.backend.capacity().await {
                Ok(c) => groups.push(self.with_no_disks(c)),
                Err(e) => {
                    tracing::warn!(carina.group = %slot.backend.config().name, error = %e, "capacity unavailable")
                }
            }
        }
        self.inner.capacity.send_modify(|snap| {
            snap.generation += 1;
            snap.reason = reason;
            snap.groups = groups;
        });
    }
}
