//! Engine tests of faults that hang, lose or exhaust, on real loop
//! devices. Each checks that nothing is lost (data written before reads
//! back the same), nothing leaks (no LV, partition, loop device left
//! over), and that the operation the fault interrupted succeeds when
//! retried; each prints how long that took after the fault ended.
//!
//! - An `lvm` command that hangs: a stopped `lvm` shell under an
//!   lvcreate, an lvextend blocked on the VG's lock. The call fails at its
//!   time limit as `DEADLINE_EXCEEDED` naming the command; the volume's
//!   and the group's locks are free again.
//! - A disk that disappears under an LVM group while a RAW group on
//!   another disk serves on.
//! - A volume group filled until `RESOURCE_EXHAUSTED`.
//!
//! Every wait is for a state, bounded by [`PATIENCE`] only to turn a hang
//! into a failure.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use carina_node::engine::health;
use carina_node::engine::lvm::LvmOptions;
use carina_node::engine::{Engine, Error};
use carina_node::server::status;
use carina_sys::command::CommandError;
use carina_tests::engine::{EngineFixture, assert_not_found, names};
use carina_tests::faults::{
    DATA, PATIENCE, Stopped, TwoGroups, Vanished, device, pattern, proc_state, req, write_data,
};
use carina_tests::lvmlock::{VgLock, blocked_on_a_lock};
use carina_tests::{LoopDisk, loops_backed_by, lvm, run, wait_until};
use tonic::Code;

const MIB: u64 = 1 << 20;

/// The `lvm` time limit of the hang tests: long enough for a loaded
/// machine's commands, short enough to wait for.
const LVM_LIMIT: Duration = Duration::from_secs(8);

/// How much later than its limit a timed-out call may return.
const SLACK: Duration = Duration::from_secs(10);

/// Asserts that `dev` starts with `seed`'s pattern, read from the device
/// (its cached pages dropped first).
fn assert_intact(dev: &Path, seed: &str) {
    let d = dev.to_string_lossy();
    run("blockdev", &["--flushbufs", &d]).expect("drop the cached pages");
    let mut got = vec![0u8; DATA];
    File::open(dev)
        .and_then(|mut f| f.read_exact(&mut got))
        .unwrap_or_else(|e| panic!("read {d}: {e}"));
    assert!(
        got == pattern(seed, DATA),
        "the data of {seed} on {d} changed"
    );
}

/// The LVs of the VG as LVM itself lists them, sorted.
fn vg_lvs(vg: &str, disks: &[&LoopDisk]) -> Vec<String> {
    let devs: Vec<String> = disks.iter().map(|d| d.dev()).collect();
    let devs: Vec<&str> = devs.iter().map(String::as_str).collect();
    let out = lvm(&devs, &["lvs", "--noheadings", "-o", "lv_name", vg]).expect("lvs");
    let mut lvs: Vec<String> = out.split_whitespace().map(str::to_string).collect();
    lvs.sort();
    lvs
}

/// Asserts the group holds exactly `expected` (sorted): as the engine
/// lists it, as LVM lists the VG, and as loop devices on its disk.
async fn assert_exactly(f: &EngineFixture, expected: &[&str]) {
    assert_eq!(f.names().await, expected, "the engine's volumes");
    let disks: Vec<&LoopDisk> = f.disks.iter().collect();
    assert_eq!(vg_lvs(&f.group, &disks), expected, "the VG's LVs");
    let loops = loops_backed_by(&f.disks[0].dev());
    assert_eq!(
        loops.len(),
        expected.len(),
        "loop devices on the PV: {loops:?}"
    );
}

/// Asserts `err` is the timeout of `lvm <sub>` on `vg`, at [`LVM_LIMIT`],
/// as a retryable `DEADLINE_EXCEEDED`, and that it came in time.
fn assert_timed_out(err: &Error, sub: &str, vg: &str, took: Duration) {
    assert!(
        matches!(err, Error::Command(CommandError::TimedOut { timeout, .. }) if *timeout == LVM_LIMIT),
        "{err}"
    );
    assert_eq!(status::code(err), Code::DeadlineExceeded, "{err}");
    let text = err.to_string();
    assert!(text.starts_with(&format!("`lvm {sub} ")), "{text}");
    assert!(text.contains(vg), "names the VG: {text}");
    assert!(
        took >= LVM_LIMIT && took < LVM_LIMIT + SLACK,
        "failed after {took:?}, the limit is {LVM_LIMIT:?}"
    );
}

