//! NodeStorage over real mutual TLS, against an in-process server whose
//! engine has one HOST group: every RPC's happy path, idempotency, paging,
//! validation, the capacity watch, config push, health, reflection and
//! metrics.

use std::time::Duration;

use carina_proto::nodestorage as pb;
use carina_tests::grpc::{Client, TestNode, create_lv, get_lv, host_config, host_engine};
use carina_tests::{MountGuard, have_root, unique};
use tonic::Code;

const MIB: u64 = 1 << 20;
/// Guards against hangs only; the awaited events happen in milliseconds.
const HANG_GUARD: Duration = Duration::from_secs(30);

async fn node(group: &str) -> (TestNode, carina_tests::grpc::EngineDirs) {
    let (engine, dirs) = host_engine(group, None).await.expect("engine");
    let node = TestNode::start(engine, "node-a").await.expect("server");
    (node, dirs)
}

fn resize(name: &str, size: u64) -> pb::ResizeLvRequest {
    pb::ResizeLvRequest {
        name: name.into(),
        size_bytes: size,
    }
}

fn delete(name: &str) -> pb::DeleteLvRequest {
    pb::DeleteLvRequest { name: name.into() }
}

/// The capacity of every group, as the node reports it.
async fn capacity(client: &Client) -> pb::CapacityResponse {
    client
        .clone()
        .capacity(pb::CapacityRequest::default())
        .await
        .expect("Capacity")
        .into_inner()
}

#[tokio::test]
async fn create_get_resize_list_delete() {
    let group = unique("g");
    let (node, dirs) = node(&group).await;
    let mut c = node.client("controller").await.expect("client");

    let created = c
        .create_lv(create_lv("vol-1", &group, 3 * MIB + 1))
        .await
        .expect("CreateLV")
        .into_inner();
    assert!(created.created);
    let v = created.volume.expect("volume");
    assert_eq!(v.name, "vol-1");
    assert_eq!(v.device_group, group);
    assert_eq!(v.policy, pb::Policy::Host as i32);
    assert!(
        v.size_bytes > 3 * MIB && v.size_bytes.is_multiple_of(4096),
        "rounded up: {}",
        v.size_bytes
    );
    assert_eq!(
        std::path::Path::new(&v.host_path),
        dirs.root.join("vol-1"),
        "HOST volumes are directories under the root"
    );
    assert!(dirs.root.join("vol-1").is_dir());

    // Same arguments again: the same volume, not created.
    let again = c
        .create_lv(create_lv("vol-1", &group, 3 * MIB + 1))
        .await
        .expect("repeat")
        .into_inner();
    assert!(!again.created);
    assert_eq!(again.volume.as_ref(), Some(&v));

    // Same name, other size: ALREADY_EXISTS.
    let e = c
        .create_lv(create_lv("vol-1", &group, 8 * MIB))
        .await
        .expect_err("different arguments");
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");

    let got = get_lv(&mut c, "vol-1").await.expect("GetLV");
    assert_eq!(got.as_ref(), Some(&v));

    let grown = c
        .resize_lv(resize("vol-1", 16 * MIB))
        .await
        .expect("ResizeLV")
        .into_inner()
        .volume
        .expect("volume");
    assert_eq!(grown.size_bytes, 16 * MIB);
    let shrink = c.resize_lv(resize("vol-1", MIB)).await.expect_err("shrink");
    assert_eq!(shrink.code(), Code::FailedPrecondition, "{shrink:?}");

    let listed = c
        .list_l_vs(pb::ListLVsRequest::default())
        .await
        .expect("ListLVs")
        .into_inner();
    assert_eq!(listed.volumes, vec![grown.clone()]);
    assert!(listed.next_page_token.is_empty());

    c.delete_lv(delete("vol-1")).await.expect("DeleteLV");
    assert!(!dirs.root.join("vol-1").exists());
    let gone = get_lv(&mut c, "vol-1")
        .await
        .expect("GetLV of a deleted volume");
    assert_eq!(gone, None, "NOT_FOUND after delete");
    let again = c
        .delete_lv(delete("vol-1"))
        .await
        .expect_err("nothing to delete");
    assert_eq!(again.code(), Code::NotFound);

    assert_eq!(node.metrics.count("CreateLV", Code::Ok), 2);
    assert_eq!(node.metrics.count("CreateLV", Code::AlreadyExists), 1);
    node.stop().await.expect("clean stop");
}

