//! Tiered volumes through the bridge: a `LogicVolume` with `spec.cache`
//! against a real kube-apiserver, carried out on an in-process NodeStorage
//! server whose engine has LVM groups on loop disks (`hdd` for backing
//! volumes, `ssd` for caches), the real `make-bcache`, and the kernel's
//! bcache driver played by the stand-in of `carina_tests::bcache` (this
//! proves the control plane's side and the engine's sysfs sequence, not a
//! kernel's `/dev/bcacheN`).
//!
//! It proves: the bridge asks `CreateBcache` with both groups, the ratio
//! and the mode; the status carries the bcache device (path, numbers) and
//! the backing size; the CSI node side finds the bcache device under the
//! volume's id, not its backing volume; growth is refused for the
//! generation with `INVALID_ARGUMENT` naming `spec.size`, and taking the
//! size back settles it; the API server refuses a ratio outside 1..100;
//! deletion goes through `DeleteBcache` and leaves neither device nor
//! volumes. Then the same through the CSI Controller over the Kubernetes
//! control plane: a bcache StorageClass's CreateVolume writes the
//! `LogicVolume` with its cache and answers the bcache device's size and
//! path, a repeat is idempotent and another ratio `ALREADY_EXISTS`,
//! ControllerExpandVolume is `FAILED_PRECONDITION`, DeleteVolume removes
//! it all.
//!
//! Needs etcd and kube-apiserver from `tests/tools/build.sh etcd kube`,
//! root, loop devices and `make-bcache`.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::{Context, Result};
use carina_api::quantity::quantity_bytes;
use carina_api::{
    LOGICVOLUME_FINALIZER, LogicVolume, LogicVolumeCache, LogicVolumeSpec,
    NODE_ENDPOINT_ANNOTATION, NodeStorageResource,
};
use carina_controlplane::kube::bridge_side::{self, BridgeConfig};
use carina_controlplane::kube::provisioner::{KubeProvisioner, KubeProvisionerConfig};
use carina_controlplane::kube::retry::Backoff;
use carina_csi::params::BCACHE_DATA_OFFSET;
use carina_csi::strategy::Strategy;
use carina_csi::volume_id::VolumeId;
use carina_csi::{LocalKind, LocalVolumes};
use carina_node::csi_local::EngineVolumes;
use carina_node::engine::bcache::CacheMode;
use carina_proto::csi;
use carina_tests::bcache::BcacheFixture;
use carina_tests::csi::{ServedController, delete, make};
use carina_tests::grpc::TestNode;
use carina_tests::kube::{KubeCluster, gone, wait_for};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use tokio::sync::oneshot;
use tonic::Code;

const NODE: &str = "node-tiered";
const MIB: u64 = 1 << 20;
const DEADLINE: Duration = Duration::from_secs(60);

fn tiered(name: &str, hdd: &str, ssd: &str, size: &str, ratio: u32) -> LogicVolume {
    let mut lv = LogicVolume::new(
        name,
        LogicVolumeSpec {
            source: None,
            node_name: NODE.to_string(),
            size: Quantity(size.to_string()),
            device_group: hdd.to_string(),
            pvc: format!("claim-{name}"),
            name_space: "default".to_string(),
            cache: Some(LogicVolumeCache {
                device_group: ssd.to_string(),
                ratio,
                policy: "writeback".to_string(),
            }),
        },
    );
    lv.metadata.finalizers = Some(vec![LOGICVOLUME_FINALIZER.to_string()]);
    lv
}

/// The status once the bridge answered this generation.
async fn answered(api: &Api<LogicVolume>, name: &str) -> Result<LogicVolume> {
    wait_for(api, name, "answer", DEADLINE, |lv| {
        lv.status.as_ref().is_some_and(|s| {
            s.observed_generation.is_some()
                && s.observed_generation == lv.metadata.generation
                && (s.code.is_some_and(|c| c != 0) || s.volume_id.is_some())
        })
    })
    .await
}

