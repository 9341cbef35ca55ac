//! `CreateVolume` through the Kubernetes control plane — CSI over its
//! unix socket → `KubeProvisioner` writes a `LogicVolume` and watches it →
//! the bridge sees it and calls `CreateLV` over mutual TLS → the engine
//! runs `lvcreate` → the bridge writes the status → the watch fires —
//! against the bare `lvcreate` on the same VG, interleaved in one run.
//! And a burst: 200 `CreateVolume` calls at once against 200 bare
//! `lvcreate` one after the other (the bridge's default concurrency).
//!
//! Everything but the API server runs in this process: etcd and
//! kube-apiserver from `tests/tools/build.sh etcd kube`, the provisioner,
//! the bridge and an in-process NodeStorage server over an LVM pool.
//! Volumes are 8 MiB, pinned to the node as for `WaitForFirstConsumer`,
//! and deleted (untimed) between measurements.
//!
//! Every other create runs with tracing on: every span of the path
//! exported over OTLP/gRPC, sampling 1.0, to a real Jaeger
//! (`tests/tools/build.sh jaeger`); `kube.create_volume.tracing_overhead`
//! is that against the creates with tracing off, in the same run.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use carina_controlplane::kube::bridge_side::{self, BridgeConfig};
use carina_controlplane::kube::provisioner::{KubeProvisioner, KubeProvisionerConfig};
use carina_csi::strategy::Strategy;
use carina_proto::csi;
use carina_proto::telemetry;
use carina_tests::cluster::{await_capacity, register_node};
use carina_tests::csi::{Csi, ServedController, delete, make, on};
use carina_tests::grpc::TestNode;
use carina_tests::jaeger::Jaeger;
use carina_tests::kube::KubeCluster;
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::pool::LvmPool;
use crate::report::{Entry, timed};
use crate::steps;

const GROUP: &str =
    "Kubernetes control plane: CreateVolume (CSI → LogicVolume → watch → bridge → mTLS → lvcreate)";
const SIZE: u64 = 8 << 20;
const NODE: &str = "bench-node";
/// Calls in the burst.
const BURST: usize = 200;
/// Calls before the recorded ones.
const WARMUP: usize = 3;
/// The span of one `CreateVolume`, whose steps are printed.
const ROOT_SPAN: &str = "Controller/CreateVolume";

