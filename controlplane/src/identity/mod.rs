//! Node identity issued by the control plane: no hand-made node
//! certificates on Kubernetes.
//!
//! The controller keeps a CA in a Secret (`tls.crt`, `tls.key`: written
//! into the chart's empty Secret on first start, or provided by the user)
//! and publishes its certificate in a ConfigMap the nodes mount
//! ([`store`]); it reaches both only by name and creates neither where the
//! chart made them. Each node sends a CSR for its
//! node name with its pod's projected ServiceAccount token to the issuing
//! endpoint `carina.identity.v1.NodeIdentity` ([`server`]); the token is
//! checked with TokenReview and the pod it is bound to must run on that
//! node, be controlled by the node DaemonSet and not be terminating
//! ([`review`]); the CSR may ask for nothing else ([`csr`]); one node and
//! one pod get at most a few certificates at once, then one per interval
//! ([`limit`]); the CA signs a short-lived server certificate ([`ca`]). Refusals carry a
//! precise status ([`error`]). The controller's own client certificate
//! and the issuer's server certificate come from the same CA and are
//! renewed in memory ([`own`]).
//!
//! [`start`] wires it for `carina-controller --mode kube`.

pub mod ca;
pub mod csr;
pub mod endorse;
pub mod error;
pub mod limit;
pub mod own;
pub mod review;
pub mod server;
pub mod store;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use carina_proto::tls::LiveClientCert;
use kube::Client;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::limit::RateSettings;
use self::own::OwnCertError;
use self::review::{KubeTokenChecker, ServiceAccountRef};
use self::server::IdentityService;
use self::store::{CaLocation, StoreError};

/// The audience node tokens must be issued for unless configured.
pub const DEFAULT_AUDIENCE: &str = "carina.storage.io/node-identity";

/// Default lifetime of issued certificates.
pub const DEFAULT_CERT_TTL: Duration = Duration::from_secs(24 * 3600);

/// The shortest lifetime accepted (renewal at two thirds must leave room).
pub const MIN_CERT_TTL: Duration = Duration::from_secs(3);

/// How often the published CA ConfigMap is checked.
pub const REPUBLISH_INTERVAL: Duration = Duration::from_secs(10);

/// What the controller's identity work needs.
#[derive(Debug, Clone)]
pub struct IdentityConfig {
    /// The CA Secret and the ConfigMap that publishes it.
    pub ca: CaLocation,
    /// Where to serve `NodeIdentity`; `None`: no issuer.
    pub listen: Option<SocketAddr>,
    /// The audience node tokens must carry.
    pub audience: String,
    /// The only ServiceAccount whose tokens are accepted.
    pub node_service_account: ServiceAccountRef,
    /// The DaemonSet (in the ServiceAccount's namespace) that must control
    /// the token's pod.
    pub node_daemonset: String,
    /// How many certificates one node and one pod may get.
    pub rate: RateSettings,
    /// Lifetime of every certificate issued (nodes, the controller's own).
    pub cert_ttl: Duration,
    /// DNS names of the issuer's certificate besides the Service's.
    pub extra_server_names: Vec<String>,
    /// Whether the controller needs its own client certificate (no
    /// `--tls-cert/--tls-key` given).
    pub own_client_cert: bool,
    /// Trust domain of the controller's SPIFFE ID.
    pub trust_domain: String,
    /// HTTP routes served beside the issuer, on its port and with its
    /// certificate (the pod webhook); the issuer knows nothing of them.
    pub extra_routes: Option<axum::Router>,
}

/// Why the identity work could not start.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    OwnCert(#[from] OwnCertError),
    #[error("listen on {addr} (node identity issuer): {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// What [`start`] hands back: the CA's trust anchors, the controller's own
/// client certificate (when asked for), and the tasks to await after
/// `stop`.
#[derive(Debug)]
pub struct Started {
    pub ca_bundle_pem: String,
    pub client_cert: Option<LiveClientCert>,
    /// The issuer's address once bound (`None` without an issuer).
    pub issuer_addr: Option<SocketAddr>,
    pub tasks: Vec<JoinHandle<()>>,
}

