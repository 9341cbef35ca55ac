//! The file-system side of a HOST group: the ownership markers, the data
//! directories and the free-space arithmetic. Every function blocks; the
//! backend in [`super`] runs them on the blocking pool.
//!
//! Markers are read, written and removed through the marker directory's
//! descriptor ([`carina_sys::fdtree`]), never through a link: a marker is
//! opened `O_NOFOLLOW`, written by [`carina_sys::atomic_file`] to a new
//! temporary file of an unpredictable name (`O_CREAT | O_EXCL |
//! O_NOFOLLOW`) and renamed into place, so a link
//! planted at a marker's or a temporary file's name is neither read nor
//! written through. A new data directory's mode is set on its descriptor.

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use carina_sys::atomic_file;
use carina_sys::fdtree::Dir;
use carina_sys::statvfs;
use serde::{Deserialize, Serialize};

use super::{DATA_DIR_MODE, MARKER_DIR_MODE, OWNER, ROOT_DIR_MODE};
use crate::engine::config::{GroupConfig, Policy};
use crate::engine::error::{Error, Result};
use crate::engine::names;
use crate::engine::quota;
use crate::engine::volume::{GroupCapacity, Volume};

/// The ownership marker of one volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Marker {
    #[serde(rename = "carina.storage.io/owner")]
    pub(super) owner: String,
    pub(super) name: String,
    pub(super) size_bytes: u64,
    /// Seconds since the Unix epoch.
    pub(super) created_unix: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) project_id: Option<u32>,
}

/// The file-system side of the group; every method blocks.
#[derive(Debug)]
pub(super) struct Store {
    pub(super) config: GroupConfig,
    pub(super) root: PathBuf,
    markers: PathBuf,
}

/// The numbers of `statvfs` that capacity needs, in blocks of `frsize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FsStats {
    frsize: u64,
    blocks: u64,
    /// Free blocks, including those only root may use.
    bfree: u64,
    /// Free blocks for everyone.
    bavail: u64,
}

impl FsStats {
    pub(super) fn total_bytes(&self) -> u64 {
        self.blocks.saturating_mul(self.frsize)
    }
}

/// The bytes our volumes hold, by their sizes.
pub(super) fn committed(markers: &[Marker]) -> u64 {
    markers
        .iter()
        .fold(0u64, |sum, m| sum.saturating_add(m.size_bytes))
}

/// Bytes free for new volumes: what the file system has available, but
/// never more than its usable size less what our volumes already hold.
///
/// The usable size leaves out the blocks only root may use (ext4 keeps 5 %
/// by default): they are not in the available count either, so counting
/// them would let the volumes' sizes add up past what can be written.
pub(super) fn free_bytes(stats: &FsStats, committed: u64) -> u64 {
    let available = stats.bavail.saturating_mul(stats.frsize);
    let root_only = stats
        .bfree
        .saturating_sub(stats.bavail)
        .saturating_mul(stats.frsize);
    let usable = stats.total_bytes().saturating_sub(root_only);
    available.min(usable.saturating_sub(committed))
}

impl Store {
    /// The store of a group over `root`, with its markers under
    /// `<root>/.carina`.
    pub(super) fn new(config: GroupConfig, root: PathBuf) -> Store {
        let markers = root.join(super::MARKER_DIR);
        Store {
            config,
            root,
            markers,
        }
    }

    pub(super) fn data_dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn marker_path(&self, name: &str) -> PathBuf {
        self.markers.join(marker_file(name))
    }

    /// The marker directory, opened without following a link there;
    /// `None` if there is none yet.
    fn marker_dir(&self) -> Result<Option<Dir>> {
        match Dir::open(&self.markers) {
            Ok(dir) => Ok(Some(dir)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io("open", &self.markers, e)),
        }
    }

    fn existing_marker_dir(&self) -> Result<Dir> {
        Dir::open(&self.markers).map_err(|e| Error::io("open", &self.markers, e))
    }

    pub(super) fn volume(&self, marker: &Marker) -> Volume {
        Volume {
            name: marker.name.clone(),
            group: self.config.name.clone(),
            policy: Policy::Host,
            size_bytes: marker.size_bytes,
            device_path: None,
            host_path: Some(self.data_dir(&marker.name)),
            major: 0,
            minor: 0,
            exclusive: false,
            disk: None,
        }
    }

