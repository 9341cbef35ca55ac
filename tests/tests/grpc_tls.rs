//! Mutual TLS and authorization of NodeStorage, each refusal its own test,
//! and certificate rotation without a restart. Real handshakes against an
//! in-process server on 127.0.0.1.

use std::time::Duration;

use carina_proto::devcerts::{DevCa, Validity};
use carina_proto::nodestorage as pb;
use carina_proto::nodestorage::node_storage_client::NodeStorageClient;
use carina_proto::tls::{
    ClientTls, DEFAULT_TRUST_DOMAIN, client_config_without_cert, connect, connect_with_config,
    crypto_provider,
};
use carina_tests::grpc::{TestNode, create_lv, host_engine, server_cert};
use carina_tests::unique;
use tonic::Code;
use tonic::transport::Channel;

const MIB: u64 = 1 << 20;

async fn node() -> (TestNode, carina_tests::grpc::EngineDirs, String) {
    let group = unique("g");
    let (engine, dirs) = host_engine(&group, None).await.expect("engine");
    let node = TestNode::start(engine, "node-a").await.expect("server");
    (node, dirs, group)
}

/// A read call through `tls`; `Ok` only if the server accepted the client.
async fn probe(node: &TestNode, tls: &ClientTls) -> Result<(), String> {
    read_over(connect(&node.endpoint(), tls).await).await
}

/// A read call over the channel `connected`; `Ok` only if the connection
/// was made and the server accepted the client.
async fn read_over(connected: Result<Channel, impl std::fmt::Display>) -> Result<(), String> {
    let channel = connected.map_err(|e| format!("connect: {e}"))?;
    NodeStorageClient::new(channel)
        .capacity(pb::CapacityRequest::default())
        .await
        .map(drop)
        .map_err(|s| format!("call: {:?}: {}", s.code(), chain(&s)))
}

/// A status with the errors that caused it (the TLS alert of a refused
/// handshake is several sources down).
fn chain(status: &tonic::Status) -> String {
    let mut text = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// The server refused the connection during or right after the handshake
/// (no status from the service, a transport failure), and the error says
/// `why` (the TLS alert the server sent).
fn assert_refused_by_tls(result: Result<(), String>, why: &str) {
    let err = result.expect_err("the server must refuse this client");
    eprintln!("refused: {err}");
    assert!(
        err.starts_with("connect:")
            || err.starts_with("call: Unavailable")
            || err.starts_with("call: Unknown"),
        "refused at the transport, not by the service: {err}"
    );
    assert!(err.contains(why), "expected {why:?} in {err}");
}

#[tokio::test]
async fn controller_is_accepted() {
    let (node, _dirs, _) = node().await;
    probe(&node, &node.client_tls("controller").expect("tls"))
        .await
        .expect("accepted");
}

#[tokio::test]
async fn refuses_a_client_without_certificate() {
    let (node, _dirs, _) = node().await;
    let config = client_config_without_cert(node.ca.cert_pem().as_bytes()).expect("config");
    let result = read_over(connect_with_config(&node.endpoint(), "node-a", config).await).await;
    assert_refused_by_tls(result, "CertificateRequired");
}

#[tokio::test]
async fn refuses_a_certificate_from_another_ca() {
    let (node, _dirs, _) = node().await;
    let other = DevCa::new("another CA", Validity::days(1)).expect("CA");
    let cert = other
        .issue_client(DEFAULT_TRUST_DOMAIN, "controller", Validity::days(1))
        .expect("client");
    let tls = ClientTls {
        ca_pem: node.ca.cert_pem().as_bytes().to_vec(),
        cert_pem: cert.cert_pem.into_bytes(),
        key_pem: cert.key_pem.into_bytes(),
        server_name: "node-a".into(),
    };
    assert_refused_by_tls(probe(&node, &tls).await, "UnknownCA");
}

#[tokio::test]
async fn refuses_an_expired_certificate() {
    let (node, _dirs, _) = node().await;
    let cert = node
        .issue_client("controller", Validity::expired())
        .expect("client");
    let tls = ClientTls {
        cert_pem: cert.cert_pem.into_bytes(),
        key_pem: cert.key_pem.into_bytes(),
        ..node.client_tls("controller").expect("tls")
    };
    assert_refused_by_tls(probe(&node, &tls).await, "CertificateExpired");
}

#[tokio::test]
async fn reader_may_read_but_not_create() {
    let (node, _dirs, group) = node().await;
    let mut reader = node.client("reader").await.expect("client");
    reader
        .list_l_vs(pb::ListLVsRequest::default())
        .await
        .expect("reader may list");
    let e = reader
        .create_lv(create_lv("v", &group, MIB))
        .await
        .expect_err("reader may not create");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("\"reader\""), "{}", e.message());
    assert!(e.message().contains("CreateLV"), "{}", e.message());
    let e = reader
        .apply_config(pb::ApplyConfigRequest {
            config_json: "{}".into(),
        })
        .await
        .expect_err("reader may not configure");
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(
        node.engine
            .list_volumes(None)
            .await
            .expect("list")
            .is_empty(),
        "nothing was created"
    );
    assert_eq!(node.metrics.count("CreateLV", Code::PermissionDenied), 1);
    // Pods' IO limits: a reader sees them, only a controller sets them.
    reader
        .list_pod_io_limits(pb::ListPodIoLimitsRequest::default())
        .await
        .expect("reader may list IO limits");
    for e in [
        reader
            .set_pod_io_limits(pb::SetPodIoLimitsRequest::default())
            .await
            .expect_err("reader may not set IO limits"),
        reader
            .clear_pod_io_limits(pb::ClearPodIoLimitsRequest::default())
            .await
            .expect_err("reader may not clear IO limits"),
    ] {
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("PodIOLimits"), "{}", e.message());
    }
}

