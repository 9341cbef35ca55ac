//! A table of bad requests against an engine with LVM, RAW and HOST groups:
//! each returns its typed error, and none of them creates anything.

use carina_node::engine::{Config, CreateRequest, Error};
use carina_tests::engine::engine_for;
use carina_tests::{LoopDisk, MountGuard, VgGuard, have_root, run, unique};

const MIB: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Invalid,
    InvalidConfig,
    UnknownGroup,
    NotFound,
    AlreadyExists,
    Exhausted,
    Precondition,
    Unsupported,
}

fn kind(e: &Error) -> Option<Kind> {
    Some(match e {
        Error::InvalidArgument { .. } => Kind::Invalid,
        Error::InvalidConfig { .. } => Kind::InvalidConfig,
        Error::UnknownGroup { .. } => Kind::UnknownGroup,
        Error::VolumeNotFound { .. } => Kind::NotFound,
        Error::AlreadyExists { .. } => Kind::AlreadyExists,
        Error::ResourceExhausted { .. } => Kind::Exhausted,
        Error::FailedPrecondition { .. } => Kind::Precondition,
        Error::Unsupported { .. } => Kind::Unsupported,
        _ => return None,
    })
}

enum Op {
    Create(&'static str, String, u64, bool),
    Get(&'static str),
    Resize(&'static str, u64),
    Delete(&'static str),
    Config(&'static str),
}

#[tokio::test]
async fn bad_requests_are_typed_and_create_nothing() {
    if !have_root("bad_requests") {
        return;
    }
    let lvm_disk = LoopDisk::new(128 * MIB).expect("lvm disk");
    let raw_disk = LoopDisk::new(64 * MIB).expect("raw disk");
    let host_disk = LoopDisk::new(64 * MIB).expect("host disk");
    let lvm = unique("bad-lvm");
    let _vg = VgGuard::new(&lvm, &[&lvm_disk]);
    let raw = unique("bad-raw");
    let host = unique("bad-host");
    run("mkfs.ext4", &["-q", "-F", &host_disk.dev()]).expect("mkfs");
    let host_mnt = tempfile::tempdir().expect("tempdir");
    let _m =
        MountGuard::mount(&host_disk.dev(), host_mnt.path(), Some("ext4"), None).expect("mount");
    let root = host_mnt.path().join("volumes");
    let config_text = format!(
        r#"{{"diskSelector":[
            {{"name":"{lvm}","re":["{}"],"policy":"LVM","reserveBytes":0,"minDiskBytes":1048576}},
            {{"name":"{raw}","re":["{}"],"policy":"RAW","reserveBytes":0,"minDiskBytes":1048576}},
            {{"name":"{host}","policy":"HOST","root":"{}","reserveBytes":0}}
        ],"diskScanInterval":"0"}}"#,
        lvm_disk.pattern(),
        raw_disk.pattern(),
        root.display()
    );
    let engine = engine_for(&config_text, None).await;
    // One real volume, so resize/idempotency rows have something to hit.
    engine
        .create_volume(CreateRequest {
            name: "existing".into(),
            group: lvm.clone(),
            size_bytes: 8 * MIB,
            exclusive: false,
        })
        .await
        .expect("existing volume");
    let before_vols = engine.list_volumes(None).await.expect("list");
    let before_cap = engine.capacity(None).await.expect("capacity");

    let long = "x".repeat(101);
    let l = lvm.clone();
    let cases: Vec<(&str, Op, Kind)> = vec![
        (
            "empty name",
            Op::Create("", l.clone(), MIB, false),
            Kind::Invalid,
        ),
        (
            "name too long",
            Op::Create(Box::leak(long.into_boxed_str()), l.clone(), MIB, false),
            Kind::Invalid,
        ),
        (
            "slash",
            Op::Create("a/b", l.clone(), MIB, false),
            Kind::Invalid,
        ),
        (
            "dot dot",
            Op::Create("..", l.clone(), MIB, false),
            Kind::Invalid,
        ),
        (
            "leading dash",
            Op::Create("-rf", l.clone(), MIB, false),
            Kind::Invalid,
        ),
        (
            "leading dot",
            Op::Create(".hidden", l.clone(), MIB, false),
            Kind::Invalid,
        ),
        (
            "space",
            Op::Create("a b", l.clone(), MIB, false),
            Kind::Invalid,
        ),
        (
            "tab",
            Op::Create("a\tb", l.clone(), MIB, false),
            Kind::Invalid,
        ),
        (
            "newline",
            Op::Create("a\nb", l.clone(), MIB, false),
            Kind::Invalid,
        ),
        (
            "NUL",
            Op::Create("a\0b", l.clone(), MIB, false),
            Kind::Invalid,
        ),
        (
            "non-ASCII",
            Op::Create("volümé", l.clone(), MIB, false),
            Kind::Invalid,
        ),
        (
            "LVM reserved prefix",
            Op::Create("snapshot0", l.clone(), MIB, false),
            Kind::Invalid,
        ),
        (
            "LVM reserved infix",
            Op::Create("a_tmeta", l.clone(), MIB, false),
            Kind::Invalid,
        ),
        (
            "size zero",
            Op::Create("zero", l.clone(), 0, false),
            Kind::Invalid,
        ),
        (
            "size above 2^63",
            Op::Create("huge", l.clone(), (1 << 63) + 1, false),
            Kind::Invalid,
        ),
        (
            "size u64::MAX",
            Op::Create("max", l.clone(), u64::MAX, false),
            Kind::Invalid,
        ),
        (
            "size above the LVM group",
            Op::Create("big", l.clone(), 1 << 40, false),
            Kind::Exhausted,
        ),
        (
            "size above the RAW group",
            Op::Create("big-raw", raw.clone(), 1 << 40, false),
            Kind::Exhausted,
        ),
        (
            "size above the HOST group",
            Op::Create("big-host", host.clone(), 1 << 40, false),
            Kind::Exhausted,
        ),
        (
            "unknown group",
            Op::Create("v", "no-such-group".into(), MIB, false),
            Kind::UnknownGroup,
        ),
        (
            "empty group",
            Op::Create("v", String::new(), MIB, false),
            Kind::Invalid,
        ),
        (
            "exclusive on LVM",
            Op::Create("v", l.clone(), MIB, true),
            Kind::Unsupported,
        ),
        (
            "exclusive on HOST",
            Op::Create("v", host.clone(), MIB, true),
            Kind::Unsupported,
        ),
        (
            "same name, other size",
            Op::Create("existing", l.clone(), 64 * MIB, false),
            Kind::AlreadyExists,
        ),
        (
            "same name, other group",
            Op::Create("existing", host.clone(), 8 * MIB, false),
            Kind::AlreadyExists,
        ),
        ("get bad name", Op::Get("../etc"), Kind::Invalid),
        ("get missing", Op::Get("missing"), Kind::NotFound),
        (
            "resize missing",
            Op::Resize("missing", 8 * MIB),
            Kind::NotFound,
        ),
        ("resize to zero", Op::Resize("existing", 0), Kind::Invalid),
        (
            "resize above 2^63",
            Op::Resize("existing", u64::MAX),
            Kind::Invalid,
        ),
        (
            "shrink",
            Op::Resize("existing", 4 * MIB),
            Kind::Precondition,
        ),
        (
            "resize beyond the group",
            Op::Resize("existing", 1 << 40),
            Kind::Exhausted,
        ),
        ("delete bad name", Op::Delete("a/../b"), Kind::Invalid),
        ("delete missing", Op::Delete("missing"), Kind::NotFound),
        (
            "config: bad regex",
            Op::Config(r#"{"diskSelector":[{"name":"x","re":["("],"policy":"LVM"}]}"#),
            Kind::InvalidConfig,
        ),
        (
            "config: duplicate group",
            Op::Config(
                r#"{"diskSelector":[{"name":"x","re":["a"],"policy":"LVM"},{"name":"x","re":["b"],"policy":"RAW"}]}"#,
            ),
            Kind::InvalidConfig,
        ),
        (
            "config: HOST without root",
            Op::Config(r#"{"diskSelector":[{"name":"x","policy":"HOST"}]}"#),
            Kind::InvalidConfig,
        ),
        (
            "config: unknown policy",
            Op::Config(r#"{"diskSelector":[{"name":"x","re":["a"],"policy":"ZFS"}]}"#),
            Kind::InvalidConfig,
        ),
        (
            "config: not JSON",
            Op::Config("diskSelector: []"),
            Kind::InvalidConfig,
        ),
    ];
    assert!(cases.len() >= 25);
    let mut failures = Vec::new();
    for (label, op, want) in cases {
        let result: Result<(), Error> = match op {
            Op::Create(name, group, size, exclusive) => engine
                .create_volume(CreateRequest {
                    name: name.into(),
                    group,
                    size_bytes: size,
                    exclusive,
                })
                .await
                .map(drop),
            Op::Get(name) => engine.get_volume(name).await.map(drop),
            Op::Resize(name, size) => engine.resize_volume(name, size).await.map(drop),
            Op::Delete(name) => engine.delete_volume(name).await,
            // A bad configuration never reaches the engine: parsing refuses it.
            Op::Config(text) => match Config::from_json(text) {
                Ok(cfg) => engine.apply_config(cfg).await,
                Err(e) => Err(e),
            },
        };
        match result {
            Err(e) if kind(&e) == Some(want) => {
                assert!(!e.to_string().is_empty());
            }
            Err(e) => failures.push(format!("{label}: want {want:?}, got {e}")),
            Ok(()) => failures.push(format!("{label}: want {want:?}, got success")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Nothing was created, nothing changed.
    assert_eq!(engine.list_volumes(None).await.expect("list"), before_vols);
    assert_eq!(engine.capacity(None).await.expect("capacity"), before_cap);
    assert_eq!(
        engine.config().await.groups.len(),
        3,
        "configuration unchanged"
    );
    let entries: Vec<_> = std::fs::read_dir(&root)
        .expect("host root")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert!(entries.is_empty(), "no host directories: {entries:?}");
    let parts = run("sfdisk", &["-J", &raw_disk.dev()]).unwrap_or_default();
    assert!(!parts.contains("carina.io/"), "no partitions: {parts}");
    drop(engine);
}
