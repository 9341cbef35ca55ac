//! The Kubernetes provisioner against a real kube-apiserver: the CSI
//! Controller served on a unix socket over `KubeProvisioner`, called
//! through a tonic client as the sidecars call it, with the fake bridge
//! of [`carina_tests::kube::fake_bridge`] writing the `LogicVolume`
//! statuses (success, failures, slow and silent cases). It
//! proves the watch path: CreateVolume returns as soon as the status is
//! written, never a polling interval later; the error codes; idempotent
//! repeats; DeleteVolume waiting for the finalizer; ControllerExpandVolume
//! waiting for `currentSize`; 20 creates running concurrently. And Lease
//! leader election: one of two candidates leads, the other takes over
//! after the first crashes (bounded by the lease duration) or steps down.
//! And the `carina-controller --mode kube` binary: two replicas, one
//! Lease, CSI served by both, the lease handed over on SIGTERM.
//!
//! Needs etcd and kube-apiserver from `tests/tools/build.sh etcd kube`,
//! and `cargo build --bins` for the binary.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result};
use carina_api::{LOGICVOLUME_FINALIZER, LogicVolume, TRACEPARENT_ANNOTATION};
use carina_csi::strategy::Strategy;
use carina_csi::{TOPOLOGY_KEY, context};
use carina_proto::csi;
use carina_proto::csi::controller_client::ControllerClient;
use carina_proto::devcerts::{DevCa, Validity};
use carina_proto::tls::DEFAULT_TRUST_DOMAIN;
use carina_tests::csi::{Csi, delete, make, make_err, mount_cap, node_of, on, with_params};
use carina_tests::grpc::unix_channel;
use carina_tests::kube::fake_bridge::{
    AbortOnDrop, BRIDGE_DELAY, GO_ANNOTATION, MANY_DELAY, Record, controller, fake_bridge, publish,
};
use carina_tests::kube::{
    Candidate, KubeCluster, await_lease_holder, gone, lease_holder, short_lease,
};
use carina_tests::metrics::{scrape, value};
use carina_tests::process::{ChildGuard, wait_for_path, workspace_binary};
use carina_tests::unique;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::time::Instant;
use tonic::Code;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const A: &str = "node-a";
const B: &str = "node-b";
/// How soon after the status is written a call must have returned to
/// count as woken by the watch: a quarter of the controllers' 20 s wait,
/// so a call that only ended at its deadline (or a poll of seconds) is
/// told apart from one the watch ended, on a loaded machine too. How fast
/// the watch path is belongs to `make bench` (the kube create beside its
/// floor), not to a timed assertion here.
const PROMPT: Duration = Duration::from_secs(WAIT.as_secs() / 4);
/// How long the controllers' calls wait for the bridge.
const WAIT: Duration = Duration::from_secs(20);

/// A volume for an xfs mount.
fn create(name: &str, required: u64) -> csi::CreateVolumeRequest {
    carina_tests::csi::create(name, required, "xfs")
}

/// Installs, once per test binary, a subscriber with an OpenTelemetry
/// layer, so spans have trace contexts to propagate.
fn tracing_with_opentelemetry() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        use opentelemetry::trace::TracerProvider as _;
        use tracing_subscriber::layer::SubscriberExt;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::set_global_default(subscriber).expect("first subscriber");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_provisioner_over_a_real_apiserver() -> Result<()> {
    tracing_with_opentelemetry();
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();
    publish(&client, A, GIB).await?;
    publish(&client, B, 2 * GIB).await?;
    let record = Record::default();
    // Declared after the cluster, so it stops before the apiserver does.
    let _bridge = AbortOnDrop(tokio::spawn(fake_bridge(client.clone(), record.clone())));

    let mut spread = controller(client.clone(), Strategy::Spreadout, WAIT).await?;
    let mut pack = controller(client.clone(), Strategy::Binpack, WAIT).await?;
    let lvs: Api<LogicVolume> = Api::all(client.clone());

    create_returns_when_the_status_is_written(&mut spread.csi, &lvs, &record).await?;
    placement(&mut spread.csi, &mut pack.csi, &lvs).await?;
    repeats_are_idempotent(&mut spread.csi).await?;
    ignored_parameters_warn_on_the_claim(&client, &mut spread.csi).await?;
    bridge_codes(&mut spread.csi, &lvs).await?;
    deadline_then_retry(&client, &mut spread.csi, &lvs).await?;
    delete_waits_for_the_finalizer(&mut spread.csi, &lvs, &record).await?;
    expand_waits_for_current_size(&mut spread.csi, &record).await?;
    lists_and_capacity(&mut spread.csi).await?;
    concurrent_creates(&spread.csi).await?;
    Ok(())
}