#[tokio::test]
async fn list_pages_through_every_volume() {
    let group = unique("g");
    let (node, _dirs) = node(&group).await;
    let mut c = node.client("controller").await.expect("client");
    let mut want = Vec::new();
    for i in 0..7 {
        let name = format!("v{i:02}");
        c.create_lv(create_lv(&name, &group, MIB))
            .await
            .expect("create");
        want.push(name);
    }
    let mut got = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = c
            .list_l_vs(pb::ListLVsRequest {
                device_group: group.clone(),
                page_size: 3,
                page_token: token,
            })
            .await
            .expect("page")
            .into_inner();
        pages += 1;
        assert!(page.volumes.len() <= 3);
        got.extend(page.volumes.into_iter().map(|v| v.name));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(got, want);
    assert_eq!(pages, 3);

    let bad = c
        .list_l_vs(pb::ListLVsRequest {
            page_token: "not-a-token".into(),
            ..Default::default()
        })
        .await
        .expect_err("bad token");
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(
        bad.message().starts_with("page_token:"),
        "{}",
        bad.message()
    );

    let unknown = c
        .list_l_vs(pb::ListLVsRequest {
            device_group: "nope".into(),
            ..Default::default()
        })
        .await
        .expect_err("unknown group");
    assert_eq!(unknown.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn bad_requests_name_the_field() {
    let group = unique("g");
    let (node, _dirs) = node(&group).await;
    let mut c = node.client("controller").await.expect("client");
    let cases = [
        (create_lv("", &group, MIB), "name:"),
        (create_lv("-x", &group, MIB), "name:"),
        (create_lv("v", "", MIB), "device_group:"),
        (create_lv("v", &group, 0), "size_bytes:"),
        (create_lv("v", &group, u64::MAX), "size_bytes:"),
    ];
    for (req, field) in cases {
        let e = c.create_lv(req).await.expect_err(field);
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().starts_with(field), "{}", e.message());
    }
    let e = c
        .create_lv(create_lv("v", "no-such-group", MIB))
        .await
        .expect_err("unknown group");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("no-such-group"), "{}", e.message());
    let e = c.resize_lv(resize("v", 0)).await.expect_err("zero size");
    assert!(e.message().starts_with("size_bytes:"), "{}", e.message());
}

#[tokio::test]
async fn pod_io_limits_refusals_name_the_field() {
    let group = unique("g");
    let (node, _dirs) = node(&group).await;
    let mut c = node.client("controller").await.expect("client");
    c.create_lv(create_lv("dir-vol", &group, MIB))
        .await
        .expect("CreateLV");
    let uid = "0e5b2a57-6a3f-4c1e-9d3b-7f2a9c4d1e00";
    let set = |pod_uid: &str, volume: &str, write_iops: u64| pb::SetPodIoLimitsRequest {
        pod_uid: pod_uid.into(),
        volume: volume.into(),
        limits: Some(pb::IoLimits {
            write_bps: MIB,
            write_iops,
            ..Default::default()
        }),
    };
    for (req, code, start) in [
        (set("", "dir-vol", 0), Code::InvalidArgument, "pod_uid:"),
        (
            set("../../x", "dir-vol", 0),
            Code::InvalidArgument,
            "pod_uid:",
        ),
        (set(uid, "", 0), Code::InvalidArgument, "volume:"),
        (
            set(uid, "dir-vol", 1 << 40),
            Code::InvalidArgument,
            "limits.write_iops:",
        ),
        (
            set(uid, "no-such-vol", 0),
            Code::NotFound,
            "volume \"no-such-vol\"",
        ),
        // A HOST volume is a directory: nothing to throttle.
        (
            set(uid, "dir-vol", 0),
            Code::FailedPrecondition,
            "IO limits on \"dir-vol\"",
        ),
    ] {
        let e = c.set_pod_io_limits(req).await.expect_err(start);
        assert_eq!(e.code(), code, "{e:?}");
        assert!(e.message().starts_with(start), "{}", e.message());
    }
    let listed = c
        .list_pod_io_limits(pb::ListPodIoLimitsRequest::default())
        .await
        .expect("ListPodIOLimits")
        .into_inner();
    assert!(listed.limits.is_empty(), "{listed:?}");
    let cleared = c
        .clear_pod_io_limits(pb::ClearPodIoLimitsRequest {
            pod_uid: uid.into(),
            volume: String::new(),
        })
        .await
        .expect("clearing a pod without a cgroup succeeds")
        .into_inner();
    assert_eq!(cleared.cleared, 0);
    let e = c
        .list_pod_io_limits(pb::ListPodIoLimitsRequest {
            pod_uid: "a b".into(),
        })
        .await
        .expect_err("bad uid");
    assert!(e.message().starts_with("pod_uid:"), "{}", e.message());
}

