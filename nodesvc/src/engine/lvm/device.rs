//! The block devices of LVs: where an LV shows up (`/dev/<vg>/<lv>` with
//! device-mapper, else a loop device over its extents on the PV, attached
//! or found and resized here), zeroing the ends of a new device, and
//! refusing to delete a device that is in use.

use std::path::{Path, PathBuf};

use carina_sys::blockdev;
use carina_sys::loopdev::{self, LosetupDevice};

use crate::engine::error::{Error, Result};

use super::report::{Lv, VgSnapshot};

/// How this group's LVs become block devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    DeviceMapper,
    Loop,
}

/// The device-mapper node of LV `lv` in VG `vg`.
pub(super) fn dm_path(vg: &str, lv: &str) -> PathBuf {
    PathBuf::from(format!("/dev/{vg}/{lv}"))
}

/// The block device of an LV, attaching its loop device if needed;
/// `loops` is the current loop device list if the caller has it.
pub(super) async fn expose(
    mode: Mode,
    vg: &str,
    snap: &VgSnapshot,
    lv: &Lv,
    loops: Option<&[LosetupDevice]>,
) -> Result<PathBuf> {
    match mode {
        Mode::DeviceMapper => Ok(dm_path(vg, &lv.name)),
        Mode::Loop => {
            let (pv, offset) = snap.loop_window(lv)?;
            let owned_loops;
            let loops = match loops {
                Some(l) => l,
                None => {
                    owned_loops = loopdev::list().await?;
                    &owned_loops
                }
            };
            if let Some(found) = loopdev::find(loops, &pv, offset) {
                let dev = PathBuf::from(&found.name);
                if found.sizelimit != lv.size {
                    loopdev::set_size_limit(&dev, lv.size).await?;
                }
                return Ok(dev);
            }
            Ok(loopdev::attach(&pv, offset, lv.size).await?)
        }
    }
}

/// Fails with `FailedPrecondition` if the block device of volume `volume`
/// is mounted or held open exclusively, so it is not deleted under a user.
pub(super) fn ensure_unused(dev: &Path, volume: &str) -> Result<()> {
    match blockdev::in_use(dev) {
        Ok(false) => Ok(()),
        Ok(true) => Err(Error::FailedPrecondition {
            operation: "delete",
            name: volume.to_string(),
            reason: format!("{} is in use (mounted or held open)", dev.display()),
        }),
        Err(e) => Err(Error::io("open", dev, e)),
    }
}
