//! Creating a bcache device: the checks of the request and of both
//! volumes, the record written first, the volumes made when the device
//! owns them, `make-bcache` on blank volumes only, and the assembly.

use std::path::Path;

use tracing::instrument;

use super::record::{Phase, Record};
use super::tools::{self, Role};
use super::{BcacheDevice, BcacheRequest, cache_size, check_field, device_of, lock_key};
use crate::engine::config::Policy;
use crate::engine::error::{Error, Result};
use crate::engine::volume::{CreateRequest, Volume};
use crate::engine::{Engine, names};

impl Engine {
    /// Creates (or finds again) the bcache device `req.name`. The second
    /// value is `false` when it already existed with these arguments.
    ///
    /// Errors: `InvalidArgument` naming the field; `FailedPrecondition`
    /// without the kernel driver or a state directory, for a volume in
    /// use or holding someone else's superblock; `BcacheConflict` for the
    /// name with other arguments; the volume errors of the create.
    #[instrument(skip(self), err(level = "info"), fields(carina.bcache.name = %req.name, carina.bcache.backing = %req.backing_volume, carina.bcache.cache = %req.cache_volume))]
    pub async fn ensure_bcache(&self, req: BcacheRequest) -> Result<(BcacheDevice, bool)> {
        check_field("name", &req.name)?;
        check_field("backing_volume", &req.backing_volume)?;
        check_field("cache_volume", &req.cache_volume)?;
        if req.backing_volume == req.cache_volume {
            return Err(Error::invalid(
                "cache_volume",
                "must differ from backing_volume",
            ));
        }
        if let Some(o) = &req.create {
            if o.backing_group.is_empty() {
                return Err(Error::invalid("backing_device_group", "must not be empty"));
            }
            if o.cache_group.is_empty() {
                return Err(Error::invalid("cache_device_group", "must not be empty"));
            }
            names::check_size("size_bytes", o.size_bytes)?;
            if !(1..=100).contains(&o.cache_ratio_percent) {
                return Err(Error::invalid(
                    "cache_ratio_percent",
                    format!(
                        "{} is not a percentage from 1 to 100",
                        o.cache_ratio_percent
                    ),
                ));
            }
        }
        let _guard = self.inner.locks.try_lock(&lock_key(&req.name))?;
        let bcache = self.bcache();
        bcache.records("create", &req.name)?;
        bcache.require_kernel("create", &req.name).await?;

        let mut record = match bcache.get(&req.name) {
            Some(rec) => {
                let same = rec.backing_volume == req.backing_volume
                    && rec.cache_volume == req.cache_volume
                    && rec.owned == req.create
                    && rec.cache_mode == req.cache_mode;
                if !same {
                    return Err(Error::BcacheConflict {
                        name: req.name.clone(),
                        reason: format!(
                            "it exists with backing volume {:?}, cache volume {:?}, cache mode {}{}",
                            rec.backing_volume,
                            rec.cache_volume,
                            rec.cache_mode,
                            match &rec.owned {
                                Some(o) => format!(
                                    ", made in groups {:?}/{:?} with {} bytes and a {}% cache",
                                    o.backing_group,
                                    o.cache_group,
                                    o.size_bytes,
                                    o.cache_ratio_percent
                                ),
                                None => String::new(),
                            }
                        ),
                    });
                }
                match rec.phase {
                    Phase::Ready => {
                        let (b, c) = self.volumes_of(&rec).await?;
                        self.assemble(&rec, &b, &c).await?;
                        return Ok((self.describe(rec).await, false));
                    }
                    Phase::Deleting => {
                        return Err(Error::FailedPrecondition {
                            operation: "create",
                            name: req.name.clone(),
                            reason: "a delete of this bcache device began; finish it with DeleteBcache first".into(),
                        });
                    }
                    Phase::Creating => rec,
                }
            }
            None => self.new_record(&req).await?,
        };

        match self.build(&mut record).await {
            Ok(()) => Ok((self.describe(record).await, true)),
            Err(e) => {
                tracing::warn!(error = %e, "bcache create failed; undoing it");
                if let Err(undo) = self.teardown(&record).await {
                    tracing::error!(error = %undo, "undoing the failed bcache create did not finish; DeleteBcache retries it");
                }
                Err(e)
            }
        }
    }

    /// The record of a new device, checked against the volumes and written.
    async fn new_record(&self, req: &BcacheRequest) -> Result<Record> {
        let bcache = self.bcache();
        for (field, volume) in [
            ("backing_volume", &req.backing_volume),
            ("cache_volume", &req.cache_volume),
        ] {
            if let Some(user) = bcache.user_of(volume) {
                return Err(Error::FailedPrecondition {
                    operation: "create",
                    name: req.name.clone(),
                    reason: format!("{field} {volume:?} is part of bcache device {user:?}"),
                });
            }
            let existing = self.find(volume).await?;
            match (&req.create, existing) {
                (Some(_), Some(v)) => {
                    return Err(Error::BcacheConflict {
                        name: req.name.clone(),
                        reason: format!(
                            "{field} {volume:?} already exists (in group {:?}); name an existing volume without backing_device_group to use it",
                            v.group
                        ),
                    });
                }
                (None, None) => {
                    return Err(Error::VolumeNotFound {
                        name: volume.clone(),
                    });
                }
                (None, Some(v)) => {
                    device_of(&v, field)?;
                }
                (Some(_), None) => {}
            }
        }
        if let Some(o) = &req.create {
            for (field, group) in [
                ("backing_device_group", &o.backing_group),
                ("cache_device_group", &o.cache_group),
            ] {
                let slot = self.slot(group).await.map_err(|_| {
                    Error::invalid(
                        field,
                        format!("device group {group:?} is not configured on this node"),
                    )
                })?;
                let policy = slot.backend.config().policy;
                if policy == Policy::Host {
                    return Err(Error::Unsupported {
                        group: group.clone(),
                        policy: policy.as_str(),
                        operation: "bcache volumes (no block device)",
                    });
                }
            }
        }
        let record = Record {
            name: req.name.clone(),
            backing_volume: req.backing_volume.clone(),
            cache_volume: req.cache_volume.clone(),
            cache_mode: req.cache_mode,
            cset_uuid: tools::new_uuid()?,
            backing_uuid: None,
            owned: req.create.clone(),
            phase: Phase::Creating,
        };
        self.bcache().put(&record).await?;
        Ok(record)
    }

