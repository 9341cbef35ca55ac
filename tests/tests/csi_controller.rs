//! The CSI Controller over the direct control plane, end to end: two
//! in-process NodeStorage servers (`node-a`, `node-b`) with HOST groups on
//! their own tmpfs (so capacities are exact: 256 MiB and 512 MiB), a
//! `DirectProvisioner` reaching them over mutual TLS, and the Controller
//! served on a unix socket and called through a tonic client, as the CSI
//! sidecars call it.
//!
//! Needs root (tmpfs mounts, loop devices for the RAW group).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use carina_csi::context;
use carina_csi::strategy::Strategy;
use carina_proto::csi;
use carina_proto::csi::identity_client::IdentityClient;
use carina_proto::csi::volume_capability::access_mode::Mode;
use carina_tests::csi::{Csi, delete, make, node_of, on};
use carina_tests::csi_direct::{A, B, Cluster, block, cap, mount, params, range};
use carina_tests::have_root;
use tonic::Code;

const MIB: u64 = 1 << 20;

/// A volume for a mount of the driver's default filesystem.
fn create(name: &str, required: u64) -> csi::CreateVolumeRequest {
    carina_tests::csi::create(name, required, "")
}

/// The node a strategy picks from the allocatable bytes of `host` on
/// node-a and node-b (ties go to node-a, the first in the list).
fn predict(strategy: Strategy, free: &[u64], size: u64) -> Option<&'static str> {
    let fits: Vec<(usize, u64)> = free
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, f)| *f >= size)
        .collect();
    let pick = match strategy {
        Strategy::Binpack => fits.iter().min_by_key(|(i, f)| (*f, *i)),
        Strategy::Spreadout => fits.iter().min_by_key(|(i, f)| (std::cmp::Reverse(*f), *i)),
    };
    pick.map(|(i, _)| [A, B][*i])
}

async fn placements(strategy: Strategy, count: usize, expected: &[&str]) -> Result<()> {
    let mut c = Cluster::start(strategy, false).await?;
    let mut got = Vec::new();
    for i in 0..count {
        let free = c.allocatable().await?;
        let want = predict(strategy, &free, 100 * MIB);
        let result = c
            .controller
            .csi
            .create_volume(create(&format!("{strategy}-{i}"), 100 * MIB))
            .await;
        match (want, result) {
            (Some(want), Ok(r)) => {
                let v = r.into_inner().volume.context("volume")?;
                assert_eq!(node_of(&v), want, "volume {i} with free {free:?}");
                assert_eq!(v.volume_id, format!("{strategy}-{i}@{want}"));
                assert_eq!(
                    v.accessible_topology,
                    [on(want)],
                    "accessible from its node"
                );
                assert_eq!(v.capacity_bytes, (100 * MIB) as i64);
                got.push(want);
            }
            (None, Err(s)) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                got.push("-");
            }
            (want, result) => panic!("volume {i}, free {free:?}: want {want:?}, got {result:?}"),
        }
    }
    assert_eq!(got, expected);
    let lvs = c.lvs().await?;
    let count = |node: &str| got.iter().filter(|n| **n == node).count();
    assert_eq!((lvs[0].len(), lvs[1].len()), (count(A), count(B)));
    Ok(())
}

#[tokio::test]
async fn spreadout_uses_the_emptiest_node() -> Result<()> {
    if !have_root("spreadout_uses_the_emptiest_node") {
        return Ok(());
    }
    // 256/512 MiB: b 412, b 312, b 212 (a has 256 > 212 next), a 156, b 112, a 56.
    placements(Strategy::Spreadout, 6, &[B, B, B, A, B, A]).await
}

#[tokio::test]
async fn binpack_fills_the_fullest_node_that_fits() -> Result<()> {
    if !have_root("binpack_fills_the_fullest_node_that_fits") {
        return Ok(());
    }
    // a 156, a 56, then a is too small: b 412 .. 12, then nothing fits.
    placements(Strategy::Binpack, 8, &[A, A, B, B, B, B, B, "-"]).await
}

/// The condition `ControllerGetVolume` reports for `volume_id`.
async fn condition_of(csi: &mut Csi, volume_id: &str) -> Result<csi::VolumeCondition> {
    csi.controller_get_volume(csi::ControllerGetVolumeRequest {
        volume_id: volume_id.to_string(),
    })
    .await?
    .into_inner()
    .status
    .and_then(|s| s.volume_condition)
    .context("no volume_condition")
}

