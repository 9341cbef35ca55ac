//! The Controller service over an in-memory provisioner: request
//! validation, capacity, paging tokens, the busy-volume lock, snapshots,
//! conditions, validation and expansion.

proptest::proptest! {
    /// A token we issue reads back as its volume id; any other text is
    /// refused or read, never a panic.
    #[test]
    fn page_tokens_round_trip_and_take_anything(id in ".{1,80}", junk in carina_sys::testkit::noisy_text()) {
        proptest::prop_assert_eq!(super::decode_token(&super::encode_token(&id)).ok(), Some(id));
        let _ = super::decode_token(&junk);
    }
}
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex as StdMutex;

use async_trait::async_trait;
use carina_proto::csi::volume_capability::AccessType;
use carina_proto::csi::volume_capability::access_mode::Mode;
use tokio::sync::Notify;
use tonic::Code;

use crate::capability::testing::{block, cap, mount};
use crate::params::FsType;

use super::*;
use crate::types::{
    CapacityInfo, CapacityRange, ContentSource, ProvisionedSnapshot, Topology, VolumeHealth,
    VolumeRequest,
};
use crate::volume_id::VolumeId;
use crate::{TOPOLOGY_KEY, context, sizes};

const GIB: i64 = 1 << 30;

/// Volumes in memory on one node `n`; `gate`, when set, holds every
/// create until notified.
#[derive(Default)]
struct Fake {
    volumes: StdMutex<BTreeMap<String, ProvisionedVolume>>,
    gate: Option<Arc<Notify>>,
    entered: Arc<Notify>,
    /// Volume ids whose node calls them abnormal, with the message.
    sick: StdMutex<BTreeMap<String, String>>,
    /// The group names the nodes publish ([`Provisioner::group_names`]).
    group_names: BTreeSet<String>,
    /// The group each create and capacity call was asked for.
    groups_asked: StdMutex<Vec<Option<String>>>,
}

fn fake_volume(local: &str, size: u64) -> ProvisionedVolume {
    ProvisionedVolume {
        volume_id: VolumeId::new(local, "n").encode(),
        capacity_bytes: size,
        node: "n".into(),
        group: "g".into(),
        context: BTreeMap::from([(context::POLICY.to_string(), "HOST".to_string())]),
    }
}

#[async_trait]
impl Provisioner for Fake {
    async fn create_volume(&self, req: &VolumeRequest) -> Result<ProvisionedVolume, CsiError> {
        self.entered.notify_one();
        self.groups_asked
            .lock()
            .expect("not poisoned")
            .push(req.parameters.group.clone());
        if let Some(gate) = &self.gate {
            gate.notified().await;
        }
        let size = sizes::allocation(&req.capacity, 4096)?;
        let v = fake_volume(&req.local_name, size);
        self.volumes
            .lock()
            .expect("not poisoned")
            .insert(v.volume_id.clone(), v.clone());
        Ok(v)
    }

    async fn delete_volume(&self, volume_id: &str) -> Result<(), CsiError> {
        self.volumes.lock().expect("not poisoned").remove(volume_id);
        Ok(())
    }

    async fn expand_volume(&self, volume_id: &str, range: &CapacityRange) -> Result<u64, CsiError> {
        let mut vols = self.volumes.lock().expect("not poisoned");
        let v = vols
            .get_mut(volume_id)
            .ok_or_else(|| CsiError::NotFound(volume_id.into()))?;
        v.capacity_bytes = v.capacity_bytes.max(range.required_bytes);
        Ok(v.capacity_bytes)
    }

    async fn get_volume(&self, volume_id: &str) -> Result<Option<ProvisionedVolume>, CsiError> {
        Ok(self
            .volumes
            .lock()
            .expect("not poisoned")
            .get(volume_id)
            .cloned())
    }

    async fn list_volumes(&self) -> Result<Vec<ProvisionedVolume>, CsiError> {
        Ok(self
            .volumes
            .lock()
            .expect("not poisoned")
            .values()
            .cloned()
            .collect())
    }

    async fn volume_health(&self, volumes: &[ProvisionedVolume]) -> Vec<VolumeHealth> {
        let sick = self.sick.lock().expect("not poisoned");
        volumes
            .iter()
            .map(|v| match sick.get(&v.volume_id) {
                Some(m) => VolumeHealth::abnormal(m.clone()),
                None => VolumeHealth::default(),
            })
            .collect()
    }

    async fn group_names(&self) -> Result<BTreeSet<String>, CsiError> {
        Ok(self.group_names.clone())
    }

