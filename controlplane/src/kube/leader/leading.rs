//! Running work only while this replica leads, and stopping it within a
//! grace period when leadership is lost or on shutdown.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use tokio::sync::watch;

/// Completes when the led work should stop (see [`while_leading`]).
pub type Stop = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs `work` while `leading` is `true`, until `shutdown` completes or
/// the elector ends (the channel closes).
///
/// `work` is called with a `stop` future each time leadership is gained;
/// `stop` completes when leadership is lost or on shutdown, and the work
/// should then return. Work that has not returned `grace` after `stop`
/// fired is dropped: another replica may take the lease soon. Work that
/// returns on its own while still leading is started again after a pause
/// of `grace`.
pub async fn while_leading<F, Fut>(
    mut leading: watch::Receiver<bool>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
    mut work: F,
) where
    F: FnMut(Stop) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut shutdown = pin!(shutdown);
    let (stop_tx, _) = watch::channel(false);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            r = leading.wait_for(|l| *l) => if r.is_err() { return },
        }
        stop_tx.send_replace(false);
        let mut stop_rx = stop_tx.subscribe();
        let stop: Stop = Box::pin(async move {
            let _ = stop_rx.wait_for(|s| *s).await;
        });
        tracing::info!("leading: starting the led work");
        let mut running = pin!(work(stop));
        let mut ended = false;
        let mut stopping = false;
        tokio::select! {
            _ = &mut running => ended = true,
            _ = &mut shutdown => stopping = true,
            _ = leading.wait_for(|l| !*l) => {}
        }
        if ended {
            if !*leading.borrow() || stopping {
                continue;
            }
            tracing::warn!(pause = ?grace, "the led work ended while leading; starting it again after a pause");
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tokio::time::sleep(grace) => {}
            }
            continue;
        }
        stop_tx.send_replace(true);
        if tokio::time::timeout(grace, &mut running).await.is_err() {
            tracing::warn!(grace = ?grace, "the led work did not stop in time; dropped");
        }
        if stopping {
            return;
        }
        tracing::info!("no longer leading: the led work stopped");
    }
}
