//! Engine tests for bcache devices: the real `make-bcache` and
//! `bcache-super-show` on volumes of real LVM and RAW groups on loop
//! devices, and the kernel driver played by the stand-in in
//! `carina_tests::bcache` (this machine's kernel has no bcache; see that
//! module for what the stand-in proves and what it does not). The flow
//! against the real driver runs in the `vm` tier (`vm_storage`), on a
//! Debian kernel under QEMU.

use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use carina_node::engine::bcache::record::{OwnedVolumes, Phase};
use carina_node::engine::bcache::{BcacheDevice, BcacheRequest, CacheMode};
use carina_node::engine::{CreateRequest, Engine, Error, Volume};
use carina_tests::bcache::{BcacheFixture, KernelStandIn, superblock_of};
use carina_tests::{lvm, run};

const MIB: u64 = 1 << 20;

fn devnum(v: &Volume) -> String {
    format!("{}:{}", v.major, v.minor)
}

async fn volume(engine: &Engine, name: &str) -> Volume {
    engine.get_volume(name).await.expect("volume exists")
}

/// Waits (bounded) until the stand-in logged an event starting with `prefix`.
async fn event(k: &KernelStandIn, prefix: &str) {
    for _ in 0..500 {
        if k.events().iter().any(|e| e.starts_with(prefix)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("no event {prefix:?} in {:?}", k.events());
}

fn assert_up(d: &BcacheDevice, mode: CacheMode) {
    let k = d.kernel.as_ref().expect("registered with the kernel");
    assert_eq!(d.phase, Phase::Ready, "{d:?}");
    assert_eq!(k.state, "clean", "{d:?}");
    assert_eq!(k.cache_mode, Some(mode), "{d:?}");
    assert_eq!(d.cache_mode, mode, "{d:?}");
    assert_eq!(k.cache_set.as_deref(), Some(d.cset_uuid.as_str()), "{d:?}");
    assert!(k.running, "{d:?}");
    let dev = k.device.as_ref().expect("a bcache device");
    assert!(dev.name.starts_with("bcache"), "{d:?}");
    assert_eq!(
        d.device_path.as_deref(),
        Some(std::path::Path::new("/dev").join(&dev.name).as_path())
    );
    assert_eq!(d.problem, None, "{d:?}");
}

/// Create, repeat, conflict, mode change, delete with a writeback flush:
/// the superblocks are real and read back, the driver's side is the
/// stand-in's log.
#[tokio::test]
async fn lifecycle_on_lvm_groups() {
    let Some(f) = BcacheFixture::new(
        "lifecycle_on_lvm_groups",
        "LVM",
        512 * MIB,
        "LVM",
        256 * MIB,
    )
    .await
    else {
        return;
    };
    let req = f.request("tier", 256 * MIB, 50, CacheMode::Writeback);
    let (d, created) = f.engine.ensure_bcache(req.clone()).await.expect("created");
    assert!(created);
    assert_up(&d, CacheMode::Writeback);
    let data = volume(&f.engine, "tier-data").await;
    let cache = volume(&f.engine, "tier-cache").await;
    assert_eq!(
        (data.group.as_str(), data.size_bytes),
        (f.hdd.as_str(), 256 * MIB)
    );
    assert_eq!(
        (cache.group.as_str(), cache.size_bytes),
        (f.ssd.as_str(), 128 * MIB),
        "50 %"
    );
    let (role, b_uuid, cset) =
        superblock_of(data.device_path.as_deref().expect("dev")).expect("backing superblock");
    assert!(role.contains("backing device"), "{role}");
    assert_eq!(cset, d.cset_uuid);
    assert_eq!(Some(&b_uuid), d.backing_uuid.as_ref());
    let (role, _, c_cset) =
        superblock_of(cache.device_path.as_deref().expect("dev")).expect("cache superblock");
    assert!(role.contains("cache device"), "{role}");
    assert_eq!(c_cset, d.cset_uuid);
    let k = f.standin();
    let events = k.events();
    assert_eq!(
        events[0],
        format!("register cache {}", d.cset_uuid),
        "{events:?}"
    );
    assert_eq!(
        events[1],
        format!("register backing {}", devnum(&data)),
        "{events:?}"
    );
    assert_eq!(
        events[2],
        format!("attach {} {}", devnum(&data), d.cset_uuid),
        "{events:?}"
    );
    assert_eq!(
        events.len(),
        3,
        "the superblock carried writeback: no mode write: {events:?}"
    );

    // The same request again is the same device, formatted once.
    let (again, created) = f.engine.ensure_bcache(req.clone()).await.expect("again");
    assert!(!created);
    assert_eq!(again.cset_uuid, d.cset_uuid);
    assert_eq!(
        superblock_of(data.device_path.as_deref().expect("dev"))
            .expect("sb")
            .1,
        b_uuid
    );
    // The same name with other arguments is a conflict; nothing changes.
    let err = f
        .engine
        .ensure_bcache(BcacheRequest {
            cache_mode: CacheMode::Writethrough,
            ..req.clone()
        })
        .await
        .expect_err("conflict");
    assert!(matches!(err, Error::BcacheConflict { .. }), "{err}");
    // Its volumes cannot be deleted from under it.
    let err = f
        .engine
        .delete_volume("tier-cache")
        .await
        .expect_err("in use");
    assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");
    assert!(err.to_string().contains("\"tier\""), "{err}");

    let d = f
        .engine
        .set_cache_mode("tier", CacheMode::Writearound)
        .await
        .expect("mode");
    assert_up(&d, CacheMode::Writearound);
    event(k, &format!("cache_mode {} writearound", devnum(&data))).await;
    let d = f
        .engine
        .set_cache_mode("tier", CacheMode::Writeback)
        .await
        .expect("mode");
    assert_up(&d, CacheMode::Writeback);

    // Writes in writeback mode left dirty data; the driver reports it.
    k.make_dirty(&devnum(&data), 3 * MIB, 87);
    let d = f.engine.get_bcache("tier").await.expect("get");
    let kd = d.kernel.expect("registered");
    assert_eq!(
        (kd.state.as_str(), kd.dirty_bytes, kd.hit_ratio_percent),
        ("dirty", 3 * MIB, 87)
    );

    f.engine.delete_bcache("tier").await.expect("deleted");
    let events = k.events();
    let tail: Vec<&str> = events[events.len() - 4..]
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(
        tail,
        [
            format!("cache_mode {} writethrough", devnum(&data)).as_str(),
            format!("detach {} flushed {}", devnum(&data), 3 * MIB).as_str(),
            format!("stop {}", devnum(&data)).as_str(),
            format!("unregister {}", d.cset_uuid).as_str(),
        ],
        "mode to writethrough, flush on detach, stop, unregister"
    );
    assert!(matches!(
        f.engine.get_volume("tier-data").await,
        Err(Error::VolumeNotFound { .. })
    ));
    assert!(matches!(
        f.engine.get_volume("tier-cache").await,
        Err(Error::VolumeNotFound { .. })
    ));
    assert!(matches!(
        f.engine.get_bcache("tier").await,
        Err(Error::BcacheNotFound { .. })
    ));
    assert!(matches!(
        f.engine.delete_bcache("tier").await,
        Err(Error::BcacheNotFound { .. })
    ));
    assert_eq!(
        std::fs::read_dir(f.state.path().join("bcache"))
            .expect("dir")
            .count(),
        0
    );
}

/// Existing volumes (a RAW backing partition, an LVM cache volume) stay
/// when the device is deleted, and lose their superblocks.
#[tokio::test]
async fn existing_volumes_on_raw_and_lvm() {
    let Some(f) = BcacheFixture::new(
        "existing_volumes_on_raw_and_lvm",
        "RAW",
        256 * MIB,
        "LVM",
        256 * MIB,
    )
    .await
    else {
        return;
    };
    let data = f
        .engine
        .create_volume(CreateRequest {
            name: "d".into(),
            group: f.hdd.clone(),
            size_bytes: 128 * MIB,
            exclusive: false,
        })
        .await
        .expect("backing");
    let cache = f
        .engine
        .create_volume(CreateRequest {
            name: "c".into(),
            group: f.ssd.clone(),
            size_bytes: 64 * MIB,
            exclusive: false,
        })
        .await
        .expect("cache");
    let req = BcacheRequest {
        name: "mixed".into(),
        backing_volume: "d".into(),
        cache_volume: "c".into(),
        cache_mode: CacheMode::Writethrough,
        create: None,
    };
    let (d, created) = f.engine.ensure_bcache(req).await.expect("created");
    assert!(created);
    assert_up(&d, CacheMode::Writethrough);
    assert_eq!(d.owned, None);
    for v in [&data, &cache] {
        assert!(
            superblock_of(v.device_path.as_deref().expect("dev")).is_some(),
            "{v:?}"
        );
    }
    f.engine.delete_bcache("mixed").await.expect("deleted");
    for v in [&data, &cache] {
        assert_eq!(
            volume(&f.engine, &v.name).await.size_bytes,
            v.size_bytes,
            "kept"
        );
        assert_eq!(
            superblock_of(v.device_path.as_deref().expect("dev")),
            None,
            "wiped: {v:?}"
        );
    }
    f.engine.delete_volume("d").await.expect("free again");
}

/// A restart re-assembles from the record and the superblocks, with the
/// mode set after the create, and formats nothing.
#[tokio::test]
async fn restart_reassembles_without_formatting() {
    let Some(f) = BcacheFixture::new(
        "restart_reassembles_without_formatting",
        "RAW",
        256 * MIB,
        "RAW",
        256 * MIB,
    )
    .await
    else {
        return;
    };
    let (d, _) = f
        .engine
        .ensure_bcache(f.request("keep", 128 * MIB, 60, CacheMode::Writethrough))
        .await
        .expect("created");
    let d = f
        .engine
        .set_cache_mode(&d.name, CacheMode::Writeback)
        .await
        .expect("mode");
    let data = volume(&f.engine, "keep-data").await;
    let sb_before = superblock_of(data.device_path.as_deref().expect("dev")).expect("sb");

    f.standin().reboot();
    assert!(!f.standin().registered(&devnum(&data)));
    let engine = f.restart().await;
    let again = engine.get_bcache("keep").await.expect("recorded");
    assert_up(&again, CacheMode::Writeback);
    assert_eq!(again.cset_uuid, d.cset_uuid);
    let data = volume(&engine, "keep-data").await;
    assert_eq!(
        superblock_of(data.device_path.as_deref().expect("dev")).expect("sb"),
        sb_before,
        "never re-formatted"
    );
    let (_, created) = engine
        .ensure_bcache(f.request("keep", 128 * MIB, 60, CacheMode::Writeback))
        .await
        .expect("same");
    assert!(!created);
    engine.delete_bcache("keep").await.expect("deleted");
}

/// The cache volume is gone after a reboot (its disk died): the backing
/// device is registered but not run, Get says what is missing, and a
/// delete removes what is left.
#[tokio::test]
async fn restart_with_the_cache_volume_gone() {
    let Some(f) = BcacheFixture::new(
        "restart_with_the_cache_volume_gone",
        "RAW",
        256 * MIB,
        "LVM",
        256 * MIB,
    )
    .await
    else {
        return;
    };
    f.engine
        .ensure_bcache(f.request("lost", 128 * MIB, 60, CacheMode::Writeback))
        .await
        .expect("created");
    let data = volume(&f.engine, "lost-data").await;
    f.standin().reboot();
    let pv = f.disks[1].dev();
    for stacked in carina_tests::loops_backed_by(&pv) {
        run("losetup", &["-d", &stacked]).expect("detach the cache volume's loop");
    }
    lvm(
        &[&pv],
        &["lvremove", "-y", &format!("{}/lost-cache", f.ssd)],
    )
    .expect("the cache volume disappears");

    let engine = f.restart().await;
    let d = engine.get_bcache("lost").await.expect("recorded");
    let k = d.kernel.as_ref().expect("backing registered");
    assert_eq!(
        (k.state.as_str(), k.running, k.device.is_none()),
        ("no cache", false, true),
        "{d:?}"
    );
    assert!(
        d.problem
            .as_deref()
            .is_some_and(|p| p.contains("lost-cache")),
        "{d:?}"
    );
    assert!(
        f.standin()
            .registered(&devnum(&volume(&engine, "lost-data").await))
    );
    let err = engine
        .set_cache_mode("lost", CacheMode::Writethrough)
        .await
        .expect_err("no cache volume");
    assert!(matches!(err, Error::VolumeNotFound { .. }), "{err}");

    engine.delete_bcache("lost").await.expect("deleted");
    assert!(!f.standin().registered(&devnum(&data)));
    assert!(matches!(
        engine.get_volume("lost-data").await,
        Err(Error::VolumeNotFound { .. })
    ));
    assert!(matches!(
        engine.get_bcache("lost").await,
        Err(Error::BcacheNotFound { .. })
    ));
}

/// An administrator detached the device; the same create re-attaches it
/// (the explicit attach path).
#[tokio::test]
async fn create_again_reattaches() {
    let Some(f) = BcacheFixture::new(
        "create_again_reattaches",
        "LVM",
        256 * MIB,
        "LVM",
        256 * MIB,
    )
    .await
    else {
        return;
    };
    let req = f.request("again", 128 * MIB, 60, CacheMode::Writethrough);
    let (d, _) = f.engine.ensure_bcache(req.clone()).await.expect("created");
    let data = volume(&f.engine, "again-data").await;
    let k = f.standin();
    k.write(&devnum(&data), "detach", "1");
    event(k, &format!("detach {}", devnum(&data))).await;
    let now = f.engine.get_bcache("again").await.expect("get");
    assert_eq!(
        now.kernel.as_ref().map(|k| k.state.as_str()),
        Some("no cache")
    );
    let attaches = || {
        k.events()
            .iter()
            .filter(|e| e.starts_with("attach "))
            .count()
    };
    assert_eq!(attaches(), 1);
    let (again, created) = f.engine.ensure_bcache(req).await.expect("repaired");
    assert!(!created);
    assert_up(&again, CacheMode::Writethrough);
    assert_eq!(attaches(), 2, "{:?}", k.events());
    assert_eq!(again.cset_uuid, d.cset_uuid);
    f.engine.delete_bcache("again").await.expect("deleted");
}

/// Failures leave nothing behind: no volume, no superblock, no record.
#[tokio::test]
async fn failures_undo_everything() {
    let Some(f) = BcacheFixture::new(
        "failures_undo_everything",
        "LVM",
        512 * MIB,
        "LVM",
        128 * MIB,
    )
    .await
    else {
        return;
    };
    let no_leftovers = |f: &BcacheFixture| {
        let names: Vec<String> = std::fs::read_dir(f.state.path().join("bcache"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(names, Vec::<String>::new(), "records left");
    };
    // The cache group cannot hold 50 % of 512 MiB.
    let err = f
        .engine
        .ensure_bcache(f.request("big", 400 * MIB, 50, CacheMode::Writethrough))
        .await
        .expect_err("no room");
    assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");
    assert!(
        matches!(
            f.engine.get_volume("big-data").await,
            Err(Error::VolumeNotFound { .. })
        ),
        "backing rolled back"
    );
    no_leftovers(&f);

    // Volumes it makes get at least make-bcache's smallest cache.
    let (small, _) = f
        .engine
        .ensure_bcache(f.request("small", 64 * MIB, 1, CacheMode::Writethrough))
        .await
        .expect("a cache of the smallest size");
    assert_eq!(
        f.engine
            .get_volume("small-cache")
            .await
            .expect("cache")
            .size_bytes,
        64 * MIB
    );
    f.engine.delete_bcache(&small.name).await.expect("delete");

    // The smallest cache a group can give (8 MiB) is formatted with
    // buckets small enough that it holds more than the 512 buckets Linux
    // needs to register a cache (make-bcache's default 512 KiB bucket gave
    // it 16, which make-bcache itself refused, and any cache under 256 MiB
    // a count the kernel refused); deleting it leaves nothing.
    for (name, group, size) in [
        ("tiny-data", &f.hdd, 64 * MIB),
        ("tiny-cache", &f.ssd, 8 * MIB),
    ] {
        f.engine
            .create_volume(CreateRequest {
                name: name.into(),
                group: group.clone(),
                size_bytes: size,
                exclusive: false,
            })
            .await
            .expect("volume");
    }
    let (tiny, _) = f
        .engine
        .ensure_bcache(BcacheRequest {
            name: "tiny".into(),
            backing_volume: "tiny-data".into(),
            cache_volume: "tiny-cache".into(),
            cache_mode: CacheMode::Writethrough,
            create: None,
        })
        .await
        .expect("an 8 MiB cache");
    let cache_dev = volume(&f.engine, "tiny-cache").await;
    let buckets = cache_buckets(cache_dev.device_path.as_deref().expect("dev"));
    assert!(
        buckets > 512,
        "the kernel registers no cache of {buckets} buckets"
    );
    f.engine.delete_bcache(&tiny.name).await.expect("delete");
    for v in ["tiny-data", "tiny-cache"] {
        f.engine.get_volume(v).await.expect("a given volume stays");
        f.engine.delete_volume(v).await.expect("delete");
    }
    no_leftovers(&f);

    // A backing volume held open (exclusively) is refused before formatting.
    let data = f
        .engine
        .create_volume(CreateRequest {
            name: "held".into(),
            group: f.hdd.clone(),
            size_bytes: 64 * MIB,
            exclusive: false,
        })
        .await
        .expect("backing");
    let cache = f
        .engine
        .create_volume(CreateRequest {
            name: "held-c".into(),
            group: f.ssd.clone(),
            size_bytes: 64 * MIB,
            exclusive: false,
        })
        .await
        .expect("cache");
    let holder = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_o_excl())
        .open(data.device_path.as_deref().expect("dev"))
        .expect("hold the device");
    let req = BcacheRequest {
        name: "busy".into(),
        backing_volume: "held".into(),
        cache_volume: "held-c".into(),
        cache_mode: CacheMode::Writethrough,
        create: None,
    };
    let err = f.engine.ensure_bcache(req.clone()).await.expect_err("busy");
    assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");
    assert!(err.to_string().contains("in use"), "{err}");
    drop(holder);
    assert_eq!(
        superblock_of(cache.device_path.as_deref().expect("dev")),
        None,
        "nothing formatted"
    );
    assert_eq!(
        superblock_of(data.device_path.as_deref().expect("dev")),
        None,
        "nothing formatted"
    );
    volume(&f.engine, "held").await;
    no_leftovers(&f);

    // Missing volumes, bad arguments.
    let err = f
        .engine
        .ensure_bcache(BcacheRequest {
            cache_volume: "nope".into(),
            ..req.clone()
        })
        .await
        .expect_err("missing cache");
    assert!(
        matches!(&err, Error::VolumeNotFound { name } if name == "nope"),
        "{err}"
    );
    let bad = [
        (
            BcacheRequest {
                name: "".into(),
                ..req.clone()
            },
            "name",
        ),
        (
            BcacheRequest {
                cache_volume: "held".into(),
                ..req.clone()
            },
            "cache_volume",
        ),
        (
            BcacheRequest {
                backing_volume: "a/b".into(),
                ..req.clone()
            },
            "backing_volume",
        ),
        (
            BcacheRequest {
                create: Some(OwnedVolumes {
                    backing_group: f.hdd.clone(),
                    size_bytes: MIB,
                    cache_group: f.ssd.clone(),
                    cache_ratio_percent: 0,
                }),
                ..req.clone()
            },
            "cache_ratio_percent",
        ),
        (
            BcacheRequest {
                create: Some(OwnedVolumes {
                    backing_group: "nope".into(),
                    size_bytes: MIB,
                    cache_group: f.ssd.clone(),
                    cache_ratio_percent: 5,
                }),
                name: "x".into(),
                backing_volume: "x-d".into(),
                cache_volume: "x-c".into(),
                ..req.clone()
            },
            "backing_device_group",
        ),
    ];
    for (r, field) in bad {
        let err = f
            .engine
            .ensure_bcache(r.clone())
            .await
            .expect_err("invalid");
        match &err {
            Error::InvalidArgument { field: got, .. } => assert_eq!(got, field, "{r:?}"),
            other => panic!("{r:?}: {other}"),
        }
    }
    no_leftovers(&f);

    // A kernel without the driver: refused before anything is made.
    let bare = tempfile::tempdir().expect("tempdir");
    let engine = f
        .restart_with(carina_node::engine::bcache::BcacheOptions {
            sysfs_root: bare.path().to_path_buf(),
            ..f.options.clone()
        })
        .await;
    let err = engine
        .ensure_bcache(f.request("nokernel", 64 * MIB, 50, CacheMode::Writethrough))
        .await
        .expect_err("no driver");
    assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");
    assert!(err.to_string().contains("fs/bcache"), "{err}");
    assert!(matches!(
        engine.get_volume("nokernel-data").await,
        Err(Error::VolumeNotFound { .. })
    ));
    no_leftovers(&f);
    // Without a state directory, bcache is refused too.
    let engine = f
        .restart_with(carina_node::engine::bcache::BcacheOptions {
            state_dir: None,
            ..f.options.clone()
        })
        .await;
    let err = engine
        .ensure_bcache(f.request("nostate", 64 * MIB, 50, CacheMode::Writethrough))
        .await
        .expect_err("no state dir");
    assert!(err.to_string().contains("--state-dir"), "{err}");
}

/// The buckets of the bcache cache device `dev`, from its superblock.
fn cache_buckets(dev: &std::path::Path) -> u64 {
    let out = std::process::Command::new("bcache-super-show")
        .arg(dev)
        .output()
        .expect("bcache-super-show runs");
    assert!(out.status.success(), "bcache-super-show {}", dev.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| -> u64 {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} in:\n{text}"))
    };
    field("dev.cache.cache_sectors") / field("dev.sectors_per_bucket")
}

const fn libc_o_excl() -> i32 {
    0o200
}
