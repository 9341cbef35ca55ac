//! The node's certificate from the control plane's issuer, instead of a
//! hand-made one (`carina-node --identity-issuer`).
//!
//! [`obtain`] asks the issuer for a first certificate (a new key and a CSR
//! for the node name, with the pod's projected ServiceAccount token, see
//! [`request`]) and, on a refusal or an unreachable issuer, logs the reason
//! and tries again with exponential backoff ([`Backoff`]) until one
//! arrives. The node serves NodeStorage only then. [`keep_renewed`] holds
//! the certificate in force: it asks for a new one (with a new key) two
//! thirds into the lifetime, retrying with backoff while the old one is
//! still served, and rebuilds the server TLS config when the certificate
//! or the trusted CA bundle changes. The bundle comes from the CA file
//! (`--tls-ca`, the mounted CA ConfigMap), but only as far as [`trust`]
//! lets it: a bundle rewritten without a trusted CA's key is refused and
//! the trusted one stays. New connections use the new config, established
//! ones keep theirs, and the process never restarts. The key never leaves
//! memory.

pub mod request;
pub mod trust;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use carina_proto::tls::{RELOAD_INTERVAL, ServerConfigUpdater, TlsError, server_config};
use rustls::ServerConfig;
use tokio::sync::watch;

use crate::server::metrics::Metrics;

use self::request::{IssuedCert, IssuerTarget, RequestError, request_certificate};
use self::trust::{Change, TrustedCa};

/// Where the token of the node's pod is projected unless configured.
pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/carina.storage.io/token";

/// What the node needs to ask for its certificate.
#[derive(Debug, Clone)]
pub struct IdentityOptions {
    /// `https://host:port` of the issuer.
    pub issuer: String,
    /// The node name the certificate is for.
    pub node_name: String,
    /// The projected ServiceAccount token, read at every request.
    pub token_file: PathBuf,
    /// The CA that verifies the issuer and the node's clients.
    pub ca_file: PathBuf,
    /// Where the trusted CA bundle is pinned across restarts (`None`: in
    /// memory only).
    pub pin_file: Option<PathBuf>,
    /// Retry delays after a failed request.
    pub backoff: Backoff,
    /// Where issuances and failures are counted (`/metrics`).
    pub metrics: Arc<Metrics>,
}

impl IdentityOptions {
    fn target<'a>(&'a self, ca_pem: &'a str) -> IssuerTarget<'a> {
        IssuerTarget {
            issuer: &self.issuer,
            node_name: &self.node_name,
            token_file: &self.token_file,
            ca_pem,
        }
    }

    /// The trusted CA bundle, following `ca_file` from the pin.
    pub fn trusted_ca(&self) -> TrustedCa {
        TrustedCa::open(&self.ca_file, self.pin_file.clone())
    }
}

/// Looks at the CA files again; logs what was taken or refused. Returns
/// whether the trusted bundle changed.
fn refresh_trust(options: &IdentityOptions, trust: &mut TrustedCa) -> bool {
    match trust.refresh() {
        Ok(Change::Unchanged) => false,
        Ok(Change::Taken { added, first }) => {
            tracing::info!(
                carina.tls.ca = %options.ca_file.display(),
                added = ?added,
                first_use = first,
                "trusting the CA bundle: new connections use it"
            );
            true
        }
        Err(e) => {
            tracing::error!(
                carina.tls.ca = %options.ca_file.display(),
                error = %e,
                "refused a CA bundle: a new CA must be endorsed by one the node trusts (the controller does so when its CA Secret is replaced)"
            );
            false
        }
    }
}

/// Exponential backoff: `min`, doubling up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    /// 1 s up to 1 minute.
    fn default() -> Self {
        Backoff {
            min: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The delay after `failures` consecutive failures (1 → `min`).
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1));
        self.min.saturating_mul(factor).min(self.max)
    }
}

fn log_issued(options: &IdentityOptions, cert: &IssuedCert, what: &str) {
    let not_after = cert
        .not_after
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    options.metrics.certificate_issued(not_after);
    tracing::info!(
        k8s.node.name = %options.node_name,
        not_after = %utc(cert.not_after),
        renew_at = %utc(cert.renew_at()),
        "{what}"
    );
}

/// An error and its sources, `: `-separated (a transport error says why).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// Completes when `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The guard wait_for returns must not live in a select's output.
    let _ = stop.wait_for(|s| *s).await;
}

/// A time as logs show it (UTC date and time).
fn utc(t: SystemTime) -> time::OffsetDateTime {
    t.into()
}

