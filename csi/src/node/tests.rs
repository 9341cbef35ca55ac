//! The Node service's RPCs over an in-memory back end: field errors,
//! the busy-volume lock, info and capabilities.

use super::*;
use crate::context;
use crate::types::LocalKind;
use csi::node_server::Node;
use csi::volume_capability::access_mode::Mode;
use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::Notify;

/// Volumes in memory; `find` can be held until released.
#[derive(Default)]
struct Fake {
    volumes: HashMap<String, LocalVolume>,
    hold: AtomicBool,
    entered: Notify,
    release: Notify,
}

#[async_trait]
impl LocalVolumes for Fake {
    fn node_id(&self) -> &str {
        "node-a"
    }
    fn max_volumes(&self) -> u64 {
        7
    }
    async fn find(&self, volume_id: &str) -> Result<Option<LocalVolume>, CsiError> {
        if self.hold.load(Ordering::SeqCst) {
            self.entered.notify_one();
            self.release.notified().await;
        }
        Ok(self.volumes.get(volume_id).cloned())
    }
}

fn fake() -> Fake {
    let mut f = Fake::default();
    f.volumes.insert(
        "v1@node-a".into(),
        LocalVolume {
            volume_id: "v1@node-a".into(),
            kind: LocalKind::Block {
                device: "/dev/null-carina-test".into(),
            },
            size_bytes: 1 << 30,
        },
    );
    f
}

fn mount_cap(mode: Mode, fs: &str) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

fn stage_req(id: &str, cap: Option<csi::VolumeCapability>) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: id.into(),
        staging_target_path: "/carina-test/staging".into(),
        volume_capability: cap,
        ..Default::default()
    }
}

