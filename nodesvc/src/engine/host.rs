//! The HOST policy: one directory per volume under the group's root.
//!
//! Layout under `root`:
//!
//! - `<root>/<volume>/` is the volume's data directory;
//! - `<root>/.carina/<volume>.json` is our ownership marker (owner, name,
//!   size, creation time, project id when a quota is set), written to a
//!   temporary file and renamed into place.
//!
//! A directory without our marker is foreign: it is never listed, resized or
//! deleted. Create writes the marker first and the directory second; delete
//! removes the directory first and the marker last; a failure in between is
//! rolled back, so a volume is never half there.
//!
//! Sizes are enforced by project quota when the root's file system supports
//! it ([`super::quota`]); otherwise they are only accounted, and the
//! capacity report says so.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use carina_sys::statvfs;
use serde::{Deserialize, Serialize};

use super::backend::Backend;
use super::config::{GroupConfig, Policy};
use super::disks::Disk;
use super::error::{Error, Result};
use super::names;
use super::quota::{self, Enforcement};
use super::volume::{CreateRequest, GroupCapacity, Volume};

/// Directory under the root that holds the markers. Volume names cannot
/// start with a dot, so it never collides with a volume.
pub const MARKER_DIR: &str = ".carina";
/// The marker key that says who owns a volume.
pub const OWNER_KEY: &str = "carina.storage.io/owner";
/// Our value of [`OWNER_KEY`].
pub const OWNER: &str = "carina";
/// Sizes are rounded up to a multiple of this.
pub const ALLOCATION_UNIT: u64 = 4096;

/// Mode of a new data directory: workloads run as any user, as with the
/// usual host-path provisioners.
const DATA_DIR_MODE: u32 = 0o777;
/// Mode of the marker directory: only the daemon reads it.
const MARKER_DIR_MODE: u32 = 0o700;

/// The ownership marker of one volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Marker {
    #[serde(rename = "carina.storage.io/owner")]
    owner: String,
    name: String,
    size_bytes: u64,
    /// Seconds since the Unix epoch.
    created_unix: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    project_id: Option<u32>,
}

/// A HOST device group.
#[derive(Debug)]
pub struct HostGroup {
    store: Arc<Store>,
    /// Quota detection result, refreshed on every rescan; `None` until the
    /// first detection.
    quota: Mutex<Option<Option<Enforcement>>>,
}

/// The file-system side of the group; every method blocks.
#[derive(Debug)]
struct Store {
    config: GroupConfig,
    root: PathBuf,
    markers: PathBuf,
}

impl HostGroup {
    /// A group over `config.root`, which is created on the first rescan if
    /// missing. A configuration without a root is `InvalidConfig`.
    pub fn new(config: GroupConfig) -> Result<HostGroup> {
        let root = config.root.clone().ok_or_else(|| {
            Error::config(
                format!("diskSelector[{}].root", config.name),
                "a HOST group needs a root directory",
            )
        })?;
        if !root.is_absolute() {
            return Err(Error::config(
                format!("diskSelector[{}].root", config.name),
                format!("{} is not an absolute path", root.display()),
            ));
        }
        let markers = root.join(MARKER_DIR);
        Ok(HostGroup {
            store: Arc::new(Store {
                config,
                root,
                markers,
            }),
            quota: Mutex::new(None),
        })
    }

    /// Runs `f` on the blocking pool: directory walks and `remove_dir_all`
    /// may take long and must not stall the runtime.
    async fn blocking<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> Result<T> + Send + 'static,
    {
        let store = Arc::clone(&self.store);
        match tokio::task::spawn_blocking(move || f(&store)).await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(Error::task(
                format!("work on {}", self.store.root.display()),
                e,
            )),
        }
    }

    /// Detects quota support again and remembers the answer.
    async fn detect_quota(&self) -> Result<Option<Enforcement>> {
        let found = self.blocking(|s| quota::detect(&s.root)).await?;
        *self.quota.lock().unwrap_or_else(|p| p.into_inner()) = Some(found.clone());
        Ok(found)
    }

    /// The remembered detection, or a fresh one.
    async fn enforcement(&self) -> Result<Option<Enforcement>> {
        let cached = self.quota.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match cached {
            Some(e) => Ok(e),
            None => self.detect_quota().await,
        }
    }
}

#[async_trait]
impl Backend for HostGroup {
    fn config(&self) -> &GroupConfig {
        &self.store.config
    }