async fn hang_fixture(test: &str) -> Option<EngineFixture> {
    EngineFixture::with_lvm(
        test,
        "LVM",
        &[128 * MIB],
        0,
        LvmOptions {
            timeout: LVM_LIMIT,
            ..LvmOptions::default()
        },
    )
    .await
}

/// An lvcreate sent to a stopped `lvm` shell hangs. Meanwhile a second
/// create of the name is refused as busy, reads of the group go on, and a
/// create of another volume waits for the group's lock. At the limit the
/// hung create fails naming lvcreate and the VG, the shell is killed, the
/// waiting create goes through; nothing of the hung volume exists, and
/// its retry makes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_lvcreate_times_out_frees_its_locks_and_the_retry_makes_the_volume() {
    let Some(f) = hang_fixture("fault_hung_lvcreate").await else {
        return;
    };
    let kept = f.create(f.req("kept", 8 * MIB)).await;
    write_data(&device(&kept), "kept");
    let pid = f.engine.lvm_shell_pid().expect("an lvm shell runs");
    let stopped = Stopped::stop(pid).await;

    let started = Instant::now();
    let hung = tokio::spawn({
        let engine = f.engine.clone();
        let req = f.req("hung", 8 * MIB);
        async move { engine.create_volume(req).await }
    });
    // The volume's lock is taken: an operation on the name is busy (a
    // resize: it takes the lock first and changes nothing without it).
    let deadline = Instant::now() + PATIENCE;
    loop {
        match f.engine.resize_volume("hung", 16 * MIB).await {
            Err(Error::Busy { name }) => {
                assert_eq!(name, "hung");
                break;
            }
            Err(Error::VolumeNotFound { .. }) => {
                assert!(Instant::now() < deadline, "the create never took the name");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => panic!("resize of a volume being created: {other:?}"),
        }
    }
    // The rest of the create (the group's lock, the cached picture, the
    // lvcreate sent) runs without waiting on anything.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other = tokio::spawn({
        let engine = f.engine.clone();
        let req = f.req("other", 8 * MIB);
        async move { engine.create_volume(req).await }
    });
    // Reads of the group go on beside the hung shell (as processes).
    let listed = Instant::now();
    assert_eq!(f.names().await, ["kept"]);
    assert!(
        listed.elapsed() < LVM_LIMIT,
        "a list waited for the hung command"
    );
    assert!(!hung.is_finished() && !other.is_finished());

    let err = hung
        .await
        .expect("the create task")
        .expect_err("lvcreate hangs in the stopped shell");
    let failed_at = Instant::now();
    assert_timed_out(&err, "lvcreate", &f.group, started.elapsed());
    assert!(err.to_string().contains(" -n hung "), "{err}");
    // The fault ends with the hung shell killed.
    wait_until("the stopped shell is killed", PATIENCE, || {
        proc_state(pid).is_none_or(|s| s.0 == 'Z')
    })
    .await
    .expect("the wait");
    drop(stopped);

    // The group's lock was released: the other create goes through.
    let other = tokio::time::timeout(PATIENCE, other)
        .await
        .expect("the other create ends")
        .expect("its task")
        .expect("the other create, once the hung one gave up");
    assert_eq!(other.size_bytes, 8 * MIB);
    // Nothing of the hung create is left: no LV, no loop.
    assert_exactly(&f, &["kept", "other"]).await;
    assert_not_found(&f.engine, "hung").await;

    let hung = f.create(f.req("hung", 8 * MIB)).await;
    println!(
        "recovery: the retried create succeeded {:?} after the hung lvcreate failed",
        failed_at.elapsed()
    );
    assert_eq!(hung.size_bytes, 8 * MIB);
    assert_ne!(f.engine.lvm_shell_pid(), Some(pid), "a new shell");
    write_data(&device(&hung), "hung");
    assert_exactly(&f, &["hung", "kept", "other"]).await;
    assert_intact(&device(&kept), "kept");
    assert_intact(&device(&hung), "hung");
    for name in ["hung", "kept", "other"] {
        f.engine.delete_volume(name).await.expect("delete");
    }
    assert_exactly(&f, &[]).await;
}

