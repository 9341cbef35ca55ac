//! `carina-controller`: the CSI controller. Serves CSI Identity and
//! Controller on a unix socket for the CSI sidecars (or csi-sanity) and
//! provisions through a control plane:
//!
//! - `--mode direct`: a static node list (`--nodes nodes.yaml`), each
//!   node's NodeStorage reached over mutual TLS with a client certificate
//!   of role `controller`. No Kubernetes needed.
//! - `--mode kube`: not in this build yet.
//!
//! Every flag has an environment fallback. SIGTERM or SIGINT: stop
//! accepting, let in-flight calls finish (bounded by
//! `--shutdown-grace-secs`), remove the socket, exit 0.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use carina_controlplane::direct::{DirectProvisioner, NodeList, Strategy};
use carina_controlplane::serve::{bind_unix, serve_controller, socket_path};
use carina_proto::tls::ClientTls;
use clap::{Parser, Subcommand, ValueEnum};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// A static node list, no Kubernetes.
    Direct,
    /// LogicVolume objects in Kubernetes (not in this build yet).
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
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if let Some(Command::Crds) = args.command {
        print!("{}", carina_controlplane::crd::crds_yaml());
        return Ok(());
    }
    let _telemetry = carina_proto::telemetry::init("carina-controller")?;
    if let Err(e) = run(args).await {
        tracing::error!(error = format!("{e:#}"), "carina-controller failed");
        return Err(e);
    }
    Ok(())
}

fn required<'a>(value: &'a Option<PathBuf>, flag: &str) -> Result<&'a PathBuf> {
    value
        .as_ref()
        .with_context(|| format!("--mode direct needs {flag}"))
}

async fn run(args: Args) -> Result<()> {
    if args.mode == Mode::Kube {
        bail!(
            "--mode kube is not in this build yet (the Kubernetes control plane comes later); use --mode direct with --nodes"
        );
    }
    let nodes_path = required(&args.nodes, "--nodes")?;
    let nodes =
        NodeList::load(nodes_path).with_context(|| format!("--nodes {}", nodes_path.display()))?;
    let tls = ClientTls::from_files(
        required(&args.tls_ca, "--tls-ca")?,
        required(&args.tls_cert, "--tls-cert")?,
        required(&args.tls_key, "--tls-key")?,
        // Replaced by each node's name when connecting.
        String::new(),
    )
    .context("load the TLS CA, client certificate and key")?;
    tls.client_config()
        .context("the TLS CA, client certificate and key do not make a client config")?;
    for n in &nodes.nodes {
        tracing::info!(node.name = %n.name, node.endpoint = %n.endpoint, topology = ?n.topology, "node");
    }
    let provisioner = DirectProvisioner::new(nodes, tls, args.strategy)
        .call_timeout(Duration::from_secs(args.node_call_timeout_secs));

    let listener = bind_unix(&args.csi_endpoint)?;
    let socket = socket_path(&args.csi_endpoint)?;
    tracing::info!(
        csi.endpoint = %args.csi_endpoint,
        mode = "direct",
        strategy = %args.strategy,
        nodes = provisioner.nodes().nodes.len(),
        "carina-controller serving CSI Identity and Controller"
    );

    let (stop_tx, mut stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        let signal = wait_for_signal().await;
        tracing::info!(
            signal,
            "received signal: no new calls, in-flight calls may finish"
        );
        let _ = stop_tx.send(true);
    });
    let mut stopping = stop_rx.clone();
    let serve = serve_controller(listener, Arc::new(provisioner), async move {
        let _ = stop_rx.wait_for(|s| *s).await;
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
    tracing::info!("carina-controller exits");
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
