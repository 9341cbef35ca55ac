//! The physical volumes of a group's VG, brought in line with its disks at
//! every rescan: new disks join (`vgcreate`/`vgextend`), a disk that grew
//! is `pvresize`d, and a disk the selector no longer matches leaves
//! (`vgreduce`, `pvremove`) once it holds no extents. One that still holds
//! extents is emptied with an atomic `pvmove` when the group runs on
//! device-mapper and the rest of the group has room; otherwise it stays,
//! and the rescan says why ([`Kept`]). Nothing here ever drops extents:
//! a move is all or nothing, and a missing PV is never removed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::instrument;

use crate::engine::backend::Kept;
use crate::engine::disks::Disk;
use crate::engine::error::Result;

use super::super::cli::OWNER_TAG;
use super::super::device::Mode;
use super::super::report::VgSnapshot;
use super::LvmGroup;

/// The longest a `pvmove` may run: it copies the disk's used extents.
const PVMOVE_LIMIT: Duration = Duration::from_secs(24 * 3600);

/// The extents a PV of `pe_start` on a device of `device_bytes` would have
/// after `pvresize`, beyond the `pv_bytes` it has (pure; 0 when none).
pub(super) fn extents_gained(device_bytes: u64, pe_start: u64, pv_bytes: u64, extent: u64) -> u64 {
    if extent == 0 {
        return 0;
    }
    (device_bytes.saturating_sub(pe_start) / extent).saturating_sub(pv_bytes / extent)
}

/// What to do with a PV that is leaving its group (pure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Leave {
    /// It holds no extents: `vgreduce` and `pvremove`.
    Reduce,
    /// Its `used` extents fit in the free extents of the rest: `pvmove`
    /// onto `to`, then reduce.
    Move { used: u64, to: Vec<PathBuf> },
    /// It stays, for this reason.
    Stay(String),
}

/// Decides what happens to the PV `pv` leaving the VG of `snap`, given the
/// group's activation `mode` and the other leaving disks `leaving`.
pub(super) fn plan_leave(snap: &VgSnapshot, pv: &Path, mode: Mode, leaving: &[PathBuf]) -> Leave {
    let used_by: Vec<&str> = snap
        .segments
        .iter()
        .filter(|s| s.pv == pv)
        .filter_map(|s| s.lv.as_deref())
        .collect();
    let used: u64 = snap
        .segments
        .iter()
        .filter(|s| s.pv == pv && s.lv.is_some())
        .map(|s| s.len)
        .sum();
    let rest: Vec<PathBuf> = snap
        .pvs
        .iter()
        .map(|p| p.path.clone())
        .filter(|p| p != pv && !leaving.contains(p))
        .collect();
    if used == 0 {
        if snap.pvs.len() == 1 {
            return Leave::Stay(
                "it is the last physical volume of the volume group; \
                 remove the group from the configuration to release it"
                    .into(),
            );
        }
        return Leave::Reduce;
    }
    let mut lvs = used_by;
    lvs.sort_unstable();
    lvs.dedup();
    let holds = format!("it holds {used} extents of LVs [{}]", lvs.join(", "));
    if mode == Mode::Loop {
        return Leave::Stay(format!(
            "{holds}; moving them needs pvmove, which needs device-mapper, \
             and the group runs in loop activation"
        ));
    }
    let free: u64 = snap
        .segments
        .iter()
        .filter(|s| s.lv.is_none() && rest.contains(&s.pv))
        .map(|s| s.len)
        .sum();
    if free < used {
        return Leave::Stay(format!(
            "{holds}; the group's other disks have {free} free extents"
        ));
    }
    Leave::Move { used, to: rest }
}