#[tokio::test]
async fn malformed_requests_name_the_field() {
    let node = NodeService::new(fake());
    let ok_cap = || Some(mount_cap(Mode::SingleNodeWriter, "ext4"));
    let cases: Vec<(csi::NodeStageVolumeRequest, Code, &str)> = vec![
        (stage_req("", ok_cap()), Code::InvalidArgument, "volume_id"),
        (
            csi::NodeStageVolumeRequest {
                staging_target_path: String::new(),
                ..stage_req("v1@node-a", ok_cap())
            },
            Code::InvalidArgument,
            "staging_target_path",
        ),
        (
            csi::NodeStageVolumeRequest {
                staging_target_path: "relative/path".into(),
                ..stage_req("v1@node-a", ok_cap())
            },
            Code::InvalidArgument,
            "staging_target_path",
        ),
        (
            stage_req("v1@node-a", None),
            Code::InvalidArgument,
            "volume_capability",
        ),
        (
            stage_req(
                "v1@node-a",
                Some(mount_cap(Mode::MultiNodeMultiWriter, "ext4")),
            ),
            Code::InvalidArgument,
            "volume_capability.access_mode.mode",
        ),
        (
            stage_req("v1@node-a", Some(mount_cap(Mode::Unknown, "ext4"))),
            Code::InvalidArgument,
            "volume_capability.access_mode.mode",
        ),
        (
            stage_req(
                "v1@node-a",
                Some(mount_cap(Mode::SingleNodeWriter, "btrfs")),
            ),
            Code::InvalidArgument,
            "volume_capability.mount.fs_type",
        ),
        (
            stage_req(
                "v1@node-a",
                Some(csi::VolumeCapability {
                    access_type: None,
                    access_mode: Some(AccessMode { mode: 1 }),
                }),
            ),
            Code::InvalidArgument,
            "volume_capability.access_type",
        ),
        (
            csi::NodeStageVolumeRequest {
                volume_context: HashMap::from([(context::FS_TYPE.into(), "zfs".into())]),
                ..stage_req("v1@node-a", Some(mount_cap(Mode::SingleNodeWriter, "")))
            },
            Code::InvalidArgument,
            "volume_context[\"csi.storage.k8s.io/fstype\"]",
        ),
        (
            csi::NodeStageVolumeRequest {
                volume_context: HashMap::from([(
                    context::MKFS_OPTIONS.into(),
                    "-b 4096 -d /etc".into(),
                )]),
                ..stage_req("v1@node-a", Some(mount_cap(Mode::SingleNodeWriter, "")))
            },
            Code::InvalidArgument,
            "volume_context[\"carina.storage.io/mkfs-options\"]: -d is not an option Carina passes to mkfs.ext4",
        ),
        (
            // Checked for the filesystem the capability names.
            csi::NodeStageVolumeRequest {
                volume_context: HashMap::from([(context::MKFS_OPTIONS.into(), "-j".into())]),
                ..stage_req("v1@node-a", Some(mount_cap(Mode::SingleNodeWriter, "xfs")))
            },
            Code::InvalidArgument,
            "-j is not an option Carina passes to mkfs.xfs",
        ),
        (
            stage_req(
                "v1@node-a",
                Some(csi::VolumeCapability {
                    access_type: Some(AccessType::Mount(csi::volume_capability::MountVolume {
                        mount_flags: vec!["noatime".into(), "loop=/dev/loop0".into()],
                        ..Default::default()
                    })),
                    access_mode: Some(AccessMode { mode: 1 }),
                }),
            ),
            Code::InvalidArgument,
            "volume_capability.mount.mount_flags[1]: option \"loop\" is refused",
        ),
        (
            stage_req("v9@node-b", ok_cap()),
            Code::NotFound,
            "does not exist on node \"node-a\"",
        ),
    ];
    for (req, code, text) in cases {
        let err = node
            .node_stage_volume(Request::new(req.clone()))
            .await
            .expect_err("refused");
        assert_eq!(err.code(), code, "{req:?}: {err:?}");
        assert!(err.message().contains(text), "{req:?}: {}", err.message());
    }

    let publish = |target: &str, staging: &str| csi::NodePublishVolumeRequest {
        volume_id: "v1@node-a".into(),
        target_path: target.into(),
        staging_target_path: staging.into(),
        volume_capability: Some(csi::VolumeCapability {
            access_type: Some(AccessType::Block(BlockVolume {})),
            access_mode: Some(AccessMode { mode: 1 }),
        }),
        ..Default::default()
    };
    for (req, field) in [
        (publish("", "/s"), "target_path"),
        (publish("t", "/s"), "target_path"),
        (publish("/t", ""), "staging_target_path"),
        (publish("/s", "/s"), "target_path"),
    ] {
        let err = node
            .node_publish_volume(Request::new(req))
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().starts_with(field), "{}", err.message());
    }

    let err = node
        .node_unpublish_volume(Request::new(csi::NodeUnpublishVolumeRequest {
            volume_id: "v1@node-a".into(),
            target_path: String::new(),
        }))
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = node
        .node_get_volume_stats(Request::new(csi::NodeGetVolumeStatsRequest {
            volume_id: "v1@node-a".into(),
            ..Default::default()
        }))
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().starts_with("volume_path"));
    // Not found comes before the path check, as csi-sanity expects.
    let err = node
        .node_expand_volume(Request::new(csi::NodeExpandVolumeRequest {
            volume_id: "gone@node-a".into(),
            volume_path: "some/path".into(),
            ..Default::default()
        }))
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn second_call_on_a_busy_volume_is_aborted() {
    let f = fake();
    f.hold.store(true, Ordering::SeqCst);
    let f = Arc::new(f);
    let node = NodeService::from_arc(f.clone());
    let first = {
        let node = node.clone();
        tokio::spawn(async move {
            node.node_stage_volume(Request::new(stage_req(
                "v1@node-a",
                Some(mount_cap(Mode::SingleNodeWriter, "")),
            )))
            .await
        })
    };
    f.entered.notified().await;
    let err = node
        .node_unstage_volume(Request::new(csi::NodeUnstageVolumeRequest {
            volume_id: "v1@node-a".into(),
            staging_target_path: "/carina-test/staging".into(),
        }))
        .await
        .expect_err("busy");
    assert_eq!(err.code(), Code::Aborted, "{err:?}");
    f.hold.store(false, Ordering::SeqCst);
    f.release.notify_one();
    // The first call goes on (and fails: the fake device does not exist).
    let first = first.await.expect("joined").expect_err("no such device");
    assert_eq!(first.code(), Code::FailedPrecondition, "{first:?}");
    // Released: the id is free again.
    let err = node
        .node_stage_volume(Request::new(stage_req(
            "v1@node-a",
            Some(mount_cap(Mode::SingleNodeWriter, "")),
        )))
        .await
        .expect_err("no such device");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
}

#[tokio::test]
async fn info_and_capabilities() {
    let node = NodeService::new(fake());
    let info = node
        .node_get_info(Request::new(csi::NodeGetInfoRequest {}))
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.node_id, "node-a");
    assert_eq!(info.max_volumes_per_node, 7);
    assert_eq!(
        info.accessible_topology.expect("topology").segments,
        HashMap::from([(TOPOLOGY_KEY.to_string(), "node-a".to_string())])
    );
    let caps: Vec<i32> = node
        .node_get_capabilities(Request::new(csi::NodeGetCapabilitiesRequest {}))
        .await
        .expect("caps")
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| c.r#type)
        .map(|csi::node_service_capability::Type::Rpc(r)| r.r#type)
        .collect();
    assert_eq!(caps, [1, 3, 2, 4, 5]);
}
