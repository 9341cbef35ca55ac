//! Engine tests of copies ([`Engine::copy_volume`](carina_node::engine::Engine::copy_volume)) of a mounted LVM
//! source: the freeze (and that the snapshot of a filesystem being written
//! to is consistent), cancellation, and the freeze timeout; each leaves
//! the source thawed. The node, the copies and the guards against a
//! filesystem left frozen are [`carina_tests::copy`]'s.

use std::time::Duration;

use carina_node::engine::Error;
use carina_node::engine::copy::Progress;
use carina_tests::copy::data::{dev, fs_uuid, sha256_bytes, write_file};
use carina_tests::copy::frozen::{Writer, assert_writable, check_records};
use carina_tests::copy::{MIB, Mounted, Node, copy, copy_watched, mkfs_ext4};
use carina_tests::engine::resize_refused;
use carina_tests::run;

// ---------------------------------------------------------------------------
// 3. A mounted source being written to: the snapshot is consistent.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_snapshot_of_a_written_filesystem_is_consistent() {
    let test = "lvm_snapshot_of_a_written_filesystem_is_consistent";
    let Some(n) = Node::new(test, Some(("LVM", 320 * MIB)), None, None).await else {
        return;
    };
    let e = &n.engine;
    let src = n.block("src", 128 * MIB).await;
    let snap = n.block("snap", 128 * MIB).await;
    mkfs_ext4(dev(&src));
    let source = Mounted::new(dev(&src), None);
    let keep = write_file(&source.path().join("keep.bin"), 20, 5 * MIB as usize);

    let writer = Writer::start(source.path(), "log");
    writer.wait_for(50, "the writer writes").await;
    let before = writer.written();
    let (copied, seen) = copy(e, "src", "snap", true).await.copied();
    let at_return = writer.written();
    assert!(copied.copied && copied.record.snapshot && copied.record.complete);
    assert_eq!(copied.record.frozen_at, None, "{copied:?}");
    assert!(seen.frozen, "the source was frozen: {seen:?}");
    let while_frozen = seen.record_while_frozen.clone().expect("a record then");
    assert!(!while_frozen.complete, "{while_frozen:?}");
    assert_eq!(
        while_frozen.frozen_at.as_deref(),
        Some(source.path()),
        "the record names what is frozen while it is"
    );
    assert_eq!(
        seen.last,
        Progress {
            copied_bytes: 128 * MIB,
            total_bytes: 128 * MIB,
            frozen: false,
        }
    );
    // The source was thawed: the writer goes on.
    writer
        .wait_for(at_return + 50, "the writer goes on after the copy")
        .await;
    let total = writer.finish().await;

    // The snapshot is a clean file system...
    let fsck = run("e2fsck", &["-fn", &dev(&snap).to_string_lossy()]);
    assert!(fsck.is_ok(), "e2fsck of the snapshot: {fsck:?}");
    // ...whose log is a prefix of what the writer wrote: every record
    // synced before the copy began, none written after it returned.
    let snapshot = Mounted::new(dev(&snap), Some("ro,noload"));
    let in_snapshot = check_records(
        &std::fs::read(snapshot.path().join("log")).expect("read the snapshot's log"),
        "the snapshot's log",
    );
    assert!(
        (before..=at_return).contains(&in_snapshot),
        "the snapshot holds {in_snapshot} records; {before} were synced before the copy, {at_return} when it returned"
    );
    let in_source = check_records(
        &std::fs::read(source.path().join("log")).expect("read the source's log"),
        "the source's log",
    );
    assert_eq!(in_source, total);
    assert!(
        in_source >= in_snapshot + 50,
        "{in_source} vs {in_snapshot}"
    );
    assert_eq!(
        sha256_bytes(&std::fs::read(snapshot.path().join("keep.bin")).expect("read")),
        keep
    );
    // Read-only, and cannot grow.
    let err = resize_refused(e, "snap", 160 * MIB).await;
    assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");
}