/// Loads (or makes) the CA, publishes it, issues the controller's own
/// certificates and serves the issuer, each running until `stop`.
pub async fn start(
    client: Client,
    config: IdentityConfig,
    stop: watch::Receiver<bool>,
) -> Result<Started, IdentityError> {
    let ca = Arc::new(store::load_or_create_ca(&client, &config.ca).await?);
    store::publish_ca(&client, &config.ca, &ca, None).await?;
    let mut tasks = vec![tokio::spawn(store::keep_published(
        client.clone(),
        config.ca.clone(),
        ca.clone(),
        REPUBLISH_INTERVAL,
        stop.clone(),
    ))];

    let client_cert = if config.own_client_cert {
        let (live, issued) = own::client_cert(&ca, &config.trust_domain, config.cert_ttl)?;
        tracing::info!(
            not_after = %issued.not_after,
            "issued the controller's client certificate from the CA"
        );
        tasks.push(tokio::spawn(own::renew_client_cert(
            ca.clone(),
            live.clone(),
            config.trust_domain.clone(),
            config.cert_ttl,
            stop.clone(),
        )));
        Some(live)
    } else {
        None
    };

    let issuer_addr = match config.listen {
        Some(addr) => {
            let names = own::issuer_names(&config.ca.namespace, &config.extra_server_names);
            let (updater, tls) = own::issuer_tls(&ca, &names, config.cert_ttl)?;
            tasks.push(tokio::spawn(own::renew_issuer_tls(
                ca.clone(),
                updater,
                names.clone(),
                config.cert_ttl,
                stop.clone(),
            )));
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|source| IdentityError::Bind { addr, source })?;
            let bound = listener.local_addr().unwrap_or(addr);
            let checker = KubeTokenChecker::new(
                client.clone(),
                config.audience.clone(),
                config.node_service_account.clone(),
                config.node_daemonset.clone(),
            );
            let service = IdentityService::new(ca.clone(), checker, config.cert_ttl, config.rate);
            let mut stop = stop.clone();
            let extra = config.extra_routes.clone();
            tasks.push(tokio::spawn(async move {
                let shutdown = async move {
                    let _ = stop.wait_for(|s| *s).await;
                };
                if let Err(e) = server::serve(listener, tls, service, extra, shutdown).await {
                    tracing::error!(error = %e, "the node identity issuer failed");
                }
            }));
            tracing::info!(
                identity.listen = %bound,
                identity.audience = %config.audience,
                identity.service_account = %config.node_service_account,
                identity.daemonset = %config.node_daemonset,
                identity.rate_burst = config.rate.burst,
                identity.rate_interval = ?config.rate.interval,
                identity.cert_ttl = ?config.cert_ttl,
                identity.server_names = ?names,
                "serving the node identity issuer"
            );
            Some(bound)
        }
        None => None,
    };
    Ok(Started {
        ca_bundle_pem: ca.bundle_pem().to_string(),
        client_cert,
        issuer_addr,
        tasks,
    })
}

/// `90s`, `15m`, `24h`, `7d` (a number alone is seconds): a lifetime of at
/// least [`MIN_CERT_TTL`].
pub fn parse_ttl(input: &str) -> Result<Duration, String> {
    let s = input.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("invalid duration {input:?} (examples: 90s, 15m, 24h, 7d)"))?;
    let secs = match unit {
        "" | "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        "d" => n.checked_mul(86_400),
        other => return Err(format!("invalid duration unit {other:?} (s, m, h, d)")),
    }
    .ok_or_else(|| format!("duration {input:?} is too long"))?;
    let ttl = Duration::from_secs(secs);
    if ttl < MIN_CERT_TTL {
        return Err(format!("{input:?} is shorter than {MIN_CERT_TTL:?}"));
    }
    Ok(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls() {
        assert_eq!(parse_ttl("24h"), Ok(DEFAULT_CERT_TTL));
        assert_eq!(parse_ttl("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_ttl("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_ttl("15m"), Ok(Duration::from_secs(900)));
        for bad in ["", "h", "1x", "2s", "-5s", "99999999999999999999d"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }
}
