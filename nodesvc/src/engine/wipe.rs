//! What every new volume gets before anyone sees it: its first and last
//! [`WIPE_BYTES`] read as zeros, so no filesystem, LVM or RAID signature
//! left by an earlier user of the same blocks shows through (blkid and
//! mkfs probe exactly there).

use std::path::Path;

use carina_sys::blockdev;

use crate::engine::error::{Error, Result};

/// How many bytes at each end of a new volume are made to read as zeros.
pub const WIPE_BYTES: u64 = 512 << 10;

/// Makes the first and last [`WIPE_BYTES`] of the device `dev` (`size`
/// bytes) read as zeros ([`blockdev::zero_ends`]: read first, written only
/// where something is not zero). Returns whether it wrote.
pub async fn zero_ends(dev: &Path, size: u64) -> Result<bool> {
    let path = dev.to_path_buf();
    tokio::task::spawn_blocking(move || blockdev::zero_ends(&path, size, WIPE_BYTES))
        .await
        .map_err(|e| Error::task("zeroing the ends of a device", e))?
        .map_err(|e| Error::io("zero the ends of", dev, e))
}
