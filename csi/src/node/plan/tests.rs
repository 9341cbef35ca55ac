//! The stage and publish plans over every state a path can be in: done,
//! to do, or refused with the code and field the answer names.

use super::*;

fn block_vol() -> LocalVolume {
    LocalVolume {
        volume_id: "v1@node-a".into(),
        kind: LocalKind::Block {
            device: "/dev/carina/v1".into(),
        },
        size_bytes: 1 << 30,
    }
}

fn dir_vol() -> LocalVolume {
    LocalVolume {
        volume_id: "d1@node-a".into(),
        kind: LocalKind::Directory {
            path: "/data/d1".into(),
        },
        size_bytes: 1 << 30,
    }
}

fn mount_cap(mode: Mode, flags: &[&str]) -> Capability {
    Capability {
        access: Access::Mount {
            fs_type: None,
            flags: flags.iter().map(|f| f.to_string()).collect(),
        },
        mode,
    }
}

fn block_cap(mode: Mode) -> Capability {
    Capability {
        access: Access::Block,
        mode,
    }
}

fn entry(source: &str, mount_point: &str, fs_type: &str, ro: bool) -> MountEntry {
    MountEntry {
        id: 30,
        parent: 1,
        major: 253,
        minor: 4,
        root: "/".into(),
        mount_point: mount_point.into(),
        options: vec![if ro { "ro" } else { "rw" }.into()],
        fs_type: fs_type.into(),
        source: source.into(),
        super_options: Vec::new(),
    }
}

const STAGING: &str = "/var/lib/kubelet/staging/v1";
const TARGET: &str = "/var/lib/kubelet/pods/p/v1";

fn stage(
    vol: &LocalVolume,
    cap: &Capability,
    fs: Option<FsType>,
    at: &AtPath,
) -> Result<String, CsiError> {
    plan_stage(vol, cap, fs, Path::new(STAGING), at).map(|s| format!("{s:?}"))
}

fn code(r: Result<impl std::fmt::Debug, CsiError>) -> String {
    match r {
        Ok(s) => format!("ok {s:?}"),
        Err(CsiError::AlreadyExists(_)) => "ALREADY_EXISTS".into(),
        Err(CsiError::FailedPrecondition(_)) => "FAILED_PRECONDITION".into(),
        Err(CsiError::InvalidArgument { field, .. }) => format!("INVALID_ARGUMENT {field}"),
        Err(e) => format!("{e:?}"),
    }
}

#[test]
fn staging_a_filesystem_mounts_once_and_then_agrees_or_refuses() {
    let vol = block_vol();
    let rw = mount_cap(Mode::SingleNodeWriter, &[]);
    let ours =
        |fs: &str, ro| AtPath::Ours(entry("/dev/dm-4", STAGING, fs, ro), FileKind::Directory);
    assert_eq!(
        plan_stage(
            &vol,
            &rw,
            Some(FsType::Xfs),
            Path::new(STAGING),
            &AtPath::Missing
        )
        .expect("planned"),
        StageStep::MountDevice {
            device: Path::new("/dev/carina/v1"),
            fs: Some(FsType::Xfs),
            flags: &[],
            create_dir: true,
        }
    );
    assert_eq!(
        plan_stage(
            &vol,
            &rw,
            None,
            Path::new(STAGING),
            &AtPath::Unmounted(FileKind::Directory)
        )
        .expect("planned"),
        StageStep::MountDevice {
            device: Path::new("/dev/carina/v1"),
            fs: None,
            flags: &[],
            create_dir: false,
        }
    );
    // Again with the same arguments (or no fs asked for): nothing to do.
    assert_eq!(
        stage(&vol, &rw, Some(FsType::Ext4), &ours("ext4", false)).expect("ok"),
        "Done"
    );
    assert_eq!(
        stage(&vol, &rw, None, &ours("xfs", false)).expect("ok"),
        "Done"
    );
    // Another filesystem, or other read-only-ness: incompatible.
    assert_eq!(
        code(stage(&vol, &rw, Some(FsType::Xfs), &ours("ext4", false))),
        "ALREADY_EXISTS"
    );
    assert_eq!(
        code(stage(&vol, &rw, None, &ours("ext4", true))),
        "ALREADY_EXISTS"
    );
    let ro = mount_cap(Mode::SingleNodeWriter, &["ro"]);
    assert_eq!(
        stage(&vol, &ro, None, &ours("ext4", true)).expect("ok"),
        "Done"
    );
    // Something else mounted there, or a file in the way.
    let foreign = AtPath::Foreign(entry("tmpfs", STAGING, "tmpfs", false));
    assert_eq!(code(stage(&vol, &rw, None, &foreign)), "ALREADY_EXISTS");
    assert_eq!(
        code(stage(&vol, &rw, None, &AtPath::Unmounted(FileKind::Other))),
        "INVALID_ARGUMENT staging_target_path"
    );
}