/// An lvextend blocked on the VG's lock (held shared: the resize's own
/// look at the VG passes) hangs. The resize fails at the limit naming
/// lvextend and the VG; the volume keeps its size and data; a delete of
/// another volume that waited for the group's lock goes through once the
/// lock is gone; the retried resize grows the volume, data intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_lvextend_times_out_frees_its_locks_and_the_retry_grows_the_volume() {
    let Some(f) = hang_fixture("fault_hung_lvextend").await else {
        return;
    };
    // [other][grow][free…]: grow's extents are followed by free ones.
    let other = f.create(f.req("other", 8 * MIB)).await;
    let grow = f.create(f.req("grow", 8 * MIB)).await;
    write_data(&device(&other), "other");
    write_data(&device(&grow), "grow");
    let pid = f.engine.lvm_shell_pid().expect("an lvm shell runs");
    let lock = VgLock::shared(&f.group);

    let started = Instant::now();
    let resize = tokio::spawn({
        let engine = f.engine.clone();
        async move { engine.resize_volume("grow", 16 * MIB).await }
    });
    wait_until(
        "lvextend waits for the VG lock in the shell",
        PATIENCE,
        || blocked_on_a_lock(pid),
    )
    .await
    .expect("the wait");
    // The volume's lock is held: another resize of it is busy at once.
    let busy = f.engine.resize_volume("grow", 24 * MIB).await;
    assert!(matches!(busy, Err(Error::Busy { .. })), "{busy:?}");
    let delete = tokio::spawn({
        let engine = f.engine.clone();
        async move { engine.delete_volume("other").await }
    });

    let err = resize
        .await
        .expect("the resize task")
        .expect_err("lvextend waits for the lock");
    assert_timed_out(&err, "lvextend", &f.group, started.elapsed());
    assert!(err.to_string().contains("/grow"), "{err}");
    drop(lock);
    let fault_ended = Instant::now();
    wait_until("the hung shell is killed", PATIENCE, || {
        proc_state(pid).is_none_or(|s| s.0 == 'Z')
    })
    .await
    .expect("the wait");

    // The group's lock was released: the delete waiting for it ends.
    tokio::time::timeout(PATIENCE, delete)
        .await
        .expect("the delete ends")
        .expect("its task")
        .expect("delete of the other volume");
    // Nothing half-done: the volume keeps its size, device and data.
    let same = f.engine.get_volume("grow").await.expect("get");
    assert_eq!(same.size_bytes, 8 * MIB);
    assert_eq!(carina_tests::blockdev_size(&device(&same)), 8 * MIB);
    assert_intact(&device(&same), "grow");
    let disks: Vec<&LoopDisk> = f.disks.iter().collect();
    let size = lvm(
        &[&f.disks[0].dev()],
        &[
            "lvs",
            "--noheadings",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            "lv_size",
            &format!("{}/grow", f.group),
        ],
    )
    .expect("lvs");
    assert_eq!(size.trim(), (8 * MIB).to_string(), "the LV kept its size");
    assert_eq!(vg_lvs(&f.group, &disks), ["grow"]);
    let grown = f
        .engine
        .resize_volume("grow", 16 * MIB)
        .await
        .expect("the retried resize");
    println!(
        "recovery: the retried resize succeeded {:?} after the VG lock was released",
        fault_ended.elapsed()
    );
    assert_eq!(grown.size_bytes, 16 * MIB);
    assert_eq!(carina_tests::blockdev_size(&device(&grown)), 16 * MIB);
    assert_intact(&device(&grown), "grow");
    assert_exactly(&f, &["grow"]).await;
    f.engine.delete_volume("grow").await.expect("delete");
    assert_exactly(&f, &[]).await;
}

