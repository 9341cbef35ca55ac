//! `carina-controller`: the CSI controller. Serves CSI Identity and
//! Controller on a unix socket for the CSI sidecars (or csi-sanity) and
//! provisions through a control plane:
//!
//! - `--mode direct`: a static node list (`--nodes nodes.yaml`), each
//!   node's NodeStorage reached over mutual TLS with a client certificate
//!   of role `controller`. No Kubernetes needed.
//! - `--mode kube`: every replica serves CSI through `KubeProvisioner`
//!   (`LogicVolume` objects, awaited by watch); the replica holding the
//!   Lease `--leader-election-namespace`/`--lease-name` also runs the
//!   bridge side (the `LogicVolume` reconciler, the capacity publisher and
//!   the config push), reaching the nodes over mutual TLS as in direct
//!   mode. The API is reached through `--kubeconfig`, else `KUBECONFIG`
//!   or the in-cluster service account.
//!
//! In kube mode the controller also keeps the node-identity CA (the Secret
//! `--identity-ca-secret`, published in the ConfigMap
//! `--identity-ca-configmap`) when it serves the issuer
//! (`--identity-listen`) or needs its own client certificate: without
//! `--tls-cert/--tls-key` it signs one for itself from that CA and renews
//! it, and verifies the nodes against that CA unless `--tls-ca` is given.
//!
//! Every flag has an environment fallback. SIGTERM or SIGINT: stop
//! accepting, let in-flight calls finish (bounded by
//! `--shutdown-grace-secs`), remove the socket; in kube mode stop the led
//! work and release the lease; exit 0.
//!
//! This file holds the flags, the signal handling, direct mode and the CSI
//! serving both modes share; [`kube_mode`] runs kube mode.

mod kube_mode;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use carina_controlplane::direct::DirectProvisioner;
use carina_controlplane::identity::limit::DEFAULT_BURST;
use carina_controlplane::identity::review::DEFAULT_NODE_DAEMONSET;
use carina_controlplane::identity::{DEFAULT_AUDIENCE, parse_ttl};
use carina_controlplane::kube::endpoints::DEFAULT_NODE_PORT;
use carina_controlplane::metrics::metrics;
use carina_controlplane::nodes::spec::NodeList;
use carina_controlplane::serve::{bind_unix, serve_controller, socket_path};
use carina_csi::Provisioner;
use carina_csi::strategy::Strategy;
use carina_proto::tls::{ClientTls, DEFAULT_TRUST_DOMAIN};
use clap::{Parser, Subcommand, ValueEnum};
use tokio::sync::watch;

use kube_mode::run_kube;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// A static node list, no Kubernetes.
    Direct,
    /// LogicVolume objects in Kubernetes, made by the bridge.
    Kube,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions (LogicVolume, NodeStorageResource)
    /// as YAML, the same text as deploy/crds/.
    Crds,
}

