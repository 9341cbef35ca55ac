//! What a bcache device is: its record joined with what the kernel shows
//! of it (get, list, and the cheap question whether one is recorded).

use tracing::instrument;

use super::record::Record;
use super::{BcacheDevice, check_field, devnum};
use crate::engine::Engine;
use crate::engine::error::{Error, Result};

impl Engine {
    /// The device as the record and the kernel show it now.
    pub(super) async fn describe(&self, record: Record) -> BcacheDevice {
        let mut problem = None;
        let mut kernel = None;
        if !self.bcache().kernel.loaded().await {
            problem = Some(format!(
                "the kernel has no bcache driver ({} is missing)",
                self.bcache().kernel.fs_dir().display()
            ));
        } else {
            match self.find(&record.backing_volume).await {
                Ok(Some(b)) => match self.bcache().kernel.backing(devnum(&b)).await {
                    Ok(k) => kernel = k,
                    Err(e) => problem = Some(e.to_string()),
                },
                Ok(None) => {
                    problem = Some(format!(
                        "backing volume {:?} not found",
                        record.backing_volume
                    ))
                }
                Err(e) => problem = Some(e.to_string()),
            }
            if problem.is_none() && !matches!(self.find(&record.cache_volume).await, Ok(Some(_))) {
                problem = Some(format!("cache volume {:?} not found", record.cache_volume));
            }
        }
        let device_path = kernel
            .as_ref()
            .and_then(|k| k.device.as_ref())
            .map(|d| self.bcache().options.dev_root.join(&d.name));
        BcacheDevice {
            name: record.name,
            backing_volume: record.backing_volume,
            cache_volume: record.cache_volume,
            cache_mode: record.cache_mode,
            cset_uuid: record.cset_uuid,
            backing_uuid: record.backing_uuid,
            owned: record.owned,
            phase: record.phase,
            kernel,
            device_path,
            problem,
        }
    }

    /// Whether a bcache device of that name is recorded: the cheap,
    /// quiet question the CSI node asks of every volume it is given.
    pub fn has_bcache(&self, name: &str) -> bool {
        self.bcache().get(name).is_some()
    }

    /// One bcache device; `BcacheNotFound` if there is none.
    #[instrument(skip(self), err(level = "info"), fields(carina.bcache.name = %name))]
    pub async fn get_bcache(&self, name: &str) -> Result<BcacheDevice> {
        check_field("name", name)?;
        let record = self
            .bcache()
            .get(name)
            .ok_or_else(|| Error::BcacheNotFound {
                name: name.to_string(),
            })?;
        Ok(self.describe(record).await)
    }

    /// Every bcache device, sorted by name.
    pub async fn list_bcache(&self) -> Vec<BcacheDevice> {
        let records: Vec<Record> = self.bcache().table().values().cloned().collect();
        let mut out = Vec::with_capacity(records.len());
        for r in records {
            out.push(self.describe(r).await);
        }
        out
    }
}
