//! Leader election under test: a candidate in its own task, a Lease
//! configuration with short periods, and who holds a Lease.

use std::time::Duration;

use anyhow::{Context, Result};
use carina_controlplane::kube::leader::LeaseConfig;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;

/// A leader-election candidate running in its own task, for tests of the
/// Lease: its leadership on `leading`; `stop` asks it to release and end
/// (then `task` finishes); aborting `task` is a crash.
#[derive(Debug)]
pub struct Candidate {
    pub leading: tokio::sync::watch::Receiver<bool>,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<()>,
}

impl Candidate {
    /// Starts a candidate with `config`.
    pub fn start(
        client: &Client,
        config: carina_controlplane::kube::leader::LeaseConfig,
    ) -> Result<Candidate> {
        let elector =
            carina_controlplane::kube::leader::LeaderElector::new(client.clone(), config)?;
        let (tx, leading) = tokio::sync::watch::channel(false);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            elector
                .run(tx, async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Candidate {
            leading,
            stop: Some(stop),
            task,
        })
    }

    /// Waits until it leads, at most `within`.
    pub async fn until_leading(&mut self, within: Duration) -> Result<()> {
        tokio::time::timeout(within, self.leading.wait_for(|l| *l))
            .await
            .context("not leading in time")??;
        Ok(())
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The Lease `name` in `kube-system` for `identity`, with periods short
/// enough for a test: 4 s lease, 3 s renew deadline, 250 ms retry.
pub fn short_lease(name: &str, identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_millis(250),
        ..LeaseConfig::new("kube-system", name, identity)
    }
}

/// The Lease `name`'s holder and its count of transitions.
pub async fn lease_holder(leases: &Api<Lease>, name: &str) -> Result<(Option<String>, i32)> {
    let spec = leases.get(name).await?.spec.context("a lease spec")?;
    Ok((spec.holder_identity, spec.lease_transitions.unwrap_or(0)))
}

/// Waits, by watch, until the Lease `name` is held by `who`, at most
/// `within`.
pub async fn await_lease_holder(
    leases: &Api<Lease>,
    name: &str,
    who: &str,
    within: Duration,
) -> Result<()> {
    let what = format!("holder {who}");
    super::wait_for(leases, name, &what, within, |l: &Lease| {
        l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(who)
    })
    .await?;
    Ok(())
}