async fn create_returns_when_the_status_is_written(
    csi: &mut Csi,
    lvs: &Api<LogicVolume>,
    record: &Record,
) -> Result<()> {
    let mut req = with_params(
        create("pvc-timing", 10 * MIB),
        &[
            ("csi.storage.k8s.io/pvc/name", "data"),
            ("csi.storage.k8s.io/pvc/namespace", "apps"),
        ],
    );
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![on(A), on(B)],
        preferred: vec![on(A)],
    });
    // The caller's trace, as external-provisioner would send it.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut request = tonic::Request::new(req);
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-00f067aa0ba902b7-01").parse()?,
    );
    let start = Instant::now();
    let v = csi
        .create_volume(request)
        .await
        .context("CreateVolume pvc-timing")?
        .into_inner()
        .volume
        .context("no volume")?;
    let returned = Instant::now();
    let written = record
        .get("status/pvc-timing")
        .context("the fake bridge wrote no status")?;
    assert!(
        returned.duration_since(start) >= BRIDGE_DELAY,
        "CreateVolume returned before the bridge could have answered"
    );
    let lag = returned.duration_since(written);
    assert!(
        lag < PROMPT,
        "CreateVolume returned {lag:?} after the status was written"
    );
    eprintln!("CreateVolume returned {lag:?} after the status was written");

    assert_eq!(v.volume_id, "pvc-timing@node-a");
    assert_eq!(
        v.capacity_bytes,
        (12 * MIB) as i64,
        "rounded to the 4 MiB unit"
    );
    let ctx = &v.volume_context;
    assert_eq!(ctx[context::NODE], A, "the preferred (selected) node");
    assert_eq!(ctx[context::PATH], "/dev/carina/pvc-timing");
    assert_eq!(ctx[context::MAJOR], "253");
    assert_eq!(ctx[context::MINOR], "7");
    assert_eq!(ctx[context::GROUP], "ssd");
    assert_eq!(ctx[context::POLICY], "LVM");
    assert_eq!(ctx[context::FS_TYPE], "xfs");
    assert_eq!(
        v.accessible_topology[0].segments[TOPOLOGY_KEY], A,
        "pinned to its node"
    );

    let lv = lvs.get("pvc-timing").await?;
    assert_eq!(lv.spec.node_name, A);
    assert_eq!(
        lv.spec.size.0,
        (12 * MIB).to_string(),
        "a plain byte quantity"
    );
    assert_eq!(lv.spec.device_group, "ssd");
    assert_eq!(
        (lv.spec.pvc.as_str(), lv.spec.name_space.as_str()),
        ("data", "apps")
    );
    assert_eq!(lv.finalizers(), [LOGICVOLUME_FINALIZER.to_string()]);
    let traceparent = lv
        .annotations()
        .get(TRACEPARENT_ANNOTATION)
        .context("no traceparent annotation")?;
    assert!(
        traceparent.starts_with(&format!("00-{trace_id}-")),
        "the caller's trace continues: {traceparent}"
    );
    Ok(())
}