#[test]
fn staging_for_block_access_mounts_nothing() {
    let vol = block_vol();
    let cap = block_cap(Mode::SingleNodeWriter);
    assert_eq!(
        stage(&vol, &cap, None, &AtPath::Missing).expect("ok"),
        "MakeDir"
    );
    assert_eq!(
        stage(&vol, &cap, None, &AtPath::Unmounted(FileKind::Directory)).expect("ok"),
        "Done"
    );
    let mounted = AtPath::Ours(
        entry("/dev/dm-4", STAGING, "ext4", false),
        FileKind::Directory,
    );
    assert_eq!(code(stage(&vol, &cap, None, &mounted)), "ALREADY_EXISTS");
    // A directory volume has no device to give.
    assert_eq!(
        code(stage(&dir_vol(), &cap, None, &AtPath::Missing)),
        "FAILED_PRECONDITION"
    );
}

#[test]
fn staging_a_directory_volume_binds_it() {
    let vol = dir_vol();
    let rw = mount_cap(Mode::SingleNodeWriter, &[]);
    assert_eq!(
        plan_stage(&vol, &rw, None, Path::new(STAGING), &AtPath::Missing).expect("planned"),
        StageStep::BindDirectory {
            dir: Path::new("/data/d1"),
            flags: &[],
            create_dir: true,
        }
    );
    let ours = |ro| AtPath::Ours(entry("/dev/sda1", STAGING, "ext4", ro), FileKind::Directory);
    assert_eq!(stage(&vol, &rw, None, &ours(false)).expect("ok"), "Done");
    assert_eq!(code(stage(&vol, &rw, None, &ours(true))), "ALREADY_EXISTS");
    let foreign = AtPath::Foreign(entry("tmpfs", STAGING, "tmpfs", false));
    assert_eq!(code(stage(&vol, &rw, None, &foreign)), "ALREADY_EXISTS");
}

