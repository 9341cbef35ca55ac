//! Putting a device together in the kernel from what is on disk:
//! registering the cache set and the backing device, attaching, setting
//! the cache mode, and waiting for each to show in sysfs. Formats nothing.

use super::record::Record;
use super::sysfs::{BackingStatus, DevNum};
use super::{CacheMode, device_of, devnum};
use crate::engine::Engine;
use crate::engine::error::{Error, Result};
use crate::engine::volume::Volume;

impl Engine {
    /// Both volumes of a device; a missing one is `VolumeNotFound`.
    pub(super) async fn volumes_of(&self, record: &Record) -> Result<(Volume, Volume)> {
        Ok((
            self.existing(&record.backing_volume).await?,
            self.existing(&record.cache_volume).await?,
        ))
    }

    /// Registers whatever is not registered, attaches, sets the mode and
    /// waits for the bcache device. Formats nothing.
    pub(super) async fn assemble(
        &self,
        record: &Record,
        backing: &Volume,
        cache: &Volume,
    ) -> Result<()> {
        let k = &self.bcache().kernel;
        let settle = self.bcache().options.settle_timeout;
        let cset = record.cset_uuid.as_str();
        if !k.cache_set_registered(cset).await {
            k.register(device_of(cache, "cache_volume")?).await?;
            k.wait_until(&format!("cache set {cset} to register"), settle, || async {
                Ok(k.cache_set_registered(cset).await)
            })
            .await?;
        }
        let dev = devnum(backing);
        self.register_backing(backing).await?;
        let status = self.backing_status(dev).await?;
        match status.cache_set.as_deref() {
            Some(s) if s == cset => {}
            Some(other) => {
                return Err(Error::FailedPrecondition {
                    operation: "assemble",
                    name: record.name.clone(),
                    reason: format!(
                        "its backing device is attached to cache set {other}, not {cset}"
                    ),
                });
            }
            None => {
                k.attach(dev, cset).await?;
                k.wait_until(
                    &format!("backing device {dev} to attach to {cset}"),
                    settle,
                    || async {
                        Ok(self.backing_status(dev).await?.cache_set.as_deref() == Some(cset))
                    },
                )
                .await?;
            }
        }
        self.apply_mode(dev, record.cache_mode).await?;
        k.wait_until(
            &format!("bcache device of {dev} to run"),
            settle,
            || async {
                let s = self.backing_status(dev).await?;
                Ok(s.running && s.device.is_some())
            },
        )
        .await
    }

    /// Registers the backing volume's device unless it is, and waits for it.
    pub(super) async fn register_backing(&self, backing: &Volume) -> Result<()> {
        let k = &self.bcache().kernel;
        let dev = devnum(backing);
        if k.registered(dev).await {
            return Ok(());
        }
        k.register(device_of(backing, "backing_volume")?).await?;
        k.wait_until(
            &format!("backing device {dev} to register"),
            self.bcache().options.settle_timeout,
            || async { Ok(k.registered(dev).await) },
        )
        .await
    }

    async fn backing_status(&self, dev: DevNum) -> Result<BackingStatus> {
        self.bcache()
            .kernel
            .backing(dev)
            .await?
            .ok_or_else(|| Error::FailedPrecondition {
                operation: "bcache",
                name: dev.to_string(),
                reason: "the backing device is not registered with the kernel".into(),
            })
    }

    pub(super) async fn apply_mode(&self, dev: DevNum, mode: CacheMode) -> Result<()> {
        let k = &self.bcache().kernel;
        if self.backing_status(dev).await?.cache_mode == Some(mode) {
            return Ok(());
        }
        k.set_cache_mode(dev, mode).await?;
        k.wait_until(
            &format!("cache mode {mode} on {dev}"),
            self.bcache().options.settle_timeout,
            || async { Ok(self.backing_status(dev).await?.cache_mode == Some(mode)) },
        )
        .await
    }
}