async fn placement(spread: &mut Csi, pack: &mut Csi, lvs: &Api<LogicVolume>) -> Result<()> {
    // Immediate binding: node-b has 2 GiB free, node-a 1 GiB.
    let v = make(spread, create("pvc-spread", 100 * MIB)).await?;
    assert_eq!(node_of(&v), B, "spreadout takes the emptiest node");
    let v = make(pack, create("pvc-pack", 100 * MIB)).await?;
    assert_eq!(node_of(&v), A, "binpack takes the fullest node that fits");
    let v = make(pack, create("pvc-big", 1500 * MIB)).await?;
    assert_eq!(node_of(&v), B, "only node-b has room");
    // The group parameter, and the first suitable group for block access
    // (node-b's HOST group cannot serve it; its LVM group comes first anyway).
    let v = make(
        pack,
        with_params(
            create("pvc-host", MIB + 1),
            &[(carina_csi::params::DISK_GROUP, "host")],
        ),
    )
    .await?;
    assert_eq!(
        (node_of(&v), v.volume_context[context::GROUP].as_str()),
        (B, "host")
    );
    assert_eq!(
        v.capacity_bytes,
        (MIB + 4096) as i64,
        "rounded to the group's 4 KiB unit"
    );
    assert_eq!(v.volume_context[context::POLICY], "HOST");
    assert!(
        !v.volume_context.contains_key(context::MAJOR),
        "a directory has no device numbers"
    );

    // WaitForFirstConsumer: the selected node even where the strategy
    // would choose another.
    let mut req = create("pvc-selected", 10 * MIB);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![on(A), on(B)],
        preferred: vec![on(A), on(B)],
    });
    assert_eq!(node_of(&make(spread, req).await?), A);
    // A selected node without room: RESOURCE_EXHAUSTED (external-provisioner
    // then reschedules), not a volume elsewhere.
    let mut req = create("pvc-no-room", 1800 * MIB);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![on(A), on(B)],
        preferred: vec![on(A)],
    });
    let s = make_err(spread, req).await;
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert!(
        lvs.get_opt("pvc-no-room").await?.is_none(),
        "nothing created"
    );
    // A selected node that has not published capacity yet takes the volume
    // when the request names the group; sizes round to 1 MiB.
    let mut req = with_params(
        create("pvc-unpublished", 10 * MIB + 1),
        &[(carina_csi::params::DISK_GROUP, "ssd")],
    );
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![on("node-c")],
        preferred: vec![on("node-c")],
    });
    let v = make(spread, req).await?;
    assert_eq!(
        (node_of(&v), v.capacity_bytes),
        ("node-c", (11 * MIB) as i64)
    );
    let mut req = create("pvc-unpublished-nogroup", 10 * MIB);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![on("node-c")],
        preferred: vec![on("node-c")],
    });
    let s = make_err(spread, req).await;
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");

    // Refused before anything is written.
    let s = make_err(
        spread,
        with_params(
            create("pvc-nogroup", MIB),
            &[(carina_csi::params::DISK_GROUP, "nvme")],
        ),
    )
    .await;
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    let s = make_err(spread, create("pvc-huge", 9 * GIB)).await;
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    for name in ["pvc-nogroup", "pvc-huge"] {
        assert!(lvs.get_opt(name).await?.is_none(), "{name} created");
    }
    Ok(())
}

async fn repeats_are_idempotent(csi: &mut Csi) -> Result<()> {
    let first = make(csi, create("pvc-again", 10 * MIB)).await?;
    let start = Instant::now();
    let again = make(csi, create("pvc-again", 10 * MIB)).await?;
    assert!(
        start.elapsed() < PROMPT,
        "a made volume is returned at once"
    );
    assert_eq!(again, first);
    // 12 MiB were made: a range that holds it is the same volume.
    let mut within = create("pvc-again", 11 * MIB);
    within.capacity_range = Some(csi::CapacityRange {
        required_bytes: (11 * MIB) as i64,
        limit_bytes: (12 * MIB) as i64,
    });
    assert_eq!(make(csi, within).await?.volume_id, first.volume_id);
    let s = make_err(csi, create("pvc-again", 20 * MIB)).await;
    assert_eq!(s.code(), Code::AlreadyExists, "{s:?}");
    let s = make_err(
        csi,
        with_params(
            create("pvc-again", 10 * MIB),
            &[(carina_csi::params::DISK_GROUP, "host")],
        ),
    )
    .await;
    assert_eq!(s.code(), Code::AlreadyExists, "{s:?}");
    // A CSI name that is no object name maps to the same hashed object.
    let odd = "Volume Of Sanity";
    let v1 = make(csi, create(odd, MIB)).await?;
    let v2 = make(csi, create(odd, MIB)).await?;
    assert_eq!(v1.volume_id, v2.volume_id);
    assert!(v1.volume_id.starts_with("csi-"), "{}", v1.volume_id);
    Ok(())
}

