//! The node's `/metrics` under the names Go Carina exported: a volume's
//! `carina_volume_stats_*` write counters rise, with its labels, when its
//! block device is written (an LVM logical volume and a RAW partition,
//! each on real loop disks), and `carina_volume_group_stats_*` equal the
//! LVM group's figures in the engine's capacity snapshot.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use carina_node::server::metrics::{Metrics, serve};
use carina_tests::engine::EngineFixture;
use carina_tests::metrics::{scrape, value};

const MIB: u64 = 1 << 20;

/// Bytes each test writes to its volume: big enough to stand out of the
/// few kilobytes a probe of the device may read or write.
const WRITTEN: u64 = 4 * MIB;

/// Serves the fixture engine's `/metrics` for node `node-a`; the returned
/// sender stops it.
async fn metrics_server(f: &EngineFixture) -> (u16, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(
        listener,
        Arc::new(Metrics::default()),
        f.engine.clone(),
        "node-a".into(),
        async {
            let _ = stopped.await;
        },
    ));
    (port, stop)
}

/// Writes [`WRITTEN`] bytes of a pattern to the start of `device` and
/// flushes them to it.
fn write_device(device: &std::path::Path) {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(device)
        .unwrap_or_else(|e| panic!("open {}: {e}", device.display()));
    let chunk = vec![0x5a_u8; MIB as usize];
    for _ in 0..WRITTEN / MIB {
        file.write_all(&chunk).expect("write");
    }
    file.sync_all().expect("fsync");
}

/// Creates a volume, writes to it and checks its counters rose between
/// two scrapes, with Go's labels.
async fn writes_are_counted(f: &EngineFixture, name: &str) {
    let v = f.create(f.req(name, 16 * MIB)).await;
    let device = v.device_path.clone().expect("a block device");
    let (port, stop) = metrics_server(f).await;
    let labels = [
        ("namespace", ""),
        ("pvc", ""),
        ("pv", name),
        ("device_group", f.group.as_str()),
        ("nodename", "node-a"),
    ];
    let started = Instant::now();
    let before = scrape(port).await.expect("a scrape");
    println!("a scrape with {name}: {:?}", started.elapsed());
    let bytes_before = value(&before, "carina_volume_stats_write_bytes_total", &labels)
        .unwrap_or_else(|| panic!("{name}'s write bytes before the write"));
    let writes_before = value(
        &before,
        "carina_volume_stats_writes_completed_total",
        &labels,
    )
    .expect("writes completed before the write");

    let written = device.clone();
    tokio::task::spawn_blocking(move || write_device(&written))
        .await
        .expect("the write");

    // A page renders the last reading when a fresh one waits on LVM (on
    // a loaded machine): scrape until the page's reading is younger than
    // the write, as its age says.
    let wrote = Instant::now();
    let deadline = wrote + Duration::from_secs(120);
    let after = loop {
        let page = scrape(port).await.expect("a scrape after the write");
        let age = value(
            &page,
            "carina_node_volume_stats_age_seconds",
            &[("node", "node-a")],
        )
        .expect("the reading's age");
        if age < wrote.elapsed().as_secs_f64() {
            break page;
        }
        assert!(
            Instant::now() < deadline,
            "no reading after the write in 120 s"
        );
    };
    let bytes_after = value(&after, "carina_volume_stats_write_bytes_total", &labels)
        .expect("write bytes after the write");
    let writes_after = value(
        &after,
        "carina_volume_stats_writes_completed_total",
        &labels,
    )
    .expect("writes completed after the write");
    println!(
        "{} {name} ({}): write bytes {bytes_before} -> {bytes_after}, writes {writes_before} -> {writes_after}",
        f.policy,
        device.display()
    );
    assert!(
        bytes_after - bytes_before >= WRITTEN as f64,
        "{name}: {WRITTEN} bytes written, counted {}",
        bytes_after - bytes_before
    );
    assert!(writes_after > writes_before, "{name}: writes completed");
    let _ = stop.send(());
    f.engine.delete_volume(name).await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_lvm_volumes_write_counters_rise_and_the_group_stats_are_the_groups_figures() {
    let Some(f) = EngineFixture::new("volume_stats_lvm", "LVM", &[64 * MIB, 64 * MIB], 0).await
    else {
        return;
    };
    f.create(f.req("kept", 8 * MIB)).await;
    let (port, stop) = metrics_server(&f).await;
    let page = scrape(port).await.expect("a scrape");
    let group = f.capacity().await;
    let labels = [("device_group", f.group.as_str()), ("nodename", "node-a")];
    for (metric, want) in [
        ("capacity_bytes_total", group.total_bytes),
        ("capacity_bytes_used", group.total_bytes - group.free_bytes),
        ("lv_total", 1),
        ("pv_total", 2),
    ] {
        let metric = format!("carina_volume_group_stats_{metric}");
        assert_eq!(
            value(&page, &metric, &labels),
            Some(want as f64),
            "{metric} of {group:?}"
        );
    }
    assert_eq!(u64::from(group.volume_count), 1);
    assert_eq!(
        value(
            &page,
            "carina_node_capacity_total_bytes",
            &[("node", "node-a"), ("device_group", f.group.as_str())]
        ),
        Some(group.total_bytes as f64),
        "the page's own gauge says the same"
    );
    let _ = stop.send(());
    writes_are_counted(&f, "pvc-stats-lvm").await;
    f.engine.delete_volume("kept").await.expect("delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_partitions_write_counters_rise() {
    let Some(f) = EngineFixture::new("volume_stats_raw", "RAW", &[64 * MIB], 0).await else {
        return;
    };
    writes_are_counted(&f, "pvc-stats-raw").await;
}
