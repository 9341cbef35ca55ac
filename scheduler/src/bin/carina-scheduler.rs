//! `carina-scheduler`: the kube-scheduler HTTP extender. Watches the
//! cluster (claims, volumes, classes, `NodeStorageResource`s,
//! `LogicVolume`s, pods), serves `/filter` and `/prioritize` from that
//! cache, `/healthz`, and `/readyz` once the cache has listed everything.
//!
//! Usually a sidecar of kube-scheduler, reached on loopback (see
//! `deploy/scheduler/`). Every flag has an environment fallback. SIGTERM
//! or SIGINT stops it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use carina_csi::strategy::Strategy;
use carina_scheduler::cache::Cache;
use carina_scheduler::{Extender, server};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "carina-scheduler",
    version,
    about = "Carina kube-scheduler extender"
)]
struct Args {
    /// Address to serve the extender on.
    #[arg(
        long,
        env = "CARINA_SCHEDULER_LISTEN",
        default_value = "127.0.0.1:8099"
    )]
    listen: String,

    /// Kubeconfig file; without it the in-cluster configuration (or the
    /// usual kubeconfig discovery) is used.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,

    /// How to rank nodes that fit: binpack prefers the fullest node,
    /// spreadout the emptiest (Carina's schedulerStrategy).
    #[arg(long, env = "CARINA_SCHEDULER_STRATEGY", default_value = "spreadout")]
    strategy: Strategy,

    /// Longest wait, in milliseconds, for the node chosen for the previous
    /// pod to show in the cache before answering the next pod.
    #[arg(
        long,
        env = "CARINA_SCHEDULER_SETTLE_TIMEOUT_MS",
        default_value_t = 2000
    )]
    settle_timeout_ms: u64,

    /// Also serve `/metrics` on this address (the extender's own address
    /// serves it too, but is usually loopback, for kube-scheduler only).
    #[arg(long, env = "CARINA_SCHEDULER_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let _telemetry = carina_proto::telemetry::init("carina-scheduler")?;
    if let Err(e) = run(args).await {
        tracing::error!(error = format!("{e:#}"), "carina-scheduler failed");
        return Err(e);
    }
    Ok(())
}

async fn run(args: Args) -> Result<()> {
    let client = carina_api::client::connect(args.kubeconfig.as_deref()).await?;
    let cache = Arc::new(Cache::start(client));
    let extender = Arc::new(Extender::new(
        cache.clone(),
        args.strategy,
        Duration::from_millis(args.settle_timeout_ms),
    ));
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    tracing::info!(
        listen = %listener.local_addr()?,
        strategy = %args.strategy,
        "carina-scheduler serving /filter and /prioritize"
    );
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    if let Some(addr) = args.metrics_listen {
        let metrics_listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("--metrics-listen {addr}"))?;
        tracing::info!(carina.metrics.address = %addr, "serving /metrics");
        let extender = extender.clone();
        tokio::spawn(carina_proto::metrics::serve(
            metrics_listener,
            carina_scheduler::metrics::CONTENT_TYPE,
            carina_proto::metrics::render_with(move || extender.metrics().encode()),
            async move {
                let _ = stop_rx.wait_for(|s| *s).await;
            },
        ));
    }
    tokio::spawn({
        let cache = cache.clone();
        async move {
            cache.wait_synced().await;
            tracing::info!("caches synced: ready");
        }
    });
    server::serve(listener, extender, async {
        let signal = wait_for_signal().await;
        tracing::info!(signal, "received signal: stopping");
    })
    .await;
    let _ = stop_tx.send(true);
    tracing::info!("carina-scheduler exits");
    Ok(())
}

/// The name of the first SIGTERM or SIGINT.
async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; only SIGINT stops the extender");
            let _ = tokio::signal::ctrl_c().await;
            return "SIGINT";
        }
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "SIGINT",
    }
}