#[derive(Debug, Parser)]
#[command(name = "carina-controller", version, about = "Carina CSI controller")]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,

    /// Serve Prometheus metrics at `http://<address>/metrics` (e.g.
    /// `0.0.0.0:9090`); none when unset.
    #[arg(long, env = "CARINA_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,

    /// The control plane that places and makes volumes.
    #[arg(
        long,
        env = "CARINA_CONTROLLER_MODE",
        value_enum,
        default_value = "direct"
    )]
    mode: Mode,

    /// Direct mode: the node list (YAML: nodes: [{name, endpoint, topology}]).
    #[arg(long, env = "CARINA_NODES")]
    nodes: Option<PathBuf>,

    /// The CSI socket (unix:///path or a path); a stale socket is replaced.
    #[arg(
        long,
        env = "CSI_ENDPOINT",
        default_value = "unix:///tmp/carina-controller.sock"
    )]
    csi_endpoint: String,

    /// CA that signed the nodes' server certificates (PEM).
    #[arg(long, env = "CARINA_TLS_CA")]
    tls_ca: Option<PathBuf>,

    /// Client certificate with URI SAN spiffe://<domain>/carina/controller (PEM).
    #[arg(long, env = "CARINA_TLS_CERT")]
    tls_cert: Option<PathBuf>,

    /// Key of the client certificate (PEM).
    #[arg(long, env = "CARINA_TLS_KEY")]
    tls_key: Option<PathBuf>,

    /// Where new volumes go among the nodes that fit: binpack fills the
    /// fullest node first, spreadout uses the emptiest.
    #[arg(long, env = "CARINA_SCHEDULER_STRATEGY", default_value = "spreadout")]
    strategy: Strategy,

    /// Seconds one NodeStorage call may take.
    #[arg(long, env = "CARINA_NODE_CALL_TIMEOUT_SECS", default_value_t = 120)]
    node_call_timeout_secs: u64,

    /// Kube mode: seconds a node stays NotReady before the pods annotated
    /// `carina.storage.io/allow-pod-migration-if-node-notready: "true"`
    /// lose their Carina claims (the data on that node is given up) and
    /// are deleted, to be made again on another node; 0 turns this off.
    #[arg(long, env = "CARINA_POD_MIGRATION_GRACE_SECS", default_value_t = 300)]
    pod_migration_grace_secs: u64,

    /// Seconds in-flight calls may run on after SIGTERM.
    #[arg(long, env = "CARINA_SHUTDOWN_GRACE_SECS", default_value_t = 20)]
    shutdown_grace_secs: u64,

    /// Kube mode: the kubeconfig file; without it, the in-cluster service
    /// account (or what `KUBECONFIG` names).
    #[arg(long, env = "CARINA_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,

    /// Kube mode: namespace of the leader-election Lease.
    #[arg(
        long,
        env = "CARINA_LEADER_ELECTION_NAMESPACE",
        default_value = "kube-system"
    )]
    leader_election_namespace: String,

    /// Kube mode: name of the leader-election Lease.
    #[arg(long, env = "CARINA_LEASE_NAME", default_value = "carina-controller")]
    lease_name: String,

    /// Kube mode: this replica's identity in the Lease (default: the pod's
    /// name from POD_NAME, else the host name).
    #[arg(long, env = "CARINA_IDENTITY")]
    identity: Option<String>,

    /// Kube mode: seconds a Lease stays valid after its last renewal.
    #[arg(long, env = "CARINA_LEASE_DURATION_SECS", default_value_t = 15)]
    lease_duration_secs: u64,

    /// Kube mode: seconds the leader keeps leading without a renewal.
    #[arg(long, env = "CARINA_RENEW_DEADLINE_SECS", default_value_t = 10)]
    renew_deadline_secs: u64,

    /// Kube mode: seconds between renewals (and attempts to acquire).
    #[arg(long, env = "CARINA_RETRY_PERIOD_SECS", default_value_t = 2)]
    retry_period_secs: u64,

    /// Kube mode: NodeStorage port on each Node's InternalIP (a Node's
    /// carina.storage.io/node-endpoint annotation overrides it).
    #[arg(long, env = "CARINA_NODE_PORT", default_value_t = DEFAULT_NODE_PORT)]
    node_port: u16,

    /// Kube mode: seconds CreateVolume, DeleteVolume and
    /// ControllerExpandVolume wait for the bridge's answer.
    #[arg(long, env = "CARINA_CREATE_TIMEOUT_SECS", default_value_t = 60)]
    create_timeout_secs: u64,

    /// Kube mode: the controller's own namespace: where it reads the
    /// `carina-csi-config` ConfigMap it pushes to the nodes, and keeps the
    /// identity CA Secret and ConfigMap.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    namespace: String,

    /// Kube mode: the kubernetes.io/tls Secret holding the node-identity
    /// CA (tls.crt, tls.key, optionally ca.crt); made with a new CA when
    /// missing, used as it is when provided.
    #[arg(long, env = "CARINA_IDENTITY_CA_SECRET", default_value = "carina-ca")]
    identity_ca_secret: String,

    /// Kube mode: the ConfigMap whose `ca.crt` the controller keeps equal
    /// to the CA certificate (the nodes mount it).
    #[arg(
        long,
        env = "CARINA_IDENTITY_CA_CONFIGMAP",
        default_value = "carina-ca"
    )]
    identity_ca_configmap: String,

    /// Kube mode: where to serve the node-identity issuer
    /// (carina.identity.v1.NodeIdentity over TLS), e.g. 0.0.0.0:7444;
    /// unset: no issuer.
    #[arg(long, env = "CARINA_IDENTITY_LISTEN")]
    identity_listen: Option<SocketAddr>,

    /// Kube mode: the audience node tokens must be issued for.
    #[arg(long, env = "CARINA_IDENTITY_AUDIENCE", default_value = DEFAULT_AUDIENCE)]
    identity_audience: String,

    /// Kube mode: `<namespace>:<name>` of the only ServiceAccount whose
    /// tokens may get node certificates (default: `<--namespace>:carina-node`).
    #[arg(long, env = "CARINA_IDENTITY_NODE_SERVICE_ACCOUNT")]
    identity_node_service_account: Option<String>,

    /// Kube mode: the DaemonSet (in the node ServiceAccount's namespace)
    /// that must control a pod asking for a node certificate.
    #[arg(long, env = "CARINA_IDENTITY_NODE_DAEMONSET", default_value = DEFAULT_NODE_DAEMONSET)]
    identity_node_daemonset: String,

    /// Kube mode: certificates one node (and one pod) may be issued at
    /// once; past them, one per --identity-rate-interval, and further
    /// requests are answered RESOURCE_EXHAUSTED.
    #[arg(long, env = "CARINA_IDENTITY_RATE_BURST", default_value_t = DEFAULT_BURST, value_parser = clap::value_parser!(u32).range(1..))]
    identity_rate_burst: u32,

    /// Kube mode: one more certificate per node and pod every interval
    /// (90s, 15m; default: a third of --identity-cert-ttl, at most 1m, so
    /// renewals at two thirds never run out).
    #[arg(long, env = "CARINA_IDENTITY_RATE_INTERVAL", value_parser = parse_interval)]
    identity_rate_interval: Option<Duration>,

    /// Kube mode: lifetime of issued certificates (90s, 15m, 24h, 7d);
    /// they are renewed at two thirds of it.
    #[arg(long, env = "CARINA_IDENTITY_CERT_TTL", default_value = "24h", value_parser = parse_ttl)]
    identity_cert_ttl: Duration,

    /// Kube mode: more DNS names for the issuer's certificate, comma
    /// separated (it always names carina-controller.<namespace>.svc and
    /// the Service's shorter and longer forms).
    #[arg(long, env = "CARINA_IDENTITY_SERVER_NAMES", value_delimiter = ',')]
    identity_server_names: Vec<String>,

    /// Kube mode: serve the pod webhook (Go Carina's: Pods with Carina
    /// claims go to --pod-webhook-scheduler) on the issuer's port, path
    /// /mutate-pods, and keep the caBundle of this
    /// MutatingWebhookConfiguration; needs --identity-listen. Empty: off.
    #[arg(long, env = "CARINA_POD_WEBHOOK_CONFIGURATION", default_value = "")]
    pod_webhook_configuration: String,

    /// Kube mode: the scheduler the pod webhook sends Pods with Carina
    /// claims to (the kube-scheduler profile with the Carina extender).
    #[arg(
        long,
        env = "CARINA_POD_WEBHOOK_SCHEDULER",
        default_value = "carina-scheduler"
    )]
    pod_webhook_scheduler: String,

    /// Trust domain of the controller's own SPIFFE ID
    /// (spiffe://<domain>/carina/controller) when it signs its certificate.
    #[arg(long, env = "CARINA_TRUST_DOMAIN", default_value = DEFAULT_TRUST_DOMAIN)]
    trust_domain: String,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(Command::Crds) = args.command {
        print!("{}", carina_api::crds_yaml());
        return Ok(());
    }
    let _telemetry = carina_proto::telemetry::init("carina-controller")?;
    if let Err(e) = run(args).await {
        tracing::error!(error = format!("{e:#}"), "carina-controller failed");
        return Err(e);
    }
    tracing::info!("carina-controller exits");
    Ok(())
}

