//! Leader election over a `coordination.k8s.io/v1` `Lease`, so that of
//! several controller replicas exactly one runs the bridge side (the
//! `LogicVolume` reconciler, capacity publisher, config push) while every
//! replica serves CSI.
//!
//! The record is the one client-go keeps: `holderIdentity`,
//! `leaseDurationSeconds`, `acquireTime`, `renewTime`, `leaseTransitions`.
//! Every write is a replace guarded by the `resourceVersion` just read, so
//! two candidates can never both believe they took the lease.
//!
//! - **Acquire** when the lease is free (no holder, e.g. released) or
//!   expired: its record has not changed for the holder's
//!   `leaseDurationSeconds`, measured on this replica's monotonic clock
//!   from when it first saw that record (so clock skew between replicas
//!   does not matter; a crashed leader is replaced at most one lease
//!   duration plus one retry period after it last renewed).
//! - **Renew** every `retry_period` while leading. Leadership is given up
//!   when the lease is found held by another, or when no renewal has
//!   succeeded for `renew_deadline` (shorter than the lease duration, so
//!   the old leader has stopped before anyone else may start).
//! - **Release** on shutdown: the holder is cleared, so a standby takes
//!   over at its next retry rather than after the lease expires.
//!
//! Leadership is published on a `watch` channel ([`LeaderElector::run`]);
//! [`while_leading`] runs work only while it is `true`.
//!
//! This file holds the candidate and its campaign loop; [`lease`] reads
//! and writes the lease record, [`leading`] runs the led work.

mod leading;
mod lease;

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

pub use leading::{Stop, while_leading};

/// Settings of one candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Namespace of the `Lease`.
    pub namespace: String,
    /// Name of the `Lease`; all replicas of one controller share it.
    pub name: String,
    /// This candidate's identity (unique per replica: the pod name).
    pub identity: String,
    /// How long a lease stays valid after its last renewal (written as
    /// whole seconds, rounded up).
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the leader renews and a standby tries to acquire.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        LeaseConfig {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Checks the timing: `retry_period < renew_deadline < lease_duration`,
    /// a lease of at least one second, and a non-empty identity.
    pub fn validate(&self) -> Result<(), LeaderError> {
        let bad = |reason: &str| Err(LeaderError::Config(reason.to_string()));
        if self.identity.is_empty() {
            return bad("the identity must not be empty");
        }
        if self.name.is_empty() || self.namespace.is_empty() {
            return bad("the lease name and namespace must not be empty");
        }
        if self.lease_duration < Duration::from_secs(1) {
            return bad("the lease duration must be at least 1 s");
        }
        if self.renew_deadline >= self.lease_duration {
            return bad("the renew deadline must be shorter than the lease duration");
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return bad("the retry period must be positive and shorter than the renew deadline");
        }
        Ok(())
    }

    fn lease_seconds(&self) -> i32 {
        let secs = self.lease_duration.as_millis().div_ceil(1000);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }
}

/// Errors of leader election.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("leader election configuration: {0}")]
    Config(String),
    /// A call on the `Lease` failed.
    #[error("{what} Lease {namespace}/{name}: {source}")]
    Api {
        what: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("{what} Lease {namespace}/{name}: no answer within {timeout:?}")]
    Timeout {
        what: &'static str,
        namespace: String,
        name: String,
        timeout: Duration,
    },
}

/// The lease record as last seen, and when this replica first saw it.
#[derive(Debug, Clone)]
struct Observed {
    resource_version: Option<String>,
    holder: Option<String>,
    lease_duration: Duration,
    since: Instant,
}

/// One candidate for the lease.
#[derive(Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
}