    /// Creates the root and the marker directory if missing, removes
    /// leftover temporary markers, recreates the missing data directory of
    /// any marked volume (putting it back into its quota project), and
    /// detects quota support again.
    async fn rescan(&self, _disks: &[Disk]) -> Result<()> {
        self.blocking(|s| s.ensure_layout()).await?;
        let enforcement = self.detect_quota().await?;
        let recreated = self.blocking(|s| s.recreate_missing()).await?;
        for marker in recreated {
            tracing::warn!(
                device.group = %self.store.config.name,
                volume.name = %marker.name,
                "data directory was missing; recreated it empty"
            );
            if let (Some(e), Some(id)) = (&enforcement, marker.project_id) {
                e.assign(&self.store.data_dir(&marker.name), id, marker.size_bytes)
                    .await?;
            }
        }
        Ok(())
    }

    async fn create(&self, req: &CreateRequest) -> Result<Volume> {
        // Already rounded to ALLOCATION_UNIT by the engine.
        let size = req.size_bytes;
        let enforcement = self.enforcement().await?;
        let with_quota = enforcement.is_some();
        let name = req.name.clone();
        let marker = self
            .blocking(move |s| s.create(&name, size, with_quota))
            .await?;
        if let (Some(e), Some(id)) = (&enforcement, marker.project_id) {
            let dir = self.store.data_dir(&marker.name);
            if let Err(err) = e.assign(&dir, id, size).await {
                let name = marker.name.clone();
                if let Err(undo) = self.blocking(move |s| s.remove(&name)).await {
                    tracing::error!(volume.name = %marker.name, error = %undo, "rollback after a failed quota set-up failed");
                }
                return Err(err);
            }
        }
        Ok(self.store.volume(&marker))
    }

    async fn get(&self, name: &str) -> Result<Option<Volume>> {
        let name = name.to_string();
        self.blocking(move |s| Ok(s.read_marker(&name)?.map(|m| s.volume(&m))))
            .await
    }

    async fn list(&self) -> Result<Vec<Volume>> {
        self.blocking(|s| {
            let mut volumes: Vec<Volume> = s.markers()?.iter().map(|m| s.volume(m)).collect();
            volumes.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(volumes)
        })
        .await
    }

    async fn resize(&self, name: &str, size_bytes: u64) -> Result<Volume> {
        // Rounded to ALLOCATION_UNIT and larger than the volume: the
        // engine's checks.
        let size = size_bytes;
        let owned = name.to_string();
        let current = self.blocking(move |s| s.check_growth(&owned, size)).await?;
        let enforcement = self.enforcement().await?;
        let quota = enforcement.as_ref().zip(current.project_id);
        if let Some((e, id)) = quota {
            e.set_limit(id, size).await?;
        }
        let grown = Marker {
            size_bytes: size,
            ..current.clone()
        };
        let to_write = grown.clone();
        if let Err(err) = self.blocking(move |s| s.write_marker(&to_write)).await {
            if let Some((e, id)) = quota
                && let Err(undo) = e.set_limit(id, current.size_bytes).await
            {
                tracing::error!(volume.name = %name, error = %undo, "restoring the quota limit failed");
            }
            return Err(err);
        }
        Ok(self.store.volume(&grown))
    }

    async fn delete(&self, name: &str) -> Result<()> {
        let owned = name.to_string();
        let marker = self
            .blocking(move |s| {
                let marker = s
                    .read_marker(&owned)?
                    .ok_or_else(|| Error::VolumeNotFound {
                        name: owned.clone(),
                    })?;
                s.remove_data(&owned)?;
                Ok(marker)
            })
            .await?;
        if let Some(id) = marker.project_id {
            // A limit left on an unused project harms nothing, so failing
            // to clear it does not keep the volume alive.
            match self.enforcement().await {
                Ok(Some(e)) => {
                    if let Err(err) = e.set_limit(id, 0).await {
                        tracing::warn!(volume.name = %name, error = %err, "clearing the quota limit failed");
                    }
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(volume.name = %name, error = %err, "quota detection failed")
                }
            }
        }
        let owned = name.to_string();
        self.blocking(move |s| s.remove_marker(&owned)).await
    }

