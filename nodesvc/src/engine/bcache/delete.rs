//! Deleting a bcache device, or undoing a failed create: flush and
//! detach, stop, unregister, wipe our superblocks and delete the volumes
//! the device made; each step looks first, so a retry finishes it.

use std::path::Path;

use tracing::instrument;

use super::record::{Phase, Record};
use super::sysfs::NO_CACHE;
use super::tools::{self, Role};
use super::{CacheMode, check_field, devnum, lock_key};
use crate::engine::Engine;
use crate::engine::error::{Error, Result};

/// Where a bcache superblock lives: 4 KiB at byte 4096 of the device.
const SB_OFFSET: u64 = 4096;
const SB_BYTES: usize = 4096;

/// Zeroes the bcache superblock of `dev` (opened exclusively, so a device
/// the kernel still holds is refused with `EBUSY`).
async fn wipe_superblock(dev: &Path) -> Result<()> {
    let path = dev.to_path_buf();
    tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let f = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_EXCL)
            .open(&path)?;
        f.write_all_at(&[0u8; SB_BYTES], SB_OFFSET)?;
        f.sync_all()
    })
    .await
    .map_err(|e| Error::task("wiping a bcache superblock", e))?
    .map_err(|e| Error::io("wipe the bcache superblock of", dev, e))
}

impl Engine {
    /// Detaches (flushing), stops, wipes and deletes; `BcacheNotFound` if
    /// there is no such device.
    #[instrument(skip(self), err(level = "info"), fields(carina.bcache.name = %name))]
    pub async fn delete_bcache(&self, name: &str) -> Result<()> {
        check_field("name", name)?;
        let _guard = self.inner.locks.try_lock(&lock_key(name))?;
        let bcache = self.bcache();
        let mut record = bcache.get(name).ok_or_else(|| Error::BcacheNotFound {
            name: name.to_string(),
        })?;
        if record.phase != Phase::Deleting {
            record.phase = Phase::Deleting;
            bcache.put(&record).await?;
        }
        self.teardown(&record).await
    }

    /// Undoes a device as far as it got; every step looks first.
    pub(super) async fn teardown(&self, record: &Record) -> Result<()> {
        let bcache = self.bcache();
        let k = &bcache.kernel;
        let settle = bcache.options.settle_timeout;
        let backing = self.find(&record.backing_volume).await?;
        let cache = self.find(&record.cache_volume).await?;
        if k.loaded().await {
            if let Some(b) = &backing
                && let Some(status) = k.backing(devnum(b)).await?
            {
                let dev = devnum(b);
                if let Some(d) = &status.device {
                    let node = bcache.options.dev_root.join(&d.name);
                    let n = node.clone();
                    let busy =
                        tokio::task::spawn_blocking(move || carina_sys::blockdev::in_use(&n))
                            .await
                            .map_err(|e| Error::task("checking a device", e))?
                            .map_err(|e| Error::io("open", &node, e))?;
                    if busy {
                        return Err(Error::FailedPrecondition {
                            operation: "delete",
                            name: record.name.clone(),
                            reason: format!("{} is in use (mounted or held open)", node.display()),
                        });
                    }
                }
                if status.cache_set.is_some() {
                    if status.cache_mode == Some(CacheMode::Writeback) {
                        // No new dirty data while the old is flushed.
                        self.apply_mode(dev, CacheMode::Writethrough).await?;
                    }
                    k.detach(dev).await?;
                    k.wait_until(
                        &format!("backing device {dev} to flush and detach"),
                        bcache.options.flush_timeout,
                        || async {
                            Ok(k.backing(dev)
                                .await?
                                .is_none_or(|s| s.cache_set.is_none() && s.state == NO_CACHE))
                        },
                    )
                    .await?;
                }
                k.stop(dev).await?;
                k.wait_until(&format!("backing device {dev} to stop"), settle, || async {
                    Ok(!k.registered(dev).await)
                })
                .await?;
            }
            let cset = record.cset_uuid.as_str();
            if k.cache_set_registered(cset).await {
                k.unregister_cache_set(cset).await?;
                k.wait_until(
                    &format!("cache set {cset} to unregister"),
                    settle,
                    || async { Ok(!k.cache_set_registered(cset).await) },
                )
                .await?;
            }
        }
        for (v, role) in [(&backing, Role::Backing), (&cache, Role::Cache)] {
            let Some(v) = v else { continue };
            let Some(dev) = v.device_path.as_deref() else {
                continue;
            };
            if let Some(sb) = tools::super_show(dev).await?
                && sb.cset_uuid == record.cset_uuid
                && sb.role == role
            {
                wipe_superblock(dev).await?;
            }
        }
        if record.owned.is_some() {
            for v in [&record.backing_volume, &record.cache_volume] {
                match self.delete_volume_unchecked(v).await {
                    Ok(()) | Err(Error::VolumeNotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        bcache.forget(&record.name).await
    }
}