impl std::fmt::Debug for LeaderElector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderElector")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl LeaderElector {
    /// A candidate for `config.name` in `config.namespace`; fails on a
    /// configuration [`LeaseConfig::validate`] refuses.
    pub fn new(client: Client, config: LeaseConfig) -> Result<Self, LeaderError> {
        config.validate()?;
        Ok(LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
        })
    }

    pub fn config(&self) -> &LeaseConfig {
        &self.config
    }

    /// Campaigns, and renews while leading, until `shutdown` completes;
    /// `leading` carries whether this replica leads. On shutdown it
    /// publishes `false` and then releases the lease if it holds it; stop
    /// the led work before (see [`while_leading`]), so that no two
    /// replicas ever run it at once.
    #[tracing::instrument(name = "leader.run", skip_all, fields(carina.lease.name = %self.config.name, carina.lease.identity = %self.config.identity))]
    pub async fn run(&self, leading: watch::Sender<bool>, shutdown: impl Future<Output = ()>) {
        let mut shutdown = pin!(shutdown);
        let mut tick = tokio::time::interval(self.config.retry_period);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut observed: Option<Observed> = None;
        let mut last_renewal: Option<Instant> = None;
        // Whether the last attempt failed: its write may still have landed
        // (a lost answer, a timeout), so this replica may hold the lease
        // without knowing.
        let mut outcome_unknown = false;
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tick.tick() => {}
            }
            let leader = *leading.borrow();
            // A renewal must land before the renew deadline; an attempt to
            // acquire gets the same bound.
            let budget = match last_renewal.filter(|_| leader) {
                Some(at) => {
                    (at + self.config.renew_deadline).saturating_duration_since(Instant::now())
                }
                None => self.config.renew_deadline,
            };
            // A shutdown does not cancel an attempt under way: its write may
            // already have reached the apiserver, and a replica that gave up
            // on the answer would hold the lease without knowing, so no one
            // releases it and the standby waits for it to expire. The
            // attempt is bounded by `budget`; it finishes, then the lease is
            // released if it was won or if its outcome is unknown.
            let mut stopping = false;
            let attempt = {
                let call =
                    self.with_timeout("renew", budget, self.try_acquire_or_renew(&mut observed));
                let mut call = pin!(call);
                tokio::select! {
                    r = &mut call => r,
                    _ = &mut shutdown => {
                        stopping = true;
                        call.await
                    }
                }
            };
            outcome_unknown = attempt.is_err();
            match attempt {
                Ok(true) => {
                    last_renewal = Some(Instant::now());
                    if !leader {
                        tracing::info!("acquired the lease: leading");
                        leading.send_replace(true);
                    }
                }
                Ok(false) => {
                    if leader {
                        tracing::warn!(carina.lease.holder = ?observed.as_ref().and_then(|o| o.holder.clone()), "the lease is held by another: no longer leading");
                        leading.send_replace(false);
                    }
                }
                Err(e) => {
                    let overdue =
                        last_renewal.is_none_or(|at| at.elapsed() >= self.config.renew_deadline);
                    if leader && overdue {
                        tracing::warn!(error = %e, "could not renew the lease within the renew deadline: no longer leading");
                        leading.send_replace(false);
                    } else {
                        tracing::warn!(error = %e, "lease attempt failed; retrying");
                    }
                }
            }
            if stopping {
                break;
            }
        }
        let was_leader = leading.send_replace(false);
        // Release reads the lease first and clears only a holder that is
        // this replica, so it is safe when in doubt.
        if was_leader || outcome_unknown {
            match self
                .with_timeout("release", self.config.renew_deadline, self.release())
                .await
            {
                Ok(()) => tracing::info!("released the lease"),
                Err(e) => {
                    tracing::warn!(error = %e, "releasing the lease failed; it expires on its own")
                }
            }
        }
    }

    async fn with_timeout<T>(
        &self,
        what: &'static str,
        timeout: Duration,
        call: impl Future<Output = Result<T, LeaderError>>,
    ) -> Result<T, LeaderError> {
        tokio::time::timeout(timeout, call)
            .await
            .unwrap_or_else(|_| Err(self.timeout_error(what, timeout)))
    }

    fn timeout_error(&self, what: &'static str, timeout: Duration) -> LeaderError {
        LeaderError::Timeout {
            what,
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            timeout,
        }
    }

    fn api_error(&self, what: &'static str, source: kube::Error) -> LeaderError {
        LeaderError::Api {
            what,
            namespace: self.config.namespace.clone(),
            name: self.config.name.clone(),
            source: Box::new(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn timing_is_checked() {
        let ok = LeaseConfig::new("kube-system", "carina-controller", "a");
        assert_eq!(ok.validate().ok(), Some(()));
        assert_eq!(ok.lease_seconds(), 15);
        let mut c = ok.clone();
        c.renew_deadline = c.lease_duration;
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.retry_period = c.renew_deadline;
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.identity.clear();
        assert!(c.validate().is_err());
        let mut c = ok;
        c.lease_duration = Duration::from_millis(1500);
        c.renew_deadline = Duration::from_secs(1);
        c.retry_period = Duration::from_millis(200);
        assert!(c.validate().is_ok());
        assert_eq!(c.lease_seconds(), 2, "rounded up");
    }

    #[tokio::test]
    async fn work_runs_only_while_leading() {
        let (tx, rx) = watch::channel(false);
        // (started, stopped) counts of the led work.
        let (count_tx, mut counts) = watch::channel((0u32, 0u32));
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(while_leading(
            rx,
            async move {
                let _ = shutdown_rx.await;
            },
            Duration::from_secs(5),
            move |stop| {
                let count_tx = count_tx.clone();
                async move {
                    count_tx.send_modify(|c| c.0 += 1);
                    stop.await;
                    count_tx.send_modify(|c| c.1 += 1);
                }
            },
        ));
        let mut expect = async |want: (u32, u32), why: &str| {
            let reached =
                tokio::time::timeout(Duration::from_secs(5), counts.wait_for(|c| *c == want))
                    .await
                    .map(|r| r.is_ok());
            assert_eq!(
                reached.ok(),
                Some(true),
                "{why}: counts stay {:?}",
                *counts.borrow()
            );
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        expect((0, 0), "not leading yet").await;
        tx.send_replace(true);
        expect((1, 0), "started on leading").await;
        tx.send_replace(false);
        expect((1, 1), "stopped on loss").await;
        tx.send_replace(true);
        expect((2, 1), "started again").await;
        let _ = shutdown_tx.send(());
        expect((2, 2), "stopped on shutdown").await;
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("while_leading returns on shutdown")
            .expect("no panic");
    }

    /// A stand-in for the apiserver's Lease endpoints: it keeps one Lease,
    /// and answers a create only after `create_delay`, once the write has
    /// landed (an answer lost or late, as behind a slow network).
    fn lease_server(create_delay: Duration) -> (Client, Arc<Mutex<Option<Lease>>>) {
        let stored: Arc<Mutex<Option<Lease>>> = Arc::default();
        let state = Arc::clone(&stored);
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let state = Arc::clone(&state);
            async move {
                let (parts, body) = req.into_parts();
                let body = body.collect_bytes().await?;
                let reply = |code: u16, value: serde_json::Value| {
                    http::Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(kube::client::Body::from(value.to_string().into_bytes()))
                };
                let current = state.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let response = match parts.method {
                    http::Method::GET => match current {
                        Some(lease) => reply(200, serde_json::to_value(lease)?),
                        None => reply(
                            404,
                            serde_json::json!({"kind": "Status", "apiVersion": "v1",
                                "status": "Failure", "reason": "NotFound", "code": 404,
                                "message": "leases not found"}),
                        ),
                    },
                    http::Method::POST | http::Method::PUT => {
                        let mut lease: Lease = serde_json::from_slice(&body)?;
                        lease.metadata.resource_version = Some("1".into());
                        *state.lock().unwrap_or_else(|p| p.into_inner()) = Some(lease.clone());
                        if parts.method == http::Method::POST {
                            tokio::time::sleep(create_delay).await;
                        }
                        reply(200, serde_json::to_value(lease)?)
                    }
                    _ => reply(405, serde_json::json!({})),
                };
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(response?)
            }
        });
        (Client::new(service, "kube-system"), stored)
    }

    /// A shutdown during an acquire whose answer comes too late: the
    /// write landed, so the replica holds the lease without knowing, and
    /// it must release it rather than leave it to expire.
    #[tokio::test]
    async fn a_shutdown_after_an_unanswered_acquire_releases_the_lease() {
        let config = LeaseConfig {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_millis(500),
            retry_period: Duration::from_millis(100),
            ..LeaseConfig::new("kube-system", "carina-controller", "replica-a")
        };
        let (client, stored) = lease_server(Duration::from_secs(30));
        let elector = LeaderElector::new(client, config).expect("valid config");
        let (leading, led) = watch::channel(false);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let run = tokio::spawn(async move {
            elector
                .run(leading, async {
                    let _ = stopped.await;
                })
                .await
        });
        // Wait until the create has landed, then stop during its wait.
        let landed = async {
            while stored.lock().unwrap_or_else(|p| p.into_inner()).is_none() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), landed)
            .await
            .expect("the acquire is sent");
        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .expect("run returns once the attempt timed out and the release is done")
            .expect("no panic");
        assert!(!*led.borrow(), "never published as leading");
        let holder = stored
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(|l| l.spec.as_ref()?.holder_identity.clone());
        assert_eq!(holder, None, "the lease it won unknowingly is released");
    }
}
