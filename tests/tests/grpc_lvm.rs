//! NodeStorage over mutual TLS against an LVM group on a loop disk: the
//! volume is a real block device, and a second operation on a name whose
//! first operation is still running is ABORTED.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use carina_proto::nodestorage as pb;
use carina_tests::grpc::{TestNode, create_lv, start_engine};
use carina_tests::{LoopDisk, VgGuard, have_root, run, unique};
use tonic::Code;

const MIB: u64 = 1 << 20;
/// Guards against hangs only.
const HANG_GUARD: Duration = Duration::from_secs(60);

fn config_json(group: &str, disk: &LoopDisk) -> String {
    carina_tests::disk_group_config(group, "LVM", &[disk], 0)
}

/// Holds LVM's lock file of one volume group (as another LVM command
/// would), so every `lvm` command on that VG waits. Released on drop.
struct VgLockHolder {
    child: Child,
}

impl VgLockHolder {
    fn hold(vg: &str) -> VgLockHolder {
        let dir = "/run/lock/lvm";
        std::fs::create_dir_all(dir).expect("lock dir");
        // flock keeps the lock while its command runs; the command prints
        // once the lock is held and ends when its stdin closes.
        let mut child = Command::new("flock")
            .args(["--close", &format!("{dir}/V_{vg}")])
            .args(["sh", "-c", "echo locked; cat >/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run flock");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read");
        assert_eq!(line.trim(), "locked");
        VgLockHolder { child }
    }
}

impl Drop for VgLockHolder {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        if self.child.wait().is_err() {
            let _ = self.child.kill();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lvm_volume_over_grpc_and_aborted_concurrent_operation() {
    if !have_root("lvm_volume_over_grpc_and_aborted_concurrent_operation") {
        return;
    }
    let disk = LoopDisk::new(256 * MIB).expect("loop disk");
    let group = unique("vg");
    let _vg = VgGuard::new(&group, &[&disk]);
    let engine = start_engine(&config_json(&group, &disk))
        .await
        .expect("engine");
    let node = TestNode::start(engine, "node-a").await.expect("server");
    let client = node.client("controller").await.expect("client");

    // The happy path on LVM: a block device of exactly the reported size.
    let made = client
        .clone()
        .create_lv(create_lv("plain", &group, 10 * MIB))
        .await
        .expect("CreateLV")
        .into_inner();
    assert!(made.created);
    let v = made.volume.expect("volume");
    assert_eq!(v.policy, pb::Policy::Lvm as i32);
    assert!(v.size_bytes >= 10 * MIB);
    assert!(v.major > 0, "a block device has a major number");
    let size: u64 = run("blockdev", &["--getsize64", &v.device_path])
        .expect("blockdev")
        .trim()
        .parse()
        .expect("number");
    assert_eq!(size, v.size_bytes);

    // While LVM is busy with the first create of "held", a second
    // operation on the same name is refused at once.
    let lock = VgLockHolder::hold(&group);
    let first = tokio::spawn({
        let mut c = client.clone();
        let req = create_lv("held", &group, 8 * MIB);
        async move { c.create_lv(req).await }
    });
    // The first call reaches the engine and takes the volume's lock; it
    // then waits for LVM, whose lvcreate (in this process's lvm shell)
    // waits for our lock.
    carina_tests::wait_until(
        "the first create's lvcreate waits for the VG lock",
        HANG_GUARD,
        || carina_tests::lvmlock::a_descendant_waits(std::process::id()),
    )
    .await
    .expect("the first create reaches LVM");
    assert!(!first.is_finished(), "the first create waits for LVM");
    let second = tokio::time::timeout(
        HANG_GUARD,
        client.clone().create_lv(create_lv("held", &group, 8 * MIB)),
    )
    .await
    .expect("answered at once, not queued")
    .expect_err("concurrent create");
    assert_eq!(second.code(), Code::Aborted, "{second:?}");
    assert!(
        second.message().contains("\"held\""),
        "{}",
        second.message()
    );
    let resize = tokio::time::timeout(
        HANG_GUARD,
        client.clone().resize_lv(pb::ResizeLvRequest {
            name: "held".into(),
            size_bytes: 16 * MIB,
        }),
    )
    .await
    .expect("answered at once")
    .expect_err("concurrent resize");
    assert_eq!(resize.code(), Code::Aborted, "{resize:?}");

    drop(lock);
    let first = tokio::time::timeout(HANG_GUARD, first)
        .await
        .expect("the first create finishes once LVM may run")
        .expect("task")
        .expect("first create succeeds")
        .into_inner();
    assert!(first.created);
    let again = client
        .clone()
        .create_lv(create_lv("held", &group, 8 * MIB))
        .await
        .expect("repeat")
        .into_inner();
    assert!(!again.created, "the repeat finds the volume");
    assert_eq!(again.volume, first.volume);

    let mut c = client.clone();
    for name in ["plain", "held"] {
        c.delete_lv(pb::DeleteLvRequest { name: name.into() })
            .await
            .expect("delete");
    }
    assert!(
        c.list_l_vs(pb::ListLVsRequest::default())
            .await
            .expect("list")
            .into_inner()
            .volumes
            .is_empty()
    );
    node.stop().await.expect("stop");
}
