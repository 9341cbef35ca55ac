//! The LVM device group backend ([`LvmGroup`]): the VG named after the
//! group on its disks, its picture cached ([`super::cache`]), and volumes
//! created ([`create`]), grown, listed and deleted as tagged LVs. Runs the
//! commands built in [`super::cli`]; placement comes from
//! [`super::extents`], devices from [`super::device`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use carina_sys::command::{Cmd, CommandError, Output};
use carina_sys::loopdev::{self, LosetupDevice};

use crate::engine::backend::{Backend, GroupLock};
use crate::engine::config::{Activation, GroupConfig, Policy};
use crate::engine::devnum;
use crate::engine::disks::Disk;
use crate::engine::error::{Error, Result};
use crate::engine::names;
use crate::engine::volume::{AdoptRequest, CreateRequest, GroupCapacity, QuotaMode, Volume};

use super::cache::VgCache;
use super::cli::{OWNER_TAG, extent_range, lvm_cmd, map_lvcreate_error, pvsegs_args};
use super::device::{self, Mode, dm_path, ensure_unused};
use super::report::{Lv, Pv, VgSnapshot, parse_pv_vgs, parse_pvsegs};
use super::runner::LvmRunner;

mod adopt;
mod create;

/// The VG each of `paths` belongs to (only those that are PVs).
pub async fn pv_vg_names(
    runner: &LvmRunner,
    paths: &[PathBuf],
) -> Result<HashMap<PathBuf, String>> {
    let out = runner
        .run(lvm_cmd("pvs", paths).args(["--reportformat", "json", "-o", "pv_name,vg_name"]))
        .await?;
    parse_pv_vgs(&out.stdout)
}

/// An LVM device group.
#[derive(Debug)]
pub struct LvmGroup {
    config: GroupConfig,
    mode: Mode,
    state: Mutex<LvmState>,
    /// The VG as last read, kept exact by our own changes.
    cache: VgCache,
    /// The node's `lvm` runner, shared by its groups.
    runner: Arc<LvmRunner>,
    /// Held while loop devices are attached or detached, together with
    /// the look at the VG that decided it: a list that read the VG before
    /// a delete must not attach a loop for the LV being removed (it would
    /// outlive the LV, over freed extents), and two exposures of one LV
    /// must not attach two loops. Taken after the engine's group lock.
    exposure: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct LvmState {
    /// The group's disks (the LVM device filter).
    devices: Vec<PathBuf>,
    /// The VG's physical volumes as last read: one missing from a later
    /// report is a disk that went away, not a smaller group.
    known_pvs: Vec<PathBuf>,
}

impl LvmGroup {
    /// A group in device-mapper or loop mode (`activation: auto` picks by
    /// whether the kernel has device-mapper) whose commands go through
    /// `runner`.
    pub fn new(
        config: GroupConfig,
        device_mapper: bool,
        runner: Arc<LvmRunner>,
    ) -> Result<LvmGroup> {
        let mode = match config.activation {
            Activation::Loop => Mode::Loop,
            Activation::Dm if !device_mapper => {
                return Err(Error::config(
                    format!("group {}: activation", config.name),
                    "dm requested but the kernel has no device-mapper",
                ));
            }
            Activation::Dm => Mode::DeviceMapper,
            Activation::Auto if device_mapper => Mode::DeviceMapper,
            Activation::Auto => Mode::Loop,
        };
        Ok(LvmGroup {
            config,
            mode,
            state: Mutex::new(LvmState::default()),
            cache: VgCache::default(),
            runner,
            exposure: tokio::sync::Mutex::new(()),
        })
    }

    fn vg(&self) -> &str {
        &self.config.name
    }

