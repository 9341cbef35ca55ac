//! Adopting a partition another program made on a disk of the group: the
//! partition keeps its entry number, start and end (its data does not
//! move); its name record slot is written, then one table write gives the
//! entry our name, GUID and type, which is what makes it ours. A failure
//! before that write leaves a slot that verifies against nothing; a retry
//! finds the partition by its old name again, or as ours.

use super::kernel::sync_kernel;
use super::record::write_slot;
use super::view::{DiskView, Part, inspect};
use super::{RawGroup, Slot, name_fits, partition_name, volume_guid};
use crate::engine::disks::Disk;
use crate::engine::error::{Error, Result};
use crate::engine::gpt;
use crate::engine::volume::{AdoptRequest, Volume};

fn differs(name: &str, reason: String) -> Error {
    Error::FailedPrecondition {
        operation: "adopt",
        name: name.to_string(),
        reason,
    }
}

impl RawGroup {
    /// Makes the partition named `req.partition_label` on `disk` the
    /// volume `req.name`, or returns it when it is ours already.
    #[tracing::instrument(skip_all, fields(carina.volume.name = %req.name, disk = %disk.path.display()))]
    pub(super) async fn adopt_partition(&self, req: &AdoptRequest, disk: &Disk) -> Result<Volume> {
        let _tables = self.tables.lock().await;
        let view = inspect(disk).await?;
        if let Some((part, owner)) = view.find(&req.name) {
            check_size(req, &view, part)?;
            return self.volume(&view, part, owner).await;
        }
        let label = req.partition_label.as_deref().ok_or_else(|| {
            Error::invalid("partition_label", "a RAW adoption names the partition")
        })?;
        let found: Vec<&Part> = view
            .parts
            .iter()
            .filter(|p| p.owner.is_none() && p.entry.name == label)
            .collect();
        let part = match found.as_slice() {
            [] => {
                return Err(Error::VolumeNotFound {
                    name: req.name.clone(),
                });
            }
            [one] => *one,
            many => {
                return Err(differs(
                    &req.name,
                    format!(
                        "{} partitions of {} are named {label:?}; which one is the volume cannot be told",
                        many.len(),
                        view.path()
                    ),
                ));
            }
        };
        check_size(req, &view, part)?;
        let number = part.entry.number;
        let path = &view.disk.path;
        if view.record_usable() {
            let slot = Slot {
                volume: req.name.clone(),
                exclusive: false,
            };
            write_slot(path, number, Some(&slot)).await?;
        } else if !name_fits(&req.name) {
            return Err(differs(
                &req.name,
                format!(
                    "its name is too long for a GPT partition name and a partition of {} covers the disk's name record",
                    view.path()
                ),
            ));
        }
        let entry = gpt::NewPartition {
            number,
            start: part.entry.start,
            end: part.entry.end(),
            name: partition_name(&req.name),
            guid: volume_guid(&req.name),
            type_guid: gpt::LINUX_DATA_TYPE.to_string(),
        };
        gpt::sfdisk_replace(path, &entry).run().await?;
        sync_kernel(&view.disk, Some(number), &view.numbers()).await?;
        let view = inspect(disk).await?;
        let (part, owner) = view.find(&req.name).ok_or_else(|| {
            Error::parse(
                format!("the table of {}", view.path()),
                format!(
                    "partition {number}, relabelled, does not read as volume {:?}",
                    req.name
                ),
            )
        })?;
        self.volume(&view, part, owner).await
    }
}

fn check_size(req: &AdoptRequest, view: &DiskView, part: &Part) -> Result<()> {
    let size = view.bytes(part.entry.size);
    if size < req.size_bytes {
        return Err(differs(
            &req.name,
            format!(
                "partition {} of {} has {size} bytes, less than the {} recorded",
                part.entry.number,
                view.path(),
                req.size_bytes
            ),
        ));
    }
    Ok(())
}
