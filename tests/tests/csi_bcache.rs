//! Tiered (bcache) volumes through the CSI Controller over the direct
//! control plane: one NodeStorage server with LVM groups `hdd` and `ssd`
//! on loop disks, the real `make-bcache`, and the kernel driver played by
//! the stand-in of `carina_tests::bcache` (the vm tier's csi-sanity run
//! does the same against the real driver). A bcache StorageClass makes
//! one `CreateBcache` on the node; a retry is the same device; another
//! size, mode or a plain volume of the name is `ALREADY_EXISTS`; growth
//! is refused; `DeleteVolume` removes the device and both volumes, and
//! again is still success.
//!
//! Needs root (loop devices, LVM).

use std::collections::HashMap;

use carina_controlplane::direct::DirectProvisioner;
use carina_controlplane::nodes::spec::{NodeList, NodeSpec};
use carina_csi::params::{
    BACKEND_GROUP, BCACHE_DATA_OFFSET, CACHE_GROUP, CACHE_POLICY, CACHE_RATIO, DISK_GROUP, FS_TYPE,
};
use carina_csi::strategy::Strategy;
use carina_csi::volume_id::VolumeId;
use carina_csi::{Topology, context};
use carina_proto::csi;
use carina_proto::nodestorage as pb;
use carina_tests::bcache::BcacheFixture;
use carina_tests::csi::{Csi, ServedController, create, delete, make};
use carina_tests::grpc::{Client as NodeClient, TestNode};
use tonic::Code;

const MIB: u64 = 1 << 20;
const NODE: &str = "tier-node";