/// A StorageClass key this driver does not read is accepted (as Go Carina
/// did) and a Warning Event on the claim names it; a class whose every key
/// has its effect makes no Event.
async fn ignored_parameters_warn_on_the_claim(client: &Client, csi: &mut Csi) -> Result<()> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let claim = |name: &str| -> Result<PersistentVolumeClaim> {
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Mi"}}},
        }))?)
    };
    let mut uids = Vec::new();
    for name in ["data-ignored", "data-plain"] {
        let made = claims.create(&PostParams::default(), &claim(name)?).await?;
        uids.push(made.uid().context("a uid")?);
    }
    let of = |pvc: &str| {
        [
            ("csi.storage.k8s.io/pvc/name", pvc.to_string()),
            ("csi.storage.k8s.io/pvc/namespace", "default".to_string()),
        ]
    };
    let mut ignored = create("pvc-ignored", MIB);
    ignored.parameters.extend(
        of("data-ignored")
            .map(|(k, v)| (k.to_string(), v))
            .into_iter()
            .chain([(
                "carina.storage.io/volume-type".to_string(),
                "lvm".to_string(),
            )]),
    );
    make(csi, ignored).await?;
    let mut plain = create("pvc-plain", MIB);
    plain
        .parameters
        .extend(of("data-plain").map(|(k, v)| (k.to_string(), v)));
    make(csi, plain).await?;
    // The Event is written before the create goes on: it is there now.
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let warnings: Vec<Event> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("StorageClassParametersIgnored"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    let w = &warnings[0];
    assert_eq!(w.type_.as_deref(), Some("Warning"));
    let regarding = w.regarding.as_ref().context("regarding")?;
    assert_eq!(regarding.uid.as_ref(), Some(&uids[0]), "on the claim");
    assert_eq!(regarding.kind.as_deref(), Some("PersistentVolumeClaim"));
    let note = w.note.as_deref().unwrap_or_default();
    assert!(note.contains("carina.storage.io/volume-type"), "{note}");
    Ok(())
}

async fn bridge_codes(csi: &mut Csi, lvs: &Api<LogicVolume>) -> Result<()> {
    for (name, code, text) in [
        ("fail-exhausted-1", Code::ResourceExhausted, "0 bytes free"),
        (
            "fail-invalid-1",
            Code::InvalidArgument,
            "no group named ssd",
        ),
        ("fail-internal-1", Code::Internal, "lvcreate failed: boom"),
        ("fail-unavailable-1", Code::Unavailable, "cannot be reached"),
    ] {
        let s = make_err(csi, create(name, 10 * MIB)).await;
        assert_eq!(s.code(), code, "{name}: {s:?}");
        assert!(s.message().contains(text), "{name}: {s:?}");
    }
    // A final failure removes its object (after the bridge released it),
    // so a retry starts over; a retryable one leaves it to the bridge.
    gone(lvs, "fail-exhausted-1", Duration::from_secs(10)).await?;
    assert!(lvs.get_opt("fail-unavailable-1").await?.is_some());
    // The retry of a final failure fails the same way, afresh.
    let s = make_err(csi, create("fail-exhausted-1", 10 * MIB)).await;
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    Ok(())
}

async fn deadline_then_retry(client: &Client, csi: &mut Csi, lvs: &Api<LogicVolume>) -> Result<()> {
    let mut short = controller(client.clone(), Strategy::Spreadout, Duration::from_secs(1)).await?;
    let start = Instant::now();
    let s = make_err(&mut short.csi, create("silent-1", 10 * MIB)).await;
    assert_eq!(s.code(), Code::DeadlineExceeded, "{s:?}");
    assert!(start.elapsed() >= Duration::from_secs(1));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(lvs.get_opt("silent-1").await?.is_some(), "the object stays");

    let s = make_err(&mut short.csi, create("slow-1", 10 * MIB)).await;
    assert_eq!(s.code(), Code::DeadlineExceeded, "{s:?}");
    // The bridge gets to it; the retry finds the object and waits for it.
    let retry = {
        let mut csi = csi.clone();
        tokio::spawn(async move { make(&mut csi, create("slow-1", 10 * MIB)).await })
    };
    lvs.patch(
        "slow-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {GO_ANNOTATION: "1"}}})),
    )
    .await?;
    let v = retry.await??;
    assert_eq!(v.volume_id, format!("slow-1@{B}"));
    let count = lvs
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|lv| lv.name_any() == "slow-1")
        .count();
    assert_eq!(count, 1);
    Ok(())
}

