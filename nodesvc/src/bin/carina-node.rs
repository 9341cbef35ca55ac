//! `carina-node`: the node daemon. Starts the storage engine on the
//! node's device groups and serves `NodeStorage` over mutual TLS, CSI
//! Identity and Node on a unix socket (`--csi-endpoint`), and `/metrics`.
//! With `--plugin-registration-dir` it registers the CSI socket with
//! kubelet itself (no registrar sidecar). Every flag has an environment
//! fallback.
//!
//! The server certificate comes either from files (`--tls-cert`,
//! `--tls-key`, reloaded when they change) or from the control plane's
//! issuer (`--identity-issuer`): then NodeStorage is served once the first
//! certificate arrives, and it is renewed in memory at two thirds of its
//! lifetime. `--tls-ca` verifies the clients (and the issuer).
//!
//! SIGTERM or SIGINT: remove the registration socket (kubelet deregisters
//! the plugin), stop accepting, let in-flight calls finish (bounded by
//! `--shutdown-grace-secs`), exit 0.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use carina_node::csi_local::registration::{PluginRegistration, advertised_endpoint};
use carina_node::csi_local::serve::{CsiNodeServer, bind};
use carina_node::engine::bcache::BcacheOptions;
use carina_node::engine::lvm::LvmOptions;
use carina_node::engine::{Config, Engine, EngineOptions, Policy};
use carina_node::identity::{self, Backoff, DEFAULT_TOKEN_FILE, IdentityOptions};
use carina_node::server::metrics::Metrics;
use carina_node::server::{NodeServer, metrics};
use carina_proto::tls::{
    DEFAULT_TRUST_DOMAIN, RELOAD_INTERVAL, ReloadingServerConfig, ServerTlsFiles,
};
use clap::Parser;
use tokio::net::TcpListener;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

#[derive(Debug, Parser)]
#[command(name = "carina-node", version, about = "Carina node storage daemon")]
struct Args {
    /// Device-group configuration (Carina's config.json). Without it the
    /// node starts with no groups and waits for ApplyConfig.
    #[arg(long, env = "CARINA_CONFIG")]
    config: Option<PathBuf>,

    /// This node's name; the server certificate must carry it as a DNS SAN.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,

    /// Address of the NodeStorage gRPC service.
    #[arg(long, env = "CARINA_LISTEN", default_value = "0.0.0.0:7443")]
    listen: SocketAddr,