#[tokio::test]
async fn capacity_and_watch_follow_a_create() {
    let group = unique("g");
    let (node, _dirs) = node(&group).await;
    let mut c = node.client("controller").await.expect("client");
    let mut reader = node.client("reader").await.expect("reader");

    let before = capacity(&reader).await;
    assert_eq!(before.node_name, "node-a");
    assert_eq!(before.reason, pb::ChangeReason::Current as i32);
    assert_eq!(before.groups.len(), 1);
    let g = &before.groups[0];
    assert_eq!(g.device_group, group);
    assert_eq!(g.volume_count, 0);
    assert_eq!(
        g.allocatable_bytes,
        g.free_bytes.saturating_sub(g.reserve_bytes)
    );

    let mut watch = reader
        .watch_capacity(pb::WatchCapacityRequest {})
        .await
        .expect("WatchCapacity")
        .into_inner();
    let first = tokio::time::timeout(HANG_GUARD, watch.message())
        .await
        .expect("first message in time")
        .expect("stream ok")
        .expect("a message");
    assert_eq!(first.reason, pb::ChangeReason::Current as i32);
    assert_eq!(first.groups[0].volume_count, 0);

    let created = c
        .create_lv(create_lv("watched", &group, 4 * MIB))
        .await
        .expect("create")
        .into_inner();
    let update = tokio::time::timeout(HANG_GUARD, watch.message())
        .await
        .expect("update in time")
        .expect("stream ok")
        .expect("a message");
    assert_eq!(update.reason, pb::ChangeReason::Create as i32);
    assert!(update.generation > first.generation);
    // The create names the report that first counts it: this one.
    let version = created.capacity.expect("capacity version");
    assert!(!first.incarnation.is_empty());
    assert_eq!(version.incarnation, first.incarnation);
    assert_eq!(update.incarnation, first.incarnation);
    assert_eq!(version.generation, update.generation);
    // Growing it names a later one that counts the new size.
    let grown = c
        .resize_lv(resize("watched", 8 * MIB))
        .await
        .expect("grow")
        .into_inner()
        .capacity
        .expect("capacity version");
    assert!(grown.generation > version.generation);
    let after_grow = tokio::time::timeout(HANG_GUARD, watch.message())
        .await
        .expect("update in time")
        .expect("stream ok")
        .expect("a message");
    assert_eq!(after_grow.generation, grown.generation);
    assert_eq!(after_grow.reason, pb::ChangeReason::Resize as i32);
    assert_eq!(update.node_name, "node-a");
    assert_eq!(update.groups[0].volume_count, 1);
    let one = reader
        .capacity(pb::CapacityRequest {
            device_group: group.clone(),
        })
        .await
        .expect("one group")
        .into_inner();
    assert_eq!(one.groups.len(), 1);
    assert_eq!(one.groups[0].volume_count, 1);
    assert!(one.generation >= update.generation);

    // Shutting the server down ends the watch instead of hanging it.
    node.stop().await.expect("clean stop");
    let end = tokio::time::timeout(HANG_GUARD, watch.message())
        .await
        .expect("stream ends in time");
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
}