    fn devices(&self) -> Vec<PathBuf> {
        self.lock().devices.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LvmState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cmd(&self, subcommand: &str) -> Cmd {
        let cmd = lvm_cmd(subcommand, &self.devices());
        match self.mode {
            Mode::Loop
                if matches!(
                    subcommand,
                    "lvcreate" | "lvextend" | "lvremove" | "vgchange"
                ) =>
            {
                cmd.args(["--driverloaded", "n"])
            }
            _ => cmd,
        }
    }

    /// Runs an `lvm` command of this group.
    async fn run(&self, cmd: Cmd) -> Result<Output, CommandError> {
        self.runner.run(cmd).await
    }

    /// Reads the VG from LVM and caches it.
    async fn refresh(&self) -> Result<VgSnapshot> {
        let mark = self.cache.read_mark();
        let out = self
            .run(self.cmd("pvs").args(pvsegs_args(self.vg())))
            .await?;
        let snap = parse_pvsegs(&out.stdout)?;
        self.check_pvs(&snap)?;
        self.cache.store(mark, &snap);
        Ok(snap)
    }

    /// Fails, naming them, when physical volumes the VG had are missing
    /// from `snap` (their disk was pulled, or reads as empty): the group
    /// would otherwise read as smaller, or as no VG at all, and its
    /// volumes as gone, which a caller would take for deleted. Nothing is
    /// cached then, so the first read after the disk is back sees it.
    fn check_pvs(&self, snap: &VgSnapshot) -> Result<()> {
        let mut state = self.lock();
        let missing: Vec<String> = state
            .known_pvs
            .iter()
            .filter(|known| !snap.pvs.iter().any(|pv| &pv.path == *known))
            .map(|p| p.display().to_string())
            .collect();
        if !missing.is_empty() {
            return Err(Error::FailedPrecondition {
                operation: "use",
                name: self.config.name.clone(),
                reason: format!(
                    "physical volume {} of volume group {:?} is missing: the disk behind it is gone or unreadable",
                    missing.join(", "),
                    self.vg()
                ),
            });
        }
        state.known_pvs = snap.pvs.iter().map(|pv| pv.path.clone()).collect();
        Ok(())
    }

    async fn snapshot(&self) -> Result<VgSnapshot> {
        match self.cache.get() {
            Some(s) => Ok(s),
            None => self.refresh().await,
        }
    }

    /// Applies a change that succeeded to the cached picture.
    fn update<F: FnOnce(&mut VgSnapshot)>(&self, f: F) {
        self.cache.update(f);
    }

    /// Drops the cached picture (also ends a change).
    fn invalidate(&self) {
        self.cache.invalidate();
    }

    /// Runs a command that changes the VG. On success the caller ends the
    /// change with [`Self::update`] or [`Self::invalidate`]; a failure
    /// invalidates here.
    async fn change(&self, cmd: Cmd) -> Result<Output, CommandError> {
        self.cache.begin_change();
        let result = self.run(cmd).await;
        if result.is_err() {
            self.invalidate();
        }
        result
    }

    /// `pvresize` of every PV whose disk has grown by an extent or more
    /// (a cloud disk or a RAID grown under the node): the group gains the
    /// room; the snapshot after it, or `snap` when none grew.
    async fn resize_grown(&self, snap: VgSnapshot) -> Result<VgSnapshot> {
        let grown: Vec<&Pv> = snap
            .pvs
            .iter()
            .filter(|pv| pv.grown(snap.extent_size))
            .collect();
        if grown.is_empty() {
            return Ok(snap);
        }
        for pv in grown {
            self.change(self.cmd("pvresize").arg(&pv.path)).await?;
            self.invalidate();
            tracing::info!(
                carina.lvm.vg = %self.vg(),
                disk = %pv.path.display(),
                from_bytes = pv.pe_start + pv.size,
                to_bytes = pv.dev_size,
                "pvresize"
            );
        }
        self.refresh().await
    }

    /// The block device of an LV, attaching its loop device if needed.
    async fn expose(
        &self,
        snap: &VgSnapshot,
        lv: &Lv,
        loops: Option<&[LosetupDevice]>,
    ) -> Result<PathBuf> {
        device::expose(self.mode, self.vg(), snap, lv, loops).await
    }

    fn volume(&self, lv: &Lv, device: PathBuf) -> Result<Volume> {
        let (major, minor) = devnum::of_path(&device)?;
        Ok(Volume {
            name: lv.name.clone(),
            group: self.config.name.clone(),
            policy: Policy::Lvm,
            size_bytes: lv.size,
            device_path: Some(device),
            host_path: None,
            major,
            minor,
            exclusive: false,
            disk: lv
                .segments
                .first()
                .map(|(pv, _, _)| pv.to_string_lossy().into_owned()),
        })
    }

    fn exhausted(&self, requested: u64, snap: &VgSnapshot) -> Error {
        Error::ResourceExhausted {
            group: self.config.name.clone(),
            requested_bytes: requested,
            allocatable_bytes: GroupCapacity::allocatable(snap.free, self.config.reserve_bytes),
        }
    }
}

#[async_trait]
impl Backend for LvmGroup {
    fn config(&self) -> &GroupConfig {
        &self.config
    }

