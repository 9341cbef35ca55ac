//! `AdoptLV` over the wire: each refusal with its code (INVALID_ARGUMENT
//! for a name that is not a Go Carina id or a thin one, NOT_FOUND for a
//! Go volume the node does not have, FAILED_PRECONDITION naming the group
//! or the kind that differs), then the adoption of a HOST directory made
//! as Go Carina did, answered again by a repeat, and served by `GetLV`.
//! Who may call it is `grpc_roles`'s table (the controller only).

use carina_proto::nodestorage as pb;
use carina_tests::gocarina::go_host_dir;
use carina_tests::grpc::{TestNode, get_lv, host_engine};
use carina_tests::unique;
use tonic::Code;

const MIB: u64 = 1 << 20;

fn adopt(name: &str, group: &str, policy: pb::Policy, size: u64) -> pb::AdoptLvRequest {
    pb::AdoptLvRequest {
        name: name.into(),
        device_group: group.into(),
        policy: policy as i32,
        size_bytes: size,
    }
}

#[tokio::test]
async fn adopt_lv_answers_each_case_with_its_code() {
    let group = unique("g");
    let (engine, dirs) = host_engine(&group, None).await.expect("engine");
    let node = TestNode::start(engine, "node-a").await.expect("server");
    let mut c = node.client("controller").await.expect("client");
    let name = format!("host-{}", unique("pvc"));
    go_host_dir(&dirs.root, &name, "kept in place");
    let refused = |code: Code, field: &'static str| {
        move |r: Result<tonic::Response<pb::AdoptLvResponse>, tonic::Status>| {
            let s = r.expect_err("refused");
            assert_eq!(s.code(), code, "{s:?}");
            assert!(s.message().contains(field), "{field}: {}", s.message());
        }
    };
    let pv = unique("pvc");
    for (req, check) in [
        (
            adopt(&pv, &group, pb::Policy::Host, MIB),
            refused(Code::InvalidArgument, "name"),
        ),
        (
            adopt(&format!("{pv}@node-a"), &group, pb::Policy::Host, MIB),
            refused(Code::InvalidArgument, "name"),
        ),
        (
            adopt(&format!("thin-{pv}"), &group, pb::Policy::Lvm, MIB),
            refused(Code::InvalidArgument, "thin"),
        ),
        (
            adopt(&name, &group, pb::Policy::Unspecified, MIB),
            refused(Code::InvalidArgument, "policy"),
        ),
        (
            adopt(&name, "", pb::Policy::Host, MIB),
            refused(Code::InvalidArgument, "device_group"),
        ),
        (
            adopt(&format!("host-{pv}"), &group, pb::Policy::Host, MIB),
            refused(Code::NotFound, "not found"),
        ),
        (
            adopt(&name, "no-such-group", pb::Policy::Host, MIB),
            refused(Code::FailedPrecondition, "no-such-group"),
        ),
        (
            adopt(&name, &group, pb::Policy::Lvm, MIB),
            refused(Code::FailedPrecondition, "host-"),
        ),
        (
            adopt(&name, &group, pb::Policy::Raw, MIB),
            refused(Code::FailedPrecondition, "host-"),
        ),
    ] {
        check(c.adopt_lv(req).await);
    }
    assert!(
        get_lv(&mut c, &name).await.expect("get").is_none(),
        "refusals adopted nothing"
    );
    assert!(
        !dirs
            .root
            .join(".carina")
            .join(format!("{name}.json"))
            .exists()
    );

    let v = c
        .adopt_lv(adopt(&name, &group, pb::Policy::Host, 8 * MIB))
        .await
        .expect("adopt")
        .into_inner()
        .volume
        .expect("volume");
    assert_eq!((v.name.as_str(), v.size_bytes), (name.as_str(), 8 * MIB));
    assert_eq!(v.host_path, dirs.root.join(&name).to_string_lossy());
    let again = c
        .adopt_lv(adopt(&name, &group, pb::Policy::Host, 8 * MIB))
        .await
        .expect("adopt again")
        .into_inner()
        .volume
        .expect("volume");
    assert_eq!(again, v);
    assert_eq!(get_lv(&mut c, &name).await.expect("get"), Some(v));
    // Recorded larger than it was adopted: refused, naming the sizes.
    refused(Code::FailedPrecondition, "less than")(
        c.adopt_lv(adopt(&name, &group, pb::Policy::Host, 16 * MIB))
            .await,
    );
    assert_eq!(
        std::fs::read_to_string(dirs.root.join(&name).join("data.txt")).expect("read"),
        "kept in place"
    );
}
