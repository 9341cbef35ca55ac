//! The bridge side of `carina-controller --mode kube` run inside a test
//! (reconciling LogicVolumes into NodeStorage calls), with short retries,
//! stopped by [`Bridge::stop`] or aborted on drop.

use std::time::Duration;

use anyhow::{Context, Result};
use carina_controlplane::kube::bridge;
use carina_controlplane::kube::bridge_side::{self, BridgeConfig};
use carina_controlplane::kube::retry::Backoff;
use kube::Client;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long [`Bridge::stop`] waits for the bridge to stop.
const STOP_WITHIN: Duration = Duration::from_secs(30);

/// The bridge running in the test, stopped on drop.
#[derive(Debug)]
pub struct Bridge {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), bridge::Error>>>,
}

impl Bridge {
    /// Starts the bridge as `instance`, retrying between 100 ms and 1 s and
    /// revisiting slow objects every `slow_retry`.
    pub fn start(
        client: Client,
        tls: carina_proto::tls::ClientTls,
        slow_retry: Duration,
        instance: &str,
    ) -> Bridge {
        let mut config = BridgeConfig::new(tls);
        config.retry = Backoff {
            min: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        config.slow_retry = slow_retry;
        config.call_timeout = Duration::from_secs(10);
        config.instance = Some(instance.into());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(bridge_side::run(client, config, async {
            let _ = stopped.await;
        }));
        Bridge {
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the bridge and returns how it ended.
    pub async fn stop(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(STOP_WITHIN, task)
                .await
                .context("the bridge did not stop")???;
        }
        Ok(())
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
