//! Secrets never reach a log: `carina-controller` (serving the identity
//! issuer, with the CA in a Secret) and `carina-node` (asking it with a
//! real ServiceAccount token) run at debug level through an issuance, a
//! configuration push over mutual TLS, the capacity stream and a CSI
//! CreateVolume that the controller carries out on the node with its own
//! certificate; then neither process's output may hold the token, the
//! CA's private key, the admin kubeconfig's private key, a PEM private key
//! of any kind or a Bearer credential. `hack/test.sh` scans every log of a
//! run the same way (`hack/scan-logs.sh`); this test proves the programs
//! keep the secrets out when they log the most.
//!
//! Needs etcd and kube-apiserver from `tests/tools/build.sh etcd kube`, and
//! `cargo build --workspace --bins`.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use carina_proto::csi::controller_client::ControllerClient;
use carina_proto::nodestorage as pb;
use carina_proto::nodestorage::node_storage_client::NodeStorageClient;
use carina_proto::tls::connect;
use carina_tests::cluster::{Service, await_capacity, free_port, register_node};
use carina_tests::grpc::host_config;
use carina_tests::identity::{
    AUDIENCE, CA, IssuedNode, NODE, NODE_SA, NodePods, WAIT, controller_argv,
};
use carina_tests::kube::KubeCluster;
use carina_tests::process::tail;
use carina_tests::unique;

const GROUP: &str = "secrets";
/// The most the programs log (every target at debug, ours at trace).
const LOUD: &str = "debug,carina_node=trace,carina_controlplane=trace,carina_proto=trace";

/// The base64 lines of a PEM block: any one of them in a log is a leak of
/// part of the key.
fn pem_body_lines(pem: &str) -> Vec<String> {
    pem.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("-----"))
        .filter(|l| l.len() >= 16)
        .map(str::to_string)
        .collect()
}

/// The private key of the admin kubeconfig (`client-key:` names a file).
fn kubeconfig_key(kubeconfig: &Path) -> Result<String> {
    let text = std::fs::read_to_string(kubeconfig)?;
    let path = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("client-key:"))
        .context("no client-key in the kubeconfig")?
        .trim()
        .trim_matches('"');
    Ok(std::fs::read_to_string(path)?)
}

/// What no log may hold, each with a name for the failure message.
struct Secrets(Vec<(String, String)>);

impl Secrets {
    fn add(&mut self, what: &str, value: &str) {
        assert!(value.len() >= 16, "{what}: too short to look for");
        self.0.push((what.to_string(), value.to_string()));
    }

    /// The secrets found in `log`, by name.
    fn found_in(&self, log: &str) -> Vec<String> {
        let mut found: Vec<String> = self
            .0
            .iter()
            .filter(|(_, v)| log.contains(v.as_str()))
            .map(|(w, _)| w.clone())
            .collect();
        if log.contains("PRIVATE KEY") {
            found.push("a PEM private key".into());
        }
        if log.lines().any(|l| {
            l.split("Bearer ")
                .skip(1)
                .any(|rest| !rest.starts_with("<masked>") && !rest.trim().is_empty())
        }) {
            found.push("a Bearer credential".into());
        }
        found
    }
}

