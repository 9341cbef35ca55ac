//! Kube mode: the controller's identity settings and client certificate,
//! CSI served by every replica, and the bridge run by the Lease holder.

use std::time::Duration;

use anyhow::{Context, Result};
use carina_controlplane::identity::limit::RateSettings;
use carina_controlplane::identity::review::ServiceAccountRef;
use carina_controlplane::identity::store::CaLocation;
use carina_controlplane::identity::{self, IdentityConfig};
use carina_controlplane::kube::bridge_side::{self, BridgeConfig};
use carina_controlplane::kube::leader::{LeaderElector, LeaseConfig, while_leading};
use carina_controlplane::kube::podhook::{self, PodHook};
use carina_controlplane::kube::provisioner::{KubeProvisioner, KubeProvisionerConfig};
use carina_controlplane::metrics::metrics;
use carina_controlplane::nodes::pool::NodeClients;
use carina_proto::tls::{ClientTls, LiveClientCert};
use tokio::sync::{oneshot, watch};

use super::{Args, client_tls, serve_csi};

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

/// Whether the controller signs its own client certificate: neither
/// `--tls-cert` nor `--tls-key` given (one without the other is an error).
fn own_client_cert(args: &Args) -> Result<bool> {
    match (&args.tls_cert, &args.tls_key) {
        (None, None) => Ok(true),
        (Some(_), Some(_)) => Ok(false),
        _ => anyhow::bail!(
            "give both --tls-cert and --tls-key, or neither (then the controller signs its own from the identity CA)"
        ),
    }
}

/// The identity settings from the flags.
fn identity_config(
    args: &Args,
    own_client_cert: bool,
    pod_hook: Option<&PodHook>,
) -> Result<IdentityConfig> {
    let sa = args
        .identity_node_service_account
        .clone()
        .unwrap_or_else(|| format!("{}:carina-node", args.namespace));
    let node_service_account = ServiceAccountRef::parse(&sa)
        .map_err(|e| anyhow::anyhow!("--identity-node-service-account: {e}"))?;
    Ok(IdentityConfig {
        ca: CaLocation {
            namespace: args.namespace.clone(),
            secret: args.identity_ca_secret.clone(),
            configmap: args.identity_ca_configmap.clone(),
        },
        listen: args.identity_listen,
        audience: args.identity_audience.clone(),
        node_service_account,
        node_daemonset: args.identity_node_daemonset.clone(),
        rate: RateSettings {
            burst: args.identity_rate_burst,
            interval: args
                .identity_rate_interval
                .unwrap_or(RateSettings::for_ttl(args.identity_cert_ttl).interval),
        },
        cert_ttl: args.identity_cert_ttl,
        extra_server_names: args
            .identity_server_names
            .iter()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect(),
        own_client_cert,
        trust_domain: args.trust_domain.clone(),
        extra_routes: pod_hook.map(|h| h.clone().router()),
    })
}

/// The pod webhook when `--pod-webhook-configuration` names one.
fn pod_hook(args: &Args, client: &kube::Client) -> Result<Option<PodHook>> {
    if args.pod_webhook_configuration.is_empty() {
        return Ok(None);
    }
    anyhow::ensure!(
        args.identity_listen.is_some(),
        "--pod-webhook-configuration needs --identity-listen: the webhook is served on the issuer's port"
    );
    anyhow::ensure!(
        !args.pod_webhook_scheduler.trim().is_empty(),
        "--pod-webhook-scheduler is empty"
    );
    Ok(Some(PodHook::new(
        client.clone(),
        args.pod_webhook_scheduler.trim().to_string(),
    )))
}

/// The nodes' client TLS in kube mode: the files, or the controller's own
/// certificate from the identity CA (which then also verifies the nodes,
/// unless `--tls-ca` names another CA).
fn kube_client_tls(
    args: &Args,
    started: Option<&identity::Started>,
) -> Result<(ClientTls, Option<LiveClientCert>)> {
    let Some(live) = started.and_then(|s| s.client_cert.clone()) else {
        return Ok((client_tls(args, "kube")?, None));
    };
    let ca_pem = match &args.tls_ca {
        Some(path) => {
            std::fs::read(path).with_context(|| format!("read --tls-ca {}", path.display()))?
        }
        None => started
            .map(|s| s.ca_bundle_pem.clone().into_bytes())
            .unwrap_or_default(),
    };
    let tls = ClientTls {
        ca_pem,
        cert_pem: Vec::new(),
        key_pem: Vec::new(),
        server_name: String::new(),
    };
    tls.client_config_live(&live)
        .context("the CA does not make a client config")?;
    Ok((tls, Some(live)))
}

