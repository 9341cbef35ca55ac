//! Creating a volume: validation, rounding to the group's unit, the
//! idempotent answer for a repeated create, the journal record around the
//! backend's create, and the creation trace kept for the volume.

use carina_sys::crashpoint;
use tracing::instrument;

use super::intents::{Intent, Operation};
use super::volume::ChangeReason;
use super::{
    Backend, CreateRequest, Engine, Error, Policy, Result, Volume, backend_call, changed_unit,
    names,
};

impl Engine {
    /// Creates a volume, or returns the existing one when the same name,
    /// group and (rounded) size are requested again.
    pub async fn create_volume(&self, req: CreateRequest) -> Result<Volume> {
        self.ensure_volume(req).await.map(|(v, _)| v)
    }

    /// [`Engine::create_volume`] that also says whether this call created
    /// the volume (`false`: it already existed with these arguments). The
    /// answer is exact: it is decided under the volume's lock.
    #[instrument(skip(self), err(level = "info"), fields(carina.volume.name = %req.name, carina.group = %req.group, carina.volume.size_bytes = req.size_bytes))]
    pub async fn ensure_volume(&self, req: CreateRequest) -> Result<(Volume, bool)> {
        names::check_volume_name(&req.name)?;
        names::check_size("size_bytes", req.size_bytes)?;
        if req.group.is_empty() {
            return Err(Error::invalid("group", "must not be empty"));
        }
        let _guard = self.inner.locks.try_lock(&req.name)?;
        self.settle(&req.name).await?;
        let slot = self.slot(&req.group).await?;
        let backend = &slot.backend;
        if req.exclusive && backend.config().policy != Policy::Raw {
            return Err(Error::Unsupported {
                group: req.group.clone(),
                policy: backend.config().policy.as_str(),
                operation: "exclusive (whole-disk) volumes",
            });
        }
        let rounded = backend.round_size(req.size_bytes).ok_or_else(|| {
            Error::invalid(
                "size_bytes",
                format!(
                    "{} cannot be rounded to the allocation unit",
                    req.size_bytes
                ),
            )
        })?;
        if let Some(existing) = self.find(&req.name).await? {
            let same = existing.group == req.group
                && existing.exclusive == req.exclusive
                && (existing.size_bytes == rounded
                    || (req.exclusive && existing.size_bytes >= rounded));
            if same {
                self.keep_creation_trace(&existing.name);
                return Ok((existing, false));
            }
            return Err(Error::AlreadyExists {
                name: req.name.clone(),
                group: existing.group,
                existing_bytes: existing.size_bytes,
                requested_bytes: rounded,
            });
        }
        let rounded_req = CreateRequest {
            size_bytes: rounded,
            ..req
        };
        let volume = {
            let (slot, lock) = self.lock_current(slot).await?;
            let backend = &slot.backend;
            if backend.round_size(rounded_req.size_bytes) != Some(rounded_req.size_bytes) {
                return Err(changed_unit());
            }
            let name = &rounded_req.name;
            self.inner.intents.begin(
                name,
                &Intent {
                    operation: Operation::Create,
                    group: rounded_req.group.clone(),
                    size_bytes: rounded_req.size_bytes,
                },
            )?;
            crashpoint::reach("create.begun", name);
            let created = backend_call(
                backend.as_ref(),
                "create",
                backend.create_releasing(&rounded_req, &lock),
            )
            .await;
            let volume = match created {
                Ok(volume) => volume,
                Err(e) => {
                    self.end_failed_create(backend.as_ref(), name).await;
                    return Err(e);
                }
            };
            crashpoint::reach("create.made", name);
            if let Err(e) = self.inner.intents.end(name) {
                // Answered, the volume would be rolled back at the next
                // start: it goes now, or then if this fails too.
                tracing::warn!(carina.volume.name = %name, error = %e, "the create cannot be recorded as done; rolling it back");
                // The backend may have handed the group's lock back for
                // its last steps.
                lock.reacquire().await;
                if backend_call(backend.as_ref(), "delete", backend.delete(name))
                    .await
                    .is_ok()
                {
                    let _ = self.inner.intents.end(name);
                }
                return Err(e);
            }
            // Indexed under the group's lock, like a rescan's listing.
            self.index_insert(&volume.name, &volume.group);
            volume
        };
        self.keep_creation_trace(&volume.name);
        self.notify(ChangeReason::Create).await;
        Ok((volume, true))
    }

    /// Keeps the current trace as `name`'s creation trace, unless it has
    /// one (a retried create keeps the first).
    fn keep_creation_trace(&self, name: &str) {
        if let (Some(links), Some(traceparent)) = (
            &self.inner.trace_links,
            carina_proto::trace::current_traceparent(),
        ) {
            links.record(name, &traceparent);
        }
    }

    /// The W3C `traceparent` of the span that created volume `name`, if
    /// the node kept one.
    pub fn creation_trace(&self, name: &str) -> Option<String> {
        names::check_volume_name(name).ok()?;
        self.inner.trace_links.as_ref()?.get(name)
    }

    /// Ends the record of a create that failed, unless the backend could
    /// not take back what it made (its rollback failed too): then the
    /// record stays, and the volume is removed by the next change of that
    /// name or the node's next start.
    async fn end_failed_create(&self, backend: &dyn Backend, name: &str) {
        match backend.get(name).await {
            Ok(None) => self.end_quietly(name),
            Ok(Some(_)) => {
                tracing::warn!(carina.volume.name = %name, "a failed create left its volume behind; it is removed before the next change of that name")
            }
            Err(e) => {
                tracing::warn!(carina.volume.name = %name, error = %e, "cannot tell what a failed create left; the journal keeps it")
            }
        }
    }
}