/// The direct control plane asks each volume's node for its condition:
/// a HOST volume whose directory is removed is abnormal, in
/// `ControllerGetVolume` and in `ListVolumes`, and the other node's volume
/// is not.
#[tokio::test]
async fn conditions_come_from_the_volumes_nodes() -> Result<()> {
    if !have_root("conditions_come_from_the_volumes_nodes") {
        return Ok(());
    }
    let mut c = Cluster::start(Strategy::Spreadout, false).await?;
    let mut ids = Vec::new();
    for (name, node) in [("cond-a", A), ("cond-b", B)] {
        let mut req = create(name, MIB);
        req.accessibility_requirements = Some(csi::TopologyRequirement {
            requisite: vec![on(node)],
            preferred: vec![on(node)],
        });
        ids.push(make(&mut c.controller.csi, req).await?.volume_id);
    }
    let sound = csi::VolumeCondition {
        abnormal: false,
        message: String::new(),
    };
    for id in &ids {
        assert_eq!(
            condition_of(&mut c.controller.csi, id).await?,
            sound,
            "{id}"
        );
    }
    let dir = c.roots[0].join("cond-a");
    std::fs::remove_dir_all(&dir)?;
    let broken = condition_of(&mut c.controller.csi, &ids[0]).await?;
    assert!(broken.abnormal, "{broken:?}");
    assert_eq!(
        broken.message,
        format!(
            "node {A}, volume \"cond-a\": directory {} is gone",
            dir.display()
        )
    );
    assert_eq!(condition_of(&mut c.controller.csi, &ids[1]).await?, sound);
    let listed = c
        .controller
        .csi
        .list_volumes(csi::ListVolumesRequest::default())
        .await?
        .into_inner();
    let by_id: HashMap<String, csi::VolumeCondition> = listed
        .entries
        .into_iter()
        .filter_map(|e| {
            let id = e.volume?.volume_id;
            Some((id, e.status?.volume_condition?))
        })
        .collect();
    assert_eq!(by_id.get(&ids[0]), Some(&broken));
    assert_eq!(by_id.get(&ids[1]), Some(&sound));
    for id in &ids {
        delete(&mut c.controller.csi, id).await?;
    }
    assert!(c.lvs().await?.iter().all(Vec::is_empty));
    Ok(())
}

