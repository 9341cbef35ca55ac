//! Copies of volumes on one node: a clone or a snapshot is a volume of
//! the same kind (block or directory), at least as large, filled with
//! another's content.
//!
//! [`Engine::copy_volume`] holds both volumes' operation locks for the
//! whole copy (so neither is resized or deleted under it), writes the
//! target's [`record::CopyRecord`] as incomplete, freezes the source's
//! filesystem when it is mounted read-write, copies (block by block, or
//! file by file for HOST), thaws, and marks the record complete. A copy
//! that fails, is cancelled or runs past the freeze timeout leaves the
//! target marked incomplete: its content is not usable, and a repeated
//! copy starts over. A complete record makes a repeat a no-op, and a
//! snapshot's record keeps it read-only.
//!
//! A block copy carries its source's filesystem UUID, and XFS does not
//! mount a second filesystem with a UUID already mounted. So once the
//! blocks are copied and synced the record says so (`blocks_copied`),
//! and the target's ext2/3/4 or xfs filesystem gets a new random UUID
//! ([`carina_sys::fsid::renew_uuid`]) before the record is complete; a
//! target holding anything else is left as it is. A node stopped between
//! the two (crash point `copy.blocks_copied`) finishes on the repeated
//! copy: the copied blocks are kept (a snapshot keeps its point in time)
//! and only the UUID is changed.

pub mod block;
pub mod freeze;
pub mod record;
pub mod tree;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use carina_sys::command::CommandError;
use carina_sys::fsid::{self, FsIdError, Renewal};
use carina_sys::mount::MountError;
use tokio::sync::watch;
use tracing::instrument;

use self::block::CopyError;
use self::freeze::Freeze;
use self::record::CopyRecord;
use super::error::{Error, Result};
use super::volume::Volume;
use super::{Engine, Policy, names};

/// How long a source's filesystem may stay frozen for one copy, unless
/// the node is told otherwise.
pub const DEFAULT_FREEZE_TIMEOUT: Duration = Duration::from_secs(300);

/// A flag that stops a copy between two chunks.
#[derive(Debug, Default, Clone)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    pub fn set(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Sets the stop when dropped: a copy whose caller went away (its future
/// dropped) does not go on in the blocking pool.
struct StopOnDrop(Stop);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.set();
    }
}

/// Where a copy is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    pub copied_bytes: u64,
    pub total_bytes: u64,
    /// The source's filesystem is frozen.
    pub frozen: bool,
}

/// What to copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyRequest {
    pub source: String,
    pub target: String,
    /// Make the target a read-only snapshot of the source.
    pub snapshot: bool,
}

/// A finished copy.
#[derive(Debug, Clone)]
pub struct Copied {
    /// The target volume.
    pub volume: Volume,
    pub record: CopyRecord,
    /// False when the target already held this copy (nothing was copied).
    pub copied: bool,
}

/// What the copy reads and writes.
enum Plan {
    Block {
        source: PathBuf,
        target: PathBuf,
        len: u64,
        freeze_at: Option<PathBuf>,
    },
    Tree {
        source: PathBuf,
        target: PathBuf,
    },
}

fn nanos_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos().min(i64::MAX as u128) as i64)
        .unwrap_or(0)
}

/// The error of a copy that did not complete; `stopped` is why it was
/// stopped, if it was.
fn copy_failed(e: CopyError, what: &str, stopped: Error) -> Error {
    match e {
        CopyError::Io {
            action,
            path,
            source,
        } => Error::io(action, path, source),
        CopyError::Stopped => stopped.with_what(what),
    }
}

impl Error {
    fn with_what(self, what: &str) -> Error {
        match self {
            Error::Cancelled { .. } => Error::Cancelled {
                what: what.to_string(),
            },
            Error::TimedOut { waited, .. } => Error::TimedOut {
                what: what.to_string(),
                waited,
            },
            other => other,
        }
    }
}

