//! The one engine fixture of the engine tests: an engine over one device
//! group of a given policy on fresh loop disks (LVM, RAW), with the group's
//! patterns matching exactly those disks, so tests in parallel never see
//! each other's disks.
//!
//! ```ignore
//! let Some(f) = EngineFixture::new("lifecycle", "LVM", &[256 * MIB], 0).await else { return };
//! let v = f.create(f.req("vol-a", 10 * MIB)).await;
//! let err = f.refused(f.req("huge", 10 << 30)).await;
//! ```
//!
//! Fields drop in order: the engine, then the LVM volume group (and the
//! loop devices stacked on its PVs), then the disks. HOST groups live on a
//! file system, not on disks: their tests build their configuration and
//! call [`engine_for`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use carina_node::engine::lvm::LvmOptions;
use carina_node::engine::{
    Config, CreateRequest, Engine, EngineOptions, Error, GroupCapacity, Volume,
};

use crate::{LoopDisk, VgGuard, disk_group_config, have_root, unique};

/// An engine over one LVM or RAW group on its own loop disks.
#[derive(Debug)]
pub struct EngineFixture {
    pub engine: Engine,
    pub group: String,
    /// `LVM` or `RAW`.
    pub policy: &'static str,
    /// The LVM volume group's guard (removes it on drop).
    pub vg: Option<VgGuard>,
    pub disks: Vec<LoopDisk>,
    reserve: u64,
    lvm: LvmOptions,
}

impl EngineFixture {
    /// An engine over a `policy` group on disks of `sizes` bytes, keeping
    /// `reserve` bytes free; `None` (the test skips) without root outside
    /// CI.
    pub async fn new(
        test: &str,
        policy: &'static str,
        sizes: &[u64],
        reserve: u64,
    ) -> Option<EngineFixture> {
        Self::with_lvm(test, policy, sizes, reserve, LvmOptions::default()).await
    }

    /// [`EngineFixture::new`] with the engine's `lvm` commands run as
    /// `lvm` says (shell or process, their time limit).
    pub async fn with_lvm(
        test: &str,
        policy: &'static str,
        sizes: &[u64],
        reserve: u64,
        lvm: LvmOptions,
    ) -> Option<EngineFixture> {
        if !have_root(test) {
            return None;
        }
        let disks: Vec<LoopDisk> = sizes
            .iter()
            .map(|s| LoopDisk::new(*s).expect("loop disk"))
            .collect();
        let group = unique(&policy.to_lowercase());
        let vg = (policy == "LVM").then(|| VgGuard::new(&group, &disks.iter().collect::<Vec<_>>()));
        let engine = engine_over_with(&group, policy, &disks, reserve, lvm.clone()).await;
        Some(EngineFixture {
            engine,
            group,
            policy,
            vg,
            disks,
            reserve,
            lvm,
        })
    }

    /// A second engine over the same disks and configuration, as after a
    /// restart of the node.
    pub async fn restart(&self) -> Engine {
        engine_over_with(
            &self.group,
            self.policy,
            &self.disks,
            self.reserve,
            self.lvm.clone(),
        )
        .await
    }

    /// A create request for this group.
    pub fn req(&self, name: &str, size: u64) -> CreateRequest {
        CreateRequest {
            name: name.into(),
            group: self.group.clone(),
            size_bytes: size,
            exclusive: false,
        }
    }

    /// A whole-disk (exclusive) create request for this group.
    pub fn exclusive(&self, name: &str, size: u64) -> CreateRequest {
        CreateRequest {
            exclusive: true,
            ..self.req(name, size)
        }
    }

    /// [`create`] on this engine.
    pub async fn create(&self, req: CreateRequest) -> Volume {
        create(&self.engine, req).await
    }

    /// [`refused`] on this engine.
    pub async fn refused(&self, req: CreateRequest) -> Error {
        refused(&self.engine, req).await
    }

    /// [`resize_refused`] on this engine.
    pub async fn resize_refused(&self, name: &str, size: u64) -> Error {
        resize_refused(&self.engine, name, size).await
    }

    /// The names of the group's volumes, sorted.
    pub async fn names(&self) -> Vec<String> {
        names(&self.engine, &self.group).await
    }

    /// The group's capacity now.
    pub async fn capacity(&self) -> GroupCapacity {
        capacity(&self.engine, &self.group).await
    }

