//! The bridge side of the Kubernetes control plane, what the elected
//! leader runs: [`run`] starts the `LogicVolume` bridge, the capacity
//! publisher, the config push, the Pods' IO limits
//! ([`super::iolimits`]) and the pod migration ([`super::migration`])
//! over one Node watch and one NodeStorage client pool, and stops them
//! together; [`BridgeConfig`] configures them. It sits above the five
//! modules, which share helpers
//! ([`super::retry`], `super::status`, [`super::endpoints`]) but not each
//! other.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use carina_proto::tls::{ClientTls, LiveClientCert};
use kube::Client;
use tokio::sync::{mpsc, watch};

use super::bridge::{self, ControllerConfig, run_controller};
use super::capacity::Publisher;
use super::config_push::{CONFIG_MAP_NAME, ConfigPush, DEFAULT_CONFIG_NAMESPACE, PushConfig};
use super::endpoints::{DEFAULT_NODE_PORT, Nodes};
use super::retry::Backoff;
use crate::nodes::pool::{DEFAULT_CALL_TIMEOUT, NodeClients};

/// What [`run`] needs besides the Kubernetes client: the settings of the
/// bridge, the capacity publisher and the config push.
#[derive(Debug, Clone)]
pub struct BridgeConfig {
    /// Client certificate of role `controller`, the CA of the nodes'
    /// certificates; `server_name` is replaced by each node's name.
    pub tls: ClientTls,
    /// When set, the client certificate offered (renewed in place)
    /// instead of `tls`'s; `tls` still gives the CA.
    pub live_cert: Option<LiveClientCert>,
    /// NodeStorage port, used with a Node's `InternalIP` when the Node
    /// has no endpoint annotation.
    pub node_port: u16,
    /// `LogicVolume`s reconciled at once.
    pub concurrency: u16,
    /// Bound of one NodeStorage call.
    pub call_timeout: Duration,
    /// Only Nodes matching this label selector get a capacity record and
    /// configuration (all when `None`). Volumes are served on any node.
    pub node_selector: Option<String>,
    /// Namespace of the `carina-csi-config` ConfigMap.
    pub config_namespace: String,
    /// Name of that ConfigMap.
    pub config_name: String,
    /// Retries after transient errors (node unreachable, API errors), and
    /// capacity stream reconnects.
    pub retry: Backoff,
    /// Retry interval after errors that are neither transient nor
    /// terminal (`INTERNAL`, `FAILED_PRECONDITION`, ...).
    pub slow_retry: Duration,
    /// `reportingInstance` of the Events (e.g. the pod name).
    pub instance: Option<String>,
    /// How long a node stays NotReady before the Pods that allow it are
    /// moved off it ([`super::migration`]); `None` turns that off.
    pub pod_migration_grace: Option<Duration>,
}

/// The default of [`BridgeConfig::pod_migration_grace`]: as long as
/// Kubernetes lets a Pod stay on an unreachable node by default.
pub const DEFAULT_POD_MIGRATION_GRACE: Duration = Duration::from_secs(300);

impl BridgeConfig {
    /// Defaults: port [`DEFAULT_NODE_PORT`], 16 concurrent reconciles,
    /// [`DEFAULT_CALL_TIMEOUT`], all Nodes, ConfigMap
    /// `kube-system/carina-csi-config`, retries from 0.5 s to 30 s, slow
    /// retries every 5 minutes.
    pub fn new(tls: ClientTls) -> Self {
        BridgeConfig {
            tls,
            live_cert: None,
            node_port: DEFAULT_NODE_PORT,
            concurrency: 16,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            node_selector: None,
            config_namespace: DEFAULT_CONFIG_NAMESPACE.to_string(),
            config_name: CONFIG_MAP_NAME.to_string(),
            retry: Backoff::default(),
            slow_retry: Duration::from_secs(300),
            instance: None,
            pod_migration_grace: Some(DEFAULT_POD_MIGRATION_GRACE),
        }
    }
}

/// Runs the bridge, the capacity publisher, the config push and the IO
/// limits until
/// `shutdown` completes (the caller holds the leadership while this
/// runs), then lets in-flight work finish.
///
/// Errors only when `config.tls` is unusable; Kubernetes and node errors
/// are retried inside.
pub async fn run(
    client: Client,
    config: BridgeConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), bridge::Error> {
    match &config.live_cert {
        Some(live) => config.tls.client_config_live(live)?,
        None => config.tls.client_config()?,
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let clients = Arc::new(
        NodeClients::new(config.tls.clone())
            .live_cert(config.live_cert.clone())
            .call_timeout(config.call_timeout),
    );
    let (nodes, watch_nodes) = Nodes::watch(
        client.clone(),
        config.node_selector.as_deref(),
        config.node_port,
        stop_rx.clone(),
    );
    let (connected_tx, connected_rx) = mpsc::unbounded_channel();
    let capacity = Publisher::new(
        client.clone(),
        nodes.clone(),
        clients.clone(),
        connected_tx,
        config.retry,
    )
    .run(stop_rx.clone());
    let push_config = PushConfig {
        namespace: config.config_namespace.clone(),
        name: config.config_name.clone(),
        retry: config.retry,
        instance: config.instance.clone(),
    };
    let push = ConfigPush::new(
        client.clone(),
        nodes.clone(),
        clients.clone(),
        connected_rx,
        &push_config,
    )
    .run(stop_rx.clone());
    let controller_config = ControllerConfig {
        concurrency: config.concurrency,
        retry: config.retry,
        slow_retry: config.slow_retry,
        instance: config.instance.clone(),
    };
    let iolimits = super::iolimits::run(
        client.clone(),
        nodes.clone(),
        clients.clone(),
        config.retry,
        config.instance.clone(),
        stop_rx.clone(),
    );
    let migration = super::migration::run(
        client.clone(),
        nodes.clone(),
        config.pod_migration_grace,
        config.instance.clone(),
        stop_rx.clone(),
    );
    let bridge = run_controller(client, nodes, clients, &controller_config, stop_rx);
    tracing::info!(
        concurrency = config.concurrency,
        node.port = config.node_port,
        config_map = %format!("{}/{}", config.config_namespace, config.config_name),
        "bridge, capacity publisher, config push, IO limits and pod migration running"
    );
    let mut all = pin!(async {
        tokio::join!(watch_nodes, capacity, push, bridge, iolimits, migration);
    });
    let finished = tokio::select! {
        _ = shutdown => false,
        _ = &mut all => true,
    };
    if !finished {
        stop_tx.send_replace(true);
        all.await;
    }
    tracing::info!("bridge stopped");
    Ok(())
}