pub(super) async fn run_kube(args: Args, stop: watch::Receiver<bool>) -> Result<()> {
    let own_client_cert = own_client_cert(&args)?;
    if !own_client_cert {
        // Fail before touching the API when the files are unusable.
        client_tls(&args, "kube")?;
    }
    // `--kubeconfig`, else `KUBECONFIG`, `~/.kube/config` or the in-cluster
    // service account.
    let client = carina_api::client::connect(args.kubeconfig.as_deref()).await?;
    let pod_hook = pod_hook(&args, &client)?;
    let mut identity_started = if own_client_cert || args.identity_listen.is_some() {
        let config = identity_config(&args, own_client_cert, pod_hook.as_ref())?;
        Some(
            identity::start(client.clone(), config, stop.clone())
                .await
                .context("node identity")?,
        )
    } else {
        None
    };
    if let (Some(started), Some(_)) = (identity_started.as_mut(), &pod_hook) {
        tracing::info!(
            webhook.configuration = %args.pod_webhook_configuration,
            webhook.scheduler = %args.pod_webhook_scheduler,
            webhook.path = podhook::PATH,
            "serving the pod webhook"
        );
        started.tasks.push(tokio::spawn(podhook::ca_bundle::keep(
            client.clone(),
            args.pod_webhook_configuration.clone(),
            started.ca_bundle_pem.clone(),
            stop.clone(),
        )));
    }
    let (tls, live_cert) = kube_client_tls(&args, identity_started.as_ref())?;
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
        pod_migration_grace: (args.pod_migration_grace_secs > 0)
            .then(|| Duration::from_secs(args.pod_migration_grace_secs)),
        live_cert,
        config_namespace: args.namespace.clone(),
        ..BridgeConfig::new(tls)
    };
    // Every replica answers ListVolumes and ControllerGetVolume, so each
    // reads volume conditions from the nodes with the bridge's credentials.
    let condition_clients = NodeClients::new(bridge_config.tls.clone())
        .live_cert(bridge_config.live_cert.clone())
        .call_timeout(bridge_config.call_timeout);
    let provisioner = KubeProvisioner::new(
        client.clone(),
        KubeProvisionerConfig {
            strategy: args.strategy,
            wait_timeout: Duration::from_secs(args.create_timeout_secs),
        },
    )
    .with_node_access(condition_clients, bridge_config.node_port);

    // The led work gets the margin between stepping down and the lease
    // running out to stop; then the lease is released.
    let margin = lease.lease_duration.saturating_sub(lease.renew_deadline);
    let mut work_stop = stop.clone();
    let leadership = tokio::spawn(async move {
        let (leading_tx, leading_rx) = watch::channel(false);
        let mut observed = leading_rx.clone();
        tokio::spawn(async move {
            loop {
                metrics().set_leader(*observed.borrow_and_update());
                if observed.changed().await.is_err() {
                    metrics().set_leader(false);
                    return;
                }
            }
        });
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
            carina.csi.endpoint = %args.csi_endpoint,
            mode = "kube",
            strategy = %args.strategy,
            lease = %format!("{}/{}", lease.namespace, lease.name),
            carina.lease.identity = %lease.identity,
            "carina-controller serving CSI Identity and Controller; the bridge runs while leading"
        );
    })
    .await;
    // The led work stops on the same signal; wait for it and the release.
    let bound = margin + lease.renew_deadline;
    if tokio::time::timeout(bound, leadership).await.is_err() {
        tracing::warn!(waited = ?bound, "the led work or the lease release did not finish in time");
    }
    if let Some(started) = identity_started {
        // They stop on the same signal; the issuer lets calls finish.
        let all = futures::future::join_all(started.tasks);
        if tokio::time::timeout(Duration::from_secs(args.shutdown_grace_secs), all)
            .await
            .is_err()
        {
            tracing::warn!("the node identity issuer did not stop in time");
        }
    }
    served
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Mode;
    use clap::Parser;

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
        assert_eq!(args.namespace, "kube-system");
        assert_eq!(args.identity_ca_secret, "carina-ca");
        assert_eq!(args.identity_ca_configmap, "carina-ca");
        assert_eq!(args.identity_listen, None);
        assert_eq!(args.identity_audience, "carina.storage.io/node-identity");
        assert_eq!(args.identity_cert_ttl, Duration::from_secs(24 * 3600));
        let config = identity_config(&args, true, None).expect("config");
        assert_eq!(config.node_daemonset, "carina-node");
        assert_eq!(
            config.rate,
            RateSettings {
                burst: 5,
                interval: Duration::from_secs(60)
            }
        );
        assert_eq!(
            config.node_service_account.username(),
            "system:serviceaccount:kube-system:carina-node"
        );
        assert!(own_client_cert(&args).expect("neither file"));
    }

    #[test]
    fn identity_flags_parse() {
        let args = Args::try_parse_from([
            "carina-controller",
            "--mode=kube",
            "--namespace=carina",
            "--identity-listen=127.0.0.1:7444",
            "--identity-cert-ttl=90s",
            "--identity-server-names=localhost,carina.example",
            "--tls-cert=/c",
        ])
        .expect("parses");
        assert_eq!(args.identity_cert_ttl, Duration::from_secs(90));
        assert_eq!(args.identity_server_names, ["localhost", "carina.example"]);
        let config = identity_config(&args, false, None).expect("config");
        assert_eq!(
            config.rate.interval,
            Duration::from_secs(30),
            "a third of 90s"
        );
        let fixed = Args::try_parse_from([
            "carina-controller",
            "--identity-rate-burst=2",
            "--identity-rate-interval=0s",
        ])
        .expect("parses");
        assert_eq!(
            identity_config(&fixed, true, None).expect("config").rate,
            RateSettings {
                burst: 2,
                interval: Duration::ZERO
            }
        );
        assert!(Args::try_parse_from(["carina-controller", "--identity-rate-burst=0"]).is_err());
        assert_eq!(
            config.node_service_account.to_string(),
            "carina:carina-node"
        );
        assert!(own_client_cert(&args).is_err(), "a cert without its key");
        assert!(
            Args::try_parse_from(["carina-controller", "--identity-cert-ttl=1s"]).is_err(),
            "too short"
        );
    }
}