    /// Server certificate (PEM); reloaded when it changes. Not with
    /// --identity-issuer.
    #[arg(
        long,
        env = "CARINA_TLS_CERT",
        required_unless_present = "identity_issuer",
        conflicts_with = "identity_issuer"
    )]
    tls_cert: Option<PathBuf>,

    /// Server private key (PEM); reloaded when it changes. Not with
    /// --identity-issuer.
    #[arg(
        long,
        env = "CARINA_TLS_KEY",
        required_unless_present = "identity_issuer",
        conflicts_with = "identity_issuer"
    )]
    tls_key: Option<PathBuf>,

    /// CA that signs client certificates (PEM); reloaded when it changes.
    /// With --identity-issuer it also verifies the issuer, and a changed
    /// bundle is taken only if a CA the node trusts endorses each new CA
    /// in it (ca-endorsements.crt beside it; the trusted bundle is pinned
    /// in --state-dir).
    #[arg(long, env = "CARINA_TLS_CA")]
    tls_ca: PathBuf,

    /// Get the server certificate from the control plane's issuer
    /// (https://carina-controller.<namespace>.svc:7444) with a CSR and the
    /// pod's token, instead of --tls-cert/--tls-key.
    #[arg(long, env = "CARINA_IDENTITY_ISSUER")]
    identity_issuer: Option<String>,

    /// The pod's projected ServiceAccount token for the issuer (audience
    /// carina.storage.io/node-identity); read at every request.
    #[arg(long, env = "CARINA_IDENTITY_TOKEN_FILE", default_value = DEFAULT_TOKEN_FILE)]
    identity_token_file: PathBuf,

    /// Trust domain of client SPIFFE IDs (spiffe://<domain>/carina/<role>).
    #[arg(long, env = "CARINA_TRUST_DOMAIN", default_value = DEFAULT_TRUST_DOMAIN)]
    trust_domain: String,

    /// Unix socket for the CSI Identity and Node services
    /// (`unix:///csi/csi.sock` or a path); not served when unset.
    #[arg(long, env = "CSI_ENDPOINT")]
    csi_endpoint: Option<String>,

    /// kubelet's plugin registration directory
    /// (`<kubelet dir>/plugins_registry`, mounted at the same path). When
    /// set, the node registers its CSI socket with kubelet by serving
    /// kubelet's plugin-registration API on
    /// `<dir>/carina.storage.io-reg.sock`. Needs --csi-endpoint; the
    /// directory must exist.
    #[arg(long, env = "CARINA_PLUGIN_REGISTRATION_DIR")]
    plugin_registration_dir: Option<PathBuf>,

    /// The CSI socket kubelet is told to dial, as a path on the host
    /// (default: the path of --csi-endpoint, right when the pod mounts the
    /// socket's directory at the host's path).
    #[arg(long, env = "CARINA_PLUGIN_REGISTRATION_ENDPOINT")]
    plugin_registration_endpoint: Option<String>,

    /// NodeGetInfo's max_volumes_per_node (0: no limit).
    #[arg(long, env = "CARINA_MAX_VOLUMES", default_value_t = 0)]
    max_volumes: u64,

    /// Address of the plain-HTTP /metrics endpoint.
    #[arg(long, env = "CARINA_METRICS_LISTEN", default_value = "127.0.0.1:9180")]
    metrics_listen: SocketAddr,

    /// Seconds in-flight calls may run on after SIGTERM.
    #[arg(long, env = "CARINA_SHUTDOWN_GRACE_SECS", default_value_t = 20)]
    shutdown_grace_secs: u64,

    /// Run lvm commands through one persistent `lvm` shell (`true`), or as
    /// a process per command (`false`).
    #[arg(long, env = "CARINA_LVM_SHELL", default_value_t = true, action = clap::ArgAction::Set)]
    lvm_shell: bool,

    /// The node's state directory (on the host, kept across restarts):
    /// the bcache devices' records live in `<dir>/bcache`, each volume's
    /// creation trace in `<dir>/traces`.
    #[arg(long, env = "CARINA_STATE_DIR", default_value = "/var/lib/carina")]
    state_dir: PathBuf,

    /// The sysfs root the bcache driver is driven through.
    #[arg(long, env = "CARINA_SYSFS_ROOT", default_value = "/sys")]
    sysfs_root: PathBuf,

    /// Where the cgroup hierarchies are mounted: pods' IO limits are
    /// written into their cgroups there (cgroup v1 blkio or v2 io).
    #[arg(long, env = "CARINA_CGROUP_ROOT", default_value = carina_node::engine::iolimits::DEFAULT_CGROUP_ROOT)]
    cgroup_root: PathBuf,

    /// Seconds a copy (CopyLV: a clone or a snapshot) may keep its
    /// source's mounted filesystem frozen; the copy is stopped and the
    /// filesystem thawed when they are up.
    #[arg(long, env = "CARINA_COPY_FREEZE_TIMEOUT_SECS", default_value_t = carina_node::engine::copy::DEFAULT_FREEZE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    copy_freeze_timeout_secs: u64,
}

#[tokio::main]
pub async fn main() -> Result<()> {
    let args = Args::parse();
    let _telemetry = carina_proto::telemetry::init("carina-node")?;
    if let Err(e) = run(args).await {
        tracing::error!(error = format!("{e:#}"), "carina-node failed");
        return Err(e);
    }
    Ok(())
}

