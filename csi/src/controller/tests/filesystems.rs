//! A class's filesystem choices through CreateVolume: mkfs options checked
//! for the filesystem the volume will get, handed to the node in the
//! volume context, and mount flags checked like every other field.

use super::*;

fn with_params(
    mut r: csi::CreateVolumeRequest,
    pairs: &[(&str, &str)],
) -> csi::CreateVolumeRequest {
    r.parameters = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    r
}

/// The options are checked for the filesystem the class or the
/// capability names, and the refusal names the parameter.
#[test]
fn mkfs_options_are_checked_for_the_volumes_filesystem() {
    let key = crate::params::MKFS_OPTIONS;
    let ext = with_params(create_req("pvc-1"), &[(key, "-O ^has_journal -b 4096")]);
    assert!(volume_request(&ext).is_ok());
    // xfs through the capability: the ext4 options are refused for it.
    let mut on_xfs = ext.clone();
    on_xfs.volume_capabilities = vec![cap(Mode::SingleNodeWriter, mount("xfs"))];
    match volume_request(&on_xfs) {
        Err(CsiError::InvalidArgument { field, reason }) => {
            assert_eq!(field, format!("parameters[{key:?}]"));
            assert!(
                reason.contains("-O is not an option Carina passes to mkfs.xfs"),
                "{reason}"
            );
            assert!(reason.ends_with("(for xfs)"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // As external-provisioner sends it: fstype only in the capability.
    let mut from_cap = with_params(create_req("pvc-1"), &[(key, "-i size=1024 -L optsxfs")]);
    from_cap.volume_capabilities = vec![cap(Mode::SingleNodeWriter, mount("xfs"))];
    assert!(volume_request(&from_cap).is_ok());
    let xfs = with_params(
        create_req("pvc-1"),
        &[
            (crate::params::FS_TYPE, "xfs"),
            (key, "-m reflink=1 -i size=512"),
        ],
    );
    assert!(volume_request(&xfs).is_ok());
    let ext3 = with_params(
        create_req("pvc-1"),
        &[(crate::params::FS_TYPE, "ext3"), (key, "-j -b 1024")],
    );
    assert_eq!(
        volume_request(&ext3).expect("ext3").parameters.fs_type,
        Some(FsType::Ext3)
    );
    let mut flagged = create_req("pvc-1");
    flagged.volume_capabilities = vec![cap(
        Mode::SingleNodeWriter,
        AccessType::Mount(csi::volume_capability::MountVolume {
            mount_flags: vec!["bind".into()],
            ..Default::default()
        }),
    )];
    match volume_request(&flagged) {
        Err(CsiError::InvalidArgument { field, .. }) => {
            assert_eq!(field, "volume_capabilities[0].mount.mount_flags[0]")
        }
        other => panic!("{other:?}"),
    }
}

/// A filesystem volume carries the options to its node; a block volume of
/// the same class does not (nothing formats it), and nothing is made for
/// a refused request.
#[tokio::test]
async fn the_node_gets_the_options_of_a_filesystem_volume() {
    let fake = Arc::new(Fake::default());
    let svc = ControllerService::new(fake.clone());
    let key = crate::params::MKFS_OPTIONS;
    let made = svc
        .create(with_params(create_req("pvc-fs"), &[(key, " -b 4096 ")]))
        .await
        .expect("created")
        .volume
        .expect("a volume");
    assert_eq!(made.volume_context[context::MKFS_OPTIONS], "-b 4096");
    let mut block_req = with_params(create_req("pvc-blk"), &[(key, "-b 4096")]);
    block_req.volume_capabilities = vec![cap(Mode::SingleNodeWriter, block())];
    let made = svc
        .create(block_req)
        .await
        .expect("created")
        .volume
        .expect("a volume");
    assert!(!made.volume_context.contains_key(context::MKFS_OPTIONS));
    let refused = svc
        .create(with_params(create_req("pvc-bad"), &[(key, "-d /etc")]))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        !fake
            .volumes
            .lock()
            .expect("not poisoned")
            .keys()
            .any(|k| k.contains("pvc-bad")),
        "nothing is made for a refused request"
    );
}
