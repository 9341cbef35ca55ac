//! The bcache RPCs of NodeStorage over mutual TLS, on real LVM groups on
//! loop disks with the real `make-bcache`, and the kernel driver played by
//! the stand-in of `carina_tests::bcache`: codes, field names in
//! messages, idempotent retries, roles.

use std::time::Duration;

use carina_proto::nodestorage as pb;
use carina_tests::bcache::BcacheFixture;
use carina_tests::grpc::TestNode;
use tonic::Code;

const MIB: u64 = 1 << 20;

fn create(
    f: &BcacheFixture,
    name: &str,
    ratio: u32,
    mode: pb::CacheMode,
) -> pb::CreateBcacheRequest {
    pb::CreateBcacheRequest {
        name: name.into(),
        backing_volume: format!("{name}-data"),
        cache_volume: format!("{name}-cache"),
        cache_mode: mode.into(),
        backing_device_group: f.hdd.clone(),
        size_bytes: 200 * MIB,
        cache_device_group: f.ssd.clone(),
        cache_ratio_percent: ratio,
    }
}

fn assert_status(r: Result<impl std::fmt::Debug, tonic::Status>, code: Code, text: &str) {
    let s = r.expect_err("must fail");
    assert_eq!(s.code(), code, "{}", s.message());
    assert!(
        s.message().contains(text),
        "{:?} lacks {text:?}",
        s.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bcache_rpcs() {
    let Some(f) = BcacheFixture::new("bcache_rpcs", "LVM", 512 * MIB, "LVM", 256 * MIB).await
    else {
        return;
    };
    if f.kernel.is_none() {
        return; // the real-driver run is the vm tier's vm_storage
    }
    let node = TestNode::start(f.engine.clone(), "bcache-node")
        .await
        .expect("server");
    let mut c = node.client("controller").await.expect("client");
    let mut reader = node.client("reader").await.expect("reader");

    let req = create(&f, "web", 50, pb::CacheMode::Writeback);
    let r = tokio::time::timeout(Duration::from_secs(60), c.create_bcache(req.clone()))
        .await
        .expect("no hang")
        .expect("created")
        .into_inner();
    assert!(r.created);
    let d = r.device.expect("device");
    assert_eq!((d.state.as_str(), d.running), ("clean", true), "{d:?}");
    assert_eq!(d.cache_mode(), pb::CacheMode::Writeback);
    assert_eq!(d.kernel_cache_mode(), pb::CacheMode::Writeback);
    assert!(d.device_path.starts_with("/dev/bcache"), "{d:?}");
    assert_eq!(
        (
            d.major,
            d.backing_device_group.as_str(),
            d.cache_ratio_percent
        ),
        (251, f.hdd.as_str(), 50)
    );
    assert!(
        !d.cache_set_uuid.is_empty() && !d.backing_uuid.is_empty(),
        "{d:?}"
    );
    let cache = c
        .get_lv(pb::GetLvRequest {
            name: "web-cache".into(),
        })
        .await
        .expect("cache volume")
        .into_inner()
        .volume
        .expect("volume");
    assert_eq!(
        (cache.device_group.as_str(), cache.size_bytes),
        (f.ssd.as_str(), 100 * MIB)
    );

    // A retry is the same device.
    let again = c
        .create_bcache(req.clone())
        .await
        .expect("again")
        .into_inner();
    assert!(!again.created);
    assert_eq!(
        again.device.expect("device").cache_set_uuid,
        d.cache_set_uuid
    );
    assert_status(
        c.create_bcache(pb::CreateBcacheRequest {
            cache_ratio_percent: 60,
            ..req.clone()
        })
        .await,
        Code::AlreadyExists,
        "\"web\"",
    );

    // Malformed requests name the field.
    let bad = [
        (
            pb::CreateBcacheRequest {
                name: String::new(),
                ..req.clone()
            },
            "name",
        ),
        (
            pb::CreateBcacheRequest {
                backing_volume: "-x".into(),
                ..req.clone()
            },
            "backing_volume",
        ),
        (
            pb::CreateBcacheRequest {
                cache_ratio_percent: 101,
                ..req.clone()
            },
            "cache_ratio_percent",
        ),
        (
            pb::CreateBcacheRequest {
                size_bytes: 0,
                ..req.clone()
            },
            "size_bytes",
        ),
        (
            pb::CreateBcacheRequest {
                cache_device_group: String::new(),
                ..req.clone()
            },
            "cache_device_group",
        ),
        (
            pb::CreateBcacheRequest {
                cache_mode: 9,
                ..req.clone()
            },
            "cache_mode",
        ),
        (
            pb::CreateBcacheRequest {
                backing_device_group: String::new(),
                ..req.clone()
            },
            "cache_device_group: only with backing_device_group",
        ),
        (
            pb::CreateBcacheRequest {
                name: "other".into(),
                backing_device_group: "nope".into(),
                backing_volume: "o-d".into(),
                cache_volume: "o-c".into(),
                ..req.clone()
            },
            "backing_device_group",
        ),
    ];
    for (r, field) in bad {
        assert_status(c.create_bcache(r).await, Code::InvalidArgument, field);
    }
    assert_status(
        c.set_cache_mode(pb::SetCacheModeRequest {
            name: "web".into(),
            cache_mode: 0,
        })
        .await,
        Code::InvalidArgument,
        "cache_mode",
    );

    let d = c
        .set_cache_mode(pb::SetCacheModeRequest {
            name: "web".into(),
            cache_mode: pb::CacheMode::Writearound.into(),
        })
        .await
        .expect("mode")
        .into_inner()
        .device
        .expect("device");
    assert_eq!(
        (d.cache_mode(), d.kernel_cache_mode()),
        (pb::CacheMode::Writearound, pb::CacheMode::Writearound)
    );
    let got = reader
        .get_bcache(pb::GetBcacheRequest { name: "web".into() })
        .await
        .expect("readers may get")
        .into_inner()
        .device
        .expect("device");
    assert_eq!(got.cache_mode(), pb::CacheMode::Writearound);
    assert_status(
        reader
            .delete_bcache(pb::DeleteBcacheRequest { name: "web".into() })
            .await,
        Code::PermissionDenied,
        "",
    );
    assert_status(
        c.delete_lv(pb::DeleteLvRequest {
            name: "web-data".into(),
        })
        .await,
        Code::FailedPrecondition,
        "bcache device \"web\"",
    );
    assert_status(
        c.get_bcache(pb::GetBcacheRequest {
            name: "nope".into(),
        })
        .await,
        Code::NotFound,
        "\"nope\"",
    );

    // Not enough room for the cache: nothing is left behind.
    assert_status(
        c.create_bcache(pb::CreateBcacheRequest {
            size_bytes: 300 * MIB,
            ..create(&f, "huge", 100, pb::CacheMode::Writethrough)
        })
        .await,
        Code::ResourceExhausted,
        "",
    );
    assert_status(
        c.get_lv(pb::GetLvRequest {
            name: "huge-data".into(),
        })
        .await,
        Code::NotFound,
        "huge-data",
    );
    assert_status(
        c.get_bcache(pb::GetBcacheRequest {
            name: "huge".into(),
        })
        .await,
        Code::NotFound,
        "huge",
    );

    c.delete_bcache(pb::DeleteBcacheRequest { name: "web".into() })
        .await
        .expect("deleted");
    assert_status(
        c.delete_bcache(pb::DeleteBcacheRequest { name: "web".into() })
            .await,
        Code::NotFound,
        "\"web\"",
    );
    assert_status(
        c.get_lv(pb::GetLvRequest {
            name: "web-data".into(),
        })
        .await,
        Code::NotFound,
        "web-data",
    );
    node.stop().await.expect("stop");

    // A node whose kernel has no bcache driver.
    let bare = tempfile::tempdir().expect("tempdir");
    let engine = f
        .restart_with(carina_node::engine::bcache::BcacheOptions {
            sysfs_root: bare.path().to_path_buf(),
            ..f.options.clone()
        })
        .await;
    let node = TestNode::start(engine, "bare-node").await.expect("server");
    let mut c = node.client("controller").await.expect("client");
    assert_status(
        c.create_bcache(create(&f, "nok", 50, pb::CacheMode::Writethrough))
            .await,
        Code::FailedPrecondition,
        "modprobe bcache",
    );
    assert_status(
        c.get_lv(pb::GetLvRequest {
            name: "nok-data".into(),
        })
        .await,
        Code::NotFound,
        "nok-data",
    );
    node.stop().await.expect("stop");
}