    /// The group's allocatable bytes now.
    pub async fn allocatable(&self) -> u64 {
        self.capacity().await.allocatable_bytes
    }
}

/// The volume `req` asks for; a refusal fails the test, naming the volume.
pub async fn create(engine: &Engine, req: CreateRequest) -> Volume {
    let name = req.name.clone();
    engine
        .create_volume(req)
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"))
}

/// Why the engine refuses `req`; a volume made fails the test.
pub async fn refused(engine: &Engine, req: CreateRequest) -> Error {
    match engine.create_volume(req).await {
        Ok(v) => panic!("create {} should be refused, made {v:?}", v.name),
        Err(e) => e,
    }
}

/// Why the engine refuses to resize `name` to `size` bytes; a resize that
/// succeeds fails the test.
pub async fn resize_refused(engine: &Engine, name: &str, size: u64) -> Error {
    match engine.resize_volume(name, size).await {
        Ok(v) => panic!("resize {name} to {size} should be refused, got {v:?}"),
        Err(e) => e,
    }
}

/// Asserts that `engine` knows no volume `name`: get and delete both answer
/// `VolumeNotFound`.
pub async fn assert_not_found(engine: &Engine, name: &str) {
    let got = engine.get_volume(name).await;
    assert!(
        matches!(got, Err(Error::VolumeNotFound { .. })),
        "get {name}: {got:?}"
    );
    let deleted = engine.delete_volume(name).await;
    assert!(
        matches!(deleted, Err(Error::VolumeNotFound { .. })),
        "delete {name}: {deleted:?}"
    );
}

/// The names of `group`'s volumes on `engine`, sorted.
pub async fn names(engine: &Engine, group: &str) -> Vec<String> {
    engine
        .list_volumes(Some(group))
        .await
        .expect("list")
        .into_iter()
        .map(|v| v.name)
        .collect()
}

/// `group`'s capacity on `engine` now.
pub async fn capacity(engine: &Engine, group: &str) -> GroupCapacity {
    engine
        .capacity(Some(group))
        .await
        .expect("capacity")
        .remove(0)
}

/// An engine over one `policy` group named `group` on `disks`. LVM detects
/// device-mapper (loop activation without it); RAW does not need it.
pub async fn engine_over(group: &str, policy: &str, disks: &[LoopDisk], reserve: u64) -> Engine {
    engine_over_with(group, policy, disks, reserve, LvmOptions::default()).await
}

/// [`engine_over`] with `lvm` commands run as `lvm` says.
pub async fn engine_over_with(
    group: &str,
    policy: &str,
    disks: &[LoopDisk],
    reserve: u64,
    lvm: LvmOptions,
) -> Engine {
    let config = disk_group_config(group, policy, &disks.iter().collect::<Vec<_>>(), reserve);
    let device_mapper = (policy != "LVM").then_some(false);
    start(
        &config,
        EngineOptions {
            device_mapper,
            lvm,
            ..Default::default()
        },
    )
    .await
}

/// An engine over `config_json`; `device_mapper` `None` detects it.
pub async fn engine_for(config_json: &str, device_mapper: Option<bool>) -> Engine {
    start(
        config_json,
        EngineOptions {
            device_mapper,
            ..Default::default()
        },
    )
    .await
}

async fn start(config_json: &str, options: EngineOptions) -> Engine {
    Engine::start(Config::from_json(config_json).expect("config"), options)
        .await
        .expect("engine starts")
}

/// Lists the volumes of an engine back to back in a task of its own, to
/// run reads beside changes; [`Lister::stop`] says how many lists ran.
#[derive(Debug)]
pub struct Lister {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<u32>,
}

impl Lister {
    pub fn start(engine: Engine) -> Lister {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut lists = 0u32;
            while !flag.load(Ordering::Relaxed) {
                engine.list_volumes(None).await.expect("list");
                lists += 1;
            }
            lists
        });
        Lister { stop, task }
    }

    /// Stops the lists; how many ran (at least one, or the reads never
    /// met the changes).
    pub async fn stop(self) -> u32 {
        self.stop.store(true, Ordering::Relaxed);
        let lists = self.task.await.expect("the lister");
        assert!(lists > 0, "no list ran");
        lists
    }
}