fn required<'a>(value: &'a Option<PathBuf>, mode: &str, flag: &str) -> Result<&'a PathBuf> {
    value
        .as_ref()
        .with_context(|| format!("--mode {mode} needs {flag}"))
}

/// The client certificate for the nodes (role `controller`), checked.
fn client_tls(args: &Args, mode: &str) -> Result<ClientTls> {
    let tls = ClientTls::from_files(
        required(&args.tls_ca, mode, "--tls-ca")?,
        required(&args.tls_cert, mode, "--tls-cert")?,
        required(&args.tls_key, mode, "--tls-key")?,
        // Replaced by each node's name when connecting.
        String::new(),
    )
    .context("load the TLS CA, client certificate and key")?;
    tls.client_config()
        .context("the TLS CA, client certificate and key do not make a client config")?;
    Ok(tls)
}

async fn run(args: Args) -> Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    if let Some(addr) = args.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("--metrics-listen {addr}"))?;
        tracing::info!(carina.metrics.address = %addr, "serving /metrics");
        let mut stop = stop_rx.clone();
        tokio::spawn(carina_proto::metrics::serve(
            listener,
            carina_proto::metrics::CONTENT_TYPE,
            carina_proto::metrics::render_with(|| metrics().encode()),
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
        ));
    }
    tokio::spawn(async move {
        let signal = wait_for_signal().await;
        tracing::info!(
            signal,
            "received signal: no new calls, in-flight calls may finish"
        );
        let _ = stop_tx.send(true);
    });
    match args.mode {
        Mode::Direct => run_direct(args, stop_rx).await,
        Mode::Kube => run_kube(args, stop_rx).await,
    }
}