#[tokio::test]
async fn carina_parameters_idempotency_sizes_and_lifecycle() -> Result<()> {
    if !have_root("carina_parameters_idempotency_sizes_and_lifecycle") {
        return Ok(());
    }
    let mut c = Cluster::start(Strategy::Spreadout, true).await?;
    let probe = IdentityClient::new(c.controller.server.channel.clone())
        .probe(csi::ProbeRequest {})
        .await?
        .into_inner();
    assert_eq!(
        probe.ready,
        Some(true),
        "Identity is served next to Controller"
    );

    // disk-group-name + fstype xfs, pinned to node-a; a carina.storage.io
    // key this driver does not know is accepted (as Go Carina did).
    let mut req = create("pvc-xfs", 10 * MIB + 1);
    req.parameters = params(&[
        ("carina.storage.io/disk-group-name", "host"),
        ("csi.storage.k8s.io/fstype", "xfs"),
        ("csi.storage.k8s.io/pvc/name", "data"),
        ("carina.storage.io/volume-type", "lvm"),
    ]);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![on(A), on(B)],
        preferred: vec![on(A)],
    });
    let xfs = make(&mut c.controller.csi, req.clone()).await?;
    assert_eq!(xfs.volume_id, "pvc-xfs@node-a", "the preferred node first");
    assert_eq!(
        xfs.capacity_bytes,
        (10 * MIB + 4096) as i64,
        "rounded to the HOST unit"
    );
    let ctx = &xfs.volume_context;
    assert_eq!(ctx[context::FS_TYPE], "xfs");
    assert_eq!(ctx[context::GROUP], "host");
    assert_eq!(ctx[context::POLICY], "HOST");
    assert_eq!(ctx[context::NODE], A);
    assert!(
        Path::new(&ctx[context::PATH]).starts_with(&c.roots[0]),
        "{ctx:?}"
    );
    assert!(Path::new(&ctx[context::PATH]).is_dir());

    // The same request again: the same volume, nothing new on any node.
    let before = c.lvs().await?;
    let again = make(&mut c.controller.csi, req.clone()).await?;
    assert_eq!(again.volume_id, xfs.volume_id);
    assert_eq!(again.capacity_bytes, xfs.capacity_bytes);
    assert_eq!(c.lvs().await?, before);
    // The same name with a size it does not satisfy, or another group.
    let mut bigger = req.clone();
    bigger.capacity_range = range(20 * MIB as i64, 20 * MIB as i64);
    let e = c
        .controller
        .csi
        .create_volume(bigger)
        .await
        .expect_err("incompatible");
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    let mut other_group = req.clone();
    other_group
        .parameters
        .insert("carina.storage.io/disk-group-name".into(), "raw".into());
    let e = c
        .controller
        .csi
        .create_volume(other_group)
        .await
        .expect_err("incompatible");
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    assert_eq!(c.lvs().await?, before);

    // exclusively-raw-disk on the RAW group: a whole disk, as a block device.
    let mut raw = create("pvc-raw", 16 * MIB);
    raw.volume_capabilities = vec![cap(Mode::SingleNodeWriter, block())];
    raw.parameters = params(&[("carina.storage.io/exclusively-raw-disk", "true")]);
    let whole = make(&mut c.controller.csi, raw.clone()).await?;
    assert_eq!(
        whole.volume_id, "pvc-raw@node-b",
        "only node-b has a RAW group"
    );
    let ctx = &whole.volume_context;
    assert_eq!(
        (ctx[context::GROUP].as_str(), ctx[context::POLICY].as_str()),
        ("raw", "RAW")
    );
    assert!(ctx[context::PATH].starts_with("/dev/"), "{ctx:?}");
    assert!(ctx.contains_key(context::MAJOR) && ctx.contains_key(context::MINOR));
    assert!(
        !ctx.contains_key(context::FS_TYPE),
        "block volumes carry no file system"
    );
    assert!(whole.capacity_bytes >= (16 * MIB) as i64);
    let b_raw = c.lvs().await?[1]
        .iter()
        .find(|v| v.name == "pvc-raw")
        .cloned()
        .context("on node-b")?;
    assert!(b_raw.exclusive);
    assert_eq!(
        make(&mut c.controller.csi, raw).await?.volume_id,
        whole.volume_id,
        "idempotent"
    );
    // A second whole disk does not exist.
    let mut second = create("pvc-raw-2", MIB);
    second.parameters = params(&[
        ("carina.storage.io/disk-group-name", "raw"),
        ("carina.storage.io/exclusively-raw-disk", "true"),
    ]);
    let e = c
        .controller
        .csi
        .create_volume(second)
        .await
        .expect_err("no free disk");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    // "false" is accepted and means a normal volume.
    let mut plain = create("pvc-plain", MIB);
    plain.parameters = params(&[("carina.storage.io/exclusively-raw-disk", "false")]);
    make(&mut c.controller.csi, plain).await?;

    // Sizes: rounded to the unit, never above limit_bytes.
    for (name, required, limit, want) in [
        ("size-a", 5000, 9000, 8192),
        ("size-b", 0, 10 * MIB as i64 + 100, 10 * MIB as i64),
        ("size-c", 8192, 8192, 8192),
        ("size-d", 4097, 0, 8192),
    ] {
        let mut r = create(name, 0);
        r.capacity_range = range(required, limit);
        let v = make(&mut c.controller.csi, r).await?;
        assert_eq!(v.capacity_bytes, want, "{name}");
        assert!(limit == 0 || v.capacity_bytes <= limit, "{name}");
    }

    // Expand: grows on the node; node expansion for mounts, not for block.
    let grown = c
        .controller
        .csi
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: xfs.volume_id.clone(),
            capacity_range: range(20 * MIB as i64 + 1, 0),
            volume_capability: Some(cap(Mode::SingleNodeWriter, mount("xfs"))),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(grown.capacity_bytes, (20 * MIB + 4096) as i64);
    assert!(grown.node_expansion_required);
    let on_a = c.lvs().await?[0]
        .iter()
        .find(|v| v.name == "pvc-xfs")
        .cloned()
        .context("on a")?;
    assert_eq!(on_a.size_bytes, 20 * MIB + 4096);
    let same = c
        .controller
        .csi
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: whole.volume_id.clone(),
            capacity_range: range(MIB as i64, 0),
            volume_capability: Some(cap(Mode::SingleNodeWriter, block())),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(
        same.capacity_bytes, whole.capacity_bytes,
        "already large enough"
    );
    assert!(!same.node_expansion_required);

    // ValidateVolumeCapabilities.
    let validate =
        |id: &str, caps: Vec<csi::VolumeCapability>| csi::ValidateVolumeCapabilitiesRequest {
            volume_id: id.to_string(),
            volume_capabilities: caps,
            ..Default::default()
        };
    let ok = c
        .controller
        .csi
        .validate_volume_capabilities(validate(
            &xfs.volume_id,
            vec![cap(Mode::SingleNodeWriter, mount("xfs"))],
        ))
        .await?
        .into_inner();
    assert!(
        ok.confirmed
            .is_some_and(|c| !c.volume_capabilities.is_empty())
    );
    for (id, access, mode) in [
        (&xfs.volume_id, mount(""), Mode::MultiNodeMultiWriter),
        (&xfs.volume_id, block(), Mode::SingleNodeWriter),
    ] {
        let r = c
            .controller
            .csi
            .validate_volume_capabilities(validate(id, vec![cap(mode, access)]))
            .await?
            .into_inner();
        assert!(r.confirmed.is_none() && !r.message.is_empty(), "{r:?}");
    }

    // GetCapacity per node and group, and over all.
    let free = c.allocatable().await?;
    let get = |topology: Option<csi::Topology>, group: &str| csi::GetCapacityRequest {
        accessible_topology: topology,
        parameters: if group.is_empty() {
            HashMap::new()
        } else {
            params(&[("carina.storage.io/disk-group-name", group)])
        },
        ..Default::default()
    };
    for (i, node) in [A, B].into_iter().enumerate() {
        let r = c
            .controller
            .csi
            .get_capacity(get(Some(on(node)), "host"))
            .await?
            .into_inner();
        assert_eq!(r.available_capacity, free[i] as i64, "{node}");
        assert_eq!(r.maximum_volume_size, Some(free[i] as i64), "{node}");
    }
    let all = c
        .controller
        .csi
        .get_capacity(get(None, "host"))
        .await?
        .into_inner();
    assert_eq!(all.available_capacity, (free[0] + free[1]) as i64);
    let unknown = c
        .controller
        .csi
        .get_capacity(get(Some(on("node-x")), ""))
        .await?
        .into_inner();
    assert_eq!(unknown.available_capacity, 0);

    // ListVolumes: every node's volumes, in id order, a page at a time.
    let lvs = c.lvs().await?;
    let mut want: Vec<String> = lvs[0]
        .iter()
        .map(|v| format!("{}@{A}", v.name))
        .chain(lvs[1].iter().map(|v| format!("{}@{B}", v.name)))
        .collect();
    want.sort();
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .controller
            .csi
            .list_volumes(csi::ListVolumesRequest {
                max_entries: 3,
                starting_token: token,
            })
            .await?
            .into_inner();
        assert!(page.entries.len() <= 3);
        seen.extend(page.entries.iter().map(|e| {
            e.volume
                .as_ref()
                .map(|v| v.volume_id.clone())
                .unwrap_or_default()
        }));
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(seen, want);

    // DeleteVolume: gone from its node; again, unknown and malformed are fine.
    for id in [
        &xfs.volume_id,
        &xfs.volume_id,
        "nope@node-a",
        "not-an-id",
        "x@node-x",
        "a b@node-a",
    ] {
        delete(&mut c.controller.csi, id).await?;
    }
    assert!(!c.lvs().await?[0].iter().any(|v| v.name == "pvc-xfs"));
    assert!(!Path::new(&xfs.volume_context[context::PATH]).exists());

    // A node that is down: UNAVAILABLE, and nothing is made elsewhere.
    let before = c.lvs().await?;
    let b = c.nodes.pop().context("node-b")?;
    c.node_clients.pop();
    b.stop().await?;
    let e = c
        .controller
        .csi
        .create_volume(create("pvc-while-b-is-down", MIB))
        .await
        .expect_err("node-b is down");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert_eq!(c.lvs().await?[0], before[0]);
    Ok(())
}

