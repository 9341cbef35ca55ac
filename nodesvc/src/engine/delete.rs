//! Deleting a volume: the refusals (a bcache member, a volume still
//! mounted on this node), the journal record around the backend's delete,
//! and what is forgotten with the volume.

use carina_sys::crashpoint;
use tracing::instrument;

use super::intents::{Intent, Operation};
use super::volume::ChangeReason;
use super::{Backend, Engine, Error, Result, backend_call, inuse, names, quota};

impl Engine {
    /// Deletes a volume we own; `VolumeNotFound` if there is none, and
    /// `FailedPrecondition` while a bcache device is made of it.
    #[instrument(skip(self), err(level = "info"), fields(carina.volume.name = %name))]
    pub async fn delete_volume(&self, name: &str) -> Result<()> {
        names::check_volume_name(name)?;
        if let Some(device) = self.inner.bcache.user_of(name) {
            return Err(Error::FailedPrecondition {
                operation: "delete",
                name: name.to_string(),
                reason: format!(
                    "the volume is part of bcache device {device:?}; delete that first"
                ),
            });
        }
        self.delete_volume_unchecked(name).await
    }

    /// [`Engine::delete_volume`] without the bcache check (a bcache
    /// delete removes its own volumes).
    pub(super) async fn delete_volume_unchecked(&self, name: &str) -> Result<()> {
        let _guard = self.inner.locks.try_lock(name)?;
        if self.settle(name).await? == Some(Operation::Delete) {
            // This is the retry of a delete the node was killed in, and
            // settling it finished it.
            self.notify(ChangeReason::Delete).await;
            return Ok(());
        }
        // The index names the group and the backend's delete says whether
        // the volume is there: reading it first would read the group twice.
        let not_found = || Error::VolumeNotFound {
            name: name.to_string(),
        };
        // Gone: its index entry and creation trace go too.
        let forget = || {
            self.index_remove(name);
            if let Some(links) = &self.inner.trace_links {
                links.forget(name);
            }
            self.inner.copies.remove(name);
        };
        let slot = match self.indexed_group(name) {
            Some(group) => self.slot(&group).await.ok(),
            None => None,
        };
        let Some(slot) = slot else {
            forget();
            return Err(not_found());
        };
        let deleted = {
            let (slot, _lock) = self.lock_current(slot).await?;
            self.ensure_not_in_use(slot.backend.as_ref(), name).await?;
            self.inner.intents.begin(
                name,
                &Intent {
                    operation: Operation::Delete,
                    group: slot.backend.config().name.clone(),
                    size_bytes: 0,
                },
            )?;
            crashpoint::reach("delete.begun", name);
            backend_call(slot.backend.as_ref(), "delete", slot.backend.delete(name)).await
        };
        match deleted {
            Ok(()) => self.end_quietly(name),
            Err(e @ Error::VolumeNotFound { .. }) => {
                self.end_quietly(name);
                forget();
                return Err(e);
            }
            // Refused before anything changed: the volume is whole.
            Err(e @ (Error::FailedPrecondition { .. } | Error::InvalidArgument { .. })) => {
                self.end_quietly(name);
                return Err(e);
            }
            // The volume may be half removed: the record stays, and the
            // delete is finished by the next change of the volume or the
            // node's next start.
            Err(e) => return Err(e),
        }
        forget();
        self.notify(ChangeReason::Delete).await;
        Ok(())
    }

    /// Refuses to delete a volume that is mounted on this node (staged,
    /// published, its device node or directory bound): `FailedPrecondition`
    /// naming the mounts, the volume kept whole. The operator's word is the
    /// unmount: once the pod that uses it is gone from this node, the
    /// control plane's next DeleteLV goes through. There is no force: a
    /// delete under a running pod is what this refuses.
    async fn ensure_not_in_use(&self, backend: &dyn Backend, name: &str) -> Result<()> {
        let Some(volume) = backend.get(name).await? else {
            // Not there: the backend's delete answers NOT_FOUND.
            return Ok(());
        };
        let text = tokio::fs::read_to_string(quota::MOUNTINFO)
            .await
            .map_err(|e| Error::io("read", quota::MOUNTINFO, e))?;
        let entries =
            carina_sys::mount::parse_mountinfo(&text).map_err(|e| Error::parse("mountinfo", e))?;
        let table = carina_sys::mount::MountTable::from_entries(entries);
        let host_dir = match &volume.host_path {
            Some(dir) => tokio::fs::canonicalize(dir).await.ok(),
            None => None,
        };
        let mounts = inuse::mounts_of(&table, &volume, host_dir.as_deref());
        if mounts.is_empty() {
            return Ok(());
        }
        let list = mounts
            .iter()
            .map(|m| m.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        tracing::warn!(
            carina.volume.name = %name,
            carina.volume.mounts = %list,
            "delete refused: the volume is still mounted on this node; kept until it is unmounted"
        );
        Err(Error::FailedPrecondition {
            operation: "delete",
            name: name.to_string(),
            reason: format!(
                "still mounted on this node at {list}; it is kept: stop the pod that uses it \
                 here (or unmount it) and delete again"
            ),
        })
    }
}