    async fn capacity(&self) -> Result<GroupCapacity> {
        let enforcement = self.enforcement().await?;
        let (stats, markers) = self.blocking(|s| Ok((s.fs_stats()?, s.markers()?))).await?;
        let committed = markers
            .iter()
            .fold(0u64, |sum, m| sum.saturating_add(m.size_bytes));
        let free = free_bytes(&stats, committed);
        let reserve = self.store.config.reserve_bytes;
        let allocatable = GroupCapacity::allocatable(free, reserve);
        Ok(GroupCapacity {
            group: self.store.config.name.clone(),
            policy: Policy::Host,
            total_bytes: stats.total_bytes(),
            free_bytes: free,
            reserve_bytes: reserve,
            allocatable_bytes: allocatable,
            largest_allocatable_bytes: allocatable,
            allocation_unit: ALLOCATION_UNIT,
            volume_count: u32::try_from(markers.len()).unwrap_or(u32::MAX),
            quota: quota::mode(enforcement.as_ref()),
            disks: vec![self.store.root.to_string_lossy().into_owned()],
            no_disks: None,
        })
    }

    fn round_size(&self, size_bytes: u64) -> Option<u64> {
        names::round_up(size_bytes, ALLOCATION_UNIT)
    }
}

/// The numbers of `statvfs` that capacity needs, in blocks of `frsize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FsStats {
    frsize: u64,
    blocks: u64,
    /// Free blocks, including those only root may use.
    bfree: u64,
    /// Free blocks for everyone.
    bavail: u64,
}

impl FsStats {
    fn total_bytes(&self) -> u64 {
        self.blocks.saturating_mul(self.frsize)
    }
}

/// Bytes free for new volumes: what the file system has available, but
/// never more than its usable size less what our volumes already hold.
///
/// The usable size leaves out the blocks only root may use (ext4 keeps 5 %
/// by default): they are not in the available count either, so counting
/// them would let the volumes' sizes add up past what can be written.
fn free_bytes(stats: &FsStats, committed: u64) -> u64 {
    let available = stats.bavail.saturating_mul(stats.frsize);
    let root_only = stats
        .bfree
        .saturating_sub(stats.bavail)
        .saturating_mul(stats.frsize);
    let usable = stats.total_bytes().saturating_sub(root_only);
    available.min(usable.saturating_sub(committed))
}

impl Store {
    fn data_dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn marker_path(&self, name: &str) -> PathBuf {
        self.markers.join(format!("{name}.json"))
    }

    /// Temporary files start with a dot, which no marker name does.
    fn temp_marker_path(&self, name: &str) -> PathBuf {
        self.markers.join(format!(".{name}.json.tmp"))
    }

