//! The node identity issuer's trust and admission against a real
//! kube-apiserver and etcd (no kubelet: Pods and a DaemonSet made
//! directly), with the real `carina-controller` and `carina-node`:
//!
//! - only a running pod the node DaemonSet controls gets a certificate:
//!   a pod without a controller, one of a ReplicaSet, of another
//!   DaemonSet, one whose reference names the DaemonSet with a uid it does
//!   not have, a terminating and a finished pod are each refused with
//!   `PERMISSION_DENIED` and the reason; past the rate limit a node (also
//!   through a new pod) gets `RESOURCE_EXHAUSTED`;
//! - a CA bundle written into the node's CA files without a CA key (alone,
//!   or beside the real CA with a self-made "endorsement") is refused: the
//!   node keeps trusting the old CA, for clients and after a restart (its
//!   pin); the controller's rotation (the Secret replaced, the new CA
//!   endorsed with the old key, both published, then the new one alone
//!   after the controller restarts) is taken.
//!
//! Needs etcd and kube-apiserver from `tests/tools/build.sh etcd kube`, and
//! `cargo build --workspace --bins`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use carina_proto::devcerts::{DevCa, Validity};
use carina_proto::nodestorage::CapacityRequest;
use carina_proto::nodestorage::node_storage_client::NodeStorageClient;
use carina_proto::tls::{ClientTls, connect};
use carina_tests::cluster::{Service, await_object, free_port};
use carina_tests::identity::{
    self, AUDIENCE, CA, IssuedNode, NODE, NODE_SA, WAIT, ask, csr, start_controller, wait_served,
};
use carina_tests::process::tail;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, PostParams};
use tonic::Code;

#[tokio::test]
async fn only_running_pods_of_the_node_daemonset_get_certificates_and_not_too_often() -> Result<()>
{
    let (cluster, pods, dir) = identity::cluster_with_node_pods("issuer").await?;
    let client = cluster.client();
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &pods.namespace);
    let good = pods.pod("carina-node-a", NODE_SA, NODE).await?;
    let unowned = pods
        .pod_owned("carina-node-unowned", NODE_SA, NODE, vec![])
        .await?;
    let by_replicaset = pods
        .pod_owned(
            "carina-node-rs",
            NODE_SA,
            NODE,
            vec![identity::owner(
                "apps/v1",
                "ReplicaSet",
                "carina-node-rs",
                "0f1e2d3c",
            )],
        )
        .await?;
    let impostor_ds = pods.daemonset("impostor").await?;
    let by_impostor = pods
        .pod_owned(
            "impostor-a",
            NODE_SA,
            NODE,
            vec![identity::owner(
                "apps/v1",
                "DaemonSet",
                "impostor",
                impostor_ds.metadata.uid.as_deref().unwrap_or_default(),
            )],
        )
        .await?;
    // The DaemonSet's name with a uid it does not have: a reference made
    // by hand, or left from a deleted DaemonSet of that name.
    let forged = pods
        .pod_owned(
            "carina-node-forged",
            NODE_SA,
            NODE,
            vec![identity::owner(
                "apps/v1",
                "DaemonSet",
                identity::NODE_DS,
                "9a8b7c6d",
            )],
        )
        .await?;
    let terminating = pods.pod("carina-node-terminating", NODE_SA, NODE).await?;
    let finished = pods.pod("carina-node-finished", NODE_SA, NODE).await?;
    let mut tokens = BTreeMap::new();
    for (what, pod) in [
        ("unowned", &unowned),
        ("ReplicaSet", &by_replicaset),
        ("another DaemonSet", &by_impostor),
        ("forged uid", &forged),
        ("terminating", &terminating),
        ("finished", &finished),
        ("good", &good),
    ] {
        tokens.insert(what, pods.token(NODE_SA, &[AUDIENCE], Some(pod)).await?);
    }
    // Deleted with a grace period: the pod stays, terminating, and its
    // token is still accepted by the apiserver (it rejects tokens only a
    // minute after the deletion time, which is 5 min ahead).
    pod_api
        .delete(
            "carina-node-terminating",
            &kube::api::DeleteParams {
                grace_period_seconds: Some(300),
                ..kube::api::DeleteParams::default()
            },
        )
        .await?;
    let deleting = pod_api.get("carina-node-terminating").await?;
    assert!(
        deleting.metadata.deletion_timestamp.is_some(),
        "{deleting:?}"
    );
    let mut done = pod_api.get_status("carina-node-finished").await?;
    done.status.get_or_insert_with(Default::default).phase = Some("Succeeded".into());
    pod_api
        .replace_status("carina-node-finished", &PostParams::default(), &done)
        .await?;

    let port = free_port()?;
    let controller = start_controller(
        &cluster,
        &pods,
        dir.path(),
        port,
        "1h",
        &["--identity-rate-burst=2", "--identity-rate-interval=1h"],
    )
    .await?;
    let ca = identity::published_ca(&client, &pods.namespace, CA, WAIT).await?;

    let cases = [
        ("unowned", "no controller"),
        (
            "ReplicaSet",
            "its controller is apps/v1 ReplicaSet/carina-node-rs",
        ),
        (
            "another DaemonSet",
            "its controller is apps/v1 DaemonSet/impostor",
        ),
        ("forged uid", "holds uid 9a8b7c6d"),
        ("terminating", "terminating"),
        ("finished", "finished (phase Succeeded)"),
    ];
    // Every case is asked before judging, so a failure lists them all.
    let mut wrong = Vec::new();
    for (what, reason) in cases {
        match ask(port, &ca, NODE, csr(NODE, |_| {})?, &tokens[what]).await? {
            Ok(()) => wrong.push(format!("{what}: issued")),
            Err(s) if s.code() != Code::PermissionDenied || !s.message().contains(reason) => wrong
                .push(format!(
                    "{what}: {s:?}, expected PERMISSION_DENIED {reason:?}"
                )),
            Err(_) => {}
        }
    }
    if !wrong.is_empty() {
        bail!("refusals missing or wrong:\n{}", wrong.join("\n"));
    }

    // The DaemonSet's pod: two at once, then RESOURCE_EXHAUSTED for an
    // hour; a new pod on the same node finds the node's allowance spent.
    for n in 0..2 {
        ask(port, &ca, NODE, csr(NODE, |_| {})?, &tokens["good"])
            .await?
            .map_err(|s| anyhow::anyhow!("request {n} within the burst refused: {s:?}"))?;
    }
    let status = ask(port, &ca, NODE, csr(NODE, |_| {})?, &tokens["good"])
        .await?
        .err()
        .context("a third certificate within the hour was issued")?;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("node \"node-a\"") && status.message().contains("retry in"),
        "{status:?}"
    );
    let replacement = pods.pod("carina-node-a2", NODE_SA, NODE).await?;
    let fresh = pods.token(NODE_SA, &[AUDIENCE], Some(&replacement)).await?;
    let status = ask(port, &ca, NODE, csr(NODE, |_| {})?, &fresh)
        .await?
        .err()
        .context("another pod of the same node was issued past the node's limit")?;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    let text = std::fs::read_to_string(controller.log())?;
    for reason in ["ReplicaSet", "terminating", "rate limit"] {
        assert!(
            text.lines()
                .any(|l| l.contains("refused a node certificate") && l.contains(reason)),
            "{reason} not logged:\n{text}"
        );
    }
    Ok(())
}