#[tokio::test]
async fn disks_config_and_bcache() {
    let group = unique("g");
    let (node, dirs) = node(&group).await;
    let mut c = node.client("controller").await.expect("client");

    let disks = c
        .list_disks(pb::ListDisksRequest {})
        .await
        .expect("ListDisks")
        .into_inner()
        .disks;
    let engine_disks = node.engine.disks();
    assert_eq!(disks.len(), engine_disks.len());
    for (wire, domain) in disks.iter().zip(&engine_disks) {
        assert_eq!(wire.name, domain.disk.name);
        assert_eq!(wire.size_bytes, domain.disk.size_bytes);
    }

    // A bad configuration names the field inside the JSON and changes
    // nothing.
    let bad = c
        .apply_config(pb::ApplyConfigRequest {
            config_json: r#"{"diskSelector":[{"name":"x","policy":"ZFS"}]}"#.into(),
        })
        .await
        .expect_err("invalid");
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert!(
        bad.message()
            .starts_with("config_json: diskSelector[0].policy"),
        "{}",
        bad.message()
    );
    assert_eq!(node.engine.config().await.groups[0].name, group);

    let second = unique("g2");
    let root2 = tempfile::tempdir().expect("tempdir");
    let text = host_config(&second, root2.path(), 0);
    let applied = c
        .apply_config(pb::ApplyConfigRequest { config_json: text })
        .await
        .expect("ApplyConfig")
        .into_inner();
    assert_eq!(applied.device_groups, vec![second.clone()]);
    let cap = capacity(&c).await;
    let names: Vec<_> = cap.groups.iter().map(|g| g.device_group.clone()).collect();
    assert_eq!(names, vec![second.clone()]);
    drop(dirs);

    // This node has no state directory for bcache records: creating and
    // changing bcache devices is refused, and there are none to find.
    let e = c
        .create_bcache(pb::CreateBcacheRequest {
            name: "b".into(),
            backing_volume: "x".into(),
            cache_volume: "y".into(),
            ..Default::default()
        })
        .await
        .expect_err("bcache");
    assert_eq!(e.code(), Code::FailedPrecondition, "{}", e.message());
    assert!(e.message().contains("--state-dir"), "{}", e.message());
    for e in [
        c.delete_bcache(pb::DeleteBcacheRequest { name: "b".into() })
            .await
            .expect_err("bcache"),
        c.get_bcache(pb::GetBcacheRequest { name: "b".into() })
            .await
            .expect_err("bcache"),
        c.set_cache_mode(pb::SetCacheModeRequest {
            name: "b".into(),
            cache_mode: 2,
        })
        .await
        .expect_err("bcache"),
    ] {
        assert_eq!(e.code(), Code::NotFound, "{}", e.message());
    }
}

#[tokio::test]
async fn health_and_reflection_for_any_authenticated_client() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let group = unique("g");
    let (node, _dirs) = node(&group).await;
    // A role this version does not know may still probe health.
    let channel =
        carina_proto::tls::connect(&node.endpoint(), &node.client_tls("prober").expect("tls"))
            .await
            .expect("connect");
    let mut health = HealthClient::new(channel.clone());
    let status = health
        .check(HealthCheckRequest {
            service: "carina.nodestorage.v1.NodeStorage".into(),
        })
        .await
        .expect("health")
        .into_inner();
    assert_eq!(status.status, ServingStatus::Serving as i32);

    let mut reflection = ServerReflectionClient::new(channel);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = reflection
        .server_reflection_info(futures::stream::iter(vec![req]))
        .await
        .expect("reflection")
        .into_inner();
    let resp = stream.message().await.expect("ok").expect("one response");
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("unexpected reflection answer: {resp:?}");
    };
    let services: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    assert!(
        services.contains(&"carina.nodestorage.v1.NodeStorage".to_string()),
        "{services:?}"
    );
    assert!(
        services.contains(&"grpc.health.v1.Health".to_string()),
        "{services:?}"
    );
}

