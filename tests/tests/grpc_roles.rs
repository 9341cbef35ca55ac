//! Which caller may call which NodeStorage RPC, as one table: every RPC of
//! `nodestorage.proto` (the test reads the file, so a new RPC fails here
//! until the table names it) called over real mutual TLS by every kind of
//! client certificate the node can be shown — role `controller`, role
//! `reader`, an unknown role, a role in another trust domain, and a
//! certificate with no URI SAN at all. An allowed call gets past the
//! authorization layer (it succeeds or fails for a business reason, such
//! as `NOT_FOUND`); a refused one is `PERMISSION_DENIED` naming the method,
//! counted in the node's metrics, and leaves the node unchanged.
//! gRPC health is open to every authenticated client.

use carina_proto::devcerts::{CertifiedKey, Validity};
use carina_proto::nodestorage as pb;
use carina_proto::tls::{ClientTls, connect};
use carina_tests::grpc::{Client, TestNode, create_lv, host_engine};
use carina_tests::manifests::repo_root;
use carina_tests::unique;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tonic::transport::Channel;
use tonic::{Code, Status};

const MIB: u64 = 1 << 20;

/// The kinds of client certificate, in the order of [`EXPECTED`]'s columns.
const CALLERS: [&str; 5] = [
    "controller",
    "reader",
    "unknown role",
    "other trust domain",
    "no role",
];

/// `true`: the caller gets past authorization; `false`: PERMISSION_DENIED.
/// Columns as [`CALLERS`]. This is ARCHITECTURE.md's security table: the
/// controller may call everything, a reader only the read RPCs, anyone
/// else nothing.
const EXPECTED: &[(&str, [bool; 5])] = &[
    ("CreateLV", [true, false, false, false, false]),
    ("DeleteLV", [true, false, false, false, false]),
    ("ResizeLV", [true, false, false, false, false]),
    ("GetLV", [true, true, false, false, false]),
    ("ListLVs", [true, true, false, false, false]),
    ("CopyLV", [true, false, false, false, false]),
    ("AdoptLV", [true, false, false, false, false]),
    ("Capacity", [true, true, false, false, false]),
    ("WatchCapacity", [true, true, false, false, false]),
    ("ListDisks", [true, true, false, false, false]),
    ("ApplyConfig", [true, false, false, false, false]),
    ("CreateBcache", [true, false, false, false, false]),
    ("DeleteBcache", [true, false, false, false, false]),
    ("GetBcache", [true, true, false, false, false]),
    ("SetCacheMode", [true, false, false, false, false]),
    ("SetPodIOLimits", [true, false, false, false, false]),
    ("ClearPodIOLimits", [true, false, false, false, false]),
    ("ListPodIOLimits", [true, true, false, false, false]),
];

/// The RPC names of `service NodeStorage` in the proto file.
fn proto_rpcs() -> Vec<String> {
    let path = repo_root().join("proto/proto/carina/nodestorage/v1/nodestorage.proto");
    let text = std::fs::read_to_string(&path).expect("read nodestorage.proto");
    let service = text
        .split("service NodeStorage {")
        .nth(1)
        .and_then(|s| s.split('}').next())
        .expect("service NodeStorage in nodestorage.proto");
    service
        .lines()
        .filter_map(|l| l.trim().strip_prefix("rpc "))
        .filter_map(|l| l.split('(').next())
        .map(|name| name.trim().to_string())
        .collect()
}

/// A client certificate signed by the node's CA with no URI SAN: it
/// authenticates, but names no role at all.
fn cert_without_role(node: &TestNode) -> CertifiedKey {
    let ca_key = KeyPair::from_pem(node.ca.key_pem()).expect("CA key");
    let issuer = Issuer::from_ca_cert_pem(node.ca.cert_pem(), ca_key).expect("issuer");
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "no-role");
    params.distinguished_name = dn;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &issuer).expect("sign");
    CertifiedKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// A channel to the node over mutual TLS with the certificate `caller`
/// stands for.
async fn channel_for(node: &TestNode, caller: &str) -> Channel {
    let cert = match caller {
        "controller" | "reader" => node.issue_client(caller, Validity::days(1)),
        "unknown role" => node.issue_client("admin", Validity::days(1)),
        "other trust domain" => node
            .ca
            .issue_client("other.example", "controller", Validity::days(1))
            .map_err(Into::into),
        "no role" => Ok(cert_without_role(node)),
        other => panic!("no such caller {other}"),
    }
    .expect("client certificate");
    let tls = ClientTls {
        cert_pem: cert.cert_pem.into_bytes(),
        key_pem: cert.key_pem.into_bytes(),
        ..node.client_tls("controller").expect("tls")
    };
    connect(&node.endpoint(), &tls)
        .await
        .unwrap_or_else(|e| panic!("{caller}: the TLS handshake itself must succeed: {e:?}"))
}