async fn delete_waits_for_the_finalizer(
    csi: &mut Csi,
    lvs: &Api<LogicVolume>,
    record: &Record,
) -> Result<()> {
    let v = make(csi, create("pvc-delete", 10 * MIB)).await?;
    let start = Instant::now();
    delete(csi, &v.volume_id).await?;
    let returned = Instant::now();
    let released = record
        .get("gone/pvc-delete")
        .context("the fake bridge never removed the finalizer")?;
    assert!(
        returned.duration_since(start) >= BRIDGE_DELAY,
        "DeleteVolume did not wait"
    );
    assert!(
        returned.duration_since(released) < PROMPT,
        "{:?}",
        returned.duration_since(released)
    );
    assert!(lvs.get_opt("pvc-delete").await?.is_none());
    // Deleting again, or a volume that never was, or an id naming another
    // node: nothing to do.
    for id in [
        v.volume_id.clone(),
        "nothing@node-a".into(),
        "pvc-again@node-a".into(),
        "Bad Name@node-a".into(),
    ] {
        delete(csi, &id).await?;
    }
    assert!(
        lvs.get_opt("pvc-again").await?.is_some(),
        "pvc-again lives on node-b"
    );
    Ok(())
}

async fn expand_waits_for_current_size(csi: &mut Csi, record: &Record) -> Result<()> {
    let v = make(csi, create("pvc-grow", 10 * MIB)).await?;
    let expand = |id: &str, bytes: u64| csi::ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        volume_capability: Some(mount_cap("xfs")),
        ..Default::default()
    };
    let start = Instant::now();
    let r = csi
        .controller_expand_volume(expand(&v.volume_id, 30 * MIB))
        .await?
        .into_inner();
    let returned = Instant::now();
    assert_eq!(r.capacity_bytes, (32 * MIB) as i64, "rounded to the unit");
    assert!(r.node_expansion_required);
    let grown = record.get("grow/pvc-grow").context("never grown")?;
    assert!(returned.duration_since(start) >= BRIDGE_DELAY);
    assert!(returned.duration_since(grown) < PROMPT);
    // Smaller than it is: nothing to do.
    let r = csi
        .controller_expand_volume(expand(&v.volume_id, 20 * MIB))
        .await?
        .into_inner();
    assert_eq!(r.capacity_bytes, (32 * MIB) as i64);

    let v = make(csi, create("nogrow-1", 10 * MIB)).await?;
    let s = csi
        .controller_expand_volume(expand(&v.volume_id, 40 * MIB))
        .await
        .expect_err("no room");
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    let s = csi
        .controller_expand_volume(expand("missing@node-a", 40 * MIB))
        .await
        .expect_err("missing");
    assert_eq!(s.code(), Code::NotFound, "{s:?}");
    Ok(())
}

async fn lists_and_capacity(csi: &mut Csi) -> Result<()> {
    let listed = csi
        .list_volumes(csi::ListVolumesRequest::default())
        .await?
        .into_inner();
    let ids: Vec<String> = listed
        .entries
        .iter()
        .filter_map(|e| e.volume.as_ref().map(|v| v.volume_id.clone()))
        .collect();
    for want in ["pvc-timing@node-a", "pvc-spread@node-b", "pvc-pack@node-a"] {
        assert!(ids.contains(&want.to_string()), "{want} not in {ids:?}");
    }
    for never_made in ["silent-1", "fail-unavailable-1"] {
        assert!(!ids.iter().any(|id| id.starts_with(never_made)), "{ids:?}");
    }
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(ids, sorted);

    let capacity = |topology: Option<csi::Topology>, group: Option<&str>| csi::GetCapacityRequest {
        accessible_topology: topology,
        parameters: group
            .map(|g| HashMap::from([(carina_csi::params::DISK_GROUP.to_string(), g.to_string())]))
            .unwrap_or_default(),
        ..Default::default()
    };
    let all = csi
        .get_capacity(capacity(None, Some("ssd")))
        .await?
        .into_inner();
    assert_eq!(all.available_capacity, (3 * GIB) as i64, "as published");
    assert_eq!(all.maximum_volume_size, Some((2 * GIB) as i64));
    let a = csi
        .get_capacity(capacity(Some(on(A)), None))
        .await?
        .into_inner();
    assert_eq!(a.available_capacity, GIB as i64);
    let b = csi
        .get_capacity(capacity(Some(on(B)), None))
        .await?
        .into_inner();
    assert_eq!(b.available_capacity, (10 * GIB) as i64, "ssd and host");
    Ok(())
}

