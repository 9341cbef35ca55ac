//! A leader-election candidate for tests of the Lease.

use std::time::Duration;

use anyhow::{Context, Result};
use kube::Client;

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