#[tokio::test]
async fn keys_and_tokens_stay_out_of_debug_logs() -> Result<()> {
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();
    let pods = NodePods::create(&client, &unique("secrets")).await?;
    let dir = tempfile::tempdir()?;
    let pod = pods.pod("carina-node-a", NODE_SA, NODE).await?;
    let loud = vec![("RUST_LOG".to_string(), LOUD.to_string())];

    let port = free_port()?;
    let socket = dir.path().join("controller.sock");
    let argv = controller_argv(
        cluster.kubeconfig_path(),
        &socket,
        &pods.namespace,
        port,
        "1h",
    );
    let controller_log = cluster
        .log_dir()
        .join(format!("{}.log", unique("carina-controller")));
    let mut controller = Service::start_with_env(
        "carina-controller",
        "carina-controller",
        argv,
        &loud,
        &socket,
        &controller_log,
    )
    .await?;

    let ca_pem = carina_tests::identity::published_ca(&client, &pods.namespace, CA, WAIT).await?;

    let node = IssuedNode::new(NODE, &dir.path().join(NODE))?;
    std::fs::write(&node.ca_file, &ca_pem)?;
    let token = pods.token(NODE_SA, &[AUDIENCE], Some(&pod)).await?;
    std::fs::write(&node.token_file, &token)?;
    let node_log = cluster
        .log_dir()
        .join(format!("{}.log", unique("carina-node")));
    let mut node_process = Service::start_with_env(
        "carina-node",
        NODE,
        node.argv(port),
        &loud,
        &node.csi_socket,
        &node_log,
    )
    .await?;

    // The controller's role, from the CA in the Secret.
    let ca = carina_tests::identity::issuer_ca(&client, &pods.namespace, CA).await?;
    let ca_key = ca.key_pem().to_string();
    let tls = carina_tests::identity::controller_tls(&ca, NODE)?;

    // Once the node serves its issued certificate, give it a group over
    // mutual TLS.
    let deadline = Instant::now() + WAIT;
    let mut storage = loop {
        node_process.check_running()?;
        let attempt = match connect(&node.endpoint(), &tls).await {
            Ok(channel) => {
                let mut c = NodeStorageClient::new(channel);
                match c.capacity(pb::CapacityRequest::default()).await {
                    Ok(_) => break c,
                    Err(s) => format!("{s:?}"),
                }
            }
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() > deadline {
            bail!(
                "the node did not serve within {WAIT:?} ({attempt}); log:\n{}",
                tail(&node_log, 40)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let root = dir.path().join("host-group");
    std::fs::create_dir_all(&root)?;
    storage
        .apply_config(pb::ApplyConfigRequest {
            config_json: host_config(GROUP, &root, 0),
        })
        .await
        .context("ApplyConfig")?;

    // The controller reaches the node with its own issued certificate:
    // the capacity stream, then a create.
    register_node(&client, NODE, &node.endpoint()).await?;
    await_capacity(&client, NODE, WAIT).await?;
    let mut csi = ControllerClient::new(controller.channel().await?);
    let mut req = carina_tests::csi::create("pvc-secrets", 16 << 20, "xfs");
    req.parameters.insert(
        carina_csi::params::DISK_GROUP.to_string(),
        GROUP.to_string(),
    );
    let volume = carina_tests::csi::make(&mut csi, req).await?;
    assert_eq!(carina_tests::csi::node_of(&volume), NODE);

    node_process.check_running()?;
    controller.check_running()?;
    node_process.stop().await;
    controller.stop().await;

    let mut secrets = Secrets(Vec::new());
    secrets.add("the node's ServiceAccount token", &token);
    let signature = token
        .rsplit('.')
        .next()
        .context("a token without signature")?;
    secrets.add("the token's signature", signature);
    for (i, l) in pem_body_lines(&ca_key).iter().enumerate() {
        secrets.add(&format!("line {} of the CA's private key", i + 1), l);
    }
    for (i, l) in pem_body_lines(&kubeconfig_key(cluster.kubeconfig_path())?)
        .iter()
        .enumerate()
    {
        secrets.add(&format!("line {} of the admin's private key", i + 1), l);
    }

    for (who, log) in [
        ("carina-controller", &controller_log),
        ("carina-node", &node_log),
    ] {
        let text = std::fs::read_to_string(log)?;
        // The logs are as loud as asked, and the work went through them.
        assert!(
            text.lines().filter(|l| l.contains("DEBUG")).count() > 10,
            "{who} did not log at debug level:\n{}",
            tail(log, 20)
        );
        let found = secrets.found_in(&text);
        assert!(
            found.is_empty(),
            "{who}'s log ({}) holds {}",
            log.display(),
            found.join(", ")
        );
    }
    Ok(())
}

/// The check itself finds what it looks for (a test that cannot fail
/// proves nothing).
#[test]
fn the_check_finds_each_kind_of_secret() {
    let key = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----\n";
    let mut secrets = Secrets(Vec::new());
    secrets.add(
        "token",
        "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJlLXBhcnQ",
    );
    for l in pem_body_lines(key) {
        secrets.add("key line", &l);
    }
    assert!(
        secrets
            .found_in("INFO all good\nAuthorization: Bearer <masked>\n")
            .is_empty()
    );
    assert_eq!(
        secrets.found_in("DEBUG token=eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJlLXBhcnQ"),
        ["token"]
    );
    assert_eq!(
        secrets.found_in("key: MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg"),
        ["key line"]
    );
    assert_eq!(secrets.found_in(key), ["key line", "a PEM private key"]);
    assert_eq!(
        secrets.found_in("authorization: Bearer abc.def"),
        ["a Bearer credential"]
    );
}