async fn run(args: Args) -> Result<()> {
    // Checked first: a missing directory is a deployment mistake.
    let registration = plugin_registration(&args)?;
    let config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("read --config {}", path.display()))?;
            Config::from_json(&text).with_context(|| format!("--config {}", path.display()))?
        }
        None => {
            tracing::info!("no --config: starting without device groups, waiting for ApplyConfig");
            Config::default()
        }
    };
    // Files: loaded now, a failure is fatal. Issued: after start-up.
    let file_tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            ReloadingServerConfig::watch(
                ServerTlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    ca: args.tls_ca.clone(),
                },
                RELOAD_INTERVAL,
            )
            .context("load TLS certificate, key and CA")?,
        ),
        _ => None,
    };

    let engine = Engine::start(
        config.clone(),
        EngineOptions {
            device_mapper: None,
            lvm: LvmOptions {
                shell: args.lvm_shell,
                ..LvmOptions::default()
            },
            bcache: BcacheOptions {
                sysfs_root: args.sysfs_root.clone(),
                state_dir: Some(args.state_dir.clone()),
                ..BcacheOptions::default()
            },
            cgroup_root: Some(args.cgroup_root.clone()),
            trace_dir: Some(args.state_dir.join("traces")),
            copy_dir: Some(args.state_dir.join("copies")),
            intent_dir: Some(args.state_dir.join("intents")),
            freeze_timeout: Some(Duration::from_secs(args.copy_freeze_timeout_secs)),
        },
    )
    .await
    .context("start the storage engine")?;
    log_summary(&args, &config, &engine).await;
    let _rescan = engine.spawn_periodic_rescan();

    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    // The TCP ports are taken before the CSI socket appears: kubelet (and
    // anyone else) takes that socket as "the node is up", so a port that
    // is already in use must fail the start before it, not after.
    let metrics_listener = TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("listen on {} (metrics)", args.metrics_listen))?;
    // With certificate files NodeStorage is served at once, so its port is
    // taken now too. With an issuer it is taken once the certificate
    // arrives: until then a client is refused, not left in a handshake
    // nobody answers.
    let mut storage_listener = match &file_tls {
        Some(_) => Some(listen_storage(args.listen).await?),
        None => None,
    };

    let csi_task = match &args.csi_endpoint {
        Some(endpoint) => {
            let listener = bind(endpoint)?;
            let csi = CsiNodeServer::new(engine.clone(), args.node_name.clone())
                .max_volumes(args.max_volumes)
                .grace_period(Duration::from_secs(args.shutdown_grace_secs));
            let serve = csi.serve(listener, stopped(stop_rx.clone()));
            let stop = stop_tx.clone();
            Some(tokio::spawn(async move {
                let result = serve.await;
                if let Err(e) = &result {
                    // Without CSI the node is useless to kubelet: stop all.
                    tracing::error!(error = %e, "CSI server failed; stopping");
                    let _ = stop.send(true);
                }
                result
            }))
        }
        None => {
            tracing::info!("no --csi-endpoint: CSI Identity and Node are not served");
            None
        }
    };

    let server = NodeServer::new(engine.clone(), args.node_name.clone())
        .trust_domain(args.trust_domain.clone())
        .grace_period(Duration::from_secs(args.shutdown_grace_secs));
    let metrics_task = tokio::spawn(metrics::serve(
        metrics_listener,
        server.metrics(),
        engine.clone(),
        args.node_name.clone(),
        stopped(stop_rx.clone()),
    ));
    tracing::info!(carina.metrics.address = %args.metrics_listen, "serving /metrics");

    // Installed before the registration socket exists, so a SIGTERM from
    // here on removes it.
    let term = signal(SignalKind::terminate());
    let signal_stop = stop_tx.clone();
    tokio::spawn(async move {
        let signal = wait_for_signal(term).await;
        tracing::info!(signal, "received signal");
        let _ = signal_stop.send(true);
    });

    // Last: kubelet dials the CSI socket as soon as it sees this one, and
    // the CSI socket is serving by now (NodeStorage, which kubelet does not
    // use, may still wait below for its certificate).
    let registration_task = match registration {
        Some(registration) => {
            let socket = registration.bind()?;
            let serve = registration.serve(socket, server.metrics(), stopped(stop_rx.clone()));
            let stop = stop_tx.clone();
            Some(tokio::spawn(async move {
                let result = serve.await;
                if let Err(e) = &result {
                    // kubelet could no longer re-register the plugin.
                    tracing::error!(error = %e, "plugin registration server failed; stopping");
                    let _ = stop.send(true);
                }
                result
            }))
        }
        None => None,
    };

    let tls = match (file_tls, &args.identity_issuer) {
        (Some(tls), _) => Some(tls),
        (None, Some(issuer)) => issued_tls(&args, issuer, server.metrics(), stop_rx.clone()).await,
        // clap requires one of the two.
        (None, None) => anyhow::bail!("give --tls-cert and --tls-key, or --identity-issuer"),
    };
    if let Some(tls) = tls {
        let listener = match storage_listener.take() {
            Some(listener) => listener,
            None => listen_storage(args.listen).await?,
        };
        server.serve(listener, tls, stopped(stop_rx)).await?;
    } else {
        tracing::info!("stopped before a certificate arrived: NodeStorage was never served");
    }
    if let Some(task) = registration_task {
        task.await.context("plugin registration task")??;
    }
    let _ = metrics_task.await;
    if let Some(task) = csi_task {
        task.await.context("CSI server task")??;
    }
    tracing::info!("carina-node exits");
    Ok(())
}