    async fn rescan(&self, disks: &[Disk]) -> Result<()> {
        let mut devices: Vec<PathBuf> = disks.iter().map(|d| d.path.clone()).collect();
        devices.sort();
        {
            let mut state = self.lock();
            // Keep PVs we already have even if discovery missed them this
            // time (a disk never leaves a VG behind our back).
            for d in state.devices.drain(..) {
                if !devices.contains(&d) {
                    devices.push(d);
                }
            }
            state.devices = devices.clone();
        }
        let snap = self.refresh().await?;
        let new: Vec<&Disk> = disks
            .iter()
            .filter(|d| !snap.pvs.iter().any(|p| p.path == d.path))
            .collect();
        if !new.is_empty() {
            let sub = if snap.vg.is_empty() {
                "vgcreate"
            } else {
                "vgextend"
            };
            let mut cmd = self.cmd(sub).arg("-q");
            if sub == "vgcreate" {
                cmd = cmd.args(["--addtag", OWNER_TAG]);
            }
            cmd = cmd.arg(self.vg());
            for d in &new {
                cmd = cmd.arg(&d.path);
            }
            self.change(cmd).await?;
            self.invalidate();
            tracing::info!(carina.lvm.vg = %self.vg(), disks = ?new.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), "{sub}");
        }
        let snap = if new.is_empty() {
            snap
        } else {
            self.refresh().await?
        };
        if snap.vg.is_empty() {
            return Ok(());
        }
        let snap = self.resize_grown(snap).await?;
        match self.mode {
            Mode::DeviceMapper => {
                self.run(self.cmd("vgchange").args(["-ay"]).arg(self.vg()))
                    .await?;
            }
            Mode::Loop => {
                let _exposing = self.exposure.lock().await;
                let loops = loopdev::list().await?;
                for lv in snap.owned_lvs() {
                    if let Err(e) = self.expose(&snap, lv, Some(&loops)).await {
                        tracing::error!(carina.lvm.vg = %self.vg(), carina.lvm.lv = %lv.name, error = %e, "cannot expose LV");
                    }
                }
            }
        }
        Ok(())
    }

    async fn create(&self, req: &CreateRequest) -> Result<Volume> {
        self.create_with(req, None).await
    }

    async fn create_releasing(&self, req: &CreateRequest, lock: &GroupLock) -> Result<Volume> {
        self.create_with(req, Some(lock)).await
    }

    async fn get(&self, name: &str) -> Result<Option<Volume>> {
        let _exposing = self.exposure.lock().await;
        let snap = self.snapshot().await?;
        let Some(lv) = snap.lvs.get(name).filter(|lv| lv.owned()) else {
            return Ok(None);
        };
        let device = self.expose(&snap, lv, None).await?;
        self.volume(lv, device).map(Some)
    }

    async fn list(&self) -> Result<Vec<Volume>> {
        let _exposing = self.exposure.lock().await;
        let snap = self.refresh().await?;
        let loops = match self.mode {
            Mode::Loop => Some(loopdev::list().await?),
            Mode::DeviceMapper => None,
        };
        let mut out = Vec::new();
        for lv in snap.owned_lvs() {
            let device = self.expose(&snap, lv, loops.as_deref()).await?;
            out.push(self.volume(lv, device)?);
        }
        Ok(out)
    }