pub async fn create_volume(iterations: usize) -> Result<Vec<Entry>> {
    steps::install();
    // Room for the burst's volumes and as many bare ones, never both.
    let pool = LvmPool::new("bench-kube", 4 << 30).await?;
    let node = TestNode::start(pool.engine.clone(), NODE).await?;
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();
    register_node(&client, NODE, &node.endpoint()).await?;

    let (stop_bridge, bridge_stopped) = oneshot::channel::<()>();
    let bridge_task = tokio::spawn(bridge_side::run(
        client.clone(),
        BridgeConfig::new(node.client_tls("controller")?),
        async {
            let _ = bridge_stopped.await;
        },
    ));
    await_capacity(&client, NODE, Duration::from_secs(60)).await?;

    let provisioner = KubeProvisioner::new(
        client.clone(),
        KubeProvisionerConfig {
            strategy: Strategy::Spreadout,
            wait_timeout: Duration::from_secs(60),
        },
    );
    let served = ServedController::start(provisioner, "carina-bench-kube-").await?;
    let mut csi = served.csi.clone();

    // Traces exported as a production binary exports them (OTLP/gRPC,
    // sampling 1.0, the bounded queue) to a real Jaeger, switched on for
    // every other create.
    let (provider, otlp_port) =
        steps::export().ok_or_else(|| anyhow::anyhow!("the steps recorder has no trace export"))?;
    let jaeger =
        Jaeger::start_with_otlp_port(&cluster.log_dir().join("jaeger.log"), *otlp_port).await?;
    let export = |on: bool| -> Result<()> {
        steps::set_export(on);
        Ok(())
    };

    // One by one, interleaved with the floor and with tracing on and off
    // (which goes first alternates).
    steps::take();
    let (mut kube, mut traced, mut bare) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..(iterations + WARMUP) {
        let mut ids = Vec::new();
        for on in [i % 2 == 0, i % 2 == 1] {
            export(on)?;
            let t0 = Instant::now();
            let id = create(&mut csi, &format!("kube-{i}-{on}"), &pool.vg).await?;
            let k = t0.elapsed();
            if i >= WARMUP {
                if on { traced.push(k) } else { kube.push(k) }
            }
            ids.push(id);
        }
        export(false)?;
        let name = format!("bare-{i}");
        let t0 = Instant::now();
        pool.bare_lvcreate(&name, "8m").run().await?;
        let b = t0.elapsed();
        for id in ids {
            delete(&mut csi, &id).await?;
        }
        pool.bare_lvremove(&name).run().await?;
        if i >= WARMUP {
            bare.push(b);
        }
    }
    export(false)?;
    let exported = telemetry::export_metrics();
    println!(
        "tracing: {} spans exported to Jaeger, {} dropped, {} failed batches",
        exported.exported(),
        exported.dropped(),
        exported.failed_batches()
    );

    println!("{}", steps::timeline(&steps::take(), ROOT_SPAN));

    // The burst, against the same number of bare commands in a row.
    let t0 = Instant::now();
    let mut calls = JoinSet::new();
    for i in 0..BURST {
        let (mut csi, vg) = (csi.clone(), pool.vg.clone());
        calls.spawn(async move { create(&mut csi, &format!("burst-{i}"), &vg).await });
    }
    let mut ids = Vec::with_capacity(BURST);
    while let Some(id) = calls.join_next().await {
        ids.push(id??);
    }
    let burst = t0.elapsed();
    println!("{}", steps::timeline(&steps::take(), ROOT_SPAN));
    let mut deletes = JoinSet::new();
    for id in ids {
        let mut csi = csi.clone();
        deletes.spawn(async move { delete(&mut csi, &id).await });
    }
    while let Some(deleted) = deletes.join_next().await {
        deleted??;
    }
    let t0 = Instant::now();
    for i in 0..BURST {
        pool.bare_lvcreate(&format!("serial-{i}"), "8m")
            .run()
            .await?;
    }
    let serial = t0.elapsed();
    for i in 0..BURST {
        pool.bare_lvremove(&format!("serial-{i}")).run().await?;
    }

    drop(served);
    let _ = stop_bridge.send(());
    bridge_task.await??;
    node.stop().await?;

    let _ = provider.force_flush();
    drop(jaeger);

    let one = timed(GROUP, "kube.create_volume", "lvcreate", &kube, Some(&bare));
    if let Some(floor) = one.floor_p50 {
        println!(
            "kube.create_volume: p50 {:.1} ms above the bare lvcreate (target: within 15 ms)",
            one.p50 - floor
        );
    }
    let with_traces = timed(
        GROUP,
        "kube.create_volume.traced",
        "lvcreate",
        &traced,
        Some(&bare),
    );
    let overhead = timed(
        GROUP,
        "kube.create_volume.tracing_overhead",
        "kube.create_volume, tracing off",
        &traced,
        Some(&kube),
    );
    println!(
        "tracing on (sampling 1.0, exported to Jaeger): p50 {:.1} ms against {:.1} ms off ({:.3}x)",
        overhead.p50,
        overhead.floor_p50.unwrap_or_default(),
        overhead.ratio.unwrap_or_default()
    );
    Ok(vec![
        one,
        with_traces,
        overhead,
        wall(
            &format!("kube.create_volume.burst_{BURST}_concurrent"),
            &format!("{BURST} serial lvcreate"),
            burst,
            serial,
            BURST,
        ),
    ])
}

/// An entry for one wall time against one floor wall time, in seconds.
fn wall(name: &str, floor: &str, took: Duration, floor_took: Duration, calls: usize) -> Entry {
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    let (s, f) = (took.as_secs_f64(), floor_took.as_secs_f64());
    Entry {
        name: name.to_string(),
        unit: "s".to_string(),
        p50: round(s),
        p99: round(s),
        floor_p50: Some(round(f)),
        ratio: (f > 0.0).then(|| round(s / f)),
        iterations: calls,
        group: GROUP.to_string(),
        floor: floor.to_string(),
    }
}

/// `CreateVolume` of `name` in `group`, pinned to the node; the volume id.
async fn create(csi: &mut Csi, name: &str, group: &str) -> Result<String> {
    let request = csi::CreateVolumeRequest {
        parameters: HashMap::from([(
            "carina.storage.io/disk-group-name".to_string(),
            group.to_string(),
        )]),
        accessibility_requirements: Some(csi::TopologyRequirement {
            requisite: vec![on(NODE)],
            preferred: vec![on(NODE)],
        }),
        ..carina_tests::csi::create(name, SIZE, "ext4")
    };
    Ok(make(csi, request).await?.volume_id)
}