async fn concurrent_creates(csi: &Csi) -> Result<()> {
    let start = Instant::now();
    let creates = (0..20).map(|i| {
        let mut csi = csi.clone();
        tokio::spawn(async move { make(&mut csi, create(&format!("many-{i}"), 10 * MIB)).await })
    });
    let made = futures::future::try_join_all(creates).await?;
    let took = start.elapsed();
    for v in made {
        v?;
    }
    // One after another they would take 20 × MANY_DELAY.
    assert!(took < 5 * MANY_DELAY, "20 creates took {took:?}");
    eprintln!("20 concurrent creates took {took:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_and_a_bounded_takeover() -> Result<()> {
    let cluster = KubeCluster::start().await?;
    let client = cluster.client();
    let name = unique("carina-controller");
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let lease_duration = short_lease(&name, "x").lease_duration;

    let mut a = Candidate::start(&client, short_lease(&name, "replica-a"))?;
    a.until_leading(Duration::from_secs(5)).await?;
    let mut b = Candidate::start(&client, short_lease(&name, "replica-b"))?;
    // b watches a renew for longer than a lease lasts and never leads.
    let mut b_led = b.leading.clone();
    let b_never = tokio::time::timeout(
        lease_duration + Duration::from_secs(1),
        b_led.wait_for(|l| *l),
    )
    .await;
    assert!(b_never.is_err(), "two leaders");
    assert!(*a.leading.borrow());
    let lease = leases.get(&name).await?.spec.context("spec")?;
    assert_eq!(lease.holder_identity.as_deref(), Some("replica-a"));
    assert_eq!(lease.lease_duration_seconds, Some(4));
    assert!(lease.acquire_time.is_some() && lease.renew_time.is_some());
    assert_eq!(lease.lease_transitions, Some(0));

    // a crashes: no release. b takes over once the lease has expired.
    a.task.abort();
    let crashed = Instant::now();
    b.until_leading(lease_duration + Duration::from_secs(3))
        .await?;
    let took = crashed.elapsed();
    assert!(
        took >= lease_duration - Duration::from_millis(500),
        "b took the lease {took:?} after a stopped renewing, before it expired"
    );
    eprintln!("takeover after a crash: {took:?}");
    assert_eq!(
        lease_holder(&leases, &name).await?,
        (Some("replica-b".into()), 1)
    );

    // a comes back as a standby; b shuts down and releases: a takes over
    // at its next retry, long before the lease would expire.
    let mut a = Candidate::start(&client, short_lease(&name, "replica-a"))?;
    let mut a_led = a.leading.clone();
    let a_waits = tokio::time::timeout(Duration::from_secs(1), a_led.wait_for(|l| *l)).await;
    assert!(a_waits.is_err(), "a led while b held the lease");
    let stepped_down = Instant::now();
    let _ = b.stop.take().map(|s| s.send(()));
    tokio::time::timeout(Duration::from_secs(5), &mut b.task).await??;
    assert!(!*b.leading.borrow(), "b published that it stopped leading");
    a.until_leading(Duration::from_secs(3)).await?;
    let took = stepped_down.elapsed();
    assert!(
        took < lease_duration,
        "a waited for expiry ({took:?}) despite the release"
    );
    assert_eq!(
        lease_holder(&leases, &name).await?,
        (Some("replica-a".into()), 2)
    );

    let _ = a.stop.take().map(|s| s.send(()));
    tokio::time::timeout(Duration::from_secs(5), &mut a.task).await??;
    let (holder_now, _) = lease_holder(&leases, &name).await?;
    assert_eq!(holder_now, None, "released on shutdown");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn carina_controller_in_kube_mode() -> Result<()> {
    let bin = workspace_binary("carina-controller")?;
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();
    let dir = tempfile::Builder::new()
        .prefix("carina-kube-ctl-")
        .tempdir()?;
    let ca = DevCa::new("carina kube mode CA", Validity::days(1))?;
    let cert = ca.issue_client(DEFAULT_TRUST_DOMAIN, "controller", Validity::days(1))?;
    let write = |name: &str, text: &str| -> Result<String> {
        let path = dir.path().join(name);
        std::fs::write(&path, text)?;
        Ok(path.display().to_string())
    };
    let (ca_pem, cert_pem, key_pem) = (
        write("ca.pem", ca.cert_pem())?,
        write("controller.pem", &cert.cert_pem)?,
        write("controller-key.pem", &cert.key_pem)?,
    );
    let lease = unique("carina-controller");
    let lease_duration = Duration::from_secs(10);
    let replica = |identity: &str, metrics_port: u16| -> Result<(ChildGuard, std::path::PathBuf)> {
        let sock = dir.path().join(format!("{identity}.sock"));
        let metrics_listen = format!("127.0.0.1:{metrics_port}");
        let args: Vec<String> = [
            "--metrics-listen",
            &metrics_listen,
            "--mode",
            "kube",
            "--kubeconfig",
            &cluster.kubeconfig_path().display().to_string(),
            "--csi-endpoint",
            &sock.display().to_string(),
            "--tls-ca",
            &ca_pem,
            "--tls-cert",
            &cert_pem,
            "--tls-key",
            &key_pem,
            "--lease-name",
            &lease,
            "--identity",
            identity,
            "--lease-duration-secs",
            "10",
            "--renew-deadline-secs",
            "5",
            "--retry-period-secs",
            "1",
            "--shutdown-grace-secs",
            "5",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        let log = cluster.log_dir().join(format!("{identity}.log"));
        let mut child = ChildGuard::spawn(identity, &bin, &args, &[("RUST_LOG", "info")], &log)?;
        tokio::task::block_in_place(|| wait_for_path(&sock, &mut child, Duration::from_secs(30)))?;
        Ok((child, sock))
    };
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");

    let [port_a, port_b] = carina_tests::ports::free_ports::<2>()?;
    let (mut a, a_sock) = replica("replica-a", port_a)?;
    await_lease_holder(&leases, &lease, "replica-a", Duration::from_secs(15)).await?;
    let (mut b, b_sock) = replica("replica-b", port_b)?;

    // The standby serves CSI too, through KubeProvisioner: no node has
    // published capacity, so a create is UNAVAILABLE and writes nothing.
    let mut csi = ControllerClient::new(unix_channel(b_sock).await?);
    let listed = csi
        .list_volumes(csi::ListVolumesRequest::default())
        .await?
        .into_inner();
    assert!(listed.entries.is_empty());
    let s = make_err(&mut csi, create("pvc-nowhere", MIB)).await;
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    let lvs: Api<LogicVolume> = Api::all(client.clone());
    assert!(lvs.get_opt("pvc-nowhere").await?.is_none());
    assert_eq!(
        lease_holder(&leases, &lease).await?,
        (Some("replica-a".into()), 0)
    );
    // Each replica's /metrics: who leads, and the CSI calls b answered.
    let leader = "carina_controller_leader";
    let a_metrics = scrape(port_a).await?;
    assert_eq!(value(&a_metrics, leader, &[]), Some(1.0));
    let b_metrics = scrape(port_b).await?;
    assert_eq!(value(&b_metrics, leader, &[]), Some(0.0));
    let calls = "carina_controller_grpc_server_duration_seconds_count";
    for (method, code) in [
        ("csi.v1.Controller/ListVolumes", "OK"),
        ("csi.v1.Controller/CreateVolume", "UNAVAILABLE"),
    ] {
        assert_eq!(
            value(&b_metrics, calls, &[("method", method), ("code", code)]),
            Some(1.0),
            "{method} {code}: {:?}",
            b_metrics.samples
        );
    }

    // SIGTERM: a stops its work, releases the lease and removes its socket;
    // b takes over at its next retry, not after the lease expires.
    let stopped = Instant::now();
    tokio::task::block_in_place(|| a.stop(Duration::from_secs(20)));
    assert!(!a_sock.exists(), "the socket is removed on shutdown");
    await_lease_holder(&leases, &lease, "replica-b", lease_duration).await?;
    let took = stopped.elapsed();
    assert!(
        took < lease_duration,
        "b waited {took:?}: the lease was not released"
    );
    eprintln!("kube mode: lease handed over {took:?} after SIGTERM");
    b.check_running()?;
    tokio::task::block_in_place(|| b.stop(Duration::from_secs(20)));
    assert_eq!(
        lease_holder(&leases, &lease).await?.0,
        None,
        "released on shutdown"
    );
    Ok(())
}
