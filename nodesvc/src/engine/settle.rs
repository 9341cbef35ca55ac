//! Settling changes a node did not finish (restart recovery): what the
//! journal of intents records is rolled back (a create), finished (a
//! delete) or kept at the size it reached (a resize), at start and before
//! the next change of the volume.

use super::intents::Operation;
use super::volume::ChangeReason;
use super::{Engine, Error, Result, backend_call, names};

impl Engine {
    /// Ends `name`'s journal record where a record left behind is
    /// harmless (settling it changes nothing), so a failure is logged.
    pub(super) fn end_quietly(&self, name: &str) {
        if let Err(e) = self.inner.intents.end(name) {
            tracing::warn!(carina.volume.name = %name, error = %e, "the journal record of a finished change stays");
        }
    }

    /// Settles what an interrupted change of `name` left (see
    /// [`intents`]): rolls back a create, finishes a delete, keeps a
    /// resize at the size it reached. Returns the operation settled. The
    /// caller holds `name`'s lock. An error leaves the record, so it is
    /// tried again.
    pub(super) async fn settle(&self, name: &str) -> Result<Option<Operation>> {
        let Some(intent) = self.inner.intents.get(name)? else {
            return Ok(None);
        };
        let slot = match self.slot(&intent.group).await {
            Ok(slot) => Some(slot),
            // The group is no longer configured: nothing of it to settle.
            Err(Error::UnknownGroup { .. }) => None,
            Err(e) => return Err(e),
        };
        if let Some(slot) = slot {
            match intent.operation {
                Operation::Create | Operation::Delete => {
                    let (slot, _lock) = self.lock_current(slot).await?;
                    match backend_call(slot.backend.as_ref(), "delete", slot.backend.delete(name))
                        .await
                    {
                        Ok(()) | Err(Error::VolumeNotFound { .. }) => {}
                        Err(e) => return Err(e),
                    }
                    self.index_remove(name);
                    if let Some(links) = &self.inner.trace_links {
                        links.forget(name);
                    }
                    self.inner.copies.remove(name);
                }
                // Getting it sizes its device from the volume.
                Operation::Resize => {
                    slot.backend.get(name).await?;
                }
            }
        }
        self.inner.intents.end(name)?;
        tracing::info!(
            carina.volume.name = %name,
            carina.group = %intent.group,
            operation = intent.operation.as_str(),
            "settled a change the node did not finish: {}",
            match intent.operation {
                Operation::Create => "the half-made volume was removed",
                Operation::Delete => "the delete was finished",
                Operation::Resize => "the volume keeps the size it reached",
            }
        );
        Ok(Some(intent.operation))
    }

    /// At start: settles every change an earlier run left unfinished. One
    /// that cannot be settled now is logged and tried again before the
    /// next change of its volume.
    pub(super) async fn settle_interrupted(&self) {
        let pending = match self.inner.intents.pending() {
            Ok(pending) => pending,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the journal of interrupted changes");
                return;
            }
        };
        let mut settled = 0;
        for name in pending {
            if let Err(e) = names::check_volume_name(&name) {
                tracing::warn!(volume = %name, error = %e, "a journal record names no volume; left alone");
                continue;
            }
            let Ok(_guard) = self.inner.locks.try_lock(&name) else {
                continue;
            };
            match self.settle(&name).await {
                Ok(Some(_)) => settled += 1,
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(carina.volume.name = %name, error = %e, "cannot settle an interrupted change yet")
                }
            }
        }
        if settled > 0 {
            self.notify(ChangeReason::Start).await;
        }
    }
}
