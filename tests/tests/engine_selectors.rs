//! Disk selectors on real loop devices: a pattern takes a disk by its path
//! (`^/dev/loopN$`, as Carina matches) or by its kernel name (`^loopN$`);
//! a group whose patterns match no usable disk is warned about once per
//! change and reports why in its capacity (`no_disks`), which the control
//! plane turns into the `NoDisks` condition.
//!
//! Patterns here are anchored at least at the end: an unanchored `loop1`
//! would also take other tests' `loop12`. Unanchored matching is covered by
//! the unit tests of the selector.

use std::io::Write;
use std::sync::{Arc, Mutex};

use carina_tests::engine::engine_for;
use carina_tests::{LoopDisk, VgGuard, have_root, unique};

const MIB: u64 = 1 << 20;

/// Log lines written by the subscriber of one test.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn lvm_group(name: &str, pattern: &str) -> serde_json::Value {
    serde_json::json!({
        "name": name, "re": [pattern], "policy": "LVM",
        "reserveBytes": 0, "minDiskBytes": MIB,
    })
}

fn config(groups: &[serde_json::Value]) -> String {
    serde_json::json!({"diskSelector": groups, "diskScanInterval": "0"}).to_string()
}

// One thread: the engine's scans log where the test's subscriber is.
#[tokio::test(flavor = "current_thread")]
async fn path_and_kernel_name_patterns_take_their_disks() {
    if !have_root("path_and_kernel_name_patterns_take_their_disks") {
        return;
    }
    let by_path_disk = LoopDisk::new(64 * MIB).expect("loop disk");
    let by_name_disk = LoopDisk::new(64 * MIB).expect("loop disk");
    let (by_path, by_name) = (unique("path"), unique("name"));
    let _vgs = [
        VgGuard::new(&by_path, &[&by_path_disk]),
        VgGuard::new(&by_name, &[&by_name_disk]),
    ];
    let engine = engine_for(
        &config(&[
            lvm_group(&by_path, &format!("^{}$", by_path_disk.dev())),
            lvm_group(&by_name, &format!("^{}$", by_name_disk.name)),
        ]),
        None,
    )
    .await;
    let capacity = engine.capacity(None).await.expect("capacity");
    for (group, disk) in [(&by_path, &by_path_disk), (&by_name, &by_name_disk)] {
        let c = capacity
            .iter()
            .find(|c| &c.group == group)
            .expect("the group reports");
        assert_eq!(c.disks, [disk.dev()], "{group} took its disk");
        assert_eq!(c.no_disks, None);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_selector_that_matches_nothing_says_why_once() {
    if !have_root("a_selector_that_matches_nothing_says_why_once") {
        return;
    }
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);

    let disk = LoopDisk::new(64 * MIB).expect("loop disk");
    let (taken, typo) = (unique("taken"), unique("typo"));
    let _vg = VgGuard::new(&taken, &[&disk]);
    // The typo group's pattern names a device that is not there; the other
    // group's disk is seen and claimed by that group.
    let missing = format!("^/dev/{}-missing$", disk.name);
    let engine = engine_for(
        &config(&[
            lvm_group(&taken, &disk.pattern()),
            lvm_group(&typo, &missing),
        ]),
        None,
    )
    .await;

    let capacity = engine.capacity(None).await.expect("capacity");
    let empty = capacity
        .iter()
        .find(|c| c.group == typo)
        .expect("the empty group reports");
    let why = empty.no_disks.as_deref().expect("no_disks is set");
    assert!(why.contains(&typo), "{why}");
    assert!(why.contains(&missing), "names its pattern: {why}");
    assert!(why.contains(&disk.dev()), "lists the disks it saw: {why}");
    assert!(why.contains("no pattern matches"), "{why}");
    let taken_cap = capacity
        .iter()
        .find(|c| c.group == taken)
        .expect("the other group reports");
    assert_eq!(taken_cap.no_disks, None);

    let warned = |text: &str| {
        text.lines()
            .filter(|l| l.contains("WARN") && l.contains(&typo) && l.contains("took no disk"))
            .count()
    };
    assert_eq!(warned(&logs.text()), 1, "{}", logs.text());
    // A rescan that finds the same: no second warning.
    engine.rescan().await.expect("rescan");
    assert_eq!(warned(&logs.text()), 1, "once per change: {}", logs.text());
}