/// A group filled with 8 MiB volumes until the engine refuses: the refusal
/// is `RESOURCE_EXHAUSTED` naming the group, the size asked and the bytes
/// left; nothing of the refused volume exists; the data of the others is
/// intact; after a delete the refused create succeeds.
#[tokio::test]
async fn a_full_group_refuses_exactly_and_takes_the_retry_after_a_delete() {
    let Some(f) = EngineFixture::new("fault_full", "LVM", &[64 * MIB], 0).await else {
        return;
    };
    let mut made: Vec<String> = Vec::new();
    let (refused, err) = loop {
        assert!(made.len() < 64, "the group never filled");
        let name = format!("v{:02}", made.len());
        match f.engine.create_volume(f.req(&name, 8 * MIB)).await {
            Ok(v) => {
                write_data(&device(&v), &name);
                made.push(name);
            }
            Err(e) => break (name, e),
        }
    };
    assert!(made.len() >= 5, "only {} volumes fit", made.len());
    let left = f.allocatable().await;
    assert!(left < 8 * MIB, "{left} bytes left, yet refused: {err}");
    match &err {
        Error::ResourceExhausted {
            group,
            requested_bytes,
            allocatable_bytes,
        } => {
            assert_eq!(group, &f.group);
            assert_eq!(*requested_bytes, 8 * MIB);
            assert_eq!(*allocatable_bytes, left);
        }
        other => panic!("create {refused} in a full group: {other}"),
    }
    assert_eq!(status::code(&err), Code::ResourceExhausted);
    let text = err.to_string();
    for part in [f.group.clone(), (8 * MIB).to_string(), left.to_string()] {
        assert!(text.contains(&part), "{part} in {text}");
    }
    // A grow is refused the same way, and changes nothing.
    let last = made.last().expect("a volume").clone();
    let err = f.resize_refused(&last, 64 * MIB).await;
    assert!(matches!(err, Error::ResourceExhausted { .. }), "{err}");
    // Nothing of the refused volume, nothing else changed.
    assert_not_found(&f.engine, &refused).await;
    let expected: Vec<&str> = made.iter().map(String::as_str).collect();
    assert_exactly(&f, &expected).await;
    assert_eq!(f.capacity().await.volume_count as usize, made.len());

    let gone = made.remove(0);
    f.engine.delete_volume(&gone).await.expect("delete");
    let freed = Instant::now();
    let v = f.create(f.req(&refused, 8 * MIB)).await;
    println!(
        "recovery: the refused create succeeded {:?} after a delete freed room",
        freed.elapsed()
    );
    write_data(&device(&v), &refused);
    made.push(refused);
    made.sort();
    let expected: Vec<&str> = made.iter().map(String::as_str).collect();
    assert_exactly(&f, &expected).await;
    for name in &made {
        let v = f.engine.get_volume(name).await.expect("get");
        assert_intact(&device(&v), name);
    }
    for name in &made {
        f.engine.delete_volume(name).await.expect("delete");
    }
    assert_exactly(&f, &[]).await;
}

/// Creates, writes, checks and deletes a volume in `group`: the group
/// serves.
async fn serves(engine: &Engine, group: &str, name: &str) {
    let v = engine
        .create_volume(req(name, group, 8 * MIB))
        .await
        .unwrap_or_else(|e| panic!("create {name} in {group}: {e}"));
    write_data(&device(&v), name);
    assert_intact(&device(&v), name);
    assert_eq!(health::condition(&v).await, health::Condition::default());
    assert!(names(engine, group).await.contains(&name.to_string()));
    engine.delete_volume(name).await.expect("delete");
}