async fn resize(api: &Api<LogicVolume>, name: &str, size: &str) -> Result<LogicVolume> {
    let patch = serde_json::json!({"spec": {"size": size}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("patch {name} to {size}"))?;
    answered(api, name).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_logic_volumes_through_the_bridge() -> Result<()> {
    // The stand-in also where `CARINA_TEST_BCACHE_KERNEL=1` asks for the
    // real driver: the subject here is the control plane's side (the real
    // driver's run is the vm tier's vm_storage), and with the real driver
    // this test used to return at once, reported as passed.
    let Some(f) =
        BcacheFixture::with_stand_in("kube_bcache", "LVM", 512 * MIB, "LVM", 256 * MIB).await
    else {
        return Ok(());
    };
    assert!(f.kernel.is_some(), "the engine writes to the stand-in");
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();
    let node = TestNode::start(f.engine.clone(), NODE).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &Node {
                metadata: ObjectMeta {
                    name: Some(NODE.to_string()),
                    annotations: Some(BTreeMap::from([(
                        NODE_ENDPOINT_ANNOTATION.to_string(),
                        node.endpoint(),
                    )])),
                    ..ObjectMeta::default()
                },
                ..Node::default()
            },
        )
        .await?;
    let mut config = BridgeConfig::new(node.client_tls("controller")?);
    config.retry = Backoff {
        min: Duration::from_millis(100),
        max: Duration::from_secs(1),
    };
    config.slow_retry = Duration::from_secs(5);
    config.call_timeout = Duration::from_secs(30);
    config.instance = Some("kube-bcache-test".into());
    let (stop, stopped) = oneshot::channel::<()>();
    let bridge = tokio::spawn(bridge_side::run(client.clone(), config, async {
        let _ = stopped.await;
    }));
    let lvs: Api<LogicVolume> = Api::all(client.clone());

    // The API server holds the ratio to a percentage.
    let refused = lvs
        .create(
            &PostParams::default(),
            &tiered("bad-ratio", &f.hdd, &f.ssd, "64Mi", 0),
        )
        .await
        .expect_err("ratio 0");
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 422 && s.message.contains("ratio")),
        "{refused:?}"
    );

    // 100 MiB in 4 MiB extents, and a 50% cache.
    let name = "pvc-tiered";
    let size = 100 * MIB;
    lvs.create(
        &PostParams::default(),
        &tiered(name, &f.hdd, &f.ssd, &size.to_string(), 50),
    )
    .await?;
    let made = answered(&lvs, name).await?;
    let status = made.status.clone().context("status")?;
    assert_eq!(status.code, Some(0), "{status:?}");
    assert_eq!(
        status.volume_id.as_deref(),
        Some(VolumeId::new(name, NODE).encode().as_str())
    );
    assert_eq!(
        quantity_bytes(status.current_size.as_ref().context("currentSize")?)?,
        size
    );
    let device = f.engine.get_bcache(name).await?;
    assert_eq!(device.backing_volume, LogicVolumeSpec::backing_volume(name));
    assert_eq!(device.cache_volume, LogicVolumeSpec::cache_volume(name));
    assert_eq!(device.cache_mode, CacheMode::Writeback);
    let owned = device.owned.clone().context("volumes made with it")?;
    assert_eq!(
        (owned.backing_group.as_str(), owned.cache_group.as_str()),
        (f.hdd.as_str(), f.ssd.as_str())
    );
    assert_eq!((owned.size_bytes, owned.cache_ratio_percent), (size, 50));
    let backing = f.engine.get_volume(&device.backing_volume).await?;
    let cache = f.engine.get_volume(&device.cache_volume).await?;
    assert_eq!(
        (backing.group.as_str(), backing.size_bytes),
        (f.hdd.as_str(), size)
    );
    // Half of 100 MiB is below make-bcache's smallest cache, 64 MiB.
    assert_eq!(
        (cache.group.as_str(), cache.size_bytes),
        (f.ssd.as_str(), 64 * MIB)
    );
    let path = device.device_path.clone().context("a bcache device")?;
    assert_eq!(status.path.as_deref(), path.to_str());
    assert!(status.device_major.is_some() && status.device_minor.is_some());
    let events = f.standin().events();
    assert!(
        events.iter().any(|e| e.starts_with("attach ")),
        "{events:?}"
    );
    // make-bcache wrote the mode into the superblock; the driver shows it.
    let kernel = device.kernel.as_ref().context("registered")?;
    assert_eq!(kernel.cache_mode, Some(CacheMode::Writeback));
    assert!(kernel.running && kernel.cache_set.is_some(), "{kernel:?}");

    // The CSI node side stages the bcache device, not the backing volume.
    let local = EngineVolumes::new(f.engine.clone(), NODE);
    let id = VolumeId::new(name, NODE).encode();
    let found = local.find(&id).await?.context("found")?;
    assert_eq!(found.kind, LocalKind::Block { device: path });
    assert_eq!(found.size_bytes, size - BCACHE_DATA_OFFSET);

    // Growth is refused for the generation; the old size settles it.
    let grown = resize(&lvs, name, &(2 * size).to_string()).await?;
    let s = grown.status.clone().context("status")?;
    assert_eq!(s.code, Some(Code::InvalidArgument as i32), "{s:?}");
    let message = s.message.unwrap_or_default();
    assert!(
        message.starts_with("spec.size: ") && message.contains("cannot grow"),
        "{message}"
    );
    assert_eq!(
        f.engine
            .get_volume(&device.backing_volume)
            .await?
            .size_bytes,
        size
    );
    let back = resize(&lvs, name, &size.to_string()).await?;
    wait_for(&lvs, name, "settled", DEADLINE, |lv| {
        lv.status
            .as_ref()
            .is_some_and(|s| s.code == Some(0) && s.observed_generation == lv.metadata.generation)
    })
    .await
    .with_context(|| format!("after {back:?}"))?;

    // Deletion: DeleteBcache, and the two volumes go with the device.
    lvs.delete(name, &Default::default()).await?;
    gone(&lvs, name, DEADLINE).await?;
    let err = f.engine.get_bcache(name).await.expect_err("deleted");
    assert_eq!(tonic::Status::from(err).code(), Code::NotFound);
    for v in [&device.backing_volume, &device.cache_volume] {
        let err = f.engine.get_volume(v).await.expect_err("deleted");
        assert_eq!(tonic::Status::from(err).code(), Code::NotFound, "{v}");
    }

    // The same through the CSI Controller over the Kubernetes control
    // plane: a bcache StorageClass, placed where both groups have room.
    let nsrs: Api<NodeStorageResource> = Api::all(client.clone());
    wait_for(&nsrs, NODE, "published groups", DEADLINE, |n| {
        n.status.as_ref().is_some_and(|s| s.groups.len() == 2)
    })
    .await?;
    let provisioner = KubeProvisioner::new(
        client.clone(),
        KubeProvisionerConfig {
            strategy: Strategy::default(),
            wait_timeout: DEADLINE,
        },
    );
    let served = ServedController::start(provisioner, "carina-kube-bcache-").await?;
    let mut csi = served.csi.clone();
    let params: HashMap<String, String> = [
        ("carina.storage.io/backend-disk-group-name", f.hdd.as_str()),
        ("carina.storage.io/cache-disk-group-name", f.ssd.as_str()),
        ("carina.storage.io/cache-disk-ratio", "40"),
        ("carina.storage.io/cache-policy", "writearound"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let capacity = csi
        .get_capacity(csi::GetCapacityRequest {
            parameters: params.clone(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert!(capacity.available_capacity > 0, "{capacity:?}");
    let mut req = carina_tests::csi::create("pvc-csi-tiered", 150 * MIB, "xfs");
    req.parameters = params;
    let volume = make(&mut csi, req.clone()).await?;
    // 150 MiB usable: 152 MiB of backing (4 MiB extents) less the offset.
    assert_eq!(
        volume.capacity_bytes,
        (152 * MIB - BCACHE_DATA_OFFSET) as i64
    );
    let lv = lvs.get("pvc-csi-tiered").await?;
    assert_eq!(lv.spec.device_group, f.hdd);
    assert_eq!(
        lv.spec.cache,
        Some(LogicVolumeCache {
            device_group: f.ssd.clone(),
            ratio: 40,
            policy: "writearound".to_string(),
        })
    );
    let device = f.engine.get_bcache("pvc-csi-tiered").await?;
    assert_eq!(device.cache_mode, CacheMode::Writearound);
    assert_eq!(
        volume
            .volume_context
            .get(carina_csi::context::PATH)
            .map(String::as_str),
        device.device_path.as_deref().and_then(|p| p.to_str())
    );
    // Asked again: the same volume; with another ratio: ALREADY_EXISTS.
    assert_eq!(
        make(&mut csi, req.clone()).await?.volume_id,
        volume.volume_id
    );
    let mut other = req.clone();
    other
        .parameters
        .insert("carina.storage.io/cache-disk-ratio".into(), "20".into());
    let e = csi.create_volume(other).await.expect_err("another ratio");
    assert_eq!(e.code(), Code::AlreadyExists, "{}", e.message());
    let e = csi
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: volume.volume_id.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: (300 * MIB) as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .expect_err("no growth");
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(e.message().contains("cannot grow"), "{}", e.message());
    delete(&mut csi, &volume.volume_id).await?;
    assert_eq!(
        tonic::Status::from(
            f.engine
                .get_bcache("pvc-csi-tiered")
                .await
                .expect_err("gone")
        )
        .code(),
        Code::NotFound
    );

    let _ = stop.send(());
    tokio::time::timeout(DEADLINE, bridge)
        .await
        .context("the bridge did not stop")???;
    Ok(())
}