    /// Makes the volumes (if the device owns them), formats what holds no
    /// superblock of ours, assembles, and marks the record ready.
    async fn build(&self, record: &mut Record) -> Result<()> {
        let (backing, cache) = match &record.owned {
            Some(o) => {
                let (b, _) = self
                    .ensure_volume(CreateRequest {
                        name: record.backing_volume.clone(),
                        group: o.backing_group.clone(),
                        size_bytes: o.size_bytes,
                        exclusive: false,
                    })
                    .await?;
                let (c, _) = self
                    .ensure_volume(CreateRequest {
                        name: record.cache_volume.clone(),
                        group: o.cache_group.clone(),
                        size_bytes: cache_size(o.size_bytes, o.cache_ratio_percent),
                        exclusive: false,
                    })
                    .await?;
                (b, c)
            }
            None => self.volumes_of(record).await?,
        };
        let b_dev = device_of(&backing, "backing_volume")?.to_path_buf();
        let c_dev = device_of(&cache, "cache_volume")?.to_path_buf();
        let b_sb = self
            .our_superblock(record, "backing_volume", &backing, Role::Backing)
            .await?;
        let c_sb = self
            .our_superblock(record, "cache_volume", &cache, Role::Cache)
            .await?;
        if b_sb.is_none() || c_sb.is_none() {
            for (field, v, dev, missing) in [
                ("backing_volume", &backing, &b_dev, b_sb.is_none()),
                ("cache_volume", &cache, &c_dev, c_sb.is_none()),
            ] {
                if missing {
                    self.check_blank(record, field, v, dev).await?;
                }
            }
            tools::make_bcache(
                &record.cset_uuid,
                b_sb.is_none().then_some(b_dev.as_path()),
                c_sb.is_none()
                    .then_some((c_dev.as_path(), cache.size_bytes)),
                record.cache_mode,
            )
            .await?;
        }
        let b_sb = self
            .our_superblock(record, "backing_volume", &backing, Role::Backing)
            .await?
            .ok_or_else(|| {
                Error::parse(
                    format!("bcache-super-show {}", b_dev.display()),
                    "make-bcache left no superblock",
                )
            })?;
        record.backing_uuid = Some(b_sb.dev_uuid);
        self.bcache().put(record).await?;
        self.assemble(record, &backing, &cache).await?;
        record.phase = Phase::Ready;
        self.bcache().put(record).await?;
        Ok(())
    }

    /// The superblock on `v` if it is ours (our cache set, the right role,
    /// the recorded backing UUID); `None` if it has none. Someone else's
    /// is `FailedPrecondition`: it is never formatted over.
    pub(super) async fn our_superblock(
        &self,
        record: &Record,
        field: &'static str,
        v: &Volume,
        role: Role,
    ) -> Result<Option<tools::Superblock>> {
        let dev = device_of(v, field)?;
        let Some(sb) = tools::super_show(dev).await? else {
            return Ok(None);
        };
        let uuid_ok = role == Role::Cache
            || record
                .backing_uuid
                .as_ref()
                .is_none_or(|u| *u == sb.dev_uuid);
        if sb.cset_uuid == record.cset_uuid && sb.role == role && uuid_ok {
            return Ok(Some(sb));
        }
        Err(Error::FailedPrecondition {
            operation: "create",
            name: record.name.clone(),
            reason: format!(
                "{field} {:?} ({}) holds a bcache {:?} superblock of cache set {} (device {}), not this device's; it is left as it is",
                v.name,
                dev.display(),
                sb.role,
                sb.cset_uuid,
                sb.dev_uuid
            ),
        })
    }

    /// Refuses to format a device that is in use or holds other data.
    async fn check_blank(
        &self,
        record: &Record,
        field: &str,
        v: &Volume,
        dev: &Path,
    ) -> Result<()> {
        let path = dev.to_path_buf();
        let busy = tokio::task::spawn_blocking(move || carina_sys::blockdev::in_use(&path))
            .await
            .map_err(|e| Error::task("checking a device", e))?
            .map_err(|e| Error::io("open", dev, e))?;
        if busy {
            return Err(Error::FailedPrecondition {
                operation: "create",
                name: record.name.clone(),
                reason: format!(
                    "{field} {:?} ({}) is in use (mounted or held open)",
                    v.name,
                    dev.display()
                ),
            });
        }
        let found = carina_sys::format::probe(dev).await.map_err(|e| match e {
            carina_sys::format::FormatError::Command(c) => Error::Command(c),
            other => Error::parse(format!("blkid {}", dev.display()), other),
        })?;
        if let Some(sig) = found {
            return Err(Error::FailedPrecondition {
                operation: "create",
                name: record.name.clone(),
                reason: format!(
                    "{field} {:?} ({}) holds {}; bcache formats blank volumes only",
                    v.name,
                    dev.display(),
                    sig.describe()
                ),
            });
        }
        Ok(())
    }
}