/// The NodeStorage listener on `addr`.
async fn listen_storage(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("listen on {addr} (NodeStorage)"))
}

/// The first certificate from the issuer (asked for until it comes, or
/// `None` when stopped first) as a server config kept renewed.
async fn issued_tls(
    args: &Args,
    issuer: &str,
    metrics: Arc<Metrics>,
    stop: watch::Receiver<bool>,
) -> Option<ReloadingServerConfig> {
    let options = IdentityOptions {
        issuer: issuer.to_string(),
        node_name: args.node_name.clone(),
        token_file: args.identity_token_file.clone(),
        ca_file: args.tls_ca.clone(),
        pin_file: Some(args.state_dir.join(identity::trust::PIN_FILE)),
        backoff: Backoff::default(),
        metrics,
    };
    tracing::info!(
        issuer,
        token_file = %args.identity_token_file.display(),
        "asking the issuer for the node certificate; NodeStorage is served once it arrives"
    );
    let mut waiting = stop.clone();
    let mut trust = options.trusted_ca();
    let (first, config) = identity::obtain(&options, &mut trust, &mut waiting).await?;
    let (updater, tls) = ReloadingServerConfig::updatable(config);
    tokio::spawn(identity::keep_renewed(options, trust, first, updater, stop));
    Some(tls)
}

async fn log_summary(args: &Args, config: &Config, engine: &Engine) {
    let activation = if engine.device_mapper() {
        "device-mapper"
    } else {
        "loop (no device-mapper in this kernel)"
    };
    for group in &config.groups {
        let patterns: Vec<&str> = group.patterns.iter().map(|r| r.as_str()).collect();
        tracing::info!(
            carina.group = %group.name,
            policy = %group.policy,
            disks = ?patterns,
            root = ?group.root,
            reserve_bytes = group.reserve_bytes,
            activation = %if group.policy == Policy::Lvm { format!("{:?}", group.activation) } else { "-".to_string() },
            "device group configured"
        );
    }
    let capacity = engine.subscribe().borrow().clone();
    for g in &capacity.groups {
        tracing::info!(
            carina.group = %g.group,
            volumes = g.volume_count,
            total_bytes = g.total_bytes,
            allocatable_bytes = g.allocatable_bytes,
            "device group ready"
        );
    }
    tracing::info!(
        k8s.node.name = %args.node_name,
        groups = config.groups.len(),
        lvm.activation = activation,
        lvm.shell = engine.lvm_options().shell,
        listen = %args.listen,
        trust_domain = %args.trust_domain,
        scan_interval = ?config.scan_interval,
        "carina-node starting"
    );
}

/// The kubelet registration the flags ask for, checked (None without
/// `--plugin-registration-dir`).
fn plugin_registration(args: &Args) -> Result<Option<PluginRegistration>> {
    let Some(dir) = &args.plugin_registration_dir else {
        if let Some(endpoint) = &args.plugin_registration_endpoint {
            tracing::warn!(
                endpoint,
                "--plugin-registration-endpoint without --plugin-registration-dir: not registering with kubelet"
            );
        }
        return Ok(None);
    };
    let endpoint = advertised_endpoint(
        args.csi_endpoint.as_deref(),
        args.plugin_registration_endpoint.as_deref(),
    )?;
    Ok(Some(PluginRegistration::new(dir, endpoint)?))
}

/// The name of the first SIGTERM (`term`, installed by the caller) or
/// SIGINT.
async fn wait_for_signal(term: std::io::Result<Signal>) -> &'static str {
    let mut term = match term {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; only SIGINT stops the node");
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        }
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}
