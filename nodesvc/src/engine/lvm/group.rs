//! The LVM device group backend ([`LvmGroup`]): the VG named after the
//! group on its disks, a cached [`VgSnapshot`] kept exact by our own
//! changes and re-read on every rescan and list, and volumes created,
//! grown, listed and deleted as tagged LVs. Runs the commands built in
//! [`super::cli`]; placement comes from [`super::extents`], devices from
//! [`super::device`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
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
use crate::engine::volume::{CreateRequest, GroupCapacity, QuotaMode, Volume};
use crate::engine::wipe::zero_ends;

use super::cli::{OWNER_TAG, extent_range, lvm_cmd, map_lvcreate_error, pvsegs_args};
use super::device::{self, Mode, dm_path, ensure_unused};
use super::report::{Lv, VgSnapshot, parse_pv_vgs, parse_pvsegs};
use super::runner::LvmRunner;

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
    /// Last known picture of the VG; kept exact by our own mutations and
    /// refreshed on every rescan and list.
    snapshot: Option<VgSnapshot>,
    /// The VG's extent size as last read. Unlike the snapshot it survives
    /// invalidation (a VG's extent size does not change), so
    /// [`Backend::round_size`] always rounds to the real unit.
    extent_size: Option<u64>,
    /// Bumped whenever we start or finish changing the VG. A refresh
    /// keeps what it read only if no change began or ended while it read
    /// (reads run beside our serialised changes): a report taken just
    /// before an lvcreate would hide the new LV, and one taken just after
    /// it would be applied a second time by the change's own update.
    generation: u64,
    /// Between the start of a change's command and its update.
    changing: bool,
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
        let generation = self.lock().generation;
        let out = self
            .run(self.cmd("pvs").args(pvsegs_args(self.vg())))
            .await?;
        let snap = parse_pvsegs(&out.stdout)?;
        let mut state = self.lock();
        if snap.extent_size > 0 {
            state.extent_size = Some(snap.extent_size);
        }
        if !state.changing && state.generation == generation {
            state.snapshot = Some(snap.clone());
        }
        Ok(snap)
    }

    async fn snapshot(&self) -> Result<VgSnapshot> {
        let cached = self.lock().snapshot.clone();
        match cached {
            Some(s) => Ok(s),
            None => self.refresh().await,
        }
    }

    /// Applies a change that succeeded to the cached picture.
    fn update<F: FnOnce(&mut VgSnapshot)>(&self, f: F) {
        let mut state = self.lock();
        if let Some(s) = state.snapshot.as_mut() {
            f(s);
        }
        state.changing = false;
        state.generation += 1;
    }

    /// Drops the cached picture (also ends a change).
    fn invalidate(&self) {
        let mut state = self.lock();
        state.snapshot = None;
        state.changing = false;
        state.generation += 1;
    }

    /// Runs a command that changes the VG. On success the caller ends the
    /// change with [`Self::update`] or [`Self::invalidate`]; a failure
    /// invalidates here.
    async fn change(&self, cmd: Cmd) -> Result<Output, CommandError> {
        {
            let mut state = self.lock();
            state.changing = true;
            state.generation += 1;
        }
        let result = self.run(cmd).await;
        if result.is_err() {
            self.invalidate();
        }
        result
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

    /// Removes an LV we just created after a later step failed.
    async fn roll_back(&self, name: &str) {
        let lv = format!("{}/{}", self.vg(), name);
        if let Err(e) = self
            .change(self.cmd("lvremove").args(["-f", "-y"]).arg(&lv))
            .await
        {
            tracing::error!(lvm.lv = %lv, error = %e, "rollback of a half-created LV failed");
        }
        self.invalidate();
    }

    async fn create_loop(
        &self,
        req: &CreateRequest,
        size: u64,
        snap: &VgSnapshot,
        lock: Option<&GroupLock>,
    ) -> Result<Volume> {
        let extents = size / snap.extent_size;
        let (pv, start) = snap
            .best_fit(extents)
            .ok_or_else(|| self.exhausted(size, snap))?;
        let range = extent_range(&pv, start, extents);
        let created = self
            .change(
                self.cmd("lvcreate")
                    .args([
                        "-q",
                        "-an",
                        "-Zn",
                        "-Wn",
                        "--alloc",
                        "contiguous",
                        "--addtag",
                        OWNER_TAG,
                        "-l",
                    ])
                    .arg(extents.to_string())
                    .arg("-n")
                    .arg(&req.name)
                    .arg(self.vg())
                    .arg(&range),
            )
            .await;
        if let Err(e) = created {
            // Our picture was stale (someone else allocated): re-read it.
            return self.after_failed_lvcreate(req, e, snap).await;
        }
        self.update(|s| s.allocate(&req.name, &pv, start, extents, vec![OWNER_TAG.to_string()]));
        let snap = self.snapshot().await?;
        let Some(lv) = snap.lvs.get(&req.name).cloned() else {
            self.roll_back(&req.name).await;
            return Err(Error::parse(
                format!("LV {}", req.name),
                "created but missing from the cache",
            ));
        };
        // The extents are taken and recorded; attaching the new LV's loop
        // and wiping its ends concern it alone, so the group's next change
        // (the next lvcreate) runs meanwhile.
        if let Some(lock) = lock {
            lock.release();
        }
        let result = async {
            let device = {
                let _exposing = self.exposure.lock().await;
                self.expose(&snap, &lv, None).await?
            };
            zero_ends(&device, lv.size).await?;
            self.volume(&lv, device)
        }
        .await;
        match result {
            Ok(v) => Ok(v),
            Err(e) => {
                if let Some(lock) = lock {
                    lock.reacquire().await;
                }
                let _exposing = self.exposure.lock().await;
                if let Some((pv, offset)) = snap.byte_offset(&lv)
                    && let Ok(loops) = loopdev::list().await
                    && let Some(l) = loopdev::find(&loops, &pv, offset)
                {
                    let _ = loopdev::detach(Path::new(&l.name)).await;
                }
                self.roll_back(&req.name).await;
                Err(e)
            }
        }
    }

    /// [`Backend::create`], with the group's lock when the engine hands
    /// it over ([`Backend::create_releasing`]).
    async fn create_with(&self, req: &CreateRequest, lock: Option<&GroupLock>) -> Result<Volume> {
        let snap = self.snapshot().await?;
        if snap.vg.is_empty() {
            return Err(Error::ResourceExhausted {
                group: self.config.name.clone(),
                requested_bytes: req.size_bytes,
                allocatable_bytes: 0,
            });
        }
        // The engine knows no volume of ours by this name; a foreign LV of
        // that name is in the VG only, so this check is ours.
        if let Some(lv) = snap.lvs.get(&req.name).cloned() {
            return self.same_name(req, &snap, &lv).await;
        }
        // Already rounded to the extent size by the engine (round_size).
        let size = req.size_bytes;
        if size > GroupCapacity::allocatable(snap.free, self.config.reserve_bytes) {
            return Err(self.exhausted(size, &snap));
        }
        match self.mode {
            Mode::Loop => self.create_loop(req, size, &snap, lock).await,
            Mode::DeviceMapper => self.create_dm(req, size, &snap).await,
        }
    }

    /// A create of a name the VG already holds as `lv` (the engine knows
    /// no volume of that name). An LV of ours of the requested size is
    /// what a create whose lvcreate committed but whose answer never came
    /// (the shell died, the time limit fired) leaves: nobody was given it,
    /// so this create finishes it, exposed and wiped as a create would
    /// have. Anything else (foreign, or another size) is a conflict.
    async fn same_name(&self, req: &CreateRequest, snap: &VgSnapshot, lv: &Lv) -> Result<Volume> {
        if !(lv.owned() && lv.size == req.size_bytes) {
            return Err(Error::AlreadyExists {
                name: req.name.clone(),
                group: self.config.name.clone(),
                existing_bytes: lv.size,
                requested_bytes: req.size_bytes,
            });
        }
        tracing::info!(lvm.lv = %req.name, "finishing an earlier create whose answer was lost");
        let device = {
            let _exposing = self.exposure.lock().await;
            self.expose(snap, lv, None).await?
        };
        zero_ends(&device, lv.size).await?;
        self.volume(lv, device)
    }

    /// After lvcreate failed: a fresh look at the VG, and if an LV of the
    /// name is there after all (our picture missed it), the decision of
    /// [`Self::same_name`]; else the command's error.
    async fn after_failed_lvcreate(
        &self,
        req: &CreateRequest,
        e: CommandError,
        snap: &VgSnapshot,
    ) -> Result<Volume> {
        self.invalidate();
        if e.stderr().contains("already exists")
            && let Ok(fresh) = self.snapshot().await
            && let Some(lv) = fresh.lvs.get(&req.name).cloned()
        {
            return self.same_name(req, &fresh, &lv).await;
        }
        Err(map_lvcreate_error(e, || {
            self.exhausted(req.size_bytes, snap)
        }))
    }

    async fn create_dm(&self, req: &CreateRequest, size: u64, snap: &VgSnapshot) -> Result<Volume> {
        let created = self
            .change(
                self.cmd("lvcreate")
                    .args(["-q", "-y", "-ay", "-Zy", "-Wy", "--addtag", OWNER_TAG, "-L"])
                    .arg(format!("{size}b"))
                    .arg("-n")
                    .arg(&req.name)
                    .arg(self.vg()),
            )
            .await;
        if let Err(e) = created {
            return self.after_failed_lvcreate(req, e, snap).await;
        }
        self.invalidate();
        let snap = self.refresh().await?;
        let lv =
            snap.lvs.get(&req.name).cloned().ok_or_else(|| {
                Error::parse(format!("LV {}", req.name), "created but not reported")
            })?;
        let device = self.expose(&snap, &lv, None).await?;
        match self.volume(&lv, device) {
            Ok(v) => Ok(v),
            Err(e) => {
                self.roll_back(&req.name).await;
                Err(e)
            }
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
            tracing::info!(lvm.vg = %self.vg(), disks = ?new.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), "{sub}");
        }
        let snap = if new.is_empty() {
            snap
        } else {
            self.refresh().await?
        };
        if snap.vg.is_empty() {
            return Ok(());
        }
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
                        tracing::error!(lvm.vg = %self.vg(), lvm.lv = %lv.name, error = %e, "cannot expose LV");
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
        // Rounded to the extent size and larger than the LV: the engine's
        // checks.
        let size = size_bytes;
        debug_assert!(size > lv.size, "the engine answers no-ops and shrinks");
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
            .lock()
            .extent_size
            .filter(|e| *e > 0)
            .unwrap_or(4 << 20);
        names::round_up(size_bytes, extent)
    }
}
