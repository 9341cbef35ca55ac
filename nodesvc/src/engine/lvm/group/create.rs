//! Creating an LV: on a loop-activated group the extents are chosen
//! here (contiguous, best fit) and the group's lock is handed back once
//! they are taken, before the loop attach and the wipe; on device-mapper
//! LVM chooses. A create whose earlier attempt's answer was lost finishes
//! that attempt's LV; any failure after lvcreate removes the LV again.

use std::path::Path;

use carina_sys::command::CommandError;
use carina_sys::loopdev;

use crate::engine::backend::GroupLock;
use crate::engine::error::{Error, Result};
use crate::engine::volume::{CreateRequest, GroupCapacity, Volume};
use crate::engine::wipe::zero_ends;

use super::super::cli::{OWNER_TAG, extent_range, map_lvcreate_error};
use super::super::device::Mode;
use super::super::report::{Lv, VgSnapshot};
use super::LvmGroup;

impl LvmGroup {
    /// Removes an LV we just created after a later step failed.
    async fn roll_back(&self, name: &str) {
        let lv = format!("{}/{}", self.vg(), name);
        if let Err(e) = self
            .change(self.cmd("lvremove").args(["-f", "-y"]).arg(&lv))
            .await
        {
            tracing::error!(carina.lvm.lv = %lv, error = %e, "rollback of a half-created LV failed");
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
        // The LV is there, neither exposed nor wiped.
        carina_sys::crashpoint::reach("lvm.create.allocated", &req.name);
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
    pub(super) async fn create_with(
        &self,
        req: &CreateRequest,
        lock: Option<&GroupLock>,
    ) -> Result<Volume> {
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
        tracing::info!(carina.lvm.lv = %req.name, "finishing an earlier create whose answer was lost");
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