    async fn capacity(
        &self,
        _: Option<&Topology>,
        group: Option<&str>,
    ) -> Result<CapacityInfo, CsiError> {
        self.groups_asked
            .lock()
            .expect("not poisoned")
            .push(group.map(str::to_string));
        Ok(CapacityInfo {
            available_bytes: 100,
            maximum_volume_size: 60,
        })
    }
}

fn create_req(name: &str) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![cap(Mode::SingleNodeWriter, mount(""))],
        capacity_range: Some(csi::CapacityRange {
            required_bytes: GIB,
            limit_bytes: 0,
        }),
        ..Default::default()
    }
}

#[test]
fn create_request_validation() {
    let ok = volume_request(&create_req("pvc-1")).expect("valid");
    assert_eq!(ok.local_name, "pvc-1");
    assert!(!ok.block);
    let mut r = create_req("pvc-1");
    r.volume_capabilities = vec![cap(Mode::SingleNodeWriter, mount("xfs"))];
    let v = volume_request(&r).expect("valid");
    assert_eq!(
        v.parameters.fs_type,
        Some(FsType::Xfs),
        "fs type from the capability"
    );
    r.parameters = HashMap::from([(crate::params::FS_TYPE.to_string(), "ext4".to_string())]);
    assert!(matches!(
        volume_request(&r),
        Err(CsiError::InvalidArgument { .. })
    ));

    let mut r = create_req("pvc-1");
    r.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: "s".into(),
            },
        )),
    });
    assert_eq!(
        volume_request(&r).expect("valid").source,
        Some(ContentSource::Snapshot("s".into()))
    );
    r.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: String::new(),
            },
        )),
    });
    match volume_request(&r) {
        Err(CsiError::InvalidArgument { field, .. }) => {
            assert_eq!(field, "volume_content_source.volume.volume_id")
        }
        other => panic!("{other:?}"),
    }
    r.volume_content_source = Some(csi::VolumeContentSource { r#type: None });
    assert!(matches!(
        volume_request(&r),
        Err(CsiError::InvalidArgument { .. })
    ));

    let mut r = create_req("pvc-1");
    r.parameters = HashMap::from(
        [
            (crate::params::BACKEND_GROUP, "hdd"),
            (crate::params::CACHE_GROUP, "ssd"),
            (crate::params::CACHE_RATIO, "10"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string())),
    );
    let v = volume_request(&r).expect("a tiered volume");
    let b = v.parameters.bcache.expect("bcache parameters");
    assert_eq!((b.backend_group.as_str(), b.cache_ratio), ("hdd", 10));

    let mut r = create_req("pvc-1");
    r.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![csi::Topology {
            segments: HashMap::from([(TOPOLOGY_KEY.to_string(), "n".to_string())]),
        }],
        preferred: vec![],
    });
    let v = volume_request(&r).expect("valid");
    assert_eq!(v.accessibility.requisite[0][TOPOLOGY_KEY], "n");
    // A node no Kubernetes node can be: the volume would wait forever.
    r.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![],
        preferred: vec![csi::Topology {
            segments: HashMap::from([(TOPOLOGY_KEY.to_string(), "N\n".to_string())]),
        }],
    });
    match volume_request(&r) {
        Err(CsiError::InvalidArgument { field, .. }) => assert_eq!(
            field,
            format!("accessibility_requirements.preferred[0].segments[{TOPOLOGY_KEY:?}]")
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn tiered_capacity_is_the_smaller_of_backing_and_cache() {
    let info = |available_bytes, maximum_volume_size| CapacityInfo {
        available_bytes,
        maximum_volume_size,
    };
    let offset = crate::params::BCACHE_DATA_OFFSET;
    let mib = 1u64 << 20;
    // 25%: 100 MiB of cache backs 400 MiB.
    let t = tiered_capacity(info(1000 * mib, 600 * mib), info(100 * mib, 50 * mib), 25);
    assert_eq!(t, info(400 * mib - offset, 200 * mib - offset));
    let t = tiered_capacity(info(100 * mib, 100 * mib), info(1000 * mib, 1000 * mib), 25);
    assert_eq!(t, info(100 * mib - offset, 100 * mib - offset));
    assert_eq!(tiered_capacity(info(0, 0), info(mib, mib), 10), info(0, 0));
}

#[test]
fn tokens() {
    for id in ["a@n", "pvc-1@node-b.example", "ü@n"] {
        assert_eq!(decode_token(&encode_token(id)).expect("round trip"), id);
    }
    for bad in [
        "invalid-token",
        "after.",
        "after.0",
        "after.zz",
        "after.ff",
        "61406e",
    ] {
        assert!(
            matches!(decode_token(bad), Err(CsiError::Aborted(_))),
            "{bad}"
        );
    }
}

#[tokio::test]
async fn second_operation_on_a_busy_volume_is_aborted() {
    let gate = Arc::new(Notify::new());
    let fake = Arc::new(Fake {
        gate: Some(gate.clone()),
        ..Default::default()
    });
    let svc = ControllerService::new(fake.clone());
    let first = tokio::spawn({
        let svc = svc.clone();
        async move { svc.create(create_req("pvc-1")).await }
    });
    fake.entered.notified().await;
    let again = svc.create(create_req("pvc-1")).await.expect_err("busy");
    assert_eq!(again.code(), Code::Aborted);
    let delete = svc
        .delete(csi::DeleteVolumeRequest {
            volume_id: "pvc-1@n".into(),
            ..Default::default()
        })
        .await
        .expect_err("busy");
    assert_eq!(delete.code(), Code::Aborted);
    gate.notify_one();
    first.await.expect("joined").expect("created");
    // Released: the next operation runs.
    svc.delete(csi::DeleteVolumeRequest {
        volume_id: "pvc-1@n".into(),
        ..Default::default()
    })
    .await
    .expect("deleted");
}

#[tokio::test]
async fn without_copies_no_snapshot_capability_and_no_content_source() {
    let svc = ControllerService::new(Arc::new(Fake::default()));
    let caps = Controller::controller_get_capabilities(
        &svc,
        Request::new(csi::ControllerGetCapabilitiesRequest {}),
    )
    .await
    .expect("capabilities")
    .into_inner()
    .capabilities;
    assert_eq!(caps.len(), CAPABILITIES.len());
    let err = svc
        .create_snapshot(csi::CreateSnapshotRequest {
            name: "s".into(),
            source_volume_id: "pvc-1@n".into(),
            ..Default::default()
        })
        .await
        .expect_err("not offered");
    assert_eq!(err.code(), Code::Unimplemented);
    let mut req = create_req("pvc-1");
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: "pvc-0@n".into(),
            },
        )),
    });
    let err = svc.create(req).await.expect_err("no clones");
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[test]
fn snapshot_requests_name_their_fields_and_ids_are_apart_from_volumes() {
    let field = |req: csi::CreateSnapshotRequest| match snapshot_request(&req) {
        Err(CsiError::InvalidArgument { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        field(csi::CreateSnapshotRequest {
            source_volume_id: "v@n".into(),
            ..Default::default()
        }),
        "name"
    );
    assert_eq!(
        field(csi::CreateSnapshotRequest {
            name: "s".into(),
            ..Default::default()
        }),
        "source_volume_id"
    );
    let ok = snapshot_request(&csi::CreateSnapshotRequest {
        name: "pvc-1".into(),
        source_volume_id: "pvc-1@n".into(),
        ..Default::default()
    })
    .expect("valid");
    // Even a name a volume could keep is hashed: never a volume's name.
    assert_ne!(ok.local_name, "pvc-1");
    let id = format!("{}@n", ok.local_name);
    assert_eq!(
        VolumeId::parse(&id).expect_err("a snapshot id").code(),
        Code::NotFound
    );
    let wire = wire_snapshot(&ProvisionedSnapshot {
        snapshot_id: id.clone(),
        source_volume_id: "pvc-1@n".into(),
        size_bytes: 4096,
        created_unix_nanos: 1_500_000_000,
        ready: true,
    });
    let t = wire.creation_time.expect("time");
    assert_eq!((t.seconds, t.nanos), (1, 500_000_000));
}

#[tokio::test]
async fn list_pages_survive_deleting_the_last_entry() {
    let fake = Arc::new(Fake::default());
    let svc = ControllerService::new(fake.clone());
    for i in 0..5 {
        svc.create(create_req(&format!("v{i}")))
            .await
            .expect("created");
    }
    let page = |max: i32, token: String| {
        let svc = svc.clone();
        async move {
            svc.list(csi::ListVolumesRequest {
                max_entries: max,
                starting_token: token,
            })
            .await
            .expect("listed")
        }
    };
    let ids = |r: &csi::ListVolumesResponse| -> Vec<String> {
        r.entries
            .iter()
            .map(|e| e.volume.as_ref().expect("volume").volume_id.clone())
            .collect()
    };
    let p1 = page(2, String::new()).await;
    assert_eq!(ids(&p1), ["v0@n", "v1@n"]);
    svc.delete(csi::DeleteVolumeRequest {
        volume_id: "v1@n".into(),
        ..Default::default()
    })
    .await
    .expect("deleted");
    let p2 = page(2, p1.next_token.clone()).await;
    assert_eq!(ids(&p2), ["v2@n", "v3@n"]);
    let p3 = page(2, p2.next_token.clone()).await;
    assert_eq!(ids(&p3), ["v4@n"]);
    assert!(p3.next_token.is_empty());
    assert_eq!(ids(&page(0, String::new()).await).len(), 4);
    assert_eq!(ids(&page(4, String::new()).await).len(), 4);
    assert!(
        page(4, String::new()).await.next_token.is_empty(),
        "exactly one page"
    );
}

#[tokio::test]
async fn list_and_get_report_each_volume_condition() {
    let fake = Arc::new(Fake::default());
    let svc = ControllerService::new(fake.clone());
    for name in ["a", "b", "c"] {
        svc.create(create_req(name)).await.expect("created");
    }
    fake.sick
        .lock()
        .expect("not poisoned")
        .insert("b@n".into(), "device /dev/loop9 is gone".into());
    let condition = |e: &csi::list_volumes_response::Entry| {
        e.status
            .as_ref()
            .and_then(|s| s.volume_condition.clone())
            .expect("a condition")
    };
    // A page of two: the condition of each entry, in order.
    let page = svc
        .list(csi::ListVolumesRequest {
            max_entries: 2,
            starting_token: String::new(),
        })
        .await
        .expect("listed");
    let seen: Vec<(bool, String)> = page
        .entries
        .iter()
        .map(|e| {
            let c = condition(e);
            (c.abnormal, c.message)
        })
        .collect();
    assert_eq!(
        seen,
        [
            (false, String::new()),
            (true, "device /dev/loop9 is gone".to_string())
        ]
    );

    let get = |id: &str| {
        let svc = svc.clone();
        let id = id.to_string();
        async move {
            svc.get(csi::ControllerGetVolumeRequest { volume_id: id })
                .await
        }
    };
    let b = get("b@n").await.expect("found");
    assert_eq!(b.volume.expect("volume").volume_id, "b@n");
    let c = b
        .status
        .and_then(|s| s.volume_condition)
        .expect("a condition");
    assert!(c.abnormal);
    assert_eq!(c.message, "device /dev/loop9 is gone");
    let a = get("a@n").await.expect("found");
    assert_eq!(
        a.status.and_then(|s| s.volume_condition),
        Some(csi::VolumeCondition {
            abnormal: false,
            message: String::new()
        })
    );
    assert_eq!(
        get("").await.expect_err("no id").code(),
        Code::InvalidArgument
    );
    assert_eq!(
        get("zz@n").await.expect_err("unknown").code(),
        Code::NotFound
    );
    assert!(CAPABILITIES.contains(&Capability::VolumeCondition));
    assert!(CAPABILITIES.contains(&Capability::GetVolume));
}

#[tokio::test]
async fn validate_and_expand() {
    let fake = Arc::new(Fake::default());
    let svc = ControllerService::new(fake.clone());
    svc.create(create_req("v")).await.expect("created");
    let validate = |caps: Vec<csi::VolumeCapability>| {
        let svc = svc.clone();
        async move {
            svc.validate(csi::ValidateVolumeCapabilitiesRequest {
                volume_id: "v@n".into(),
                volume_capabilities: caps,
                ..Default::default()
            })
            .await
            .expect("answered")
        }
    };
    let ok = validate(vec![cap(Mode::SingleNodeWriter, mount(""))]).await;
    assert!(
        ok.confirmed
            .is_some_and(|c| c.volume_capabilities.len() == 1)
    );
    let multi = validate(vec![cap(Mode::MultiNodeMultiWriter, mount(""))]).await;
    assert!(multi.confirmed.is_none());
    assert!(
        multi.message.contains("MULTI_NODE_MULTI_WRITER"),
        "{}",
        multi.message
    );
    let host_block = validate(vec![cap(Mode::SingleNodeWriter, block())]).await;
    assert!(
        host_block.confirmed.is_none(),
        "a directory is no block device"
    );

    let expand = |access: AccessType| {
        let svc = svc.clone();
        async move {
            svc.expand(csi::ControllerExpandVolumeRequest {
                volume_id: "v@n".into(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: 2 * GIB,
                    limit_bytes: 0,
                }),
                volume_capability: Some(cap(Mode::SingleNodeWriter, access)),
                ..Default::default()
            })
            .await
            .expect("expanded")
        }
    };
    let r = expand(mount("")).await;
    assert_eq!(r.capacity_bytes, 2 * GIB);
    assert!(r.node_expansion_required);
    assert!(!expand(block()).await.node_expansion_required);
}

mod compat;
mod filesystems;