/// An LVM group's disk disappears while a RAW group on another disk holds
/// a volume too. The LVM volume's condition is abnormal naming the disk; a
/// create there fails and makes nothing; the node answers every call (no
/// panic), and a rescan (as the periodic one) passes; the RAW group goes
/// on creating, listing and deleting, its data intact. With the disk back
/// and the next rescan, the failed create succeeds, the old volume is
/// normal with its data, and deleting everything leaves no LV, loop
/// device or partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_that_disappears_makes_its_volume_abnormal_and_the_other_group_serves_on() {
    let Some(t) = TwoGroups::new("fault_disk_gone").await else {
        return;
    };
    let engine = &t.engine;
    let gone = Vanished::vanish(&t.lvm_disk);

    // The volume is abnormal, naming its disk.
    let seen = engine.get_volume("on-lvm").await.expect("get");
    let c = health::condition(&seen).await;
    assert!(c.abnormal, "{c:?}");
    assert_eq!(
        c.message,
        format!(
            "physical volume {} has 0 bytes: the disk behind it is gone",
            t.lvm_disk.dev()
        )
    );
    // The broken group answers, naming its disk (checked in
    // `a_group_whose_disk_is_gone_says_so_instead_of_listing_nothing`).
    let listed = engine.list_volumes(Some(&t.lvm_group)).await;
    println!("list of the broken group: {listed:?}");
    let cap = engine.capacity(Some(&t.lvm_group)).await;
    println!("capacity of the broken group: {cap:?}");
    let err = engine
        .create_volume(req("late", &t.lvm_group, 8 * MIB))
        .await
        .expect_err("a create on a gone disk");
    println!(
        "create on the broken group: {err} ({:?})",
        status::code(&err)
    );
    // The rescan reports the broken group (naming its disk) and goes on
    // with the others; the group's volumes stay known.
    let rescanned = engine.rescan().await;
    assert!(
        rescanned
            .as_ref()
            .is_err_and(|e| e.to_string().contains(&t.lvm_disk.dev())),
        "a rescan with a disk gone: {rescanned:?}"
    );
    println!(
        "get of the LVM volume after that rescan: {:?}",
        engine.get_volume("on-lvm").await.map(|v| v.name)
    );

    // The other group serves on.
    serves(engine, &t.raw_group, "raw-during").await;
    assert_eq!(names(engine, &t.raw_group).await, ["on-raw"]);
    assert_intact(&device(&t.part), "on-raw");
    let part_now = engine.get_volume("on-raw").await.expect("get on RAW");
    assert_eq!(
        health::condition(&part_now).await,
        health::Condition::default()
    );
    engine
        .capacity(Some(&t.raw_group))
        .await
        .expect("capacity of RAW");

    gone.restore();
    let back = Instant::now();
    // The periodic rescan's turn (a fresh look at the VG).
    engine.rescan().await.expect("rescan with the disk back");
    let late = engine
        .create_volume(req("late", &t.lvm_group, 8 * MIB))
        .await
        .expect("the create once the disk is back");
    println!(
        "recovery: the failed create succeeded {:?} after the disk came back (a rescan included)",
        back.elapsed()
    );
    assert_eq!(late.size_bytes, 8 * MIB);
    let lv = engine.get_volume("on-lvm").await.expect("get");
    assert_eq!(lv.device_path, t.lv.device_path);
    assert_eq!(health::condition(&lv).await, health::Condition::default());
    assert_intact(&device(&lv), "on-lvm");
    assert_intact(&device(&t.part), "on-raw");
    assert_eq!(names(engine, &t.lvm_group).await, ["late", "on-lvm"]);
    for name in ["late", "on-lvm", "on-raw"] {
        engine.delete_volume(name).await.expect("delete");
    }
    assert!(vg_lvs(&t.lvm_group, &[&t.lvm_disk]).is_empty());
    assert!(loops_backed_by(&t.lvm_disk.dev()).is_empty());
    let parts = run("lsblk", &["-nro", "NAME", &t.raw_disk.dev()]).expect("lsblk");
    assert_eq!(parts.lines().count(), 1, "partitions left: {parts}");
}

/// With its disk gone, an LVM group must not answer as an empty group:
/// its volumes must not drop out of the listing or the index (a delete
/// answering NOT_FOUND would be taken for done, and the LV orphaned when
/// the disk is back), and a create must not be RESOURCE_EXHAUSTED. Each
/// answer names the missing disk instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_disk_is_gone_says_so_instead_of_listing_nothing() {
    let Some(t) = TwoGroups::new("fault_disk_gone_list").await else {
        return;
    };
    let engine = &t.engine;
    let gone = Vanished::vanish(&t.lvm_disk);
    let dev = t.lvm_disk.dev();
    match engine.list_volumes(Some(&t.lvm_group)).await {
        Ok(vols) => assert_eq!(
            vols.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
            ["on-lvm"],
            "a volume silently dropped"
        ),
        Err(e) => assert!(e.to_string().contains(&dev), "{e}"),
    }
    let err = engine
        .create_volume(req("late", &t.lvm_group, 8 * MIB))
        .await
        .expect_err("a create on a gone disk");
    assert_ne!(status::code(&err), Code::ResourceExhausted, "{err}");
    assert!(err.to_string().contains(&dev), "{err}");
    let _ = engine.rescan().await;
    match engine.get_volume("on-lvm").await {
        Ok(_) => {}
        Err(e) => {
            assert_ne!(
                status::code(&e),
                Code::NotFound,
                "the volume is forgotten: {e}"
            );
            assert!(e.to_string().contains(&dev), "{e}");
        }
    }
    let err = engine
        .delete_volume("on-lvm")
        .await
        .expect_err("a delete on a gone disk");
    assert_ne!(
        status::code(&err),
        Code::NotFound,
        "a delete taken for done: {err}"
    );
    assert!(err.to_string().contains(&dev), "{err}");
    gone.restore();
    engine.rescan().await.expect("rescan with the disk back");
    engine
        .get_volume("on-lvm")
        .await
        .expect("the volume is back");
}
