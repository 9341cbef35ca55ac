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
//! Every flag has an environment fallback. SIGTERM or SIGINT: stop
//! accepting, let in-flight calls finish (bounded by
//! `--shutdown-grace-secs`), remove the socket; in kube mode stop the led
//! work and release the lease; exit 0.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use carina_controlplane::direct::DirectProvisioner;
use carina_controlplane::kube::bridge_side::{self, BridgeConfig};
use carina_controlplane::kube::endpoints::DEFAULT_NODE_PORT;
use carina_controlplane::kube::leader::{LeaderElector, LeaseConfig, while_leading};
use carina_controlplane::kube::provisioner::{KubeProvisioner, KubeProvisionerConfig};
use carina_controlplane::nodes::spec::NodeList;
use carina_controlplane::serve::{bind_unix, serve_controller, socket_path};
use carina_csi::Provisioner;
use carina_csi::strategy::Strategy;
use carina_proto::tls::ClientTls;
use clap::{Parser, Subcommand, ValueEnum};
use tokio::sync::{oneshot, watch};

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
        tracing::info!(node.name = %n.name, node.endpoint = %n.endpoint, topology = ?n.topology, "node");
    }
    let provisioner = DirectProvisioner::new(nodes, tls, args.strategy)
        .call_timeout(Duration::from_secs(args.node_call_timeout_secs));
    let count = provisioner.nodes().nodes.len();
    serve_csi(&args, provisioner, stop, || {
        tracing::info!(
            csi.endpoint = %args.csi_endpoint,
            mode = "direct",
            strategy = %args.strategy,
            nodes = count,
            "carina-controller serving CSI Identity and Controller"
        );
    })
    .await
}

/// This replica's Lease identity: `--identity`, else `POD_NAME`, else the
/// host name (a pod's host name is its name).
fn identity(
    flag: Option<&str>,
    pod_name: Option<String>,
    hostname: impl FnOnce() -> Option<String>,
) -> Option<String> {
    let nonempty = |s: &String| !s.trim().is_empty();
    flag.map(str::to_string)
        .filter(nonempty)
        .or(pod_name.filter(nonempty))
        .or_else(|| hostname().filter(nonempty))
        .map(|s| s.trim().to_string())
}

async fn run_kube(args: Args, stop: watch::Receiver<bool>) -> Result<()> {
    let tls = client_tls(&args, "kube")?;
    // `--kubeconfig`, else `KUBECONFIG`, `~/.kube/config` or the in-cluster
    // service account.
    let client = carina_api::client::connect(args.kubeconfig.as_deref()).await?;
    let identity = identity(
        args.identity.as_deref(),
        std::env::var("POD_NAME").ok(),
        || std::fs::read_to_string("/proc/sys/kernel/hostname").ok(),
    )
    .context("no --identity, POD_NAME or host name for the leader-election Lease")?;
    let lease = LeaseConfig {
        lease_duration: Duration::from_secs(args.lease_duration_secs),
        renew_deadline: Duration::from_secs(args.renew_deadline_secs),
        retry_period: Duration::from_secs(args.retry_period_secs),
        ..LeaseConfig::new(&args.leader_election_namespace, &args.lease_name, &identity)
    };
    let elector = LeaderElector::new(client.clone(), lease.clone())?;
    let bridge_config = BridgeConfig {
        node_port: args.node_port,
        call_timeout: Duration::from_secs(args.node_call_timeout_secs),
        instance: Some(identity.clone()),
        ..BridgeConfig::new(tls)
    };
    let provisioner = KubeProvisioner::new(
        client.clone(),
        KubeProvisionerConfig {
            strategy: args.strategy,
            wait_timeout: Duration::from_secs(args.create_timeout_secs),
        },
    );

    // The led work gets the margin between stepping down and the lease
    // running out to stop; then the lease is released.
    let margin = lease.lease_duration.saturating_sub(lease.renew_deadline);
    let mut work_stop = stop.clone();
    let leadership = tokio::spawn(async move {
        let (leading_tx, leading_rx) = watch::channel(false);
        let (work_done, work_stopped) = oneshot::channel::<()>();
        let elect = elector.run(leading_tx, async {
            let _ = work_stopped.await;
        });
        let work = async move {
            while_leading(
                leading_rx,
                async move {
                    let _ = work_stop.wait_for(|s| *s).await;
                },
                margin,
                |stop_leading| {
                    let (client, config) = (client.clone(), bridge_config.clone());
                    async move {
                        if let Err(e) = bridge_side::run(client, config, stop_leading).await {
                            tracing::error!(error = %e, "the bridge failed");
                        }
                    }
                },
            )
            .await;
            let _ = work_done.send(());
        };
        tokio::join!(elect, work);
    });

    let served = serve_csi(&args, provisioner, stop, || {
        tracing::info!(
            csi.endpoint = %args.csi_endpoint,
            mode = "kube",
            strategy = %args.strategy,
            lease = %format!("{}/{}", lease.namespace, lease.name),
            lease.identity = %lease.identity,
            "carina-controller serving CSI Identity and Controller; the bridge runs while leading"
        );
    })
    .await;
    // The led work stops on the same signal; wait for it and the release.
    let bound = margin + lease.renew_deadline;
    if tokio::time::timeout(bound, leadership).await.is_err() {
        tracing::warn!(waited = ?bound, "the led work or the lease release did not finish in time");
    }
    served
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_falls_back_to_pod_then_host_name() {
        let host = || Some("host-1\n".to_string());
        assert_eq!(
            identity(Some("me"), Some("pod".into()), host).as_deref(),
            Some("me")
        );
        assert_eq!(
            identity(None, Some("pod".into()), host).as_deref(),
            Some("pod")
        );
        assert_eq!(identity(Some(""), None, host).as_deref(), Some("host-1"));
        assert_eq!(identity(None, Some(" ".into()), || None), None);
    }

    #[test]
    fn kube_flags_have_defaults() {
        let args = Args::try_parse_from(["carina-controller", "--mode", "kube"]).expect("parses");
        assert_eq!(args.mode, Mode::Kube);
        assert_eq!(args.leader_election_namespace, "kube-system");
        assert_eq!(args.lease_name, "carina-controller");
        assert_eq!(args.node_port, 7443);
        assert_eq!(args.create_timeout_secs, 60);
        assert_eq!(args.kubeconfig, None);
    }
}