impl Engine {
    /// The copy record of volume `name`, if it was filled by a copy (an
    /// unreadable record shows none: see [`record`]).
    pub fn copy_record(&self, name: &str) -> Option<CopyRecord> {
        self.inner.copies.origin(name)
    }

    /// Whether `name` is a snapshot (read-only).
    pub(super) fn is_snapshot(&self, name: &str) -> Result<bool> {
        Ok(self
            .inner
            .copies
            .get(name)?
            .is_some_and(|r| r.snapshot && r.complete))
    }

    /// Thaws what a copy of an earlier run of the node left frozen.
    pub(super) fn thaw_leftover_freezes(&self) {
        for (volume, record) in self.inner.copies.all() {
            if let (false, Some(mount_point)) = (record.complete, &record.frozen_at) {
                tracing::warn!(
                    carina.volume.name = %volume,
                    mount_point = %mount_point.display(),
                    "a copy was interrupted while its source was frozen; thawing it"
                );
                freeze::thaw(mount_point);
            }
        }
    }

    /// Fills `req.target` with a copy of `req.source`, publishing progress
    /// on `progress`; `stop` cancels it. See the module header.
    #[instrument(
        skip(self, progress, stop),
        err(level = "info"),
        fields(carina.copy.source = %req.source, carina.volume.name = %req.target, carina.copy.snapshot = req.snapshot)
    )]
    pub async fn copy_volume(
        &self,
        req: CopyRequest,
        progress: Arc<watch::Sender<Progress>>,
        stop: Stop,
    ) -> Result<Copied> {
        names::check_volume_name_field("source", &req.source)?;
        names::check_volume_name_field("target", &req.target)?;
        if req.source == req.target {
            return Err(Error::invalid("target", "must differ from source"));
        }
        let _target_lock = self.inner.locks.try_lock(&req.target)?;
        let _source_lock = self.inner.locks.try_lock(&req.source)?;
        let source = self.existing(&req.source).await?;
        let target = self.existing(&req.target).await?;
        let copies = &self.inner.copies;
        if let Some(done) = copies.get(&req.target)?.filter(|r| r.complete) {
            if done.source == req.source && done.snapshot == req.snapshot {
                return Ok(Copied {
                    volume: target,
                    record: done,
                    copied: false,
                });
            }
            let kind = if done.snapshot {
                "a snapshot"
            } else {
                "a copy"
            };
            return Err(Error::CopyConflict {
                target: req.target.clone(),
                holds: format!("{kind} of {:?}", done.source),
            });
        }
        let earlier = copies.get(&req.target)?;
        if copies.get(&req.source)?.is_some_and(|r| !r.complete) {
            return Err(precondition(
                &req.source,
                "it is an incomplete copy itself (the copy that was filling it did not finish)",
            ));
        }
        if let Some(device) = self.inner.bcache.user_of(&req.target) {
            return Err(precondition(
                &req.target,
                format!("the target is part of bcache device {device:?}"),
            ));
        }
        if target.size_bytes < source.size_bytes {
            return Err(precondition(
                &req.target,
                format!(
                    "the target has {} bytes, less than the source's {}",
                    target.size_bytes, source.size_bytes
                ),
            ));
        }
        let plan = self.plan(&source, &target).await?;
        let what = format!("the copy of {:?} into {:?}", req.source, req.target);
        let renew_at = match &plan {
            Plan::Block { target, .. } => Some(target.clone()),
            Plan::Tree { .. } => None,
        };
        let mut record = match earlier.filter(|r| {
            r.blocks_copied
                && r.source == req.source
                && r.snapshot == req.snapshot
                && r.source_size_bytes == source.size_bytes
                && renew_at.is_some()
        }) {
            Some(copied) => {
                tracing::info!(
                    "the blocks of an interrupted copy are all on the target; finishing it"
                );
                progress.send_replace(Progress {
                    copied_bytes: source.size_bytes,
                    total_bytes: source.size_bytes,
                    frozen: false,
                });
                copied
            }
            None => {
                let mut record = CopyRecord {
                    source: req.source.clone(),
                    snapshot: req.snapshot,
                    blocks_copied: false,
                    complete: false,
                    completed_unix_nanos: 0,
                    source_size_bytes: source.size_bytes,
                    frozen_at: match &plan {
                        Plan::Block { freeze_at, .. } => freeze_at.clone(),
                        Plan::Tree { .. } => None,
                    },
                };
                copies.put(&req.target, &record)?;
                if let Err(e) = self.run_copy(plan, progress, stop, &what).await {
                    // Thawed by now: a later start must not thaw a freeze
                    // someone else set there since.
                    if record.frozen_at.take().is_some()
                        && let Err(put) = copies.put(&req.target, &record)
                    {
                        tracing::warn!(error = %put, "could not record that the source was thawed");
                    }
                    return Err(e);
                }
                record
            }
        };
        if let Some(device) = renew_at {
            if !record.blocks_copied {
                record.blocks_copied = true;
                record.frozen_at = None;
                copies.put(&req.target, &record)?;
            }
            carina_sys::crashpoint::reach("copy.blocks_copied", &req.target);
            renew_identity(&device).await?;
        }
        record.complete = true;
        record.completed_unix_nanos = nanos_now();
        record.frozen_at = None;
        copies.put(&req.target, &record)?;
        tracing::info!(
            bytes = source.size_bytes,
            "copy complete{}",
            if req.snapshot { " (snapshot)" } else { "" }
        );
        Ok(Copied {
            volume: self.existing(&req.target).await?,
            record,
            copied: true,
        })
    }

    /// What to copy from `source` into `target`, checked.
    async fn plan(&self, source: &Volume, target: &Volume) -> Result<Plan> {
        let host = |v: &Volume| v.policy == Policy::Host;
        match (host(source), host(target)) {
            (true, true) => {
                let dir = |v: &Volume| {
                    v.host_path
                        .clone()
                        .ok_or_else(|| precondition(&v.name, "the HOST volume has no directory"))
                };
                Ok(Plan::Tree {
                    source: dir(source)?,
                    target: dir(target)?,
                })
            }
            (false, false) => {
                let dev = |v: &Volume| {
                    v.device_path
                        .clone()
                        .ok_or_else(|| precondition(&v.name, "the volume has no block device"))
                };
                let mountinfo = tokio::fs::read_to_string(super::quota::MOUNTINFO)
                    .await
                    .map_err(|e| Error::io("read", super::quota::MOUNTINFO, e))?;
                if freeze::is_mounted(&mountinfo, target.major, target.minor) {
                    return Err(precondition(
                        &target.name,
                        "the target is mounted; its content would be replaced under its users",
                    ));
                }
                Ok(Plan::Block {
                    source: dev(source)?,
                    target: dev(target)?,
                    len: source.size_bytes,
                    freeze_at: freeze::writable_mount(&mountinfo, source.major, source.minor),
                })
            }
            _ => Err(precondition(
                &target.name,
                format!(
                    "a {} volume cannot be copied into a {} volume (a directory and a block device)",
                    source.policy, target.policy
                ),
            )),
        }
    }

    /// Runs `plan` in the blocking pool, frozen where it says, stopped by
    /// `stop` or by the freeze timeout.
    async fn run_copy(
        &self,
        plan: Plan,
        progress: Arc<watch::Sender<Progress>>,
        stop: Stop,
        what: &str,
    ) -> Result<()> {
        let _stop_on_drop = StopOnDrop(stop.clone());
        match plan {
            Plan::Tree { source, target } => {
                let job_stop = stop.clone();
                let result = tokio::task::spawn_blocking(move || {
                    let total = tree::file_bytes(&source)?;
                    progress.send_replace(Progress {
                        copied_bytes: 0,
                        total_bytes: total,
                        frozen: false,
                    });
                    tree::empty_dir(&target)?;
                    tree::copy_tree(&source, &target, &job_stop, &mut |n| {
                        progress.send_modify(|p| p.copied_bytes = n)
                    })
                })
                .await
                .map_err(|e| Error::task(what, e))?;
                result.map_err(|e| copy_failed(e, what, cancelled()))
            }
            Plan::Block {
                source,
                target,
                len,
                freeze_at,
            } => {
                progress.send_replace(Progress {
                    copied_bytes: 0,
                    total_bytes: len,
                    frozen: freeze_at.is_some(),
                });
                let frozen = match freeze_at {
                    Some(mount_point) => Some(
                        tokio::task::spawn_blocking(move || {
                            Freeze::new(&mount_point)
                                .map_err(|e| Error::io("freeze the filesystem at", mount_point, e))
                        })
                        .await
                        .map_err(|e| Error::task("freezing the source's filesystem", e))??,
                    ),
                    None => None,
                };
                let job_stop = stop.clone();
                let job_progress = progress.clone();
                let mut job = tokio::task::spawn_blocking(move || {
                    block::copy_device(&source, &target, len, &job_stop, |n| {
                        job_progress.send_modify(|p| p.copied_bytes = n)
                    })
                });
                let limit = self.inner.freeze_timeout;
                let (joined, timed_out) = match &frozen {
                    Some(_) => match tokio::time::timeout(limit, &mut job).await {
                        Ok(joined) => (joined, false),
                        Err(_) => {
                            stop.set();
                            (job.await, true)
                        }
                    },
                    None => (job.await, false),
                };
                drop(frozen);
                progress.send_modify(|p| p.frozen = false);
                let result = joined.map_err(|e| Error::task(what, e))?;
                let stopped = if timed_out {
                    Error::TimedOut {
                        what: String::new(),
                        waited: limit,
                    }
                } else {
                    cancelled()
                };
                result.map_err(|e| copy_failed(e, what, stopped))
            }
        }
    }
}

