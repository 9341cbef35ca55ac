//! Adopting a directory another program made under the group's root: the
//! directory and its files stay as they are; our marker is written last
//! (one atomic write, so the volume is either untouched or ours), with the
//! size recorded for it, which capacity then counts like any volume's.

use std::fs;
use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use super::store::{Marker, Store};
use super::{ALLOCATION_UNIT, HostGroup, OWNER};
use crate::engine::error::{Error, Result};
use crate::engine::names;
use crate::engine::quota;
use crate::engine::volume::{AdoptRequest, Volume};

impl Store {
    /// Our marker of `name`, written now for its existing data directory
    /// unless there is one already. The size is `size` rounded up to the
    /// allocation unit; it is not checked against free space, since the
    /// data already takes its room.
    fn adopt(&self, name: &str, size: u64, with_quota: bool) -> Result<Marker> {
        if let Some(existing) = self.read_marker(name)? {
            return Ok(existing);
        }
        let dir = self.data_dir(name);
        match fs::symlink_metadata(&dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(Error::FailedPrecondition {
                    operation: "adopt",
                    name: name.to_string(),
                    reason: format!("{} is not a directory", dir.display()),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::VolumeNotFound {
                    name: name.to_string(),
                });
            }
            Err(e) => return Err(Error::io("inspect", &dir, e)),
        }
        let size_bytes = names::round_up(size, ALLOCATION_UNIT)
            .ok_or_else(|| Error::invalid("size_bytes", format!("{size} cannot be rounded")))?;
        self.ensure_layout()?;
        let project_id = if with_quota {
            let markers = self.markers()?;
            Some(quota::free_project_id(name, |id| {
                markers.iter().any(|m| m.project_id == Some(id))
            }))
        } else {
            None
        };
        let marker = Marker {
            owner: OWNER.to_string(),
            name: name.to_string(),
            size_bytes,
            created_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            project_id,
        };
        self.write_marker(&marker)?;
        Ok(marker)
    }
}

impl HostGroup {
    /// Marks the directory `req.name` as ours (and puts it in a quota
    /// project where the root has quotas), or returns it when it is ours.
    #[tracing::instrument(skip_all, fields(carina.volume.name = %req.name))]
    pub(super) async fn adopt_dir(&self, req: &AdoptRequest) -> Result<Volume> {
        if req.size_bytes == 0 {
            return Err(Error::invalid(
                "size_bytes",
                "a HOST volume's size must be given: it is what capacity counts",
            ));
        }
        let enforcement = self.enforcement().await?;
        let with_quota = enforcement.is_some();
        let (name, size) = (req.name.clone(), req.size_bytes);
        let marker = self
            .blocking(move |s| s.adopt(&name, size, with_quota))
            .await?;
        if let (Some(e), Some(id)) = (&enforcement, marker.project_id) {
            // Repeated on a retry: setting a project and its limit again
            // is harmless.
            e.assign(&self.store.data_dir(&marker.name), id, marker.size_bytes)
                .await?;
        }
        Ok(self.store.volume(&marker))
    }
}
