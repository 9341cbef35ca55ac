//! Taking over a volume another program (Go Carina) made on this node, in
//! place and under its own name: the group's backend adds what makes the
//! volume ours (an LVM tag, a GPT name and type, a HOST marker) without
//! touching its data. Afterwards it is a volume like any other. A RAW
//! volume's disk may hold only the other program's partitions, which keeps
//! the group from taking it: it is adopted on the disk the request names
//! when the group's selector matches it, and the group takes it then.

use tracing::instrument;

use super::volume::ChangeReason;
use super::{AdoptRequest, Disk, Engine, Error, Policy, Result, Volume, backend_call, names};

fn differs(name: &str, reason: String) -> Error {
    Error::FailedPrecondition {
        operation: "adopt",
        name: name.to_string(),
        reason,
    }
}

impl Engine {
    /// Adopts the volume `req.name` of group `req.group`, or returns it
    /// when it is ours already (in that group, at least `req.size_bytes`).
    #[instrument(skip(self), err(level = "info"), fields(carina.volume.name = %req.name, carina.group = %req.group, carina.volume.size_bytes = req.size_bytes))]
    pub async fn adopt_volume(&self, req: AdoptRequest) -> Result<Volume> {
        names::check_volume_name(&req.name)?;
        let _guard = self.inner.locks.try_lock(&req.name)?;
        self.settle(&req.name).await?;
        if let Some(existing) = self.find(&req.name).await? {
            return check_adopted(&req, existing);
        }
        let slot = self.slot(&req.group).await.map_err(|_| {
            differs(
                &req.name,
                format!(
                    "device group {:?} is not configured on this node",
                    req.group
                ),
            )
        })?;
        let policy = slot.backend.config().policy;
        if policy != req.policy {
            return Err(differs(
                &req.name,
                format!(
                    "device group {:?} is a {policy} group, not {}",
                    req.group, req.policy
                ),
            ));
        }
        let disk = match &req.disk {
            Some(disk) => Some(self.adoptable_disk(&req, disk).await?),
            None => None,
        };
        let volume = {
            let (slot, _lock) = self.lock_current(slot).await?;
            let backend = &slot.backend;
            let adopt = backend.adopt(&req, disk.as_ref().map(|(d, _)| d));
            let volume = backend_call(backend.as_ref(), "adopt", adopt).await?;
            self.index_insert(&volume.name, &volume.group);
            volume
        };
        let volume = check_adopted(&req, volume)?;
        if disk.is_some_and(|(_, taken)| !taken) {
            // The group takes the disk now that a partition on it is ours;
            // until it has, the volume is not found by name. A retry of
            // the adoption finds the partition ours and rescans again.
            self.rescan_with(ChangeReason::Create).await?;
        } else {
            self.notify(ChangeReason::Create).await;
        }
        Ok(volume)
    }
}

impl Engine {
    /// The disk `name` as the last scan saw it, if the group `req.group`
    /// took it or its selector matches it (a disk holding only another
    /// program's partitions is not taken), and whether the group took it.
    async fn adoptable_disk(&self, req: &AdoptRequest, name: &str) -> Result<(Disk, bool)> {
        let status = self
            .inner
            .disks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|s| s.disk.name == name)
            .cloned()
            .ok_or_else(|| Error::VolumeNotFound {
                name: req.name.clone(),
            })?;
        if status.group.as_deref() == Some(req.group.as_str()) {
            return Ok((status.disk, true));
        }
        let config = self.config().await;
        let first = config.groups.iter().find(|g| {
            g.policy != Policy::Host
                && g.matches(&status.disk.path, &status.disk.name)
                && g.takes_kind(status.disk.rotational)
        });
        match (status.group, first) {
            (None, Some(g)) if g.name == req.group => Ok((status.disk, false)),
            (Some(other), _) => Err(differs(
                &req.name,
                format!(
                    "disk {name} belongs to device group {other:?}, not {:?}",
                    req.group
                ),
            )),
            (None, _) => Err(differs(
                &req.name,
                format!(
                    "disk {name} is not selected by device group {:?}",
                    req.group
                ),
            )),
        }
    }
}

/// The answer for a volume we own: it must be in the group asked for and
/// at least the size recorded.
fn check_adopted(req: &AdoptRequest, volume: Volume) -> Result<Volume> {
    if volume.group != req.group {
        return Err(differs(
            &req.name,
            format!(
                "it is in device group {:?}, not {:?}",
                volume.group, req.group
            ),
        ));
    }
    if volume.size_bytes < req.size_bytes {
        return Err(differs(
            &req.name,
            format!(
                "it has {} bytes, less than the {} recorded",
                volume.size_bytes, req.size_bytes
            ),
        ));
    }
    Ok(volume)
}
