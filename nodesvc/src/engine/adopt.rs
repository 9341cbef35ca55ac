//! Taking over a volume another program (Go Carina) made on this node, in
//! place and under its own name: the group's backend adds what makes the
//! volume ours (an LVM tag, a GPT name and type, a HOST marker) without
//! touching its data. Afterwards it is a volume like any other.

use tracing::instrument;

use super::volume::ChangeReason;
use super::{AdoptRequest, Engine, Error, Result, Volume, backend_call, names};

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
        let volume = {
            let (slot, _lock) = self.lock_current(slot).await?;
            let backend = &slot.backend;
            let volume = backend_call(backend.as_ref(), "adopt", backend.adopt(&req)).await?;
            self.index_insert(&volume.name, &volume.group);
            volume
        };
        let volume = check_adopted(&req, volume)?;
        self.notify(ChangeReason::Create).await;
        Ok(volume)
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
