//! Growing a volume: the checks that refuse a shrink, a bcache member or
//! a snapshot, and the journal record around the backend's resize.

use carina_sys::crashpoint;
use tracing::instrument;

use super::intents::{Intent, Operation};
use super::volume::ChangeReason;
use super::{Engine, Error, Result, Volume, backend_call, changed_unit, names};

impl Engine {
    /// Grows a volume to at least `size_bytes` (rounded up to the group's
    /// unit). Shrinking is refused, and growing a volume a bcache device
    /// is made of; the current size is a no-op.
    #[instrument(skip(self), err(level = "info"), fields(carina.volume.name = %name, carina.volume.size_bytes = size_bytes))]
    pub async fn resize_volume(&self, name: &str, size_bytes: u64) -> Result<Volume> {
        names::check_volume_name(name)?;
        names::check_size("size_bytes", size_bytes)?;
        let _guard = self.inner.locks.try_lock(name)?;
        self.settle(name).await?;
        let existing = self.existing(name).await?;
        if let Some(device) = self.inner.bcache.user_of(name)
            && size_bytes > existing.size_bytes
        {
            // The kernel sizes a bcache device when it registers the
            // backing device, and a cache sized by ratio would not follow.
            return Err(Error::FailedPrecondition {
                operation: "resize",
                name: name.to_string(),
                reason: format!(
                    "the volume is part of bcache device {device:?}, and bcache devices cannot grow"
                ),
            });
        }
        if size_bytes > existing.size_bytes && self.is_snapshot(name)? {
            return Err(Error::FailedPrecondition {
                operation: "resize",
                name: name.to_string(),
                reason: "the volume is a snapshot, which is read-only".to_string(),
            });
        }
        let slot = self.slot(&existing.group).await?;
        let rounded = slot.backend.round_size(size_bytes).ok_or_else(|| {
            Error::invalid(
                "size_bytes",
                format!("{size_bytes} cannot be rounded to the allocation unit"),
            )
        })?;
        if rounded == existing.size_bytes || (existing.exclusive && rounded <= existing.size_bytes)
        {
            return Ok(existing);
        }
        if rounded < existing.size_bytes {
            return Err(Error::FailedPrecondition {
                operation: "resize",
                name: name.to_string(),
                reason: format!(
                    "shrinking from {} to {rounded} bytes is not supported",
                    existing.size_bytes
                ),
            });
        }
        let volume = {
            let (slot, _lock) = self.lock_current(slot).await?;
            if slot.backend.round_size(rounded) != Some(rounded) {
                return Err(changed_unit());
            }
            self.inner.intents.begin(
                name,
                &Intent {
                    operation: Operation::Resize,
                    group: existing.group.clone(),
                    size_bytes: rounded,
                },
            )?;
            crashpoint::reach("resize.begun", name);
            let resized = backend_call(
                slot.backend.as_ref(),
                "resize",
                slot.backend.resize(name, rounded),
            )
            .await;
            // Either size is a whole volume: the record only has to go.
            self.end_quietly(name);
            resized?
        };
        self.notify(ChangeReason::Resize).await;
        Ok(volume)
    }
}
