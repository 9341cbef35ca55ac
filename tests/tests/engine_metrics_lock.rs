//! The node's `/metrics` while a volume group's lvm lock is held: an
//! lvcreate waits in the node's `lvm` shell for the VG's lock (held
//! exclusively here, as a hung lvm command elsewhere would hold it), and a
//! scrape meanwhile answers within its bound with the capacity gauges of
//! the node's latest snapshot and the volumes' IO counters as last read,
//! the next one at once. Before, the page listed the volumes (an
//! `lvm pvs` that waits for the same lock) and answered only when that
//! command gave up.

use std::time::{Duration, Instant};

use carina_node::server::metrics::{IO_LIMITS_WAIT, Metrics, serve};
use carina_tests::engine::EngineFixture;
use carina_tests::lvmlock::{VgLock, blocked_on_a_lock};
use carina_tests::metrics::{scrape, value};
use carina_tests::wait_until;

const MIB: u64 = 1 << 20;

/// The longest any wait below may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(120);

/// How long a scrape may take while the lock is held: the page's bounded
/// wait for a fresh IO limit count ([`IO_LIMITS_WAIT`], 5 s) and a loaded
/// machine's slack,
/// far below the `lvm` time limit (60 s) a scrape waited for before.
const SCRAPE_LIMIT: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_answers_with_the_capacity_gauges_while_an_lvcreate_waits_for_the_vg_lock() {
    let Some(f) = EngineFixture::new("metrics_vg_lock", "LVM", &[128 * MIB], 0).await else {
        return;
    };
    f.create(f.req("kept", 8 * MIB)).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        std::sync::Arc::new(Metrics::default()),
        f.engine.clone(),
        "node-a".into(),
        async {
            let _ = stopped.await;
        },
    ));
    let labels = [("node", "node-a"), ("device_group", f.group.as_str())];
    let before = scrape(port).await.expect("a scrape without the lock");
    let free =
        value(&before, "carina_node_capacity_free_bytes", &labels).expect("the group's free bytes");
    assert_eq!(
        value(&before, "carina_node_volumes", &labels),
        Some(1.0),
        "one volume before the lock"
    );
    let kept = [("pv", "kept"), ("device_group", f.group.as_str())];
    let written = value(&before, "carina_volume_stats_write_bytes_total", &kept)
        .expect("the volume's IO counters before the lock");

    let pid = f.engine.lvm_shell_pid().expect("an lvm shell runs");
    let lock = VgLock::exclusive(&f.group);
    let create = tokio::spawn({
        let engine = f.engine.clone();
        let req = f.req("waits", 8 * MIB);
        async move { engine.create_volume(req).await }
    });
    // The create is in flight: its lvcreate waits in the shell for the
    // VG's lock, and holds the engine's lock of the group meanwhile.
    wait_until(
        "lvcreate waits for the VG lock in the shell",
        PATIENCE,
        || blocked_on_a_lock(pid),
    )
    .await
    .expect("the wait");

    let started = Instant::now();
    let during = tokio::time::timeout(SCRAPE_LIMIT, scrape(port))
        .await
        .unwrap_or_else(|_| {
            panic!("/metrics did not answer within {SCRAPE_LIMIT:?} while the VG lock was held")
        })
        .expect("a scrape while the VG lock is held");
    let took = started.elapsed();
    println!("scrape while an lvcreate waited for the VG lock: {took:?}");
    assert!(
        blocked_on_a_lock(pid) && !create.is_finished(),
        "the create was still in flight when the scrape answered"
    );
    assert_eq!(
        value(&during, "carina_node_capacity_free_bytes", &labels),
        Some(free),
        "the free bytes of the latest snapshot"
    );
    assert_eq!(value(&during, "carina_node_volumes", &labels), Some(1.0));
    // The volumes' IO counters are read with a listing that waits on the
    // lock too: the page renders the last reading, and its age.
    assert_eq!(
        value(&during, "carina_volume_stats_write_bytes_total", &kept),
        Some(written),
        "the last reading of the counters"
    );
    let age = value(
        &during,
        "carina_node_volume_stats_age_seconds",
        &[("node", "node-a")],
    )
    .expect("the reading's age");
    assert!(
        age >= IO_LIMITS_WAIT.as_secs_f64(),
        "the reading is as old as the wait at least: {age}"
    );
    // The count of IO limits the first scrape started still waits on
    // LVM: the next scrape starts none and does not wait for it again.
    let started = Instant::now();
    let again = tokio::time::timeout(SCRAPE_LIMIT, scrape(port))
        .await
        .expect("a second scrape in time")
        .expect("a second scrape while the VG lock is held");
    let took = started.elapsed();
    println!("the next scrape: {took:?}");
    assert!(took < IO_LIMITS_WAIT, "the second scrape waited {took:?}");
    assert_eq!(
        value(&again, "carina_node_capacity_free_bytes", &labels),
        Some(free)
    );
    assert!(blocked_on_a_lock(pid) && !create.is_finished());
    assert!(
        value(
            &during,
            "carina_node_capacity_generation",
            &[("node", "node-a")]
        )
        .is_some(),
        "the snapshot's generation"
    );

    drop(lock);
    let made = tokio::time::timeout(PATIENCE, create)
        .await
        .expect("the create ends")
        .expect("its task")
        .expect("the create once the lock is free");
    assert_eq!(made.size_bytes, 8 * MIB);
    let after = scrape(port).await.expect("a scrape after the lock");
    assert_eq!(value(&after, "carina_node_volumes", &labels), Some(2.0));
    assert_eq!(
        value(&after, "carina_node_capacity_free_bytes", &labels),
        Some(free - (8 * MIB) as f64)
    );
    let _ = stop.send(());
    server.await.expect("the metrics server stops");
    for name in ["kept", "waits"] {
        f.engine.delete_volume(name).await.expect("delete");
    }
}
