//! CopyLV over real mutual TLS, against an in-process server whose engine
//! has one HOST group: clones and snapshots filled file by file, the
//! origin every answer carries, idempotency, refusals with precise codes
//! (whether the call or its stream returns them), a copy stopped by the
//! client going away or by the node shutting down, and authorization.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use carina_proto::nodestorage as pb;
use carina_tests::grpc::{
    Client, CopyRun, EngineDirs, TestNode, copy_lv, create_lv, get_lv, host_engine,
};
use carina_tests::unique;
use tonic::Code;

const MIB: u64 = 1 << 20;
/// Guards against hangs only; the awaited events happen in milliseconds.
const HANG_GUARD: Duration = Duration::from_secs(30);
/// Guards against hangs only: the copies here move at most a few
/// hundred MiB.
const COPY_GUARD: Duration = Duration::from_secs(180);

async fn node(group: &str) -> (TestNode, EngineDirs) {
    let (engine, dirs) = host_engine(group, None).await.expect("engine");
    let node = TestNode::start(engine, "node-a").await.expect("server");
    (node, dirs)
}

fn copy_req(source: &str, target: &str, snapshot: bool) -> pb::CopyLvRequest {
    pb::CopyLvRequest {
        source: source.into(),
        target: target.into(),
        snapshot,
    }
}

/// CopyLV read to its end (see [`copy_lv`]).
async fn copy(c: &mut Client, source: &str, target: &str, snapshot: bool) -> CopyRun {
    tokio::time::timeout(COPY_GUARD, copy_lv(c, copy_req(source, target, snapshot)))
        .await
        .expect("CopyLV ends in time")
        .expect("a well-formed CopyLV stream")
}

/// A completed copy: its last message, checked against the progress
/// messages before it.
async fn copied(c: &mut Client, source: &str, target: &str, snapshot: bool) -> pb::CopyLvProgress {
    let run = copy(c, source, target, snapshot).await;
    let last = run
        .outcome
        .unwrap_or_else(|e| panic!("CopyLV {source} -> {target}: {e:?}"));
    assert!(last.done);
    assert!(!last.frozen, "a HOST copy freezes nothing: {last:?}");
    let mut before = 0;
    for p in &run.progress {
        assert!(!p.done && p.target.is_none(), "{p:?}");
        assert!(!p.frozen, "a HOST copy freezes nothing: {p:?}");
        assert!(p.copied_bytes >= before, "progress goes forward: {p:?}");
        if p.total_bytes > 0 {
            assert!(p.copied_bytes <= p.total_bytes, "{p:?}");
        }
        before = p.copied_bytes;
    }
    last
}

/// The status a CopyLV ended with, whichever way it came.
async fn refused(c: &mut Client, source: &str, target: &str, snapshot: bool) -> tonic::Status {
    let run = copy(c, source, target, snapshot).await;
    assert!(run.progress.iter().all(|p| !p.done), "{:?}", run.progress);
    match run.outcome {
        Ok(done) => panic!("CopyLV {source:?} -> {target:?} succeeded: {done:?}"),
        Err(status) => status,
    }
}

async fn create(c: &mut Client, name: &str, group: &str, size: u64) -> pb::LogicVolume {
    let v = c
        .create_lv(create_lv(name, group, size))
        .await
        .unwrap_or_else(|e| panic!("CreateLV {name}: {e:?}"))
        .into_inner()
        .volume
        .expect("volume");
    assert!(!v.host_path.is_empty(), "a HOST volume has a directory");
    assert_eq!(v.origin, None, "a new volume has no origin: {v:?}");
    v
}

async fn volume(c: &mut Client, name: &str) -> pb::LogicVolume {
    get_lv(c, name)
        .await
        .expect("GetLV")
        .unwrap_or_else(|| panic!("no volume {name}"))
}

async fn list(c: &mut Client) -> BTreeMap<String, pb::LogicVolume> {
    c.list_l_vs(pb::ListLVsRequest::default())
        .await
        .expect("ListLVs")
        .into_inner()
        .volumes
        .into_iter()
        .map(|v| (v.name.clone(), v))
        .collect()
}