/// Asks until a certificate arrives that makes a server config with the
/// trusted CA bundle (`Some`), or `stop` turns true (`None`). Every
/// failure is logged with its reason.
pub async fn obtain(
    options: &IdentityOptions,
    trust: &mut TrustedCa,
    stop: &mut watch::Receiver<bool>,
) -> Option<(IssuedCert, Arc<ServerConfig>)> {
    let mut failures = 0;
    loop {
        refresh_trust(options, trust);
        let attempt = tokio::select! {
            _ = stopped(stop) => return None,
            r = request_usable(options, trust.pem()) => r,
        };
        match attempt {
            Ok((cert, config)) => {
                log_issued(options, &cert, "received a certificate from the issuer");
                return Some((cert, config));
            }
            Err(e) => {
                failures += 1;
                options.metrics.certificate_request_failed();
                let delay = options.backoff.delay(failures);
                tracing::warn!(
                    k8s.node.name = %options.node_name,
                    issuer = %options.issuer,
                    reason = %chain(&e),
                    retry_in = ?delay,
                    "no certificate from the issuer yet"
                );
                tokio::select! {
                    _ = stopped(stop) => return None,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// One request, and the server config its answer makes, both with the
/// trusted CA bundle `ca_pem`.
async fn request_usable(
    options: &IdentityOptions,
    ca_pem: Option<&str>,
) -> Result<(IssuedCert, Arc<ServerConfig>), RequestError> {
    let ca_pem = ca_pem.ok_or_else(|| {
        RequestError::Ca(format!(
            "{} holds no bundle the node takes",
            options.ca_file.display()
        ))
    })?;
    let cert = request_certificate(&options.target(ca_pem)).await?;
    let config = config_for(&cert, ca_pem).map_err(|e| RequestError::Answer(e.to_string()))?;
    Ok((cert, config))
}

/// The server config for `cert` with the trusted CA bundle `ca_pem`.
pub fn config_for(cert: &IssuedCert, ca_pem: &str) -> Result<Arc<ServerConfig>, TlsError> {
    server_config(
        cert.chain_pem.as_bytes(),
        cert.key_pem.as_bytes(),
        ca_pem.as_bytes(),
    )
}

/// Renews `current` two thirds into its lifetime and follows the trusted
/// CA bundle, replacing the config through `updater`, until `stop` or
/// until no server uses the config any more.
pub async fn keep_renewed(
    options: IdentityOptions,
    mut trust: TrustedCa,
    mut current: IssuedCert,
    updater: ServerConfigUpdater,
    mut stop: watch::Receiver<bool>,
) {
    let mut failures = 0;
    let mut next = current.renew_at();
    let mut tick = tokio::time::interval(RELOAD_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let wait = next
            .duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO);
        tokio::select! {
            _ = stopped(&mut stop) => return,
            _ = updater.closed() => return,
            _ = tick.tick() => {
                if !refresh_trust(&options, &mut trust) {
                    continue;
                }
                let Some(ca_pem) = trust.pem() else { continue };
                match config_for(&current, ca_pem) {
                    Ok(config) => updater.replace(config),
                    Err(e) => tracing::warn!(error = %e, "the CA changed but cannot be loaded; keeping the previous one"),
                }
            }
            _ = tokio::time::sleep(wait) => {
                match request_usable(&options, trust.pem()).await {
                    Ok((cert, config)) => {
                        updater.replace(config);
                        log_issued(&options, &cert, "renewed the certificate: new connections use it");
                        failures = 0;
                        next = cert.renew_at();
                        current = cert;
                    }
                    Err(e) => {
                        failures += 1;
                        options.metrics.certificate_request_failed();
                        let delay = options.backoff.delay(failures);
                        tracing::warn!(
                            k8s.node.name = %options.node_name,
                            issuer = %options.issuer,
                            reason = %chain(&e),
                            retry_in = ?delay,
                            not_after = %utc(current.not_after),
                            "cannot renew the certificate yet; the current one is still served"
                        );
                        next = SystemTime::now() + delay;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = Backoff::default();
        let secs: Vec<u64> = (1..=8).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(b.delay(200), Duration::from_secs(60));
    }

    #[test]
    fn reasons_carry_their_sources_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let inner = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(chain(&Outer(inner)), "outer: refused");
        let token = RequestError::EmptyToken { path: "/t".into() };
        assert_eq!(chain(&token), "the token file /t is empty");
    }
}