/// A call of the table below.
enum Call {
    Create(csi::CreateVolumeRequest),
    Delete(csi::DeleteVolumeRequest),
    Expand(csi::ControllerExpandVolumeRequest),
    Validate(csi::ValidateVolumeCapabilitiesRequest),
    List(csi::ListVolumesRequest),
    Capacity(csi::GetCapacityRequest),
    Publish(csi::ControllerPublishVolumeRequest),
    Snapshot(csi::CreateSnapshotRequest),
    Get(csi::ControllerGetVolumeRequest),
}

async fn code_of(csi: &mut Csi, call: Call) -> Code {
    fn code<T>(r: Result<T, tonic::Status>) -> Code {
        r.map_or_else(|s| s.code(), |_| Code::Ok)
    }
    match call {
        Call::Create(r) => code(csi.create_volume(r).await),
        Call::Delete(r) => code(csi.delete_volume(r).await),
        Call::Expand(r) => code(csi.controller_expand_volume(r).await),
        Call::Validate(r) => code(csi.validate_volume_capabilities(r).await),
        Call::List(r) => code(csi.list_volumes(r).await),
        Call::Capacity(r) => code(csi.get_capacity(r).await),
        Call::Publish(r) => code(csi.controller_publish_volume(r).await),
        Call::Snapshot(r) => code(csi.create_snapshot(r).await),
        Call::Get(r) => code(csi.controller_get_volume(r).await),
    }
}

