//! Taking a disk out of an LVM group, the way docs/config.md says to: its
//! extents moved off, `vgreduce`, then the node restarted (it reads a
//! physical volume that left its volume group as a pulled disk until
//! then), with the selector changed or not (the node does not take back
//! the physical volume of no volume group that is left). And why not the
//! other way round: a selector that drops a disk of the group's volume
//! group first leaves LVM missing a physical volume of it, and no volume
//! can be created in the group until the disk is selected again.

use carina_tests::engine::{EngineFixture, capacity, create, engine_over, names, refused};
use carina_tests::lvm;

const MIB: u64 = 1 << 20;
/// A 64 MiB disk holds 15 extents of 4 MiB.
const DISK_ROOM: u64 = 60 * MIB;

/// The disk of `f` no extent of which is used, and the other one.
fn empty_and_used(f: &EngineFixture) -> (usize, usize) {
    let devs: Vec<String> = f.disks.iter().map(|d| d.dev()).collect();
    let all: Vec<&str> = devs.iter().map(String::as_str).collect();
    let out = lvm(
        &all,
        &[
            "pvs",
            "--noheadings",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            "pv_name,pv_used",
        ],
    )
    .expect("pvs");
    let used = |dev: &str| -> u64 {
        out.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|cols| cols.first() == Some(&dev))
            .and_then(|cols| cols.get(1).and_then(|n| n.parse().ok()))
            .unwrap_or_else(|| panic!("{dev} in pvs: {out}"))
    };
    match (used(&devs[0]), used(&devs[1])) {
        (0, u) if u > 0 => (0, 1),
        (u, 0) if u > 0 => (1, 0),
        other => panic!("one volume on two disks: used {other:?}"),
    }
}

#[tokio::test]
async fn a_disk_leaves_an_lvm_group_by_vgreduce_then_a_restart() {
    let Some(f) = EngineFixture::new("leave", "LVM", &[64 * MIB, 64 * MIB], 0).await else {
        return;
    };
    let kept = f.create(f.req("kept", 8 * MIB)).await;
    assert_eq!(f.capacity().await.total_bytes, 2 * DISK_ROOM);
    let (leaving, staying) = empty_and_used(&f);
    let both: Vec<String> = f.disks.iter().map(|d| d.dev()).collect();
    let both: Vec<&str> = both.iter().map(String::as_str).collect();
    lvm(&both, &["vgreduce", &f.group, both[leaving]]).expect("vgreduce");

    // The running node reads the disk that left as a pulled one and
    // refuses the group, naming it, rather than a smaller picture.
    let err = f.engine.rescan().await.expect_err("a disk left the VG");
    assert!(
        err.to_string().contains(both[leaving]) && err.to_string().contains("missing"),
        "{err}"
    );

    // Restarted with the selector unchanged: the disk is a physical volume
    // of no volume group now, which the node does not take back.
    let restarted = f.restart().await;
    assert_eq!(capacity(&restarted, &f.group).await.total_bytes, DISK_ROOM);
    assert_eq!(restarted.get_volume("kept").await.expect("kept"), kept);
    let after = create(&restarted, f.req("after", 8 * MIB)).await;
    let vg = lvm(
        &[both[leaving]],
        &["pvs", "--noheadings", "-o", "vg_name", both[leaving]],
    )
    .expect("pvs of the disk that left");
    assert_eq!(vg.trim(), "", "the disk went back into a volume group");
    drop(restarted);

    // Restarted with the selector changed: the group on the one disk,
    // every change allowed.
    let engine = engine_over(&f.group, "LVM", std::slice::from_ref(&f.disks[staying]), 0).await;
    let mut names = names(&engine, &f.group).await;
    names.sort();
    assert_eq!(names, ["after", "kept"]);
    assert_eq!(engine.get_volume("after").await.expect("after"), after);
    assert_eq!(capacity(&engine, &f.group).await.total_bytes, DISK_ROOM);
    create(&engine, f.req("third", 8 * MIB)).await;
    engine.delete_volume("third").await.expect("delete");
}

#[tokio::test]
async fn a_selector_that_drops_a_disk_first_leaves_the_group_unable_to_create() {
    let Some(f) = EngineFixture::new("drop", "LVM", &[64 * MIB, 64 * MIB], 0).await else {
        return;
    };
    f.create(f.req("kept", 8 * MIB)).await;
    let (_, staying) = empty_and_used(&f);
    let engine = engine_over(&f.group, "LVM", std::slice::from_ref(&f.disks[staying]), 0).await;
    let refused = refused(&engine, f.req("new", 8 * MIB)).await;
    assert!(
        refused.to_string().contains("missing"),
        "a create in a volume group missing a disk: {refused}"
    );
    drop(engine);
    // Selected again, the disk completes the volume group: no harm done.
    let restored = f.restart().await;
    create(&restored, f.req("new", 8 * MIB)).await;
    let mut left = names(&restored, &f.group).await;
    left.sort();
    assert_eq!(left, ["kept", "new"]);
}
