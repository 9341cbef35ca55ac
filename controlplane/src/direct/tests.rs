//! Unit tests of the direct plane's pure rules: which names a node
//! accepts, and the volume context of each kind of volume.

use super::*;

#[test]
fn volume_names_the_nodes_accept() {
    for ok in ["pvc-1", "csi-0123abcd", "a.b_c+d", &"x".repeat(100)] {
        assert!(possible_volume_name(ok), "{ok}");
    }
    for bad in ["", "-a", ".a", "a b", "a/b", &"x".repeat(101), "ü"] {
        assert!(!possible_volume_name(bad), "{bad}");
    }
}

#[test]
fn context_of_block_and_host_volumes() {
    let node = NodeSpec {
        name: "n".into(),
        endpoint: "n:1".into(),
        topology: Topology::new(),
    };
    let block = pb::LogicVolume {
        name: "v".into(),
        device_group: "g".into(),
        policy: pb::Policy::Lvm as i32,
        size_bytes: 8,
        device_path: "/dev/loop9".into(),
        major: 7,
        minor: 9,
        ..Default::default()
    };
    let v = provisioned(&node, &block, Some(FsType::Xfs));
    assert_eq!(v.volume_id, "v@n");
    assert_eq!(v.context[context::PATH], "/dev/loop9");
    assert_eq!(v.context[context::MAJOR], "7");
    assert_eq!(v.context[context::POLICY], "LVM");
    assert_eq!(v.context[context::FS_TYPE], "xfs");
    let host = pb::LogicVolume {
        policy: pb::Policy::Host as i32,
        device_path: String::new(),
        host_path: "/srv/g/v".into(),
        ..block
    };
    let v = provisioned(&node, &host, None);
    assert_eq!(v.context[context::PATH], "/srv/g/v");
    assert!(!v.context.contains_key(context::MAJOR));
    assert!(!v.context.contains_key(context::FS_TYPE));
}