impl LvmGroup {
    /// Takes `disks` (the group's, by the selector) into the VG and makes
    /// each of `leaving` (PVs of the VG the selector no longer matches)
    /// leave it where no data is lost; returns those that stay, and why.
    pub(super) async fn reconcile_pvs(
        &self,
        disks: &[Disk],
        leaving: &[Disk],
    ) -> Result<Vec<Kept>> {
        let mut devices: Vec<PathBuf> = disks
            .iter()
            .chain(leaving)
            .map(|d| d.path.clone())
            .collect();
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
        let mut snap = if new.is_empty() {
            snap
        } else {
            self.refresh().await?
        };
        if snap.vg.is_empty() {
            return Ok(Vec::new());
        }
        if self.grow_pvs(&snap, disks).await? {
            snap = self.refresh().await?;
        }
        let mut kept = Vec::new();
        let leaving_paths: Vec<PathBuf> = leaving.iter().map(|d| d.path.clone()).collect();
        for disk in leaving {
            if !snap.pvs.iter().any(|p| p.path == disk.path) {
                continue;
            }
            match plan_leave(&snap, &disk.path, self.mode, &leaving_paths) {
                Leave::Stay(reason) => {
                    tracing::warn!(carina.lvm.vg = %self.vg(), carina.disk = %disk.path.display(), "the selector no longer matches this disk, and it stays in the volume group: {reason}");
                    kept.push(Kept {
                        path: disk.path.clone(),
                        reason,
                    });
                }
                Leave::Reduce => {
                    self.reduce(&disk.path).await?;
                    snap = self.refresh().await?;
                }
                Leave::Move { used, to } => {
                    // A move that fails is a reason to stay, not a failed
                    // rescan: the group keeps serving from the old extents.
                    if let Err(e) = self.move_off(&disk.path, used, &to).await {
                        let reason = format!(
                            "it holds {used} extents; moving them failed, and they stay \
                             where they were: {e}"
                        );
                        kept.push(Kept {
                            path: disk.path.clone(),
                            reason,
                        });
                        snap = self.refresh().await?;
                        continue;
                    }
                    self.reduce(&disk.path).await?;
                    snap = self.refresh().await?;
                }
            }
        }
        Ok(kept)
    }

    /// `pvresize`s every PV of `disks` whose device has grown by at least
    /// one extent; whether any was.
    async fn grow_pvs(&self, snap: &VgSnapshot, disks: &[Disk]) -> Result<bool> {
        let mut grown = false;
        for pv in &snap.pvs {
            let Some(disk) = disks.iter().find(|d| d.path == pv.path) else {
                continue;
            };
            let gained = extents_gained(disk.size_bytes, pv.pe_start, pv.size, snap.extent_size);
            if gained > 0 {
                self.pvresize(&pv.path, pv.size, disk.size_bytes, gained)
                    .await?;
                grown = true;
            }
        }
        Ok(grown)
    }

    #[instrument(name = "lvm.pvresize", skip(self), err, fields(carina.lvm.vg = %self.vg(), carina.disk = %pv.display()))]
    async fn pvresize(
        &self,
        pv: &Path,
        pv_bytes: u64,
        device_bytes: u64,
        gained: u64,
    ) -> Result<()> {
        self.change(self.cmd("pvresize").arg("-q").arg(pv)).await?;
        self.invalidate();
        tracing::info!(
            carina.lvm.vg = %self.vg(),
            carina.disk = %pv.display(),
            pv_bytes,
            device_bytes,
            extents_gained = gained,
            "pvresize: the disk grew"
        );
        Ok(())
    }

    /// Takes the empty PV `pv` out of the VG and wipes its label.
    #[instrument(name = "lvm.vgreduce", skip(self), err, fields(carina.lvm.vg = %self.vg(), carina.disk = %pv.display()))]
    async fn reduce(&self, pv: &Path) -> Result<()> {
        self.change(self.cmd("vgreduce").arg("-q").arg(self.vg()).arg(pv))
            .await?;
        self.invalidate();
        // The disk is no longer ours: later commands must not see it.
        self.lock().devices.retain(|d| d != pv);
        self.lock().known_pvs.retain(|d| d != pv);
        let pvremove = super::super::cli::lvm_cmd("pvremove", &[pv.to_path_buf()])
            .args(["-q", "-y"])
            .arg(pv);
        self.run(pvremove).await?;
        tracing::info!(carina.lvm.vg = %self.vg(), carina.disk = %pv.display(), "the selector no longer matches this disk: removed from the volume group (vgreduce, pvremove)");
        Ok(())
    }