async fn run_direct(args: Args, stop: watch::Receiver<bool>) -> Result<()> {
    let nodes_path = required(&args.nodes, "direct", "--nodes")?;
    let nodes =
        NodeList::load(nodes_path).with_context(|| format!("--nodes {}", nodes_path.display()))?;
    let tls = client_tls(&args, "direct")?;
    for n in &nodes.nodes {
        tracing::info!(k8s.node.name = %n.name, carina.node.endpoint = %n.endpoint, topology = ?n.topology, "node");
    }
    let provisioner = DirectProvisioner::new(nodes, tls, args.strategy)
        .call_timeout(Duration::from_secs(args.node_call_timeout_secs));
    let count = provisioner.nodes().nodes.len();
    serve_csi(&args, provisioner, stop, || {
        tracing::info!(
            carina.csi.endpoint = %args.csi_endpoint,
            mode = "direct",
            strategy = %args.strategy,
            nodes = count,
            "carina-controller serving CSI Identity and Controller"
        );
    })
    .await
}

/// A rate interval: a lifetime as `--identity-cert-ttl` takes, or `0s`
/// (no limit).
fn parse_interval(input: &str) -> Result<Duration, String> {
    if input.trim().trim_end_matches('s') == "0" {
        return Ok(Duration::ZERO);
    }
    parse_ttl(input)
}

/// Serves CSI Identity and Controller over `provisioner` until `stop`,
/// then lets in-flight calls finish within `--shutdown-grace-secs` and
/// removes the socket. `started` logs once the socket is bound.
async fn serve_csi<P: Provisioner>(
    args: &Args,
    provisioner: P,
    mut stop: watch::Receiver<bool>,
    started: impl FnOnce(),
) -> Result<()> {
    let listener = bind_unix(&args.csi_endpoint)?;
    let socket = socket_path(&args.csi_endpoint)?;
    started();
    let mut stopping = stop.clone();
    let serve = serve_controller(listener, Arc::new(provisioner), async move {
        let _ = stop.wait_for(|s| *s).await;
    });
    let grace = Duration::from_secs(args.shutdown_grace_secs);
    let deadline = async move {
        let _ = stopping.wait_for(|s| *s).await;
        tokio::time::sleep(grace).await;
    };
    let result = tokio::select! {
        r = serve => r.context("CSI server"),
        _ = deadline => {
            tracing::warn!(grace_period = ?grace, "grace period over: dropping the calls still running");
            Ok(())
        }
    };
    let _ = std::fs::remove_file(&socket);
    result
}

/// The name of the first SIGTERM or SIGINT.
async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; only SIGINT stops the controller");
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        }
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}