/// A bcache class over the fixture's groups.
fn class(f: &BcacheFixture, ratio: &str, policy: &str) -> HashMap<String, String> {
    [
        (BACKEND_GROUP, f.hdd.as_str()),
        (CACHE_GROUP, f.ssd.as_str()),
        (CACHE_RATIO, ratio),
        (CACHE_POLICY, policy),
        (FS_TYPE, "ext4"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn tiered(name: &str, required: u64, params: HashMap<String, String>) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        parameters: params,
        ..create(name, required, "")
    }
}

/// The names of the node's volumes, sorted.
async fn volumes(node: &mut NodeClient) -> Vec<String> {
    let mut names: Vec<String> = node
        .list_l_vs(pb::ListLVsRequest::default())
        .await
        .expect("ListLVs")
        .into_inner()
        .volumes
        .into_iter()
        .map(|v| v.name)
        .collect();
    names.sort();
    names
}

async fn device(node: &mut NodeClient, name: &str) -> Option<pb::BcacheDevice> {
    match node
        .get_bcache(pb::GetBcacheRequest { name: name.into() })
        .await
    {
        Ok(r) => r.into_inner().device,
        Err(s) if s.code() == Code::NotFound => None,
        Err(s) => panic!("GetBcache {name}: {s}"),
    }
}

fn refused<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, text: &str) {
    let s = r.expect_err("must be refused");
    assert_eq!(s.code(), code, "{}", s.message());
    assert!(
        s.message().contains(text),
        "{:?} lacks {text:?}",
        s.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_plane_bcache_volumes() {
    let Some(f) = BcacheFixture::new(
        "direct_plane_bcache_volumes",
        "LVM",
        512 * MIB,
        "LVM",
        256 * MIB,
    )
    .await
    else {
        return;
    };
    let node = TestNode::start(f.engine.clone(), NODE)
        .await
        .expect("node server");
    let list = NodeList::new(vec![NodeSpec {
        name: NODE.into(),
        endpoint: node.endpoint(),
        topology: Topology::new(),
    }])
    .expect("node list");
    let provisioner = DirectProvisioner::new(
        list,
        node.client_tls("controller").expect("client certificate"),
        Strategy::Binpack,
    );
    let served = ServedController::start(provisioner, "carina-csi-bcache-")
        .await
        .expect("controller");
    let mut csi: Csi = served.csi.clone();
    let mut reader = node.client("reader").await.expect("reader");
    let before = volumes(&mut reader).await;

    // Made: one bcache device over a backing volume in hdd and a cache
    // volume in ssd, in the class's mode.
    let req = tiered("pvc-tier", 64 * MIB, class(&f, "50", "writeback"));
    let v = make(&mut csi, req.clone()).await.expect("CreateVolume");
    let id = VolumeId::parse(&v.volume_id).expect("volume id");
    assert_eq!(id.node, NODE);
    let d = device(&mut reader, &id.volume)
        .await
        .expect("the bcache device");
    assert!(d.running, "{d:?}");
    assert_eq!(d.cache_mode(), pb::CacheMode::Writeback);
    assert_eq!(
        (
            d.backing_device_group.as_str(),
            d.cache_device_group.as_str(),
            d.cache_ratio_percent
        ),
        (f.hdd.as_str(), f.ssd.as_str(), 50)
    );
    assert_eq!(v.volume_context[context::PATH], d.device_path);
    assert!(d.device_path.starts_with("/dev/bcache"), "{d:?}");
    assert_eq!(v.volume_context[context::GROUP], f.hdd);
    assert_eq!(v.volume_context[context::FS_TYPE], "ext4");
    let backing = reader
        .get_lv(pb::GetLvRequest {
            name: d.backing_volume.clone(),
        })
        .await
        .expect("backing volume")
        .into_inner()
        .volume
        .expect("volume");
    assert_eq!(backing.device_group, f.hdd);
    assert_eq!(
        v.capacity_bytes as u64,
        backing.size_bytes - BCACHE_DATA_OFFSET,
        "the volume is the bcache device: its backing volume less the data offset"
    );
    assert!(v.capacity_bytes as u64 >= 64 * MIB);
    let made = volumes(&mut reader).await;
    let mut expected = before.clone();
    expected.extend([d.backing_volume.clone(), d.cache_volume.clone()]);
    expected.sort();
    assert_eq!(made, expected, "exactly the backing and the cache volume");

    // A retry is the same device.
    let again = make(&mut csi, req.clone())
        .await
        .expect("CreateVolume again");
    assert_eq!(
        (again.volume_id.as_str(), again.capacity_bytes),
        (v.volume_id.as_str(), v.capacity_bytes)
    );
    let same = device(&mut reader, &id.volume).await.expect("device");
    assert_eq!(same.cache_set_uuid, d.cache_set_uuid, "not made again");

    // The name with another size, mode or ratio, or without a cache.
    let conflicts = [
        (
            "a larger size",
            tiered("pvc-tier", 256 * MIB, class(&f, "50", "writeback")),
        ),
        (
            "another mode",
            tiered("pvc-tier", 64 * MIB, class(&f, "50", "writethrough")),
        ),
        (
            "another ratio",
            tiered("pvc-tier", 64 * MIB, class(&f, "20", "writeback")),
        ),
        (
            "no cache",
            csi::CreateVolumeRequest {
                parameters: HashMap::from([(DISK_GROUP.to_string(), f.hdd.clone())]),
                ..create("pvc-tier", 64 * MIB, "")
            },
        ),
    ];
    for (what, r) in conflicts {
        let s = csi.create_volume(r).await.expect_err(what);
        assert_eq!(s.code(), Code::AlreadyExists, "{what}: {}", s.message());
    }
    // A plain volume's name for a bcache class.
    let plain = make(
        &mut csi,
        csi::CreateVolumeRequest {
            parameters: HashMap::from([(DISK_GROUP.to_string(), f.hdd.clone())]),
            ..create("pvc-plain", 16 * MIB, "")
        },
    )
    .await
    .expect("plain volume");
    let with_plain = volumes(&mut reader).await;
    refused(
        csi.create_volume(tiered("pvc-plain", 16 * MIB, class(&f, "50", "writeback")))
            .await,
        Code::AlreadyExists,
        "without a cache",
    );
    // Unusable classes name the parameter; nothing is made.
    let mut no_cache_group = class(&f, "50", "writeback");
    no_cache_group.insert(CACHE_GROUP.into(), "nvme".into());
    refused(
        csi.create_volume(tiered("pvc-bad", 16 * MIB, no_cache_group))
            .await,
        Code::InvalidArgument,
        CACHE_GROUP,
    );
    refused(
        csi.create_volume(tiered("pvc-big", 4096 * MIB, class(&f, "50", "writeback")))
            .await,
        Code::ResourceExhausted,
        "room",
    );
    assert_eq!(volumes(&mut reader).await, with_plain, "nothing half-made");

    // Listed once, as the device; its volumes are not volumes of their own.
    let listed: Vec<(String, i64)> = csi
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .expect("ListVolumes")
        .into_inner()
        .entries
        .into_iter()
        .filter_map(|e| e.volume)
        .map(|v| (v.volume_id, v.capacity_bytes))
        .collect();
    assert!(
        listed.contains(&(v.volume_id.clone(), v.capacity_bytes)),
        "{listed:?}"
    );
    assert!(
        !listed.iter().any(|(id, _)| id.contains('+')),
        "member volumes listed: {listed:?}"
    );
    assert_eq!(listed.len(), 2, "{listed:?}");

    // Growth is refused; a size it has already is its size.
    let expand = |bytes: u64| csi::ControllerExpandVolumeRequest {
        volume_id: v.volume_id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    refused(
        csi.controller_expand_volume(expand(128 * MIB)).await,
        Code::FailedPrecondition,
        "cannot grow",
    );
    let kept = csi
        .controller_expand_volume(expand(32 * MIB))
        .await
        .expect("a size it has")
        .into_inner();
    assert_eq!(kept.capacity_bytes, v.capacity_bytes);
    // Nor is it copied.
    refused(
        csi.create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: v.volume_id.clone(),
            name: "snap-tier".into(),
            ..Default::default()
        })
        .await,
        Code::InvalidArgument,
        "bcache",
    );

    // Deleted with both volumes; again is success.
    delete(&mut csi, &v.volume_id).await.expect("DeleteVolume");
    assert!(device(&mut reader, &id.volume).await.is_none());
    delete(&mut csi, &v.volume_id)
        .await
        .expect("DeleteVolume again");
    delete(&mut csi, &plain.volume_id)
        .await
        .expect("DeleteVolume plain");
    assert_eq!(volumes(&mut reader).await, before, "everything removed");
    refused(
        csi.controller_expand_volume(expand(128 * MIB)).await,
        Code::NotFound,
        "does not exist",
    );
}
