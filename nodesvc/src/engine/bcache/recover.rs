//! Re-assembling every ready device when the node starts, from the
//! superblocks it finds checked against the records; formats nothing.

use tracing::Instrument;

use super::record::{Phase, Record};
use super::tools::Role;
use crate::engine::Engine;
use crate::engine::error::{Error, Result};
use crate::engine::volume::Volume;

impl Engine {
    /// Re-assembles every ready device after a start: registers, attaches
    /// and sets the mode from the superblocks and the records; formats
    /// nothing. Failures are logged per device and do not stop the node.
    pub(in crate::engine) async fn recover_bcache(&self) {
        let records: Vec<Record> = self.bcache().table().values().cloned().collect();
        if records.is_empty() {
            return;
        }
        if !self.bcache().kernel.loaded().await {
            tracing::error!(
                devices = records.len(),
                "bcache devices are recorded but the kernel has no bcache driver; they stay down"
            );
            return;
        }
        for record in records {
            if record.phase != Phase::Ready {
                tracing::warn!(carina.bcache.name = %record.name, phase = ?record.phase, "bcache device was left half-way; CreateBcache finishes it, DeleteBcache removes it");
                continue;
            }
            let span = tracing::info_span!("bcache.recover", carina.bcache.name = %record.name);
            if let Err(e) = self.recover_one(&record).instrument(span).await {
                tracing::error!(carina.bcache.name = %record.name, error = %e, "bcache device not re-assembled");
            } else {
                tracing::info!(carina.bcache.name = %record.name, "bcache device re-assembled");
            }
        }
    }

    async fn recover_one(&self, record: &Record) -> Result<()> {
        let backing = self.existing(&record.backing_volume).await?;
        let cache = match self.existing(&record.cache_volume).await {
            Ok(c) => c,
            Err(e) => {
                // Register the backing device alone: the kernel keeps it
                // stopped while its cache is missing (so dirty data is
                // never bypassed) and the record says what is missing.
                self.our_superblock(record, "backing_volume", &backing, Role::Backing)
                    .await?
                    .ok_or_else(|| self.lost_superblock(record, "backing_volume", &backing))?;
                self.register_backing(&backing).await?;
                return Err(e);
            }
        };
        for (field, v, role) in [
            ("backing_volume", &backing, Role::Backing),
            ("cache_volume", &cache, Role::Cache),
        ] {
            self.our_superblock(record, field, v, role)
                .await?
                .ok_or_else(|| self.lost_superblock(record, field, v))?;
        }
        self.assemble(record, &backing, &cache).await
    }

    fn lost_superblock(&self, record: &Record, field: &str, v: &Volume) -> Error {
        Error::FailedPrecondition {
            operation: "re-assemble",
            name: record.name.clone(),
            reason: format!(
                "{field} {:?} holds no bcache superblock any more; it is not formatted again",
                v.name
            ),
        }
    }
}