/// Whether a Capacity call over a new connection with `tls` succeeds.
async fn capacity(endpoint: &str, tls: &ClientTls) -> Result<()> {
    let channel = connect(endpoint, tls).await?;
    NodeStorageClient::new(channel)
        .capacity(CapacityRequest::default())
        .await?;
    Ok(())
}

/// Waits until `log` has a line containing `text`, the process alive.
async fn wait_logged(process: &mut Service, text: &str) -> Result<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        process.check_running()?;
        if let Some(line) = std::fs::read_to_string(process.log())?
            .lines()
            .find(|l| l.contains(text))
        {
            return Ok(line.to_string());
        }
        if Instant::now() > deadline {
            bail!(
                "{text:?} not logged in {WAIT:?}:\n{}",
                tail(process.log(), 40)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The number of lines of `log` containing `text`.
fn logged(process: &Service, text: &str) -> Result<usize> {
    Ok(std::fs::read_to_string(process.log())?
        .lines()
        .filter(|l| l.contains(text))
        .count())
}

/// Client credentials of role `controller` signed by `signer`, verifying
/// the node against `server_ca`.
fn client_of(signer: &DevCa, server_ca: &str) -> Result<ClientTls> {
    let mut tls = identity::controller_tls(signer, NODE)?;
    tls.ca_pem = server_ca.as_bytes().to_vec();
    Ok(tls)
}

#[tokio::test]
async fn a_rewritten_ca_bundle_is_refused_and_an_endorsed_rotation_taken() -> Result<()> {
    let (cluster, pods, dir) = identity::cluster_with_node_pods("issuer").await?;
    let client = cluster.client();
    let pod = pods.pod("carina-node-a", NODE_SA, NODE).await?;
    let port = free_port()?;
    let mut controller = start_controller(&cluster, &pods, dir.path(), port, "1h", &[]).await?;
    let ca_a = identity::published_ca(&client, &pods.namespace, CA, WAIT).await?;
    let old = identity::issuer_ca(&client, &pods.namespace, CA).await?;

    let node = IssuedNode::new(NODE, &dir.path().join(NODE))?;
    let (bundle, endorsements) = identity::published_files(&client, &pods.namespace, CA).await?;
    node.write_ca(&bundle, &endorsements)?;
    std::fs::write(
        &node.token_file,
        pods.token(NODE_SA, &[AUDIENCE], Some(&pod)).await?,
    )?;
    let mut process = node.start(&cluster, port).await?;
    let tls_a = client_of(&old, &ca_a)?;
    wait_served(&mut process, &node.endpoint(), &tls_a, "served", |_| true).await?;
    capacity(&node.endpoint(), &tls_a).await?;

    // Someone who can write the ConfigMap but holds no CA key puts their
    // own CA in it (alone, and beside the real one, with a
    // "cross-certificate" they signed themselves).
    let evil = DevCa::new("carina.storage.io node identity CA", Validity::days(1))?;
    let tls_evil = client_of(&evil, &ca_a)?;
    for (n, (bundle, endorsements)) in [
        (evil.cert_pem().to_string(), String::new()),
        (
            format!("{ca_a}{}", evil.cert_pem()),
            evil.cert_pem().to_string(),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        node.write_ca(&bundle, &endorsements)?;
        // The node looks within a second; the old code took it then.
        let deadline = Instant::now() + WAIT;
        while logged(&process, "refused a CA bundle")? <= n {
            process.check_running()?;
            if capacity(&node.endpoint(), &tls_evil).await.is_ok() {
                bail!("the node accepts a client of the CA someone wrote into the ConfigMap");
            }
            if Instant::now() > deadline {
                bail!("no refusal logged:\n{}", tail(process.log(), 40));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            capacity(&node.endpoint(), &tls_evil).await.is_err(),
            "bundle {n}: the rewritten CA's client is accepted"
        );
        capacity(&node.endpoint(), &tls_a)
            .await
            .with_context(|| format!("bundle {n}: the trusted CA's client refused"))?;
    }
    let refusal = wait_logged(&mut process, "refused a CA bundle").await?;
    assert!(refusal.contains("not trusted yet"), "{refusal}");

    // A restart does not start over from the rewritten file: the pinned
    // bundle verifies the issuer and the clients.
    process.stop().await;
    let mut process = node.start(&cluster, port).await?;
    wait_logged(&mut process, "trusting the pinned CA bundle").await?;
    wait_served(
        &mut process,
        &node.endpoint(),
        &tls_a,
        "served after restart",
        |_| true,
    )
    .await?;
    capacity(&node.endpoint(), &tls_a).await?;
    assert!(capacity(&node.endpoint(), &tls_evil).await.is_err());
    wait_logged(&mut process, "refused a CA bundle").await?;

    // The legitimate rotation: the Secret gets a new CA; the running
    // controller, still holding the old key, endorses it and publishes
    // both; the node takes them.
    let new = DevCa::new("carina new CA", Validity::days(1))?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &pods.namespace);
    let mut secret = secrets.get(CA).await?;
    secret.data = Some(BTreeMap::from([
        ("tls.crt".to_string(), ByteString(new.cert_pem().into())),
        ("tls.key".to_string(), ByteString(new.key_pem().into())),
    ]));
    secrets.replace(CA, &PostParams::default(), &secret).await?;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), &pods.namespace);
    await_object(&cms, CA, "endorsed", WAIT, |cm| {
        cm.and_then(|c| c.data.as_ref())
            .and_then(|d| d.get(carina_proto::anchors::ENDORSEMENTS_KEY))
            .is_some_and(|e| e.contains("BEGIN CERTIFICATE"))
    })
    .await?;
    let (bundle, endorsements) = identity::published_files(&client, &pods.namespace, CA).await?;
    assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), 2, "{bundle}");
    node.write_ca(&bundle, &endorsements)?;
    let taken = wait_logged(&mut process, "carina new CA").await?;
    assert!(taken.contains("trusting the CA bundle"), "{taken}");
    let tls_new = client_of(&new, &ca_a)?;
    capacity(&node.endpoint(), &tls_new)
        .await
        .context("a client of the endorsed new CA")?;
    capacity(&node.endpoint(), &tls_a).await?;

    // Restarted on the new CA, the controller publishes it alone, the
    // endorsement kept; the node drops the old CA.
    controller.stop().await;
    let _controller = start_controller(&cluster, &pods, dir.path(), port, "1h", &[]).await?;
    await_object(&cms, CA, "the new CA alone", WAIT, |cm| {
        cm.and_then(|c| c.data.as_ref())
            .and_then(|d| d.get("ca.crt"))
            .is_some_and(|b| b.trim() == new.cert_pem().trim())
    })
    .await?;
    let (bundle, endorsements) = identity::published_files(&client, &pods.namespace, CA).await?;
    assert!(
        endorsements.contains("BEGIN CERTIFICATE"),
        "endorsement dropped"
    );
    let taken = logged(&process, "trusting the CA bundle")?;
    node.write_ca(&bundle, &endorsements)?;
    let deadline = Instant::now() + WAIT;
    while logged(&process, "trusting the CA bundle")? == taken {
        process.check_running()?;
        if Instant::now() > deadline {
            bail!(
                "the new CA alone was not taken:\n{}",
                tail(process.log(), 40)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    capacity(&node.endpoint(), &tls_new).await?;
    assert!(
        capacity(&node.endpoint(), &tls_a).await.is_err(),
        "the old CA is no longer trusted"
    );
    Ok(())
}