    async fn resize(&self, name: &str, size_bytes: u64) -> Result<Volume> {
        // A list's exposure must not set the loop back to the old size.
        let _exposing = self.exposure.lock().await;
        let snap = self.refresh().await?;
        let lv = snap
            .lvs
            .get(name)
            .filter(|lv| lv.owned())
            .cloned()
            .ok_or_else(|| Error::VolumeNotFound {
                name: name.to_string(),
            })?;
        // Rounded to the extent size: the engine's check. It answers no-ops
        // and shrinks from its cache, which misses a resize whose caller
        // went away during lvextend (the command ran on): the LV already
        // has the size, so only its device is brought to it.
        let size = size_bytes;
        if size <= lv.size {
            let device = self.expose(&snap, &lv, None).await?;
            return self.volume(&lv, device);
        }
        let growth = size.saturating_sub(lv.size);
        if growth > GroupCapacity::allocatable(snap.free, self.config.reserve_bytes) {
            return Err(self.exhausted(growth, &snap));
        }
        let lv_path = format!("{}/{}", self.vg(), name);
        let mut cmd = self
            .cmd("lvextend")
            .args(["-q", "-L"])
            .arg(format!("{size}b"))
            .arg(&lv_path);
        if self.mode == Mode::Loop {
            let extra = growth / snap.extent_size;
            if snap.free_after(&lv) < extra {
                return Err(Error::FailedPrecondition {
                    operation: "resize",
                    name: name.to_string(),
                    reason: format!(
                        "loop activation needs the {extra} extents right after the LV free, and only {} are",
                        snap.free_after(&lv)
                    ),
                });
            }
            let (pv, start, len) = lv.segments[0].clone();
            cmd = cmd
                .args(["--alloc", "contiguous"])
                .arg(extent_range(&pv, start + len, extra));
        }
        let result = self.change(cmd).await;
        self.invalidate();
        result.map_err(|e| map_lvcreate_error(e, || self.exhausted(growth, &snap)))?;
        // The LV has grown, its loop device not yet.
        carina_sys::crashpoint::reach("lvm.resize.extended", name);
        let snap = self.refresh().await?;
        let lv = snap
            .lvs
            .get(name)
            .cloned()
            .ok_or_else(|| Error::VolumeNotFound {
                name: name.to_string(),
            })?;
        let device = self.expose(&snap, &lv, None).await?;
        self.volume(&lv, device)
    }

    async fn delete(&self, name: &str) -> Result<()> {
        let _exposing = self.exposure.lock().await;
        let snap = self.snapshot().await?;
        let Some(lv) = snap.lvs.get(name).filter(|lv| lv.owned()).cloned() else {
            return Err(Error::VolumeNotFound {
                name: name.to_string(),
            });
        };
        match self.mode {
            Mode::Loop => {
                if let Some((pv, offset)) = snap.byte_offset(&lv) {
                    let loops = loopdev::list().await?;
                    if let Some(l) = loopdev::find(&loops, &pv, offset) {
                        let dev = PathBuf::from(&l.name);
                        ensure_unused(&dev, name)?;
                        loopdev::detach(&dev).await?;
                        // No device any more, the LV still there.
                        carina_sys::crashpoint::reach("lvm.delete.detached", name);
                    }
                }
            }
            Mode::DeviceMapper => {
                ensure_unused(&dm_path(self.vg(), name), name)?;
            }
        }
        let result = self
            .change(self.cmd("lvremove").args(["-q", "-f", "-y"]).arg(format!(
                "{}/{}",
                self.vg(),
                name
            )))
            .await;
        match result {
            Ok(_) => {
                self.update(|s| s.release(name));
                Ok(())
            }
            Err(e) => {
                self.invalidate();
                Err(e.into())
            }
        }
    }

    async fn adopt(&self, req: &AdoptRequest, _disk: Option<&Disk>) -> Result<Volume> {
        self.adopt_lv(req).await
    }

    async fn capacity(&self) -> Result<GroupCapacity> {
        let snap = self.snapshot().await?;
        let reserve = self.config.reserve_bytes;
        let allocatable = GroupCapacity::allocatable(snap.free, reserve);
        let largest = match self.mode {
            Mode::Loop => snap.largest_free_extents() * snap.extent_size,
            Mode::DeviceMapper => snap.free,
        };
        Ok(GroupCapacity {
            group: self.config.name.clone(),
            policy: Policy::Lvm,
            total_bytes: snap.size,
            free_bytes: snap.free,
            reserve_bytes: reserve,
            allocatable_bytes: allocatable,
            largest_allocatable_bytes: largest.min(allocatable),
            allocation_unit: snap.extent_size.max(1),
            volume_count: snap.owned_lvs().count() as u32,
            quota: QuotaMode::NotApplicable,
            disks: snap
                .pvs
                .iter()
                .map(|p| p.path.to_string_lossy().into_owned())
                .collect(),
            no_disks: None,
        })
    }

    fn round_size(&self, size_bytes: u64) -> Option<u64> {
        let extent = self
            .cache
            .extent_size()
            .filter(|e| *e > 0)
            .unwrap_or(4 << 20);
        names::round_up(size_bytes, extent)
    }
}