    /// Creates the root and the marker directory if missing and drops
    /// temporary markers a crash left behind.
    pub(super) fn ensure_layout(&self) -> Result<()> {
        self.ensure_dirs()?;
        let dir = self.existing_marker_dir()?;
        atomic_file::remove_temps(&dir)
            .map(|_| ())
            .map_err(|e| Error::io("remove temporary markers in", &self.markers, e))
    }

    /// Creates the root (with [`ROOT_DIR_MODE`], as any missing parent) and
    /// the marker directory if missing; a marker path that is not a
    /// directory (a file, a link) is an error.
    fn ensure_dirs(&self) -> Result<()> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(ROOT_DIR_MODE)
            .create(&self.root)
            .map_err(|e| Error::io("create", &self.root, e))?;
        match fs::symlink_metadata(&self.markers) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(Error::io(
                    "use marker directory",
                    &self.markers,
                    io::Error::new(
                        io::ErrorKind::NotADirectory,
                        "exists and is not a directory",
                    ),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::DirBuilder::new()
                    .mode(MARKER_DIR_MODE)
                    .create(&self.markers)
                    .map_err(|e| Error::io("create", &self.markers, e))?;
                sync_dir(&self.root)?;
            }
            Err(e) => return Err(Error::io("inspect", &self.markers, e)),
        }
        Ok(())
    }

    /// Recreates the data directory of every marked volume that lacks one.
    pub(super) fn recreate_missing(&self) -> Result<Vec<Marker>> {
        let mut recreated = Vec::new();
        for marker in self.markers()? {
            let dir = self.data_dir(&marker.name);
            match fs::symlink_metadata(&dir) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => tracing::warn!(
                    path = %dir.display(),
                    "data path of a marked volume is not a directory; left alone"
                ),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    make_data_dir(&dir)?;
                    sync_dir(&self.root)?;
                    recreated.push(marker);
                }
                Err(e) => return Err(Error::io("inspect", &dir, e)),
            }
        }
        Ok(recreated)
    }

    /// Our marker of `name`: `None` if there is none or it is not ours; a
    /// marker that cannot be read or parsed is an error, so nothing
    /// overwrites it.
    pub(super) fn read_marker(&self, name: &str) -> Result<Option<Marker>> {
        let path = self.marker_path(name);
        let Some(dir) = self.marker_dir()? else {
            return Ok(None);
        };
        let mut text = String::new();
        match dir.open_file(OsStr::new(&marker_file(name))) {
            Ok(Some(mut file)) => file
                .read_to_string(&mut text)
                .map_err(|e| Error::io("read", &path, e))?,
            Ok(None) => return Ok(None),
            Err(e) => return Err(Error::io("read", &path, e)),
        };
        let marker: Marker = serde_json::from_str(&text)
            .map_err(|e| Error::parse(format!("marker {}", path.display()), e))?;
        Ok((marker.owner == OWNER && marker.name == name).then_some(marker))
    }

    /// Every marker of ours. Files that are not markers, name another owner
    /// or cannot be parsed are skipped (the last with a warning).
    pub(super) fn markers(&self) -> Result<Vec<Marker>> {
        let Some(dir) = self.marker_dir()? else {
            return Ok(Vec::new());
        };
        let names = dir
            .names()
            .map_err(|e| Error::io("read", &self.markers, e))?;
        let mut out = Vec::new();
        for file_name in names {
            let Some(name) = file_name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            if names::check_volume_name(name).is_err() {
                continue;
            }
            match self.read_marker(name) {
                Ok(Some(marker)) => out.push(marker),
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "skipping unreadable marker"),
            }
        }
        Ok(out)
    }

    /// Writes `marker` atomically ([`carina_sys::atomic_file::write_at`]
    /// through the marker directory's descriptor: a new temporary file of
    /// an unguessable name, flushed, renamed over the marker (a link there
    /// is replaced, not followed), and the directory flushed).
    pub(super) fn write_marker(&self, marker: &Marker) -> Result<()> {
        let dir = self.existing_marker_dir()?;
        let path = self.marker_path(&marker.name);
        let mut text = serde_json::to_vec_pretty(marker)
            .map_err(|e| Error::parse(format!("marker of {}", marker.name), e))?;
        text.push(b'\n');
        atomic_file::write_at(
            &dir,
            OsStr::new(&marker_file(&marker.name)),
            &text,
            MARKER_FILE_MODE,
        )
        .map_err(|e| Error::io("write", &path, e))
    }

    /// Marker first, then the directory; the marker is removed again if the
    /// directory cannot be made. Refuses a name whose data path exists
    /// without our marker, and a size above what is allocatable.
    pub(super) fn create(&self, name: &str, size: u64, with_quota: bool) -> Result<Marker> {
        self.ensure_dirs()?;
        if let Some(existing) = self.read_marker(name)? {
            // The engine answers repeats of the volumes it knows; a marker
            // it cannot know (written by another engine over the same root)
            // is on disk only, so this check is ours, and it keeps us from
            // writing over another volume's marker.
            if existing.size_bytes == size {
                return Ok(existing);
            }
            return Err(Error::AlreadyExists {
                name: name.to_string(),
                group: self.config.name.clone(),
                existing_bytes: existing.size_bytes,
                requested_bytes: size,
            });
        }
        let dir = self.data_dir(name);
        match fs::symlink_metadata(&dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Ok(_) => {
                return Err(Error::FailedPrecondition {
                    operation: "create",
                    name: name.to_string(),
                    reason: format!(
                        "{} exists and was not created by carina; it is left alone",
                        dir.display()
                    ),
                });
            }
            Err(e) => return Err(Error::io("inspect", &dir, e)),
        }
        let markers = self.markers()?;
        let allocatable = self.allocatable(&markers)?;
        if size > allocatable {
            return Err(Error::ResourceExhausted {
                group: self.config.name.clone(),
                requested_bytes: size,
                allocatable_bytes: allocatable,
            });
        }
        let project_id = with_quota.then(|| {
            quota::free_project_id(name, |id| markers.iter().any(|m| m.project_id == Some(id)))
        });
        let marker = Marker {
            owner: OWNER.to_string(),
            name: name.to_string(),
            size_bytes: size,
            created_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            project_id,
        };
        self.write_marker(&marker)?;
        // The marker is written, the data directory not made.
        carina_sys::crashpoint::reach("host.create.marked", name);
        if let Err(e) = make_data_dir(&dir).and_then(|()| sync_dir(&self.root)) {
            if let Err(undo) = self.remove_marker(name) {
                tracing::error!(carina.volume.name = %name, error = %undo, "rollback of the marker failed");
            }
            return Err(e);
        }
        Ok(marker)
    }

    /// Our marker of `name` if the growth to `size` (larger than its size:
    /// the engine answers no-ops and refuses shrinks) fits what is
    /// allocatable.
    pub(super) fn check_growth(&self, name: &str, size: u64) -> Result<Marker> {
        let current = self
            .read_marker(name)?
            .ok_or_else(|| Error::VolumeNotFound {
                name: name.to_string(),
            })?;
        debug_assert!(
            size > current.size_bytes,
            "the engine answers no-ops and shrinks"
        );
        let growth = size.saturating_sub(current.size_bytes);
        let allocatable = self.allocatable(&self.markers()?)?;
        if growth > allocatable {
            return Err(Error::ResourceExhausted {
                group: self.config.name.clone(),
                requested_bytes: growth,
                allocatable_bytes: allocatable,
            });
        }
        Ok(current)
    }

    fn allocatable(&self, markers: &[Marker]) -> Result<u64> {
        let free = free_bytes(&self.fs_stats()?, committed(markers));
        Ok(GroupCapacity::allocatable(free, self.config.reserve_bytes))
    }

    pub(super) fn fs_stats(&self) -> Result<FsStats> {
        let st = statvfs::statvfs(&self.root).map_err(|e| Error::io("statvfs", &self.root, e))?;
        Ok(FsStats {
            frsize: st.f_frsize,
            blocks: st.f_blocks,
            bfree: st.f_bfree,
            bavail: st.f_bavail,
        })
    }

    /// Removes the data directory and then the marker (rollback of a create
    /// whose quota could not be set).
    pub(super) fn remove(&self, name: &str) -> Result<()> {
        self.remove_data(name)?;
        self.remove_marker(name)
    }

    /// Removes `<root>/<name>` without following symbolic links: a link in
    /// its place is removed itself, links inside are not followed, and a
    /// directory on another file system (something mounted there) is
    /// refused rather than emptied.
    pub(super) fn remove_data(&self, name: &str) -> Result<()> {
        let dir = self.data_dir(name);
        let meta = match fs::symlink_metadata(&dir) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io("inspect", &dir, e)),
        };
        if meta.is_dir() {
            let root_dev = fs::metadata(&self.root)
                .map_err(|e| Error::io("inspect", &self.root, e))?
                .dev();
            if meta.dev() != root_dev {
                return Err(Error::FailedPrecondition {
                    operation: "delete",
                    name: name.to_string(),
                    reason: format!("{} is a mount point; unmount it first", dir.display()),
                });
            }
            fs::remove_dir_all(&dir).map_err(|e| Error::io("remove", &dir, e))?;
        } else {
            fs::remove_file(&dir).map_err(|e| Error::io("remove", &dir, e))?;
        }
        sync_dir(&self.root)
    }

    pub(super) fn remove_marker(&self, name: &str) -> Result<()> {
        let path = self.marker_path(name);
        let Some(dir) = self.marker_dir()? else {
            return Ok(());
        };
        match dir.remove_file(OsStr::new(&marker_file(name))) {
            Ok(true) => dir.sync().map_err(|e| Error::io("flush", &self.markers, e)),
            Ok(false) => Ok(()),
            Err(e) => Err(Error::io("remove", &path, e)),
        }
    }
}

