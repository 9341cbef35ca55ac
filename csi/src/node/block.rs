//! Carrying out the steps for block access: staging only makes sure the
//! staging directory exists (no filesystem is mounted), and publishing
//! bind-mounts the device node onto a target file. What to do was decided
//! by [`super::plan`]; a failed step removes the file it created.

use std::path::Path;

use carina_sys::mount::MountTable;

use crate::error::CsiError;
use crate::types::LocalVolume;

use super::observe::canonical_or_self;
use super::plan::{other_publications, single_writer};
use super::target::{TargetKind, bind_onto, create_dir};

/// Creates the staging directory, which stays empty for block access.
pub(super) async fn stage(staging: &Path) -> Result<(), CsiError> {
    create_dir(staging).await.map(|_| ())
}

/// Bind-mounts `device` onto the file `target`; a single writer is refused
/// first if the device node shows elsewhere.
pub(super) async fn publish(
    vol: &LocalVolume,
    device: &Path,
    target: &Path,
    options: &[String],
    create: bool,
    exclusive: bool,
) -> Result<(), CsiError> {
    if exclusive {
        let table = MountTable::read().await?;
        let device = canonical_or_self(device).await?;
        if let Some((major, minor, root)) = table.locate(&device) {
            let others = other_publications(&table, (major, minor, &root), &[target]);
            single_writer(vol, &others)?;
        }
    }
    bind_onto(device, target, TargetKind::File, options, create).await
}