#[tokio::test]
async fn malformed_requests_get_the_spec_code_and_create_nothing() -> Result<()> {
    if !have_root("malformed_requests_get_the_spec_code_and_create_nothing") {
        return Ok(());
    }
    let mut c = Cluster::start(Strategy::Spreadout, false).await?;
    let existing = make(&mut c.controller.csi, create("pvc-existing", MIB)).await?;
    let before = c.lvs().await?;

    let with = |f: &dyn Fn(&mut csi::CreateVolumeRequest)| {
        let mut r = create("pvc-bad", MIB);
        f(&mut r);
        Call::Create(r)
    };
    let mode = |m: Mode| with(&|r| r.volume_capabilities = vec![cap(m, mount(""))]);
    let param = |k: &'static str, v: &'static str| with(&move |r| r.parameters = params(&[(k, v)]));
    let expand =
        |id: &str, req: Option<csi::CapacityRange>, capability: Option<csi::VolumeCapability>| {
            Call::Expand(csi::ControllerExpandVolumeRequest {
                volume_id: id.into(),
                capacity_range: req,
                volume_capability: capability,
                ..Default::default()
            })
        };
    use Code::{
        Aborted, AlreadyExists, InvalidArgument, NotFound, OutOfRange, ResourceExhausted,
        Unimplemented,
    };
    let table: Vec<(&str, Call, Code)> = vec![
        ("missing name", with(&|r| r.name.clear()), InvalidArgument),
        (
            "missing capabilities",
            with(&|r| r.volume_capabilities.clear()),
            InvalidArgument,
        ),
        (
            "MULTI_NODE_MULTI_WRITER",
            mode(Mode::MultiNodeMultiWriter),
            InvalidArgument,
        ),
        (
            "MULTI_NODE_READER_ONLY",
            mode(Mode::MultiNodeReaderOnly),
            InvalidArgument,
        ),
        (
            "MULTI_NODE_SINGLE_WRITER",
            mode(Mode::MultiNodeSingleWriter),
            InvalidArgument,
        ),
        ("access mode UNKNOWN", mode(Mode::Unknown), InvalidArgument),
        (
            "no access mode",
            with(&|r| r.volume_capabilities[0].access_mode = None),
            InvalidArgument,
        ),
        (
            "no access type",
            with(&|r| r.volume_capabilities[0].access_type = None),
            InvalidArgument,
        ),
        (
            "block and mount together",
            with(&|r| {
                r.volume_capabilities
                    .push(cap(Mode::SingleNodeWriter, block()))
            }),
            InvalidArgument,
        ),
        (
            "required > limit",
            with(&|r| r.capacity_range = range(2 * MIB as i64, MIB as i64)),
            InvalidArgument,
        ),
        (
            "negative required",
            with(&|r| r.capacity_range = range(-1, 0)),
            InvalidArgument,
        ),
        (
            "negative limit",
            with(&|r| r.capacity_range = range(0, -5)),
            InvalidArgument,
        ),
        (
            "no unit multiple in range",
            with(&|r| r.capacity_range = range(5000, 8191)),
            OutOfRange,
        ),
        (
            "unknown mount fs type",
            with(&|r| r.volume_capabilities = vec![cap(Mode::SingleNodeWriter, mount("btrfs"))]),
            InvalidArgument,
        ),
        (
            "unknown fstype parameter",
            param("csi.storage.k8s.io/fstype", "ntfs"),
            InvalidArgument,
        ),
        (
            "fs type conflict",
            with(&|r| {
                r.volume_capabilities = vec![cap(Mode::SingleNodeWriter, mount("ext4"))];
                r.parameters = params(&[("csi.storage.k8s.io/fstype", "xfs")]);
            }),
            InvalidArgument,
        ),
        (
            "a bad known value beside an unknown carina.storage.io key",
            with(&|r| {
                r.parameters = params(&[
                    ("carina.storage.io/disk-group", "host"),
                    ("carina.storage.io/exclusively-raw-disk", "yes"),
                ])
            }),
            InvalidArgument,
        ),
        (
            "exclusively-raw-disk yes",
            param("carina.storage.io/exclusively-raw-disk", "yes"),
            InvalidArgument,
        ),
        (
            "empty disk-group-name",
            param("carina.storage.io/disk-group-name", ""),
            InvalidArgument,
        ),
        (
            "group no node has",
            param("carina.storage.io/disk-group-name", "ssd"),
            InvalidArgument,
        ),
        (
            "exclusive without a RAW group",
            param("carina.storage.io/exclusively-raw-disk", "true"),
            InvalidArgument,
        ),
        (
            "block on a HOST group",
            with(&|r| r.volume_capabilities = vec![cap(Mode::SingleNodeWriter, block())]),
            InvalidArgument,
        ),
        (
            "bcache backing volume on a HOST group",
            with(&|r| {
                r.parameters = params(&[
                    ("carina.storage.io/backend-disk-group-name", "host"),
                    ("carina.storage.io/cache-disk-group-name", "host"),
                    ("carina.storage.io/cache-disk-ratio", "10"),
                ])
            }),
            InvalidArgument,
        ),
        (
            "bcache cache group no node has",
            with(&|r| {
                r.parameters = params(&[
                    ("carina.storage.io/backend-disk-group-name", "host"),
                    ("carina.storage.io/cache-disk-group-name", "ssd"),
                    ("carina.storage.io/cache-disk-ratio", "10"),
                ])
            }),
            InvalidArgument,
        ),
        (
            "from a snapshot id no snapshot can have",
            with(&|r| {
                r.volume_content_source = Some(csi::VolumeContentSource {
                    r#type: Some(csi::volume_content_source::Type::Snapshot(
                        csi::volume_content_source::SnapshotSource {
                            snapshot_id: "s".into(),
                        },
                    )),
                })
            }),
            NotFound,
        ),
        (
            "from a snapshot without id",
            with(&|r| {
                r.volume_content_source = Some(csi::VolumeContentSource {
                    r#type: Some(csi::volume_content_source::Type::Snapshot(
                        csi::volume_content_source::SnapshotSource {
                            snapshot_id: String::new(),
                        },
                    )),
                })
            }),
            InvalidArgument,
        ),
        (
            "clone of a volume that does not exist",
            with(&|r| {
                r.volume_content_source = Some(csi::VolumeContentSource {
                    r#type: Some(csi::volume_content_source::Type::Volume(
                        csi::volume_content_source::VolumeSource {
                            volume_id: "pvc-missing@node-a".into(),
                        },
                    )),
                })
            }),
            NotFound,
        ),
        (
            "a content source naming nothing",
            with(&|r| r.volume_content_source = Some(csi::VolumeContentSource { r#type: None })),
            InvalidArgument,
        ),
        (
            "mutable parameters",
            with(&|r| r.mutable_parameters = params(&[("iops", "1")])),
            InvalidArgument,
        ),
        (
            "requisite names no known node",
            with(&|r| {
                r.accessibility_requirements = Some(csi::TopologyRequirement {
                    requisite: vec![on("node-x")],
                    preferred: vec![],
                })
            }),
            ResourceExhausted,
        ),
        (
            "larger than any node",
            with(&|r| r.capacity_range = range(600 * MIB as i64, 0)),
            ResourceExhausted,
        ),
        (
            "existing name, other size",
            Call::Create(csi::CreateVolumeRequest {
                capacity_range: range(2 * MIB as i64, 2 * MIB as i64),
                ..create("pvc-existing", 0)
            }),
            AlreadyExists,
        ),
        (
            "bad starting_token",
            Call::List(csi::ListVolumesRequest {
                max_entries: 0,
                starting_token: "invalid-token".into(),
            }),
            Aborted,
        ),
        (
            "negative max_entries",
            Call::List(csi::ListVolumesRequest {
                max_entries: -1,
                starting_token: String::new(),
            }),
            InvalidArgument,
        ),
        (
            "delete without id",
            Call::Delete(Default::default()),
            InvalidArgument,
        ),
        (
            "expand without id",
            expand("", range(2 * MIB as i64, 0), None),
            InvalidArgument,
        ),
        (
            "expand without range",
            expand(&existing.volume_id, None, None),
            InvalidArgument,
        ),
        (
            "expand with negative size",
            expand(&existing.volume_id, range(-1, 0), None),
            InvalidArgument,
        ),
        (
            "expand with a multi-node capability",
            expand(
                &existing.volume_id,
                range(2 * MIB as i64, 0),
                Some(cap(Mode::MultiNodeMultiWriter, mount(""))),
            ),
            InvalidArgument,
        ),
        (
            "expand unknown volume",
            expand("nope@node-a", range(2 * MIB as i64, 0), None),
            NotFound,
        ),
        (
            "expand on unknown node",
            expand("nope@node-x", range(2 * MIB as i64, 0), None),
            NotFound,
        ),
        (
            "expand malformed id",
            expand("not-an-id", range(2 * MIB as i64, 0), None),
            NotFound,
        ),
        (
            "validate without id",
            Call::Validate(csi::ValidateVolumeCapabilitiesRequest {
                volume_capabilities: vec![cap(Mode::SingleNodeWriter, mount(""))],
                ..Default::default()
            }),
            InvalidArgument,
        ),
        (
            "validate without capabilities",
            Call::Validate(csi::ValidateVolumeCapabilitiesRequest {
                volume_id: existing.volume_id.clone(),
                ..Default::default()
            }),
            InvalidArgument,
        ),
        (
            "validate unknown volume",
            Call::Validate(csi::ValidateVolumeCapabilitiesRequest {
                volume_id: "nope@node-b".into(),
                volume_capabilities: vec![cap(Mode::SingleNodeWriter, mount(""))],
                ..Default::default()
            }),
            NotFound,
        ),
        (
            "capacity with a bad known value beside an unknown carina key",
            Call::Capacity(csi::GetCapacityRequest {
                parameters: params(&[
                    ("carina.storage.io/size", "1"),
                    ("carina.storage.io/cache-policy", "fast"),
                    ("carina.storage.io/backend-disk-group-name", "host"),
                    ("carina.storage.io/cache-disk-group-name", "host"),
                    ("carina.storage.io/cache-disk-ratio", "10"),
                ]),
                ..Default::default()
            }),
            InvalidArgument,
        ),
        (
            "ControllerPublishVolume",
            Call::Publish(Default::default()),
            Unimplemented,
        ),
        (
            "CreateSnapshot without name",
            Call::Snapshot(csi::CreateSnapshotRequest {
                source_volume_id: "pvc-missing@node-a".into(),
                ..Default::default()
            }),
            InvalidArgument,
        ),
        (
            "CreateSnapshot without source",
            Call::Snapshot(csi::CreateSnapshotRequest {
                name: "snap".into(),
                ..Default::default()
            }),
            InvalidArgument,
        ),
        (
            "CreateSnapshot of a volume that does not exist",
            Call::Snapshot(csi::CreateSnapshotRequest {
                name: "snap".into(),
                source_volume_id: "pvc-missing@node-a".into(),
                ..Default::default()
            }),
            NotFound,
        ),
        (
            "get without id",
            Call::Get(Default::default()),
            InvalidArgument,
        ),
        (
            "get unknown volume",
            Call::Get(csi::ControllerGetVolumeRequest {
                volume_id: "nope@node-b".into(),
            }),
            NotFound,
        ),
        (
            "get an id this driver never issues",
            Call::Get(csi::ControllerGetVolumeRequest {
                volume_id: "no-node-in-it".into(),
            }),
            NotFound,
        ),
    ];
    assert!(table.len() >= 20);
    let mut wrong = Vec::new();
    for (what, call, want) in table {
        let got = code_of(&mut c.controller.csi, call).await;
        if got != want {
            wrong.push(format!("{what}: want {want:?}, got {got:?}"));
        }
        assert_eq!(c.lvs().await?, before, "{what} changed the nodes' volumes");
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    Ok(())
}