#[test]
fn publishing_a_filesystem_needs_it_staged() {
    let vol = block_vol();
    let staged = AtPath::Ours(
        entry("/dev/dm-4", STAGING, "ext4", false),
        FileKind::Directory,
    );
    let publish = |cap: &Capability, read_only, at: &AtPath, staged: Option<&AtPath>| {
        code(plan_publish(
            &vol,
            cap,
            read_only,
            Path::new(TARGET),
            Path::new(STAGING),
            at,
            staged,
        ))
    };
    let rw = mount_cap(Mode::SingleNodeWriter, &[]);
    assert_eq!(
        publish(&rw, false, &AtPath::Missing, Some(&AtPath::Missing)),
        "FAILED_PRECONDITION"
    );
    let step = plan_publish(
        &vol,
        &mount_cap(Mode::SingleNodeSingleWriter, &[]),
        false,
        Path::new(TARGET),
        Path::new(STAGING),
        &AtPath::Missing,
        Some(&staged),
    )
    .expect("planned");
    let AtPath::Ours(staged_entry, _) = &staged else {
        unreachable!("built as Ours above")
    };
    assert_eq!(
        step,
        PublishStep::BindStaging {
            staged: staged_entry,
            create_dir: true,
            single_writer: true,
        }
    );
    let published = |ro| AtPath::Ours(entry("/dev/dm-4", TARGET, "ext4", ro), FileKind::Directory);
    assert_eq!(
        publish(&rw, false, &published(false), Some(&staged)),
        "ok Done"
    );
    assert_eq!(
        publish(&rw, true, &published(true), Some(&staged)),
        "ok Done"
    );
    assert_eq!(
        publish(&rw, true, &published(false), Some(&staged)),
        "ALREADY_EXISTS"
    );
    let foreign = AtPath::Foreign(entry("tmpfs", TARGET, "tmpfs", false));
    assert_eq!(
        publish(&rw, false, &foreign, Some(&staged)),
        "ALREADY_EXISTS"
    );
    assert_eq!(
        publish(
            &rw,
            false,
            &AtPath::Unmounted(FileKind::Other),
            Some(&staged)
        ),
        "FAILED_PRECONDITION"
    );
}

#[test]
fn publishing_for_block_access_binds_the_device_onto_a_file() {
    let vol = block_vol();
    let cap = block_cap(Mode::SingleNodeWriter);
    let publish = |vol: &LocalVolume, read_only, at: &AtPath| {
        code(plan_publish(
            vol,
            &cap,
            read_only,
            Path::new(TARGET),
            Path::new(STAGING),
            at,
            None,
        ))
    };
    assert_eq!(
        plan_publish(
            &vol,
            &cap,
            false,
            Path::new(TARGET),
            Path::new(STAGING),
            &AtPath::Missing,
            None
        )
        .expect("planned"),
        PublishStep::BindDevice {
            device: Path::new("/dev/carina/v1"),
            create_file: true,
            single_writer: false,
        }
    );
    assert!(
        publish(&vol, false, &AtPath::Unmounted(FileKind::Other)).contains("create_file: false")
    );
    assert_eq!(
        publish(&vol, false, &AtPath::Unmounted(FileKind::Directory)),
        "FAILED_PRECONDITION"
    );
    let published = |ro| {
        AtPath::Ours(
            entry("devtmpfs", TARGET, "devtmpfs", ro),
            FileKind::BlockDevice,
        )
    };
    assert_eq!(publish(&vol, true, &published(true)), "ok Done");
    assert_eq!(publish(&vol, false, &published(true)), "ALREADY_EXISTS");
    assert_eq!(
        publish(&dir_vol(), false, &AtPath::Missing),
        "FAILED_PRECONDITION"
    );
}

#[test]
fn a_single_writer_is_refused_when_published_elsewhere() {
    let table = MountTable::from_entries(vec![
        entry("/dev/dm-4", STAGING, "ext4", false),
        entry("/dev/dm-4", TARGET, "ext4", false),
        entry("/dev/dm-4", "/var/lib/kubelet/pods/q/v1", "ext4", false),
        MountEntry {
            minor: 5,
            ..entry("/dev/dm-5", "/elsewhere", "ext4", false)
        },
    ]);
    let others = other_publications(
        &table,
        (253, 4, Path::new("/")),
        &[Path::new(STAGING), Path::new(TARGET)],
    );
    assert_eq!(others, [PathBuf::from("/var/lib/kubelet/pods/q/v1")]);
    let err = single_writer(&block_vol(), &others).expect_err("refused");
    assert!(
        matches!(&err, CsiError::FailedPrecondition(m) if m.contains("/var/lib/kubelet/pods/q/v1")),
        "{err:?}"
    );
    single_writer(&block_vol(), &[]).expect("alone");
    assert_eq!(publish_options(true), ["ro"]);
    assert!(publish_options(false).is_empty());
}
