//! Node identity issued by the control plane, against a real
//! kube-apiserver and etcd with real TokenRequest tokens bound to real Pod
//! objects (their `spec.nodeName` set directly: no kubelet), and the real
//! `carina-controller` (serving the issuer) and `carina-node` (asking it)
//! processes.
//!
//! It proves:
//! - a node gets a certificate naming only itself, signed by the CA the
//!   controller made and published, serves NodeStorage with it, renews it
//!   at two thirds of its lifetime and serves the new one on new
//!   connections without restarting (its `/metrics` count both); the
//!   controller reaches the node with its own certificate from the same
//!   CA;
//! - every refusal has its precise status and reason, also in the
//!   controller's log: a token for another audience, an expired token, a
//!   token whose pod was deleted, a pod on another node, another
//!   ServiceAccount, a token bound to no pod, a CSR asking for more (an
//!   extra DNS SAN, an IP SAN, CA:TRUE) or for another name; and the
//!   node's token gets nothing from the Kubernetes API (401 with the
//!   identity audience, 403 with the API's own: no RBAC);
//! - a node started before the issuer exists keeps asking with backoff,
//!   does not serve NodeStorage meanwhile, and gets its certificate once
//!   the issuer comes up, from a CA the user provided in the Secret.
//!
//! Needs etcd and kube-apiserver from `tests/tools/build.sh etcd kube`, and
//! `cargo build --workspace --bins`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use carina_api::NodeStorageResource;
use carina_controlplane::kube::capacity::READY;
use carina_proto::devcerts::{DevCa, Validity};
use carina_proto::nodestorage::CapacityRequest;
use carina_proto::nodestorage::node_storage_client::NodeStorageClient;
use carina_proto::tls::{ClientTls, connect};
use carina_tests::cluster::{await_object, free_port, register_node};
use carina_tests::identity::{
    self, AUDIENCE, CA, IssuedNode, NODE, NODE_SA, WAIT, ask, csr, expired_copy, start_controller,
    wait_served,
};
use carina_tests::kube::KubeCluster;
use carina_tests::process::tail;
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ObjectMeta, PostParams};
use rcgen::{BasicConstraints, IsCa, SanType};
use tonic::Code;
use x509_parser::extensions::GeneralName;

/// Client credentials of role `controller` from the CA in the Secret, for
/// node `node`.
async fn controller_tls(client: &kube::Client, namespace: &str, node: &str) -> Result<ClientTls> {
    let ca = identity::issuer_ca(client, namespace, CA).await?;
    identity::controller_tls(&ca, node)
}

/// The DNS and other SANs of a DER certificate, and its lifetime.
fn sans_and_lifetime(der: &[u8]) -> Result<(Vec<String>, i64)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)?;
    let names = cert
        .subject_alternative_name()?
        .map(|s| {
            s.value
                .general_names
                .iter()
                .map(|n| match n {
                    GeneralName::DNSName(d) => d.to_string(),
                    other => format!("other: {other}"),
                })
                .collect()
        })
        .unwrap_or_default();
    let validity = cert.validity();
    Ok((
        names,
        validity.not_after.timestamp() - validity.not_before.timestamp(),
    ))
}

fn verify_signed_by(der: &[u8], ca_pem: &str) -> Result<()> {
    let ca_der = x509_parser::pem::parse_x509_pem(ca_pem.as_bytes())?
        .1
        .contents;
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der)?;
    let (_, cert) = x509_parser::parse_x509_certificate(der)?;
    cert.verify_signature(Some(ca.public_key()))
        .context("not signed by the CA")
}

