//! The engine the bcache tests start from: two groups on their own loop
//! disks with the stand-in (or the real driver), restarts over the same
//! disks, requests that make both volumes, and what `bcache-super-show`
//! says of a device.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::KernelStandIn;

/// An engine over two groups on their own loop disks — `hdd` (backing
/// volumes) and `ssd` (cache volumes), each LVM or RAW — with a state
/// directory and the bcache driver of [`KernelStandIn`], or the real one
/// under `/sys` when `CARINA_TEST_BCACHE_KERNEL=1`.
///
/// Fields drop in order: the engine, the stand-in, the state directory,
/// the volume groups, the disks.
#[derive(Debug)]
pub struct BcacheFixture {
    pub engine: carina_node::engine::Engine,
    /// `None`: the real driver under `/sys`.
    pub kernel: Option<KernelStandIn>,
    pub state: tempfile::TempDir,
    pub hdd: String,
    pub ssd: String,
    config: String,
    pub options: carina_node::engine::bcache::BcacheOptions,
    _vgs: Vec<crate::VgGuard>,
    pub disks: Vec<crate::LoopDisk>,
}

/// Whether the opt-in run against the real driver was asked for.
pub fn real_kernel() -> bool {
    std::env::var("CARINA_TEST_BCACHE_KERNEL").is_ok_and(|v| v == "1")
}

impl BcacheFixture {
    /// The fixture with an `hdd` group of `backing_policy` on a disk of
    /// `hdd_bytes` and an `ssd` group of `cache_policy` on one of
    /// `ssd_bytes`; `None` (skip) without root outside CI.
    pub async fn new(
        test: &str,
        backing_policy: &str,
        hdd_bytes: u64,
        cache_policy: &str,
        ssd_bytes: u64,
    ) -> Option<BcacheFixture> {
        let stand_in = !real_kernel();
        Self::build(
            test,
            backing_policy,
            hdd_bytes,
            cache_policy,
            ssd_bytes,
            stand_in,
        )
        .await
    }

    /// [`BcacheFixture::new`] with the stand-in whatever
    /// `CARINA_TEST_BCACHE_KERNEL` says: for a test whose subject is the
    /// control plane's side, which the stand-in proves as well anywhere.
    pub async fn with_stand_in(
        test: &str,
        backing_policy: &str,
        hdd_bytes: u64,
        cache_policy: &str,
        ssd_bytes: u64,
    ) -> Option<BcacheFixture> {
        Self::build(
            test,
            backing_policy,
            hdd_bytes,
            cache_policy,
            ssd_bytes,
            true,
        )
        .await
    }

    async fn build(
        test: &str,
        backing_policy: &str,
        hdd_bytes: u64,
        cache_policy: &str,
        ssd_bytes: u64,
        stand_in: bool,
    ) -> Option<BcacheFixture> {
        if !crate::have_root(test) {
            return None;
        }
        let hdd_disk = crate::LoopDisk::new(hdd_bytes).expect("loop disk");
        let ssd_disk = crate::LoopDisk::new(ssd_bytes).expect("loop disk");
        let hdd = crate::unique("hdd");
        let ssd = crate::unique("ssd");
        let mut vgs = Vec::new();
        if backing_policy == "LVM" {
            vgs.push(crate::VgGuard::new(&hdd, &[&hdd_disk]));
        }
        if cache_policy == "LVM" {
            vgs.push(crate::VgGuard::new(&ssd, &[&ssd_disk]));
        }
        let selector = |name: &str, policy: &str, disk: &crate::LoopDisk| {
            format!(
                r#"{{"name":"{name}","re":["{}"],"policy":"{policy}","reserveBytes":0,"minDiskBytes":1048576}}"#,
                disk.pattern()
            )
        };
        let config = format!(
            r#"{{"diskSelector":[{},{}],"diskScanInterval":"0"}}"#,
            selector(&hdd, backing_policy, &hdd_disk),
            selector(&ssd, cache_policy, &ssd_disk)
        );
        let kernel = stand_in.then(KernelStandIn::new);
        let state = tempfile::Builder::new()
            .prefix("carina-state-")
            .tempdir()
            .expect("state dir");
        let options = carina_node::engine::bcache::BcacheOptions {
            sysfs_root: kernel
                .as_ref()
                .map_or_else(|| PathBuf::from("/sys"), |k| k.root().to_path_buf()),
            state_dir: Some(state.path().to_path_buf()),
            settle_timeout: Duration::from_secs(5),
            flush_timeout: Duration::from_secs(30),
            poll: Duration::from_millis(5),
            ..Default::default()
        };
        let engine = start(&config, options.clone()).await;
        Some(BcacheFixture {
            engine,
            kernel,
            state,
            hdd,
            ssd,
            config,
            options,
            _vgs: vgs,
            disks: vec![hdd_disk, ssd_disk],
        })
    }

    /// A second engine over the same disks, records and driver, as after
    /// a restart of the node.
    pub async fn restart(&self) -> carina_node::engine::Engine {
        start(&self.config, self.options.clone()).await
    }

    /// An engine with these options over the same disks.
    pub async fn restart_with(
        &self,
        options: carina_node::engine::bcache::BcacheOptions,
    ) -> carina_node::engine::Engine {
        start(&self.config, options).await
    }

    /// The stand-in (the test is about its events); panics on a real
    /// kernel run.
    pub fn standin(&self) -> &KernelStandIn {
        self.kernel.as_ref().expect("the kernel stand-in")
    }

    /// A request that makes both volumes: `size` bytes in `hdd`, `ratio`
    /// percent of it in `ssd`.
    pub fn request(
        &self,
        name: &str,
        size: u64,
        ratio: u32,
        mode: carina_node::engine::bcache::CacheMode,
    ) -> carina_node::engine::bcache::BcacheRequest {
        carina_node::engine::bcache::BcacheRequest {
            name: name.into(),
            backing_volume: format!("{name}-data"),
            cache_volume: format!("{name}-cache"),
            cache_mode: mode,
            create: Some(carina_node::engine::bcache::record::OwnedVolumes {
                backing_group: self.hdd.clone(),
                size_bytes: size,
                cache_group: self.ssd.clone(),
                cache_ratio_percent: ratio,
            }),
        }
    }
}

async fn start(
    config: &str,
    bcache: carina_node::engine::bcache::BcacheOptions,
) -> carina_node::engine::Engine {
    carina_node::engine::Engine::start(
        carina_node::engine::Config::from_json(config).expect("config"),
        carina_node::engine::EngineOptions {
            bcache,
            ..Default::default()
        },
    )
    .await
    .expect("engine starts")
}

/// What `bcache-super-show` says of `dev`: (role, dev.uuid, cset.uuid),
/// or `None` when it finds no superblock.
pub fn superblock_of(dev: &Path) -> Option<(String, String, String)> {
    let out = std::process::Command::new("bcache-super-show")
        .arg(dev)
        .output()
        .expect("bcache-super-show runs");
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |k: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(k))
            .map(|l| l[k.len()..].trim().to_string())
            .expect("field")
    };
    Some((field("sb.version"), field("dev.uuid"), field("cset.uuid")))
}