// ---------------------------------------------------------------------------
// 4. Cancellation.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_cancelled_copy_thaws_and_can_be_repeated() {
    let test = "lvm_cancelled_copy_thaws_and_can_be_repeated";
    let Some(n) = Node::new(test, Some(("LVM", 600 * MIB)), None, None).await else {
        return;
    };
    let e = &n.engine;
    let src = n.block("src", 256 * MIB).await;
    let tgt = n.block("tgt", 256 * MIB).await;
    n.block("small", 8 * MIB).await;
    mkfs_ext4(dev(&src));
    let source = Mounted::new(dev(&src), None);
    let data = write_file(&source.path().join("data.bin"), 30, 32 * MIB as usize);

    let cancelled = copy_watched(e, "src", "tgt", false, Some(1)).await;
    let (err, seen) = cancelled.refused();
    match &err {
        Error::Cancelled { what } => {
            assert!(
                what.contains("\"src\"") && what.contains("\"tgt\""),
                "{err}"
            )
        }
        other => panic!("not a cancel: {other}"),
    }
    // The stop was set on an update that said frozen: the source's
    // filesystem stays frozen until the copy ends.
    assert!(seen.frozen, "the source was frozen: {seen:?}");
    assert!(
        seen.max_copied > 0 && seen.last.copied_bytes < 256 * MIB,
        "stopped part of the way: {seen:?}"
    );
    assert!(!seen.last.frozen, "the last progress says thawed: {seen:?}");
    let record = e.copy_record("tgt").expect("a record");
    assert!(!record.complete && record.source == "src", "{record:?}");
    // Thawed, and recorded so: a later start thaws nothing there.
    assert_eq!(record.frozen_at, None, "{record:?}");
    assert_eq!(n.record_files(), ["tgt.json"]);
    assert_writable(source.path(), "after-cancel").await;

    // An incomplete copy is no source.
    let (err, _) = copy(e, "tgt", "small", false).await.refused();
    assert!(
        matches!(&err, Error::FailedPrecondition { operation: "copy", name, .. } if name == "tgt"),
        "{err}"
    );
    assert_eq!(e.copy_record("small"), None);

    // The repeat starts over and completes: the target holds the
    // source's files, in a filesystem with a UUID of its own.
    drop(source);
    let (copied, seen) = copy(e, "src", "tgt", false).await.copied();
    assert!(copied.copied);
    assert!(!seen.frozen, "unmounted: nothing to freeze");
    assert_eq!(seen.last.copied_bytes, 256 * MIB);
    let record = e.copy_record("tgt").expect("a record");
    assert!(record.complete && record.frozen_at.is_none(), "{record:?}");
    assert_ne!(fs_uuid(dev(&tgt)), fs_uuid(dev(&src)));
    let check = Mounted::new(dev(&tgt), Some("ro"));
    assert!(check.path().join("after-cancel").exists());
    assert_eq!(
        sha256_bytes(&std::fs::read(check.path().join("data.bin")).expect("read")),
        data
    );
}

// ---------------------------------------------------------------------------
// 5. The freeze timeout.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_freeze_timeout_stops_the_copy_and_thaws() {
    let test = "lvm_freeze_timeout_stops_the_copy_and_thaws";
    let limit = Duration::from_millis(1);
    let Some(n) = Node::new(test, Some(("LVM", 600 * MIB)), None, Some(limit)).await else {
        return;
    };
    let e = &n.engine;
    let src = n.block("src", 256 * MIB).await;
    n.block("tgt", 256 * MIB).await;
    mkfs_ext4(dev(&src));
    let source = Mounted::new(dev(&src), None);
    let data = write_file(&source.path().join("data.bin"), 40, 16 * MIB as usize);

    let (err, seen) = copy(e, "src", "tgt", false).await.refused();
    match &err {
        Error::TimedOut { what, waited } => {
            assert_eq!(*waited, limit, "{err}");
            assert!(
                what.contains("\"src\"") && what.contains("\"tgt\""),
                "{err}"
            );
        }
        other => panic!("not a timeout: {other}"),
    }
    assert!(!seen.last.frozen, "{seen:?}");
    assert!(seen.last.copied_bytes < 256 * MIB, "{seen:?}");
    assert_writable(source.path(), "after-timeout").await;
    let record = e.copy_record("tgt").expect("a record");
    assert!(!record.complete && record.frozen_at.is_none(), "{record:?}");
    // A read-only mount is not frozen, so the limit does not apply.
    drop(source);
    let _ro = Mounted::new(dev(&src), Some("ro"));
    let (copied, seen) = copy(e, "src", "tgt", false).await.copied();
    assert!(copied.copied && !seen.frozen, "{seen:?}");
    assert_ne!(fs_uuid(dev(&copied.volume)), fs_uuid(dev(&src)));
    let check = Mounted::new(dev(&copied.volume), Some("ro"));
    assert_eq!(
        sha256_bytes(&std::fs::read(check.path().join("data.bin")).expect("read")),
        data
    );
}