#[tokio::test]
async fn a_node_gets_renews_and_reloads_its_certificate() -> Result<()> {
    let (cluster, pods, dir) = identity::cluster_with_node_pods("identity").await?;
    let client = cluster.client();
    let pod = pods.pod("carina-node-a", NODE_SA, NODE).await?;
    let port = free_port()?;
    // 12 s: renewed after 8 s.
    let controller = start_controller(&cluster, &pods, dir.path(), port, "12s", &[]).await?;
    let ca = identity::published_ca(&client, &pods.namespace, CA, WAIT).await?;

    let node = IssuedNode::new(NODE, &dir.path().join(NODE))?;
    std::fs::write(&node.ca_file, &ca)?;
    let token = pods.token(NODE_SA, &[AUDIENCE], Some(&pod)).await?;
    std::fs::write(&node.token_file, token)?;
    let mut process = node.start(&cluster, port).await?;
    let pid = process.pid();

    let tls = controller_tls(&client, &pods.namespace, NODE).await?;
    let first = wait_served(&mut process, &node.endpoint(), &tls, "served", |_| true).await?;
    let (names, lifetime) = sans_and_lifetime(&first)?;
    assert_eq!(names, [NODE], "only the node's name");
    // Valid from five minutes back (clock skew) for 12 s from issuance.
    assert!(lifetime <= 300 + 12 + 1, "lifetime {lifetime}s");
    verify_signed_by(&first, &ca)?;
    // The certificate serves NodeStorage over mutual TLS.
    let channel = connect(&node.endpoint(), &tls).await?;
    NodeStorageClient::new(channel)
        .capacity(CapacityRequest::default())
        .await
        .context("Capacity with the issued certificate")?;

    let renewed = wait_served(&mut process, &node.endpoint(), &tls, "renewed", |der| {
        der != first.as_slice()
    })
    .await?;
    assert_eq!(sans_and_lifetime(&renewed)?.0, [NODE]);
    verify_signed_by(&renewed, &ca)?;
    assert_eq!(process.pid(), pid, "the same process serves the new one");
    process.check_running()?;
    let metrics = metrics_text(node.metrics_port).await?;
    let issued = metrics
        .lines()
        .find_map(|l| l.strip_prefix("carina_node_certificates_issued_total{node=\"node-a\"} "))
        .context("no issuance counter")?;
    assert!(issued.parse::<u64>()? >= 2, "{metrics}");

    // The controller reaches the node with its own certificate from the
    // same CA: the capacity publisher reports from it.
    register_node(&client, NODE, &node.endpoint()).await?;
    let nsrs: Api<NodeStorageResource> = Api::all(client.clone());
    await_object(&nsrs, NODE, "Ready", WAIT, |n| {
        n.and_then(|n| n.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == READY && c.status == "True")
        })
    })
    .await?;

    let text = std::fs::read_to_string(controller.log())?;
    let issued = text
        .lines()
        .filter(|l| l.contains("issued a node certificate") && l.contains(NODE))
        .count();
    assert!(issued >= 2, "one issuance logged per certificate:\n{text}");
    Ok(())
}

/// The node's `/metrics` text.
async fn metrics_text(port: u16) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await?;
    let mut text = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut text))
        .await
        .context("/metrics did not answer")??;
    Ok(text)
}