/// Mode of a marker file: only the daemon reads it.
const MARKER_FILE_MODE: u32 = 0o600;

fn marker_file(name: &str) -> String {
    format!("{name}.json")
}

/// Makes the data directory `dir` and gives it [`DATA_DIR_MODE`] through
/// its descriptor (the umask narrowed the mode given to `mkdir`); a link
/// put in its place in between is not followed.
fn make_data_dir(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .mode(DATA_DIR_MODE)
        .create(dir)
        .map_err(|e| Error::io("create", dir, e))?;
    Dir::open(dir)
        .and_then(|d| d.set_mode(DATA_DIR_MODE))
        .map_err(|e| Error::io("set the mode of", dir, e))
}

/// Flushes a directory so a rename or a new entry in it survives a crash.
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("flush", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::host::OWNER_KEY;

    #[test]
    fn free_space_arithmetic() {
        let stats = FsStats {
            frsize: 4096,
            blocks: 1000,
            bfree: 900,
            bavail: 850,
        };
        assert_eq!(stats.total_bytes(), 4_096_000);
        // usable = (1000 - 50) blocks; nothing committed: available wins.
        assert_eq!(free_bytes(&stats, 0), 850 * 4096);
        // Empty volumes of 900 blocks leave 50 of the usable 950.
        assert_eq!(free_bytes(&stats, 900 * 4096), 50 * 4096);
        // Over-committed: zero, not an underflow.
        assert_eq!(free_bytes(&stats, u64::MAX), 0);
        let odd = FsStats {
            frsize: u64::MAX,
            blocks: u64::MAX,
            bfree: 1,
            bavail: 2,
        };
        assert_eq!(free_bytes(&odd, 0), u64::MAX, "saturates");
        assert_eq!(GroupCapacity::allocatable(10, 20), 0);
    }

    #[test]
    fn marker_format() {
        let marker = Marker {
            owner: OWNER.into(),
            name: "pvc-1".into(),
            size_bytes: 8192,
            created_unix: 1_700_000_000,
            project_id: Some(7),
        };
        let json: serde_json::Value = serde_json::to_value(&marker).expect("serializable");
        assert_eq!(json[OWNER_KEY], "carina");
        assert_eq!(json["name"], "pvc-1");
        assert_eq!(json["sizeBytes"], 8192);
        assert_eq!(json["createdUnix"], 1_700_000_000u64);
        assert_eq!(json["projectId"], 7);
        let without = Marker {
            project_id: None,
            ..marker
        };
        let json = serde_json::to_value(&without).expect("serializable");
        assert!(json.get("projectId").is_none(), "{json}");
    }
}