    fn volume(&self, marker: &Marker) -> Volume {
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
    fn ensure_layout(&self) -> Result<()> {
        self.ensure_dirs()?;
        for entry in read_dir(&self.markers)? {
            let file_name = entry.file_name();
            let file_name = file_name.to_string_lossy();
            if file_name.starts_with('.') && file_name.ends_with(".json.tmp") {
                let path = entry.path();
                fs::remove_file(&path).map_err(|e| Error::io("remove", &path, e))?;
            }
        }
        Ok(())
    }

    /// Creates the root and the marker directory if missing; a marker
    /// path that is not a directory (a file, a link) is an error.
    fn ensure_dirs(&self) -> Result<()> {
        fs::create_dir_all(&self.root).map_err(|e| Error::io("create", &self.root, e))?;
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
    fn recreate_missing(&self) -> Result<Vec<Marker>> {
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
    fn read_marker(&self, name: &str) -> Result<Option<Marker>> {
        let path = self.marker_path(name);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("read", &path, e)),
        };
        let marker: Marker = serde_json::from_str(&text)
            .map_err(|e| Error::parse(format!("marker {}", path.display()), e))?;
        Ok((marker.owner == OWNER && marker.name == name).then_some(marker))
    }

    /// Every marker of ours. Files that are not markers, name another owner
    /// or cannot be parsed are skipped (the last with a warning).
    fn markers(&self) -> Result<Vec<Marker>> {
        let entries = match fs::read_dir(&self.markers) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("read", &self.markers, e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("read", &self.markers, e))?;
            let file_name = entry.file_name();
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

    /// Writes `marker` atomically: a temporary file, flushed, renamed over
    /// the marker, and the directory flushed.
    fn write_marker(&self, marker: &Marker) -> Result<()> {
        let temp = self.temp_marker_path(&marker.name);
        let path = self.marker_path(&marker.name);
        let text = serde_json::to_vec_pretty(marker)
            .map_err(|e| Error::parse(format!("marker of {}", marker.name), e))?;
        let write = || -> io::Result<()> {
            let mut file = File::create(&temp)?;
            file.write_all(&text)?;
            file.write_all(b"\n")?;
            file.sync_all()
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&temp);
            return Err(Error::io("write", &temp, e));
        }
        if let Err(e) = fs::rename(&temp, &path) {
            let _ = fs::remove_file(&temp);
            return Err(Error::io("rename into place", &path, e));
        }
        sync_dir(&self.markers)
    }

    /// Marker first, then the directory; the marker is removed again if the
    /// directory cannot be made. Refuses a name whose data path exists
    /// without our marker, and a size above what is allocatable.
    fn create(&self, name: &str, size: u64, with_quota: bool) -> Result<Marker> {
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
        if let Err(e) = make_data_dir(&dir).and_then(|()| sync_dir(&self.root)) {
            if let Err(undo) = self.remove_marker(name) {
                tracing::error!(volume.name = %name, error = %undo, "rollback of the marker failed");
            }
            return Err(e);
        }
        Ok(marker)
    }

    /// Our marker of `name` if the growth to `size` (larger than its size:
    /// the engine answers no-ops and refuses shrinks) fits what is
    /// allocatable.
    fn check_growth(&self, name: &str, size: u64) -> Result<Marker> {
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
        let committed = markers
            .iter()
            .fold(0u64, |sum, m| sum.saturating_add(m.size_bytes));
        let free = free_bytes(&self.fs_stats()?, committed);
        Ok(GroupCapacity::allocatable(free, self.config.reserve_bytes))
    }

    fn fs_stats(&self) -> Result<FsStats> {
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
    fn remove(&self, name: &str) -> Result<()> {
        self.remove_data(name)?;
        self.remove_marker(name)
    }

    /// Removes `<root>/<name>` without following symbolic links: a link in
    /// its place is removed itself, links inside are not followed, and a
    /// directory on another file system (something mounted there) is
    /// refused rather than emptied.
    fn remove_data(&self, name: &str) -> Result<()> {
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

    fn remove_marker(&self, name: &str) -> Result<()> {
        let path = self.marker_path(name);
        match fs::remove_file(&path) {
            Ok(()) => sync_dir(&self.markers),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io("remove", &path, e)),
        }
    }
}

fn make_data_dir(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .mode(DATA_DIR_MODE)
        .create(dir)
        .map_err(|e| Error::io("create", dir, e))?;
    // The umask narrowed the mode given above.
    fs::set_permissions(dir, fs::Permissions::from_mode(DATA_DIR_MODE))
        .map_err(|e| Error::io("set the mode of", dir, e))
}

fn read_dir(dir: &Path) -> Result<Vec<fs::DirEntry>> {
    fs::read_dir(dir)
        .and_then(|entries| entries.collect::<io::Result<Vec<_>>>())
        .map_err(|e| Error::io("read", dir, e))
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
    use crate::engine::config::Config;

    fn group(root: &Path, reserve: u64) -> HostGroup {
        let text = format!(
            r#"{{"diskSelector":[{{"name":"dirs","policy":"HOST","root":{:?},"reserveBytes":{reserve}}}]}}"#,
            root.to_str().expect("temp paths are UTF-8")
        );
        let config = Config::from_json(&text).expect("valid config");
        HostGroup::new(config.groups[0].clone()).expect("group")
    }

    fn req(name: &str, size: u64) -> CreateRequest {
        CreateRequest {
            name: name.to_string(),
            group: "dirs".to_string(),
            size_bytes: size,
            exclusive: false,
        }
    }

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

    #[test]
    fn missing_root_in_config_is_rejected() {
        let text = r#"{"diskSelector":[{"name":"dirs","policy":"HOST","root":"/x"}]}"#;
        let mut config = Config::from_json(text).expect("valid").groups[0].clone();
        config.root = None;
        let err = HostGroup::new(config).expect_err("no root");
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    }

    /// The file-level lifecycle on whatever file system holds the temp dir
    /// (capacity-sensitive cases run on their own file systems in
    /// `tests/engine_host.rs`).
    #[tokio::test]
    async fn lifecycle_on_a_temp_dir() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("a/b/root");
        let g = group(&root, 0);
        g.rescan(&[]).await.expect("rescan creates the root");
        assert!(root.join(MARKER_DIR).is_dir());

        // The engine rounds before it calls create (and resize).
        let size = g.round_size(5000).expect("rounds");
        assert_eq!(size, 8192);
        let v = g.create(&req("vol-1", size)).await.expect("create");
        assert_eq!(v.size_bytes, 8192);
        assert_eq!(v.host_path.as_deref(), Some(root.join("vol-1").as_path()));
        assert!(root.join("vol-1").is_dir());
        let mode = fs::metadata(root.join("vol-1"))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, DATA_DIR_MODE);
        assert_eq!(g.get("vol-1").await.expect("get"), Some(v.clone()));

        // A directory of the same name without our marker blocks a create.
        fs::create_dir(root.join("theirs")).expect("mkdir");
        let err = g.create(&req("theirs", 4096)).await.expect_err("foreign");
        assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");
        assert!(!root.join(MARKER_DIR).join("theirs.json").exists());

        // A marker of another owner is not ours.
        fs::write(
            root.join(MARKER_DIR).join("other.json"),
            r#"{"carina.storage.io/owner":"someone","name":"other","sizeBytes":4096,"createdUnix":0}"#,
        )
        .expect("write");
        // A corrupt marker is skipped by list and refused by get.
        fs::write(root.join(MARKER_DIR).join("broken.json"), "{").expect("write");
        let names: Vec<String> = g
            .list()
            .await
            .expect("list")
            .into_iter()
            .map(|v| v.name)
            .collect();
        assert_eq!(names, ["vol-1"]);
        assert_eq!(g.get("other").await.expect("get"), None);
        assert!(matches!(g.get("broken").await, Err(Error::Parse { .. })));

        let size = g.round_size(10_000).expect("rounds");
        let grown = g.resize("vol-1", size).await.expect("grow");
        assert_eq!(grown.size_bytes, 12_288);
        assert_eq!(
            g.get("vol-1").await.expect("get").map(|v| v.size_bytes),
            Some(12_288)
        );
        // Shrinks and same-size resizes are the engine's to answer
        // (tests/tests/engine_host.rs, engine_bad_requests.rs).

        // Rescan recreates a lost data directory and removes stale temps.
        fs::remove_dir(root.join("vol-1")).expect("rmdir");
        fs::write(root.join(MARKER_DIR).join(".vol-2.json.tmp"), "x").expect("write");
        g.rescan(&[]).await.expect("rescan");
        assert!(root.join("vol-1").is_dir());
        assert!(!root.join(MARKER_DIR).join(".vol-2.json.tmp").exists());

        // Delete does not follow a link out of the root.
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).expect("mkdir");
        fs::write(outside.join("keep"), "x").expect("write");
        std::os::unix::fs::symlink(&outside, root.join("vol-1").join("link")).expect("symlink");
        g.delete("vol-1").await.expect("delete");
        assert!(!root.join("vol-1").exists());
        assert!(!root.join(MARKER_DIR).join("vol-1.json").exists());
        assert!(outside.join("keep").exists(), "link target survives");
        assert!(root.join("theirs").is_dir(), "foreign dir survives");
        assert!(matches!(
            g.delete("vol-1").await,
            Err(Error::VolumeNotFound { .. })
        ));
        assert!(matches!(
            g.delete("theirs").await,
            Err(Error::VolumeNotFound { .. })
        ));