/// Waits until the apiserver itself no longer accepts `token` (its pod
/// was deleted; the apiserver's pod cache may lag a moment).
async fn await_token_rejected(client: &kube::Client, token: &str) -> Result<()> {
    let api: Api<TokenReview> = Api::all(client.clone());
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_string(),
            audiences: Some(vec![AUDIENCE.to_string()]),
        },
        ..TokenReview::default()
    };
    let deadline = Instant::now() + WAIT;
    loop {
        let status = api.create(&PostParams::default(), &review).await?.status;
        if status.and_then(|s| s.authenticated) != Some(true) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("a token of a deleted pod still authenticates after {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn the_issuer_refuses_with_precise_reasons() -> Result<()> {
    let (cluster, pods, dir) = identity::cluster_with_node_pods("identity").await?;
    let client = cluster.client();
    pods.service_account("intruder").await?;
    let on_a = pods.pod("carina-node-a", NODE_SA, NODE).await?;
    let on_b = pods.pod("carina-node-b", NODE_SA, "node-b").await?;
    let intruder = pods.pod("intruder-a", "intruder", NODE).await?;
    let doomed = pods.pod("carina-node-gone", NODE_SA, NODE).await?;
    let port = free_port()?;
    let controller = start_controller(&cluster, &pods, dir.path(), port, "1h", &[]).await?;
    let ca = identity::published_ca(&client, &pods.namespace, CA, WAIT).await?;

    let good = pods.token(NODE_SA, &[AUDIENCE], Some(&on_a)).await?;
    ask(port, &ca, NODE, csr(NODE, |_| {})?, &good)
        .await?
        .map_err(|s| anyhow::anyhow!("the good request was refused: {s:?}"))?;

    let other_audience = pods.token(NODE_SA, &["someone-else"], Some(&on_a)).await?;
    let expired = expired_copy(&good, cluster.service_account_key())?;
    let gone = pods.token(NODE_SA, &[AUDIENCE], Some(&doomed)).await?;
    pods.delete_pod("carina-node-gone").await?;
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &pods.namespace);
    await_object(&pod_api, "carina-node-gone", "deleted", WAIT, |p| {
        p.is_none()
    })
    .await?;
    await_token_rejected(&client, &gone).await?;
    let of_b = pods.token(NODE_SA, &[AUDIENCE], Some(&on_b)).await?;
    let stranger = pods.token("intruder", &[AUDIENCE], Some(&intruder)).await?;
    let unbound = pods.token(NODE_SA, &[AUDIENCE], None).await?;

    let dns = |n: &str| SanType::DnsName(n.to_string().try_into().expect("ia5"));
    let cases = [
        (
            "another audience",
            csr(NODE, |_| {})?,
            other_audience.as_str(),
            Code::Unauthenticated,
            "token: not accepted by the Kubernetes API",
        ),
        (
            "expired",
            csr(NODE, |_| {})?,
            expired.as_str(),
            Code::Unauthenticated,
            "expired",
        ),
        (
            "pod deleted",
            csr(NODE, |_| {})?,
            gone.as_str(),
            Code::Unauthenticated,
            "token: not accepted by the Kubernetes API",
        ),
        (
            "pod on another node",
            csr(NODE, |_| {})?,
            of_b.as_str(),
            Code::PermissionDenied,
            "runs on node \"node-b\", not on \"node-a\"",
        ),
        (
            "another ServiceAccount",
            csr(NODE, |_| {})?,
            stranger.as_str(),
            Code::PermissionDenied,
            "may ask for node certificates",
        ),
        (
            "no pod",
            csr(NODE, |_| {})?,
            unbound.as_str(),
            Code::PermissionDenied,
            "not bound to a pod",
        ),
        (
            "extra DNS SAN",
            csr(NODE, |p| p.subject_alt_names.push(dns("node-b")))?,
            good.as_str(),
            Code::InvalidArgument,
            "more than one DNS SAN",
        ),
        (
            "IP SAN",
            csr(NODE, |p| {
                p.subject_alt_names
                    .push(SanType::IpAddress([127, 0, 0, 1].into()))
            })?,
            good.as_str(),
            Code::InvalidArgument,
            "IP address SAN",
        ),
        (
            "CA:TRUE",
            csr(NODE, |p| {
                p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained)
            })?,
            good.as_str(),
            Code::InvalidArgument,
            "CA:TRUE",
        ),
        (
            "another name",
            csr("node-b", |_| {})?,
            good.as_str(),
            Code::InvalidArgument,
            "not the node name",
        ),
    ];
    for (what, csr_pem, token, code, reason) in cases {
        let status = ask(port, &ca, NODE, csr_pem, token)
            .await?
            .err()
            .with_context(|| format!("{what}: issued"))?;
        assert_eq!(status.code(), code, "{what}: {status:?}");
        assert!(status.message().contains(reason), "{what}: {status:?}");
    }
    let text = std::fs::read_to_string(controller.log())?;
    let refused = text
        .lines()
        .filter(|l| l.contains("refused a node certificate"))
        .collect::<Vec<_>>();
    assert_eq!(refused.len(), 10, "one warning per refusal:\n{text}");
    for reason in ["expired", "runs on node", "CA:TRUE", "IP address SAN"] {
        assert!(
            refused.iter().any(|l| l.contains(reason)),
            "{reason} not logged:\n{text}"
        );
    }

    // The node's ServiceAccount can do nothing with the Kubernetes API: with
    // the identity audience the apiserver does not accept the token at
    // all, with its own audience it knows who it is and allows nothing.
    let node_client = |token: String| -> Result<kube::Client> {
        let mut config = kube::Config::new(cluster.server_url().parse()?);
        config.root_cert = Some(vec![cluster_ca_der(&cluster)?]);
        config.auth_info.token = Some(token.into());
        Ok(carina_api::client::client(config)?)
    };
    let api_token = pods.token(NODE_SA, &[], Some(&on_a)).await?;
    for (token, expected) in [(good.clone(), 401), (api_token, 403)] {
        let as_node = node_client(token)?;
        let secrets: Api<Secret> = Api::namespaced(as_node.clone(), &pods.namespace);
        let pods_api: Api<Pod> = Api::namespaced(as_node, &pods.namespace);
        for result in [
            secrets.get(CA).await.map(|_| ()),
            pods_api.list(&Default::default()).await.map(|_| ()),
        ] {
            match result {
                Err(kube::Error::Api(s)) => assert_eq!(s.code, expected, "{s:?}"),
                other => bail!("expected HTTP {expected}, got {other:?}"),
            }
        }
    }
    Ok(())
}

