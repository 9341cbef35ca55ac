//! Adopting a logical volume another program made in the group's VG: the
//! LV keeps its name, extents and data; our owner tag is added (one
//! `lvchange`, so the LV is either untouched or ours), after checking that
//! it is large enough and, in loop mode, that it can be exposed.

use crate::engine::error::{Error, Result};
use crate::engine::volume::{AdoptRequest, Volume};

use super::super::cli::OWNER_TAG;
use super::{LvmGroup, Mode};

impl LvmGroup {
    /// Tags the LV `req.name` as ours and returns it exposed; an LV that
    /// is ours already is only returned.
    #[tracing::instrument(skip_all, fields(carina.lvm.vg = %self.vg(), carina.lvm.lv = %req.name))]
    pub(super) async fn adopt_lv(&self, req: &AdoptRequest) -> Result<Volume> {
        let _exposing = self.exposure.lock().await;
        let snap = self.refresh().await?;
        let not_found = || Error::VolumeNotFound {
            name: req.name.clone(),
        };
        let lv = snap.lvs.get(&req.name).cloned().ok_or_else(not_found)?;
        if lv.size < req.size_bytes {
            return Err(Error::FailedPrecondition {
                operation: "adopt",
                name: req.name.clone(),
                reason: format!(
                    "logical volume {}/{} has {} bytes, less than the {} recorded",
                    self.vg(),
                    req.name,
                    lv.size,
                    req.size_bytes
                ),
            });
        }
        if lv.owned() {
            let device = self.expose(&snap, &lv, None).await?;
            return self.volume(&lv, device);
        }
        if self.mode == Mode::Loop {
            // Checked before the tag: an LV we could not expose must not
            // become ours.
            snap.loop_window(&lv)?;
        }
        let mut cmd = self
            .cmd("lvchange")
            .args(["-q", "--addtag", OWNER_TAG])
            .arg(format!("{}/{}", self.vg(), req.name));
        if self.mode == Mode::Loop {
            cmd = cmd.args(["--driverloaded", "n"]);
        }
        let result = self.change(cmd).await;
        self.invalidate();
        result?;
        let snap = self.refresh().await?;
        let lv = snap
            .lvs
            .get(&req.name)
            .filter(|lv| lv.owned())
            .cloned()
            .ok_or_else(not_found)?;
        let device = self.expose(&snap, &lv, None).await?;
        self.volume(&lv, device)
    }
}
