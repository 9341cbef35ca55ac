//! What the kernel knows about a disk's partitions: sysfs lookups (never
//! guessed from naming conventions), `partx` to tell it about table
//! changes (there is no udev), and bounded waits for device nodes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use carina_sys::blockdev;

use crate::engine::disks::Disk;
use crate::engine::error::{Error, Result};
use crate::engine::gpt;

/// How long to wait for a partition's device node after `partx`.
pub(super) const NODE_WAIT: Duration = Duration::from_secs(5);

/// How long a partition nothing holds for good may stay open before the
/// kernel is asked to forget it for the last time: scanners (blkid,
/// udev's probes, monitoring agents) open every partition for a moment,
/// and the kernel refuses to forget one that is open.
pub(super) const FORGET_WAIT: Duration = Duration::from_secs(2);

pub(super) fn sysfs_u64(disk: &str, file: &str) -> Option<u64> {
    let path = Path::new("/sys/block").join(disk).join(file);
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The kernel name of partition `number` of `disk`, from sysfs (never
/// guessed from naming conventions).
pub(super) fn kernel_partition(disk: &str, number: u32) -> Option<String> {
    let dir = std::fs::read_dir(Path::new("/sys/block").join(disk)).ok()?;
    for entry in dir.flatten() {
        if let Ok(text) = std::fs::read_to_string(entry.path().join("partition"))
            && text.trim().parse::<u32>() == Ok(number)
        {
            return Some(entry.file_name().to_string_lossy().into_owned());
        }
    }
    None
}

/// The device node of partition `number`, if the kernel has it and the
/// node exists.
pub(super) fn present_node(disk: &str, number: u32) -> Option<PathBuf> {
    let node = Path::new("/dev").join(kernel_partition(disk, number)?);
    node.exists().then_some(node)
}

/// Waits (bounded by [`NODE_WAIT`]) for the node of partition `number`.
pub(super) async fn wait_node(disk: &str, number: u32) -> Option<PathBuf> {
    let deadline = Instant::now() + NODE_WAIT;
    loop {
        if let Some(node) = present_node(disk, number) {
            return Some(node);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Makes the kernel forget partition `number` of `disk` (device `node`):
/// `None` once it has, or why it keeps it: mounted or held open for good
/// (at once), or open each time it was asked within [`FORGET_WAIT`].
pub(super) async fn forget(disk: &Path, node: &Path, number: u32) -> Result<Option<String>> {
    let deadline = Instant::now() + FORGET_WAIT;
    loop {
        if blockdev::in_use(node).map_err(|e| Error::io("open", node, e))? {
            return Ok(Some("mounted or held open".into()));
        }
        match gpt::partx_delete(disk, number).run().await {
            Ok(_) => return Ok(None),
            Err(e) if Instant::now() >= deadline => {
                return Ok(Some(format!("the kernel keeps it: {e}")));
            }
            Err(e) => tracing::debug!(
                partition = %node.display(),
                error = %e,
                "the kernel keeps a partition that is open for a moment; asking again"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Size in bytes the kernel gives partition `number`.
pub(super) fn kernel_size(disk: &str, number: u32) -> Option<u64> {
    let part = kernel_partition(disk, number)?;
    sysfs_u64(disk, &format!("{part}/size")).map(|s| s * 512)
}

/// Tells the kernel about the table. Entry `number` (just written) must
/// reach it; the other entries in `expected` are re-added only when the
/// kernel lacks them (after a restart, or a re-read by another tool: on
/// kernels without a GPT parser a re-read drops every partition not in
/// use); re-adding a partition that is present would only give it a new
/// device number.
pub(super) async fn sync_kernel(disk: &Disk, number: Option<u32>, expected: &[u32]) -> Result<()> {
    if let Some(n) = number {
        gpt::partx_update(&disk.path, Some(n)).run().await?;
    }
    for &n in expected {
        if Some(n) != number
            && present_node(&disk.name, n).is_none()
            && let Err(e) = gpt::partx_update(&disk.path, Some(n)).run().await
        {
            tracing::warn!(disk = %disk.path.display(), partition = n, error = %e, "partx update failed");
        }
    }
    Ok(())
}