/// Gives the filesystem on the copied `device` a UUID of its own, or
/// leaves what is not an ext2/3/4 or xfs filesystem as it is.
#[instrument(err, fields(device = %device.display()))]
async fn renew_identity(device: &Path) -> Result<()> {
    match fsid::renew_uuid(device, &std::env::temp_dir()).await {
        Ok(Renewal::Renewed { .. }) => Ok(()),
        Ok(Renewal::Left { found }) => {
            tracing::info!(
                fs_type = found.fs_type.as_deref().unwrap_or("-"),
                partition_table = found.pt_type.as_deref().unwrap_or("-"),
                "the copy holds no ext2/3/4 or xfs filesystem; its content is left as it is"
            );
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The failures of renewing a copy's UUID, as the engine reports command
/// and IO failures.
impl From<FsIdError> for Error {
    fn from(e: FsIdError) -> Self {
        match e {
            FsIdError::Command(c) => Error::Command(c),
            FsIdError::Io(e) => Error::Io(e),
            FsIdError::Replay { source, device } => match source {
                MountError::Command(c) => Error::Command(c),
                MountError::Io(e) => Error::Io(e),
                other => Error::parse(
                    format!("the mounts of {} (an xfs log replay)", device.display()),
                    other,
                ),
            },
            FsIdError::Unchanged {
                command,
                device,
                fs,
                uuid,
                output,
            } => Error::Command(CommandError::Failed {
                command,
                status: format!(
                    "exit status 0, but the {fs} UUID of {} is still {uuid}",
                    device.display()
                ),
                code: Some(0),
                stderr: output,
            }),
        }
    }
}

fn cancelled() -> Error {
    Error::Cancelled {
        what: String::new(),
    }
}

fn precondition(name: &str, reason: impl Into<String>) -> Error {
    Error::FailedPrecondition {
        operation: "copy",
        name: name.to_string(),
        reason: reason.into(),
    }
}