fn resize(name: &str, size: u64) -> pb::ResizeLvRequest {
    pb::ResizeLvRequest {
        name: name.into(),
        size_bytes: size,
    }
}

fn nanos_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_nanos() as i64
}

/// Bytes that differ from file to file (by `seed`) and along a file.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    // A block of an odd length repeated: cheap to make, and no two
    // chunks of a copy alike.
    let block: Vec<u8> = (0..4093u64)
        .map(|i| ((i * 31 + seed * 7) % 251) as u8)
        .collect();
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let n = (len - out.len()).min(block.len());
        out.extend_from_slice(&block[..n]);
    }
    out
}

/// A file's bytes, compared in full but shown by length only.
#[derive(PartialEq, Eq)]
struct Content(Vec<u8>);

impl std::fmt::Debug for Content {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes>", self.0.len())
    }
}

/// One entry of a directory tree, as a copy must reproduce it.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    Dir {
        mode: u32,
        uid: u32,
        gid: u32,
    },
    File {
        mode: u32,
        uid: u32,
        gid: u32,
        modified: SystemTime,
        content: Content,
    },
    Link(PathBuf),
}

/// Every entry under `root` (itself as ""), by path relative to it.
fn tree(root: &Path) -> BTreeMap<PathBuf, Entry> {
    fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Entry>) {
        let path = root.join(rel);
        let meta = std::fs::symlink_metadata(&path).expect("stat");
        let (mode, uid, gid) = (meta.mode() & 0o7777, meta.uid(), meta.gid());
        let kind = meta.file_type();
        let entry = if kind.is_dir() {
            Entry::Dir { mode, uid, gid }
        } else if kind.is_file() {
            Entry::File {
                mode,
                uid,
                gid,
                modified: meta.modified().expect("mtime"),
                content: Content(std::fs::read(&path).expect("read")),
            }
        } else if kind.is_symlink() {
            Entry::Link(std::fs::read_link(&path).expect("readlink"))
        } else {
            panic!("unexpected file type at {}", path.display());
        };
        out.insert(rel.to_path_buf(), entry);
        if kind.is_dir() {
            for e in std::fs::read_dir(&path).expect("list") {
                walk(root, &rel.join(e.expect("entry").file_name()), out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, Path::new(""), &mut out);
    out
}

/// The bytes of regular files in a tree (what a copy of it moves).
fn file_bytes(t: &BTreeMap<PathBuf, Entry>) -> u64 {
    t.values()
        .map(|e| match e {
            Entry::File { content, .. } => content.0.len() as u64,
            _ => 0,
        })
        .sum()
}

/// Writes a small tree into `dir`: a small file with its own mode, one
/// file larger than a copy chunk (4 MiB), an empty file, nested
/// directories and a symbolic link. Returns the file bytes written.
fn fill(dir: &Path, seed: u64) -> u64 {
    let small = dir.join("small.txt");
    std::fs::write(&small, format!("hello {seed}\n")).expect("write");
    std::fs::set_permissions(&small, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    std::fs::create_dir_all(dir.join("sub/deeper")).expect("mkdir");
    std::fs::set_permissions(dir.join("sub"), std::fs::Permissions::from_mode(0o750))
        .expect("chmod");
    std::fs::write(
        dir.join("sub/big.bin"),
        pattern(5 * MIB as usize + 123, seed),
    )
    .expect("write");
    std::fs::write(dir.join("sub/deeper/empty"), b"").expect("write");
    std::os::unix::fs::symlink("sub/big.bin", dir.join("link")).expect("symlink");
    file_bytes(&tree(dir))
}

/// Files in [`big_source`]: enough bytes that a copy (synced file by
/// file) lasts far longer than the node takes to see the client go away
/// or to start shutting down (here: a copy takes some 400 ms, the node
/// sees either within 10 ms).
const BIG_FILES: u64 = 32;
const BIG_FILE_BYTES: u64 = 8 * MIB;
const BIG_BYTES: u64 = BIG_FILES * BIG_FILE_BYTES;
/// The size of [`big_source`] and of volumes that take its copy.
const BIG_VOLUME: u64 = BIG_BYTES + 64 * MIB;

/// Volume "src" holding [`BIG_BYTES`] in files; its directory.
async fn big_source(c: &mut Client, group: &str) -> PathBuf {
    let src = create(c, "src", group, BIG_VOLUME).await;
    let dir = PathBuf::from(&src.host_path);
    for i in 0..BIG_FILES {
        std::fs::write(
            dir.join(format!("f{i:02}")),
            pattern(BIG_FILE_BYTES as usize, i),
        )
        .expect("write");
    }
    dir
}

#[tokio::test]
async fn a_copy_fills_the_target_and_every_answer_names_its_origin() {
    let group = unique("g");
    let (node, _dirs) = node(&group).await;
    let mut c = node.client("controller").await.expect("client");

    let source = create(&mut c, "src", &group, 32 * MIB).await;
    let src_dir = PathBuf::from(&source.host_path);
    let want_bytes = fill(&src_dir, 1);
    assert!(want_bytes > 5 * MIB, "{want_bytes}");
    let want = tree(&src_dir);

    let mut targets = BTreeMap::new();
    for (target, snapshot) in [("clone", false), ("snap", true)] {
        let t = create(&mut c, target, &group, 48 * MIB).await;
        let dir = PathBuf::from(&t.host_path);
        // What the target held is replaced.
        std::fs::write(dir.join("stale"), b"old").expect("write");
        std::fs::create_dir(dir.join("stale-dir")).expect("mkdir");

        let started = nanos_now();
        let last = copied(&mut c, "src", target, snapshot).await;
        let ended = nanos_now();
        assert_eq!(last.copied_bytes, want_bytes, "{last:?}");
        assert_eq!(last.total_bytes, want_bytes, "{last:?}");
        let v = last.target.expect("the done message carries the target");
        assert_eq!(v.name, target);
        assert_eq!(v.device_group, group);
        assert_eq!(v.size_bytes, t.size_bytes, "a copy does not resize");
        assert_eq!(v.host_path, t.host_path);
        let origin = v.origin.clone().expect("the target has an origin");
        assert_eq!(origin.source, "src");
        assert_eq!(origin.snapshot, snapshot);
        assert!(origin.complete, "{origin:?}");
        assert!(
            origin.completed_unix_nanos >= started && origin.completed_unix_nanos <= ended,
            "completed during the call: {started} <= {} <= {ended}",
            origin.completed_unix_nanos
        );
        assert_eq!(origin.source_size_bytes, source.size_bytes);
        assert_eq!(tree(&dir), want, "the target holds the source's tree");
        // GetLV tells the same.
        assert_eq!(volume(&mut c, target).await, v);
        targets.insert(target.to_string(), v);
    }

    // ListLVs too; the source has no origin and is unchanged.
    let listed = list(&mut c).await;
    assert_eq!(
        listed.keys().collect::<Vec<_>>(),
        ["clone", "snap", "src"],
        "{listed:?}"
    );
    for (name, v) in &targets {
        assert_eq!(&listed[name], v, "ListLVs and the copy agree on {name}");
    }
    assert_eq!(listed["src"].origin, None);
    assert_eq!(volume(&mut c, "src").await.origin, None);
    assert_eq!(tree(&src_dir), want, "the source is unchanged");
    assert_eq!(node.metrics.count("CopyLV", Code::Ok), 2);
    node.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_repeated_copy_is_a_no_op_and_a_snapshot_stays_read_only() {
    let group = unique("g");
    let (node, _dirs) = node(&group).await;
    let mut c = node.client("controller").await.expect("client");
    let src = create(&mut c, "src", &group, 16 * MIB).await;
    fill(Path::new(&src.host_path), 1);
    let other = create(&mut c, "other", &group, 16 * MIB).await;
    fill(Path::new(&other.host_path), 2);
    let snap = create(&mut c, "snap", &group, 16 * MIB).await;
    let snap_dir = PathBuf::from(&snap.host_path);

    let first = copied(&mut c, "src", "snap", true)
        .await
        .target
        .expect("target");
    let origin = first.origin.clone().expect("origin");
    assert!(origin.snapshot && origin.complete, "{origin:?}");
    let content = tree(&snap_dir);

    // The same copy again: done at once, the same copy (not redone).
    let again = copied(&mut c, "src", "snap", true)
        .await
        .target
        .expect("target");
    assert_eq!(
        again.origin,
        Some(origin.clone()),
        "the same copy, not redone"
    );
    assert_eq!(again, first);
    assert_eq!(tree(&snap_dir), content);

    // Another source, or the same one as a clone: it holds a snapshot.
    for (source, snapshot) in [("other", true), ("other", false), ("src", false)] {
        let e = refused(&mut c, source, "snap", snapshot).await;
        assert_eq!(
            e.code(),
            Code::AlreadyExists,
            "{source} snapshot={snapshot}: {e:?}"
        );
        assert!(e.message().contains("\"snap\""), "{}", e.message());
        assert!(e.message().contains("\"src\""), "{}", e.message());
    }
    assert_eq!(volume(&mut c, "snap").await.origin, Some(origin.clone()));
    assert_eq!(tree(&snap_dir), content, "a refused copy changes nothing");

    // A snapshot is read-only: it does not grow (its size is a no-op).
    let e = c
        .resize_lv(resize("snap", 32 * MIB))
        .await
        .expect_err("growing a snapshot");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("snapshot"), "{}", e.message());
    let same = c
        .resize_lv(resize("snap", snap.size_bytes))
        .await
        .expect("resizing to the current size")
        .into_inner()
        .volume
        .expect("volume");
    assert_eq!(same.size_bytes, snap.size_bytes);
    assert_eq!(same.origin, Some(origin.clone()));

    // A clone grows, and keeps its origin.
    create(&mut c, "clone", &group, 16 * MIB).await;
    copied(&mut c, "src", "clone", false).await;
    let grown = c
        .resize_lv(resize("clone", 32 * MIB))
        .await
        .expect("growing a clone")
        .into_inner()
        .volume
        .expect("volume");
    assert_eq!(grown.size_bytes, 32 * MIB);
    let clone_origin = grown.origin.expect("the grown clone keeps its origin");
    assert_eq!(
        (clone_origin.source.as_str(), clone_origin.snapshot),
        ("src", false)
    );

    // A new volume of the same name is not the snapshot.
    c.delete_lv(pb::DeleteLvRequest {
        name: "snap".into(),
    })
    .await
    .expect("DeleteLV");
    let fresh = create(&mut c, "snap", &group, 16 * MIB).await;
    assert_eq!(fresh.origin, None);
    assert_eq!(volume(&mut c, "snap").await.origin, None);
    assert_eq!(list(&mut c).await["snap"].origin, None);
    // ... and takes a copy of anything.
    let refilled = copied(&mut c, "other", "snap", false)
        .await
        .target
        .expect("target");
    let o = refilled.origin.expect("origin");
    assert_eq!(
        (o.source.as_str(), o.snapshot, o.complete),
        ("other", false, true)
    );
    node.stop().await.expect("clean stop");
}

#[tokio::test]
async fn refusals_have_precise_codes_and_name_the_field() {
    let group = unique("g");
    let (node, _dirs) = node(&group).await;
    let mut c = node.client("controller").await.expect("client");
    let src = create(&mut c, "src", &group, 16 * MIB).await;
    fill(Path::new(&src.host_path), 1);
    let mut held = Vec::new();
    for (name, size) in [("tgt", 16 * MIB), ("small", 8 * MIB)] {
        let dir = PathBuf::from(create(&mut c, name, &group, size).await.host_path);
        std::fs::write(dir.join("kept"), name).expect("write");
        held.push((tree(&dir), dir));
    }
    let before = list(&mut c).await;

    let long = "x".repeat(101);
    let cases: &[(&str, &str, Code, &str)] = &[
        ("", "tgt", Code::InvalidArgument, "source:"),
        ("-x", "tgt", Code::InvalidArgument, "source:"),
        ("a/b", "tgt", Code::InvalidArgument, "source:"),
        (&long, "tgt", Code::InvalidArgument, "source:"),
        ("src", "", Code::InvalidArgument, "target:"),
        ("src", ".hidden", Code::InvalidArgument, "target:"),
        ("src", "a b", Code::InvalidArgument, "target:"),
        ("src", "src", Code::InvalidArgument, "target:"),
        ("nope", "tgt", Code::NotFound, "volume \"nope\""),
        ("src", "nope", Code::NotFound, "volume \"nope\""),
        (
            "src",
            "small",
            Code::FailedPrecondition,
            "copy on \"small\"",
        ),
    ];
    for &(source, target, code, start) in cases {
        for snapshot in [false, true] {
            let e = refused(&mut c, source, target, snapshot).await;
            assert_eq!(e.code(), code, "{source:?} -> {target:?}: {e:?}");
            assert!(
                e.message().starts_with(start),
                "{source:?} -> {target:?}: {:?} does not start with {start:?}",
                e.message()
            );
        }
    }
    let e = refused(&mut c, "src", "small", false).await;
    assert!(
        e.message().contains("less than the source"),
        "{}",
        e.message()
    );

    // Nothing changed: no volume has an origin, no target lost its files.
    assert_eq!(list(&mut c).await, before);
    for (content, dir) in &held {
        assert_eq!(&tree(dir), content, "{}", dir.display());
    }
    assert!(before.values().all(|v| v.origin.is_none()), "{before:?}");
    assert_eq!(node.metrics.count("CopyLV", Code::Ok), 0);
    node.stop().await.expect("clean stop");
}

/// CopyLV of "src" into "tgt" started; its first progress message must
/// show the copy under way (not done).
async fn copy_under_way(c: &mut Client) -> tonic::Streaming<pb::CopyLvProgress> {
    let mut stream = c
        .copy_lv(copy_req("src", "tgt", false))
        .await
        .expect("CopyLV")
        .into_inner();
    let first = tokio::time::timeout(HANG_GUARD, stream.message())
        .await
        .expect("a progress message in time")
        .expect("the copy runs")
        .expect("a message");
    assert!(
        !first.done,
        "{BIG_BYTES} bytes were copied before the first progress message; the source is too small to stop the copy midway"
    );
    stream
}

#[tokio::test]
async fn a_copy_stops_when_the_client_goes_away() {
    let group = unique("g");
    let (node, _dirs) = node(&group).await;
    let mut c = node.client("controller").await.expect("client");
    let src_dir = big_source(&mut c, &group).await;
    let tgt = create(&mut c, "tgt", &group, BIG_VOLUME).await;

    drop(copy_under_way(&mut c).await);

    // The node sees the client go away and stops the copy. It counts the
    // call's end after the copy has let go of both volumes.
    let deadline = Instant::now() + HANG_GUARD;
    let ended = |code| node.metrics.count("CopyLV", code);
    while ended(Code::Cancelled) + ended(Code::Ok) == 0 {
        assert!(
            Instant::now() < deadline,
            "the copy did not end {HANG_GUARD:?} after the client went away"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        (ended(Code::Cancelled), ended(Code::Ok)),
        (1, 0),
        "the copy was cancelled, not completed"
    );
    // The target's lock is free: a call on it is not ABORTED (resizing to
    // the current size changes nothing).
    c.resize_lv(resize("tgt", tgt.size_bytes))
        .await
        .expect("the cancelled copy let go of the target");
    let v = volume(&mut c, "tgt").await;
    let origin = v.origin.expect("the interrupted copy is recorded");
    assert_eq!(origin.source, "src");
    assert!(!origin.complete, "{origin:?}");
    assert_eq!(origin.completed_unix_nanos, 0, "{origin:?}");
    assert_eq!(list(&mut c).await["tgt"].origin, Some(origin));

    // A repeated copy starts over and completes.
    let last = copied(&mut c, "src", "tgt", false).await;
    assert_eq!(last.copied_bytes, BIG_BYTES);
    let origin = last.target.expect("target").origin.expect("origin");
    assert!(
        origin.complete && origin.completed_unix_nanos > 0,
        "{origin:?}"
    );
    assert_eq!(tree(Path::new(&tgt.host_path)), tree(&src_dir));
    node.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_reader_may_not_copy() {
    let group = unique("g");
    let (node, _dirs) = node(&group).await;
    let mut c = node.client("controller").await.expect("client");
    let mut reader = node.client("reader").await.expect("reader");
    let src = create(&mut c, "src", &group, 16 * MIB).await;
    fill(Path::new(&src.host_path), 1);
    create(&mut c, "tgt", &group, 16 * MIB).await;
    create(&mut c, "copied", &group, 16 * MIB).await;
    copied(&mut c, "src", "copied", true).await;

    for (source, target) in [("src", "tgt"), ("src", "copied"), ("", "")] {
        let e = refused(&mut reader, source, target, false).await;
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("\"reader\""), "{}", e.message());
        assert!(e.message().contains("CopyLV"), "{}", e.message());
    }
    assert_eq!(node.metrics.count("CopyLV", Code::PermissionDenied), 3);
    assert_eq!(
        volume(&mut c, "tgt").await.origin,
        None,
        "nothing was copied"
    );
    // A reader sees the origins.
    let seen = volume(&mut reader, "copied").await;
    let origin = seen.origin.expect("origin");
    assert_eq!((origin.source.as_str(), origin.snapshot), ("src", true));
    node.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_copy_stopped_by_the_node_shutting_down_is_unavailable() {
    let group = unique("g");
    let (node, _dirs) = node(&group).await;
    let mut c = node.client("controller").await.expect("client");
    let src_dir = big_source(&mut c, &group).await;
    let tgt = create(&mut c, "tgt", &group, BIG_VOLUME).await;
    let mut stream = copy_under_way(&mut c).await;

    // The node stops; the call in flight ends with a status, not a hang.
    let engine = node.engine.clone();
    let stopped = tokio::spawn(node.stop());
    let end = tokio::time::timeout(HANG_GUARD, async {
        loop {
            match stream.message().await {
                Ok(Some(m)) => assert!(!m.done, "the copy completed: {m:?}"),
                Ok(None) => panic!("the stream ended without a status or a done message"),
                Err(status) => break status,
            }
        }
    })
    .await
    .expect("the call ends in time");
    // Not CANCELLED: the caller did not cancel it, and a retry works.
    assert_eq!(end.code(), Code::Unavailable, "{end:?}");
    assert!(end.message().contains("shutting down"), "{}", end.message());
    tokio::time::timeout(HANG_GUARD, stopped)
        .await
        .expect("the node stops in time")
        .expect("join")
        .expect("clean stop");

    // The same engine served again: the copy is incomplete, and a retry
    // completes it.
    let node = TestNode::start(engine, "node-a").await.expect("server");
    let mut c = node.client("controller").await.expect("client");
    let origin = volume(&mut c, "tgt").await.origin.expect("origin");
    assert!(!origin.complete, "{origin:?}");
    let last = copied(&mut c, "src", "tgt", false).await;
    assert_eq!(last.copied_bytes, BIG_BYTES);
    assert!(
        last.target
            .expect("target")
            .origin
            .expect("origin")
            .complete
    );
    assert_eq!(tree(Path::new(&tgt.host_path)), tree(&src_dir));
    node.stop().await.expect("clean stop");
}
