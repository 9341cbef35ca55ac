//! `CopyLV`: starts the engine's copy and streams its progress, stopping
//! the copy when the client goes away or the server stops.

use std::pin::Pin;
use std::sync::Arc;

use carina_proto::nodestorage as pb;
use futures::Stream;
use tokio::sync::{mpsc, watch};
use tonic::Status;
use tracing::Instrument;

use super::NodeStorageService;
use crate::engine::Error;
use crate::engine::copy::{Progress, Stop};
use crate::server::convert;

/// How often a running copy reports its progress.
pub const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// The progress messages of one copy.
pub type CopyStream = Pin<Box<dyn Stream<Item = Result<pb::CopyLvProgress, Status>> + Send>>;

impl NodeStorageService {
    /// Starts the copy `req` asks for and streams its progress: a message
    /// every [`PROGRESS_EVERY`] while it runs, then the last one (done,
    /// with the target) or the error. The copy stops when the client goes
    /// away (the stream is dropped) or the server stops (the call then
    /// ends UNAVAILABLE: the caller did not cancel it, a retry works).
    pub(super) fn copy(&self, req: pb::CopyLvRequest) -> Result<CopyStream, Status> {
        let req = convert::copy_request(req)?;
        let (tx, rx) = mpsc::channel::<Result<pb::CopyLvProgress, Status>>(8);
        let (progress_tx, progress) = watch::channel(Progress::default());
        let stop = Stop::default();
        let service = self.clone();
        let mut stopping = self.stopping.clone();
        let task = async move {
            let copy = service
                .engine
                .copy_volume(req, Arc::new(progress_tx), stop.clone());
            tokio::pin!(copy);
            let mut ticker = tokio::time::interval(PROGRESS_EVERY);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut stopped = false;
            let mut shutting_down = false;
            let outcome = loop {
                tokio::select! {
                    result = &mut copy => break result,
                    _ = ticker.tick() => {
                        // Never waits on the client: a slow reader misses
                        // a progress message, it does not hold the copy
                        // (and a frozen filesystem) up.
                        let _ = tx.try_send(Ok(convert::copy_progress(&progress.borrow())));
                    }
                    _ = tx.closed(), if !stopped => {
                        tracing::info!("the client went away; stopping the copy");
                        stopped = true;
                        stop.set();
                    }
                    _ = stopping.wait_for(|s| *s), if !stopped => {
                        tracing::info!("the server is stopping; stopping the copy");
                        stopped = true;
                        shutting_down = true;
                        stop.set();
                    }
                }
            };
            let last = match outcome {
                Ok(copied) => {
                    let total = progress.borrow().total_bytes;
                    Ok(pb::CopyLvProgress {
                        copied_bytes: total,
                        total_bytes: total,
                        done: true,
                        target: Some(service.wire(&copied.volume).await),
                        frozen: false,
                    })
                }
                // Stopped by the node going down, not by the caller: a
                // retry (once the node is back) works.
                Err(e @ Error::Cancelled { .. }) if shutting_down => Err(Status::unavailable(
                    format!("{e}: the node is shutting down"),
                )),
                Err(e) => Err(Status::from(e)),
            };
            // Counted (and a node failure logged) like every call's end.
            let _ = service.done("CopyLV", last.as_ref().map(|_| ()).map_err(Clone::clone));
            let _ = tx.send(last).await;
        };
        tokio::spawn(task.instrument(tracing::Span::current()));
        Ok(Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })))
    }
}
