//! The controller's own certificates from the cluster CA, renewed at two
//! thirds of their lifetime: its client certificate (role `controller`,
//! offered to the nodes through a [`LiveClientCert`]) and the issuer's
//! server certificate (the Service's DNS names, served through a
//! [`ReloadingServerConfig`]). Nothing is written to disk: a restart
//! issues new ones.

use std::sync::Arc;
use std::time::Duration;

use carina_proto::tls::{
    LiveClientCert, ReloadingServerConfig, ServerConfigUpdater, TlsError,
    server_config_without_client_auth,
};
use time::OffsetDateTime;
use tokio::sync::watch;

use super::ca::{CaError, ClusterCa, Issued};

/// Why an own certificate could not be made or put in use.
#[derive(Debug, thiserror::Error)]
pub enum OwnCertError {
    #[error("issue the {what}: {source}")]
    Issue {
        what: &'static str,
        #[source]
        source: CaError,
    },
    #[error("use the {what}: {source}")]
    Tls {
        what: &'static str,
        #[source]
        source: TlsError,
    },
}

/// When a certificate issued now for `ttl` is renewed: after two thirds
/// of it.
pub fn renew_after(ttl: Duration) -> Duration {
    ttl.mul_f64(2.0 / 3.0)
}

/// How long to wait before trying again after a failed renewal.
const RETRY: Duration = Duration::from_secs(10);

/// The DNS names of the issuer's certificate: the Service
/// `carina-controller` in `namespace` by every name a pod resolves, then
/// `extra`.
pub fn issuer_names(namespace: &str, extra: &[String]) -> Vec<String> {
    let service = "carina-controller";
    let mut names = vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc.cluster.local"),
        service.to_string(),
    ];
    for name in extra {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    names
}

/// The controller's client certificate, and its first issue.
pub fn client_cert(
    ca: &ClusterCa,
    trust_domain: &str,
    ttl: Duration,
) -> Result<(LiveClientCert, Issued), OwnCertError> {
    const WHAT: &str = "controller client certificate";
    let issued = ca
        .issue_client(trust_domain, "controller", ttl)
        .map_err(|source| OwnCertError::Issue { what: WHAT, source })?;
    let live = LiveClientCert::from_pem(issued.chain_pem.as_bytes(), issued.key_pem.as_bytes())
        .map_err(|source| OwnCertError::Tls { what: WHAT, source })?;
    Ok((live, issued))
}

/// Renews `live` from `ca` until `stop`.
pub async fn renew_client_cert(
    ca: Arc<ClusterCa>,
    live: LiveClientCert,
    trust_domain: String,
    ttl: Duration,
    stop: watch::Receiver<bool>,
) {
    const WHAT: &str = "controller client certificate";
    renew_loop(WHAT, ttl, stop, || {
        let issued = ca
            .issue_client(&trust_domain, "controller", ttl)
            .map_err(|source| OwnCertError::Issue { what: WHAT, source })?;
        live.replace(issued.chain_pem.as_bytes(), issued.key_pem.as_bytes())
            .map_err(|source| OwnCertError::Tls { what: WHAT, source })?;
        Ok(issued.not_after)
    })
    .await
}

/// The issuer's server TLS and its updater, first issue included.
pub fn issuer_tls(
    ca: &ClusterCa,
    names: &[String],
    ttl: Duration,
) -> Result<(ServerConfigUpdater, ReloadingServerConfig), OwnCertError> {
    let config = issue_server_config(ca, names, ttl)?.0;
    Ok(ReloadingServerConfig::updatable(config))
}

fn issue_server_config(
    ca: &ClusterCa,
    names: &[String],
    ttl: Duration,
) -> Result<(Arc<rustls::ServerConfig>, OffsetDateTime), OwnCertError> {
    const WHAT: &str = "issuer server certificate";
    let issued = ca
        .issue_server(names, ttl)
        .map_err(|source| OwnCertError::Issue { what: WHAT, source })?;
    let config =
        server_config_without_client_auth(issued.chain_pem.as_bytes(), issued.key_pem.as_bytes())
            .map_err(|source| OwnCertError::Tls { what: WHAT, source })?;
    Ok((config, issued.not_after))
}

/// Renews the issuer's server certificate through `updater` until `stop`.
pub async fn renew_issuer_tls(
    ca: Arc<ClusterCa>,
    updater: ServerConfigUpdater,
    names: Vec<String>,
    ttl: Duration,
    stop: watch::Receiver<bool>,
) {
    renew_loop("issuer server certificate", ttl, stop, || {
        let (config, not_after) = issue_server_config(&ca, &names, ttl)?;
        updater.replace(config);
        Ok(not_after)
    })
    .await
}

/// Calls `renew` every two thirds of `ttl` (after a failure, every
/// [`RETRY`]) until `stop`.
async fn renew_loop(
    what: &'static str,
    ttl: Duration,
    mut stop: watch::Receiver<bool>,
    mut renew: impl FnMut() -> Result<OffsetDateTime, OwnCertError>,
) {
    let mut wait = renew_after(ttl);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = match renew() {
            Ok(not_after) => {
                tracing::info!(cert = what, %not_after, "renewed");
                renew_after(ttl)
            }
            Err(e) => {
                tracing::error!(cert = what, error = %e, retry_in = ?RETRY, "cannot renew");
                RETRY
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_at_two_thirds() {
        assert_eq!(
            renew_after(Duration::from_secs(24 * 3600)),
            Duration::from_secs(16 * 3600)
        );
        assert_eq!(renew_after(Duration::from_secs(9)), Duration::from_secs(6));
    }

    #[test]
    fn issuer_names_start_with_the_service() {
        let names = issuer_names(
            "kube-system",
            &["localhost".into(), "carina-controller".into()],
        );
        assert_eq!(names[0], "carina-controller.kube-system.svc");
        assert_eq!(names.last().map(String::as_str), Some("localhost"));
        assert_eq!(
            names.iter().filter(|n| *n == "carina-controller").count(),
            1
        );
    }

    #[tokio::test]
    async fn own_certificates_build_tls_configs() {
        let ca = ClusterCa::generate("ca").expect("CA");
        let (live, issued) =
            client_cert(&ca, "carina.storage.io", Duration::from_secs(60)).expect("client");
        assert!(!live.chain().is_empty());
        assert!(issued.not_after > OffsetDateTime::now_utc());
        let (_updater, tls) =
            issuer_tls(&ca, &issuer_names("ns", &[]), Duration::from_secs(60)).expect("server");
        assert_eq!(tls.current().alpn_protocols, vec![b"h2".to_vec()]);
    }
}
