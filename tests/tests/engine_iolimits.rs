//! Per-pod IO limits against the real cgroup v1 blkio controller: a pod
//! cgroup made by the test (the kubelet's cgroupfs layout), volumes on
//! loop devices, and `dd` with direct IO running in a container cgroup of
//! the pod. The limits must hold dd to the rate (bytes and operations per
//! second, read and write), and dd must run free once they are removed.
//!
//! The rates are what the kernel enforces, so the checks are on the
//! throttle, not on this machine's speed: a throttled copy takes the time
//! its size and the limit give (within 10%), an unthrottled one a small
//! part of it.

use carina_node::engine::iolimits::Limits;
use carina_node::engine::{Engine, Error};
use carina_tests::cgroup::PodCgroup;
use carina_tests::engine::EngineFixture;

const MIB: u64 = 1 << 20;

/// Runs `dd` in `ctr` and checks it took `expected` seconds within 10%.
fn throttled(pod: &PodCgroup, ctr: &str, args: &[&str], expected: f64) -> f64 {
    let took = pod.dd(ctr, args);
    let ratio = took / expected;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "dd {args:?} took {took:.2} s under the limit, {expected:.2} s expected"
    );
    took
}

/// Runs `dd` in `ctr` and checks it is far from the limit's pace.
fn free(pod: &PodCgroup, ctr: &str, args: &[&str], limited: f64) -> f64 {
    let took = pod.dd(ctr, args);
    assert!(
        took < limited / 3.0,
        "dd {args:?} took {took:.2} s without limits, {limited:.2} s with them"
    );
    took
}

/// `clear_pod_io_limits` of every volume: how many rules it removed.
async fn cleared(engine: &Engine, uid: &str) -> u32 {
    engine.clear_pod_io_limits(uid, None).await.expect("clear")
}

/// What `pod_io_limits` lists for `uid`.
async fn in_force(engine: &Engine, uid: &str) -> Vec<carina_node::engine::iolimits::PodLimit> {
    engine.pod_io_limits(Some(uid)).await.expect("list")
}

async fn set(engine: &Engine, pod: &PodCgroup, volume: &str, limits: Limits) {
    let got = engine
        .set_pod_io_limits(&pod.uid, volume, limits)
        .await
        .expect("limits set")
        .expect("limits read back");
    assert_eq!(got.limits, limits);
    assert_eq!(got.volume, volume);
    assert_eq!(got.cgroup_version, 1);
    assert_eq!((got.cgroups, got.cgroups_expected), (2, 2), "pod and ctr-0");
}

#[tokio::test]
async fn bandwidth_limits_hold_dd_to_the_rate_until_removed() {
    let Some(f) = EngineFixture::new("iolimits-bps", "LVM", &[256 * MIB], 0).await else {
        return;
    };
    let v = f.create(f.req("thr-bps", 64 * MIB)).await;
    let dev = v.device_path.clone().expect("a block device");
    let of = format!("of={}", dev.display());
    let input = format!("if={}", dev.display());
    let pod = PodCgroup::new();
    let limits = Limits {
        read_bps: 4 * MIB,
        write_bps: 2 * MIB,
        ..Limits::default()
    };
    set(&f.engine, &pod, &v.name, limits).await;
    // 6 MiB at 2 MiB/s, 12 MiB at 4 MiB/s: 3 s each.
    let write = ["if=/dev/zero", &of, "bs=256k", "count=24", "oflag=direct"];
    let read = [
        &input,
        "of=/dev/null",
        "bs=256k",
        "count=48",
        "iflag=direct",
    ];
    let w = throttled(&pod, "ctr-0", &write, 3.0);
    let r = throttled(&pod, "ctr-0", &read, 3.0);
    println!(
        "throttled: write {:.2} MiB/s, read {:.2} MiB/s",
        6.0 / w,
        12.0 / r
    );

    // The kernel's own files say the same as the engine.
    let file = std::fs::read_to_string(
        pod.container("ctr-0")
            .join("blkio.throttle.write_bps_device"),
    )
    .expect("read the container's rule");
    assert!(
        file.contains(&format!("{}:{} {}", v.major, v.minor, 2 * MIB)),
        "{file}"
    );

    let listed = in_force(&f.engine, &pod.uid).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].limits, limits);

    assert_eq!(cleared(&f.engine, &pod.uid).await, 1);
    assert!(in_force(&f.engine, &pod.uid).await.is_empty());
    let w = free(&pod, "ctr-0", &write, 3.0);
    let r = free(&pod, "ctr-0", &read, 3.0);
    println!(
        "unthrottled: write {:.1} MiB/s, read {:.1} MiB/s",
        6.0 / w,
        12.0 / r
    );
    // Clearing again finds nothing.
    assert_eq!(cleared(&f.engine, &pod.uid).await, 0);
    f.engine.delete_volume(&v.name).await.expect("delete");
}