#[tokio::test]
async fn metrics_endpoint_counts_calls() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let group = unique("g");
    let (node, _dirs) = node(&group).await;
    let mut c = node.client("controller").await.expect("client");
    c.create_lv(create_lv("m1", &group, MIB))
        .await
        .expect("create");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(carina_node::server::metrics::serve(
        listener,
        node.metrics.clone(),
        node.engine.clone(),
        "node-a".into(),
        async {
            let _ = stopped.await;
        },
    ));
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut text = String::new();
    tokio::time::timeout(HANG_GUARD, s.read_to_string(&mut text))
        .await
        .expect("in time")
        .expect("read");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        text.contains(
            r#"carina_node_grpc_requests_total{node="node-a",method="CreateLV",code="OK"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            r#"carina_node_volumes{{node="node-a",device_group="{group}",policy="HOST"}} 1"#
        )),
        "{text}"
    );
    // The latency histograms: of the gRPC call and of the engine's
    // operation on the HOST group (counts are the process's, other tests
    // add to them).
    for family in [
        r#"carina_node_grpc_server_duration_seconds_count{method="carina.nodestorage.v1.NodeStorage/CreateLV",code="OK"}"#,
        r#"carina_node_engine_operation_duration_seconds_count{operation="create",policy="HOST",result="ok"}"#,
    ] {
        assert!(text.contains(family), "{family} in {text}");
    }
    let _ = stop.send(());
    server.await.expect("metrics server stops");
}

/// 100 concurrent creates into a group that holds only some of them: the
/// successes never exceed what was allocatable, every other call is
/// RESOURCE_EXHAUSTED, and the final Capacity is what the engine reports.
/// The group lives on a small tmpfs so its size is the test's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_never_overcommit() {
    if !have_root("concurrent_creates_never_overcommit") {
        return;
    }
    let mnt = tempfile::tempdir().expect("tempdir");
    let _tmpfs = MountGuard::mount("tmpfs", mnt.path(), Some("tmpfs"), Some("size=40m"))
        .expect("mount tmpfs");
    let group = unique("g");
    let (engine, _dirs) = host_engine(&group, Some(mnt.path())).await.expect("engine");
    let node = TestNode::start(engine, "node-a").await.expect("server");
    let client: Client = node.client("controller").await.expect("client");

    let before = capacity(&client).await.groups.remove(0);
    let size = 3 * MIB;
    assert!(
        before.allocatable_bytes < 100 * size,
        "the group must not fit all of them: {}",
        before.allocatable_bytes
    );

    let calls = (0..100).map(|i| {
        let mut c = client.clone();
        let req = create_lv(&format!("burst-{i:03}"), &group, size);
        async move { c.create_lv(req).await }
    });
    let results = futures::future::join_all(calls).await;
    let mut ok = 0u64;
    for r in &results {
        match r {
            Ok(resp) => {
                assert!(resp.get_ref().created);
                ok += 1;
            }
            Err(e) => assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}"),
        }
    }
    assert!(ok > 0, "some fit");
    assert!(ok < 100, "not all fit");
    assert!(
        ok * size <= before.allocatable_bytes,
        "{ok} volumes of {size} bytes exceed the {} allocatable bytes",
        before.allocatable_bytes
    );

    let after = capacity(&client).await.groups.remove(0);
    let engine = node.engine.capacity(None).await.expect("engine capacity");
    assert_eq!(after.volume_count as u64, ok);
    assert_eq!(engine[0].volume_count as u64, ok);
    assert_eq!(after.allocatable_bytes, engine[0].allocatable_bytes);
    assert_eq!(after.free_bytes, engine[0].free_bytes);
    assert!(
        after.allocatable_bytes < size,
        "a rejected create would have fit: {} bytes still allocatable",
        after.allocatable_bytes
    );
    let listed = client
        .clone()
        .list_l_vs(pb::ListLVsRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert_eq!(listed.volumes.len() as u64, ok);
    node.stop().await.expect("stop");
}
