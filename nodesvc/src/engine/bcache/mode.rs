//! Changing a ready device's cache mode, in the kernel and in its record.

use tracing::instrument;

use super::record::Phase;
use super::{BcacheDevice, CacheMode, check_field, devnum, lock_key};
use crate::engine::Engine;
use crate::engine::error::{Error, Result};

impl Engine {
    /// Changes the cache mode, in the kernel and in the record.
    #[instrument(skip(self), err(level = "info"), fields(carina.bcache.name = %name, carina.bcache.mode = %mode))]
    pub async fn set_cache_mode(&self, name: &str, mode: CacheMode) -> Result<BcacheDevice> {
        check_field("name", name)?;
        let _guard = self.inner.locks.try_lock(&lock_key(name))?;
        let bcache = self.bcache();
        let mut record = bcache.get(name).ok_or_else(|| Error::BcacheNotFound {
            name: name.to_string(),
        })?;
        bcache.require_kernel("set cache mode of", name).await?;
        if record.phase != Phase::Ready {
            return Err(Error::FailedPrecondition {
                operation: "set cache mode of",
                name: name.to_string(),
                reason: format!("the device is {:?}, not ready", record.phase),
            });
        }
        let (b, c) = self.volumes_of(&record).await?;
        self.assemble(&record, &b, &c).await?;
        self.apply_mode(devnum(&b), mode).await?;
        if record.cache_mode != mode {
            record.cache_mode = mode;
            bcache.put(&record).await?;
        }
        Ok(self.describe(record).await)
    }
}