        let cap = g.capacity().await.expect("capacity");
        assert_eq!(cap.volume_count, 0);
        assert_eq!(cap.allocation_unit, ALLOCATION_UNIT);
        assert_eq!(cap.disks, [root.to_string_lossy().into_owned()]);
    }

    #[tokio::test]
    async fn a_marker_path_that_is_not_a_directory_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        fs::create_dir(&root).expect("mkdir");
        std::os::unix::fs::symlink(tmp.path(), root.join(MARKER_DIR)).expect("symlink");
        let g = group(&root, 0);
        let err = g
            .rescan(&[])
            .await
            .expect_err("a link is not our marker dir");
        assert!(err.to_string().contains(MARKER_DIR), "{err}");
        let err = g.create(&req("v", 4096)).await.expect_err("nor for create");
        assert!(matches!(err, Error::Io { .. }), "{err}");
        assert!(!tmp.path().join("v.json").exists());
    }

    #[tokio::test]
    async fn a_data_path_that_is_a_link_is_removed_not_followed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        let g = group(&root, 0);
        g.rescan(&[]).await.expect("rescan");
        g.create(&req("v", 4096)).await.expect("create");
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).expect("mkdir");
        fs::write(outside.join("keep"), "x").expect("write");
        fs::remove_dir(root.join("v")).expect("rmdir");
        std::os::unix::fs::symlink(&outside, root.join("v")).expect("symlink");
        g.delete("v").await.expect("delete");
        assert!(
            fs::symlink_metadata(root.join("v")).is_err(),
            "link removed"
        );
        assert!(outside.join("keep").exists(), "target untouched");
    }
}
