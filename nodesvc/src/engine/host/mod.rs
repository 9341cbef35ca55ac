//! The HOST policy: one directory per volume under the group's root.
//!
//! Layout under `root`:
//!
//! - `<root>/<volume>/` is the volume's data directory;
//! - `<root>/.carina/<volume>.json` is our ownership marker (owner, name,
//!   size, creation time, project id when a quota is set), written to a
//!   new temporary file and renamed into place, never through a link
//!   ([`store`]).
//!
//! A directory without our marker is foreign: it is never listed, resized or
//! deleted. Create writes the marker first and the directory second; delete
//! removes the directory first and the marker last; a failure in between is
//! rolled back, so a volume is never half there. A directory another
//! program made becomes ours when adopted ([`adopt`]): our marker is
//! added, the directory kept as it is.
//!
//! Sizes are enforced by project quota when the root's file system supports
//! it ([`super::quota`]); otherwise they are only accounted, and the
//! capacity report says so.

mod adopt;
mod store;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use self::store::{Marker, Store};
use super::backend::Backend;
use super::config::{GroupConfig, Policy};
use super::disks::Disk;
use super::error::{Error, Result};
use super::names;
use super::quota::{self, Enforcement};
use super::volume::{AdoptRequest, CreateRequest, GroupCapacity, Volume};

/// Directory under the root that holds the markers. Volume names cannot
/// start with a dot, so it never collides with a volume.
pub const MARKER_DIR: &str = ".carina";
/// The marker key that says who owns a volume.
pub const OWNER_KEY: &str = "carina.storage.io/owner";
/// Our value of [`OWNER_KEY`].
pub const OWNER: &str = "carina";
/// Sizes are rounded up to a multiple of this.
pub const ALLOCATION_UNIT: u64 = 4096;

/// Mode of a new data directory: a workload may run as any user and must
/// be able to write its volume without an `fsGroup`, so everyone may write
/// (no sticky bit: the users of one volume may remove each other's files).
/// Only pods that mount the volume reach it: the root is
/// [`ROOT_DIR_MODE`], and a pod's access goes through its bind mount, which
/// the root's mode does not gate. With an `fsGroup`, kubelet narrows it to
/// the group (the driver's `fsGroupPolicy` is `File`).
const DATA_DIR_MODE: u32 = 0o777;
/// Mode of a root the node creates (and of any parent it creates): only
/// root traverses it, so no user on the host reaches the world-writable
/// data directories inside. A root that exists is left as it is.
const ROOT_DIR_MODE: u32 = 0o700;
/// Mode of the marker directory: only the daemon reads it.
const MARKER_DIR_MODE: u32 = 0o700;

/// A HOST device group.
#[derive(Debug)]
pub struct HostGroup {
    store: Arc<Store>,
    /// Quota detection result, refreshed on every rescan; `None` until the
    /// first detection.
    quota: Mutex<Option<Option<Enforcement>>>,
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
        Ok(HostGroup {
            store: Arc::new(Store::new(config, root)),
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
                carina.group = %self.store.config.name,
                carina.volume.name = %marker.name,
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
                    tracing::error!(carina.volume.name = %marker.name, error = %undo, "rollback after a failed quota set-up failed");
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
                tracing::error!(carina.volume.name = %name, error = %undo, "restoring the quota limit failed");
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
                // The data is gone, the marker still there.
                carina_sys::crashpoint::reach("host.delete.emptied", &owned);
                Ok(marker)
            })
            .await?;
        if let Some(id) = marker.project_id {
            // A limit left on an unused project harms nothing, so failing
            // to clear it does not keep the volume alive.
            match self.enforcement().await {
                Ok(Some(e)) => {
                    if let Err(err) = e.set_limit(id, 0).await {
                        tracing::warn!(carina.volume.name = %name, error = %err, "clearing the quota limit failed");
                    }
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(carina.volume.name = %name, error = %err, "quota detection failed")
                }
            }
        }
        let owned = name.to_string();
        self.blocking(move |s| s.remove_marker(&owned)).await
    }

    async fn adopt(&self, req: &AdoptRequest, _disk: Option<&Disk>) -> Result<Volume> {
        self.adopt_dir(req).await
    }

    async fn capacity(&self) -> Result<GroupCapacity> {
        let enforcement = self.enforcement().await?;
        let (stats, markers) = self.blocking(|s| Ok((s.fs_stats()?, s.markers()?))).await?;
        let free = store::free_bytes(&stats, store::committed(&markers));
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

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

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
        assert!(matches!(err, Error::Io(_)), "{err}");
        assert!(!tmp.path().join("v.json").exists());
    }

    #[tokio::test]
    async fn links_planted_at_marker_names_are_not_followed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        let g = group(&root, 0);
        g.rescan(&[]).await.expect("rescan");
        let markers = root.join(MARKER_DIR);
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).expect("mkdir");
        let victim = outside.join("victim");
        fs::write(&victim, "precious").expect("write");
        let symlink = |to: &Path, at: &str| {
            std::os::unix::fs::symlink(to, markers.join(at)).expect("symlink");
        };

        // A link at the temporary name the node used to write through.
        symlink(&victim, ".v.json.tmp");
        g.create(&req("v", 4096)).await.expect("create");
        assert_eq!(fs::read_to_string(&victim).expect("read"), "precious");
        let marker = fs::symlink_metadata(markers.join("v.json")).expect("stat");
        assert!(marker.is_file(), "the marker is a file of its own");
        // A resize rewrites it the same way.
        let _ = fs::remove_file(markers.join(".v.json.tmp"));
        symlink(&victim, ".v.json.tmp");
        g.resize("v", 8192).await.expect("grow");
        assert_eq!(fs::read_to_string(&victim).expect("read"), "precious");
        assert_eq!(
            g.get("v").await.expect("get").map(|v| v.size_bytes),
            Some(8192)
        );

        // A link at a marker's own name, to a file that reads as a marker
        // of ours: not a volume.
        let fake = outside.join("fake.json");
        fs::write(
            &fake,
            r#"{"carina.storage.io/owner":"carina","name":"w","sizeBytes":4096,"createdUnix":0}"#,
        )
        .expect("write");
        symlink(&fake, "w.json");
        assert!(g.get("w").await.is_err(), "not read through the link");
        let names: Vec<String> = g
            .list()
            .await
            .expect("list")
            .into_iter()
            .map(|v| v.name)
            .collect();
        assert_eq!(names, ["v"]);
        assert!(g.delete("w").await.is_err());
        assert!(fake.exists() && victim.exists());
    }

    #[tokio::test]
    async fn a_new_root_is_reached_by_root_only() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("made/root");
        let g = group(&root, 0);
        g.rescan(&[]).await.expect("rescan");
        for dir in [&root, &tmp.path().join("made")] {
            let mode = fs::metadata(dir).expect("stat").permissions().mode();
            assert_eq!(mode & 0o777, ROOT_DIR_MODE, "{}", dir.display());
        }
        // An existing root keeps its mode.
        let existing = tmp.path().join("existing");
        fs::create_dir(&existing).expect("mkdir");
        fs::set_permissions(&existing, fs::Permissions::from_mode(0o755)).expect("chmod");
        group(&existing, 0).rescan(&[]).await.expect("rescan");
        let mode = fs::metadata(&existing).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
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
