//! Engine tests for HOST groups. Every test gets its own small file system
//! (a loop disk formatted and mounted at a temp dir), so capacity numbers are
//! the test's alone and can be checked against `statvfs`.

use std::path::{Path, PathBuf};

use carina_node::engine::quota;
use carina_node::engine::{CreateRequest, Engine, Error, GroupCapacity, Policy, QuotaMode, Volume};
use carina_tests::engine::{
    assert_not_found, capacity, create, engine_for, refused, resize_refused,
};
use carina_tests::{LoopDisk, MountGuard, have_root, run, stat_fs, unique};

const MIB: u64 = 1 << 20;
const UNIT: u64 = 4096;

/// A fresh file system on a loop disk, mounted at a temp dir. Fields drop
/// in order: unmount, remove the mount point, detach the disk.
struct Fs {
    mount: Option<MountGuard>,
    dir: tempfile::TempDir,
    disk: LoopDisk,
    fstype: &'static str,
}

impl Fs {
    /// `None` means skip (no root, or outside CI no loop device or mkfs).
    fn new(test: &str, fstype: &'static str, size: u64) -> Option<Fs> {
        if !have_root(test) {
            return None;
        }
        let disk = match LoopDisk::new(size) {
            Ok(d) => d,
            Err(e) => {
                carina_tests::skip(test, &format!("no loop device: {e:#}"));
                return None;
            }
        };
        let dev = disk.dev();
        let made = match fstype {
            "ext4" => run(
                "mkfs.ext4",
                &[
                    "-q",
                    "-F",
                    "-E",
                    "lazy_itable_init=0,lazy_journal_init=0",
                    &dev,
                ],
            ),
            "xfs" => run("mkfs.xfs", &["-q", "-f", &dev]),
            other => panic!("no mkfs for {other}"),
        };
        if let Err(e) = made {
            carina_tests::skip(test, &format!("mkfs.{fstype}: {e:#}"));
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("carina-hostfs-")
            .tempdir()
            .expect("tempdir");
        let mount = MountGuard::mount(&dev, dir.path(), Some(fstype), None).expect("mount");
        Some(Fs {
            mount: Some(mount),
            dir,
            disk,
            fstype,
        })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Unmounts the file system and mounts it again at the same place.
    fn remount(&mut self) {
        drop(self.mount.take());
        assert!(
            !is_mount_point(self.path()),
            "{} still mounted",
            self.path().display()
        );
        self.mount = Some(
            MountGuard::mount(&self.disk.dev(), self.path(), Some(self.fstype), None)
                .expect("mount again"),
        );
    }
}

/// An engine over HOST groups on one [`Fs`]. The engine drops first.
struct Host {
    engine: Engine,
    /// (group name, root) per configured group.
    groups: Vec<(String, PathBuf)>,
    config: String,
    fs: Fs,
}

impl Host {
    /// One group per `(root relative to the mount, reserve)`.
    async fn new(
        test: &str,
        fstype: &'static str,
        size: u64,
        roots: &[(&str, u64)],
    ) -> Option<Host> {
        let fs = Fs::new(test, fstype, size)?;
        let mut selectors = Vec::new();
        let mut groups = Vec::new();
        for (rel, reserve) in roots {
            let name = unique("host");
            let root = fs.path().join(rel);
            selectors.push(serde_json::json!({
                "name": name,
                "policy": "HOST",
                "root": root,
                "reserveBytes": reserve,
            }));
            groups.push((name, root));
        }
        let config = serde_json::json!({
            "diskSelector": selectors,
            "diskScanInterval": "0",
        })
        .to_string();
        let engine = start(&config).await;
        Some(Host {
            engine,
            groups,
            config,
            fs,
        })
    }

    /// One group at `rel` keeping `reserve` bytes, on a 64 MiB ext4.
    async fn ext4(test: &str, rel: &str, reserve: u64) -> Option<Host> {
        Host::new(test, "ext4", 64 * MIB, &[(rel, reserve)]).await
    }

    fn group(&self) -> &str {
        &self.groups[0].0
    }

    fn root(&self) -> &Path {
        &self.groups[0].1
    }

    /// Replaces the engine by a new one over the same configuration.
    async fn restart(&mut self) {
        self.engine = start(&self.config).await;
    }

    /// The first group's capacity now.
    async fn capacity(&self) -> GroupCapacity {
        capacity(&self.engine, self.group()).await
    }

    fn req(&self, name: &str, size: u64) -> CreateRequest {
        CreateRequest {
            name: name.to_string(),
            group: self.group().to_string(),
            size_bytes: size,
            exclusive: false,
        }
    }
}

async fn start(config: &str) -> Engine {
    engine_for(config, Some(false)).await
}

fn is_mount_point(path: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    quota::parse_mountinfo(&text)
        .iter()
        .any(|m| m.mount_point == path)
}

/// What the file system says, independently of the engine:
/// (frsize, blocks, free blocks, available blocks).
fn statfs(path: &Path) -> (u64, u64, u64, u64) {
    let n: Vec<u64> = stat_fs(path, "%S %b %f %a");
    (n[0], n[1], n[2], n[3])
}

/// The documented formula: available bytes, but never more than the size
/// usable by everyone (total less root-only blocks) less what volumes hold.
fn expected_free(path: &Path, committed: u64) -> u64 {
    let (frsize, blocks, bfree, bavail) = statfs(path);
    let usable = (blocks - (bfree - bavail)) * frsize;
    (bavail * frsize).min(usable.saturating_sub(committed))
}

fn marker(root: &Path, name: &str) -> serde_json::Value {
    let path = root.join(".carina").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).expect("marker readable");
    serde_json::from_str(&text).expect("marker is JSON")
}

fn names(volumes: &[Volume]) -> Vec<&str> {
    volumes.iter().map(|v| v.name.as_str()).collect()
}

#[tokio::test]
async fn host_lifecycle_is_idempotent() {
    let Some(h) = Host::ext4("host_lifecycle_is_idempotent", "vols", 0).await else {
        return;
    };
    let e = &h.engine;

    let v = create(e, h.req("vol-a", 5 * MIB + 1)).await;
    assert_eq!(v.size_bytes, 5 * MIB + UNIT, "rounded up to 4 KiB");
    assert_eq!(v.policy, Policy::Host);
    assert_eq!(v.group, h.group());
    assert_eq!(
        v.host_path.as_deref(),
        Some(h.root().join("vol-a").as_path())
    );
    assert_eq!(v.device_path, None);
    assert_eq!((v.major, v.minor), (0, 0));
    assert!(h.root().join("vol-a").is_dir());
    let m = marker(h.root(), "vol-a");
    assert_eq!(m["carina.storage.io/owner"], "carina");
    assert_eq!(m["name"], "vol-a");
    assert_eq!(m["sizeBytes"], 5 * MIB + UNIT);
    assert!(m["createdUnix"].as_u64().expect("creation time") > 0);
    assert!(m.get("projectId").is_none(), "no quota here, so no project");

    assert_eq!(e.get_volume("vol-a").await.expect("get"), v);
    assert_eq!(
        e.list_volumes(Some(h.group())).await.expect("list"),
        vec![v.clone()]
    );

    // The same request again, and one that rounds to the same size.
    for size in [5 * MIB + 1, 5 * MIB + 2] {
        assert_eq!(create(e, h.req("vol-a", size)).await, v, "a repeat");
    }
    let err = refused(e, h.req("vol-a", 6 * MIB)).await;
    assert!(
        matches!(
            err,
            Error::AlreadyExists { existing_bytes, requested_bytes, .. }
                if existing_bytes == 5 * MIB + UNIT && requested_bytes == 6 * MIB
        ),
        "{err}"
    );

    let grown = e.resize_volume("vol-a", 8 * MIB).await.expect("grow");
    assert_eq!(grown.size_bytes, 8 * MIB);
    assert_eq!(
        e.get_volume("vol-a").await.expect("get").size_bytes,
        8 * MIB
    );
    assert_eq!(marker(h.root(), "vol-a")["sizeBytes"], 8 * MIB);
    assert_eq!(
        e.resize_volume("vol-a", 8 * MIB).await.expect("same size"),
        grown
    );
    let err = resize_refused(e, "vol-a", 4 * MIB).await;
    assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");

    let cap = h.capacity().await;
    assert_eq!(cap.volume_count, 1);
    assert_eq!(cap.free_bytes, expected_free(h.root(), 8 * MIB));

    e.delete_volume("vol-a").await.expect("delete");
    assert!(!h.root().join("vol-a").exists());
    assert!(!h.root().join(".carina/vol-a.json").exists());
    assert_not_found(e, "vol-a").await;
    assert!(e.list_volumes(None).await.expect("list").is_empty());
}

#[tokio::test]
async fn host_exhaustion_is_refused_and_leaves_nothing() {
    let Some(h) = Host::ext4("host_exhaustion_is_refused_and_leaves_nothing", "vols", 0).await
    else {
        return;
    };
    let e = &h.engine;
    let cap = h.capacity().await;
    assert_eq!(cap.free_bytes, expected_free(h.root(), 0));
    assert_eq!(cap.allocatable_bytes, cap.free_bytes, "no reserve");
    assert_eq!(cap.largest_allocatable_bytes, cap.allocatable_bytes);
    assert!(cap.allocatable_bytes > 40 * MIB, "{cap:?}");

    let err = refused(e, h.req("too-big", cap.allocatable_bytes + 1)).await;
    assert!(
        matches!(
            err,
            Error::ResourceExhausted { allocatable_bytes, .. } if allocatable_bytes == cap.allocatable_bytes
        ),
        "{err}"
    );
    assert!(!h.root().join("too-big").exists(), "no directory left");
    assert!(
        !h.root().join(".carina/too-big.json").exists(),
        "no marker left"
    );

    let fill = cap.allocatable_bytes / UNIT * UNIT;
    create(e, h.req("fill", fill)).await;
    let after = h.capacity().await;
    assert_eq!(after.free_bytes, expected_free(h.root(), fill));
    assert!(after.allocatable_bytes < MIB, "{after:?}");
    let err = refused(e, h.req("one-more", after.allocatable_bytes + 1)).await;
    assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");
    let err = resize_refused(e, "fill", fill + after.allocatable_bytes + 1).await;
    assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");
    assert_eq!(e.get_volume("fill").await.expect("get").size_bytes, fill);
    assert_eq!(names(&e.list_volumes(None).await.expect("list")), ["fill"]);

    e.delete_volume("fill").await.expect("delete");
    let back = h.capacity().await;
    assert_eq!(back.free_bytes, expected_free(h.root(), 0));
    assert!(back.allocatable_bytes >= fill, "{back:?}");
}

#[tokio::test]
async fn host_reserve_is_never_allocated() {
    let Some(h) = Host::new(
        "host_reserve_is_never_allocated",
        "ext4",
        64 * MIB,
        &[("keep", 16 * MIB), ("greedy", 1 << 40)],
    )
    .await
    else {
        return;
    };
    let e = &h.engine;
    let (keep, keep_root) = (&h.groups[0].0, &h.groups[0].1);
    let (greedy, _) = (&h.groups[1].0, &h.groups[1].1);
    let req = |group: &str, name: &str, size| CreateRequest {
        name: name.to_string(),
        group: group.to_string(),
        size_bytes: size,
        exclusive: false,
    };

    let cap = capacity(e, keep).await;
    assert_eq!(cap.reserve_bytes, 16 * MIB);
    assert_eq!(cap.free_bytes, expected_free(keep_root, 0));
    assert_eq!(cap.allocatable_bytes, cap.free_bytes - 16 * MIB);
    // Fits the free space, but not without eating into the reserve.
    let err = refused(e, req(keep, "into-reserve", cap.allocatable_bytes + UNIT)).await;
    assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");
    let most = cap.allocatable_bytes / UNIT * UNIT;
    create(e, req(keep, "most", most)).await;
    let after = capacity(e, keep).await;
    assert!(
        after.free_bytes >= 16 * MIB,
        "reserve still free: {after:?}"
    );
    assert_eq!(after.free_bytes, expected_free(keep_root, most));
    assert_eq!(after.allocatable_bytes, after.free_bytes - 16 * MIB);
    // What is left is the file system's own few blocks (root directory,
    // lost+found, markers), which the formula cannot tell from volume data.
    assert!(after.allocatable_bytes < MIB, "{after:?}");

    // A reserve larger than the file system: nothing allocatable, no underflow.
    let cap = capacity(e, greedy).await;
    assert_eq!(cap.allocatable_bytes, 0);
    assert_eq!(cap.largest_allocatable_bytes, 0);
    let err = refused(e, req(greedy, "tiny", UNIT)).await;
    assert!(
        matches!(
            err,
            Error::ResourceExhausted {
                allocatable_bytes: 0,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn host_foreign_entries_are_never_touched() {
    let Some(h) = Host::ext4("host_foreign_entries_are_never_touched", "vols", 0).await else {
        return;
    };
    let root = h.root();
    // Someone else's directory, a stray file, a marker of another owner,
    // and a directory outside the root that a volume will link to.
    std::fs::create_dir(root.join("stranger")).expect("mkdir");
    std::fs::write(root.join("stranger/data.txt"), "theirs").expect("write");
    std::fs::write(root.join("notes.txt"), "theirs").expect("write");
    std::fs::write(
        root.join(".carina/impostor.json"),
        r#"{"carina.storage.io/owner":"someone-else","name":"impostor","sizeBytes":4096,"createdUnix":1}"#,
    )
    .expect("write");
    std::fs::create_dir(root.join("impostor")).expect("mkdir");
    let outside = h.fs.path().join("outside");
    std::fs::create_dir(&outside).expect("mkdir");
    std::fs::write(outside.join("keep.txt"), "outside").expect("write");

    // A new engine sees none of it.
    let mut h = h;
    h.restart().await;
    let e = &h.engine;
    let root = h.root();
    assert!(e.list_volumes(None).await.expect("list").is_empty());
    for name in ["stranger", "impostor"] {
        assert_not_found(e, name).await;
        assert!(matches!(
            e.resize_volume(name, 8 * MIB).await,
            Err(Error::VolumeNotFound { .. })
        ));
    }
    // Taken by someone else.
    let err = refused(e, h.req("stranger", 4 * MIB)).await;
    assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");
    assert!(
        !root.join(".carina/stranger.json").exists(),
        "no marker made"
    );

    // One of ours, holding a link out of the root, deleted.
    let v = create(e, h.req("ours", 4 * MIB)).await;
    let dir = v.host_path.expect("a directory");
    std::os::unix::fs::symlink(&outside, dir.join("escape")).expect("symlink");
    assert_eq!(h.capacity().await.volume_count, 1);
    e.delete_volume("ours").await.expect("delete");
    assert!(!dir.exists());

    assert_eq!(
        std::fs::read_to_string(root.join("stranger/data.txt")).expect("still there"),
        "theirs"
    );
    assert!(root.join("notes.txt").exists());
    assert!(root.join("impostor").is_dir());
    assert!(root.join(".carina/impostor.json").exists());
    assert_eq!(
        std::fs::read_to_string(outside.join("keep.txt")).expect("still there"),
        "outside"
    );
}

#[tokio::test]
async fn host_new_engine_finds_volumes_and_restores_directories() {
    let Some(mut h) = Host::ext4(
        "host_new_engine_finds_volumes_and_restores_directories",
        "deep/nested/root",
        0,
    )
    .await
    else {
        return;
    };
    assert!(
        h.root().join(".carina").is_dir(),
        "start made root and markers"
    );
    let a = create(&h.engine, h.req("vol-a", 4 * MIB)).await;
    let b = create(&h.engine, h.req("vol-b", 8 * MIB)).await;
    std::fs::write(h.root().join("vol-a/file"), "kept").expect("write");
    std::fs::remove_dir(h.root().join("vol-b")).expect("lose b's directory");

    h.restart().await;
    let e = &h.engine;
    assert_eq!(
        e.list_volumes(None).await.expect("list"),
        vec![a.clone(), b.clone()]
    );
    assert_eq!(e.get_volume("vol-b").await.expect("get"), b);
    assert!(h.root().join("vol-b").is_dir(), "rescan recreated it");
    assert_eq!(
        std::fs::read_to_string(h.root().join("vol-a/file")).expect("read"),
        "kept"
    );
    let cap = h.capacity().await;
    assert_eq!(cap.volume_count, 2);
    assert_eq!(cap.free_bytes, expected_free(h.root(), 12 * MIB));
    // The new engine knows them: repeat, conflict and delete all work.
    assert_eq!(create(e, h.req("vol-a", 4 * MIB)).await, a, "a repeat");
    let err = refused(e, h.req("vol-b", 4 * MIB)).await;
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err}");
    e.delete_volume("vol-a").await.expect("delete");
    e.delete_volume("vol-b").await.expect("delete");
}

#[tokio::test]
async fn host_capacity_reports_accounting_only() {
    let Some(h) = Host::ext4("host_capacity_reports_accounting_only", "vols", 3 * MIB).await else {
        return;
    };
    let e = &h.engine;
    create(e, h.req("vol-a", 2 * MIB)).await;
    // This kernel has no quota support, so the file system is mounted
    // without prjquota and sizes are only accounted: say so.
    assert_eq!(quota::detect(h.root()).expect("detect"), None);
    let cap = h.capacity().await;
    let (frsize, blocks, _, _) = statfs(h.root());
    assert_eq!(cap.quota, QuotaMode::AccountingOnly);
    assert_eq!(cap.policy, Policy::Host);
    assert_eq!(cap.group, h.group());
    assert_eq!(cap.total_bytes, frsize * blocks);
    assert_eq!(cap.free_bytes, expected_free(h.root(), 2 * MIB));
    assert_eq!(cap.reserve_bytes, 3 * MIB);
    assert_eq!(cap.allocatable_bytes, cap.free_bytes - 3 * MIB);
    assert_eq!(cap.largest_allocatable_bytes, cap.allocatable_bytes);
    assert_eq!(cap.allocation_unit, UNIT);
    assert_eq!(cap.volume_count, 1);
    assert_eq!(cap.disks, [h.root().to_string_lossy().into_owned()]);
    // The published snapshot carries the same report.
    let snap = e.subscribe().borrow().clone();
    assert_eq!(snap.groups, vec![cap]);
}

/// Creates a volume, writes through a bind mount of its directory,
/// unmounts everything (the bind and the file system), mounts again, and
/// reads the data back through a new bind mount.
async fn data_survives_remount(test: &str, fstype: &'static str, size: u64) {
    let Some(mut h) = Host::new(test, fstype, size, &[("vols", 0)]).await else {
        return;
    };
    let v = create(&h.engine, h.req("data", 16 * MIB)).await;
    assert_eq!(h.capacity().await.quota, QuotaMode::AccountingOnly);
    let dir = v.host_path.clone().expect("a directory");
    let dir_s = dir.to_string_lossy().into_owned();
    let payload: Vec<u8> = (0..MIB as usize).map(|i| (i % 251) as u8).collect();

    let pod = tempfile::tempdir().expect("tempdir");
    let target = pod.path().join("mnt");
    {
        let _bind = MountGuard::mount(&dir_s, &target, None, Some("bind")).expect("bind");
        assert!(is_mount_point(&target));
        let mut f = std::fs::File::create(target.join("payload")).expect("create file");
        std::io::Write::write_all(&mut f, &payload).expect("write");
        f.sync_all().expect("fsync");
    }
    assert!(!is_mount_point(&target), "bind mount released");

    h.fs.remount();
    h.restart().await;
    let again = h
        .engine
        .get_volume("data")
        .await
        .expect("found after remount");
    assert_eq!(again, v);
    let _bind = MountGuard::mount(&dir_s, &target, None, Some("bind")).expect("bind again");
    assert_eq!(
        std::fs::read(target.join("payload")).expect("read back"),
        payload
    );
}

#[tokio::test]
async fn host_data_survives_remount_ext4() {
    data_survives_remount("host_data_survives_remount_ext4", "ext4", 64 * MIB).await;
}

#[tokio::test]
async fn host_data_survives_remount_xfs() {
    // mkfs.xfs refuses file systems below 300 MiB.
    data_survives_remount("host_data_survives_remount_xfs", "xfs", 320 * MIB).await;
}