#[tokio::test]
async fn unknown_role_is_denied() {
    let (node, _dirs, _) = node().await;
    let mut client = node.client("admin").await.expect("client");
    let e = client
        .get_lv(pb::GetLvRequest { name: "v".into() })
        .await
        .expect_err("unknown role");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("\"admin\""), "{}", e.message());
}

#[tokio::test]
async fn certificate_without_a_role_is_denied() {
    let (node, _dirs, _) = node().await;
    let cert = node
        .ca
        .issue_client("other.example", "controller", Validity::days(1))
        .expect("client");
    let tls = ClientTls {
        cert_pem: cert.cert_pem.into_bytes(),
        key_pem: cert.key_pem.into_bytes(),
        ..node.client_tls("controller").expect("tls")
    };
    let channel = connect(&node.endpoint(), &tls).await.expect("TLS is fine");
    let e = NodeStorageClient::new(channel)
        .capacity(pb::CapacityRequest::default())
        .await
        .expect_err("no role in our trust domain");
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(
        e.message()
            .contains("spiffe://other.example/carina/controller"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn refuses_a_plaintext_client() {
    let (node, _dirs, _) = node().await;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", node.endpoint()))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5));
    let result = read_over(endpoint.connect().await).await;
    // The server reads the HTTP/2 preface as a broken TLS record and hangs
    // up; the client sees the connection die.
    assert_refused_by_tls(result, "transport error");
}

/// A client that offers only TLS 1.2, with a valid controller
/// certificate, is refused during the handshake: the node speaks TLS 1.3
/// only.
#[tokio::test]
async fn refuses_a_tls12_client() {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (node, _dirs, _) = node().await;
    let tls = node.client_tls("controller").expect("tls");
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(&tls.ca_pem) {
        roots.add(ca.expect("CA PEM")).expect("CA");
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&tls.cert_pem)
        .collect::<Result<_, _>>()
        .expect("certificate PEM");
    let key = PrivateKeyDer::from_pem_slice(&tls.key_pem).expect("key PEM");
    let config = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS12])
        .expect("TLS 1.2 is built in")
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .expect("client config");
    let err = connect_with_config(&node.endpoint(), "node-a", std::sync::Arc::new(config))
        .await
        .expect_err("the node must refuse a TLS 1.2 handshake");
    // The server's alert, several sources down.
    let text = format!("{err:?}");
    assert!(text.contains("AlertReceived(ProtocolVersion)"), "{text}");
    // The same credentials over TLS 1.3 are accepted.
    probe(&node, &tls).await.expect("TLS 1.3");
}

#[tokio::test]
async fn client_expecting_another_node_refuses_the_server() {
    // The server is node-b; the client wants node-a.
    let group = unique("g");
    let (engine, _dirs) = host_engine(&group, None).await.expect("engine");
    let node_b = TestNode::start(engine, "node-b").await.expect("server");
    let tls = node_b
        .client_tls("controller")
        .expect("tls")
        .for_server("node-a");
    let err = connect(&node_b.endpoint(), &tls)
        .await
        .expect_err("node-b's certificate does not name node-a");
    let text = format!("{err:?}");
    assert!(text.contains("NotValidForName"), "{text}");
    // The same credentials expecting node-b succeed.
    probe(&node_b, &tls.for_server("node-b"))
        .await
        .expect("right name");
}

#[tokio::test]
async fn rotation_takes_effect_without_restart() {
    let (mut node, _dirs, _) = node().await;
    let old_tls = node.client_tls("controller").expect("tls");
    let old_channel = connect(&node.endpoint(), &old_tls).await.expect("connect");
    let mut old_client = NodeStorageClient::new(old_channel);
    old_client
        .capacity(pb::CapacityRequest::default())
        .await
        .expect("before rotation");

    // A new CA, a new server certificate and key, swapped in at once.
    let new_ca = DevCa::new("rotated CA", Validity::days(1)).expect("CA");
    let new_server = server_cert(&new_ca, "node-a", Validity::days(1)).expect("cert");
    node.certs
        .write(&new_server, new_ca.cert_pem())
        .expect("write");
    node.wait_for_reload(Duration::from_secs(10))
        .await
        .expect("reloaded");

    // New connections present the new certificate and trust the new CA.
    let new_client = new_ca
        .issue_client(DEFAULT_TRUST_DOMAIN, "controller", Validity::days(1))
        .expect("client");
    let new_tls = ClientTls {
        ca_pem: new_ca.cert_pem().as_bytes().to_vec(),
        cert_pem: new_client.cert_pem.into_bytes(),
        key_pem: new_client.key_pem.into_bytes(),
        server_name: "node-a".into(),
    };
    probe(&node, &new_tls).await.expect("new certificates work");
    let err = connect(&node.endpoint(), &old_tls)
        .await
        .expect_err("the old CA does not vouch for the new server certificate");
    assert!(format!("{err:?}").contains("UnknownIssuer"), "{err:?}");

    // The connection made before the rotation keeps working.
    old_client
        .capacity(pb::CapacityRequest::default())
        .await
        .expect("established connection unaffected");
}