    /// Moves every used extent off `pv` onto `to` in one atomic `pvmove`
    /// (all or nothing: an interrupted move leaves the data where it was).
    #[instrument(name = "lvm.pvmove", skip(self), err, fields(carina.lvm.vg = %self.vg(), carina.disk = %pv.display()))]
    async fn move_off(&self, pv: &Path, used: u64, to: &[PathBuf]) -> Result<()> {
        tracing::info!(carina.lvm.vg = %self.vg(), carina.disk = %pv.display(), extents = used, "pvmove: emptying a disk the selector no longer matches");
        let cmd = self
            .cmd("pvmove")
            .args(["-q", "--atomic"])
            .arg(pv)
            .args(to.iter().map(|p| p.as_os_str().to_owned()));
        // A process of its own with its own limit: a move copies data and
        // must not hold the node's lvm shell.
        self.cache.begin_change();
        let result = cmd.timeout(PVMOVE_LIMIT).run().await;
        self.invalidate();
        result?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::lvm::{Pv, Segment};

    const EXTENT: u64 = 4 << 20;

    fn snap(segments: &[(&str, u64, u64, Option<&str>)]) -> VgSnapshot {
        let mut s = VgSnapshot {
            vg: "g".into(),
            extent_size: EXTENT,
            ..VgSnapshot::default()
        };
        for (pv, start, len, lv) in segments {
            if !s.pvs.iter().any(|p| p.path == Path::new(pv)) {
                s.pvs.push(Pv {
                    path: PathBuf::from(pv),
                    pe_start: 1 << 20,
                    size: 15 * EXTENT,
                });
            }
            s.segments.push(Segment {
                pv: PathBuf::from(pv),
                start: *start,
                len: *len,
                lv: lv.map(str::to_string),
            });
        }
        s
    }

    #[test]
    fn a_disk_grown_by_an_extent_or_more_gains_extents() {
        // 64 MiB device, 1 MiB before the extents: 15 extents, as LVM has.
        assert_eq!(extents_gained(64 << 20, 1 << 20, 15 * EXTENT, EXTENT), 0);
        assert_eq!(extents_gained(128 << 20, 1 << 20, 15 * EXTENT, EXTENT), 16);
        // Less than an extent more: nothing to gain, no pvresize.
        assert_eq!(
            extents_gained((64 << 20) + 4096, 1 << 20, 15 * EXTENT, EXTENT),
            0
        );
        // A device smaller than its PV (a shrunken disk): never negative.
        assert_eq!(extents_gained(32 << 20, 1 << 20, 15 * EXTENT, EXTENT), 0);
        assert_eq!(extents_gained(64 << 20, 1 << 20, 15 * EXTENT, 0), 0);
    }

    #[test]
    fn an_empty_leaving_disk_is_reduced_unless_it_is_the_last() {
        let s = snap(&[("/dev/a", 0, 15, None), ("/dev/b", 0, 15, None)]);
        assert_eq!(
            plan_leave(&s, Path::new("/dev/b"), Mode::Loop, &[]),
            Leave::Reduce
        );
        let one = snap(&[("/dev/a", 0, 15, None)]);
        let Leave::Stay(why) = plan_leave(&one, Path::new("/dev/a"), Mode::DeviceMapper, &[])
        else {
            panic!("the last PV stays");
        };
        assert!(why.contains("last physical volume"), "{why}");
    }

    #[test]
    fn a_leaving_disk_with_extents_moves_only_with_device_mapper_and_room() {
        let s = snap(&[
            ("/dev/a", 0, 15, None),
            ("/dev/b", 0, 5, Some("v1")),
            ("/dev/b", 5, 10, None),
        ]);
        let Leave::Stay(why) = plan_leave(&s, Path::new("/dev/b"), Mode::Loop, &[]) else {
            panic!("loop activation cannot move");
        };
        assert!(
            why.contains("5 extents of LVs [v1]") && why.contains("device-mapper"),
            "{why}"
        );
        assert_eq!(
            plan_leave(&s, Path::new("/dev/b"), Mode::DeviceMapper, &[]),
            Leave::Move {
                used: 5,
                to: vec![PathBuf::from("/dev/a")]
            }
        );
        // The only other disk is leaving too: no room.
        let both = [PathBuf::from("/dev/a"), PathBuf::from("/dev/b")];
        let Leave::Stay(why) = plan_leave(&s, Path::new("/dev/b"), Mode::DeviceMapper, &both)
        else {
            panic!("no room");
        };
        assert!(why.contains("other disks have 0 free extents"), "{why}");
        let full = snap(&[
            ("/dev/a", 0, 12, Some("v2")),
            ("/dev/a", 12, 3, None),
            ("/dev/b", 0, 5, Some("v1")),
            ("/dev/b", 5, 10, None),
        ]);
        let Leave::Stay(why) = plan_leave(&full, Path::new("/dev/b"), Mode::DeviceMapper, &[])
        else {
            panic!("no room");
        };
        assert!(why.contains("3 free extents"), "{why}");
    }
}