#[tokio::test]
async fn iops_limits_on_a_partition_go_on_its_disk() {
    let Some(f) = EngineFixture::new("iolimits-iops", "RAW", &[128 * MIB], 0).await else {
        return;
    };
    let v = f.create(f.req("thr-iops", 32 * MIB)).await;
    let dev = v.device_path.clone().expect("a block device");
    let of = format!("of={}", dev.display());
    let input = format!("if={}", dev.display());
    let pod = PodCgroup::new();
    let limits = Limits {
        read_iops: 300,
        write_iops: 200,
        ..Limits::default()
    };
    let got = f
        .engine
        .set_pod_io_limits(&pod.uid, &v.name, limits)
        .await
        .expect("limits set")
        .expect("read back");
    // The rule is on the loop disk, not on the partition.
    let disk = &f.disks[0];
    let disk_dev = std::fs::read_to_string(format!(
        "/sys/class/block/{}/dev",
        disk.dev().trim_start_matches("/dev/")
    ))
    .expect("disk dev");
    assert_eq!(
        format!("{}:{}", got.major, got.minor),
        disk_dev.trim(),
        "{got:?}"
    );
    assert_ne!((got.major, got.minor), (v.major, v.minor));
    let metrics = carina_node::server::metrics::Metrics::default();
    let page = || carina_node::server::metrics::page(&metrics, &f.engine, "node-a");
    let gauge = |n: u32| format!(r#"carina_node_io_limits_in_force{{node="node-a"}} {n}"#);
    let text = page().await;
    assert!(text.lines().any(|l| l == gauge(1)), "{}: {text}", gauge(1));
    // 600 writes at 200/s, 900 reads at 300/s: 3 s each.
    let write = ["if=/dev/zero", &of, "bs=4k", "count=600", "oflag=direct"];
    let read = [&input, "of=/dev/null", "bs=4k", "count=900", "iflag=direct"];
    let w = throttled(&pod, "ctr-0", &write, 3.0);
    let r = throttled(&pod, "ctr-0", &read, 3.0);
    println!(
        "throttled: {:.0} write IOPS, {:.0} read IOPS",
        600.0 / w,
        900.0 / r
    );

    // All zero removes the rule.
    let removed = f
        .engine
        .set_pod_io_limits(&pod.uid, &v.name, Limits::default())
        .await
        .expect("limits removed");
    assert_eq!(removed, None);
    let text = page().await;
    assert!(text.lines().any(|l| l == gauge(0)), "{}: {text}", gauge(0));
    let w = free(&pod, "ctr-0", &write, 3.0);
    let r = free(&pod, "ctr-0", &read, 3.0);
    println!(
        "unthrottled: {:.0} write IOPS, {:.0} read IOPS",
        600.0 / w,
        900.0 / r
    );
    f.engine.delete_volume(&v.name).await.expect("delete");
}

#[tokio::test]
async fn a_container_started_later_gets_the_rule_on_the_next_set() {
    let Some(f) = EngineFixture::new("iolimits-late", "LVM", &[128 * MIB], 0).await else {
        return;
    };
    let v = f.create(f.req("thr-late", 16 * MIB)).await;
    let pod = PodCgroup::new();
    let limits = Limits {
        write_bps: MIB,
        ..Limits::default()
    };
    set(&f.engine, &pod, &v.name, limits).await;
    pod.add_container("ctr-1");
    let listed = in_force(&f.engine, &pod.uid).await;
    assert_eq!((listed[0].cgroups, listed[0].cgroups_expected), (2, 3));
    let again = f
        .engine
        .set_pod_io_limits(&pod.uid, &v.name, limits)
        .await
        .expect("set again")
        .expect("read back");
    assert_eq!((again.cgroups, again.cgroups_expected), (3, 3));
    f.engine
        .clear_pod_io_limits(&pod.uid, Some(&v.name))
        .await
        .expect("clear");
    f.engine.delete_volume(&v.name).await.expect("delete");
}

#[tokio::test]
async fn refusals_name_the_field_and_change_nothing() {
    let Some(f) = EngineFixture::new("iolimits-refuse", "LVM", &[128 * MIB], 0).await else {
        return;
    };
    let v = f.create(f.req("thr-refuse", 16 * MIB)).await;
    let limits = Limits {
        write_bps: MIB,
        ..Limits::default()
    };
    for uid in ["", "../etc", "pod/x", "a b", &"x".repeat(129)] {
        let e = f
            .engine
            .set_pod_io_limits(uid, &v.name, limits)
            .await
            .expect_err("refused");
        assert!(
            matches!(&e, Error::InvalidArgument { field, .. } if field == "pod_uid"),
            "{uid:?}: {e}"
        );
    }
    let e = f
        .engine
        .set_pod_io_limits("11111111-2222-4333-8444-555555555555", &v.name, limits)
        .await
        .expect_err("refused");
    assert!(matches!(e, Error::PodNotFound { .. }), "{e}");
    let pod = PodCgroup::new();
    let e = f
        .engine
        .set_pod_io_limits(&pod.uid, "no-such-volume", limits)
        .await
        .expect_err("refused");
    assert!(matches!(e, Error::VolumeNotFound { .. }), "{e}");
    assert!(in_force(&f.engine, &pod.uid).await.is_empty());
    // Clearing a pod without a cgroup succeeds: it has no limits.
    assert_eq!(
        cleared(&f.engine, "11111111-2222-4333-8444-555555555555").await,
        0
    );
    f.engine.delete_volume(&v.name).await.expect("delete");
}

#[tokio::test]
async fn a_pod_deleted_while_its_limits_are_applied() {
    let Some(f) = EngineFixture::new("iolimits-race", "LVM", &[128 * MIB], 0).await else {
        return;
    };
    let v = f.create(f.req("thr-race", 16 * MIB)).await;
    let pod = PodCgroup::new();
    for i in 0..20 {
        pod.add_container(&format!("ctr-{}", i + 1));
    }
    let engine = f.engine.clone();
    let (uid, name) = (pod.uid.clone(), v.name.clone());
    let sets_ok = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = sets_ok.clone();
    // Sets back to back while the pod's cgroup is removed under them:
    // each answer is success or NOT_FOUND, never a failure of the node.
    // Once NOT_FOUND, always NOT_FOUND: the sets stop after five of them.
    let setter = tokio::spawn(async move {
        let mut outcomes = (0u32, 0u32);
        for n in 1..=20_000u64 {
            let limits = Limits {
                write_bps: n * MIB,
                ..Limits::default()
            };
            match engine.set_pod_io_limits(&uid, &name, limits).await {
                Ok(_) if outcomes.1 == 0 => {
                    outcomes.0 += 1;
                    seen.store(outcomes.0, std::sync::atomic::Ordering::SeqCst);
                }
                Ok(_) => panic!("set {n} succeeded after the pod was gone"),
                Err(Error::PodNotFound { .. }) => outcomes.1 += 1,
                Err(e) => panic!("set {n}: {e}"),
            }
            if outcomes.1 == 5 {
                break;
            }
        }
        outcomes
    });
    // The removal starts once the sets are running.
    carina_tests::wait_until("a set succeeds", std::time::Duration::from_secs(60), || {
        sets_ok.load(std::sync::atomic::Ordering::SeqCst) > 0
    })
    .await
    .expect("the setter runs");
    tokio::task::spawn_blocking({
        let pod_dir = pod.pod.clone();
        move || {
            // What the kubelet does: containers first, then the pod.
            let mut dirs: Vec<_> = std::fs::read_dir(&pod_dir)
                .expect("read the pod cgroup")
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect();
            dirs.sort();
            for d in dirs {
                std::fs::remove_dir(&d).expect("remove a container cgroup");
            }
            std::fs::remove_dir(&pod_dir).expect("remove the pod cgroup");
        }
    })
    .await
    .expect("the removal ran");
    let (ok, gone) = setter.await.expect("the setter ran");
    println!("{ok} sets succeeded, {gone} found the pod gone");
    assert_eq!(gone, 5, "the sets saw the pod go");
    assert!(in_force(&f.engine, &pod.uid).await.is_empty());
    assert_eq!(cleared(&f.engine, &pod.uid).await, 0);
    f.engine.delete_volume(&v.name).await.expect("delete");
}
