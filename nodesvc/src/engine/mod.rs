//! The storage engine: device groups built from the node's disks, and the
//! volumes carved out of them.
//!
//! [`Engine`] is the async API the rest of the workspace calls. It validates
//! names and sizes, keeps one [`backend::Backend`] per configured group
//! (LVM, RAW, HOST), serialises mutations per group so free-space checks
//! cannot race, refuses a second concurrent operation on one volume name,
//! and publishes a [`CapacitySnapshot`] after every change.
//!
//! This file holds the engine's state and its start; each verb has a file
//! of its own: `create`, `resize`, `delete`, `lookup` (get and list),
//! `capacity` (reports and snapshots), `adopt` (taking over volumes
//! another program made), `settle` (changes a node did not
//! finish) and `scan` (rescans and configuration applies).

mod adopt;
pub mod backend;
pub mod bcache;
mod capacity;
pub mod config;
pub mod copy;
mod create;
mod delete;
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
mod lookup;
pub mod lvm;
pub mod names;
pub mod quota;
pub mod raw;
pub mod records;
mod resize;
mod scan;
mod settle;
pub mod trace_links;
pub mod volume;
pub mod wipe;

#[cfg(test)]
mod records_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{Mutex, RwLock, watch};
use tracing::{Instrument, instrument};

use self::scan::build_groups;

pub use backend::{Backend, GroupLock};
pub use config::{Activation, Config, GroupConfig, Policy, SchedulerStrategy};
pub use disks::{Disk, DiskStatus};
pub use error::{Error, Result};
pub use volume::{
    AdoptRequest, CapacitySnapshot, ChangeReason, CreateRequest, GroupCapacity, QuotaMode, Volume,
};

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
}