/// The cluster CA (DER), read from the admin kubeconfig's directory.
fn cluster_ca_der(cluster: &KubeCluster) -> Result<Vec<u8>> {
    let pem = std::fs::read(cluster.dir().join("pki").join("ca.crt"))?;
    Ok(x509_parser::pem::parse_x509_pem(&pem)?.1.contents)
}

#[tokio::test]
async fn a_node_started_before_the_issuer_gets_its_certificate_when_it_comes() -> Result<()> {
    let (cluster, pods, dir) = identity::cluster_with_node_pods("identity").await?;
    let client = cluster.client();
    let pod = pods.pod("carina-node-a", NODE_SA, NODE).await?;

    // The user's own CA, provided as the Secret before any controller.
    let user_ca = DevCa::new("user-provided CA", Validity::days(1))?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(CA.into()),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            ("tls.crt".to_string(), ByteString(user_ca.cert_pem().into())),
            ("tls.key".to_string(), ByteString(user_ca.key_pem().into())),
        ])),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(client.clone(), &pods.namespace)
        .create(&PostParams::default(), &secret)
        .await?;

    let port = free_port()?;
    let node = IssuedNode::new(NODE, &dir.path().join(NODE))?;
    std::fs::write(&node.ca_file, user_ca.cert_pem())?;
    std::fs::write(
        &node.token_file,
        pods.token(NODE_SA, &[AUDIENCE], Some(&pod)).await?,
    )?;
    let mut process = node.start(&cluster, port).await?;
    let log = process.log().to_path_buf();

    // It asks, is refused by an absent issuer, and serves nothing meanwhile.
    let deadline = Instant::now() + WAIT;
    while !std::fs::read_to_string(&log)?.contains("no certificate from the issuer yet") {
        process.check_running()?;
        if Instant::now() > deadline {
            bail!("the node did not try the issuer; log:\n{}", tail(&log, 40));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        tokio::net::TcpStream::connect(node.endpoint())
            .await
            .is_err(),
        "NodeStorage must not be served without a certificate"
    );

    let _controller = start_controller(&cluster, &pods, dir.path(), port, "1h", &[]).await?;
    let tls = controller_tls(&client, &pods.namespace, NODE).await?;
    let served = wait_served(&mut process, &node.endpoint(), &tls, "served", |_| true).await?;
    assert_eq!(sans_and_lifetime(&served)?.0, [NODE]);
    verify_signed_by(&served, user_ca.cert_pem())?;

    // The user's CA is used as it is and published.
    assert_eq!(
        identity::published_ca(&client, &pods.namespace, CA, WAIT)
            .await?
            .trim(),
        user_ca.cert_pem().trim()
    );
    let kept = Api::<Secret>::namespaced(client, &pods.namespace)
        .get(CA)
        .await?;
    assert_eq!(identity::secret_text(&kept, "tls.crt")?, user_ca.cert_pem());
    Ok(())
}