/// Calls `rpc` with a request that would be carried out if allowed (a
/// volume or cache that does not exist where a name is needed, so a
/// controller's call fails for that business reason at most). A streaming
/// RPC counts as answered once its stream opens.
async fn call(client: &mut Client, rpc: &str, group: &str) -> Result<(), Status> {
    let missing = || "missing".to_string();
    match rpc {
        "CreateLV" => client
            .create_lv(create_lv(&unique("v"), group, MIB))
            .await
            .map(drop),
        "DeleteLV" => client
            .delete_lv(pb::DeleteLvRequest { name: missing() })
            .await
            .map(drop),
        "ResizeLV" => client
            .resize_lv(pb::ResizeLvRequest {
                name: missing(),
                size_bytes: 2 * MIB,
            })
            .await
            .map(drop),
        "GetLV" => client
            .get_lv(pb::GetLvRequest { name: missing() })
            .await
            .map(drop),
        "ListLVs" => client
            .list_l_vs(pb::ListLVsRequest::default())
            .await
            .map(drop),
        "CopyLV" => client
            .copy_lv(pb::CopyLvRequest {
                source: missing(),
                target: unique("copy"),
                snapshot: false,
            })
            .await
            .map(drop),
        "AdoptLV" => client
            .adopt_lv(pb::AdoptLvRequest {
                name: format!("volume-{}", unique("pvc")),
                device_group: group.to_string(),
                policy: pb::Policy::Lvm as i32,
                size_bytes: MIB,
            })
            .await
            .map(drop),
        "Capacity" => client
            .capacity(pb::CapacityRequest::default())
            .await
            .map(drop),
        "WatchCapacity" => client
            .watch_capacity(pb::WatchCapacityRequest::default())
            .await
            .map(drop),
        "ListDisks" => client
            .list_disks(pb::ListDisksRequest::default())
            .await
            .map(drop),
        // Not valid JSON: a controller's call changes nothing either.
        "ApplyConfig" => client
            .apply_config(pb::ApplyConfigRequest {
                config_json: "{".into(),
            })
            .await
            .map(drop),
        "CreateBcache" => client
            .create_bcache(pb::CreateBcacheRequest {
                name: unique("cache"),
                backing_volume: missing(),
                cache_volume: missing(),
                ..Default::default()
            })
            .await
            .map(drop),
        "DeleteBcache" => client
            .delete_bcache(pb::DeleteBcacheRequest { name: missing() })
            .await
            .map(drop),
        "GetBcache" => client
            .get_bcache(pb::GetBcacheRequest { name: missing() })
            .await
            .map(drop),
        "SetCacheMode" => client
            .set_cache_mode(pb::SetCacheModeRequest {
                name: missing(),
                ..Default::default()
            })
            .await
            .map(drop),
        "SetPodIOLimits" => client
            .set_pod_io_limits(pb::SetPodIoLimitsRequest {
                pod_uid: missing(),
                volume: missing(),
                ..Default::default()
            })
            .await
            .map(drop),
        "ClearPodIOLimits" => client
            .clear_pod_io_limits(pb::ClearPodIoLimitsRequest {
                pod_uid: missing(),
                volume: missing(),
            })
            .await
            .map(drop),
        "ListPodIOLimits" => client
            .list_pod_io_limits(pb::ListPodIoLimitsRequest::default())
            .await
            .map(drop),
        other => panic!("the test does not know how to call {other}"),
    }
}

/// Codes that mean the call did not reach the service's own logic.
fn refused_before_the_service(code: Code) -> bool {
    matches!(
        code,
        Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unavailable
            | Code::Unimplemented
            | Code::Unknown
    )
}

#[test]
fn the_table_names_every_rpc_of_the_proto() {
    let mut in_proto = proto_rpcs();
    let mut in_table: Vec<String> = EXPECTED.iter().map(|(r, _)| r.to_string()).collect();
    in_proto.sort();
    in_table.sort();
    assert!(in_proto.len() >= 18, "{in_proto:?}");
    assert_eq!(
        in_table, in_proto,
        "EXPECTED must name every NodeStorage RPC"
    );
}

#[tokio::test]
async fn each_caller_may_call_exactly_the_rpcs_of_its_role() {
    let group = unique("g");
    let (engine, _dirs) = host_engine(&group, None).await.expect("engine");
    let node = TestNode::start(engine, "node-a").await.expect("server");

    let mut mismatches = Vec::new();
    let mut denied_calls = 0u64;
    for (column, caller) in CALLERS.iter().enumerate() {
        let mut client = Client::new(channel_for(&node, caller).await);
        for (rpc, allowed) in EXPECTED {
            let want = allowed[column];
            let before = node.metrics.count(rpc, Code::PermissionDenied);
            let got = call(&mut client, rpc, &group).await;
            let outcome = match &got {
                Ok(()) => "OK".to_string(),
                Err(s) => format!("{:?}: {}", s.code(), s.message()),
            };
            let passed = match &got {
                Ok(()) => true,
                Err(s) => !refused_before_the_service(s.code()),
            };
            if passed != want {
                mismatches.push(format!(
                    "{caller} {rpc}: expected {}, got {outcome}",
                    if want { "allowed" } else { "PERMISSION_DENIED" }
                ));
                continue;
            }
            if !want {
                let s = got.expect_err("refused");
                if s.code() != Code::PermissionDenied || !s.message().contains(rpc) {
                    mismatches.push(format!(
                        "{caller} {rpc}: refused with {outcome}, not PERMISSION_DENIED naming the method"
                    ));
                }
                if node.metrics.count(rpc, Code::PermissionDenied) != before + 1 {
                    mismatches.push(format!("{caller} {rpc}: the refusal was not counted"));
                }
                denied_calls += 1;
            }
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    // 18 RPCs × 3 callers without a role, and the 11 a reader may not call.
    assert_eq!(denied_calls, 18 * 3 + 11);

    // Only the controller's CreateLV made something.
    let volumes = node.engine.list_volumes(None).await.expect("list");
    assert_eq!(volumes.len(), 1, "{volumes:?}");
}

/// gRPC health is open to every client the TLS handshake accepted,
/// whatever its certificate names.
#[tokio::test]
async fn health_is_open_to_every_authenticated_caller() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let group = unique("g");
    let (engine, _dirs) = host_engine(&group, None).await.expect("engine");
    let node = TestNode::start(engine, "node-a").await.expect("server");
    for caller in CALLERS {
        let channel = channel_for(&node, caller).await;
        HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap_or_else(|s| panic!("{caller}: health refused: {s:?}"));
    }
}
