//! Engine tests of the copies ([`Engine::copy_volume`](carina_node::engine::Engine::copy_volume)) the engine
//! refuses: each changes nothing, neither the volumes nor the records.
//! The node and the copies are [`carina_tests::copy`]'s.

use carina_node::engine::{Error, Volume};
use carina_tests::copy::data::{dev, dir, pseudo_random, sha256_prefix, write_device};
use carina_tests::copy::{MIB, Mounted, Node, copy, mkfs_ext4};

// ---------------------------------------------------------------------------
// 6. Refusals change nothing.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_copies_change_nothing() {
    let test = "refused_copies_change_nothing";
    let Some(n) = Node::new(test, Some(("LVM", 256 * MIB)), Some(64 * MIB), None).await else {
        return;
    };
    let e = &n.engine;
    let src = n.block("src", 16 * MIB).await;
    let small = n.block("small", 8 * MIB).await;
    let dst = n.block("dst", 16 * MIB).await;
    let mounted = n.block("mounted", 16 * MIB).await;
    let hsrc = n.host("hsrc", 4 * MIB).await;
    let hdst = n.host("hdst", 16 * MIB).await;
    write_device(dev(&src), 0, &pseudo_random(50, (16 * MIB) as usize));
    write_device(dev(&small), 0, &pseudo_random(51, (8 * MIB) as usize));
    write_device(dev(&dst), 0, &pseudo_random(52, (16 * MIB) as usize));
    mkfs_ext4(dev(&mounted));
    let mount = Mounted::new(dev(&mounted), None);
    std::fs::write(mount.path().join("theirs"), b"in use").expect("write");
    std::fs::write(dir(&hsrc).join("file"), b"host source").expect("write");
    std::fs::write(dir(&hdst).join("file"), b"host target").expect("write");
    let hashes = |vs: &[&Volume]| -> Vec<String> {
        vs.iter()
            .map(|v| sha256_prefix(dev(v), v.size_bytes))
            .collect()
    };
    let before = hashes(&[&src, &small, &dst]);

    let invalid = |f: &'static str| move |err: &Error| matches!(err, Error::InvalidArgument { field, .. } if field == f);
    let not_found = |v: &'static str| move |err: &Error| matches!(err, Error::VolumeNotFound { name } if name == v);
    let precondition = |v: &'static str| move |err: &Error| matches!(err, Error::FailedPrecondition { operation: "copy", name, .. } if name == v);
    type Check = Box<dyn Fn(&Error) -> bool>;
    let cases: Vec<(&str, &str, Check)> = vec![
        ("src", "src", Box::new(invalid("target"))),
        ("bad/name", "dst", Box::new(invalid("source"))),
        ("src", ".hidden", Box::new(invalid("target"))),
        ("missing", "dst", Box::new(not_found("missing"))),
        ("src", "missing", Box::new(not_found("missing"))),
        ("src", "small", Box::new(precondition("small"))),
        ("src", "mounted", Box::new(precondition("mounted"))),
        ("hsrc", "dst", Box::new(precondition("dst"))),
        ("src", "hdst", Box::new(precondition("hdst"))),
    ];
    for (source, target, check) in &cases {
        for snapshot in [false, true] {
            let (err, seen) = copy(e, source, target, snapshot).await.refused();
            assert!(check(&err), "{source} into {target}: {err:?}");
            assert_eq!(seen.updates, 0, "{source} into {target}: {seen:?}");
            assert_eq!(e.copy_record(target), None, "{source} into {target}");
            assert_eq!(
                n.record_files(),
                Vec::<String>::new(),
                "{source} into {target}"
            );
        }
    }
    assert_eq!(hashes(&[&src, &small, &dst]), before, "no data changed");
    assert_eq!(
        std::fs::read(mount.path().join("theirs")).expect("read"),
        b"in use"
    );
    assert_eq!(
        std::fs::read(dir(&hdst).join("file")).expect("read"),
        b"host target"
    );
    let snap = n.engine.list_volumes(None).await.expect("list");
    assert_eq!(snap.len(), 6, "{snap:?}");

    // The same volumes copy where the copy is possible.
    drop(mount);
    let (copied, _) = copy(e, "src", "mounted", false).await.copied();
    assert!(copied.copied);
    assert_eq!(hashes(&[&mounted]), before[..1].to_vec());
    let (copied, _) = copy(e, "hsrc", "hdst", true).await.copied();
    assert!(copied.copied && copied.record.snapshot);
    assert_eq!(
        std::fs::read(dir(&hdst).join("file")).expect("read"),
        b"host source"
    );
    assert_eq!(n.record_files(), ["hdst.json", "mounted.json"]);
}
