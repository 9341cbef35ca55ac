//! Engine tests of block copies ([`Engine::copy_volume`](carina_node::engine::Engine::copy_volume)) between LVM and
//! RAW volumes on real loop devices: the data, the records that make
//! repeats no-ops and snapshots read-only, conflicts, and a copy stopped
//! between its blocks and its new filesystem UUID that the repeat
//! finishes. The node and the copies are [`carina_tests::copy`]'s; data is
//! checked by SHA-256.

use carina_node::engine::Error;
use carina_node::engine::copy::Progress;
use carina_node::engine::copy::record::CopyRecord;
use carina_tests::copy::data::{
    dev, fs_uuid, pseudo_random, sha256_bytes, sha256_prefix, write_device, write_file,
};
use carina_tests::copy::{MIB, Node, copy, mount_dir};
use carina_tests::engine::resize_refused;
use carina_tests::{MountGuard, run};

// ---------------------------------------------------------------------------
// 1. Block copies (LVM, RAW): data, records, repeats, conflicts, snapshots.
// ---------------------------------------------------------------------------

async fn block_copies(test: &str, policy: &'static str) {
    let Some(n) = Node::new(test, Some((policy, 320 * MIB)), None, None).await else {
        return;
    };
    let e = &n.engine;
    // `tgt` sits right before `snap`, which is last: `snap` would have the
    // room to grow, and `tgt` has it once `snap` is gone.
    let src = n.block("src", 64 * MIB).await;
    n.block("other", 8 * MIB).await;
    let tgt = n.block("tgt", 96 * MIB).await;
    let snap = n.block("snap", 64 * MIB).await;

    let data = pseudo_random(1, (64 * MIB) as usize);
    write_device(dev(&src), 0, &data);
    let want = sha256_bytes(&data);
    assert_eq!(sha256_prefix(dev(&src), 64 * MIB), want, "the source");
    // The targets hold something else first.
    for v in [&tgt, &snap] {
        write_device(dev(v), 0, &pseudo_random(2, (64 * MIB) as usize));
        assert_ne!(sha256_prefix(dev(v), 64 * MIB), want);
    }
    assert_eq!(e.copy_record("tgt"), None);

    let (copied, seen) = copy(e, "src", "tgt", false).await.copied();
    assert!(copied.copied, "{copied:?}");
    assert_eq!(copied.volume.name, "tgt");
    assert_eq!(
        copied.volume.size_bytes,
        96 * MIB,
        "the target keeps its size"
    );
    assert_eq!(sha256_prefix(dev(&tgt), 64 * MIB), want, "the copy");
    assert_eq!(
        seen.last,
        Progress {
            copied_bytes: 64 * MIB,
            total_bytes: 64 * MIB,
            frozen: false,
        }
    );
    assert!(seen.updates > 0 && seen.max_copied == 64 * MIB, "{seen:?}");
    assert!(!seen.frozen, "nothing is mounted, nothing to freeze");
    let record = e.copy_record("tgt").expect("a record");
    assert_eq!(record, copied.record);
    assert_eq!(record.source, "src");
    assert!(record.complete && !record.snapshot, "{record:?}");
    assert_eq!(record.source_size_bytes, 64 * MIB);
    assert!(record.completed_unix_nanos > 0, "{record:?}");
    assert_eq!(record.frozen_at, None);
    assert_eq!(n.record_files(), ["tgt.json"]);

    // The same copy again does nothing, even though the source changed.
    write_device(dev(&src), 0, &pseudo_random(3, MIB as usize));
    let (again, _) = copy(e, "src", "tgt", false).await.copied();
    assert!(!again.copied, "{again:?}");
    assert_eq!(again.record, record);
    assert_eq!(e.copy_record("tgt").as_ref(), Some(&record));
    assert_eq!(sha256_prefix(dev(&tgt), 64 * MIB), want, "nothing copied");

    // Another source, or a snapshot instead of a copy, conflicts.
    for (source, snapshot) in [("other", false), ("src", true)] {
        let (err, seen) = copy(e, source, "tgt", snapshot).await.refused();
        match &err {
            Error::CopyConflict { target, holds } => {
                assert_eq!(target, "tgt");
                assert!(holds.contains("\"src\""), "{err}");
            }
            other => panic!("{source} into tgt: {other}"),
        }
        assert_eq!(seen.updates, 0, "nothing copied: {seen:?}");
    }
    assert_eq!(e.copy_record("tgt").as_ref(), Some(&record));
    assert_eq!(sha256_prefix(dev(&tgt), 64 * MIB), want, "the conflicts");

    // A snapshot of the (changed) source: read-only, gone with its volume.
    let now = sha256_prefix(dev(&src), 64 * MIB);
    assert_ne!(now, want);
    let (snapped, seen) = copy(e, "src", "snap", true).await.copied();
    assert!(snapped.copied);
    assert_eq!(seen.last.copied_bytes, 64 * MIB);
    assert!(
        snapped.record.snapshot && snapped.record.complete,
        "{snapped:?}"
    );
    assert_eq!(e.copy_record("snap"), Some(snapped.record.clone()));
    assert_eq!(sha256_prefix(dev(&snap), 64 * MIB), now, "the snapshot");
    let err = resize_refused(e, "snap", 80 * MIB).await;
    assert!(
        matches!(&err, Error::FailedPrecondition { operation: "resize", name, reason }
            if name == "snap" && reason.contains("snapshot")),
        "{err}"
    );
    assert_eq!(
        e.resize_volume("snap", 64 * MIB)
            .await
            .expect("its own size")
            .size_bytes,
        64 * MIB
    );
    assert_eq!(n.record_files(), ["snap.json", "tgt.json"]);
    e.delete_volume("snap").await.expect("delete the snapshot");
    assert_eq!(e.copy_record("snap"), None);
    assert_eq!(n.record_files(), ["tgt.json"]);

    // A copy that is no snapshot grows (into the room `snap` left).
    let grown = e.resize_volume("tgt", 128 * MIB).await.expect("grow");
    assert_eq!(grown.size_bytes, 128 * MIB);
    assert_eq!(
        sha256_prefix(dev(&grown), 64 * MIB),
        want,
        "kept by the grow"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_block_copy_repeat_conflict_and_snapshot() {
    block_copies("lvm_block_copy_repeat_conflict_and_snapshot", "LVM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_block_copy_repeat_conflict_and_snapshot() {
    block_copies("raw_block_copy_repeat_conflict_and_snapshot", "RAW").await;
}

// ---------------------------------------------------------------------------
// 7. A node stopped between the copied blocks and the new UUID.
// ---------------------------------------------------------------------------

/// What a node killed at `copy.blocks_copied` leaves (every block of an
/// xfs source frozen while mounted is on the target, the record says so,
/// the UUID is still the source's) is finished by the repeated copy: no
/// block is copied again (the source is not frozen, and what was written
/// to it since is not in the target), the target gets a UUID of its own
/// (its log replayed first) and mounts beside the mounted source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_copy_stopped_before_its_new_uuid_is_finished_by_the_repeat() {
    let test = "lvm_copy_stopped_before_its_new_uuid_is_finished_by_the_repeat";
    let Some(n) = Node::new(test, Some(("LVM", 700 * MIB)), None, None).await else {
        return;
    };
    let e = &n.engine;
    let size = 320 * MIB;
    let src = n.block("src", size).await;
    let tgt = n.block("tgt", size).await;
    run("mkfs.xfs", &["-q", "-f", &dev(&src).to_string_lossy()]).expect("mkfs.xfs");
    let source_dir = mount_dir("carina-copy-xfs-src-");
    let _source = MountGuard::mount(
        &dev(&src).to_string_lossy(),
        source_dir.path(),
        Some("xfs"),
        None,
    )
    .expect("mount the source");
    let before = write_file(&source_dir.path().join("before.bin"), 70, 4 * MIB as usize);

    // The state of the kill: the blocks of the frozen source, a record
    // saying they are all there.
    let at = source_dir.path().to_string_lossy().into_owned();
    run("fsfreeze", &["-f", &at]).expect("freeze");
    let copied = run(
        "dd",
        &[
            &format!("if={}", dev(&src).display()),
            &format!("of={}", dev(&tgt).display()),
            "bs=4M",
            "iflag=direct",
            "oflag=direct,sync",
            "status=none",
        ],
    );
    run("fsfreeze", &["-u", &at]).expect("thaw");
    copied.expect("dd");
    let record = CopyRecord {
        source: "src".into(),
        snapshot: false,
        blocks_copied: true,
        complete: false,
        completed_unix_nanos: 0,
        source_size_bytes: size,
        frozen_at: None,
    };
    let records = n.records.path().join("copies");
    std::fs::create_dir_all(&records).expect("the records directory");
    std::fs::write(
        records.join("tgt.json"),
        serde_json::to_string(&record).expect("json"),
    )
    .expect("write the record");
    assert_eq!(
        fs_uuid(dev(&tgt)),
        fs_uuid(dev(&src)),
        "the UUID is the source's"
    );
    write_file(&source_dir.path().join("after.bin"), 71, MIB as usize);

    let (copied, seen) = copy(e, "src", "tgt", false).await.copied();
    assert!(copied.copied && copied.record.complete, "{copied:?}");
    assert!(!seen.frozen, "nothing copied, so nothing frozen: {seen:?}");
    assert_eq!(seen.last.copied_bytes, size, "{seen:?}");
    assert_ne!(fs_uuid(dev(&tgt)), fs_uuid(dev(&src)));
    let target_dir = mount_dir("carina-copy-xfs-tgt-");
    let _target = MountGuard::mount(
        &dev(&tgt).to_string_lossy(),
        target_dir.path(),
        Some("xfs"),
        None,
    )
    .expect("the copy mounts beside its source");
    assert_eq!(
        sha256_bytes(&std::fs::read(target_dir.path().join("before.bin")).expect("read")),
        before
    );
    assert!(
        !target_dir.path().join("after.bin").exists(),
        "the blocks were not copied again"
    );
    // A repeat now is a no-op.
    let (again, _) = copy(e, "src", "tgt", false).await.copied();
    assert!(!again.copied);
}
